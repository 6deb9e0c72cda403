"""Faults over real gloo processes: a rank stuck in user code, a rank that raises first, a
rank that gloo kills, a function that new processes cannot load, and what check mode
(``Driver(check=True)``) catches: a receive of another size or dtype than its send, a send
buffer changed before its Wait."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from algorithms import (
    AVG, MAX, SUM, Comm, Compute, Join, Recv, Send, Sleep, Spawn, Wait, all_gather,
    nccl_ring_allreduce, reduce, ring_allreduce, ring_channels,
)
from algorithms.protocol import AlgorithmError
from realcomm import Driver, RealcommError, SpawnError, spawn
from realcomm.cli import main

GRACE = 1.0  # seconds the other ranks get once one has failed
SHORT_TIMEOUT = 2.0  # the driver's, where a rank is meant to give up on a silent peer
TIMEOUT = 30.0  # the driver's, where no rank should wait that long
STUCK = 1000.0  # seconds a stuck rank would sleep


# -- these functions run in the spawned processes --------------------------------------

def _stuck_in_the_middle(comm: Comm, x: torch.Tensor) -> Generator[Any, Any, torch.Tensor]:
    """Two ring all-reduces; between them rank 1 runs user code that never returns."""
    yield from ring_allreduce(comm, x)
    if comm.rank == 1:
        yield Compute(0.0, work=lambda: time.sleep(STUCK))
    yield from ring_allreduce(comm, x)
    return x


def _all_reduce_with_a_stuck_rank() -> float:
    driver = Driver(timeout=SHORT_TIMEOUT)
    return float(driver.run(_stuck_in_the_middle, torch.ones(1000)).sum())


def _one_rank_raises() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1 broke")
    time.sleep(STUCK)


def _mismatched(comm: Comm, x: torch.Tensor, count: int, dtype: torch.dtype
                ) -> Generator[Any, Any, torch.Tensor | None]:
    """Rank 0 sends ``x``; rank 1 receives ``count`` elements of ``dtype``."""
    if comm.rank == 0:
        sent = yield Send(1, x)
        yield Wait(sent)
        return None
    buf = torch.zeros(count, dtype=dtype)
    received = yield Recv(0, buf)
    yield Wait(received)
    return buf


def _changes_its_send_buffer(comm: Comm, x: torch.Tensor
                             ) -> Generator[Any, Any, torch.Tensor]:
    """Rank 0 writes the buffer of its send before waiting for it."""
    if comm.rank == 0:
        sent = yield Send(1, x)
        x.add_(1)
        yield Wait(sent)
        return x
    received = yield Recv(0, x)
    yield Wait(received)
    return x


def _join_cycle(comm: Comm, x: torch.Tensor) -> Generator[Any, Any, torch.Tensor]:
    """Two tasks that join each other, and the main task joins the first."""
    box: dict[str, Any] = {}

    def task(other: str) -> Generator[Any, Any, None]:
        yield Compute(1e-4)
        yield Join(box[other])

    box["a"] = yield Spawn(task("b"), 1)
    box["b"] = yield Spawn(task("a"), 2)
    yield Join(box["a"])
    yield Join(box["b"])
    return x


def _joins_in_a_cycle() -> tuple[str, Any]:
    return _outcome(Driver(channels=[1, 2], timeout=SHORT_TIMEOUT).run, _join_cycle,
                    torch.ones(4))


def _outcome(run: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``run(*args, **kwargs)``: ("ok", its result as numpy) or (the error's class name, its
    message)."""
    try:
        result = run(*args, **kwargs)
    except (AlgorithmError, RealcommError) as error:
        return type(error).__name__, str(error)
    return "ok", None if result is None else result.numpy()


def _check_mode_runs(length: int) -> list[tuple[str, Any]]:
    """The same all-reduces with and without check mode (sliced, on channels too), then a
    send buffer changed before its Wait."""
    channels = ring_channels(2)
    plain = Driver(channels=channels, timeout=TIMEOUT)
    checked = Driver(channels=channels, timeout=TIMEOUT, check=True, slice_bytes=1000)
    generator = np.random.default_rng(dist.get_rank())
    outcomes = []
    for dtype in (np.float32, np.int64):
        data = torch.from_numpy((generator.standard_normal(length) * 100).astype(dtype))
        for algorithm, params in ((ring_allreduce, {}), (nccl_ring_allreduce, {"channels": 2})):
            for driver in (plain, checked):
                outcomes.append(_outcome(driver.run, algorithm, data.clone(), op=SUM,
                                         **params))
    outcomes.append(_outcome(checked.run, _changes_its_send_buffer, torch.ones(8)))
    # Rank 0 raised as soon as its send was done; were it to exit now, rank 1 could still be
    # reading that message and find the connection reset.
    dist.barrier()
    return outcomes


def _checked_mismatch(count: int, dtype: torch.dtype) -> tuple[str, Any]:
    driver = Driver(timeout=TIMEOUT, check=True)
    return _outcome(driver.run, _mismatched, torch.ones(4), check_args=False, count=count,
                    dtype=dtype)


def _unchecked_mismatch() -> tuple[str, Any]:
    return _outcome(Driver(timeout=TIMEOUT).run, _mismatched, torch.ones(8), check_args=False,
                    count=4, dtype=torch.float32)


def _sends(comm: Comm, x: torch.Tensor, buf: torch.Tensor) -> Generator[Any, Any, None]:
    h = yield Send(1 - comm.rank, buf)
    yield Wait(h)


def _holds_for(comm: Comm, x: torch.Tensor, op: Compute | Sleep) -> Generator[Any, Any, None]:
    yield op


def _unfit_runs() -> list[str]:
    """What a driver says of tensors without dense data (as x, as a message's buffer) and
    of a Compute or Sleep longer than a day: each is refused on this rank before any
    message, so every run fails alike and the next one starts clean."""
    driver = Driver(timeout=TIMEOUT)
    said = []
    for x in (torch.ones(4).to_sparse(), torch.ones(4, device="meta")):
        try:
            driver.run(ring_allreduce, x)
        except TypeError as error:
            said.append(str(error))
        said.append(_outcome(driver.run, _sends, torch.ones(4), buf=x, check_args=False)[1])
    for op in (Compute(1e300, "huge"), Sleep(1e6)):
        said.append(_outcome(driver.run, _holds_for, torch.ones(4), op=op,
                             check_args=False)[1])
    return said


# -- the tests ---------------------------------------------------------------------------

def test_a_rank_stuck_in_user_code_is_terminated_after_the_others_fail(hang_guard: None
                                                                       ) -> None:
    begin = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(_all_reduce_with_a_stuck_rank, 3, grace=GRACE)
    error = info.value
    assert time.monotonic() - begin < SHORT_TIMEOUT + 2 * GRACE + 10  # start-up included
    message = str(error)
    assert re.search(r"rank 1: still running 1s after rank [02] failed: terminated",
                     message), message
    for rank in (0, 2):
        assert re.search(rf"realcomm\.driver\.Peer(Timeout)?Error: rank {rank} gave up on its "
                         r"(Send to|Recv from) rank \d", message), message
    assert sorted(error.failures) == [0, 1, 2]
    assert error.first in (0, 2)
    story = error.failures[error.first]
    assert error.__notes__ == [f"rank {error.first} failed first:\n{story}"]
    assert "Traceback" in story


def test_the_first_failure_is_reported_whole_and_the_rest_terminated(hang_guard: None
                                                                     ) -> None:
    begin = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(_one_rank_raises, 3, grace=GRACE)
    assert time.monotonic() - begin < 2 * GRACE + 10
    error = info.value
    assert str(error) == ("rank 1: ValueError: rank 1 broke; ranks 0, 2: still running 1s "
                          "after rank 1 failed: terminated")
    assert error.first == 1
    assert 'raise ValueError("rank 1 broke")' in error.failures[1]
    assert error.failures[0].startswith("still running 1s after rank 1 failed: terminated")
    assert error.__notes__[0].startswith("rank 1 failed first:\nTraceback")


def test_a_rank_that_gloo_aborts_shows_its_last_error_output() -> None:
    # Without check mode a receive smaller than its send aborts the receiving process.
    with pytest.raises(SpawnError) as info:
        spawn(_unchecked_mismatch, 2, grace=GRACE)
    message = str(info.value)
    assert "rank 1: exited with code -6 (SIGABRT) without a result; its last error output:" \
        in message, message
    assert "Received data size doesn't match expected size" in message
    assert "Received data size doesn't match expected size" in info.value.failures[1]


def test_tasks_that_join_each_other_raise_a_deadlock_naming_them(hang_guard: None) -> None:
    begin = time.monotonic()
    outcomes = spawn(_joins_in_a_cycle, 2, grace=GRACE)
    assert time.monotonic() - begin < SHORT_TIMEOUT + 10  # start-up included
    assert outcomes == [("DeadlockError", (
        f"deadlock on rank {rank}: every task waits for a Join of another, none for a message "
        f"or a computation: rank {rank} (channel 0) waits for Join of its task on channel 1; "
        f"rank {rank} (channel 1) waits for Join of its task on channel 2; rank {rank} "
        "(channel 2) waits for Join of its task on channel 1")) for rank in range(2)]


def _dtype_outcomes() -> dict[str, str]:
    """What each run does with a dtype torch has no arithmetic for, or a tensor that requires
    grad: the error's message, or the result."""
    driver = Driver(timeout=TIMEOUT)
    rank = dist.get_rank()
    runs: dict[str, Callable[[], Any]] = {
        "uint32 all-reduce": lambda: driver.run(ring_allreduce,
                                                torch.ones(4, dtype=torch.uint32)),
        # The root alone reduces: every rank must refuse it, not only the root.
        "uint16 reduce": lambda: driver.run(reduce, torch.ones(4, dtype=torch.uint16), root=1),
        "complex max": lambda: driver.run(ring_allreduce, torch.ones(4, dtype=torch.complex64),
                                          op=MAX),
        # The average divides at the end, after every rank has sent: refused up front too.
        "complex avg": lambda: driver.run(ring_allreduce, torch.ones(4, dtype=torch.complex64),
                                          op=AVG),
        # Moving data needs no arithmetic.
        "uint32 all-gather": lambda: driver.run(
            all_gather, torch.full((4,), rank + 7, dtype=torch.uint32)).tolist(),
        "requires grad": lambda: driver.run(ring_allreduce, torch.ones(4, requires_grad=True)),
    }
    outcomes = {}
    for name, run in runs.items():
        try:
            outcomes[name] = str(run())
        except (TypeError, ValueError) as error:
            outcomes[name] = f"{type(error).__name__}: {error}"
    return outcomes


def test_a_reduction_torch_cannot_do_is_refused_on_every_rank_before_it_runs() -> None:
    for outcomes in spawn(_dtype_outcomes, 2, grace=GRACE, backend="Gloo"):  # any case
        assert outcomes["uint32 all-reduce"].startswith(
            "TypeError: torch cannot sum-reduce torch.uint32 tensors on cpu")
        assert outcomes["uint16 reduce"].startswith(
            "TypeError: torch cannot sum-reduce torch.uint16 tensors on cpu")
        assert outcomes["complex max"].startswith(
            "TypeError: torch cannot max-reduce torch.complex64 tensors on cpu")
        assert outcomes["complex avg"].startswith(
            "TypeError: torch cannot avg-reduce torch.complex64 tensors on cpu")
        assert outcomes["uint32 all-gather"] == str([7, 7, 8, 8])
        assert outcomes["requires grad"] == (
            "ValueError: x requires grad, and an algorithm works on it in place: pass "
            "x.detach(), or a gradient (which does not require grad)")


@pytest.mark.parametrize(("options", "message"), [
    ({"timeout": -1}, "timeout must be a finite number of seconds from 1 to 86400 (a day), "
                      "got -1"),
    ({"timeout": float("inf")}, "got inf"),
    ({"timeout": True}, "got True"),
    ({"backend": "mpi"}, "backend must be 'gloo' or 'nccl' (or None: from the device), got "
                         "'mpi'"),
    ({"backend": "nccl"}, "backend 'nccl' needs CUDA tensors, got device 'cpu'"),
    ({"device": "tpu:0"}, "device 'tpu:0' is not a torch device"),
])
def test_spawn_refuses_a_bad_backend_device_or_timeout_before_any_process_starts(
        options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        spawn(_one_rank_raises, 2, **options)
    assert message in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_spawn_refuses_cuda_where_torch_sees_no_gpu() -> None:
    with pytest.raises(ValueError, match="device 'cuda': this torch sees no CUDA GPU"):
        spawn(_one_rank_raises, 2, device="cuda")


def _marked_environment(name: str) -> tuple[str | None, int]:
    return os.environ.get(name), torch.get_num_threads()


def test_each_start_hands_the_processes_the_environment_of_that_moment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The processes fork from a server that keeps the environment it started with; each
    # start still hands them this process's environment as it is then.
    mark = "REALCOMM_TEST_MARK"
    monkeypatch.delenv(mark, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert spawn(_marked_environment, 1, (mark,)) == [(None, 1)]  # the server runs now
    monkeypatch.setenv(mark, "set after the first start")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert spawn(_marked_environment, 2, (mark,)) == [("set after the first start", 2)] * 2
    monkeypatch.delenv(mark)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert spawn(_marked_environment, 1, (mark,)) == [(None, 1)]


def test_spawn_refuses_a_bool_for_a_number_of_processes() -> None:
    with pytest.raises(ValueError, match="nprocs must be an int >= 1, got True"):
        spawn(_one_rank_raises, True)


def test_a_function_that_cannot_be_sent_is_named_as_such() -> None:
    with pytest.raises(TypeError, match="cannot send the function to the spawned processes"):
        spawn(lambda: None, 2)


def test_a_function_that_new_processes_cannot_import_is_named_as_such() -> None:
    script = textwrap.dedent("""
        from realcomm import spawn
        def work():
            return 1
        spawn(work, 2)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0
    assert ("SpawnError: ranks 0, 1: RuntimeError: cannot load the function to run in the "
            "spawned process (Can't get attribute 'work' on <module '__main__'") in done.stderr


def test_check_mode_changes_no_result_and_catches_a_changed_send_buffer() -> None:
    changed = []
    for outcomes in spawn(_check_mode_runs, 2, (3001,)):
        *runs, last = outcomes
        for plain, checked in zip(runs[::2], runs[1::2]):
            assert plain[0] == checked[0] == "ok", (plain, checked)
            assert np.array_equal(plain[1], checked[1])
        changed.append(last[0:1] if last[0] == "ok" else last)
    assert changed == [("ProtocolError", ("rank 0 changed the buffer of its Send to rank 1 "
                                          "before waiting for it")), ("ok",)]


@pytest.mark.parametrize(("count", "dtype"), [
    (4, torch.int32),  # the same bytes, taken as another type
    (2, torch.float32),  # smaller: gloo would abort the receiving process
    (8, torch.float32),  # larger: gloo would fill half of it
])
def test_check_mode_names_a_receive_of_another_size_or_dtype(count: int, dtype: torch.dtype
                                                             ) -> None:
    sender, receiver = spawn(_checked_mismatch, 2, (count, dtype), grace=GRACE)
    assert receiver == ("MessageSizeError", (
        f"rank 1 posted a Recv of {count} x {str(dtype).removeprefix('torch.')} from rank 0 "
        "on channel 0, but the matching Send from rank 0 carries 4 x float32"))
    # The send is never received: rank 0 gives up once rank 1 has left.
    assert sender[0] == "PeerError", sender


def test_tensors_without_dense_data_and_endless_computes_are_named(hang_guard: None
                                                                  ) -> None:
    # Used to be: an error from the meta kernel of Tensor.item(), a PeerError "the transport
    # failed (No backend type associated with device type meta)", a sparse buffer called
    # "a non-contiguous (strided) view", and "OverflowError: timestamp out of range".
    for rank, said in enumerate(spawn(_unfit_runs, 2, grace=GRACE)):
        assert said == [
            "x must be a 1-D contiguous torch tensor, got a tensor of layout "
            "torch.sparse_coo: give a dense one (x.to_dense())",
            f"rank {rank} posted a Send to rank {1 - rank} on channel 0 of a tensor of layout "
            "torch.sparse_coo: give a dense one (x.to_dense())",
            "x must be a 1-D contiguous torch tensor, got a tensor on the meta device, which "
            "holds no data: give one on the CPU or a GPU",
            f"rank {rank} posted a Send to rank {1 - rank} on channel 0 of a tensor on the "
            "meta device, which holds no data: give one on the CPU or a GPU",
            f"rank {rank} yielded a Compute of 1e+300 s on channel 0: realcomm runs none "
            "longer than 86400 s (a day), its longest timeout",
            f"rank {rank} yielded a Sleep of 1e+06 s on channel 0: realcomm runs none "
            "longer than 86400 s (a day), its longest timeout",
        ]


def test_bench_can_check_every_message(capfd: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["bench", "--nprocs", "2", "--algorithm", "ring_allreduce", "--sizes",
                 "64KiB", "--check", "--check-messages", "-w", "1", "-n", "3"]) == 0
    out = capfd.readouterr().out  # rank 0, a process of its own, printed it
    assert "# message check: on" in out
    assert out.splitlines()[-4].split()[-1] == "0"  # no wrong element
