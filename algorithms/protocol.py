"""The rules of the ops, in one place, for every transport.

``algorithms.ops`` says what the ops are; this module says what they mean and which misuse
is an error: tasks and their channels, handles and waits, spawning and joining, peers. Both
interpreters (``simcomm``'s engine and ``realcomm``'s driver) subclass ``Interpreter`` and
keep only what is theirs: the simulator its clock, links and costs; the driver its torch
works and threads. So a rule cannot differ between them, and an error is the same class
whichever transport raised it.

The rules:

* A rank runs one main task on ``MAIN_CHANNEL``; ``Spawn`` starts another task of the same
  rank on a channel that no live task of that rank uses. The child runs first, until it
  blocks; then its spawner goes on.
* ``Send`` and ``Recv`` name a peer other than the rank itself, inside the world. They
  return a handle that the task that posted it waits exactly once, before the task returns.
* ``Join`` names another task of the same rank; any task may join any other, any number of
  times; every spawned task is joined at least once before its spawner returns.
* ``Copy`` copies between buffers of equal length and dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Hashable
from typing import Any

from algorithms.ops import (
    Alloc, Compute, Copy, Divide, Footprint, Join, Recv, ReduceOp, Send, Spawn, Wait,
)

MAIN_CHANNEL = 0
BLOCKED = object()  # what an op handler returns when its task cannot go on yet


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


class Task:
    """One task of a rank: a generator of ops running on a channel.

    Interpreters subclass it (with ``__slots__``) for what they track besides.
    """

    __slots__ = ("rank", "channel", "gen", "outstanding", "children", "joiners", "joined",
                 "done", "result", "blocked_on")

    def __init__(self, rank: int, channel: Hashable, gen: Generator[Any, Any, Any]) -> None:
        self.rank, self.channel, self.gen = rank, channel, gen
        self.outstanding: dict[Handle, None] = {}  # posted, not yet waited; in posting order
        self.children: list[Task] = []
        self.joiners: list[Task] = []
        self.joined = False
        self.done = False
        self.result: Any = None
        self.blocked_on = ""  # what a blocked task waits for, in words, besides handles


class Handle:
    """What a ``Send`` or a ``Recv`` returns to the algorithm.

    Interpreters subclass it (with ``__slots__``) for what they track besides. Handles
    compare by identity, so a task's outstanding handles can be a dict.
    """

    __slots__ = ("task", "is_send", "peer", "buf", "reduce", "label", "waited")

    def __init__(self, task: Task, is_send: bool, peer: int, buf: Any,
                 reduce: ReduceOp | None, label: str) -> None:
        self.task, self.is_send, self.peer, self.buf, self.reduce = (
            task, is_send, peer, buf, reduce)
        self.label = label
        self.waited = False
        task.outstanding[self] = None

    def describe(self) -> str:
        """The handle in words, for error messages."""
        what = "Send to" if self.is_send else "Recv from"
        return (f"{what} rank {self.peer} on channel {self.task.channel!r} "
                f"({len(self.buf)} x {self.buf.dtype})")


class Interpreter(ABC):
    """What every transport does the same way: dispatching ops and enforcing their rules.

    A subclass implements one method per op that touches data, time or the wire (``send``,
    ``recv``, ``wait``, ``compute``, ``copy``, ``divide``, ``alloc``, ``footprint``),
    ``new_task``, ``run_child_first`` (how a spawned task gets to run before its spawner)
    and ``resume`` (let a blocked task go on), and may override the hooks ``on_block``,
    ``on_finish`` and ``context``. A handler returns the value to send back into the
    generator, or ``BLOCKED`` when the task must wait; the interpreter later resumes it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.live_channels: set[tuple[int, Hashable]] = set()
        self.handlers: dict[type, Callable[[Any, Any], Any]] = {
            Send: self.send, Recv: self.recv, Wait: self.wait, Compute: self.compute,
            Copy: self.copy, Divide: self.divide, Alloc: self.alloc, Spawn: self.spawn,
            Join: self.join, Footprint: self.footprint,
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

    def context(self, task: Task) -> str:
        """Where an algorithm's own exception was raised, added to it as a note."""
        return f"raised by the algorithm on rank {task.rank} (channel {task.channel!r})"

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
    def copy(self, task: Any, op: Copy) -> Any:
        """Call ``check_copy``, then copy."""

    @abstractmethod
    def divide(self, task: Any, op: Divide) -> Any:
        """Divide a buffer in place."""

    @abstractmethod
    def alloc(self, task: Any, op: Alloc) -> Any:
        """Return a new zeroed buffer like ``op.like``."""

    def footprint(self, task: Any, op: Footprint) -> Any:
        """Account memory (the simulator) or nothing (real memory is real)."""
        return None

    # -- tasks ---------------------------------------------------------------------------

    def open_task(self, rank: int, gen: Generator[Any, Any, Any], channel: Hashable) -> Task:
        """A new task of ``rank`` on ``channel``, which no live task of the rank may use."""
        key = (rank, channel)
        if key in self.live_channels:
            raise ProtocolError(f"rank {rank} spawned a task on channel {channel!r}, which a "
                                "live task of that rank already uses: concurrent tasks need "
                                "distinct channels")
        task = self.new_task(rank, channel, gen)
        self.live_channels.add(key)
        return task

    def step(self, task: Task, value: Any) -> None:
        """Run ``task`` from where it stopped, sending ``value`` in, until it blocks or ends."""
        handlers, send = self.handlers, task.gen.send
        while True:
            try:
                op = send(value)
            except StopIteration as stop:
                self.finish(task, stop.value)
                return
            except AlgorithmError:
                raise
            except Exception as error:
                error.add_note(self.context(task))
                raise
            handler = handlers.get(type(op))
            if handler is None:
                raise ProtocolError(f"rank {task.rank} yielded {op!r}, which is not an op")
            value = handler(task, op)
            if value is BLOCKED:
                self.on_block(task)
                return

    def finish(self, task: Task, result: Any) -> None:
        """``task`` returned ``result``: check it left nothing behind, then wake its joiners."""
        if task.outstanding:
            waits = "; ".join(h.describe() for h in task.outstanding)
            raise ProtocolError(f"rank {task.rank} (channel {task.channel!r}) returned without "
                                f"waiting for: {waits}")
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
            raise ProtocolError(f"rank {task.rank} joined {child!r}, which is not another "
                                "task of this rank (tasks come from Spawn)")
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

    def accept_wait(self, task: Task, handles: tuple[Any, ...]) -> None:
        """Check that ``task`` may wait on ``handles`` and mark them waited."""
        for h in handles:
            if not isinstance(h, Handle):
                raise ProtocolError(f"rank {task.rank} waited on {h!r}, which is not a Send "
                                    "or Recv handle (join tasks with Join)")
            if h.task is not task:
                raise ProtocolError(f"rank {task.rank} (channel {task.channel!r}) waited on a "
                                    "handle that another task posted")
            if h.waited:
                raise ProtocolError(f"rank {task.rank} waited twice on its {h.describe()}")
            h.waited = True
            del task.outstanding[h]

    def check_copy(self, task: Task, op: Copy) -> None:
        """A copy is between buffers of equal length and dtype."""
        if len(op.dst) != len(op.src) or op.dst.dtype != op.src.dtype:
            raise ProtocolError(f"rank {task.rank} copied {len(op.src)} x {op.src.dtype} into "
                                f"{len(op.dst)} x {op.dst.dtype}")
