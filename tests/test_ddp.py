"""DDP bucketing and the simulated training steps: properties of the buckets and of the
step times, the presets' published parameter counts, and the ``simcomm ddp`` command."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import AVG
from algorithms.ddp import BucketLauncher, assign_buckets, gradient_order
from algorithms.harness.catalog import COLLECTIVES
from algorithms.harness.model_presets import preset_model
from algorithms.models import Layer, Model
from simcomm import SizeOnly, fully_connected, ring, simulate, switch
from simcomm.cli import main
from simcomm.training import model_buckets, simulate_ddp, simulate_dp

REL = 1e-9
ALLREDUCES = [c.function for c in COLLECTIVES.values() if c.kind == "allreduce"]


# -- buckets ----------------------------------------------------------------------------------

@given(sizes=st.lists(st.integers(0, 5000), max_size=60), element=st.sampled_from([2, 4, 8]),
       cap=st.integers(1, 20000), first=st.integers(1, 20000))
def test_every_tensor_lands_in_one_bucket_in_order_within_the_cap(sizes, element, cap, first
                                                                 ) -> None:
    buckets = assign_buckets(sizes, element, cap, first)
    assert [i for bucket in buckets for i in bucket] == list(range(len(sizes)))
    assert all(buckets)  # no empty bucket
    for b, bucket in enumerate(buckets):
        limit = first if b == 0 else cap
        nbytes = sum(sizes[i] for i in bucket) * element
        assert nbytes <= limit or len(bucket) == 1, (b, bucket, nbytes, limit)
        if b + 1 < len(buckets):  # a bucket closes only when the next tensor would overflow
            following = sizes[buckets[b + 1][0]] * element
            assert nbytes + following > limit


@st.composite
def models(draw: st.DrawFn) -> Model:
    layers = []
    for i in range(draw(st.integers(1, 6))):
        params = tuple(draw(st.lists(st.integers(0, 3000), max_size=4)))
        layers.append(Layer(f"l{i}", params, draw(st.floats(0, 1e-3)), draw(st.floats(0, 2e-3))))
    return Model("drawn", tuple(layers), grad_bytes=draw(st.sampled_from([2, 4, 8])))


@given(model=models(), cap=st.integers(1, 40000))
def test_buckets_follow_reverse_layer_order(model, cap) -> None:
    order = gradient_order(model)
    layers_in_bucket_order = [order[i][0] for bucket in model_buckets(model, cap, cap)
                              for i in bucket]
    assert layers_in_bucket_order == sorted(layers_in_bucket_order, reverse=True)
    assert len(layers_in_bucket_order) == sum(len(layer.params) for layer in model.layers)


@given(data=st.data(), sizes=st.lists(st.integers(1, 100), min_size=1, max_size=30),
       cap=st.integers(1, 400))
def test_launcher_hands_out_each_bucket_once_in_order_when_complete(data, sizes, cap) -> None:
    buckets = assign_buckets(sizes, 1, cap, cap)
    launcher = BucketLauncher(buckets)
    ready: set[int] = set()
    launched: list[int] = []
    for index in data.draw(st.permutations(range(len(sizes)))):
        ready.add(index)
        for b in launcher.ready(index):
            assert all(set(buckets[c]) <= ready for c in range(b + 1))
            launched.append(b)
    assert launched == list(range(len(buckets))) and launcher.done
    with pytest.raises(ValueError, match="twice"):
        launcher.ready(0)


# -- simulated steps --------------------------------------------------------------------------

def allreduce_alone(allreduce, topology, count: int, dtype) -> float:
    """One bucket's all-reduce (averaging, as DDP's) simulated on its own."""
    return simulate(allreduce, [SizeOnly(count, dtype)] * topology.size, topology,
                    record=False, op=AVG).time


topologies = st.sampled_from([ring, fully_connected, switch])


@given(model=models(), p=st.integers(1, 6), cap=st.integers(1, 40000),
       builder=topologies, allreduce=st.sampled_from(ALLREDUCES),
       alpha=st.floats(0, 1e-4), bandwidth=st.floats(1e8, 1e11),
       reduce_bw=st.one_of(st.just(math.inf), st.floats(1e8, 1e11)))
def test_step_time_lies_between_max_and_sum_of_compute_and_comm(
        model, p, cap, builder, allreduce, alpha, bandwidth, reduce_bw) -> None:
    topology = builder(p, bandwidth, alpha, reduce_bw)
    for overlap in (True, False):
        report = simulate_ddp(model, topology, bucket_cap=cap, first_bucket_cap=cap,
                              allreduce=allreduce, overlap=overlap)
        compute = model.forward_seconds + model.backward_seconds
        assert report.compute == pytest.approx(compute, rel=REL)
        assert report.step >= max(report.compute, report.comm) * (1 - REL)
        assert report.step <= (report.compute + report.comm) * (1 + REL) + 1e-15
        assert 0.0 <= report.overlap <= 1.0
        assert report.exposed == pytest.approx(report.step - compute, rel=REL, abs=1e-15)
        if not overlap:
            assert report.overlap == 0.0


@given(model=models(), p=st.integers(1, 6), cap=st.integers(1, 40000),
       allreduce=st.sampled_from(ALLREDUCES), alpha=st.floats(0, 1e-4),
       bandwidth=st.floats(1e8, 1e11),
       reduce_bw=st.one_of(st.just(math.inf), st.floats(1e8, 1e11)))
def test_overlap_never_hurts_without_contention(model, p, cap, allreduce, alpha, bandwidth,
                                                 reduce_bw) -> None:
    # On a full mesh no two pairs of ranks share a link, so starting a bucket earlier can
    # only end it earlier: overlap <= one after another <= compute + each all-reduce alone.
    # (The last is not an equality: a rank that finishes one all-reduce early starts the next
    # early.)
    topology = fully_connected(p, bandwidth, alpha, reduce_bw)
    overlapped = simulate_ddp(model, topology, bucket_cap=cap, first_bucket_cap=cap,
                              allreduce=allreduce)
    serial = simulate_ddp(model, topology, bucket_cap=cap, first_bucket_cap=cap,
                          allreduce=allreduce, overlap=False)
    dtype = {2: np.float16, 4: np.float32, 8: np.float64}[model.grad_bytes]
    alone = sum(allreduce_alone(allreduce, topology, b.bytes // model.grad_bytes, dtype)
                for b in serial.buckets)
    assert overlapped.step <= serial.step * (1 + REL) + 1e-15
    assert serial.step <= (serial.compute + alone) * (1 + REL) + 1e-15


def test_buckets_queue_on_one_comm_stream() -> None:
    model = preset_model("bert-base")
    report = simulate_ddp(model, switch(8, 100e9, 5e-6))
    for before, after in zip(report.buckets, report.buckets[1:]):
        assert before.ready <= after.ready
        assert after.start == pytest.approx(max(after.ready, before.end), rel=REL)
        assert after.end > after.start
    assert report.step == pytest.approx(report.buckets[-1].end, rel=REL)
    assert sum(b.bytes for b in report.buckets) == model.param_bytes


def test_one_rank_has_nothing_to_communicate() -> None:
    model = preset_model("resnet50")
    topology = ring(1, 1e9, 1e-6)
    for report in (simulate_ddp(model, topology), simulate_dp(model, topology)):
        assert report.step == pytest.approx(report.compute, rel=REL)
        assert report.exposed == pytest.approx(0.0, abs=1e-12)


def test_dataparallel_funnels_everything_through_the_master() -> None:
    model = preset_model("bert-base")
    topology = switch(8, 100e9, 5e-6)
    dp, ddp = simulate_dp(model, topology), simulate_ddp(model, topology)
    assert dp.compute == pytest.approx(ddp.compute, rel=REL)
    assert dp.step > 2 * ddp.step
    master_links = [s for s in dp.result.links if "gpu0" in (s.link.src, s.link.dst)]
    other = max(s.bytes for s in dp.result.links if "gpu0" not in (s.link.src, s.link.dst))
    assert min(s.bytes for s in master_links) >= 7 * model.param_bytes > 7 * other / 2


def test_bucket_cap_matters_on_a_slow_network() -> None:
    # The DDP paper (Li et al., VLDB 2020, section 5.2) saw bucket size alone change the
    # speed by more than 2x; so does the cost model on a network of 10 us latency.
    model = preset_model("resnet50")
    topology = switch(16, 12.5e9, 10e-6)
    tiny = simulate_ddp(model, topology, bucket_cap=256 * 1024, first_bucket_cap=256 * 1024)
    default = simulate_ddp(model, topology)
    assert tiny.step > 2 * default.step


# -- presets ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [
    ("resnet50", 25_557_032), ("bert-base", 109_482_240), ("gpt2-small", 124_439_808),
    ("llama-7b", 6_738_415_616)])
def test_presets_have_the_published_parameter_counts(name, params) -> None:
    assert preset_model(name).param_count == params


def test_resnet50_forward_flops_match_the_usual_count() -> None:
    # 4.09 GMACs per 224x224 image (torchvision's model table), 2 FLOPs per MAC.
    model = preset_model("resnet50", batch=1, throughput=1.0)
    assert model.forward_seconds == pytest.approx(2 * 4.09e9, rel=0.01)
    assert model.backward_seconds == pytest.approx(2 * model.forward_seconds)


def test_bad_presets_and_models_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        preset_model("vgg")
    with pytest.raises(ValueError, match="batch"):
        preset_model("resnet50", batch=0)
    with pytest.raises(ValueError, match="distinct"):
        Model("m", (Layer("a", (1,), 0, 0), Layer("a", (1,), 0, 0)))
    with pytest.raises(ValueError, match="forward_seconds"):
        Layer("a", (1,), -1.0, 0.0)


# -- command line -----------------------------------------------------------------------------

def test_ddp_command_compares_schedules_and_sweeps_buckets(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sweep.png"
    assert main(["ddp", "--model", "bert-base", "--topology", "dgx-a100", "--compare",
                 "--sweep-buckets", "1MiB,25MiB,1GiB", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "ddp: bert-base on 8 ranks, bucket cap 25MiB" in out
    for schedule in ("ddp ", "ddp-no-overlap", "dp "):
        assert f"\n{schedule}" in out
    assert out.count("<- fastest") == 1
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--model", "vgg", "--topology", "dgx-a100"], "unknown model 'vgg'"),
    (["--model", "resnet50", "--topology", "dgx-a100", "--allreduce", "broadcast"],
     "--allreduce 'broadcast'"),
    (["--model", "resnet50", "--topology", "dgx-a100", "--throughput", "fast"],
     "compute rate"),
    (["--model", "resnet50", "--topology", "dgx-a100", "--throughput", "125"],
     "compute rate '125' has no unit"),  # used to be read as 125 FLOP/s
    (["--model", "resnet50", "--topology", "dgx-a100", "--plot", "x.png"], "--sweep-buckets"),
    # These used to end in an OverflowError's traceback, and in an error after the step ran.
    (["--model", "bert-base", "--topology", "dgx-a100", "--batch", str(10**30)],
     "simcomm: error: batch must be at most 2,251,799,813,685,247 for bert-base (its input "
     f"and output of a step in at most 9223372036854775807 B each), got {10**30:,}\n"),
    (["--model", "resnet50", "--topology", "dgx-a100", "--sweep-buckets", "1MiB,0"],
     "simcomm: error: --sweep-buckets: a bucket cap must be >= 1 byte, got '0'\n"),
])
def test_ddp_command_mistakes_are_one_line(capsys, argv, message) -> None:
    assert main(["ddp", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
