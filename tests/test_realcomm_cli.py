"""``realcomm bench``: local processes and torchrun, the columns of ``simcomm bench``, and one
line on stderr with status 2 for every mistake.

Rank 0 prints, in a process of its own under ``--nprocs``, so tests that call ``main`` read
what it printed with ``capfd`` (the file descriptors), not ``capsys``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from algorithms.harness.bench import CSV_HEADER, bench_config
from algorithms.harness.catalog import COLLECTIVES
from realcomm import spawn
from realcomm.bench import RunOptions, bench_rank
from realcomm.cli import main
from realcomm.launch import load_kernels_eagerly_for_nccl, nccl_version_of, shared_gpu_refusal
from simcomm.cli import main as simcomm_main

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RUN_TIMEOUT = 240  # seconds for a whole command, start-up included


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=_environment())


def _leave_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if not under torchrun, even when the tests are."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _csv_rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    assert lines[0] == CSV_HEADER, stdout
    return [line.split(",") for line in lines[1:]]


def test_bench_spawns_processes_checks_data_and_prints_simcomms_columns(
        capsys: pytest.CaptureFixture[str]) -> None:
    done = _run(sys.executable, "-m", "realcomm", "bench", "--nprocs", "2", "--algorithm",
                "ring_allreduce", "--sizes", "1MiB,16MiB", "--check", "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = _csv_rows(done.stdout)
    assert [row[0] for row in rows] == ["1048576", "16777216"]
    assert all(row[-1] == "0" and float(row[5]) > 0 for row in rows)
    assert simcomm_main(["bench", "--algorithm", "ring_allreduce", "--ranks", "2",
                         "--topology", "ring", "--bandwidth", "1GB/s", "--latency", "1us",
                         "--sizes", "1MiB", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == done.stdout.splitlines()[0]


def test_native_baseline_runs_through_the_same_harness(capfd: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "reduce", "--root", "1", "--op",
                 "max", "--sizes", "64KiB,1000", "--baseline", "native", "--check",
                 "--format", "json", "-w", "1", "-n", "3"]) == 0
    rows = json.loads(capfd.readouterr().out)
    assert [(row["size"], row["count"], row["redop"], row["root"], row["wrong"])
            for row in rows] == [(65536, 16384, "max", 1, 0), (1000, 250, "max", 1, 0)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_bench_runs_under_torchrun_and_rank_0_prints() -> None:
    done = _run(sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                str(_free_port()), "-m", "realcomm", "bench", "--algorithm", "all_gather",
                "--sizes", "64KiB", "--check", "--format", "csv", "-w", "1", "-n", "3")
    assert done.returncode == 0, done.stderr
    (row,) = _csv_rows(done.stdout)
    assert row[0] == "65536" and row[-1] == "0"


def test_an_op_that_gloo_lacks_is_one_line_not_a_crash(capfd: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "ring_allreduce", "--dtype", "int64",
                 "--op", "avg", "--sizes", "1KiB", "--baseline", "native"]) == 2
    out, err = capfd.readouterr()
    # the header came first, as nccl-tests prints it; no row came
    assert out.splitlines()[0].startswith("# realcomm bench: torch's all_reduce")
    assert all(line.startswith("#") for line in out.splitlines())
    assert err == ("realcomm: error: ranks 0, 1: ValueError: torch's all_reduce on gloo "
                   "cannot run torch.int64 avg: result type Float can't be cast to the "
                   "desired output type Long\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--algorithm", "nope", "--nprocs", "2"], "unknown algorithm 'nope'"),
    (["--algorithm", "ring_allreduce"], "no torchrun environment"),
    (["--algorithm", "ring_allreduce", "--nprocs", "0"], "--nprocs must be >= 1"),
    (["--algorithm", "reduce", "--root", "2", "--nprocs", "2"], "--root 2 is not a rank"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-n", "0"], "-n/--iters must be >= 1"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--timeout", "0"],
     "--timeout must be a finite number of seconds from 1 to 86400"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--slice-bytes", "lots"],
     "--slice-bytes: cannot read 'lots' as a size"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--backend", "nccl"],
     "--backend nccl needs CUDA tensors"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--baseline", "mpi"],
     "argument --baseline: invalid choice"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--timing", "mode"],
     "argument --timing: invalid choice"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-g", "2"],
     "argument -g/--ngpus: GPUs per process do not apply"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-t", "4"],
     "argument -t/--nthreads: threads per process do not apply"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-G", "10"],
     "argument -G/--cudagraph: CUDA graphs do not apply"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-d", "uint64"],
     "--dtype uint64: torch has no arithmetic for uint32 and uint64 tensors"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-a", "9"],
     "argument -a/--average: invalid choice: 9"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-c", "5"],
     "argument -c/--check: takes 0 (off) or 1 (on), got '5'"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-b", "1Kb", "-e", "1M"],
     "-b: size '1Kb' is ambiguous: a small b means bits"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "0"],
     "--timeout must be a finite number of seconds from 1 to 86400"),
    # torch's store overflowed on these, or gave up at once after a dump of C++ frames.
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "1e300"],
     "-T/--timeout must be a finite number of seconds from 1 to 86400 (a day), got 1e+300"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "inf"], "got inf"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "nan"], "got nan"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "1e-9"], "got 1e-09"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-T", "1e10"], "got 1e+10"),
    (["--algorithm", "ring_allreduce", "--nprocs", "100000"],
     "--nprocs must be at most 256 (each is a Python interpreter with torch"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--tuner-file", "none.csv"],
     "--tuner-file decides how nccl_allreduce, nccl_reduce_scatter, nccl_all_gather run; "
     "ring_allreduce asks no tuner"),
    (["--algorithm", "nccl_allreduce", "--nprocs", "2", "--tuner-file", "none.csv"],
     "cannot read tuner file none.csv"),
    # Used to build 4e9 sizes first.
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "-b", "4", "-e", "16G", "-i", "4"],
     "-b 4 -e 17179869184 -i 4 make 4,294,967,296 sizes, more than the 10,000 a run takes"),
])
def test_mistakes_print_one_line_and_exit_2(args: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("realcomm: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert main(["bench", "--algorithm", "ring_allreduce", "--nprocs", "2", "--device",
                 "cuda"]) == 2
    assert "--device cuda: this machine has no CUDA device" in capsys.readouterr().err


# -- nccl-tests' flags, rows as they come, algorithms of a user's own -------------------

def test_an_nccl_tests_command_line_runs(capfd: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "ring_allreduce", "-b", "1K", "-e",
                 "16K", "-f", "4", "-d", "bfloat16", "-o", "avg", "-c", "1", "-w", "1", "-n",
                 "2", "-a", "3", "-T", "60", "-g", "1"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0].startswith("# realcomm bench: ring_allreduce on 2 ranks, gloo on cpu, "
                               "2 timed runs after 1 warm-up runs")
    assert lines[0].endswith("the slowest rank's time (-a 3)")
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert [row[:5] + row[-1:] for row in rows] == [
        [str(size), str(size // 2), "bfloat16", "avg", "-1", "0"]
        for size in (1024, 4096, 16384)]
    assert lines[-3] == "# Out of bounds values : 0 OK"


def test_every_type_torch_can_reduce_in_turn(capfd: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "reduce_scatter", "-d", "all",
                 "-o", "max", "-c", "1", "--sizes", "64", "-w", "0", "-n", "1",
                 "--format", "csv"]) == 0
    rows = _csv_rows(capfd.readouterr().out)
    assert [(row[2], row[3], row[-1]) for row in rows] == [
        (dtype, "max", "0") for dtype in ("int8", "uint8", "int32", "int64", "half", "float",
                                          "double", "bfloat16")]


def _run_in(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``realcomm`` in ``folder``, which is not on ``sys.path`` but as the command puts it."""
    return subprocess.run([sys.executable, "-P", "-m", "realcomm", *argv], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, env=_environment(), cwd=folder)


def test_a_users_algorithm_runs_and_rows_come_as_they_are_done(user_algorithms: str) -> None:
    done = _run_in(Path.cwd(), "bench", "--nprocs", "2", "--algorithm",
                   f"{user_algorithms}:my_broadcast", "--kind", "broadcast", "-r", "1",
                   "--sizes", "4KiB", "-c", "1", "-w", "1", "-n", "2", "--format", "csv")
    assert done.returncode == 0, done.stderr
    (row,) = _csv_rows(done.stdout)
    assert (row[0], row[3], row[4], row[-1]) == ("4096", "none", "1", "0")
    # small_only refuses more than 256 elements: the rows before it are out, the summary not
    failed = _run_in(Path.cwd(), "bench", "--nprocs", "2", "--algorithm",
                     f"{user_algorithms}:small_only", "-b", "512", "-e", "4K", "-w", "0",
                     "-n", "1")
    assert failed.returncode == 2
    lines = failed.stdout.splitlines()
    assert lines[0].startswith(f"# realcomm bench: {user_algorithms}:small_only on 2 ranks")
    assert [line.split()[0] for line in lines if not line.startswith("#")] == ["512", "1024"]
    assert "# Out of bounds" not in failed.stdout
    assert failed.stderr.splitlines()[-1] == (
        "realcomm: error: ranks 0, 1: ValueError: small_only takes at most 256 elements, "
        "got 512")


def test_per_iteration_statistics_come_from_every_timed_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    done = _run(sys.executable, "-m", "realcomm", "bench", "--nprocs", "2", "--algorithm",
                "ring_allreduce", "--sizes", "64KiB,1MiB", "-n", "7", "-I", "--format", "json")
    assert done.returncode == 0, done.stderr
    for row in json.loads(done.stdout):
        spread = row["spread"]
        runs = spread["runs_us"]
        assert len(runs) == 7 and all(t > 0 for t in runs)
        assert spread["min_us"] == min(runs) and spread["max_us"] == max(runs)
        assert min(runs) <= spread["p50_us"] <= spread["p90_us"] <= spread["p99_us"] <= max(runs)
        # The row's time is the elapsed time over the runs: their mean, to the timer.
        assert row["time_us"] == pytest.approx(sum(runs) / 7, rel=0.02)
    # simcomm's seeded samples give the same fields, so the two compare line by line.
    assert simcomm_main(["bench", "--algorithm", "ring_allreduce", "--ranks", "2",
                         "--topology", "ring", "--bandwidth", "1GB/s", "--latency", "1us",
                         "--sizes", "64KiB", "--samples", "3", "--message-delay",
                         "lognormal:5us,1", "--format", "json"]) == 0
    simulated = json.loads(capsys.readouterr().out)[0]
    assert simulated.keys() == row.keys() and simulated["spread"].keys() == spread.keys()


# -- every built-in collective, NCCL-class ones on their channels ---------------------------

# Beside each built-in collective with its defaults: the tuned all-reduce forced onto each of
# its algorithms, and a channel count given.
FORCED = [("nccl_allreduce", ("algorithm=tree", "channels=2")),
          ("nccl_allreduce", ("algorithm=nvls",)),
          ("nccl_allreduce", ("algorithm=hierarchical",)),
          ("nccl_ring_allreduce", ("channels=2", "protocol=ll")),
          ("nvls_tree_allreduce", ("channels=3",))]


def bench_every_collective() -> list[tuple[str, tuple[str, ...], int | None]]:
    """On every rank: each built-in collective with its data checked, as ``realcomm bench
    --check`` runs it; (name, params, wrong elements) per row."""
    runs = [(name, ()) for name in COLLECTIVES] + FORCED
    results = []
    for name, params in runs:
        config = bench_config(name, [0, 1536], params=params, check=True)
        for row in bench_rank(config, RunOptions(warmup_iters=0, iters=1), torch.device("cpu")):
            results.append((name, params, row.wrong))
    return results


def test_every_builtin_collective_runs_on_the_channels_bench_declares() -> None:
    """NCCL-class collectives spawn tasks on channels, which realcomm maps to process groups
    made up front: ``realcomm bench`` must declare each one they use."""
    rows = spawn(bench_every_collective, 3)[0]
    assert {name for name, _, _ in rows} == set(COLLECTIVES)
    assert len(rows) == 2 * (len(COLLECTIVES) + len(FORCED))
    assert [row for row in rows if row[2] != 0] == []


@pytest.mark.parametrize(("nprocs", "gpus", "version", "enable", "refused"), [
    (1, 1, (2, 28, 9), None, None),
    (2, 1, (2, 28, 9), None, "NCCL 2.28.9 refuses (NCCL 2.30 and newer allow it"),
    (2, 1, (2, 28, 9), "1", "NCCL 2.28.9 refuses"),
    (4, 1, (2, 30, 3), None, "NCCL_MULTI_RANK_GPU_ENABLE=1 allows it"),
    (4, 1, (2, 30, 3), "1", None),
    (8, 8, (2, 21, 5), None, None),
])
def test_nccl_with_more_ranks_than_gpus_is_refused_up_front(
        nprocs: int, gpus: int, version: tuple[int, ...], enable: str | None,
        refused: str | None) -> None:
    why = shared_gpu_refusal(nprocs, gpus, version, enable)
    if refused is None:
        assert why is None
    else:
        assert refused in why and "use the gloo backend" in why and "\n" not in why
        assert why.endswith(f"at most {gpus} rank" + ("s" if gpus > 1 else ""))


@pytest.mark.parametrize(("code", "version"), [
    (23007, (2, 30, 7)), (22809, (2, 28, 9)), (21003, (2, 10, 3)), (2804, (2, 8, 4)),
])
def test_nccl_version_codes_read_as_nccl_h_writes_them(code: int,
                                                       version: tuple[int, int, int]) -> None:
    # The refusal above asks the library torch runs, whose ncclGetVersion gives such a code.
    assert nccl_version_of(code) == version


@pytest.mark.parametrize(("device", "backend", "eager"), [
    ("cuda", None, True), (None, None, True), ("cuda", "nccl", True), (None, "nccl", True),
    ("cpu", None, False), ("cuda", "gloo", False), (None, "gloo", False), ("cpu", "gloo", False),
])
def test_runs_that_may_use_nccl_ask_cuda_to_load_kernels_eagerly(
        monkeypatch: pytest.MonkeyPatch, device: str | None, backend: str | None,
        eager: bool) -> None:
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    load_kernels_eagerly_for_nccl(device, backend)
    assert os.environ.get("CUDA_MODULE_LOADING") == ("EAGER" if eager else None)
    # A user's own choice stands.
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    load_kernels_eagerly_for_nccl(device, backend)
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"


@pytest.mark.parametrize(("params", "message"), [
    (["protocol=ll256"], "unknown protocol 'll256'; known: simple, ll, ll128"),
    (["channels=65"], "channels must be an int from 0 to 64"),
    (["algorithm=nvls", "protocol=ll"], "nvls runs under the simple protocol only, not 'll'"),
])
def test_parameters_the_algorithm_refuses_stop_it_before_any_rank_starts(
        params: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    argv = ["bench", "--algorithm", "nccl_allreduce", "--nprocs", "2"]
    for param in params:
        argv += ["--param", param]
    assert main(argv) == 2
    # A rank's error would read "ranks 0, 1: ValueError: ..." after printing the header.
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"realcomm: error: {message}") and err.count("\n") == 1


# -- calibrate's checks, torchrun's variables, Ctrl-C --------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--timeout", "inf"], "--timeout must be a finite number of seconds from 1 to 86400 "
                           "(a day), got inf"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds from 1 to 86400"),
    (["--timeout", "-1"], "got -1"),
    (["--timeout", "0"], "got 0"),
    (["--timeout", "1e300"], "got 1e+300"),
    (["--nprocs", "100000"], "--nprocs must be at most 256"),
])
def test_calibrate_refuses_a_bad_timeout_or_too_many_processes_in_one_line(
        args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    argv = ["calibrate", "--out", str(tmp_path / "m.json"), "--sizes", "16,64", "-n", "1"]
    assert main(argv + (args if "--nprocs" in args else ["--nprocs", "2", *args])) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("realcomm: error: --") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(("variables", "message"), [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' in the environment is not an integer"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 in the environment must be >= 1"),
    ({"RANK": "3", "WORLD_SIZE": "2"},
     "RANK=3 in the environment must be from 0 to 1 (WORLD_SIZE=2)"),
    ({"MASTER_PORT": "x"}, "MASTER_PORT='x' in the environment is not an integer"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 in the environment must be from 1 to 65535"),
    ({"LOCAL_RANK": "z"}, "LOCAL_RANK='z' in the environment is not an integer"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1", "RANK": "1", "WORLD_SIZE": "2"},
     "LOCAL_RANK=1 in the environment must be from 0 to 0 (LOCAL_WORLD_SIZE=1)"),
])
def test_a_bad_launcher_variable_is_named_before_torch_reads_it(
        variables: dict[str, str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(_free_port()), **variables}.items():
        monkeypatch.setenv(name, value)
    # torch said "invalid literal for int() with base 10: 'abc'", or waited for rank 2 until
    # the timeout.
    assert main(["bench", "--algorithm", "ring_allreduce", "--device", "cpu", "--sizes", "1K",
                 "-T", "5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"realcomm: error: {message}\n"


@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c", "parent-only"])
def test_an_interrupt_ends_the_run_and_its_ranks_in_one_line_with_status_130(
        whole_group: bool) -> None:
    """Ctrl-C signals the whole foreground process group, ranks included; ``kill -INT``
    the command alone, which must then end its ranks (it used to wait for them for ever)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "realcomm", "bench", "--nprocs", "2", "--algorithm",
         "ring_allreduce", "--sizes", "1K", "-w", "0", "-n", "1000000000", "-T", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environment(),
        start_new_session=True,
        # As from a shell: Ctrl-C's default action, whatever this process (or a test before
        # it) set; an ignored SIGINT is inherited, and Python then raises no KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert process.stdout is not None
        # Rank 0 prints the header once every rank has joined: the run is under way.
        assert process.stdout.readline().startswith("# realcomm bench: ring_allreduce")
        if whole_group:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert (process.returncode, err) == (130, "realcomm: interrupted\n")


def test_a_tuner_file_chooses_each_call_on_gloo_and_results_are_torchs(
        tmp_path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The tree on 2 channels, the ring under LL128 on 3, NVLS (plain sends here) and, past
    # the last row, the ring on one channel: each run on its own channels' process groups.
    _leave_launcher(monkeypatch)
    path = tmp_path / "tuner.csv"
    path.write_text("allreduce,0,1024,tree,ll,2,-1,-1\n"
                    "allreduce,1025,16384,ring,ll128,3,-1,-1\n"
                    "allreduce,16385,65536,nvls,simple,2,1,-1\n")
    assert main(["bench", "--nprocs", "3", "--algorithm", "nccl_allreduce", "--tuner-file",
                 str(path), "--sizes", "1000,8KiB,64KiB,1MiB", "--check", "-w", "1", "-n", "2",
                 "--format", "csv"]) == 0
    out = capfd.readouterr().out
    rows = _csv_rows(out)
    assert [row[0] for row in rows] == ["1000", "8192", "65536", "1048576"]
    assert all(row[-1] == "0" for row in rows)
