"""Seeded random variation of messages and computations, and samples of step times."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from algorithms import ring_allreduce
from algorithms.harness.model_presets import preset_model
from simcomm import SizeOnly, simulate, switch
from simcomm.presets import make_preset
from simcomm.training import simulate_ddp, simulate_fsdp
from simcomm.variation import Distribution, Samples, Variation, sample_times

NOISY = Variation(7, Distribution("normal", (2e-6, 1e-6)), Distribution("lognormal", (1.0, 0.05)))
NONE = Variation(3, Distribution("uniform", (0.0, 0.0)), Distribution("uniform", (1.0, 1.0)))


def test_the_same_seed_gives_the_same_step_and_no_spread_gives_the_nominal_one() -> None:
    model, topology = preset_model("resnet50"), make_preset("cluster-h100:nodes=2")
    nominal = simulate_ddp(model, topology)
    first, again = (simulate_ddp(model, topology, variation=NOISY) for _ in range(2))
    assert first.step == again.step != nominal.step
    other = simulate_ddp(model, topology, variation=Variation(8, NOISY.message_delay,
                                                              NOISY.compute_factor))
    assert other.step != first.step
    assert simulate_ddp(model, topology, variation=NONE).step == nominal.step
    assert simulate_fsdp(model, topology, variation=NONE).step == simulate_fsdp(
        model, topology).step


def test_message_delays_reach_a_collective() -> None:
    # A 2 us delay on every message of a ring of 4: each of its 6 steps starts 2 us late.
    topology = switch(4, 1e10, 1e-6)
    inputs = [SizeOnly(4000)] * 4
    nominal = simulate(ring_allreduce, inputs, topology).time
    late = simulate(ring_allreduce, inputs, topology,
                    variation=Variation(0, Distribution("uniform", (2e-6, 2e-6)))).time
    assert late == pytest.approx(nominal + 6 * 2e-6, rel=1e-12)


def test_a_message_slowdown_stretches_its_bytes_on_every_link() -> None:
    # Every message of a contention-free ring at half the bandwidth: each of the 6 steps
    # takes its chunk's time (4000 float32 / 4 ranks: 4000 bytes) once more; latencies stay.
    # A factor of 1 changes nothing.
    topology = switch(4, 1e9, 1e-6)
    inputs = [SizeOnly(4000)] * 4
    nominal = simulate(ring_allreduce, inputs, topology).time

    def slowed(factor: float) -> float:
        variation = Variation(0, message_slowdown=Distribution("uniform", (factor, factor)))
        return simulate(ring_allreduce, inputs, topology, variation=variation).time
    assert slowed(1.0) == nominal
    # Cut through 2 links (up to the switch, then down), the tail comes one byte-time later.
    assert slowed(2.0) == pytest.approx(nominal + 6 * 4000 / 1e9, rel=1e-9)
    assert slowed(3.0) == pytest.approx(nominal + 6 * 8000 / 1e9, rel=1e-9)


def test_samples_give_percentiles_and_do_not_depend_on_the_processes() -> None:
    run = partial(_step, model=preset_model("resnet50"), topology=make_preset("dgx-h100"))
    one = sample_times(run, 6, seed=10, jobs=1)
    two = sample_times(run, 6, seed=10, jobs=2)
    assert one == two and len(one.times) == 6 and len(set(one.times)) > 1
    assert min(one.times) <= one.percentile(50) <= one.percentile(90) <= max(one.times)
    assert one.format().startswith("6 samples: step median ")


def _step(seed, model, topology):
    return simulate_ddp(model, topology, variation=Variation(seed, None,
                                                             Distribution("normal", (1, 0.1)))
                        ).step


def test_distributions_are_read_and_checked(tmp_path: Path) -> None:
    assert Distribution.parse("normal:2us,0.5us", seconds=True) == Distribution(
        "normal", (2e-6, 5e-7))
    assert Distribution.parse("lognormal:1,0.05") == Distribution("lognormal", (1.0, 0.05))
    samples = tmp_path / "times.txt"
    samples.write_text("0.001\n0.002\n\n0.004\n")
    empirical = Distribution.parse(f"empirical:{samples}")
    rng = np.random.default_rng(0)
    assert {empirical.draw(rng) for _ in range(200)} == {0.001, 0.002, 0.004}
    for text, message in [("gamma:1,2", "unknown distribution 'gamma'"),
                          ("normal", "give KIND:A,B"), ("normal:1", "takes two finite numbers"),
                          ("lognormal:0,1", "the median must be > 0"),
                          ("uniform:2,1", "0 <= low <= high"), ("normal:a,1", "not a number")]:
        with pytest.raises(ValueError, match=message):
            Distribution.parse(text)
    with pytest.raises(ValueError, match="needs samples"):
        Distribution("empirical")
    # A missing file or a folder used to escape as an OSError that named no flag, and
    # "empirical:" read the working folder.
    missing = tmp_path / "missing.txt"
    for text, message in [(f"empirical:{missing}",
                           f"cannot read '{missing}': No such file or directory"),
                          (f"empirical:{tmp_path}", f"cannot read '{tmp_path}': Is a directory"),
                          ("empirical:", "'empirical:': give empirical:FILE")]:
        with pytest.raises(ValueError) as info:
            Distribution.parse(text)
        assert str(info.value).startswith(message), info.value
    # Delays take units, as every time on the command line; a lognormal's sigma takes none.
    assert Distribution.parse("lognormal:20us,0.5", seconds=True) == Distribution(
        "lognormal", (2e-5, 0.5))
    for text, message in [("normal:2,1us", "'2' is not a number of seconds with a unit"),
                          ("lognormal:20us,1.5us", "a lognormal's sigma has no unit"),
                          ("lognormal:20us,-1.5", "sigma >= 0"),
                          # These used to say "'-2us' is not a number of seconds" and "'1'
                          # is not a number of seconds": the rule and the kind come first.
                          ("normal:-2us,1us", "the mean and the standard deviation must be "
                                              ">= 0"),
                          ("uniform:-1us,1us", "need 0 <= low <= high"),
                          ("foo:1,2", "unknown distribution 'foo'")]:
        with pytest.raises(ValueError, match=message):
            Distribution.parse(text, seconds=True)


@pytest.mark.parametrize("call, message", [
    (lambda: sample_times(float, 3, jobs=0), "jobs must be an int >= 1, got 0"),
    (lambda: sample_times(float, 3, jobs="2"), "jobs must be an int >= 1"),
    (lambda: sample_times(float, 3, seed=1.5), "seed must be an int >= 0, got 1.5"),
    (lambda: sample_times(5, 3), "run must be callable"),
    (lambda: Variation(-1), "Variation.seed must be an int >= 0, got -1"),
    (lambda: switch(2, 1e9, 1e-6).with_latency_jitter(-1, 1e-6), "seed must be an int >= 0"),
])
def test_bad_sampling_arguments_are_named(call, message) -> None:
    # Each failed inside concurrent.futures or numpy ("expected non-negative integer").
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_samples_need_a_time() -> None:
    with pytest.raises(ValueError, match="Samples needs at least one time"):
        Samples(())


def test_a_factor_that_can_be_zero_is_refused(tmp_path: Path, capsys) -> None:
    # A slowdown or compute factor of 0 made links or computations free: busbw 3696 GB/s on
    # a DGX A100 with --message-slowdown uniform:0,0, against 225 nominal.
    zeros = tmp_path / "factors.txt"
    zeros.write_text("0\n1\n")
    for field, factor, message in [
            ("message_slowdown", Distribution("uniform", (0.0, 0.0)), "the low end must be > 0"),
            ("compute_factor", Distribution("normal", (0.0, 0.0)), "the mean must be > 0"),
            ("message_slowdown", Distribution.parse(f"empirical:{zeros}"),
             "every sample must be > 0")]:
        with pytest.raises(ValueError, match=f"Variation.{field}: a factor of 0 makes the "
                                             f"work free; {message}"):
            Variation(0, **{field: factor})
    # A delay of 0 is fine, and so is a factor that lognormal draws (always > 0).
    Variation(0, Distribution("uniform", (0.0, 0.0)), Distribution("lognormal", (1.0, 0.5)))
    from simcomm.cli import main
    assert main(["bench", "--algorithm", "ring_allreduce", "--topology", "dgx-a100",
                 "--sizes", "1M", "--message-slowdown", "uniform:0,1"]) == 2
    assert capsys.readouterr().err == ("simcomm: error: --message-slowdown: a factor of 0 "
                                       "makes the work free; the low end must be > 0\n")


def test_the_collective_level_refuses_random_variation() -> None:
    with pytest.raises(ValueError, match="run it at the message level"):
        simulate_ddp(preset_model("resnet50"), make_preset("dgx-h100"), level="collective",
                     variation=NOISY)
    auto = simulate_ddp(preset_model("resnet50"), make_preset("dgx-h100"), level="auto",
                        variation=NOISY)
    assert auto.result.level == "message"


def test_simcomm_ddp_prints_the_spread_of_its_samples(capsys) -> None:
    from simcomm.cli import main
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100", "--compute-noise",
                 "lognormal:1,0.05", "--samples", "4", "--seed", "5"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("# 4 samples: step median ") and last.endswith("seeds 5 to 8")
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100", "--samples", "0",
                 "--compute-noise", "normal:1,0.1"]) == 2
    assert "--samples must be from 1 to 1,000,000, got 0" in capsys.readouterr().err
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100", "--samples",
                 "100000000", "--compute-noise", "normal:1,0.1"]) == 2
    assert "--samples must be from 1 to 1,000,000, got 100000000" in capsys.readouterr().err


def test_simcomm_bench_samples_give_each_size_its_spread(tmp_path: Path, capsys) -> None:
    from simcomm.cli import main
    command = ["bench", "--algorithm", "ring_allreduce", "--topology", "switch", "--ranks", "4",
               "--bandwidth", "10GB/s", "--latency", "2us", "--sizes", "64KiB,4MiB",
               "--format", "json", "--message-delay", "lognormal:3us,1", "--message-slowdown",
               "lognormal:1,0.2"]
    assert main(command + ["--samples", "6", "--seed", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        runs = row["spread"]["runs_us"]
        assert len(runs) == 6 and len(set(runs)) == 6
        assert row["time_us"] == pytest.approx(float(np.mean(runs)), rel=1e-12)
    # Sample k is the single run with seed 3 + k.
    assert main(command + ["--seed", "5"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert [row["time_us"] for row in single] == pytest.approx(
        [row["spread"]["runs_us"][2] for row in rows], rel=1e-12)
    assert "spread" not in single[0]
    for flags, message in ((["--samples", "3"], "--samples draws from --message-delay or "
                                                "--message-slowdown"),
                           (["--histogram", str(tmp_path / "h.png")], "goes with --samples"),
                           (["--samples", "2", "--message-slowdown", "lognormal:0,1"],
                            "the median must be > 0"),
                           (["--samples", "2", "--message-delay", "normal:1us,1us", "-c", "1"],
                            "counts no wrong elements"),
                           (["--samples", "2", "--message-delay", "normal:1us,1us", "--level",
                             "collective"], "the level is collective here")):
        assert main(command[:-4] + flags) == 2
        assert message in capsys.readouterr().err


def test_fsdp_samples_and_their_histogram(tmp_path: Path, capsys) -> None:
    from simcomm.cli import main
    png = tmp_path / "steps.png"
    assert main(["fsdp", "--model", "gpt2-small", "--topology", "dgx-h100", "--message-delay",
                 "lognormal:20us,1", "--samples", "3", "--histogram", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("# 3 samples: step median ") and out[-1].endswith("seeds 0 to 2")
    assert png.read_bytes().startswith(b"\x89PNG")
