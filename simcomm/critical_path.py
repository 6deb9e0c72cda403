"""The critical path of a simulated run: the chain of work and messages, each waiting on the
one before, that ends when the run ends. Shorten anything off it and the run ends no
sooner; lengthen anything on it and the run ends later by as much.

``critical_path(result).format()`` is the short report that ``simcomm bench --summary`` and
``simcomm ddp|fsdp --critical-path`` print. ``critical_path(result)`` walks the op trace
back from the rank that finished last. At each point it takes the span of that rank that
ended there: local work (compute, reduction, copy, sleep) goes on the path and the walk
goes on from its start on the same rank; a receive whose message arrived after it was
posted puts the message on the path (from its send to its arrival, charged to the link of
its route where it spent longest, waiting or crossing) and the walk goes on at the sender,
from when it sent; a receive posted after its message had arrived waited for nothing but
its own rank, so the walk goes on from its posting. Time that no span of the rank explains
(a task waiting on a barrier of its own making, say) is ``idle``. Where two spans end
together, a receive is followed first, since it leads to the rank that was waited for.

Message level only, with the trace kept (``simulate``'s ``record``, the default): the
collective level has no messages to follow.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from simcomm.results import Hop, SimResult, TraceEvent
from simcomm.topology import Link

LOCAL_KINDS = ("compute", "reduce", "copy", "divide", "sleep")
# Spans that end at one moment are followed in this order: a receive leads to its sender.
_PREFERENCE = {"recv": 0, **{kind: 1 for kind in LOCAL_KINDS}, "send": 2}
_EPSILON = 1e-12  # seconds: trace times are whole ticks, far coarser than this


@dataclass(frozen=True)
class Segment:
    """One stretch of the critical path (seconds)."""

    kind: str  # "compute" (any local work), "message" or "idle"
    rank: int  # where it ran; a message's sender
    start: float
    end: float
    peer: int = -1  # a message's receiver
    link: int = -1  # a message's link where it spent longest (into ``Topology.links``)
    label: str = ""  # the op's label, where it has one

    @property
    def seconds(self) -> float:
        """How long it lasted."""
        return self.end - self.start


@dataclass(frozen=True)
class CriticalPath:
    """The chain that ends a run, in time order."""

    segments: tuple[Segment, ...]
    links: tuple[Link, ...]  # the topology's, to name a segment's link

    def seconds_of(self, kind: str) -> float:
        """The path's seconds of one kind of segment."""
        return sum(s.seconds for s in self.segments if s.kind == kind)

    def compute_by_rank(self) -> dict[int, float]:
        """Local work on the path, seconds by rank, the most first."""
        return _ranked((s.rank, s.seconds) for s in self.segments if s.kind == "compute")

    def messages_by_link(self) -> dict[int, float]:
        """Messages on the path, seconds by the link each spent longest on, the most first."""
        return _ranked((s.link, s.seconds) for s in self.segments
                       if s.kind == "message" and s.link >= 0)

    def format(self, top: int = 3) -> str:
        """A few lines: how long the path is, and its compute, messages and idle time with
        the ranks and links that carry most of them."""
        total = sum(s.seconds for s in self.segments)
        if total <= 0:
            return "critical path: empty (the run took no time)"

        def share(seconds: float) -> str:
            return f"{seconds * 1e3:.3f} ms ({seconds / total:.0%})"

        ranks = self.compute_by_rank()
        links = self.messages_by_link()
        lines = [f"critical path: {total * 1e3:.3f} ms, {len(self.segments)} segments"]
        lines.append(f"  compute   {share(self.seconds_of('compute'))}"
                     + _most([(f"rank {r}", t) for r, t in ranks.items()], top))
        lines.append(f"  messages  {share(self.seconds_of('message'))}"
                     + _most([(self._link_name(i), t) for i, t in links.items()], top))
        idle = self.seconds_of("idle")
        if idle > 0:
            lines.append(f"  idle      {share(idle)}")
        return "\n".join(lines)

    def _link_name(self, index: int) -> str:
        link = self.links[index]
        return f"{link.src}->{link.dst}"


def critical_path(result: SimResult) -> CriticalPath:
    """The critical path of ``result``, a message-level run with its trace (see the module
    doc)."""
    if result.level != "message":
        raise ValueError("the critical path follows messages: run at the message level")
    if result.time > 0 and not result.trace:
        raise ValueError("the critical path needs the op trace: simulate with record=True")
    indices: dict[int, list[int]] = defaultdict(list)
    sends: dict[int, TraceEvent] = {}
    for i, event in enumerate(result.trace):
        if event.kind in _PREFERENCE:
            indices[event.rank].append(i)
        if event.kind == "send":
            sends[event.message] = event
    spans = {r: _Spans(result.trace, found) for r, found in indices.items()}
    hops: dict[int, list[Hop]] = defaultdict(list)
    for hop in result.hops:
        hops[hop.message].append(hop)
    segments: list[Segment] = []
    used: set[int] = set()
    rank = max(range(len(result.finish_times)), key=result.finish_times.__getitem__)
    now = result.time
    while now > _EPSILON:
        index = spans[rank].last(result.trace, used, now) if rank in spans else None
        if index is None:
            segments.append(Segment("idle", rank, 0.0, now))
            break
        used.add(index)
        event = result.trace[index]
        if event.end < now - _EPSILON:
            segments.append(Segment("idle", rank, event.end, now))
            now = event.end
        send = sends.get(event.message) if event.kind == "recv" else None
        if event.kind in LOCAL_KINDS:
            segments.append(Segment("compute", rank, event.start, now, label=event.label))
            now = event.start
        elif send is not None and send.end > event.start + _EPSILON:
            # The receive waited for its message: follow it back to its sender.
            if now > send.end + _EPSILON:
                segments.append(Segment("compute", rank, send.end, now, label=event.label))
            segments.append(Segment("message", send.rank, send.start, send.end, rank,
                                    _slowest_link(hops[send.message], send.start),
                                    send.label))
            rank, now = send.rank, send.start
        elif event.kind == "send":
            # A sender waiting for its message to land: the message is the wait.
            segments.append(Segment("message", rank, event.start, now, event.peer,
                                    _slowest_link(hops[event.message], event.start),
                                    event.label))
            now = event.start
        else:
            # Posted after its message arrived: it waited for its own rank; what it took
            # from its posting (a reduction into memory) is local work.
            if now > event.start + _EPSILON:
                segments.append(Segment("compute", rank, event.start, now, label=event.label))
            now = event.start
    return CriticalPath(tuple(reversed(segments)), tuple(stats.link for stats in result.links))


class _Spans:
    """One rank's spans by when they ended, to find the last one that ended by a time."""

    def __init__(self, trace: Sequence[TraceEvent], indices: Sequence[int]) -> None:
        self.order = sorted(indices, key=lambda i: trace[i].end)
        self.ends = [trace[i].end for i in self.order]

    def last(self, trace: Sequence[TraceEvent], used: set[int], now: float) -> int | None:
        """The span, not yet on the path, that ended last by ``now``; of those that ended
        together, a receive first."""
        best, best_key = None, None
        for at in range(bisect_right(self.ends, now + _EPSILON) - 1, -1, -1):
            i = self.order[at]
            if i in used:
                continue
            event = trace[i]
            if best_key is not None and event.end < best_key[0] - _EPSILON:
                break  # every later candidate ended earlier still
            key = (event.end, -_PREFERENCE[event.kind], event.start)
            if best_key is None or (abs(key[0] - best_key[0]) <= _EPSILON
                                    and key[1:] > best_key[1:]):
                best, best_key = i, key
        return best


def _slowest_link(hops: Sequence[Hop], sent: float) -> int:
    """The link where a message spent longest, waiting for it and crossing it; -1 for a
    message that crossed none (the channels' pipes are not links)."""
    best, longest, since = -1, -1.0, sent
    for hop in hops:
        spent = hop.end - since
        if spent > longest:
            best, longest = hop.link, spent
        since = hop.start
    return best


def _ranked(pairs: Iterable[tuple[int, float]]) -> dict[int, float]:
    totals: dict[int, float] = defaultdict(float)
    for key, seconds in pairs:
        totals[key] += seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _most(named: Sequence[tuple[str, float]], top: int) -> str:
    """The ``top`` largest (name, seconds), the most first, leaving out those under 1% of
    the whole, which would only crowd the line."""
    whole = sum(seconds for _, seconds in named)
    shown = [(name, t) for name, t in named[:top] if t >= 0.01 * whole]
    if not shown:
        return ""
    more = f", {len(named) - len(shown)} more" if len(named) > len(shown) else ""
    return "; most on " + ", ".join(f"{name} {seconds * 1e3:.3f} ms"
                                   for name, seconds in shown) + more
