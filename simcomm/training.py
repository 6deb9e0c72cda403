"""Simulated training steps: DDP with and without overlap, DataParallel, bucket sweeps, and
FSDP with its memory over time.

Each function runs a schedule of ``algorithms.ddp`` on size-only buffers (so a 7B model
allocates nothing) and reports what users ask of a step: how long it takes, how much of it
is compute, how much communication is left exposed after the overlap, and, per bucket, when
its gradients were ready and when its all-reduce started and ended.

Definitions (times in seconds, on the rank that finishes last):

* ``compute``: forward plus backward, the rank's compute stream busy;
* ``comm``: time during which at least one bucket's all-reduce is running (for DataParallel:
  every moment the step is not computing);
* ``exposed``: ``step - compute``, the time the step waits on communication;
* ``overlap``: the share of ``comm`` hidden behind compute, ``1 - exposed / comm`` (0 when
  there is no communication).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algorithms.collectives import Schedule, all_gather, reduce_scatter, ring_allreduce
from algorithms.ddp import (
    DEFAULT_BUCKET_CAP, FIRST_BUCKET_CAP, assign_buckets, bucket_channel, ddp_step, dp_step,
    gradient_order,
)
from algorithms.fsdp import BACKWARD_PRE, fsdp_channels, fsdp_step, padded_size
from algorithms.models import Model
from algorithms.ops import Comm
from simcomm.buffers import SizeOnly
from simcomm.collective_level import Machine, TimedCollective, choose_level
from simcomm.engine import simulate
from simcomm.results import SimResult
from simcomm.summary import covered_time
from simcomm.topology import Topology
from simcomm.units import format_bytes
from simcomm.variation import Variation

_GRAD_DTYPES = {2: np.float16, 4: np.float32, 8: np.float64}


@dataclass(frozen=True)
class BucketTiming:
    """One bucket of a DDP step: its size and, on the last rank to finish, when its
    gradients were all ready and when its all-reduce started and ended (seconds)."""

    index: int
    tensors: int
    bytes: int
    ready: float
    start: float
    end: float


@dataclass(frozen=True)
class StepReport:
    """What one simulated training step cost (see the module doc for the definitions)."""

    schedule: str  # "ddp", "ddp-no-overlap" or "dp"
    model: str
    ranks: int
    step: float
    compute: float
    comm: float
    exposed: float
    overlap: float
    bucket_cap: int | None
    buckets: tuple[BucketTiming, ...]
    result: SimResult = field(repr=False, compare=False)

    @property
    def slowest(self) -> tuple[int, float, float] | None:
        """Where ranks compute at different speeds: the rank that computed longest, its
        compute seconds and the least any rank took; None if all took the same."""
        return _slowest(self.result)

    def format(self) -> str:
        """The report as text (times in milliseconds)."""
        ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
        cap = "" if self.bucket_cap is None else f", bucket cap {format_bytes(self.bucket_cap)}"
        lines = [f"{self.schedule}: {self.model} on {self.ranks} ranks{cap}",
                 f"  step      {ms(self.step)}",
                 f"  compute   {ms(self.compute)}",
                 f"  comm      {ms(self.comm)}",
                 f"  exposed   {ms(self.exposed)}  ({self.exposed / self.step:.1%} of the step)"
                 if self.step > 0 else f"  exposed   {ms(self.exposed)}",
                 f"  overlap   {self.overlap:.1%} of comm hidden behind compute"]
        if self.slowest is not None:
            rank, longest, least = self.slowest
            lines.append(f"  slowest   rank {rank}: compute {ms(longest)}, the fastest "
                         f"{ms(least)}")
        if self.buckets:
            lines.append(f"  buckets ({len(self.buckets)}; ms):")
            lines.append(f"    {'#':>4} {'tensors':>7} {'size':>10} {'ready':>10} {'start':>10} "
                         f"{'end':>10}")
            for b in self.buckets:
                lines.append(f"    {b.index:>4} {b.tensors:>7} {format_bytes(b.bytes):>10} "
                             f"{b.ready * 1e3:>10.3f} {b.start * 1e3:>10.3f} "
                             f"{b.end * 1e3:>10.3f}")
        return "\n".join(lines)


def _grad_dtype(model: Model, topology: Topology) -> Any:
    """The gradients' dtype, after refusing a model or topology of the wrong type."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be an algorithms.models.Model (preset_model, "
                        f"model_from_flops), got {model!r}")
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a simcomm.Topology, got {topology!r}")
    dtype = _GRAD_DTYPES.get(model.grad_bytes)
    if dtype is None:
        raise ValueError(f"model {model.name!r}: grad_bytes must be 2, 4 or 8, "
                         f"got {model.grad_bytes}")
    return dtype


def model_buckets(model: Model, bucket_cap: int = DEFAULT_BUCKET_CAP,
                  first_bucket_cap: int = FIRST_BUCKET_CAP) -> list[list[int]]:
    """``model``'s gradients cut into DDP buckets (indices into ``gradient_order``)."""
    sizes = [model.layers[li].params[ti] for li, ti in gradient_order(model)]
    return assign_buckets(sizes, model.grad_bytes, bucket_cap, first_bucket_cap)


def simulate_ddp(model: Model, topology: Topology, *, bucket_cap: int = DEFAULT_BUCKET_CAP,
                 first_bucket_cap: int = FIRST_BUCKET_CAP,
                 allreduce: Callable[..., Schedule] = ring_allreduce, overlap: bool = True,
                 trace: Any = None, level: str = "message", variation: Variation | None = None,
                 progress: Callable[[int], None] | None = None, **allreduce_params: Any
                 ) -> StepReport:
    """Simulate one DDP step of ``model`` on every rank of ``topology``; at ``level``
    ``collective`` (or ``auto``, see ``simulate``) each all-reduce is one timed event on a
    rank that stands for all (``run_one_rank_for_all``). ``variation`` draws messages'
    delays and computations' lengths at random (``simcomm.variation``; message level);
    ``progress`` is ``simulate``'s."""
    dtype = _grad_dtype(model, topology)
    buckets = model_buckets(model, bucket_cap, first_bucket_cap)
    order = gradient_order(model)
    grads = [SizeOnly(sum(model.layers[li].params[ti] for li, ti in (order[i] for i in members)),
                      dtype) for members in buckets]
    if choose_level(_level_for(level, variation), allreduce, topology.size,
                    calls=len(buckets)) == "collective":
        timed = TimedCollective(allreduce, topology, **allreduce_params)
        result = run_one_rank_for_all(_ddp_rank, topology, [timed], trace=trace, model=model,
                                         grads=grads, buckets=buckets, allreduce=timed,
                                         overlap=overlap, allreduce_params={})
    else:
        result = simulate(_ddp_rank, [SizeOnly(0, dtype)] * topology.size, topology,
                          trace=trace, variation=variation, progress=progress, model=model,
                          grads=grads,
                          buckets=buckets, allreduce=allreduce, overlap=overlap,
                          allreduce_params=allreduce_params)
    rank = int(np.argmax(result.finish_times))
    compute = _compute_time(result, rank)
    running = _running_spans(result, rank, [bucket_channel(b) for b in range(len(buckets))])
    ready_at = _backward_ends(result, rank)
    timings = []
    for b, members in enumerate(buckets):
        last_layer = order[members[-1]][0]
        start, end = running[bucket_channel(b)]
        timings.append(BucketTiming(b, len(members), grads[b].nbytes,
                                    ready_at[model.layers[last_layer].name], float(start),
                                    float(end)))
    comm = covered_time([(t.start, t.end) for t in timings])
    return _report("ddp" if overlap else "ddp-no-overlap", model, topology, result, compute,
                   comm, bucket_cap, timings)


def simulate_dp(model: Model, topology: Topology, *, root: int = 0, trace: Any = None
                ) -> StepReport:
    """Simulate one DataParallel step of ``model`` with the master GPU ``root``."""
    dtype = _grad_dtype(model, topology)
    p = topology.size
    flat = SizeOnly(model.param_count, dtype)
    inputs = [SizeOnly(model.input_bytes * (p if rank == root else 1), np.uint8)
              for rank in range(p)]
    outputs = SizeOnly(model.output_bytes, np.uint8)
    result = simulate(_dp_rank, inputs, topology, trace=trace, model=model, flat=flat,
                      outputs=outputs, root=root)
    rank = int(np.argmax(result.finish_times))
    compute = _compute_time(result, rank)
    return _report("dp", model, topology, result, compute, result.time - compute, None, [])


def _ddp_rank(comm: Any, _unused: Any, model: Model, grads: list[SizeOnly],
              buckets: list[list[int]], allreduce: Callable[..., Schedule], overlap: bool,
              allreduce_params: dict[str, Any]) -> Schedule:
    # The step's buffers are the buckets' gradients, the same on every rank (size-only).
    return ddp_step(comm, model, grads, buckets, allreduce, overlap, **allreduce_params)


def _dp_rank(comm: Any, inputs: Any, model: Model, flat: SizeOnly, outputs: SizeOnly,
             root: int) -> Schedule:
    # Size-only buffers are immutable, so one serves for parameters and gradients alike.
    return dp_step(comm, model, flat, flat, inputs, outputs, root)


def bucket_sweep(model: Model, topology: Topology, caps: Sequence[int], **kwargs: Any
                 ) -> list[StepReport]:
    """``simulate_ddp`` once per bucket cap; the first bucket's cap stays as given."""
    return [simulate_ddp(model, topology, bucket_cap=cap, **kwargs) for cap in caps]


def _level_for(level: str, variation: Variation | None) -> str:
    """The level to run at: random variation draws per rank and per message, which only
    the message level has."""
    if variation is None or level == "message":
        return level
    if level == "collective":
        raise ValueError("random variation draws for every rank and message: run it at the "
                         "message level")
    return "message"


def run_one_rank_for_all(schedule: Callable[..., Schedule], topology: Topology,
                            collectives: Sequence[TimedCollective], trace: Any = None,
                            **params: Any) -> SimResult:
    """Run ``schedule`` (called as a per-rank algorithm, with ``params``) on one rank that
    stands for every rank of ``topology``: its ``Comm`` says rank 0 of all of them, and its
    collectives are ``collectives``, each call one timed event. Compute, the comm stream's
    order and its overlap with compute run on the event engine as at the message level;
    the ranks are taken to keep in step, so a collective starts on all at once and ends
    when its last rank is done (where ranks compute at different speeds, the slowest stands
    for all, as every collective waits for it). The result has the one rank's trace, level
    ``collective``, and the messages the collectives would have sent."""
    stand_in = Comm(0, topology.size, topology.local_size)
    # Where ranks compute at different speeds, every collective waits for the slowest: it
    # stands for all.
    slowest = min(range(topology.size), key=topology.speed_of)
    node = topology.ranks[slowest]
    one_rank = Topology(f"{topology.name} (one rank for all)", (node,), (), (node,),
                        (topology.reduce_bandwidth[slowest],),
                        launch_latency=topology.launch_latency,
                        compute_speed=(topology.speed_of(slowest),))

    def representative(_comm: Comm, buf: Any, **kwargs: Any) -> Schedule:
        return schedule(stand_in, buf, **kwargs)

    result = simulate(representative, [SizeOnly(0)], one_rank, trace=trace, **params)
    result.level, result.exact = "collective", False
    result.messages = sum(cost.messages for timed in collectives for cost in timed.costs)
    return result


def _report(schedule: str, model: Model, topology: Topology, result: SimResult,
            compute: float, comm: float, bucket_cap: int | None,
            buckets: list[BucketTiming]) -> StepReport:
    exposed = max(0.0, result.time - compute)
    return StepReport(schedule, model.name, topology.size, float(result.time), compute, comm,
                      exposed, _overlap(exposed, comm), bucket_cap, tuple(buckets), result)


def _overlap(exposed: float, comm: float) -> float:
    # The share of communication hidden behind compute; none when there is none.
    return min(1.0, max(0.0, 1.0 - exposed / comm)) if comm > 0 else 0.0


def _running_spans(result: SimResult, rank: int, channels: Sequence[Hashable]
                   ) -> dict[Any, tuple[float, float]]:
    """Per task of ``rank`` on one of the comm stream's ``channels``, when it ran: the
    schedules queue their collectives on one comm stream, so a task spawned while the one
    before it still runs starts when that one ends. Tasks that a collective spawns itself
    (its rings, on channels of their own) run inside it and are not counted apart."""
    queued = set(channels)
    spans: dict[Any, tuple[float, float]] = {}
    previous_end = -math.inf
    for e in sorted((e for e in result.trace
                     if e.kind == "task" and e.rank == rank and e.channel in queued),
                    key=lambda e: e.start):
        start = max(e.start, previous_end)
        spans[e.channel] = (float(start), float(e.end))
        previous_end = e.end
    return spans


def sent_bytes(result: SimResult, rank: int) -> int:
    """Bytes ``rank`` sent over the run (the trace must be recorded)."""
    return sum(e.nbytes for e in result.trace if e.kind == "send" and e.rank == rank)


def _slowest(result: SimResult) -> tuple[int, float, float] | None:
    """The rank that computed longest, its compute seconds and the least any rank took, if
    they differ."""
    busy = [0.0] * len(result.finish_times)
    for e in result.trace:
        if e.kind == "compute":
            busy[e.rank] += e.end - e.start
    rank = max(range(len(busy)), key=busy.__getitem__, default=0)
    if not busy or busy[rank] <= min(busy) * (1 + 1e-9):
        return None
    return rank, busy[rank], min(busy)


def _compute_time(result: SimResult, rank: int) -> float:
    return sum(e.end - e.start for e in result.trace if e.kind == "compute" and e.rank == rank)


def _backward_ends(result: SimResult, rank: int) -> dict[str, float]:
    return {e.label.removeprefix("backward "): e.end for e in result.trace
            if e.kind == "compute" and e.rank == rank and e.label.startswith("backward ")}


@dataclass(frozen=True)
class FSDPReport:
    """One simulated FSDP step: times as ``StepReport`` (``comm`` is the time during which
    an all-gather or a reduce-scatter runs), the bytes one rank sent, and memory (bytes) on
    the rank whose footprint peaks highest: ``memory`` is its footprint after each change,
    as (seconds, bytes)."""

    model: str
    ranks: int
    options: dict[str, Any]
    step: float
    compute: float
    comm: float
    exposed: float
    overlap: float
    sent_bytes: int
    peak_memory: int
    memory: tuple[tuple[float, int], ...]
    result: SimResult = field(repr=False, compare=False)

    def format(self) -> str:
        """The report as text (times in milliseconds, memory in MiB)."""
        ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
        options = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return "\n".join([
            f"fsdp: {self.model} on {self.ranks} ranks ({options})",
            f"  step      {ms(self.step)}",
            f"  compute   {ms(self.compute)}",
            f"  comm      {ms(self.comm)}",
            f"  exposed   {ms(self.exposed)}",
            f"  overlap   {self.overlap:.1%} of comm hidden behind compute",
            f"  sent      {self.sent_bytes / 2**20:.1f} MiB per rank",
            f"  peak      {self.peak_memory / 2**20:.1f} MiB of parameters and gradients"])


def no_sharding_memory(model: Model) -> int:
    """Bytes a rank holds without sharding: every parameter and every gradient."""
    return 2 * model.param_bytes


def simulate_fsdp(model: Model, topology: Topology, *, forward_prefetch: bool = False,
                  backward_prefetch: str | None = BACKWARD_PRE, limit_all_gathers: int = 2,
                  reshard_after_forward: bool = True, trace: Any = None,
                  level: str = "message", variation: Variation | None = None,
                  progress: Callable[[int], None] | None = None) -> FSDPReport:
    """Simulate one FSDP step of ``model`` (one unit per layer) on ``topology``; at
    ``level`` ``collective`` (or ``auto``) each all-gather and reduce-scatter is one timed
    event (``run_one_rank_for_all``)."""
    dtype = _grad_dtype(model, topology)
    p = topology.size
    flat = [SizeOnly(padded_size(layer.param_count, p), dtype) for layer in model.layers]
    shards = [SizeOnly(len(buf) // p, dtype) for buf in flat]
    options = {"forward_prefetch": forward_prefetch, "backward_prefetch": backward_prefetch,
               "limit_all_gathers": limit_all_gathers,
               "reshard_after_forward": reshard_after_forward}
    calls = 3 * len(model.layers)  # gathers for forward and backward, and a scatter
    if choose_level(_level_for(level, variation), all_gather, p, calls=calls) == "collective":
        machine = Machine(topology)
        collectives = [TimedCollective(all_gather, machine),
                       TimedCollective(reduce_scatter, machine)]
        result = run_one_rank_for_all(
            _fsdp_rank, topology, collectives, trace=trace, model=model, flat=flat,
            shards=shards, options=options, all_gather_algorithm=collectives[0],
            reduce_scatter_algorithm=collectives[1])
        sent = int(sum(cost.sent_bytes[0] for timed in collectives for cost in timed.costs))
    else:
        result = simulate(_fsdp_rank, [SizeOnly(0, dtype)] * p, topology, trace=trace,
                          variation=variation, progress=progress, model=model, flat=flat,
                          shards=shards, options=options)
        sent = sent_bytes(result, int(np.argmax(result.finish_times)))
    rank = int(np.argmax(result.finish_times))
    compute = _compute_time(result, rank)
    comm = covered_time(_running_spans(result, rank, fsdp_channels(len(model.layers))).values())
    exposed = max(0.0, result.time - compute)
    memories = [_memory_over_time(result, r) for r in range(len(result.finish_times))]
    peaks = [max((b for _, b in m), default=0) for m in memories]
    top = int(np.argmax(peaks))
    return FSDPReport(model.name, p, options, float(result.time), compute, comm, exposed,
                      _overlap(exposed, comm), sent, peaks[top], tuple(memories[top]), result)


def _fsdp_rank(comm: Any, _unused: Any, model: Model, flat: list[SizeOnly],
               shards: list[SizeOnly], options: dict[str, Any],
               all_gather_algorithm: Callable[..., Schedule] = all_gather,
               reduce_scatter_algorithm: Callable[..., Schedule] = reduce_scatter) -> Schedule:
    # Size-only buffers are immutable: one list serves as parameters and gradients alike.
    return fsdp_step(comm, model, shards, flat, flat, shards, **options,
                     all_gather_algorithm=all_gather_algorithm,
                     reduce_scatter_algorithm=reduce_scatter_algorithm)


def _memory_over_time(result: SimResult, rank: int) -> list[tuple[float, int]]:
    held, points = 0, []
    for e in result.trace:  # footprint events are recorded in time order
        if e.kind == "footprint" and e.rank == rank:
            held += e.nbytes
            points.append((float(e.start), held))
    return points
