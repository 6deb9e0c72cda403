"""A short calibration and validation at world size 2: the fit is usable, the topology file
loads, and the validation report has a row per measured size and a summary per collective.
(Accuracy is the business of benchmarks/calibration.py, not of a test on a shared machine.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms import Recv, Send, Wait
from realcomm.calibrate import BURST, Calibration, combine, fit_line, fit_links
from realcomm.cli import main as realcomm_main
from simcomm import SizeOnly, simulate
from simcomm.cli import main as simcomm_main
from simcomm.topofile import load_topology, parse_topology


def test_fit_recovers_a_line_and_refuses_nonsense() -> None:
    sizes = [16, 1024, 65536, 4 * 2**20]
    fit = fit_line(sizes, [5e-6 + n / 2e9 for n in sizes])
    assert fit.fixed == pytest.approx(5e-6) and fit.rate == pytest.approx(2e9)
    assert fit.median_error < 1e-9
    with pytest.raises(ValueError, match="do not grow"):
        fit_line([16, 1024], [2e-3, 1e-3])
    with pytest.raises(ValueError, match="two different sizes"):
        fit_line([64, 64], [1e-3, 1e-3])


SIZES = (16, 1024, 65536, 2**20, 4 * 2**20)


def loggp_calibration(latency: float, gap: float, bandwidth: float, p: int) -> Calibration:
    """Exact times of a shared medium with these LogGP figures."""
    return Calibration(
        p, "cpu", "median", SIZES,
        exchange=tuple(latency + p * gap + n / bandwidth for n in SIZES),
        pingpong=tuple(latency + gap + n / (p * bandwidth) for n in SIZES),
        stream=tuple(latency / BURST + gap + n / (p * bandwidth) for n in SIZES),
        reduction=tuple(1e-6 + n / 10e9 for n in SIZES), concurrent_ratio=None)


@given(latency=st.floats(0, 1e-3), gap=st.floats(0, 1e-3), bandwidth=st.floats(1e8, 1e11),
       p=st.integers(2, 8))
@example(latency=150e-6, gap=100e-6, bandwidth=1.5e9, p=2)
def test_fit_links_recovers_loggp_figures_of_a_shared_medium(latency, gap, bandwidth, p
                                                             ) -> None:
    calibration = loggp_calibration(latency, gap, bandwidth, p)
    fit = fit_links(SIZES, calibration.exchange, calibration.pingpong, calibration.stream, p,
                    shared=True)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert fit.latency == pytest.approx(latency, rel=1e-6, abs=1e-12)
    assert fit.gap == pytest.approx(gap, rel=1e-6, abs=1e-12)
    assert all(largest < 1e-6 for _, largest in fit.errors.values())


def test_the_fitted_topology_simulates_what_was_measured() -> None:
    # The topology file's shared medium must give back the measured ring step and one-way
    # message: the engine's gap and the fit's LogGP terms must agree.
    calibration = loggp_calibration(150e-6, 100e-6, 1.5e9, 2)
    assert calibration.shared_medium
    topology = parse_topology(calibration.topology_toml())
    n = 4 * 2**20

    def ring_step(comm, x):
        sent = yield Send((comm.rank + 1) % comm.size, x)
        yield Wait(sent, (yield Recv((comm.rank - 1) % comm.size, SizeOnly(n // 4))))

    def one_way(comm, x):
        yield Wait((yield Send(1, x)) if comm.rank == 0 else (yield Recv(0, x)))

    buffers = [SizeOnly(n // 4)] * 2
    assert simulate(ring_step, buffers, topology).time == pytest.approx(calibration.exchange[-1])
    assert simulate(one_way, buffers, topology).time == pytest.approx(calibration.pingpong[-1])


def test_combine_takes_the_median_per_size() -> None:
    runs = [loggp_calibration(latency, 100e-6, 1.5e9, 2) for latency in (1e-4, 9e-4, 2e-4)]
    combined = combine(runs)
    assert combined.exchange == runs[2].exchange
    with pytest.raises(ValueError, match="share world size"):
        combine([runs[0], loggp_calibration(1e-4, 1e-4, 1.5e9, 4)])


def test_calibrate_then_validate(tmp_path, capsys, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    topology_file = tmp_path / "calibrated.toml"
    # Sizes far apart, so that the time grows with size however noisy the machine is.
    code = realcomm_main(["calibrate", "--nprocs", "2", "--out", str(topology_file),
                          "--sizes", "4KiB,1MiB,4MiB", "-n", "3", "--timing", "median",
                          "--rounds", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
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


@pytest.mark.parametrize(("args", "message"), [
    (["--nprocs", "1"], "--nprocs must be >= 2"),
    (["--nprocs", "2", "--rounds", "0"], "--rounds must be >= 1"),
    (["--nprocs", "2", "-n", "0"], "--iters must be >= 1"),
    (["--nprocs", "2", "--timing", "mode"], "argument --timing: invalid choice"),
])
def test_calibrate_mistakes_are_one_line(args, message, tmp_path, capsys, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert realcomm_main(["calibrate", "--out", str(tmp_path / "t.toml"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "t.toml").exists()


def test_validate_mistakes_are_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("size,time\n1,2\n")
    assert simcomm_main(["validate", "--topology", "dgx-a100",
                         "--measured", f"ring_allreduce={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected the bench CSV header" in err
    assert simcomm_main(["validate", "--topology", "dgx-a100", "--measured", "nofile"]) == 2
    assert "ALGORITHM=FILE" in capsys.readouterr().err
