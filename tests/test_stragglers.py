"""Ranks that compute at other speeds: a slow rank never makes a step faster, the nominal
speed changes nothing, and the report says which rank was slow."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from algorithms import alltoall_allreduce, reduce_broadcast_allreduce, ring_allreduce
from algorithms.harness.model_presets import preset_model
from algorithms.models import Layer, Model
from simcomm import SizeOnly, fully_connected, hierarchical, simulate, switch
from simcomm.presets import make_preset
from simcomm.topofile import TopologyFileError, dump_topology, parse_topology
from simcomm.training import simulate_ddp, simulate_fsdp

REL = 1e-12


@st.composite
def models(draw: st.DrawFn) -> Model:
    layers = [Layer(f"l{i}", tuple(draw(st.lists(st.integers(1, 3000), min_size=1, max_size=3))),
                    draw(st.floats(1e-6, 1e-3)), draw(st.floats(1e-6, 2e-3)))
              for i in range(draw(st.integers(1, 5)))]
    return Model("drawn", tuple(layers), grad_bytes=4)


@settings(max_examples=30)
@given(model=models(), p=st.integers(2, 6), builder=st.sampled_from([fully_connected, switch]),
       allreduce=st.sampled_from([ring_allreduce, reduce_broadcast_allreduce,
                                  alltoall_allreduce]),
       slow=st.data(), factor=st.floats(0.05, 1.0), cap=st.integers(1, 20000))
def test_slowing_a_rank_never_makes_a_ddp_step_faster(model, p, builder, allreduce, slow,
                                                       factor, cap) -> None:
    topology = builder(p, 1e10, 2e-6, 5e10)
    rank = slow.draw(st.integers(0, p - 1))
    nominal = simulate_ddp(model, topology, bucket_cap=cap, allreduce=allreduce)
    slowed = simulate_ddp(model, topology.with_compute_speed({rank: factor}), bucket_cap=cap,
                          allreduce=allreduce)
    assert slowed.step >= nominal.step * (1 - REL)
    # Never slower than if the whole step of every rank ran at the slow rank's speed.
    assert slowed.step <= nominal.step / factor * (1 + REL) + 1e-15


def test_the_nominal_speed_changes_nothing() -> None:
    model, topology = preset_model("resnet50"), make_preset("cluster-h100:nodes=2")
    plain = simulate_ddp(model, topology)
    ones = simulate_ddp(model, topology.with_compute_speed(dict.fromkeys(range(16), 1.0)))
    assert (ones.step, ones.comm, ones.exposed) == (plain.step, plain.comm, plain.exposed)
    assert ones.slowest is None and plain.slowest is None
    fsdp_plain = simulate_fsdp(model, topology)
    fsdp_ones = simulate_fsdp(model, topology.with_compute_speed({3: 1.0}))
    assert fsdp_ones.step == fsdp_plain.step


def test_a_gpu_20_percent_slow_delays_a_resnet50_step_on_64_gpus() -> None:
    model, topology = preset_model("resnet50"), make_preset("cluster-h100:nodes=8")
    nominal = simulate_ddp(model, topology)
    slowed = simulate_ddp(model, topology.with_compute_speed({37: 0.8}))
    compute = model.forward_seconds + model.backward_seconds
    assert slowed.slowest == (37, pytest.approx(compute / 0.8), pytest.approx(compute))
    # The step is late by at most the straggler's extra compute; here the all-reduces hide
    # part of it (docs/stragglers.md).
    assert 0 < slowed.step - nominal.step <= compute / 0.8 - compute + 1e-12
    assert "slowest   rank 37: compute 7.851 ms, the fastest 6.281 ms" in slowed.format()
    # The collective level takes the slowest rank as the one that stands for all.
    collective = simulate_ddp(model, topology.with_compute_speed({37: 0.8}), level="collective")
    assert collective.step == pytest.approx(slowed.step, rel=2e-3)


def test_compute_speeds_are_checked_and_read_from_topology_files() -> None:
    topology = switch(4, 1e9, 1e-6)
    for bad in ({4: 0.5}, {-1: 0.5}, {0: 0.0}, {0: math.inf}, {0: True}):
        with pytest.raises(ValueError, match="compute speed"):
            topology.with_compute_speed(bad)
    slowed = topology.with_compute_speed({2: 0.5})
    assert slowed.compute_speed == (1.0, 1.0, 0.5, 1.0) and slowed.speed_of(2) == 0.5
    assert parse_topology(dump_topology(slowed)) == slowed
    text = 'kind = "switch"\nranks = 4\nbandwidth = "1GB/s"\nlatency = "1us"\n'
    assert parse_topology(text + "[compute_speed]\ngpu2 = 0.5\n").compute_speed == (
        1.0, 1.0, 0.5, 1.0)
    with pytest.raises(TopologyFileError, match="compute_speed.gpu9: names no node"):
        parse_topology(text + "[compute_speed]\ngpu9 = 0.5\n")
    with pytest.raises(TopologyFileError, match="compute_speed.gpu1: must be a number > 0"):
        parse_topology(text + "[compute_speed]\ngpu1 = -2\n")


def test_the_commands_take_compute_speeds(capsys) -> None:
    from simcomm.cli import main
    assert main(["ddp", "--model", "resnet50", "--topology", "cluster-h100:nodes=8",
                 "--compute-speed", "37=0.8"]) == 0
    assert "slowest   rank 37" in capsys.readouterr().out
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100",
                 "--compute-speed", "3:0.8"]) == 2
    assert "--compute-speed: '3:0.8' is not RANK=FACTOR" in capsys.readouterr().err
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100",
                 "--compute-speed", "9=0.8"]) == 2
    assert "compute speed for rank 9: the topology has ranks 0 to 7" in capsys.readouterr().err


def _ring_with_a_slow_rank(slow: float) -> tuple[float, list[float]]:
    import time

    import torch
    import torch.distributed as dist

    from realcomm import Driver
    rank = dist.get_rank()
    driver = Driver(slow_per_op=slow if rank == 1 else 0.0)
    x = torch.full((1000,), float(rank))
    begin = time.monotonic()
    driver.run(ring_allreduce, x, check_args=False)
    return time.monotonic() - begin, x[:2].tolist()


def test_realcomm_slows_a_rank_on_purpose() -> None:
    # Rank 1 sleeps 50 ms before each of its 6 ops (two ring steps of Send, Recv, Wait);
    # rank 0 waits for it, and the sum is still right.
    from algorithms.collectives import slowed
    from realcomm import spawn
    from simcomm import SizeOnly, simulate
    (fast, result), (slow, _) = spawn(_ring_with_a_slow_rank, 2, (0.05,))
    assert result == [1.0, 1.0]
    assert 0.3 <= slow and 0.2 <= fast
    # The same wrapper runs in the simulator, where its sleeps are exact.
    nominal = simulate(ring_allreduce, [SizeOnly(1000)] * 2, switch(2, 1e9, 1e-6)).time
    slower = simulate(lambda comm, x: slowed(ring_allreduce(comm, x), 0.05),
                      [SizeOnly(1000)] * 2, switch(2, 1e9, 1e-6)).time
    assert 0.3 <= slower <= nominal + 0.3 + 1e-12


def test_a_slowed_schedule_slows_the_tasks_it_spawns_too() -> None:
    # A schedule that spawns its all-reduce as a task, then joins it: 2 ops of its own
    # (Spawn, Join) and the task's 6 (two ring steps of Send, Recv, Wait), each after a Sleep.
    from algorithms import Join, Spawn
    from algorithms.collectives import slowed
    from simcomm import SizeOnly, simulate

    def spawned(comm, x):
        task = yield Spawn(ring_allreduce(comm, x), "ring")
        return (yield Join(task))
    sleeps = simulate(lambda comm, x: slowed(spawned(comm, x), 0.01), [SizeOnly(1000)] * 2,
                      switch(2, 1e9, 1e-6)).trace
    per_rank = [sum(1 for e in sleeps if e.kind == "sleep" and e.rank == r) for r in (0, 1)]
    assert per_rank == [8, 8]  # Spawn and Join, and the task's 6 ops


def test_a_link_at_another_speed() -> None:
    topology = make_preset("cluster-h100:nodes=2")
    half = topology.with_link_speed("gpu7", "net", bandwidth=0.5, latency=2.0)
    changed = [(a, b) for a, b in zip(topology.links, half.links) if a != b]
    assert sorted((a.src, a.dst) for a, _ in changed) == [("gpu7", "net"), ("net", "gpu7")]
    for before, after in changed:
        assert after.bandwidth == before.bandwidth / 2 and after.latency == 2 * before.latency
        assert after.ll_latency == 2 * before.ll_latency
    one_way = topology.with_link_speed("gpu7", "net", bandwidth=0.5, both_ways=False)
    assert sum(a != b for a, b in zip(topology.links, one_way.links)) == 1
    with pytest.raises(ValueError, match="no link from 'gpu7' to 'gpu9'"):
        topology.with_link_speed("gpu7", "gpu9", 0.5)
    with pytest.raises(ValueError, match="the bandwidth factor must be a number > 0"):
        topology.with_link_speed("gpu7", "net", 0)


@settings(max_examples=30)
@given(p=st.integers(2, 12), data=st.data(), factor=st.floats(0.05, 1.0),
       count=st.integers(1, 5000))
def test_a_slower_link_never_makes_a_ring_faster_where_routes_stay(p, data, factor,
                                                                  count) -> None:
    from simcomm.testing import topologies
    topology = data.draw(topologies(p))
    link = topology.links[data.draw(st.integers(0, len(topology.links) - 1))]
    slowed = topology.with_link_speed(link.src, link.dst, factor, 1 / factor,
                                      both_ways=False)
    # Routes take the fattest of the shortest paths: a slower link can move a route to
    # another path, which may have less latency (see the test below).
    assume(all(slowed.route(r, (r + 1) % p) == topology.route(r, (r + 1) % p)
               for r in range(p)))
    inputs = [SizeOnly(count)] * p
    assert (simulate(ring_allreduce, inputs, slowed, record=False).time
            >= simulate(ring_allreduce, inputs, topology, record=False).time * (1 - REL))


def test_a_slower_link_can_move_a_route_to_a_path_of_less_latency() -> None:
    # Two GPUs of one node joined through its switch and through the network, equally fat:
    # the route takes the switch (listed first) until its uplink slows, then the network,
    # here the path of less latency, so the ring gets faster.
    topology = hierarchical(1, 2, 1e9, 10e-6, 1e9, 1e-6)
    slowed = topology.with_link_speed("gpu0", "node0.switch", 0.5, both_ways=False)
    assert [topology.links[i].dst for i in topology.route(0, 1)] == ["node0.switch", "gpu1"]
    assert [slowed.links[i].dst for i in slowed.route(0, 1)] == ["net", "gpu1"]
    inputs = [SizeOnly(1)] * 2
    assert (simulate(ring_allreduce, inputs, slowed).time
            < simulate(ring_allreduce, inputs, topology).time)


def test_the_commands_take_link_speeds(capsys) -> None:
    from simcomm.cli import main
    argv = ["bench", "--algorithm", "ring_allreduce", "--topology", "cluster-h100:nodes=2",
            "--sizes", "1GiB", "--format", "csv"]
    assert main(argv) == 0
    nominal = float(capsys.readouterr().out.splitlines()[-1].split(",")[5])
    assert main(argv + ["--link-speed", "gpu7:net=0.5"]) == 0
    slowed = float(capsys.readouterr().out.splitlines()[-1].split(",")[5])
    assert slowed == pytest.approx(2 * nominal, rel=0.01)  # its NIC is the ring's bottleneck
    assert main(argv + ["--link-speed", "gpu7=0.5"]) == 2
    assert "--link-speed: 'gpu7=0.5' is not SRC:DST=FACTOR" in capsys.readouterr().err


@settings(max_examples=30)
@given(p=st.integers(2, 8), data=st.data(), factor=st.floats(0.05, 1.0),
       builder=st.sampled_from([fully_connected, switch]),
       allreduce=st.sampled_from([ring_allreduce, reduce_broadcast_allreduce]))
def test_slower_memory_on_a_rank_never_makes_an_allreduce_faster(p, data, factor, builder,
                                                                 allreduce) -> None:
    # Each reducing receive costs its bytes over the rank's reduction rate, so a rank with
    # slower memory can only make the collective end later; at a factor of 1 nothing moves.
    topology = builder(p, 1e10, 2e-6, 2e10)
    rank = data.draw(st.integers(0, p - 1))
    inputs = [SizeOnly(data.draw(st.integers(p, 1 << 18)))] * p
    nominal = simulate(allreduce, inputs, topology, record=False).time
    slowed = simulate(allreduce, inputs, topology.with_memory_speed({rank: factor}),
                      record=False).time
    assert slowed >= nominal * (1 - REL)
    assert simulate(allreduce, inputs, topology.with_memory_speed({rank: 1.0}),
                    record=False).time == nominal


def test_a_rank_with_slower_memory_slows_a_ring_and_the_commands_take_it(capsys) -> None:
    # A ring all-reduce of 4 ranks: the reduce-scatter's 3 reducing receives on rank 2 take
    # 16 MiB / 4 at half the rate each, and the ring waits for them step after step.
    topology = switch(4, 1e11, 1e-6, 1e11)
    inputs = [SizeOnly(1 << 22)] * 4
    nominal = simulate(ring_allreduce, inputs, topology)
    slowed_topology = topology.with_memory_speed({2: 0.5})
    assert slowed_topology.reduce_bandwidth == (1e11, 1e11, 5e10, 1e11)
    slowed = simulate(ring_allreduce, inputs, slowed_topology)
    assert slowed.time > nominal.time
    # The collective level's ring follows every rank's rate exactly.
    assert simulate(ring_allreduce, inputs, slowed_topology, level="collective").time == (
        pytest.approx(slowed.time, rel=1e-9))
    for speeds, message in (({9: 0.5}, "ranks 0 to 3"), ({1: 0.0}, "a factor > 0")):
        with pytest.raises(ValueError, match=message):
            topology.with_memory_speed(speeds)
    from simcomm.cli import main
    command = ["bench", "--algorithm", "ring_allreduce", "--topology", "switch", "--ranks", "4",
               "--bandwidth", "100GB/s", "--latency", "1us", "--reduce-bandwidth", "100GB/s",
               "--sizes", "16MiB", "--format", "csv"]
    assert main(command) == 0
    fast = float(capsys.readouterr().out.splitlines()[1].split(",")[5])
    assert main(command + ["--memory-speed", "2=0.5"]) == 0
    slow = float(capsys.readouterr().out.splitlines()[1].split(",")[5])
    assert slow == pytest.approx(slowed.time * 1e6, rel=1e-9) and slow > fast
    assert main(command + ["--memory-speed", "2=x"]) == 2
    assert "--memory-speed: '2=x' is not RANK=FACTOR" in capsys.readouterr().err
