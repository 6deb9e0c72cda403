"""NVLS: all-reduce in the NVLink switch (NVLink SHARP, H100 and newer).

An NVSwitch that supports it reduces and multicasts (NVIDIA/nccl, src/device/all_reduce.h,
the NVLS kernels): each GPU owns one slice of the buffer; it asks the switch for the sum
of that slice over every GPU (``multimem.ld_reduce``: the switch reads the slice from all
of them, adds, and returns one copy), then writes the sum once to the switch, which copies
it to every GPU (``multimem.st``). Each GPU's link carries the buffer once up and once
down, plus a slice each way: about half what a ring moves over it, and no GPU reduces
anything itself.

Here the two steps are ``RecvReduce`` (fed by ``Send(..., in_switch=True)``) and
``Multicast``. Where no switch reduces they are plain sends and receives, so the
algorithm is correct on any machine, only not fast.

The buffer is cut into one part per channel, and each part into chunks that are pipelined:
a chunk's all-gather overlaps the next chunk's reduce-scatter, so both directions of every
link are busy at once.
"""

from __future__ import annotations

import math
from typing import Any

from algorithms.buffers import split_even
from algorithms.collectives import Schedule
from algorithms.ops import (
    AVG, SUM, Comm, Divide, Join, Launch, Multicast, Protocol, Recv, RecvReduce, ReduceOp,
    Send, Spawn, Wait,
)

# NCCL's NVLS channels on H100 (NVLS_NCHANNELS_SM90) and its largest chunk per GPU and step
# (NCCL_NVLS_CHUNKSIZE's default), NVIDIA/nccl v2.26.2 src/transport/nvls.cc.
NVLS_CHANNELS = 16
NVLS_CHUNK_BYTES = 128 * 1024
# At most this many chunks per channel: past it a larger buffer only makes the simulation
# slower, since the pipeline's fill is already below 1/32 of its time.
MAX_CHUNKS = 32


def nvls_channels(channels: int) -> list[str]:
    """The channel names the NVLS parts are spawned on (a transport that maps channels to
    process groups declares them up front)."""
    return [f"nvls {c}" for c in range(channels)]


def nvls_chunk_bytes(nbytes: int, channels: int, size: int) -> int:
    """NCCL's NVLS chunk per rank and step for a buffer of ``nbytes``: 128 KiB, halved
    down to 16 KiB for buffers too small to keep every channel's pipeline full
    (``calcCollChunking``, NVIDIA/nccl v2.26.2 src/enqueue.cc; every rank of a node heads
    its own slice, so ``size`` operations run per channel)."""
    concurrent = channels * size
    chunk = NVLS_CHUNK_BYTES
    for depth, smaller in ((64, 64 * 1024), (8, 32 * 1024), (2, 16 * 1024)):
        if nbytes < depth * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = NVLS_CHANNELS,
                   chunk_bytes: int = 0) -> Schedule:
    """All-reduce in the switch (see the module doc): ``channels`` parts of ``x`` at once,
    each pipelined in chunks of up to ``chunk_bytes`` per rank (0: NCCL's,
    ``nvls_chunk_bytes``). Returns ``x``, reduced over all ranks."""
    if type(channels) is not int or channels < 1:
        raise ValueError(f"channels must be an int >= 1, got {channels!r}")
    if type(chunk_bytes) is not int or chunk_bytes < 0:
        raise ValueError(f"chunk_bytes must be an int >= 0 (0: NCCL's), got {chunk_bytes!r}")
    chunk_bytes = chunk_bytes or nvls_chunk_bytes(x.nbytes, channels, comm.size)
    yield Launch(Protocol.SIMPLE, "nvls", channels)
    if comm.size == 1:
        return x
    tasks = []
    for channel, part in zip(nvls_channels(channels), split_even(x, channels)):
        tasks.append((yield Spawn(_pipeline(comm, part, op, chunk_bytes), channel)))
    for task in tasks:
        yield Join(task)
    if op is AVG:
        yield Divide(x, comm.size)
    return x


def pipeline_chunks(bytes_per_rank: float, chunk_bytes: int) -> int:
    """How many chunks a channel's part is pipelined in: one per ``chunk_bytes`` of each
    rank's slice, at most ``MAX_CHUNKS``."""
    return min(MAX_CHUNKS, max(1, math.ceil(bytes_per_rank / chunk_bytes)))


def _pipeline(comm: Comm, part: Any, op: ReduceOp, chunk_bytes: int) -> Schedule:
    # No more chunks than a rank's slice has elements.
    chunks = min(pipeline_chunks(part.nbytes / comm.size, chunk_bytes),
                 len(part) // comm.size or 1)
    gathering: tuple[Any, ...] = ()
    for chunk in split_even(part, chunks):
        yield from _reduce_scatter(comm, chunk, op)
        handles = yield from _post_all_gather(comm, chunk)
        if gathering:  # the previous chunk's all-gather ran beside this reduce-scatter
            yield Wait(*gathering)
        gathering = handles
    yield Wait(*gathering)


def _reduce_scatter(comm: Comm, chunk: Any, op: ReduceOp) -> Schedule:
    # Slice r of every rank's chunk, summed in the switch, lands on rank r.
    slices, me = split_even(chunk, comm.size), comm.rank
    others = tuple(r for r in range(comm.size) if r != me)
    sends = []
    for r in others:
        sends.append((yield Send(r, slices[r], "nvls reduce-scatter", in_switch=True)))
    sums = yield RecvReduce(others, slices[me], SUM if op is AVG else op, "nvls reduce-scatter")
    yield Wait(*sends, *sums)


def _post_all_gather(comm: Comm, chunk: Any) -> Schedule:
    slices, me = split_even(chunk, comm.size), comm.rank
    others = tuple(r for r in range(comm.size) if r != me)
    handles = yield Multicast(others, slices[me], "nvls all-gather")
    for r in others:
        handles += ((yield Recv(r, slices[r], label="nvls all-gather")),)
    return handles
