"""Topology builders: how many links each makes, where routes go, and what they cost."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcomm import Link, Topology, fully_connected, hierarchical, make_topology, ring, switch
from simcomm.topology import check_full_mesh

B, ALPHA = 1e10, 2e-6


def route_links(topology: Topology, src: int, dst: int) -> list[Link]:
    return [topology.links[i] for i in topology.route(src, dst)]


def check_route_is_a_path(topology: Topology, src: int, dst: int) -> None:
    links = route_links(topology, src, dst)
    assert links[0].src == topology.ranks[src]
    assert links[-1].dst == topology.ranks[dst]
    for before, after in zip(links, links[1:]):
        assert before.dst == after.src


@given(p=st.integers(1, 16))
def test_ring_links_and_routes(p) -> None:
    topology = ring(p, B, ALPHA)
    assert len(topology.links) == {1: 0, 2: 2}.get(p, 2 * p)
    for src in range(p):
        for dst in range(p):
            if src != dst:
                check_route_is_a_path(topology, src, dst)
                # the shorter way round the ring
                assert len(topology.route(src, dst)) == min((dst - src) % p, (src - dst) % p)
    assert topology.egress_bandwidth(0) == {1: 0, 2: B}.get(p, 2 * B)


@given(p=st.integers(1, 16))
def test_fully_connected_has_a_direct_link_per_ordered_pair(p) -> None:
    topology = fully_connected(p, B, ALPHA)
    assert len(topology.links) == p * (p - 1)
    assert len({(link.src, link.dst) for link in topology.links}) == p * (p - 1)
    for src in range(p):
        assert topology.egress_bandwidth(src) == pytest.approx((p - 1) * B)
        for dst in range(p):
            if src != dst:
                (link,) = route_links(topology, src, dst)
                assert (link.src, link.dst) == (topology.ranks[src], topology.ranks[dst])


def test_fully_connected_is_refused_past_a_million_links() -> None:
    check_full_mesh(1000)  # 999,000 links
    with pytest.raises(ValueError, match="a fully-connected topology of 1,001 ranks has "
                                         "1,001,000 links, more than the 1,000,000"):
        fully_connected(1001, B, ALPHA)


@given(p=st.integers(1, 16))
def test_switch_routes_go_up_and_down_with_half_the_latency_on_each(p) -> None:
    topology = switch(p, B, ALPHA)
    assert len(topology.links) == 2 * p
    assert "switch" in topology.nodes and "switch" not in topology.ranks
    for src in range(p):
        assert topology.egress_bandwidth(src) == B
        for dst in range(p):
            if src != dst:
                up, down = route_links(topology, src, dst)
                assert (up.src, up.dst, down.src, down.dst) == (
                    topology.ranks[src], "switch", "switch", topology.ranks[dst])
                assert up.latency + down.latency == ALPHA


INTRA_B, INTRA_ALPHA, INTER_B, INTER_ALPHA = 9e11, 1e-6, 5e10, 4e-6


@pytest.mark.parametrize("nic_per_gpu", [True, False], ids=["nic_per_gpu", "nic_per_node"])
@given(nodes=st.integers(1, 4), per_node=st.integers(1, 4))
def test_hierarchical_routes_stay_in_the_node_or_cross_the_network(nic_per_gpu, nodes,
                                                                   per_node) -> None:
    topology = hierarchical(nodes, per_node, INTRA_B, INTRA_ALPHA, INTER_B, INTER_ALPHA,
                            nic_per_gpu=nic_per_gpu)
    p = nodes * per_node
    assert topology.size == p
    nic_links = 2 * p if nic_per_gpu else 2 * nodes
    assert len(topology.links) == 2 * p + nic_links
    for src in range(p):
        expected_egress = INTRA_B + INTER_B if nic_per_gpu else INTRA_B
        assert topology.egress_bandwidth(src) == expected_egress
        for dst in range(p):
            if src == dst:
                continue
            check_route_is_a_path(topology, src, dst)
            links = route_links(topology, src, dst)
            nodes_on_path = {link.dst for link in links}
            latency = sum(link.latency for link in links)
            bottleneck = min(link.bandwidth for link in links)
            if src // per_node == dst // per_node:
                assert nodes_on_path == {f"node{src // per_node}.switch", topology.ranks[dst]}
                assert (latency, bottleneck) == (pytest.approx(INTRA_ALPHA), INTRA_B)
            elif nic_per_gpu:
                assert nodes_on_path == {"net", topology.ranks[dst]}
                assert (latency, bottleneck) == (pytest.approx(INTER_ALPHA), INTER_B)
            else:  # GPU -> node switch -> network -> node switch -> GPU
                assert len(links) == 4 and "net" in nodes_on_path
                assert (latency, bottleneck) == (pytest.approx(INTRA_ALPHA + INTER_ALPHA),
                                                 INTER_B)


def test_equal_hop_routes_prefer_the_fattest_path() -> None:
    # Two 2-hop paths from a to b; the one through the fast hub wins, whatever the link order.
    slow = [Link("a", "slow", 1e9, 0.0), Link("slow", "b", 1e9, 0.0)]
    fast = [Link("a", "fast", 1e10, 0.0), Link("fast", "b", 1e10, 0.0)]
    topology = Topology("two_paths", ("a", "b", "slow", "fast"), tuple(slow + fast),
                        ("a", "b"), (math.inf, math.inf))
    assert [topology.links[i].dst for i in topology.route(0, 1)] == ["fast", "b"]


def test_fewer_hops_beat_a_fatter_path() -> None:
    links = (Link("a", "b", 1e9, 0.0), Link("a", "hub", 1e12, 0.0), Link("hub", "b", 1e12, 0.0))
    topology = Topology("direct", ("a", "b", "hub"), links, ("a", "b"), (1.0, 1.0))
    assert topology.route(0, 1) == (0,)


def test_hierarchical_with_a_fast_network_still_routes_intra_node_on_ties() -> None:
    # Equal bandwidths: the node switch is found first in link order, so it wins the tie.
    topology = hierarchical(2, 2, 1e11, 1e-6, 1e11, 1e-6)
    nodes_on_path = [topology.links[i].dst for i in topology.route(0, 1)]
    assert nodes_on_path == ["node0.switch", "gpu1"]


@given(seed=st.integers(0, 2**32 - 1), extra=st.floats(1e-9, 1e-3))
def test_latency_jitter_only_adds_latency(seed, extra) -> None:
    topology = switch(4, B, ALPHA, reduce_bandwidth=1e11)
    noisy = topology.with_latency_jitter(seed, extra)
    assert noisy.name == "switch+jitter"
    assert (noisy.nodes, noisy.ranks, noisy.reduce_bandwidth) == (
        topology.nodes, topology.ranks, topology.reduce_bandwidth)
    for before, after in zip(topology.links, noisy.links):
        assert (after.src, after.dst, after.bandwidth) == (before.src, before.dst, before.bandwidth)
        assert before.latency <= after.latency <= before.latency + extra
    assert noisy.route(0, 3) == topology.route(0, 3)


@pytest.mark.parametrize("kind", ["ring", "fully_connected", "switch", "hierarchical"])
def test_make_topology_builds_each_kind(kind) -> None:
    topology = make_topology(kind, 8, B, ALPHA, reduce_bandwidth=1e11)
    assert topology.name == kind
    assert topology.size == 8
    assert topology.reduce_bandwidth == (1e11,) * 8


def test_make_topology_hierarchical_takes_network_figures() -> None:
    topology = make_topology("hierarchical", 16, INTRA_B, INTRA_ALPHA, gpus_per_node=4,
                             inter_bandwidth=INTER_B, inter_latency=INTER_ALPHA)
    assert [node for node in topology.nodes if node.endswith(".switch")] == [
        "node0.switch", "node1.switch", "node2.switch", "node3.switch"]
    assert min(link.bandwidth for link in route_links(topology, 0, 15)) == INTER_B
    assert min(link.bandwidth for link in route_links(topology, 0, 3)) == INTRA_B


def test_topologies_are_frozen_values() -> None:
    assert ring(4, B, ALPHA) == ring(4, B, ALPHA)
    assert ring(4, B, ALPHA) != ring(4, B, 2 * ALPHA)
    with pytest.raises(AttributeError):
        ring(4, B, ALPHA).name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("max_extra", [-1e-6, math.nan, math.inf, "1us", True])
def test_latency_jitter_refuses_a_bad_amount_by_name(max_extra) -> None:
    with pytest.raises(ValueError, match="max_extra must be a finite number of seconds >= 0"):
        ring(4, 1e9, 0.0).with_latency_jitter(0, max_extra)


def test_latency_jitter_refuses_a_seed_that_is_not_an_int() -> None:
    with pytest.raises(ValueError, match="seed must be an int"):
        ring(4, 1e9, 0.0).with_latency_jitter(0.5, 1e-6)


def _full_search_route(topology: Topology, src: int, dst: int) -> tuple[int, ...] | None:
    # The definition of a route, searched over the whole graph: Dijkstra on (hops,
    # -bottleneck bandwidth, link indices). Topology.route searches only the nodes on
    # paths of the fewest hops and must agree with it everywhere.
    import heapq
    start, goal = topology.ranks[src], topology.ranks[dst]
    heap = [(0, -math.inf, (), start)]
    done = set()
    while heap:
        hops, neg_bw, path, node = heapq.heappop(heap)
        if node == goal:
            return path
        if node in done:
            continue
        done.add(node)
        for i, link in enumerate(topology.links):
            if link.src == node and link.dst not in done:
                heapq.heappush(heap, (hops + 1, -min(-neg_bw, link.bandwidth), path + (i,),
                                      link.dst))
    return None


@st.composite
def _random_graphs(draw: st.DrawFn) -> Topology:
    # Few bandwidths, so that ties between paths are common; no parallel links (a topology
    # refuses them: a route would take one and idle the other).
    nodes = [f"n{i}" for i in range(draw(st.integers(2, 9)))]
    pairs = st.tuples(st.sampled_from(nodes), st.sampled_from(nodes)).filter(
        lambda pair: pair[0] != pair[1])
    links = tuple(Link(a, b, draw(st.sampled_from([1.0, 2.0, 3.0])), 0.0)
                  for a, b in draw(st.lists(pairs, min_size=1, max_size=30, unique=True)))
    ranks = draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True))
    return Topology("random", tuple(nodes), links, tuple(ranks), (1.0,) * len(ranks))


@given(_random_graphs())
def test_routes_equal_a_search_of_the_whole_graph(topology) -> None:
    for src in range(topology.size):
        for dst in range(topology.size):
            want = _full_search_route(topology, src, dst)
            if want is None:
                with pytest.raises(ValueError, match="no route from rank"):
                    topology.route(src, dst)
            else:
                assert topology.route(src, dst) == want


@pytest.mark.parametrize("spec", ["cluster-h100:nodes=3", "fattree-h100:nodes=4",
                                  "pcie-a100", "dgx-h100"])
def test_preset_routes_equal_a_search_of_the_whole_graph(spec) -> None:
    from simcomm.presets import make_preset
    topology = make_preset(spec)
    for src in range(topology.size):
        for dst in range(0, topology.size, 3):
            if src != dst:
                assert topology.route(src, dst) == _full_search_route(topology, src, dst)


def test_a_route_across_a_large_cluster_does_not_walk_the_network_switch() -> None:
    # 2,048 nodes: the network switch has 32,768 links; a route between two GPUs looks at
    # the few links of its ends only (else this test would take minutes).
    topology = hierarchical(2048, 8, B, ALPHA, B / 9, ALPHA)
    for r in range(0, topology.size, 7):
        route = route_links(topology, r, (r + 8) % topology.size)
        assert [link.dst for link in route] == ["net", topology.ranks[(r + 8) % topology.size]]
