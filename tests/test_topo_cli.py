"""``simcomm topo list/show`` and ``simcomm bench`` on presets and topology files, with its
``--summary``; mistakes exit 2 with one line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from algorithms import reduce_broadcast_allreduce, ring_allreduce
from simcomm import SizeOnly, simulate, switch
from simcomm.cli import main
from simcomm.presets import describe, list_presets, make_preset
from simcomm.topofile import load_topology, parse_topology

SWITCH_FILE = """\
kind = "switch"
ranks = 4
bandwidth = "100GB/s"
latency = "5us"
"""

TWO_BOXES = """\
name = "two-boxes"
gpus = ["a0", "a1", "b0", "b1"]
switches = ["a.sw", "b.sw"]

[defaults]
bandwidth = "50GB/s"
latency = "2us"

[[link]]
src = ["a0", "a1"]
dst = "a.sw"

[[link]]
src = ["b0", "b1"]
dst = "b.sw"

[[link]]
src = "a.sw"
dst = "b.sw"
bandwidth = "10GB/s"
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def switch_file(tmp_path: Path) -> Path:
    path = tmp_path / "box.toml"
    path.write_text(SWITCH_FILE, encoding="utf-8")
    return path


def test_topo_list_names_every_preset_with_its_description(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "topo", "list")
    assert status == 0 and err == ""
    lines = out.splitlines()
    for (name, description), line in zip(list_presets(), lines):
        assert line.split(maxsplit=1) == [name, description]
    assert "ring, fully_connected, switch, hierarchical" in lines[-1]


@pytest.mark.parametrize("spec", ["dgx-a100", "cluster-h100:nodes=3"])
def test_topo_show_preset_is_its_description(capsys: pytest.CaptureFixture[str],
                                             spec: str) -> None:
    status, out, _ = run(capsys, "topo", "show", spec)
    assert status == 0 and out == describe(make_preset(spec)) + "\n"


def test_topo_show_file_and_its_toml(capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    path = tmp_path / "two-boxes.toml"
    path.write_text(TWO_BOXES, encoding="utf-8")
    status, out, _ = run(capsys, "topo", "show", str(path))
    assert status == 0 and out == describe(load_topology(str(path))) + "\n"
    assert "10 GB/s" in out and out.startswith("two-boxes: 4 ranks, 6 nodes")
    status, out, _ = run(capsys, "topo", "show", "--toml", "dgx-h100")
    assert status == 0 and parse_topology(out) == make_preset("dgx-h100")


def test_topo_show_gives_protocol_latencies_where_there_are_some(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "ll-box.toml"
    path.write_text(SWITCH_FILE + 'latency_ll = "1us"\nlaunch_latency = "8us"\n'
                    'launch_latency_ll128 = "12us"\n', encoding="utf-8")
    status, out, _ = run(capsys, "topo", "show", str(path))
    assert status == 0
    # half of each latency on each of a path's two links; LL128 not given: Simple's
    assert "gpuN <-> switch      8 links      100 GB/s     2.5 us  LL 0.5 us  LL128 2.5 us\n" in out
    assert "launch latency per collective: Simple 8 us, LL 8 us, LL128 12 us\n" in out
    status, out, _ = run(capsys, "topo", "show", "dgx-h100")
    # NCCL's tree has hop and launch latencies of its own (hwLat, baseLat)
    assert ("1.7 us  LL 0.3 us  LL128 0.95 us  (tree: Simple 2 us, LL 0.3 us, LL128 0.625 us)\n"
            in out)
    assert ("launch latency per collective: Simple 8.4 us, LL 6.6 us, LL128 14 us "
            "(tree: Simple 8.4 us, LL 6.8 us, LL128 14 us)\n") in out
    assert "channels of rings and trees: 24\n" in out  # NCCL's count on one H100 node
    path.write_text(SWITCH_FILE, encoding="utf-8")
    status, out, _ = run(capsys, "topo", "show", str(path))
    assert status == 0 and " LL" not in out and "launch latency" not in out
    assert "channels" not in out


def test_bench_on_a_preset_times_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "bench", "--algorithm", "ring_allreduce", "--topology",
                         "dgx-a100", "--sizes", "1MiB,64MiB", "--format", "csv")
    assert status == 0
    preset = make_preset("dgx-a100")
    for row, n in zip(csv_rows(out), (2**20, 2**26)):
        expected = simulate(ring_allreduce, [SizeOnly(n // 4)] * 8, preset, record=False)
        assert float(row["time_us"]) == expected.time * 1e6
    # --ranks that agrees with the preset changes nothing
    assert run(capsys, "bench", "--algorithm", "ring_allreduce", "--topology", "dgx-a100",
               "--ranks", "8", "--sizes", "1MiB,64MiB", "--format", "csv")[1] == out
    status, table, _ = run(capsys, "bench", "--algorithm", "ring_allreduce", "--topology",
                           "pcie-a100:gpus=4", "--sizes", "1MiB")
    assert status == 0 and "on 4 ranks, topology pcie-a100:gpus=4" in table.splitlines()[0]


def test_bench_on_a_file_equals_the_same_builder(capsys: pytest.CaptureFixture[str],
                                                 switch_file: Path) -> None:
    common = ["bench", "--algorithm", "alltoall_allreduce", "--sizes", "4KiB,4MiB",
              "--format", "csv"]
    status, from_file, _ = run(capsys, *common, "--topology", str(switch_file))
    assert status == 0
    status, built, _ = run(capsys, *common, "--topology", "switch", "--ranks", "4",
                           "--bandwidth", "100GB/s", "--latency", "5us")
    assert status == 0 and from_file == built and len(csv_rows(built)) == 2


def test_bench_summary_of_the_largest_size(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--algorithm", "reduce_broadcast_allreduce", "--topology", "switch",
            "--ranks", "4", "--bandwidth", "100GB/s", "--latency", "5us",
            "--sizes", "1MiB,4KiB", "--summary"]
    status, out, err = run(capsys, *argv)
    assert status == 0 and err == ""
    lines = out.splitlines()
    start = lines.index("# summary of the largest size, 1048576 B:")
    assert lines[start + 1].startswith("# run: 4 ranks, ")
    # the root's links carry the (p-1) n of the master-GPU pattern
    assert lines[start + 3].split()[1:5] == ["gpu0", "->", "switch", "3MiB"]
    expected = simulate(reduce_broadcast_allreduce, [SizeOnly(2**18)] * 4,
                        switch(4, 1e11, 5e-6), record=False)
    assert f"{expected.time * 1e6:.2f} us" in lines[start + 1]
    status, out, err = run(capsys, *argv, "--format", "csv")
    assert status == 0 and len(csv_rows(out)) == 2  # stdout stays a CSV
    assert err.splitlines()[0] == "# summary of the largest size, 1048576 B:"


BAD = [
    (["topo", "show", "torus"], "unknown topology 'torus'"),
    (["topo", "show", "switch"], "switch is a builder"),
    (["topo", "show", "missing.toml"], "cannot read topology file 'missing.toml'"),
    (["topo", "show", "dgx-a100:nodes=4"], "preset 'dgx-a100' has no parameter 'nodes'"),
    # Capped as the cluster presets are: 100,000 nodes used to hang, 16,386 to be taken.
    (["topo", "show", "fattree-h100:nodes=100000"],
     "preset 'fattree-h100': number of ranks must be at most 131,072, got 800,000"),
    (["topo", "show", "fattree-h100:nodes=16386"],
     "preset 'fattree-h100': number of ranks must be at most 131,072, got 131,088"),
    (["topo", "show", "cluster-h100:nodes=100000,nics=4"],
     "preset 'cluster-h100': number of ranks must be at most 131,072, got 800,000"),
    (["topo"], "required: ACTION"),
    (["bench", "--algorithm", "ring_allreduce", "--topology", "dgx-a100", "--ranks", "4"],
     "--ranks 4 does not match dgx-a100, which has 8 ranks"),
    (["bench", "--algorithm", "ring_allreduce", "--topology", "dgx-a100", "--latency", "1us"],
     "--latency applies only to the builder topologies"),
    (["bench", "--algorithm", "ring_allreduce", "--topology", "FILE",
      "--reduce-bandwidth", "1TB/s"], "--reduce-bandwidth applies only to the builder"),
    (["bench", "--algorithm", "ring_allreduce", "--topology", "switch", "--ranks", "4",
      "--bandwidth", "1GB/s"], "the following arguments are required: --latency"),
    (["bench", "--algorithm", "ring_allreduce", "--topology", "torus"],
     "unknown topology 'torus'"),
    (["bench", "--algorithm", "reduce", "--root", "4", "--topology", "FILE"],
     "--root 4 is not a rank of a world of 4"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_mistakes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], switch_file: Path,
                                       argv: list[str], message: str) -> None:
    argv = [str(switch_file) if arg == "FILE" else arg for arg in argv]
    status, out, err = run(capsys, *argv, *(["--sizes", "1KiB"] if argv[0] == "bench" else []))
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("simcomm: error: ")
    assert message in lines[0]
