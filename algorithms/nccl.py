"""Collectives as NCCL runs them on clusters, written with the same ops as the textbook ones.

NCCL's ring collectives differ from the textbook rings (``collectives.ring_allreduce`` and
its halves) in two ways that decide their cost across nodes (NVIDIA/nccl,
src/device/all_reduce.h and src/graph/rings.cc):

* Channels. The buffer is cut into parts, each moved by its own ring, all at once. The
  rings visit the ranks of a node in different orders, so that each ring enters and leaves
  a node through a different GPU, and so through a different NIC: with one NIC per GPU
  (rail-optimised clusters) every NIC carries one ring's traffic instead of one NIC
  carrying all of it.
* Pipelining. A step waits only for the data it needs, the chunk arriving from the left;
  its own send drains in the background and is waited only before its buffer is written
  again. The textbook ring waits for both, so every rank moves in lockstep at the pace of
  the slowest hop. A large chunk moves in slices, each passed on as soon as it has come
  (``ring_slices``), so the latency of one hides behind the bytes of the others.

Each takes the ``protocol`` NCCL would run it with (``Protocol``: Simple, LL or LL128, or
their names): it starts with a ``Launch`` and sends every message under it, so that a
simulator charges its costs; the data moved are the same under every protocol.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from algorithms.buffers import split_even
from algorithms.collectives import Schedule
from algorithms.ops import (
    AVG, SUM, Comm, Divide, Join, Launch, Protocol, Recv, ReduceOp, Send, Spawn, Wait,
    check_channels,
)


# NCCL's Simple ring moves a rank's part of a channel in chunks of 4 of its buffer's steps
# (its 4 MiB buffer over NCCL_STEPS = 8 steps: ALLREDUCE_CHUNKSTEPS and its kin), and hands
# each chunk on in 2 slices of at least a 32nd of a 2-step slice
# (src/include/collectives.h, src/device/prims_simple.h, NVIDIA/nccl v2.26.2).
RING_STEP_BYTES = (4 << 20) // 8
RING_CHUNK_BYTES = 4 * RING_STEP_BYTES
RING_MIN_SLICE_BYTES = 2 * RING_STEP_BYTES // 32
# The most slices a ring step is moved in here: where NCCL cuts a large step finer, each
# slice's latency hides behind the bytes of the others all the same.
RING_MAX_SLICES = 8


def ring_channels(channels: int) -> list[str]:
    """The channel names the NCCL-class rings are spawned on (a transport that maps
    channels to process groups declares them up front)."""
    return [f"ring {c}" for c in range(channels)]


def rail_ring(comm: Comm, channel: int) -> list[int]:
    """The rank order of ring ``channel``: node after node, each node's ranks starting at
    local rank ``channel`` (mod ranks per node), so the ring leaves node n from local rank
    ``channel - 1`` and enters node n + 1 at local rank ``channel``: a different pair of
    GPUs, and NICs, for each channel."""
    if isinstance(channel, bool) or not isinstance(channel, int) or channel < 0:
        raise ValueError(f"rail_ring: channel must be an int >= 0, got {channel!r}")
    per_node = comm.ranks_per_node
    return [node * per_node + (channel + j) % per_node
            for node in range(comm.size // per_node) for j in range(per_node)]


def nccl_ring_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = 0,
                        protocol: Protocol | str = "simple") -> Schedule:
    """Ring all-reduce as NCCL runs it: ``channels`` rings at once (0: one per rank of a
    node, so that every GPU's NIC carries one), each over its part of ``x`` in its own rank
    order (``rail_ring``), each a pipeline (see the module doc)."""
    count, wire = _channel_count(comm, channels), as_protocol(protocol)
    yield Launch(wire, "ring", count)

    def ring(order: list[int], part: Any) -> Schedule:
        # Any chunk may end at any position: every rank ends with all of them.
        return _pipelined_ring(comm, order, split_even(part, comm.size), op, True, True, wire)

    yield from _on_channels(comm, count, split_even(x, count), ring)
    return x


def nccl_ring_reduce_scatter(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = 0,
                             protocol: Protocol | str = "simple") -> Schedule:
    """Ring reduce-scatter as NCCL runs it (``nccl_ring_allreduce``'s first half): rank r
    ends with chunk r of ``x`` (``split_even`` bounds) reduced over all ranks, and returns
    it."""
    yield from _rings_over_rank_chunks(comm, x, op, channels, as_protocol(protocol),
                                       reduce_scatter=True)
    return split_even(x, comm.size)[comm.rank]


def nccl_ring_all_gather(comm: Comm, x: Any, channels: int = 0,
                         protocol: Protocol | str = "simple") -> Schedule:
    """Ring all-gather as NCCL runs it (``nccl_ring_allreduce``'s second half): every rank
    ends with chunk r of rank r's ``x`` at chunk r, for every r."""
    yield from _rings_over_rank_chunks(comm, x, SUM, channels, as_protocol(protocol),
                                       reduce_scatter=False)
    return x


def as_protocol(protocol: Protocol | str) -> Protocol:
    """``protocol`` as a ``Protocol``; names (``"ll128"``, any case) are accepted."""
    if type(protocol) is Protocol:
        return protocol
    try:
        return Protocol(str(protocol).lower())
    except ValueError:
        raise ValueError(f"unknown protocol {protocol!r}; known: "
                         f"{', '.join(p.value for p in Protocol)}") from None


def _rings_over_rank_chunks(comm: Comm, x: Any, op: ReduceOp, channels: int, wire: Protocol,
                            reduce_scatter: bool) -> Schedule:
    # Ring c moves part c of every rank's chunk; its position j holds rank order[j]'s.
    count = _channel_count(comm, channels)
    yield Launch(wire, "ring", count)
    parts = [split_even(chunk, count) for chunk in split_even(x, comm.size)]  # cut once

    def ring(order: list[int], channel: int) -> Schedule:
        chunks = [parts[rank][channel] for rank in order]
        return _pipelined_ring(comm, order, chunks, op, reduce_scatter, not reduce_scatter,
                               wire)

    yield from _on_channels(comm, count, range(count), ring)


def _channel_count(comm: Comm, channels: int) -> int:
    return check_channels(channels, "one per rank of a node") or comm.ranks_per_node


def _on_channels(comm: Comm, count: int, parts: Sequence[Any],
                 ring: Callable[[list[int], Any], Schedule]) -> Schedule:
    # One ring per channel, all at once; one channel needs no task of its own.
    if count == 1:
        yield from ring(rail_ring(comm, 0), parts[0])
        return
    tasks = []
    for channel, (part, name) in enumerate(zip(parts, ring_channels(count))):
        tasks.append((yield Spawn(ring(rail_ring(comm, channel), part), name)))
    for task in tasks:
        yield Join(task)


def _pipelined_ring(comm: Comm, order: list[int], chunks: Sequence[Any], op: ReduceOp,
                    reduce_scatter: bool, all_gather: bool, wire: Protocol) -> Schedule:
    """One pipelined ring over ``chunks``, indexed by ring position: the reduce-scatter
    leaves position i with chunk i reduced; the all-gather hands every position's chunk i
    to all. Each step moves its chunk in slices, and a slice goes on as soon as it has
    come (``ring_slices``)."""
    p = len(order)
    i = order.index(comm.rank)
    right, left = order[(i + 1) % p], order[(i - 1) % p]
    count = ring_slices(chunks[0].nbytes, wire) if chunks else 1
    slices = [split_even(chunk, count) for chunk in chunks]
    sends = {}  # (chunk, slice) -> its send, not yet waited
    landed: dict[int, tuple[Any, ...]] = {}  # slice -> the last step's receive of it, unwaited
    if reduce_scatter:
        for step in range(p - 1):
            label = f"reduce-scatter {step}"
            out, landing = (i - step - 1) % p, (i - step - 2) % p
            for k in range(count):
                if k in landed:  # the slice to pass on came in the last step
                    yield Wait(*landed.pop(k))
                sends[out, k] = yield Send(right, slices[out][k], label, wire)
                landed[k] = ((yield Recv(left, slices[landing][k], op, label)),)
        if op is AVG and p > 1 and len(chunks[i]) > 0:
            yield Wait(*(h for handles in landed.values() for h in handles))
            landed = {}
            yield Divide(chunks[i], p)
    if all_gather:
        for step in range(p - 1):  # pass on the chunk that came last
            label = f"all-gather {step}"
            out, landing = (i - step) % p, (i - step - 1) % p
            for k in range(count):
                if k in landed:
                    yield Wait(*landed.pop(k))
                sent = yield Send(right, slices[out][k], label, wire)
                received = yield Recv(left, slices[landing][k], label=label)
                # The slice lands where the reduce-scatter sent from: that send leaves first.
                earlier = sends.pop((landing, k), None)
                landed[k] = (received,) if earlier is None else (received, earlier)
                sends[out, k] = sent
    pending = [h for handles in landed.values() for h in handles] + list(sends.values())
    if pending:
        yield Wait(*pending)


def ring_slices(chunk_bytes: int, protocol: Protocol) -> int:
    """How many slices a ring step moves its chunk of ``chunk_bytes`` in under ``protocol``,
    each passed on as soon as it has come. Under Simple as NCCL cuts it: chunks of
    ``RING_CHUNK_BYTES``, each in two slices unless a slice would be smaller than
    ``RING_MIN_SLICE_BYTES``. Under LL and LL128, NCCL hands on every step of its buffer, of
    about ``RING_STEP_BYTES``. Never more than ``RING_MAX_SLICES``."""
    if protocol is Protocol.SIMPLE:
        chunks = max(1, math.ceil(chunk_bytes / RING_CHUNK_BYTES))
        halves = 2 if chunk_bytes / chunks > RING_MIN_SLICE_BYTES else 1
        return min(RING_MAX_SLICES, chunks * halves)
    return min(RING_MAX_SLICES, max(1, math.ceil(chunk_bytes / RING_STEP_BYTES)))


def hierarchical_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM,
                           protocol: Protocol | str = "simple") -> Schedule:
    """All-reduce in three rings, two within nodes and one across: a reduce-scatter within
    each node leaves local rank i with chunk i reduced over its node; an all-reduce of chunk
    i among the ranks of local rank i, one per node (a rail: their NICs share a network
    plane), reduces it over the world; an all-gather within the node hands every rank all
    chunks. So each rank's NIC carries an all-reduce of 1 / (ranks per node) of ``x``, all
    NICs at once. Each ring is pipelined as ``nccl_ring_allreduce``'s."""
    wire = as_protocol(protocol)
    yield Launch(wire, "hierarchical")
    per_node = comm.ranks_per_node
    node, local = divmod(comm.rank, per_node)
    in_node = [node * per_node + j for j in range(per_node)]
    rail = [other * per_node + local for other in range(comm.size // per_node)]
    chunks = split_even(x, per_node)  # ring position j of in_node is local rank j
    fold = SUM if op is AVG else op  # an average sums on the way and divides once, below
    yield from _pipelined_ring(comm, in_node, chunks, fold, True, False, wire)
    mine = chunks[local]
    yield from _pipelined_ring(comm, rail, split_even(mine, len(rail)), fold, True, True, wire)
    if op is AVG and comm.size > 1 and len(mine) > 0:
        yield Divide(mine, comm.size)
    yield from _pipelined_ring(comm, in_node, chunks, fold, False, True, wire)
    return x
