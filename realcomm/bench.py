"""What ``realcomm bench`` does on each rank: time a collective as nccl-tests does.

For each size (nccl-tests, src/common.cu, ``BenchTime``): one run that also checks that the
ranks agree on the arguments, a few warm-up runs, a barrier, ``iters`` runs back to back,
and the time of one run is the elapsed time over ``iters``, averaged over the ranks
(nccl-tests' default ``-a 1``; ``RunOptions.average`` takes rank 0's, the least or the
most instead, as ``-a 0``, ``2`` and ``3`` do). nccl-tests warms up once, at the largest and
smallest size; here every size gets its warm-up runs. With ``--check``, one more run on
``algorithms.harness.bench.check_inputs`` data counts the wrong elements against the
reference.

The rows come from ``algorithms.harness.bench``, the same as ``simcomm bench``'s; rank 0
hands each to ``on_row`` as soon as it is done, so that it can be printed then. With
``baseline="native"`` the harness runs torch's own collective of the same kind
(``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``, ``reduce``,
``all_to_all_single``) instead of the algorithm. bfloat16 buffers (``ml_dtypes``' on the
numpy side, which ``torch.from_numpy`` does not take) cross between numpy and torch as their
bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from algorithms.harness.bench import (
    AVERAGES, DTYPES, BenchConfig, BenchRow, RunSpread, bench_row, buffer_count, check_inputs,
    count_wrong, rank_time,
)
from algorithms.harness.catalog import Collective, channel_names
from algorithms.harness.tuner_file import TableTuner, TunerRow
from algorithms.ops import Choice, Protocol, ReduceOp
from realcomm.driver import (
    DEFAULT_SLICE_BYTES, DEFAULT_TIMEOUT, Driver, launcher_local_size,
)

# nccl-tests' defaults (src/common.cu): -w 5 warm-up runs, -n 20 timed runs.
WARMUP_ITERS = 5
ITERS = 20
BASELINES = ("none", "native")
# How the timed runs of one size make one time: "mean" is nccl-tests' (elapsed over the
# runs, back to back); "median" times each run and takes the median, the time of a typical
# run, which a long tail of late wake-ups on a busy machine does not move.
TIMINGS = ("mean", "median")
# The ranks' times a row shows by default (nccl-tests' -a), per timing: the mean of their
# elapsed times, as nccl-tests; for the median run, the slowest rank's time of each run.
DEFAULT_AVERAGE: Mapping[str, int] = MappingProxyType({"mean": 1, "median": 3})
# Types torch cannot reduce (no arithmetic on them), with why: -d all leaves them out.
UNSUPPORTED_DTYPES: Mapping[str, str] = MappingProxyType({
    name: "torch has no arithmetic for uint32 and uint64 tensors, so realcomm cannot run "
          "them (simcomm can)" for name in ("uint32", "uint64")})
_BFLOAT16 = DTYPES["bfloat16"]

_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.PROD: dist.ReduceOp.PRODUCT,
    ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.AVG: dist.ReduceOp.AVG,
}
# Newer torch renames the tensor forms of reduce-scatter and all-gather.
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

NATIVE_NAMES = {
    "allreduce": "all_reduce", "reducescatter": _reduce_scatter.__name__,
    "allgather": _all_gather.__name__, "broadcast": "broadcast", "reduce": "reduce",
    "alltoall": "all_to_all_single",
}

# What runs a call no row of a tuner file decides. NCCL's example plugin leaves such a call
# to NCCL's own choice on one channel; realcomm has no cost model, so the ring runs.
UNMATCHED = Choice("ring", Protocol.SIMPLE, 1)

Runner = Callable[[bool], Any]  # one run; the flag asks it to check its arguments first
RowSink = Callable[[BenchRow], None]


@dataclass(frozen=True)
class RunOptions:
    """How to run: the parts of ``realcomm bench``'s flags that ``BenchConfig`` lacks."""

    warmup_iters: int = WARMUP_ITERS
    iters: int = ITERS
    baseline: str = "none"
    timeout: float = DEFAULT_TIMEOUT  # seconds
    slice_bytes: int = DEFAULT_SLICE_BYTES
    timing: str = "mean"
    check_messages: bool = False  # the driver's check mode
    average: int | None = None  # nccl-tests' -a (AVERAGES); None: DEFAULT_AVERAGE[timing]
    per_iteration: bool = False  # -I: time every run and give each row their spread
    tuner_rows: tuple[TunerRow, ...] = ()  # --tuner-file's rows; () for none

    def __post_init__(self) -> None:
        if self.warmup_iters < 0:
            raise ValueError(f"-w/--warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.iters < 1:
            raise ValueError(f"-n/--iters must be >= 1, got {self.iters}")
        if self.baseline not in BASELINES:
            raise ValueError(f"unknown --baseline {self.baseline!r}; known: "
                             f"{', '.join(BASELINES)}")
        if self.timing not in TIMINGS:
            raise ValueError(f"unknown --timing {self.timing!r}; known: {', '.join(TIMINGS)}")
        if self.average is not None and self.average not in AVERAGES:
            raise ValueError(f"-a/--average must be one of {', '.join(map(str, AVERAGES))}, "
                             f"got {self.average}")

    @property
    def rank_average(self) -> int:
        """The ``-a`` in force: the one given, or the timing's default."""
        return DEFAULT_AVERAGE[self.timing] if self.average is None else self.average


def bench_rank(config: BenchConfig, options: RunOptions, device: torch.device,
               on_row: RowSink | None = None) -> list[BenchRow]:
    """Run the benchmark on this rank of the default process group; every rank returns
    the same rows, and rank 0 hands each to ``on_row`` as soon as it is done. A CUDA
    ``device`` without an index means this process's current one."""
    world = dist.get_world_size()
    local_size = launcher_local_size(world) or world
    config.check_world(world, local_size)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    channels = channel_names(config.collective.name, dict(config.params), local_size)
    tuner = None
    if options.tuner_rows:
        tuner = TableTuner(options.tuner_rows, world // local_size, world, default=UNMATCHED)
        channels = _tuned_channels(config, options.tuner_rows, local_size, channels)
    driver = Driver(channels=channels, timeout=options.timeout, tuner=tuner,
                    slice_bytes=options.slice_bytes, check=options.check_messages)
    rows = []
    for size in config.sizes:
        rows.append(_bench_size(config, options, driver, device, size))
        if on_row is not None and driver.comm.rank == 0:
            on_row(rows[-1])
    driver.close()  # `-d all` and `-o all` make one driver per type and op
    return rows


def _tuned_channels(config: BenchConfig, rows: Sequence[TunerRow], local_size: int,
                    channels: Sequence[str]) -> list[str]:
    """Every channel that a call of ``config``'s collective may run on under the tuner
    file's ``rows`` (or, where no row decides, ``UNMATCHED``): the driver makes each
    channel's process group before the first call."""
    names = dict.fromkeys(channels)
    for choice in [row.choice for row in rows] + [UNMATCHED]:
        params = {**dict(config.params), "algorithm": choice.algorithm,
                  "channels": choice.channels}
        names.update(dict.fromkeys(channel_names(config.collective.name, params, local_size)))
    return list(names)


def _bench_size(config: BenchConfig, options: RunOptions, driver: Driver,
                device: torch.device, size: int) -> BenchRow:
    p, rank = driver.comm.size, driver.comm.rank
    count = buffer_count(config.collective, p, size, config.dtype.itemsize)
    x = torch.ones(count, dtype=_to_torch(np.empty(0, dtype=config.dtype)).dtype, device=device)
    run = make_runner(config, options.baseline, driver, x)
    seconds, runs = measure_runs(run, options.warmup_iters, options.iters, device,
                                 options.timing, options.rank_average, options.per_iteration)
    wrong = None
    if config.check:
        inputs = check_inputs(p, count, config.dtype, config.op)
        x.copy_(_to_torch(inputs[rank]))
        result = run(False)
        gathered: list[Any] = [None] * p if rank == 0 else []
        dist.gather_object(None if result is None else _to_numpy(result),
                           gathered if rank == 0 else None, dst=0)
        count_tensor = torch.zeros(1, dtype=torch.int64, device=device)
        if rank == 0:
            count_tensor += count_wrong(config.collective, inputs, gathered, config.op,
                                        config.root, dict(config.params))
        dist.broadcast(count_tensor, src=0)
        wrong = int(count_tensor.item())
    return bench_row(config.collective, p, size, config.dtype, config.op, config.root,
                     seconds, wrong, spread=RunSpread.of(runs) if options.per_iteration else None)


def time_runs(run: Runner, warmup_iters: int, iters: int, device: torch.device,
              timing: str = "mean", average: int | None = None) -> float:
    """Seconds per run: one run that checks the arguments, the warm-up runs, a barrier,
    then ``iters`` timed runs back to back. ``timing="mean"``: their elapsed time over
    ``iters``, the ranks' made one by ``average`` (nccl-tests' ``-a``; default 1, the mean
    over ranks, as nccl-tests reports). ``timing="median"``: each run's time on the ranks
    made one by ``average`` (default 3, the slowest rank), the median over the runs (on
    CUDA each run is then synchronised, so runs no longer overlap)."""
    return measure_runs(run, warmup_iters, iters, device, timing, average)[0]


def measure_runs(run: Runner, warmup_iters: int, iters: int, device: torch.device,
                 timing: str = "mean", average: int | None = None, each_run: bool = False
                 ) -> tuple[float, tuple[float, ...]]:
    """``time_runs``'s seconds per run, and with ``each_run`` every timed run's seconds
    (the ranks' made one by ``average``, as the median timing does; on CUDA each run is
    then synchronised); without, no run times."""
    if timing not in TIMINGS:
        raise ValueError(f"unknown timing {timing!r}; known: {', '.join(TIMINGS)}")
    average = DEFAULT_AVERAGE[timing] if average is None else average
    each_run = each_run or timing == "median"
    run(True)
    for _ in range(warmup_iters):
        run(False)
    dist.barrier()
    marks = [time.perf_counter()]
    for _ in range(iters):
        run(False)
        if each_run and device.type == "cuda":
            torch.cuda.synchronize(device)
        marks.append(time.perf_counter())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - marks[0]) / iters
    if not each_run:
        return rank_time(_every_rank([elapsed], device)[:, 0], average), ()
    everyone = _every_rank([elapsed, *np.diff(marks)], device)
    runs = tuple(rank_time(everyone[:, i], average) for i in range(1, iters + 1))
    if timing == "mean":
        return rank_time(everyone[:, 0], average), runs
    return float(np.median(runs)), runs


def _every_rank(seconds: Any, device: torch.device) -> np.ndarray:
    """Every rank's ``seconds`` (a sequence of the same length on each), a row per rank."""
    mine = torch.tensor(seconds, dtype=torch.float64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone).cpu().numpy()


def make_runner(config: BenchConfig, baseline: str, driver: Driver, x: torch.Tensor
                ) -> Runner:
    """One run of the configured collective on ``x``: the algorithm over ``driver``, or
    with ``baseline="native"`` torch's own collective. The runner returns the rank's
    result, as the algorithm would."""
    if baseline == "native":
        return _native_runner(config.collective, config.op, config.root, x)
    kwargs = config.algorithm_kwargs()

    def run(check_args: bool) -> Any:
        return driver.run(config.collective.function, x, check_args=check_args, **kwargs)
    return run


def _native_runner(collective: Collective, op: ReduceOp | None, root: int | None,
                   x: torch.Tensor) -> Runner:
    p, rank = dist.get_world_size(), dist.get_rank()
    kind = collective.kind
    torch_op = _TORCH_OPS[op] if op is not None else None
    part = len(x) // p  # split kinds have (count // p) * p elements
    out = torch.empty_like(x[:part]) if kind == "reducescatter" else torch.empty_like(x)

    def call() -> Any:
        if kind == "allreduce":
            dist.all_reduce(x, torch_op)
            return x
        if kind == "reducescatter":
            _reduce_scatter(out, x, torch_op)
            return out
        if kind == "allgather":
            _all_gather(out, x[rank * part:(rank + 1) * part])
            return out
        if kind == "broadcast":
            dist.broadcast(x, src=root)
            return x
        if kind == "reduce":
            dist.reduce(x, dst=root, op=torch_op)
            return x if rank == root else None
        if kind == "alltoall":
            dist.all_to_all_single(out, x)
            return out
        raise ValueError(f"no native baseline for {collective.name} ({kind})")

    def run(check_args: bool) -> Any:
        if not check_args:
            return call()
        try:
            return call()
        except RuntimeError as error:
            detail = " ".join(str(error).split())
            raise ValueError(
                f"torch's {NATIVE_NAMES[kind]} on {dist.get_backend()} cannot run "
                f"{x.dtype}{'' if op is None else ' ' + op.value}: {detail}") from None
    return run


def _to_torch(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor sharing its memory; bfloat16 through its bits."""
    if array.dtype == _BFLOAT16:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` on the CPU as a numpy array; bfloat16 as ``ml_dtypes``' through its bits."""
    if tensor.dtype == torch.bfloat16:
        return tensor.cpu().view(torch.uint16).numpy().view(_BFLOAT16)
    return tensor.cpu().numpy()
