"""Models as the training schedules see them: a list of layers, each with its parameter
tensors and its forward and backward compute time.

Published models ready to use are in ``algorithms.harness.model_presets``; a real
``torch.nn.Module`` becomes one with ``realcomm.models.model_from_module``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """One layer: its parameter tensors (element counts, in registration order) and the
    seconds its forward and backward passes take on one rank's batch."""

    name: str
    params: tuple[int, ...]
    forward_seconds: float
    backward_seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.params, (tuple, list)) or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in self.params):
            raise ValueError(f"layer {self.name!r}: parameter sizes must be a tuple of ints "
                             f">= 0, got {self.params!r}")
        for what, value in (("forward_seconds", self.forward_seconds),
                            ("backward_seconds", self.backward_seconds)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"layer {self.name!r}: {what} must be a number of seconds, "
                                f"got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"layer {self.name!r}: {what} must be finite and >= 0, "
                                 f"got {value!r}")

    @property
    def param_count(self) -> int:
        """Parameters of the layer, all tensors together."""
        return sum(self.params)


@dataclass(frozen=True)
class Model:
    """A model for the training schedules.

    ``grad_bytes`` is the size of one gradient element (4 for float32). ``input_bytes`` and
    ``output_bytes`` are one rank's batch of inputs and of outputs: DataParallel scatters
    the one and gathers the other.
    """

    name: str
    layers: tuple[Layer, ...]
    grad_bytes: int = 4
    input_bytes: int = 0
    output_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no layers")
        for layer in self.layers:
            if not isinstance(layer, Layer):
                raise TypeError(f"model {self.name!r}: layers must be Layer objects, got "
                                f"{layer!r}")
        for what, value, least in (("grad_bytes", self.grad_bytes, 1),
                                   ("input_bytes", self.input_bytes, 0),
                                   ("output_bytes", self.output_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"model {self.name!r}: {what} must be an int >= {least}, "
                                 f"got {value!r}")
        if len({layer.name for layer in self.layers}) != len(self.layers):
            raise ValueError(f"model {self.name!r}: layer names must be distinct")

    @property
    def param_count(self) -> int:
        """Parameters of the whole model."""
        return sum(layer.param_count for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        """Bytes of all gradients (one element of ``grad_bytes`` per parameter)."""
        return self.param_count * self.grad_bytes

    @property
    def forward_seconds(self) -> float:
        """The whole forward pass on one rank's batch."""
        return sum(layer.forward_seconds for layer in self.layers)

    @property
    def backward_seconds(self) -> float:
        """The whole backward pass on one rank's batch."""
        return sum(layer.backward_seconds for layer in self.layers)
