"""Spawn, Join and channels: concurrent tasks on one rank overlap in time and keep their
messages apart."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import (
    Compute, Join, Recv, Send, Spawn, Wait, ring_allreduce, split_even,
)
from simcomm import SizeOnly, Topology, fully_connected, ring, simulate, switch

pytestmark = pytest.mark.usefixtures("hang_guard")


def concurrent_halves(comm, x):
    """All-reduce the two halves of x at once, on channels 1 and 2."""
    first, second = split_even(x, 2)
    tasks = [(yield Spawn(ring_allreduce(comm, first), 1)),
             (yield Spawn(ring_allreduce(comm, second), 2))]
    for task in tasks:
        yield Join(task)
    return x


def sequential_halves(comm, x):
    first, second = split_even(x, 2)
    yield from ring_allreduce(comm, first)
    yield from ring_allreduce(comm, second)
    return x


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    builder = draw(st.sampled_from([ring, fully_connected, switch]))
    return builder(draw(st.integers(2, 8)), draw(st.floats(1e8, 1e11)),
                   draw(st.floats(1e-7, 1e-5)), draw(st.floats(1e9, 1e12)))


@given(topology=topologies(), length=st.integers(2, 300), seed=st.integers(0, 2**32 - 1))
def test_two_all_reduces_on_two_channels_are_correct_and_overlap(topology, length,
                                                                 seed) -> None:
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-1000, 1000, length) for _ in range(topology.size)]
    concurrent = simulate(concurrent_halves, inputs, topology)
    expected = np.sum(inputs, axis=0)
    for result in concurrent.results:
        np.testing.assert_array_equal(result, expected)
    sequential = simulate(sequential_halves, inputs, topology)
    assert concurrent.time < sequential.time
    alone = simulate(ring_allreduce, [x[:(length + 1) // 2] for x in inputs], topology)
    assert concurrent.time >= alone.time
    assert {e.channel for e in concurrent.sends()} == {1, 2}


@pytest.mark.parametrize("compute_seconds", [1e-6, 1e-3], ids=["short", "long"])
def test_compute_overlaps_a_spawned_all_reduce(compute_seconds) -> None:
    topology = ring(4, 1e10, 1e-6, reduce_bandwidth=1e11)
    inputs = [SizeOnly(100_000)] * 4
    allreduce_alone = simulate(ring_allreduce, inputs, topology).time

    def backward_with_allreduce(comm, x):
        task = yield Spawn(ring_allreduce(comm, x), "grads")
        yield Compute(compute_seconds, "backward")
        return (yield Join(task))

    result = simulate(backward_with_allreduce, inputs, topology)
    assert result.time == pytest.approx(max(compute_seconds, allreduce_alone), rel=1e-12)
    computes = [e for e in result.trace if e.kind == "compute"]
    assert [(e.start, e.end, e.label) for e in computes] == [(0.0, compute_seconds,
                                                              "backward")] * 4


def test_one_rank_computes_one_thing_at_a_time() -> None:
    def two_computes(comm, x):
        task = yield Spawn(compute(2e-3), 1)
        yield Compute(1e-3)
        yield Join(task)

    def compute(seconds):
        yield Compute(seconds)

    result = simulate(two_computes, [SizeOnly(1)] * 2, ring(2, 1e9, 0.0))
    assert result.time == pytest.approx(3e-3, rel=1e-12)


def test_a_spawned_task_messages_do_not_match_the_main_task() -> None:
    # Rank 0 posts its channel-1 send first, but rank 1's main task receives on channel 0:
    # it must get the main task's message, of another size, and not the first one sent.
    def crossing(comm, x):
        if comm.rank == 0:
            task = yield Spawn(send(np.full(3, 1.0)), 1)
            yield Wait((yield Send(1, np.full(2, 2.0))))
            yield Join(task)
            return None
        main_buf, side_buf = np.zeros(2), np.zeros(3)
        task = yield Spawn(receive(side_buf), 1)
        yield Wait((yield Recv(0, main_buf)))
        yield Join(task)
        return main_buf, side_buf

    def send(buf):
        yield Wait((yield Send(1, buf)))

    def receive(buf):
        yield Wait((yield Recv(0, buf)))

    result = simulate(crossing, [np.zeros(1), np.zeros(1)], fully_connected(2, 1e9, 1e-6))
    main_buf, side_buf = result.results[1]
    np.testing.assert_array_equal(main_buf, [2.0, 2.0])
    np.testing.assert_array_equal(side_buf, [1.0, 1.0, 1.0])
    assert [(e.channel, e.nbytes) for e in result.sends()] == [(1, 24), (0, 16)]


def test_join_returns_the_task_result_and_frees_its_channel() -> None:
    def reuse(comm, x):
        results = []
        for bucket in split_even(x, 3):  # one channel, one bucket after another
            task = yield Spawn(ring_allreduce(comm, bucket), "bucket")
            results.append((yield Join(task)))
        return results

    inputs = [np.arange(9) * (r + 1) for r in range(3)]
    result = simulate(reuse, inputs, switch(3, 1e9, 1e-6))
    expected = np.arange(9) * 6
    for buckets in result.results:
        np.testing.assert_array_equal(np.concatenate(buckets), expected)


def test_a_task_may_be_joined_by_a_sibling_and_again_by_its_spawner() -> None:
    # A stream of collectives: the second waits for the first, and the spawner waits for
    # both; the first is joined twice and gives its result each time.
    def after(previous, schedule):
        first = yield Join(previous)
        return first, (yield from schedule)

    def chained(comm, x):
        halves = split_even(x, 2)
        first = yield Spawn(ring_allreduce(comm, halves[0]), "a")
        second = yield Spawn(after(first, ring_allreduce(comm, halves[1])), "b")
        yield Compute(1e-6, "meanwhile")
        seen_by_sibling, _ = yield Join(second)
        seen_by_spawner = yield Join(first)
        return seen_by_sibling is seen_by_spawner is halves[0]

    inputs = [np.arange(8) * (r + 1) for r in range(4)]
    result = simulate(chained, inputs, ring(4, 1e9, 1e-6))
    assert result.results == [True] * 4
    tasks = sorted((e.channel, e.start, e.end) for e in result.trace
                   if e.kind == "task" and e.rank == 0)
    (_, _, first_end), (_, _, second_end) = tasks
    assert second_end > first_end
