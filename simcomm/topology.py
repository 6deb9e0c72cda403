"""Topologies: named nodes (GPUs and switches) joined by directed links.

A link has a latency (alpha, seconds) and a bandwidth (bytes/second); a full-duplex cable is
two links. A link's latency is the Simple protocol's; it may give LL's and LL128's as well
(``algorithms.Protocol``), and a topology may charge a fixed launch latency per collective
and protocol. Ranks live on GPU nodes, each with a reduction bandwidth: a local reduction or copy
of n bytes costs n / reduce_bandwidth seconds (infinite means free).

Messages follow the route with the fewest hops, ties broken by the highest bottleneck
bandwidth, then by link order (so routes are deterministic). Builders list a node's own
switch links before network links, so traffic inside a node stays on the node's switch
unless the network is strictly faster.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from algorithms.nvls import NVLS_CHANNELS
from algorithms.ops import Protocol, check_channels, check_flag

# Ranks a builder makes at most: the largest clusters trained on today are about 100,000
# GPUs. Beyond it a typo (--ranks 100000000) would build billions of links before a word.
MAX_RANKS = 131_072
# Links a fully-connected topology holds at most: ranks * (ranks - 1) of them take 43 s to
# simulate on 2,000 ranks (4 million links), so past 1,000 ranks a switch is the model.
MAX_FULL_MESH_LINKS = 1_000_000


def _check_seconds(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be finite seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class Link:
    """A one-way link from node ``src`` to node ``dst``."""

    src: str
    dst: str
    bandwidth: float  # bytes/second
    latency: float  # seconds
    # Seconds a message holds the link on top of its bytes (LogGP's gap g: the per-message
    # cost of a link that a stream of messages cannot hide, such as a software send path).
    gap: float = 0.0
    # Latencies under the LL and LL128 protocols (seconds); None: ``latency``, Simple's.
    ll_latency: float | None = None
    ll128_latency: float | None = None
    # A hop of NCCL's tree, under each protocol: NCCL's cost model gives its tree latencies
    # of their own (hwLat's Tree row, src/graph/tuning.cc). None: as every other message.
    tree_latency: PerProtocol | None = None

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"link {name} must be a node's name, got "
                                f"{getattr(self, name)!r}")
        for name in ("bandwidth", "latency", "gap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"link {self.src}->{self.dst}: {name} must be a number, got "
                                f"{value!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"link {self.src}->{self.dst}: bandwidth must be > 0, "
                             f"got {self.bandwidth!r}")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"link {self.src}->{self.dst}: latency must be finite and >= 0, "
                             f"got {self.latency!r}")
        if not (math.isfinite(self.gap) and self.gap >= 0):
            raise ValueError(f"link {self.src}->{self.dst}: gap must be finite and >= 0, "
                             f"got {self.gap!r}")
        if self.src == self.dst:
            raise ValueError(f"link {self.src}->{self.dst} connects a node to itself")
        for name in ("ll_latency", "ll128_latency"):
            if getattr(self, name) is not None:
                _check_seconds(getattr(self, name), f"link {self.src}->{self.dst}: {name}")
        if self.tree_latency is not None and type(self.tree_latency) is not PerProtocol:
            raise TypeError(f"link {self.src}->{self.dst}: tree_latency must be a PerProtocol "
                            f"or None, got {self.tree_latency!r}")

    def latency_of(self, protocol: Protocol, algorithm: str = "") -> float:
        """Seconds a message's tail takes across this link under ``protocol``, sent by
        ``algorithm`` (``tree``: ``tree_latency``, where the link has one)."""
        if algorithm == "tree" and self.tree_latency is not None:
            return self.tree_latency.of(protocol)
        latency = (self.ll_latency if protocol is Protocol.LL else
                   self.ll128_latency if protocol is Protocol.LL128 else None)
        return self.latency if latency is None else latency


@dataclass(frozen=True)
class PerProtocol:
    """A cost in seconds under each of NCCL's protocols (``algorithms.Protocol``), and
    optionally NCCL's tree's own (``tree``; None: the same as every algorithm's)."""

    simple: float
    ll: float
    ll128: float
    tree: PerProtocol | None = None

    def __post_init__(self) -> None:
        for protocol in Protocol:
            _check_seconds(getattr(self, protocol.value), f"{protocol.value} latency")
        if self.tree is not None and type(self.tree) is not PerProtocol:
            raise TypeError(f"PerProtocol.tree must be a PerProtocol or None, got {self.tree!r}")

    def of(self, protocol: Protocol, algorithm: str = "") -> float:
        """The cost under ``protocol`` for ``algorithm`` (``tree``: ``tree``'s, if set)."""
        if algorithm == "tree" and self.tree is not None:
            return self.tree.of(protocol)
        return getattr(self, protocol.value)

    def scaled(self, factor: float, extra: float = 0.0) -> PerProtocol:
        """Every cost times ``factor``, plus ``extra`` seconds."""
        return PerProtocol(self.simple * factor + extra, self.ll * factor + extra,
                           self.ll128 * factor + extra,
                           None if self.tree is None else self.tree.scaled(factor, extra))


NO_LAUNCH_LATENCY = PerProtocol(0.0, 0.0, 0.0)

# Data bytes per byte on the wire under each protocol. LL sends 8-byte lines of 4 data bytes
# and a 4-byte flag; LL128 128-byte lines of 120 data bytes and an 8-byte flag (NVIDIA/nccl,
# src/device/prims_ll.h and prims_ll128.h; NCCL's own cost model uses 0.5 and 0.92,
# src/graph/tuning.cc).
WIRE_EFFICIENCY = {Protocol.SIMPLE: 1.0, Protocol.LL: 0.5, Protocol.LL128: 120 / 128}


@dataclass(frozen=True)
class Topology:
    """Nodes, links, and which node each rank runs on.

    ``ranks[r]`` is the node of rank r; ``reduce_bandwidth[r]`` its local reduction
    bandwidth. ``local_size``, if known, is how many consecutive ranks share a machine (a
    DGX's 8 GPUs): algorithms see it as ``Comm.local_size``. ``launch_latency`` is what
    starting one collective costs under each protocol (the ``Launch`` op; NCCL's base
    latency). ``ll_bandwidth`` is the most one GPU sends per second under LL, over all its
    links and channels together: the LL protocol's polling on 8-byte flags, not the wire, is
    its limit (NCCL's ``llMaxBw``); infinite means none. ``ll128_channel_bandwidth`` is the
    most one channel moves per second under LL128 (NCCL's ``perChMaxRingLL128Bw``; infinite:
    none), ``ll128_bandwidth`` the most one GPU sends per second under LL128 over all its
    channels together (measured, not in NCCL's cost model, so a tuner leaves it out;
    infinite: none). ``tree_channel_bandwidth`` is the most one channel of NCCL's tree
    sends per second to each of its peers (its parent, each child) under Simple, so the
    most it all-reduces per second (NCCL's ``perChMaxTreeBw``, which in NCCL's model binds
    only there: LL's and LL128's own ceilings are lower; infinite: none).
    ``net_channel_bandwidth`` is the most one channel of a ring sends per second to a peer on
    another node (``local_size`` says which ranks share one), under any protocol
    (infinite: none): a ceiling per channel that crosses the network, measured, not in
    NCCL's cost model. ``ring_slice_gap`` is how long a channel of a ring holds each slice
    it sends under Simple on top of its bytes: NCCL's Simple kernel waits for the peer's
    flag before a slice and posts its own after, so a channel's slices pay it one after the
    other (fitted to published tables, not in NCCL's cost model; 0: none).
    ``net_message_gap`` and ``net_message_bandwidth`` are what each message a ring's
    channel sends to a peer on another node under Simple holds that connection: the gap
    besides its bytes at that rate (0 and infinite: nothing), on top of
    ``net_channel_bandwidth`` (measured, not in NCCL's cost model).
    ``ll128_enabled`` says whether NCCL runs LL128 here unless told to: it enables it by
    default only where the GPUs of a node talk over NVLink (and a NIC is at most a PCIe
    switch away), so a tuner leaves it out elsewhere; a forced LL128 still runs, as with
    ``NCCL_PROTO=LL128``. ``ll_enabled`` likewise for LL: a network plugin that cannot
    promise LL's ordering sets NCCL_PROTO=simple (AWS's EFA plugin on p4d), and then a tuner
    weighs Simple alone.
    ``injection_bandwidth`` is what one GPU's kernels move per second over all their
    channels together, each channel of a collective an even share (infinite: no limit).
    ``reducing_switches`` are the switch nodes that reduce and multicast in the switch
    (NVLink SHARP, NVLS: ``Multicast`` and ``RecvReduce``), whose traffic of that kind moves
    at ``switch_efficiency`` of its links' bandwidth, under NVLS-tree (across nodes) at
    ``tree_switch_efficiency`` of it (None: the same share); each such op's data wait
    ``switch_latency`` seconds in the switch besides their links' latencies.
    ``tree_network_efficiency`` is the share of its way's bandwidth that a rank's sends to
    other nodes reach under NVLS-tree on more than two nodes (``tree_network_share``).
    ``nvls_channels`` is how many channels NCCL runs NVLS and NVLS-tree on, the count a
    tuner gives them.
    ``compute_speed[r]`` is how fast rank r computes against the nominal speed a ``Compute``
    op's seconds are given at (0.8: a GPU 20% slow takes 1.25x as long); empty means every
    rank at 1. ``channels`` is how many channels NCCL runs its rings and trees on here, the
    count a tuner gives them (None: one per rank of a node). ``net_overhead`` is what NCCL's
    tuner takes a host to spend posting each network send (its ``getNetOverhead``): when it
    chooses how to run a call across nodes, it charges every step of a ring within a node
    at least that, three times under Simple. Only a tuner weighs it; messages do not pay it.
    ``tuner_nvls_tree_bandwidth`` is the most of its NIC's rate at which a tuner weighs
    each GPU's sends to other nodes under NVLS-tree on more than two nodes, as NCCL's cost
    model credits them: before NCCL 2.28.3 5/6 of the NIC, from 2.28.3 the whole NIC up to a
    ceiling per channel (0: at the rate they reach, ``tree_network_efficiency`` of it).
    Only a tuner weighs it. ``tuner_net_latency`` is what NCCL's tuner counts on each hop
    between nodes under each protocol besides the hop's latency: a network plugin reports a
    latency for its devices (``ncclNetProperties_t.latency``: none from NCCL's own InfiniBand
    transport, 75 us from AWS's EFA plugin on p4d and p5), which NCCL's tuner adds to NCCL's
    own figure for the hop, twice under Simple (src/graph/tuning.cc, NVIDIA/nccl v2.22.3 to
    v2.30.7), where the links hold what the hop takes; so this is the reported latency less
    what the links hold beyond NCCL's figure. Only a tuner weighs it.
    """

    name: str
    nodes: tuple[str, ...]
    links: tuple[Link, ...]
    ranks: tuple[str, ...]
    reduce_bandwidth: tuple[float, ...]
    local_size: int | None = None
    launch_latency: PerProtocol = NO_LAUNCH_LATENCY
    ll_bandwidth: float = math.inf
    injection_bandwidth: float = math.inf
    ll128_channel_bandwidth: float = math.inf
    ll128_bandwidth: float = math.inf
    tree_channel_bandwidth: float = math.inf
    net_channel_bandwidth: float = math.inf
    ring_slice_gap: float = 0.0
    net_message_gap: float = 0.0
    net_message_bandwidth: float = math.inf
    ll128_enabled: bool = True
    ll_enabled: bool = True
    reducing_switches: tuple[str, ...] = ()
    switch_efficiency: float = 1.0
    tree_switch_efficiency: float | None = None
    tree_network_efficiency: float = 1.0
    switch_latency: float = 0.0
    nvls_channels: int = NVLS_CHANNELS
    compute_speed: tuple[float, ...] = ()
    channels: int | None = None
    net_overhead: float = 0.0
    tuner_nvls_tree_bandwidth: float = 0.0
    tuner_net_latency: PerProtocol = NO_LAUNCH_LATENCY
    # Routes found so far, and each node's links out and in: made anew for every instance
    # (``dataclasses.replace`` too), so a copy with other links never sees stale routes.
    _routes: dict[tuple[int, int], tuple[int, ...]] = field(
        init=False, repr=False, compare=False)
    _adjacency: list[dict[str, list[int]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_routes", {})
        object.__setattr__(self, "_adjacency", [])
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"topology {self.name!r}: node names must be unique")
        known, ends = set(self.nodes), set()
        for link in self.links:
            if not isinstance(link, Link):
                raise TypeError(f"topology {self.name!r}: links must be Link objects, got "
                                f"{link!r}")
            for end in (link.src, link.dst):
                if end not in known:
                    raise ValueError(f"topology {self.name!r}: link {link.src}->{link.dst} "
                                     f"names unknown node {end!r}")
            if (link.src, link.dst) in ends:  # a route takes the first; the second idles
                raise ValueError(f"topology {self.name!r}: two links from {link.src} to "
                                 f"{link.dst}; give one, with their bandwidth together")
            ends.add((link.src, link.dst))
        if not self.ranks:
            raise ValueError(f"topology {self.name!r} has no ranks")
        for r, node in enumerate(self.ranks):
            if node not in known:
                raise ValueError(f"topology {self.name!r}: rank {r} is on unknown node {node!r}")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"topology {self.name!r}: two ranks share a node")
        if (not isinstance(self.reduce_bandwidth, (Sequence, np.ndarray))
                or len(self.reduce_bandwidth) != len(self.ranks)):
            raise ValueError(f"topology {self.name!r}: need one reduce bandwidth per rank")
        for r, bw in enumerate(self.reduce_bandwidth):
            if isinstance(bw, bool) or not isinstance(bw, numbers.Real):
                raise TypeError(f"topology {self.name!r}: rank {r} reduce bandwidth must be a "
                                f"number of bytes/second, got {bw!r}")
            if not bw > 0:
                raise ValueError(f"topology {self.name!r}: rank {r} reduce bandwidth must be > 0")
        if self.local_size is not None and (
                type(self.local_size) is not int or self.local_size < 1
                or len(self.ranks) % self.local_size):
            raise ValueError(f"topology {self.name!r}: local_size must be an int >= 1 that "
                             f"divides its {len(self.ranks)} ranks, got {self.local_size!r}")
        if self.channels is not None:
            try:
                check_channels(self.channels)
            except ValueError as error:
                raise ValueError(f"topology {self.name!r}: {error} (None: one per rank of a "
                                 "node)") from None
        if not (isinstance(self.ll_bandwidth, (int, float))
                and not isinstance(self.ll_bandwidth, bool) and self.ll_bandwidth > 0):
            raise ValueError(f"topology {self.name!r}: ll_bandwidth must be > 0 bytes/second "
                             f"(inf: no limit), got {self.ll_bandwidth!r}")
        for key in ("injection_bandwidth", "ll128_channel_bandwidth", "ll128_bandwidth",
                    "tree_channel_bandwidth", "net_channel_bandwidth", "net_message_bandwidth"):
            rate = getattr(self, key)
            if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0):
                raise ValueError(f"topology {self.name!r}: {key} must be > 0 bytes/second "
                                 f"(inf: no limit), got {rate!r}")
        rate = self.tuner_nvls_tree_bandwidth
        if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 0):
            raise ValueError(f"topology {self.name!r}: tuner_nvls_tree_bandwidth must be >= 0 "
                             f"bytes/second (0: none), got {rate!r}")
        for key in ("ll128_enabled", "ll_enabled"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"topology {self.name!r}: {key} must be True or False, "
                                 f"got {getattr(self, key)!r}")
        ranked = set(self.ranks)
        if isinstance(self.reducing_switches, str):  # a name, not a tuple of names
            raise ValueError(f"topology {self.name!r}: reducing_switches must be a tuple of "
                             f"node names, got {self.reducing_switches!r}")
        for node in self.reducing_switches:
            if node not in known or node in ranked:
                raise ValueError(f"topology {self.name!r}: reducing switch {node!r} is not a "
                                 "switch node of the topology")
        for key in ("switch_efficiency", "tree_switch_efficiency", "tree_network_efficiency"):
            share = getattr(self, key)
            if key == "tree_switch_efficiency" and share is None:
                continue
            if not (isinstance(share, (int, float)) and not isinstance(share, bool)
                    and 0 < share <= 1):
                raise ValueError(f"topology {self.name!r}: {key} must be in (0, 1], "
                                 f"got {share!r}")
        try:
            check_channels(self.nvls_channels)
        except ValueError as error:
            raise ValueError(f"topology {self.name!r}: nvls_{error}") from None
        _check_seconds(self.switch_latency, f"topology {self.name!r}: switch_latency")
        _check_seconds(self.net_overhead, f"topology {self.name!r}: net_overhead")
        if type(self.tuner_net_latency) is not PerProtocol:
            raise ValueError(f"topology {self.name!r}: tuner_net_latency must be a "
                             f"PerProtocol, got {self.tuner_net_latency!r}")
        _check_seconds(self.ring_slice_gap, f"topology {self.name!r}: ring_slice_gap")
        _check_seconds(self.net_message_gap, f"topology {self.name!r}: net_message_gap")
        if self.compute_speed and len(self.compute_speed) != len(self.ranks):
            raise ValueError(f"topology {self.name!r}: compute_speed needs one factor per rank "
                             f"({len(self.ranks)}), got {len(self.compute_speed)}")
        for r, speed in enumerate(self.compute_speed):
            if not (isinstance(speed, (int, float)) and not isinstance(speed, bool)
                    and 0 < speed < math.inf):
                raise ValueError(f"topology {self.name!r}: rank {r} compute speed must be a "
                                 f"number > 0, got {speed!r}")
        if type(self.launch_latency) is not PerProtocol:
            raise TypeError(f"topology {self.name!r}: launch_latency must be a PerProtocol, "
                            f"got {self.launch_latency!r}")

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node: ``local_size``, or every rank on one node without it (as
        ``Comm.ranks_per_node``)."""
        return self.local_size or len(self.ranks)

    @property
    def node_count(self) -> int:
        """How many nodes the ranks lie on."""
        return len(self.ranks) // self.ranks_per_node

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Indices into ``links`` of the path from rank ``src`` to rank ``dst`` (cached)."""
        key = (src, dst)
        path = self._routes.get(key)
        if path is None:
            for rank in key:
                if (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))
                        or not 0 <= rank < self.size):
                    raise ValueError(f"route from rank {src!r} to rank {dst!r}: the topology "
                                     f"has ranks 0 to {self.size - 1}")
            path = self._routes[key] = self._shortest_path(src, dst)
        return path

    def switch_share(self, tree: bool = False) -> float:
        """The share of its links' bandwidth in-switch traffic reaches: under NVLS, or
        (``tree``) under NVLS-tree."""
        if tree and self.tree_switch_efficiency is not None:
            return self.tree_switch_efficiency
        return self.switch_efficiency

    def tree_network_share(self) -> float:
        """The share of its way's bandwidth that an NVLS-tree rank's sends to other nodes
        reach: ``tree_network_efficiency`` on more than two nodes, all of it on two (where
        each tree is a single pair of nodes)."""
        return self.tree_network_efficiency if self.node_count > 2 else 1.0

    def switch_rate(self, rank: int, tree: bool = False) -> float:
        """Bytes per second of in-switch traffic (NVLS, or ``tree``: NVLS-tree) on
        ``rank``'s way to the switch that reduces for its node: ``switch_share`` of the
        slowest link on it."""
        self._check_rank("switch_rate", rank)
        per_node = self.ranks_per_node
        if per_node == 1:
            raise ValueError(f"topology {self.name!r}: rank {rank} shares its node with no "
                             "other rank, so no in-switch traffic leaves it")
        first = rank - rank % per_node
        mate = first + 1 if rank == first else first  # another GPU of its node
        return self.switch_share(tree) * min(self.links[i].bandwidth
                                             for i in self.route(rank, mate))

    def route_matrix(self, src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray
                     ) -> np.ndarray:
        """The routes from each ``src[i]`` to ``dst[i]`` as rows of link indices, padded at
        the end with -1 (an int64 array of shape (pairs, links of the longest route))."""
        routes = [self.route(int(a), int(b)) for a, b in zip(src, dst)]
        width = max((len(route) for route in routes), default=0)
        return np.array([route + (-1,) * (width - len(route)) for route in routes],
                        dtype=np.int64).reshape(len(routes), width)

    def _shortest_path(self, src: int, dst: int) -> tuple[int, ...]:
        # Fewest hops, then the fattest path, then link order: Dijkstra on (hops, -bottleneck
        # bandwidth, link indices), run only over the links that lie on some path of the
        # fewest hops. Those come from a search from both ends that stops where they meet,
        # so a route between two GPUs never walks the thousands of links of the network
        # switch between them. Every node's best label comes over such a link, so the
        # restriction leaves the route as a search of the whole graph finds it.
        start, goal = self.ranks[src], self.ranks[dst]
        short = self._route_of_two_links_at_most(start, goal)
        if short is not None:
            return short
        outgoing = self._links_on_shortest_paths(start, goal)
        if outgoing is None:
            raise ValueError(f"topology {self.name!r}: no route from rank {src} ({start}) "
                             f"to rank {dst} ({goal})")
        heap: list[tuple[int, float, tuple[int, ...], str]] = [(0, -math.inf, (), start)]
        done: set[str] = set()
        while heap:
            hops, neg_bw, path, node = heapq.heappop(heap)
            if node == goal:
                return path
            if node in done:
                continue
            done.add(node)
            for i in outgoing.get(node, ()):
                link = self.links[i]
                if link.dst not in done:
                    bottleneck = -min(-neg_bw, link.bandwidth)
                    heapq.heappush(heap, (hops + 1, bottleneck, path + (i,), link.dst))
        raise AssertionError("unreachable: the goal ends every path of the fewest hops")

    def _route_of_two_links_at_most(self, start: str, goal: str) -> tuple[int, ...] | None:
        """The route if it has one or two links (most routes between GPUs), else None: what
        the search below finds, from the links of the two ends alone."""
        if start == goal:
            return ()
        outgoing, incoming = self._links_by_node()
        links = self.links
        # Labels (-bandwidth, index) order the candidates: the fattest, then link order.
        direct = None
        into: dict[str, tuple[float, int]] = {}  # middle node -> its best link from start
        for i in outgoing.get(start, ()):
            link = links[i]
            label = (-link.bandwidth, i)
            if link.dst == goal:
                direct = label if direct is None or label < direct else direct
            elif link.dst not in into or label < into[link.dst]:
                into[link.dst] = label
        if direct is not None:
            return (direct[1],)
        best = None
        for j in incoming.get(goal, ()):
            first = into.get(links[j].src)
            if first is not None:
                candidate = (max(first[0], -links[j].bandwidth), (first[1], j))
                best = candidate if best is None or candidate < best else best
        return None if best is None else best[1]

    def _links_on_shortest_paths(self, start: str, goal: str) -> dict[str, list[int]] | None:
        """The links on some path of the fewest hops from ``start`` to ``goal``, by the node
        they leave; None if there is no path. Breadth-first from both ends, each time
        widening the side whose next step crosses fewer links, until the two meet."""
        by_node = self._links_by_node()  # outgoing, incoming
        far_end = ("dst", "src")
        ends: list[dict[str, int]] = [{start: 0}, {goal: 0}]  # node -> hops from its end
        layers: list[list[list[str]]] = [[[start]], [[goal]]]
        meet = [start] if start == goal else []
        while not meet:
            cost = [sum(len(by_node[side].get(v, ())) for v in layers[side][-1])
                    for side in (0, 1)]
            side = 0 if cost[0] <= cost[1] else 1
            frontier = []
            for v in layers[side][-1]:
                for i in by_node[side].get(v, ()):
                    w = getattr(self.links[i], far_end[side])
                    if w not in ends[side]:
                        ends[side][w] = len(layers[side])
                        frontier.append(w)
            if not frontier:
                return None
            layers[side].append(frontier)
            meet = [v for v in frontier if v in ends[1 - side]]
        # Every link of a shortest path leaves a node of the start's layers or enters one of
        # the goal's. Walk each side's layers back from where they met, keeping the links
        # that lead on to a node kept one layer nearer the meeting.
        outgoing: dict[str, list[int]] = {}
        for side in (0, 1):
            ahead = set(meet)
            for layer in reversed(layers[side][:ends[side][meet[0]]]):
                kept = set()
                for v in layer:
                    for i in by_node[side].get(v, ()):
                        if getattr(self.links[i], far_end[side]) in ahead:
                            outgoing.setdefault(self.links[i].src, []).append(i)
                            kept.add(v)
                ahead = kept
        return outgoing

    def _links_by_node(self) -> list[dict[str, list[int]]]:
        """Each node's outgoing and incoming link indices, in link order (built once)."""
        if not self._adjacency:
            outgoing: dict[str, list[int]] = {}
            incoming: dict[str, list[int]] = {}
            for i, link in enumerate(self.links):
                outgoing.setdefault(link.src, []).append(i)
                incoming.setdefault(link.dst, []).append(i)
            self._adjacency.extend((outgoing, incoming))
        return self._adjacency

    def egress_bandwidth(self, rank: int) -> float:
        """Total bandwidth of the links leaving rank ``rank``'s node."""
        self._check_rank("egress bandwidth", rank)
        node = self.ranks[rank]
        return sum(link.bandwidth for link in self.links if link.src == node)

    def speed_of(self, rank: int) -> float:
        """How fast ``rank`` computes against the nominal speed (``compute_speed``)."""
        return self.compute_speed[rank] if self.compute_speed else 1.0

    def with_compute_speed(self, speeds: dict[int, float]) -> Topology:
        """A copy whose ranks in ``speeds`` compute at those factors of the nominal speed
        (``{3: 0.8}``: rank 3 is 20% slow); the others keep theirs."""
        if not isinstance(speeds, dict):
            raise TypeError(f"with_compute_speed takes a dict of rank -> factor, got {speeds!r}")
        factors = [self.speed_of(r) for r in range(self.size)]
        for rank, speed in speeds.items():
            self._check_rank("compute speed", rank)
            factors[rank] = speed
        return replace(self, compute_speed=tuple(factors))

    def with_memory_speed(self, speeds: dict[int, float]) -> Topology:
        """A copy whose ranks in ``speeds`` reduce and copy locally at those factors of
        their ``reduce_bandwidth`` (``{3: 0.5}``: rank 3's memory at half the rate); an
        infinite rate (free reductions) stays infinite."""
        if not isinstance(speeds, dict):
            raise TypeError(f"with_memory_speed takes a dict of rank -> factor, got {speeds!r}")
        rates = list(self.reduce_bandwidth)
        for rank, speed in speeds.items():
            self._check_rank("memory speed", rank)
            if not (isinstance(speed, (int, float)) and not isinstance(speed, bool)
                    and 0 < speed < math.inf):
                raise ValueError(f"memory speed for rank {rank}: a factor > 0, got {speed!r}")
            rates[rank] *= speed
        return replace(self, reduce_bandwidth=tuple(rates))

    def channel_rate(self, protocol: Protocol, channels: int, as_nccl: bool = False) -> float:
        """What one of a collective's ``channels`` channels moves per second at most under
        ``protocol``: an even share of what one GPU's kernels move (``injection_bandwidth``;
        under LL no more than ``ll_bandwidth``, under LL128 no more than
        ``ll128_bandwidth`` unless ``as_nccl``, as NCCL's cost model takes it), under LL128
        no more than ``ll128_channel_bandwidth``. Infinite: no limit."""
        if not channels >= 1:
            raise ValueError(f"channel_rate: channels must be >= 1, got {channels!r}")
        rate = self.injection_bandwidth
        if protocol is Protocol.LL:
            rate = min(rate, self.ll_bandwidth)
        if protocol is Protocol.LL128 and not as_nccl:
            rate = min(rate, self.ll128_bandwidth)
        share = rate / channels
        if protocol is Protocol.LL128:
            return min(share, self.ll128_channel_bandwidth)
        return share

    def _check_rank(self, what: str, rank: object) -> None:
        if not (isinstance(rank, int) and 0 <= rank < self.size):
            raise ValueError(f"{what} for rank {rank!r}: the topology has ranks 0 to "
                             f"{self.size - 1}")

    def with_link_speed(self, src: str, dst: str, bandwidth: float = 1.0, latency: float = 1.0,
                        both_ways: bool = True) -> Topology:
        """A copy whose links from node ``src`` to node ``dst`` (and back, with
        ``both_ways``) carry ``bandwidth`` times their bandwidth and take ``latency`` times
        their latency, under every protocol (a NIC at half rate: ``bandwidth=0.5``)."""
        for name, factor in (("bandwidth", bandwidth), ("latency", latency)):
            if not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
                    and 0 < factor < math.inf):
                raise ValueError(f"link speed {src}->{dst}: the {name} factor must be a "
                                 f"number > 0, got {factor!r}")
        ends = {(src, dst), (dst, src)} if both_ways else {(src, dst)}
        if not any((link.src, link.dst) in ends for link in self.links):
            raise ValueError(f"topology {self.name!r} has no link from {src!r} to {dst!r}")
        scaled = [replace(link, bandwidth=link.bandwidth * bandwidth,
                          latency=link.latency * latency,
                          ll_latency=None if link.ll_latency is None
                          else link.ll_latency * latency,
                          ll128_latency=None if link.ll128_latency is None
                          else link.ll128_latency * latency,
                          tree_latency=None if link.tree_latency is None
                          else link.tree_latency.scaled(latency))
                  if (link.src, link.dst) in ends else link for link in self.links]
        return replace(self, links=tuple(scaled))

    def with_latency_jitter(self, seed: int, max_extra: float) -> Topology:
        """A copy whose every link latency grows by a random amount in [0, max_extra)
        seconds, drawn from ``seed``."""
        if not (isinstance(max_extra, (int, float)) and not isinstance(max_extra, bool)
                and math.isfinite(max_extra) and max_extra >= 0):
            raise ValueError(f"with_latency_jitter: max_extra must be a finite number of "
                             f"seconds >= 0, got {max_extra!r}")
        if type(seed) is not int or seed < 0:
            raise ValueError(f"with_latency_jitter: seed must be an int >= 0, got {seed!r}")
        rng = np.random.default_rng(seed)
        extra = rng.uniform(0.0, max_extra, size=len(self.links))
        links = tuple(replace(link, latency=link.latency + float(e),
                              ll_latency=None if link.ll_latency is None
                              else link.ll_latency + float(e),
                              ll128_latency=None if link.ll128_latency is None
                              else link.ll128_latency + float(e),
                              tree_latency=None if link.tree_latency is None
                              else link.tree_latency.scaled(1.0, float(e)))
                      for link, e in zip(self.links, extra))
        return replace(self, name=f"{self.name}+jitter", links=links)


def duplex(a: str, b: str, bandwidth: float, latency: float | PerProtocol,
            share: float = 1.0) -> list[Link]:
    """Both directions of a cable with ``share`` of ``latency`` (each protocol's, if given)."""
    return [_link_with(a, b, bandwidth, latency, share),
            _link_with(b, a, bandwidth, latency, share)]


def _link_with(src: str, dst: str, bandwidth: float, latency: float | PerProtocol,
              share: float = 1.0) -> Link:
    """A link with ``share`` of ``latency``: seconds, or seconds per protocol (and for
    NCCL's tree, if given)."""
    if isinstance(latency, bool) or not isinstance(latency, (PerProtocol, numbers.Real)):
        raise TypeError(f"link {src}->{dst}: latency must be seconds (a number) or a "
                        f"PerProtocol, got {latency!r}")
    if isinstance(latency, PerProtocol):
        return Link(src, dst, bandwidth, latency.simple * share,
                    ll_latency=latency.ll * share, ll128_latency=latency.ll128 * share,
                    tree_latency=None if latency.tree is None
                    else latency.tree.scaled(share))
    return Link(src, dst, bandwidth, latency * share)


def check_rank_count(n: int) -> None:
    """Refuse a number of ranks that is not an int from 1 to ``MAX_RANKS``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"number of ranks must be an int >= 1, got {n!r}")
    if n > MAX_RANKS:
        raise ValueError(f"number of ranks must be at most {MAX_RANKS:,}, got {n:,}")


def _gpus(n: int, prefix: str = "gpu") -> list[str]:
    check_rank_count(n)
    return [f"{prefix}{i}" for i in range(n)]


def _reduce_bw(n: int, reduce_bandwidth: float) -> tuple[float, ...]:
    if isinstance(reduce_bandwidth, bool) or not isinstance(reduce_bandwidth, numbers.Real):
        raise TypeError(f"reduce_bandwidth must be a number of bytes/second, got "
                        f"{reduce_bandwidth!r}")
    return (float(reduce_bandwidth),) * n


def ring(ranks: int, bandwidth: float, latency: float | PerProtocol,
         reduce_bandwidth: float = math.inf) -> Topology:
    """GPUs in a ring, a full-duplex cable between neighbours."""
    gpus = _gpus(ranks)
    links: list[Link] = []
    pairs = {(min(i, (i + 1) % ranks), max(i, (i + 1) % ranks)) for i in range(ranks)}
    for i, j in sorted(pairs):
        if i != j:
            links += duplex(gpus[i], gpus[j], bandwidth, latency)
    return Topology("ring", tuple(gpus), tuple(links), tuple(gpus),
                    _reduce_bw(ranks, reduce_bandwidth))


def fully_connected(ranks: int, bandwidth: float, latency: float | PerProtocol,
                    reduce_bandwidth: float = math.inf) -> Topology:
    """A direct link each way between every pair of GPUs (an NVLink mesh)."""
    gpus = _gpus(ranks)
    check_full_mesh(ranks)
    links = [_link_with(a, b, bandwidth, latency) for a in gpus for b in gpus if a != b]
    return Topology("fully_connected", tuple(gpus), tuple(links), tuple(gpus),
                    _reduce_bw(ranks, reduce_bandwidth))


def check_full_mesh(ranks: int) -> None:
    """Refuse a link each way between every pair of ``ranks`` ranks past
    ``MAX_FULL_MESH_LINKS`` links."""
    links = ranks * (ranks - 1)
    if links > MAX_FULL_MESH_LINKS:
        raise ValueError(f"a fully-connected topology of {ranks:,} ranks has {links:,} links, "
                         f"more than the {MAX_FULL_MESH_LINKS:,} simulated in reasonable time: "
                         "use a switch topology for this many ranks")


def switch(ranks: int, bandwidth: float, latency: float | PerProtocol,
           reduce_bandwidth: float = math.inf) -> Topology:
    """Each GPU has an up and a down link to one switch (NVSwitch).

    ``latency`` is GPU-to-GPU: half of it is put on each of the two links of a path. Here
    and in every builder a latency is seconds, or seconds per protocol (``PerProtocol``).
    """
    gpus = _gpus(ranks)
    links: list[Link] = []
    for g in gpus:
        links += duplex(g, "switch", bandwidth, latency, 0.5)
    return Topology("switch", tuple(gpus) + ("switch",), tuple(links), tuple(gpus),
                    _reduce_bw(ranks, reduce_bandwidth))


def hierarchical(nodes: int, gpus_per_node: int, intra_bandwidth: float,
                 intra_latency: float | PerProtocol, inter_bandwidth: float,
                 inter_latency: float | PerProtocol, nic_per_gpu: bool = True,
                 reduce_bandwidth: float = math.inf) -> Topology:
    """Nodes of GPUs on a node switch, joined by one network switch.

    With ``nic_per_gpu`` every GPU has its own NIC link to the network switch (rail-style, as
    DGX machines); otherwise each node switch has one NIC link. Latencies are end-to-end:
    half on each link of an intra-node path (GPU-switch-GPU), and for inter-node paths half of
    ``inter_latency`` on each network link.
    """
    for name, count in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be an int >= 1, got {count!r}")
    check_flag(nic_per_gpu, "nic_per_gpu")
    gpus = _gpus(nodes * gpus_per_node)
    names: list[str] = list(gpus)
    links: list[Link] = []
    for n in range(nodes):
        node_switch = f"node{n}.switch"
        names.append(node_switch)
        for g in gpus[n * gpus_per_node:(n + 1) * gpus_per_node]:
            links += duplex(g, node_switch, intra_bandwidth, intra_latency, 0.5)
            if nic_per_gpu:
                links += duplex(g, "net", inter_bandwidth, inter_latency, 0.5)
        if not nic_per_gpu:
            links += duplex(node_switch, "net", inter_bandwidth, inter_latency, 0.5)
    names.append("net")
    return Topology("hierarchical", tuple(names), tuple(links), tuple(gpus),
                    _reduce_bw(len(gpus), reduce_bandwidth), gpus_per_node)


TOPOLOGIES = ("ring", "fully_connected", "switch", "hierarchical")


def make_topology(kind: str, ranks: int, bandwidth: float, latency: float,
                  reduce_bandwidth: float = math.inf, gpus_per_node: int | None = None,
                  inter_bandwidth: float | None = None, inter_latency: float | None = None
                  ) -> Topology:
    """Build a topology by name; ``hierarchical`` needs ``gpus_per_node`` dividing ``ranks``
    and takes the network's figures from ``inter_*`` (default: the intra-node ones); the
    others take none of them."""
    if kind != "hierarchical":
        given = [name for name, value in (("gpus_per_node", gpus_per_node),
                                          ("inter_bandwidth", inter_bandwidth),
                                          ("inter_latency", inter_latency)) if value is not None]
        if given:
            raise ValueError(f"{kind}: {', '.join(given)} apply to hierarchical only")
    if kind == "ring":
        return ring(ranks, bandwidth, latency, reduce_bandwidth)
    if kind == "fully_connected":
        return fully_connected(ranks, bandwidth, latency, reduce_bandwidth)
    if kind == "switch":
        return switch(ranks, bandwidth, latency, reduce_bandwidth)
    if kind == "hierarchical":
        check_rank_count(ranks)
        per_node = min(ranks, 8) if gpus_per_node is None else gpus_per_node
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ValueError(f"hierarchical: gpus_per_node must be an int >= 1, got {per_node!r}")
        if ranks % per_node:
            raise ValueError(f"hierarchical: {ranks} ranks do not fill nodes of {per_node} GPUs")
        return hierarchical(ranks // per_node, per_node, bandwidth, latency,
                            bandwidth if inter_bandwidth is None else inter_bandwidth,
                            latency if inter_latency is None else inter_latency,
                            reduce_bandwidth=reduce_bandwidth)
    raise ValueError(f"unknown topology {kind!r}; known: {', '.join(TOPOLOGIES)}")


def check_ranks(topology: Topology, inputs: Sequence[object]) -> None:
    """Raise if the number of inputs does not match the topology's ranks."""
    if len(inputs) != topology.size:
        raise ValueError(f"got {len(inputs)} inputs for a topology of {topology.size} ranks")
