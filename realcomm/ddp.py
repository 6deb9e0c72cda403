"""DDP's bucketed gradient all-reduce for a real ``torch.nn.Module``, run by the algorithms
of ``algorithms`` over realcomm, overlapped with backward.

The bucketing is the one the simulator uses (``algorithms.ddp``): the module's parameters,
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
``find_unused_parameters``); ``finish`` raises naming the ones that did not.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from algorithms.collectives import Schedule, broadcast, ring_allreduce
from algorithms.ddp import DEFAULT_BUCKET_CAP, FIRST_BUCKET_CAP, BucketLauncher, assign_buckets
from algorithms.ops import AVG
from realcomm.driver import Driver

_STOP = -1


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

    def _on_ready(self, param: torch.Tensor) -> None:
        # Runs in autograd's thread as each gradient is accumulated.
        for b in self._launcher.ready(self._index[id(param)]):
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
            self.driver.run(self.allreduce, self._flat[b], op=AVG, check_args=False,
                            **self.allreduce_params)
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
