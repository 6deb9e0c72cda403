"""DDP's gradient all-reduce run by the algorithms of ``algorithms`` over realcomm.

The usual way is torch's own DDP with a communication hook: DDP keeps doing everything else
(buckets, parameter and buffer broadcast, ``no_sync``, unused parameters), and each bucket
is averaged by the algorithm of your choice, on a comm thread, while backward goes on::

    model = DistributedDataParallel(module)
    model.register_comm_hook(HookState(ring_allreduce), allreduce_hook)

``BucketedAllreduce`` does the bucketing itself instead, the simulator's way, so that a
real run and a simulated one cut the same buckets (DDP's own cut depends on its
heuristics): the module's parameters,
in reverse registration order (the order backward makes their gradients ready), cut into
buckets by ``assign_buckets``; a ``BucketLauncher`` hands out buckets in bucket order as
their gradients become ready. A post-accumulate-grad hook on every parameter tells the
launcher; a comm thread all-reduces the buckets it hands out, one at a time and in order,
while autograd goes on with backward, as DDP's comm stream does.

    sync = BucketedAllreduce(model, Driver())        # broadcasts rank 0's parameters
    for inputs, targets in batches:
        loss_fn(model(inputs), targets).backward()   # buckets all-reduce during backward
        sync.finish()                                # wait: every gradient is averaged
        optimizer.step(); optimizer.zero_grad()

Every parameter that requires grad must get a gradient in every backward (as DDP without
``find_unused_parameters``); ``finish`` raises naming the ones that did not. Before every
forward, rank 0's buffers (BatchNorm's running statistics) are broadcast, as DDP does.
"""

# No ``from __future__ import annotations`` here: DDP checks a comm hook's annotations
# against the real GradBucket and Future classes, not their names.
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from algorithms.collectives import Schedule, broadcast, ring_allreduce
from algorithms.ddp import DEFAULT_BUCKET_CAP, FIRST_BUCKET_CAP, BucketLauncher, assign_buckets
from algorithms.ops import AVG
from realcomm.driver import Driver

_STOP = -1
_MISSED_FINISH = ("the last backward's gradients are not averaged yet: call finish() after "
                  "every backward, before the next forward (to accumulate gradients over "
                  "several backwards, use torch's DDP with allreduce_hook and no_sync)")


def _average_in_place(driver: Driver, allreduce: Callable[..., Schedule], tensor: torch.Tensor,
                     params: dict[str, Any]) -> None:
    """Average ``tensor`` over the driver's ranks with ``allreduce``, leaving the average in
    ``tensor``. An all-reduce works in place (``algorithms.collectives``); one that returns
    its result in another tensor has it copied in, and one that returns something else is
    refused, naming it (DDP would otherwise step on gradients nobody averaged)."""
    result = driver.run(allreduce, tensor, op=AVG, check_args=False, **params)
    if result is tensor:
        return
    if not (isinstance(result, torch.Tensor) and result.shape == tensor.shape
            and result.dtype == tensor.dtype):
        got = (f"a {tuple(result.shape)} {result.dtype} tensor"
               if isinstance(result, torch.Tensor) else type(result).__name__)
        raise ValueError(f"{getattr(allreduce, '__name__', allreduce)!r} returned {got} for a "
                         f"bucket of {tuple(tensor.shape)} {tensor.dtype}: an all-reduce "
                         "returns the averaged buffer")
    if result.data_ptr() != tensor.data_ptr():
        tensor.copy_(result)


class HookState:
    """The state of ``allreduce_hook``: which all-reduce averages DDP's buckets, and the
    driver and comm thread it runs on, made once.

    Make it on every rank at the same point (it makes the driver's process group, which is
    collective). ``allreduce`` is any all-reduce of ``algorithms`` (``ring_allreduce``,
    ``nccl_allreduce``, ...) and ``params`` go to it. Without a ``driver`` it makes one over
    all ranks of the default process group, on a group of its own, so that its messages
    never meet DDP's own collectives, with the ``channels`` the algorithm spawns on
    (``ring_channels(k)`` for NCCL-class rings, say).
    """

    def __init__(self, allreduce: Callable[..., Schedule] = ring_allreduce,
                 driver: Driver | None = None, channels: Sequence[Hashable] = (),
                 **params: Any) -> None:
        if not callable(allreduce):
            raise TypeError(f"allreduce must be an algorithm (a generator function), got "
                            f"{allreduce!r}")
        self.allreduce, self.params = allreduce, params
        self.driver = driver if driver is not None else Driver(
            range(torch.distributed.get_world_size()), channels=channels)
        self._todo: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Buckets are averaged one at a time, in the order DDP hands them over, which is
        # the same on every rank: so every rank's collectives meet in the same order.
        self._thread = threading.Thread(target=self._comm_loop, name="realcomm-ddp-hook",
                                        daemon=True)
        self._thread.start()

    def _comm_loop(self) -> None:
        while (work := self._todo.get()) is not None:
            work()

    def average(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Average ``tensor`` over the ranks on the comm thread; the future holds it."""
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

        def work() -> None:
            try:
                with torch.no_grad():
                    _average_in_place(self.driver, self.allreduce, tensor, self.params)
                future.set_result(tensor)
            except BaseException as error:  # DDP raises it where backward waits
                future.set_exception(error)

        self._todo.put(work)
        return future

    def close(self) -> None:
        """Stop the comm thread once the buckets handed to it are done."""
        self._todo.put(None)
        self._thread.join()


def allreduce_hook(state: HookState, bucket: torch.distributed.GradBucket
                   ) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook (``DistributedDataParallel.register_comm_hook``): averages
    the bucket with ``state.allreduce`` over the ranks, asynchronously, so that the
    communication of one bucket overlaps the backward of the next."""
    return state.average(bucket.buffer())


class BucketedAllreduce:
    """Averages a module's gradients over the driver's ranks in DDP's buckets.

    Constructing it is collective over the driver's ranks: it broadcasts rank 0's
    parameters, as DDP does, so that every replica starts the same.
    """

    def __init__(self, module: torch.nn.Module, driver: Driver, *,
                 bucket_cap: int = DEFAULT_BUCKET_CAP,
                 first_bucket_cap: int = FIRST_BUCKET_CAP,
                 allreduce: Callable[..., Schedule] = ring_allreduce,
                 **allreduce_params: Any) -> None:
        if not callable(allreduce):  # else the comm thread finds it at the first backward
            raise TypeError(f"allreduce must be an algorithm (a generator function), got "
                            f"{allreduce!r}")
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no parameters that require grad")
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError("all parameters must share one dtype and device, got "
                             f"{sorted({(str(p.dtype), str(p.device)) for p in params})}")
        self.driver = driver
        self.allreduce = allreduce
        self.allreduce_params = allreduce_params
        self.ready_order = list(reversed(params))  # as backward makes their grads ready
        self.buckets = assign_buckets([p.numel() for p in self.ready_order],
                                      params[0].element_size(), bucket_cap, first_bucket_cap)
        self._flat = [torch.empty(sum(self.ready_order[i].numel() for i in members),
                                  dtype=params[0].dtype, device=params[0].device)
                      for members in self.buckets]
        self._index = {id(p): i for i, p in enumerate(self.ready_order)}
        self._broadcast_parameters()
        self._launcher = BucketLauncher(self.buckets)
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._launched = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_ready) for p in params]
        self._buffers = list(module.buffers())
        if self._buffers:
            self._hooks.append(module.register_forward_pre_hook(self._broadcast_buffers))
        self._thread = threading.Thread(target=self._comm_loop, name="realcomm-ddp",
                                        daemon=True)
        self._thread.start()

    def _broadcast_parameters(self) -> None:
        with torch.no_grad():
            for b, members in enumerate(self.buckets):
                views = self._views(b)
                for i, view in zip(members, views):
                    view.copy_(self.ready_order[i].detach().view(-1))
                self.driver.run(broadcast, self._flat[b], root=0)
                for i, view in zip(members, views):
                    self.ready_order[i].copy_(view.view_as(self.ready_order[i]))

    def _views(self, bucket: int) -> list[torch.Tensor]:
        views, start = [], 0
        for i in self.buckets[bucket]:
            n = self.ready_order[i].numel()
            views.append(self._flat[bucket][start:start + n])
            start += n
        return views

    def _broadcast_buffers(self, _module: torch.nn.Module, _inputs: Any) -> None:
        if self._launched:  # the last backward's buckets may still be on the wire
            raise RuntimeError(_MISSED_FINISH)
        with torch.no_grad():
            for buffer in self._buffers:
                self.driver.run(broadcast, buffer.view(-1), root=0)

    def _on_ready(self, param: torch.Tensor) -> None:
        # Runs in autograd's thread as each gradient is accumulated.
        try:
            ready = self._launcher.ready(self._index[id(param)])
        except ValueError:  # its bucket went already: a second backward without finish()
            raise RuntimeError(_MISSED_FINISH) from None
        for b in ready:
            self._todo.put(b)
            self._launched += 1

    def _comm_loop(self) -> None:
        while (b := self._todo.get()) != _STOP:
            try:
                self._allreduce_bucket(b)
                self._done.put(None)
            except BaseException as error:  # reported by finish(), in the caller's thread
                self._done.put(error)

    def _allreduce_bucket(self, b: int) -> None:
        members, views = self.buckets[b], self._views(b)
        with torch.no_grad():
            for i, view in zip(members, views):
                view.copy_(self.ready_order[i].grad.view(-1))
            _average_in_place(self.driver, self.allreduce, self._flat[b], self.allreduce_params)
            for i, view in zip(members, views):
                self.ready_order[i].grad.copy_(view.view_as(self.ready_order[i]))

    def finish(self) -> None:
        """Wait until every bucket of this backward is all-reduced; then every gradient is
        the average over the ranks. Call it after ``backward`` and before the optimizer."""
        if not self._launcher.done:
            missing = [i for members in self.buckets for i in members
                       if self.ready_order[i].grad is None]
            raise RuntimeError(
                f"backward left {len(missing) or 'some'} parameters without a gradient, so "
                "their buckets never started: every parameter that requires grad must take "
                "part in the loss")
        errors = [self._done.get() for _ in range(self._launched)]
        self._launched = 0
        self._launcher = BucketLauncher(self.buckets)
        failed = [e for e in errors if e is not None]
        if failed:
            raise failed[0]

    def close(self) -> None:
        """Remove the hooks and stop the comm thread."""
        for hook in self._hooks:
            hook.remove()
        self._todo.put(_STOP)
        self._thread.join()
