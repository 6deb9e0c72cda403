"""``simcomm bench``: its output against the alpha-beta closed forms, the data check, and its
errors (one line on stderr, status 2, no traceback)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.harness.bench import CSV_HEADER
from algorithms.harness.cli import run_command
from simcomm.bench import HOST_SECONDS_PER_CHANNEL, host_floor_seconds
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
    assert lines[4].split()[1:] == ["size", "count", "type", "redop", "root", "time",
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
    # Used to build 10^10 links, and to re-run a size of 2 million messages, for hours.
    (["--algorithm", "ring_allreduce", "--topology", "fully_connected", "--ranks", "100000"],
     "a fully-connected topology of 100,000 ranks has 9,999,900,000 links, more than the "
     "1,000,000 simulated in reasonable time: use a switch topology for this many ranks"),
    (["--algorithm", "ring_allreduce", "--topology", "switch", "--ranks", "1000", "--sizes",
      "1M", "--summary"], "--summary: the largest size, 1048576 B, would be run again with "
                          "every message simulated, 1,998,000 of them, past the 200,000 the "
                          "auto level simulates: leave it out, or give --level message"),
    # Used to grow past 18 GB and run for hours, to end at the op budget.
    (["--algorithm", "nccl_tree_allreduce", "--topology", "switch", "--sizes", "1G",
      "--param", "chunk_bytes=1", "--level", "message"],
     "--level message: 1073741824 B would send 3,758,096,384 messages, past the "
     "300,000,000 ops a run may take (a Send and a Recv each): give --level auto or "
     "collective, or a smaller size"),
    (["--algorithm", "ring_allreduce", "--trace", "no/such/folder/run.json"],
     "argument --trace: folder no/such/folder does not exist"),
    (["--algorithm", "ring_allreduce", "--timeline", "no/such/folder/run.png"],
     "argument --timeline: folder no/such/folder does not exist"),
    (["--algorithm", "ring_allreduce", "--trace", "."], "argument --trace: . is a folder"),
    (["--algorithm", "ring_allreduce", "-t", "2"], "argument -t/--nthreads: threads per "
                                                   "process do not apply"),
    (["--algorithm", "ring_allreduce", "-g", "3"], "-g/--ngpus 3: the GPUs one process "
                                                   "drives must be a whole share of the 8 ranks"),
    (["--algorithm", "ring_allreduce", "-g", "0"], "-g/--ngpus 0: the GPUs one process"),
    (["--algorithm", "ring_allreduce", "-G", "1"], "argument -G/--cudagraph: CUDA graphs do "
                                                   "not apply"),
    (["--algorithm", "ring_allreduce", "-z", "1"], "argument -z/--blocking: nccl-tests' "
                                                   "blocking mode"),
    (["--algorithm", "ring_allreduce", "-m", "4"], "argument -m/--agg_iters: aggregated "
                                                   "iterations"),
    (["--algorithm", "ring_allreduce", "-T", "30"], "argument -T/--timeout: a simulated run "
                                                    "cannot hang"),
    (["--algorithm", "ring_allreduce", "-F", "out.csv"], "argument -F/--output_file: "
                                                         "nccl-tests' CSV layout"),
    (["--algorithm", "ring_allreduce", "-c", "3"], "argument -c/--check: takes 0 (off) or 1"),
    (["--algorithm", "ring_allreduce", "-o", "mulsum"], "--op mulsum: NCCL's pre-multiplied "
                                                        "sum is not one of the reductions"),
    (["--algorithm", "ring_allreduce", "-n", "0"], "-n/--iters must be >= 1, got 0"),
    (["--algorithm", "ring_allreduce", "-w", "-1"], "-w/--warmup_iters must be >= 0, got -1"),
    (["--algorithm", "ring_allreduce", "-a", "4"], "argument -a/--average: invalid choice: 4"),
    (["--algorithm", "ring_allreduce", "--sizes", "1KiB,1Mb"],
     "size '1Mb' is ambiguous: a small b means bits, as in rates (Gb/s); write 1MB for 10^6 "
     "bytes, or 1M or 1MiB for 2^20 bytes"),
    (["--algorithm", "ring_allreduce", "--sizes", "64Kb"], "size '64Kb' is ambiguous"),
    (["--algorithm", "ring_allreduce", "--kind", "gather"], "unknown --kind 'gather'"),
    (["--algorithm", "no_such_module:f"], "--algorithm 'no_such_module:f': no module named "
                                          "'no_such_module'"),
    # Values only the algorithm can judge: refused before the header is printed.
    (["--algorithm", "nccl_allreduce", "--param", "protocol=ll256"],
     "unknown protocol 'll256'; known: simple, ll, ll128"),
    (["--algorithm", "nccl_allreduce", "--param", "channels=65"], "channels must be"),
    # A second entry used to multiply the first (--link-speed) or replace it, unseen.
    (["--algorithm", "ring_allreduce", "--topology", "switch", "--link-speed",
      "gpu0:switch=0.5,switch:gpu0=0.7"],
     "--link-speed: 'switch:gpu0=0.7': the links between switch and gpu0 are given twice"),
    # The factor's rule, where these used to say "is not SRC:DST=FACTOR".
    (["--algorithm", "ring_allreduce", "--topology", "switch", "--link-speed", "gpu0:switch=0"],
     "--link-speed: 'gpu0:switch=0': the factor must be a finite number > 0"),
    (["--algorithm", "ring_allreduce", "--topology", "switch", "--link-speed",
      "gpu0:switch=nan"], "--link-speed: 'gpu0:switch=nan': the factor must be a finite"),
    (["--algorithm", "ring_allreduce", "--compute-speed", "3=inf"],
     "--compute-speed: '3=inf': the factor must be a finite number > 0"),
    (["--algorithm", "ring_allreduce", "--compute-speed", "3=0.5,3=0.7"],
     "--compute-speed: '3=0.7': rank 3 is given twice"),
    (["--algorithm", "ring_allreduce", "--memory-speed", "3=0.5, 03=0.7"],
     "--memory-speed: '03=0.7': rank 3 is given twice"),
    # A time without a unit used to be read as seconds.
    (["--algorithm", "ring_allreduce", "--latency", "1"],
     "--latency: time '1' has no unit: write 1s, 1ms, 1us or 1ns"),
    (["--algorithm", "ring_allreduce", "--latency", "1e-6"], "--latency: time '1e-6' has no unit"),
    (["--algorithm", "ring_allreduce", "--topology", "hierarchical", "--ranks", "16",
      "--inter-latency", "2"], "--inter-latency: time '2' has no unit"),
    (["--algorithm", "ring_allreduce", "--seed", "-1", "--message-delay", "normal:2us,1us"],
     "--seed must be >= 0, got -1"),
    # A rate that overflows used to run at infinite bandwidth.
    (["--algorithm", "ring_allreduce", "--bandwidth", "1e400GB/s"],
     "--bandwidth: bandwidth '1e400GB/s' is too large: it overflows to infinity"),
    (["--algorithm", "ring_allreduce", "--reduce-bandwidth", "1e400GB/s"],
     "--reduce-bandwidth: bandwidth '1e400GB/s' is too large"),
    (["--algorithm", "ring_allreduce", "--trace", ""],
     "argument --trace: an empty path names no file"),
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
    assert "Traceback" not in captured.err


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


# -- nccl-tests' flags, rows as they come, algorithms of a user's own -------------------

def test_an_nccl_tests_command_line_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # as typed for all_reduce_perf, -g 1 and -w/-n included; -c 1 checks the data
    assert main(["bench", "--algorithm", "ring_allreduce", "--ranks", "4", "--topology",
                 "fully_connected", *LINKS, "-b", "8", "-e", "128", "-f", "4", "-d", "double",
                 "-o", "max", "-c", "1", "-g", "1", "-w", "5", "-n", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "# data check: on (numpy data)"
    assert lines[2] == ("# -w/-n: one run per size; a simulated run is deterministic, so "
                        "every run takes the same time")
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert [row[:5] + row[-1:] for row in rows] == [
        [str(size), str(size // 8), "double", "max", "-1", "0"] for size in (8, 32, 128)]
    assert lines[-3] == "# Out of bounds values : 0 OK"


def test_one_process_driving_several_gpus_takes_their_launches(
        capsys: pytest.CaptureFixture[str]) -> None:
    # nccl-tests' -g: the host launches each GPU's kernel in turn, so a small row takes at
    # least -g launches; a large one is the collective's own time, as with -g 1.
    argv = ["--algorithm", "ring_allreduce", "--ranks", "8", "--topology", "ring",
            "--bandwidth", "100GB/s", "--latency", "1us", "--sizes", "8,64MiB"]
    small, large = bench(capsys, *argv)
    driven_small, driven_large = bench(capsys, *argv, "-g", "8")
    assert float(small["time_us"]) < host_floor_seconds(8) * 1e6
    assert float(driven_small["time_us"]) == pytest.approx(host_floor_seconds(8) * 1e6)
    assert driven_large == large
    assert main(["bench", *argv, "-g", "4"]) == 0
    assert ("# one process drives 4 GPUs (-g): a row takes at least the host's 22.65 us to "
            "launch them on one channel each, 0.16 us more per further channel"
            ) in capsys.readouterr().out.splitlines()


def test_the_host_of_several_gpus_sets_up_every_channel_of_their_kernels(
        capsys: pytest.CaptureFixture[str]) -> None:
    # NCCL's host code prepares each channel of a call for each GPU, so a row spread over
    # NCCL's 24 channels (1 MiB: ring/LL/24) takes the host longer than one on a single
    # channel (8 B: ring/LL/1).
    argv = ["--algorithm", "nccl_allreduce", "--topology", "dgx-h100", "--sizes", "8,1MiB"]
    small, spread = bench(capsys, *argv)
    driven_small, driven_spread = bench(capsys, *argv, "-g", "8")
    assert float(spread["time_us"]) < host_floor_seconds(8, 24) * 1e6
    assert float(driven_small["time_us"]) == pytest.approx(host_floor_seconds(8, 1) * 1e6)
    assert float(driven_spread["time_us"]) == pytest.approx(host_floor_seconds(8, 24) * 1e6)
    assert host_floor_seconds(8, 24) - host_floor_seconds(8, 1) == pytest.approx(
        8 * 23 * HOST_SECONDS_PER_CHANNEL)


def test_every_type_and_op_in_turn(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench(capsys, "--algorithm", "reduce_scatter", "--ranks", "3", "--topology",
                 "ring", *LINKS, "-d", "all", "-o", "all", "-c", "1", "--sizes", "24,48")
    assert [(row["type"], row["redop"], row["size"]) for row in rows] == [
        (dtype, op, size) for dtype in ("int8", "uint8", "int32", "uint32", "int64", "uint64",
                                        "half", "float", "double", "bfloat16")
        for op in ("sum", "prod", "max", "min", "avg") for size in ("24", "48")]
    assert {row["wrong"] for row in rows} == {"0"}


def test_average_picks_which_ranks_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--algorithm", "reduce", "--param", "tree=true", "--ranks", "5", "--topology",
            "fully_connected", *LINKS, "--sizes", "4KiB"]
    times = {}
    for average in ("0", "1", "2", "3"):
        (row,) = bench(capsys, *argv, "-a", average)
        times[average] = float(row["time_us"])
    (default,) = bench(capsys, *argv)
    assert float(default["time_us"]) == times["3"]  # the last rank's finish: the whole run
    assert times["2"] < times["1"] < times["3"]
    assert times["2"] <= times["0"] <= times["3"]


def run_in(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``simcomm`` in ``folder``, which is not on ``sys.path`` but as the command puts it."""
    return subprocess.run([sys.executable, "-P", "-m", "simcomm", *argv], capture_output=True,
                          text=True, timeout=120, cwd=folder)


def test_a_users_algorithm_runs_checked_against_its_kind(user_algorithms: str) -> None:
    done = run_in(Path.cwd(), "bench", "--algorithm", f"{user_algorithms}:my_broadcast",
                  "--kind", "broadcast", "-r", "2", "--ranks", "3", "--topology",
                  "fully_connected", *LINKS, "--sizes", "8KB", "-c", "1", "--format", "json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert (row["size"], row["root"], row["redop"], row["wrong"]) == (8000, 2, "none", 0)
    assert row["busbw_GBps"] == row["algbw_GBps"]  # a broadcast's bus factor, 1


def test_rows_are_printed_as_they_are_done(user_algorithms: str) -> None:
    # small_only refuses more than 256 elements: the rows before it are out, the summary not
    done = run_in(Path.cwd(), "bench", "--algorithm", f"{user_algorithms}:small_only",
                  "--ranks", "4", "--topology", "ring", *LINKS, "-b", "256", "-e", "4K", "-c")
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"# simcomm bench: {user_algorithms}:small_only on 4 ranks")
    assert [line.split()[0] for line in lines if not line.startswith("#")] == ["256", "512",
                                                                               "1024"]
    assert "# Out of bounds" not in done.stdout
    assert done.stderr == ("simcomm: error: small_only takes at most 256 elements, got 512\n")


def test_sweep_takes_a_users_algorithm_and_its_kind(user_algorithms: str) -> None:
    done = run_in(Path.cwd(), "sweep", "--algorithm", f"broadcast,{user_algorithms}:my_broadcast",
                  "--kind", "broadcast", "--sizes", "1KiB,1MiB", "--ranks", "4", "--no-plots",
                  "--jobs", "1", "--out", "out")
    assert done.returncode == 0, done.stderr
    with open("out/sweep.csv", encoding="utf-8") as stream:
        rows = [row for row in csv.DictReader(stream)
                if row["algorithm"] == f"{user_algorithms}:my_broadcast"]
    assert [row["size"] for row in rows] == ["1024", "1048576"]
    for row in rows:  # a broadcast's bus factor is 1 (an all-reduce's on 4 ranks, 1.5)
        assert (row["root"], row["busbw_GBps"]) == ("0", row["algbw_GBps"])
    wrong = run_in(Path.cwd(), "sweep", "--algorithm", f"{user_algorithms}:my_broadcast",
                   "--sizes", "1KiB", "--no-plots", "--out", "out")
    assert wrong.returncode == 2
    assert wrong.stderr.count("\n") == 1 and "allreduce takes op, so my_broadcast" in wrong.stderr


OTHER_BAD_ARGS = [
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--sweep-buckets", ""],
     "--sweep-buckets '' names no bucket cap"),  # used to run no sweep, silently
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--sweep-buckets", ","],
     "--sweep-buckets ',' names no bucket cap"),
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--sweep-buckets", "1MiB,"],
     "--sweep-buckets '1MiB,': item 2 is empty"),
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--sweep-buckets", "1MiBB"],
     "--sweep-buckets: unknown size unit 'MiBB'"),
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--kineto", "no/such/traces"],
     "argument --kineto: folder no/such does not exist"),  # used to be made
    (["fsdp", "--model", "resnet50", "--topology", "dgx-a100", "--kineto", "file"],
     "argument --kineto: file exists and is not a folder"),
    # An empty path used to write nothing (--kineto) or into the working folder (--out).
    (["ddp", "--model", "resnet50", "--topology", "dgx-a100", "--kineto", ""],
     "argument --kineto: an empty path names no folder"),
    (["fsdp", "--model", "resnet50", "--topology", "dgx-a100", "--kineto", ""],
     "argument --kineto: an empty path names no folder"),
    (["plot", "--out", "", "sweep.csv"], "argument --out: an empty path names no folder"),
    (["validate", "--topology", "switch", "--measured", "ring_allreduce=x.csv"],
     "--topology switch is a builder: validate takes a preset or a .toml file"),
    (["tune", "--topology", "dgx-h100", "--collectives", "allreduce,allreduce"],
     "--collectives: allreduce is given twice"),  # its rows were written twice
    (["tune", "--topology", "dgx-h100", "--collectives", ""], "--collectives: '' names nothing"),
    # Sizes past bench's cap used to be estimated, and -b 3 -e 5 was called "each power of
    # two from 3 to 3".
    (["tune", "--topology", "dgx-h100", "-e", "1e30"], "-e/--maxbytes 1e30: "
     "1000000000000000000000000000000 B is too large; at most 9223372036854775807 B"),
    (["tune", "--topology", "dgx-h100", "-b", "3", "-e", "5"],
     "-b/--minbytes 3: 3 B is not a power of two (tune estimates each power of two"),
    (["tune", "--topology", "dgx-h100", "-b", "4", "-e", "5"],
     "-e/--maxbytes 5: 5 B is not a power of two"),
]


@pytest.mark.parametrize("argv, message", OTHER_BAD_ARGS)
def test_other_commands_bad_arguments_exit_2_with_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("file").write_text("")
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("simcomm: error: ")
    assert message in captured.err
    assert not Path("no").exists()


def test_validate_splits_measured_at_the_last_equals_sign(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An algorithm with parameters has an = of its own: the file used to be "ring=FILE".
    rows = bench(capsys, "--algorithm", "nccl_allreduce", "--param", "algorithm=ring",
                 "--topology", "dgx-h100", "--sizes", "1MiB")
    measured = tmp_path / "m.csv"
    measured.write_text(CSV_HEADER + "\n" + ",".join(rows[0].values()) + "\n")
    assert main(["validate", "--topology", "dgx-h100", "--measured",
                 f"nccl_allreduce:algorithm=ring={measured}"]) == 0
    assert "nccl_allreduce:algorithm=ring     1MiB" in capsys.readouterr().out


def test_validate_refuses_a_bench_csv_with_wrong_results_or_a_size_twice(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # As nccl-tests' output is refused for them (tests/test_nccl_tests_output.py).
    row, = bench(capsys, "--algorithm", "nccl_allreduce", "--topology", "dgx-h100",
                 "--sizes", "1MiB")
    line = ",".join(row.values())
    measured = tmp_path / "m.csv"
    for rows, message in (
            ([line, line], "size 1048576 is in two rows (two runs in one file?); give each "
                           "run a file of its own"),
            ([",".join({**row, "wrong": "2"}.values())],
             "the row of size 1048576 has 2 wrong elements (#wrong): the time of a run with "
             "wrong results is no measurement")):
        measured.write_text("\n".join([CSV_HEADER, *rows]) + "\n")
        assert main(["validate", "--topology", "dgx-h100", "--measured",
                     f"nccl_allreduce={measured}"]) == 2
        assert capsys.readouterr().err == f"simcomm: error: {measured}: {message}\n"


def test_an_interrupt_is_one_line_and_status_130(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C ends either command (simcomm's and realcomm's share ``run_command``) with
    one line instead of a traceback, and the shells' status for it."""
    def interrupted() -> int:
        raise KeyboardInterrupt
    assert run_command("simcomm", interrupted, (ValueError,)) == 130
    assert capsys.readouterr() == ("", "simcomm: interrupted\n")


def test_bench_check_fails_on_wrong_values_and_names_a_scalar_result(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "bad_results.py").write_text(
        "from algorithms import Compute\n\n\n"
        "def wrong(comm, x, op=None):\n    yield Compute(0.0)\n    return x * 0 + 7\n\n\n"
        "def scalar(comm, x, op=None):\n    yield Compute(0.0)\n    return 3.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["--kind", "allreduce", "--ranks", "2", "-c", "1", "--sizes", "1KiB",
            "--topology", "ring", "--bandwidth", "100GB/s", "--latency", "5us"]
    assert main(["bench", "--algorithm", "bad_results:wrong", *argv]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["bench", "--algorithm", "bad_results:scalar", *argv]) == 2
    assert "rank 0 returned the scalar 3.0" in capsys.readouterr().err
