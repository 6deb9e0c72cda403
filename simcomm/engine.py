"""The simulator: a thin interpreter of the ops on a simpy clock.

Cost model (alpha-beta with contention):

* A message of n bytes follows its route link by link, cut-through: its head enters link k
  when it has crossed link k-1 and link k is free, and goes on at once; the message occupies
  the link for gap + n / bandwidth seconds (``gap`` is 0 unless a link says otherwise),
  ending no earlier than its tail arrives from upstream; the tail reaches the far end
  ``latency`` seconds after it leaves. Uncontended, a message of gap-free links costs the
  sum of its links' latencies plus n / (slowest bandwidth), wherever on the route the
  slowest link is.
* A link carries one message at a time, first come first served in the order the messages'
  heads reach it (at the same instant: in send order). A message that waits upstream takes
  its turn downstream when it gets there, so it holds no link it has not reached.
* A send completes once its message has arrived and the peer has posted the matching
  receive (rendezvous, as gloo's and NCCL's sends do). The data leave when the send is
  posted, so a receive posted before they arrive costs nothing extra; one posted later
  finds them waiting at the receiver. An algorithm that waits on a send before posting the
  receive its peer waits for deadlocks here as it hangs on real hardware. ``eager_limit``
  lets sends of at most that many bytes complete on arrival instead (MPI's eager protocol).
* A Send's ``protocol`` (``algorithms.Protocol``) sets its costs: each link's latency under
  that protocol (``Link.latency_of``) and the share of the wire that carries data
  (``WIRE_EFFICIENCY``: LL's lines are half flags). A ``Launch`` holds its task for the
  topology's launch latency under its protocol.
* Where the topology limits what a GPU's kernels move (``Topology.injection_bandwidth``,
  under LL ``Topology.ll_bandwidth``, under LL128 ``Topology.ll128_bandwidth``), a message
  first crosses its channel's pipe on its sender (a task spawned with ``shares_rate``: its
  spawner's channel's): a link with no latency and an even share
  of that rate among the channels of the rank's latest ``Launch`` (under LL128 at most
  ``Topology.ll128_channel_bandwidth``); a message of NCCL's tree under Simple then crosses
  a pipe of its channel's stream to that peer, at ``Topology.tree_channel_bandwidth``; after
  a ``Launch`` of a ring (or of the hierarchical all-reduce, whose rings span nodes), a
  message to a peer on another node crosses a pipe of its channel's connection to that peer,
  at ``Topology.net_channel_bandwidth``, and under Simple one more, which holds each message
  ``Topology.net_message_gap`` besides its bytes at ``Topology.net_message_bandwidth``;
  after a ``Launch`` of NVLS-tree, a message to another node crosses a pipe of its sender's,
  shared by all its channels, at ``Topology.tree_network_share`` of its way's slowest link;
  and under Simple its channel's pipe holds it ``Topology.ring_slice_gap`` longer than its
  bytes take. NCCL runs each channel on its own SMs, side by side, so a channel's steps pay
  their latency and their bytes one after the other, and the channels together reach the
  GPU's rate.
* In a switch that reduces and multicasts (``Topology.reducing_switches``, NVLink SHARP), a
  ``Multicast`` crosses the links up to the switch once, then a copy goes on to every peer
  and one back to the sender; a ``RecvReduce`` pulls its contributions (``Send`` with
  ``in_switch``) when it and all of them are posted: each crosses its links up to the
  switch, the receiver's own contribution too, and once every head is there the sum goes
  on down to the receiver, cut-through as any message, with no reduction charged to the
  receiver's memory. Both move at ``Topology.switch_efficiency`` of their links'
  bandwidth (after a Launch of NVLS-tree at ``Topology.tree_switch_efficiency``), under
  Simple's latencies, and wait ``Topology.switch_latency`` in the switch.
  Elsewhere they are plain sends and reducing receives (an ``in_switch`` send then leaves
  when its receive is posted, pulled).
* A reducing receive, a ``Combine``, a ``Copy`` and a ``Divide`` of n bytes take
  n / reduce_bandwidth seconds on the rank's memory, one at a time. ``Compute`` runs on
  the rank's compute stream, one at a time, concurrently with communication, for its
  seconds over the rank's ``Topology.compute_speed``.

Data move when a handle is waited (see ``algorithms.ops``); a send's data is taken when it
is posted, and waiting checks that the algorithm left the send buffer untouched meanwhile.
Likewise a receive's buffer must be left alone from the Recv until its Wait: with data, the
Wait checks that it holds what it held when the Recv was posted (a write meanwhile would race
the data landing on hardware), besides what the landings of earlier receives put there.
"""

from __future__ import annotations

import gc
import math
import os
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import simpy

from algorithms.ops import (
    Alloc, Combine, Comm, Compute, Copy, Divide, Footprint, Launch, Multicast, Protocol, Recv,
    RecvReduce, ReduceOp, Send, Sleep, TUNER_SHAPE, Tuner, Wait, check_callback,
)
from algorithms.protocol import (
    BLOCKED, MAIN_CHANNEL, DeadlockError, Handle, InFlight, Interpreter, MessageSizeError,
    ProtocolError, RunLimitError, Span, Task, UnreceivedMessageError, elements,
)
from algorithms import reference
from simcomm.buffers import SizeOnly, check_dtype
from simcomm.chrome_trace import write_chrome_trace
from simcomm.collective_level import (
    AUTO_MESSAGE_LIMIT, choose_level, has_collective_model, run_collective_level,
)
from simcomm.results import Hop, SimResult, TraceEvent, link_stats
from simcomm.topology import WIRE_EFFICIENCY, Topology, check_ranks
from simcomm.tuning import ModelTuner
from simcomm.variation import Variation

# The clock counts whole zeptoseconds (1e-21 s): each duration is rounded to a tick once,
# and sums of ticks are exact in any order. In float seconds two messages that should reach
# a link at one instant could differ by an ulp and be served in the wrong order, so that a
# run's time did not scale with 1 / bandwidth. Rounding costs at most 0.5e-21 s a term.
TICKS_PER_SECOND = 10**21
_NEVER = -(10**40)  # the tail of a message that has crossed no link yet, in ticks
# Ops of all ranks together that a run may take by default: about 50 times a ring
# all-reduce on 1,024 ranks (6.3 million ops), some minutes of simulation; past it, an
# algorithm that never ends is the likelier cause.
DEFAULT_MAX_OPS = 300_000_000
# How many stuck tasks, handles of a task or messages an error names before it counts the
# rest: a deadlock of thousands of ranks still reads in a few lines.
_LISTED = 5
_SIMPLE = Protocol.SIMPLE
PROGRESS_EVERY = 4096  # messages between two calls of simulate's progress


@dataclass(frozen=True)
class Jitter:
    """Seeded random delays that make a run take other orders: each message leaves, and
    each ``Compute`` ends, up to ``max_delay`` seconds late, drawn from ``seed``. For
    property tests (``simcomm.testing`` draws them), not for costs."""

    seed: int
    max_delay: float  # seconds

    def __post_init__(self) -> None:
        if type(self.seed) is not int or self.seed < 0:
            raise ValueError(f"Jitter.seed must be an int >= 0, got {self.seed!r}")
        if not (isinstance(self.max_delay, (int, float)) and not isinstance(self.max_delay, bool)
                and math.isfinite(self.max_delay) and self.max_delay >= 0):
            raise ValueError(f"Jitter.max_delay must be finite seconds >= 0, got "
                             f"{self.max_delay!r}")


class _Handle(Handle):
    """A Send's or a Recv's handle, with what the simulator tracks of it.

    A Send's handle is also the message it sent: ``done`` means it has arrived, and ``recv``
    is the receive that matched it. A Recv's handle never points back at its message; it
    copies what Wait needs (the data) when matched. With no reference cycle per message,
    refcounting frees both once they are done; with one, the cyclic garbage collector ran
    hundreds of times per 100k messages and took about a third of a large run.
    """

    __slots__ = ("nbytes", "data", "recv", "matched", "arrived", "posted",
                 "message", "route", "hop", "tail", "trace_index", "in_switch", "group",
                 "snapshot")

    def __init__(self, task: _Task, is_send: bool, peer: int, buf: Any,
                 reduce: ReduceOp | None, posted: float, label: str) -> None:
        # Handle's fields, set here rather than by super().__init__: this runs twice per
        # message, and the extra call cost the simulator 4% of its speed. The span is
        # None (no memory to guard) until a run with data sets it.
        self.task, self.is_send, self.peer, self.buf, self.reduce = (
            task, is_send, peer, buf, reduce)
        self.label, self.waited, self.span, self.seq = label, False, None, 0
        task.outstanding[self] = None
        self.message = -1  # a Send's number; a Recv's is its matching Send's
        # Only a Send sets nbytes, route (link, ticks per byte, latency, gap), hop (the next
        # link its head enters), tail (when its tail reached the end of the last link
        # crossed) and trace_index (its place in the trace, or -1). Only a Recv of a run
        # with data sets snapshot: what its buffer must still hold when its data land.
        self.data: np.ndarray | None = None  # the message's data; None for size-only runs
        self.recv: _Handle | None = None
        self.matched = False
        self.done = self.arrived = False  # done: Handle's
        self.posted = posted
        # A Send's in_switch; a Recv's RecvReduce (a _Reduction), if it is one's receive.
        self.in_switch = False
        self.group: _Reduction | None = None

    def describe(self) -> str:
        if self.is_send:
            state = "received" if self.recv is not None else "its Recv was never posted"
        else:
            state = "matched" if self.matched else "no matching Send was posted"
        return f"{super().describe()[:-1]}; {state})"


Route = tuple[tuple[int, float, int, int], ...]  # per link: index, ticks per byte, latency, gap


class _Leg:
    """Traffic of an in-switch op that no one send owns: a multicast's way up to the switch,
    a contribution's way up, the sum's way down, or the switch's copy back to the sender.
    Its hops are recorded under ``message``, a send of the same op, so traces draw them.
    ``then(leg)`` runs when its head has crossed its last link (cut-through: the tail may
    still be on the way, ``tail`` says when it arrives)."""

    __slots__ = ("nbytes", "route", "hop", "tail", "message", "then")

    def __init__(self, nbytes: int, route: Route, message: int,
                 then: Callable[[_Leg], None] | None, tail: int = -(10**40)) -> None:
        self.nbytes, self.route, self.message, self.then = nbytes, route, message, then
        self.hop, self.tail = 0, tail


class _Reduction:
    """A ``RecvReduce``: how a switch sums it (if one does), the sends matched to its
    receives, and its legs' progress."""

    __slots__ = ("sends", "plan", "legs_left", "tail")

    def __init__(self, plan: tuple[dict[int, Route], Route, Route] | None) -> None:
        self.sends: list[_Handle] = []
        self.plan = plan  # peer -> way up, own way up, way down; None: no switch sums it
        self.legs_left = 0
        self.tail = -(10**40)


class _Task(Task):
    __slots__ = ("main", "pending", "wait_handles", "started")

    def __init__(self, rank: int, channel: Hashable, gen: Any, started: float) -> None:
        super().__init__(rank, channel, gen)
        self.main = False  # a rank's main task: its result is the rank's
        self.started = started
        self.pending = 0
        self.wait_handles: tuple[_Handle, ...] | None = None


class _Simulation(Interpreter):
    buffer_kinds = (np.ndarray, SizeOnly)
    buffer_advice = "give a numpy array (or a SizeOnly)"

    def buffer_fits(self, buf: Any) -> bool:
        return _fit(buf)

    def __init__(self, topology: Topology, record: bool, has_data: bool, eager_limit: int,
                 max_ops: float, jitter: Jitter | None, variation: Variation | None,
                 progress: Callable[[int], None] | None = None) -> None:
        super().__init__(topology.size, max_ops)
        self.progress = progress  # told of every PROGRESS_EVERY messages sent
        self.eager_limit = eager_limit  # sends of at most this many bytes need no Recv
        self.jitter = jitter
        self.jitter_rng = None if jitter is None else np.random.default_rng(jitter.seed)
        self.variation_rng = None if variation is None else np.random.default_rng(variation.seed)
        self.message_delay = None if variation is None else variation.message_delay
        self.compute_factor = None if variation is None else variation.compute_factor
        self.message_slowdown = None if variation is None else variation.message_slowdown
        self.departs_late = (jitter is not None or self.message_delay is not None
                             or self.message_slowdown is not None)
        self.env = simpy.Environment()
        self.has_data = has_data  # numpy buffers; size-only runs move no data
        # Per rank, with data only: its receives whose data have not landed yet, waited or
        # not, by memory (see _land).
        self.unlanded: dict[int, InFlight] = {}
        # Handles that a task waits on which another task of its rank posted, and the task
        # that waits on each (a tree's down stream waits on its up stream's sends).
        self.waiters: dict[_Handle, _Task] = {}
        self.topology = topology
        self.record = record
        self.links = topology.links
        # The topology's links, then the channels' pipes as they are used (see the module doc).
        self.link_free = [0] * len(self.links)
        self.link_bytes = [0] * len(self.links)
        self.link_busy = [0] * len(self.links)  # ticks
        # Whether a channel's rate is limited under some protocol (Topology.channel_rate).
        self.piped = (any(math.isfinite(topology.channel_rate(protocol, 1))
                          for protocol in Protocol)
                      or math.isfinite(topology.tree_channel_bandwidth)
                      or math.isfinite(topology.net_channel_bandwidth)
                      or topology.tree_network_share() < 1
                      or topology.ring_slice_gap > 0 or topology.net_message_gap > 0
                      or math.isfinite(topology.net_message_bandwidth))
        self.share = [1] * self.size  # channels of each rank's latest Launch
        self.ranks_per_node = topology.ranks_per_node
        self.piped_routes: dict[tuple[int, int, Hashable, int, Protocol], Route] = {}
        self.pipes: dict[tuple[Hashable, ...], int] = {}
        # Per protocol, src * size + dst -> per link of the route: (index, ticks per byte,
        # latency, gap). Simple's table is looked up without the protocol: hashing an enum
        # member is a Python call, a tenth of a microsecond on every message.
        self.simple_routes: dict[int, Route] = {}
        self.routes = {Protocol.SIMPLE: self.simple_routes, Protocol.LL: {}, Protocol.LL128: {}}
        # The same tables for NCCL's tree, whose hops have latencies of their own; each
        # rank's latest Launch picks the tables its sends look up (set once per collective).
        self.tree_routes = {protocol: {} for protocol in Protocol}
        self.tree_piped_routes: dict[tuple[int, int, Hashable, int, Protocol], Route] = {}
        # And for a ring's (the hierarchical all-reduce's too), whose messages between
        # nodes cross a pipe of their own.
        self.ring_piped_routes: dict[tuple[int, int, Hashable, int, Protocol], Route] = {}
        # And for NVLS-tree's, whose sends between nodes share a pipe per rank.
        self.nvls_tree_piped_routes: dict[tuple[int, int, Hashable, int, Protocol], Route] = {}
        self.simple_routes_of = [self.simple_routes] * self.size
        self.routes_of = [self.routes] * self.size
        self.piped_routes_of = [self.piped_routes] * self.size
        self.memory_free = [0] * self.size  # ticks
        self.compute_speed = [topology.speed_of(rank) for rank in range(self.size)]
        self.compute_free = [0] * self.size
        self.memory_per_byte = [TICKS_PER_SECOND / bandwidth
                                for bandwidth in topology.reduce_bandwidth]
        # (src, dst, channel) -> (sends waiting for a Recv, Recvs waiting for a Send)
        self.queues: defaultdict[tuple[int, int, Hashable], tuple[deque, deque]] = (
            defaultdict(lambda: (deque(), deque())))
        self.tasks: list[_Task] = []
        self.results: list[Any] = [None] * self.size
        self.finish_times = [math.nan] * self.size
        self.trace: list[TraceEvent] = []
        self.hops: list[Hop] = []
        self.messages = 0
        self.launches: list[Launch] = []
        self.reducing = frozenset(topology.reducing_switches)
        # Bytes/s of an in-switch pipeline once full, under NVLS and NVLS-tree (True),
        # found at the first fill; whether each rank's latest Launch is NVLS-tree's.
        self.in_switch_pace: dict[bool, float] = {}
        self.nvls_tree = [False] * self.size
        self.plans: dict[tuple[int, tuple[int, ...], bool, bool], Any] = {}

    # -- tasks -------------------------------------------------------------------------

    def new_task(self, rank: int, channel: Hashable, gen: Any) -> _Task:
        task = _Task(rank, channel, gen, self.env.now)
        self.tasks.append(task)
        return task

    def start_main(self, rank: int, gen: Any) -> None:
        task = self.open_task(rank, gen, MAIN_CHANNEL)
        task.main = True
        self.step(task, None)

    def resume(self, task: Task, value: Any) -> None:
        self.step(task, value)

    def run_child_first(self, task: Task, child: Task) -> Any:
        self.step(child, None)
        return child

    def where(self, task: Task) -> str:
        return f"{super().where(task)} at t={self.env.now / TICKS_PER_SECOND:.9g}s"

    def on_finish(self, task: _Task) -> None:
        if self.record and not task.main:
            self.trace.append(TraceEvent("task", task.rank, task.channel,
                                         task.started / TICKS_PER_SECOND,
                                         self.env.now / TICKS_PER_SECOND,
                                         label=getattr(task.gen, "__name__", "")))
        if task.main:
            self.results[task.rank] = task.result
            self.finish_times[task.rank] = self.env.now / TICKS_PER_SECOND

    # -- point to point ------------------------------------------------------------------

    def send(self, task: _Task, op: Send, branch: bool = False) -> _Handle:
        src, dst, now, buf = task.rank, op.peer, self.env.now, op.buf
        if dst >= self.size or dst == src:  # Send itself checked that dst >= 0
            self.check_peer(task, dst, "Send")
        if not _fit(buf):
            self.check_buffer(task, "Send", buf, dst)
        h = _Handle(task, True, dst, buf, None, now, op.label)
        if self.has_data:
            h.span = _span(buf)
            self.guard(h)
            # The data leave when the Send is posted; Wait checks the buffer was left alone.
            h.data = buf.copy()
        h.nbytes = buf.nbytes
        h.message = message = self.messages
        self.messages = message + 1
        if self.progress is not None and not self.messages % PROGRESS_EVERY:
            self.progress(PROGRESS_EVERY)
        h.trace_index = -1
        if self.record:  # its end is filled in when it arrives
            h.trace_index = len(self.trace)
            self.trace.append(TraceEvent("send", src, task.channel, now / TICKS_PER_SECOND,
                                         math.nan, dst, h.nbytes, op.label, message))
        protocol = op.protocol
        routes = (self.simple_routes_of[src] if protocol is _SIMPLE
                  else self.routes_of[src][protocol])
        key = src * self.size + dst  # an int hashes quicker than a (src, dst) tuple
        route = routes.get(key)
        if route is None:
            in_tree = self.routes_of[src] is self.tree_routes
            route = routes[key] = self._route(src, dst, protocol, in_tree)
        if self.piped:
            route = self._through_pipe(src, dst, task.rate_channel, protocol, route)
        h.route, h.hop, h.tail = route, 0, _NEVER
        if op.in_switch:  # pulled by its RecvReduce: it leaves when that is posted
            h.in_switch = True
        elif not branch:  # a multicast's branch leaves from the switch
            if self.departs_late:
                self._leave(h)
            else:
                self._cross(h, now)
        sends, recvs = self.queues[src, dst, task.channel]
        if recvs:
            self._pair(h, recvs.popleft())
        else:
            sends.append(h)
        return h

    def _leave(self, h: _Handle) -> None:
        if not self.departs_late:
            self._cross(h, self.env.now)
            return
        # It leaves a little late; _on_hop puts it on its first link then.
        delay = 0.0
        if self.jitter is not None:
            delay += self.jitter_rng.uniform(0.0, self.jitter.max_delay)
        if self.message_delay is not None:
            delay += self.message_delay.draw(self.variation_rng)
        if self.message_slowdown is not None:  # its own route, each byte slower on every link
            factor = self.message_slowdown.draw(self.variation_rng)
            h.route = tuple((i, per_byte * factor, latency, gap)
                            for i, per_byte, latency, gap in h.route)
        self.env.timeout(_ticks(delay), h).callbacks.append(self._on_hop)

    def _route(self, src: int, dst: int, protocol: Protocol, in_tree: bool) -> Route:
        per_data_byte = TICKS_PER_SECOND / WIRE_EFFICIENCY[protocol]
        algorithm = "tree" if in_tree else ""
        return tuple((i, per_data_byte / self.links[i].bandwidth,
                      _ticks(self.links[i].latency_of(protocol, algorithm)),
                      _ticks(self.links[i].gap))
                     for i in self.topology.route(src, dst))

    def _through_pipe(self, src: int, dst: int, channel: Hashable, protocol: Protocol,
                      route: Route) -> Route:
        # One pipe per (rank, channel), whatever the peer and the protocol; on NCCL's tree
        # under Simple another per peer besides, at the tree's own ceiling, and on a ring
        # another per peer on another node, at the network's ceiling per channel (under
        # Simple a third, which holds each message a gap besides its bytes); under
        # NVLS-tree one per rank for its sends to other nodes, at the tree's share of its
        # way; under Simple a ring's channel holds each slice a gap longer.
        share = self.share[src]
        key = (src, dst, channel, share, protocol)
        piped_routes = self.piped_routes_of[src]
        piped = piped_routes.get(key)
        if piped is None:
            piped = route
            crosses = src // self.ranks_per_node != dst // self.ranks_per_node
            if piped_routes is self.tree_piped_routes and protocol is _SIMPLE:
                piped = self._piped(piped, (src, channel, dst),
                                    self.topology.tree_channel_bandwidth)
            elif piped_routes is self.ring_piped_routes and crosses:
                piped = self._piped(piped, (src, channel, dst, "net"),
                                    self.topology.net_channel_bandwidth)
                if protocol is _SIMPLE:
                    piped = self._piped(piped, (src, channel, dst, "net message"),
                                        self.topology.net_message_bandwidth,
                                        self.topology.net_message_gap)
            elif (piped_routes is self.nvls_tree_piped_routes and crosses
                  and self.topology.tree_network_share() < 1):
                slowest = min(self.links[i].bandwidth for i, *_ in route)
                piped = self._piped(piped, (src, "nvls tree net"),
                                    self.topology.tree_network_share() * slowest)
            gap = (self.topology.ring_slice_gap
                   if piped_routes is self.ring_piped_routes and protocol is _SIMPLE else 0.0)
            piped = self._piped(piped, (src, channel),
                                self.topology.channel_rate(protocol, share), gap)
            piped_routes[key] = piped
        return piped

    def _piped(self, route: Route, name: tuple[Hashable, ...], rate: float,
               gap: float = 0.0) -> Route:
        # ``route`` behind the pipe ``name``, a link with no latency that moves ``rate``
        # bytes a second and holds each message ``gap`` seconds besides; the route alone
        # where the pipe costs nothing.
        if math.isinf(rate) and not gap:
            return route
        pipe = self.pipes.get(name)
        if pipe is None:
            pipe = self.pipes[name] = len(self.link_free)
            for per_link in (self.link_free, self.link_bytes, self.link_busy):
                per_link.append(0)
        return ((pipe, TICKS_PER_SECOND / rate, 0, _ticks(gap)), *route)

    def _cross(self, h: _Handle, head: int) -> None:
        # The message's head reaches the next link of its route now. The link serves heads in
        # the order they reach it; the head goes on as soon as the link is free (cut-through),
        # but the message cannot finish crossing before its tail has come from upstream.
        hop, nbytes, free = h.hop, h.nbytes, self.link_free
        i, per_byte, latency, gap = h.route[hop]
        occupancy = gap + round(nbytes * per_byte)
        enter = free[i] if free[i] > head else head
        start = h.tail - occupancy  # conditionals, not max(): this runs once per link crossed
        if start < enter:
            start = enter
        end = free[i] = start + occupancy
        self.link_busy[i] += occupancy
        self.link_bytes[i] += nbytes
        if self.record and i < len(self.links):  # not the channels' pipes
            self.hops.append(Hop(i, h.message, start / TICKS_PER_SECOND,
                                 end / TICKS_PER_SECOND))
        h.hop = hop = hop + 1
        h.tail = tail = end + latency
        if hop == len(h.route):
            if h.__class__ is _Leg:
                self.env.timeout(enter + latency - head, h).callbacks.append(self._on_leg_end)
            else:
                self.env.timeout(tail - head, h).callbacks.append(self._on_arrival)
        else:
            self.env.timeout(enter + latency - head, h).callbacks.append(self._on_hop)

    def _on_hop(self, event: simpy.Event) -> None:
        self._cross(event.value, self.env.now)

    def recv(self, task: _Task, op: Recv, group: _Reduction | None = None) -> _Handle:
        src, dst = op.peer, task.rank
        if src >= self.size or src == dst:  # Recv itself checked that src >= 0
            self.check_peer(task, src, "Recv")
        if not _fit(op.buf):
            self.check_buffer(task, "Recv" if group is None else "RecvReduce", op.buf, src)
        h = _Handle(task, False, src, op.buf, op.reduce, self.env.now, op.label)
        if self.has_data:
            h.span = _span(op.buf)
            self.guard(h)
            # The buffer is the receive's until its data land at its Wait: it must then
            # still hold what it holds now (a write meanwhile races the data on hardware).
            h.snapshot = op.buf.copy()
            unlanded = self.unlanded.get(task.rank)
            if unlanded is None:
                unlanded = self.unlanded[task.rank] = InFlight()
            unlanded.add(h)
        h.group = group
        sends, recvs = self.queues[src, dst, task.channel]
        if sends:
            self._pair(sends.popleft(), h)
        else:
            recvs.append(h)
        return h

    def _pair(self, send: _Handle, recv: _Handle) -> None:
        src, dst, sent, buf = send.task.rank, recv.task.rank, send.buf, recv.buf
        # dtypes compared by identity first: a dtype's == is a numpy call, per message.
        # Equal dtypes and byte counts: equally many elements, whatever the shapes.
        if (buf.dtype is not sent.dtype and buf.dtype != sent.dtype) or buf.nbytes != sent.nbytes:
            raise MessageSizeError(
                f"rank {dst} posted a Recv of {elements(buf)} x {buf.dtype} from rank {src} "
                f"on channel {recv.task.channel!r}, but the matching Send from rank {src} "
                f"carries {elements(sent)} x {sent.dtype}")
        if (send.data is None) != (not isinstance(buf, np.ndarray)):
            raise ProtocolError(f"ranks {src} and {dst} mix size-only and numpy buffers")
        if send.in_switch != (recv.group is not None):
            raise ProtocolError(
                f"rank {src}'s Send to rank {dst} on channel {recv.task.channel!r} "
                + (f"is in_switch, but rank {dst} matched it with a plain Recv" if send.in_switch
                   else f"is not in_switch, but rank {dst} matched it with a RecvReduce")
                + ": a RecvReduce takes in_switch sends, and they go to nothing else")
        send.recv = recv
        recv.matched, recv.data, recv.message = True, send.data, send.message
        if recv.group is not None:
            self._pulled(send, recv.group)
            return
        if send.arrived:
            if not send.done:
                # The send waited for this receive (rendezvous). Its task goes on from the
                # event loop, not from inside this rank's op: a chain of such wake-ups
                # across many ranks would otherwise nest as deep as the chain.
                self.env.timeout(0, send).callbacks.append(self._on_received_late)
            self._deliver(send)

    # -- in the switch -------------------------------------------------------------------

    def multicast(self, task: _Task, op: Multicast) -> tuple[_Handle, ...]:
        plan = self._plan(task.rank, op.peers, inbound=False, tree=self.nvls_tree[task.rank])
        if plan is None:
            return super().multicast(task, op)
        up, downs, own = plan
        branches = []
        for peer in op.peers:  # each a Send whose way starts in the switch
            h = self.send(task, Send(peer, op.buf, op.label), branch=True)
            h.route = downs[peer]
            branches.append(h)

        def fork(carrier: _Leg) -> None:
            for h in branches:
                h.tail = carrier.tail
                self._cross(h, self.env.now)
            # The writer's own copy belongs to the multicast, as its way up does.
            self._cross(_Leg(carrier.nbytes, own, branches[0].message, None, carrier.tail),
                        self.env.now)

        self._cross(_Leg(op.buf.nbytes, up, branches[0].message, fork), self.env.now)
        return tuple(branches)

    def recv_reduce(self, task: _Task, op: RecvReduce) -> tuple[_Handle, ...]:
        group = _Reduction(self._plan(task.rank, op.peers, inbound=True,
                                      tree=self.nvls_tree[task.rank]))
        return tuple(self.recv(task, Recv(peer, op.buf, op.op, op.label), group)
                     for peer in op.peers)

    def _pulled(self, send: _Handle, group: _Reduction) -> None:
        # An in_switch send met its RecvReduce's receive: its data may leave now.
        if group.plan is None:
            self._leave(send)
            return
        group.sends.append(send)
        ups, own, _ = group.plan
        if len(group.sends) < len(ups):
            return
        group.legs_left = len(ups) + 1
        arrived = self._summed_up(group)
        for h in group.sends:
            self._cross(_Leg(h.nbytes, ups[h.task.rank], h.message, arrived), self.env.now)
        # The asker's own part of the sum goes up as part of the last send it met.
        self._cross(_Leg(send.nbytes, own, send.message, arrived), self.env.now)

    def _summed_up(self, group: _Reduction) -> Callable[[_Leg], None]:
        def arrived(leg: _Leg) -> None:
            # Every head at the switch: the sum goes down, its tail after the last one's.
            group.legs_left -= 1
            group.tail = max(group.tail, leg.tail)
            if group.legs_left == 0:
                down = group.plan[2]
                self._cross(_Leg(leg.nbytes, down, group.sends[0].message,
                                 lambda sum_: self._sum_arrives(group, sum_), group.tail),
                            self.env.now)
        return arrived

    def _sum_arrives(self, group: _Reduction, leg: _Leg) -> None:
        def land(_event: simpy.Event) -> None:
            for send in group.sends:
                send.arrived = True
                if send.trace_index >= 0:
                    self._arrived_in_trace(send)
                self._complete(send)
                self._complete(send.recv)  # the switch summed: no reduction in memory
        self.env.timeout(leg.tail - self.env.now).callbacks.append(land)

    def _on_leg_end(self, event: simpy.Event) -> None:
        leg = event.value
        if leg.then is not None:
            leg.then(leg)

    def _switch_route(self, links: Sequence[int], tree: bool, into_switch: bool = False
                      ) -> Route:
        # The way into the switch carries the switch's own latency on its last link.
        per_byte = TICKS_PER_SECOND / self.topology.switch_share(tree)
        route = [(i, per_byte / self.links[i].bandwidth, _ticks(self.links[i].latency),
                  _ticks(self.links[i].gap)) for i in links]
        if into_switch and route:
            i, per_byte, latency, gap = route[-1]
            route[-1] = (i, per_byte, latency + _ticks(self.topology.switch_latency), gap)
        return tuple(route)

    def _split_at_switch(self, src: int, dst: int) -> tuple[str, int] | None:
        """The first reducing switch on the route from ``src`` to ``dst``, and how many of
        the route's links lead into it; None if there is none."""
        for k, i in enumerate(self.topology.route(src, dst)):
            if self.links[i].dst in self.reducing:
                return self.links[i].dst, k + 1
        return None

    def _plan(self, rank: int, peers: tuple[int, ...], inbound: bool, tree: bool) -> Any:
        """How a switch carries a reduction into ``rank`` (``inbound``: each peer's way up
        to the switch, the rank's own, and the way down to it) or a multicast from it (the
        way up, the way down to each peer, and back to the rank); None unless one switch
        that reduces and multicasts is on every peer's route, with the shared part of the
        routes the same links; ``tree``: at NVLS-tree's share of their bandwidth. Cached."""
        key = (rank, peers, inbound, tree)
        if key not in self.plans:
            self.plans[key] = self._new_plan(rank, peers, inbound, tree)
        return self.plans[key]

    def _new_plan(self, rank: int, peers: tuple[int, ...], inbound: bool, tree: bool) -> Any:
        if not self.reducing or any(p >= self.size or p == rank for p in peers):
            return None  # a bad peer is reported by the Send or Recv it falls back to
        route = self.topology.route
        splits = {p: self._split_at_switch(*((p, rank) if inbound else (rank, p)))
                  for p in peers}
        if None in splits.values() or len({where for where, _ in splits.values()}) > 1:
            return None
        # The rank's own way up (inbound) or down (outbound) through the same switch.
        first, switch = peers[0], splits[peers[0]][0]
        own = self._split_at_switch(*((rank, first) if inbound else (first, rank)))
        if own is None or own[0] != switch:
            return None
        if inbound:
            downs = {route(p, rank)[k:] for p, (_, k) in splits.items()}
            if len(downs) > 1:
                return None
            return ({p: self._switch_route(route(p, rank)[:k], tree, True)
                     for p, (_, k) in splits.items()},
                    self._switch_route(route(rank, first)[:own[1]], tree, True),
                    self._switch_route(downs.pop(), tree))
        ups = {route(rank, p)[:k] for p, (_, k) in splits.items()}
        if len(ups) > 1:
            return None
        return (self._switch_route(ups.pop(), tree, True),
                {p: self._switch_route(route(rank, p)[k:], tree)
                 for p, (_, k) in splits.items()},
                self._switch_route(route(first, rank)[own[1]:], tree))

    def _on_arrival(self, event: simpy.Event) -> None:
        send = event.value
        send.arrived = True
        if send.trace_index >= 0:
            self._arrived_in_trace(send)
        if send.recv is not None:
            self._complete(send)
            self._deliver(send)
        elif send.nbytes <= self.eager_limit:
            self._complete(send)

    def _arrived_in_trace(self, send: _Handle) -> None:
        # The send's event with its end; made anew, which is quicker than _replace.
        self.trace[send.trace_index] = TraceEvent(
            "send", send.task.rank, send.task.channel, send.posted / TICKS_PER_SECOND,
            self.env.now / TICKS_PER_SECOND, send.peer, send.nbytes, send.label, send.message)

    def _on_received_late(self, event: simpy.Event) -> None:
        self._complete(event.value)

    def _deliver(self, send: _Handle) -> None:
        h = send.recv
        # A reduction at no cost (reduce_bandwidth infinite) never waits for the memory:
        # every op on it then takes no time.
        if h.reduce is not None and self.memory_per_byte[h.task.rank]:
            end = self._occupy_memory(h.task, send.nbytes, "reduce", send.task.rank,
                                      h.label, h.message)
            if end > self.env.now:
                self.env.timeout(end - self.env.now, h).callbacks.append(self._on_reduced)
                return
        self._complete(h)

    def _on_reduced(self, event: simpy.Event) -> None:
        self._complete(event.value)

    def _complete(self, h: _Handle) -> None:
        h.done = True
        if not h.is_send and self.record:
            self.trace.append(TraceEvent("recv", h.task.rank, h.task.channel,
                                         h.posted / TICKS_PER_SECOND,
                                         self.env.now / TICKS_PER_SECOND, h.peer,
                                         h.buf.nbytes, h.label, h.message))
        if h.waited:  # its task waits on it (a handle done before its Wait never blocks)
            task = self.waiters.pop(h, h.task) if self.waiters else h.task
            task.pending -= 1
            if task.pending == 0:
                handles, task.wait_handles = task.wait_handles, None
                if self.has_data:
                    self._apply(task, handles)
                self.step(task, None)

    # -- waiting -------------------------------------------------------------------------

    def wait(self, task: _Task, op: Wait) -> Any:
        pending = self.accept_wait(task, op.handles)
        if pending == 0:
            if self.has_data:
                self._apply(task, op.handles)
            return None
        task.pending, task.wait_handles = pending, op.handles
        for h in op.handles:
            if h.task is not task and not h.done:
                self.waiters[h] = task
        return BLOCKED

    def _apply(self, task: _Task, handles: Sequence[_Handle]) -> None:
        # Check every send before any receive lands: a receive into a buffer that a send in
        # the same Wait reads from is legal, since both are complete when Wait returns.
        for h in handles:
            if h.is_send and h.data is not None and not _same(h.data, h.buf):
                raise ProtocolError(f"rank {task.rank} changed the buffer of its Send to rank "
                                    f"{h.peer} before waiting for it")
        for h in handles:
            if not h.is_send and h.data is not None:
                self._land(task, h)

    def _land(self, task: _Task, h: _Handle) -> None:
        # Its buffer, and that of every other receive of the rank still to land over the
        # same memory, must hold what it held when that receive was posted, or what the
        # landings since left there: anything else was written while a receive was in
        # flight. The others then take what this landing leaves as their own.
        unlanded = self.unlanded[task.rank]
        unlanded.discard(h)
        others = unlanded.overlapping(h.span)
        for r in (h, *others):
            if not _same(r.snapshot, r.buf):
                raise ProtocolError(
                    f"rank {r.task.rank} wrote to the buffer of its Recv from rank {r.peer} "
                    f"on channel {r.task.channel!r}"
                    + (f" (label {r.label!r})" if r.label else "")
                    + " while that Recv was in flight, between posting it and its Wait: its "
                    "data may land at any moment; leave a Recv's buffer alone until its Wait")
        # The bytes travel: a message lands in a buffer of another shape as it is.
        data = h.data if h.data.shape == h.buf.shape else h.data.reshape(h.buf.shape)
        if h.reduce is None:
            h.buf[...] = data
        else:
            reference.combine(h.reduce, h.buf, data)
        h.snapshot = None
        for r in others:
            r.snapshot = r.buf.copy()

    # -- local work ----------------------------------------------------------------------

    def _occupy_memory(self, task: _Task, nbytes: int, kind: str, peer: int = -1,
                       label: str = "", message: int = -1) -> int:
        rank = task.rank
        cost = round(nbytes * self.memory_per_byte[rank])
        start = max(self.env.now, self.memory_free[rank])
        end = self.memory_free[rank] = start + cost
        if self.record and cost > 0:
            self.trace.append(TraceEvent(kind, rank, task.channel, start / TICKS_PER_SECOND,
                                         end / TICKS_PER_SECOND, peer, nbytes, label, message))
        return end

    def _sleep_until(self, task: _Task, end: int, value: Any = None) -> Any:
        if end <= self.env.now:
            return value
        self.env.timeout(end - self.env.now).callbacks.append(
            lambda _event: self.step(task, value))
        return BLOCKED

    def compute(self, task: _Task, op: Compute) -> Any:
        rank = task.rank
        start = max(self.env.now, self.compute_free[rank])
        seconds = op.seconds / self.compute_speed[rank]
        if self.compute_factor is not None:
            seconds *= self.compute_factor.draw(self.variation_rng)
        if self.jitter is not None:
            seconds += self.jitter_rng.uniform(0.0, self.jitter.max_delay)
        end = self.compute_free[rank] = start + _ticks(seconds)
        if self.record:
            self.trace.append(TraceEvent("compute", rank, task.channel,
                                         start / TICKS_PER_SECOND, end / TICKS_PER_SECOND,
                                         label=op.label))
        return self._sleep_until(task, end)

    def sleep(self, task: _Task, op: Sleep) -> Any:
        end = self.env.now + _ticks(op.seconds)
        if self.record:
            self.trace.append(TraceEvent("sleep", task.rank, task.channel,
                                         self.env.now / TICKS_PER_SECOND,
                                         end / TICKS_PER_SECOND, label=op.label))
        return self._sleep_until(task, end)

    def copy(self, task: _Task, op: Copy) -> Any:
        self.check_copy(task, op)
        if self.has_data:
            self.check_local(task, "Copy", _span, reads=(op.src,), writes=(op.dst,))
        if isinstance(op.dst, np.ndarray):
            op.dst[...] = op.src
        return self._sleep_until(task, self._occupy_memory(task, op.src.nbytes, "copy"))

    def combine(self, task: _Task, op: Combine) -> Any:
        self.check_copy(task, op)
        if self.has_data:
            self.check_local(task, "Combine", _span, reads=(op.src,), writes=(op.dst,))
        if isinstance(op.dst, np.ndarray):
            reference.combine(op.op, op.dst, op.src)
        return self._sleep_until(task, self._occupy_memory(task, op.src.nbytes, "reduce"))

    def divide(self, task: _Task, op: Divide) -> Any:
        if not _fit(op.buf):
            self.check_buffer(task, "Divide", op.buf)
        if self.has_data:
            self.check_local(task, "Divide", _span, writes=(op.buf,))
        if isinstance(op.buf, np.ndarray):
            reference.divide(op.buf, op.divisor)
        return self._sleep_until(task, self._occupy_memory(task, op.buf.nbytes, "divide"))

    def alloc(self, task: _Task, op: Alloc) -> Any:
        if isinstance(op.like, np.ndarray):
            return np.zeros(op.count, dtype=op.like.dtype)
        return SizeOnly(op.count, op.like.dtype)

    def launch(self, task: _Task, op: Launch) -> Any:
        if task.rank == 0:
            self.launches.append(op)
        self.share[task.rank] = op.channels
        self.nvls_tree[task.rank] = op.algorithm == "nvls_tree"
        tree = op.algorithm == "tree"
        self.routes_of[task.rank] = self.tree_routes if tree else self.routes
        self.simple_routes_of[task.rank] = self.routes_of[task.rank][Protocol.SIMPLE]
        self.piped_routes_of[task.rank] = (
            self.tree_piped_routes if tree
            else self.ring_piped_routes if op.algorithm in ("ring", "hierarchical")
            else self.nvls_tree_piped_routes if op.algorithm == "nvls_tree"
            else self.piped_routes)
        latency = _ticks(self.topology.launch_latency.of(op.protocol, op.algorithm)
                         + self._fill_seconds(op))
        if self.record and latency:
            now = self.env.now / TICKS_PER_SECOND
            self.trace.append(TraceEvent("launch", task.rank, task.channel, now,
                                         now + latency / TICKS_PER_SECOND,
                                         label=f"launch {op.protocol.value}"))
        return self._sleep_until(task, self.env.now + latency)

    def _fill_seconds(self, op: Launch) -> float:
        # An in-switch pipeline's fill moves at the pace it keeps once full; where no
        # switch reduces, the algorithm's plain sends take their own time.
        if not op.fill_bytes or not self.reducing:
            return 0.0
        if op.one_way:  # no fill where no GPU shares a switch with another
            return (op.fill_bytes / self.topology.switch_rate(0)
                    if self.topology.ranks_per_node > 1 else 0.0)
        tree = op.algorithm == "nvls_tree"
        if tree not in self.in_switch_pace:
            self.in_switch_pace[tree] = ModelTuner(self.topology).in_switch_pace(tree)
        return op.fill_bytes / self.in_switch_pace[tree]

    def footprint(self, task: _Task, op: Footprint) -> None:
        if self.record:
            now = self.env.now / TICKS_PER_SECOND
            self.trace.append(TraceEvent("footprint", task.rank, task.channel, now, now,
                                         nbytes=op.delta, label=op.label))

    # -- after the run -------------------------------------------------------------------

    def check_finished(self, max_time: float) -> None:
        stuck = [t for t in self.tasks if not t.done]
        unreceived = [m for sends, _ in self.queues.values() for m in sends]
        if stuck and self.env.peek() < math.inf:
            running = sorted({t.rank for t in stuck})
            raise RunLimitError(f"the run passed its limit of {max_time:g} simulated seconds "
                                f"(max_time) with ranks {running} still running: an "
                                "algorithm that never ends? A longer run needs a larger "
                                "max_time")
        if stuck:
            raise DeadlockError(self._describe_deadlock(stuck, unreceived))
        if unreceived:
            raise UnreceivedMessageError("the run ended with messages never received: "
                                         + _describe_messages(unreceived))


    def _describe_deadlock(self, stuck: list[_Task], unreceived: list[_Handle]) -> str:
        lines = [self._describe_stuck(t) for t in stuck[:_LISTED]]
        if len(stuck) > _LISTED:
            lines.append(f"and {len(stuck) - _LISTED} more tasks blocked ({len(stuck)} in all)")
        text = f"deadlock at t={self.env.now / TICKS_PER_SECOND:.9g}s: " + "; ".join(lines)
        if unreceived:
            text += "; never received: " + _describe_messages(unreceived)
        if any(h.is_send and h.recv is None and not h.done
               for t in stuck for h in t.wait_handles or ()):
            text += (". A Send completes only once its peer has posted the matching Recv, as "
                     "on gloo and NCCL: post the Recv before waiting on the Send, or wait on "
                     "both in one Wait")
        return text

    def _describe_stuck(self, t: _Task) -> str:
        if t.wait_handles is None:
            return (f"rank {t.rank} (channel {t.channel!r}) waits for "
                    f"{t.blocked_on or 'nothing it can name'}")
        pending = [h for h in t.wait_handles if not h.done]
        waits = [h.describe() + (f", and rank {h.peer} has already returned"
                                 if not math.isnan(self.finish_times[h.peer]) else "")
                 for h in pending[:_LISTED]]
        if len(pending) > _LISTED:
            waits.append(f"and {len(pending) - _LISTED} more of its handles")
        return f"rank {t.rank} (channel {t.channel!r}) waits for {'; '.join(waits)}"


def _describe_messages(sends: list[_Handle]) -> str:
    return ", ".join(f"rank {s.task.rank} -> rank {s.peer} ({elements(s.buf)} x {s.buf.dtype} on "
                     f"channel {s.task.channel!r})" for s in sends[:_LISTED]) + (
        f" and {len(sends) - _LISTED} more" if len(sends) > _LISTED else "")


def _ticks(seconds: float) -> int:
    return round(seconds * TICKS_PER_SECOND)


def _fit(buf: Any) -> bool:
    # A buffer that check_buffer would pass, tested quickly: this runs per message.
    return type(buf) is SizeOnly or (type(buf) is np.ndarray and buf.flags.c_contiguous
                                     and buf.ndim > 0)


def _span(buf: np.ndarray) -> Span:
    # check_buffer let only contiguous buffers through.
    start = buf.__array_interface__["data"][0]
    return "cpu", start, start + buf.nbytes


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    # Bit for bit: any write into a send's buffer before its Wait changes it, a NaN's
    # payload or a zero's sign included (and comparing bytes is the cheaper test).
    return a.tobytes() == b.tobytes()


@contextmanager
def _finite_costs(topology: Topology) -> Iterator[None]:
    """Name a cost that came to infinity (an OverflowError where seconds meet the clock's
    integer ticks, or numpy's integers) as the inputs' doing."""
    try:
        yield
    except OverflowError:
        raise ValueError(
            f"a cost in this run on {topology.name!r} came to infinity: a bandwidth or speed "
            "too small, or a latency, delay or buffer too large, for floating point") from None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after. A run makes no
    reference cycle per message (see ``_Handle``), so refcounting frees what it drops; but
    the collector, woken every few hundred allocations, walked the growing trace again and
    again (a fifth to a third of a run with the trace on), or a large cluster's links (half
    of a collective-level run on 131,072 GPUs)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _counted_at_collective_level(algorithm: Callable[..., Any], inputs: Sequence[Any],
                                 topology: Topology, tuner: Tuner | None,
                                 params: dict[str, Any]) -> SimResult | None:
    """The collective level's run of this call, which counts the messages the message level
    would step through for its size and choice; None where no model covers the call (the
    message level then runs it, and reports any error in it)."""
    if not has_collective_model(algorithm):
        return None
    try:
        check_ranks(topology, inputs)
        with _collector_paused(), _finite_costs(topology):
            return run_collective_level(algorithm, inputs, topology, tuner, **params)
    except (ValueError, TypeError):
        return None


def simulate(algorithm: Callable[..., Any], inputs: Sequence[Any], topology: Topology, /,
             *, record: bool = True, trace: str | os.PathLike[str] | IO[str] | None = None,
             eager_limit: int | None = None, max_ops: int | None = DEFAULT_MAX_OPS,
             max_time: float | None = None, jitter: Jitter | None = None,
             variation: Variation | None = None,
             progress: Callable[[int], None] | None = None,
             tuner: Tuner | None = None, level: str = "message", **params: Any) -> SimResult:
    """Run ``algorithm`` on every rank of ``topology`` and return results and costs.

    ``inputs`` holds one 1-D numpy array or ``SizeOnly`` buffer per rank; numpy inputs are
    copied first, so the caller's arrays are left alone. ``params`` go to the algorithm.
    With ``record=False`` the trace stays empty (faster for large cost-only runs). With
    ``trace`` (a path or an open text file) the run is also written as a Chrome trace-event
    file for Perfetto (``simcomm.chrome_trace``).

    A send completes once its receive is posted (rendezvous, as on gloo and NCCL), so an
    algorithm that would hang on them raises ``DeadlockError`` here. ``eager_limit`` (bytes)
    lets sends up to that size complete without a receive, as MPI's eager protocol does.
    ``max_ops`` (ops of all ranks together) and ``max_time`` (simulated seconds) bound the
    run: past either, ``RunLimitError``; None lifts the bound. ``variation``
    (``simcomm.variation.Variation``) draws each message's late start and slowdown and each
    computation's length from seeded distributions, the machine's own spread.
    ``progress(n)`` is told of every n (``PROGRESS_EVERY``) messages sent, for a progress
    bar. ``jitter`` delays messages and computations at random (``Jitter``), to explore the
    orders a run may take.
    ``tuner`` chooses how the collectives that ask (``algorithms.tuned.nccl_allreduce``) run
    (``Comm.tuner``); by default ``simcomm.tuning.ModelTuner(topology)``, this model's
    fastest choice.

    ``level`` is ``message`` (every op simulated, as above), ``collective`` (the collective's
    cost from the topology, ``simcomm.collective_level``: built-in collectives on size-only
    buffers, no data, no trace, seconds even at 100,000 ranks) or ``auto`` (the collective
    level where the message level would step through more than ``AUTO_MESSAGE_LIMIT``
    messages, counted for this call's size and choice where the collective level can, and
    the message level wherever a message-level option is given); ``SimResult.level`` says
    which ran.
    """
    # Checks that hold at either level, before choosing one.
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a simcomm.Topology (ring, switch, make_preset, ...), "
                        f"got {topology!r}")
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, (Sequence, np.ndarray)):
        raise TypeError(f"inputs must be a list of one buffer per rank (numpy arrays or "
                        f"SizeOnly), got {type(inputs).__name__}")
    if eager_limit is not None and (type(eager_limit) is not int or eager_limit < 0):
        raise ValueError(f"eager_limit must be an int of bytes >= 0 or None, got "
                         f"{eager_limit!r}")
    if max_ops is not None and (type(max_ops) is not int or max_ops < 1):
        raise ValueError(f"max_ops must be an int >= 1 or None, got {max_ops!r}")
    if max_time is not None and not (isinstance(max_time, (int, float))
                                     and not isinstance(max_time, bool) and max_time > 0
                                     and not math.isnan(max_time)):
        raise ValueError(f"max_time must be a number of seconds > 0 or None, got "
                         f"{max_time!r}")
    if type(record) is not bool:
        raise ValueError(f"record must be True or False, got {record!r}")
    if trace is not None and not isinstance(trace, (str, os.PathLike)) and not hasattr(
            trace, "write"):  # refused now, not after the whole run
        raise TypeError(f"trace must be a path or an open text file, got {trace!r}")
    if isinstance(trace, (str, os.PathLike)):  # refused now, not after the whole run
        where = Path(trace)
        if where.is_dir() or not where.parent.is_dir():
            raise ValueError(f"trace {str(trace)!r}: " + (
                "is a folder: name a file" if where.is_dir()
                else f"folder {str(where.parent)!r} does not exist"))
    check_callback(progress, 1, "progress", "(messages) -> None")
    check_callback(tuner, 2, "tuner", TUNER_SHAPE)
    size_only = all(isinstance(buf, SizeOnly) for buf in inputs)
    asked, level = level, choose_level(level, algorithm, topology.size, size_only)
    message_options = any(option is not None for option in (trace, eager_limit, jitter,
                                                             variation))
    if asked == "auto" and level == "message" and size_only and not message_options:
        counted = _counted_at_collective_level(algorithm, inputs, topology, tuner, params)
        if counted is not None and counted.messages > AUTO_MESSAGE_LIMIT:
            return counted
    if level == "collective":
        given = [name for name, value in (("trace", trace), ("eager_limit", eager_limit),
                                          ("jitter", jitter), ("variation", variation))
                 if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: message-level options, but level is "
                             "collective")
        check_ranks(topology, inputs)
        with _collector_paused(), _finite_costs(topology):
            return run_collective_level(algorithm, inputs, topology, tuner, **params)
    if trace is not None and not record:
        raise ValueError("trace= writes the op trace, so it needs record=True")
    if jitter is not None and not isinstance(jitter, Jitter):
        raise TypeError(f"jitter must be a simcomm.Jitter or None, got {jitter!r}")
    if variation is not None and not isinstance(variation, Variation):
        raise TypeError(f"variation must be a simcomm.variation.Variation or None, got "
                        f"{variation!r}")
    check_ranks(topology, inputs)
    buffers = []
    for rank, buf in enumerate(inputs):
        if isinstance(buf, np.ndarray):
            if buf.ndim != 1:
                raise ValueError(f"input of rank {rank} must be 1-D, got shape {buf.shape}")
            check_dtype(buf.dtype, f"input of rank {rank}")
            buffers.append(buf.copy())
        elif isinstance(buf, SizeOnly):
            buffers.append(buf)
        else:
            raise TypeError(f"input of rank {rank} must be a numpy array or SizeOnly, "
                            f"got {type(buf).__name__}")
    if len({isinstance(b, SizeOnly) for b in buffers}) > 1:
        raise ValueError("inputs mix numpy arrays and SizeOnly buffers")
    sim = _Simulation(topology, record,
                      has_data=not isinstance(buffers[0], SizeOnly) if buffers else False,
                      eager_limit=-1 if eager_limit is None else eager_limit,
                      max_ops=math.inf if max_ops is None else max_ops, jitter=jitter,
                      variation=variation, progress=progress)
    if tuner is None:
        tuner = ModelTuner(topology)
    gens = []
    for rank in range(topology.size):
        gen = algorithm(Comm(rank, topology.size, topology.local_size, tuner), buffers[rank],
                        **params)
        if not hasattr(gen, "send"):
            raise TypeError(f"{getattr(algorithm, '__name__', algorithm)!r} did not return a "
                            "generator: an algorithm is a generator function that yields ops")
        gens.append(gen)
    # A bound past what the clock's ticks hold as a float bounds nothing.
    until = (_ticks(max_time) if max_time is not None
             and math.isfinite(max_time * TICKS_PER_SECOND) else None)
    with _collector_paused(), _finite_costs(topology):
        for rank, gen in enumerate(gens):
            sim.start_main(rank, gen)
        sim.env.run(until=until)
    limit = math.inf if max_time is None else max_time
    sim.check_finished(limit)
    wires = len(topology.links)  # the channels' pipes come after them
    links = link_stats(topology.links, sim.link_bytes[:wires],
                       [busy / TICKS_PER_SECOND for busy in sim.link_busy[:wires]])
    result = SimResult(sim.results, max(sim.finish_times), sim.finish_times, links, sim.trace,
                       sim.messages, sim.hops, sim.launches)
    if trace is not None:
        write_chrome_trace(result, trace)
    return result
