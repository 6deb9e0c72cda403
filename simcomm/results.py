"""What a simulated run produces: per-rank results, times, link traffic and the op trace."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

from algorithms.ops import Launch
from simcomm.topology import Link


class TraceEvent(NamedTuple):
    """One span of the op trace. ``kind`` is ``send`` (``rank`` -> ``peer``, issue to
    arrival), ``recv`` (posting to completion), ``reduce``, ``copy``, ``divide``,
    ``compute``, ``sleep`` (``Sleep``: at the collective level, a whole collective),
    ``launch`` (a collective's start, ``Launch``), ``task`` (a spawned task,
    from its ``Spawn`` to its end; labelled with its generator's name) or ``footprint`` (an
    instant: ``nbytes`` more memory held, or fewer if negative, from ``start`` on).
    ``message`` numbers the message a send, receive or reduction belongs to (in send order,
    from 0; -1 for local work); ``label`` is the op's."""

    kind: str
    rank: int
    channel: Hashable
    start: float
    end: float
    peer: int = -1
    nbytes: int = 0
    label: str = ""
    message: int = -1


class Hop(NamedTuple):
    """A message on one link of its route: the link (an index into ``Topology.links``)
    carries it from ``start`` to ``end`` (seconds); its tail reaches the far end one link
    latency later."""

    link: int
    message: int
    start: float
    end: float


class LinkStats(NamedTuple):
    """Traffic of one link over a run (a tuple, as ``Hop`` and ``TraceEvent`` are: a run
    of the collective level makes one per link, 524,288 on a 131,072-GPU cluster)."""

    link: Link
    bytes: int
    busy_time: float


def link_stats(links: Iterable[Link], nbytes: Iterable[int], busy_time: Iterable[float]
               ) -> list[LinkStats]:
    """One ``LinkStats`` per link, from its bytes and busy seconds."""
    # tuple.__new__ makes each without the NamedTuple's own __new__, a Python call: a
    # third of a second on a cluster of 524,288 links.
    return list(map(tuple.__new__, repeat(LinkStats), zip(links, nbytes, busy_time)))


@dataclass
class SimResult:
    """What a simulated run produced and what it cost."""

    results: list[Any]
    time: float
    finish_times: list[float]
    links: list[LinkStats]
    trace: list[TraceEvent] = field(repr=False)
    messages: int = 0
    hops: list[Hop] = field(default_factory=list, repr=False)
    # Rank 0's ``Launch`` ops in order: which algorithm, protocol and channels ran.
    launches: list[Launch] = field(default_factory=list)
    # "message": every op simulated (``simcomm.engine``); "collective": the collective's
    # cost from the topology (``simcomm.collective_level``), with no data and no trace.
    level: str = "message"
    # At the collective level, whether the times are the message level's exactly (no link
    # shared by two messages) or a bound from above; None at the message level.
    exact: bool | None = None

    def sends(self) -> list[TraceEvent]:
        """The trace's messages, in send order."""
        return [e for e in self.trace if e.kind == "send"]
