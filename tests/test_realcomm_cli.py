"""``realcomm bench``: local processes and torchrun, the columns of ``simcomm bench``, and one
line on stderr with status 2 for every mistake."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from algorithms.harness.bench import CSV_HEADER
from realcomm.cli import main
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


def test_native_baseline_runs_through_the_same_harness(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "reduce", "--root", "1", "--op",
                 "max", "--sizes", "64KiB,1000", "--baseline", "native", "--check",
                 "--format", "json", "-w", "1", "-n", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
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


def test_an_op_that_gloo_lacks_is_one_line_not_a_crash(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", "--nprocs", "2", "--algorithm", "ring_allreduce", "--dtype", "int64",
                 "--op", "avg", "--sizes", "1KiB", "--baseline", "native"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
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
     "--timeout must be a finite number of seconds > 0"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--slice-bytes", "lots"],
     "--slice-bytes: cannot read 'lots' as a size"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--backend", "nccl"],
     "--backend nccl needs CUDA tensors"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--baseline", "mpi"],
     "argument --baseline: invalid choice"),
    (["--algorithm", "ring_allreduce", "--nprocs", "2", "--timing", "mode"],
     "argument --timing: invalid choice"),
])
def test_mistakes_print_one_line_and_exit_2(args: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_launcher(monkeypatch)
    assert main(["bench", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("realcomm: error: ") and message in err
    assert err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert main(["bench", "--algorithm", "ring_allreduce", "--nprocs", "2", "--device",
                 "cuda"]) == 2
    assert "--device cuda: this machine has no CUDA device" in capsys.readouterr().err
