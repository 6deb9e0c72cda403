"""What each collective is, for harnesses: which nccl-tests collective it implements, which
arguments it takes, and how its size and bus bandwidth are counted.

Bus bandwidth factors and size conventions follow nccl-tests (doc/PERFORMANCE.md):
``busbw = algbw * factor(p)`` with ``algbw = size / time``; ``size`` is the all-reduced,
broadcast or reduced buffer, the full gathered / scattered buffer for all-gather and
reduce-scatter, and one rank's send buffer for all-to-all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from algorithms import collectives, nccl, nccl_tree, nvls, reference, tuned


@dataclass(frozen=True)
class Collective:
    """A collective algorithm and what a harness needs to know to run and score it."""

    name: str
    function: Callable[..., Any]
    kind: str  # nccl-tests name: allreduce, reducescatter, allgather, broadcast, reduce, alltoall
    takes_op: bool
    takes_root: bool
    reference: Callable[..., list[Any]]

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' factor from algorithm bandwidth to bus bandwidth."""
        p = world_size
        if self.kind == "allreduce":
            return 2 * (p - 1) / p
        if self.kind in ("reducescatter", "allgather", "alltoall"):
            return (p - 1) / p
        return 1.0


def _allreduce(name: str, fn: Callable[..., Any]) -> Collective:
    return Collective(name, fn, "allreduce", True, False, reference.allreduce_reference)


COLLECTIVES: MappingProxyType[str, Collective] = MappingProxyType({
    c.name: c for c in (
        _allreduce("ring_allreduce", collectives.ring_allreduce),
        _allreduce("reduce_broadcast_allreduce", collectives.reduce_broadcast_allreduce),
        _allreduce("alltoall_allreduce", collectives.alltoall_allreduce),
        _allreduce("nccl_ring_allreduce", nccl.nccl_ring_allreduce),
        _allreduce("nccl_tree_allreduce", nccl_tree.nccl_tree_allreduce),
        _allreduce("hierarchical_allreduce", nccl.hierarchical_allreduce),
        _allreduce("nvls_allreduce", nvls.nvls_allreduce),
        _allreduce("nccl_allreduce", tuned.nccl_allreduce),
        Collective("nccl_reduce_scatter", tuned.nccl_reduce_scatter, "reducescatter", True,
                   False, reference.reduce_scatter_reference),
        Collective("nccl_all_gather", tuned.nccl_all_gather, "allgather", False, False,
                   reference.all_gather_reference),
        Collective("reduce_scatter", collectives.reduce_scatter, "reducescatter", True, False,
                   reference.reduce_scatter_reference),
        Collective("all_gather", collectives.all_gather, "allgather", False, False,
                   reference.all_gather_reference),
        Collective("nccl_ring_reduce_scatter", nccl.nccl_ring_reduce_scatter, "reducescatter",
                   True, False, reference.reduce_scatter_reference),
        Collective("nccl_ring_all_gather", nccl.nccl_ring_all_gather, "allgather", False, False,
                   reference.all_gather_reference),
        Collective("broadcast", collectives.broadcast, "broadcast", False, True,
                   reference.broadcast_reference),
        Collective("reduce", collectives.reduce, "reduce", True, True,
                   reference.reduce_reference),
        Collective("all_to_all", collectives.all_to_all, "alltoall", False, False,
                   reference.all_to_all_reference),
    )
})


def get_collective(name: str) -> Collective:
    """Look up a collective by its Python name, with an error that lists the known ones."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}; known: {', '.join(sorted(COLLECTIVES))}") from None
