"""The collectives, each a per-rank generator function over the ops in ``algorithms.ops``.

Every collective takes ``comm`` (this rank and the world size) and the rank's buffer, works
in place where the result fits the input, and returns the rank's result (``None`` on ranks
that have no defined result, such as non-roots of ``reduce``).

Conventions, shared with the numpy references in ``algorithms.reference``:

* ``reduce_scatter`` and ``all_gather`` work on the full-length buffer split with
  ``split_even``: rank ``r`` owns chunk ``r``. ``all_gather`` reads chunk ``r`` of each
  rank's buffer and fills the rest; ``reduce_scatter`` returns chunk ``r`` reduced.
* ``all_to_all`` sends chunk ``j`` of its buffer to rank ``j`` and returns the chunks it
  received, concatenated in rank order.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from algorithms.buffers import split_even, split_sizes
from algorithms.ops import (
    AVG, SUM, Alloc, Combine, Comm, Copy, Divide, Join, Recv, ReduceOp, Send, Sleep, Spawn,
    Wait, check_flag, check_root,
)

Schedule = Generator[Any, Any, Any]


def run_after(previous: Any, schedule: Schedule) -> Schedule:
    """Wait for the task ``previous`` (if any), then run ``schedule``: spawned so, tasks
    queue on one stream and run in order, as collectives do on a comm stream."""
    if previous is not None:
        yield Join(previous)
    return (yield from schedule)


def slowed(schedule: Schedule, seconds: float, label: str = "slowed") -> Schedule:
    """``schedule`` with a ``Sleep`` of ``seconds`` before each of its ops, and of the ops of
    the tasks it spawns: a rank slowed on purpose, on either transport (the simulator models
    slow ranks with ``Topology.compute_speed``; this is for testing what real runs do with
    one)."""
    value = None
    while True:
        try:
            op = schedule.send(value)
        except StopIteration as stop:
            return stop.value
        if isinstance(op, Spawn):
            op = Spawn(slowed(op.schedule, seconds, label), op.channel)
        yield Sleep(seconds, label)
        value = yield op


def _finish_avg(op: ReduceOp, buf: Any, size: int) -> Schedule:
    # AVG travels as a sum and is divided once, where the final value lives.
    if op is AVG and size > 1 and len(buf) > 0:
        yield Divide(buf, size)


def reduce_scatter(comm: Comm, x: Any, op: ReduceOp = SUM) -> Schedule:
    """Ring reduce-scatter: after p-1 steps rank r holds chunk r reduced over all ranks.

    At step s rank r passes chunk r-s-1 to its right neighbour and folds chunk r-s-2 from its
    left neighbour into its own copy, so every chunk collects one contribution per hop.
    """
    p, r = comm.size, comm.rank
    chunks = split_even(x, p)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        label = f"reduce-scatter {step}"
        sent = yield Send(right, chunks[(r - step - 1) % p], label)
        received = yield Recv(left, chunks[(r - step - 2) % p], op, label)
        yield Wait(sent, received)
    yield from _finish_avg(op, chunks[r], p)
    return chunks[r]


def all_gather(comm: Comm, x: Any) -> Schedule:
    """Ring all-gather: each rank forwards the chunk it got last step, p-1 steps in all."""
    p, r = comm.size, comm.rank
    chunks = split_even(x, p)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        label = f"all-gather {step}"
        sent = yield Send(right, chunks[(r - step) % p], label)
        received = yield Recv(left, chunks[(r - step - 1) % p], label=label)
        yield Wait(sent, received)
    return x


def ring_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM) -> Schedule:
    """Ring all-reduce (baidu-allreduce): a ring reduce-scatter, then a ring all-gather.

    Each rank sends 2(p-1)/p of the buffer, the lower bound for any all-reduce, in 2(p-1)
    latency-bound steps: bandwidth-optimal, latency-poor.
    """
    yield from reduce_scatter(comm, x, op)
    yield from all_gather(comm, x)
    return x


def reduce(comm: Comm, x: Any, root: int = 0, op: ReduceOp = SUM, tree: bool = False) -> Schedule:
    """Reduce to ``root``. Flat: the root receives every other buffer directly (the
    parameter-server pattern; the root's links and reductions are the bottleneck). Tree:
    binomial tree, log2(p) rounds, each rank halving the set of senders.

    Non-root buffers are used as scratch by the tree form.
    """
    p, r = comm.size, comm.rank
    check_root(root, p)
    if not check_flag(tree, "tree"):
        if r != root:
            yield Wait((yield Send(root, x, "reduce")))
            return None
        handles = []
        for peer in range(p):
            if peer != root:
                handles.append((yield Recv(peer, x, op, "reduce")))
        if handles:
            yield Wait(*handles)
    else:
        v = (r - root) % p  # rank relative to the root
        mask = 1
        while mask < p:
            label = f"reduce tree round {mask.bit_length() - 1}"
            if v & mask:  # my subtree is complete: hand it to my parent and stop
                yield Wait((yield Send((r - mask) % p, x, label)))
                return None
            if v + mask < p:
                yield Wait((yield Recv((r + mask) % p, x, op, label)))
            mask <<= 1
    yield from _finish_avg(op, x, p)
    return x


def broadcast(comm: Comm, x: Any, root: int = 0, tree: bool = False) -> Schedule:
    """Broadcast the root's buffer. Flat: the root sends to everyone. Tree: binomial tree,
    each rank that has the data forwards it to a rank that has not, doubling each round."""
    p, r = comm.size, comm.rank
    check_root(root, p)
    if not check_flag(tree, "tree"):
        if r == root:
            handles = []
            for peer in range(p):
                if peer != root:
                    handles.append((yield Send(peer, x, "broadcast")))
            if handles:
                yield Wait(*handles)
        else:
            yield Wait((yield Recv(root, x, label="broadcast")))
        return x
    v = (r - root) % p
    mask = 1
    while mask < p:  # receive once, from the parent that differs in my lowest set bit
        if v & mask:
            yield Wait((yield Recv((r - mask) % p, x, label="broadcast tree")))
            break
        mask <<= 1
    handles = []
    mask >>= 1
    while mask > 0:  # then forward to my children, largest subtree first
        if v + mask < p:
            handles.append((yield Send((r + mask) % p, x, "broadcast tree")))
        mask >>= 1
    if handles:
        yield Wait(*handles)
    return x


def reduce_broadcast_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, root: int = 0,
                               tree: bool = False) -> Schedule:
    """All-reduce as reduce to a root, then broadcast back (DataParallel's master GPU).

    Flat: the root receives and sends p-1 full buffers, so its links carry (p-1)n each way.
    Tree: 2 log2(p) full-buffer rounds.
    """
    yield from reduce(comm, x, root=root, op=op, tree=tree)
    yield from broadcast(comm, x, root=root, tree=tree)
    return x


def alltoall_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, chunked: bool = False) -> Schedule:
    """All-reduce by direct exchange with every other rank.

    Whole-buffer (default): every rank sends its whole buffer to every other rank and reduces
    what it receives, n(p-1) messages of the full size; one latency, (p-1)n bytes per rank.
    Chunked: a direct reduce-scatter then a direct all-gather of 1/p chunks; two latencies,
    2(p-1)/p n bytes per rank, spread over p-1 links.
    """
    p, r = comm.size, comm.rank
    sends_to = [(r + k) % p for k in range(1, p)]  # shifted order: no rank is everyone's first
    recvs_from = [(r - k) % p for k in range(1, p)]
    if not check_flag(chunked, "chunked"):
        yield from _fold_in_rank_order(comm, x, op, sends_to)
        yield from _finish_avg(op, x, p)
        return x
    chunks = split_even(x, p)
    handles = []
    for peer in sends_to:
        handles.append((yield Send(peer, chunks[peer], "reduce-scatter")))
    for peer in recvs_from:
        handles.append((yield Recv(peer, chunks[r], op, "reduce-scatter")))
    if handles:
        yield Wait(*handles)
    yield from _finish_avg(op, chunks[r], p)
    handles = []
    for peer in sends_to:
        handles.append((yield Send(peer, chunks[r], "all-gather")))
    for peer in recvs_from:
        handles.append((yield Recv(peer, chunks[peer], label="all-gather")))
    if handles:
        yield Wait(*handles)
    return x


def _fold_in_rank_order(comm: Comm, x: Any, op: ReduceOp, sends_to: list[int]) -> Schedule:
    # Every rank folds the p buffers in one order, x_0, x_1, ..., x_{p-1}, so that every
    # rank evaluates the same expression: floating-point reduction is not associative, and
    # folding in arrival order would leave each rank different bits. x_0 lands in x and
    # the rest fold into it; this rank's own part, kept aside, joins at its turn.
    p, r = comm.size, comm.rank
    handles = []
    for peer in sends_to:
        handles.append((yield Send(peer, x, "all-to-all")))
    own = x
    if r > 0:
        own = yield Alloc(len(x), x)
        yield Copy(own, x)
    for peer in range(r):
        handles.append((yield Recv(peer, x, None if peer == 0 else op, "all-to-all")))
    if handles:
        yield Wait(*handles)  # receives land in the order they are named
    if r > 0:
        yield Combine(x, own, op)
    # Posted only now: nothing may write x while a receive into it is outstanding.
    later = []
    for peer in range(r + 1, p):
        later.append((yield Recv(peer, x, op, "all-to-all")))
    if later:
        yield Wait(*later)


def all_to_all(comm: Comm, x: Any, split_sizes_matrix: Sequence[Sequence[int]] | None = None
               ) -> Schedule:
    """Personalized exchange: chunk j of rank i goes to rank j.

    By default every rank splits its buffer with ``split_even`` (so all ranks need buffers of
    one length); ``split_sizes_matrix[i][j]`` gives any uneven split instead, and must be the
    same on every rank. Returns the received chunks concatenated in rank order.
    """
    p, r = comm.size, comm.rank
    sizes = _all_to_all_sizes(split_sizes_matrix, len(x), p)
    send_chunks = split_sizes(x, list(sizes[r]))
    out = yield Alloc(sum(sizes[i][r] for i in range(p)), x)
    recv_chunks = split_sizes(out, [sizes[i][r] for i in range(p)])
    if len(send_chunks[r]):
        yield Copy(recv_chunks[r], send_chunks[r])
    handles = []
    for k in range(1, p):
        peer = (r + k) % p
        handles.append((yield Send(peer, send_chunks[peer], "all-to-all")))
    for k in range(1, p):
        peer = (r - k) % p
        handles.append((yield Recv(peer, recv_chunks[peer], label="all-to-all")))
    if handles:
        yield Wait(*handles)
    return out


def _all_to_all_sizes(matrix: Sequence[Sequence[int]] | None, length: int, p: int
                      ) -> list[list[int]]:
    if matrix is None:
        base, extra = divmod(length, p)
        row = [base + (1 if j < extra else 0) for j in range(p)]
        return [row] * p
    rows = [list(row) for row in matrix]
    if len(rows) != p or any(len(row) != p for row in rows):
        raise ValueError(f"split_sizes_matrix must be {p} x {p}, got {len(rows)} rows")
    if any(not isinstance(v, int) or v < 0 for row in rows for v in row):
        raise ValueError("split_sizes_matrix entries must be ints >= 0")
    return rows
