"""The rules of the ops, in one place, for every transport.

``algorithms.ops`` says what the ops are; this module says what they mean and which misuse
is an error: tasks and their channels, handles and waits, spawning and joining, peers. Both
interpreters (``simcomm``'s engine and ``realcomm``'s driver) subclass ``Interpreter`` and
keep only what is theirs: the simulator its clock, links and costs; the driver its torch
works and threads. So a rule cannot differ between them, and an error is the same class
whichever transport raised it.

The rules:

* A rank runs one main task on ``MAIN_CHANNEL``; ``Spawn`` starts another task of the same
  rank on a channel that no live task of that rank uses, running a generator that no task
  has run (each task its own generator object). The child runs first, until it blocks; then
  its spawner goes on.
* ``Send`` and ``Recv`` name a peer other than the rank itself, inside the world. They
  return a handle that a task of the same rank waits exactly once (the one that posted it,
  or another: a tree's down stream waits on its up stream's sends, and its up stream on
  the down stream's), before the rank's main task returns.
  ``Multicast`` and ``RecvReduce`` are a ``Send`` or a reducing ``Recv`` per peer, and
  return a handle per peer. A ``Send`` with ``in_switch`` is matched by a ``RecvReduce``'s
  receive and by nothing else, and a ``RecvReduce``'s receives by such sends only.
* ``Join`` names another task of the same rank; any task may join any other, any number of
  times; every spawned task is joined at least once before its spawner returns.
* A buffer is one of the transport's (numpy arrays or ``SizeOnly`` in the simulator, tensors
  in realcomm), contiguous and not a single (0-d) element. ``Copy`` and ``Combine`` work on
  two buffers of equal shape and dtype; a message's buffers hold equally many elements of
  one dtype (their shapes may differ: the bytes travel).
* Memory, where buffers have it: from posting to its Wait, a receive's memory may be
  neither read (by a ``Send``, a ``Copy``, a ``Combine``) nor written by a local op (a
  ``Copy``, a ``Combine``, a ``Divide``): its data may land at any moment. Receives into
  overlapping memory are waited in the order they were posted (one Wait applies its
  receives in the order it names them). A send's memory may not be written until the send
  is waited, by a local op or by a receive waited before it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from collections.abc import Callable, Generator, Hashable
from typing import Any

from algorithms.ops import (
    Alloc, Combine, Compute, Copy, Divide, Footprint, Join, Launch, Multicast, Recv, RecvReduce,
    ReduceOp, Send, Sleep, Spawn, Wait,
)

MAIN_CHANNEL = 0
BLOCKED = object()  # what an op handler returns when its task cannot go on yet

# A buffer's memory: (device, address of its first byte, address past its last byte).
Span = tuple[Hashable, int, int]


def overlaps(a: Span | None, b: Span | None) -> bool:
    """Whether two spans share a byte (no span, or an empty one, shares none)."""
    return (a is not None and b is not None and a[0] == b[0]
            and a[1] < b[2] and b[1] < a[2] and a[1] < a[2] and b[1] < b[2])


def elements(buf: Any) -> int:
    """How many elements a buffer holds, in all its dimensions (a ``SizeOnly``: its count)."""
    shape = getattr(buf, "shape", None)
    return len(buf) if shape is None else math.prod(shape)


def buffer_problem(buf: Any, kinds: tuple[type, ...], advice: str) -> str | None:
    """What makes ``buf`` unfit as an op's buffer, in words, or None: it must be one of
    ``kinds`` (else ``advice`` says what to give), not a 0-d element, and contiguous."""
    if getattr(buf, "ndim", None) == 0 or isinstance(buf, (int, float, complex)):
        return f"a single element ({type(buf).__name__}): use a slice such as x[i:i+1]"
    if not isinstance(buf, kinds):
        return f"a {type(buf).__name__}: {advice}"
    flags = getattr(buf, "flags", None)  # numpy's; a tensor says is_contiguous()
    contiguous = (flags.c_contiguous if flags is not None
                  else buf.is_contiguous() if hasattr(buf, "is_contiguous") else True)
    if not contiguous:
        return ("a non-contiguous (strided) view: give a contiguous one, such as x[a:b], or "
                "copy it into one")
    return None


class AlgorithmError(Exception):
    """Base of the errors an algorithm causes, whichever transport runs it."""


class ProtocolError(AlgorithmError):
    """An algorithm misused the ops: bad peer, handle not waited, task not joined, ..."""


class MessageSizeError(ProtocolError):
    """A receive's buffer does not match the size or dtype of the send it matched."""


class UnreceivedMessageError(ProtocolError):
    """The run ended with messages that no receive matched."""


class DeadlockError(AlgorithmError):
    """Every unfinished task is blocked and nothing is in flight."""


class RunLimitError(AlgorithmError):
    """A run went past its bound on ops or time: an algorithm that never ends, most likely."""


class Task:
    """One task of a rank: a generator of ops running on a channel.

    Interpreters subclass it (with ``__slots__``) for what they track besides.
    """

    __slots__ = ("rank", "channel", "gen", "outstanding", "children", "joiners", "joined",
                 "done", "result", "blocked_on", "rate_channel")

    def __init__(self, rank: int, channel: Hashable, gen: Generator[Any, Any, Any]) -> None:
        self.rank, self.channel, self.gen = rank, channel, gen
        self.rate_channel = channel  # whose share of the GPU it sends at (Spawn.shares_rate)
        self.outstanding: dict[Handle, None] = {}  # posted, not yet waited; in posting order
        self.children: list[Task] = []
        self.joiners: list[Task] = []
        self.joined = False
        self.done = False
        self.result: Any = None
        self.blocked_on = ""  # what a blocked task waits for, in words, besides handles


def _task_tree(task: Task) -> list[Task]:
    """``task`` and every task it spawned, and they spawned, and so on."""
    tasks = [task]
    for t in tasks:
        tasks += t.children
    return tasks


class Handle:
    """What a ``Send`` or a ``Recv`` returns to the algorithm.

    Interpreters subclass it (with ``__slots__``) for what they track besides. Handles
    compare by identity, so a task's outstanding handles can be a dict.
    """

    __slots__ = ("task", "is_send", "peer", "buf", "reduce", "label", "waited", "span", "seq",
                 "done")

    def __init__(self, task: Task, is_send: bool, peer: int, buf: Any,
                 reduce: ReduceOp | None, label: str, span: Span | None = None) -> None:
        self.task, self.is_send, self.peer, self.buf, self.reduce = (
            task, is_send, peer, buf, reduce)
        self.label = label
        self.waited = False
        self.span = span  # None: the buffer has no memory to guard (size-only)
        self.seq = 0  # posting order among the rank's guarded handles
        # Whether the transport has completed it: the simulator knows; realcomm's waits ask
        # torch instead and leave it False.
        self.done = False
        task.outstanding[self] = None

    def describe(self) -> str:
        """The handle in words, for error messages."""
        what = "Send to" if self.is_send else "Recv from"
        return (f"{what} rank {self.peer} on channel {self.task.channel!r} "
                f"({elements(self.buf)} x {self.buf.dtype})")


class InFlight:
    """A rank's posted and not yet waited handles whose buffers have memory, found by the
    memory they touch. Per device their spans are kept sorted by first byte, so that a
    check looks only at those that start before its span ends and no further back than
    the longest span seen there: a rank may have hundreds in flight (a ring on every
    channel, each in slices)."""

    def __init__(self) -> None:
        self._by_start: dict[Hashable, list[tuple[int, int, Handle]]] = {}  # (start, seq, h)
        self._longest: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return sum(map(len, self._by_start.values()))

    def add(self, h: Handle) -> None:
        """Track ``h``, whose ``span`` and ``seq`` are set."""
        device, start, end = h.span
        insort(self._by_start.setdefault(device, []), (start, h.seq, h))
        self._longest[device] = max(self._longest.get(device, 0), end - start)

    def discard(self, h: Handle) -> None:
        """Stop tracking ``h`` if it is tracked."""
        if h.span is None:
            return
        device, start, _ = h.span
        entries = self._by_start.get(device, [])
        i = bisect_left(entries, (start, h.seq))
        if i < len(entries) and entries[i][2] is h:
            del entries[i]

    def overlapping(self, span: Span | None) -> list[Handle]:
        """The tracked handles whose spans share a byte with ``span``, in posting order."""
        if span is None or span[1] >= span[2]:
            return []
        device, first, end = span
        entries = self._by_start.get(device)
        if not entries:
            return []
        lo = bisect_left(entries, (first - self._longest[device] + 1,))
        hi = bisect_left(entries, (end,))
        found = [h for _, _, h in entries[lo:hi] if overlaps(span, h.span)]
        found.sort(key=lambda h: h.seq)
        return found


class Interpreter(ABC):
    """What every transport does the same way: dispatching ops and enforcing their rules.

    A subclass implements one method per op that touches data, time or the wire (``send``,
    ``recv``, ``wait``, ``compute``, ``sleep``, ``copy``, ``combine``, ``divide``, ``alloc``),
    ``new_task``, ``run_child_first`` (how a spawned task gets to run before its spawner)
    and ``resume`` (let a blocked task go on), and may override ``footprint`` and ``launch``
    (which cost nothing by default) and the hooks ``on_block``, ``on_finish`` and ``where``.
    A handler returns the value to send back into the generator, or ``BLOCKED`` when the
    task must wait; the interpreter later resumes it.
    """

    # The transport's buffers, and what to give instead of anything else, for check_buffer.
    buffer_kinds: tuple[type, ...] = ()
    buffer_advice = ""

    def __init__(self, size: int, max_ops: float = math.inf) -> None:
        self.size = size
        self.max_ops = max_ops  # ops all tasks may run in all; a bound on runaway loops
        self.ops_left = max_ops
        # Per rank, its posted and not yet waited handles whose buffers have memory.
        self.in_flight: dict[int, InFlight] = {}
        self.posted = 0
        self.live_channels: set[tuple[int, Hashable]] = set()
        # Every task by the id of its generator (the task keeps the generator, and so its
        # id, alive): a generator runs one task only.
        self.task_of_gen: dict[int, Task] = {}
        # on_block as step calls it: None where a transport has nothing to do when a task
        # blocks (the simulator), which spares a call per blocking op on its hot path.
        self.block_hook = (None if type(self).on_block is Interpreter.on_block
                           else self.on_block)
        self.handlers: dict[type, Callable[[Any, Any], Any]] = {
            Send: self.send, Recv: self.recv, Multicast: self.multicast,
            RecvReduce: self.recv_reduce, Wait: self.wait, Compute: self.compute,
            Copy: self.copy, Combine: self.combine, Divide: self.divide, Alloc: self.alloc,
            Spawn: self.spawn, Join: self.join, Footprint: self.footprint,
            Launch: self.launch, Sleep: self.sleep,
        }

    # -- what each transport supplies ---------------------------------------------------

    @abstractmethod
    def new_task(self, rank: int, channel: Hashable, gen: Generator[Any, Any, Any]) -> Task:
        """Make the transport's task object."""

    @abstractmethod
    def resume(self, task: Task, value: Any) -> None:
        """Let a blocked task go on, sending ``value`` into it."""

    def on_block(self, task: Task) -> None:
        """Called when ``task`` blocks (realcomm posts what it queued)."""

    def on_finish(self, task: Task) -> None:
        """Called when ``task`` has ended, before its joiners go on."""

    def where(self, task: Task) -> str:
        """Where ``task`` is, in words, for messages (the simulator adds the time)."""
        return f"rank {task.rank} (channel {task.channel!r})"

    @abstractmethod
    def send(self, task: Any, op: Send) -> Any:
        """Post a send; return its handle."""

    @abstractmethod
    def recv(self, task: Any, op: Recv) -> Any:
        """Post a receive; return its handle."""

    @abstractmethod
    def wait(self, task: Any, op: Wait) -> Any:
        """Call ``accept_wait``, then return None or ``BLOCKED``."""

    @abstractmethod
    def compute(self, task: Any, op: Compute) -> Any:
        """Occupy the rank's compute stream."""

    @abstractmethod
    def sleep(self, task: Any, op: Sleep) -> Any:
        """Hold the task for ``op.seconds``."""

    @abstractmethod
    def copy(self, task: Any, op: Copy) -> Any:
        """Call ``check_copy``, then copy."""

    @abstractmethod
    def combine(self, task: Any, op: Combine) -> Any:
        """Call ``check_copy``, then combine ``op.src`` into ``op.dst``."""

    @abstractmethod
    def divide(self, task: Any, op: Divide) -> Any:
        """Divide a buffer in place."""

    @abstractmethod
    def alloc(self, task: Any, op: Alloc) -> Any:
        """Return a new zeroed buffer like ``op.like``."""

    def multicast(self, task: Any, op: Multicast) -> tuple[Any, ...]:
        """Post a multicast: by default a ``Send`` to each peer (a simulator with switches
        that multicast overrides it)."""
        return tuple(self.send(task, Send(peer, op.buf, op.label)) for peer in op.peers)

    def recv_reduce(self, task: Any, op: RecvReduce) -> tuple[Any, ...]:
        """Post a reduction of the peers' contributions: by default a reducing ``Recv``
        from each peer (a simulator with switches that reduce overrides it)."""
        return tuple(self.recv(task, Recv(peer, op.buf, op.op, op.label)) for peer in op.peers)

    def footprint(self, task: Any, op: Footprint) -> Any:
        """Account memory (the simulator) or nothing (real memory is real)."""
        return None

    def launch(self, task: Any, op: Launch) -> Any:
        """Charge a collective's start (the simulator) or nothing (a real one is real)."""
        return None

    # -- tasks ---------------------------------------------------------------------------

    def open_task(self, rank: int, gen: Generator[Any, Any, Any], channel: Hashable) -> Task:
        """A new task of ``rank`` on ``channel``, which no live task of the rank may use,
        running ``gen``, which no task may have run."""
        other = self.task_of_gen.get(id(gen))
        if other is not None:
            state = "ended" if other.done else "still running"
            raise ProtocolError(f"rank {rank} spawned a task on channel {channel!r} with a "
                                f"generator already spawned as the task of rank {other.rank} "
                                f"on channel {other.channel!r} ({state}): each task needs its "
                                "own generator object; call the generator function once per "
                                "Spawn")
        key = (rank, channel)
        if key in self.live_channels:
            raise ProtocolError(f"rank {rank} spawned a task on channel {channel!r}, which a "
                                "live task of that rank already uses: concurrent tasks need "
                                "distinct channels")
        task = self.new_task(rank, channel, gen)
        self.live_channels.add(key)
        self.task_of_gen[id(gen)] = task
        return task

    def step(self, task: Task, value: Any) -> None:
        """Run ``task`` from where it stopped, sending ``value`` in, until it blocks or ends."""
        # The op budget is kept in a local while the task runs. A child that a Spawn runs
        # meanwhile counts against the same stored budget and this task then writes its own
        # back, so the child's first ops go uncounted: the bound is loose, never tighter.
        handlers, send, left, block_hook = (self.handlers, task.gen.send, self.ops_left,
                                            self.block_hook)
        while True:
            try:
                op = send(value)
            except StopIteration as stop:
                self.ops_left = left
                self.finish(task, stop.value)
                return
            except AlgorithmError:
                raise
            except Exception as error:
                error.add_note(f"raised by the algorithm on {self.where(task)}")
                raise
            handler = handlers.get(type(op))
            if handler is None:
                raise ProtocolError(f"rank {task.rank} yielded {op!r}, which is not an op")
            left -= 1
            if left < 0:
                raise RunLimitError(
                    f"the run passed its limit of {self.max_ops:g} ops (max_ops) while "
                    f"{self.where(task)} yielded {type(op).__name__}: an algorithm that "
                    "never ends? A larger run needs a larger max_ops")
            value = handler(task, op)
            if value is BLOCKED:
                self.ops_left = left
                if block_hook is not None:
                    block_hook(task)
                return

    def finish(self, task: Task, result: Any) -> None:
        """``task`` returned ``result``: check it left nothing behind, then wake its joiners."""
        if task.channel == MAIN_CHANNEL:  # a spawned task may leave its handles to others
            unwaited = [h for t in _task_tree(task) for h in t.outstanding]
            if unwaited:
                waits = "; ".join(h.describe() for h in unwaited)
                raise ProtocolError(f"rank {task.rank} (channel {task.channel!r}) returned "
                                    f"without waiting for: {waits}")
        unjoined = [c.channel for c in task.children if not c.joined]
        if unjoined:
            raise ProtocolError(f"rank {task.rank} (channel {task.channel!r}) returned without "
                                f"joining its tasks on channels {unjoined!r}")
        task.done, task.result = True, result
        self.live_channels.discard((task.rank, task.channel))
        self.on_finish(task)
        if task.joiners:
            task.joined = True
            for joiner in task.joiners:
                joiner.blocked_on = ""
                self.resume(joiner, result)

    def spawn(self, task: Task, op: Spawn) -> Any:
        child = self.open_task(task.rank, op.schedule, op.channel)
        if op.shares_rate:
            child.rate_channel = task.rate_channel
        task.children.append(child)
        return self.run_child_first(task, child)

    @abstractmethod
    def run_child_first(self, task: Task, child: Task) -> Any:
        """Run ``child`` until it blocks, then let ``task`` go on with the child as value."""

    def join(self, task: Task, op: Join) -> Any:
        child = op.task
        # Any task of the rank may join any other, any number of times (DDP and FSDP chain
        # their collectives on a stream so, and FSDP's compute waits on them too).
        if not isinstance(child, Task) or child is task or child.rank != task.rank:
            raise ProtocolError(f"rank {task.rank} joined {_named(child, task)}, which is not "
                                "another task of this rank (tasks come from Spawn)")
        if child.done:
            child.joined = True
            return child.result
        child.joiners.append(task)
        task.blocked_on = f"Join of its task on channel {child.channel!r}"
        return BLOCKED

    # -- checks --------------------------------------------------------------------------

    def check_peer(self, task: Task, peer: int, what: str) -> None:
        """A send or receive names another rank of the world (ops checked ``peer >= 0``)."""
        if peer == task.rank:
            raise ProtocolError(f"rank {task.rank} posted a {what} to itself; use Copy")
        if peer >= self.size:
            raise ProtocolError(f"rank {task.rank} posted a {what} with peer {peer}, but the "
                                f"world has {self.size} ranks")

    def buffer_problem(self, buf: Any) -> str | None:
        """What makes ``buf`` unfit as a buffer of this transport, in words, or None (a
        transport may add problems of its own buffers)."""
        return buffer_problem(buf, self.buffer_kinds, self.buffer_advice)

    def buffer_fits(self, buf: Any) -> bool:
        """Whether ``buf`` passes ``check_buffer`` (a transport may test it faster)."""
        return self.buffer_problem(buf) is None

    def check_buffer(self, task: Task, what: str, buf: Any, peer: int | None = None) -> None:
        """Refuse a buffer that is not one of ``buffer_kinds``, is a single element or is not
        contiguous, naming the rank, the op (``what``) and its peer, if it has one."""
        problem = self.buffer_problem(buf)
        if problem is not None:
            to = "" if peer is None else f" {'to' if what == 'Send' else 'from'} rank {peer}"
            raise ProtocolError(f"rank {task.rank} posted a {what}{to} on channel "
                                f"{task.channel!r} of {problem}")

    def accept_wait(self, task: Task, handles: tuple[Any, ...]) -> int:
        """Check that ``task`` may wait on ``handles`` and mark them waited; return how many
        of them are not done."""
        pending = 0
        for h in handles:
            if not isinstance(h, Handle):
                raise ProtocolError(f"rank {task.rank} waited on {_named(h, task)}, which is "
                                    "not a Send or Recv handle (join tasks with Join)")
            if h.task.rank != task.rank:
                raise ProtocolError(f"rank {task.rank} (channel {task.channel!r}) waited on a "
                                    f"handle that rank {h.task.rank} posted")
            if h.waited:
                raise ProtocolError(f"rank {task.rank} waited twice on its {h.describe()}")
            h.waited = True
            del h.task.outstanding[h]
            if not h.done:
                pending += 1
        if self.in_flight:  # buffers with memory (not size-only runs)
            flight = self.in_flight.get(task.rank)
            if flight:
                self._check_landing(task, handles, flight)
                for h in handles:
                    flight.discard(h)
        return pending

    def check_copy(self, task: Task, op: Copy | Combine) -> None:
        """A copy or a combine is between fit buffers of equal shape and dtype (a shape
        that differs would broadcast)."""
        what = type(op).__name__
        for buf in (op.src, op.dst):
            if not self.buffer_fits(buf):
                self.check_buffer(task, what, buf)
        if (getattr(op.dst, "shape", len(op.dst)) != getattr(op.src, "shape", len(op.src))
                or op.dst.dtype != op.src.dtype):
            def shape(buf: Any) -> str:
                return f"{tuple(getattr(buf, 'shape', (len(buf),)))} {buf.dtype}"
            verb = "copied" if isinstance(op, Copy) else "combined"
            raise ProtocolError(f"rank {task.rank} {verb} {shape(op.src)} into "
                                f"{shape(op.dst)}: a {what} takes buffers of one shape "
                                "and dtype")

    # -- memory --------------------------------------------------------------------------

    def guard(self, h: Handle) -> None:
        """Check a newly posted handle against the rank's memory in flight, then add it."""
        flight = self.in_flight.setdefault(h.task.rank, InFlight())
        if h.is_send:
            # The words are made only for an error: posting is the simulator's hot path.
            self._refuse_reading(h.task, h.span, lambda: f"posted a {h.describe()}, which reads",
                                 flight)
        self.posted += 1
        h.seq = self.posted
        flight.add(h)

    def check_local(self, task: Task, what: str, span_of: Callable[[Any], Span | None],
                    reads: tuple[Any, ...] = (), writes: tuple[Any, ...] = ()) -> None:
        """Check that a local op (``what``) reads and writes no memory in flight."""
        flight = self.in_flight.get(task.rank)
        if not flight:
            return
        for buf in reads:
            self._refuse_reading(task, span_of(buf), lambda: f"{what} reads", flight)
        for buf in writes:
            for other in flight.overlapping(span_of(buf)):
                if other.is_send:
                    raise ProtocolError(
                        f"rank {task.rank} {what} writes the buffer of its outstanding "
                        f"{other.describe()}; wait for that send first")
                raise ProtocolError(
                    f"rank {task.rank} {what} writes memory that its outstanding "
                    f"{other.describe()} writes; wait for that receive first")

    @staticmethod
    def _refuse_reading(task: Task, span: Span | None, what: Callable[[], str],
                        flight: InFlight) -> None:
        for other in flight.overlapping(span):
            if not other.is_send:
                raise ProtocolError(
                    f"rank {task.rank} {what()} memory that its outstanding {other.describe()} "
                    "writes; its data may land at any moment: wait for that receive first")

    @staticmethod
    def _check_landing(task: Task, handles: tuple[Any, ...],
                       flight: InFlight) -> None:
        # A receive lands when it is waited: not over a send still to be waited, and not
        # before an overlapping receive posted earlier.
        named: set[Handle] = set()
        for h in handles:
            named.add(h)
            if h.is_send or h.span is None:
                continue
            for other in flight.overlapping(h.span):
                if other is h:
                    continue
                if other.is_send and other not in handles:
                    raise ProtocolError(
                        f"rank {task.rank} waited on its {h.describe()}, which changes the "
                        f"buffer of its {other.describe()} before that send was waited")
                if not other.is_send and other.seq < h.seq and other not in named:
                    raise ProtocolError(
                        f"rank {task.rank} waited on its {h.describe()} before its "
                        f"{other.describe()}, posted earlier into the same memory: wait for "
                        "receives into one buffer in the order they were posted")


def _named(thing: object, task: Task) -> str:
    # What an op was given in place of a task or a handle, as the algorithm's author knows it.
    if isinstance(thing, (list, tuple)):
        return (f"a {type(thing).__name__} of {len(thing)} items (unpack it: "
                f"Wait(*handles))")
    if thing is task:
        return "itself"
    if isinstance(thing, Task):
        return f"a task of rank {thing.rank} (channel {thing.channel!r})"
    if isinstance(thing, Handle):
        return f"its {thing.describe()}"
    return repr(thing)
