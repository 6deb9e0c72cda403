"""A run's op trace as a Chrome trace-event file, for Perfetto (ui.perfetto.dev) and
chrome://tracing.

What the file shows (timestamps and durations in microseconds of simulated time):

* a process per rank, ``rank R``, with a thread ``compute`` (its ``Compute`` spans), a thread
  ``memory`` (reductions, copies and divisions, one at a time), and per channel a thread of
  sends and one of receives. Slices on one thread must nest, and the messages of one rank
  overlap freely (a whole-buffer all-to-all has p-1 sends in flight at once), so overlapping
  spans spill into further lanes: ``ch 0 send``, ``ch 0 send #2``, ...
* a process ``links`` with a thread per link that carried anything: a slice per message, for
  the time the link spends putting it on the wire (n / bandwidth), and a counter per link of
  the bytes in flight on it (from the head entering the link to the tail reaching its end).
* a flow arrow from each send slice to the receive slice that matched it.
* per rank whose schedule accounts its memory (``Footprint`` ops, as FSDP's does), a
  counter ``memory`` of the bytes it holds.
* per spawned task (a DDP bucket's all-reduce, say), a slice on its channel's ``task``
  thread from its ``Spawn`` to its end, named after its generator (``ring_allreduce``).

Slices are named after the op's label (``reduce-scatter 3 -> 5``: step 3 of the
reduce-scatter, to rank 5); their args hold the peer, bytes, channel and message number.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import IO, Any

from simcomm.files import replacing
from simcomm.results import SimResult, TraceEvent

_US = 1e6  # trace-event timestamps are in microseconds
_COMPUTE_TID, _MEMORY_TID = 0, 1
_MEMORY_KINDS = ("reduce", "copy", "divide")


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace-event JSON object (``{"traceEvents": [...]}``) of a recorded run.

    Raises ``ValueError`` if the run sent messages but recorded no trace
    (``simulate(..., record=False)``).
    """
    if result.messages > 0 and not result.trace:
        raise ValueError("a timeline needs the op trace: simulate with record=True")
    events: list[dict[str, Any]] = []
    size = len(result.finish_times)
    links_pid = size
    for rank in range(size):
        events += _process(rank, f"rank {rank}")
    events += _process(links_pid, "links")
    threads = _RankThreads(events)
    send_slots: dict[int, tuple[int, int, float]] = {}  # message -> (pid, tid, ts)
    recv_slots: dict[int, tuple[int, int, float]] = {}
    spans = [e for e in result.trace if e.kind != "footprint"]
    for event, tid in threads.place(spans):
        events.append(_slice(event, tid))
        if event.kind == "send":
            send_slots[event.message] = (event.rank, tid, event.start * _US)
        elif event.kind == "recv":
            recv_slots[event.message] = (event.rank, tid, event.start * _US)
    for message, (pid, tid, ts) in send_slots.items():
        if message in recv_slots:
            events.append(_flow("s", message, pid, tid, ts))
            events.append(_flow("f", message, *recv_slots[message]))
    events += _link_events(result, links_pid)
    events += _memory_counters(result)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"simulated_time_s": result.time, "messages": result.messages}}


def write_chrome_trace(result: SimResult, destination: str | os.PathLike[str] | IO[str]
                       ) -> None:
    """Write ``chrome_trace(result)`` as JSON to a path or an open text file."""
    data = chrome_trace(result)
    if hasattr(destination, "write"):
        json.dump(data, destination)
        return
    with replacing(destination) as scratch, open(scratch, "w", encoding="utf-8") as stream:
        json.dump(data, stream)


def _process(pid: int, name: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
         "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
         "args": {"sort_index": pid}},
    ]


def _thread(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
         "args": {"name": name}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
         "args": {"sort_index": tid}},
    ]


def _channel_name(channel: Hashable) -> str:
    return str(channel) if isinstance(channel, (str, int)) else repr(channel)


class _RankThreads:
    """Gives each trace event a thread (tid) of its rank's process, such that the slices of
    one thread never overlap, and names each thread once, when first used."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.tids: dict[tuple[int, str], int] = {}  # (rank, thread name) -> tid
        self.next_tid: defaultdict[int, int] = defaultdict(lambda: _MEMORY_TID + 1)
        self.lane_ends: dict[tuple[int, Hashable, str], list[float]] = {}

    def place(self, trace: Iterable[TraceEvent]) -> list[tuple[TraceEvent, int]]:
        placed = []
        for event in sorted(trace, key=lambda e: (e.start, e.end)):
            if event.kind == "compute":
                name = "compute"
            elif event.kind in _MEMORY_KINDS:
                name = "memory"
            else:
                lane = self._lane(event)
                name = f"ch {_channel_name(event.channel)} {event.kind}"
                if lane:
                    name += f" #{lane + 1}"
            placed.append((event, self._tid(event.rank, name)))
        return placed

    def _lane(self, event: TraceEvent) -> int:
        # The first lane whose last span has ended by now: greedy interval colouring.
        ends = self.lane_ends.setdefault((event.rank, event.channel, event.kind), [])
        for lane, end in enumerate(ends):
            if end <= event.start:
                ends[lane] = event.end
                return lane
        ends.append(event.end)
        return len(ends) - 1

    def _tid(self, rank: int, name: str) -> int:
        tid = self.tids.get((rank, name))
        if tid is None:
            if name == "compute":
                tid = _COMPUTE_TID
            elif name == "memory":
                tid = _MEMORY_TID
            else:
                tid = self.next_tid[rank]
                self.next_tid[rank] += 1
            self.tids[rank, name] = tid
            self.events += _thread(rank, tid, name)
        return tid


def _slice_name(event: TraceEvent) -> str:
    label = event.label or event.kind
    if event.kind == "send":
        return f"{label} -> {event.peer}"
    if event.kind == "recv":
        return f"{label} <- {event.peer}"
    if event.kind == "reduce":
        return f"reduce {label} <- {event.peer}" if event.label else f"reduce <- {event.peer}"
    return label


def _slice(event: TraceEvent, tid: int) -> dict[str, Any]:
    start, end = event.start * _US, event.end * _US
    args: dict[str, Any] = {"bytes": event.nbytes}
    if event.kind != "compute":
        args["channel"] = _channel_name(event.channel)
    if event.peer >= 0:
        args["peer"] = event.peer
    if event.message >= 0:
        args["message"] = event.message
    category = {"compute": "compute", "task": "task"}.get(
        event.kind, "memory" if event.kind in _MEMORY_KINDS else "comm")
    return {"ph": "X", "name": _slice_name(event), "cat": category, "pid": event.rank,
            "tid": tid, "ts": start, "dur": end - start, "args": args}


def _flow(phase: str, message: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    flow = {"ph": phase, "name": "message", "cat": "comm", "id": message, "pid": pid,
            "tid": tid, "ts": ts}
    if phase == "f":
        flow["bp"] = "e"  # bind to the receive slice that encloses ts, not the next one
    return flow


def _link_events(result: SimResult, pid: int) -> list[dict[str, Any]]:
    sends = {e.message: e for e in result.trace if e.kind == "send"}
    hops_by_link: defaultdict[int, list] = defaultdict(list)
    for hop in result.hops:
        hops_by_link[hop.link].append(hop)
    events: list[dict[str, Any]] = []
    for tid, index in enumerate(sorted(hops_by_link)):
        link = result.links[index].link
        name = f"{link.src} -> {link.dst}"
        events += _thread(pid, tid, name)
        changes: defaultdict[float, int] = defaultdict(int)  # time -> change of bytes in flight
        for hop in hops_by_link[index]:
            send = sends[hop.message]
            label = send.label or "send"
            start, end = hop.start * _US, hop.end * _US
            events.append({
                "ph": "X", "name": f"{label} {send.rank}->{send.peer}", "cat": "link",
                "pid": pid, "tid": tid, "ts": start, "dur": end - start,
                "args": {"bytes": send.nbytes, "message": hop.message, "from": send.rank,
                         "to": send.peer}})
            changes[hop.start] += send.nbytes
            changes[hop.end + link.latency] -= send.nbytes
        in_flight = 0
        for time in sorted(changes):
            in_flight += changes[time]
            events.append({"ph": "C", "name": f"bytes in flight {name}", "pid": pid,
                           "tid": tid, "ts": time * _US, "args": {"bytes": in_flight}})
    return events


def _memory_counters(result: SimResult) -> list[dict[str, Any]]:
    held: defaultdict[int, int] = defaultdict(int)
    events = []
    for e in result.trace:  # footprint events are recorded in time order
        if e.kind == "footprint":
            held[e.rank] += e.nbytes
            events.append({"ph": "C", "name": "memory", "pid": e.rank, "tid": 0,
                           "ts": e.start * _US, "args": {"bytes": held[e.rank]}})
    return events
