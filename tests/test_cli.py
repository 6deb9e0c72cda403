"""``simcomm bench``: its output against the alpha-beta closed forms, the data check, and its
errors (one line on stderr, status 2, no traceback)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from algorithms.harness.bench import CSV_HEADER
from simcomm.cli import main

ALPHA = 5e-6  # seconds
B = 1e11  # link bandwidth, bytes/second
R = 4e10  # reduction bandwidth, bytes/second
LINKS = ["--bandwidth", "100GB/s", "--latency", "5us", "--reduce-bandwidth", "40GB/s"]


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, str]]:
    """Run ``simcomm bench ... --format csv`` in-process; return its rows."""
    assert main(["bench", *argv, "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == CSV_HEADER
    return list(csv.DictReader(io.StringIO(out)))


def ring_allreduce_time(p: int, n: int) -> float:
    return 2 * (p - 1) * (ALPHA + n / (p * B)) + (p - 1) * (n / p) / R


def reduce_broadcast_time(p: int, n: int) -> float:
    return 2 * (ALPHA + n / B) + (p - 1) * n / R


def alltoall_allreduce_time(p: int, n: int) -> float:
    # Ranks other than 0 keep their part aside (a copy) while the buffers cross.
    return max(n / R, ALPHA + n / B) + (p - 1) * n / R


@pytest.mark.parametrize("algorithm, topology, closed_form", [
    ("ring_allreduce", "ring", ring_allreduce_time),
    ("ring_allreduce", "fully_connected", ring_allreduce_time),
    ("reduce_broadcast_allreduce", "fully_connected", reduce_broadcast_time),
    ("alltoall_allreduce", "fully_connected", alltoall_allreduce_time),
])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_times_match_closed_forms(capsys: pytest.CaptureFixture[str], algorithm: str,
                                  topology: str, closed_form, p: int) -> None:
    sizes = [4 * p, 4 * p * 1000, 4 * p * 2**18]  # float32 counts divisible by p
    rows = bench(capsys, "--algorithm", algorithm, "--ranks", str(p), "--topology", topology,
                 *LINKS, "--sizes", ",".join(map(str, sizes)))
    assert [int(row["size"]) for row in rows] == sizes
    for row, n in zip(rows, sizes):
        assert float(row["time_us"]) == pytest.approx(closed_form(p, n) * 1e6, rel=1e-12)
        assert float(row["algbw_GBps"]) == pytest.approx(n / closed_form(p, n) / 1e9,
                                                         rel=1e-12)
        assert float(row["busbw_GBps"]) == pytest.approx(
            float(row["algbw_GBps"]) * 2 * (p - 1) / p, rel=1e-12)
        assert (row["type"], row["redop"], row["root"], row["wrong"]) == (
            "float", "sum", "-1", "N/A")


def test_example_command_csv_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--algorithm", "ring_allreduce", "--ranks", "8", "--topology", "ring",
            "--bandwidth", "100GB/s", "--latency", "5us", "--reduce-bandwidth", "inf",
            "--sizes", "1KiB,1MiB,1GiB"]
    assert main(argv + ["--format", "csv"]) == 0
    first = capsys.readouterr().out.splitlines()[1].split(",")
    assert first[:5] + first[-1:] == ["1024", "256", "float", "sum", "-1", "N/A"]
    assert float(first[5]) == pytest.approx(2 * 7 * (5 + 1024 / 8 / 1e5), rel=1e-12)
    assert main(argv) == 0  # table by default
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[1:] == ["size", "count", "type", "redop", "root", "time",
                                    "algbw", "busbw", "#wrong"]
    assert lines[-4].split() == ["1073741824", "268435456", "float", "sum", "-1", "18860",
                                 "56.93", "99.63", "N/A"]
    assert lines[-1] == "#" and lines[-2].startswith("# Avg bus bandwidth    : ")


def test_sizes_from_min_max_factor(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench(capsys, "--algorithm", "all_gather", "--ranks", "4", "--topology", "switch",
                 *LINKS, "-b", "1K", "-e", "64K", "-f", "4", "--dtype", "double")
    assert [int(row["size"]) for row in rows] == [1024, 4096, 16384, 65536]
    assert [int(row["count"]) for row in rows] == [32, 128, 512, 2048]  # per rank
    for row in rows:
        assert (row["type"], row["redop"], row["root"]) == ("double", "none", "-1")
        assert float(row["busbw_GBps"]) == pytest.approx(
            float(row["algbw_GBps"]) * 3 / 4, rel=1e-12)


def test_json_and_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--algorithm", "broadcast", "--root", "2", "--ranks", "3",
                 "--topology", "fully_connected", *LINKS, "--sizes", "8KB",
                 "--format", "json", "--check"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["size"], row["count"], row["root"], row["redop"], row["wrong"]) == (
        8000, 2000, 2, "none", 0)
    # flat broadcast on a mesh: every copy leaves the root at once on its own link
    assert row["time_us"] == pytest.approx((ALPHA + 8000 / B) * 1e6, rel=1e-12)
    assert row["busbw_GBps"] == row["algbw_GBps"]


CHECK_CASES = [
    ("ring_allreduce", []), ("reduce_broadcast_allreduce", []),
    ("reduce_broadcast_allreduce", ["--param", "tree=true", "--param", "root=2"]),
    ("alltoall_allreduce", []), ("alltoall_allreduce", ["--param", "chunked=true"]),
    ("reduce_scatter", []), ("all_gather", []), ("all_to_all", []),
    ("broadcast", ["--root", "2"]), ("broadcast", ["--param", "tree=true", "--root", "1"]),
    ("reduce", ["--root", "2"]), ("reduce", ["--param", "tree=true", "--root", "1"]),
]
TYPED_OPS = {  # dtype and op per rank count, so each reduction meets several of each
    3: ["--dtype", "half", "--op", "prod"],
    5: ["--dtype", "int32", "--op", "avg"],
    7: ["--dtype", "double", "--op", "min"],
}


@pytest.mark.parametrize("algorithm, extra", CHECK_CASES)
@pytest.mark.parametrize("p", sorted(TYPED_OPS))
def test_check_finds_no_wrong_element(capsys: pytest.CaptureFixture[str], algorithm: str,
                                      extra: list[str], p: int) -> None:
    typed = TYPED_OPS[p]
    if algorithm in ("all_gather", "all_to_all", "broadcast"):
        typed = typed[:2]  # no reduction: no --op
    rows = bench(capsys, "--algorithm", algorithm, "--ranks", str(p), "--topology",
                 "fully_connected", *LINKS, "--check", "--sizes", "0,8,24,1000", *typed, *extra)
    assert [row["wrong"] for row in rows] == ["0"] * 4


def test_hierarchical_and_sum_check(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench(capsys, "--algorithm", "ring_allreduce", "--ranks", "6", "--topology",
                 "hierarchical", "--gpus-per-node", "3", "--inter-bandwidth", "25GB/s",
                 "--inter-latency", "10us", *LINKS, "--check", "--sizes", "4KiB")
    assert rows[0]["wrong"] == "0"
    # the ring crosses the network between nodes, so it is slower than the intra-node figures
    assert float(rows[0]["time_us"]) > ring_allreduce_time(6, 4096) * 1e6


def test_size_only_buffers_allocate_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # 64 ranks x 1 TiB would not fit in memory if the buffers held data
    rows = bench(capsys, "--algorithm", "reduce_scatter", "--ranks", "64", "--topology",
                 "switch", *LINKS, "--sizes", "1TiB")
    assert int(rows[0]["size"]) == 2**40 and rows[0]["wrong"] == "N/A"


BAD_ARGS = [
    (["--algorithm", "ring_alreduce"], "unknown algorithm 'ring_alreduce'; known:"),
    (["--algorithm", "ring_allreduce", "--bandwidth", "100GBs"], "--bandwidth: unknown"),
    (["--algorithm", "ring_allreduce", "--latency", "5parsecs"], "--latency: unknown"),
    (["--algorithm", "ring_allreduce", "--sizes", "1KiBB"], "unknown size unit"),
    (["--algorithm", "ring_allreduce", "--ranks", "-4"], "--ranks must be >= 1, got -4"),
    (["--algorithm", "ring_allreduce", "--ranks", "four"], "invalid int value: 'four'"),
    (["--algorithm", "ring_allreduce", "--param", "chunked=true"], "has no such parameter"),
    (["--algorithm", "ring_allreduce", "--topology", "hierarchical", "--ranks", "12",
      "--gpus-per-node", "8"], "12 ranks do not fill nodes of 8 GPUs"),
    (["--algorithm", "ring_allreduce", "--topology", "torus"], "unknown topology 'torus'"),
    (["--algorithm", "ring_allreduce", "--gpus-per-node", "2"], "applies only to"),
    (["--algorithm", "reduce", "--root", "8"], "--root 8 is not a rank of a world of 8"),
    (["--algorithm", "all_to_all", "--op", "max"], "all_to_all does not reduce"),
    (["--algorithm", "ring_allreduce", "--dtype", "float", "--sizes", "6"], "not a multiple"),
    (["--algorithm", "ring_allreduce", "--frobnicate"], "unrecognized arguments"),
    (["--algorithm", "ring_allreduce", "--sizes", "1e20"], "1e20 B is too large"
     .replace("1e20", str(10**20))),
    (["--algorithm", "ring_allreduce", "--sizes", "1KiB,,2KiB"], "item 2 is empty"),
    (["--algorithm", "ring_allreduce", "--sizes", "1KiB,"], "item 2 is empty"),
    (["--algorithm", "ring_allreduce", "--ranks", "100000000"],
     "number of ranks must be at most 131,072, got 100,000,000"),
    (["--algorithm", "ring_allreduce", "--trace", "no/such/folder/run.json"],
     "argument --trace: folder no/such/folder does not exist"),
    (["--algorithm", "ring_allreduce", "--timeline", "no/such/folder/run.png"],
     "argument --timeline: folder no/such/folder does not exist"),
    (["--algorithm", "ring_allreduce", "--trace", "."], "argument --trace: . is a folder"),
]


@pytest.mark.parametrize("argv, message", BAD_ARGS)
def test_bad_arguments_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    defaults = {"--ranks": "8", "--topology": "ring", "--bandwidth": "100GB/s",
                "--latency": "5us", "--sizes": "1KiB"}
    full = ["bench", *argv]
    for flag, value in defaults.items():
        if flag not in argv:
            full += [flag, value]
    assert main(full) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("simcomm: error: ")
    assert message in lines[0]


def test_missing_subcommand_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["bench", "--algorithm", "ring_allreduce"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("simcomm: error: ") for line in lines)
    assert "--ranks, --topology, --bandwidth, --latency" in lines[1]


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simcomm", *argv], capture_output=True,
                          text=True, timeout=60)


def test_python_dash_m_entry_point() -> None:
    done = run_module("bench", "--algorithm", "alltoall_allreduce", "--ranks", "4",
                      "--topology", "fully_connected", *LINKS, "--sizes", "4KiB",
                      "--format", "csv")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header == CSV_HEADER
    assert float(row.split(",")[5]) == pytest.approx(
        alltoall_allreduce_time(4, 4096) * 1e6, rel=1e-12)
    failed = run_module("bench", "--algorithm", "ring_allreduce", "--ranks", "0",
                        "--topology", "ring", "--bandwidth", "1GB/s", "--latency", "1us")
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr == "simcomm: error: --ranks must be >= 1, got 0\n"
