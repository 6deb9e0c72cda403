"""The tree, hierarchical and NVLS-tree all-reduces over gloo, with ranks grouped into nodes: four
processes as two nodes of two and as four nodes of one get torch's all-reduce and the
simulator's results, bit for bit (the inputs are small integers, so any order of reduction
gives the same sums)."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from algorithms import (
    AVG, MAX, SUM, hierarchical_allreduce, nccl_tree_allreduce, nvls_channels,
    nvls_tree_allreduce, tree_channels,
)
from realcomm import Driver, spawn
from simcomm import hierarchical, simulate

RANKS = 4
LOCAL_SIZES = (2, 1)
LENGTH = 37  # no number of ranks or channels divides it
CASES = [(algorithm, params) for op in (SUM, MAX, AVG) for algorithm, params in (
    (nccl_tree_allreduce, {"op": op}),
    (nccl_tree_allreduce, {"op": op, "channels": 2, "chunk_bytes": 24}),
    (hierarchical_allreduce, {"op": op}),
    (nvls_tree_allreduce, {"op": op, "channels": 2, "chunk_bytes": 24}),
)]
TORCH_OPS = {SUM: dist.ReduceOp.SUM, MAX: dist.ReduceOp.MAX, AVG: dist.ReduceOp.AVG}


def inputs() -> list[np.ndarray]:
    return [np.random.default_rng(r).integers(-3, 4, LENGTH).astype(np.float32)
            for r in range(RANKS)]


def _run_on_nodes(data: list[np.ndarray]) -> list[tuple[list[float], list[float]]]:
    """(ours, torch's) for every local size and case, on this rank."""
    rank, replies = dist.get_rank(), []
    for local_size in LOCAL_SIZES:
        # One CTA per channel's communicator is NCCL's business; gloo runs the same.
        driver = Driver(range(RANKS), channels=tree_channels(2) + nvls_channels(2), timeout=60.0,
                        local_size=local_size, nccl_channel_ctas=1)
        for algorithm, params in CASES:
            ours = driver.run(algorithm, torch.from_numpy(data[rank].copy()), **params)
            native = torch.from_numpy(data[rank].copy())
            dist.all_reduce(native, TORCH_OPS[params["op"]])
            replies.append((ours.tolist(), native.tolist()))
    return replies


def test_trees_and_rails_on_nodes_match_torch_and_the_simulator() -> None:
    data = inputs()
    real = spawn(_run_on_nodes, RANKS, (data,), timeout=120)
    index = 0
    for local_size in LOCAL_SIZES:
        topology = hierarchical(RANKS // local_size, local_size, 1e9, 1e-6, 1e8, 1e-5)
        for algorithm, params in CASES:
            simulated = simulate(algorithm, data, topology, **params).results
            where = (algorithm.__name__, params, f"local size {local_size}")
            for rank in range(RANKS):
                ours, native = real[rank][index]
                assert ours == native == simulated[rank].tolist(), (where, rank)
            index += 1


def _refused_ctas() -> list[str]:
    messages = []
    for ctas in (0, 1.5, True):
        try:
            Driver(channels=["ring 0"], nccl_channel_ctas=ctas)
        except ValueError as error:
            messages.append(str(error))
    return messages


def test_a_cta_count_that_is_not_a_positive_int_is_refused() -> None:
    for messages in spawn(_refused_ctas, 2, timeout=60):
        assert messages == [f"nccl_channel_ctas must be an int >= 1 (or None: NCCL's default), "
                            f"got {bad!r}" for bad in (0, 1.5, True)]
