"""``simcomm.testing`` as a user meets it: algorithms written the way a user would write them,
one correct and some buggy, put through ``check_collective``."""

from __future__ import annotations

import math
import re
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import (
    SUM, Alloc, Comm, Copy, Divide, Join, Recv, ReduceOp, Send, Spawn, Wait, chunk_bounds,
    ring_allreduce,
)
from algorithms.reference import allreduce_reference, reduce_reference, reduced
from simcomm import ring
from simcomm.testing import (
    Case, buffers, check_case, check_collective, dtypes, reduce_ops, topologies, world_sizes,
)


def lossy_ring_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """A ring all-reduce with a planted bug: chunks of len(x) // p elements, so the last
    len(x) % p elements are never reduced."""
    p, r = comm.size, comm.rank
    step = len(x) // p
    chunks = [x[i * step:(i + 1) * step] for i in range(p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        sent = yield Send(right, chunks[(r - s) % p])
        received = yield Recv(left, chunks[(r - s - 1) % p], reduce=op)
        yield Wait(sent, received)
    for s in range(p - 1):
        sent = yield Send(right, chunks[(r - s + 1) % p])
        received = yield Recv(left, chunks[(r - s) % p])
        yield Wait(sent, received)
    return x


def fixed_ring_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """The same ring all-reduce with uneven chunks that cover the whole buffer. It does not
    divide for AVG."""
    p, r = comm.size, comm.rank
    chunks = [x[a:b] for a, b in chunk_bounds(len(x), p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        sent = yield Send(right, chunks[(r - s) % p])
        received = yield Recv(left, chunks[(r - s - 1) % p], reduce=op)
        yield Wait(sent, received)
    for s in range(p - 1):
        sent = yield Send(right, chunks[(r - s + 1) % p])
        received = yield Recv(left, chunks[(r - s) % p])
        yield Wait(sent, received)
    return x


def chain_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """Pass a running reduction round the ring. Bug: rank 0 should send first, but every
    rank waits for its left neighbour, so with two ranks or more nobody ever sends."""
    p, r = comm.size, comm.rank
    if p > 1:
        yield Wait((yield Recv((r - 1) % p, x, reduce=op)))
        yield Wait((yield Send((r + 1) % p, x)))
    return x


NO_AVG = st.sampled_from([op for op in ReduceOp if op is not ReduceOp.AVG])
REPORT_ONE_BUG = {"report_multiple_bugs": False}


def shrunk_case(error: BaseException) -> tuple[int, int]:
    """World size and length of the case named in a ``check_collective`` failure."""
    match = re.search(r"world size (\d+), length (\d+)", str(error))
    assert match, f"no case in {error}"
    return int(match.group(1)), int(match.group(2))


def test_planted_uneven_chunk_bug_is_caught_with_an_uneven_length() -> None:
    with pytest.raises(AssertionError) as info:
        check_collective(lossy_ring_allreduce, allreduce_reference,
                         settings=settings(**REPORT_ONE_BUG))
    p, n = shrunk_case(info.value)
    assert n % p != 0, str(info.value)
    assert re.search(r"wrong on rank \d+: first wrong index \d+: got .+, expected ",
                     str(info.value))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    # hypothesis words its report "Falsifying example:", "Failing test case:" or, for an
    # explicit example (the corner cases run first), "Failing explicit example:".
    assert re.search(r"(Falsifying|Failing) (explicit )?(example|test case): "
                     r"check_lossy_ring_allreduce\(", notes), notes


def test_correct_user_algorithm_passes() -> None:
    check_collective(fixed_ring_allreduce, allreduce_reference, ops=NO_AVG)


def test_forgotten_avg_division_is_caught() -> None:
    with pytest.raises(AssertionError, match="op AVG"):
        check_collective(fixed_ring_allreduce, allreduce_reference,
                         ops=st.just(ReduceOp.AVG), settings=settings(**REPORT_ONE_BUG))


def test_deadlock_is_a_failure_with_the_simulators_message(hang_guard: None) -> None:
    with pytest.raises(AssertionError) as info:
        check_collective(chain_allreduce, allreduce_reference,
                         settings=settings(**REPORT_ONE_BUG))
    message = str(info.value)
    assert "chain_allreduce failed in the simulator (DeadlockError): deadlock at t=" in message
    assert "rank 0 (channel 0) waits for Recv from rank 1" in message
    assert shrunk_case(info.value)[0] == 2


def test_an_exception_in_the_algorithm_carries_the_case() -> None:
    def broken(comm: Comm, x: Any) -> Generator[Any, Any, Any]:
        last = x[len(x)]  # one past the end
        yield Wait((yield Send((comm.rank + 1) % comm.size, last)))
        return x

    with pytest.raises(IndexError) as info:
        check_collective(broken, allreduce_reference, settings=settings(**REPORT_ONE_BUG))
    assert any(note.startswith("case: world size ") for note in info.value.__notes__)


def _case(*inputs: list[float], op: ReduceOp | None = SUM) -> Case:
    arrays = [np.array(values, dtype=np.float32) for values in inputs]
    return Case(arrays, ring(len(arrays), 1e9, 1e-6), op=op)


@pytest.mark.parametrize(("result", "problem"), [
    (lambda x: None, "returned None, expected 3 x float32"),
    (lambda x: x[:2], r"returned shape \(2,\), expected \(3,\)"),
    (lambda x: x.astype(np.float64), "returned dtype float64, expected float32"),
    (lambda x: x * 0, "first wrong index 1: got 0.0, expected 3.0 .2 of 3 elements wrong."),
])
def test_check_case_names_the_problem(result: Any, problem: str) -> None:
    def allreduce_then(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
        yield from fixed_ring_allreduce(comm, x, op)
        return result(x)

    case = _case([0, 1, 2], [0, 2, -1])
    check_case(fixed_ring_allreduce, allreduce_reference, case)
    with pytest.raises(AssertionError, match=f"allreduce_then is wrong on rank 0: {problem}"):
        check_case(allreduce_then, allreduce_reference, case)


def test_reference_must_take_the_op_the_algorithm_takes() -> None:
    with pytest.raises(ValueError, match="takes 'op' but the reference"):
        check_collective(fixed_ring_allreduce, lambda inputs: inputs)


def test_params_must_be_parameters_of_the_algorithm() -> None:
    with pytest.raises(ValueError, match=r"takes no parameters \['tree'\]"):
        check_collective(fixed_ring_allreduce, allreduce_reference, params={"tree": True})


@given(p=world_sizes(), dtype=dtypes(), op=reduce_ops(), data=st.data())
def test_buffers_reduce_exactly(p: int, dtype: np.dtype, op: ReduceOp, data: st.DataObject
                                ) -> None:
    """In the buffer's dtype, the reduction equals the one in exact integers (so it is the
    same in any order). AVG is checked by its sum, the part whose order varies."""
    n = data.draw(st.integers(0, 100))
    inputs = [data.draw(buffers(dtype, n, op)) for _ in range(p)]
    assert all(a.dtype == dtype and len(a) == n for a in inputs)
    op = ReduceOp.SUM if op is ReduceOp.AVG else op
    exact = reduced([a.astype(np.int64) for a in inputs], op)
    np.testing.assert_array_equal(reduced(inputs, op), exact.astype(dtype))


@given(p=world_sizes(), data=st.data())
def test_topologies_route_between_every_pair(p: int, data: st.DataObject) -> None:
    topology = data.draw(topologies(p))
    assert topology.size == p
    for src in range(p):
        for dst in range(p):
            if src != dst:
                latency = sum(topology.links[i].latency for i in topology.route(src, dst))
                assert math.isfinite(latency)


def _send_on(peer: int, buf: Any) -> Generator[Any, Any, Any]:
    yield Wait((yield Send(peer, buf)))


def _receive_then_copy(peer: int, buf: Any, x: Any) -> Generator[Any, Any, Any]:
    yield Wait((yield Recv(peer, buf)))
    yield Copy(x, buf)


def last_one_wins_copy(comm: Comm, x: Any) -> Generator[Any, Any, Any]:
    """Rank 0 gives rank 1 its buffer, with a planted race: a stale copy and the real one go
    on two channels, and rank 1 keeps whichever lands last, trusting the real one, sent
    second, to arrive second. On one link in order it does; across channels nothing says
    so, on NCCL or here once messages are delayed at random."""
    if comm.size < 2 or comm.rank > 1:
        return x
    first, second = (yield Alloc(len(x), x)), (yield Alloc(len(x), x))
    if comm.rank == 0:
        yield Copy(second, x)
        stale = yield Spawn(_send_on(1, first), "stale")
        real = yield Spawn(_send_on(1, second), "real")
    else:
        stale = yield Spawn(_receive_then_copy(0, first, x), "stale")
        real = yield Spawn(_receive_then_copy(0, second, x), "real")
    yield Join(stale)
    yield Join(real)
    return x


def rank_0_to_rank_1(inputs: Any) -> list[Any]:
    return [inputs[0] if rank == 1 else inputs[rank] for rank in range(len(inputs))]


def test_random_delays_find_a_race_that_only_timing_across_channels_decides() -> None:
    # Link latencies alone never reorder two messages on one route: the link serves them in
    # send order. Only the per-message delays (Case.jitter) can, as real transports may.
    with pytest.raises(AssertionError, match=r"(?s)is wrong on rank 1.*delays up to") as caught:
        check_collective(last_one_wins_copy, rank_0_to_rank_1,
                         world_sizes=st.integers(2, 3), dtypes=st.just(np.dtype(np.int32)))
    assert "(seed " in str(caught.value)


@settings(max_examples=40)
@given(p=st.integers(2, 3), data=st.data())
def test_without_random_delays_the_race_never_shows(p: int, data: st.DataObject) -> None:
    inputs = [np.full(5, rank + 1, np.int32) for rank in range(p)]
    check_case(last_one_wins_copy, rank_0_to_rank_1,
               Case(inputs, data.draw(topologies(p)), jitter=None))


# Bugs that the drawn cases alone missed within the profile's examples (a mutation test of
# the checker): its corner cases (``_corner_cases``) and wide values must catch them.

def max_as_sum_reduce(comm: Comm, x: Any, root: int = 0, op: ReduceOp = SUM
                      ) -> Generator[Any, Any, Any]:
    """A flat reduce that folds MAX as a sum: right for every op but MAX."""
    fold = SUM if op is ReduceOp.MAX else op
    if comm.rank != root:
        yield Wait((yield Send(root, x)))
        return None
    handles = []
    for peer in range(comm.size):
        if peer != root:
            handles.append((yield Recv(peer, x, fold)))
    if handles:
        yield Wait(*handles)
    if op is ReduceOp.AVG and comm.size > 1 and len(x):
        yield Divide(x, comm.size)
    return x


def short_buffer_shortcut(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """Skips the all-reduce of a buffer of one element or none, 'too small to split'."""
    if len(x) <= 1:
        return x
    return (yield from ring_allreduce(comm, x, op))


def float32_staging(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """All-reduces a float32 copy of x: loses float64's, int32's and int64's low bits."""
    work = x.astype(np.float32)
    yield from ring_allreduce(comm, work, op)
    yield Copy(x, work.astype(x.dtype))
    return x


def reduce_a_copy(comm: Comm, x: Any, op: ReduceOp = SUM) -> Generator[Any, Any, Any]:
    """All-reduces a copy and returns it: the right result, but x keeps the rank's own
    values, and a caller that reads x (realcomm's DDP reads its bucket) gets no average."""
    work = x.copy()
    yield from ring_allreduce(comm, work, op)
    return work


@pytest.mark.parametrize(("algorithm", "problem"), [
    (max_as_sum_reduce, r"(?s)is wrong on rank \d+: .*op MAX"),
    (short_buffer_shortcut, r"(?s)is wrong on rank \d+: .*length 1,"),
    (float32_staging, r"(?s)is wrong on rank \d+: .*dtype (float64|int32|int64)"),
    (reduce_a_copy, r"(?s)returned the right result on rank \d+ but left its buffer without "
                    r"it .*: first wrong index"),
])
def test_mutants_the_drawn_cases_missed_are_caught(algorithm: Any, problem: str) -> None:
    reference = reduce_reference if algorithm is max_as_sum_reduce else allreduce_reference
    with pytest.raises(AssertionError, match=problem):
        check_collective(algorithm, reference, settings=settings(**REPORT_ONE_BUG))


def test_in_place_false_checks_the_returned_result_alone() -> None:
    # As for an all-to-all, whose result is what it received, not its buffer.
    check_collective(reduce_a_copy, allreduce_reference, in_place=False,
                     settings=settings(max_examples=5))
    inputs = [np.arange(4, dtype=np.int64) + rank for rank in range(3)]
    with pytest.raises(AssertionError, match="left its buffer without it"):
        check_case(reduce_a_copy, allreduce_reference, Case(inputs, ring(3, 1e9, 1e-6)))


def test_an_algorithm_that_is_no_generator_function_is_named() -> None:
    def listing(comm: Comm, x: Any, op: ReduceOp = SUM) -> list[Any]:
        return [x]
    inputs = [np.arange(4, dtype=np.int64) for _ in range(2)]
    with pytest.raises(TypeError, match="'listing' did not return a generator"):
        check_case(listing, allreduce_reference, Case(inputs, ring(2, 1e9, 1e-6)))
