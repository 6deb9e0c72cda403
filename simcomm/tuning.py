"""Choosing how to run a collective, as NCCL's tuner does: estimate every candidate
(algorithm x protocol) from the topology and take the fastest.

NCCL estimates each candidate as a base latency, plus a latency per step, plus the bytes
over a bus bandwidth (NVIDIA/nccl, src/graph/tuning.cc). The estimates here take the same
shape from this simulator's own figures, so that the choice is the one the message-level
model would make:

* A pipelined ring phase moves ``steps`` messages of ``chunk`` bytes around each of its
  rings at once. It takes the longer of its critical path (a chunk's ``steps`` hops in a
  row, each hop's latency under the protocol plus its transfer) and its busiest link's
  bytes over that link's bandwidth, the wire share of the protocol counted.
* A tree phase is a pipeline of chunks up and down the tree: its critical path is the
  deepest leaf's way to the root and back, and its busiest link again bounds it.
* What a GPU's kernels move (``Topology.injection_bandwidth``, and under LL
  ``Topology.ll_bandwidth``) bounds it as a link does, and each channel's share of it
  bounds that channel's steps.
* NVLS, on one node whose switch reduces (``Topology.reducing_switches``), moves the buffer
  and one slice of it each way over every GPU's link, at the switch's share of its
  bandwidth, in two in-switch steps; its pipeline's fill adds a slice of a chunk.
* Every call pays the topology's launch latency for the protocol once.

They are estimates: a pipeline's fill and drain overlap partly with its bottleneck, which
the larger of the two terms ignores, so they come out a little low where the two are
close. ``tests/test_tuning.py`` holds them to the message-level times.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from algorithms.nccl import rail_ring, ring_slices
from algorithms.nccl_tree import TREE_CHUNK_BYTES, tree_position
from algorithms.nvls import NVLS_CHANNELS, nvls_chunk_bytes, pipeline_chunks
from algorithms.ops import Choice, Comm, Protocol
from simcomm.topology import WIRE_EFFICIENCY, Topology

# Collective -> algorithms the tuner weighs for it: NCCL's (its NVLS-tree and CollNet are not
# modelled; it runs reduce-scatter and all-gather as rings otherwise). NVLS only where a
# switch reduces, on one node (NCCL runs it across nodes only with CollNet).
CANDIDATES: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "tree", "nvls"),
    "reducescatter": ("ring",),
    "allgather": ("ring",),
}


class ModelTuner:
    """A ``Tuner`` (``algorithms.ops.Tuner``) for ``topology``: for each call the candidate
    with the least estimated time. Choices are cached per (collective, bytes)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        # Rings and trees alike run one channel per rank of a node: every NIC busy.
        self.channels = topology.local_size or topology.size
        self._choices: dict[tuple[str, int], Choice] = {}

    def __call__(self, collective: str, nbytes: int) -> Choice:
        key = (collective, nbytes)
        choice = self._choices.get(key)
        if choice is None:
            estimates = self.estimates(collective, nbytes)
            choice = self._choices[key] = min(estimates, key=estimates.__getitem__)
        return choice

    def estimates(self, collective: str, nbytes: int) -> dict[Choice, float]:
        """Estimated seconds of every candidate for ``nbytes`` per rank, in the order
        tried (ties go to the first)."""
        if collective not in CANDIDATES:
            raise ValueError(f"no tuner for collective {collective!r}; known: "
                             f"{', '.join(CANDIDATES)}")
        candidates = [Choice(algorithm, protocol, self.channels)
                      for algorithm in CANDIDATES[collective] if algorithm != "nvls"
                      for protocol in Protocol]
        if "nvls" in CANDIDATES[collective] and self.has_nvls():
            candidates.append(Choice("nvls", Protocol.SIMPLE, NVLS_CHANNELS))
        return {choice: self.estimate(collective, choice, nbytes) for choice in candidates}

    def has_nvls(self) -> bool:
        """Whether NVLS can run here: one node, on a switch that reduces."""
        topology = self.topology
        return (bool(topology.reducing_switches) and topology.size > 1
                and topology.local_size in (None, topology.size))

    def estimate(self, collective: str, choice: Choice, nbytes: int) -> float:
        """Estimated seconds of ``collective`` of ``nbytes`` per rank run as ``choice``."""
        p, protocol = self.topology.size, choice.protocol
        launch = self.topology.launch_latency.of(protocol)
        if p == 1:
            return launch
        comm = Comm(0, p, self.topology.local_size)
        if choice.algorithm == "ring":
            rings = [rail_ring(comm, c) for c in range(choice.channels)]
            steps = 2 * (p - 1) if collective == "allreduce" else p - 1
            return launch + self._rings(rings, steps, nbytes / (choice.channels * p), protocol)
        if choice.algorithm == "tree" and collective == "allreduce":
            return launch + self._trees(comm, choice.channels, nbytes, protocol)
        if choice.algorithm == "nvls" and collective == "allreduce":
            return launch + self._nvls(choice.channels, nbytes)
        raise ValueError(f"no estimate for {collective} by algorithm {choice.algorithm!r}")

    def _trees(self, comm: Comm, channels: int, nbytes: int, protocol: Protocol) -> float:
        """Seconds for ``channels`` trees to reduce and broadcast their parts of
        ``nbytes``, pipelined in chunks of ``TREE_CHUNK_BYTES``, all at once."""
        part = nbytes / channels
        chunks = max(1, math.ceil(part / TREE_CHUNK_BYTES))
        load: defaultdict[int, float] = defaultdict(float)  # link -> bytes
        sent: defaultdict[int, float] = defaultdict(float)  # rank -> bytes
        trees = []  # per channel: each rank's parent, and its deepest rank
        for channel in range(channels):
            parents, deepest = {}, (-1, -1)
            for rank in range(comm.size):
                parent, _, depth = tree_position(Comm(rank, comm.size, comm.local_size),
                                                 channel, 2 * channel // channels)
                parents[rank], deepest = parent, max(deepest, (depth, rank))
                if parent != -1:  # a part goes up this edge and comes back down
                    for src, dst in ((rank, parent), (parent, rank)):
                        sent[src] += part
                        for i in self.topology.route(src, dst):
                            load[i] += part
            trees.append((parents, deepest[1]))
        # A chunk's way from the deepest rank to the root and back.
        path = latency = 0.0  # the way's seconds, and its latencies alone
        links = self.topology.links
        for parents, rank in trees:
            trip = hops = 0.0
            while parents[rank] != -1:
                for src, dst in ((rank, parents[rank]), (parents[rank], rank)):
                    route = self.topology.route(src, dst)
                    hops += sum(links[i].latency_of(protocol) for i in route)
                    trip += part / chunks / self._rate(route, protocol, channels)
                rank = parents[rank]
            path, latency = max(path, trip + hops), max(latency, hops)
        # The first chunk pays the whole way; the others follow at the busiest link's pace;
        # and no link, or GPU's pipe, carries its bytes faster than its bandwidth, the way's
        # latencies aside.
        busiest = self._busiest(load, sent, protocol)
        return max(path + busiest * (chunks - 1) / chunks, latency + busiest)

    def _nvls(self, channels: int, nbytes: int) -> float:
        """Seconds for NVLS to reduce ``nbytes`` in the switch and multicast the sums, on
        ``channels`` parts at once, each pipelined in chunks (``algorithms.nvls``)."""
        topology, p = self.topology, self.topology.size
        route = [topology.links[i] for i in topology.route(0, 1)]
        step = sum(link.latency for link in route) + topology.switch_latency
        rate = topology.switch_efficiency * min(link.bandwidth for link in route)
        chunk = nvls_chunk_bytes(nbytes, channels, p)
        chunks = pipeline_chunks(nbytes / channels / p, chunk)
        # While the first chunks go up the downlinks idle, for about a slice of a chunk.
        return 2 * step + nbytes * (p + 1) / p / rate + nbytes / chunks / p / rate

    def _rings(self, rings: Sequence[Sequence[int]], steps: int, chunk: float,
               protocol: Protocol) -> float:
        """Seconds for every ring in ``rings`` to move ``steps`` chunks of ``chunk`` bytes
        per hop, each in slices (``ring_slices``), pipelined, all at once."""
        links = self.topology.links
        slices = ring_slices(math.ceil(chunk))
        load: defaultdict[int, float] = defaultdict(float)  # link -> bytes
        sent: defaultdict[int, float] = defaultdict(float)  # rank -> bytes
        path = 0.0
        for ring in rings:
            if len(ring) < 2:
                continue
            latency = moving = 0.0  # seconds for a slice once around this ring
            for j, src in enumerate(ring):
                route = self.topology.route(src, ring[(j + 1) % len(ring)])
                sent[src] += steps * chunk
                for i in route:
                    load[i] += steps * chunk
                latency += sum(links[i].latency_of(protocol) for i in route)
                moving += chunk / slices / self._rate(route, protocol, len(rings))
            # The first slice's way through every step, then the other slices behind it.
            hop = moving / len(ring)
            path = max(path, (latency + moving) * steps / len(ring) + (slices - 1) * hop)
        return max(path, self._busiest(load, sent, protocol))

    def _rate(self, route: Sequence[int], protocol: Protocol, channels: int) -> float:
        """Bytes per second of one channel's message along ``route``: its slowest link's
        data rate, or the channel's share of its GPU's rate if that is less."""
        rate = WIRE_EFFICIENCY[protocol] * min(self.topology.links[i].bandwidth for i in route)
        return min(rate, self._gpu_rate(protocol) / channels)

    def _gpu_rate(self, protocol: Protocol) -> float:
        """What one GPU's kernels move per second under ``protocol``, all channels
        together."""
        rate = self.topology.injection_bandwidth
        return min(rate, self.topology.ll_bandwidth) if protocol is Protocol.LL else rate

    def _busiest(self, load: dict[int, float], sent: dict[int, float],
                 protocol: Protocol) -> float:
        """Seconds the busiest link, or the busiest sender's kernels, take for its bytes."""
        links = self.topology.links
        busiest = max((bytes_ / links[i].bandwidth for i, bytes_ in load.items()), default=0.0)
        busiest /= WIRE_EFFICIENCY[protocol]
        return max(busiest, max(sent.values(), default=0.0) / self._gpu_rate(protocol))
