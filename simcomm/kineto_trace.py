"""A simulated run as one trace file per rank, in the shape ``torch.profiler`` writes
(Kineto's JSON), for the tools that read a distributed job's traces that way, such as
Holistic Trace Analysis (HTA).

Each rank's file holds its GPU's work as kernels on two streams: its computation (``Compute``
ops, named by their labels) on stream 7, and its communication on stream 13, as NCCL kernels
(``ncclDevKernel_...``, the names HTA takes for communication). A communication kernel is a
span during which the rank has a message in flight or is waiting for one, reducing one, or
running a whole collective (``Sleep`` at the collective level): the spans of its sends,
receives and reductions, merged where they touch, as an NCCL kernel runs from its launch to
its last step. ``distributedInfo`` gives the rank and the world size, and a CPU annotation
``ProfilerStep#0`` spans the rank's run, as the profiler marks a training step. A training
step simulated at the collective level has the one rank that stands for all.

    write_kineto_traces(result, "traces/")  # traces/rank_0.json, traces/rank_1.json, ...
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from simcomm.files import replacing
from simcomm.results import SimResult, TraceEvent

COMPUTE_STREAM, COMM_STREAM = 7, 13  # the streams a PyTorch job usually shows
_US = 1e6  # trace times are microseconds
_COMMUNICATION = ("send", "recv", "reduce", "sleep")


def write_kineto_traces(result: SimResult, folder: str | os.PathLike[str]) -> list[Path]:
    """Write one Kineto-shaped trace per rank of ``result`` (which must have its op trace:
    ``simulate(record=True)``) into ``folder`` as ``rank_<r>.json``; return the paths."""
    ranks = len(result.finish_times)
    if ranks and not result.trace and result.time > 0:
        raise ValueError("the run has no op trace: simulate it with record=True")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        path = out / f"rank_{rank}.json"
        with replacing(path) as scratch, open(scratch, "w", encoding="utf-8") as stream:
            json.dump(rank_trace(result, rank), stream)
        paths.append(path)
    return paths


def rank_trace(result: SimResult, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s trace, as ``write_kineto_traces`` writes it."""
    events: list[dict[str, Any]] = []
    for event in result.trace:
        if event.rank == rank and event.kind == "compute" and event.end > event.start:
            events.append(_kernel(rank, COMPUTE_STREAM, event.label or "compute", event.start,
                                  event.end, len(events)))
    for start, end, label in _communication(result.trace, rank):
        events.append(_kernel(rank, COMM_STREAM, f"ncclDevKernel_{label}", start, end,
                              len(events)))
    # The profiler marks each training step on the CPU; the run is one step.
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": rank,
                   "tid": 1, "ts": 0.0, "dur": result.finish_times[rank] * _US,
                   "args": {"External id": len(events)}})
    return {"schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank,
                                "world_size": len(result.finish_times)},
            "deviceProperties": [{"id": rank, "name": "simulated GPU"}],
            "traceEvents": events}


def _communication(trace: list[TraceEvent], rank: int) -> list[tuple[float, float, str]]:
    """The rank's communication spans, merged where they touch or overlap, each named by
    the label of its first op (its spaces as underscores)."""
    spans = sorted((e.start, e.end, e.label or e.kind) for e in trace
                   if e.rank == rank and e.kind in _COMMUNICATION and e.end > e.start)
    merged: list[tuple[float, float, str]] = []
    for start, end, label in spans:
        if merged and start <= merged[-1][1]:
            first, last, name = merged[-1]
            merged[-1] = (first, max(last, end), name)
        else:
            merged.append((start, end, label.replace(" ", "_")))
    return merged


def _kernel(rank: int, stream: int, name: str, start: float, end: float, number: int
            ) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": stream,
            "ts": start * _US, "dur": (end - start) * _US,
            "args": {"device": rank, "stream": stream, "correlation": number,
                     "External id": number}}
