"""The Chrome trace-event file and the PNG timeline of a run.

Format checks follow the trace-event format: every event has ph, ts, pid and tid; complete
events (X) have a duration; slices on one thread nest; flow start and finish events pair by
id, each on a slice of its thread at the same time.
"""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms import Compute, Join, Spawn, all_gather, ring_allreduce
from algorithms.harness.catalog import COLLECTIVES
from simcomm import SizeOnly, fully_connected, ring, simulate, switch
from simcomm.chrome_trace import chrome_trace
from simcomm.cli import main
from simcomm.testing import topologies

EPS_US = 1e-6  # timestamps are floats in microseconds; allow rounding in ts + dur


def check_format(data: dict[str, Any]) -> None:
    """Assert that ``data`` is a well-formed trace-event file (see the module doc)."""
    events = data["traceEvents"]
    slices: defaultdict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        for key in ("ph", "ts", "pid", "tid"):
            assert key in event, (key, event)
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
            slices[event["pid"], event["tid"]].append((event["ts"], event["ts"] + event["dur"]))
    for track, spans in slices.items():
        open_ends: list[float] = []  # a stack of the enclosing slices' ends
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start + EPS_US:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + EPS_US, (
                f"slice {start}..{end} overlaps its neighbour on track {track}")
            open_ends.append(end)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys()
    assert len(starts) == sum(e["ph"] == "s" for e in events)
    slice_keys = {(e["pid"], e["tid"], e["ts"], e["cat"]) for e in events if e["ph"] == "X"}
    for flow in list(starts.values()) + list(finishes.values()):
        assert (flow["pid"], flow["tid"], flow["ts"], flow["cat"]) in slice_keys, flow
    assert all(e["bp"] == "e" for e in finishes.values())


def process_names(data: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def thread_names(data: dict[str, Any], pid: int) -> set[str]:
    return {e["args"]["name"] for e in data["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def size_only(p: int, count: int) -> list[SizeOnly]:
    return [SizeOnly(count, np.float32)] * p


def test_ring_allreduce_on_a_switch_has_the_expected_tracks_and_slices() -> None:
    p = 4
    topology = switch(p, 1e9, 1e-6, 1e10)
    result = simulate(ring_allreduce, size_only(p, 1000), topology)
    data = chrome_trace(result)
    check_format(data)
    names = process_names(data)
    assert names == {**{r: f"rank {r}" for r in range(p)}, p: "links"}
    assert thread_names(data, 0) == {"memory", "ch 0 send", "ch 0 recv"}
    assert thread_names(data, p) == {f"gpu{r} -> switch" for r in range(p)} | {
        f"switch -> gpu{r}" for r in range(p)}
    slices = Counter((e["pid"] == p, e["cat"]) for e in data["traceEvents"] if e["ph"] == "X")
    messages = 2 * p * (p - 1)
    assert result.messages == messages
    assert slices[False, "comm"] == 2 * messages  # a send and a receive slice each
    assert slices[True, "link"] == 2 * messages  # every message crosses two links
    assert slices[False, "memory"] == p * (p - 1)  # one reduction per reduce-scatter step
    assert sum(e["ph"] == "s" for e in data["traceEvents"]) == messages
    names = Counter(e["name"] for e in data["traceEvents"]
                    if e["ph"] == "X" and e["pid"] == 1 and e["cat"] == "comm")
    assert names["reduce-scatter 0 -> 2"] == 1 and names["all-gather 2 <- 0"] == 1


def test_link_counters_track_bytes_in_flight() -> None:
    p, count = 3, 250
    result = simulate(ring_allreduce, size_only(p, count), ring(p, 1e9, 2e-6))
    counters = defaultdict(list)
    for e in chrome_trace(result)["traceEvents"]:
        if e["ph"] == "C":
            counters[e["name"]].append((e["ts"], e["args"]["bytes"]))
    assert len(counters) == p  # one per link that carried something: the ring's one way
    for series in counters.values():
        values = [v for _, v in sorted(series)]
        assert min(values) >= 0 and values[-1] == 0
        # One chunk (83 or 84 elements) at a time: latency 2us outlasts nothing here.
        assert set(values) - {0} <= {83 * 4, 84 * 4}


def test_concurrent_messages_spill_into_lanes_that_do_not_overlap() -> None:
    alltoall = COLLECTIVES["alltoall_allreduce"].function
    result = simulate(alltoall, size_only(6, 600), switch(6, 1e9, 1e-6))
    data = chrome_trace(result)
    check_format(data)
    assert {"ch 0 send", "ch 0 send #2", "ch 0 send #5"} <= thread_names(data, 0)


def test_compute_and_spawned_channels_get_their_own_threads() -> None:
    def overlapped(comm, x):
        task = yield Spawn(all_gather(comm, x), "bucket")
        yield Compute(3e-6, "backward")
        yield Join(task)
        return x

    result = simulate(overlapped, size_only(2, 100), ring(2, 1e9, 1e-6))
    data = chrome_trace(result)
    check_format(data)
    assert thread_names(data, 1) == {"compute", "ch bucket send", "ch bucket recv",
                                     "ch bucket task"}
    tasks = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "task"]
    assert [e["name"] for e in tasks] == ["all_gather"] * 2
    computes = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
    assert [(e["name"], e["dur"]) for e in computes] == [("backward", pytest.approx(3.0))] * 2


@given(data=st.data(), name=st.sampled_from(sorted(COLLECTIVES)),
       p=st.integers(1, 7), count=st.integers(0, 300))
def test_every_collective_on_any_topology_gives_a_well_formed_trace(data, name, p, count
                                                                   ) -> None:
    topology = data.draw(topologies(p))
    result = simulate(COLLECTIVES[name].function, size_only(p, count), topology)
    trace = chrome_trace(result)
    check_format(trace)
    sends = sum(1 for e in trace["traceEvents"] if e["ph"] == "s")
    assert sends == result.messages
    link_slices = sum(1 for e in trace["traceEvents"] if e.get("cat") == "link")
    assert link_slices == len(result.hops) >= result.messages


@pytest.mark.parametrize("name", ["nvls_allreduce", "nvls_all_gather", "nvls_reduce_scatter"])
def test_in_switch_traffic_shows_as_the_messages_it_belongs_to(name) -> None:
    # Regression (found by the random profile): the switch's copy back to a multicast's
    # writer, and an asker's own part of a sum, crossed links as no message's traffic, and
    # the trace failed on them.
    topology = replace(switch(2, 1e9, 0.0), reducing_switches=("switch",))
    result = simulate(COLLECTIVES[name].function, size_only(2, 64), topology)
    trace = chrome_trace(result)
    check_format(trace)
    sends = {e.message for e in result.trace if e.kind == "send"}
    assert {hop.message for hop in result.hops} <= sends
    link_slices = [e for e in trace["traceEvents"] if e.get("cat") == "link"]
    assert len(link_slices) == len(result.hops) > result.messages


def test_simulate_writes_the_trace_to_a_file_or_stream(tmp_path) -> None:
    path = tmp_path / "run.json"
    result = simulate(ring_allreduce, size_only(3, 30), fully_connected(3, 1e9, 1e-6),
                      trace=path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(chrome_trace(result)))
    stream = io.StringIO()
    simulate(ring_allreduce, size_only(3, 30), fully_connected(3, 1e9, 1e-6), trace=stream)
    assert json.loads(stream.getvalue())["traceEvents"]


def test_a_trace_needs_a_recorded_run() -> None:
    with pytest.raises(ValueError, match="record=True"):
        simulate(ring_allreduce, size_only(2, 10), ring(2, 1e9, 0.0), record=False,
                 trace=io.StringIO())
    result = simulate(ring_allreduce, size_only(2, 10), ring(2, 1e9, 0.0), record=False)
    with pytest.raises(ValueError, match="record=True"):
        chrome_trace(result)


def test_timeline_rows_are_ranks_then_busy_links() -> None:
    plots = pytest.importorskip("simcomm.plots")
    result = simulate(ring_allreduce, size_only(3, 300), ring(3, 1e9, 1e-6, 1e10))
    figure = plots.timeline_figure(result, "ring")
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[:6] == ["rank 0 sends", "rank 0 memory", "rank 1 sends", "rank 1 memory",
                          "rank 2 sends", "rank 2 memory"]
    assert set(labels[6:]) == {"gpu0 -> gpu1", "gpu1 -> gpu2", "gpu2 -> gpu0"}  # link order
    legend = {t.get_text() for t in figure.legends[0].get_texts()}
    assert legend == {"reduce-scatter", "all-gather", "local reduce"}


def test_bench_writes_a_trace_and_a_timeline_of_the_largest_size(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    code = main(["bench", "--algorithm", "ring_allreduce", "--ranks", "4", "--topology", "ring",
                 "--bandwidth", "100GB/s", "--latency", "5us", "--sizes", "1KiB,1MiB",
                 "--trace", str(trace), "--timeline", str(png), "--format", "csv"])
    assert code == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong"
    assert f"trace of the largest size, 1048576 B: {trace}" in err
    data = json.loads(trace.read_text())
    check_format(data)
    sends = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "link"]
    assert len(sends) == 2 * 4 * 3  # ring: 2(p-1) messages per rank, one link each
    assert {e["args"]["bytes"] for e in sends} == {1048576 // 4}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("matplotlib.image").imread(png)
    assert image.shape[0] > 200 and len(np.unique(image.reshape(-1, image.shape[2]), axis=0)) > 3


def test_the_format_check_rejects_overlaps_and_unpaired_flows() -> None:
    def x(ts: float, dur: float) -> dict[str, Any]:
        return {"ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 0, "cat": "comm"}

    check_format({"traceEvents": [x(0, 10), x(2, 3), x(10, 1)]})  # nested, then adjacent
    with pytest.raises(AssertionError, match="overlaps"):
        check_format({"traceEvents": [x(0, 10), x(5, 10)]})
    start = {"ph": "s", "id": 1, "ts": 0, "pid": 0, "tid": 0, "cat": "comm"}
    with pytest.raises(AssertionError):
        check_format({"traceEvents": [x(0, 10), start]})
