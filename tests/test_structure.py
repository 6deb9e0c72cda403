"""Structural tests over the recorded op trace: how many messages each algorithm sends,
between which ranks and of what size. The manner is tinygrad's ring all-reduce test
(test/unit/test_allreduce.py in tinygrad/tinygrad), which counts the copies of a schedule,
2N(N-1) for N devices, and checks that their (source, destination) pairs form a ring."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import (
    all_gather, all_to_all, alltoall_allreduce, broadcast, nccl_ring_allreduce, reduce,
    reduce_broadcast_allreduce, reduce_scatter, ring_allreduce,
)
from simcomm import (
    SimResult, SizeOnly, Topology, fully_connected, hierarchical, ring, simulate, switch,
)
from simcomm.presets import make_preset

ITEM = 4  # float32


def run(algorithm, p: int, count: int, topology: Topology | None = None, **params
        ) -> SimResult:
    topology = topology or fully_connected(p, 1e9, 1e-6, reduce_bandwidth=1e10)
    return simulate(algorithm, [SizeOnly(count)] * topology.size, topology, **params)


def pairs(result: SimResult) -> Counter:
    return Counter((event.rank, event.peer) for event in result.sends())


def sizes(result: SimResult) -> set[int]:
    return {event.nbytes for event in result.sends()}


def tree_rounds(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


world_sizes = st.integers(1, 16)
chunk_counts = st.integers(1, 64)  # elements per chunk, so that n is divisible by p


@given(p=world_sizes, k=chunk_counts)
def test_ring_allreduce_sends_2_p_minus_1_chunks_per_rank_to_its_right(p, k) -> None:
    result = run(ring_allreduce, p, p * k)
    assert pairs(result) == Counter({(r, (r + 1) % p): 2 * (p - 1) for r in range(p)})
    assert len(result.sends()) == result.messages == 2 * p * (p - 1)
    assert sizes(result) <= {k * ITEM}


@given(p=world_sizes, count=st.integers(0, 200))
def test_ring_allreduce_moves_every_chunk_2_p_minus_1_times_for_any_length(p, count) -> None:
    result = run(ring_allreduce, p, count)
    assert sum(event.nbytes for event in result.sends()) == 2 * (p - 1) * count * ITEM


@pytest.mark.parametrize("algorithm", [reduce_scatter, all_gather], ids=lambda f: f.__name__)
@given(p=world_sizes, k=chunk_counts)
def test_ring_halves_send_p_minus_1_chunks_per_rank_to_its_right(algorithm, p, k) -> None:
    result = run(algorithm, p, p * k)
    assert pairs(result) == Counter({(r, (r + 1) % p): p - 1 for r in range(p)})
    assert sizes(result) <= {k * ITEM}


@given(p=world_sizes, data=st.data(), k=chunk_counts)
def test_flat_reduce_broadcast_touches_only_the_root(p, data, k) -> None:
    root = data.draw(st.integers(0, p - 1))
    result = run(reduce_broadcast_allreduce, p, p * k, root=root)
    others = [r for r in range(p) if r != root]
    assert [(e.rank, e.peer) for e in result.sends()] == (
        [(r, root) for r in others] + [(root, r) for r in others])
    assert sizes(result) <= {p * k * ITEM}


def check_binomial_tree(sends: list, p: int, root: int, toward_root: bool) -> None:
    """Each non-root rank talks once to its parent, which differs from it in its lowest set
    bit of (rank - root) mod p; the distances used are the log2(p) powers of two."""
    edges = [(e.rank, e.peer) if toward_root else (e.peer, e.rank) for e in sends]
    children = [child for child, _ in edges]
    assert sorted(children) == [r for r in range(p) if r != root]
    distances = set()
    for child, parent in edges:
        v = (child - root) % p
        lowest = v & -v
        assert (parent - root) % p == v - lowest
        distances.add(lowest)
    assert distances == {2**i for i in range(tree_rounds(p))}


@given(p=world_sizes, data=st.data(), k=chunk_counts)
def test_tree_reduce_broadcast_is_two_binomial_trees(p, data, k) -> None:
    root = data.draw(st.integers(0, p - 1))
    result = run(reduce_broadcast_allreduce, p, p * k, root=root, tree=True)
    sends = result.sends()
    assert len(sends) == 2 * (p - 1)
    check_binomial_tree(sends[:p - 1], p, root, toward_root=True)
    check_binomial_tree(sends[p - 1:], p, root, toward_root=False)
    assert sum(1 for e in sends if e.rank == root) == tree_rounds(p)


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
@given(p=world_sizes, data=st.data(), k=chunk_counts)
def test_reduce_and_broadcast_send_p_minus_1_full_messages(tree, p, data, k) -> None:
    root = data.draw(st.integers(0, p - 1))
    reduced = run(reduce, p, p * k, root=root, tree=tree).sends()
    broadcast_ = run(broadcast, p, p * k, root=root, tree=tree).sends()
    assert len(reduced) == len(broadcast_) == p - 1
    assert {e.nbytes for e in reduced + broadcast_} <= {p * k * ITEM}
    if tree:
        check_binomial_tree(reduced, p, root, toward_root=True)
        check_binomial_tree(broadcast_, p, root, toward_root=False)
    else:
        assert {e.peer for e in reduced} <= {root}
        assert {e.rank for e in broadcast_} <= {root}


def all_ordered_pairs(p: int, times: int) -> Counter:
    return Counter({(i, j): times for i in range(p) for j in range(p) if i != j})


@given(p=world_sizes, k=chunk_counts)
def test_whole_buffer_alltoall_allreduce_sends_p_p_minus_1_full_buffers(p, k) -> None:
    result = run(alltoall_allreduce, p, p * k)
    assert pairs(result) == all_ordered_pairs(p, 1)
    assert sizes(result) <= {p * k * ITEM}


@given(p=world_sizes, k=chunk_counts)
def test_chunked_alltoall_allreduce_sends_2_p_p_minus_1_chunks(p, k) -> None:
    result = run(alltoall_allreduce, p, p * k, chunked=True)
    assert pairs(result) == all_ordered_pairs(p, 2)
    assert sizes(result) <= {k * ITEM}


@given(p=world_sizes, k=chunk_counts)
def test_all_to_all_sends_one_chunk_per_ordered_pair(p, k) -> None:
    result = run(all_to_all, p, p * k)
    assert pairs(result) == all_ordered_pairs(p, 1)
    assert sizes(result) <= {k * ITEM}


def test_all_to_all_with_a_split_matrix_sends_each_entry_to_its_column() -> None:
    matrix = [[0, 3, 1], [2, 0, 0], [5, 4, 7]]
    result = simulate(all_to_all, [SizeOnly(sum(row)) for row in matrix],
                      fully_connected(3, 1e9, 1e-6), split_sizes_matrix=matrix)
    sent = {(e.rank, e.peer): e.nbytes for e in result.sends()}
    assert sent == {(i, j): matrix[i][j] * ITEM for i in range(3) for j in range(3) if i != j}
    assert [len(out) for out in result.results] == [7, 7, 8]


def test_every_send_has_one_matching_receive_and_reduce() -> None:
    p, k = 5, 10
    result = run(ring_allreduce, p, p * k)
    receives = Counter((e.peer, e.rank) for e in result.trace if e.kind == "recv")
    assert receives == pairs(result)
    reductions = [e for e in result.trace if e.kind == "reduce"]
    assert len(reductions) == p * (p - 1)  # one per reduce-scatter step and rank
    assert all(e.end - e.start == pytest.approx(k * ITEM / 1e10) for e in reductions)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    kind = draw(st.sampled_from(["ring", "fully_connected", "switch", "hierarchical"]))
    if kind == "hierarchical":
        return hierarchical(draw(st.integers(1, 3)), draw(st.integers(1, 3)), 1e11, 1e-6, 1e10,
                            5e-6, nic_per_gpu=draw(st.booleans()))
    builder = {"ring": ring, "fully_connected": fully_connected, "switch": switch}[kind]
    return builder(draw(st.integers(1, 9)), 1e10, 1e-6)


@pytest.mark.parametrize("algorithm, params", [
    (ring_allreduce, {}), (reduce_broadcast_allreduce, {"tree": True}), (all_to_all, {}),
], ids=["ring_allreduce", "reduce_broadcast_tree", "all_to_all"])
@given(topology=topologies(), count=st.integers(0, 100))
def test_link_bytes_add_up_to_message_bytes_times_hops(algorithm, params, topology,
                                                       count) -> None:
    result = run(algorithm, topology.size, count, topology, **params)
    hops_bytes = sum(e.nbytes * len(topology.route(e.rank, e.peer)) for e in result.sends())
    assert sum(stats.bytes for stats in result.links) == hops_bytes
    for stats in result.links:
        assert stats.busy_time == pytest.approx(stats.bytes / stats.link.bandwidth)


def test_unrecorded_run_costs_the_same_with_an_empty_trace() -> None:
    topology = ring(6, 1e10, 1e-6, reduce_bandwidth=1e11)
    recorded = run(ring_allreduce, 6, 600, topology)
    bare = simulate(ring_allreduce, [SizeOnly(600)] * 6, topology, record=False)
    assert bare.trace == []
    assert (bare.time, bare.finish_times, bare.messages, bare.links) == (
        recorded.time, recorded.finish_times, recorded.messages, recorded.links)


def test_numpy_and_size_only_runs_have_the_same_trace() -> None:
    topology = switch(4, 1e10, 1e-6, reduce_bandwidth=1e11)
    data = [np.arange(40, dtype=np.float32) * r for r in range(4)]
    with_data = simulate(ring_allreduce, data, topology)
    cost_only = simulate(ring_allreduce, [SizeOnly(40)] * 4, topology)
    assert with_data.trace == cost_only.trace


def test_nccl_rings_cross_nodes_through_a_different_gpu_each() -> None:
    # Two nodes of 8 (cluster-h100): ring c leaves node n from local rank c - 1 and enters
    # node n + 1 at local rank c, so the 8 rings use all 8 GPUs' NICs, one each way.
    topology = make_preset("cluster-h100:nodes=2")
    result = run(nccl_ring_allreduce, 16, 16 * 8 * 4, topology)
    across = Counter((e.rank, e.peer) for e in result.sends() if e.rank // 8 != e.peer // 8)
    expected = {(node * 8 + (c - 1) % 8, (1 - node) * 8 + c) for node in (0, 1) for c in range(8)}
    assert set(across) == expected
    # Every position of a ring passes 2(p-1) chunks to the next, across nodes or not.
    assert set(across.values()) == {2 * 15}
