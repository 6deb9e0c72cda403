"""Starting the processes: from torchrun's environment, or as N local processes spawned here.

Under torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``LOCAL_RANK``), each process calls ``init_from_env``. For tests, demos
and laptops, ``spawn`` starts N processes on this machine itself; they meet at a store that
this process serves on 127.0.0.1, on a port the operating system picks (so no port is
guessed, and none can be taken by someone else meanwhile).

The backend follows the device unless given: NCCL for CUDA, gloo for the CPU.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist

from realcomm.driver import DEFAULT_TIMEOUT

LOOPBACK = "127.0.0.1"
_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class SpawnError(RuntimeError):
    """One or more spawned processes failed; ``failures`` maps rank to its traceback."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


def backend_for(device: torch.device | str) -> str:
    """The backend for tensors on ``device``: ``nccl`` for CUDA, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def default_device() -> torch.device:
    """CUDA if this machine has it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def in_launcher_env() -> bool:
    """Whether torchrun (or a launcher like it) started this process."""
    return all(name in os.environ for name in _ENV_VARS)


def init_from_env(device: torch.device | str | None = None, backend: str | None = None,
                  timeout: float = DEFAULT_TIMEOUT) -> torch.device:
    """Join the process group that the launcher's environment describes (``env://``).

    Returns this process's device: ``cuda:LOCAL_RANK`` for CUDA, made current, or the CPU.
    """
    missing = [name for name in _ENV_VARS if name not in os.environ]
    if missing:
        raise RuntimeError(f"the environment lacks {', '.join(missing)}: start with torchrun "
                           "(or use spawn for local processes)")
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    return _init(local_rank, device, backend, timeout, init_method="env://")


def _init(local_rank: int, device: torch.device | str | None, backend: str | None,
          timeout: float, **rendezvous: Any) -> torch.device:
    device = default_device() if device is None else torch.device(device)
    bound = None
    if device.type == "cuda":
        device = bound = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend or backend_for(device),
                            timeout=datetime.timedelta(seconds=timeout), device_id=bound,
                            **rendezvous)
    return device


@dataclass
class LocalGroup:
    """Processes started by ``start``; ``join`` collects what each one returned."""

    processes: Sequence[multiprocessing.process.BaseProcess]
    results: list[Connection]
    store: Any  # the rendezvous store: it must outlive the processes' start-up

    def join(self) -> list[Any]:
        """Wait for every process; return their results in rank order, or raise
        ``SpawnError`` describing each rank that raised or died."""
        outcome: dict[int, tuple[bool, Any]] = {}
        pending = {conn: rank for rank, conn in enumerate(self.results)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while pending:
            for ready in wait(list(pending) + list(sentinels)):
                if ready in pending:
                    rank = pending.pop(ready)
                    try:
                        outcome[rank] = ready.recv()
                    except EOFError:
                        outcome[rank] = self._died(rank)
                elif ready in sentinels:
                    rank = sentinels.pop(ready)
                    conn = self.results[rank]
                    if conn in pending and not conn.poll():
                        del pending[conn]
                        outcome[rank] = self._died(rank)
        for process in self.processes:
            process.join()
        # Stop serving now, not at interpreter exit, when the store's thread may outlive
        # what it needs.
        self.store = None
        failures = {rank: detail for rank, (ok, detail) in sorted(outcome.items()) if not ok}
        if failures:
            ranks_by_line: dict[str, list[int]] = {}
            for rank, detail in failures.items():
                ranks_by_line.setdefault(detail.strip().splitlines()[-1], []).append(rank)
            raise SpawnError("; ".join(
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {line}"
                for line, ranks in ranks_by_line.items()), failures)
        return [outcome[rank][1] for rank in range(len(self.processes))]


    def _died(self, rank: int) -> tuple[bool, str]:
        process = self.processes[rank]
        process.join()
        return False, f"process exited with code {process.exitcode} without a result"


def start(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
          device: torch.device | str = "cpu", backend: str | None = None,
          timeout: float = DEFAULT_TIMEOUT) -> LocalGroup:
    """Start ``nprocs`` local processes; each joins the process group and calls
    ``fn(*args)``. ``fn`` and ``args`` must pickle (``fn`` a module-level function).

    As torchrun does, each process runs its CPU ops on one thread unless OMP_NUM_THREADS
    says otherwise: several processes share the cores.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    store = dist.TCPStore(LOOPBACK, 0, None, True,
                          timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    processes, results = [], []
    for rank in range(nprocs):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_child, name=f"realcomm-rank{rank}",
            args=(rank, nprocs, store.port, str(device), backend, timeout, fn, tuple(args),
                  sender))
        process.start()
        sender.close()
        processes.append(process)
        results.append(receiver)
    return LocalGroup(processes, results, store)


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
          device: torch.device | str = "cpu", backend: str | None = None,
          timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` local processes of one process group and return
    what each returned, in rank order (see ``start`` and ``LocalGroup.join``)."""
    return start(fn, nprocs, args, device=device, backend=backend, timeout=timeout).join()


def _child(rank: int, nprocs: int, port: int, device: str, backend: str | None,
           timeout: float, fn: Callable[..., Any], args: tuple[Any, ...],
           results: Connection) -> None:
    try:
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(1)
        store = dist.TCPStore(LOOPBACK, port, None, False,
                              timeout=datetime.timedelta(seconds=timeout))
        _init(rank, device, backend, timeout, store=store, rank=rank, world_size=nprocs)
        outcome: tuple[bool, Any] = (True, fn(*args))
    except BaseException:  # reported to the parent, which raises SpawnError
        outcome = (False, traceback.format_exc())
    results.send(outcome)
    results.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    # The result is delivered: leave now. Tearing down the interpreter runs torch's C++
    # destructors after its threads, which now and then aborts the process ("terminate
    # called without an active exception") for no fault of the run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
