"""The transport-free half of a collective benchmark, in the manner of nccl-tests.

``simcomm bench`` and ``realcomm bench`` share this module, so both print the same columns
and the two can be compared line by line. It knows nothing of how a collective is run: a
transport runs it and hands back the seconds it took (and, with ``check``, the results).

Public API:

* ``bench_config(algorithm, sizes, dtype, op, root, params, check, format, kind)
  -> BenchConfig``: checks a benchmark's settings and types them; raises ``ValueError``
  naming the bad flag and value. ``BenchConfig`` pickles, so a transport can hand it to
  the processes it starts.
  ``BenchConfig.check_world(world_size, local_size)`` checks what needs the world's shape
  (root ranges, parameter values a built-in algorithm refuses);
  ``BenchConfig.algorithm_kwargs()`` is what to pass to the algorithm besides ``comm`` and
  the buffer.
* ``buffer_count(collective, world_size, size, itemsize)``: per-rank input length.
* ``bench_row(collective, world_size, size, dtype, op, root, seconds, wrong) -> BenchRow``.
* ``check_inputs(world_size, count, dtype, op)`` and
  ``count_wrong(collective, inputs, results, op, root, params)``: the data check.
* ``rank_time(seconds, average)``: one time from every rank's, as nccl-tests' ``-a``.
* ``RunSpread.of(seconds)``: the spread of a size's runs (least, median, 90th and 99th
  percentiles, most, coefficient of variation), which a row carries when its transport
  timed every run (``realcomm bench -I``) or ran seeded samples (``simcomm bench
  --samples``); a table then prints it in six more columns, CSV in six more fields and JSON
  as ``spread`` with every run's time.
* ``RowWriter(stream, fmt, header_lines)``: rows printed as they come (``start``, ``write``
  each row, ``finish``), as nccl-tests prints them.
* ``format_table(rows, header_lines)``, ``format_csv(rows)``, ``format_json(rows)`` and
  ``format_rows(rows, fmt, header_lines)`` which picks one of them: the same, whole.
* ``parse_size``, ``parse_sizes``, ``size_range``, ``size_steps``: sizes as nccl-tests'
  flags spell them.
* ``params_from_items``: ``key=value`` texts typed as the algorithm's keyword arguments.
* ``DTYPES`` (nccl-tests type name -> numpy dtype; bfloat16 is ``ml_dtypes``'),
  ``type_name(dtype)``, ``CSV_HEADER``, ``FORMATS``, ``AVERAGES``.

The command-line flags that fill a ``BenchConfig`` are in ``algorithms.harness.cli``.

Unchecked rows have ``wrong = None``, printed ``N/A`` as nccl-tests prints a run without
its data check (``null`` in JSON).

What ``size`` and ``count`` mean follows nccl-tests (src/common.cu, ``TimeTest``; the
``GetCollByteCount`` function of each collective's .cu file): ``count = size / element
size``. All-reduce, broadcast and reduce move a buffer of ``count`` elements and print
``size`` and ``count`` as they are. All-gather, reduce-scatter and all-to-all give each rank
``count // p`` elements of the whole (rounded down, as nccl-tests does), print that per-rank
count, and print the size of the whole that is really moved, ``(count // p) * p`` elements.
(Recent nccl-tests releases also round that per-rank count down to whole 16-byte lines for
their kernels; that is a device detail, left out here.)

The per-rank input buffer (``buffer_count``) follows the conventions of
``algorithms.collectives``: all-gather and reduce-scatter take the full-length buffer of
``(count // p) * p`` elements (rank r owns chunk r), and all-to-all takes one rank's send
buffer, also ``(count // p) * p`` elements, chunk j going to rank j. The rest take ``count``.

Bandwidths are in GB/s with GB = 1e9 bytes: ``algbw = size / time`` and ``busbw = algbw *
factor`` with nccl-tests' factor per collective (doc/PERFORMANCE.md, ``Collective.bus_factor``).
A run that takes no time (one rank, say) moved nothing across a link: its bandwidths are 0.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, TextIO

import ml_dtypes
import numpy as np

from algorithms.harness.catalog import Collective, get_collective, is_user_algorithm
from algorithms.harness.units import parse_bytes
from algorithms.ops import Comm, ReduceOp

# nccl-tests' types, in its order (src/common.cu, test_typenames), as -d all runs them.
DTYPES: Mapping[str, np.dtype] = MappingProxyType({
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32), "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64), "uint64": np.dtype(np.uint64),
    "half": np.dtype(np.float16), "float": np.dtype(np.float32),
    "double": np.dtype(np.float64), "bfloat16": np.dtype(ml_dtypes.bfloat16),
})
_DTYPE_ALIASES = {"float16": "half", "float32": "float", "float64": "double"}
FORMATS = ("table", "csv", "json")
CSV_HEADER = "size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong"
# nccl-tests' -a: how the times of the ranks make the time of a row.
AVERAGES: Mapping[int, str] = MappingProxyType({
    0: "rank 0's time", 1: "the mean over ranks", 2: "the fastest rank's time",
    3: "the slowest rank's time",
})

# Gathered, scattered and exchanged collectives split their buffer into p equal parts.
_SPLIT_KINDS = ("allgather", "reducescatter", "alltoall")
# Arguments a harness sets itself: never through --param.
_FIXED_ARGUMENTS = ("comm", "x")
# The most sizes one run takes: each is a row (and, for realcomm, warm-up and timed runs), so
# more is a mistake, and -i over a wide range would otherwise build billions of them.
MAX_SIZES = 10_000


def parse_size(text: str) -> int:
    """Bytes from ``"1KiB"`` (1024), ``"1KB"`` (1000), ``"1K"`` (1024, as nccl-tests),
    ``"512"``; ``"1Kb"`` is refused as ambiguous (``units.parse_bytes``)."""
    return parse_bytes(text)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Bytes from a comma-separated list: ``"1KiB,1MiB,1GiB"``."""
    parts = text.split(",")
    if not any(part.strip() for part in parts):
        raise ValueError(f"--sizes {text!r} names no size")
    if len(parts) > MAX_SIZES:
        raise ValueError(f"--sizes names {len(parts):,} sizes, more than the {MAX_SIZES:,} a run "
                         "takes")
    for number, part in enumerate(parts, 1):
        if not part.strip():
            raise ValueError(f"--sizes {text!r}: item {number} is empty")
    return tuple(parse_size(part) for part in parts)


def size_range(minbytes: int, maxbytes: int, factor: int) -> tuple[int, ...]:
    """nccl-tests' ``-b minbytes -e maxbytes -f factor``: minbytes, minbytes*factor, ... up to
    and including maxbytes."""
    if not isinstance(factor, int) or factor < 2:
        raise ValueError(f"-f/--stepfactor must be an int >= 2, got {factor!r}")
    if minbytes < 1:
        raise ValueError(f"-b/--minbytes must be >= 1 byte to step by a factor, got {minbytes}")
    if minbytes > maxbytes:
        raise ValueError(f"-b/--minbytes ({minbytes}) is larger than -e/--maxbytes ({maxbytes})")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def size_steps(minbytes: int, maxbytes: int, stepbytes: int) -> tuple[int, ...]:
    """nccl-tests' ``-b minbytes -e maxbytes -i stepbytes``: minbytes, minbytes+stepbytes, ...
    up to and including maxbytes."""
    if stepbytes < 1:
        raise ValueError(f"-i/--stepbytes must be >= 1 byte, got {stepbytes}")
    if minbytes > maxbytes:
        raise ValueError(f"-b/--minbytes ({minbytes}) is larger than -e/--maxbytes ({maxbytes})")
    count = (maxbytes - minbytes) // stepbytes + 1
    if count > MAX_SIZES:  # counted, not built: it may be billions
        raise ValueError(f"-b {minbytes} -e {maxbytes} -i {stepbytes} make {count:,} sizes, more "
                         f"than the {MAX_SIZES:,} a run takes: give a larger -i/--stepbytes or "
                         "a narrower -b/-e range")
    return tuple(range(minbytes, maxbytes + 1, stepbytes))


def buffer_count(collective: Collective, world_size: int, size: int, itemsize: int) -> int:
    """Elements of each rank's input buffer for a run of ``size`` bytes (see module doc)."""
    count = size // itemsize
    if collective.kind in _SPLIT_KINDS:
        return count // world_size * world_size
    return count


# -- configuration ----------------------------------------------------------------------

@dataclass(frozen=True)
class BenchConfig:
    """The checked, typed settings of a benchmark (made by ``bench_config``); plain values
    only, so it pickles."""

    collective: Collective
    sizes: tuple[int, ...]
    dtype: np.dtype
    op: ReduceOp | None  # None for collectives without a reduction
    root: int | None  # None for collectives without a root
    check: bool = False
    format: str = "table"
    params: tuple[tuple[str, Any], ...] = ()  # (name, value) of the ``--param`` values

    @property
    def type_name(self) -> str:
        """The dtype as nccl-tests names it (a name of ``DTYPES``: float, half, bfloat16, ...)."""
        return type_name(self.dtype)

    def algorithm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the algorithm: op, root and the ``--param`` values."""
        kwargs = dict(self.params)
        if self.op is not None:
            kwargs["op"] = self.op
        if self.root is not None:
            kwargs["root"] = self.root
        return kwargs

    def check_world(self, world_size: int, local_size: int | None = None) -> None:
        """Raise ``ValueError`` if a root (``--root`` or ``--param root=``) is not a rank, or
        if a built-in algorithm refuses the ``--param`` values (``protocol=ll256``), before
        any rank runs: rank 0's schedule is started on a zero buffer of the smallest size
        (a view of one element, so that no size needs its memory), with no tuner, up to its
        first op, in a world of ``local_size`` ranks per node (``Comm.local_size``; ``None``:
        one node), as the run will have it."""
        for flag, root in (("--root", self.root), ("--param root", dict(self.params).get("root"))):
            if root is not None and not 0 <= root < world_size:
                raise ValueError(f"{flag} {root} is not a rank of a world of {world_size} "
                                 f"(0 to {world_size - 1})")
        if self.params and not is_user_algorithm(self.collective.name):
            count = buffer_count(self.collective, world_size, self.sizes[0], self.dtype.itemsize)
            zeros = np.broadcast_to(np.zeros(1, self.dtype), (count,))
            schedule = self.collective.function(Comm(0, world_size, local_size), zeros,
                                                **self.algorithm_kwargs())
            try:
                next(schedule)  # an algorithm checks its arguments before its first op
            except StopIteration:
                pass
            finally:
                schedule.close()


def bench_config(algorithm: str, sizes: Iterable[int], dtype: str = "float",
                 op: str | None = None, root: int | None = None, params: Iterable[str] = (),
                 check: bool = False, format: str = "table", kind: str | None = None
                 ) -> BenchConfig:
    """Check a benchmark's settings, as the bench flags spell them, and type them.

    ``algorithm`` is a collective's Python name or a user's ``module.path:function``, which
    implements ``kind`` (``catalog.get_collective``); ``sizes`` are bytes; ``dtype`` an nccl-tests
    or numpy type name; ``op`` a reduction (default sum, for collectives that reduce);
    ``root`` a rank (default 0, for collectives with a root); ``params`` ``key=value``
    texts for the algorithm's other keyword arguments; ``format`` one of ``FORMATS``.
    Raises ``ValueError`` naming the bad flag and value.
    """
    collective = get_collective(algorithm, kind)
    dtype_name = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype_name not in DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; known: "
                         f"{', '.join(list(_DTYPE_ALIASES) + list(DTYPES))}")
    numpy_dtype = DTYPES[dtype_name]
    if format not in FORMATS:
        raise ValueError(f"unknown --format {format!r}; known: {', '.join(FORMATS)}")
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("--sizes names no size")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"--sizes: a size must be an int >= 0 bytes, got {size!r}")
        if size > sys.maxsize:
            raise ValueError(f"--sizes: {size} B is too large; at most {sys.maxsize} B")
        if size % numpy_dtype.itemsize:
            raise ValueError(f"size {size} B is not a multiple of the {dtype_name} element "
                             f"size ({numpy_dtype.itemsize} B)")
    return BenchConfig(collective, sizes, numpy_dtype, _checked_op(collective, op),
                       _checked_root(collective, root), bool(check), format,
                       tuple(params_from_items(collective, params).items()))


def _checked_op(collective: Collective, op: str | None) -> ReduceOp | None:
    if not collective.takes_op:
        if op is not None:
            raise ValueError(f"--op: {collective.name} does not reduce, so it takes no op")
        return None
    if op is None:
        return ReduceOp.SUM
    if op.lower() == "mulsum":
        raise ValueError("--op mulsum: NCCL's pre-multiplied sum is not one of the reductions "
                         f"the algorithms implement; use {', '.join(o.value for o in ReduceOp)}")
    try:
        return ReduceOp(op.lower())
    except ValueError:
        raise ValueError(f"unknown --op {op!r}; known: "
                         f"{', '.join(o.value for o in ReduceOp)}") from None


def _checked_root(collective: Collective, root: int | None) -> int | None:
    if not collective.takes_root:
        if root is not None:
            raise ValueError(f"--root: {collective.name} has no root")
        return None
    if root is None:
        return 0
    if isinstance(root, bool) or not isinstance(root, int) or root < 0:
        raise ValueError(f"--root must be a rank >= 0, got {root!r}")
    return root


def params_from_items(collective: Collective, items: Iterable[str]) -> dict[str, Any]:
    """Parse `--param key=value` items into keyword arguments the algorithm accepts, with
    errors that name the bad item."""
    accepted = _settable_parameters(collective)
    params: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--param {item!r}: write it as key=value")
        if key in params:
            raise ValueError(f"--param {key} is given twice")
        if key not in accepted:
            raise ValueError(f"--param {key}: {_why_not_settable(collective, key)}; "
                             f"{collective.name} accepts: {', '.join(accepted) or 'none'}")
        value, default = _parse_value(text.strip()), accepted[key]
        if not _same_kind(value, default):
            raise ValueError(f"--param {key}={text}: expected a {type(default).__name__} "
                             f"like the default {default!r}")
        params[key] = value
    return params


def _settable_parameters(collective: Collective) -> dict[str, Any]:
    """Keyword parameters of the algorithm that --param may set, with their defaults."""
    reserved = set(_FIXED_ARGUMENTS)
    if collective.takes_op:
        reserved.add("op")
    if collective.takes_root:
        reserved.add("root")
    return {name: p.default
            for name, p in inspect.signature(collective.function).parameters.items()
            if name not in reserved and isinstance(p.default, (bool, int, float, str))}


def _why_not_settable(collective: Collective, key: str) -> str:
    if key in ("op", "root") and getattr(collective, f"takes_{key}"):
        return f"give it with --{key}"
    if key in _FIXED_ARGUMENTS:
        return "the benchmark sets it"
    if key in inspect.signature(collective.function).parameters:
        return "its value cannot be written on the command line"
    return f"{collective.name} has no such parameter"


def _parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return type(value) is type(default)


# -- rows -------------------------------------------------------------------------------

# The spread columns, after nccl-tests' own: microseconds, and the coefficient of variation.
SPREAD_COLUMNS = ("min_us", "p50_us", "p90_us", "p99_us", "max_us", "cv")


@dataclass(frozen=True)
class RunSpread:
    """How the runs of one size spread: every run's time and statistics of them."""

    runs_us: tuple[float, ...]  # every timed run (or sample), in order

    def __post_init__(self) -> None:
        if not self.runs_us or any(not (math.isfinite(t) and t >= 0) for t in self.runs_us):
            raise ValueError("a spread needs one or more run times, finite and >= 0")

    @classmethod
    def of(cls, seconds: Iterable[float]) -> RunSpread:
        """The spread of runs that took ``seconds`` each."""
        return cls(tuple(float(t) * 1e6 for t in seconds))

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0 to 100) in microseconds, interpolated as numpy does."""
        return float(np.percentile(self.runs_us, q))

    @property
    def cv(self) -> float:
        """Standard deviation over mean (population); 0 for runs that took no time."""
        mean = float(np.mean(self.runs_us))
        return float(np.std(self.runs_us)) / mean if mean > 0 else 0.0

    def columns(self) -> tuple[float, ...]:
        """The values of ``SPREAD_COLUMNS``."""
        return (min(self.runs_us), self.percentile(50), self.percentile(90),
                self.percentile(99), max(self.runs_us), self.cv)


@dataclass(frozen=True)
class BenchRow:
    """One line of results, in nccl-tests' columns. ``wrong`` is None when not checked."""

    size: int  # bytes
    count: int  # elements
    type: str
    redop: str
    root: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None
    # What ran, where the transport says (``Launch.describe``: ``ring/LL/8``); "" if not.
    algo: str = ""
    spread: RunSpread | None = None  # every run's time, where the transport kept them


def type_name(dtype: Any) -> str:
    """nccl-tests' name of a numpy dtype: a name of ``DTYPES`` (float, half, bfloat16, ...)."""
    dtype = np.dtype(dtype)
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no nccl-tests name; known: {', '.join(DTYPES)}")


def bench_row(collective: Collective, world_size: int, size: int, dtype: Any,
              op: ReduceOp | None, root: int | None, seconds: float, wrong: int | None,
              algo: str = "", spread: RunSpread | None = None) -> BenchRow:
    """The row for a run of ``size`` requested bytes that took ``seconds`` (running
    ``algo``, if the transport says; ``spread``, the times of its runs, if it kept them)."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"time must be finite and >= 0 seconds, got {seconds!r}")
    itemsize = np.dtype(dtype).itemsize
    moved = buffer_count(collective, world_size, size, itemsize)
    count = moved // world_size if collective.kind in _SPLIT_KINDS else moved
    nbytes = moved * itemsize
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return BenchRow(nbytes, count, type_name(dtype), "none" if op is None else op.value,
                    -1 if root is None else root, seconds * 1e6, algbw,
                    algbw * collective.bus_factor(world_size), wrong, algo, spread)


def rank_time(seconds: Sequence[float], average: int) -> float:
    """The time of a row from each rank's ``seconds``, as nccl-tests' ``-a`` (``AVERAGES``):
    0 rank 0's, 1 the mean, 2 the least, 3 the most."""
    if average not in AVERAGES:
        known = ", ".join(f"{k} ({v})" for k, v in AVERAGES.items())
        raise ValueError(f"-a/--average must be one of {known}; got {average!r}")
    if average == 0:
        return float(seconds[0])
    if average == 1:
        return float(np.mean(seconds))
    return float(min(seconds) if average == 2 else max(seconds))


# -- data check -------------------------------------------------------------------------

# Largest power of two up to which every integer is exact, and the largest exponent.
_FLOAT_EXACT = {np.dtype(np.float16): (2**11, 15), np.dtype(np.float32): (2**24, 127),
                np.dtype(np.float64): (2**53, 1023), DTYPES["bfloat16"]: (2**8, 127)}


def check_inputs(world_size: int, count: int, dtype: Any, op: ReduceOp | None,
                 seed: int = 0) -> list[np.ndarray]:
    """Deterministic per-rank inputs of ``count`` elements whose reduction is exact in any
    order, so results compare exactly with the reference.

    Small integers: float sums of values in -3..3 stay within the float's exact integers
    (smaller values on many ranks; an error where even -1..1 could not), float products of
    -2..2 are powers of two that cannot overflow (-1..1 where 2**p would), and integer types
    wrap the same way in any order.
    """
    dtype = np.dtype(dtype)
    exact, exponent = _FLOAT_EXACT.get(dtype, (None, None))
    high = 3
    if op is ReduceOp.PROD:
        high = 1 if exponent is not None and world_size > exponent else 2
    elif op in (ReduceOp.SUM, ReduceOp.AVG) and exact is not None:
        high = min(3, exact // world_size)
        if high < 1:
            raise ValueError(f"--check cannot make {type_name(dtype)} sums exact on "
                             f"{world_size} ranks (more than {exact})")
    return [np.random.default_rng([seed, rank]).integers(-high, high + 1, count).astype(dtype)
            for rank in range(world_size)]


def count_wrong(collective: Collective, inputs: Sequence[np.ndarray],
                results: Sequence[Any], op: ReduceOp | None, root: int | None,
                params: Mapping[str, Any]) -> int:
    """Elements that differ from the numpy reference, over all ranks with a defined result.

    Exact comparison is right for ``check_inputs`` data. A missing result, or one of the
    wrong length, counts every element it lacks or adds as wrong.
    """
    offered = dict(params)
    if op is not None:
        offered["op"] = op
    if root is not None:
        offered["root"] = root
    accepted = inspect.signature(collective.reference).parameters
    expected = collective.reference(
        list(inputs), **{k: v for k, v in offered.items() if k in accepted})
    wrong = 0
    for rank, (want, got) in enumerate(zip(expected, results)):
        if want is None:
            continue
        if got is None:
            wrong += len(want)
            continue
        got = np.asarray(got)
        if got.ndim == 0:
            raise ValueError(f"{collective.name}: rank {rank} returned the scalar "
                             f"{got.item()!r}, not an array of {len(want)} elements")
        common = min(len(want), len(got))
        wrong += int(np.count_nonzero(want[:common] != got[:common]))
        wrong += abs(len(want) - len(got))
    return wrong


# -- output -----------------------------------------------------------------------------

def _time_text(time_us: float) -> str:
    # nccl-tests (src/common.cu) keeps the time column 7 wide: fewer decimals as it grows.
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    if time_us >= 100.0:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def _table_heading(algo: bool, spread: bool = False) -> list[str]:
    names = ["min", "p50", "p90", "p99", "max"]
    return [f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
            f"{'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}"
            + ("".join(f"  {name:>7}" for name in names) + f"  {'cv':>6}" if spread else "")
            + ("  algo/proto/channels" if algo else ""),
            (f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
             f"{'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6} {'':>6}"
             + ("".join(f"  {'(us)':>7}" for _ in names) + f"  {'(%)':>6}" if spread
                else "")).rstrip()]


def _table_line(row: BenchRow) -> str:
    wrong = "N/A" if row.wrong is None else f"{row.wrong:5g}"
    spread = ""
    if row.spread is not None:
        *times, cv = row.spread.columns()
        spread = "".join(f"  {_time_text(t)}" for t in times) + f"  {cv * 100:6.2f}"
    return (f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {row.redop:>6}  "
            f"{row.root:6d}  {_time_text(row.time_us)}  {row.algbw_GBps:6.2f}  "
            f"{row.busbw_GBps:6.2f}  {wrong:>5}" + spread
            + (f"  {row.algo}" if row.algo else ""))


def _table_footer(rows: Sequence[BenchRow]) -> list[str]:
    failed = sum(1 for row in rows if row.wrong)
    average = sum(row.busbw_GBps for row in rows) / len(rows) if rows else 0.0
    return [f"# Out of bounds values : {failed} {'FAILED' if failed else 'OK'}",
            f"# Avg bus bandwidth    : {average:g}", "#"]


def _csv_line(row: BenchRow, spread: bool) -> str:
    fields = [str(row.size), str(row.count), row.type, row.redop, str(row.root),
              repr(row.time_us), repr(row.algbw_GBps), repr(row.busbw_GBps),
              "N/A" if row.wrong is None else str(row.wrong)]
    if spread:
        fields += ([repr(value) for value in row.spread.columns()] if row.spread is not None
                   else [""] * len(SPREAD_COLUMNS))
    return ",".join(fields)


class RowWriter:
    """Rows printed as they come, as nccl-tests prints them.

    A table: ``start`` writes the ``header_lines`` as ``#`` comments and, if
    ``algo_column`` says whether rows say what ran (``True``: the last column,
    algorithm/protocol/channels), the column heading; otherwise the heading waits for the
    first row, which tells. ``write`` prints each row at once and ``finish`` the summary
    (``# Out of bounds values``, ``# Avg bus bandwidth``). CSV streams the same way under
    ``CSV_HEADER``. JSON is one list, so ``finish`` writes it whole. Every write is flushed,
    so a reader sees each row when it is done. With ``spread``, rows carry the spread of
    their runs (``RunSpread``) and the table and CSV have its columns.
    """

    def __init__(self, stream: TextIO, fmt: str, header_lines: Sequence[str] = (),
                 algo_column: bool | None = None, spread: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        self._stream = stream
        self._fmt = fmt
        self._header_lines = tuple(header_lines)
        self._algo = algo_column
        self._spread = spread
        self.rows: list[BenchRow] = []  # those written so far

    @property
    def failed(self) -> bool:
        """Whether a row written so far found wrong values (the run should exit non-zero,
        as nccl-tests does)."""
        return any(row.wrong for row in self.rows)

    def start(self) -> None:
        """The header: the table's comments (and heading, if known), or the CSV header."""
        if self._fmt == "table":
            lines = [f"# {line}" for line in self._header_lines] + ["#"]
            self._emit(lines + (self._heading() if self._algo is not None else []))
        elif self._fmt == "csv":
            self._emit([CSV_HEADER + "".join(f",{name}" for name in SPREAD_COLUMNS)
                        if self._spread else CSV_HEADER])

    def write(self, row: BenchRow) -> None:
        """One row, printed now (JSON: kept for ``finish``)."""
        self.rows.append(row)
        if self._fmt == "table":
            heading = []
            if self._algo is None:
                self._algo = bool(row.algo)
                heading = self._heading()
            self._emit(heading + [_table_line(row)])
        elif self._fmt == "csv":
            self._emit([_csv_line(row, self._spread)])

    def finish(self) -> None:
        """The table's summary lines, or the JSON list of every row."""
        if self._fmt == "table":
            if self._algo is None:
                self._algo = False
                self._emit(self._heading())
            self._emit(_table_footer(self.rows))
        elif self._fmt == "json":
            self._stream.write(format_json(self.rows))
            self._stream.flush()

    def _heading(self) -> list[str]:
        return _table_heading(bool(self._algo), self._spread)

    def _emit(self, lines: Sequence[str]) -> None:
        self._stream.write("".join(line + "\n" for line in lines))
        self._stream.flush()


def format_table(rows: Sequence[BenchRow], header_lines: Sequence[str] = ()) -> str:
    """Rows as nccl-tests prints them, ``header_lines`` first as ``#`` comments; rows that
    say what ran get it in a last column (algorithm/protocol/channels), rows with the spread
    of their runs its columns."""
    return _written(rows, "table", header_lines, any(row.algo for row in rows))


def format_csv(rows: Sequence[BenchRow]) -> str:
    """Rows as CSV under ``CSV_HEADER`` (and ``SPREAD_COLUMNS`` if rows carry spreads);
    floats in full precision, unchecked wrong as N/A."""
    return _written(rows, "csv")


def format_json(rows: Sequence[BenchRow]) -> str:
    """Rows as a JSON list of objects keyed by the CSV columns, ``algo`` where the
    transport says what ran, and ``spread`` (``SPREAD_COLUMNS`` and ``runs_us``, every
    run's time) where rows carry one; unchecked wrong is null."""
    return json.dumps([_json_object(row) for row in rows], indent=2) + "\n"


def _json_object(row: BenchRow) -> dict[str, Any]:
    fields = {k: v for k, v in asdict(row).items() if k not in ("algo", "spread")}
    if row.algo:
        fields["algo"] = row.algo
    if row.spread is not None:
        fields["spread"] = dict(zip(SPREAD_COLUMNS, row.spread.columns()),
                                runs_us=list(row.spread.runs_us))
    return fields


def format_rows(rows: Sequence[BenchRow], fmt: str, header_lines: Sequence[str] = ()) -> str:
    """Rows in ``fmt`` (one of ``FORMATS``); only the table shows ``header_lines``."""
    if fmt == "table":
        return format_table(rows, header_lines)
    if fmt == "csv":
        return format_csv(rows)
    if fmt == "json":
        return format_json(rows)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def _written(rows: Sequence[BenchRow], fmt: str, header_lines: Sequence[str] = (),
             algo_column: bool | None = None) -> str:
    """What a ``RowWriter`` prints for ``rows``."""
    stream = io.StringIO()
    writer = RowWriter(stream, fmt, header_lines, algo_column,
                       spread=any(row.spread is not None for row in rows))
    writer.start()
    for row in rows:
        writer.write(row)
    writer.finish()
    return stream.getvalue()
