"""The collective level: what a collective costs on a topology, without stepping through its
messages one by one.

The message-level engine (``simcomm.engine``) runs every op of every rank; a ring
all-reduce on p ranks is 2p(p-1) messages, hours of simulation at 16,384 ranks. Here a
collective's time comes from what its algorithm does step by step, computed for all ranks
at once (numpy arrays over the ranks):

* A message from rank i to its peer costs, uncontended, what the engine charges it: its
  route's latencies plus, on the slowest link of the route (the GPU's channel pipe
  included, ``Topology.injection_bandwidth``), its gap and its bytes over the bandwidth.
* A ring step (``algorithms.collectives.reduce_scatter``, ``all_gather``, and
  ``ring_allreduce``, one after the other) follows the engine's rules: rank i posts its
  send and its receive when its last step ends; its send arrives one message cost later,
  and completes then or when the right neighbour posts its receive, whichever is later
  (rendezvous); its receive completes when the left neighbour's message has arrived and,
  for a reduction, been reduced into the rank's memory; the step ends when both are done.
  So each rank's times follow from its neighbours' times of the step before.
* Where every step costs each rank the same (the buffer splits evenly), the ranks soon
  advance by one common amount per step; from then on the remaining steps are that amount
  each, exactly, and are not iterated.

Exactness: where no two of a collective's messages ever share a link (each ring hop has
links of its own: the ring, switch, fully-connected and hierarchical builders, and every
preset's rings), these times equal the message level's to rounding (``exact``). Where
hops share links (several rings through one NIC, an oversubscribed uplink), each shared
link is charged every hop that crosses it, as if all crossed it at once: a bound from
above, not exact. ``docs/scale.md`` measures both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from algorithms.buffers import split_even
from algorithms.collectives import all_gather, reduce_scatter, ring_allreduce
from algorithms.nccl import ring_slices
from algorithms.nccl_tree import TREE_CHUNK_BYTES
from algorithms.nvls import NVLS_CHANNELS, nvls_chunk_bytes, pipeline_chunks
from algorithms.ops import AVG, SUM, Choice, Comm, Protocol, ReduceOp, Sleep
from algorithms.tuned import (
    ALLREDUCE_ALGORITHMS, AUTO, choose, nccl_all_gather, nccl_allreduce, nccl_reduce_scatter,
)
from simcomm.buffers import SizeOnly
from simcomm.results import LinkStats, SimResult
from simcomm.topology import Topology
from simcomm.tuning import ModelTuner
from simcomm.units import format_bytes

LEVELS = ("message", "collective", "auto")
# ``auto`` runs the message level up to this many messages (a few seconds of simulation),
# the collective level beyond.
AUTO_MESSAGE_LIMIT = 200_000
# Ring steps iterated at most when the steps differ (an uneven split): beyond, every chunk
# is taken at the larger of its two sizes (one element more), a bound from above.
_MAX_UNEVEN_STEP_RANKS = 50_000_000
_NO_DATA = ("the collective level moves no data: give size-only buffers (SizeOnly), or run "
            "real data at the message level")


@dataclass(frozen=True)
class CollectiveCost:
    """A collective's cost at the collective level: when each rank finishes (seconds from a
    common start), how many messages it sends in all, the bytes each rank sends, each
    link's bytes and busy seconds (indexed as ``Topology.links``; None where the model
    does not follow the traffic), and whether the times are the message level's exactly
    (``exact``) or not (a bound from above, or an estimate)."""

    finish_times: np.ndarray
    messages: int
    sent_bytes: np.ndarray | None
    link_bytes: np.ndarray | None
    link_busy: np.ndarray | None
    exact: bool

    @property
    def time(self) -> float:
        """Seconds until the last rank finishes."""
        return float(self.finish_times.max()) if len(self.finish_times) else 0.0


class _Hops:
    """One message from each rank to a peer (``peers[i]``): per rank, its route's latency
    and, per link of the route (and the rank's channel pipe), the gap and the seconds per
    byte, so that a message of n bytes costs ``cost(n)``. Where several ranks' messages
    cross one link (``shared``), a message is charged its slowest link once more for every
    other message crossing a link of its route (a bound from above)."""

    def __init__(self, topology: Topology, peers: np.ndarray) -> None:
        p, links = topology.size, topology.links
        routes = [topology.route(i, int(peers[i])) for i in range(p)]
        width = max((len(route) for route in routes), default=0)
        # Routes as rows of link indices, padded with a link of no latency, no gap and
        # infinite bandwidth (index -1, the last entry of the arrays below).
        self.route = np.array([route + (-1,) * (width - len(route)) for route in routes],
                              dtype=np.int64).reshape(p, width)
        used = np.unique(self.route[self.route >= 0])
        self.latency_of, self.bandwidth_of, self.gap_of = (
            np.zeros(len(links) + 1), np.full(len(links) + 1, np.inf), np.zeros(len(links) + 1))
        for i in used.tolist():
            link = links[i]
            self.latency_of[i], self.bandwidth_of[i], self.gap_of[i] = (
                link.latency, link.bandwidth, link.gap)
        uses = np.bincount(self.route[self.route >= 0], minlength=len(links) + 1)
        uses[-1] = 1
        self.shared = bool((uses[:-1] > 1).any())
        self.latency = self.latency_of[self.route].sum(axis=1)
        self.gap = self.gap_of[self.route]
        self.per_byte = 1.0 / self.bandwidth_of[self.route]
        # A link serves one message at a time, and holds a message's head until its tail
        # has come from upstream: on a shared link each other message crossing it may go
        # first, and hold it up to as long as its whole way takes at its slowest link.
        self.crossing = 1.0 + (uses[self.route] - 1).sum(axis=1)
        if math.isfinite(topology.injection_bandwidth):  # the rank's channel pipe
            self.gap = np.hstack([self.gap, np.zeros((p, 1))])
            self.per_byte = np.hstack([self.per_byte,
                                       np.full((p, 1), 1.0 / topology.injection_bandwidth)])

    def cost(self, nbytes: np.ndarray) -> np.ndarray:
        """Seconds from posting to arrival of each rank's message of ``nbytes[rank]``."""
        if self.gap.shape[1] == 0:
            return self.latency.copy()
        slowest = (self.gap + nbytes[:, None] * self.per_byte).max(axis=1)
        return self.latency + (self.crossing * slowest if self.shared else slowest)

    def account(self, sent: np.ndarray, messages: np.ndarray, link_bytes: np.ndarray,
                link_busy: np.ndarray) -> None:
        """Add ``sent[rank]`` bytes in ``messages[rank]`` messages on each rank's route."""
        on_route = self.route >= 0
        ranks = np.nonzero(on_route)[0]
        crossed = self.route[on_route]
        np.add.at(link_bytes, crossed, sent[ranks])
        np.add.at(link_busy, crossed, messages[ranks] * self.gap_of[crossed]
                  + sent[ranks] / self.bandwidth_of[crossed])


def _ring_phase(start: np.ndarray, hops: _Hops, chunk_bytes: np.ndarray, offset: int,
                memory_seconds_per_byte: np.ndarray | None) -> np.ndarray:
    """Finish times of p-1 ring steps begun at ``start`` (per rank): at step s rank r sends
    chunk (r - s - offset) mod p to its right neighbour and receives the chunk its left
    neighbour sends, reducing it into memory if ``memory_seconds_per_byte`` is given."""
    p = len(start)
    steps = p - 1
    even = bool((chunk_bytes == chunk_bytes[0]).all()) if p else True
    if not even and steps * p > _MAX_UNEVEN_STEP_RANKS:
        chunk_bytes = np.full(p, chunk_bytes.max())  # one element more, a bound from above
        even = True
    ranks = np.arange(p)
    times = start.copy()
    steady = 0  # consecutive steps in which every rank advanced by the same amount
    for step in range(steps):
        sent = chunk_bytes if even else chunk_bytes[(ranks - step - offset) % p]
        arrive = times + hops.cost(sent)
        received_at = np.maximum(np.roll(arrive, 1), times)
        if memory_seconds_per_byte is not None:
            received_at = received_at + np.roll(sent, 1) * memory_seconds_per_byte
        send_done = np.maximum(arrive, np.roll(times, -1))
        after = np.maximum(send_done, received_at)
        if even:
            advance = after - times
            spread = float(advance.max() - advance.min())
            steady = steady + 1 if spread <= 1e-12 * float(advance.max()) else 0
            if steady == 2:  # the same step from here on: the rest add the same amount
                return after + (steps - step - 1) * float(advance.mean())
        times = after
    return times


def _chunk_bytes(count: int, itemsize: int, p: int) -> np.ndarray:
    # chunk_bounds' split: the first count % p chunks one element longer.
    base, extra = divmod(count, p)
    return ((base + (np.arange(p) < extra)) * itemsize).astype(float)


def _ring_collective(topology: Topology, count: int, itemsize: int, phases: list[str],
                     op: ReduceOp) -> CollectiveCost:
    p = topology.size
    chunks = _chunk_bytes(count, itemsize, p)
    times = np.zeros(p)
    sent = np.zeros(p)
    n_links = len(topology.links)
    link_bytes, link_busy = np.zeros(n_links), np.zeros(n_links)
    if p == 1:
        return CollectiveCost(times, 0, sent, link_bytes, link_busy, True)
    hops = _Hops(topology, (np.arange(p) + 1) % p)
    memory = 1.0 / np.asarray(topology.reduce_bandwidth, dtype=float)
    for phase in phases:
        if phase == "reduce-scatter":
            times = _ring_phase(times, hops, chunks, 1, memory)
            # Every chunk but its own goes out once; AVG divides the own chunk once.
            phase_sent = chunks.sum() - chunks
            if op is AVG:
                times = times + chunks * memory
        else:
            times = _ring_phase(times, hops, chunks, 0, None)
            phase_sent = chunks.sum() - np.roll(chunks, -1)  # all but the right's own chunk
        sent += phase_sent
        hops.account(phase_sent, np.full(p, p - 1), link_bytes, link_busy)
    messages = len(phases) * p * (p - 1)
    return CollectiveCost(times, messages, sent, link_bytes, link_busy, not hops.shared)


def _reduce_scatter_cost(topology: Topology, count: int, itemsize: int,
                         op: ReduceOp = SUM) -> CollectiveCost:
    return _ring_collective(topology, count, itemsize, ["reduce-scatter"], op)


def _all_gather_cost(topology: Topology, count: int, itemsize: int) -> CollectiveCost:
    return _ring_collective(topology, count, itemsize, ["all-gather"], SUM)


def _ring_allreduce_cost(topology: Topology, count: int, itemsize: int,
                         op: ReduceOp = SUM) -> CollectiveCost:
    return _ring_collective(topology, count, itemsize, ["reduce-scatter", "all-gather"], op)


def _parts(count: int, parts: int) -> list[int]:
    """Lengths of ``split_even``'s parts of ``count`` elements."""
    base, extra = divmod(count, parts)
    return [base + (i < extra) for i in range(parts)]


def _tuned_cost(topology: Topology, collective: str, count: int, itemsize: int,
                algorithm: str = AUTO, protocol: str = AUTO, channels: int = 0,
                algorithms: tuple[str, ...] = ("ring",)) -> CollectiveCost:
    """The cost of an NCCL-class collective of ``algorithms.tuned``: its choice made as the
    algorithm makes it (``choose``, with the model's tuner), and its time the tuner's
    estimate of that choice (``simcomm.tuning.ModelTuner.estimate``), which keeps within
    10% of the message level for rings and 45% for trees (``tests/test_tuning.py``): not
    exact, and no link traffic."""
    p, nbytes = topology.size, count * itemsize
    tuner = ModelTuner(topology)
    comm = Comm(0, p, topology.local_size, tuner)
    choice = choose(comm, collective, nbytes, algorithm, protocol, channels, algorithms)
    if choice.algorithm == "nvls":
        choice = Choice("nvls", Protocol.SIMPLE, choice.channels or NVLS_CHANNELS)
    elif not choice.channels:
        choice = Choice(choice.algorithm, choice.protocol, comm.ranks_per_node)
    if count == 0:  # NCCL drops an empty collective before it launches
        return CollectiveCost(np.zeros(p), 0, None, None, None, False)
    seconds = tuner.estimate(collective, choice, nbytes)
    messages = _tuned_messages(collective, choice, count, itemsize, comm)
    return CollectiveCost(np.full(p, seconds), messages, None, None, None, False)


def _nccl_allreduce_cost(topology: Topology, count: int, itemsize: int, op: ReduceOp = SUM,
                         algorithm: str = AUTO, protocol: str = AUTO, channels: int = 0
                         ) -> CollectiveCost:
    return _tuned_cost(topology, "allreduce", count, itemsize, algorithm, protocol, channels,
                       ALLREDUCE_ALGORITHMS)


def _nccl_reduce_scatter_cost(topology: Topology, count: int, itemsize: int,
                              op: ReduceOp = SUM, protocol: str = AUTO, channels: int = 0
                              ) -> CollectiveCost:
    return _tuned_cost(topology, "reducescatter", count, itemsize, AUTO, protocol, channels)


def _nccl_all_gather_cost(topology: Topology, count: int, itemsize: int, protocol: str = AUTO,
                          channels: int = 0) -> CollectiveCost:
    return _tuned_cost(topology, "allgather", count, itemsize, AUTO, protocol, channels)


def _tuned_messages(collective: str, choice: Choice, count: int, itemsize: int, comm: Comm
                    ) -> int:
    """The messages the message level sends for ``choice``, as the algorithms cut the
    buffer: per channel, a ring's p hops per step in slices, a tree's p - 1 edges up and
    down per chunk, NVLS's p (p - 1) sends into and out of the switch per chunk."""
    p = comm.size
    if p == 1:
        return 0
    parts = _parts(count, choice.channels)
    if choice.algorithm == "nvls":
        chunk = nvls_chunk_bytes(count * itemsize, choice.channels, p)
        return sum(2 * p * (p - 1) * min(pipeline_chunks(part * itemsize / p, chunk),
                                         part // p or 1) for part in parts)
    if choice.algorithm == "tree":
        return sum(2 * (p - 1) * max(1, math.ceil(part * itemsize / TREE_CHUNK_BYTES))
                   for part in parts)
    if collective == "allreduce":
        return sum(2 * p * (p - 1) * ring_slices(_parts(part, p)[0] * itemsize)
                   for part in parts)
    # A reduce-scatter's or all-gather's ring c moves part c of every rank's chunk; its
    # slices follow the chunk of the rank at its first position (rail_ring).
    first = [_parts(length, choice.channels) for length in _parts(count, p)]
    return sum(p * (p - 1) * ring_slices(first[c % comm.ranks_per_node][c] * itemsize)
               for c in range(choice.channels))


class _Model(NamedTuple):
    cost: Callable[..., CollectiveCost]  # (topology, elements, bytes per element, **params)
    messages: Callable[[int], int]  # ranks -> messages the message level would simulate
    result: Callable[[Comm, Any], Any] = lambda comm, buf: buf  # what a rank's call returns


def _own_chunk(comm: Comm, buf: Any) -> Any:
    return split_even(buf, comm.size)[comm.rank]


def _ring_messages(phases: int) -> Callable[[int], int]:
    return lambda p: phases * p * (p - 1)


MODELS: dict[Callable[..., Any], _Model] = {
    reduce_scatter: _Model(_reduce_scatter_cost, _ring_messages(1), _own_chunk),
    all_gather: _Model(_all_gather_cost, _ring_messages(1)),
    ring_allreduce: _Model(_ring_allreduce_cost, _ring_messages(2)),
    # At least one ring's messages: enough for auto to choose.
    nccl_allreduce: _Model(_nccl_allreduce_cost, _ring_messages(2)),
    nccl_reduce_scatter: _Model(_nccl_reduce_scatter_cost, _ring_messages(1), _own_chunk),
    nccl_all_gather: _Model(_nccl_all_gather_cost, _ring_messages(1)),
}


def has_model(algorithm: Callable[..., Any]) -> bool:
    """Whether ``algorithm`` has a cost at the collective level."""
    return algorithm in MODELS


def collective_cost(algorithm: Callable[..., Any], count: int, itemsize: int,
                    topology: Topology, /, **params: Any) -> CollectiveCost:
    """The cost of ``algorithm`` on ``topology`` with ``count`` elements of ``itemsize``
    bytes per rank, all ranks starting together; ``params`` go to the algorithm."""
    return _model(algorithm).cost(topology, count, itemsize, **params)


def _model(algorithm: Callable[..., Any]) -> _Model:
    model = MODELS.get(algorithm)
    if model is None:
        known = ", ".join(sorted(fn.__name__ for fn in MODELS))
        raise ValueError(f"no collective-level model of "
                         f"{getattr(algorithm, '__name__', algorithm)!r} (models exist for "
                         f"{known}): run it at the message level")
    return model


def choose_level(level: str, algorithm: Callable[..., Any], ranks: int,
                 size_only: bool = True, calls: int = 1) -> str:
    """The level a run at ``level`` takes: ``message`` or ``collective`` as asked; for
    ``auto`` the collective level where there is a model, the buffers are size-only and
    the message level would step through more than ``AUTO_MESSAGE_LIMIT`` messages in
    ``calls`` calls of the algorithm, else the message level."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if level == "auto":
        model = MODELS.get(algorithm)
        return ("collective" if size_only and model is not None
                and calls * model.messages(ranks) > AUTO_MESSAGE_LIMIT else "message")
    if level == "collective":
        _model(algorithm)
        if not size_only:
            raise ValueError(_NO_DATA)
    return level


def describe_level(asked: str, level: str) -> str:
    """What level ran (``level``, when ``asked`` for), in words, for reports."""
    how = ("every message simulated" if level == "message" else
           "each collective costed from the topology, no message simulated (docs/scale.md: "
           "where this is exact)")
    chose = (f" (auto: {'few' if level == 'message' else 'too many'} messages)"
             if asked == "auto" else "")
    return f"level: {level}{chose}: {how}"


def run_collective_level(algorithm: Callable[..., Any], inputs: Sequence[Any],
                         topology: Topology, /, **params: Any) -> SimResult:
    """``simulate``'s result at the collective level: times and link traffic from
    ``collective_cost``, no data (``results`` are None) and no op trace."""
    model = _model(algorithm)
    shapes = {(len(buf), np.dtype(buf.dtype)) for buf in inputs}
    if any(not isinstance(buf, SizeOnly) for buf in inputs):
        raise ValueError(_NO_DATA)
    if len(shapes) != 1:
        raise ValueError(f"the collective level needs one buffer length and dtype on every "
                         f"rank, got {len(shapes)} different ones")
    (count, dtype), = shapes
    cost = model.cost(topology, count, dtype.itemsize, **params)
    links = [] if cost.link_bytes is None or cost.link_busy is None else [
        LinkStats(link, int(cost.link_bytes[i]), float(cost.link_busy[i]))
        for i, link in enumerate(topology.links)]
    return SimResult([None] * topology.size, cost.time, cost.finish_times.tolist(), links, [],
                     cost.messages, level="collective", exact=cost.exact)


class TimedCollective:
    """``algorithm`` as one timed event, for a training step run at the collective level on
    one rank that stands for all (``simcomm.training``): called as the algorithm is, it
    sleeps (``Sleep``) for the collective's cost on ``topology`` and returns what the
    algorithm returns (size-only). ``costs`` lists every call's cost, in order."""

    def __init__(self, algorithm: Callable[..., Any], topology: Topology, /, **params: Any
                 ) -> None:
        self.model = _model(algorithm)
        self.algorithm, self.topology, self.params = algorithm, topology, params
        self.costs: list[CollectiveCost] = []
        self._known: dict[tuple[Any, ...], CollectiveCost] = {}
        self.__name__ = algorithm.__name__

    def __call__(self, comm: Comm, buf: Any, **params: Any) -> Generator[Any, Any, Any]:
        params = {**self.params, **params}
        key = (len(buf), buf.dtype, tuple(sorted(params.items(), key=lambda item: item[0])))
        cost = self._known.get(key)
        if cost is None:
            cost = self._known[key] = self.model.cost(self.topology, len(buf),
                                                      buf.dtype.itemsize, **params)
        self.costs.append(cost)
        yield Sleep(cost.time, f"{self.__name__} {format_bytes(buf.nbytes)}")
        return self.model.result(comm, buf)
