"""Presets: they build, simulate, parse their parameters, and the DGX ones land near the
all-reduce bus bandwidth that nccl-tests reaches on the real machines."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from algorithms import nccl_all_gather, nccl_allreduce, ring_allreduce
from algorithms.nccl import RING_CHUNK_BYTES
from algorithms.ops import Protocol
from simcomm import Link, SizeOnly, Topology, simulate
from simcomm.presets import (
    GB, PUBLISHED_BUSBW, US, describe, list_presets, make_preset, ring_allreduce_busbw,
)
from simcomm.topofile import dump_topology

PRESET_NAMES = [name for name, _ in list_presets()]


def _route(topology, src, dst):
    return [(topology.links[i].src, topology.links[i].dst) for i in topology.route(src, dst)]


def test_list_presets_names_the_required_machines_with_one_line_each():
    assert {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "pcie-a100", "cluster-h100",
            "cluster-a100", "cluster-h200", "cluster-b200", "fattree-h100", "aws-p4d",
            "aws-p4de", "aws-p5"} <= set(PRESET_NAMES)
    for name, description in list_presets():
        assert description and "\n" not in description, name


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds_and_all_reduces_correctly(name):
    topology = make_preset(name)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-9, 9, size=37).astype(np.float32) for _ in range(topology.size)]
    result = simulate(ring_allreduce, inputs, topology, record=False)
    expected = np.sum(inputs, axis=0)
    for got in result.results:
        np.testing.assert_array_equal(got, expected)
    assert 0 < result.time < 1


@pytest.mark.parametrize("name", sorted(PUBLISHED_BUSBW))
def test_dgx_ring_allreduce_busbw_within_ten_percent_of_nccl_tests(name):
    # A property of the preset's documented figures (link data rate, step latency, HBM), not
    # a timing of this code: 1 GiB of float32, nccl-tests' bus bandwidth formula.
    simulated = ring_allreduce_busbw(make_preset(name))
    published = PUBLISHED_BUSBW[name].busbw
    assert abs(simulated / published - 1) <= 0.10, (name, simulated / GB)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_no_preset_beats_the_bus_bandwidth_of_its_gpu_links(name):
    topology = make_preset(name)
    slowest_egress = min(topology.egress_bandwidth(r) for r in range(topology.size))
    assert ring_allreduce_busbw(topology, 64 * 1024**2) <= slowest_egress


def test_dgx_h100_figures():
    topology = make_preset("dgx-h100")
    assert topology.size == 8
    assert all(link.bandwidth == pytest.approx(18 * 20.6 * GB) for link in topology.links)
    # GPU to GPU: two links of half the NCCL step latency each
    assert sum(topology.links[i].latency for i in topology.route(0, 5)) == pytest.approx(3.4 * US)
    assert set(topology.reduce_bandwidth) == {3350 * GB}


def test_preset_parameters_are_parsed_and_named_canonically():
    topology = make_preset("cluster-h100:nodes=3")
    assert topology.size == 24
    assert topology.name == "cluster-h100:nodes=3"
    assert make_preset("cluster-h100").name == "cluster-h100:nodes=2"
    assert make_preset(" pcie-a100 : gpus = 4 ").size == 4
    for spec in ("fattree-h100", "fattree-h100:oversubscription=1.2345678912345"):
        assert make_preset(make_preset(spec).name) == make_preset(spec)


def test_nvls_channels_set_what_nvls_runs_on_and_nothing_else():
    # NCCL_NVLS_NCHANNELS: NVLS and NVLS-tree on that many channels (NCCL's 16 on Hopper,
    # 32 on Blackwell by default); rings and trees keep theirs.
    for spec, default in (("dgx-h100", 16), ("cluster-h200:nodes=2", 16), ("dgx-b200", 32),
                          ("cluster-b200:nodes=4", 32)):
        base = make_preset(spec)
        given = make_preset(f"{spec}{',' if ':' in spec else ':'}nvls_channels=24")
        assert (base.nvls_channels, given.nvls_channels) == (default, 24)
        assert given.channels == base.channels and given.name.endswith("nvls_channels=24")
        assert make_preset(given.name) == given
    assert make_preset("dgx-h100:nvls_channels=0") == make_preset("dgx-h100")


def test_cluster_routes_inside_a_node_over_nvlink_and_across_nodes_over_the_nics():
    topology = make_preset("cluster-h100:nodes=2")
    assert _route(topology, 0, 1) == [("gpu0", "node0.switch"), ("node0.switch", "gpu1")]
    assert _route(topology, 7, 8) == [("gpu7", "net"), ("net", "gpu8")]


def test_cluster_a100_figures():
    # DGX A100 nodes: 12 NVLinks of 20 GB/s, one HDR NIC per GPU at NDR's share of its line
    # rate, NCCL's LL rates for AMD hosts, LL128's per channel for Ampere, no NVLS.
    two, four = make_preset("cluster-a100"), make_preset("cluster-a100:nodes=4")
    assert two.name == "cluster-a100:nodes=2" and two.size == 16 and two.local_size == 8
    assert _route(two, 7, 8) == [("gpu7", "net"), ("net", "gpu8")]
    assert sorted({round(link.bandwidth / GB, 6) for link in two.links}) == [24, 240]
    assert (two.ll_bandwidth, four.ll_bandwidth) == (22.5 * GB, 19.0 * GB)
    assert two.ll128_channel_bandwidth == 20.0 / 2 * GB
    assert not two.reducing_switches
    assert set(two.reduce_bandwidth) == {2039 * GB}


def test_nccls_tree_ceilings_by_generation_and_node_count():
    # A quarter of NCCL's perChMaxTreeBws per channel (each search channel runs as two, a
    # tree's algorithm bandwidth is half its bus bandwidth): v2.26.2's for Ampere and
    # Hopper, v2.28.9's for Blackwell.
    for spec, per_search_channel in (("dgx-a100", 24.0), ("cluster-a100:nodes=2", 23.6),
                                     ("cluster-a100:nodes=4", 17.8), ("dgx-h100", 38.7),
                                     ("cluster-h100:nodes=2", 41.4),
                                     ("cluster-h100:nodes=16", 36.0), ("dgx-b200", 70.0),
                                     ("cluster-b200:nodes=2", 42.8),
                                     ("cluster-b200:nodes=8", 24.0)):
        assert make_preset(spec).tree_channel_bandwidth == pytest.approx(
            per_search_channel / 4 * GB), spec
    # More channels than NCCL's share its ceilings, which it takes per search channel.
    more = make_preset("cluster-h100:nodes=2,channels=32")
    assert more.tree_channel_bandwidth == pytest.approx(41.4 / 8 * GB)


def test_nic_ports_give_a_search_channel_each_and_keep_the_nics_rate():
    # Oracle's A100 nodes: 8 cards of two 100 Gb/s ports. NCCL's search finds a ring per
    # port at 12 GB/s, too slow to double: 16 search channels, 32 run.
    one, two = make_preset("cluster-a100:nodes=2"), make_preset("cluster-a100:nic_ports=2")
    assert two.name == "cluster-a100:nodes=2,nic_ports=2"
    assert (one.channels, two.channels) == (16, 32)
    assert two.links == one.links  # one link per NIC carries what its ports do together
    # Twice the search channels, twice NCCL's ceilings in all.
    assert two.channels * two.ll128_channel_bandwidth == pytest.approx(16 * 20.0 * GB)
    assert two.channels * two.tree_channel_bandwidth == pytest.approx(16 * 23.6 / 2 * GB)


def test_fewer_gpus_per_node_each_use_their_own_nic():
    # A job of 4 or 1 GPUs on each of 10 nodes: NCCL's search finds a ring per NIC in use,
    # fast enough (48 GB/s) to double where there are at most 4 (ncclTopoDupChannels).
    eight, four, one = (make_preset(f"cluster-h100:nodes=10{gpus}")
                        for gpus in ("", ",gpus=4", ",gpus=1"))
    assert four.name == "cluster-h100:nodes=10,gpus=4"
    assert (four.size, four.local_size, four.channels) == (40, 4, 16)
    assert (one.size, one.local_size, one.channels) == (10, 1, 4)
    assert eight.channels == 16
    nic = {round(link.bandwidth / GB, 6) for link in four.links if link.dst == "net"}
    assert nic == {48}
    # NVLS needs GPUs of a node to share its switch; one GPU a node has none to share.
    assert four.reducing_switches and not one.reducing_switches


def test_aws_efa_figures():
    # p5: a 400 Gb/s device per GPU (four EFA devices joined), AMD hosts; p4d and p4de: four
    # 100 Gb/s EFA devices shared by the GPUs of a PCIe switch, Simple only. A hop between
    # nodes takes NCCL's figures plus EFA's 20.4 us (twice under Simple on p4d, which
    # flushes), and the tuner counts the plugin's 75 us (twice under Simple) in its place.
    p5, p4d, p4de = (make_preset(f"aws-{kind}") for kind in ("p5", "p4d", "p4de"))
    assert (p5.name, p4d.name) == ("aws-p5:nodes=2", "aws-p4d:nodes=2")
    assert p5.size == p4d.size == 16 and p5.local_size == p4d.local_size == 8
    assert _route(p5, 7, 8) == [("gpu7", "net"), ("net", "gpu8")]
    assert _route(p4d, 1, 8) == [("gpu1", "node0.nic0"), ("node0.nic0", "net"),
                                 ("net", "node1.nic0"), ("node1.nic0", "gpu8")]
    hop = [p5.links[i] for i in p5.route(0, 8)]
    assert sum(link.latency_of(Protocol.LL) for link in hop) == pytest.approx(23.1e-6)
    assert sum(link.latency_of(Protocol.LL128, "tree") for link in hop) == pytest.approx(
        28.9e-6)
    assert sum(link.latency for link in hop) == pytest.approx(34.4e-6)
    flushed = [p4d.links[i] for i in p4d.route(0, 8)]
    assert sum(link.latency for link in flushed) == pytest.approx(54.8e-6)
    assert p5.tuner_net_latency.of(Protocol.LL) == pytest.approx(54.6e-6)
    assert p5.tuner_net_latency.simple == pytest.approx(129.6e-6)
    assert p4d.tuner_net_latency.simple == pytest.approx(109.2e-6)
    assert p5.ll_enabled and p5.ll128_enabled and p5.reducing_switches
    assert not (p4d.ll_enabled or p4d.ll128_enabled or p4d.reducing_switches)
    assert (p5.channels, p4d.channels) == (16, 8)
    assert p5.ll_bandwidth == 22.5 * GB and math.isinf(p5.net_channel_bandwidth)
    assert {round(link.bandwidth / GB, 6) for link in p5.links} == {47.5, 370.8}
    assert 12 * GB in {link.bandwidth for link in p4d.links}
    assert set(p4d.reduce_bandwidth) == {1555 * GB} and set(p4de.reduce_bandwidth) == {2039 * GB}
    assert make_preset("aws-p5:nodes=4,gpus=4").name == "aws-p5:nodes=4,gpus=4"
    assert "reported latency" in describe(p5) and "leaves out unless told: LL, LL128" in (
        describe(p4d))


def test_h200_and_b200_figures():
    h100, h200, b200 = (make_preset(f"dgx-{gpu}") for gpu in ("h100", "h200", "b200"))
    # H200: H100's links and rates, more memory bandwidth.
    assert h200.links == h100.links and set(h200.reduce_bandwidth) == {4800 * GB}
    assert h200.reducing_switches == h100.reducing_switches
    # B200: 18 NVLinks of 40 GB/s, twice Hopper's LL rate, NCCL 2.30's LL128 ceiling, NVLS.
    assert {round(link.bandwidth / GB, 6) for link in b200.links} == {720}
    assert (b200.ll_bandwidth, b200.ll128_channel_bandwidth) == (282 * GB, 40.0 / 2 * GB)
    assert b200.reducing_switches and set(b200.reduce_bandwidth) == {8000 * GB}
    # Across nodes: Intel hosts, NDR NICs.
    cluster = make_preset("cluster-b200:nodes=4")
    assert cluster.ll_bandwidth == 20.4 * GB
    assert _route(cluster, 7, 8) == [("gpu7", "net"), ("net", "gpu8")]
    assert {round(link.bandwidth / GB, 6) for link in cluster.links} == {720, 48}


@pytest.mark.parametrize("gpu", ["h100", "a100", "h200", "b200"])
def test_fewer_nics_are_shared_by_the_gpus_of_a_pcie_switch(gpu):
    topology = make_preset(f"cluster-{gpu}:nodes=2,nics=4")
    assert topology.name == f"cluster-{gpu}:nodes=2,nics=4"
    assert make_preset(topology.name) == topology
    # GPUs 0 and 1 share node 0's first NIC; inside a node NVLink still carries the data.
    assert _route(topology, 1, 9) == [("gpu1", "node0.nic0"), ("node0.nic0", "net"),
                                      ("net", "node1.nic0"), ("node1.nic0", "gpu9")]
    assert _route(topology, 0, 1) == [("gpu0", "node0.switch"), ("node0.switch", "gpu1")]
    # The network's latency is the same whatever the NIC count.
    eight = make_preset(f"cluster-{gpu}:nodes=2")
    assert (sum(topology.links[i].latency for i in topology.route(1, 9))
            == pytest.approx(sum(eight.links[i].latency for i in eight.route(1, 9))))


def without_ceilings(topology: Topology) -> Topology:
    """``topology`` with no ceiling per channel between nodes, nor a gap per message."""
    return replace(topology, net_channel_bandwidth=math.inf, net_message_gap=0.0,
                   net_message_bandwidth=math.inf)


def test_half_the_nics_halve_a_rail_aligned_ring_across_nodes():
    # Eight rings cross between the nodes, two through each NIC when a node has four: on
    # 1 GiB the NICs are the bottleneck, so the ring takes about twice as long (with no
    # ceiling per channel, which would cap the 8 NICs first).
    inputs = [SizeOnly(2**28, np.float32)] * 16
    times = {nics: simulate(nccl_allreduce, inputs,
                            without_ceilings(make_preset(f"cluster-h100:nics={nics}")),
                            record=False, algorithm="ring").time for nics in (8, 4)}
    assert 1.8 < times[4] / times[8] < 2.1


def test_a_ring_message_between_nodes_under_simple_holds_its_connection_a_gap_longer():
    # 8.2 us besides its bytes at 24 GB/s (a NIC's share for each of its two channels), so
    # that NCCL's largest Simple slice, 1 MiB, takes what the 20.2 GB/s ceiling gives it and
    # smaller ones more; a second queue pair halves the gap and doubles the rate.
    topology = make_preset("cluster-h100:nodes=2")
    assert topology.net_message_gap == pytest.approx(8.2e-6)
    assert topology.net_message_bandwidth == 24 * GB
    full_slice = RING_CHUNK_BYTES // 2
    assert full_slice / topology.net_message_bandwidth + topology.net_message_gap == (
        pytest.approx(full_slice / topology.net_channel_bandwidth, rel=1e-3))
    two = make_preset("cluster-h100:nodes=2,qps=2")
    assert (two.net_message_gap, two.net_message_bandwidth) == pytest.approx((4.1e-6, 48 * GB))
    assert make_preset("cluster-a100:nodes=2").net_message_gap == 0.0

    # An all-gather's rings under Simple on two nodes: at 32 MiB each step's two 64 KiB slices
    # pay the gap (352 us against 163 without it), at 1 GiB its slices are full (the same
    # time); the collective level charges it as the messages do.
    gapless = replace(topology, net_message_gap=0.0, net_message_bandwidth=math.inf)

    def seconds(each: Topology, nbytes: int, level: str = "message") -> float:
        inputs = [SizeOnly(nbytes // 4, np.float32)] * 16  # the gathered buffer
        return simulate(nccl_all_gather, inputs, each, record=False, algorithm="ring",
                        protocol="simple", level=level).time

    assert seconds(topology, 32 << 20) > 2 * seconds(gapless, 32 << 20)
    assert seconds(topology, 1 << 30) == pytest.approx(seconds(gapless, 1 << 30), rel=1e-9)
    assert seconds(topology, 32 << 20, "collective") == pytest.approx(
        seconds(topology, 32 << 20), rel=0.1)
    # LL128 pays no gap.
    ll128 = [simulate(nccl_all_gather, [SizeOnly(1 << 20, np.float32)] * 16, each,
                      record=False, algorithm="ring", protocol="ll128").time
             for each in (topology, gapless)]
    assert ll128[0] == ll128[1]


def test_hopper_rings_level_off_at_the_ceiling_per_channel_between_nodes():
    # 16 channels over 8 NICs a node: 2 a NIC at 20.2 GB/s each, 323.5 GB/s of busbw where
    # the NICs carry 384. With 4 GPUs a node, 4 channels a NIC: the NICs bind, as before.
    def busbw(spec: str, ceiling: bool = True) -> float:
        topology = make_preset(spec)
        if not ceiling:
            topology = without_ceilings(topology)
        p = topology.size
        inputs = [SizeOnly(2**27, np.float32)] * p  # 512 MiB, the gathered buffer
        seconds = simulate(nccl_all_gather, inputs, topology, record=False,
                           algorithm="ring", protocol="simple").time
        return 2**29 * (p - 1) / p / seconds / GB

    assert make_preset("cluster-h100:nodes=2").net_channel_bandwidth == 20.2 * GB
    assert busbw("cluster-h100:nodes=2") == pytest.approx(323.5, rel=0.03)
    assert busbw("cluster-h100:nodes=2", ceiling=False) > 360
    # Two queue pairs a connection (NCCL_IB_QPS_PER_CONNECTION=2): the NICs bind again.
    two = make_preset("cluster-h100:nodes=2,qps=2")
    assert (two.name, two.net_channel_bandwidth) == ("cluster-h100:nodes=2,qps=2", 40.4 * GB)
    assert busbw("cluster-h100:nodes=2,qps=2") == pytest.approx(
        busbw("cluster-h100:nodes=2", ceiling=False), rel=0.01)
    four = busbw("cluster-h100:nodes=2,gpus=4")
    assert four == pytest.approx(busbw("cluster-h100:nodes=2,gpus=4", ceiling=False),
                                 rel=0.01)
    assert four == pytest.approx(4 * 48, rel=0.05)
    # B200 nodes have the same NICs; no A100 table shows a ceiling, and their 200 Gb/s NICs
    # would need only 12 GB/s a channel.
    assert make_preset("cluster-b200:nodes=2").net_channel_bandwidth == 20.2 * GB
    assert make_preset("cluster-a100:nodes=2").net_channel_bandwidth == math.inf


def test_fattree_uplinks_follow_the_oversubscription():
    topology = make_preset("fattree-h100:nodes=8,nodes_per_leaf=4,oversubscription=2")
    assert topology.size == 64
    uplinks = [link for link in topology.links if link.src.startswith("leaf")
               and link.dst == "spine"]
    assert len(uplinks) == 2
    assert {link.bandwidth for link in uplinks} == {4 * 8 * 48 * GB / 2}
    assert _route(topology, 8, 16) == [("gpu8", "leaf0"), ("leaf0", "gpu16")]
    assert _route(topology, 0, 63) == [("gpu0", "leaf0"), ("leaf0", "spine"),
                                       ("spine", "leaf1"), ("leaf1", "gpu63")]
    assert _route(topology, 0, 7) == [("gpu0", "node0.switch"), ("node0.switch", "gpu7")]


@pytest.mark.parametrize("spec, message", [
    ("dgx-b300", "unknown preset 'dgx-b300'"),
    ("dgx-h100:nodes=2", "has no parameter 'nodes' (it takes: gpus, channels, nvls_channels)"),
    ("dgx-a100:nvls_channels=8", "has no parameter 'nvls_channels' (it takes: gpus, channels)"),
    ("cluster-a100:nvls_channels=8", "has no parameter 'nvls_channels'"),
    ("cluster-h100:nvls_channels=65", "nvls_channels must be an int from 0 to 64 (0: NCCL's "
                                      "16), got 65"),
    ("dgx-b200:nvls_channels=-1", "nvls_channels must be an int from 0 to 64 (0: NCCL's 32)"),
    ("dgx-h100:gpus=9", "gpus must be at most 8, got 9"),
    ("cluster-h100:fans=4", "has no parameter 'fans' (it takes: nodes, nics, channels, "
                            "nic_ports, gpus, qps, nvls_channels, nccl)"),
    ("cluster-h100:qps=0", "qps must be an int >= 1"),
    ("cluster-h100:nccl=2", "nccl must be a version such as 2.26 or 2.29.2, got '2'"),
    ("cluster-b200:nccl=2.x", "nccl must be a version"),
    ("cluster-a100:nccl=2.26", "has no parameter 'nccl'"),
    ("cluster-h100:gpus=0", "gpus must be an int >= 1"),
    ("cluster-h100:gpus=16", "gpus must be at most 8, got 16"),
    ("cluster-h100:gpus=4,nics=4", "give gpus or nics, not both"),
    ("cluster-a100:nic_ports=0", "nic_ports must be an int >= 1"),
    ("cluster-a100:nic_ports=5", "nic_ports must be at most 4, got 5"),
    ("cluster-h100:nics=3", "nics must divide the 8 GPUs of a node, got 3"),
    ("cluster-a100:nics=0", "nics must be an int >= 1"),
    ("cluster-a100:nics=16", "nics must divide the 8 GPUs of a node, got 16"),
    ("cluster-h100:nodes=two", "nodes must be an int, got 'two'"),
    ("aws-p4d:nics=8", "has no parameter 'nics' (it takes: nodes, channels)"),
    ("aws-p5:gpus=9", "gpus must be at most 8, got 9"),
    ("cluster-h100:nodes=1.5", "nodes must be an int"),
    ("cluster-h100:nodes=0", "nodes must be an int >= 1"),
    ("cluster-h100:nodes", "write parameters as key=value"),
    ("cluster-h100:nodes=2,nodes=3", "given twice"),
    ("fattree-h100:nodes=5,nodes_per_leaf=2", "5 nodes do not fill leaves of 2 nodes"),
    ("fattree-h100:oversubscription=0.5", "oversubscription must be a number >= 1"),
    ("fattree-h100:oversubscription=inf", "oversubscription must be a plain number (e.g. 2 or "
                                          "1.5), got 'inf'"),
    # int() and float() take these, so 4_0 was read as 40.
    ("dgx-h100:gpus=4_0", "gpus must be an int, got '4_0' (write plain digits)"),
    ("cluster-h100:nodes=+2", "nodes must be an int, got '+2'"),
    ("cluster-h100:nodes=\u0662", "nodes must be an int, got '\u0662'"),
    ("fattree-h100:oversubscription=1_5", "oversubscription must be a plain number"),
    ("fattree-h100:oversubscription=2e0", "oversubscription must be a plain number"),
])
def test_bad_preset_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match="preset") as info:
        make_preset(spec)
    assert message in str(info.value)


def test_describe_shows_link_classes_in_human_units():
    text = describe(make_preset("cluster-h100:nodes=2"))
    assert text.splitlines()[0] == ("cluster-h100:nodes=2: 16 ranks, 19 nodes "
                                    "(3 without a rank), 64 links")
    assert "gpuN <-> nodeN.switch     32 links    370.8 GB/s     1.7 us" in text
    assert "gpuN <-> net              32 links       48 GB/s       7 us" in text
    assert "reduce bandwidth: 3350 GB/s on every rank" in text
    assert "ranks 0..15 on: gpu0 gpu1" in text
    assert "posting a network send (weighed by the tuner): 1 us" in text  # Intel hosts
    assert "a ring's channel per slice under Simple, besides its bytes: 2 us" in text
    assert "network send" not in describe(make_preset("dgx-h100"))  # one node: no network


def test_describe_shows_one_way_links_and_mixed_reduce_bandwidths():
    topology = Topology("t", ("a", "b"), (Link("a", "b", 2e9, 1e-6), Link("b", "a", 1e9, 1e-6)),
                        ("a", "b"), (1e9, float("inf")))
    text = describe(topology)
    assert "a -> b" in text and "b -> a" in text
    assert "reduce bandwidth: 1 GB/s on 1 rank, inf on 1 rank" in text


def test_size_only_busbw_matches_the_closed_form_on_dgx_a100():
    # 2(p-1) steps of alpha + n/(pB), plus p-1 reductions of n/p at the HBM rate.
    topology = make_preset("dgx-a100")
    n, p = 1024**3, 8
    alpha, bandwidth, hbm = 3.4 * US, 240 * GB, 2039 * GB
    time = 2 * (p - 1) * (alpha + n / p / bandwidth) + (p - 1) * n / p / hbm
    result = simulate(ring_allreduce, [SizeOnly(n // 4)] * p, topology, record=False)
    assert result.time == pytest.approx(time, rel=1e-12)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_a_preset_written_as_a_topology_file_shows_its_figures_as_published(name) -> None:
    # NCCL's 3.4 us reads back as "1.7us" a link, not "1699.9999999999998ns".
    text = dump_topology(make_preset(name))
    figures = re.findall(r'= "([0-9.]+)([A-Za-z/]+)"', text)
    assert figures
    assert all(len(number.replace(".", "").strip("0")) <= 6 for number, _ in figures), [
        number + unit for number, unit in figures if len(number.replace(".", "")) > 6]
