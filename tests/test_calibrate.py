"""A short calibration and validation at world size 2: the fit is usable, the topology file
loads, and the validation report has a row per measured size and a summary per collective.
(Accuracy is the business of benchmarks/calibration.py, not of a test on a shared machine.)"""

from __future__ import annotations

import math

import pytest

from realcomm.calibrate import fit_line
from realcomm.cli import main as realcomm_main
from simcomm.cli import main as simcomm_main
from simcomm.topofile import load_topology


def test_fit_recovers_a_line_and_refuses_nonsense() -> None:
    sizes = [16, 1024, 65536, 4 * 2**20]
    fit = fit_line(sizes, [5e-6 + n / 2e9 for n in sizes])
    assert fit.fixed == pytest.approx(5e-6) and fit.rate == pytest.approx(2e9)
    assert fit.median_error < 1e-9
    with pytest.raises(ValueError, match="do not grow"):
        fit_line([16, 1024], [2e-3, 1e-3])
    with pytest.raises(ValueError, match="two different sizes"):
        fit_line([64, 64], [1e-3, 1e-3])


def test_calibrate_then_validate(tmp_path, capsys, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    topology_file = tmp_path / "calibrated.toml"
    # Sizes far apart, so that the time grows with size however noisy the machine is.
    code = realcomm_main(["calibrate", "--nprocs", "2", "--out", str(topology_file),
                          "--sizes", "4KiB,1MiB,4MiB", "-n", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "link: alpha" in out and f"wrote {topology_file}" in out
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
                              "4KiB,64KiB", "--format", "csv", "-w", "1", "-n", "3"])
        out, err = capsys.readouterr()
        assert code == 0, err
        measured[algorithm] = tmp_path / f"{algorithm}.csv"
        measured[algorithm].write_text(out)
    assert simcomm_main(["validate", "--topology", str(topology_file),
                         *[f"--measured={name}={path}" for name, path in measured.items()]]) == 0
    report = capsys.readouterr().out.splitlines()
    rows = [line for line in report if line.split()[:1] in (["ring_allreduce"], ["all_gather"])]
    assert len(rows) == 4 + 2  # two sizes each, then one summary line each
    assert "median |err|" in "\n".join(report)


def test_validate_mistakes_are_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("size,time\n1,2\n")
    assert simcomm_main(["validate", "--topology", "dgx-a100",
                         "--measured", f"ring_allreduce={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected the bench CSV header" in err
    assert simcomm_main(["validate", "--topology", "dgx-a100", "--measured", "nofile"]) == 2
    assert "ALGORITHM=FILE" in capsys.readouterr().err
