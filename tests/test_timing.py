"""Simulated times against the alpha-beta closed forms, derived from the cost model in
``simcomm.engine``: a message of n bytes over an uncontended link costs alpha + n/B, a
reducing receive adds n/R on the receiver's memory, one reduction at a time.

In contention-free cases the simulator must match the closed forms exactly (up to float
rounding); in every case no all-reduce may beat 2(p-1)/p * n / B_egress.

Notation below: p ranks, a = alpha, b = n/B and r = n/R for the whole buffer of n bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms import (
    Compute, Recv, Send, Wait, all_gather, all_to_all, alltoall_allreduce, broadcast,
    hierarchical_allreduce, nccl_tree_allreduce, reduce, reduce_broadcast_allreduce,
    reduce_scatter, ring_allreduce,
)
from simcomm import (
    Link, SimResult, SizeOnly, Topology, fully_connected, hierarchical, make_topology, ring,
    simulate, switch,
)

REL = 1e-9

# No latency, or one the clock resolves (its tick is 1e-21 s: simcomm.engine).
alphas = st.one_of(st.just(0.0), st.floats(1e-12, 1e-3))
bandwidths = st.floats(1e6, 1e12)
reduce_bandwidths = st.one_of(st.just(math.inf), st.floats(1e6, 1e12))
dtypes = st.sampled_from([np.int8, np.float16, np.float32, np.float64])
per_rank_counts = st.integers(0, 4096)  # elements per rank's chunk: n is divisible by p


def exactly(expected: float):
    """Equality up to float rounding, with no absolute slack (times can be nanoseconds)."""
    return pytest.approx(expected, rel=REL, abs=0.0)


def run_cost(algorithm: Callable, topology: Topology, count: int, dtype: type,
             **params: object) -> SimResult:
    """Simulate with size-only buffers of ``count`` elements on every rank."""
    return simulate(algorithm, [SizeOnly(count, dtype)] * topology.size, topology, **params)


def tree_height(p: int) -> int:
    """Rounds of a binomial tree: rank v sits popcount(v) hops below the root."""
    return max(bin(v).count("1") for v in range(p))


@st.composite
def cases(draw: st.DrawFn, min_ranks: int = 1) -> tuple[int, float, float, float, int, type]:
    """(p, alpha, B, R, count, dtype) with count divisible by p."""
    p = draw(st.integers(min_ranks, 16))
    return (p, draw(alphas), draw(bandwidths), draw(reduce_bandwidths),
            p * draw(per_rank_counts), draw(dtypes))


def costs(p: int, alpha: float, bandwidth: float, reduce_bw: float, count: int, dtype: type
          ) -> tuple[float, float, float]:
    nbytes = count * np.dtype(dtype).itemsize
    return alpha, nbytes / bandwidth, nbytes / reduce_bw


# -- ring-based collectives: one neighbour message per step, on every builder whose
#    neighbour path is uncontended (a switch splits alpha over two links) -------------------

NEIGHBOUR_TOPOLOGIES = [ring, fully_connected, switch]
RING_FORMS = {
    ring_allreduce: lambda p, a, b, r: 2 * (p - 1) * (a + b / p) + (p - 1) * r / p,
    reduce_scatter: lambda p, a, b, r: (p - 1) * (a + b / p + r / p),
    all_gather: lambda p, a, b, r: (p - 1) * (a + b / p),
}


@pytest.mark.parametrize("builder", NEIGHBOUR_TOPOLOGIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("algorithm", list(RING_FORMS), ids=lambda f: f.__name__)
@given(case=cases())
@example(case=(1, 1e-6, 1e9, 1e9, 0, np.float32))
@example(case=(2, 0.0, 1e9, math.inf, 0, np.float32))
@example(case=(16, 5e-6, 1e11, 2e11, 16 * 1024, np.float16))
def test_ring_collectives_match_closed_form(builder, algorithm, case) -> None:
    p, alpha, bandwidth, reduce_bw, count, dtype = case
    topology = builder(p, bandwidth, alpha, reduce_bw)
    result = run_cost(algorithm, topology, count, dtype)
    expected = RING_FORMS[algorithm](p, *costs(*case))
    assert result.time == exactly(expected)


# -- direct algorithms on a fully connected mesh: every message has its own link -------------

DIRECT_FORMS = [
    # (name, algorithm, params, closed form for p > 1)
    ("reduce_broadcast_flat", reduce_broadcast_allreduce, {},
     lambda p, a, b, r: 2 * (a + b) + (p - 1) * r),
    ("alltoall_whole", alltoall_allreduce, {}, lambda p, a, b, r: max(r, a + b) + (p - 1) * r),
    ("alltoall_chunked", alltoall_allreduce, {"chunked": True},
     lambda p, a, b, r: 2 * (a + b / p) + (p - 1) * r / p),
    ("reduce_flat", reduce, {}, lambda p, a, b, r: a + b + (p - 1) * r),
    ("broadcast_flat", broadcast, {}, lambda p, a, b, r: a + b),
    ("broadcast_tree", broadcast, {"tree": True}, lambda p, a, b, r: tree_height(p) * (a + b)),
    # all_to_all copies its own chunk (r/p) before it sends anything
    ("all_to_all", all_to_all, {}, lambda p, a, b, r: r / p + a + b / p),
]


@pytest.mark.parametrize("name, algorithm, params, form", DIRECT_FORMS,
                         ids=[case[0] for case in DIRECT_FORMS])
@given(case=cases(min_ranks=2))
def test_direct_collectives_on_fully_connected_match_closed_form(
        name, algorithm, params, form, case) -> None:
    p, alpha, bandwidth, reduce_bw, count, dtype = case
    result = run_cost(algorithm, fully_connected(p, bandwidth, alpha, reduce_bw), count, dtype,
                      **params)
    assert result.time == exactly(form(p, *costs(*case)))


@pytest.mark.parametrize("algorithm", [reduce_broadcast_allreduce, alltoall_allreduce, reduce,
                                       broadcast, all_to_all], ids=lambda f: f.__name__)
def test_one_rank_moves_nothing(algorithm) -> None:
    result = run_cost(algorithm, fully_connected(1, 1e9, 1e-6, math.inf), 1000, np.float32)
    assert result.time == 0.0
    assert result.messages == 0


@given(case=cases(min_ranks=2))
def test_tree_reduce_with_free_reduction_is_height_rounds(case) -> None:
    p, alpha, bandwidth, _, count, dtype = case
    a, b, _ = costs(p, alpha, bandwidth, math.inf, count, dtype)
    topology = fully_connected(p, bandwidth, alpha)
    h = tree_height(p)
    assert run_cost(reduce, topology, count, dtype, tree=True).time == exactly(h * (a + b))
    assert (run_cost(reduce_broadcast_allreduce, topology, count, dtype, tree=True).time
            == exactly(2 * h * (a + b)))


@given(log_p=st.integers(0, 4), alpha=alphas, bandwidth=bandwidths, reduce_bw=reduce_bandwidths,
       per_rank=per_rank_counts, dtype=dtypes)
def test_tree_reduce_on_powers_of_two_is_log_p_rounds(log_p, alpha, bandwidth, reduce_bw,
                                                      per_rank, dtype) -> None:
    # With p = 2^h a rank's children are ready exactly when it can take them, so every
    # round costs a + b + r; truncated trees (other p) finish some subtrees early.
    p, h = 2**log_p, log_p
    a, b, r = costs(p, alpha, bandwidth, reduce_bw, p * per_rank, dtype)
    topology = fully_connected(p, bandwidth, alpha, reduce_bw)
    assert (run_cost(reduce, topology, p * per_rank, dtype, tree=True).time
            == exactly(h * (a + b + r)))
    assert (run_cost(reduce_broadcast_allreduce, topology, p * per_rank, dtype, tree=True).time
            == exactly(h * (a + b + r) + h * (a + b)))


# -- the switch: one up and one down link per GPU ---------------------------------------------

@given(case=cases(min_ranks=2))
def test_flat_broadcast_on_switch_serializes_on_the_root_up_link(case) -> None:
    p, alpha, bandwidth, reduce_bw, count, dtype = case
    a, b, _ = costs(*case)
    result = run_cost(broadcast, switch(p, bandwidth, alpha, reduce_bw), count, dtype)
    assert result.time == exactly(a + (p - 1) * b)


@given(case=cases(min_ranks=2))
def test_flat_reduce_broadcast_on_switch_is_bound_by_the_master_gpu(case) -> None:
    # Reduce: the p-1 messages queue on the root's down link and arrive at a + k*b; the
    # root reduces them one at a time, so it is done at a + max(b + (p-1)r, (p-1)b + r).
    # Broadcast: p-1 messages queue on the root's up link, a + (p-1)b more.
    p, alpha, bandwidth, reduce_bw, count, dtype = case
    a, b, r = costs(*case)
    topology = switch(p, bandwidth, alpha, reduce_bw)
    result = run_cost(reduce_broadcast_allreduce, topology, count, dtype)
    reduced_at = a + max(b + (p - 1) * r, (p - 1) * b + r)
    assert result.time == exactly(reduced_at + a + (p - 1) * b)
    (root_down,) = [stats for stats in result.links
                    if (stats.link.src, stats.link.dst) == ("switch", topology.ranks[0])]
    assert root_down.bytes == (p - 1) * count * np.dtype(dtype).itemsize
    assert root_down.busy_time == exactly((p - 1) * b)


# -- hierarchical: a ring is paced by its slowest hop -----------------------------------------

@given(nodes=st.integers(2, 4), per_node=st.integers(1, 4), nic_per_gpu=st.booleans(),
       intra=bandwidths, slowdown=st.floats(1.0, 100.0), intra_alpha=alphas, inter_alpha=alphas,
       per_rank=per_rank_counts)
def test_ring_allreduce_on_hierarchical_is_paced_by_its_slowest_hop(
        nodes, per_node, nic_per_gpu, intra, slowdown, intra_alpha, inter_alpha,
        per_rank) -> None:
    # Every rank waits for its send and its receive each step, so after k steps the rank
    # next to the slowest hop has paid k times that hop and no rank has paid more.
    inter = intra / slowdown  # no faster than intra: intra-node paths stay on the node switch
    p = nodes * per_node
    topology = hierarchical(nodes, per_node, intra, intra_alpha, inter, inter_alpha,
                            nic_per_gpu=nic_per_gpu)
    chunk = per_rank * 4
    intra_hop = intra_alpha + chunk / intra
    inter_hop = inter_alpha + chunk / inter
    if not nic_per_gpu:  # GPU -> node switch -> network -> node switch -> GPU
        inter_hop += intra_alpha
    slowest = inter_hop if per_node == 1 else max(intra_hop, inter_hop)
    result = run_cost(ring_allreduce, topology, p * per_rank, np.float32)
    assert result.time == exactly(2 * (p - 1) * slowest)


# -- the lower bound ---------------------------------------------------------------------------

ALLREDUCES = [
    (ring_allreduce, {}), (reduce_broadcast_allreduce, {}),
    (reduce_broadcast_allreduce, {"tree": True}), (alltoall_allreduce, {}),
    (alltoall_allreduce, {"chunked": True}), (nccl_tree_allreduce, {}),
    (nccl_tree_allreduce, {"chunk_bytes": 4096}), (hierarchical_allreduce, {}),
]


@st.composite
def any_topology(draw: st.DrawFn) -> Topology:
    kind = draw(st.sampled_from(["ring", "fully_connected", "switch", "hierarchical"]))
    bandwidth, alpha, reduce_bw = draw(bandwidths), draw(alphas), draw(reduce_bandwidths)
    if kind == "hierarchical":
        topology = hierarchical(draw(st.integers(1, 4)), draw(st.integers(1, 4)), bandwidth,
                                alpha, draw(bandwidths), draw(alphas),
                                nic_per_gpu=draw(st.booleans()), reduce_bandwidth=reduce_bw)
    else:
        builder = {"ring": ring, "fully_connected": fully_connected, "switch": switch}[kind]
        topology = builder(draw(st.integers(2, 16)), bandwidth, alpha, reduce_bw)
    if draw(st.booleans()):
        topology = topology.with_latency_jitter(draw(st.integers(0, 2**32 - 1)),
                                                draw(st.floats(1e-9, 1e-4)))
    return topology


@pytest.mark.parametrize("algorithm, params", ALLREDUCES,
                         ids=["ring", "reduce_broadcast", "reduce_broadcast_tree",
                              "alltoall", "alltoall_chunked", "nccl_tree", "nccl_tree_chunked",
                              "hierarchical"])
@given(topology=any_topology(), count=st.integers(0, 100_000), dtype=dtypes)
def test_no_allreduce_beats_the_bandwidth_lower_bound(algorithm, params, topology, count,
                                                      dtype) -> None:
    p = topology.size
    nbytes = count * np.dtype(dtype).itemsize
    egress = max(topology.egress_bandwidth(rank) for rank in range(p))
    bound = 2 * (p - 1) / p * nbytes / egress
    result = run_cost(algorithm, topology, count, dtype, **params)
    assert result.time >= bound * (1 - REL)


def test_chunked_alltoall_meets_the_lower_bound_with_no_latency() -> None:
    # The bound is tight: a direct reduce-scatter and all-gather over p-1 links each way.
    p, bandwidth, count = 8, 1e9, 8 * 1024
    result = run_cost(alltoall_allreduce, fully_connected(p, bandwidth, 0.0), count, np.float32,
                      chunked=True)
    bound = 2 * (p - 1) / p * count * 4 / ((p - 1) * bandwidth)
    assert result.time == exactly(bound)


# -- messages: cut-through routes and first-come-first-served links ---------------------------

def point_to_point(*sizes: int) -> Callable:
    """Rank 0 sends one message of each size to rank 1 (all posted at once)."""
    def algorithm(comm, x):
        handles = []
        for size in sizes:
            op = Send(1, SizeOnly(size)) if comm.rank == 0 else Recv(0, SizeOnly(size))
            handles.append((yield op))
        yield Wait(*handles)
    return algorithm


@given(lat1=alphas, lat2=alphas, bw1=bandwidths, bw2=bandwidths, count=st.integers(0, 10**6))
def test_a_two_hop_message_is_cut_through(lat1, lat2, bw1, bw2, count) -> None:
    line = Topology("line", ("gpu0", "hub", "gpu1"),
                    (Link("gpu0", "hub", bw1, lat1), Link("hub", "gpu1", bw2, lat2)),
                    ("gpu0", "gpu1"), (math.inf, math.inf))
    result = simulate(point_to_point(count), [SizeOnly(0)] * 2, line)
    # store-and-forward would pay both serializations: count*4/bw1 + count*4/bw2
    assert result.time == exactly(lat1 + lat2 + count * 4 / min(bw1, bw2))


@given(hops=st.lists(st.tuples(alphas, bandwidths), min_size=1, max_size=6),
       count=st.integers(0, 10**6))
@example(hops=[(0.0, 1e9), (0.0, 1e12), (0.0, 1e9)], count=10**6)  # slow, fast, slow
def test_a_message_over_any_chain_of_links_is_cut_through(hops, count) -> None:
    # Uncontended, the latencies add up and the slowest link sets the pace: a fast link
    # between two slow ones neither speeds the message up nor holds its head back.
    nodes = ["gpu0"] + [f"hub{i}" for i in range(len(hops) - 1)] + ["gpu1"]
    links = tuple(Link(a, b, bandwidth, latency)
                  for a, b, (latency, bandwidth) in zip(nodes, nodes[1:], hops))
    line = Topology("line", tuple(nodes), links, ("gpu0", "gpu1"), (math.inf, math.inf))
    result = simulate(point_to_point(count), [SizeOnly(0)] * 2, line)
    slowest = min(bandwidth for _, bandwidth in hops)
    assert result.time == exactly(sum(latency for latency, _ in hops) + count * 4 / slowest)


@given(alpha=alphas, bandwidth=bandwidths, first=st.integers(0, 10**6),
       second=st.integers(0, 10**6))
def test_two_messages_on_one_link_serialize_in_send_order(alpha, bandwidth, first,
                                                          second) -> None:
    result = simulate(point_to_point(first, second), [SizeOnly(0)] * 2,
                      fully_connected(2, bandwidth, alpha))
    arrivals = [event.end for event in result.sends()]
    assert arrivals == [exactly(alpha + first * 4 / bandwidth),
                        exactly(alpha + (first + second) * 4 / bandwidth)]
    assert result.links[0].busy_time == exactly((first + second) * 4 / bandwidth)


@given(alpha=alphas, gap=alphas, bandwidth=bandwidths, count=st.integers(0, 10**6),
       messages=st.integers(1, 5))
def test_a_gap_holds_the_link_for_every_message(alpha, gap, bandwidth, count,
                                                messages) -> None:
    # LogGP: a stream of k messages of n bytes costs alpha + k (gap + n/B); one, alpha +
    # gap + n/B.
    link = Topology("pair", ("gpu0", "gpu1"), (Link("gpu0", "gpu1", bandwidth, alpha, gap),),
                    ("gpu0", "gpu1"), (math.inf, math.inf))
    result = simulate(point_to_point(*[count] * messages), [SizeOnly(0)] * 2, link)
    arrivals = [event.end for event in result.sends()]
    assert arrivals == [exactly(alpha + k * (gap + count * 4 / bandwidth))
                        for k in range(1, messages + 1)]


def test_a_shared_link_serves_the_earlier_sender_first() -> None:
    # Ranks 1 and 2 both send to rank 0 through the switch; rank 1 starts later, so its
    # message queues behind rank 2's on the switch's link down to rank 0.
    alpha, bandwidth, count, delay = 2e-6, 1e9, 1000, 1e-7

    def algorithm(comm, x):
        if comm.rank == 0:
            yield Wait((yield Recv(1, x)), (yield Recv(2, x)))
        elif comm.rank == 1:
            yield Compute(delay)
            yield Wait((yield Send(0, x)))
        else:
            yield Wait((yield Send(0, x)))

    result = run_cost(algorithm, switch(3, bandwidth, alpha), count, np.float32)
    b = count * 4 / bandwidth
    arrival = {event.rank: event.end for event in result.sends()}
    assert arrival[2] == exactly(alpha + b)
    assert arrival[1] == exactly(alpha + 2 * b)


def test_time_scales_with_one_over_bandwidth_when_messages_tie() -> None:
    # Two messages that reach a link at one instant are served in one order whatever the
    # bandwidth: in float seconds they arrived an ulp apart for some bandwidths and the run
    # took 4% longer (32.16 us x 1e8 / B against 33.44).
    times = []
    for bandwidth in (1e8, 2e8, 3e8, 4e8, 5e8, 1e9):
        topology = hierarchical(4, 2, bandwidth, 0.0, bandwidth, 0.0, nic_per_gpu=False)
        result = run_cost(alltoall_allreduce, topology, 257, np.float32, chunked=True)
        times.append(result.time * bandwidth)
    assert times == pytest.approx([times[0]] * len(times), rel=1e-12)


@given(algorithm=st.sampled_from([ring_allreduce, alltoall_allreduce, reduce_scatter,
                                  all_gather, broadcast, reduce]),
       p=st.integers(2, 9), count=st.integers(0, 300), factor=st.integers(2, 7),
       bandwidth=bandwidths, kind=st.sampled_from(["ring", "switch", "hierarchical"]))
def test_scaling_every_bandwidth_scales_a_latency_free_run(algorithm, p, count, factor,
                                                           bandwidth, kind) -> None:
    def build(b: float) -> Topology:
        if kind == "hierarchical" and p % 2 == 0:
            return hierarchical(p // 2, 2, b, 0.0, b / 3, 0.0, reduce_bandwidth=b * 5)
        return make_topology("switch" if kind == "hierarchical" else kind, p, b, 0.0, b * 5)

    slow = run_cost(algorithm, build(bandwidth), count, np.float32).time
    fast = run_cost(algorithm, build(bandwidth * factor), count, np.float32).time
    assert fast * factor == pytest.approx(slow, rel=1e-12)
