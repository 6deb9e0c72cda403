"""numpy references: what each collective must produce, rank by rank.

Each takes the list of per-rank input arrays and returns the list of per-rank expected
results, ``None`` where a rank has no defined result.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from algorithms.buffers import chunk_bounds
from algorithms.ops import ReduceOp

_COMBINE = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
}


def combine(op: ReduceOp, acc: np.ndarray, incoming: np.ndarray) -> None:
    """Fold ``incoming`` into ``acc`` in place with ``op`` (AVG folds as a sum)."""
    _COMBINE[op](acc, incoming, out=acc)


def divide(buf: np.ndarray, divisor: int) -> None:
    """Divide in place; integers truncate toward zero as C integer division does."""
    if buf.dtype.kind in "iu":
        quotient = buf // divisor
        quotient += ((buf % divisor) != 0) & (buf < 0)  # floor -> toward zero
        buf[...] = quotient
    else:
        np.divide(buf, buf.dtype.type(divisor), out=buf)


def reduced(inputs: Sequence[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The elementwise reduction of all inputs, in rank order, in their own dtype."""
    if len({len(a) for a in inputs}) > 1:
        raise ValueError("all ranks need buffers of the same length for a reduction")
    acc = np.array(inputs[0], copy=True)
    for a in inputs[1:]:
        combine(op, acc, a)
    if op is ReduceOp.AVG and len(inputs) > 1:
        divide(acc, len(inputs))
    return acc


def allreduce_reference(inputs: Sequence[np.ndarray], op: ReduceOp = ReduceOp.SUM
                        ) -> list[np.ndarray]:
    """Every rank gets the reduction of all inputs."""
    result = reduced(inputs, op)
    return [result.copy() for _ in inputs]


def reduce_scatter_reference(inputs: Sequence[np.ndarray], op: ReduceOp = ReduceOp.SUM
                             ) -> list[np.ndarray]:
    """Rank r gets chunk r (``split_even`` bounds) of the reduction."""
    result = reduced(inputs, op)
    return [result[a:b].copy() for a, b in chunk_bounds(len(result), len(inputs))]


def all_gather_reference(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every rank gets chunk r of rank r's buffer, for every r, concatenated."""
    p = len(inputs)
    if len({len(a) for a in inputs}) > 1:
        raise ValueError("all ranks need buffers of the same length for all_gather")
    bounds = chunk_bounds(len(inputs[0]), p)
    result = np.concatenate([inputs[r][a:b] for r, (a, b) in enumerate(bounds)])
    return [result.copy() for _ in inputs]


def broadcast_reference(inputs: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
    """Every rank gets the root's buffer."""
    return [np.array(inputs[root], copy=True) for _ in inputs]


def reduce_reference(inputs: Sequence[np.ndarray], root: int = 0,
                     op: ReduceOp = ReduceOp.SUM) -> list[np.ndarray | None]:
    """The root gets the reduction; other ranks have no defined result."""
    result = reduced(inputs, op)
    return [result if r == root else None for r in range(len(inputs))]


def all_to_all_reference(inputs: Sequence[np.ndarray],
                         split_sizes_matrix: Sequence[Sequence[int]] | None = None
                         ) -> list[np.ndarray]:
    """Rank j gets chunk j of every rank's buffer, concatenated in rank order."""
    p = len(inputs)
    if split_sizes_matrix is None:
        bounds = [chunk_bounds(len(a), p) for a in inputs]
    else:
        bounds = []
        for row in split_sizes_matrix:
            edges = np.concatenate([[0], np.cumsum(row, dtype=np.int64)])
            bounds.append([(int(edges[j]), int(edges[j + 1])) for j in range(p)])
    return [np.concatenate([inputs[i][bounds[i][j][0]:bounds[i][j][1]] for i in range(p)])
            for j in range(p)]
