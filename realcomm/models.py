"""A ``algorithms.models.Model`` from a real ``torch.nn.Module``: parameter sizes read from
the module, compute times measured by running it, so that the simulator can schedule DDP
for a user's own model.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import torch

from algorithms.models import Layer, Model


def model_from_module(module: torch.nn.Module, sample_input: torch.Tensor, *,
                      name: str | None = None, repeats: int = 5,
                      loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Model:
    """Describe ``module`` layer by layer, its direct children being the layers.

    Each layer's parameters are those of the child that require grad, in registration order
    (parameters held by ``module`` itself form a layer of their own, ``(root)``, first).
    Forward and backward times are the medians over ``repeats`` runs on ``sample_input``
    (one rank's batch) on its device, measured with module hooks; ``loss`` turns the output
    into the scalar to differentiate (default: its sum). A floating-point input is made to
    require grad while timing, so the first layer's backward includes its input gradient;
    for an integer input the first layer's backward can only be timed from its output on,
    which leaves out its own gradients. Gradients are zeroed afterwards.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    children = list(module.named_children())
    if not children:
        raise ValueError("the module has no children to take as layers")
    own = [p for p in module.parameters(recurse=False) if p.requires_grad]
    forward: dict[str, list[float]] = {n: [] for n, _ in children}
    backward: dict[str, list[float]] = {n: [] for n, _ in children}
    started: dict[str, float] = {}
    handles = []
    for child_name, child in children:
        handles += _timing_hooks(child, child_name, started, forward, backward)
    # An input that requires grad makes the first layer's backward hooks span its whole
    # backward; for integer inputs (token ids) torch can only time it from its output on.
    x = sample_input.detach().clone()
    if x.is_floating_point():
        x.requires_grad_(True)
    try:
        output = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            for _ in range(repeats):
                output = module(x)
                (loss or torch.sum)(output).backward()
                _synchronize(x.device)
    finally:
        for handle in handles:
            handle.remove()
        module.zero_grad(set_to_none=True)
    layers = []
    if own:
        layers.append(Layer("(root)", tuple(p.numel() for p in own), 0.0, 0.0))
    for child_name, child in children:
        params = tuple(p.numel() for p in child.parameters() if p.requires_grad)
        layers.append(Layer(child_name, params, _median(forward[child_name]),
                            _median(backward[child_name])))
    element = next((p.element_size() for p in module.parameters()), 4)
    assert output is not None
    return Model(name or type(module).__name__, tuple(layers), element,
                 sample_input.numel() * sample_input.element_size(),
                 output.numel() * output.element_size())


def _timing_hooks(child: torch.nn.Module, name: str, started: dict[str, float],
                  forward: dict[str, list[float]], backward: dict[str, list[float]]
                  ) -> list[torch.utils.hooks.RemovableHandle]:
    def before_forward(_module: torch.nn.Module, args: object) -> None:
        started["forward " + name] = time.perf_counter()

    def after_forward(_module: torch.nn.Module, args: object, output: object) -> None:
        forward[name].append(time.perf_counter() - started["forward " + name])

    def before_backward(_module: torch.nn.Module, grad_output: object) -> None:
        started["backward " + name] = time.perf_counter()

    def after_backward(_module: torch.nn.Module, grad_input: object, grad_output: object
                       ) -> None:
        backward[name].append(time.perf_counter() - started["backward " + name])

    return [child.register_forward_pre_hook(before_forward),
            child.register_forward_hook(after_forward),
            child.register_full_backward_pre_hook(before_backward),
            child.register_full_backward_hook(after_backward)]


def _median(samples: list[float]) -> float:
    # A child that never ran (or whose backward never fired) costs nothing.
    return statistics.median(samples) if samples else 0.0


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
