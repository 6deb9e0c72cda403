"""Collectives as NCCL runs them on clusters, written with the same ops as the textbook ones.

NCCL's ring all-reduce differs from the textbook ring (``collectives.ring_allreduce``) in
two ways that decide its cost across nodes (NVIDIA/nccl, src/device/all_reduce.h and
src/graph/rings.cc):

* Channels. The buffer is cut into parts, each moved by its own ring, all at once. The
  rings visit the ranks of a node in different orders, so that each ring enters and leaves
  a node through a different GPU, and so through a different NIC: with one NIC per GPU
  (rail-optimised clusters) every NIC carries one ring's traffic instead of one NIC
  carrying all of it.
* Pipelining. A step waits only for the data it needs, the chunk arriving from the left;
  its own send drains in the background and is waited only before its buffer is written
  again. The textbook ring waits for both, so every rank moves in lockstep at the pace of
  the slowest hop.
"""

from __future__ import annotations

from typing import Any

from algorithms.buffers import split_even
from algorithms.collectives import Schedule
from algorithms.ops import AVG, SUM, Comm, Divide, Join, Recv, ReduceOp, Send, Spawn, Wait


def ring_channels(channels: int) -> list[str]:
    """The channel names ``nccl_ring_allreduce`` spawns its rings on (a transport that maps
    channels to process groups declares them up front)."""
    return [f"ring {c}" for c in range(channels)]


def rail_ring(comm: Comm, channel: int) -> list[int]:
    """The rank order of ring ``channel``: node after node, each node's ranks starting at
    local rank ``channel`` (mod ranks per node), so the ring leaves node n from local rank
    ``channel - 1`` and enters node n + 1 at local rank ``channel``: a different pair of
    GPUs, and NICs, for each channel."""
    per_node = comm.ranks_per_node
    return [node * per_node + (channel + j) % per_node
            for node in range(comm.size // per_node) for j in range(per_node)]


def nccl_ring_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = 0) -> Schedule:
    """Ring all-reduce as NCCL runs it: ``channels`` rings at once (0: one per rank of a
    node, so every GPU's NIC carries one), each over its part of ``x`` in its own rank
    order (``rail_ring``), each a pipeline (see the module doc)."""
    if type(channels) is not int or channels < 0:
        raise ValueError(f"channels must be an int >= 0 (0: one per rank of a node), got "
                         f"{channels!r}")
    count = channels or comm.ranks_per_node
    parts = split_even(x, count)
    if count == 1:
        yield from _pipelined_ring(comm, parts[0], op, rail_ring(comm, 0))
        return x
    tasks = []
    for channel, (part, name) in enumerate(zip(parts, ring_channels(count))):
        tasks.append((yield Spawn(_pipelined_ring(comm, part, op, rail_ring(comm, channel)),
                                  name)))
    for task in tasks:
        yield Join(task)
    return x


def _pipelined_ring(comm: Comm, x: Any, op: ReduceOp, order: list[int]) -> Schedule:
    p = len(order)
    i = order.index(comm.rank)
    right, left = order[(i + 1) % p], order[(i - 1) % p]
    chunks = split_even(x, p)
    sends = {}  # chunk -> its send, not yet waited
    for step in range(p - 1):  # reduce-scatter: position i ends with chunk i reduced
        label = f"reduce-scatter {step}"
        sends[(i - step - 1) % p] = yield Send(right, chunks[(i - step - 1) % p], label)
        yield Wait((yield Recv(left, chunks[(i - step - 2) % p], op, label)))
    if op is AVG and p > 1 and len(chunks[i]) > 0:
        yield Divide(chunks[i], p)
    for step in range(p - 1):  # all-gather: pass on the chunk that came last
        label = f"all-gather {step}"
        out = (i - step) % p
        landing = (i - step - 1) % p
        sent = yield Send(right, chunks[out], label)
        received = yield Recv(left, chunks[landing], label=label)
        # The chunk lands where the reduce-scatter sent from: that send must leave first.
        earlier = sends.pop(landing, None)
        yield Wait(received, *([] if earlier is None else [earlier]))
        sends[out] = sent
    if sends:
        yield Wait(*sends.values())
    return x
