"""Runs the op generators of ``algorithms`` over torch.distributed: gloo on the CPU, NCCL on
CUDA, the same code for both."""

from algorithms.protocol import MAIN_CHANNEL, AlgorithmError, MessageSizeError, ProtocolError
from realcomm.driver import (
    DEFAULT_SLICE_BYTES, DEFAULT_TIMEOUT, ArgumentMismatchError, Driver, PeerError,
    PeerTimeoutError, RealcommError,
)
from realcomm.launch import (
    DEFAULT_GRACE, LocalGroup, SpawnError, backend_for, init_from_env, spawn, start,
)

__all__ = [
    "DEFAULT_GRACE", "DEFAULT_SLICE_BYTES", "DEFAULT_TIMEOUT", "MAIN_CHANNEL", "AlgorithmError",
    "ArgumentMismatchError", "Driver", "LocalGroup", "MessageSizeError", "PeerError",
    "PeerTimeoutError", "ProtocolError", "RealcommError", "SpawnError", "backend_for",
    "init_from_env", "spawn", "start",
]
