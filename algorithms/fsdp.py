"""FSDP unit scheduling as a schedule of ops: all-gather a unit's parameters before its
forward and again before its backward, reduce-scatter its gradients after, and free what
is no longer needed, with PyTorch FSDP's options (forward prefetch, backward prefetch
BACKWARD_PRE / BACKWARD_POST, a limit on in-flight all-gathers, reshard after forward).

Each layer of the model is a unit. Its parameters are flattened and padded to a multiple of
the world size p; rank r keeps shard r (1/p of them) between uses. The all-gathers and
reduce-scatters run one at a time, in the order they are issued, beside the compute stream:
FSDP issues them on two CUDA streams but over one NCCL communicator, which runs its
collectives in issue order. That order is what the backward prefetch options choose:
BACKWARD_PRE issues the next all-gather before the current backward, BACKWARD_POST after it
but before the current reduce-scatter, and without prefetch the all-gather waits behind
that reduce-scatter (PyTorch's ``BackwardPrefetch`` documentation). ``Footprint`` ops say
what each rank holds, so a simulation reports memory over time.

Memory accounted (per rank): the parameter shards throughout; a unit's gathered parameters
from the issue of its all-gather until it is freed; a unit's full gradient from the start
of its backward until its reduce-scatter ends, then its gradient shard. Activations and
optimizer state are left out.

Simplifications, each on the side FSDP takes by default: the last unit stays gathered
between forward and backward (FSDP2 does not reshard its root after forward, as those
parameters are needed again at once); prefetch looks one unit ahead; with one rank nothing
is gathered or scattered (FSDP falls back to no sharding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from algorithms.buffers import split_even
from algorithms.collectives import Schedule, all_gather, reduce_scatter, run_after
from algorithms.models import Model
from algorithms.ops import AVG, Comm, Compute, Copy, Footprint, Join, Spawn, check_flag

BACKWARD_PRE, BACKWARD_POST = "pre", "post"


def padded_size(elements: int, world_size: int) -> int:
    """``elements`` rounded up to a multiple of ``world_size``: a unit's flat length."""
    return -(-elements // world_size) * world_size


def fsdp_channels(units: int) -> list[str]:
    """The channels ``fsdp_step`` spawns its collectives on, for a model of ``units`` units
    (a transport that maps channels to process groups declares them up front)."""
    return [f"{kind} {i}" for i in range(units) for kind in ("all-gather", "reduce-scatter")]


def check_fsdp_options(forward_prefetch: bool, backward_prefetch: str | None,
                       limit_all_gathers: int, reshard_after_forward: bool) -> None:
    """Refuse ``fsdp_step``'s options where they are wrong (a wrapper that runs it later
    checks them up front with this)."""
    if backward_prefetch not in (BACKWARD_PRE, BACKWARD_POST, None):
        raise ValueError(f"backward_prefetch must be {BACKWARD_PRE!r}, {BACKWARD_POST!r} or "
                         f"None, got {backward_prefetch!r}")
    if isinstance(limit_all_gathers, bool) or not isinstance(limit_all_gathers, int) or (
            limit_all_gathers < 1):
        raise ValueError(f"limit_all_gathers must be an int >= 1, got {limit_all_gathers!r}")
    check_flag(forward_prefetch, "forward_prefetch")
    check_flag(reshard_after_forward, "reshard_after_forward")


def fsdp_step(comm: Comm, model: Model, shards: Sequence[Any], gathered: Sequence[Any],
              grads: Sequence[Any], shard_grads: Sequence[Any], *,
              forward_prefetch: bool = False, backward_prefetch: str | None = BACKWARD_PRE,
              limit_all_gathers: int = 2, reshard_after_forward: bool = True,
              forward_work: Sequence[Callable[[], object]] | None = None,
              backward_work: Sequence[Callable[[], object]] | None = None,
              all_gather_algorithm: Callable[..., Schedule] = all_gather,
              reduce_scatter_algorithm: Callable[..., Schedule] = reduce_scatter) -> Schedule:
    """One FSDP training step on this rank.

    Unit i's buffers: ``shards[i]`` this rank's parameters (``padded_size / p`` elements);
    ``gathered[i]`` and ``grads[i]`` the unit's full flat parameters and gradients
    (``padded_size`` elements); ``shard_grads[i]`` this rank's averaged gradients. An
    all-gather copies the shard into chunk r of ``gathered[i]`` and fills the rest; a
    reduce-scatter averages ``grads[i]`` and copies chunk r into ``shard_grads[i]``.
    ``forward_work[i]`` and ``backward_work[i]``, if given, are the unit's real forward and
    backward (``Compute.work``), which read ``gathered[i]`` and fill ``grads[i]``.
    ``limit_all_gathers`` caps the all-gathers issued and not yet used by compute,
    prefetches included. The collectives are ``all_gather_algorithm`` and
    ``reduce_scatter_algorithm`` (the ring ones by default), called as ``all_gather`` and
    ``reduce_scatter`` of ``algorithms.collectives`` are.
    """
    check_fsdp_options(forward_prefetch, backward_prefetch, limit_all_gathers,
                       reshard_after_forward)
    units = _Units(comm, model, shards, gathered, grads, shard_grads, limit_all_gathers,
                   all_gather_algorithm, reduce_scatter_algorithm)
    yield Footprint(units.sharded_bytes, "parameter shards")
    last = len(model.layers) - 1
    for i, layer in enumerate(model.layers):
        yield from units.gather(i)
        if forward_prefetch and i < last:
            yield from units.gather(i + 1, prefetch=True)
        yield from units.wait(i)
        yield Compute(layer.forward_seconds, f"forward {layer.name}",
                      forward_work[i] if forward_work else None)
        if reshard_after_forward and i < last:
            yield from units.free(i)
    for i in reversed(range(last + 1)):
        layer = model.layers[i]
        yield from units.gather(i)
        if backward_prefetch == BACKWARD_PRE and i > 0:
            yield from units.gather(i - 1, prefetch=True)
        yield from units.wait(i)
        yield Footprint(units.full_bytes(i), f"gradient {layer.name}")
        yield Compute(layer.backward_seconds, f"backward {layer.name}",
                      backward_work[i] if backward_work else None)
        yield from units.free(i)
        if backward_prefetch == BACKWARD_POST and i > 0:
            yield from units.gather(i - 1, prefetch=True)
        yield from units.scatter(i)
    yield from units.finish()
    return shard_grads


class _Units:
    """The bookkeeping of ``fsdp_step``: which units are gathered, which all-gathers are in
    flight, and the last collective issued (each waits for the one before it)."""

    def __init__(self, comm: Comm, model: Model, shards: Sequence[Any],
                 gathered: Sequence[Any], grads: Sequence[Any], shard_grads: Sequence[Any],
                 limit: int, all_gather_algorithm: Callable[..., Schedule],
                 reduce_scatter_algorithm: Callable[..., Schedule]) -> None:
        self.comm, self.model, self.limit = comm, model, limit
        self.all_gather, self.reduce_scatter = all_gather_algorithm, reduce_scatter_algorithm
        self.shards, self.gathered, self.grads, self.shard_grads = (
            shards, gathered, grads, shard_grads)
        self.held: set[int] = set()  # units whose gathered parameters are allocated
        self.in_flight: dict[int, Any] = {}  # unit -> all-gather task not yet waited on
        self.last: Any = None  # the last collective issued
        self.sharded_bytes = sum(self.shard_bytes(i) for i in range(len(gathered)))

    def full_bytes(self, i: int) -> int:
        return len(self.gathered[i]) * self.model.grad_bytes

    def shard_bytes(self, i: int) -> int:
        return self.full_bytes(i) // self.comm.size

    def gather(self, i: int, prefetch: bool = False) -> Schedule:
        if i in self.held:
            return
        if self.comm.size == 1:  # no sharding: the parameters are the shard
            self.held.add(i)
            yield Copy(self.gathered[i], self.shards[i])
            return
        if prefetch and len(self.in_flight) >= self.limit:
            return  # the rate limiter: this unit is gathered when it is needed instead
        self.held.add(i)
        yield Footprint(self.full_bytes(i), f"gathered {self.model.layers[i].name}")
        schedule = run_after(self.last, self._copy_in_and_gather(i))
        self.last = self.in_flight[i] = yield Spawn(schedule, f"all-gather {i}")

    def _copy_in_and_gather(self, i: int) -> Schedule:
        mine = split_even(self.gathered[i], self.comm.size)[self.comm.rank]
        yield Copy(mine, self.shards[i])
        yield from self.all_gather(self.comm, self.gathered[i])

    def wait(self, i: int) -> Schedule:
        task = self.in_flight.pop(i, None)
        if task is not None:
            yield Join(task)

    def free(self, i: int) -> Schedule:
        if i in self.held:
            self.held.discard(i)
            if self.comm.size > 1:
                yield Footprint(-self.full_bytes(i), f"freed {self.model.layers[i].name}")

    def scatter(self, i: int) -> Schedule:
        if self.comm.size == 1:
            yield Copy(self.shard_grads[i], self.grads[i])
            return
        schedule = run_after(self.last, self._scatter_and_copy_out(i))
        self.last = yield Spawn(schedule, f"reduce-scatter {i}")

    def _scatter_and_copy_out(self, i: int) -> Schedule:
        mine = yield from self.reduce_scatter(self.comm, self.grads[i], op=AVG)
        yield Copy(self.shard_grads[i], mine)
        yield Footprint(self.shard_bytes(i) - self.full_bytes(i),
                        f"gradient shard {self.model.layers[i].name}")

    def finish(self) -> Schedule:
        if self.last is not None:  # the last collective ends after all the others
            yield Join(self.last)

