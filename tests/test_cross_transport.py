"""Passing the simulator means running for real: every built-in collective and training
schedule, and planted unsafe algorithms, behave alike in the simulator and over gloo with 2
to 4 processes. Either both finish with equal results, or the simulator raises
``DeadlockError`` and the real run times out.

Each world size runs in one spawn of real processes. A timed-out run breaks its process
group, so every unsafe case gets a driver over a new group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from algorithms import (
    AVG, MAX, PROD, SUM, Alloc, Recv, Send, Wait, all_gather, all_to_all, alltoall_allreduce,
    broadcast, hierarchical_allreduce, nccl_ring_all_gather, nccl_ring_allreduce,
    nccl_ring_reduce_scatter, nccl_tree_allreduce, reduce, reduce_broadcast_allreduce,
    reduce_scatter, ring_allreduce, ring_channels, split_sizes, tree_channels,
)
from algorithms.ddp import assign_buckets, bucket_channel, ddp_step, gradient_order
from algorithms.fsdp import fsdp_channels, fsdp_step, padded_size
from algorithms.models import Layer, Model
from algorithms.reference import allreduce_reference
from realcomm import Driver, PeerError, PeerTimeoutError, spawn
from simcomm import DeadlockError, fully_connected, hierarchical, simulate
from test_send_semantics import recursive_doubling_send_first

WORLD_SIZES = (2, 3, 4)
SHORT_TIMEOUT = 2.0  # seconds a real run of an unsafe algorithm hangs before it gives up
LENGTHS = (0, 7, 64)  # an empty buffer, one no world size divides, one most do
MODEL = Model("two layers", (Layer("first", (5, 3), 1e-4, 2e-4),
                             Layer("second", (6,), 1e-4, 2e-4)))


# -- the schedules as algorithms of one flat buffer -------------------------------------

def ddp_schedule(comm, x, bucket_cap: int = 24):
    """A DDP step whose gradient buckets are views of ``x``; returns the averaged ``x``."""
    sizes = [MODEL.layers[layer].params[tensor] for layer, tensor in gradient_order(MODEL)]
    buckets = assign_buckets(sizes, MODEL.grad_bytes, bucket_cap, bucket_cap)
    grads = split_sizes(x, [sum(sizes[i] for i in bucket) for bucket in buckets])
    yield from ddp_step(comm, MODEL, grads, buckets)
    return x


def fsdp_schedule(comm, x):
    """An FSDP step: ``x`` holds every unit's gradients; returns this rank's averaged
    shards of them, end to end."""
    p = comm.size
    full = [padded_size(layer.param_count, p) for layer in MODEL.layers]
    grads = split_sizes(x, full)
    shards = [np.zeros(n // p, x.dtype) if isinstance(x, np.ndarray)
              else torch.zeros(n // p, dtype=x.dtype) for n in full]
    gathered = [g.copy() if isinstance(g, np.ndarray) else g.clone() for g in grads]
    shard_grads = [s.copy() if isinstance(s, np.ndarray) else s.clone() for s in shards]
    yield from fsdp_step(comm, MODEL, shards, gathered, grads, shard_grads)
    if isinstance(x, np.ndarray):
        return np.concatenate(shard_grads)
    return torch.cat(shard_grads)


def fsdp_length(p: int) -> int:
    return sum(padded_size(layer.param_count, p) for layer in MODEL.layers)


# -- planted unsafe algorithms ----------------------------------------------------------

def send_wait_recv_ring(comm, x):
    """Each rank waits on its send to the right before posting the receive from the left:
    every send waits for a receive that is never posted."""
    incoming = yield Alloc(len(x), x)
    yield Wait((yield Send((comm.rank + 1) % comm.size, x)))
    yield Wait((yield Recv((comm.rank - 1) % comm.size, incoming)))
    return incoming


UNSAFE = (send_wait_recv_ring, recursive_doubling_send_first)


# -- the cases --------------------------------------------------------------------------

def safe_cases(p: int) -> list[tuple[Callable[..., Any], dict[str, Any], list[np.ndarray]]]:
    """(algorithm, params, per-rank inputs) for every built-in collective and schedule."""
    rng = np.random.default_rng(p)

    def inputs(length: int, dtype: Any = np.float32) -> list[np.ndarray]:
        return [rng.integers(-3, 4, length).astype(dtype) for _ in range(p)]

    cases = []
    for n in LENGTHS:
        for op in (SUM, AVG, MAX, PROD):
            cases += [(ring_allreduce, {"op": op}, inputs(n)),
                      (nccl_ring_allreduce, {"op": op}, inputs(n)),
                      (nccl_ring_allreduce, {"op": op, "channels": 3}, inputs(n)),
                      (nccl_tree_allreduce, {"op": op}, inputs(n)),
                      (nccl_tree_allreduce, {"op": op, "channels": 3, "chunk_bytes": 40},
                       inputs(n)),
                      (hierarchical_allreduce, {"op": op}, inputs(n)),
                      (alltoall_allreduce, {"op": op}, inputs(n)),
                      (alltoall_allreduce, {"op": op, "chunked": True}, inputs(n)),
                      (reduce_broadcast_allreduce, {"op": op}, inputs(n)),
                      (reduce_broadcast_allreduce, {"op": op, "tree": True}, inputs(n))]
        cases += [(reduce_scatter, {"op": SUM}, inputs(n)),
                  (nccl_ring_reduce_scatter, {"op": AVG, "channels": 2}, inputs(n)),
                  (all_gather, {}, inputs(n, np.int64)),
                  (nccl_ring_all_gather, {}, inputs(n, np.int64)),
                  (broadcast, {"root": p - 1}, inputs(n)),
                  (broadcast, {"root": 1, "tree": True}, inputs(n)),
                  (reduce, {"root": p - 1, "op": SUM}, inputs(n)),
                  (reduce, {"root": 1, "tree": True, "op": MAX}, inputs(n)),
                  (all_to_all, {}, inputs(n * p))]
    total = sum(MODEL.layers[i].params[j] for i, j in gradient_order(MODEL))
    cases += [(ddp_schedule, {}, inputs(total)), (ddp_schedule, {"bucket_cap": 1000},
                                                   inputs(total)),
              (fsdp_schedule, {}, inputs(fsdp_length(p)))]
    return cases


def unsafe_cases(p: int) -> list[tuple[Callable[..., Any], dict[str, Any], list[np.ndarray]]]:
    return [(algorithm, {}, [np.arange(10, dtype=np.float32)] * p) for algorithm in UNSAFE]


def _channels() -> list[str]:
    # Enough bucket channels for the smallest cap; FSDP's for every unit.
    return ([bucket_channel(b) for b in range(8)] + fsdp_channels(len(MODEL.layers))
            + ring_channels(max(WORLD_SIZES)) + tree_channels(max(WORLD_SIZES)))


# -- the real side (runs in each process) -----------------------------------------------

def _run_real(cases: list[tuple[Callable[..., Any], dict[str, Any], list[np.ndarray]]],
              unsafe: list[tuple[Callable[..., Any], dict[str, Any], list[np.ndarray]]]
              ) -> list[tuple[str, Any]]:
    rank, p = dist.get_rank(), dist.get_world_size()
    replies: list[tuple[str, Any]] = []
    driver = Driver(range(p), channels=_channels(), timeout=60.0)
    for algorithm, params, inputs in cases:
        result = driver.run(algorithm, torch.from_numpy(inputs[rank].copy()), **params)
        replies.append(("ok", None if result is None else result.numpy().copy()))
    for algorithm, params, inputs in unsafe:
        fresh = Driver(range(p), timeout=SHORT_TIMEOUT)  # the last run broke its group
        try:
            fresh.run(algorithm, torch.from_numpy(inputs[rank].copy()), check_args=False,
                      **params)
            replies.append(("ok", None))
        except PeerError as error:
            replies.append((type(error).__name__, str(error)))
    return replies


def _simulate(algorithm: Callable[..., Any], params: dict[str, Any],
              inputs: list[np.ndarray]) -> list[Any]:
    return simulate(algorithm, inputs, fully_connected(len(inputs), 1e9, 1e-6),
                    record=False, **params).results


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_the_simulator_and_gloo_agree_on_every_collective_and_on_unsafe_algorithms(p) -> None:
    cases, unsafe = safe_cases(p), unsafe_cases(p)
    real = spawn(_run_real, p, (cases, unsafe), timeout=120)
    for index, (algorithm, params, inputs) in enumerate(cases):
        simulated = _simulate(algorithm, params, inputs)
        for rank in range(p):
            status, got = real[rank][index]
            want = simulated[rank]
            where = f"{algorithm.__name__} {params} on {p} ranks, length " \
                    f"{len(inputs[0])}, rank {rank}"
            assert status == "ok", where
            if want is None:
                assert got is None, where
            else:
                np.testing.assert_array_equal(got, want, err_msg=where)
    for offset, (algorithm, params, inputs) in enumerate(unsafe, len(cases)):
        with pytest.raises(DeadlockError, match="its Recv was never posted"):
            _simulate(algorithm, params, inputs)
        outcomes = [real[rank][offset][0] for rank in range(p)]
        # Every rank gave up; at least one because its own wait ran out.
        assert all(o in ("PeerTimeoutError", "PeerError") for o in outcomes), outcomes
        assert PeerTimeoutError.__name__ in outcomes, outcomes


def test_the_planted_unsafe_algorithms_are_right_where_sends_are_eager() -> None:
    # They are faults of ordering only: with MPI-style eager sends they compute an all-
    # reduce, which is why an eager simulator passed them.
    inputs = [np.arange(4, dtype=np.float32) + r for r in range(4)]
    got = simulate(recursive_doubling_send_first, inputs, fully_connected(4, 1e9, 1e-6),
                   eager_limit=1 << 20).results
    for result, want in zip(got, allreduce_reference(inputs)):
        np.testing.assert_array_equal(result, want)


def _rails_on_two_nodes(inputs: list[np.ndarray]) -> list[Any]:
    rank = dist.get_rank()
    driver = Driver(range(4), channels=ring_channels(2), timeout=60.0, local_size=2)
    assert driver.comm.local_size == 2
    return driver.run(nccl_ring_allreduce, torch.from_numpy(inputs[rank].copy())).tolist()


def test_a_local_size_given_to_the_driver_gives_the_simulators_rings() -> None:
    # Four processes as two nodes of two: two rings, rail-aligned as on the topology.
    inputs = [np.random.default_rng(r).integers(-3, 4, 37).astype(np.float32) for r in range(4)]
    real = spawn(_rails_on_two_nodes, 4, (inputs,), timeout=120)
    topology = hierarchical(2, 2, 1e9, 1e-6, 1e8, 1e-5)
    simulated = simulate(nccl_ring_allreduce, inputs, topology).results
    assert real == [r.tolist() for r in simulated]
