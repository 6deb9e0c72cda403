"""Results as data: a ``SimResult`` or bench rows as plain dicts, records and summaries.

Everything here returns built-in types (dicts, lists, str, int, float, None), so it goes
straight to ``json.dumps`` or ``pandas.DataFrame(records)``:

* ``result_to_dict(result)``: the whole run, JSON-ready. Per-rank results are summarised
  (kind, dtype, length, min, max) rather than dumped, unless ``arrays=True``; the trace is
  left out unless ``trace=True``.
* ``trace_records``, ``link_records``, ``rank_records``, ``bench_records``: one dict per trace
  event, link, rank or bench row.
* ``link_usage`` and ``busiest_links``: per-link bytes, busy time and utilization (busy time
  / the run's time).
* ``rank_activity``: per rank, how long it computed, had a message in flight, reduced or
  copied locally, and sat idle.
* ``format_summary(result)``: the busiest links and the ranks' activity as text.

What "busy" means for a rank, with the intervals taken from the trace (so the run must be
simulated with ``record=True``):

* ``compute``: its ``Compute`` spans;
* ``comm``: time with at least one message of the rank in flight, sent or received (a
  message is in flight from its send to its arrival);
* ``memory``: its local reductions, copies and divisions;
* ``busy``: time in any of the three (they may overlap, so ``busy`` is at most their sum);
  ``idle = time - busy``, up to the end of the whole run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from algorithms.harness.bench import BenchRow
from simcomm.buffers import SizeOnly
from simcomm.critical_path import critical_path
from simcomm.results import SimResult, TraceEvent
from simcomm.units import format_bytes

_MEMORY_KINDS = ("reduce", "copy", "divide")


@dataclass(frozen=True)
class LinkUsage:
    """Traffic of one link over a run; ``utilization`` is ``busy_time`` / the run's time."""

    index: int  # position in the topology's links
    src: str
    dst: str
    bandwidth: float  # bytes/second
    latency: float  # seconds
    bytes: int
    busy_time: float  # seconds
    utilization: float  # 0 to 1


@dataclass(frozen=True)
class RankActivity:
    """How one rank spent the run, in seconds (see the module doc for the definitions)."""

    rank: int
    finish_time: float
    compute: float
    comm: float
    memory: float
    busy: float
    idle: float


def link_usage(result: SimResult) -> list[LinkUsage]:
    """Every link's traffic, in the topology's link order."""
    usage = []
    for i, stats in enumerate(result.links):
        share = stats.busy_time / result.time if result.time > 0 else 0.0
        usage.append(LinkUsage(i, stats.link.src, stats.link.dst, stats.link.bandwidth,
                               stats.link.latency, stats.bytes, stats.busy_time, share))
    return usage


def busiest_links(result: SimResult, top: int = 5) -> list[LinkUsage]:
    """The ``top`` links with the most busy time, busiest first (ties in link order);
    links that carried nothing are left out."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    used = [u for u in link_usage(result) if u.bytes > 0]
    used.sort(key=lambda u: (-u.busy_time, u.index))
    return used[:top]


def rank_activity(result: SimResult) -> list[RankActivity]:
    """Each rank's compute, comm, memory, busy and idle time over ``[0, result.time]``.

    Raises ``ValueError`` if the run sent messages but recorded no trace.
    """
    if not result.trace and result.messages > 0:
        raise ValueError("rank activity needs the op trace: simulate with record=True")
    size = len(result.finish_times)
    spans: dict[str, list[list[tuple[float, float]]]] = {
        kind: [[] for _ in range(size)] for kind in ("compute", "comm", "memory")}
    for event in result.trace:
        if event.kind == "send":
            spans["comm"][event.rank].append((event.start, event.end))
            spans["comm"][event.peer].append((event.start, event.end))
        elif event.kind == "compute":
            spans["compute"][event.rank].append((event.start, event.end))
        elif event.kind in _MEMORY_KINDS:
            spans["memory"][event.rank].append((event.start, event.end))
    activity = []
    for rank in range(size):
        compute, comm, memory = (spans[kind][rank] for kind in ("compute", "comm", "memory"))
        busy = covered_time(compute + comm + memory)
        activity.append(RankActivity(rank, result.finish_times[rank], covered_time(compute),
                                     covered_time(comm), covered_time(memory), busy,
                                     max(0.0, result.time - busy)))
    return activity


def covered_time(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of the intervals (seconds covered by at least one)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


# -- records -------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A JSON-ready stand-in for a channel or label: itself if plain, else its repr."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def trace_records(result: SimResult) -> list[dict[str, Any]]:
    """One dict per trace event (the ``TraceEvent`` fields plus ``duration``)."""
    return [_event_record(event) for event in result.trace]


def _event_record(event: TraceEvent) -> dict[str, Any]:
    record = event._asdict()
    record["channel"] = _plain(event.channel)
    record["duration"] = event.end - event.start
    return record


def link_records(result: SimResult) -> list[dict[str, Any]]:
    """One dict per link, in link order (the ``LinkUsage`` fields)."""
    return [asdict(u) for u in link_usage(result)]


def rank_records(result: SimResult) -> list[dict[str, Any]]:
    """One dict per rank (the ``RankActivity`` fields); needs a recorded trace."""
    return [asdict(a) for a in rank_activity(result)]


def bench_records(rows: Sequence[BenchRow]) -> list[dict[str, Any]]:
    """One dict per bench row, keyed by nccl-tests' columns (``wrong`` None if unchecked)."""
    return [asdict(row) for row in rows]


def buffer_summary(value: Any, arrays: bool = False) -> Any:
    """A rank's result as plain data: a dict describing a numpy array or size-only buffer
    (with the elements themselves under ``values`` when ``arrays``), None as None."""
    if isinstance(value, SizeOnly):
        return {"kind": "size-only", "dtype": str(value.dtype), "length": len(value),
                "nbytes": value.nbytes}
    if isinstance(value, np.ndarray):
        summary: dict[str, Any] = {"kind": "ndarray", "dtype": str(value.dtype),
                                   "length": int(value.size), "nbytes": int(value.nbytes),
                                   "min": None, "max": None}
        if value.size:
            summary["min"], summary["max"] = value.min().item(), value.max().item()
        if arrays:
            summary["values"] = value.tolist()
        return summary
    return _plain(value)


def result_to_dict(result: SimResult, *, arrays: bool = False, trace: bool = False
                   ) -> dict[str, Any]:
    """The run as plain data: time, messages, finish times, results (summarised unless
    ``arrays``), links with their usage, ranks' activity (None without a trace) and, with
    ``trace``, every trace event and every message's hops over links."""
    has_trace = bool(result.trace) or result.messages == 0
    data: dict[str, Any] = {
        "time": result.time,
        "messages": result.messages,
        "finish_times": list(result.finish_times),
        "results": [buffer_summary(r, arrays) for r in result.results],
        "links": link_records(result),
        "ranks": rank_records(result) if has_trace else None,
        "trace_events": len(result.trace),
    }
    if trace:
        data["trace"] = trace_records(result)
        data["hops"] = [hop._asdict() for hop in result.hops]
    return data


# -- text ----------------------------------------------------------------------------------

def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def format_summary(result: SimResult, top: int = 5, max_ranks: int = 16) -> str:
    """The busiest links, each rank's activity (times in microseconds) and the critical
    path (``simcomm.critical_path``) as text.

    Runs with more than ``max_ranks`` ranks show the minimum, mean and maximum over ranks
    instead of one line per rank.
    """
    lines = [f"run: {len(result.finish_times)} ranks, {_us(result.time)} us, "
             f"{result.messages} messages"]
    busiest = busiest_links(result, top)
    lines.append(f"busiest links ({len(busiest)} of {len(result.links)}; utilization = "
                 "busy time / run time):")
    width = max((len(u.src) + len(u.dst) + 4 for u in busiest), default=0)
    for u in busiest:
        lines.append(f"  {u.src + ' -> ' + u.dst:<{width}}  {format_bytes(u.bytes):>10}  "
                     f"busy {_us(u.busy_time):>10} us  {u.utilization:6.1%}")
    activity = rank_activity(result)
    lines.append("ranks (us; comm: a message of the rank in flight; memory: local "
                 "reductions and copies):")
    columns = ("compute", "comm", "memory", "busy", "idle")
    lines.append(f"  {'rank':>6}" + "".join(f"  {c:>10}" for c in columns))
    if len(activity) <= max_ranks:
        for a in activity:
            lines.append(f"  {a.rank:>6}" + "".join(f"  {_us(getattr(a, c)):>10}"
                                                  for c in columns))
    else:
        for label, pick in (("min", min), ("mean", lambda v: sum(v) / len(v)), ("max", max)):
            lines.append(f"  {label:>6}" + "".join(
                f"  {_us(pick([getattr(a, c) for a in activity])):>10}" for c in columns))
    if result.level == "message" and result.trace:
        lines.append(critical_path(result).format())
    return "\n".join(lines)
