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

Across nodes NCCL runs NVLS-tree (``NCCL_ALGO_NVLS_TREE``, the same file): in each node
the switch sums every GPU's slice over the node, as above; each GPU then all-reduces its
slice with the GPUs of the same local rank in the other nodes, up and down a tree of the
nodes (NCCL's double binary tree, ``algorithms.nccl_tree``), over its own NIC; and the
switch multicasts the result in the node. The three stages run at once on successive
chunks.

A reduce-scatter or an all-gather uses one of the two steps alone (NCCL runs them in the
switch on one node): the sums land on their owners, or each GPU's chunk is multicast to
all. The switch reads from, or writes to, every GPU, the asking or writing one too, so each
GPU's link carries the whole buffer one way, more than a ring's (p - 1) / p.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from algorithms.buffers import split_even
from algorithms.collectives import Schedule
from algorithms.nccl_tree import double_binary_tree, node_depth
from algorithms.ops import (
    AVG, MAX, MIN, SUM, Comm, Divide, Join, Launch, Multicast, Protocol, Recv, RecvReduce, ReduceOp,
    Send, Spawn, Wait, check_channels, check_flag,
)

# NCCL's NVLS channels on H100 (NVLS_NCHANNELS_SM90) and its largest chunk per GPU and step
# (NCCL_NVLS_CHUNKSIZE's default), NVIDIA/nccl v2.26.2 src/transport/nvls.cc.
NVLS_CHANNELS = 16
NVLS_CHUNK_BYTES = 128 * 1024
# At most this many chunks per channel: past it a chunk stands for several of NCCL's, and
# the pipeline's fill and drain, a few chunks long, take a little more than NCCL's (a
# sixty-fourth of the time per chunk of lag); more chunks only make the simulation slower.
MAX_CHUNKS = 64
# Chunks a channel keeps in flight: the slots of NCCL's buffers between its stages
# (NCCL_STEPS, src/include/device.h).
NVLS_STEPS = 8


def nvls_channels(channels: int) -> list[str]:
    """The channel names the NVLS parts are spawned on (a transport that maps channels to
    process groups declares them up front)."""
    return [f"nvls {c}" for c in range(channels)]


# The reductions NCCL builds NVLS kernels for, by element type ("Must match
# ncclNvlsSupported()", required_cuda in src/device/generate.py, NVIDIA/nccl v2.26.2): sums
# of 32- and 64-bit integers and of floats of 16 bits and more; minimum and maximum of those
# integers and of 16-bit floats. No product, and no average (NCCL's is a pre-multiplied sum
# for floats, a sum then a division for integers).
_SWITCH_REDUCES: dict[ReduceOp, frozenset[str]] = {
    SUM: frozenset({"int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
                    "float64"}),
    MAX: frozenset({"int32", "uint32", "int64", "uint64", "float16", "bfloat16"}),
    MIN: frozenset({"int32", "uint32", "int64", "uint64", "float16", "bfloat16"}),
}


def switch_reduces(dtype: Any, op: ReduceOp) -> bool:
    """Whether NCCL's NVLS kernels reduce elements of ``dtype`` (a numpy or torch dtype) by
    ``op``; where they cannot, NCCL runs no NVLS or NVLS-tree for the call."""
    return dtype_name(dtype) in _SWITCH_REDUCES.get(op, frozenset())


def dtype_name(dtype: Any) -> str:
    """A numpy or torch dtype's name as numpy spells it: ``float32``, ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


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


def nvls_tree_chunk_bytes(nbytes: int, channels: int, ranks_per_node: int, nodes: int) -> int:
    """NCCL's NVLS-tree chunk per rank and step: 128 KiB, 64 KiB from 4 nodes on, halved
    down to 32 KiB for buffers too small to keep every channel's pipeline full
    (``calcCollChunking``, NVIDIA/nccl v2.26.2 src/enqueue.cc)."""
    concurrent = channels * ranks_per_node
    chunk = NVLS_CHUNK_BYTES if nodes < 4 else 64 * 1024
    for depth, smaller in ((4, 64 * 1024), (1, 32 * 1024)):
        if nbytes < depth * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def pipeline_fill_bytes(nbytes: int, chunk_bytes: int, channels: int, heads: int,
                        registered: bool, one_way: bool = False) -> int:
    """The bytes of each GPU's buffer that NCCL's NVLS kernel moves before its pipeline
    keeps pace, beyond what the messages here pay. The kernel gives each stage of a chunk's
    way its own warps, sized so that all keep the same pace (src/device/all_reduce.h): the
    copy into the NVLS buffer, the reduction in the switch, across nodes a hop up and down
    the tree, the multicast, the copy out; buffers registered with NCCL skip the two
    copies. A reduce-scatter or an all-gather goes ``one_way`` (src/device/reduce_scatter.h,
    all_gather.h): the copy in and the reduction, or the multicast and the copy out. A
    round (a chunk per head on every channel) leaves the last stage one round later for
    every stage after the first. Here the switch's work and the tree's hops are messages,
    which pay their own way, so the fill is a round per copy."""
    if heads == 1:  # one GPU alone: nothing to pipeline
        return 0
    copies = 0 if registered else 1 if one_way else 2
    return copies * min(nbytes, channels * heads * chunk_bytes)


def nvls_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = NVLS_CHANNELS,
                   chunk_bytes: int = 0, registered: bool = False) -> Schedule:
    """All-reduce in the switch (see the module doc): ``channels`` parts of ``x`` at once,
    each pipelined in chunks of up to ``chunk_bytes`` per rank (0: NCCL's,
    ``nvls_chunk_bytes``); ``registered``: buffers registered with NCCL, which it reduces
    in place of copies (``pipeline_fill_bytes``). Returns ``x``, reduced over all ranks."""
    _check(channels, chunk_bytes, registered)
    chunk_bytes = chunk_bytes or nvls_chunk_bytes(x.nbytes, channels, comm.size)
    yield Launch(Protocol.SIMPLE, "nvls", channels, pipeline_fill_bytes(
        x.nbytes, chunk_bytes, channels, comm.size, registered))
    yield from _on_channels(comm, x, op, channels,
                            lambda channel, part: _pipeline(comm, part, op, chunk_bytes))
    return x


def nvls_tree_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM,
                        channels: int = NVLS_CHANNELS, chunk_bytes: int = 0,
                        registered: bool = False) -> Schedule:
    """All-reduce across nodes as NCCL's NVLS-tree runs it (see the module doc):
    ``channels`` parts of ``x`` at once, half of them on each tree of the double binary
    tree, each pipelined in chunks of up to ``chunk_bytes`` per rank (0: NCCL's,
    ``nvls_tree_chunk_bytes``); ``registered`` as for ``nvls_allreduce``. Returns ``x``,
    reduced over all ranks."""
    _check(channels, chunk_bytes, registered)
    per_node = comm.ranks_per_node
    nodes = comm.size // per_node
    chunk_bytes = chunk_bytes or nvls_tree_chunk_bytes(x.nbytes, channels, per_node, nodes)
    yield Launch(Protocol.SIMPLE, "nvls_tree", channels, pipeline_fill_bytes(
        x.nbytes, chunk_bytes, channels, per_node, registered))
    yield from _on_channels(comm, x, op, channels, lambda channel, part: _tree_pipeline(
        comm, part, op, chunk_bytes, 2 * channel // channels))
    return x


def nvls_reduce_scatter(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = NVLS_CHANNELS,
                        chunk_bytes: int = 0, registered: bool = False) -> Schedule:
    """Reduce-scatter in the switch, on one node (NCCL's NVLS reduce-scatter,
    src/device/reduce_scatter.h): rank r asks the switch for chunk r of ``x``
    (``split_even`` bounds) summed over every GPU, ``channels`` parts of it at once, each
    pipelined in chunks of up to ``chunk_bytes`` per rank (0: NCCL's); ``registered`` as
    for ``nvls_allreduce``. The switch reads every GPU's slice, the asking GPU's own too, so
    each GPU's link carries the whole buffer up, where a ring's carries (p - 1) / p of it
    each way: slower, as NVIDIA says of it (S. Jeaugey in NVIDIA/nccl issue #1083), but the
    GPUs reduce nothing and NCCL gives it fewer SMs. Returns this rank's chunk, reduced."""
    _check(channels, chunk_bytes, registered)
    yield from _one_way(comm, x, op, channels, chunk_bytes, registered)
    return split_even(x, comm.size)[comm.rank]


def nvls_all_gather(comm: Comm, x: Any, channels: int = NVLS_CHANNELS, chunk_bytes: int = 0,
                    registered: bool = False) -> Schedule:
    """All-gather in the switch, on one node (NCCL's NVLS all-gather,
    src/device/all_gather.h): rank r writes chunk r of ``x`` once to the switch, which
    copies it to every GPU; ``channels`` parts at once, pipelined as
    ``nvls_reduce_scatter``. The switch copies every chunk to every GPU, its writer too, so
    each GPU's link carries the whole buffer down. Every rank ends with chunk r of rank r's
    ``x`` at chunk r."""
    _check(channels, chunk_bytes, registered)
    yield from _one_way(comm, x, None, channels, chunk_bytes, registered)
    return x


def _one_way(comm: Comm, x: Any, op: ReduceOp | None, channels: int, chunk_bytes: int,
             registered: bool) -> Schedule:
    # Channel c moves part c of every rank's chunk, in steps of one piece of each; a
    # reduction (``op``) or else a multicast. An average travels as a sum, divided once.
    p = comm.size
    parts = [split_even(chunk, channels) for chunk in split_even(x, p)]
    # NCCL sizes the chunk from the whole buffer (the gathered one), as for an all-reduce.
    chunk_bytes = chunk_bytes or nvls_chunk_bytes(x.nbytes, channels, p)
    yield Launch(Protocol.SIMPLE, "nvls", channels, pipeline_fill_bytes(
        x.nbytes, chunk_bytes, channels, p, registered, one_way=True), one_way=True)
    if p == 1:
        return
    world = list(range(p))

    def pipeline(channel: int) -> Schedule:
        mine = [parts[rank][channel] for rank in world]
        count = min(pipeline_chunks(mine[0].nbytes, chunk_bytes), min(map(len, mine)) or 1)
        pieces = [split_even(part, count) for part in mine]
        running: deque[tuple[Any, ...]] = deque()  # pieces in flight, oldest first
        for step in range(count):
            slices = [pieces[rank][step] for rank in world]
            if op is None:
                running.append((yield from _post_all_gather(world, comm.rank, slices)))
            else:
                running.append((yield from _post_reduce_scatter(world, comm.rank, slices, op)))
            if len(running) > NVLS_STEPS:  # the NVLS buffer's slots are all taken
                yield Wait(*running.popleft())
        yield Wait(*(handle for handles in running for handle in handles))

    tasks = []
    for channel, task_name in enumerate(nvls_channels(channels)):
        tasks.append((yield Spawn(pipeline(channel), task_name)))
    for task in tasks:
        yield Join(task)
    if op is AVG:
        yield Divide(split_even(x, p)[comm.rank], p)


def tree_depth(nodes: int) -> int:
    """The most node hops from a leaf to the root in NCCL's double binary tree of
    ``nodes`` nodes, over both trees."""
    return max(node_depth(nodes, node, tree) for node in range(nodes) for tree in (0, 1))


def _check(channels: int, chunk_bytes: int, registered: bool) -> None:
    check_flag(registered, "registered")
    check_channels(channels)
    if type(chunk_bytes) is not int or chunk_bytes < 0:
        raise ValueError(f"chunk_bytes must be an int >= 0 (0: NCCL's), got {chunk_bytes!r}")


def _on_channels(comm: Comm, x: Any, op: ReduceOp, channels: int,
                 pipeline: Callable[[int, Any], Schedule]) -> Schedule:
    # One part of x per channel, all at once; an average travels as a sum, divided once.
    if comm.size == 1:
        return
    tasks = []
    parts = split_even(x, channels)
    for channel, name in enumerate(nvls_channels(channels)):
        tasks.append((yield Spawn(pipeline(channel, parts[channel]), name)))
    for task in tasks:
        yield Join(task)
    if op is AVG:
        yield Divide(x, comm.size)


def pipeline_chunks(bytes_per_rank: float, chunk_bytes: int) -> int:
    """How many chunks a channel's part is pipelined in: one per ``chunk_bytes`` of each
    rank's slice, at most ``MAX_CHUNKS``."""
    return min(MAX_CHUNKS, max(1, math.ceil(bytes_per_rank / chunk_bytes)))


def _pipeline(comm: Comm, part: Any, op: ReduceOp, chunk_bytes: int) -> Schedule:
    # No more chunks than a rank's slice has elements.
    chunks = min(pipeline_chunks(part.nbytes / comm.size, chunk_bytes),
                 len(part) // comm.size or 1)
    world = list(range(comm.size))
    gathering: tuple[Any, ...] = ()
    for chunk in split_even(part, chunks):
        slices = split_even(chunk, comm.size)
        yield from _reduce_scatter(world, comm.rank, slices, op)
        handles = yield from _post_all_gather(world, comm.rank, slices)
        if gathering:  # the previous chunk's all-gather ran beside this reduce-scatter
            yield Wait(*gathering)
        gathering = handles
    yield Wait(*gathering)


def _tree_pipeline(comm: Comm, part: Any, op: ReduceOp, chunk_bytes: int, tree: int
                   ) -> Schedule:
    # Step s sums chunk s in the node and sends this rank's slice of it up the tree; then
    # takes chunk s - lag's slice from the parent, passes it down and multicasts it in the
    # node. ``lag`` chunks go up while one makes its round trip to the root.
    per_node = comm.ranks_per_node
    nodes, (node, local) = comm.size // per_node, divmod(comm.rank, per_node)
    group = [node * per_node + j for j in range(per_node)]
    parent_node, child_nodes = double_binary_tree(nodes, node)[tree]
    parent = parent_node * per_node + local if parent_node != -1 else -1
    children = [child * per_node + local for child in child_nodes if child != -1]
    lag = 2 * node_depth(nodes, node, tree)
    fold = SUM if op is AVG else op
    count = min(pipeline_chunks(part.nbytes / per_node, chunk_bytes), len(part) // per_node or 1)
    chunks = split_even(part, count)
    mine = [split_even(chunk, per_node)[local] for chunk in chunks]
    ups: dict[int, Any] = {}  # chunk -> its slice's send up, waited before the result lands
    downs: list[Any] = []  # sends down, waited at the end: nothing writes their slices again
    gathering: tuple[Any, ...] = ()
    for step in range(count + lag):
        if step < count:
            if per_node > 1:
                yield from _reduce_scatter(group, local, split_even(chunks[step], per_node),
                                           fold)
            received = []
            for child in children:
                received.append((yield Recv(child, mine[step], fold, f"nvls tree up {step}")))
            if received:
                yield Wait(*received)
            if parent != -1:
                ups[step] = yield Send(parent, mine[step], f"nvls tree up {step}")
        if step >= lag:
            k = step - lag
            if parent != -1:
                result = yield Recv(parent, mine[k], label=f"nvls tree down {k}")
                yield Wait(result, ups.pop(k))
            for child in children:
                downs.append((yield Send(child, mine[k], f"nvls tree down {k}")))
            if per_node > 1:
                handles = yield from _post_all_gather(group, local,
                                                      split_even(chunks[k], per_node))
                if gathering:
                    yield Wait(*gathering)
                gathering = handles
    if downs or gathering:
        yield Wait(*downs, *gathering)


def _reduce_scatter(group: list[int], me: int, slices: list[Any], op: ReduceOp) -> Schedule:
    # Slice i of every member's buffer, summed in the switch, lands on member i (``me`` is
    # this rank's place in ``group``).
    handles = yield from _post_reduce_scatter(group, me, slices, op)
    yield Wait(*handles)


def _post_reduce_scatter(group: list[int], me: int, slices: list[Any], op: ReduceOp
                         ) -> Schedule:
    sends = []
    for i, rank in enumerate(group):
        if i != me:
            sends.append((yield Send(rank, slices[i], "nvls reduce-scatter", in_switch=True)))
    others = tuple(rank for i, rank in enumerate(group) if i != me)
    sums = yield RecvReduce(others, slices[me], SUM if op is AVG else op, "nvls reduce-scatter")
    return (*sends, *sums)


def _post_all_gather(group: list[int], me: int, slices: list[Any]) -> Schedule:
    # Member i's slice, multicast by the switch, lands at slice i of every member's buffer.
    others = tuple(rank for i, rank in enumerate(group) if i != me)
    handles = yield Multicast(others, slices[me], "nvls all-gather")
    for i, rank in enumerate(group):
        if i != me:
            handles += ((yield Recv(rank, slices[i], label="nvls all-gather")),)
    return handles
