"""Collective algorithms written once, as per-rank generators of ops.

This package knows no transport: it imports neither simpy nor torch. ``simcomm`` simulates
the ops; ``realcomm`` runs them over torch.distributed. The rules every transport applies
to the ops, and their errors, are in ``algorithms.protocol``; what benchmarks, parses and
prints the algorithms is in ``algorithms.harness``.
"""

from algorithms.buffers import chunk_bounds, split_even, split_sizes
from algorithms.collectives import (
    all_gather, all_to_all, alltoall_allreduce, broadcast, reduce, reduce_broadcast_allreduce,
    reduce_scatter, ring_allreduce,
)
from algorithms.nccl import (
    hierarchical_allreduce, nccl_ring_all_gather, nccl_ring_allreduce, nccl_ring_reduce_scatter,
    rail_ring, ring_channels,
)
from algorithms.nccl_tree import (
    binary_tree, double_binary_tree, nccl_tree_allreduce, tree_channels, tree_position,
)
from algorithms.nvls import (
    nvls_all_gather, nvls_allreduce, nvls_channels, nvls_reduce_scatter, nvls_tree_allreduce,
)
from algorithms.ops import (
    AVG, MAX, MIN, PROD, SUM, Alloc, Choice, Combine, Comm, Compute, Copy, Divide, Footprint,
    Join, Launch, Multicast, Op, Protocol, Recv, RecvReduce, ReduceOp, Send, Sleep, Spawn, Tuner,
    Wait,
)
from algorithms.tuned import nccl_all_gather, nccl_allreduce, nccl_reduce_scatter

__all__ = [
    "AVG", "MAX", "MIN", "PROD", "SUM", "Alloc", "Choice", "Combine", "Comm", "Compute", "Copy",
    "Divide", "Footprint", "Join", "Launch", "Multicast", "Op", "Protocol", "Recv",
    "RecvReduce", "ReduceOp", "Send", "Sleep",
    "Spawn", "Tuner", "Wait", "all_gather", "all_to_all", "alltoall_allreduce", "binary_tree",
    "broadcast", "chunk_bounds", "double_binary_tree", "hierarchical_allreduce",
    "nccl_all_gather", "nccl_allreduce", "nccl_reduce_scatter", "nccl_ring_all_gather",
    "nccl_ring_allreduce", "nccl_ring_reduce_scatter", "nccl_tree_allreduce", "nvls_all_gather",
    "nvls_allreduce", "nvls_channels", "nvls_reduce_scatter", "nvls_tree_allreduce", "rail_ring",
    "reduce", "reduce_broadcast_allreduce", "reduce_scatter", "ring_allreduce", "ring_channels",
    "split_even", "split_sizes", "tree_channels", "tree_position",
]
