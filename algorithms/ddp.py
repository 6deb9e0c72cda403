"""Data-parallel training steps as schedules: DDP's bucketed gradient all-reduce overlapped
with backward, the same without overlap, and DataParallel's master-GPU step.

Gradients become ready in reverse layer order during backward (within a layer, in reverse
registration order, as torch's autograd produces them). DDP packs them, in that order, into
buckets (``assign_buckets``); a bucket's all-reduce is queued as soon as its last gradient
is ready, on a comm stream beside the compute stream that runs the rest of backward.
Buckets launch in bucket order on every rank (``BucketLauncher``), as DDP requires so that
the ranks' collectives match, and run one at a time, as on DDP's one comm stream. The step
ends when the last all-reduce ends.

Bucket sizes follow PyTorch DDP: ``bucket_cap_mb`` = 25 MiB by default, and a first bucket of
1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``) so that communication starts early.
One difference: torch closes a bucket once it reaches the cap, so its buckets overshoot by
up to one tensor; here a tensor that would overshoot starts the next bucket, so a bucket
exceeds its cap only when it holds a single tensor larger than the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from algorithms.collectives import Schedule, broadcast, reduce, ring_allreduce, run_after
from algorithms.buffers import split_even
from algorithms.ops import (
    AVG, SUM, Alloc, Comm, Compute, Copy, Join, Recv, Send, Spawn, Wait, check_flag,
)
from algorithms.models import Model

DEFAULT_BUCKET_CAP = 25 * 2**20  # bytes: DDP's bucket_cap_mb=25
FIRST_BUCKET_CAP = 2**20  # bytes: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def gradient_order(model: Model) -> list[tuple[int, int]]:
    """(layer index, tensor index) of every parameter, in the order backward makes their
    gradients ready: layers last to first, tensors last to first within a layer."""
    return [(li, ti) for li in reversed(range(len(model.layers)))
            for ti in reversed(range(len(model.layers[li].params)))]


def assign_buckets(sizes: Sequence[int], element_bytes: int,
                   cap_bytes: int = DEFAULT_BUCKET_CAP,
                   first_cap_bytes: int = FIRST_BUCKET_CAP) -> list[list[int]]:
    """Cut tensors of ``sizes`` elements, taken in the given (ready) order, into buckets:
    lists of indices into ``sizes``.

    A tensor joins the open bucket if the bucket stays within its cap, else it opens the
    next one. The first bucket's cap is ``first_cap_bytes``, the others' ``cap_bytes``.
    """
    for name, value in (("bucket cap", cap_bytes), ("first bucket cap", first_cap_bytes),
                        ("element size", element_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"the {name} must be an int >= 1 byte, got {value!r}")
    buckets: list[list[int]] = []
    filled = 0
    for index, size in enumerate(sizes):
        nbytes = size * element_bytes
        cap = first_cap_bytes if len(buckets) <= 1 else cap_bytes
        if not buckets or (buckets[-1] and filled + nbytes > cap):
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += nbytes
    return buckets


class BucketLauncher:
    """Says which buckets may start as gradients become ready: each once all its gradients
    are ready, and in bucket order, so that every rank launches the same sequence."""

    def __init__(self, buckets: Sequence[Sequence[int]]) -> None:
        self._bucket_of = {index: b for b, members in enumerate(buckets) for index in members}
        self._missing = [len(members) for members in buckets]
        self._next = 0

    def ready(self, index: int) -> list[int]:
        """Mark gradient ``index`` ready; return the buckets that may start now, in order."""
        bucket = self._bucket_of.get(index)
        if bucket is None:
            raise ValueError(f"gradient {index} is in no bucket")
        if self._missing[bucket] == 0:
            raise ValueError(f"gradient {index} was marked ready twice")
        self._missing[bucket] -= 1
        start = self._next
        while self._next < len(self._missing) and self._missing[self._next] == 0:
            self._next += 1
        return list(range(start, self._next))

    @property
    def done(self) -> bool:
        """Whether every bucket has been handed out."""
        return self._next == len(self._missing)


def bucket_channel(bucket: int) -> str:
    """The channel bucket ``bucket``'s all-reduce runs on."""
    return f"bucket {bucket}"


def ddp_step(comm: Comm, model: Model, grads: Sequence[Any], buckets: Sequence[Sequence[int]],
             allreduce: Callable[..., Schedule] = ring_allreduce, overlap: bool = True,
             **allreduce_params: Any) -> Schedule:
    """One DDP training step: forward, then backward with each bucket's gradients averaged
    over the ranks by ``allreduce`` (any all-reduce of ``algorithms``).

    ``grads[b]`` is bucket ``b``'s flat gradient buffer; ``buckets`` indexes
    ``gradient_order(model)``. The all-reduces run one at a time, in bucket order, as on
    DDP's single comm stream. With ``overlap`` a bucket's all-reduce is queued as soon as
    its gradients are ready, beside the rest of backward; without, all of them are queued
    once backward is done.
    """
    check_flag(overlap, "overlap")
    for layer in model.layers:
        yield Compute(layer.forward_seconds, f"forward {layer.name}")
    launcher = BucketLauncher(buckets)
    order = {param: index for index, param in enumerate(gradient_order(model))}
    last_task = None
    waiting = []
    for li in reversed(range(len(model.layers))):
        layer = model.layers[li]
        yield Compute(layer.backward_seconds, f"backward {layer.name}")
        for ti in reversed(range(len(layer.params))):
            waiting += launcher.ready(order[li, ti])
            if overlap:
                for b in waiting:
                    last_task = yield from _queue(comm, grads, b, last_task, allreduce,
                                                  allreduce_params)
                waiting = []
    for b in waiting:
        last_task = yield from _queue(comm, grads, b, last_task, allreduce, allreduce_params)
    if last_task is not None:
        yield Join(last_task)
    return grads


def _queue(comm: Comm, grads: Sequence[Any], bucket: int, previous: Any,
           allreduce: Callable[..., Schedule], params: dict[str, Any]) -> Schedule:
    # The bucket's task first waits for the previous bucket's, so the all-reduces run in
    # order, one at a time; each runs on a channel of its own, so that no two cross.
    task = yield Spawn(run_after(previous, allreduce(comm, grads[bucket], op=AVG, **params)),
                       bucket_channel(bucket))
    return task


def dp_step(comm: Comm, model: Model, params: Any, grads: Any, inputs: Any, outputs: Any,
            root: int = 0) -> Schedule:
    """One step of ``torch.nn.DataParallel`` as the seeds describe it, from the master GPU
    ``root``: replicate the model (broadcast the parameters), scatter the batch, forward,
    gather the outputs to the master (which computes the loss), scatter the output
    gradients back, backward, and reduce the gradients to the master, which alone updates
    the model. Every exchange goes through the master.

    ``params`` and ``grads`` are the model's flat buffers and ``outputs`` this rank's share
    of the batch's outputs. ``inputs`` is the whole batch on the master (cut with
    ``split_even``, share r for rank r) and this rank's share elsewhere. Returns the
    gradients, summed on the master.
    """
    p, r = comm.size, comm.rank
    yield from broadcast(comm, params, root=root)
    if r == root:
        shares = split_even(inputs, p)
        gathered = split_even((yield Alloc(p * len(outputs), outputs)), p)
        yield from _exchange([Send(peer, shares[peer], "scatter inputs")
                              for peer in range(p) if peer != root])
    else:
        yield from _exchange([Recv(root, inputs, label="scatter inputs")])
    for layer in model.layers:
        yield Compute(layer.forward_seconds, f"forward {layer.name}")
    if r == root:
        yield Copy(gathered[root], outputs)
        yield from _exchange([Recv(peer, gathered[peer], label="gather outputs")
                              for peer in range(p) if peer != root])
        # The loss's gradient has the outputs' shape; the master sends each replica its share.
        yield from _exchange([Send(peer, gathered[peer], "scatter output grads")
                              for peer in range(p) if peer != root])
    else:
        yield from _exchange([Send(root, outputs, "gather outputs")])
        yield from _exchange([Recv(root, outputs, label="scatter output grads")])
    for layer in reversed(model.layers):
        yield Compute(layer.backward_seconds, f"backward {layer.name}")
    yield from reduce(comm, grads, root=root, op=SUM)
    return grads


def _exchange(ops: list[Send | Recv]) -> Schedule:
    # Post every message of one phase, then wait for them all.
    handles = []
    for op in ops:
        handles.append((yield op))
    if handles:
        yield Wait(*handles)
