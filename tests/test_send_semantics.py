"""Send semantics as on gloo and NCCL: a send completes only once its receive is posted, so
an algorithm that hangs on real transports deadlocks in the simulator too, with an error
that says why and what to do. Eager sends are an explicit option; runs are bounded."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms import SUM, Alloc, Compute, Recv, Send, Wait
from algorithms.reference import allreduce_reference
from simcomm import (
    DeadlockError, RunLimitError, SizeOnly, fully_connected, ring, simulate,
)
from simcomm.testing import check_collective

LATENCY, BANDWIDTH = 1e-6, 1e9


def unsafe_exchange(comm, x):
    """Each rank waits on its send before posting the receive its peer needs: MPI's
    classic unsafe exchange, which hangs on gloo and NCCL."""
    peer = 1 - comm.rank
    incoming = x.copy() if isinstance(x, np.ndarray) else x
    yield Wait((yield Send(peer, x)))
    yield Wait((yield Recv(peer, incoming)))
    return incoming


def recursive_doubling_send_first(comm, x, op=SUM):
    """Recursive-doubling all-reduce whose every rank sends, waits for the send, then
    receives: correct under eager buffering, a hang on real transports."""
    incoming = yield Alloc(len(x), x)
    distance = 1
    while distance < comm.size:
        peer = comm.rank ^ distance
        if peer < comm.size:
            yield Wait((yield Send(peer, x)))
            yield Wait((yield Recv(peer, incoming)))
            x += incoming
        distance *= 2
    return x


def test_an_unsafe_exchange_deadlocks_and_the_error_says_how_to_fix_it() -> None:
    inputs = [np.arange(4, dtype=np.float32)] * 2
    with pytest.raises(DeadlockError) as caught:
        simulate(unsafe_exchange, inputs, fully_connected(2, BANDWIDTH, LATENCY))
    text = str(caught.value)
    assert "rank 0 (channel 0) waits for Send to rank 1" in text
    assert "rank 1 (channel 0) waits for Send to rank 0" in text
    assert text.count("its Recv was never posted") == 2
    assert "post the Recv before waiting on the Send, or wait on both in one Wait" in text


def test_eager_sends_let_the_unsafe_exchange_through_up_to_the_limit() -> None:
    inputs = [np.full(4, rank, dtype=np.float32) for rank in range(2)]
    topology = fully_connected(2, BANDWIDTH, LATENCY)
    result = simulate(unsafe_exchange, inputs, topology, eager_limit=16)
    assert [r.tolist() for r in result.results] == [[1.0] * 4, [0.0] * 4]
    with pytest.raises(DeadlockError):
        simulate(unsafe_exchange, inputs, topology, eager_limit=15)


def test_check_collective_refuses_send_wait_recv_recursive_doubling_with_a_small_case() -> None:
    with pytest.raises(AssertionError, match="DeadlockError") as caught:
        check_collective(recursive_doubling_send_first, allreduce_reference)
    text = str(caught.value)
    assert "its Recv was never posted" in text
    # hypothesis shrinks to the smallest failing case: two ranks, an empty buffer.
    assert "case: world size 2, length 0" in text


def test_a_send_whose_receive_comes_late_completes_when_it_is_posted() -> None:
    late = 5e-3

    def late_receiver(comm, x):
        if comm.rank == 0:
            yield Wait((yield Send(1, x)))
        else:
            yield Compute(late)
            yield Wait((yield Recv(0, x)))
        return x

    result = simulate(late_receiver, [SizeOnly(1000)] * 2, fully_connected(2, BANDWIDTH,
                                                                          LATENCY))
    # The data arrived long before; the send waited for the receive, not for more data.
    assert result.finish_times == pytest.approx([late, late], rel=1e-12)


def test_a_long_chain_of_late_receives_does_not_nest_calls() -> None:
    # Rank r waits on its send to r + 1 before it posts the receive from r - 1: each send
    # completes only when the next rank's receive is posted, a chain through every rank.
    def chain(comm, x):
        if comm.rank + 1 < comm.size:
            yield Wait((yield Send(comm.rank + 1, x)))
        if comm.rank > 0:
            yield Wait((yield Recv(comm.rank - 1, x)))
        return x

    p = 3000
    result = simulate(chain, [SizeOnly(0)] * p, ring(p, BANDWIDTH, 0.0), record=False)
    assert result.messages == p - 1


def spin(comm, x):
    while True:
        yield Compute(0.0)


def poll(comm, x):
    while True:
        yield Compute(1e-6)


def test_a_loop_that_never_blocks_is_stopped_by_the_op_limit(hang_guard) -> None:
    with pytest.raises(RunLimitError, match=r"limit of 1000 ops \(max_ops\) while rank 0"):
        simulate(spin, [SizeOnly(4)] * 2, ring(2, BANDWIDTH, LATENCY), max_ops=1000)


def test_a_polling_loop_is_stopped_by_the_time_limit_and_the_ranks_are_named() -> None:
    with pytest.raises(RunLimitError, match=r"limit of 0\.001 simulated seconds "
                                            r"\(max_time\) with ranks \[0, 1\] still running"):
        simulate(poll, [SizeOnly(4)] * 2, ring(2, BANDWIDTH, LATENCY), max_time=1e-3)


@pytest.mark.parametrize("bad", [{"eager_limit": -1}, {"eager_limit": 1.5},
                                 {"max_ops": 0}, {"max_ops": 2.0}, {"max_time": 0},
                                 {"max_time": float("nan")}, {"max_time": -1.0}])
def test_bad_run_bounds_are_refused_by_name(bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        simulate(spin, [SizeOnly(4)], ring(1, BANDWIDTH, LATENCY), **bad)
