"""Starting the processes: from torchrun's environment, or as N local processes spawned here.

Under torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``LOCAL_RANK``), each process calls ``init_from_env``. For tests, demos
and laptops, ``spawn`` starts N processes on this machine itself (forked from a server
process that has imported torch once, each with this process's environment and output as
they are at the start); they meet at a store that this process serves on 127.0.0.1, on a
port the operating system picks (so no port is guessed, and none can be taken by someone
else meanwhile).

The backend follows the device unless given: NCCL for CUDA, gloo for the CPU.

A spawned process's error output goes through a pipe to this process, which passes it on to
its own stderr as it comes and keeps the last lines, to quote them if the process dies
without a result (gloo, for one, aborts the process on some errors and says why only
there). Once one process has failed, the others get a grace period to end (they usually
fail at once, their peer gone); those still running after it are terminated, so that the
parent never waits on a process stuck in user code.
"""

from __future__ import annotations

import ctypes
import datetime
import math
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist

from realcomm.driver import DEFAULT_TIMEOUT, EAGER_LOADING, MODULE_LOADING, check_timeout

LOOPBACK = "127.0.0.1"
# Seconds the other processes get to end once one has failed, before they are terminated;
# also how long processes that have delivered their results get to exit.
DEFAULT_GRACE = 5.0
_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_KEPT_OUTPUT_BYTES = 8192  # of each process's error output, the end kept for SpawnError
_QUOTED_LINES = 10  # of that, the lines a failure quotes


class SpawnError(RuntimeError):
    """One or more spawned processes did not return a result.

    The message has one line per kind of failure, the first failure's first. ``failures``
    maps each such rank to what became of it: its traceback, or how it exited and the last
    lines of its error output, or that it was terminated. ``first`` is the rank that failed
    first; its whole story is also a note of the error.
    """

    def __init__(self, message: str, failures: dict[int, str], first: int) -> None:
        super().__init__(message)
        self.failures = failures
        self.first = first
        self.add_note(f"rank {first} failed first:\n{failures[first]}")


def backend_for(device: torch.device | str) -> str:
    """The backend for tensors on ``device``: ``nccl`` for CUDA, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _check_group_args(device: torch.device | str | None, backend: str | None,
                      timeout: float) -> str | None:
    """``backend`` in lower case (torch takes any case), after refusing a backend, device
    or timeout that torch would fail on only inside each process, or after the timeout."""
    check_timeout("timeout", timeout)
    if backend is not None and str(backend).lower() in ("gloo", "nccl"):
        backend = str(backend).lower()
    elif backend is not None:
        raise ValueError(f"backend must be 'gloo' or 'nccl' (or None: from the device), got "
                         f"{backend!r}")
    try:
        device_type = None if device is None else torch.device(device).type
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a torch device: {error}") from None
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch sees no CUDA GPU")
    if backend == "nccl" and device_type not in (None, "cuda"):
        raise ValueError(f"backend 'nccl' needs CUDA tensors, got device {device!r}")
    if backend == "nccl" and not dist.is_nccl_available():
        raise ValueError("backend 'nccl': this torch is built without NCCL")
    return backend


def default_device() -> torch.device:
    """CUDA if this machine has it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def in_launcher_env() -> bool:
    """Whether torchrun (or a launcher like it) started this process."""
    return all(name in os.environ for name in _ENV_VARS)


def init_from_env(device: torch.device | str | None = None, backend: str | None = None,
                  timeout: float = DEFAULT_TIMEOUT) -> torch.device:
    """Join the process group that the launcher's environment describes (``env://``).

    Returns this process's device: ``cuda:LOCAL_RANK`` for CUDA (ranks share the GPUs in turn
    when there are more ranks than GPUs), made current, or the CPU.
    """
    missing = [name for name in _ENV_VARS if name not in os.environ]
    if missing:
        raise RuntimeError(f"the environment lacks {', '.join(missing)}: start with torchrun "
                           "(or use spawn for local processes)")
    backend = _check_group_args(device, backend, timeout)
    local_rank = _check_launcher_env()
    return _init(local_rank, device, backend, timeout, init_method="env://")


def _env_int(name: str, low: int, high: int | None = None, why: str = "") -> int:
    """The launcher's variable ``name``, an int from ``low`` to ``high`` (None: no upper
    bound); ``ValueError`` naming it otherwise, where torch would say only "invalid literal
    for int()", or wait until the timeout for a rank that never comes."""
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} in the environment is not an integer") from None
    if high is None and value < low:
        raise ValueError(f"{name}={value} in the environment must be >= {low}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name}={value} in the environment must be from {low} to "
                         f"{high}{why}")
    return value


def _check_launcher_env() -> int:
    """Check the launcher's variables before torch reads them; return the local rank
    (``LOCAL_RANK``, else ``RANK``)."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0, world_size - 1, f" (WORLD_SIZE={world_size})")
    _env_int("MASTER_PORT", 1, 65535)
    if "LOCAL_RANK" not in os.environ:
        return rank
    if "LOCAL_WORLD_SIZE" in os.environ:
        local_world_size = _env_int("LOCAL_WORLD_SIZE", 1, world_size,
                                    f" (WORLD_SIZE={world_size})")
        return _env_int("LOCAL_RANK", 0, local_world_size - 1,
                        f" (LOCAL_WORLD_SIZE={local_world_size})")
    return _env_int("LOCAL_RANK", 0, world_size - 1, f" (WORLD_SIZE={world_size})")


def load_kernels_eagerly_for_nccl(device: torch.device | str | None, backend: str | None
                                  ) -> None:
    """Have CUDA load every kernel when it starts (``CUDA_MODULE_LOADING=EAGER``, unless the
    variable is set) if a run on ``device`` with ``backend`` (None: chosen from the device,
    or the machine) may use NCCL; see ``realcomm.driver``'s docstring for why. Call it
    before the process first touches CUDA (``torch.cuda.is_available()`` does)."""
    if backend == "nccl" or (backend is None
                             and (device is None or torch.device(device).type == "cuda")):
        os.environ.setdefault(MODULE_LOADING, EAGER_LOADING)


def _init(local_rank: int, device: torch.device | str | None, backend: str | None,
          timeout: float, **rendezvous: Any) -> torch.device:
    load_kernels_eagerly_for_nccl(device, backend)
    device = default_device() if device is None else torch.device(device)
    backend = backend or backend_for(device)
    bound = None
    if device.type == "cuda":
        # More local ranks than GPUs share them in turn (gloo takes that; NCCL only from
        # 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, and refuses it otherwise).
        device = bound = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    dist.init_process_group(backend,
                            timeout=datetime.timedelta(seconds=timeout), device_id=bound,
                            **rendezvous)
    return device


class _ErrorOutput:
    """A spawned process's error output: passed on to this process's stderr as it comes,
    its last few KiB kept."""

    def __init__(self, receiver: Connection, name: str) -> None:
        self._receiver = receiver
        self._kept = b""
        self._thread = threading.Thread(target=self._forward, name=name, daemon=True)
        self._thread.start()

    def _forward(self) -> None:
        forward = True
        while data := os.read(self._receiver.fileno(), 65536):
            self._kept = (self._kept + data)[-_KEPT_OUTPUT_BYTES:]
            while forward and data:
                try:
                    data = data[os.write(2, data):]
                except OSError:  # our stderr is gone: keep reading, for the end
                    forward = False
        self._receiver.close()

    def last_lines(self) -> list[str]:
        """The last lines the process wrote (waiting a moment for the pipe to drain)."""
        self._thread.join(1.0)
        return self._kept.decode(errors="replace").strip().splitlines()[-_QUOTED_LINES:]


@dataclass
class LocalGroup:
    """Processes started by ``start``; ``join`` collects what each one returned."""

    processes: Sequence[multiprocessing.process.BaseProcess]
    results: list[Connection]
    store: Any  # the rendezvous store: it must outlive the processes' start-up
    error_output: Sequence[_ErrorOutput]

    def join(self, grace: float = DEFAULT_GRACE) -> list[Any]:
        """Wait for every process; return their results in rank order.

        Once a process has failed (raised, or exited without a result), the others get
        ``grace`` seconds to end; those still running then are terminated. Processes that
        delivered their results get as long to exit. Raises ``SpawnError`` naming each rank
        that returned no result and what became of it.
        """
        _check_grace(grace)
        results: dict[int, Any] = {}
        # Ranks that failed, in the order they did: their tracebacks and what failed in one
        # line, None if they exited without a result.
        failed: dict[int, tuple[str, str] | None] = {}
        pending = {conn: rank for rank, conn in enumerate(self.results)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        deadline = math.inf
        try:
            while len(results) + len(failed) < len(self.processes):
                timeout = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
                ready = wait([*pending, *sentinels], timeout)
                if not ready:
                    break  # the grace period is over
                for item in ready:
                    if item in pending:
                        rank = pending.pop(item)
                        try:
                            ok, value = item.recv()
                        except EOFError:  # the process has ended without a result
                            failed[rank] = None
                            continue
                        if ok:
                            results[rank] = value
                        else:
                            failed[rank] = value
                    elif item in sentinels:
                        rank = sentinels.pop(item)
                        conn = self.results[rank]
                        # Its result (or the end of the pipe) may still be there to read.
                        if conn in pending and not conn.poll():
                            del pending[conn]
                            failed[rank] = None
                if failed and deadline == math.inf:
                    deadline = time.monotonic() + grace
        except BaseException:
            # Ctrl-C, most likely: no process may outlive this one (each would wait on its
            # peers until the timeout, and multiprocessing would wait for each at exit).
            self.terminate(grace)
            raise
        running = [rank for rank in range(len(self.processes))
                   if rank not in results and rank not in failed]
        for rank in running:
            self.processes[rank].terminate()
        self._reap(time.monotonic() + grace)
        # Stop serving now, not at interpreter exit, when the store's thread may outlive
        # what it needs.
        self.store = None
        if failed:
            raise self._error(failed, running, grace)
        return [results[rank] for rank in range(len(self.processes))]

    def terminate(self, grace: float = DEFAULT_GRACE) -> None:
        """Terminate every process still running and wait for it to exit; kill those still
        there after ``grace`` seconds."""
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        self._reap(time.monotonic() + grace)
        self.store = None

    def _reap(self, until: float) -> None:
        """Wait for every process to exit until ``until`` (monotonic seconds); kill the
        rest."""
        for process in self.processes:
            process.join(max(0.0, until - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

    def _error(self, failed: dict[int, tuple[str, str] | None], running: list[int],
               grace: float) -> SpawnError:
        first = next(iter(failed))
        stories: dict[int, str] = {}
        ranks_by_line: dict[str, list[int]] = {}
        for rank, failure in failed.items():
            if failure is None:
                line, stories[rank] = self._exit_story(rank)
            else:
                stories[rank], line = failure
            ranks_by_line.setdefault(line, []).append(rank)
        if running:
            line = f"still running {grace:g}s after rank {first} failed: terminated"
            ranks_by_line[line] = running
            for rank in running:
                stories[rank] = line + _quoted(self.error_output[rank].last_lines())
        message = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} "
                            f"{', '.join(map(str, sorted(ranks)))}: {line}"
                            for line, ranks in ranks_by_line.items())
        return SpawnError(message, dict(sorted(stories.items())), first)

    def _exit_story(self, rank: int) -> tuple[str, str]:
        """How a process that returned no result exited: one line, and the whole story."""
        code = self.processes[rank].exitcode
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                how += f" ({signal.Signals(-code).name})"
            except ValueError:  # a signal without a name
                pass
        output = self.error_output[rank].last_lines()
        line = f"{how} without a result"
        if output:
            line += f"; its last error output: {output[-1].strip()}"
        return line, f"process {how} without a result" + _quoted(output)


def _check_grace(grace: float) -> None:
    if not (isinstance(grace, (int, float)) and math.isfinite(grace) and grace >= 0):
        raise ValueError(f"grace must be a finite number of seconds >= 0, got {grace!r}")


def _quoted(output: list[str]) -> str:
    return "; its last error output:\n" + "\n".join(output) if output else ""


def nccl_runtime_version() -> tuple[int, ...]:
    """The version of the NCCL library this process runs. ``torch.cuda.nccl.version()`` is
    the one torch was built against, which a newer ``libnccl.so.2`` (a newer nvidia-nccl
    package, ``LD_PRELOAD``) replaces at run time; that one is asked (``ncclGetVersion``)
    where torch has loaded it."""
    try:
        library = ctypes.CDLL("libnccl.so.2")  # torch's CUDA build has loaded it already
        code = ctypes.c_int()
        if library.ncclGetVersion(ctypes.byref(code)) == 0:
            return nccl_version_of(code.value)
    except (OSError, AttributeError):
        pass
    return tuple(torch.cuda.nccl.version())


def nccl_version_of(code: int) -> tuple[int, int, int]:
    """(major, minor, patch) of an ``NCCL_VERSION_CODE``: major x 10000 + minor x 100 +
    patch from NCCL 2.9, major x 1000 + minor x 100 + patch before (NVIDIA/nccl nccl.h)."""
    major = code // 10000 if code >= 20900 else code // 1000
    rest = code - major * (10000 if code >= 20900 else 1000)
    return major, rest // 100, rest % 100


def shared_gpu_refusal(nprocs: int, gpus: int, nccl_version: tuple[int, ...],
                       multi_rank_gpu_enable: str | None) -> str | None:
    """Why NCCL would refuse ``nprocs`` local ranks on ``gpus`` GPUs, or None if it takes
    them. More ranks than GPUs put two on one GPU, which NCCL refuses ("Duplicate GPU
    detected") unless it is 2.30 or newer and NCCL_MULTI_RANK_GPU_ENABLE=1
    (``ncclParamMultiRankGpuEnable``, NVIDIA/nccl v2.30.3 src/init.cc)."""
    if nprocs <= gpus or (nccl_version >= (2, 30) and multi_rank_gpu_enable == "1"):
        return None
    version = ".".join(map(str, nccl_version))
    how = ("NCCL_MULTI_RANK_GPU_ENABLE=1 allows it" if nccl_version >= (2, 30)
           else "NCCL 2.30 and newer allow it with NCCL_MULTI_RANK_GPU_ENABLE=1")
    return (f"{nprocs} ranks on {gpus} GPU(s) put two ranks on one GPU, which NCCL {version} "
            f"refuses ({how}); use the gloo backend (CUDA tensors then travel through host "
            f"memory) or at most {gpus} rank{'s' if gpus != 1 else ''}")


def start(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
          device: torch.device | str = "cpu", backend: str | None = None,
          timeout: float = DEFAULT_TIMEOUT) -> LocalGroup:
    """Start ``nprocs`` local processes; each joins the process group and calls
    ``fn(*args)``. ``fn`` and ``args`` must pickle, and ``fn`` must be importable by a new
    process: a function defined at the top level of a module (not in an interactive
    session or ``python -c``).

    As torchrun does, each process runs its CPU ops on one thread unless OMP_NUM_THREADS
    says otherwise: several processes share the cores.
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    backend = _check_group_args(device, backend, timeout)
    if (torch.device(device).type == "cuda" and torch.cuda.is_available()
            and (backend or backend_for(device)) == "nccl"):
        refusal = shared_gpu_refusal(nprocs, torch.cuda.device_count(),
                                     nccl_runtime_version(),
                                     os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE"))
        if refusal is not None:
            raise ValueError(refusal)
    try:
        payload = pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(f"cannot send the function to the spawned processes: {error}; give "
                        "a function defined at the top level of a module") from error
    store = dist.TCPStore(LOOPBACK, 0, None, True,
                          timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    context = _context()
    processes: list[multiprocessing.process.BaseProcess] = []
    results: list[Connection] = []
    error_output: list[_ErrorOutput] = []
    group = LocalGroup(processes, results, store, error_output)
    try:
        for rank in range(nprocs):
            receiver, sender = context.Pipe(duplex=False)
            error_receiver, error_sender = context.Pipe(duplex=False)
            # This process's output as it is now (the server forked from has its own).
            output = Connection(os.dup(1))
            process = context.Process(
                target=_child, name=f"realcomm-rank{rank}",
                args=(rank, nprocs, store.port, str(device), backend, timeout, payload,
                      tuple(args), sender, error_sender, output, dict(os.environ)))
            process.start()
            sender.close()
            error_sender.close()
            output.close()
            processes.append(process)
            results.append(receiver)
            error_output.append(_ErrorOutput(error_receiver, f"realcomm-rank{rank}-stderr"))
    except BaseException:  # Ctrl-C while starting: those started wait for the rest
        group.terminate()
        raise
    return group


def spawn(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
          device: torch.device | str = "cpu", backend: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, grace: float = DEFAULT_GRACE) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` local processes of one process group and return
    what each returned, in rank order (see ``start`` and ``LocalGroup.join``: once one
    process fails, the others get ``grace`` seconds before they are terminated)."""
    _check_grace(grace)
    return start(fn, nprocs, args, device=device, backend=backend, timeout=timeout
                 ).join(grace)


def _failure(error: BaseException) -> tuple[bool, tuple[str, str]]:
    """What a process sends when ``error`` (being handled) ends it: its traceback, and the
    error in one line for ``SpawnError``'s message (without the notes that a traceback
    prints after it, which say where, as the message does)."""
    lines = traceback.format_exception_only(error)
    line = lines[len(lines) - len(getattr(error, "__notes__", ())) - 1]
    return False, (traceback.format_exc(), " ".join(line.split()))


def _context() -> multiprocessing.context.BaseContext:
    """How the processes start: forked from a server process that has imported torch once
    (a fresh interpreter spends about 3 s of CPU importing it, at every start of a test
    suite or a sweep) and has not initialised CUDA, so that forking is safe. Where there is
    no fork (Windows), a fresh interpreter each."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "realcomm"])
    return context


def _child(rank: int, nprocs: int, port: int, device: str, backend: str | None,
           timeout: float, payload: bytes, args: tuple[Any, ...], results: Connection,
           error_output: Connection, output: Connection, environment: dict[str, str]
           ) -> None:
    # The parent's environment and output as they are now, as a fresh interpreter would
    # get them (the server forked from keeps those it started with).
    os.environ.clear()
    os.environ.update(environment)
    os.dup2(output.fileno(), 1)
    output.close()
    os.dup2(error_output.fileno(), 2)  # all of it, the C++ libraries' included
    error_output.close()
    try:
        try:
            fn = pickle.loads(payload)
        except Exception as error:
            raise RuntimeError(
                f"cannot load the function to run in the spawned process ({error}): it "
                "must be importable by a new process, defined at the top level of a module "
                "(not in an interactive session or python -c)") from error
        # Said here, not left to torch: it read the server's environment when it loaded.
        threads = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
        store = dist.TCPStore(LOOPBACK, port, None, False,
                              timeout=datetime.timedelta(seconds=timeout))
        _init(rank, device, backend, timeout, store=store, rank=rank, world_size=nprocs)
        outcome: tuple[bool, Any] = (True, fn(*args))
    except BaseException as error:  # reported to the parent, which raises SpawnError
        outcome = _failure(error)
    try:
        results.send(outcome)
    except (pickle.PicklingError, AttributeError, TypeError) as error:  # it does not pickle
        results.send(_failure(error))
    results.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    # The result is delivered: leave now. Tearing down the interpreter runs torch's C++
    # destructors after its threads, which now and then aborts the process ("terminate
    # called without an active exception") for no fault of the run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
