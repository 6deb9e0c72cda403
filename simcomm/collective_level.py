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

import inspect
import math
import sys
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from algorithms.buffers import split_even
from algorithms.collectives import (
    all_gather, all_to_all, broadcast, reduce, reduce_broadcast_allreduce, reduce_scatter,
    ring_allreduce,
)
from algorithms.nccl import (
    as_protocol, hierarchical_allreduce, nccl_ring_all_gather, nccl_ring_allreduce,
    nccl_ring_reduce_scatter, ring_slices,
)
from algorithms.nccl_tree import nccl_tree_allreduce, tree_chunk_bytes
from algorithms.nvls import (
    NVLS_CHANNELS, nvls_all_gather, nvls_allreduce, nvls_chunk_bytes, nvls_reduce_scatter,
    nvls_tree_allreduce, nvls_tree_chunk_bytes,
    pipeline_chunks,
)
from algorithms.ops import (
    AVG, SUM, Choice, Comm, Launch, Protocol, ReduceOp, Sleep, Tuner, check_channels,
    check_divisible, check_flag, check_root,
)
from algorithms.tuned import (
    ALLREDUCE_ALGORITHMS, AUTO, IN_SWITCH, ONE_WAY_ALGORITHMS, choose,
    nccl_all_gather, nccl_allreduce, nccl_reduce_scatter, no_switch_reason,
)
from simcomm.buffers import SizeOnly
from simcomm.results import SimResult, link_stats
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
_HEAD_RESOLUTION = 1e15  # per second: heads are compared to a femtosecond (see _Traffic)
_TICK_NOISE = 1e-20  # seconds: ten of the engine's ticks, what its rounding of latencies makes
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
    choice: Choice | None = None  # an NCCL-class collective's algorithm, protocol, channels

    @property
    def time(self) -> float:
        """Seconds until the last rank finishes."""
        return float(self.finish_times.max()) if len(self.finish_times) else 0.0


class Machine:
    """What a collective is costed on: the topology, the model's estimates of NCCL-class
    choices (``simcomm.tuning.ModelTuner``, which keeps what it works out once), and the
    tuner that makes those choices (``Comm.tuner``: the model's own unless given)."""

    def __init__(self, topology: Topology, tuner: Tuner | None = None) -> None:
        if tuner is not None and not callable(tuner):
            raise TypeError(f"tuner must be callable (collective, nbytes) -> Choice, got "
                            f"{tuner!r}")
        self.topology = topology
        self.estimator = ModelTuner(topology)
        self.tuner = self.estimator if tuner is None else tuner


class _Hops:
    """One message from each rank to a peer (``peers[i]``): per rank, its route's latency
    and, per link of the route (and the rank's channel pipe), the gap and the seconds per
    byte, so that a message of n bytes costs ``cost(n)``. Where several ranks' messages
    cross one link (``shared``), a message is charged its slowest link once more for every
    other message crossing a link of its route (a bound from above)."""

    def __init__(self, topology: Topology, peers: np.ndarray) -> None:
        p, links = topology.size, topology.links
        # Routes as rows of link indices, padded with -1: a link of no latency, no gap and
        # infinite bandwidth (the last entry of the arrays below).
        self.route = topology.route_matrix(np.arange(p), peers)
        uses = np.bincount(self.route[self.route >= 0], minlength=len(links) + 1)
        self.latency_of, self.bandwidth_of, self.gap_of = (
            np.zeros(len(links) + 1), np.full(len(links) + 1, np.inf), np.zeros(len(links) + 1))
        for i in np.flatnonzero(uses).tolist():
            link = links[i]
            self.latency_of[i], self.bandwidth_of[i], self.gap_of[i] = (
                link.latency, link.bandwidth, link.gap)
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


def _reduce_scatter_cost(machine: Machine, count: int, itemsize: int,
                         op: ReduceOp = SUM) -> CollectiveCost:
    return _ring_collective(machine.topology, count, itemsize, ["reduce-scatter"], op)


def _all_gather_cost(machine: Machine, count: int, itemsize: int) -> CollectiveCost:
    return _ring_collective(machine.topology, count, itemsize, ["all-gather"], SUM)


def _ring_allreduce_cost(machine: Machine, count: int, itemsize: int,
                         op: ReduceOp = SUM) -> CollectiveCost:
    return _ring_collective(machine.topology, count, itemsize, ["reduce-scatter", "all-gather"],
                            op)


def _in_turn(start: np.ndarray, cost: np.ndarray, before: float) -> np.ndarray:
    """When each of jobs served one at a time in the order given ends: job k begins at
    ``start[k]`` or when job k - 1 ends, whichever is later (and not before ``before``),
    and takes ``cost[k]``. The recurrence end_k = max(start_k, end_k-1) + cost_k sums to
    end_k = C_k + max(before, max over j <= k of start_j - C_j-1), C the running cost."""
    ran = np.cumsum(cost)
    return ran + np.maximum.accumulate(np.maximum(start - (ran - cost), before))


class _Traffic:
    """Messages sent in batches (one message per row), each following the engine's rules
    link by link (cut-through: a head enters a free link and goes on after its latency;
    the link holds the message for its gap and bytes, ending no earlier than the tail comes
    from upstream). Messages of one burst (one rank's sends posted together, or the sends
    of many ranks to one) queue behind each other on the links they share, in the order
    given. Every message's time on every link is kept: if two messages of different bursts
    ever hold one link at once, or a message of a burst went first though another's head
    came earlier, the engine would have served the link otherwise, and the times are not
    exact (``contended``)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        links, p = topology.links, topology.size
        # Indices: the links, then each rank's channel pipe, then a link that costs nothing.
        self.sentinel = len(links) + p
        self.latency = np.zeros(self.sentinel + 1)
        self.gap = np.zeros(self.sentinel + 1)
        self.per_byte = np.zeros(self.sentinel + 1)
        self.pipes = math.isfinite(topology.injection_bandwidth)
        if self.pipes:
            self.per_byte[len(links):self.sentinel] = 1.0 / topology.injection_bandwidth
        self.known = np.zeros(len(links), dtype=bool)
        self.free = np.full(self.sentinel + 1, -np.inf)  # within the current burst
        self.owner = np.full(self.sentinel + 1, -1)  # the burst that last used the link
        # Per hop of a batch: link, head's arrival at it, enter, end, burst, and the batch.
        self.holds: list[tuple[np.ndarray, ...]] = []
        self.bytes = np.zeros(len(links))
        self.busy = np.zeros(len(links))
        self.messages = 0

    def send(self, src: np.ndarray, dst: np.ndarray, nbytes: float | np.ndarray,
             post: np.ndarray, burst: np.ndarray) -> np.ndarray:
        """Send ``nbytes`` (one size, or one per message) from each ``src`` to its ``dst``,
        posted at ``post``, each the next message of its ``burst``; return when each
        arrives."""
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape)
        rows = self.topology.route_matrix(src, dst)
        rows[rows < 0] = self.sentinel
        self._learn(rows)
        if self.pipes:
            rows = np.hstack([(len(self.topology.links) + src)[:, None], rows])
        head, tail = post.astype(float), np.full(len(src), -np.inf)
        for k in range(rows.shape[1]):
            link = rows[:, k]
            occupancy = self.gap[link] + nbytes * self.per_byte[link]
            before = np.where(self.owner[link] == burst, self.free[link], -np.inf)
            # On an idle link a message starts once its head is there and no earlier than
            # its tail's arrival from upstream allows.
            start = np.maximum(head, tail - occupancy)
            enter, end = self._queue(link, burst, head, start, occupancy, before)
            real = link != self.sentinel
            self.free[link[real]], self.owner[link[real]] = end[real], burst[real]
            # Where a link took several messages of its (new) owner's burst, the last
            # served ends last.
            same = real & (burst == self.owner[link])
            np.maximum.at(self.free, link[same], end[same])
            self.holds.append((link[real], head[real], enter[real], end[real], burst[real],
                               np.full(int(real.sum()), self.messages)))
            wire = real & (link < len(self.topology.links))
            np.add.at(self.bytes, link[wire], nbytes[wire])
            np.add.at(self.busy, link[wire], occupancy[wire])
            tail = end + self.latency[link]
            head = enter + self.latency[link]
        self.messages += len(src)
        return tail

    def _queue(self, link: np.ndarray, burst: np.ndarray, head: np.ndarray,
               start: np.ndarray, occupancy: np.ndarray, before: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """When each message enters its ``link`` and leaves it free: after the last message
        of its burst sent there before (``before``), and behind the messages of its burst
        on that link in this batch whose heads came first (at one instant: earlier rows
        first, as the engine serves them in send order): end_k = max(start_k, end_k-1) +
        occupancy_k (``_in_turn``)."""
        enter, end = np.maximum(head, before), np.maximum(start, before) + occupancy
        real = np.flatnonzero(link != self.sentinel)
        groups, which, counts = np.unique(link[real] * (self.topology.size + 1) + burst[real],
                                          return_inverse=True, return_counts=True)
        for group in np.flatnonzero(counts > 1):
            rows = real[which == group]
            # By head, then row. Heads within a femtosecond count as one instant: float sums
            # of latencies differ by an ulp where the engine's whole ticks tie, and a
            # latency below its tick (1e-21 s) is none to the engine.
            rows = rows[np.lexsort((rows, np.round(head[rows] * _HEAD_RESOLUTION)))]
            end[rows] = _in_turn(start[rows], occupancy[rows], before[rows[0]])
            enter[rows] = np.maximum(head[rows], np.concatenate(([before[rows[0]]],
                                                                end[rows[:-1]])))
        return enter, end

    def _learn(self, rows: np.ndarray) -> None:
        new = np.unique(rows[rows < len(self.topology.links)])
        new = new[~self.known[new]]
        for i in new.tolist():
            link = self.topology.links[i]
            self.latency[i], self.gap[i] = link.latency, link.gap
            self.per_byte[i] = 1.0 / link.bandwidth
        self.known[new] = True

    def delivered(self) -> np.ndarray:
        """Per rank, a time it cannot have received everything before: a link into it
        carries one message at a time, so its last message's tail arrives no earlier than
        the first head came, plus every message's time on the link, plus its latency."""
        topology = self.topology
        rank_of = {node: rank for rank, node in enumerate(topology.ranks)}
        into = np.array([rank_of.get(link.dst, -1) for link in topology.links])
        bound = np.full(topology.size, -np.inf)
        if not self.holds:
            return bound
        link, head = (np.concatenate(parts) for parts in list(zip(*self.holds))[:2])
        wire = link < len(topology.links)
        first = np.full(len(topology.links), np.inf)
        np.minimum.at(first, link[wire], head[wire])
        used = np.isfinite(first) & (into >= 0)
        np.maximum.at(bound, into[used], first[used] + self.busy[used] + self.latency[:len(
            topology.links)][used])
        return bound

    @property
    def contended(self) -> bool:
        """Whether the engine might have served some link otherwise: two messages held it
        at once (touching is fine); one whose head came later went first (a burst's
        messages queue in the order given, the engine's in the order their heads come),
        heads within a femtosecond included, which ``_queue`` takes as one instant where
        the engine's tick tells them apart; or the heads of two bursts' messages of two
        batches came at one instant (the engine then goes by the order it scheduled them
        in, which the batches need not follow)."""
        if not self.holds:
            return False
        link, head, enter, end, burst, batch = (np.concatenate(parts)
                                                for parts in zip(*self.holds))
        order = np.lexsort((end, enter, link))
        link, enter, end = link[order], enter[order], end[order]
        burst, batch, exact = burst[order], batch[order], head[order]
        head = np.round(exact * _HEAD_RESOLUTION)  # one instant as in _queue
        # Beyond float sums' noise and a few of the engine's ticks, a later head went first.
        overtaken = exact[1:] < exact[:-1] - (1e-12 * np.abs(exact[:-1]) + _TICK_NOISE)
        same = link[1:] == link[:-1]
        tie = ((head[1:] == head[:-1]) & (batch[1:] != batch[:-1])
               & (burst[1:] != burst[:-1]))
        return bool((same & ((enter[1:] < end[:-1]) | (head[1:] < head[:-1]) | overtaken
                             | tie)).any())


def _binomial_reduce(traffic: _Traffic, times: np.ndarray, root: int, nbytes: float,
                     memory: np.ndarray, op: ReduceOp) -> np.ndarray:
    """``collectives.reduce(tree=True)``: round by round, the ranks whose relative number
    has the round's bit send to the one without it and stop; the receivers reduce."""
    p, times = len(times), times.copy()
    relative = np.arange(p)
    mask = 1
    while mask < p:
        senders = relative[(relative % (2 * mask)) == mask]
        if len(senders):
            src, dst = (senders + root) % p, (senders - mask + root) % p
            arrive = traffic.send(src, dst, nbytes, times[src], src)
            matched = np.maximum(arrive, times[dst])
            times[src] = matched  # the send completes once the receive is posted
            times[dst] = matched + nbytes * memory[dst]
        mask <<= 1
    if op is AVG and p > 1 and nbytes > 0:
        times[root] += nbytes * memory[root]
    return times


def _binomial_broadcast(traffic: _Traffic, times: np.ndarray, root: int, nbytes: float
                        ) -> np.ndarray:
    """``collectives.broadcast(tree=True)``: each rank receives once, from the rank that
    differs in its lowest set bit, then sends to its children, largest subtree first, all
    posted together (one burst), and waits for them all."""
    p = len(times)
    relative = np.arange(p)
    received = times.copy()  # when each rank has the data (the root at once)
    finish = times.copy()
    top = 1 << max(p - 1, 0).bit_length()  # the first power of two >= p
    # Parents before children: by the number of set bits of the relative rank.
    ones = np.array([bin(v).count("1") for v in range(p)])
    for level in range(int(ones.max(initial=0)) + 1):
        parents = relative[ones == level]
        lowest = np.where(parents == 0, top, parents & -parents)
        step = lowest >> 1
        while True:  # the j-th send of every parent that has a j-th child
            # Skip the offsets past the last rank: those children do not exist.
            while True:
                absent = (step > 0) & (parents + step >= p)
                if not absent.any():
                    break
                step = np.where(absent, step >> 1, step)
            sending = step > 0
            if not sending.any():
                break
            q, child = parents[sending], parents[sending] + step[sending]
            src, dst = (q + root) % p, (child + root) % p
            arrive = traffic.send(src, dst, nbytes, received[src], src)
            done = np.maximum(arrive, times[dst])  # the child posted its receive at start
            received[dst] = done
            finish[dst] = np.maximum(finish[dst], done)
            np.maximum.at(finish, src, done)  # the parent waits for all its sends
            step = np.where(sending, step >> 1, step)
    return finish


def _flat_reduce(traffic: _Traffic, times: np.ndarray, root: int, nbytes: float,
                 memory: np.ndarray, op: ReduceOp) -> np.ndarray:
    """``collectives.reduce(tree=False)``: every other rank sends to the root, which posts
    all its receives at once and reduces each message into its memory as it comes, one at a
    time."""
    p, times = len(times), times.copy()
    others = np.flatnonzero(np.arange(p) != root)
    if len(others):
        # One burst: they queue on the root's links in rank order, as the engine's sends,
        # posted in rank order, reach them at one instant.
        arrive = traffic.send(others, np.full(len(others), root), nbytes, times[others],
                              np.full(len(others), root))
        landed = np.sort(np.maximum(arrive, times[root]))
        times[others] = np.maximum(arrive, times[root])  # a send completes once received
        # The root's memory reduces the messages one at a time, as they land.
        times[root] = _in_turn(landed, np.full(len(landed), nbytes * memory[root]),
                               times[root])[-1]
    if op is AVG and p > 1 and nbytes > 0:
        times[root] += nbytes * memory[root]
    return times


def _flat_broadcast(traffic: _Traffic, times: np.ndarray, root: int, nbytes: float
                    ) -> np.ndarray:
    """``collectives.broadcast(tree=False)``: the root sends to every other rank, all
    posted at once (one burst, in rank order), and waits for them all."""
    p, times = len(times), times.copy()
    others = np.flatnonzero(np.arange(p) != root)
    if len(others):
        arrive = traffic.send(np.full(len(others), root), others, nbytes, np.full(
            len(others), times[root]), np.full(len(others), root))
        done = np.maximum(arrive, times[others])  # each receive was posted at its start
        times[others] = done
        times[root] = max(float(times[root]), float(done.max()))
    return times


def _tree_reduce_cost(machine: Machine, count: int, itemsize: int, root: int = 0,
                      op: ReduceOp = SUM, tree: bool = False) -> CollectiveCost:
    return _tree_cost(machine.topology, count * itemsize, root, tree, op, ["reduce"])


def _tree_broadcast_cost(machine: Machine, count: int, itemsize: int, root: int = 0,
                         tree: bool = False) -> CollectiveCost:
    return _tree_cost(machine.topology, count * itemsize, root, tree, SUM, ["broadcast"])


def _reduce_broadcast_cost(machine: Machine, count: int, itemsize: int, op: ReduceOp = SUM,
                           root: int = 0, tree: bool = False) -> CollectiveCost:
    return _tree_cost(machine.topology, count * itemsize, root, tree, op,
                      ["reduce", "broadcast"])


def _tree_cost(topology: Topology, nbytes: int, root: int, tree: bool, op: ReduceOp,
               phases: list[str]) -> CollectiveCost:
    p = topology.size
    check_root(root, p)
    check_flag(tree, "tree")
    traffic, times = _Traffic(topology), np.zeros(p)
    memory = 1.0 / np.asarray(topology.reduce_bandwidth, dtype=float)
    for phase in phases:
        if phase == "reduce":
            times = (_binomial_reduce if tree else _flat_reduce)(traffic, times, root, nbytes,
                                                                memory, op)
        else:
            times = (_binomial_broadcast if tree else _flat_broadcast)(traffic, times, root,
                                                                      nbytes)
    # A reduce sends the buffer once from every rank but the root; a broadcast once per child
    # (the root's p - 1 in the flat form).
    sent = sum(((np.arange(p) != root) * float(nbytes) if phase == "reduce"
                else _broadcast_sent(p, root, nbytes, tree)) for phase in phases)
    return CollectiveCost(times, traffic.messages, sent, traffic.bytes, traffic.busy,
                          not traffic.contended)


def _broadcast_sent(p: int, root: int, nbytes: int, tree: bool) -> np.ndarray:
    """Bytes each rank sends in a broadcast: one buffer per child of the binomial tree, or
    the root's one to every other rank."""
    children = np.zeros(p)
    if not tree:
        children[root] = p - 1
        return children * nbytes
    for v in range(1, p):
        children[((v - (v & -v)) + root) % p] += 1
    return children * nbytes


def _all_to_all_cost(machine: Machine, count: int, itemsize: int,
                     split_sizes_matrix: Any = None) -> CollectiveCost:
    """``collectives.all_to_all`` with the even split: each rank copies its own chunk, then
    posts its sends to the ranks after it in turn (one burst, queued on its links) and its
    receives; a send completes once it has arrived and its receiver has posted. Messages of
    different ranks that meet on a link are let through side by side, so the times are a
    bound from below (equal to the message level's where none meet), raised where a rank's
    own links cannot bring in all it receives sooner (``_Traffic.delivered``). Every one of
    the p (p - 1) routes is walked: seconds for a few thousand ranks, not more."""
    if split_sizes_matrix is not None:
        raise ValueError("the collective level times all_to_all's even split: leave "
                         "split_sizes_matrix out, or run at the message level")
    topology = machine.topology
    p = topology.size
    chunk = np.array(_parts(count, p), dtype=float) * itemsize  # chunk j goes to rank j
    ranks = np.arange(p)
    posted = chunk / np.asarray(topology.reduce_bandwidth, dtype=float)  # the own copy
    finish, traffic = posted.copy(), _Traffic(topology)
    for shift in range(1, p):
        dst = (ranks + shift) % p
        done = np.maximum(traffic.send(ranks, dst, chunk[dst], posted, ranks),
                          posted[dst])
        finish = np.maximum(finish, done)  # the sender waits for it
        finish[dst] = np.maximum(finish[dst], done)  # and so does the receiver
    finish = np.maximum(finish, traffic.delivered())
    sent = chunk.sum() - chunk
    # Never called exact: where messages of different ranks reach a link at one instant
    # (empty chunks, say) the engine may take them in another order than the shifts do.
    return CollectiveCost(finish, traffic.messages, sent, traffic.bytes, traffic.busy, False)


def _all_to_all_result(comm: Comm, buf: Any) -> Any:
    # What the rank receives: its chunk of every rank's buffer, all of one length.
    return SizeOnly(comm.size * _parts(len(buf), comm.size)[comm.rank], buf.dtype)


def _parts(count: int, parts: int) -> list[int]:
    """Lengths of ``split_even``'s parts of ``count`` elements."""
    base, extra = divmod(count, parts)
    return [base + (i < extra) for i in range(parts)]


def _tuned_cost(machine: Machine, collective: str, count: int, itemsize: int,
                algorithm: str = AUTO, protocol: str = AUTO, channels: int = 0,
                algorithms: tuple[str, ...] = ("ring",), no_switch: str = ""
                ) -> CollectiveCost:
    """The cost of an NCCL-class collective of ``algorithms.tuned``: its choice made as the
    algorithm makes it (``choose``, with the machine's tuner), timed by ``_estimated``."""
    topology = machine.topology
    comm = Comm(0, topology.size, topology.local_size, machine.tuner)
    choice = choose(comm, collective, count * itemsize, algorithm, protocol, channels,
                    algorithms, no_switch)
    if choice.algorithm in IN_SWITCH and not choice.channels:  # as the algorithms default
        choice = Choice(choice.algorithm, choice.protocol, topology.nvls_channels)
    if count == 0:  # NCCL drops an empty collective before it launches
        return CollectiveCost(np.zeros(topology.size), 0, None, None, None, False)
    return _estimated(machine, collective, choice, count, itemsize)


def _estimated(machine: Machine, collective: str, choice: Choice, count: int, itemsize: int,
               chunk_bytes: int = 0) -> CollectiveCost:
    """``choice`` timed by the model's estimate (``simcomm.tuning.ModelTuner.estimate``; a
    tree in chunks of ``chunk_bytes``, 0: NCCL's): not exact (``benchmarks/level_error.py``
    measures it against the message level), and no link traffic."""
    topology, estimator = machine.topology, machine.estimator
    comm = Comm(0, topology.size, topology.local_size)
    check_channels(choice.channels, "one per rank of a node")
    if not choice.channels:
        choice = Choice(choice.algorithm, choice.protocol, comm.ranks_per_node)
    if choice.algorithm == "nvls" and topology.size > 1 and not estimator.has_nvls():
        raise ValueError("nvls at the collective level needs one node whose switch reduces "
                         "(Topology.reducing_switches): run it at the message level")
    if choice.algorithm == "nvls_tree" and not topology.reducing_switches:
        raise ValueError("nvls_tree at the collective level needs switches that reduce "
                         "(Topology.reducing_switches): run it at the message level")
    seconds = estimator.estimate(collective, choice, count * itemsize, chunk_bytes)
    messages = _tuned_messages(collective, choice, count, itemsize, comm, chunk_bytes)
    return CollectiveCost(np.full(topology.size, seconds), messages, None, None, None, False,
                          choice)


def _forced(collective: str, algorithm: str) -> Callable[..., CollectiveCost]:
    """The cost of an NCCL-class algorithm called directly (``nccl_ring_allreduce`` and
    co.): its algorithm, protocol and channels as given, timed by ``_estimated``."""
    def cost(machine: Machine, count: int, itemsize: int, *, channels: int,
             protocol: Protocol | str = Protocol.SIMPLE, chunk_bytes: int = 0) -> CollectiveCost:
        if chunk_bytes and algorithm != "tree":
            raise ValueError(f"the collective level times {algorithm} in NCCL's own chunks: "
                             "leave chunk_bytes out, or run at the message level")
        if type(chunk_bytes) is not int or chunk_bytes < 0:  # as the algorithm says it
            raise ValueError(f"chunk_bytes must be an int >= 0 (0: NCCL's), got "
                             f"{chunk_bytes!r}")
        choice = Choice(algorithm, as_protocol(protocol), channels)
        return _estimated(machine, collective, choice, count, itemsize, chunk_bytes)
    return cost


def _nccl_ring_allreduce_cost(machine: Machine, count: int, itemsize: int,
                              op: ReduceOp = SUM, channels: int = 0,
                              protocol: Protocol | str = "simple") -> CollectiveCost:
    return _forced("allreduce", "ring")(machine, count, itemsize, channels=channels,
                                        protocol=protocol)


def _nccl_ring_reduce_scatter_cost(machine: Machine, count: int, itemsize: int,
                                   op: ReduceOp = SUM, channels: int = 0,
                                   protocol: Protocol | str = "simple") -> CollectiveCost:
    return _forced("reducescatter", "ring")(machine, count, itemsize, channels=channels,
                                            protocol=protocol)


def _nccl_ring_all_gather_cost(machine: Machine, count: int, itemsize: int,
                               channels: int = 0, protocol: Protocol | str = "simple"
                               ) -> CollectiveCost:
    return _forced("allgather", "ring")(machine, count, itemsize, channels=channels,
                                        protocol=protocol)


def _nccl_tree_allreduce_cost(machine: Machine, count: int, itemsize: int,
                              op: ReduceOp = SUM, channels: int = 0,
                              protocol: Protocol | str = "simple",
                              chunk_bytes: int = 0) -> CollectiveCost:
    return _forced("allreduce", "tree")(machine, count, itemsize, channels=channels,
                                        protocol=protocol, chunk_bytes=chunk_bytes)


def _in_switch(algorithm: str, collective: str = "allreduce") -> Callable[..., CollectiveCost]:
    """The cost of ``nvls_allreduce``, ``nvls_tree_allreduce`` or (``collective``)
    ``nvls_reduce_scatter`` and ``nvls_all_gather`` (which takes no ``op``) called
    directly: Simple, on the channels given (NCCL's 16 by default), buffers not
    registered."""
    def cost(machine: Machine, count: int, itemsize: int, op: ReduceOp = SUM,
             channels: int = NVLS_CHANNELS, chunk_bytes: int = 0, registered: bool = False
             ) -> CollectiveCost:
        check_channels(channels)
        if registered is not False:
            raise ValueError("the collective level times buffers NCCL does not know "
                             "(registered=False): run registered buffers at the message level")
        return _forced(collective, algorithm)(machine, count, itemsize, channels=channels,
                                              chunk_bytes=chunk_bytes)
    return cost


def _nvls_all_gather_cost(machine: Machine, count: int, itemsize: int,
                          channels: int = NVLS_CHANNELS, chunk_bytes: int = 0,
                          registered: bool = False) -> CollectiveCost:
    return _in_switch("nvls", "allgather")(machine, count, itemsize, channels=channels,
                                            chunk_bytes=chunk_bytes, registered=registered)


def _hierarchical_allreduce_cost(machine: Machine, count: int, itemsize: int,
                                 op: ReduceOp = SUM, protocol: Protocol | str = "simple"
                                 ) -> CollectiveCost:
    choice = Choice("hierarchical", as_protocol(protocol), 1)
    return _estimated(machine, "allreduce", choice, count, itemsize)


def _nccl_allreduce_cost(machine: Machine, count: int, itemsize: int, op: ReduceOp = SUM,
                         algorithm: str = AUTO, protocol: str = AUTO, channels: int = 0, *,
                         dtype: Any = None) -> CollectiveCost:
    return _tuned_cost(machine, "allreduce", count, itemsize, algorithm, protocol, channels,
                       ALLREDUCE_ALGORITHMS, _no_switch(dtype, op))


def _nccl_reduce_scatter_cost(machine: Machine, count: int, itemsize: int,
                              op: ReduceOp = SUM, algorithm: str = AUTO, protocol: str = AUTO,
                              channels: int = 0, *, dtype: Any = None) -> CollectiveCost:
    return _tuned_cost(machine, "reducescatter", count, itemsize, algorithm, protocol,
                       channels, ONE_WAY_ALGORITHMS, _no_switch(dtype, op))


def _no_switch(dtype: Any, op: ReduceOp) -> str:
    # Without the dtype (collective_cost is given an item size), as for a sum.
    return "" if dtype is None else no_switch_reason(dtype, op)


def _nccl_all_gather_cost(machine: Machine, count: int, itemsize: int, algorithm: str = AUTO,
                          protocol: str = AUTO, channels: int = 0) -> CollectiveCost:
    return _tuned_cost(machine, "allgather", count, itemsize, algorithm, protocol, channels,
                       ONE_WAY_ALGORITHMS)


def _tuned_messages(collective: str, choice: Choice, count: int, itemsize: int, comm: Comm,
                    chunk_bytes: int = 0) -> int:
    """The messages the message level sends for ``choice``, as the algorithms cut the
    buffer: per channel, a ring's p hops per step in slices, a tree's p - 1 edges up and
    down per chunk, NVLS's p (p - 1) sends into and out of the switch per chunk; the
    hierarchical all-reduce's rings in nodes and along rails, in slices."""
    p = comm.size
    if p == 1:
        return 0
    if choice.algorithm == "nvls_tree":  # per chunk: in the switch both ways, rails' trees
        per_node = comm.ranks_per_node
        nodes = p // per_node
        chunk = nvls_tree_chunk_bytes(count * itemsize, choice.channels, per_node, nodes)
        per_chunk = 2 * p * (per_node - 1) + 2 * per_node * (nodes - 1)
        return sum(per_chunk * min(pipeline_chunks(part * itemsize / per_node, chunk),
                                   part // per_node or 1)
                   for part in _parts(count, choice.channels))
    if choice.algorithm == "hierarchical":
        per_node = comm.ranks_per_node
        nodes = p // per_node
        chunks = _parts(count, per_node)  # local rank j's chunk goes along rail j
        within = 2 * p * (per_node - 1) * ring_slices(chunks[0] * itemsize, choice.protocol)
        return within + sum(2 * nodes * (nodes - 1)
                            * ring_slices(_parts(chunk, nodes)[0] * itemsize, choice.protocol)
                            for chunk in chunks)
    if choice.algorithm == "nvls" and collective != "allreduce":
        # Per channel and piece, each rank sends into the switch to, or receives from, every
        # other; pieces as the first rank's part has bytes and the last one elements.
        chunk = nvls_chunk_bytes(count * itemsize, choice.channels, p)
        first, last = (_parts(length, choice.channels)
                       for length in (_parts(count, p)[0], _parts(count, p)[-1]))
        return sum(p * (p - 1) * min(pipeline_chunks(a * itemsize, chunk), b or 1)
                   for a, b in zip(first, last))
    parts = _parts(count, choice.channels)
    if choice.algorithm == "nvls":
        chunk = nvls_chunk_bytes(count * itemsize, choice.channels, p)
        return sum(2 * p * (p - 1) * min(pipeline_chunks(part * itemsize / p, chunk),
                                         part // p or 1) for part in parts)
    if choice.algorithm == "tree":
        chunk = chunk_bytes or tree_chunk_bytes(choice.protocol, count * itemsize,
                                                choice.channels, p // comm.ranks_per_node,
                                                comm.ranks_per_node)
        return sum(2 * (p - 1) * max(1, min(part, math.ceil(part * itemsize / chunk)))
                   for part in parts)
    if collective == "allreduce":
        return sum(2 * p * (p - 1) * ring_slices(_parts(part, p)[0] * itemsize, choice.protocol)
                   for part in parts)
    # A reduce-scatter's or all-gather's ring c moves part c of every rank's chunk; its
    # slices follow the chunk of the rank at its first position (rail_ring).
    first = [_parts(length, choice.channels) for length in _parts(count, p)]
    return sum(p * (p - 1)
               * ring_slices(first[c % comm.ranks_per_node][c] * itemsize, choice.protocol)
               for c in range(choice.channels))


class _Model(NamedTuple):
    cost: Callable[..., CollectiveCost]  # (topology, elements, bytes per element, **params)
    messages: Callable[[int], int]  # ranks -> messages the message level would simulate
    result: Callable[[Comm, Any], Any] = lambda comm, buf: buf  # what a rank's call returns
    # Whether cost takes the element type too (dtype=): NCCL's choice of NVLS depends on it.
    typed: bool = False

    def cost_of(self, machine: Machine, count: int, dtype: Any, **params: Any
                ) -> CollectiveCost:
        """``cost`` for ``count`` elements of ``dtype`` (a numpy dtype)."""
        typed = {"dtype": dtype} if self.typed else {}
        return self.cost(machine, count, dtype.itemsize, **params, **typed)


def _own_chunk(comm: Comm, buf: Any) -> Any:
    return split_even(buf, comm.size)[comm.rank]


def _ring_messages(phases: int) -> Callable[[int], int]:
    return lambda p: phases * p * (p - 1)


MODELS: dict[Callable[..., Any], _Model] = {
    reduce_scatter: _Model(_reduce_scatter_cost, _ring_messages(1), _own_chunk),
    all_gather: _Model(_all_gather_cost, _ring_messages(1)),
    ring_allreduce: _Model(_ring_allreduce_cost, _ring_messages(2)),
    # At least one ring's messages: enough for auto to choose.
    nccl_allreduce: _Model(_nccl_allreduce_cost, _ring_messages(2), typed=True),
    nccl_reduce_scatter: _Model(_nccl_reduce_scatter_cost, _ring_messages(1), _own_chunk,
                                typed=True),
    nccl_all_gather: _Model(_nccl_all_gather_cost, _ring_messages(1)),
    nccl_ring_allreduce: _Model(_nccl_ring_allreduce_cost, _ring_messages(2)),
    nccl_ring_reduce_scatter: _Model(_nccl_ring_reduce_scatter_cost, _ring_messages(1),
                                     _own_chunk),
    nccl_ring_all_gather: _Model(_nccl_ring_all_gather_cost, _ring_messages(1)),
    nccl_tree_allreduce: _Model(_nccl_tree_allreduce_cost, lambda p: 2 * (p - 1)),
    reduce: _Model(_tree_reduce_cost, lambda p: p - 1),
    broadcast: _Model(_tree_broadcast_cost, lambda p: p - 1),
    reduce_broadcast_allreduce: _Model(_reduce_broadcast_cost, lambda p: 2 * (p - 1)),
    all_to_all: _Model(_all_to_all_cost, lambda p: p * (p - 1), _all_to_all_result),
    nvls_allreduce: _Model(_in_switch("nvls"), lambda p: 2 * p * (p - 1)),
    nvls_reduce_scatter: _Model(_in_switch("nvls", "reducescatter"), _ring_messages(1),
                                _own_chunk),
    nvls_all_gather: _Model(_nvls_all_gather_cost, _ring_messages(1)),
    # A tree's 2 (p - 1) messages at least (one GPU a node).
    nvls_tree_allreduce: _Model(_in_switch("nvls_tree"), lambda p: 2 * (p - 1)),
    # Rings of L ranks in nodes and of N = p / L along rails: 2p(L + N - 2) messages at
    # least, and L + N >= 2 sqrt(p).
    hierarchical_allreduce: _Model(_hierarchical_allreduce_cost,
                                   lambda p: 4 * p * (math.isqrt(p) - 1)),
}


def has_collective_model(algorithm: Callable[..., Any]) -> bool:
    """Whether the collective level can cost ``algorithm``."""
    return algorithm in MODELS


def expected_messages(algorithm: Callable[..., Any], ranks: int) -> int | None:
    """About how many messages the message level steps through for one call of
    ``algorithm`` on ``ranks`` ranks (at least that many); None if no model knows."""
    model = MODELS.get(algorithm)
    return None if model is None else model.messages(ranks)


def collective_cost(algorithm: Callable[..., Any], count: int, itemsize: int,
                    machine: Topology | Machine, /, **params: Any) -> CollectiveCost:
    """The cost of ``algorithm`` on a topology (or a ``Machine``) with ``count`` elements of
    ``itemsize`` bytes per rank, all ranks starting together; ``params`` go to the
    algorithm."""
    model = _model(algorithm)
    for name, value, least in (("count", count, 0), ("itemsize", itemsize, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"collective_cost: {name} must be an int >= {least}, got {value!r}")
    count, itemsize = int(count), int(itemsize)
    if count * itemsize > sys.maxsize:
        raise ValueError(f"collective_cost: {count:,} elements of {itemsize} B are more than "
                         f"a buffer holds ({sys.maxsize:,} B)")
    if not isinstance(machine, Machine):
        machine = Machine(machine)
    _check_params(algorithm, params)
    return model.cost(machine, count, itemsize, **params)


def _check_params(algorithm: Callable[..., Any], params: dict[str, Any]) -> None:
    """Refuse, as the message level does, a parameter ``algorithm`` does not take and an
    ``op`` that is not a ``ReduceOp`` (the cost functions' own errors would mislead)."""
    unknown = set(params) - set(inspect.signature(algorithm).parameters)
    if unknown:
        raise TypeError(f"{algorithm.__name__}() got unexpected keyword arguments "
                        f"{', '.join(sorted(unknown))}")
    if "op" in params and type(params["op"]) is not ReduceOp:
        raise TypeError(f"{algorithm.__name__}: op must be a ReduceOp (algorithms.SUM, AVG, "
                        f"MAX, MIN, PROD), got {params['op']!r}")


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
    ``auto`` the collective level where a model covers the algorithm, the buffers are
    size-only and the message level would step through more than ``AUTO_MESSAGE_LIMIT``
    messages in ``calls`` calls of the algorithm, else the message level."""
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
                         topology: Topology, /, tuner: Tuner | None = None, **params: Any
                         ) -> SimResult:
    """``simulate``'s result at the collective level: times and link traffic from
    ``collective_cost`` (NCCL-class choices made by ``tuner``, the model's by default), no
    data (``results`` are None) and no op trace."""
    model = _model(algorithm)
    if any(not isinstance(buf, SizeOnly) for buf in inputs):
        raise ValueError(_NO_DATA)
    shapes = {(buf.count, buf.dtype) for buf in inputs}
    if len(shapes) != 1:
        raise ValueError(f"the collective level needs one buffer length and dtype on every "
                         f"rank, got {len(shapes)} different ones")
    (count, dtype), = shapes
    _check_params(algorithm, params)  # the cost function's own errors would mislead
    if params.get("op") is AVG:  # the message level's Divide refuses some dtypes
        check_divisible(dtype)
    cost = model.cost_of(Machine(topology, tuner), count, dtype, **params)
    links = [] if cost.link_bytes is None or cost.link_busy is None else link_stats(
        topology.links, cost.link_bytes.astype(np.int64).tolist(), cost.link_busy.tolist())
    launches = [] if cost.choice is None else [
        Launch(cost.choice.protocol, cost.choice.algorithm, cost.choice.channels)]
    return SimResult([None] * topology.size, cost.time, cost.finish_times.tolist(), links, [],
                     cost.messages, launches=launches, level="collective", exact=cost.exact)


class TimedCollective:
    """``algorithm`` as one timed event, for a training step run at the collective level on
    one rank that stands for all (``simcomm.training``): called as the algorithm is, it
    sleeps (``Sleep``) for the collective's cost on the topology (or ``Machine``) and
    returns what the algorithm returns (size-only). ``costs`` lists every call's cost, in
    order."""

    def __init__(self, algorithm: Callable[..., Any], machine: Topology | Machine, /,
                 **params: Any) -> None:
        self.model = _model(algorithm)
        _check_params(algorithm, params)
        self.algorithm, self.params = algorithm, params
        self.machine = machine if isinstance(machine, Machine) else Machine(machine)
        self.costs: list[CollectiveCost] = []
        self._known: dict[tuple[Any, ...], CollectiveCost] = {}
        self.__name__ = algorithm.__name__

    def __call__(self, comm: Comm, buf: Any, **params: Any) -> Generator[Any, Any, Any]:
        params = {**self.params, **params}
        key = (len(buf), buf.dtype, tuple(sorted(params.items(), key=lambda item: item[0])))
        cost = self._known.get(key)
        if cost is None:
            _check_params(self.algorithm, params)
            cost = self._known[key] = self.model.cost_of(self.machine, len(buf), buf.dtype,
                                                         **params)
        self.costs.append(cost)
        yield Sleep(cost.time, f"{self.__name__} {format_bytes(buf.nbytes)}")
        return self.model.result(comm, buf)
