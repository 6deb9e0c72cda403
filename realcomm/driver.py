"""The driver: runs one rank's op generator over a torch.distributed process group.

Each op of ``algorithms.ops`` becomes torch work on the tensor's own device:

* ``Send`` / ``Recv`` are queued and posted together with ``batch_isend_irecv`` when the
  task next blocks (NCCL needs a send and a receive between the same two ranks in one batch,
  or both ranks block in their send). A message larger than ``slice_bytes`` travels as
  several slices, so that the reduction of one slice overlaps the transfer of the next.
* A plain ``Recv`` lands in its buffer directly. A reducing one lands in a scratch buffer
  that the driver owns and reuses (keyed by length, dtype and device), and is folded into
  the buffer with an in-place torch op once the data is there.
* gloo cannot move CUDA memory (its point-to-point ops take the pointer for host memory), so
  over gloo a CUDA tensor travels through host memory: a send is copied out when it is
  posted, a receive lands in a host buffer and is copied or folded in when waited.
* ``Wait`` waits for the works; ``Copy``, ``Combine``, ``Divide`` and ``Alloc`` are torch
  ops;
  ``Compute`` runs its ``work`` if it has one (a real layer's forward, say), else sleeps for
  its seconds (it stands for a kernel), one at a time per rank.
* ``Spawn`` / ``Join`` run tasks cooperatively in one thread: when every task is blocked,
  the driver waits for the one Wait there is in this thread, or for several at once in
  helper threads (gloo's works cannot be polled: ``is_completed`` stays false until
  ``wait`` is called).

Message semantics follow ``algorithms.ops``: a receive's data is there once it is waited.
A Wait finishes its sends before it folds a receive into memory that those sends read, and
applies its receives in the order it names them, so a run gives the same bits as
``simcomm``. The rules of memory are ``algorithms.protocol``'s, the simulator's too: from
posting to its Wait nothing else reads a receive's buffer or writes it by a local op, so a
plain receive can land in place, whenever it arrives.

Channels: the main task runs on channel 0, the driver's own process group. Every other
channel a task may be spawned on is declared when the driver is made, and gets a process
group of its own (on NCCL, tags are ignored and point-to-point ops match in issue order per
communicator, so channels sharing one would cross). ``torch.distributed.new_group`` is
collective over the whole default group, so every process constructs its drivers with the
same ranks and channels in the same order, members or not.

On NCCL three more things are meant to keep the ranks from waiting on each other for ever
(docs/realcomm.md says which of them a GPU has confirmed). The driver connects every pair
of ranks on every channel when it starts (``_connect_every_pair`` says why); it wants CUDA
to load every kernel when it starts (``CUDA_MODULE_LOADING=EAGER``, which
``realcomm.launch`` sets for NCCL, and the driver warns without): a kernel loaded at its
first launch waits for the GPU's running kernels, a waiting NCCL kernel among them; and it
polls an NCCL work until it is done before it waits for it (``_wait_until``).

Every blocking wait has a deadline (``timeout`` seconds). A peer that dies or never
answers makes the waiting rank raise ``PeerError`` naming the peer and the op, instead of
hanging. Afterwards the process group is broken (gloo closes its connections on a
timeout): destroy it, as after any error in the middle of a run.

Check mode (``Driver(check=True)``, off by default) checks every message, as the simulator
does: each Send is preceded, in the same batch and on the same channel, by a header of two
int64s (its length and dtype), and the matching Recv compares it with its own buffer at its
Wait (``MessageSizeError``). The data of a message travels on a tag made from its length
and dtype, so data never meets a receive of another size or dtype (gloo would abort the
receiving process, or fill part of the buffer, or take the bytes as another type); the
headers travel on tag 0, in order. At a send's Wait the driver compares a checksum of the
buffer with the one taken at posting (``ProtocolError``). It costs a small message and two
passes over the data per message. NCCL ignores tags: there the header still matches its
message, but a mismatched message may fail inside NCCL before the check sees it.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import heapq
import inspect
import itertools
import math
import numbers
import os
import queue
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Generator, Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.profiler

from algorithms.buffers import chunk_bounds
from algorithms.collectives import slowed
from algorithms.ops import (
    TUNER_SHAPE, Alloc, Combine, Comm, Compute, Copy, Divide, Recv, ReduceOp, Send, Sleep, Tuner,
    Wait, check_callback,
)
from algorithms.protocol import (
    BLOCKED, MAIN_CHANNEL, DeadlockError, Handle, Interpreter, MessageSizeError, ProtocolError,
    Task, overlaps,
)

DEFAULT_TIMEOUT = 300.0  # seconds
# The timeout bounds the start-up rendezvous of the processes too, and torch counts it in
# whole milliseconds (a shorter one is 0 and fails at once): below a second (the unit of
# nccl-tests' -T) it fails a sound run on a busy machine. Above a day it is no timeout, and
# torch's socket code overflows on 1e10 s (a timeout "after 10000000000000ms" at once).
MIN_TIMEOUT = 1.0
MAX_TIMEOUT = 86400.0
MIN_WAIT = 1e-3  # the least a Driver takes: torch counts its timeouts in whole milliseconds
# Messages above slice_bytes travel as slices of about that size. Off by default: on two
# CPU cores over loopback gloo, 1 and 4 MiB slices brought ring all-reduce no steady gain
# at 16 and 64 MiB and were up to 50% slower in some runs (docs/realcomm.md): the copies
# at both ends already keep the cores busy, so a reduction has nothing to overlap with.
DEFAULT_SLICE_BYTES = 0
# Newer torch renames the tensor form of all-gather.
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
# Check mode: a message's header travels on this tag, its data on a tag of its own (_data_tag).
_HEADER_TAG = 0
_MAX_TAG = 2**31 - 1  # gloo takes tags that fit an int
_HOST = torch.device("cpu")
# CUDA loads a kernel at its first launch unless told to load them all when it starts, and
# that loading waits for the kernels running on the GPU, NCCL's waiting ones too. A rank that
# first reduces while an NCCL operation of its own waits for a peer who is doing the same
# would wait for ever (see the module's docstring).
MODULE_LOADING, EAGER_LOADING = "CUDA_MODULE_LOADING", "EAGER"


_EAGER_LOADING_MODE = 1  # CU_MODULE_EAGER_LOADING, cuda.h's CUmoduleLoadingMode
_POLL_SECONDS = 20e-6  # between two looks at an NCCL work (torch's own wait sleeps 1 ms)
# Integer types by width, to read a buffer's bytes as words for its checksum.
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def check_timeout(name: str, seconds: float, minimum: float = MIN_TIMEOUT) -> None:
    """Refuse a timeout that is not a number of seconds from ``minimum`` to
    ``MAX_TIMEOUT``, naming it ``name`` (a keyword or a command-line flag)."""
    number = isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
    if not (number and math.isfinite(seconds) and minimum <= seconds <= MAX_TIMEOUT):
        given = f"{seconds:g}" if number else repr(seconds)
        raise ValueError(f"{name} must be a finite number of seconds from {minimum:g} to "
                         f"{MAX_TIMEOUT:g} (a day), got {given}")


class RealcommError(Exception):
    """Base of the errors of a real run that are not the algorithm's (those are
    ``algorithms.protocol.AlgorithmError``): the ranks disagree, a peer failed."""


class ArgumentMismatchError(RealcommError):
    """The ranks of one run disagree on the algorithm, its parameters or the buffers."""


class PeerError(RealcommError):
    """Waiting on other ranks failed: a peer died or closed its connection."""


class PeerTimeoutError(PeerError):
    """Other ranks did not answer within the timeout."""


def _combine_sum(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    acc.add_(incoming)


def _combine_prod(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    acc.mul_(incoming)


def _combine_max(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    torch.maximum(acc, incoming, out=acc)


def _combine_min(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    torch.minimum(acc, incoming, out=acc)


_COMBINE: dict[ReduceOp | None, Callable[[torch.Tensor, torch.Tensor], None]] = {
    ReduceOp.SUM: _combine_sum, ReduceOp.AVG: _combine_sum,  # AVG travels as a sum
    ReduceOp.PROD: _combine_prod, ReduceOp.MAX: _combine_max, ReduceOp.MIN: _combine_min,
}


def _check_reducible(algorithm: Callable[..., Any], params: dict[str, Any],
                     x: torch.Tensor) -> None:
    """Refuse, on every rank alike, a reduction that torch has no arithmetic for (uint32 and
    float8 have none on the CPU, complex numbers no maximum), before any rank waits on
    another that has failed."""
    op = params.get("op")
    if op is None:
        try:
            declared = inspect.signature(algorithm).parameters.get("op")
        except (TypeError, ValueError):  # a callable without a signature to read
            declared = None
        op = None if declared is None else declared.default
    combine = _COMBINE.get(op) if isinstance(op, ReduceOp) else None
    if combine is None:
        return
    probe = torch.ones(2, dtype=x.dtype, device=x.device)  # torch fails some ops at length 1
    try:
        combine(probe, probe)
        if op is ReduceOp.AVG:
            divide_(probe, 2)
    except (NotImplementedError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TypeError(f"torch cannot {op.value}-reduce {x.dtype} tensors on "
                        f"{x.device.type} ({reason}); use a dtype it has arithmetic for"
                        ) from None


def divide_(buf: torch.Tensor, divisor: int) -> None:
    """Divide in place; integers truncate toward zero, as ``algorithms.reference.divide``."""
    if buf.is_floating_point():
        buf.div_(divisor)
    else:
        buf.div_(divisor, rounding_mode="trunc")


def _nccl_options(max_ctas: int | None, timeout: datetime.timedelta) -> Any:
    """Options for a new NCCL process group that caps its CTAs, or None: NCCL's defaults,
    and the only options another backend takes. They carry the group's timeout too, which
    torch otherwise warns would override theirs."""
    if max_ctas is None or dist.get_backend() != "nccl":
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.config.max_ctas = max_ctas
    options._timeout = timeout
    return options


def _check_every_process_agrees(ranks: Sequence[int] | None, channels: Sequence[Hashable],
                                check: bool, slice_bytes: int, local_size: int | None) -> None:
    """Refuse drivers that the processes construct with different arguments that must
    match: each process would make a different number of process groups (and wait in
    ``new_group`` until its timeout), or cut or check its messages differently from its
    peers' (a receive of another size than its send). Collective over the default group,
    as constructing a driver is."""
    mine = {"ranks": None if ranks is None else sorted(int(rank) for rank in ranks),
            "channels": [repr(name) for name in channels], "check": check,
            "slice_bytes": slice_bytes, "local_size": local_size}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for rank, theirs in enumerate(every):
        differ = [key for key in mine if theirs[key] != mine[key]]
        if differ:
            raise ValueError(
                f"Driver: process {dist.get_rank()} and process {rank} construct it with "
                "different " + ", ".join(
                    f"{key} ({mine[key]!r} against {theirs[key]!r})" for key in differ)
                + "; every process must give the same ranks, channels, check, slice_bytes "
                "and local_size")


class Driver:
    """Runs op generators for this process over a group of ranks.

    ``ranks`` are global ranks of the default process group (all of them if None); the
    algorithm sees their positions in that list as its ranks. Constructing a driver is
    collective over the default group (see the module doc): every process calls it with
    the same arguments (ranks, channels, check, slice_bytes and local_size are compared, and
    a difference is refused with ``ValueError`` on every process); a process outside
    ``ranks`` gets a driver that cannot run. With
    ``check``, every message is checked (see the module doc): a receive of another size or
    dtype than its send raises ``MessageSizeError``, a send whose buffer changed before its
    Wait ``ProtocolError``. ``local_size`` (ranks per node, consecutive) is what
    hierarchical algorithms see as ``Comm.local_size``; by default torchrun's
    LOCAL_WORLD_SIZE for a driver over the whole world, else one node. ``tuner`` is
    ``Comm.tuner``: what algorithms that choose per call (``algorithms.tuned.nccl_allreduce``)
    ask; it must answer every process alike. ``slow_per_op`` makes this rank a straggler on
    purpose: it sleeps that many seconds before each op of ``run``'s algorithm
    (``algorithms.collectives.slowed``), for testing. ``nccl_channel_ctas``, where the
    backend is NCCL, is the most CTAs (NCCL's ``max_ctas``) NCCL gives the communicator of
    each channel beyond the main one: NCCL sizes a communicator's buffers by its channel
    count, so 1 takes far less GPU memory per channel (35 MiB against 1.2 GB per rank on
    one H200, docs/gpu.md), one CTA a channel as the simulator models it; None leaves
    NCCL's default. Other backends ignore it.
    """

    def __init__(self, ranks: Sequence[int] | None = None, *, channels: Sequence[Hashable] = (),
                 timeout: float = DEFAULT_TIMEOUT,
                 slice_bytes: int = DEFAULT_SLICE_BYTES, check: bool = False,
                 local_size: int | None = None, tuner: Tuner | None = None,
                 slow_per_op: float = 0.0, nccl_channel_ctas: int | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start the process "
                               "with realcomm.launch (init_from_env or spawn) first")
        check_timeout("timeout", timeout, minimum=MIN_WAIT)
        if not isinstance(slice_bytes, int) or slice_bytes < 0:
            raise ValueError(f"slice_bytes must be an int >= 0, got {slice_bytes!r}")
        if not isinstance(check, bool):
            raise TypeError(f"check must be a bool, got {check!r}")
        if not (isinstance(slow_per_op, (int, float)) and math.isfinite(slow_per_op)
                and slow_per_op >= 0):
            raise ValueError(f"slow_per_op must be finite seconds >= 0, got {slow_per_op!r}")
        self.slow_per_op = float(slow_per_op)
        if nccl_channel_ctas is not None and not (
                isinstance(nccl_channel_ctas, int) and not isinstance(nccl_channel_ctas, bool)
                and nccl_channel_ctas >= 1):
            raise ValueError(f"nccl_channel_ctas must be an int >= 1 (or None: NCCL's "
                             f"default), got {nccl_channel_ctas!r}")
        check_callback(tuner, 2, "tuner", TUNER_SHAPE)
        names = list(channels)
        if MAIN_CHANNEL in names or len(set(names)) != len(names):
            raise ValueError(f"channels must be distinct and leave out {MAIN_CHANNEL!r}, the "
                             f"main task's, got {names!r}")
        _check_every_process_agrees(ranks, names, check, slice_bytes, local_size)
        self.timeout = float(timeout)
        self.slice_bytes = slice_bytes
        self.check = check
        pg_timeout = datetime.timedelta(seconds=timeout)
        if ranks is None:
            group: Any = dist.group.WORLD
        else:
            group = dist.new_group(sorted(ranks), timeout=pg_timeout)
        self._groups: dict[Hashable, Any] = {MAIN_CHANNEL: group}
        options = _nccl_options(nccl_channel_ctas, pg_timeout)
        for name in names:
            self._groups[name] = dist.new_group(
                None if ranks is None else sorted(ranks), timeout=pg_timeout,
                pg_options=options)
        self.is_member = group != dist.GroupMember.NON_GROUP_MEMBER
        # Peers are ranks of the group; torch's point-to-point ops take global ranks.
        self._global_ranks: list[int] = []
        self._scratch: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        backend = dist.get_backend(group) if self.is_member else None
        # gloo moves host memory only: CUDA tensors are staged through it.
        self._stages_cuda = backend == "gloo"
        # NCCL's works are polled before they are waited for (see _wait_until).
        self._polls = backend == "nccl"
        if self.is_member:
            size = dist.get_world_size(group)
            if local_size is None and ranks is None:
                local_size = launcher_local_size(size)
            self.comm = Comm(dist.get_rank(group), size, local_size, tuner)
            self._global_ranks = dist.get_process_group_ranks(group)
            # Every rank of a new communicator takes part in its first op: NCCL wants that
            # of batched point-to-point ops, which may involve only some ranks.
            for channel_group in self._groups.values():
                dist.barrier(group=channel_group)
            if backend == "nccl":
                self._connect_every_pair()
                if cuda_loads_kernels_eagerly() is False:
                    warnings.warn(
                        f"CUDA loads each kernel at its first launch, waiting for the running "
                        "NCCL kernels, and a run that overlaps its sends with local work can "
                        f"hang on that; set {MODULE_LOADING}={EAGER_LOADING} before CUDA "
                        "starts (realcomm's launcher does)", RuntimeWarning, stacklevel=2)

    def _connect_every_pair(self) -> None:
        """Connect every pair of ranks, both ways, on every channel, one channel after the
        other in the declared order.

        NCCL connects two ranks of a communicator at their first send or receive to each
        other, inside the call that posts it, and blocks there until the peer posts its own.
        Left to the algorithm, that goes wrong twice: a rank whose first batch with a peer
        holds a send and a receive, while the peer's holds only one of them, makes the two
        exchange connection records of different sizes (NCCL fails with "Message
        truncated", src/transport.cc, v2.30.7); and two ranks that first meet on different
        channels wait in different communicators for each other, forever. Once connected,
        a pair never connects again, so the algorithm's sends and receives no longer block
        in the call that posts them.

        Connecting has no deadline of its own: a peer that dies between the barriers above
        and this leaves the call waiting."""
        peers = [peer for peer in self._global_ranks if peer != dist.get_rank()]
        if not peers:
            return
        # The device the communicators were made for (realcomm.launch binds each process
        # group to it); NCCL tensors of a run must live there too.
        device = (getattr(self.group, "bound_device_id", None)
                  or torch.device("cuda", torch.cuda.current_device()))
        token = torch.zeros(1, device=device)
        for channel_group in self._groups.values():
            ops = []
            for peer in peers:
                ops += [dist.P2POp(dist.isend, token, peer, group=channel_group),
                        dist.P2POp(dist.irecv, torch.empty(1, device=device), peer,
                                   group=channel_group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    @property
    def group(self) -> Any:
        """The process group of the main channel (for torch's own collectives on it)."""
        return self._groups[MAIN_CHANNEL]

    @property
    def channels(self) -> tuple[Hashable, ...]:
        """The channels a task may be spawned on (the main channel not included)."""
        return tuple(name for name in self._groups if name != MAIN_CHANNEL)

    def close(self) -> None:
        """Destroy the process groups this driver made (its channels', and its main one
        unless it is the world's), freeing their communicators; the driver cannot run
        after. Collective, as making it was."""
        for group in self._groups.values():
            if group not in (dist.group.WORLD, dist.GroupMember.NON_GROUP_MEMBER):
                dist.destroy_process_group(group)
        self._groups = {}
        self.is_member = False

    def run(self, algorithm: Callable[..., Any], x: torch.Tensor, /, *,
            check_args: bool = True, equal_lengths: bool = True, **params: Any) -> Any:
        """Run ``algorithm(comm, x, **params)`` for this rank and return its result.

        Collective: every rank of the driver calls it. The algorithm works on ``x`` in place
        (a 1-D contiguous tensor; CPU tensors need gloo, CUDA tensors go over NCCL, or over
        gloo through host memory). With
        ``check_args`` the ranks first compare the algorithm, its parameters, the dtype and
        device type, the channels, the slicing, check mode and (with ``equal_lengths``;
        turn it off for an uneven all-to-all) the length, and all raise
        ``ArgumentMismatchError`` if they differ. It costs one small collective, so timing
        loops turn it off.
        """
        if not self.is_member:
            raise RuntimeError("this process is not one of the driver's ranks, or the driver is "
                               "closed")
        problem = tensor_problem(x)
        if problem is not None:
            raise TypeError(f"x must be a 1-D contiguous torch tensor, got {problem}")
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_contiguous():
            raise TypeError(f"x must be a 1-D contiguous torch tensor, got "
                            f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
        if x.requires_grad:
            raise ValueError("x requires grad, and an algorithm works on it in place: pass "
                             "x.detach(), or a gradient (which does not require grad)")
        if check_args:
            self._check_args(algorithm, x, params, equal_lengths)
            _check_reducible(algorithm, params, x)
        gen = algorithm(self.comm, x, **params)
        name = getattr(algorithm, "__name__", repr(algorithm))
        if not isinstance(gen, Generator):
            raise TypeError(f"{name!r} did not return a generator: an algorithm is a "
                            "generator function that yields ops")
        if self.slow_per_op:
            gen = slowed(gen, self.slow_per_op)
        # Named in a torch profiler trace, as torch's own collectives are.
        with torch.profiler.record_function(f"realcomm:{name}"):
            return _Run(self).execute(gen)

    def _check_args(self, algorithm: Callable[..., Any], x: torch.Tensor,
                    params: dict[str, Any], equal_lengths: bool) -> None:
        mine = {
            "algorithm": f"{getattr(algorithm, '__module__', '?')}."
                         f"{getattr(algorithm, '__qualname__', repr(algorithm))}",
            "params": repr(sorted(params.items())),
            "dtype": str(x.dtype),
            "device type": x.device.type,
            "channels": repr(self.channels),
            "slice_bytes": str(self.slice_bytes),
            "message check": str(self.check),
            "local size": str(self.comm.local_size),
        }
        if equal_lengths:
            mine["length"] = str(len(x))
        # Compare digests first: a collective of fixed size whose wait has a deadline.
        digest = hashlib.sha256(repr(sorted(mine.items())).encode()).digest()
        mine_tensor = torch.tensor(list(digest), dtype=torch.uint8, device=x.device)
        everyone_tensor = torch.empty(self.comm.size * len(digest), dtype=torch.uint8,
                                      device=x.device)
        deadline = time.monotonic() + self.timeout
        try:
            _wait_until(_all_gather(everyone_tensor, mine_tensor, group=self.group,
                                    async_op=True), deadline, self._polls)
        except RuntimeError as error:
            raise _peer_error(self.comm.rank, "comparing this run's arguments with the "
                              "other ranks", error, deadline, self.timeout) from error
        if bool((everyone_tensor.view(self.comm.size, -1) == mine_tensor).all()):
            return
        # They differ: gather the readable form to say how (the group is healthy).
        everyone: list[Any] = [None] * self.comm.size
        dist.all_gather_object(everyone, mine, group=self.group)
        for key in mine:
            values = [theirs.get(key) for theirs in everyone]
            if len(set(values)) > 1:
                listed = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
                raise ArgumentMismatchError(f"ranks disagree on the {key} of this run: "
                                            f"{listed}")

    def _take_scratch(self, like: torch.Tensor, device: torch.device | None = None
                      ) -> torch.Tensor:
        device = like.device if device is None else device
        free = self._scratch.get((len(like), like.dtype, device))
        return free.pop() if free else torch.empty(len(like), dtype=like.dtype, device=device)

    def _give_scratch(self, buf: torch.Tensor) -> None:
        self._scratch.setdefault((len(buf), buf.dtype, buf.device), []).append(buf)


def cuda_loads_kernels_eagerly() -> bool | None:
    """Whether CUDA in this process loaded every kernel when it started
    (``CUDA_MODULE_LOADING=EAGER``) rather than each at its first launch, as the CUDA
    driver says (``cuModuleGetLoadingMode``); None where it cannot be asked (no CUDA
    driver, or CUDA not started)."""
    try:
        mode = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuModuleGetLoadingMode(ctypes.byref(mode)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return mode.value == _EAGER_LOADING_MODE


def _wait_until(work: Any, deadline: float, poll: bool) -> None:
    """``work.wait()``, giving up at ``deadline`` (monotonic seconds).

    ``poll`` (NCCL): first poll ``is_completed`` until the work is done. NCCL's ``wait``
    makes the thread's current CUDA stream wait for the work, then blocks. That stream is
    the default one, shared by every thread, and torch starts each NCCL operation only after
    the posting thread's current stream: a send posted on one channel while a helper thread
    waits on another would queue behind that other channel's receive. Two ranks each waiting
    for the other on different channels then hold back each other's sends, for ever."""
    if poll:
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
    # Whole milliseconds, rounded up, at least one: gloo counts whole milliseconds (a
    # shorter wait would give up before the deadline, and read as a failed transport
    # rather than a timeout), and gives up at once on a zero timeout, even on works that
    # are already done.
    milliseconds = max(math.ceil((deadline - time.monotonic()) * 1000), 1)
    work.wait(datetime.timedelta(milliseconds=milliseconds))


def _peer_error(rank: int, what: str, error: Exception, deadline: float, timeout: float
                ) -> PeerError:
    timed_out = time.monotonic() >= deadline
    why = f"no answer within the timeout of {timeout:g}s" if timed_out else "the transport failed"
    kind = PeerTimeoutError if timed_out else PeerError
    return kind(f"rank {rank} gave up on {what}: {why} ({' '.join(str(error).split())})")


def _check_duration(task: _Task, what: str, seconds: float) -> None:
    """Refuse a Compute or Sleep that would hold a rank for longer than anything here
    waits (a day): time.sleep overflows on 1e300, and peers gave up long before."""
    if seconds > MAX_TIMEOUT:
        raise ProtocolError(f"rank {task.rank} yielded a {what} of {seconds:g} s on channel "
                            f"{task.channel!r}: realcomm runs none longer than "
                            f"{MAX_TIMEOUT:g} s (a day), its longest timeout")


def tensor_problem(buf: Any) -> str | None:
    """What makes a tensor unfit to carry data here, in words, or None (a tensor that
    holds no dense data: torch's own messages would fail on it, or misname it)."""
    if not isinstance(buf, torch.Tensor):
        return None
    if buf.layout != torch.strided:
        return f"a tensor of layout {buf.layout}: give a dense one (x.to_dense())"
    if buf.is_meta:
        return "a tensor on the meta device, which holds no data: give one on the CPU or a GPU"
    return None


def _span(buf: torch.Tensor) -> tuple[torch.device, int, int]:
    start = buf.data_ptr()
    return buf.device, start, start + buf.numel() * buf.element_size()


def launcher_local_size(world_size: int) -> int | None:
    """Ranks per node as torchrun tells them (LOCAL_WORLD_SIZE), if they divide the world;
    None otherwise (then a driver over the whole world takes it for one node)."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    if text.isdigit() and 0 < int(text) <= world_size and world_size % int(text) == 0:
        return int(text)
    return None


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # as numpy and the simulator name it


_DTYPE_NAMES = {_dtype_code(d): _dtype_name(d) for d in vars(torch).values()
                if isinstance(d, torch.dtype)}


def _data_tag(buf: torch.Tensor) -> int:
    """Check mode's tag for a message's data, from its length and dtype: never the header's."""
    return 1 + zlib.crc32(f"{len(buf)} {buf.dtype}".encode()) % (_MAX_TAG - 1)


def _checksum(buf: torch.Tensor) -> int:
    """The sum of the buffer's bytes taken as integers as wide as its elements (at most 8
    bytes), wrapping around in that width (so it is fast): any change of one element
    changes it."""
    words = buf.view(_WORDS[math.gcd(buf.element_size(), 8)])
    return int(words.sum(dtype=words.dtype))


class _Handle(Handle):
    """A posted Send or Recv, the slices it travels in once flushed, and in check mode its
    header (and a send's checksum at posting)."""

    __slots__ = ("scratch", "pieces", "header", "header_works", "checksum")

    def __init__(self, task: _Task, is_send: bool, peer: int, buf: torch.Tensor,
                 reduce: ReduceOp | None, label: str) -> None:
        # Flat: the bytes travel, so a buffer of any shape is sliced and landed as 1-D.
        super().__init__(task, is_send, peer, buf.view(-1), reduce, label, _span(buf))
        self.scratch: torch.Tensor | None = None  # where the data lands, if not in buf
        self.pieces: list[tuple[tuple[Any, ...], int, int]] = []  # (works, start, stop)
        self.header: torch.Tensor | None = None
        self.header_works: tuple[Any, ...] = ()
        self.checksum = 0


class _Task(Task):
    __slots__ = ("group", "queued")

    def __init__(self, rank: int, channel: Hashable, group: Any,
                 gen: Generator[Any, Any, Any]) -> None:
        super().__init__(rank, channel, gen)
        self.group = group
        self.queued: list[_Handle] = []  # posted by the algorithm, not yet given to torch


class _Run(Interpreter):
    """The state of one ``Driver.run``: its tasks and who is blocked on what."""

    buffer_kinds = (torch.Tensor,)
    buffer_advice = "give a torch tensor"

    def buffer_problem(self, buf: Any) -> str | None:
        return tensor_problem(buf) or super().buffer_problem(buf)

    def __init__(self, driver: Driver) -> None:
        super().__init__(driver.comm.size)
        self.driver = driver
        self.rank = driver.comm.rank
        self.global_ranks = driver._global_ranks
        self.ready: deque[tuple[_Task, Any]] = deque()
        self.waiting: list[tuple[_Task, tuple[_Handle, ...], float]] = []
        self.sleeping: list[tuple[float, int, _Task]] = []  # heap of (wake time, seq, task)
        self.sequence = itertools.count()
        self.compute_free = 0.0  # when this rank's compute stream is next free
        self.outstanding: dict[int, _Handle] = {}  # every task's handles, posted and flushed
        self.finished: queue.SimpleQueue[tuple[_Task, tuple[_Handle, ...],
                                               BaseException | None]] = queue.SimpleQueue()
        self.helpers = 0

    # -- scheduling ------------------------------------------------------------------------

    def execute(self, gen: Generator[Any, Any, Any]) -> Any:
        main = self.open_task(self.rank, gen, MAIN_CHANNEL)
        self.ready.append((main, None))
        while True:
            while self.ready:
                task, value = self.ready.popleft()
                self.step(task, value)
            if main.done:
                return main.result
            if not self.waiting and not self.helpers and not self.sleeping:
                raise self._deadlock(main)
            self._block()

    def _deadlock(self, main: _Task) -> DeadlockError:
        """Nothing runs, waits or sleeps: every live task waits for a Join of another."""
        stuck = [main]
        for task in stuck:  # a task that is done has joined its own: all live ones are found
            stuck.extend(child for child in task.children if not child.done)
        waits = "; ".join(f"{self.where(t)} waits for {t.blocked_on}" for t in stuck)
        return DeadlockError(f"deadlock on rank {self.rank}: every task waits for a Join of "
                             f"another, none for a message or a computation: {waits}")

    def _block(self) -> None:
        """Nothing can run: wait for a Wait to finish or a Compute to end."""
        if len(self.waiting) == 1 and not self.helpers and not self.sleeping:
            task, handles, deadline = self.waiting.pop()
            self._finish_wait(handles, deadline)
            self._after_wait(task, handles)
            return
        for task, handles, deadline in self.waiting:
            threading.Thread(target=self._helper, args=(task, handles, deadline),
                             daemon=True).start()
            self.helpers += 1
        self.waiting.clear()
        if self.helpers:
            timeout = None
            if self.sleeping:
                timeout = max(0.0, self.sleeping[0][0] - time.monotonic())
            try:
                task, handles, error = self.finished.get(timeout=timeout)
            except queue.Empty:
                pass
            else:
                self.helpers -= 1
                if error is not None:
                    raise error
                self._after_wait(task, handles)
        elif self.sleeping:
            time.sleep(max(0.0, self.sleeping[0][0] - time.monotonic()))
        now = time.monotonic()
        while self.sleeping and self.sleeping[0][0] <= now:
            self.ready.append((heapq.heappop(self.sleeping)[2], None))

    def _helper(self, task: _Task, handles: tuple[_Handle, ...], deadline: float) -> None:
        try:
            self._finish_wait(handles, deadline)
        except BaseException as error:  # handed to the scheduling thread, which raises it
            self.finished.put((task, handles, error))
        else:
            self.finished.put((task, handles, None))

    def new_task(self, rank: int, channel: Hashable, gen: Generator[Any, Any, Any]
                 ) -> _Task:
        group = self.driver._groups.get(channel)
        if group is None:
            raise ProtocolError(
                f"rank {self.rank} spawned a task on channel {channel!r}, which the driver "
                f"does not have; declare it: Driver(channels=[...]) (declared: "
                f"{list(self.driver.channels)!r})")
        return _Task(rank, channel, group, gen)

    def resume(self, task: Task, value: Any) -> None:
        self.ready.append((task, value))

    def run_child_first(self, task: Task, child: Task) -> Any:
        self.ready.appendleft((task, child))
        self.ready.appendleft((child, None))
        return BLOCKED

    def on_block(self, task: _Task) -> None:
        self._flush(task)

    # -- point to point --------------------------------------------------------------------

    def _post(self, task: _Task, op: Send | Recv) -> _Handle:
        is_send = isinstance(op, Send)
        what = "Send" if is_send else "Recv"
        self.check_peer(task, op.peer, what)
        self.check_buffer(task, what, op.buf, op.peer)
        h = _Handle(task, is_send, op.peer, op.buf, None if is_send else op.reduce, op.label)
        self.guard(h)
        task.queued.append(h)
        return h

    def send(self, task: _Task, op: Send) -> _Handle:
        h = self._post(task, op)
        if self.driver.check:  # as the algorithm posts it, before the batch goes out
            h.checksum = _checksum(h.buf)
        return h

    def recv(self, task: _Task, op: Recv) -> _Handle:
        return self._post(task, op)

    def _flush(self, task: _Task) -> None:
        """Hand the task's queued sends and receives to torch, in one batch."""
        if not task.queued:
            return
        ops, owners = [], []  # owners: (handle, start, stop), start -1 for a header
        for h in task.queued:
            self._place(h)
            target = h.buf if h.scratch is None else h.scratch
            post = dist.isend if h.is_send else dist.irecv
            peer = self.global_ranks[h.peer]
            tag = 0
            if self.driver.check:
                h.header = self._header(h)
                ops.append(dist.P2POp(post, h.header, peer, task.group, _HEADER_TAG))
                owners.append((h, -1, -1))
                tag = _data_tag(h.buf)
            for start, stop in self._slices(len(target), target.element_size()):
                ops.append(dist.P2POp(post, target[start:stop], peer, task.group, tag))
                owners.append((h, start, stop))
            self.outstanding[id(h)] = h
        task.queued.clear()
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as error:  # gloo refuses to post to a peer that has gone
            posted = "; ".join(h.describe() for h in dict.fromkeys(h for h, _, _ in owners))
            raise _peer_error(self.rank, f"posting {posted}", error, math.inf,
                              self.driver.timeout) from error
        # Backends that coalesce (NCCL) return one work for the whole batch.
        per_op = [(w,) for w in works] if len(works) == len(ops) else [tuple(works)] * len(ops)
        for (h, start, stop), op_works in zip(owners, per_op):
            if start < 0:
                h.header_works = op_works
            else:
                h.pieces.append((op_works, start, stop))

    @staticmethod
    def _header(h: _Handle) -> torch.Tensor:
        """Check mode: a send's header (its length and dtype), or the buffer for a
        receive's, where the message travels from."""
        device = (h.buf if h.scratch is None else h.scratch).device
        if not h.is_send:
            return torch.empty(2, dtype=torch.int64, device=device)
        return torch.tensor([len(h.buf), _dtype_code(h.buf.dtype)], dtype=torch.int64,
                            device=device)

    def _place(self, h: _Handle) -> None:
        """Decide where a receive lands: in its buffer, unless it reduces or its memory is
        shared with another send or receive in flight (the rules of ``algorithms.protocol``
        keep everything else off it until it is waited), or it travels through host memory;
        a send travelling through host memory is copied there now."""
        staged = self.driver._stages_cuda and h.buf.is_cuda
        if h.is_send:
            if staged:
                h.scratch = self.driver._take_scratch(h.buf, _HOST)
                h.scratch.copy_(h.buf)
            return
        if staged or h.reduce is not None or any(overlaps(h.span, o.span)
                                                 for o in self.outstanding.values()):
            h.scratch = self.driver._take_scratch(h.buf, _HOST if staged else None)

    def _slices(self, count: int, itemsize: int) -> list[tuple[int, int]]:
        slice_bytes = self.driver.slice_bytes
        nbytes = count * itemsize
        if not slice_bytes or nbytes <= slice_bytes:
            return [(0, count)]
        return chunk_bounds(count, -(-nbytes // slice_bytes))

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, task: _Task, op: Wait) -> Any:
        self._flush(task)
        for h in op.handles:  # a handle another task posted (checked below to be a handle)
            if isinstance(h, _Handle) and h.task is not task:
                self._flush(h.task)
        self.accept_wait(task, op.handles)
        self.waiting.append((task, op.handles, time.monotonic() + self.driver.timeout))
        return BLOCKED

    def _finish_wait(self, handles: Sequence[_Handle], deadline: float) -> None:
        """Wait for every handle and land the receives, in order. Runs in any thread."""
        if self.driver.check:
            self._check_messages(handles, deadline)
        finished: set[int] = set()
        for h in handles:
            if h.is_send or h.scratch is None:
                continue
            # Before this receive lands, the data of a send must have left and a receive
            # named before it (landing in place) must have arrived.
            for other in handles:
                if (id(other) not in finished and other.scratch is None and other is not h
                        and overlaps(h.span, other.span)):
                    self._wait_pieces(other, deadline)
                    finished.add(id(other))
            combine = _COMBINE.get(h.reduce)
            for works, start, stop in h.pieces:
                self._wait_works(h, works, deadline)
                arrived = h.scratch[start:stop].to(h.buf.device)
                if combine is None:
                    h.buf[start:stop].copy_(arrived)
                else:
                    combine(h.buf[start:stop], arrived)
            finished.add(id(h))
        for h in handles:
            if id(h) not in finished:
                self._wait_pieces(h, deadline)

    def _check_messages(self, handles: Sequence[_Handle], deadline: float) -> None:
        """Check mode, before anything lands: no send's buffer has changed since it was
        posted, and every receive's buffer matches its send's header."""
        for h in handles:
            if h.is_send:
                if _checksum(h.buf) != h.checksum:
                    raise ProtocolError(f"rank {self.rank} changed the buffer of its Send to "
                                        f"rank {h.peer} before waiting for it")
                continue
            self._wait_works(h, h.header_works, deadline)
            count, code = h.header.tolist()
            if count != len(h.buf) or code != _dtype_code(h.buf.dtype):
                raise MessageSizeError(
                    f"rank {self.rank} posted a Recv of {len(h.buf)} x "
                    f"{_dtype_name(h.buf.dtype)} from rank {h.peer} on channel "
                    f"{h.task.channel!r}, but the matching Send from rank {h.peer} carries "
                    f"{count} x {_DTYPE_NAMES.get(code, f'an unknown dtype ({code})')}")

    def _wait_pieces(self, h: _Handle, deadline: float) -> None:
        for works, _, _ in h.pieces:
            self._wait_works(h, works, deadline)

    def _wait_works(self, h: _Handle, works: tuple[Any, ...], deadline: float) -> None:
        for work in works:
            try:
                _wait_until(work, deadline, self.driver._polls)
            except RuntimeError as error:
                raise _peer_error(self.rank, f"its {h.describe()}", error, deadline,
                                  self.driver.timeout) from error

    def _after_wait(self, task: _Task, handles: Sequence[_Handle]) -> None:
        for h in handles:
            del self.outstanding[id(h)]
            if h.scratch is not None:
                self.driver._give_scratch(h.scratch)
                h.scratch = None
        self.ready.append((task, None))

    # -- local work ------------------------------------------------------------------------

    def compute(self, task: _Task, op: Compute) -> Any:
        if op.work is not None:  # the real computation, on this thread, now
            with torch.profiler.record_function(op.label):
                op.work()
            return None
        _check_duration(task, "Compute", op.seconds)
        now = time.monotonic()
        self.compute_free = max(now, self.compute_free) + op.seconds
        heapq.heappush(self.sleeping, (self.compute_free, next(self.sequence), task))
        return BLOCKED

    def sleep(self, task: _Task, op: Sleep) -> Any:
        _check_duration(task, "Sleep", op.seconds)
        heapq.heappush(self.sleeping, (time.monotonic() + op.seconds, next(self.sequence), task))
        return BLOCKED

    def copy(self, task: _Task, op: Copy) -> None:
        self.check_copy(task, op)
        self.check_local(task, "Copy", _span, reads=(op.src,), writes=(op.dst,))
        op.dst.copy_(op.src)

    def combine(self, task: _Task, op: Combine) -> None:
        self.check_copy(task, op)
        self.check_local(task, "Combine", _span, reads=(op.src,), writes=(op.dst,))
        _COMBINE[op.op](op.dst, op.src)

    def divide(self, task: _Task, op: Divide) -> None:
        self.check_buffer(task, "Divide", op.buf)
        self.check_local(task, "Divide", _span, writes=(op.buf,))
        divide_(op.buf, op.divisor)

    def alloc(self, task: _Task, op: Alloc) -> torch.Tensor:
        # Zeros, as the simulator allocates, so that no algorithm can see stale memory.
        return torch.zeros(op.count, dtype=op.like.dtype, device=op.like.device)
