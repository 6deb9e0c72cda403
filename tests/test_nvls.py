"""NVLS: reduction and multicast in the switch (``Multicast``, ``RecvReduce``,
``Send(in_switch=True)``), ``nvls_allreduce`` on both transports and NVLS-tree across nodes,
their cost where a switch reduces and where none does, and the checks on ops, topologies and
topology files."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from algorithms import (
    AVG, MAX, SUM, Multicast, Recv, RecvReduce, Send, Wait, nccl_allreduce,
)
from algorithms.nvls import (
    nvls_all_gather, nvls_allreduce, nvls_channels, nvls_chunk_bytes, nvls_reduce_scatter,
    nvls_tree_allreduce, nvls_tree_chunk_bytes, pipeline_fill_bytes,
)
from algorithms.protocol import ProtocolError
from realcomm import Driver, spawn
from simcomm import SizeOnly, hierarchical, simulate, switch
from simcomm.presets import make_preset
from simcomm.topofile import TopologyFileError, dump_topology, parse_topology
from simcomm.tuning import ModelTuner

BANDWIDTH, LATENCY = 100e9, 2e-6  # per link direction; GPU to GPU through the switch


def reducing_switch(p: int, efficiency: float = 0.5, latency: float = 1e-6):
    return replace(switch(p, BANDWIDTH, LATENCY), reducing_switches=("switch",),
                   switch_efficiency=efficiency, switch_latency=latency)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_one_chunk_costs_the_buffer_and_a_slice_each_way_at_the_switch_rate(p) -> None:
    # Reduce-scatter: each uplink carries the whole buffer (the rank's own slice too), the
    # sums follow it down; all-gather: a slice up, every slice (its own too) down. Each
    # phase takes its bytes at the switch's share of the link, plus a GPU-to-GPU latency and
    # the switch's own.
    # Registered buffers: the switch works on them in place, with no copies in and out.
    efficiency, wait, nbytes = 0.5, 1e-6, p * 10**6
    topology = reducing_switch(p, efficiency, wait)
    result = simulate(nvls_allreduce, [SizeOnly(nbytes // 4, np.float32)] * p, topology,
                      channels=1, chunk_bytes=nbytes, registered=True)
    rate = efficiency * BANDWIDTH
    assert result.time == pytest.approx(2 * (nbytes / rate + LATENCY + wait), rel=1e-9)
    for stats in result.links:
        assert stats.bytes == nbytes * (p + 1) // p


@pytest.mark.parametrize("p", [2, 8])
def test_unregistered_buffers_pass_a_copy_stage_before_and_after_the_switch(p) -> None:
    # One chunk: it is copied into the NVLS buffer before the switch reduces it and out
    # after the multicast, each copy at the pace of the switch's stage (the buffer and a
    # slice over the GPU's link).
    efficiency, wait, nbytes = 0.5, 1e-6, p * 10**6
    result = simulate(nvls_allreduce, [SizeOnly(nbytes // 4, np.float32)] * p,
                      reducing_switch(p, efficiency, wait), channels=1, chunk_bytes=nbytes)
    rate = efficiency * BANDWIDTH
    copy = nbytes * (p + 1) / p / rate
    assert result.time == pytest.approx(2 * (nbytes / rate + LATENCY + wait) + 2 * copy,
                                        rel=1e-9)


def test_one_rank_alone_has_nothing_to_fill() -> None:
    # A counterexample the property tests found: the fill's pace divided by zero.
    alone = replace(switch(1, BANDWIDTH, LATENCY), reducing_switches=("switch",))
    for algorithm in (nvls_allreduce, nvls_tree_allreduce):
        result = simulate(algorithm, [np.array([2.0], np.float16)], alone, channels=3,
                          chunk_bytes=64)
        assert result.results[0].tolist() == [2.0] and result.time == 0.0
    assert pipeline_fill_bytes(1 << 20, 1 << 17, 16, 1, False) == 0


def test_one_way_collectives_on_nodes_of_one_gpu_have_nothing_to_fill() -> None:
    # A counterexample the property tests found: two nodes of one GPU each, their switches
    # reducing, asked the switch's rate of a GPU that shares its switch with none.
    nodes = replace(hierarchical(2, 1, BANDWIDTH, LATENCY, BANDWIDTH, LATENCY),
                    reducing_switches=("node0.switch", "node1.switch"))
    data = [np.array([2.0], dtype=np.float16)] * 2
    scattered = simulate(nvls_reduce_scatter, data, nodes, channels=3, chunk_bytes=32)
    assert [r.tolist() for r in scattered.results] == [[4.0], []]
    gathered = simulate(nvls_all_gather, data, nodes, channels=3, chunk_bytes=32)
    assert [r.tolist() for r in gathered.results] == [[2.0]] * 2


def test_the_switch_rate_names_bad_ranks_and_lone_gpus() -> None:
    assert reducing_switch(4, 0.5).switch_rate(3) == 0.5 * BANDWIDTH
    with pytest.raises(ValueError, match="switch_rate for rank 4"):
        reducing_switch(4).switch_rate(4)
    with pytest.raises(ValueError, match="shares its node with no other rank"):
        switch(1, BANDWIDTH, LATENCY).switch_rate(0)


def test_the_pipeline_fills_one_round_per_copy() -> None:
    # A round is a chunk per head on every channel: 16 x 8 x 128 KiB = 16 MiB. The copies
    # in and out each leave the last stage a round later; registered buffers skip them, a
    # one-way collective has one. The switch and a tree's hops are messages of their own.
    round_bytes = 16 * 8 * (128 << 10)
    assert pipeline_fill_bytes(1 << 30, 128 << 10, 16, 8, False) == 2 * round_bytes
    assert pipeline_fill_bytes(1 << 30, 128 << 10, 16, 8, False, one_way=True) == round_bytes
    assert pipeline_fill_bytes(1 << 30, 128 << 10, 16, 8, True) == 0
    assert pipeline_fill_bytes(1 << 20, 128 << 10, 16, 8, False) == 2 << 20  # < a round


def test_without_a_reducing_switch_it_is_plain_sends_and_moves_more() -> None:
    p, nbytes = 4, 4 * 10**6
    result = simulate(nvls_allreduce, [SizeOnly(nbytes // 4, np.float32)] * p,
                      switch(p, BANDWIDTH, LATENCY), channels=1, chunk_bytes=nbytes)
    # A slice to each peer in each phase: 2 (p - 1) / p of the buffer over every link.
    for stats in result.links:
        assert stats.bytes == 2 * (p - 1) * nbytes // p


TWO_NODES = replace(hierarchical(2, 3, BANDWIDTH, LATENCY, 1e9, 1e-5, nic_per_gpu=False),
                    reducing_switches=("node0.switch", "node1.switch"))
THREE_NODES = replace(hierarchical(3, 2, BANDWIDTH, LATENCY, 1e9, 1e-5),
                      reducing_switches=("node0.switch", "node1.switch", "node2.switch"))


@pytest.mark.parametrize("algorithm, topology", [
    (nvls_allreduce, reducing_switch(5)), (nvls_allreduce, switch(5, BANDWIDTH, LATENCY)),
    (nvls_allreduce, TWO_NODES),
    (nvls_tree_allreduce, make_preset("cluster-h100:nodes=2")),
    (nvls_tree_allreduce, make_preset("cluster-h100:nodes=3")),
    (nvls_tree_allreduce, THREE_NODES),
    (nvls_tree_allreduce, hierarchical(5, 1, BANDWIDTH, LATENCY, 1e9, 1e-5)),
    (nvls_tree_allreduce, hierarchical(2, 3, BANDWIDTH, LATENCY, 1e9, 1e-5)),
], ids=["reducing-switch", "plain-switch", "two-nodes", "tree-2-h100-nodes",
        "tree-3-h100-nodes", "tree-3-nodes-of-2", "tree-5-nodes-of-1", "tree-no-reducing-switch"])
@pytest.mark.parametrize("op", [SUM, MAX, AVG])
def test_results_equal_the_reference_wherever_it_runs(algorithm, topology, op) -> None:
    rng = np.random.default_rng(1)
    data = [rng.integers(-5, 6, 53).astype(np.float64) for _ in range(topology.size)]
    result = simulate(algorithm, data, topology, op=op, channels=3, chunk_bytes=48)
    want = {SUM: np.sum, MAX: np.max, AVG: np.mean}[op](data, axis=0)
    for got in result.results:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("p", [2, 3, 8])
def test_one_way_collectives_carry_the_whole_buffer_one_way_at_the_switch_rate(p) -> None:
    # Reduce-scatter: the switch reads every GPU's slice, the asking GPU's own too, so each
    # uplink carries the whole buffer and each downlink its sum; all-gather: each GPU writes
    # its slice once, and the switch copies every slice to every GPU, its writer too (S.
    # Jeaugey in NVIDIA/nccl issue #1083). One chunk, registered: one in-switch step.
    efficiency, wait, nbytes = 0.5, 1e-6, p * 10**6
    topology = reducing_switch(p, efficiency, wait)
    for algorithm in (nvls_reduce_scatter, nvls_all_gather):
        result = simulate(algorithm, [SizeOnly(nbytes // 4, np.float32)] * p, topology,
                          channels=1, chunk_bytes=nbytes, registered=True)
        assert result.time == pytest.approx(nbytes / (efficiency * BANDWIDTH) + LATENCY + wait,
                                            rel=1e-9)
        up = [s.bytes for s in result.links if s.link.src.startswith("gpu")]
        down = [s.bytes for s in result.links if s.link.dst.startswith("gpu")]
        heavy, light = (up, down) if algorithm is nvls_reduce_scatter else (down, up)
        assert heavy == [nbytes] * p and light == [nbytes // p] * p
    # Unregistered: one copy stage (into the switch's buffer, or out of it) fills first.
    copied = simulate(nvls_all_gather, [SizeOnly(nbytes // 4, np.float32)] * p, topology,
                      channels=1, chunk_bytes=nbytes)
    assert copied.time == pytest.approx(2 * nbytes / (efficiency * BANDWIDTH) + LATENCY + wait,
                                        rel=1e-9)


@pytest.mark.parametrize("topology", [reducing_switch(5), switch(5, BANDWIDTH, LATENCY),
                                      TWO_NODES, reducing_switch(1)],
                         ids=["reducing-switch", "plain-switch", "two-nodes", "one-rank"])
@pytest.mark.parametrize("op", [SUM, MAX, AVG])
def test_one_way_results_equal_the_reference_wherever_they_run(topology, op) -> None:
    p = topology.size
    rng = np.random.default_rng(2)
    data = [rng.integers(-5, 6, 53).astype(np.float64) for _ in range(p)]
    scattered = simulate(nvls_reduce_scatter, data, topology, op=op, channels=3, chunk_bytes=16)
    reduced = {SUM: np.sum, MAX: np.max, AVG: np.mean}[op](data, axis=0)
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(reduced, p)])
    for rank, got in enumerate(scattered.results):
        np.testing.assert_array_equal(got, reduced[bounds[rank]:bounds[rank + 1]])
    gathered = simulate(nvls_all_gather, data, topology, channels=3, chunk_bytes=16)
    want = np.concatenate([data[r][bounds[r]:bounds[r + 1]] for r in range(p)])
    for got in gathered.results:
        np.testing.assert_array_equal(got, want)


def test_a_multicast_crosses_the_senders_link_once_and_reaches_every_peer() -> None:
    topology, nbytes = reducing_switch(4), 8000

    def algorithm(comm, x):
        if comm.rank == 0:
            handles = yield Multicast((1, 2, 3), x, "hello")
        else:
            handles = ((yield Recv(0, x)),)
        yield Wait(*handles)
        return x

    data = [np.full(nbytes // 8, float(r)) for r in range(4)]
    result = simulate(algorithm, data, topology)
    assert all((got == 0.0).all() for got in result.results)
    by_link = {(s.link.src, s.link.dst): s.bytes for s in result.links}
    assert by_link["gpu0", "switch"] == nbytes  # once, not three times
    assert all(by_link["switch", f"gpu{r}"] == nbytes for r in range(4))  # the sender's too


@pytest.mark.parametrize("topology", [reducing_switch(3), switch(3, BANDWIDTH, LATENCY)],
                         ids=["reducing-switch", "plain-switch"])
def test_in_switch_sends_and_reductions_match_only_each_other(topology) -> None:
    def in_switch_to_plain_recv(comm, x):
        if comm.rank == 0:
            yield Wait((yield Recv(1, x)), (yield Recv(2, x)))
        else:
            yield Wait((yield Send(0, x, in_switch=True)))

    def plain_send_to_reduction(comm, x):
        if comm.rank == 0:
            yield Wait(*(yield RecvReduce((1, 2), x)))
        else:
            yield Wait((yield Send(0, x)))

    data = [np.ones(4) for _ in range(3)]
    with pytest.raises(ProtocolError, match="is in_switch, but rank 0 matched it with a "
                                            "plain Recv"):
        simulate(in_switch_to_plain_recv, data, topology)
    with pytest.raises(ProtocolError, match="is not in_switch, but rank 0 matched it with a "
                                            "RecvReduce"):
        simulate(plain_send_to_reduction, data, topology)


def test_bad_peers_are_refused() -> None:
    buf = np.ones(2)
    with pytest.raises(TypeError, match="Multicast.peers must be a non-empty tuple"):
        Multicast([1, 2], buf)
    with pytest.raises(TypeError, match="RecvReduce.peers must be a non-empty tuple"):
        RecvReduce((), buf)
    with pytest.raises(ValueError, match="names a rank twice"):
        Multicast((1, 1), buf)
    with pytest.raises(ValueError, match="must be a non-negative int rank"):
        RecvReduce((1, -2), buf)
    with pytest.raises(TypeError, match="Send.in_switch must be a bool"):
        Send(1, buf, in_switch=1)

    def to_itself(comm, x):
        yield Wait(*(yield Multicast((0, 1), x)))

    with pytest.raises(ProtocolError, match="posted a Send to itself"):
        simulate(to_itself, [np.ones(2)] * 2, reducing_switch(2))


def test_topologies_and_files_check_and_keep_the_switch_figures() -> None:
    with pytest.raises(ValueError, match="reducing switch 'gpu0' is not a switch node"):
        replace(switch(2, BANDWIDTH, LATENCY), reducing_switches=("gpu0",))
    with pytest.raises(ValueError, match="switch_efficiency must be in"):
        replace(switch(2, BANDWIDTH, LATENCY), switch_efficiency=1.5)
    topology = make_preset("dgx-h100")
    assert parse_topology(dump_topology(topology)) == topology
    text = ('kind = "switch"\nranks = 2\nbandwidth = "1GB/s"\nlatency = "1us"\n'
            'reducing_switches = ["switch"]\nswitch_efficiency = 0.75\n'
            'switch_latency = "2us"\n')
    loaded = parse_topology(text)
    assert (loaded.reducing_switches, loaded.switch_efficiency, loaded.switch_latency) == (
        ("switch",), 0.75, 2e-6)
    with pytest.raises(TopologyFileError, match="switch_efficiency: must be a number in"):
        parse_topology(text.replace("0.75", "0"))
    with pytest.raises(TopologyFileError, match="reducing switch 'nowhere'"):
        parse_topology(text.replace('["switch"]', '["nowhere"]'))


def test_files_keep_nvls_trees_share_and_nvls_channels() -> None:
    b200 = make_preset("cluster-b200:nodes=2")
    assert (b200.nvls_channels, b200.tree_switch_efficiency) == (32, 0.78)
    assert parse_topology(dump_topology(b200)) == b200
    text = ('kind = "switch"\nranks = 2\nbandwidth = "1GB/s"\nlatency = "1us"\n'
            'reducing_switches = ["switch"]\ntree_switch_efficiency = 0.5\n'
            'nvls_channels = 8\n')
    loaded = parse_topology(text)
    assert (loaded.switch_efficiency, loaded.tree_switch_efficiency,
            loaded.nvls_channels) == (1.0, 0.5, 8)
    assert (loaded.switch_share(), loaded.switch_share(tree=True)) == (1.0, 0.5)
    with pytest.raises(TopologyFileError, match="tree_switch_efficiency: must be a number in"):
        parse_topology(text.replace("0.5", "1.5"))
    with pytest.raises(TopologyFileError, match="nvls_channels must be an int from 1 to 64"):
        parse_topology(text.replace("= 8", "= 65"))
    with pytest.raises(ValueError, match="tree_switch_efficiency must be in"):
        replace(switch(2, BANDWIDTH, LATENCY), tree_switch_efficiency=0.0)


def test_files_keep_nvls_trees_share_of_the_network() -> None:
    cluster = make_preset("cluster-h100:nodes=4")
    assert cluster.tree_network_efficiency == 0.85
    assert parse_topology(dump_topology(cluster)) == cluster
    text = ('kind = "switch"\nranks = 2\nbandwidth = "1GB/s"\nlatency = "1us"\n'
            'tree_network_efficiency = 0.5\n')
    assert parse_topology(text).tree_network_efficiency == 0.5
    with pytest.raises(TopologyFileError, match="tree_network_efficiency: must be a number in"):
        parse_topology(text.replace("0.5", "0"))
    with pytest.raises(ValueError, match="tree_network_efficiency must be in"):
        replace(switch(2, BANDWIDTH, LATENCY), tree_network_efficiency=1.5)


@pytest.mark.parametrize("nodes", [2, 4])
def test_nvls_trees_sends_between_nodes_take_their_share_beyond_two_nodes(nodes) -> None:
    # Switches far faster than the NICs: the NICs set NVLS-tree's pace. At half the NICs'
    # rate four nodes take about twice as long; two nodes, each tree a single pair, not at
    # all longer.
    fast = replace(hierarchical(nodes, 2, BANDWIDTH, LATENCY, BANDWIDTH / 100, LATENCY,
                                nic_per_gpu=True),
                   reducing_switches=tuple(f"node{n}.switch" for n in range(nodes)))
    times = [simulate(nvls_tree_allreduce, [SizeOnly(2**22, np.float32)] * fast.size,
                      replace(fast, tree_network_efficiency=share), channels=2,
                      registered=True, record=False).time for share in (1.0, 0.5)]
    if nodes == 2:
        assert times[1] == times[0]
    else:
        assert times[1] / times[0] == pytest.approx(2, rel=0.02)
        # The tuner's pace takes the same share.
        paces = [ModelTuner(replace(fast, tree_network_efficiency=share)).in_switch_pace(True)
                 for share in (1.0, 0.5)]
        assert paces[1] == pytest.approx(paces[0] / 2)


def test_nvls_tree_moves_at_its_own_share_of_the_links() -> None:
    # NVLS-tree's kernel keeps a slower pace than NVLS's on one node; the switch's traffic
    # takes each link at tree_switch_efficiency of its bandwidth after NVLS-tree's launch,
    # and at switch_efficiency after NVLS's.
    nodes = replace(hierarchical(2, 2, BANDWIDTH, LATENCY, BANDWIDTH, LATENCY,
                                 nic_per_gpu=True),
                    reducing_switches=("node0.switch", "node1.switch"),
                    switch_efficiency=1.0, tree_switch_efficiency=0.5)
    one_node = replace(reducing_switch(2, 1.0), tree_switch_efficiency=0.5)
    for algorithm, topology, share in ((nvls_tree_allreduce, nodes, 0.5),
                                       (nvls_allreduce, one_node, 1.0)):
        result = simulate(algorithm, [SizeOnly(2**18, np.float32)] * topology.size, topology,
                          channels=2, registered=True)
        in_switch = [stats for stats in result.links
                     if any(end.endswith("switch") for end in (stats.link.src, stats.link.dst))]
        assert in_switch and all(stats.bytes > 0 for stats in in_switch)
        for stats in in_switch:
            assert stats.busy_time == pytest.approx(stats.bytes / (share * BANDWIDTH),
                                                    rel=1e-6), stats.link


@pytest.mark.parametrize("preset, channels", [
    ("dgx-h100", 16), ("dgx-b200", 32), ("cluster-h200:nodes=2", 16),
    ("cluster-b200:nodes=2", 32)])
def test_nccl_runs_nvls_on_its_channel_count_for_the_gpu(preset, channels) -> None:
    # NVLS_NCHANNELS_SM90 and NVLS_NCHANNELS_SM100 (NVIDIA/nccl v2.26.2
    # src/transport/nvls.cc): Hopper 16, Blackwell 32.
    topology = make_preset(preset)
    algorithm = "nvls" if topology.node_count == 1 else "nvls_tree"
    result = simulate(nccl_allreduce, [SizeOnly(2**18, np.float32)] * topology.size, topology,
                      record=False, algorithm=algorithm)
    assert result.launches[0].describe() == f"{algorithm}/SIMPLE/{channels}"


def test_nccls_chunk_shrinks_for_small_buffers() -> None:
    # 16 channels of 8 ranks: 128 operations at once (NVIDIA/nccl v2.26.2 src/enqueue.cc).
    assert nvls_chunk_bytes(1 << 30, 16, 8) == 128 << 10
    assert nvls_chunk_bytes(256 << 20, 16, 8) == 64 << 10
    assert nvls_chunk_bytes(32 << 20, 16, 8) == 32 << 10
    assert nvls_chunk_bytes(1 << 20, 16, 8) == 16 << 10


def test_one_dgx_h100_reaches_the_published_nvls_bus_bandwidth() -> None:
    # benchmarks/published/h100-1node-default-dgxcbench.csv: 1 GiB in 4029.4 us, busbw
    # 466.33 GB/s, where NCCL runs NVLS.
    nbytes = 1 << 30
    result = simulate(nccl_allreduce, [SizeOnly(nbytes // 4, np.float32)] * 8,
                      make_preset("dgx-h100"), record=False)
    assert result.launches[0].describe() == "nvls/SIMPLE/16"
    assert result.time == pytest.approx(4029.4e-6, rel=0.05)


@pytest.mark.parametrize("nbytes, measured", [(8 << 20, 83.02e-6), (128 << 20, 586.4e-6)])
def test_one_dgx_h100_fills_its_nvls_pipeline_as_measured(nbytes, measured) -> None:
    # The same table in the middle sizes, where the pipeline's fill is a good part of the
    # time (without it the model ran 29% and 10% fast here).
    result = simulate(nvls_allreduce, [SizeOnly(nbytes // 4, np.float32)] * 8,
                      make_preset("dgx-h100"), record=False)
    assert result.time == pytest.approx(measured, rel=0.1)


@pytest.mark.parametrize("preset, measured", [
    ("cluster-h100:nodes=2", 4484.9e-6),  # h100-2nodes-default-nccltests309.csv
    ("cluster-h200:nodes=2", 4396.8e-6),  # h200-2nodes-default-ocisuperant.csv
])
def test_two_nodes_choose_nvls_tree_for_a_large_buffer_as_nccl_does(preset, measured) -> None:
    nbytes = 1 << 30
    result = simulate(nccl_allreduce, [SizeOnly(nbytes // 4, np.float32)] * 16,
                      make_preset(preset), record=False)
    assert result.launches[0].describe() == "nvls_tree/SIMPLE/16"
    assert result.time == pytest.approx(measured, rel=0.05)


# -- over gloo -------------------------------------------------------------------------------

RANKS = 3
TORCH_OPS = {SUM: dist.ReduceOp.SUM, MAX: dist.ReduceOp.MAX, AVG: dist.ReduceOp.AVG}
# Newer torch renames the tensor forms of reduce-scatter and all-gather.
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def _run(data: list[np.ndarray]) -> list[tuple[list[float], list[float]]]:
    rank, replies = dist.get_rank(), []
    driver = Driver(range(RANKS), channels=nvls_channels(2), timeout=60.0)
    for op in (SUM, MAX, AVG):
        ours = driver.run(nvls_allreduce, torch.from_numpy(data[rank].copy()), op=op,
                          channels=2, chunk_bytes=24)
        native = torch.from_numpy(data[rank].copy())
        dist.all_reduce(native, TORCH_OPS[op])
        replies.append((ours.tolist(), native.tolist()))
        # Chunk r of the sum to rank r; below, chunk r of rank r's buffer to everyone (36
        # elements: even chunks, which torch's own collectives need).
        whole = torch.from_numpy(data[rank][:36].copy())
        ours = driver.run(nvls_reduce_scatter, whole.clone(), op=op, channels=2,
                          chunk_bytes=8)
        native = torch.empty(36 // RANKS)
        _reduce_scatter(native, whole.clone(), TORCH_OPS[op])
        replies.append((ours.tolist(), native.tolist()))
    whole = torch.from_numpy(data[rank][:36].copy())
    ours = driver.run(nvls_all_gather, whole.clone(), channels=2, chunk_bytes=8)
    native, size = torch.empty(36), 36 // RANKS
    _all_gather(native, whole[rank * size:(rank + 1) * size].clone())
    replies.append((ours.tolist(), native.tolist()))
    return replies


def test_over_gloo_it_matches_torch_and_the_simulator() -> None:
    data = [np.random.default_rng(r).integers(-3, 4, 37).astype(np.float32)
            for r in range(RANKS)]
    real = spawn(_run, RANKS, (data,), timeout=120)
    switch = reducing_switch(RANKS)
    for index, op in enumerate((SUM, MAX, AVG)):
        simulated = simulate(nvls_allreduce, data, switch, op=op, channels=2,
                             chunk_bytes=24).results
        scattered = simulate(nvls_reduce_scatter, [d[:36] for d in data], switch, op=op,
                             channels=2, chunk_bytes=8).results
        for rank in range(RANKS):
            ours, native = real[rank][2 * index]
            assert ours == native == simulated[rank].tolist(), (op, rank)
            ours, native = real[rank][2 * index + 1]
            assert ours == native == scattered[rank].tolist(), (op, rank)
    gathered = simulate(nvls_all_gather, [d[:36] for d in data], switch, channels=2,
                        chunk_bytes=8).results
    for rank in range(RANKS):
        ours, native = real[rank][-1]
        assert ours == native == gathered[rank].tolist(), rank


# -- NVLS-tree: the switch within nodes, a tree of the nodes along every rail -----------------

def test_nvls_tree_sends_each_gpus_slice_once_each_way_over_its_nic() -> None:
    # Two nodes of eight: the switch carries the buffer and a slice each way over every
    # GPU's NVLink, as on one node; each GPU's NIC carries only its eighth of the buffer
    # each way (each tree's one edge, half the buffer on each tree), where a ring's NIC
    # carries a quarter of it.
    topology, nbytes = make_preset("cluster-h100:nodes=2"), 2**24
    result = simulate(nvls_tree_allreduce, [SizeOnly(nbytes // 4, np.float32)] * 16, topology,
                      registered=True)
    for stats in result.links:
        ends = (stats.link.src, stats.link.dst)
        if "net" in ends:
            assert stats.bytes == nbytes // 8, ends
        elif any(end.endswith("switch") for end in ends):
            assert stats.bytes == nbytes * 9 // 8, ends
    # With no copies in and out of the NVLS buffer it beats the ring even at 16 MiB.
    ring = simulate(nccl_allreduce, [SizeOnly(nbytes // 4, np.float32)] * 16, topology,
                    algorithm="ring", protocol="simple")
    assert result.time < ring.time


def test_nvls_tree_chunks_follow_nccls_sizes() -> None:
    # 128 KiB a step on fewer than 4 nodes, 64 KiB from 4 on; halved for small buffers.
    assert nvls_tree_chunk_bytes(2**30, 16, 8, 2) == 128 * 1024
    assert nvls_tree_chunk_bytes(2**30, 16, 8, 4) == 64 * 1024
    assert nvls_tree_chunk_bytes(32 * 2**20, 16, 8, 2) == 64 * 1024  # < 4 x 128 x 128 KiB
    assert nvls_tree_chunk_bytes(4 * 2**20, 16, 8, 2) == 32 * 1024  # < 128 x 64 KiB
