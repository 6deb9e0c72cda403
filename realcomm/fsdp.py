"""FSDP on a real ``torch.nn.Sequential`` over realcomm, driven by the very schedule the
simulator runs (``algorithms.fsdp.fsdp_step``).

Each child of the sequential is a unit. Its parameters are flattened and padded to a
multiple of the world size; this rank keeps one shard of them as an ``nn.Parameter`` (what
the optimizer updates). The module's own parameters become views into the unit's gathered
buffer, which the schedule's all-gathers fill from every rank's shard before the unit's
forward and backward. The schedule's ``Compute`` ops carry the real work: the forward of one
unit, and the backward of one unit from the gradient of its output, so that backward runs
unit by unit in the order the schedule says; each unit's gradients land in its flat
gradient buffer, which the schedule reduce-scatters (averaging) into the shard's gradient.

    model = FullyShardedSequential(torch.nn.Sequential(...))   # collective: all ranks
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)    # the shards
    for inputs, targets in batches:
        loss = model.train_step(inputs, targets, loss_fn)      # forward and backward
        optimizer.step(); optimizer.zero_grad()
    model.eval()
    predictions = model(inputs)                                # gathers the current shards
    weights = model.state_dict()                               # the whole module's

It is an ``nn.Module`` whose parameters are the shards; calling it (for evaluation) and
``state_dict`` first gather the current shards, so they never see parameters older than the
last optimizer step.

What it does not do: free memory. The gathered buffers stay allocated between uses (freeing
them under autograd needs FSDP's storage tricks); the schedule's ``Footprint`` accounting is
the simulator's business. Activations are kept unit by unit, as without FSDP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from algorithms.collectives import Schedule, all_gather, broadcast
from algorithms.fsdp import (
    BACKWARD_PRE, check_fsdp_options, fsdp_channels, fsdp_step, padded_size,
)
from algorithms.models import Layer, Model
from realcomm.driver import DEFAULT_TIMEOUT, Driver


class FullyShardedSequential(torch.nn.Module):
    """A ``torch.nn.Sequential`` trained with FSDP's schedule over the driver's ranks.

    Constructing it is collective over the default process group: it makes a driver with
    a channel per collective of the schedule and broadcasts rank 0's parameters. So are
    calling it, ``state_dict`` and ``full_parameters``, which gather the shards.
    """

    def __init__(self, module: torch.nn.Sequential, *, forward_prefetch: bool = False,
                 backward_prefetch: str | None = BACKWARD_PRE, limit_all_gathers: int = 2,
                 reshard_after_forward: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        self.units = list(module.children())
        if not self.units:
            raise ValueError("the module has no children to take as units")
        params = [p for unit in self.units for p in unit.parameters()]
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError("all parameters must share one dtype and device")
        # Before the driver and the broadcasts: train_step would find them wrong only then.
        check_fsdp_options(forward_prefetch, backward_prefetch, limit_all_gathers,
                           reshard_after_forward)
        # Not a submodule: its parameters are views of the gathered buffers, which the
        # optimizer must not see; the shards below are this module's parameters.
        self.__dict__["module"] = module
        self.driver = Driver(channels=fsdp_channels(len(self.units)), timeout=timeout)
        p, r = self.driver.comm.size, self.driver.comm.rank
        like = params[0] if params else torch.empty(0)
        self.options = {"forward_prefetch": forward_prefetch,
                        "backward_prefetch": backward_prefetch,
                        "limit_all_gathers": limit_all_gathers,
                        "reshard_after_forward": reshard_after_forward}
        self.gathered: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        shards = []
        for unit in self.units:
            count = sum(q.numel() for q in unit.parameters())
            flat = torch.zeros(padded_size(count, p), dtype=like.dtype, device=like.device)
            with torch.no_grad():
                for q, view in _views(unit, flat):
                    view.copy_(q)
                self.driver.run(broadcast, flat, root=0)  # every replica starts as rank 0's
            chunk = len(flat) // p
            shard = torch.nn.Parameter(flat[r * chunk:(r + 1) * chunk].clone())
            shard.grad = torch.zeros_like(shard)
            shards.append(shard)
            self.gathered.append(flat)
            self.grads.append(torch.zeros_like(flat))
            # From now on the parameters are views into the gathered buffer, so whatever the
            # all-gathers write there is what forward and backward use.
            for q, view in _views(unit, flat):
                q.data = view
        self.shards = torch.nn.ParameterList(shards)
        self.model = Model(type(module).__name__, tuple(
            Layer(str(i), tuple(q.numel() for q in unit.parameters()), 0.0, 0.0)
            for i, unit in enumerate(self.units)), grad_bytes=like.element_size())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The module's output on ``inputs`` with the current parameters (collective: they
        are gathered first). For evaluation: training goes through ``train_step``."""
        if self.training and torch.is_grad_enabled():
            raise RuntimeError("FullyShardedSequential trains through train_step(inputs, "
                               "targets, loss_fn); call it for evaluation, after model.eval() "
                               "or under torch.no_grad()")
        self._gather()
        return self.module(inputs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The whole module's state, with its current parameters, under its own keys, as
        FSDP's full state dict (collective: the shards are gathered first)."""
        self._gather()
        return {key: value.detach().clone()
                for key, value in self.module.state_dict(*args, **kwargs).items()}

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        """Forward and backward on this rank's batch; the shards' ``.grad`` then hold the
        gradients averaged over the ranks. Returns this rank's loss."""
        for shard in self.shards:  # optimizer.zero_grad() may have set them to None
            if shard.grad is None:
                shard.grad = torch.zeros_like(shard)
        activations: list[torch.Tensor] = [inputs]
        unit_inputs: list[torch.Tensor] = []
        loss: list[torch.Tensor] = []
        last = len(self.units) - 1

        def forward(i: int) -> None:
            x = activations[i].detach()
            if i > 0 and x.is_floating_point():  # its gradient feeds the unit before
                x.requires_grad_(True)
            unit_inputs.append(x)
            out = self.units[i](x)
            activations.append(out)
            if i == last:
                loss.append(loss_fn(out, targets))

        def backward(i: int) -> None:
            unit = self.units[i]
            for q in unit.parameters():
                q.grad = None
            if i == last:
                loss[0].backward()
            else:
                activations[i + 1].backward(unit_inputs[i + 1].grad)
            with torch.no_grad():
                self.grads[i].zero_()
                for q, view in _views(unit, self.grads[i]):
                    if q.grad is not None:
                        view.copy_(q.grad)

        self.driver.run(_fsdp_rank, torch.empty(0), check_args=False, model=self.model,
                        shards=[s.detach() for s in self.shards], gathered=self.gathered,
                        grads=self.grads, shard_grads=[s.grad for s in self.shards],
                        forward_work=[_bind(forward, i) for i in range(len(self.units))],
                        backward_work=[_bind(backward, i) for i in range(len(self.units))],
                        options=self.options)
        return float(loss[0].detach())

    def full_parameters(self) -> list[torch.Tensor]:
        """Every unit's parameters, gathered from the current shards (collective)."""
        self._gather()
        return [view.clone() for unit, flat in zip(self.units, self.gathered)
                for _, view in _views(unit, flat)]

    def _gather(self) -> None:
        """Fill every unit's gathered buffer, and so its parameters, from the shards."""
        p, r = self.driver.comm.size, self.driver.comm.rank
        with torch.no_grad():
            for shard, flat in zip(self.shards, self.gathered):
                chunk = len(flat) // p
                flat[r * chunk:(r + 1) * chunk] = shard.detach()
                self.driver.run(all_gather, flat)


def _fsdp_rank(comm: Any, _unused: Any, model: Model, options: dict[str, Any],
               **buffers: Any) -> Schedule:
    return fsdp_step(comm, model, **buffers, **options)


def _bind(fn: Callable[[int], None], i: int) -> Callable[[], None]:
    return lambda: fn(i)


def _views(unit: torch.nn.Module, flat: torch.Tensor
           ) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Each parameter of ``unit`` with the part of ``flat`` that holds it, shaped like it."""
    views, start = [], 0
    for q in unit.parameters():
        views.append((q, flat[start:start + q.numel()].view_as(q)))
        start += q.numel()
    return views
