"""Results as data: link utilization and rank activity against closed forms, and the plain
dicts and records being JSON-ready."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import (
    Compute, Join, Recv, Send, Spawn, Wait, reduce_broadcast_allreduce, ring_allreduce,
)
from algorithms.harness.bench import bench_row
from algorithms.harness.catalog import COLLECTIVES
from simcomm import SizeOnly, fully_connected, ring, simulate, switch
from simcomm.summary import (
    bench_records, busiest_links, format_summary, link_usage, rank_activity, result_to_dict,
    trace_records,
)

ALPHA = 5e-6  # seconds
B = 1e11  # bytes/second


def ring_allreduce_time(p: int, n: int, alpha: float, reduce_bw: float) -> float:
    return 2 * (p - 1) * (alpha + n / (p * B)) + (p - 1) * (n / p) / reduce_bw


@given(p=st.integers(2, 8), chunk=st.integers(1, 2**16), alpha=st.sampled_from([0.0, ALPHA]),
       reduce_bw=st.sampled_from([math.inf, 4e10]))
def test_ring_allreduce_link_utilization_is_its_closed_form_share(
        p: int, chunk: int, alpha: float, reduce_bw: float) -> None:
    n = 4 * p * chunk  # float32 bytes, divisible into p chunks
    result = simulate(ring_allreduce, [SizeOnly(n // 4)] * p, ring(p, B, alpha, reduce_bw),
                      record=False)
    total = ring_allreduce_time(p, n, alpha, reduce_bw)
    assert result.time == pytest.approx(total, rel=1e-12)
    busy = 2 * (p - 1) * n / (p * B)  # 2(p-1) chunks on each link to a right neighbour
    for usage in link_usage(result):
        src, dst = (int(node.removeprefix("gpu")) for node in (usage.src, usage.dst))
        if dst == (src + 1) % p:
            assert usage.bytes == 2 * (p - 1) * n // p
            assert usage.busy_time == pytest.approx(busy, rel=1e-12)
            assert usage.utilization == pytest.approx(busy / total, rel=1e-9)
        else:  # the ring never sends to the left
            assert (usage.bytes, usage.busy_time, usage.utilization) == (0, 0.0, 0.0)


@given(p=st.integers(2, 8), chunk=st.integers(1, 2**16),
       reduce_bw=st.sampled_from([math.inf, 4e10]))
def test_ring_allreduce_ranks_are_never_idle(p: int, chunk: int, reduce_bw: float) -> None:
    n = 4 * p * chunk
    result = simulate(ring_allreduce, [SizeOnly(n // 4)] * p, ring(p, B, ALPHA, reduce_bw))
    comm = 2 * (p - 1) * (ALPHA + n / (p * B))  # a message in flight every step
    memory = (p - 1) * (n / p) / reduce_bw  # each reduce-scatter step reduces one chunk
    for activity in rank_activity(result):
        assert activity.compute == 0.0
        assert activity.comm == pytest.approx(comm, rel=1e-9)
        assert activity.memory == pytest.approx(memory, rel=1e-9)
        # the reduction starts when the step's messages have arrived, so nothing overlaps
        assert activity.busy == pytest.approx(comm + memory, rel=1e-9)
        assert activity.busy + activity.idle == pytest.approx(result.time, rel=1e-12)
        assert activity.idle == pytest.approx(0.0, abs=1e-12 * result.time)


def compute_then_send(n: int, compute: tuple[float, float]):
    """Rank 0 computes, then sends n float32 to rank 1, which then computes."""
    def schedule(comm, x):
        if comm.rank == 0:
            yield Compute(compute[0])
            yield Wait((yield Send(1, x)))
        else:
            yield Wait((yield Recv(0, x)))
            yield Compute(compute[1])
        return x
    return schedule


def test_rank_activity_adds_up_with_compute_and_idle() -> None:
    n, before, after = 4000, 10e-6, 3e-6
    result = simulate(compute_then_send(n, (before, after)), [SizeOnly(n // 4)] * 2,
                      fully_connected(2, B, ALPHA))
    message = ALPHA + n / B
    assert result.time == pytest.approx(before + message + after, rel=1e-12)
    sender, receiver = rank_activity(result)
    assert (sender.compute, sender.comm, sender.memory) == pytest.approx((before, message, 0))
    assert (sender.busy, sender.idle) == pytest.approx((before + message, after))
    assert (receiver.compute, receiver.comm) == pytest.approx((after, message))
    assert (receiver.busy, receiver.idle) == pytest.approx((message + after, before))


def overlapped(comm, x):
    """Each rank's message travels on a spawned task while rank 0 computes."""
    def talk():
        if comm.rank == 0:
            yield Wait((yield Send(1, x)))
        else:
            yield Wait((yield Recv(0, x)))
    task = yield Spawn(talk(), channel=1)
    if comm.rank == 0:
        yield Compute(20e-6)
    yield Join(task)
    return x


def test_overlapping_compute_and_comm_count_once_in_busy() -> None:
    n = 4000
    result = simulate(overlapped, [SizeOnly(n // 4)] * 2, fully_connected(2, B, ALPHA))
    message = ALPHA + n / B  # 5.04 us, all of it under the 20 us of compute
    sender, receiver = rank_activity(result)
    assert (sender.compute, sender.comm) == pytest.approx((20e-6, message))
    assert sender.busy == pytest.approx(20e-6) and sender.idle == pytest.approx(0.0)
    assert receiver.busy == pytest.approx(message)
    assert receiver.idle == pytest.approx(20e-6 - message)


@pytest.mark.parametrize("p", [2, 5, 9])
def test_flat_reduce_broadcast_loads_the_roots_links(p: int) -> None:
    n = 2**20
    result = simulate(reduce_broadcast_allreduce, [SizeOnly(n // 4)] * p,
                      switch(p, B, ALPHA), record=False)
    first, second = busiest_links(result, top=2)
    assert {(first.src, first.dst), (second.src, second.dst)} == {
        ("gpu0", "switch"), ("switch", "gpu0")}
    for hot in (first, second):  # p-1 buffers come in to the root, p-1 copies go out
        assert hot.bytes == (p - 1) * n
        assert hot.busy_time == pytest.approx((p - 1) * n / B, rel=1e-12)
    others = [u for u in link_usage(result) if "gpu0" not in (u.src, u.dst)]
    assert [u.bytes for u in others] == [n] * 2 * (p - 1)  # one buffer each way
    assert busiest_links(result, top=0) == []


def test_rank_activity_needs_a_trace() -> None:
    result = simulate(ring_allreduce, [SizeOnly(8)] * 2, ring(2, B, ALPHA), record=False)
    with pytest.raises(ValueError, match="record=True"):
        rank_activity(result)
    assert result_to_dict(result)["ranks"] is None


def test_result_to_dict_is_json_ready_and_summarises_arrays() -> None:
    inputs = [np.arange(6, dtype=np.float32) * (rank + 1) for rank in range(3)]
    result = simulate(ring_allreduce, inputs, ring(3, B, ALPHA))
    data = json.loads(json.dumps(result_to_dict(result)))
    assert data["time"] == result.time and data["messages"] == result.messages == 12
    assert data["results"][0] == {"kind": "ndarray", "dtype": "float32", "length": 6,
                                  "nbytes": 24, "min": 0.0, "max": 30.0}
    assert len(data["links"]) == 6 and "trace" not in data
    assert data["trace_events"] == len(result.trace)
    assert [r["busy"] + r["idle"] for r in data["ranks"]] == pytest.approx([result.time] * 3)
    full = json.loads(json.dumps(result_to_dict(result, arrays=True, trace=True)))
    assert full["results"][2]["values"] == [0.0, 6.0, 12.0, 18.0, 24.0, 30.0]
    assert len(full["trace"]) == len(result.trace)
    first = full["trace"][0]
    assert set(first) == {"kind", "rank", "channel", "start", "end", "duration", "peer",
                          "nbytes", "label", "message"}
    assert len(full["hops"]) == 12  # one link per message on a ring
    assert set(full["hops"][0]) == {"link", "message", "start", "end"}
    assert first["duration"] == pytest.approx(first["end"] - first["start"])


def test_size_only_results_and_odd_channels_become_plain_data() -> None:
    result = simulate(overlapped, [SizeOnly(10)] * 2, fully_connected(2, B, ALPHA))
    data = result_to_dict(result, trace=True)
    assert data["results"][1] == {"kind": "size-only", "dtype": "float32", "length": 10,
                                  "nbytes": 40}
    assert {record["channel"] for record in trace_records(result)} == {0, 1}
    json.dumps(data)


def test_bench_records_are_the_rows_as_dicts() -> None:
    collective = COLLECTIVES["ring_allreduce"]
    rows = [bench_row(collective, 4, size, np.float32, None, None, 1e-3, None)
            for size in (1024, 4096)]
    records = bench_records(rows)
    assert records == [asdict(row) for row in rows]
    assert records[1]["size"] == 4096 and records[1]["wrong"] is None
    json.dumps(records)


def test_format_summary_shows_the_hot_link_and_every_rank() -> None:
    result = simulate(reduce_broadcast_allreduce, [SizeOnly(2**18)] * 4, switch(4, B, ALPHA))
    text = format_summary(result, top=2)
    lines = text.splitlines()
    assert lines[0].startswith("run: 4 ranks, ")
    assert lines[2].split()[:4] == ["gpu0", "->", "switch", "3MiB"]
    assert sum(1 for line in lines if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])) == 4
    many = simulate(ring_allreduce, [SizeOnly(2**10)] * 20, ring(20, B, ALPHA))
    lines = format_summary(many).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("critical path: ")))
    assert [line.split()[0] for line in lines[at - 3:at]] == ["min", "mean", "max"]
