"""NCCL's protocols in the cost model: each link's latency under the protocol a Send names,
LL's and LL128's share of the wire, and the launch latency a ``Launch`` charges. The data
are the same under every protocol."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from algorithms import (
    Join, Launch, Protocol, Recv, Send, Spawn, Wait, nccl_ring_allreduce, nccl_tree_allreduce,
)
from algorithms.nccl import RING_MAX_SLICES, as_protocol, nccl_ring_all_gather, ring_slices
from simcomm import SizeOnly, simulate
from simcomm.presets import NCCL_LAUNCH_LATENCY, make_preset
from simcomm.topology import WIRE_EFFICIENCY, Link, PerProtocol, Topology, fully_connected
from simcomm.tuning import Choice, ModelTuner

BANDWIDTH = 1e9  # bytes/second
LATENCIES = PerProtocol(simple=5e-6, ll=1e-6, ll128=2e-6)
LAUNCH = PerProtocol(simple=8e-6, ll=6e-6, ll128=14e-6)


def one_message(comm, x, protocol):
    """Rank 0 sends ``x`` to rank 1 under ``protocol``."""
    if comm.rank == 0:
        yield Wait((yield Send(1, x, "m", protocol)))
    else:
        yield Wait((yield Recv(0, x)))
    return x


def launched(comm, x, protocol):
    """A collective that only starts."""
    yield Launch(protocol)
    return x


def two_ranks() -> Topology:
    topology = fully_connected(2, BANDWIDTH, LATENCIES)
    return Topology(topology.name, topology.nodes, topology.links, topology.ranks,
                    topology.reduce_bandwidth, None, LAUNCH)


@pytest.mark.parametrize("protocol, efficiency", [
    (Protocol.SIMPLE, 1.0), (Protocol.LL, 0.5), (Protocol.LL128, 120 / 128)])
def test_a_message_costs_its_protocols_latency_and_wire_share(protocol, efficiency) -> None:
    nbytes = 1_000_000
    result = simulate(one_message, [SizeOnly(nbytes // 4, np.float32)] * 2, two_ranks(),
                      protocol=protocol)
    expected = LATENCIES.of(protocol) + nbytes / (BANDWIDTH * efficiency)
    assert result.time == pytest.approx(expected, rel=1e-12)


def test_data_arrive_the_same_under_every_protocol() -> None:
    for protocol in Protocol:
        inputs = [np.arange(5, dtype=np.float64), np.zeros(5)]
        result = simulate(one_message, inputs, two_ranks(), protocol=protocol)
        assert result.results[1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_launch_costs_the_topologys_launch_latency_for_its_protocol(protocol) -> None:
    result = simulate(launched, [SizeOnly(1, np.float32)] * 2, two_ranks(), protocol=protocol)
    assert result.time == pytest.approx(LAUNCH.of(protocol), rel=1e-12)
    assert [e.kind for e in result.trace] == ["launch", "launch"]


def test_a_topology_without_protocol_figures_charges_simple_latency_and_no_launch() -> None:
    topology = fully_connected(2, BANDWIDTH, 5e-6)
    assert topology.links[0].latency_of(Protocol.LL) == 5e-6
    assert topology.launch_latency.of(Protocol.LL128) == 0.0
    ll = simulate(one_message, [SizeOnly(250, np.float32)] * 2, topology, protocol=Protocol.LL)
    assert ll.time == pytest.approx(5e-6 + 2 * 1000 / BANDWIDTH, rel=1e-12)
    start = simulate(launched, [SizeOnly(1, np.float32)] * 2, topology, protocol=Protocol.LL)
    assert start.time == 0.0


def fan_out(comm, x, protocol):
    """Rank 0 sends ``x`` to every other rank at once."""
    if comm.rank == 0:
        sends = []
        for peer in range(1, comm.size):
            sends.append((yield Send(peer, x, "m", protocol)))
        yield Wait(*sends)
    else:
        yield Wait((yield Recv(0, x)))
    return x


@pytest.mark.parametrize("protocol, field", [(Protocol.LL, "ll_bandwidth"),
                                             (Protocol.LL128, "ll128_channel_bandwidth"),
                                             (Protocol.LL128, "ll128_bandwidth")])
def test_a_rate_of_ll_or_ll128_paces_a_channels_sends_in_its_pipe(protocol, field) -> None:
    # The pipe (0.25 GB/s: under LL the GPU's rate, NCCL's llMaxBw; under LL128 one
    # channel's, NCCL's perChMaxRingLL128Bw, or the GPU's, measured on A100; one channel
    # here) is slower than the wire's share of either: it
    # sets the pace, and the two messages of one channel through it take twice as long;
    # Simple does not use it.
    topology = replace(fully_connected(3, BANDWIDTH, LATENCIES), **{field: 0.25e9})
    nbytes = 1_000_000
    inputs = [SizeOnly(nbytes // 4, np.float32)] * 3
    paced = simulate(fan_out, inputs, topology, protocol=protocol)
    assert paced.time == pytest.approx(LATENCIES.of(protocol) + 2 * nbytes / 0.25e9,
                                       rel=1e-12)
    simple = simulate(fan_out, inputs, topology, protocol=Protocol.SIMPLE)
    assert simple.time == pytest.approx(LATENCIES.simple + nbytes / BANDWIDTH, rel=1e-12)
    assert [s.bytes for s in paced.links] == [s.bytes for s in simple.links]  # pipes not links
    with pytest.raises(ValueError, match=f"{field} must be > 0 bytes/second"):
        replace(topology, **{field: 0.0})


def fan_out_in_two_tasks(comm, x, protocol, shares_rate):
    """Rank 0 sends ``x`` to rank 1 from its main task and to rank 2 from a task on channel
    1, spawned with ``shares_rate``."""
    if comm.rank == 0:
        task = yield Spawn(one_way(x, 2, protocol), 1, shares_rate=shares_rate)
        yield Wait((yield Send(1, x, "m", protocol)))
        yield Join(task)
    elif comm.rank == 1:
        yield Wait((yield Recv(0, x)))
    else:
        yield Join((yield Spawn(one_way(x, 0, None), 1)))
    return x


def one_way(x, peer, protocol):
    if protocol is None:
        yield Wait((yield Recv(peer, x)))
    else:
        yield Wait((yield Send(peer, x, "m", protocol)))


@pytest.mark.parametrize("shares_rate, messages", [(True, 2), (False, 1)])
def test_a_task_that_shares_its_spawners_rate_sends_through_its_pipe(shares_rate,
                                                                    messages) -> None:
    # NCCL's tree runs its up and down streams on one channel's threads: a task spawned
    # with shares_rate sends through its spawner's pipe, so the two messages take turns
    # there; a task on a channel of its own has a pipe of its own.
    topology = replace(fully_connected(3, BANDWIDTH, LATENCIES), ll_bandwidth=0.25e9)
    nbytes = 1_000_000
    inputs = [SizeOnly(nbytes // 4, np.float32)] * 3
    result = simulate(fan_out_in_two_tasks, inputs, topology, protocol=Protocol.LL,
                      shares_rate=shares_rate)
    assert result.time == pytest.approx(LATENCIES.ll + messages * nbytes / 0.25e9, rel=1e-12)


def test_nccls_simple_ring_hands_each_chunk_on_in_two_slices() -> None:
    # Under Simple NCCL cuts a rank's part of a channel in 2 MiB chunks and passes each on
    # in two slices, none under 32 KiB unless the chunk is (src/device/prims_simple.h);
    # under LL and LL128 it hands on each 512 KiB step of its buffer.
    kib = 1 << 10
    assert [ring_slices(n * kib, Protocol.SIMPLE) for n in (1, 32, 33, 349, 2048, 2049)] == [
        1, 1, 2, 2, 2, 4]
    assert ring_slices(100 << 20, Protocol.SIMPLE) == RING_MAX_SLICES
    assert [ring_slices(n * kib, protocol) for n in (349, 1024) for protocol in (
        Protocol.LL, Protocol.LL128)] == [1, 1, 2, 2]


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_rings_channel_holds_each_slice_its_gap_longer_under_simple(protocol) -> None:
    # One channel between two ranks: a rank's 3 MiB chunk goes in 4 slices under Simple.
    # The channel's pipe holds each a gap longer than its bytes take (here none: no rate
    # limit), its bytes crossing the link meanwhile, so with a gap longer than they take the
    # slices end a gap apart; LL and LL128 pay no gap.
    gap, chunk = 1e-3, 3 << 20
    topology = fully_connected(2, BANDWIDTH, 0.0)
    inputs = [SizeOnly(2 * chunk // 4, np.float32)] * 2

    def seconds(ring_slice_gap: float) -> float:
        return simulate(nccl_ring_all_gather, inputs, replace(
            topology, ring_slice_gap=ring_slice_gap), channels=1, protocol=protocol).time

    if protocol is Protocol.SIMPLE:
        assert seconds(0.0) == pytest.approx(chunk / BANDWIDTH, rel=1e-12)
        assert seconds(gap) == pytest.approx(4 * gap, rel=1e-12)
    else:
        assert seconds(gap) == seconds(0.0)
    with pytest.raises(ValueError, match="ring_slice_gap must be finite seconds >= 0"):
        replace(topology, ring_slice_gap=-1e-6)


def test_presets_carry_nccls_ll128_ceiling_per_channel() -> None:
    # NCCL's figure is per channel of its search; it runs each as two channels.
    assert make_preset("cluster-h100:nodes=2").ll128_channel_bandwidth == 36.7e9 / 2
    assert make_preset("dgx-a100").ll128_channel_bandwidth == 20e9 / 2


@pytest.mark.parametrize("spec, channels", [
    # One node: six rings of NCCL's fastest speed doubled by the search, then run as two.
    ("dgx-h100", 24), ("dgx-h100:gpus=4", 24), ("dgx-a100", 24), ("dgx-b200", 32),
    # Across nodes: a ring per NIC, not doubled past four of under 50 GB/s on Hopper...
    ("cluster-h100:nodes=2", 16), ("cluster-h100:nodes=4,nics=4", 16),
    ("cluster-h100:nodes=2,nics=1", 4), ("fattree-h100", 16),
    # ...nor where a ring carries under 25 GB/s (200 Gb/s NICs).
    ("cluster-a100:nodes=2", 16), ("cluster-a100:nodes=2,nics=4", 8),
    # Given: as NCCL_MIN_NCHANNELS sets it.
    ("cluster-h100:nodes=8,channels=24", 24), ("dgx-h100:channels=32", 32),
])
def test_presets_run_rings_and_trees_on_nccls_channels(spec: str, channels: int) -> None:
    topology = make_preset(spec)
    assert topology.channels == channels and topology.name.startswith(spec)
    tuner = ModelTuner(topology)
    for algorithm in ("ring", "tree"):  # 16 MiB: large enough for all of them
        assert tuner.best_for("allreduce", 16 << 20, algorithm).channels == channels


@pytest.mark.parametrize("spec, nbytes, ran", [
    # A ring under LL gives each channel 512 threads x 8 bytes x the ranks: 32 KiB on 8.
    ("dgx-h100", 8, "ring/LL/1"), ("dgx-h100", 64 << 10, "ring/LL/2"),
    ("dgx-h100", 512 << 10, "ring/LL/16"), ("dgx-h100", 1 << 20, "ring/LL/24"),
    # A tree under LL: 512 threads x 8 bytes, 4 KiB; 16 ranks' ring under LL: 64 KiB.
    ("cluster-h100:nodes=2", 8, "tree/LL/1"), ("cluster-h100:nodes=2", 16 << 10, "tree/LL/4"),
    ("cluster-h100:nodes=2", 64 << 10, "ring/LL/1"),
])
def test_small_calls_run_on_fewer_channels_as_in_nccl(spec: str, nbytes: int, ran: str
                                                       ) -> None:
    # NCCL's topoGetAlgoInfo (src/enqueue.cc) after it picks the algorithm and protocol.
    choice = ModelTuner(make_preset(spec))("allreduce", nbytes)
    assert f"{choice.algorithm}/{choice.protocol.value.upper()}/{choice.channels}" == ran


def test_more_channels_share_nccls_ll128_ceiling() -> None:
    # NCCL's tuner caps LL128 per search channel, however many channels NCCL_MIN_CTAS runs.
    default, more = make_preset("cluster-h100:nodes=8"), make_preset(
        "cluster-h100:nodes=8,channels=24")
    assert default.channels * default.ll128_channel_bandwidth == pytest.approx(8 * 36.7e9)
    assert more.channels * more.ll128_channel_bandwidth == pytest.approx(8 * 36.7e9)


def test_a_bad_channel_count_is_named() -> None:
    with pytest.raises(ValueError, match=r"channels must be an int from 0 to 64 \(0: NCCL's"):
        make_preset("cluster-h100:channels=-2")
    with pytest.raises(ValueError, match="channels must be an int from 1 to 64"):
        replace(make_preset("dgx-h100"), channels=0)
    # NCCL runs at most 64 (MAXCHANNELS): more is refused at once, not run for hours.
    with pytest.raises(ValueError, match="channels must be an int from 0 to 64"):
        make_preset("dgx-h100:channels=65")
    with pytest.raises(ValueError, match="channels must be an int from 1 to 64"):
        replace(make_preset("dgx-h100"), channels=100_000)


def test_presets_carry_nccls_figures_per_protocol() -> None:
    topology = make_preset("cluster-h100:nodes=2")
    assert topology.launch_latency == NCCL_LAUNCH_LATENCY
    assert topology.ll_bandwidth == 39e9  # NCCL's llMaxBw on two nodes of Intel hosts
    assert make_preset("dgx-h100").ll_bandwidth == 141e9
    gpu_to_net = next(link for link in topology.links if link.dst == "net")
    # Half of NCCL's network step latency on each of the two network links of a path.
    assert gpu_to_net.latency_of(Protocol.SIMPLE) == pytest.approx(7e-6)
    assert gpu_to_net.latency_of(Protocol.LL) == pytest.approx(1.35e-6)
    assert gpu_to_net.latency_of(Protocol.LL128) == pytest.approx(2e-6)


def test_ll_wins_small_messages_and_simple_wins_large_ones_on_a_cluster() -> None:
    topology = make_preset("cluster-h100:nodes=2")

    def time(nbytes: int, protocol: str) -> float:
        inputs = [SizeOnly(nbytes // 4, np.float32)] * topology.size
        return simulate(nccl_ring_allreduce, inputs, topology, record=False,
                        protocol=protocol).time

    assert time(4096, "ll") < time(4096, "ll128") < time(4096, "simple")
    assert time(1 << 30, "simple") < time(1 << 30, "ll128") < time(1 << 30, "ll")


def test_protocols_are_named_or_refused_with_the_known_names() -> None:
    assert as_protocol("LL128") is Protocol.LL128
    assert as_protocol(Protocol.LL) is Protocol.LL
    with pytest.raises(ValueError, match="unknown protocol 'fast'; known: simple, ll, ll128"):
        as_protocol("fast")
    with pytest.raises(TypeError, match="Send.protocol must be a Protocol"):
        Send(1, np.zeros(1), "", "ll")
    with pytest.raises(TypeError, match="Launch.protocol must be a Protocol"):
        Launch("simple")
    with pytest.raises(ValueError, match="ll latency must be finite seconds >= 0"):
        PerProtocol(1e-6, -1e-6, 1e-6)
    with pytest.raises(ValueError, match="ll128_latency must be finite seconds >= 0"):
        Link("a", "b", 1e9, 1e-6, ll128_latency=float("nan"))


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_tree_pays_the_trees_own_hop_and_launch_latencies(protocol) -> None:
    # NCCL's cost model gives its tree latencies of its own (hwLat's and baseLat's Tree
    # rows). On two ranks each channel's tree is one hop up and one down.
    hop = PerProtocol(simple=20e-6, ll=9e-6, ll128=11e-6)
    launch = replace(LAUNCH, tree=PerProtocol(simple=1e-6, ll=2e-6, ll128=3e-6))
    topology = replace(fully_connected(2, BANDWIDTH, replace(LATENCIES, tree=hop)),
                       launch_latency=launch)
    inputs = [SizeOnly(2, np.float32)] * 2  # one float per channel
    wire = 4 / (BANDWIDTH * WIRE_EFFICIENCY[protocol])
    tree = simulate(nccl_tree_allreduce, inputs, topology, protocol=protocol)
    assert tree.time == pytest.approx(launch.tree.of(protocol) + 2 * (hop.of(protocol) + wire),
                                      rel=1e-9)
    tuner = ModelTuner(topology).estimate("allreduce", Choice("tree", protocol, 2), 8)
    assert tuner == pytest.approx(tree.time, rel=1e-9)
    # the ring keeps the figures for every algorithm
    ring = simulate(nccl_ring_allreduce, inputs, topology, protocol=protocol, channels=1)
    assert ring.time == pytest.approx(LAUNCH.of(protocol) + 2 * (LATENCIES.of(protocol) + wire),
                                      rel=1e-9)
