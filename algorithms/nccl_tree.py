"""NCCL's tree all-reduce: reduce up a tree to a root, broadcast the result back down.

NCCL builds its trees in two levels (NVIDIA/nccl, src/graph/trees.cc and connect.cc):

* Across nodes, a double binary tree over the node indices (``double_binary_tree``): two
  binary trees, every node (node 0 of an odd count excepted) a leaf in one and so interior
  in at most one, so that the nodes send and receive about as much as each other once the
  data are split between the two.
* Within a node, a chain through the node's GPUs. Its first GPU, the head, is the one that
  talks to the parent's and the children's heads; the head differs per channel so that
  channels leave a node through different GPUs, and so through different NICs.

The buffer is cut into one part per channel, half of the channels on each tree. Each part
is pipelined in chunks: a rank reduces chunk k (its own data and its children's) and passes
it up while the chunks before it come back down, as NCCL's kernel runs its reduce and its
broadcast at once (``runTreeSplit`` in src/device/all_reduce.h). The root holds every
chunk fully reduced first, so every rank ends with the root's bits.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from algorithms.buffers import split_even
from algorithms.collectives import Schedule
from algorithms.nccl import _channel_count, as_protocol
from algorithms.ops import (
    AVG, SUM, Comm, Divide, Join, Launch, Protocol, Recv, ReduceOp, Send, Spawn, Wait,
)

# NCCL's tree chunks (calcCollChunking in src/enqueue.cc, NVIDIA/nccl v2.26.2): a tree moves
# one step of its protocol's buffer per chunk, each buffer holding NCCL_STEPS = 8 steps
# (src/include/device.h). Simple: DEFAULT_BUFFSIZE, 4 MiB (src/init.cc). LL: 8 lines of 16 B
# per thread for 512 threads, half of each line data (DEFAULT_LL_BUFFSIZE). LL128: 120 words
# of 8 B per thread for 640 threads, 15 of every 16 words data (DEFAULT_LL128_BUFFSIZE).
TREE_CHUNK_BYTES = (4 << 20) // 8
LL_TREE_CHUNK_BYTES = 8 * 512 * 16 // 2
LL128_TREE_CHUNK_BYTES = 120 * 640 * 8 // 16 * 15

# A node of a binary tree: its parent and its two children; -1 where there is none.
TreeNode = tuple[int, tuple[int, int]]


def tree_chunk_bytes(protocol: Protocol, nbytes: int, channels: int, nodes: int,
                     ranks_per_node: int) -> int:
    """The chunk NCCL's tree all-reduce of ``nbytes`` on ``channels`` channels moves under
    ``protocol``: one step of the protocol's buffer; under LL128 halved while a channel
    would move too few of them for the tree's depth (the same file)."""
    if protocol is Protocol.SIMPLE:
        return TREE_CHUNK_BYTES
    if protocol is Protocol.LL:
        return LL_TREE_CHUNK_BYTES
    chunk = LL128_TREE_CHUNK_BYTES
    steps = 1 + int(math.log2(nodes)) + 0.1 * ranks_per_node
    while nbytes // (channels * chunk) < steps * 64 / ranks_per_node and chunk > 131072:
        chunk //= 2
    while nbytes // (channels * chunk) < steps * 16 / ranks_per_node and chunk > 32768:
        chunk //= 2
    return chunk


def tree_channels(channels: int) -> list[str]:
    """The channel names the trees are spawned on, a channel's up stream and its down
    stream apart (a transport that maps channels to process groups declares them up
    front)."""
    return [f"tree {c}" for c in range(channels)] + [_down_channel(c) for c in range(channels)]


def _down_channel(channel: int) -> str:
    return f"tree {channel} down"


def _check_node(nodes: int, index: int) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be an int >= 1, got {nodes!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < nodes:
        raise ValueError(f"index must be a node in [0, {nodes}), got {index!r}")


def binary_tree(nodes: int, index: int) -> TreeNode:
    """Node ``index`` of NCCL's binary tree over ``nodes`` nodes, rooted at 0: its parent
    and children, -1 for none (``ncclGetBtree``, NVIDIA/nccl src/graph/trees.cc).

    A node's lowest set bit says its level (odd indices are leaves); its parent clears
    that bit and sets the next one up, or only clears it where the next would pass the
    last node. For 14 nodes::

        0---------------8
                 ______/ \\______
                4               12
              /   \\            /  \\
            2       6       10     \\
           / \\     / \\     /  \\     \\
          1   3   5   7   9   11    13
    """
    _check_node(nodes, index)
    bit = 1
    while bit < nodes and not bit & index:
        bit <<= 1
    if index == 0:  # the root's one child comes second, as in NCCL
        return -1, (-1, bit >> 1 if nodes > 1 else -1)
    parent = (index ^ bit) | (bit << 1)
    if parent >= nodes:
        parent = index ^ bit
    low = bit >> 1
    first = index - low if low else -1
    second = index + low if low else -1
    while second >= nodes:  # the largest of index + low/2, + low/4, ... that exists
        low >>= 1
        second = index + low if low else -1
    return parent, (first, second)


def double_binary_tree(nodes: int, index: int) -> tuple[TreeNode, TreeNode]:
    """Node ``index`` in NCCL's two trees over ``nodes`` nodes (``ncclGetDtree``, NVIDIA/nccl
    src/graph/trees.cc): tree 0 is ``binary_tree``; tree 1 is its mirror (node i in the
    place of nodes - 1 - i) for an even count, or it shifted by one (node i in the place of
    i - 1) for an odd count.

    Tree 0's leaves are the odd nodes; tree 1's the even ones, so each node is a leaf in one
    tree and free to spend its links on the other. Node 0 of an odd count (3 or more) is
    the exception: the root of tree 0, interior in tree 1."""
    _check_node(nodes, index)
    if nodes % 2:
        moved, back = (index - 1) % nodes, (lambda i: (i + 1) % nodes)
    else:
        moved, back = nodes - 1 - index, (lambda i: nodes - 1 - i)
    parent, (first, second) = binary_tree(nodes, moved)

    def place(i: int) -> int:
        return back(i) if i != -1 else -1

    return binary_tree(nodes, index), (place(parent), (place(first), place(second)))


def nccl_tree_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, channels: int = 0,
                        protocol: Protocol | str = "simple",
                        chunk_bytes: int = 0) -> Schedule:
    """Tree all-reduce as NCCL runs it (see the module doc): ``channels`` trees at once (0:
    one per rank of a node), the first half of them on tree 0 of the double binary tree,
    the rest on tree 1; channel c enters and leaves each node through local rank c (mod
    ranks per node). Each moves its part of ``x`` in chunks of about ``chunk_bytes`` (0:
    NCCL's, ``tree_chunk_bytes``)."""
    count, wire = _channel_count(comm, channels), as_protocol(protocol)
    if type(chunk_bytes) is not int or chunk_bytes < 0:
        raise ValueError(f"chunk_bytes must be an int >= 0 (0: NCCL's), got {chunk_bytes!r}")
    chunk_bytes = chunk_bytes or tree_chunk_bytes(wire, x.nbytes, count,
                                                  comm.size // comm.ranks_per_node,
                                                  comm.ranks_per_node)
    yield Launch(wire, "tree", count)

    def on_channel(channel: int, part: Any) -> Schedule:
        parent, children, _ = tree_position(comm, channel, 2 * channel // count)
        # At least one element a chunk, however small chunk_bytes is.
        chunks = split_even(part, max(1, min(len(part), math.ceil(part.nbytes / chunk_bytes))))
        return _reduce_and_broadcast(comm, chunks, parent, children, op, wire,
                                     _down_channel(channel))

    parts = split_even(x, count)
    if count == 1:  # one channel needs no task of its own
        yield from on_channel(0, parts[0])
        return x
    tasks = []
    for channel in range(count):
        tasks.append((yield Spawn(on_channel(channel, parts[channel]), f"tree {channel}")))
    for task in tasks:
        yield Join(task)
    return x


def tree_position(comm: Comm, channel: int, tree: int) -> tuple[int, list[int], int]:
    """This rank's parent (-1 at the root), children and depth (hops from the root) in
    ``channel``'s tree, which runs on ``tree`` (0 or 1) of the double binary tree: a chain
    through each node from local rank ``channel`` (mod ranks per node), the head, which
    links to the heads of its node's parent and children in ``tree``."""
    per_node = comm.ranks_per_node
    nodes, (node, local) = comm.size // per_node, divmod(comm.rank, per_node)
    position = (local - channel) % per_node  # along the chain; the head is at 0

    def rank(of_node: int, step: int) -> int:  # the rank ``step`` links down a node's chain
        return of_node * per_node + (channel + step) % per_node

    depth = position + node_depth(nodes, node, tree)
    children = [rank(node, position + 1)] if position + 1 < per_node else []
    if position > 0:
        return rank(node, position - 1), children, depth
    parent, node_children = double_binary_tree(nodes, node)[tree]
    children += [rank(child, 0) for child in node_children if child != -1]  # NCCL's order
    return (rank(parent, 0) if parent != -1 else -1), children, depth


def tree_parents(size: int, ranks_per_node: int, channel: int, tree: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's parent (-1 at the root) and depth in ``channel``'s tree on ``tree``, as
    ``tree_position`` gives them one rank at a time, for all ranks at once (for cost models
    of thousands of ranks)."""
    nodes = size // ranks_per_node
    node_parent = np.array([double_binary_tree(nodes, n)[tree][0] for n in range(nodes)])
    level = np.zeros(nodes, dtype=np.int64)
    above = node_parent.copy()
    while (above != -1).any():  # one level up per pass, for every node at once
        level += above != -1
        above = np.where(above != -1, node_parent[np.maximum(above, 0)], -1)
    node, local = np.divmod(np.arange(size), ranks_per_node)
    position = (local - channel) % ranks_per_node  # along the node's chain; the head is 0
    up_the_chain = node * ranks_per_node + (channel + position - 1) % ranks_per_node
    head_parent = np.where(node_parent[node] != -1,
                           node_parent[node] * ranks_per_node + channel % ranks_per_node, -1)
    parents = np.where(position > 0, up_the_chain, head_parent)
    return parents, position + level[node]


def node_depth(nodes: int, node: int, tree: int) -> int:
    """How many levels ``node`` lies below the root of ``tree`` (0 or 1) of the double
    binary tree over ``nodes`` nodes."""
    depth = 0
    while (node := double_binary_tree(nodes, node)[tree][0]) != -1:
        depth += 1
    return depth


def _reduce_and_broadcast(comm: Comm, chunks: list[Any], parent: int, children: list[int],
                          op: ReduceOp, wire: Protocol, down_channel: str) -> Schedule:
    """Pipeline ``chunks`` up the tree and back down in two streams, as NCCL's kernel splits
    a channel's warps between them (``runTreeSplit``): this task reduces chunk k (its own
    data and its children's) and passes it up; a task on ``down_channel`` takes chunk k's
    result from the parent (at the root: the sum) and passes it down. Neither stream waits
    for the other, so a chunk's round trip to the root holds up no chunk behind it.
    """
    # Chunks the up stream is done with, each with its send up (None at the root), in order;
    # the down stream takes them from the front. It ends whenever it runs out and is started
    # again with the next one: only a task's end can tell another task anything.
    ready: deque[tuple[int, Any]] = deque()
    tasks: list[Any] = []  # the down stream's tasks, the last one maybe still running
    downs: list[Any] = []  # sends down, waited at the end: nothing writes their chunks again
    running = False

    def down_stream() -> Schedule:
        nonlocal running
        while ready:
            k, up = ready.popleft()
            label = f"broadcast {k}"
            if up is not None:
                received = yield Recv(parent, chunks[k], label=label)
                yield Wait(received, up)  # the result lands where the chunk left from
            for child in children:
                downs.append((yield Send(child, chunks[k], label, wire)))
        running = False

    for k, chunk in enumerate(chunks):
        label = f"reduce {k}"
        received = []
        for child in children:
            received.append((yield Recv(child, chunk, op, label)))
        if received:
            yield Wait(*received)
        up = None
        if parent != -1:
            up = yield Send(parent, chunk, label, wire)
        elif op is AVG and comm.size > 1 and len(chunk) > 0:
            yield Divide(chunk, comm.size)  # the root holds the sum: divide it once
        ready.append((k, up))
        if not running:
            running = True
            tasks.append((yield Spawn(down_stream(), down_channel, shares_rate=True)))
    for task in tasks:
        yield Join(task)
    if downs:
        yield Wait(*downs)
