"""``realcomm calibrate``: a short measurement at world size 2 with real gloo processes,
written to a measurements file that ``simcomm fit`` turns into a topology file that loads and
validates; combining rounds; and mistakes, an unwritable ``--out`` among them, caught before
anything is measured. (The fits are tested in test_fit.py; accuracy is the business of
benchmarks/calibration.py, not of a test on a shared machine.)"""

from __future__ import annotations

import json
import math

import pytest

from realcomm.calibrate import BURST, Measurements, combine
from realcomm.cli import main as realcomm_main
from simcomm.calibration import parse_calibration
from simcomm.cli import main as simcomm_main
from simcomm.topofile import load_topology

SIZES = (16, 1024, 65536, 2**20, 4 * 2**20)


def measured(latency: float, world_size: int = 2) -> Measurements:
    """Made-up measurements: a ring step and a lone message of ``latency`` plus 1 GB/s."""
    return Measurements(
        world_size, "cpu", "median", SIZES,
        exchange=tuple(latency + n / 1e9 for n in SIZES),
        pingpong=tuple(latency + n / 2e9 for n in SIZES),
        stream=tuple(latency / BURST + n / 2e9 for n in SIZES),
        reduction=tuple(1e-6 + n / 10e9 for n in SIZES), concurrent_ratio=None)


def test_combine_takes_the_median_per_size() -> None:
    runs = [measured(latency) for latency in (1e-4, 9e-4, 2e-4)]
    combined = combine(runs)
    assert combined.exchange == runs[2].exchange
    with pytest.raises(ValueError, match="share world size"):
        combine([runs[0], measured(1e-4, world_size=4)])


def test_the_measurements_file_is_what_simcomm_reads() -> None:
    measurements = measured(1e-4)
    data = json.loads(measurements.to_json())
    assert data["format"] == {"name": "realcomm-calibration", "version": 1}
    calibration = parse_calibration(measurements.to_json())
    assert (calibration.sizes, calibration.exchange, calibration.pingpong, calibration.stream,
            calibration.reduction, calibration.burst) == (
        measurements.sizes, measurements.exchange, measurements.pingpong, measurements.stream,
        measurements.reduction, BURST)


def test_calibrate_fit_then_validate(tmp_path, capfd, monkeypatch) -> None:
    # capfd: realcomm bench's rank 0, a process of its own, prints the rows
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    measurements_file = tmp_path / "cal.json"
    topology_file = tmp_path / "calibrated.toml"
    # Sizes far apart, so that the time grows with size however noisy the machine is.
    code = realcomm_main(["calibrate", "--nprocs", "2", "--out", str(measurements_file),
                          "--sizes", "4KiB,1MiB,4MiB", "-n", "3", "--timing", "median",
                          "--rounds", "2"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert out.startswith("  size (B)  exchange ping-pong")
    assert f"wrote {measurements_file}" in out
    assert json.loads(measurements_file.read_text())["sizes_bytes"] == [4096, 2**20, 4 * 2**20]
    assert simcomm_main(["fit", str(measurements_file), "--out", str(topology_file)]) == 0
    out, err = capfd.readouterr()
    assert "links: L" in out and f"wrote {topology_file}" in out
    topology = load_topology(topology_file)
    assert topology.size == 2
    # Full-duplex (a link each way) or a shared medium (feeder links of infinite bandwidth
    # into one link): either way every route has a finite, positive bottleneck.
    for src, dst in ((0, 1), (1, 0)):
        route = [topology.links[i] for i in topology.route(src, dst)]
        assert 0 < min(link.bandwidth for link in route) < math.inf
        assert all(math.isfinite(link.latency) and link.latency >= 0 for link in route)
    assert all(math.isfinite(r) and r > 0 for r in topology.reduce_bandwidth)

    measured = {}
    for algorithm in ("ring_allreduce", "all_gather"):
        code = realcomm_main(["bench", "--nprocs", "2", "--algorithm", algorithm, "--sizes",
                              "4KiB,64KiB", "--format", "csv", "-w", "1", "-n", "3",
                              "--timing", "median"])
        out, err = capfd.readouterr()
        assert code == 0, err
        measured[algorithm] = tmp_path / f"{algorithm}.csv"
        measured[algorithm].write_text(out)
    assert simcomm_main(["validate", "--topology", str(topology_file),
                         *[f"--measured={name}={path}" for name, path in measured.items()]]) == 0
    report = capfd.readouterr().out.splitlines()
    rows = [line for line in report if line.split()[:1] in (["ring_allreduce"], ["all_gather"])]
    assert len(rows) == 4 + 2  # two sizes each, then one summary line each
    assert "median |err|" in "\n".join(report)


@pytest.mark.parametrize(("args", "message"), [
    (["--nprocs", "1"], "--nprocs must be >= 2"),
    (["--nprocs", "2", "--rounds", "0"], "--rounds must be >= 1"),
    (["--nprocs", "2", "-n", "0"], "--iters must be >= 1"),
    (["--nprocs", "2", "--timing", "mode"], "argument --timing: invalid choice"),
    # Checked in the spawned processes, after they had started.
    (["--nprocs", "2", "--sizes", "6B"], "give at least two sizes, multiples of 4 bytes"),
])
def test_calibrate_mistakes_are_one_line(args, message, tmp_path, capsys, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert realcomm_main(["calibrate", "--out", str(tmp_path / "cal.json"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "cal.json").exists()


@pytest.mark.parametrize(("out", "message"), [
    ("{file}/cal.json", "argument --out: {file} is not a folder"),
    ("{tmp}/missing/cal.json", "argument --out: folder {tmp}/missing does not exist"),
    ("{tmp}", "argument --out: {tmp} is a folder, not a file"),
])
def test_an_unwritable_out_fails_before_measuring(out, message, tmp_path, capsys, monkeypatch
                                                  ) -> None:
    # The file used to be opened only after the whole measurement, which then ended in a
    # traceback.
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    file = tmp_path / "file"
    file.write_text("")
    out, message = (text.format(file=file, tmp=tmp_path) for text in (out, message))
    assert realcomm_main(["calibrate", "--nprocs", "2", "--sizes", "4KiB,8KiB", "-n", "1",
                          "--out", out]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"realcomm: error: {message} (see realcomm calibrate --help)\n"


def test_validate_mistakes_are_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("size,time\n1,2\n")
    assert simcomm_main(["validate", "--topology", "dgx-a100",
                         "--measured", f"ring_allreduce={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected the bench CSV header" in err
    assert simcomm_main(["validate", "--topology", "dgx-a100", "--measured", "nofile"]) == 2
    assert "ALGORITHM=FILE" in capsys.readouterr().err
