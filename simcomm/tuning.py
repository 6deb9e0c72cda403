"""Choosing how to run a collective, as NCCL's tuner does: estimate every candidate
(algorithm x protocol) from the topology and take the fastest.

NCCL estimates each candidate as a base latency, plus a latency per step, plus the bytes
over a bus bandwidth (NVIDIA/nccl, src/graph/tuning.cc). The estimates here take the same
shape from this simulator's own figures, so that the choice is the one NCCL would make on
such a machine:

* A pipelined ring phase moves ``steps`` messages of ``chunk`` bytes around each of its
  rings at once. It takes the longer of its critical path (a chunk's ``steps`` hops in a
  row, each hop's latency under the protocol plus its transfer) and its busiest link's
  bytes over that link's bandwidth, the wire share of the protocol counted.
* A tree phase is a pipeline of chunks up and down the tree: its critical path is the
  deepest leaf's way to the root and back, and its busiest link again bounds it.
* What a GPU's kernels move (``Topology.injection_bandwidth``, under LL
  ``Topology.ll_bandwidth``, under LL128 ``Topology.ll128_bandwidth``) bounds it as a link
  does, and each channel's share of it (under LL128 at most
  ``Topology.ll128_channel_bandwidth``) bounds that channel's steps; under Simple a tree's
  channel sends to each peer at most ``Topology.tree_channel_bandwidth``, and a ring's
  channel to a peer on another node at most ``Topology.net_channel_bandwidth``.
* NVLS, on one node whose switch reduces (``Topology.reducing_switches``), moves the buffer
  and one slice of it each way over every GPU's link, at the switch's share of its
  bandwidth, in two in-switch steps; NVLS-tree, across such nodes, also sends each GPU's
  slice up and down a tree of the nodes over its NIC, at the slower of the two paces.
  Both first fill their pipeline of stages (``algorithms.nvls.pipeline_fill_bytes``).
* Every call pays the topology's launch latency for the protocol once.

The choice weighs a ring as NCCL's tuner does, not by its estimate: its steps' latencies
one after the other plus its bytes on the busiest link (NCCL adds the two; the message
level overlaps them in part), and across nodes each step within a node at least the host's
time to post a network send (``Topology.net_overhead``), which NCCL charges and its
messages do not take; it leaves out the ceiling of a ring's channel between nodes
(``Topology.net_channel_bandwidth``), which NCCL's model does not have. It weighs
NVLS-tree as NCCL does too, as its latency plus its bytes at its bandwidth, with no
pipeline to fill (``ncclTopoGetAlgoTime``, src/graph/tuning.cc, NVIDIA/nccl v2.26.2): here
the estimate's latencies and pace. Beyond two nodes NCCL before v2.28.3 gives NVLS-tree
half its NICs' rate (``bwInter/2``), which the pace has in the load of the tree on a
node's NICs (two slices for every one on two nodes), times 5/6; from v2.28.3 it gives it
their whole rate up to a ceiling per channel, more than the sends reach; the tuner weighs
what the topology says NCCL credits (``Topology.tuner_nvls_tree_bandwidth``). Across nodes NCCL
multiplies a Simple ring all-reduce's latency by 1.4 once a channel's share of a rank
exceeds 64 bytes ("plateau effect of ring", ``ncclTopoGetAlgoTime``), as the weight here
does. Where the network plugin reports a latency for its devices (AWS's EFA plugin does),
NCCL adds it to every hop between nodes of a ring, a tree or NVLS-tree, twice under
Simple, and so does the weight here (``Topology.tuner_net_latency``). So the pick is
NCCL's, which is not always the candidate the estimates (and the message level) find
fastest.

They are estimates: a pipeline's fill and drain overlap partly with its bottleneck, which
the larger of the two terms ignores, so they come out a little low where the two are
close. ``tests/test_tuning.py`` holds them to the message-level times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from algorithms.nccl import as_protocol, rail_ring, ring_slices
from algorithms.nccl_tree import double_binary_tree, tree_chunk_bytes, tree_parents
from algorithms.nvls import (
    nvls_chunk_bytes, nvls_tree_chunk_bytes, pipeline_chunks, pipeline_fill_bytes, tree_depth,
)
from algorithms.ops import Choice, Comm, Protocol
from algorithms.tuned import IN_SWITCH
from simcomm.topology import WIRE_EFFICIENCY, Topology

# Collective -> algorithms the tuner weighs for it: NCCL's (its CollNet is not modelled).
# Where a switch reduces: on one node NVLS (NCCL runs it across nodes only with CollNet),
# across nodes NVLS-tree, for the all-reduce alone.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "tree", "nvls", "nvls_tree"),
    "reducescatter": ("ring", "nvls"),
    "allgather": ("ring", "nvls"),
}

# NCCL runs a small call of a ring or tree on fewer channels than it has: as many as give each
# channel's threads, at their most, a threshold of bytes per thread (topoGetAlgoInfo in
# src/enqueue.cc; the most threads per channel, NCCL_LL_MAX_NTHREADS 512,
# NCCL_LL128_MAX_NTHREADS 640 and NCCL_SIMPLE_MAX_NTHREADS 512, and the thresholds per
# thread, NCCL_LL_THREAD_THRESHOLD 8 bytes times the ranks for a ring, LL128's 8 and
# Simple's 64, from src/include/device.h, src/include/comm.h and src/graph/tuning.cc,
# NVIDIA/nccl v2.26.2).
_CHANNEL_THREADS = {Protocol.LL: 512, Protocol.LL128: 640, Protocol.SIMPLE: 512}
_THREAD_BYTES = {Protocol.LL: 8, Protocol.LL128: 8, Protocol.SIMPLE: 64}

# What NCCL's tuner multiplies a Simple ring all-reduce's latency by across nodes, from 64
# bytes of a channel's share of a rank (1.9 before compute capability 8.0, which no preset
# has; ``ncclTopoGetAlgoTime``, src/graph/tuning.cc, NVIDIA/nccl v2.18.3 to v2.30.7).
RING_PLATEAU = 1.4


def call_channels(choice: Choice, nbytes: int, ranks: int) -> Choice:
    """``choice`` on as many of its channels as NCCL runs a call of ``nbytes`` (a ring's or
    a tree's; the whole buffer of ``ranks`` ranks) on: at least one, and no more than
    ``nbytes`` over each channel's share (see above)."""
    if choice.algorithm not in ("ring", "tree"):
        return choice
    share = _CHANNEL_THREADS[choice.protocol] * _THREAD_BYTES[choice.protocol]
    if choice.algorithm == "ring" and choice.protocol is Protocol.LL:
        share *= ranks
    channels = max(1, min(choice.channels, int(nbytes) // share))
    return Choice(choice.algorithm, choice.protocol, channels)


def _check_call(collective: str, nbytes: int) -> None:
    """Refuse a collective the tuner does not know and a size that is no count of bytes."""
    if collective not in CANDIDATES:
        raise ValueError(f"no tuner for collective {collective!r}; known: "
                         f"{', '.join(CANDIDATES)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"{collective}: nbytes must be an int >= 0, got {nbytes!r}")


@dataclass(frozen=True)
class _Shape:
    """Rings' or trees' costs that do not depend on the bytes (``ModelTuner._shape``)."""

    latency: np.ndarray  # per ring or tree: seconds of latency along its way
    per_byte: np.ndarray  # per ring or tree: seconds per byte along its way
    busiest: float  # seconds per byte of a part on the busiest link or pipe (a sender's,
    # a tree channel's to a peer, a ring channel's to a peer on another node)
    busiest_for_nccl: float  # the same without the last and a GPU's LL128 ceiling (the
    # pipe at NCCL's rates), which NCCL's model lacks
    posting: np.ndarray  # per ring or tree: seconds NCCL's tuner adds along its way
    # (``_net_overhead``, ``Topology.tuner_net_latency``)
    pipe: float  # seconds per byte of a part on the busiest sender's channel pipe
    protocol: Protocol
    crossings: np.ndarray  # per ring: its hops between nodes (trees: none counted)


def _ring_edges(orders: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Every hop of the rings ``orders`` (one row per ring), and per ring its hops."""
    size = orders.shape[1]
    src, dst = orders.ravel(), np.roll(orders, -1, axis=1).ravel()
    return src, dst, [np.arange(c * size, (c + 1) * size) for c in range(len(orders))]


class ModelTuner:
    """A ``Tuner`` (``algorithms.ops.Tuner``) for ``topology``: for each call the candidate
    with the least estimated time. Choices are cached per (collective, bytes)."""

    def __init__(self, topology: Topology) -> None:
        if not isinstance(topology, Topology):
            raise TypeError(f"ModelTuner needs a Topology, got {topology!r}")
        self.topology = topology
        # Rings and trees alike run on NCCL's channels, or else one per rank of a node:
        # every NIC busy.
        self.channels = topology.channels or topology.ranks_per_node
        self._choices: dict[tuple[str, int], Choice] = {}
        self._shapes: dict[tuple[str, int, Protocol], _Shape] = {}
        self._trees_of_nodes: dict[int, tuple[int, float]] = {}
        self._pace: dict[tuple[bool, bool], float] = {}

    def __call__(self, collective: str, nbytes: int) -> Choice:
        key = (collective, nbytes)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = self._fastest(collective, nbytes)
        return choice

    def estimates(self, collective: str, nbytes: int) -> dict[Choice, float]:
        """Estimated seconds of every candidate for ``nbytes`` per rank, in the order
        tried (ties go to the first)."""
        _check_call(collective, nbytes)
        candidates = [Choice(algorithm, protocol, self.channels)
                      for algorithm in CANDIDATES[collective] if algorithm not in IN_SWITCH
                      for protocol in self.protocols()]
        if "nvls" in CANDIDATES[collective] and self.has_nvls():
            candidates.append(Choice("nvls", Protocol.SIMPLE, self.topology.nvls_channels))
        if "nvls_tree" in CANDIDATES[collective] and self.has_nvls_tree():
            candidates.append(Choice("nvls_tree", Protocol.SIMPLE,
                                     self.topology.nvls_channels))
        return {choice: self.estimate(collective, choice, nbytes) for choice in candidates}

    def best_for(self, collective: str, nbytes: int, algorithm: str) -> Choice:
        """The fastest protocol and channels for ``algorithm``, as NCCL chooses when
        NCCL_ALGO names it (NVLS and NVLS-tree: Simple, on ``Topology.nvls_channels``). As
        NCCL, refuses NVLS where it cannot run: it needs switches that reduce (NVLink SHARP,
        from H100's NVSwitch on), and NCCL runs it on one node and NVLS-tree across several only
        (``ncclTopoTuneModel`` in src/graph/tuning.cc disables the others; a forced one then
        fails with ncclInvalidUsage, ``topoGetAlgoInfo`` in src/enqueue.cc)."""
        if algorithm == "nvls" and not (self.topology.reducing_switches and self._one_node()):
            other = "nvls_tree" if collective == "allreduce" else "ring (across nodes NCCL " \
                "runs it in the switch only with CollNet, IB SHARP, which is not modelled)"
            raise ValueError(self._no_in_switch("nvls", "one node", other))
        if algorithm == "nvls_tree" and not self.has_nvls_tree():
            raise ValueError(self._no_in_switch("nvls_tree", "several nodes", "nvls"))
        if algorithm in IN_SWITCH:
            return Choice(algorithm, Protocol.SIMPLE, self.topology.nvls_channels)
        return self._fastest(collective, nbytes, (algorithm,))

    def best_with(self, collective: str, nbytes: int, protocol: Protocol | str,
                  algorithm: str | None = None) -> Choice:
        """The fastest algorithm (or ``algorithm``) and its channels under ``protocol``, as
        NCCL chooses when NCCL_PROTO names it (NVLS and NVLS-tree run under Simple only)."""
        protocol = as_protocol(protocol)
        if algorithm in IN_SWITCH:
            return self.best_for(collective, nbytes, algorithm)
        return self._fastest(collective, nbytes, None if algorithm is None else (algorithm,),
                             protocol)

    def best_outside_switch(self, collective: str, nbytes: int,
                            protocol: Protocol | None = None) -> Choice:
        """The fastest choice (under ``protocol`` if given) that does not reduce in the
        switch, as NCCL chooses for a reduction its NVLS kernels cannot do."""
        return self._fastest(collective, nbytes, protocol=protocol, in_switch=False)

    def _fastest(self, collective: str, nbytes: int, algorithms: tuple[str, ...] | None = None,
                 protocol: Protocol | None = None, in_switch: bool = True) -> Choice:
        """As NCCL: the fastest estimate on all channels, then fewer for a small call; of
        ``algorithms`` (None: every candidate, the in-switch ones if ``in_switch``) under
        ``protocol`` (None: each the topology enables; one it does not, as told)."""
        estimates = {} if algorithms is not None else {
            choice: seconds for choice, seconds in self.estimates(collective, nbytes).items()
            if (in_switch or choice.algorithm not in IN_SWITCH)
            and protocol in (None, choice.protocol)}
        if not estimates:  # algorithms given, or a protocol the topology has off
            names = algorithms or [name for name in CANDIDATES[collective]
                                   if name not in IN_SWITCH]
            protocols = self.protocols() if protocol is None else [protocol]
            estimates = {choice: self.estimate(collective, choice, nbytes)
                         for choice in (Choice(name, each, self.channels)
                                        for name in names for each in protocols)}
        weighed = {choice: self._weigh(collective, choice, nbytes, seconds)
                   for choice, seconds in estimates.items()}
        return call_channels(min(weighed, key=weighed.__getitem__), nbytes,
                             self.topology.size)

    def _weigh(self, collective: str, choice: Choice, nbytes: int, seconds: float) -> float:
        """What NCCL's tuner makes of ``choice``, estimated at ``seconds`` (see the module
        doc): a ring's launch and its steps' latencies with NCCL's charge for posting network
        sends (``_net_overhead``), times ``RING_PLATEAU`` where NCCL applies it, plus its
        bytes on the busiest link (as NCCL, with no ceiling per channel between nodes);
        NVLS-tree its launch, its latencies and its bytes at the pace NCCL credits it with
        (``in_switch_pace``), with no pipeline to fill; any other choice its estimate."""
        p = self.topology.size
        if choice.algorithm == "nvls_tree":
            depth = self._node_trees(self.topology.node_count)[0]
            return (self.topology.launch_latency.of(choice.protocol, choice.algorithm)
                    + self._nvls_tree(choice.channels, nbytes, filled=False, credited=True)
                    + 2 * depth * self.topology.tuner_net_latency.simple)
        if choice.algorithm == "tree" and p > 1:
            comm = Comm(0, p, self.topology.local_size)
            shape = self._shape("tree", comm, choice.channels, choice.protocol)
            return seconds + float(shape.posting.max())
        if choice.algorithm != "ring" or p == 1:
            return seconds
        steps, shape = self._ring_steps(collective, choice)
        chunk = nbytes / (choice.channels * p)
        latency = (self.topology.launch_latency.of(choice.protocol, "ring")
                   + float((shape.latency + shape.posting).max()) * steps / p)
        if (collective == "allreduce" and choice.protocol is Protocol.SIMPLE
                and not self._one_node() and chunk >= 64):
            latency *= RING_PLATEAU
        return latency + steps * chunk * shape.busiest_for_nccl

    def _ring_steps(self, collective: str, choice: Choice) -> tuple[int, _Shape]:
        """How many steps the rings of ``choice`` take for ``collective``, and their shape."""
        p = self.topology.size
        steps = 2 * (p - 1) if collective == "allreduce" else p - 1
        return steps, self._shape("ring", Comm(0, p, self.topology.local_size),
                                  choice.channels, choice.protocol)

    def protocols(self) -> list[Protocol]:
        """The protocols NCCL weighs here unless told: all but LL128 where the topology
        does not enable it (``Topology.ll128_enabled``; NVIDIA/nccl v2.26.2
        src/graph/tuning.cc, "Enable LL128 by default only on ...+NVLink"), and but LL
        where it does not enable that (``Topology.ll_enabled``: NCCL_PROTO=simple)."""
        enabled = {Protocol.LL: self.topology.ll_enabled,
                   Protocol.LL128: self.topology.ll128_enabled}
        return [protocol for protocol in Protocol if enabled.get(protocol, True)]

    def _no_in_switch(self, algorithm: str, where: str, other: str) -> str:
        topology = self.topology
        if not topology.reducing_switches:
            return (f"{algorithm} needs NVSwitches that reduce (NVLink SHARP, H100 and "
                    f"newer); {topology.name} has none, and NCCL refuses it there")
        return (f"{algorithm} runs on {where} only, as NCCL runs it; on {topology.name} "
                f"try algorithm={other}")

    def _one_node(self) -> bool:
        return self.topology.local_size in (None, self.topology.size)

    def has_nvls_tree(self) -> bool:
        """Whether NVLS-tree can run here: several nodes whose switches reduce."""
        return bool(self.topology.reducing_switches) and not self._one_node()

    def has_nvls(self) -> bool:
        """Whether NVLS can run here: one node, on a switch that reduces."""
        return (bool(self.topology.reducing_switches) and self.topology.size > 1
                and self._one_node())

    def estimate(self, collective: str, choice: Choice, nbytes: int, chunk_bytes: int = 0
                 ) -> float:
        """Estimated seconds of ``collective`` of ``nbytes`` per rank run as ``choice``; a
        tree in chunks of about ``chunk_bytes`` (0: NCCL's, ``tree_chunk_bytes``)."""
        _check_call(collective, nbytes)
        if (not isinstance(choice, Choice) or type(choice.protocol) is not Protocol
                or type(choice.channels) is not int or choice.channels < 1):
            raise TypeError(f"choice must be a Choice(algorithm, Protocol, channels >= 1), "
                            f"got {choice!r}")
        p, protocol = self.topology.size, choice.protocol
        launch = self.topology.launch_latency.of(protocol, choice.algorithm)
        if p == 1:
            return launch
        comm = Comm(0, p, self.topology.local_size)
        if choice.algorithm == "ring":
            steps, shape = self._ring_steps(collective, choice)
            return launch + self._rings(shape, p, steps, nbytes / (choice.channels * p))
        if choice.algorithm == "hierarchical" and collective == "allreduce":
            return launch + self._hierarchical(comm, nbytes, protocol)
        if choice.algorithm == "tree" and collective == "allreduce":
            return launch + self._trees(comm, choice.channels, nbytes, protocol, chunk_bytes)
        if choice.algorithm == "nvls" and collective == "allreduce":
            return launch + self._nvls(choice.channels, nbytes)
        if choice.algorithm == "nvls" and collective in ("reducescatter", "allgather"):
            return launch + self._nvls_one_way(choice.channels, nbytes)
        if choice.algorithm == "nvls_tree" and collective == "allreduce":
            return launch + self._nvls_tree(choice.channels, nbytes)
        raise ValueError(f"no estimate for {collective} by algorithm {choice.algorithm!r}")

    def _trees(self, comm: Comm, channels: int, nbytes: int, protocol: Protocol,
               chunk_bytes: int = 0) -> float:
        """Seconds for ``channels`` trees to reduce and broadcast their parts of
        ``nbytes``, pipelined in chunks of ``chunk_bytes`` (0: NCCL's, ``tree_chunk_bytes``),
        all at once."""
        part = nbytes / channels
        chunk = chunk_bytes or tree_chunk_bytes(protocol, int(nbytes), channels,
                                                comm.size // comm.ranks_per_node,
                                                comm.ranks_per_node)
        chunks = max(1, math.ceil(part / chunk))
        shape = self._shape("tree", comm, channels, protocol)
        # A chunk's way from the deepest rank to the root and back: the first chunk pays
        # the whole way; the others follow at the busiest link's pace; and no link, or
        # GPU's pipe, carries its bytes faster than its bandwidth, the way's latencies aside.
        path = float((shape.latency + part / chunks * shape.per_byte).max())
        latency = float(shape.latency.max())
        busiest = part * shape.busiest
        return max(path + busiest * (chunks - 1) / chunks, latency + busiest)

    def _nvls(self, channels: int, nbytes: int) -> float:
        """Seconds for NVLS to reduce ``nbytes`` in the switch and multicast the sums, on
        ``channels`` parts at once, each pipelined in chunks (``algorithms.nvls``), after
        the pipeline's fill."""
        topology, p = self.topology, self.topology.size
        route = [topology.links[i] for i in topology.route(0, 1)]
        step = sum(link.latency for link in route) + topology.switch_latency
        rate, pace = topology.switch_rate(0), self.in_switch_pace()
        chunk = nvls_chunk_bytes(nbytes, channels, p)
        chunks = pipeline_chunks(nbytes / channels / p, chunk)
        fill = pipeline_fill_bytes(nbytes, chunk, channels, p, False)
        # While the first chunks go up the downlinks idle, for about a slice of a chunk.
        return 2 * step + (nbytes + fill) / pace + nbytes / chunks / p / rate

    def _nvls_one_way(self, channels: int, nbytes: int) -> float:
        """Seconds for NVLS to reduce-scatter or all-gather ``nbytes`` (the whole buffer)
        (``algorithms.nvls.nvls_reduce_scatter``, ``nvls_all_gather``): one in-switch step
        per chunk, each GPU's way carrying the whole buffer one way (its own slice too) at
        the switch's rate, after the pipeline's fill."""
        topology, p = self.topology, self.topology.size
        route = [topology.links[i] for i in topology.route(0, 1)]
        step = sum(link.latency for link in route) + topology.switch_latency
        rate = topology.switch_rate(0)
        chunk = nvls_chunk_bytes(nbytes, channels, p)
        chunks = pipeline_chunks(nbytes / channels / p, chunk)
        fill = pipeline_fill_bytes(nbytes, chunk, channels, p, False, one_way=True)
        return step + (nbytes + fill + nbytes / chunks / p) / rate

    def in_switch_pace(self, tree: bool = False, credited: bool = False) -> float:
        """Bytes of the buffer per second that each GPU's NVLS or (``tree``) NVLS-tree
        all-reduce moves once its pipeline is full: the pace of the busier of the GPU's way
        to its switch (the buffer and a slice each way) and, across nodes, its NIC (its
        slice once per tree edge at its node, half the buffer on each tree), at
        ``Topology.tree_network_share`` of the NIC's rate; if ``credited``, at the rate
        NCCL's tuner credits it with where the topology gives one
        (``Topology.tuner_nvls_tree_bandwidth``, on more than two nodes) (cached)."""
        key = (tree, credited)
        if key not in self._pace:
            topology = self.topology
            per_node, nodes = topology.ranks_per_node, topology.node_count
            intra = cross = 0.0  # seconds per byte of the buffer through the switch, the NIC
            if per_node > 1:
                intra = (per_node + 1) / per_node / topology.switch_rate(0, tree)
            if nodes > 1:
                way = min(topology.links[i].bandwidth for i in topology.route(0, per_node))
                rate = topology.tree_network_share() * way
                if credited and nodes > 2 and topology.tuner_nvls_tree_bandwidth:
                    rate = min(way, topology.tuner_nvls_tree_bandwidth)
                cross = self._node_trees(nodes)[1] / per_node / rate
            slowest = max(intra, cross)  # 0: one GPU alone, nothing crosses a link
            self._pace[key] = 1 / slowest if slowest else math.inf
        return self._pace[key]

    def _hierarchical(self, comm: Comm, nbytes: int, protocol: Protocol) -> float:
        """Seconds for ``algorithms.nccl.hierarchical_allreduce``: a reduce-scatter in every
        node's ring, an all-reduce of a node's share in every rail's ring, an all-gather in
        every node's ring, one phase after the other, one channel each."""
        per_node = comm.ranks_per_node
        nodes = comm.size // per_node
        within = self._shape("node", comm, 1, protocol)
        across = self._shape("rail", comm, 1, protocol)
        return (2 * self._rings(within, per_node, per_node - 1, nbytes / per_node)
                + self._rings(across, nodes, 2 * (nodes - 1), nbytes / per_node / nodes))

    def _nvls_tree(self, channels: int, nbytes: int, filled: bool = True,
                   credited: bool = False) -> float:
        """Seconds for NVLS-tree (``algorithms.nvls.nvls_tree_allreduce``): a chunk's way
        into each node's switch and back, and up and down the deepest tree of the nodes;
        then the buffer at the in-switch pace (``in_switch_pace``, ``credited`` as there),
        and if ``filled`` a chunk more and the pipeline's fill."""
        topology = self.topology
        per_node, nodes = topology.ranks_per_node, topology.node_count
        depth = self._node_trees(nodes)[0]
        chunk = nvls_tree_chunk_bytes(nbytes, channels, per_node, nodes)
        step = hop = extra = 0.0
        if per_node > 1:
            way = [topology.links[i] for i in topology.route(0, 1)]
            step = sum(link.latency for link in way) + topology.switch_latency
        if nodes > 1:
            hop = sum(topology.links[i].latency for i in topology.route(0, per_node))
        if filled:
            chunks = pipeline_chunks(nbytes / channels / per_node, chunk)
            extra = nbytes / (chunks * per_node)
            if topology.reducing_switches:
                extra += pipeline_fill_bytes(nbytes, chunk, channels, per_node, False)
        return (2 * step + 2 * depth * hop
                + (nbytes + extra) / self.in_switch_pace(True, credited))

    def _node_trees(self, nodes: int) -> tuple[int, float]:
        """The double binary tree over ``nodes`` nodes: its deepest node's depth, and the
        most tree edges at one node, averaged over the two trees (cached)."""
        if nodes not in self._trees_of_nodes:
            load = 0.0
            for node in range(nodes):
                edges = sum((parent != -1) + sum(child != -1 for child in children)
                            for parent, children in double_binary_tree(nodes, node))
                load = max(load, edges / 2)
            self._trees_of_nodes[nodes] = (tree_depth(nodes), load)
        return self._trees_of_nodes[nodes]

    def _rings(self, shape: _Shape, size: int, steps: int, chunk: float) -> float:
        """Seconds for the rings of ``shape``, ``size`` ranks each, to move ``steps``
        chunks of ``chunk`` bytes per hop, each in slices (``ring_slices``), pipelined, all
        at once; under Simple each slice holds its sender's channel
        ``Topology.ring_slice_gap`` longer, and its connection to another node
        ``Topology.net_message_gap`` besides its bytes at ``net_message_bandwidth``."""
        if steps == 0:
            return 0.0
        topology = self.topology
        slices = ring_slices(math.ceil(chunk), shape.protocol)
        simple = shape.protocol is Protocol.SIMPLE
        gap = topology.ring_slice_gap if simple else 0.0
        net_gap = topology.net_message_gap if simple else 0.0
        # Per ring: a slice once around it, then the first slice's way through every step
        # and the other slices behind it.
        moving = chunk / slices * shape.per_byte + size * gap + shape.crossings * net_gap
        hop = moving / size
        path = float(((shape.latency + moving) * steps / size + (slices - 1) * hop).max())
        on_connection = (steps * (chunk / topology.net_message_bandwidth + slices * net_gap)
                         if simple and shape.crossings.any() else 0.0)
        return max(path, steps * chunk * shape.busiest,
                   steps * (chunk * shape.pipe + slices * gap), on_connection)

    def _shape(self, kind: str, comm: Comm, channels: int, protocol: Protocol) -> _Shape:
        """What an estimate of rings or trees needs, whatever the bytes (cached): per ring
        or tree, the latency and the seconds per byte of its way (a ring once around, a
        tree's deepest rank to the root and back), and the seconds per byte of a part on the
        busiest link or pipe (``_Shape``), with and without the ceilings NCCL's model lacks
        (a ring channel's between nodes, a GPU's under LL128). ``kind`` is ``ring``
        (``channels`` rings of all ranks, ``rail_ring``), ``tree`` (``channels`` trees),
        ``node`` (a ring in every node) or ``rail`` (a ring of every rail, a node's local
        rank i in each)."""
        key = (kind, channels, protocol)
        if key not in self._shapes:
            if kind == "tree":
                src, dst, ways = self._tree_edges(comm, channels)
            else:
                src, dst, ways = _ring_edges(self._ring_orders(kind, comm, channels))
            routes = self.topology.route_matrix(src, dst)
            per_node = self.topology.ranks_per_node
            # A ring's hops between nodes, each of a channel at most at the network's
            # ceiling per channel (a tree's channels have a ceiling of their own).
            between_nodes = src // per_node != dst // per_node
            capped = between_nodes if kind != "tree" else None
            latency, per_byte = self._route_costs(routes, protocol, channels, kind, capped)
            # NCCL's tuner counts the network plugin's reported latency on each hop between
            # nodes (``Topology.tuner_net_latency``).
            posting = np.where(between_nodes, self.topology.tuner_net_latency.of(protocol),
                               0.0)
            if kind == "ring":
                posting += self._net_overhead(latency, ~between_nodes, protocol)
            links = self.topology.links
            bandwidth = np.array([link.bandwidth for link in links] + [np.inf])
            crossing = np.bincount(routes[routes >= 0], minlength=len(links) + 1)
            on_link = float((crossing / bandwidth).max()) / WIRE_EFFICIENCY[protocol]
            # Each ring or tree on its own channel, whose pipe carries every message its
            # sender sends in it (a tree's rank sends a part up and one to each child).
            group = np.arange(len(src)) // (len(src) // len(ways))
            busiest_pipe = float(np.bincount(src * len(ways) + group).max())
            on_pipe = busiest_pipe / self.topology.channel_rate(protocol, channels)
            on_pipe_for_nccl = busiest_pipe / self.topology.channel_rate(protocol, channels,
                                                                         as_nccl=True)
            # A tree's channel sends its part to each peer once, under Simple at most at
            # the tree's ceiling.
            on_peer = (1 / self.topology.tree_channel_bandwidth
                       if kind == "tree" and protocol is Protocol.SIMPLE else 0.0)
            on_network = (1 / self.topology.net_channel_bandwidth
                          if capped is not None and capped.any() else 0.0)
            self._shapes[key] = _Shape(np.array([latency[way].sum() for way in ways]),
                                       np.array([per_byte[way].sum() for way in ways]),
                                       max(on_link, on_pipe, on_peer, on_network),
                                       max(on_link, on_pipe_for_nccl, on_peer),
                                       np.array([posting[way].sum() for way in ways]),
                                       on_pipe, protocol,
                                       np.array([int(capped[way].sum()) if capped is not None
                                                 else 0 for way in ways]))
        return self._shapes[key]

    def _net_overhead(self, latency: np.ndarray, within: np.ndarray, protocol: Protocol
                      ) -> np.ndarray:
        """What NCCL's tuner adds to the ``latency`` of each hop of a ring that spans nodes
        (``within``: the hops that stay in a node): it takes a step within a node as at
        least the host's time to post a network send (``Topology.net_overhead``; three times
        that under Simple), "Inter-node rings still have to launch nsteps * net overhead"
        (src/graph/tuning.cc, NVIDIA/nccl v2.26.2). Messages do not take it: DeepOps' ring
        forced under LL on two DGX A100 nodes measures 38.6 us for 8 B, where NCCL's model
        gives 69 us with it."""
        topology = self.topology
        if topology.node_count == 1 or not topology.net_overhead:
            return np.zeros_like(latency)
        floor = topology.net_overhead * (3 if protocol is Protocol.SIMPLE else 1)
        return np.where(within, np.maximum(floor - latency, 0.0), 0.0)

    @staticmethod
    def _ring_orders(kind: str, comm: Comm, channels: int) -> np.ndarray:
        """The rank orders of the rings of ``kind`` (see ``_shape``), one row per ring."""
        if kind == "ring":
            return np.array([rail_ring(comm, c) for c in range(channels)])
        in_nodes = np.arange(comm.size).reshape(-1, comm.ranks_per_node)
        return in_nodes if kind == "node" else in_nodes.T

    def _tree_edges(self, comm: Comm, channels: int
                    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Every edge of ``channels`` trees, both ways (a part goes up and comes back
        down), and per tree the edges of its deepest rank's round trip to the root."""
        src, dst, ways = [], [], []
        for channel in range(channels):
            parents, depths = tree_parents(comm.size, comm.ranks_per_node, channel,
                                           2 * channel // channels)
            children = np.nonzero(parents != -1)[0]
            first = sum(len(edges) for edges in src)
            src += [children, parents[children]]
            dst += [parents[children], children]
            # The deepest rank (the highest of them): its edges up, each with its way down.
            rank, way = int(np.flatnonzero(depths == depths.max())[-1]), []
            where = {int(child): k for k, child in enumerate(children)}
            while parents[rank] != -1:
                way += [first + where[rank], first + len(children) + where[rank]]
                rank = int(parents[rank])
            ways.append(np.array(way, dtype=np.int64))
        return np.concatenate(src), np.concatenate(dst), ways

    def _route_costs(self, routes: np.ndarray, protocol: Protocol, channels: int,
                     algorithm: str = "", capped: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Per route (a row of link indices, -1 padded): its latency under ``protocol``
        (and ``algorithm``: ``tree`` has its own),
        and the seconds per byte of one channel's message along it: its slowest link's data
        rate, or the channel's share of its GPU's rate if that is less, and on the routes
        ``capped`` marks no more than ``Topology.net_channel_bandwidth``."""
        links = self.topology.links
        used = np.unique(routes[routes >= 0])
        latency_of, bandwidth_of = np.zeros(len(links) + 1), np.full(len(links) + 1, np.inf)
        for i in used.tolist():
            latency_of[i] = links[i].latency_of(protocol, algorithm)
            bandwidth_of[i] = links[i].bandwidth
        rate = WIRE_EFFICIENCY[protocol] * bandwidth_of[routes].min(axis=1, initial=np.inf)
        rate = np.minimum(rate, self.topology.channel_rate(protocol, channels))
        if algorithm == "tree" and protocol is Protocol.SIMPLE:
            rate = np.minimum(rate, self.topology.tree_channel_bandwidth)
        if capped is not None:
            rate = np.where(capped, np.minimum(rate, self.topology.net_channel_bandwidth), rate)
        return latency_of[routes].sum(axis=1), 1.0 / rate

