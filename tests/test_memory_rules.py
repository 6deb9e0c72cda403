"""The rules of memory, one copy for both transports (``algorithms.protocol``): a receive's
buffer is off limits from posting to its Wait, a send's buffer may not change before its
Wait, and receives into one buffer are waited in posting order. Each misuse below is
refused with the same words by the simulator and by real gloo processes; the legal
neighbours of each are accepted by both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from algorithms import SUM, Alloc, Combine, Copy, Divide, Recv, Send, Wait
from algorithms.protocol import Handle, InFlight, Task, overlaps
from realcomm import AlgorithmError, Driver, spawn
from simcomm import ProtocolError, fully_connected, simulate


def _peer(comm):
    return 1 - comm.rank


def forward_before_wait(comm, x):
    r = yield Recv(_peer(comm), x)
    s = yield Send(_peer(comm), x)
    yield Wait(r, s)


def copy_from_before_wait(comm, x):
    other = yield Alloc(len(x), x)
    r = yield Recv(_peer(comm), x)
    yield Copy(other, x)
    s = yield Send(_peer(comm), other)
    yield Wait(r, s)


def divide_before_wait(comm, x):
    r = yield Recv(_peer(comm), x)
    s = yield Send(_peer(comm), x[:0])  # keeps the peer's receive company
    yield Divide(x, 2)
    yield Wait(r, s)


def overwrite_a_send(comm, x):
    other = yield Alloc(len(x), x)
    s = yield Send(_peer(comm), x)
    r = yield Recv(_peer(comm), other)
    yield Combine(x, x, SUM)
    yield Wait(s, r)


def land_over_a_send_waited_later(comm, x):
    s = yield Send(_peer(comm), x)
    r = yield Recv(_peer(comm), x)
    yield Wait(r)
    yield Wait(s)


def receives_waited_out_of_order(comm, x):
    first = yield Recv(_peer(comm), x)
    second = yield Recv(_peer(comm), x, SUM)
    a = yield Send(_peer(comm), (yield Alloc(len(x), x)))
    b = yield Send(_peer(comm), (yield Alloc(len(x), x)))
    yield Wait(second, a, b)
    yield Wait(first)


MISUSES = [
    (forward_before_wait, "which reads memory that its outstanding Recv from rank"),
    (copy_from_before_wait, "Copy reads memory that its outstanding Recv from rank"),
    (divide_before_wait, "Divide writes memory that its outstanding Recv from rank"),
    (overwrite_a_send, "Combine writes the buffer of its outstanding Send to rank"),
    (land_over_a_send_waited_later, "which changes the buffer of its Send to rank"),
    (receives_waited_out_of_order, "posted earlier into the same memory"),
]


def send_and_receive_in_place(comm, x):
    # Legal: the receive lands after the send's data has left, as both are in one Wait.
    s = yield Send(_peer(comm), x)
    r = yield Recv(_peer(comm), x)
    yield Wait(s, r)
    return x


def receives_waited_in_order(comm, x):
    # Legal: the second receive folds into the first one's data.
    mine = yield Alloc(len(x), x)
    yield Copy(mine, x)
    first = yield Recv(_peer(comm), x)
    second = yield Recv(_peer(comm), x, SUM)
    a = yield Send(_peer(comm), mine)
    b = yield Send(_peer(comm), mine)
    yield Wait(first, second, a, b)
    return x


LEGAL = [send_and_receive_in_place, receives_waited_in_order]


def _inputs() -> list[np.ndarray]:
    return [np.full(4, rank + 1.0) for rank in range(2)]


@pytest.mark.parametrize(("algorithm", "message"), MISUSES,
                         ids=[algorithm.__name__ for algorithm, _ in MISUSES])
def test_the_simulator_refuses_each_misuse_of_memory(algorithm, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        simulate(algorithm, _inputs(), fully_connected(2, 1e9, 1e-6))


def test_the_simulator_accepts_the_legal_neighbours() -> None:
    topology = fully_connected(2, 1e9, 1e-6)
    assert [r.tolist() for r in simulate(send_and_receive_in_place, _inputs(),
                                         topology).results] == [[2.0] * 4, [1.0] * 4]
    assert [r.tolist() for r in simulate(receives_waited_in_order, _inputs(),
                                         topology).results] == [[4.0] * 4, [2.0] * 4]


# -- a receive's buffer, written directly (numpy) before its Wait: the simulator only ----------
# Local ops into it are refused at the op (MISUSES above); a plain numpy write is no op, so the
# simulator finds it where the data land, at the Wait: the buffer no longer holds what it held
# when the Recv was posted. On hardware the write and the arriving data would race.

def _exchange(write, reduce=None):
    """Rank 1 receives into x and, before the Wait, lets ``write(x, other)`` touch memory;
    rank 0 is a plain partner."""
    def algorithm(comm, x):
        other = yield Alloc(len(x), x)
        yield Copy(other, x)
        r = yield Recv(_peer(comm), x, reduce, label="inbox")
        s = yield Send(_peer(comm), other)
        if comm.rank == 1:
            yield from write(x, other)
        yield Wait(r, s)
        return x
    return algorithm


def _zero(x, other):
    x[:] = 0
    yield from ()


def _add(x, other):
    x += other
    yield from ()


def _copy_in(x, other):
    yield Copy(x, other)


def _write_a_view(x, other):
    x[2:3] = 7.0  # through another view of the same memory
    yield from ()


RECV_WRITTEN = "rank 1 wrote to the buffer of its Recv from rank 0 on channel 0 \\(label 'inbox'\\)"


@pytest.mark.parametrize(("write", "reduce"), [(_zero, None), (_add, SUM), (_write_a_view, None)],
                         ids=["zeroed", "added_into_a_reducing_recv", "through_a_view"])
def test_a_direct_write_into_a_recv_buffer_before_its_wait_is_refused(write, reduce) -> None:
    with pytest.raises(ProtocolError, match=RECV_WRITTEN + " while that Recv was in flight, "
                       "between posting it and its Wait: its data may land at any moment"):
        simulate(_exchange(write, reduce), _inputs(), fully_connected(2, 1e9, 1e-6))


def test_a_copy_into_a_recv_buffer_before_its_wait_is_refused_at_the_copy() -> None:
    with pytest.raises(ProtocolError, match="rank 1 Copy writes memory that its outstanding "
                                            "Recv from rank 0 on channel 0"):
        simulate(_exchange(_copy_in), _inputs(), fully_connected(2, 1e9, 1e-6))


def _second_of_two(write_between):
    """Rank 1 receives twice into x (the second reducing), waits the first and then the
    second; ``write_between`` writes x after the first lands, before the second's Wait."""
    def algorithm(comm, x):
        mine = yield Alloc(len(x), x)
        yield Copy(mine, x)
        first = yield Recv(_peer(comm), x, label="first")
        second = yield Recv(_peer(comm), x, SUM, label="second")
        a = yield Send(_peer(comm), mine)
        b = yield Send(_peer(comm), mine)
        yield Wait(first, a, b)
        if write_between and comm.rank == 1:
            x[0] = -1.0
        yield Wait(second)
        return x
    return algorithm


def test_a_write_between_two_receives_into_one_buffer_is_refused_at_the_second() -> None:
    topology = fully_connected(2, 1e9, 1e-6)
    # The first landing is no write of the algorithm's: waited apart, as posted, they pass.
    assert [r.tolist() for r in simulate(_second_of_two(False), _inputs(),
                                         topology).results] == [[4.0] * 4, [2.0] * 4]
    with pytest.raises(ProtocolError, match="rank 1 wrote to the buffer of its Recv from rank 0 "
                                            "on channel 0 \\(label 'second'\\) while that Recv"):
        simulate(_second_of_two(True), _inputs(), topology)


def test_a_write_into_the_part_only_a_later_receive_covers_names_that_receive() -> None:
    def algorithm(comm, x):
        mine = yield Alloc(len(x), x)
        yield Copy(mine, x)
        head = yield Recv(_peer(comm), x[:2], label="head")
        whole = yield Recv(_peer(comm), x, SUM, label="whole")
        a = yield Send(_peer(comm), mine[:2])
        b = yield Send(_peer(comm), mine)
        if comm.rank == 1:
            x[3] = 0.0  # the head's receive does not cover it; the whole's does
        yield Wait(head, whole, a, b)

    with pytest.raises(ProtocolError, match="its Recv from rank 0 on channel 0 "
                                            "\\(label 'whole'\\) while that Recv was in flight"):
        simulate(algorithm, _inputs(), fully_connected(2, 1e9, 1e-6))


def test_writing_a_recv_buffer_after_its_wait_and_reducing_what_landed_are_legal() -> None:
    def algorithm(comm, x):
        mine = yield Alloc(len(x), x)
        yield Copy(mine, x)
        inbox = yield Alloc(len(x), x)
        for _ in range(2):  # the inbox reused once its Wait has returned
            r = yield Recv(_peer(comm), inbox)
            s = yield Send(_peer(comm), mine)
            x *= 2  # neither buffer in flight
            yield Wait(r, s)
            x += inbox  # reduce what landed, after its Wait
            yield Combine(x, inbox, SUM)
            inbox[:] = -1.0
        return x

    result = simulate(algorithm, _inputs(), fully_connected(2, 1e9, 1e-6)).results
    # Each round: x = 2x + 2 * peer's input.
    assert [r.tolist() for r in result] == [[16.0] * 4, [14.0] * 4]


def _run_real(misuses, legal):
    rank = dist.get_rank()
    replies = []
    for algorithm in legal:
        x = torch.full((4,), rank + 1.0, dtype=torch.float64)
        replies.append(("ok", Driver(timeout=30.0).run(algorithm, x).tolist()))
    for algorithm in misuses:
        x = torch.full((4,), rank + 1.0, dtype=torch.float64)
        try:
            Driver(range(2), timeout=5.0).run(algorithm, x, check_args=False)
            replies.append(("ok", None))
        except AlgorithmError as error:
            replies.append((type(error).__name__, str(error)))
    return replies


def test_gloo_refuses_the_same_misuses_with_the_same_words_and_runs_the_legal_ones() -> None:
    misuses = [algorithm for algorithm, _ in MISUSES]
    real = spawn(_run_real, 2, (misuses, LEGAL), timeout=120)
    for rank in range(2):
        assert real[rank][0] == ("ok", [2.0 - rank] * 4)
        assert real[rank][1] == ("ok", [4.0 - 2 * rank] * 4)
        for (algorithm, message), (kind, text) in zip(MISUSES, real[rank][2:]):
            assert kind == "ProtocolError" and message in text, (algorithm.__name__, text)


# -- the index of memory in flight ----------------------------------------------------------

spans = st.tuples(st.sampled_from(["cpu", "gpu"]), st.integers(0, 60), st.integers(0, 20)
                  ).map(lambda t: (t[0], t[1], t[1] + t[2]))  # empty ones too


@given(st.lists(st.tuples(spans, st.booleans()), max_size=30), st.lists(spans, max_size=10))
def test_the_index_of_memory_in_flight_finds_what_a_scan_finds(posted, queries) -> None:
    # Post handles over (device, first byte, past the last byte) spans, drop some (True),
    # and ask which overlap each query: the index answers as a scan of every handle does,
    # in posting order.
    task = Task(0, 0, iter(()))
    flight, kept = InFlight(), []
    for seq, (span, _) in enumerate(posted, 1):
        h = Handle(task, False, 1, np.empty(0), None, "", span)
        h.seq = seq
        flight.add(h)
        kept.append(h)
    for h, (_, dropped) in zip(list(kept), posted):
        if dropped:
            flight.discard(h)
            flight.discard(h)  # a second time: nothing
            kept.remove(h)
    assert len(flight) == len(kept)
    for query in queries + [h.span for h in kept]:
        assert flight.overlapping(query) == [h for h in kept if overlaps(query, h.span)]
