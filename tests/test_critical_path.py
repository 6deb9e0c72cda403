"""The critical path of a simulated run: which ranks' work and which links' messages the
run's end waited on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import reduce_broadcast_allreduce, ring_allreduce
from algorithms.harness.model_presets import preset_model
from simcomm import SizeOnly, simulate, switch
from simcomm.cli import main
from simcomm.critical_path import critical_path
from simcomm.presets import make_preset
from simcomm.training import simulate_ddp


def test_a_ring_waits_on_one_message_a_step() -> None:
    # Four ranks on a switch, a chunk of 4000 bytes at 1 GB/s and 1 us a link: every one of
    # the 6 steps is a message of 4 us on the wire plus 1 us of latency, one after another.
    result = simulate(ring_allreduce, [SizeOnly(4000)] * 4, switch(4, 1e9, 0.5e-6))
    path = critical_path(result)
    assert [s.kind for s in path.segments] == ["message"] * 6
    assert sum(s.seconds for s in path.segments) == pytest.approx(result.time, rel=1e-12)
    for before, after in zip(path.segments, path.segments[1:]):
        assert before.end == pytest.approx(after.start, abs=1e-15)
        assert before.peer == after.rank or before.rank == after.rank
    assert path.links[path.segments[0].link].src == "switch"  # the wire into the receiver


def test_a_slow_rank_is_on_the_path_and_named() -> None:
    # ResNet-50 on 16 H100s with rank 13 at 0.8 of the speed: the step waits for its
    # backward, so the path is nearly all rank 37's compute, and the report names it.
    topology = make_preset("cluster-h100:nodes=2").with_compute_speed({13: 0.8})
    from algorithms import nccl_allreduce
    report = simulate_ddp(preset_model("resnet50"), topology, allreduce=nccl_allreduce)
    path = critical_path(report.result)
    ranks = path.compute_by_rank()
    assert next(iter(ranks)) == 13 and ranks[13] > 0.9 * report.step
    assert path.seconds_of("compute") + path.seconds_of("message") + path.seconds_of(
        "idle") == pytest.approx(report.step, rel=1e-9)
    assert "most on rank 13 " in path.format()


@given(slow=st.integers(0, 3), factor=st.sampled_from([0.25, 0.5]),
       tree=st.booleans())
def test_the_path_covers_the_run_and_each_segment_follows_the_last(slow: int, factor: float,
                                                                  tree: bool) -> None:
    # Reductions cost time (200 GB/s): a receive posted after its message came still
    # reduces, and that belongs on the path too.
    topology = switch(4, 1e9, 1e-6, 2e11).with_compute_speed({slow: factor})
    model = preset_model("resnet50")
    report = simulate_ddp(model, topology, bucket_cap=8 << 20,
                          allreduce=reduce_broadcast_allreduce, tree=tree)
    path = critical_path(report.result)
    assert sum(s.seconds for s in path.segments) == pytest.approx(report.step, rel=1e-9)
    assert all(s.seconds >= -1e-15 for s in path.segments)
    for before, after in zip(path.segments, path.segments[1:]):
        assert before.end == pytest.approx(after.start, abs=1e-12)
    assert next(iter(path.compute_by_rank())) == slow


def test_only_a_message_level_run_with_its_trace_has_a_path() -> None:
    topology = switch(4, 1e9, 1e-6)
    collective = simulate(ring_allreduce, [SizeOnly(4000)] * 4, topology, level="collective")
    with pytest.raises(ValueError, match="message level"):
        critical_path(collective)
    untraced = simulate(ring_allreduce, [SizeOnly(4000)] * 4, topology, record=False)
    with pytest.raises(ValueError, match="record=True"):
        critical_path(untraced)


def test_simcomm_ddp_prints_the_path_and_what_a_straggler_costs(capsys) -> None:
    assert main(["ddp", "--model", "resnet50", "--topology", "switch", "--ranks", "4",
                 "--bandwidth", "100GB/s", "--latency", "5us", "--compute-speed", "2=0.5",
                 "--critical-path"]) == 0
    out = capsys.readouterr().out
    assert "critical path: " in out and "most on rank 2 " in out
    delayed = [line for line in out.splitlines() if "slower ranks (2) delay the step" in line]
    assert len(delayed) == 1
    assert main(["ddp", "--model", "resnet50", "--topology", "switch", "--ranks", "4",
                 "--bandwidth", "100GB/s", "--latency", "5us", "--critical-path"]) == 0
    assert "delay the step" not in capsys.readouterr().out
