"""Property testing of collective algorithms: hypothesis strategies, and ``check_collective``,
which runs an algorithm through the simulator on many drawn cases and compares every rank's
result with a numpy reference.

    from algorithms.reference import allreduce_reference
    from simcomm.testing import check_collective

    def test_my_allreduce():
        check_collective(my_allreduce, allreduce_reference)

A case is a world size, one input buffer per rank, a topology with random bandwidths,
latencies and per-link latency jitter (so messages arrive in many different orders), and,
where the algorithm takes them, a reduce op and a root. Input values are small integers, so
every reduction is exact in floating point whatever order the ranks combine in; results are
therefore compared exactly, floats included.

This module needs hypothesis (``pip install hypothesis``, or the ``test`` extra).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

try:
    import hypothesis
    from hypothesis import strategies as st
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("simcomm.testing needs hypothesis: pip install hypothesis") from error

from algorithms.harness.catalog import KINDS
from algorithms.ops import Comm, ReduceOp
from algorithms.protocol import AlgorithmError
from simcomm.engine import Jitter, simulate
from simcomm.topology import Topology, fully_connected, hierarchical, ring, switch

DTYPES = tuple(np.dtype(name) for name in ("float16", "float32", "float64", "int32", "int64"))
"""The dtypes ``dtypes()`` draws from."""

# Falsifying examples list buffers up to this length in full.
_PRINTED_LENGTH = 32


def world_sizes(min_size: int = 1, max_size: int = 16) -> st.SearchStrategy[int]:
    """Numbers of ranks from ``min_size`` to ``max_size``; shrinks toward ``min_size``."""
    return st.integers(min_size, max_size)


def dtypes() -> st.SearchStrategy[np.dtype]:
    """float16, float32, float64, int32 and int64."""
    return st.sampled_from(DTYPES)


def reduce_ops() -> st.SearchStrategy[ReduceOp]:
    """Every ``ReduceOp``: SUM, PROD, MAX, MIN and AVG."""
    return st.sampled_from(list(ReduceOp))


def lengths(world_size: int, max_length: int = 3000) -> st.SearchStrategy[int]:
    """Buffer lengths from 0 to ``max_length``, often below ``3 * world_size``, where chunks
    of a split are empty or uneven, or next to a multiple of it (1, p - 1, p + 1, ...)."""
    small = min(max_length, 3 * world_size)
    return st.one_of(st.integers(0, small), st.sampled_from(_edges(world_size, max_length)),
                     st.integers(0, max_length))


def _edges(p: int, max_length: int) -> list[int]:
    # Lengths where splits into p chunks go wrong: none, fewer than p, one past a multiple.
    return sorted({n for n in (0, 1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p + 1)
                   if 0 <= n <= max_length})


# The largest integers each dtype holds exactly (int64's kept where int64 sums of 16 fit).
_EXACT = {"float16": 2**11, "float32": 2**24, "float64": 2**53, "int32": 2**31 - 1,
          "int64": 2**59}


def _value_range(dtype: np.dtype, op: ReduceOp | None, wide: bool = False) -> tuple[int, int]:
    # Sums of 16 values in [-3, 3] and products of 16 values in [-2, 2] stay within
    # float16's and float32's exact integers (2048 and 2**24). float16 products need
    # {-1, 0, 1}. Data movement has no arithmetic, so it gets more distinct values, which
    # makes a misplaced element likelier to show. ``wide``: values up to the dtype's exact
    # range (a sixteenth of it for sums), so that an algorithm that moves or reduces them
    # in a narrower type (float32 for float64, 32 bits for int64) is wrong.
    if op is ReduceOp.PROD:
        return (-1, 1) if dtype == np.float16 else (-2, 2)
    if wide and dtype.name in _EXACT:
        limit = _EXACT[dtype.name] // (16 if op in (ReduceOp.SUM, ReduceOp.AVG) else 1)
        return -limit, limit
    return (-1000, 1000) if op is None else (-3, 3)


def buffers(dtype: Any, length: int, op: ReduceOp | None = None
            ) -> st.SearchStrategy[np.ndarray]:
    """1-D arrays of ``length`` small integers in ``dtype`` whose reduction with ``op`` (by
    up to 16 ranks, in any order) is exact; ``op=None`` for collectives that only move data."""
    # Values come from a seeded generator rather than one draw per element: hypothesis caps
    # the data one example may draw (a few kilobytes), which 16 ranks x thousands of elements
    # exceed; and with one draw per buffer, shrinking the length keeps the other choices in
    # place, so the shrinker reaches short buffers (a shorter buffer is a prefix of a longer).
    dtype = np.dtype(dtype)
    return st.tuples(st.booleans(), st.integers(0, 2**32 - 1)).map(
        lambda drawn: _values(dtype, length, op, *drawn))


def _values(dtype: np.dtype, length: int, op: ReduceOp | None, wide: bool, seed: int
            ) -> np.ndarray:
    low, high = _value_range(dtype, op, wide)
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, length, endpoint=True).astype(dtype)


_BANDWIDTHS = st.floats(1e9, 1e12)  # bytes/second
_LATENCIES = st.floats(0.0, 1e-5, allow_subnormal=False)  # seconds


@st.composite
def topologies(draw: st.DrawFn, world_size: int) -> Topology:
    """Ring, fully connected, switch or hierarchical topologies of ``world_size`` ranks with
    random bandwidths, latencies and reduction bandwidths, switches that may reduce and
    multicast (NVLS), random extra latency per link, maybe a ceiling per ring channel
    between nodes (``Topology.net_channel_bandwidth``), maybe a channel count for the
    tuner's rings and trees (``Topology.channels``, more than a node's ranks too), and
    maybe a gap per slice of a ring's channel under Simple (``Topology.ring_slice_gap``)."""
    kind = draw(st.sampled_from(("ring", "fully_connected", "switch", "hierarchical")))
    bandwidth, latency = draw(_BANDWIDTHS), draw(_LATENCIES)
    reduce_bandwidth = draw(st.one_of(st.just(math.inf), _BANDWIDTHS))
    if kind == "hierarchical":
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        per_node = draw(st.sampled_from(divisors))
        topology = hierarchical(world_size // per_node, per_node, bandwidth, latency,
                                draw(_BANDWIDTHS), draw(_LATENCIES),
                                nic_per_gpu=draw(st.booleans()),
                                reduce_bandwidth=reduce_bandwidth)
        if draw(st.booleans()):
            topology = replace(topology, net_channel_bandwidth=draw(_BANDWIDTHS))
    else:
        build = {"ring": ring, "fully_connected": fully_connected, "switch": switch}[kind]
        topology = build(world_size, bandwidth, latency, reduce_bandwidth)
    switches = tuple(n for n in topology.nodes if n == "switch" or n.endswith(".switch"))
    if switches and draw(st.booleans()):  # switches that reduce and multicast (NVLS)
        topology = replace(topology, reducing_switches=switches,
                           switch_efficiency=draw(st.floats(0.1, 1.0)),
                           tree_switch_efficiency=draw(st.none() | st.floats(0.1, 1.0)),
                           tree_network_efficiency=draw(st.floats(0.1, 1.0)),
                           switch_latency=draw(_LATENCIES),
                           nvls_channels=draw(st.integers(1, 16)))
    if draw(st.booleans()):
        topology = replace(topology, channels=draw(st.integers(1, world_size + 2)))
    max_jitter = draw(_LATENCIES)
    if max_jitter > 0:
        topology = topology.with_latency_jitter(draw(st.integers(0, 2**32 - 1)), max_jitter)
    if draw(st.booleans()):
        topology = replace(topology, ring_slice_gap=draw(_LATENCIES))
    return topology


def jitters() -> st.SearchStrategy[Jitter | None]:
    """No delays, or seeded random delays of every message and computation (``Jitter``):
    messages between different ranks arrive, and tasks finish, in other orders."""
    return st.one_of(st.none(), st.builds(Jitter, st.integers(0, 2**32 - 1), _LATENCIES))


def _span(values: Sequence[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low:.4g} {unit}" if low == high else f"{low:.4g}..{high:.4g} {unit}"


def _describe_topology(topology: Topology) -> str:
    links = topology.links
    reduce = _span(topology.reduce_bandwidth, "B/s")
    if not links:
        return f"{topology.name} (no links, reduce bandwidth {reduce})"
    return (f"{topology.name} ({len(links)} links, bandwidth "
            f"{_span([link.bandwidth for link in links], 'B/s')}, latency "
            f"{_span([link.latency for link in links], 's')}, reduce bandwidth {reduce})")


@dataclass(frozen=True, repr=False)
class Case:
    """One run of a collective: per-rank inputs, a topology, and the op, root and other
    keyword arguments for the algorithm (``op``/``root`` are ``None`` where not taken)."""

    inputs: Sequence[np.ndarray]
    topology: Topology
    op: ReduceOp | None = None
    root: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    jitter: Jitter | None = None  # random delays of messages and computations

    def describe(self) -> str:
        """A one-line summary naming everything that defines the case."""
        sizes = {len(a) for a in self.inputs}
        length = f"length {sizes.pop()}" if len(sizes) == 1 else \
            f"lengths {[len(a) for a in self.inputs]}"
        dtype = self.inputs[0].dtype if self.inputs else "-"
        op = self.op.name if self.op is not None else "-"
        root = self.root if self.root is not None else "-"
        params = f", params {dict(self.params)}" if self.params else ""
        jitter = "" if self.jitter is None else (
            f", delays up to {self.jitter.max_delay:.4g} s (seed {self.jitter.seed})")
        return (f"world size {len(self.inputs)}, {length}, dtype {dtype}, op {op}, "
                f"root {root}{params}, topology {_describe_topology(self.topology)}{jitter}")

    def __repr__(self) -> str:
        inputs = [a.tolist() if len(a) <= _PRINTED_LENGTH else f"<{len(a)} values>"
                  for a in self.inputs]
        return f"Case({self.describe()}, inputs={inputs})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis prints falsifying examples with this; without it, it would list every
        # link of the topology.
        printer.text(repr(self))


def _parameters(fn: Callable[..., Any]) -> set[str] | None:
    """Names ``fn`` accepts by keyword; ``None`` if it takes ``**kwargs``."""
    names = set()
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind is not inspect.Parameter.POSITIONAL_ONLY:
            names.add(parameter.name)
    return names


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    names = _parameters(fn)
    return names is None or name in names


def _names_parameter(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_case(algorithm: Callable[..., Any], reference: Callable[..., Sequence[Any]],
               case: Case, in_place: bool | None = None) -> None:
    """Simulate ``algorithm`` on ``case`` and compare every rank's result with ``reference``,
    and with ``in_place`` also the rank's buffer where the result fits it (same length and
    dtype): a collective leaves its result there (``algorithms.collectives``), and callers
    such as realcomm's DDP read the buffer. None: as the catalog's collective of
    ``reference`` does (all but the all-to-all; in place for a reference of one's own).

    ``case.op`` and ``case.root`` (where not ``None``) and ``case.params`` go to the algorithm,
    and to the reference where it accepts them. Raises ``AssertionError`` naming the
    case, the rank, the first wrong index and the two values; a simulator error (deadlock,
    size mismatch, ...) becomes an ``AssertionError`` with the simulator's message.
    """
    __tracebackhide__ = True  # pytest then shows the failure from the user's test
    if in_place is None:
        in_place = all(kind.in_place for kind in KINDS.values() if kind.reference is reference)
    special = {k: v for k, v in (("op", case.op), ("root", case.root)) if v is not None}
    buffers: dict[int, Any] = {}  # the buffer each rank's algorithm was given

    @functools.wraps(algorithm)
    def given_buffers(comm: Comm, x: Any, **params: Any) -> Any:
        buffers[comm.rank] = x
        return algorithm(comm, x, **params)

    try:
        run = simulate(given_buffers, case.inputs, case.topology, record=False,
                       jitter=case.jitter, **special, **case.params)
    except AlgorithmError as error:
        raise AssertionError(f"{_name(algorithm)} failed in the simulator "
                             f"({type(error).__name__}): {error}\n  case: {case.describe()}"
                             ) from error
    except Exception as error:
        error.add_note(f"case: {case.describe()}")
        raise
    accepted = _parameters(reference)
    extra = {k: v for k, v in {**special, **case.params}.items()
             if accepted is None or k in accepted}
    expected = reference([np.array(a, copy=True) for a in case.inputs], **extra)
    if len(expected) != len(case.inputs):
        raise ValueError(f"{_name(reference)} returned {len(expected)} results for "
                         f"{len(case.inputs)} ranks")
    for rank, (got, want) in enumerate(zip(run.results, expected)):
        if want is None:
            continue  # the reference defines no result for this rank
        want = np.asarray(want)
        problem = _compare(got, want)
        if problem:
            raise AssertionError(f"{_name(algorithm)} is wrong on rank {rank}: {problem}\n"
                                 f"  case: {case.describe()}")
        mine = buffers[rank]
        if in_place and want.shape == mine.shape and want.dtype == mine.dtype:
            problem = _compare(mine, want)
            if problem:
                raise AssertionError(
                    f"{_name(algorithm)} returned the right result on rank {rank} but left "
                    f"its buffer without it (a result that fits the buffer is written in "
                    f"place): {problem.replace('returned', 'holds', 1)}\n"
                    f"  case: {case.describe()}")


def _compare(got: Any, want: np.ndarray) -> str:
    """Why ``got`` differs from ``want`` (exactly), or ``""`` if it does not."""
    if got is None:
        return f"returned None, expected {len(want)} x {want.dtype}"
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"returned shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"returned dtype {got.dtype}, expected {want.dtype}"
    wrong = np.flatnonzero(got != want)
    if len(wrong) == 0:
        return ""
    i = int(wrong[0])
    return (f"first wrong index {i}: got {got[i].item()!r}, expected {want[i].item()!r} "
            f"({len(wrong)} of {len(want)} elements wrong)")


ParamsStrategy = Callable[[int, int], st.SearchStrategy[Mapping[str, Any]]]


@st.composite
def _cases(draw: st.DrawFn, world_size_strategy: st.SearchStrategy[int], max_length: int,
           dtype_strategy: st.SearchStrategy[Any], op_strategy: st.SearchStrategy[ReduceOp],
           takes_op: bool, takes_root: bool, params: Mapping[str, Any] | ParamsStrategy
           ) -> Case:
    p = draw(world_size_strategy)
    n = draw(lengths(p, max_length))
    dtype = draw(dtype_strategy)
    op = draw(op_strategy) if takes_op else None
    drawn = dict(draw(params(p, n)) if callable(params) else params)
    root = None
    if takes_root:
        root = drawn.pop("root") if "root" in drawn else draw(st.integers(0, p - 1))
    inputs = [draw(buffers(dtype, n, op)) for _ in range(p)]
    return Case(inputs, draw(topologies(p)), op, root, drawn, draw(jitters()))


def _members(strategy: st.SearchStrategy[Any]) -> list[Any] | None:
    """The values ``strategy`` draws, in order, where it is a plain ``sampled_from``,
    ``just`` or ``integers`` strategy; ``None`` for any other."""
    inner = getattr(strategy, "wrapped_strategy", strategy)
    kind = type(inner).__name__
    if kind in ("SampledFromStrategy", "JustStrategy") and \
            not getattr(inner, "_transformations", ()):
        return list(inner.elements)
    if kind == "IntegersStrategy" and inner.start is not None and inner.end is not None:
        return list(range(inner.start, inner.end + 1))
    return None


def _corner_cases(world_size_strategy: st.SearchStrategy[int], max_length: int,
                  dtype_strategy: st.SearchStrategy[Any],
                  op_strategy: st.SearchStrategy[ReduceOp], takes_op: bool, takes_root: bool,
                  params: Mapping[str, Any] | ParamsStrategy) -> list[Case]:
    """Small cases run first, whatever hypothesis draws: every op with every dtype, world
    sizes 1 to 7 (odd ones too), lengths below, at and next to multiples of the world size
    and one long one, the last rank or a middle one as root, on a ring, a reducing switch
    and two nodes. None where a strategy is not a plain list of values or ``params`` is."""
    sizes, kinds = _members(world_size_strategy), _members(dtype_strategy)
    ops = _members(op_strategy) if takes_op else [None]
    if not (sizes and kinds and ops) or callable(params):
        return []
    sizes = [p for p in (2, 3, 1, 5, 4, 7, 6) if p in sizes] or sizes[:1]
    drawn = dict(params)
    cases = []
    for i in range(max(len(ops) * len(kinds), 2 * len(sizes), 12)):
        p, op = sizes[i % len(sizes)], ops[i % len(ops)]
        dtype = np.dtype(kinds[(i // len(ops)) % len(kinds)])
        n = min(max_length, (1, p + 1, 2 * p - 1, 0, p - 1, p, 997)[(i + i // len(sizes)) % 7])
        root = None
        if takes_root:
            root = drawn.get("root", p - 1 if i % 2 == 0 else p // 2)
        topology = ring(p, 1e9, 1e-6)
        if i % 3 == 1:
            topology = replace(switch(p, 1e9, 1e-6), reducing_switches=("switch",))
        elif i % 3 == 2 and p % 2 == 0:
            topology = hierarchical(2, p // 2, 1e9, 1e-6, 1e9, 1e-5)
        inputs = [_values(dtype, n, op, i % 4 >= 2, 1000 * i + rank) for rank in range(p)]
        cases.append(Case(inputs, topology, op, root,
                          {k: v for k, v in drawn.items() if k != "root"}))
    return cases


def check_collective(algorithm: Callable[..., Any], reference: Callable[..., Sequence[Any]], *,
                     world_sizes: st.SearchStrategy[int] = world_sizes(),
                     max_length: int = 3000,
                     dtypes: st.SearchStrategy[Any] = dtypes(),
                     ops: st.SearchStrategy[ReduceOp] = reduce_ops(),
                     params: Mapping[str, Any] | ParamsStrategy | None = None,
                     settings: hypothesis.settings | None = None,
                     in_place: bool | None = None) -> None:
    """Property-test ``algorithm`` against ``reference`` with hypothesis; raise on failure.

    Every drawn case (world size, length, dtype, op, root, topology, inputs: see ``Case``) is
    simulated and compared rank by rank with ``reference(inputs, **kwargs)``, a function like
    those in ``algorithms.reference``; a ``None`` in its result means the rank has no defined
    result. All ranks get inputs of one length.

    * ``op``: drawn from ``ops`` if ``algorithm`` has a parameter named ``op``; the reference
      must take it too.
    * ``root``: drawn from the ranks if ``algorithm`` has a parameter named ``root`` (unless
      ``params`` gives one).
    * ``params``: extra keyword arguments for the algorithm, as a mapping, or as a function
      ``(world_size, length) -> strategy of mappings`` for ones that depend on the case.
    * ``in_place``: whether a rank's buffer must hold its result too where the result fits
      it (same length and dtype), as ``check_case`` says; None: as the catalog's collective
      of ``reference`` works (every one but the all-to-all).
    * ``settings``: hypothesis settings (``max_examples``, ...); default: the loaded profile.
      Three are always overridden: the per-example deadline is off, since a case's cost
      grows with its size; so is ``print_blob``, since the test built here cannot be
      decorated with the ``@reproduce_failure`` it would suggest; and so is the explain
      phase, which would only point at lines of this module, at a cost of seconds.

    The reference gets ``op``, ``root`` and ``params`` where it accepts them (a ``tree`` flag
    changes how, not what; an all-reduce through a root gives the same result for any root).

    On failure hypothesis shrinks the case and raises the ``AssertionError`` of the smallest
    one it found, its falsifying example attached as a note. Call it from a plain test, not
    from inside another ``@given`` test.
    """
    __tracebackhide__ = True
    if not isinstance(max_length, int) or max_length < 0:
        raise ValueError(f"max_length must be an int >= 0, got {max_length!r}")
    takes_op = _names_parameter(algorithm, "op")
    takes_root = _names_parameter(algorithm, "root")
    # An op changes what the result is, so the reference needs it; a root may not (an
    # all-reduce through a root gives every rank the same result whichever root it is).
    if takes_op and not _accepts(reference, "op"):
        raise ValueError(f"{_name(algorithm)} takes 'op' but the reference "
                         f"{_name(reference)} does not")
    if isinstance(params, Mapping):
        accepted = _parameters(algorithm)
        unknown = [k for k in params if accepted is not None and k not in accepted]
        if unknown:
            raise ValueError(f"{_name(algorithm)} takes no parameters {unknown}")
    cases = _cases(world_sizes, max_length, dtypes, ops, takes_op, takes_root, params or {})

    def run(case: Case) -> None:
        check_case(algorithm, reference, case, in_place)

    # hypothesis names the test in its report ("Falsifying example: check_my_allreduce(...)").
    run.__name__ = run.__qualname__ = f"check_{_name(algorithm)}"
    test = hypothesis.given(case=cases)(run)
    # Explicit examples run first, in this order, and hypothesis reports the first that fails.
    for case in reversed(_corner_cases(world_sizes, max_length, dtypes, ops, takes_op,
                                       takes_root, params or {})):
        test = hypothesis.example(case=case)(test)
    base = settings or hypothesis.settings()
    phases = [phase for phase in base.phases if phase is not hypothesis.Phase.explain]
    hypothesis.settings(base, deadline=None, print_blob=False, phases=phases)(test)()
