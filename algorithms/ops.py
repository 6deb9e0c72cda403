"""The op vocabulary: plain, frozen data that an algorithm yields to its transport.

An algorithm is a per-rank generator function. It yields ops; the transport executes each
op and sends back its result (a handle, a buffer, a task's return value or ``None``); the
generator's return value is the rank's result. Ops carry no behaviour, so any transport
is a small interpreter loop over them.

Semantics every transport honours:

* ``Send`` and ``Recv`` are non-blocking and return a handle. ``Wait`` blocks until all of
  its handles are complete. Every handle must be waited exactly once.
* A send's buffer must not change until the send has been waited. A receive's buffer holds
  the incoming data (or the reduction of it into the old contents) once the receive has been
  waited, not before.
* Messages between an ordered pair of ranks match in the order they were posted, per channel.
  A task runs on one channel; ``Spawn`` starts a concurrent task on another one.
"""

from __future__ import annotations

import enum
import inspect
import math
import operator
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any


class ReduceOp(enum.Enum):
    """How a receive with reduction combines incoming data with the buffer's contents."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"  # summed on the way, divided by the world size once at the end


SUM, PROD, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG


class Protocol(enum.Enum):
    """How a message's bytes travel, after NCCL's three protocols (NVIDIA/nccl,
    src/device/prims_simple.h, prims_ll.h, prims_ll128.h). The data are the same under each;
    only the cost differs, and a simulator charges it (``simcomm.engine``):

    * ``SIMPLE``: large chunks, then a memory fence and a flag per chunk; the whole bandwidth,
      the highest latency per step.
    * ``LL`` (low latency): 8-byte lines of 4 data bytes and a 4-byte flag, so no fence;
      the least latency, half the bandwidth.
    * ``LL128``: 128-byte lines of 120 data bytes and an 8-byte flag; between the two.
    """

    SIMPLE = "simple"
    LL = "ll"
    LL128 = "ll128"


_SIMPLE = Protocol.SIMPLE  # Send's common case, checked with one identity test per message


# NCCL runs a collective on at most 64 channels (MAXCHANNELS, NVIDIA/nccl v2.26.2
# src/include/device.h).
MAX_CHANNELS = 64


def check_channels(channels: object, zero_means: str = "") -> int:
    """``channels`` if it is a channel count NCCL could run, 1 to ``MAX_CHANNELS`` (or 0
    where ``zero_means`` says what 0 stands for); else a ValueError naming it."""
    least = 0 if zero_means else 1
    if type(channels) is not int or not least <= channels <= MAX_CHANNELS:
        meaning = f"0: {zero_means}; " if zero_means else ""
        raise ValueError(f"channels must be an int from {least} to {MAX_CHANNELS} ({meaning}"
                         f"NCCL runs at most {MAX_CHANNELS}), got {channels!r}")
    return channels


def check_root(root: object, size: int) -> int:
    """``root`` if it is a rank of a world of ``size``; else a ValueError naming it."""
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(f"root must be a rank in [0, {size}), got {root!r}")
    return root


# What a tuner is called with and answers (``Comm.tuner``).
TUNER_SHAPE = "(collective, nbytes) -> Choice"


def check_callback(callback: Any, arguments: int, name: str, shape: str) -> None:
    """Refuse, before the run, a ``callback`` that is not callable or cannot take
    ``arguments`` positional arguments (it would fail only when first called, deep in the
    run)."""
    if callback is None:
        return
    if not callable(callback):
        raise TypeError(f"{name} must be callable {shape}, got {callback!r}")
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # a builtin without one: it is called as it is
        return
    try:
        signature.bind(*range(arguments))
    except TypeError:
        raise TypeError(f"{name} must be callable {shape}: {callback!r} cannot take "
                        f"{arguments} argument{'s' if arguments > 1 else ''}") from None


def check_divisible(dtype: object) -> None:
    """Refuse a ``Divide`` (op=AVG) of a buffer of ``dtype`` where the mean has no meaning:
    numpy's or torch's bool."""
    if str(dtype) in ("bool", "torch.bool"):
        raise TypeError("Divide of a bool buffer (op=AVG): a mean of booleans is no boolean; "
                        "use SUM or MAX (logical or), MIN or PROD (and), or a numeric dtype")


def check_flag(value: object, name: str) -> bool:
    """``value`` if it is True or False; else a ValueError naming ``name`` (a string such as
    "false" would otherwise count as true)."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _rank(value: object, what: str) -> int:
    """``value`` as a plain int if it is a non-negative integer of any type that
    ``operator.index`` takes (a numpy integer, say) other than bool; else a ValueError
    naming ``what``."""
    try:
        rank = operator.index(value)
    except TypeError:
        rank = -1
    if isinstance(value, bool) or rank < 0:
        raise ValueError(f"{what} must be a non-negative int rank, got {value!r}")
    return rank


@dataclass(frozen=True, slots=True, eq=False)
class Send:
    """Send ``buf`` to rank ``peer``. Returns a handle to ``Wait`` on.

    ``label`` names the step in traces and timelines (``"reduce-scatter 2"``); ``protocol``
    says how the bytes travel (``Protocol``), which only a cost model heeds.
    """

    peer: int
    buf: Any
    label: str = ""
    protocol: Protocol = Protocol.SIMPLE
    # A contribution to the peer's ``RecvReduce``: in a switch that reduces, the switch sums
    # the contributions on their way and pulls them when the receive is posted.
    in_switch: bool = False

    def __post_init__(self) -> None:
        # type() rather than isinstance(): it turns bools away, and ops are made per message.
        if type(self.peer) is not int or self.peer < 0:
            object.__setattr__(self, "peer", _rank(self.peer, "Send.peer"))
        if self.protocol is not _SIMPLE and type(self.protocol) is not Protocol:
            raise TypeError(f"Send.protocol must be a Protocol, got {self.protocol!r}")
        if self.in_switch is not False and self.in_switch is not True:
            raise TypeError(f"Send.in_switch must be a bool, got {self.in_switch!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Recv:
    """Receive from rank ``peer`` into ``buf``; with ``reduce``, combine into it instead.

    The transport owns any scratch space a reducing receive needs and charges the reduction.
    Returns a handle to ``Wait`` on. ``label`` names the step in traces and timelines.
    """

    peer: int
    buf: Any
    reduce: ReduceOp | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if type(self.peer) is not int or self.peer < 0:
            object.__setattr__(self, "peer", _rank(self.peer, "Recv.peer"))
        if self.reduce is not None and type(self.reduce) is not ReduceOp:
            raise TypeError(f"Recv.reduce must be a ReduceOp or None, got {self.reduce!r}")


def _check_peers(op: Multicast | RecvReduce) -> None:
    # Sets op.peers to its ranks as plain ints.
    what, peers = type(op).__name__, op.peers
    if type(peers) is not tuple or not peers:
        raise TypeError(f"{what}.peers must be a non-empty tuple of ranks, got {peers!r}")
    name = f"{what}.peers"
    ranks = tuple(_rank(peer, name) for peer in peers)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{what}.peers names a rank twice: {peers!r}")
    object.__setattr__(op, "peers", ranks)


@dataclass(frozen=True, slots=True, eq=False)
class Multicast:
    """Send ``buf`` to every rank of ``peers``, each of which posts a plain ``Recv``.
    Returns a tuple of handles, one per peer, to ``Wait`` on.

    Through a switch that multicasts (NVLink SHARP's ``multimem.st``) the data cross the
    sender's link once and the switch copies them to every member of the group, the sender
    included; elsewhere it is a ``Send`` to each peer. Always under the Simple protocol.
    """

    peers: tuple[int, ...]
    buf: Any
    label: str = ""

    def __post_init__(self) -> None:
        _check_peers(self)


@dataclass(frozen=True, slots=True, eq=False)
class RecvReduce:
    """Combine into ``buf`` with ``op`` what every rank of ``peers`` sends it, each with a
    ``Send(..., in_switch=True)``. Returns a tuple of handles, one per peer, to ``Wait`` on
    together.

    A switch that reduces (NVLink SHARP's ``multimem.ld_reduce``) pulls the contributions
    when the receive is posted, the receiver's own included, sums them, and sends the sum
    across the receiver's link once; elsewhere it is a reducing ``Recv`` from each peer.
    """

    peers: tuple[int, ...]
    buf: Any
    op: ReduceOp = ReduceOp.SUM
    label: str = ""

    def __post_init__(self) -> None:
        _check_peers(self)
        if type(self.op) is not ReduceOp:
            raise TypeError(f"RecvReduce.op must be a ReduceOp, got {self.op!r}")


@dataclass(frozen=True, slots=True, eq=False, init=False)
class Wait:
    """Block until every handle is complete: ``yield Wait(h1, h2, ...)``."""

    handles: tuple[Any, ...]

    def __init__(self, *handles: Any) -> None:
        if not handles:
            raise ValueError("Wait needs at least one handle")
        object.__setattr__(self, "handles", handles)


@dataclass(frozen=True, slots=True, eq=False)
class Compute:
    """Occupy the rank's compute stream for ``seconds`` (a layer's backward, say).

    ``work``, if given, is the computation itself (a callable taking no arguments): a
    transport that runs real tensors calls it instead of waiting ``seconds``; the simulator
    charges ``seconds`` and never calls it.
    """

    seconds: float
    label: str = "compute"
    work: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and not isinstance(self.seconds, bool)
                and math.isfinite(self.seconds)
                and self.seconds >= 0):
            raise ValueError(f"Compute.seconds must be finite and >= 0, got {self.seconds!r}")
        if self.work is not None and not callable(self.work):
            raise TypeError(f"Compute.work must be callable or None, got {self.work!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Sleep:
    """Hold this task for ``seconds``, occupying nothing (no stream, link or memory): a
    whole collective timed as one event (the simulator's collective level), or a rank
    slowed on purpose."""

    seconds: float
    label: str = "sleep"

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and not isinstance(self.seconds, bool)
                and math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"Sleep.seconds must be finite and >= 0, got {self.seconds!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Copy:
    """Copy ``src`` into ``dst`` on this rank (same length and dtype)."""

    dst: Any
    src: Any


@dataclass(frozen=True, slots=True, eq=False)
class Combine:
    """Combine ``src`` into ``dst`` on this rank with ``op``, element by element (same length
    and dtype): a local reduction, charged as a reducing receive's. ``AVG`` combines as a
    sum (divide once at the end)."""

    dst: Any
    src: Any
    op: ReduceOp

    def __post_init__(self) -> None:
        if type(self.op) is not ReduceOp:
            raise TypeError(f"Combine.op must be a ReduceOp, got {self.op!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Divide:
    """Divide ``buf`` in place by ``divisor`` (integers truncate toward zero, as C does)."""

    buf: Any
    divisor: int

    def __post_init__(self) -> None:
        if not isinstance(self.divisor, int) or self.divisor < 1:
            raise ValueError(f"Divide.divisor must be an int >= 1, got {self.divisor!r}")
        check_divisible(getattr(self.buf, "dtype", None))


@dataclass(frozen=True, slots=True, eq=False)
class Alloc:
    """Return a new buffer of ``count`` elements of the same kind and dtype as ``like``."""

    count: int
    like: Any

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"Alloc.count must be an int >= 0, got {self.count!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Spawn:
    """Run ``schedule`` (a generator of ops) concurrently on ``channel``; returns a task.

    Messages of concurrent tasks must not cross, so each live task of a rank needs its own
    channel; ranks talk to each other on the same channel name. With ``shares_rate`` the
    task sends at its spawner's rate, the share of the GPU its channel's kernel gets, which
    only a cost model heeds: NCCL's tree runs its up and down streams on the threads of one
    channel.
    """

    schedule: Generator[Any, Any, Any]
    channel: Hashable
    shares_rate: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, Generator):
            raise TypeError(
                f"Spawn.schedule must be a generator (call the algorithm), got {self.schedule!r}")
        if self.shares_rate is not False and self.shares_rate is not True:
            raise TypeError(f"Spawn.shares_rate must be a bool, got {self.shares_rate!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Join:
    """Block until a spawned task ends; returns the task's return value.

    Any task of the rank may join any other task of the rank, any number of times (a task
    may wait for its sibling, as DDP's buckets queue on one comm stream); every spawned task
    must be joined at least once before its spawner returns.
    """

    task: Any


@dataclass(frozen=True, slots=True, eq=False)
class Footprint:
    """Account ``delta`` bytes more (negative: fewer) to this rank's memory from now on.

    Schedules say with it what they hold (FSDP's gathered parameters, a unit's gradients)
    so that a simulation can report memory over time; on real hardware memory is real and
    the op does nothing.
    """

    delta: int
    label: str = ""

    def __post_init__(self) -> None:
        if type(self.delta) is not int:
            raise ValueError(f"Footprint.delta must be an int of bytes, got {self.delta!r}")


@dataclass(frozen=True, slots=True, eq=False)
class Launch:
    """A collective's kernel starts here, running ``protocol``. A simulator charges the
    machine's fixed cost of starting one (NCCL's base latency per protocol); on real
    hardware the launch costs what it costs and the op does nothing. ``algorithm`` and
    ``channels`` say what runs, for reports (as NCCL_DEBUG=INFO does). ``fill_bytes`` are
    the bytes of each GPU's buffer that pass the kernel's pipeline stages before it runs at
    its steady pace (``algorithms.nvls.pipeline_fill_bytes``): a simulator charges them at
    that pace where a switch reduces. ``one_way``: a reduce-scatter or all-gather in the
    switch, whose pace is the switch's rate over each GPU's link (the buffer crosses it one
    way), where an all-reduce's buffer crosses it both ways."""

    protocol: Protocol = Protocol.SIMPLE
    algorithm: str = ""
    channels: int = 1
    fill_bytes: int = 0
    one_way: bool = False

    def __post_init__(self) -> None:
        if type(self.protocol) is not Protocol:
            raise TypeError(f"Launch.protocol must be a Protocol, got {self.protocol!r}")
        check_channels(self.channels)
        if type(self.fill_bytes) is not int or self.fill_bytes < 0:
            raise ValueError(f"Launch.fill_bytes must be an int >= 0, got {self.fill_bytes!r}")
        check_flag(self.one_way, "Launch.one_way")

    def describe(self) -> str:
        """``algorithm/PROTOCOL/channels``, as ``simcomm bench`` shows it: ``ring/LL/8``."""
        return f"{self.algorithm or '?'}/{self.protocol.value.upper()}/{self.channels}"


Op = (Send | Recv | Multicast | RecvReduce | Wait | Compute | Sleep | Copy | Combine | Divide
      | Alloc | Spawn | Join | Footprint | Launch)


@dataclass(frozen=True, slots=True)
class Choice:
    """How to run one collective call, as NCCL's tuner decides it: the ``algorithm``
    (``"ring"``, ``"tree"``, ``"hierarchical"``, ``"nvls"``, ``"nvls_tree"``), the
    ``protocol`` and the number of ``channels``."""

    algorithm: str
    protocol: Protocol
    channels: int


# A tuner: (collective, bytes per rank) -> how to run it. Collectives are named as
# nccl-tests names them: "allreduce", "reducescatter", "allgather". A tuner may also have a
# method best_for(collective, bytes per rank, algorithm) -> Choice: its pick when the caller
# forces the algorithm (as NCCL_ALGO does); without one the forced algorithm runs under the
# protocol of the tuner's own pick. And a method best_with(collective, bytes per rank,
# protocol) -> Choice: its pick when the caller forces the protocol alone (as NCCL_PROTO
# does); without one the tuner's pick runs under the forced protocol (the ring, if the pick
# runs in the switch, which takes Simple only). And best_outside_switch(collective, bytes
# per rank, protocol or None) -> Choice: its pick for a reduction the switch cannot do;
# without one the ring runs.
Tuner = Callable[[str, int], Choice]


@dataclass(frozen=True, slots=True)
class Comm:
    """What a rank knows of its group: its own rank, the world size, and how many ranks
    share a node (``local_size``; ranks r and s share one when r // local_size equals
    s // local_size). Hierarchical algorithms use the last; ``None`` means one node.

    ``tuner``, if the transport has one, chooses algorithm, protocol and channels per call
    for the collectives that let it (``algorithms.tuned.nccl_allreduce``); the simulator's
    comes from its cost model. Every rank must get the same answers from it."""

    rank: int
    size: int
    local_size: int | None = None
    tuner: Tuner | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"world size must be an int >= 1, got {self.size!r}")
        if (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                or not 0 <= self.rank < self.size):
            raise ValueError(f"rank must be an int in [0, {self.size}), got {self.rank!r}")
        if self.local_size is not None and (
                type(self.local_size) is not int or self.local_size < 1
                or self.size % self.local_size):
            raise ValueError(f"local_size must be an int >= 1 that divides the world size "
                             f"{self.size}, got {self.local_size!r}")
        if self.tuner is not None and not callable(self.tuner):
            raise TypeError(f"tuner must be callable {TUNER_SHAPE}, got {self.tuner!r}")

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node: ``local_size``, or the whole world on one node."""
        return self.size if self.local_size is None else self.local_size
