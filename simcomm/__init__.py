"""A discrete-event simulator (simpy) of GPUs and links that runs the op generators of
``algorithms`` and reports what they cost."""

from algorithms.protocol import (
    AlgorithmError, DeadlockError, MessageSizeError, ProtocolError, RunLimitError,
    UnreceivedMessageError,
)
from simcomm.buffers import SizeOnly
from simcomm.engine import Jitter, simulate
from simcomm.results import Hop, LinkStats, SimResult, TraceEvent
from simcomm.topology import (
    Link, Topology, fully_connected, hierarchical, make_topology, ring, switch,
)
from simcomm.units import parse_bandwidth, parse_bytes, parse_seconds

__all__ = [
    "AlgorithmError", "DeadlockError", "Hop", "Jitter", "Link", "LinkStats", "MessageSizeError",
    "ProtocolError", "RunLimitError", "SimResult", "SizeOnly", "Topology", "TraceEvent",
    "UnreceivedMessageError", "fully_connected", "hierarchical", "make_topology",
    "parse_bandwidth", "parse_bytes", "parse_seconds", "ring", "simulate", "switch",
]
