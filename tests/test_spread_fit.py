"""Fitting the random variation of messages to the spread of measured runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from algorithms import ring_allreduce
from simcomm import SizeOnly, simulate, switch
from simcomm.cli import main
from simcomm.spread_fit import fit_spread, read_runs
from simcomm.variation import Distribution, Variation

TOPOLOGY = switch(2, 2e9, 50e-6)
SIZES = (2**18, 2**22, 2**24)  # bytes
TRUTH = Variation(0, Distribution("lognormal", (40e-6, 1.5)),
                  message_slowdown=Distribution("lognormal", (1.1, 0.25)))


def _run(size: int, variation: Variation) -> float:
    return simulate(ring_allreduce, [SizeOnly(size // 4)] * 2, TOPOLOGY, record=False,
                    variation=variation).time


def test_the_fit_finds_a_variation_that_spreads_runs_as_the_measured_ones() -> None:
    # "Measured" runs made by the simulator under a known variation, with other seeds than
    # the fit uses: the fit must reproduce their median and 90th percentile at every size,
    # though a delay and a slowdown act differently on small and large messages.
    measured = {size: [_run(size, Variation(1000 + k, TRUTH.message_delay,
                                            message_slowdown=TRUTH.message_slowdown))
                       for k in range(80)] for size in SIZES}
    trials = []
    fit = fit_spread(_run, measured, samples=40, max_trials=150,
                     progress=lambda: trials.append(1))
    assert len(trials) == fit.trials  # one call per trial, as the bar counts them
    for row in fit.sizes:
        assert row.nominal == _run(row.size, Variation(0))
        assert all(abs(error) < 0.12 for error in row.errors()), fit.format()
    assert fit.flags().startswith("--message-delay lognormal:")
    assert "# largest error" in fit.format()


def test_measured_runs_are_read_from_bench_json_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    for text, message in (("[]", "expected a JSON list"), ("{", "cannot read"),
                          ('[{"size": 8, "time_us": 1.0}]', "row 1 has no runs"),
                          ('[{"size": 8, "spread": {"runs_us": [1]}}, '
                           '{"size": 8, "spread": {"runs_us": [1]}}]', "repeated"),
                          ('[{"size": 8, "spread": {"runs_us": [1, null]}}]',
                           "other than numbers"),
                          # These two used to end in a traceback.
                          ("[" * 100_000 + "]" * 100_000,
                           "cannot read measured runs: arrays or objects nested too deep$"),
                          ('[{"size": 8, "spread": {"runs_us": [1' + "0" * 400 + "]}}]",
                           "row 1: runs_us holds a number too large for a float$")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_runs(path)
    with pytest.raises(ValueError, match="need 5 or more measured runs"):
        fit_spread(_run, {8: [1e-3] * 4})
    for samples in (4, 10_001, 20.0):
        with pytest.raises(ValueError, match="samples must be an int from 5 to 10000, got"):
            fit_spread(_run, {8: [1e-3] * 5}, samples=samples)
    with pytest.raises(ValueError, match="no measured sizes"):
        fit_spread(_run, {})
    # A 0 B row was fitted, and printed a +4660% error.
    for size in (0, -8, True):
        with pytest.raises(ValueError, match=f"size {size!r}: sizes are bytes > 0"):
            fit_spread(_run, {size: [1e-3] * 5})
    with pytest.raises(ValueError, match="takes no time"):
        fit_spread(lambda size, variation: 0.0, {8: [1e-3] * 5})


def test_simcomm_fit_spread_reads_what_bench_samples_write(tmp_path: Path, capsys) -> None:
    # simcomm bench --samples writes every sample's time as realcomm bench -I writes every
    # run's, so the fit can be tried on simulated "measurements" of a known variation.
    topology = ["--topology", "switch", "--ranks", "2", "--bandwidth", "2GB/s",
                "--latency", "50us"]
    assert main(["bench", "--algorithm", "ring_allreduce", *topology, "--sizes",
                 "256KiB,16MiB", "--samples", "40", "--seed", "500", "--format", "json",
                 "--message-delay", "lognormal:40us,1.5", "--message-slowdown",
                 "lognormal:1.1,0.25"]) == 0
    runs = tmp_path / "runs.json"
    runs.write_text(capsys.readouterr().out)
    assert len(read_runs(runs)[2**18]) == 40
    assert main(["fit-spread", str(runs), "--algorithm", "ring_allreduce", "--samples", "20",
                 *topology]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# size (B)") and out[-1].startswith("# fitted: --message-delay")
    errors = [float(cell.rstrip("%")) for line in out[1:3] for cell in line.split()
              if cell.endswith("%")]
    assert len(errors) == 4 and max(map(abs, errors)) < 15
    assert main(["fit-spread", str(runs), "--algorithm", "ring_allreduce", "--samples", "2",
                 *topology]) == 2
    assert "--samples must be from 5 to 10000, got 2" in capsys.readouterr().err
    # A typo of a million samples would have run for days without a word.
    assert main(["fit-spread", str(runs), "--algorithm", "ring_allreduce", "--samples",
                 "1000000", *topology]) == 2
    assert "--samples must be from 5 to 10000" in capsys.readouterr().err
    data = json.loads(runs.read_text())
    assert np.isclose(data[0]["time_us"], np.mean(data[0]["spread"]["runs_us"]))
