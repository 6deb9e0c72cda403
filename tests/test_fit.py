"""``simcomm fit`` and ``simcomm.calibration``: the fits recover the figures that made the
measurements, the fitted topology simulates what was measured, and a measurements file that
cannot be read is one line on stderr with status 2."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms import Recv, Send, Wait
from simcomm import SizeOnly, simulate
from simcomm.calibration import (
    FORMAT_NAME, FORMAT_VERSION, Calibration, CalibrationFileError, fit_line, fit_links,
    parse_calibration,
)
from simcomm.cli import main
from simcomm.topofile import load_topology, parse_topology

SIZES = (16, 1024, 65536, 2**20, 4 * 2**20)
BURST = 8


def test_fit_recovers_a_line_and_refuses_nonsense() -> None:
    sizes = [16, 1024, 65536, 4 * 2**20]
    fit = fit_line(sizes, [5e-6 + n / 2e9 for n in sizes])
    assert fit.fixed == pytest.approx(5e-6) and fit.rate == pytest.approx(2e9)
    assert fit.median_error < 1e-9
    with pytest.raises(ValueError, match="do not grow"):
        fit_line([16, 1024], [2e-3, 1e-3])
    with pytest.raises(ValueError, match="two different sizes"):
        fit_line([64, 64], [1e-3, 1e-3])


def loggp_calibration(latency: float, gap: float, bandwidth: float, p: int) -> Calibration:
    """Exact times of a shared medium with these LogGP figures."""
    return Calibration(
        p, "cpu", "median", BURST, SIZES,
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
                    shared=True, burst=BURST)
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


def measurements(calibration: Calibration) -> dict:
    """The measurements file of ``calibration``, as a JSON object."""
    return {
        "format": {"name": FORMAT_NAME, "version": FORMAT_VERSION},
        "world_size": calibration.world_size, "device": calibration.device,
        "timing": calibration.timing, "burst": calibration.burst,
        "sizes_bytes": list(calibration.sizes),
        "exchange_seconds": list(calibration.exchange),
        "pingpong_seconds": list(calibration.pingpong),
        "stream_seconds": list(calibration.stream),
        "reduction_seconds": list(calibration.reduction),
        "concurrent_ratio": calibration.concurrent_ratio,
    }


def test_parse_reads_back_every_measurement() -> None:
    calibration = loggp_calibration(150e-6, 100e-6, 1.5e9, 4)
    assert parse_calibration(json.dumps(measurements(calibration))) == calibration


def test_fit_prints_the_table_and_writes_a_topology(tmp_path, capsys) -> None:
    calibration = loggp_calibration(150e-6, 100e-6, 1.5e9, 2)
    source, out = tmp_path / "cal.json", tmp_path / "cal.toml"
    source.write_text(json.dumps(measurements(calibration)))
    assert main(["fit", str(source), "--out", str(out), "--name", "lab"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("  size (B)  exchange       fit")
    assert "links: L 150.00 us, g 100.00 us a message, B 1.500 GB/s a rank" in printed
    assert printed.endswith(f"wrote {out} (simcomm topo show {out})\n")
    topology = load_topology(out)
    assert topology == calibration.topology("lab")
    assert all(math.isfinite(r) for r in topology.reduce_bandwidth)


def _broken(change) -> str:
    data = measurements(loggp_calibration(150e-6, 100e-6, 1.5e9, 2))
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON: Expecting property name"),
    ("[1, 2]", "must be a JSON object, got list"),
    # json recurses per level: this used to end in a RecursionError's traceback.
    ("[" * 100_000 + "]" * 100_000, "arrays or objects nested too deep to read"),
    (_broken(lambda d: d.pop("format")), "format: not a measurements file of realcomm "
                                         "calibrate"),
    (_broken(lambda d: d["format"].update(name="other")), "not a measurements file"),
    (_broken(lambda d: d["format"].update(version=2)), "version 2 is not one this simcomm "
                                                       "reads (it reads version 1)"),
    (_broken(lambda d: d.pop("stream_seconds")), "missing keys: stream_seconds"),
    (_broken(lambda d: d.update(extra=1)), "unknown keys: extra"),
    (_broken(lambda d: d.update(world_size=1)), "world_size: must be an integer >= 2, got 1"),
    (_broken(lambda d: d.update(world_size=10**8)),
     "world_size: must be at most 131,072 ranks, got 100,000,000"),
    (_broken(lambda d: d.update(burst=True)), "burst: must be an integer >= 1, got true"),
    (_broken(lambda d: d.update(device="")), "device: must be a non-empty string"),
    (_broken(lambda d: d["sizes_bytes"].__setitem__(1, 1.5)),
     "sizes_bytes[1]: must be an integer >= 1, got 1.5"),
    (_broken(lambda d: d.update(sizes_bytes=[64] * 5)), "at least two different sizes"),
    (_broken(lambda d: d.update(sizes_bytes=[1, 10**30, 10**40, 2**63, 2**64])),
     f"sizes_bytes[1]: {10**30} B is too large; at most {2**63 - 1} B"),
    (_broken(lambda d: d["exchange_seconds"].pop()), "exchange_seconds: has 4 values for 5 "
                                                     "sizes"),
    (_broken(lambda d: d["pingpong_seconds"].__setitem__(2, -1e-6)),
     "pingpong_seconds[2]: must be a finite number > 0, got -1e-06"),
    (_broken(lambda d: d["reduction_seconds"].__setitem__(0, math.inf)),
     "reduction_seconds[0]: must be a finite number > 0, got Infinity"),
    (_broken(lambda d: d["stream_seconds"].__setitem__(0, "1us")),
     "stream_seconds[0]: must be a finite number > 0, got \"1us\""),
    (_broken(lambda d: d.update(concurrent_ratio=0)), "concurrent_ratio: must be a finite "
                                                      "number > 0, got 0"),
])
def test_a_bad_measurements_file_is_one_line(text, message, tmp_path, capsys) -> None:
    with pytest.raises(CalibrationFileError):
        parse_calibration(text)
    source = tmp_path / "cal.json"
    source.write_text(text)
    assert main(["fit", str(source), "--out", str(tmp_path / "cal.toml")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"simcomm: error: {source}: ") and message in err
    assert not (tmp_path / "cal.toml").exists()


def test_fit_refuses_a_full_mesh_too_large_to_simulate_before_printing(tmp_path,
                                                                        capsys) -> None:
    # Full-duplex measurements (an exchange as fast as a lone message) on 1,001 ranks: a
    # link each way between every pair would be 1,001,000 links.
    one_way = tuple(50e-6 + n / 1e9 for n in SIZES)
    calibration = Calibration(1001, "cpu", "median", BURST, SIZES, one_way, one_way, one_way,
                              tuple(1e-6 + n / 10e9 for n in SIZES), None)
    source = tmp_path / "cal.json"
    source.write_text(json.dumps(measurements(calibration)))
    assert main(["fit", str(source), "--out", str(tmp_path / "cal.toml")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "simcomm: error: a fully-connected topology of 1,001 ranks has 1,001,000 links, more "
        "than the 1,000,000 simulated in reasonable time: use a switch topology for this many "
        "ranks\n")


def test_fit_mistakes_are_one_line(tmp_path, capsys) -> None:
    source = tmp_path / "cal.json"
    assert main(["fit", str(source), "--out", str(tmp_path / "cal.toml")]) == 2
    assert f"cannot read measurements file {str(source)!r}" in capsys.readouterr().err
    source.write_text(json.dumps(measurements(loggp_calibration(150e-6, 100e-6, 1.5e9, 2))))
    assert main(["fit", str(source), "--out", str(tmp_path / "cal.toml"), "--name", ""]) == 2
    assert "--name must be a non-empty line of text" in capsys.readouterr().err
    assert main(["fit", str(source), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simcomm: error: ") and err.count("\n") == 1
    assert main(["fit", str(source)]) == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err
