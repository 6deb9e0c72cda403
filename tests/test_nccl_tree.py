"""NCCL's trees and the tree and hierarchical all-reduces: the double binary tree against
NCCL's own drawings (src/graph/trees.cc), and the messages each all-reduce sends, from the
recorded op trace. Their results are checked in test_properties.py with the others'."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest

from algorithms import (
    Comm, Launch, Protocol, Send, Spawn, binary_tree, double_binary_tree, hierarchical_allreduce,
    nccl_ring_allreduce, nccl_tree_allreduce, tree_position,
)
from simcomm import SizeOnly, SimResult, Topology, hierarchical, simulate
from simcomm.presets import make_preset


def run(algorithm, topology: Topology, count: int, **params) -> SimResult:
    return simulate(algorithm, [SizeOnly(count, np.float32)] * topology.size, topology,
                    **params)


def tree_edges(nodes: int, tree: int) -> set[tuple[int, int]]:
    """(child, parent) of every node but the root in tree 0 or 1 of the double tree."""
    parents = [double_binary_tree(nodes, n)[tree][0] for n in range(nodes)]
    return {(n, parent) for n, parent in enumerate(parents) if parent != -1}


# -- the trees ---------------------------------------------------------------------------

def test_binary_tree_is_the_one_drawn_above_ncclGetBtree() -> None:
    # 0---8; 8: 4, 12; 4: 2, 6; 12: 10, 13; 2: 1, 3; 6: 5, 7; 10: 9, 11 (14 nodes).
    drawn = {0: (-1, (-1, 8)), 8: (0, (4, 12)), 4: (8, (2, 6)), 12: (8, (10, 13)),
             2: (4, (1, 3)), 6: (4, (5, 7)), 10: (12, (9, 11)), 13: (12, (-1, -1))}
    drawn |= {leaf: (parent, (-1, -1)) for leaf, parent in
              ((1, 2), (3, 2), (5, 6), (7, 6), (9, 10), (11, 10))}
    assert {n: binary_tree(14, n) for n in range(14)} == drawn


@pytest.mark.parametrize(("nodes", "parents"), [
    # Mirrored for an even count: 11---3; 3: 1, 7; 1: 0, 2; 7: 5, 9; 5: 4, 6; 9: 8, 10.
    (12, {11: -1, 3: 11, 1: 3, 7: 3, 0: 1, 2: 1, 5: 7, 9: 7, 4: 5, 6: 5, 8: 9, 10: 9}),
    # Shifted by one for an odd count: 1---9; 9: 5, 0; 5: 3, 7; 0: 11; 3: 2, 4; 7: 6, 8;
    # 11: 10, 12.
    (13, {1: -1, 9: 1, 5: 9, 0: 9, 3: 5, 7: 5, 11: 0, 2: 3, 4: 3, 6: 7, 8: 7, 10: 11,
          12: 11}),
], ids=["mirror", "shift"])
def test_the_second_tree_is_the_one_drawn_above_ncclGetDtree(nodes, parents) -> None:
    assert {n: double_binary_tree(nodes, n)[1][0] for n in range(nodes)} == parents
    for n in range(nodes):
        children = {c for c in double_binary_tree(nodes, n)[1][1] if c != -1}
        assert children == {c for c, p in parents.items() if p == n}


@pytest.mark.parametrize("nodes", range(1, 70))
def test_both_trees_span_the_nodes_and_each_node_is_a_leaf_in_one(nodes) -> None:
    for tree in (0, 1):
        places = [double_binary_tree(nodes, n)[tree] for n in range(nodes)]
        assert sum(parent == -1 for parent, _ in places) == 1
        for n, (parent, children) in enumerate(places):
            if parent != -1:
                assert n in places[parent][1]
            for child in children:
                assert child == -1 or places[child][0] == n
        for n in range(nodes):  # every node reaches the root
            hops, up = 0, n
            while places[up][0] != -1 and hops < nodes:
                hops, up = hops + 1, places[up][0]
            assert places[up][0] == -1
    interior_in_both = [n for n in range(nodes)
                        if all(place[1] != (-1, -1) for place in double_binary_tree(nodes, n))]
    # NCCL's property; for an odd count node 0 is the first root and interior in the second.
    assert interior_in_both == ([0] if nodes % 2 and nodes > 1 else [])


@pytest.mark.parametrize("tree", [binary_tree, double_binary_tree], ids=lambda f: f.__name__)
@pytest.mark.parametrize("nodes, index, message", [
    (5, 9, r"index must be a node in \[0, 5\), got 9"), (5, -1, "got -1"),
    (5, 1.0, "got 1.0"), (0, 0, "nodes must be an int >= 1, got 0"),
])
def test_a_node_outside_the_tree_is_refused(tree, nodes, index, message) -> None:
    # binary_tree(5, 9) answered (8, (-1, -1)): a parent that is no node.
    with pytest.raises(ValueError, match=message):
        tree(nodes, index)


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 1), (1, 4), (4, 2), (5, 3), (6, 1)])
def test_tree_positions_make_one_tree_of_all_ranks_per_channel(nodes, per_node) -> None:
    p = nodes * per_node
    for channel in range(per_node):
        for tree in (0, 1):
            places = [tree_position(Comm(r, p, per_node), channel, tree) for r in range(p)]
            assert [depth for parent, _, depth in places if parent == -1] == [0]
            for rank, (parent, children, depth) in enumerate(places):
                if parent != -1:
                    assert rank in places[parent][1] and depth == places[parent][2] + 1
                assert all(places[child][0] == rank for child in children)
                assert len(children) <= 3  # its chain's next rank and two nodes' heads


# -- the tree all-reduce's messages --------------------------------------------------------

def test_cross_node_messages_follow_the_double_binary_tree_head_to_head() -> None:
    # 4 nodes of 2: channel 0 runs tree 0 through local rank 0 of each node, channel 1 tree
    # 1 through local rank 1.
    result = run(nccl_tree_allreduce, hierarchical(4, 2, 1e11, 1e-6, 1e10, 5e-6), 64)
    for channel, tree in (("tree 0", 0), ("tree 1", 1)):
        across = {(e.rank, e.peer) for e in result.sends()  # up, and down on its own stream
                  if e.channel in (channel, f"{channel} down") and e.rank // 2 != e.peer // 2}
        edges = tree_edges(4, tree)
        head = tree
        assert across == ({(2 * c + head, 2 * p + head) for c, p in edges}
                          | {(2 * p + head, 2 * c + head) for c, p in edges})
    assert tree_edges(4, 0) != tree_edges(4, 1)


def test_within_a_node_each_channel_chains_the_gpus_from_its_own_head() -> None:
    # 2 nodes of 4: channel c's chain is local rank c, c+1, c+2, c+3 (mod 4), both ways.
    result = run(nccl_tree_allreduce, hierarchical(2, 4, 1e11, 1e-6, 1e10, 5e-6), 64)
    for c in range(4):
        within = {(e.rank, e.peer) for e in result.sends()
                  if e.channel in (f"tree {c}", f"tree {c} down") and e.rank // 4 == e.peer // 4}
        links = {(4 * n + (c + j) % 4, 4 * n + (c + j + 1) % 4) for n in (0, 1) for j in range(3)}
        assert within == links | {(b, a) for a, b in links}


@pytest.mark.parametrize(("count", "chunk_bytes", "chunks"), [
    (0, 64, 1), (16, 64, 1), (17, 64, 2), (1000, 64, 63), (1000, 1 << 19, 1),
    (10, 1, 10),  # chunks below one element: one element each (it sent 30 empty chunks more)
])
def test_every_chunk_goes_up_and_down_every_edge_once(count, chunk_bytes, chunks) -> None:
    # One channel over 6 ranks: 5 edges, each carries every chunk once each way.
    result = run(nccl_tree_allreduce, hierarchical(3, 2, 1e11, 1e-6, 1e10, 5e-6), count,
                 channels=1, chunk_bytes=chunk_bytes)
    sends = result.sends()
    assert len(sends) == 2 * 5 * chunks
    assert max(e.nbytes for e in sends) <= max(chunk_bytes, 4)
    assert sum(e.nbytes for e in sends) == 2 * 5 * count * 4


def ops_of(schedule: Generator[Any, Any, Any], seen: list[Any]) -> Generator[Any, Any, Any]:
    """Run ``schedule``, noting each op it yields, spawned tasks' ops too, in ``seen``."""
    value = None
    while True:
        try:
            op = schedule.send(value)
        except StopIteration as stop:
            return stop.value
        if isinstance(op, Spawn):
            op = Spawn(ops_of(op.schedule, seen), op.channel)
        seen.append(op)
        value = yield op


@pytest.mark.parametrize("algorithm", [nccl_tree_allreduce, hierarchical_allreduce],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("protocol", list(Protocol), ids=lambda p: p.value)
def test_a_launch_comes_first_and_every_send_carries_the_protocol(algorithm, protocol) -> None:
    seen: dict[int, list[Any]] = {}

    def recorded(comm, x, **params):
        return (yield from ops_of(algorithm(comm, x, **params), seen.setdefault(comm.rank, [])))

    run(recorded, hierarchical(2, 2, 1e11, 1e-6, 1e10, 5e-6), 10, protocol=protocol.value)
    for ops in seen.values():
        assert isinstance(ops[0], Launch) and ops[0].protocol is protocol
        assert sum(isinstance(op, Launch) for op in ops) == 1
        sends = [op for op in ops if isinstance(op, Send)]
        assert sends and {op.protocol for op in sends} == {protocol}


def test_hierarchical_crosses_nodes_only_along_rails() -> None:
    # 4 nodes of 2: within nodes a ring over the node; across, a ring over each local rank.
    result = run(hierarchical_allreduce, hierarchical(4, 2, 1e11, 1e-6, 1e10, 5e-6), 64)
    pairs = {(e.rank, e.peer) for e in result.sends()}
    across = {(a, b) for a, b in pairs if a // 2 != b // 2}
    assert across == {(2 * n + j, 2 * ((n + 1) % 4) + j) for n in range(4) for j in (0, 1)}
    assert pairs - across == {(2 * n + j, 2 * n + 1 - j) for n in range(4) for j in (0, 1)}


# -- time ----------------------------------------------------------------------------------

def test_a_chunks_round_trip_holds_up_no_chunk_behind_it() -> None:
    # Two nodes of one GPU, 100 us apart, 16 chunks of 6.55 us each on the wire: the first
    # chunk goes up and comes back (2 x 100 us + 2 chunk-times), the other 15 follow one
    # chunk-time apart, as the up and down streams run side by side (NCCL's runTreeSplit).
    # In one sequence that waited on each chunk four chunks after sending it, the round
    # trip stalled the stream four times: 852 us.
    latency, chunk = 100e-6, 1 << 16
    result = run(nccl_tree_allreduce, hierarchical(2, 1, 1e11, 1e-6, 1e10, latency), 1 << 18,
                 channels=1, chunk_bytes=chunk)
    assert result.time == pytest.approx(2 * latency + 17 * chunk / 1e10)


@pytest.mark.parametrize("protocol", list(Protocol), ids=lambda p: p.value)
def test_the_tree_beats_the_ring_on_small_calls_across_nodes(protocol) -> None:
    # 32 ranks: the ring takes 2 x 31 steps, the tree a round trip of about 2 x (7 + 2) hops.
    topology = make_preset("cluster-h100:nodes=4")

    def time(algorithm) -> float:
        inputs = [SizeOnly(2, np.float32)] * topology.size
        return simulate(algorithm, inputs, topology, record=False, protocol=protocol).time

    assert time(nccl_tree_allreduce) < time(nccl_ring_allreduce)


@pytest.mark.parametrize("size, per_node", [(1, 1), (2, 2), (8, 8), (24, 8), (40, 8), (7, 1),
                                            (12, 4), (96, 8), (30, 3)])
def test_tree_parents_gives_every_rank_its_tree_position(size, per_node) -> None:
    from algorithms.nccl_tree import tree_parents
    for channel in range(2 * per_node):
        for tree in (0, 1):
            parents, depths = tree_parents(size, per_node, channel, tree)
            for rank in range(size):
                parent, _, depth = tree_position(Comm(rank, size, per_node), channel, tree)
                assert (parents[rank], depths[rank]) == (parent, depth)
