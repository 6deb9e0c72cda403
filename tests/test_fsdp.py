"""FSDP unit scheduling in the simulator: the FSDP paper's communication volume, memory
bounds, what the options trade, correct data through the all-gathers and reduce-scatters,
and the ``simcomm fsdp`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms.fsdp import BACKWARD_POST, BACKWARD_PRE, fsdp_step, padded_size
from algorithms.harness.model_presets import preset_model
from algorithms.models import Layer, Model
from simcomm import fully_connected, ring, simulate, switch
from simcomm.cli import main
from simcomm.presets import make_preset
from simcomm.training import no_sharding_memory, simulate_ddp, simulate_fsdp

options = st.fixed_dictionaries({
    "forward_prefetch": st.booleans(),
    "backward_prefetch": st.sampled_from([BACKWARD_PRE, BACKWARD_POST, None]),
    "limit_all_gathers": st.integers(1, 3),
    "reshard_after_forward": st.booleans(),
})


@st.composite
def models(draw: st.DrawFn, multiple: int = 1, min_layers: int = 1) -> Model:
    layers = []
    for i in range(draw(st.integers(min_layers, 8))):
        params = tuple(multiple * n for n in draw(st.lists(st.integers(0, 2000), max_size=3)))
        layers.append(Layer(f"l{i}", params, draw(st.floats(0, 1e-3)), draw(st.floats(0, 2e-3))))
    return Model("drawn", tuple(layers), grad_bytes=4)


def sent_by_rank_0(report) -> int:
    return sum(e.nbytes for e in report.result.trace if e.kind == "send" and e.rank == 0)


@given(model=models(multiple=840), p=st.sampled_from([2, 3, 4, 5, 6, 7, 8]),
       builder=st.sampled_from([ring, switch, fully_connected]), opts=options)
def test_full_sharding_moves_one_and_a_half_times_ddps_bytes(model, p, builder, opts) -> None:
    # FSDP paper (Zhao et al., VLDB 2023, section 3.3): full sharding all-gathers in forward
    # and backward and reduce-scatters once, 3 (p-1)/p of the model per rank; DDP's ring
    # all-reduce is 2 (p-1)/p; without resharding the backward all-gather goes. Units here
    # divide evenly by p (840 = lcm(1..8)), so no padding blurs the count.
    topology = builder(p, 1e10, 1e-6)
    fsdp = simulate_fsdp(model, topology, **opts)
    ddp = simulate_ddp(model, topology)
    assert sent_by_rank_0(ddp) == 2 * (p - 1) * model.param_bytes // p
    expected = 3 if opts["reshard_after_forward"] else 2
    # The last unit stays gathered between forward and backward (no second all-gather).
    last = model.layers[-1].param_count * model.grad_bytes * (p - 1) // p
    kept = last if opts["reshard_after_forward"] else 0
    assert fsdp.sent_bytes == expected * (p - 1) * model.param_bytes // p - kept


def test_the_fsdp_paper_ratio_on_a_preset() -> None:
    model = preset_model("gpt2-small")
    topology = make_preset("dgx-a100")
    fsdp, ddp = simulate_fsdp(model, topology), simulate_ddp(model, topology)
    assert fsdp.sent_bytes / sent_by_rank_0(ddp) == pytest.approx(1.5, rel=1e-4)


@st.composite
def even_models(draw: st.DrawFn) -> Model:
    """8 to 12 units of s to 2s parameters each: none holds more than a quarter."""
    base = draw(st.integers(1, 2000))
    layers = []
    for i in range(draw(st.integers(8, 12))):
        n = draw(st.integers(base, 2 * base))
        cut = draw(st.integers(0, n))
        layers.append(Layer(f"l{i}", (cut, n - cut), draw(st.floats(0, 1e-3)),
                            draw(st.floats(0, 2e-3))))
    return Model("even", tuple(layers), grad_bytes=4)


@given(model=even_models(), p=st.integers(4, 8), opts=options, data=st.data())
def test_peak_memory_stays_below_no_sharding_when_units_are_small(model, p, opts, data
                                                                  ) -> None:
    # A rank holds its shards (P/p of parameters, as much of gradients), at most two gathered
    # units, and full gradients still waiting for their reduce-scatter (at most P): so with
    # p >= 4 and no unit above P/4 it never holds more than 2P, the no-sharding footprint.
    # (FSDP with a few huge units can hold more than no sharding, as the real one can.)
    assert all(4 * layer.param_count <= model.param_count for layer in model.layers)
    opts = {**opts, "reshard_after_forward": True}
    topology = fully_connected(p, data.draw(st.floats(1e8, 1e11)), 1e-6)
    report = simulate_fsdp(model, topology, **opts)
    padding = sum(padded_size(layer.param_count, p) - layer.param_count
                  for layer in model.layers) * model.grad_bytes
    assert report.peak_memory <= no_sharding_memory(model) + 4 * padding


@given(model=models(multiple=16, min_layers=2), opts=options)
def test_peak_memory_shrinks_as_the_world_grows(model, opts) -> None:
    # With communication free (no gradient waits for its reduce-scatter), the shards shrink
    # as 1/p and nothing else grows: the peak at 2p is at most the peak at p, from p = 2 on.
    # (Going from 1 rank to 2 adds a gathered copy beside the shards.)
    peaks = [simulate_fsdp(model, fully_connected(p, 1e30, 0.0), **opts).peak_memory
             for p in (2, 4, 8, 16)]
    assert peaks == sorted(peaks, reverse=True)


def test_prefetch_and_resharding_trade_time_for_memory() -> None:
    model = preset_model("gpt2-small")
    topology = make_preset("dgx-a100")
    default = simulate_fsdp(model, topology)
    no_prefetch = simulate_fsdp(model, topology, backward_prefetch=None)
    forward = simulate_fsdp(model, topology, forward_prefetch=True)
    keep = simulate_fsdp(model, topology, reshard_after_forward=False)
    assert default.step < no_prefetch.step and forward.step < default.step
    assert no_prefetch.peak_memory < default.peak_memory < keep.peak_memory
    assert keep.sent_bytes < default.sent_bytes
    assert default.peak_memory < no_sharding_memory(model)


def test_step_time_lies_between_max_and_sum_of_compute_and_comm() -> None:
    for name in ("resnet50", "bert-base", "gpt2-small"):
        report = simulate_fsdp(preset_model(name), switch(8, 50e9, 5e-6))
        assert max(report.compute, report.comm) <= report.step <= report.compute + report.comm
        assert report.exposed == pytest.approx(report.step - report.compute)


def test_real_data_is_gathered_and_averaged() -> None:
    # With numpy buffers the schedule moves real data: after the step each unit's gathered
    # buffer holds every rank's shard, and each rank's gradient shard is the average.
    p = 3
    model = Model("m", (Layer("a", (4, 2), 0.0, 0.0), Layer("b", (5,), 0.0, 0.0)))
    sizes = [padded_size(layer.param_count, p) for layer in model.layers]

    def step(comm, x):
        r = comm.rank
        shards = [10.0 * r + np.arange(n // p) for n in sizes]  # this rank's parameters
        gathered = [np.zeros(n) for n in sizes]
        grads = [np.full(n, float(r + 1)) for n in sizes]
        shard_grads = [np.zeros(n // p) for n in sizes]
        yield from fsdp_step(comm, model, shards, gathered, grads, shard_grads,
                             forward_prefetch=True)
        return gathered, shard_grads

    result = simulate(step, [np.zeros(0)] * p, switch(p, 1e9, 1e-6))
    for gathered, shard_grads in result.results:
        for n, buf, grad in zip(sizes, gathered, shard_grads):
            expected = np.concatenate([10.0 * q + np.arange(n // p) for q in range(p)])
            np.testing.assert_array_equal(buf, expected)
            np.testing.assert_array_equal(grad, 2.0)  # (1 + 2 + 3) / 3


def test_one_rank_holds_everything_and_sends_nothing() -> None:
    model = preset_model("resnet50")
    report = simulate_fsdp(model, ring(1, 1e9, 1e-6))
    assert report.sent_bytes == 0 and report.step == pytest.approx(report.compute)
    assert report.peak_memory == no_sharding_memory(model)


def test_bad_options_are_refused() -> None:
    model = preset_model("resnet50")
    with pytest.raises(ValueError, match="backward_prefetch"):
        simulate_fsdp(model, ring(2, 1e9, 0.0), backward_prefetch="BACKWARD_PRE")
    with pytest.raises(ValueError, match="limit_all_gathers"):
        simulate_fsdp(model, ring(2, 1e9, 0.0), limit_all_gathers=0)


def test_memory_counters_in_the_trace(tmp_path) -> None:
    path = tmp_path / "fsdp.json"
    report = simulate_fsdp(preset_model("bert-base"), switch(4, 1e11, 1e-6), trace=path)
    counters = [e for e in json.loads(path.read_text())["traceEvents"]
                if e["ph"] == "C" and e["name"] == "memory"]
    assert {e["pid"] for e in counters} == {0, 1, 2, 3}
    assert max(e["args"]["bytes"] for e in counters) == report.peak_memory


def test_fsdp_command_compares_options_with_ddp(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "memory.png"
    assert main(["fsdp", "--model", "gpt2-small", "--topology", "dgx-a100", "--compare",
                 "--memory-plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "fsdp: gpt2-small on 8 ranks" in out
    assert "ddp (no sharding)" in out and " 1.50x " in out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["fsdp", "--model", "gpt2-small", "--topology", "dgx-a100",
                 "--backward-prefetch", "sideways"]) == 2
