"""Runs the op generators of ``algorithms`` over torch.distributed: gloo on the CPU, NCCL on
CUDA, the same code for both."""

from algorithms.protocol import MAIN_CHANNEL, AlgorithmError, ProtocolError
from realcomm.driver import (
    DEFAULT_SLICE_BYTES, DEFAULT_TIMEOUT, ArgumentMismatchError, Driver, PeerError,
    PeerTimeoutError, RealcommError,
)
from realcomm.launch import (
    LocalGroup, SpawnError, backend_for, init_from_env, spawn, start,
)

__all__ = [
    "DEFAULT_SLICE_BYTES", "DEFAULT_TIMEOUT", "MAIN_CHANNEL", "AlgorithmError",
    "ArgumentMismatchError", "Driver", "LocalGroup", "PeerError", "PeerTimeoutError",
    "ProtocolError", "RealcommError", "SpawnError", "backend_for", "init_from_env", "spawn",
    "start",
]
