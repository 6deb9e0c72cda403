"""Sweeps: simulate a grid of algorithms x sizes x topologies x ranks x bandwidths x latencies
and turn the rows into a CSV, plots and a crossover table.

* ``Grid`` holds the axes; ``Grid.points()`` checks every axis and lists the grid points.
  Builder topologies (``ring``, ``fully_connected``, ``switch``, ``hierarchical``) take every
  ranks x bandwidth x latency combination; a preset or a topology file brings its own ranks
  and links, so it is one point per algorithm and size, with empty bandwidth and latency.
* ``run_sweep(points, jobs)`` simulates them, size-only and without a trace, in ``jobs``
  processes (one task per point); rows come back in the order of the points whatever the
  order in which they finish, so the output does not depend on ``jobs``.
* ``write_csv`` / ``read_csv``: the rows under ``SWEEP_HEADER``, the bench columns after
  ``algorithm, topology, ranks, bandwidth, latency``. ``read_bench_csv`` reads the plain
  bench columns that ``simcomm bench`` and ``realcomm bench`` print with ``--format csv``.
* ``crossovers(rows)`` / ``format_crossovers``: which algorithm is fastest over which range
  of sizes, per collective, topology, ranks, bandwidth and latency.
* ``write_plots`` draws one PNG per ranks x bandwidth x latency combination (see
  ``simcomm.plots``; matplotlib is only imported there).

An algorithm is written ``NAME`` or ``NAME:key=value,key=value`` with the algorithm's keyword
arguments (``reduce_broadcast_allreduce:tree=true``); a preset takes its parameters the same
way (``cluster-h100:nodes=4``). In a comma list such parameters stay with their name:
``split_list("switch,fattree-h100:nodes=8,nodes_per_leaf=2")`` is two topologies.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import IO, Any

from algorithms.bench import (
    CSV_HEADER, BenchConfig, BenchRow, bench_row, buffer_count, check_inputs, config_from_args,
    count_wrong, size_range,
)
from algorithms.catalog import COLLECTIVES
from simcomm.buffers import SizeOnly
from simcomm.engine import simulate
from simcomm.presets import PRESETS, is_preset_spec
from simcomm.topofile import load_topology
from simcomm.topology import TOPOLOGIES, Topology, make_topology
from simcomm.units import format_bytes, parse_bandwidth, parse_seconds

DEFAULT_ALGORITHMS = ("ring_allreduce", "reduce_broadcast_allreduce", "alltoall_allreduce")
DEFAULT_SIZES = size_range(1024, 1024**3, 4)  # 1 KiB, 4 KiB, ..., 1 GiB
DEFAULT_TOPOLOGIES = ("switch",)
DEFAULT_RANKS = (8,)
DEFAULT_BANDWIDTHS = ("100GB/s",)
DEFAULT_LATENCIES = ("5us",)

SWEEP_COLUMNS = ("algorithm", "topology", "ranks", "bandwidth", "latency",
                 *CSV_HEADER.split(","))
SWEEP_HEADER = ",".join(SWEEP_COLUMNS)

# Two times closer than this (relative) are a tie in the crossover table: they differ by
# float rounding only.
TIE_TOLERANCE = 1e-9


# -- specs ---------------------------------------------------------------------------------

def split_list(text: str) -> list[str]:
    """Split a comma list, keeping ``key=value`` parameters with the ``NAME:`` before them."""
    items: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part and ":" not in part and items and ":" in items[-1]:
            items[-1] += "," + part
        else:
            items.append(part)
    if not items:
        raise ValueError(f"{text!r} names nothing")
    return items


def algorithm_config(spec: str, sizes: Sequence[int], dtype: str = "float") -> BenchConfig:
    """The bench configuration of ``NAME`` or ``NAME:key=value,...`` at ``sizes``, checked
    as ``simcomm bench`` checks its flags."""
    name, _, params = spec.partition(":")
    args = argparse.Namespace(
        algorithm=name.strip(), param=[p for p in params.split(",") if p.strip()],
        sizes=",".join(str(size) for size in sizes), minbytes=None, maxbytes=None,
        stepfactor=None, dtype=dtype, op=None, root=None, check=False, format="table")
    try:
        return config_from_args(args)
    except ValueError as error:
        raise ValueError(f"algorithm {spec!r}: {error}") from None


def is_builder(spec: str) -> bool:
    """Whether ``spec`` names a topology builder that needs ranks, bandwidth and latency."""
    return spec in TOPOLOGIES


def load_named_topology(spec: str) -> Topology:
    """A preset (``dgx-a100``, ``cluster-h100:nodes=4``) or a topology file (``lab.toml``)."""
    if not (is_preset_spec(spec) or spec.endswith(".toml") or os.path.exists(spec)):
        raise ValueError(f"unknown topology {spec!r}: not a builder ({', '.join(TOPOLOGIES)}), "
                         f"a preset ({', '.join(PRESETS)}) or a topology file (.toml)")
    return load_topology(spec)


def build_topology(spec: str, ranks: int, bandwidth: str, latency: str,
                   reduce_bandwidth: str = "inf") -> Topology:
    """A builder topology from human units (``100GB/s``, ``5us``), or a preset or file
    (then the other arguments are ignored: it has its own)."""
    if not is_builder(spec):
        return load_named_topology(spec)
    return make_topology(spec, ranks, _parse("bandwidth", parse_bandwidth, bandwidth),
                         _parse("latency", parse_seconds, latency),
                         _parse("reduce bandwidth", parse_bandwidth, reduce_bandwidth))


def _parse(what: str, parse: Callable[[str], float], text: str) -> float:
    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"{what} {text!r}: {error}") from None


# -- the grid ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One simulation of the grid: plain strings and ints, so it pickles to a worker."""

    algorithm: str
    topology: str
    ranks: int
    bandwidth: str  # "" for a preset or file, which has its own links
    latency: str
    size: int  # bytes
    dtype: str = "float"
    reduce_bandwidth: str = "inf"


@dataclass(frozen=True)
class Grid:
    """The axes of a sweep; every combination is simulated."""

    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    topologies: tuple[str, ...] = DEFAULT_TOPOLOGIES
    ranks: tuple[int, ...] = DEFAULT_RANKS
    bandwidths: tuple[str, ...] = DEFAULT_BANDWIDTHS
    latencies: tuple[str, ...] = DEFAULT_LATENCIES
    dtype: str = "float"
    reduce_bandwidth: str = "inf"

    def points(self) -> list[Point]:
        """Check every axis (raising ``ValueError`` naming the bad value) and list the
        points: topology by topology, then ranks, bandwidth, latency, algorithm and size."""
        for axis in ("algorithms", "sizes", "topologies", "ranks", "bandwidths", "latencies"):
            if not getattr(self, axis):
                raise ValueError(f"the sweep has no {axis}")
        for ranks in self.ranks:
            if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
                raise ValueError(f"ranks must be ints >= 1, got {ranks!r}")
        configs = {spec: algorithm_config(spec, self.sizes, self.dtype)
                   for spec in self.algorithms}
        points = []
        for topology in self.topologies:
            for ranks, bandwidth, latency in self._settings(topology):
                for spec, config in configs.items():
                    config.check_world(ranks)
                    points += [Point(spec, topology, ranks, bandwidth, latency, size,
                                     self.dtype, self.reduce_bandwidth)
                               for size in self.sizes]
        return points

    def _settings(self, topology: str) -> list[tuple[int, str, str]]:
        """(ranks, bandwidth, latency) of each topology made from ``topology``; each is
        built once here, so a bad value is reported before any work starts."""
        if not is_builder(topology):
            return [(load_named_topology(topology).size, "", "")]
        settings = []
        for ranks in self.ranks:
            for bandwidth in self.bandwidths:
                for latency in self.latencies:
                    build_topology(topology, ranks, bandwidth, latency, self.reduce_bandwidth)
                    settings.append((ranks, bandwidth, latency))
        return settings


# -- running -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepRow:
    """A bench row with the grid point it came from (the columns of ``SWEEP_HEADER``)."""

    algorithm: str
    topology: str
    ranks: int
    bandwidth: str
    latency: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None


def bench_size(config: BenchConfig, topology: Topology, size: int, check: bool = False
               ) -> BenchRow:
    """Simulate ``config``'s collective at ``size`` bytes on ``topology`` and score it.

    Size-only buffers unless ``check``, which runs numpy data and counts wrong elements.
    """
    p = topology.size
    count = buffer_count(config.collective, p, size, config.dtype.itemsize)
    if check:
        inputs = check_inputs(p, count, config.dtype, config.op)
    else:
        inputs = [SizeOnly(count, config.dtype)] * p  # immutable, so one serves every rank
    result = simulate(config.collective.function, inputs, topology, record=False,
                      **config.algorithm_kwargs())
    wrong = None
    if check:
        wrong = count_wrong(config.collective, inputs, result.results, config.op,
                            config.root, config.params)
    return bench_row(config.collective, p, size, config.dtype, config.op, config.root,
                     result.time, wrong)


def run_point(point: Point) -> SweepRow:
    """Simulate one grid point (size-only, no trace)."""
    config = algorithm_config(point.algorithm, (point.size,), point.dtype)
    topology = build_topology(point.topology, point.ranks, point.bandwidth, point.latency,
                              point.reduce_bandwidth)
    row = bench_size(config, topology, point.size)
    return SweepRow(point.algorithm, point.topology, topology.size, point.bandwidth,
                    point.latency, *astuple(row))


def default_jobs() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_sweep(points: Sequence[Point], jobs: int = 1,
              on_done: Callable[[int, int], None] | None = None) -> list[SweepRow]:
    """Simulate every point in ``jobs`` processes (in this one if ``jobs`` is 1); rows in
    the order of ``points``. ``on_done(done, total)`` is called as points finish."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    total = len(points)
    if jobs == 1 or total <= 1:
        rows = []
        for done, point in enumerate(points, 1):
            rows.append(run_point(point))
            if on_done:
                on_done(done, total)
        return rows
    results: list[SweepRow | None] = [None] * total
    with ProcessPoolExecutor(max_workers=min(jobs, total)) as pool:
        index = {pool.submit(run_point, point): i for i, point in enumerate(points)}
        try:
            for done, future in enumerate(as_completed(index), 1):
                results[index[future]] = future.result()
                if on_done:
                    on_done(done, total)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # a failed sweep stops at once
            raise
    return [row for row in results if row is not None]


class ProgressBar:
    """A one-line progress bar redrawn with a carriage return: ``[#####.....] 12/40``."""

    def __init__(self, stream: IO[str], label: str = "sweep", width: int = 30) -> None:
        self.stream, self.label, self.width = stream, label, width

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // total if total else self.width
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{done}/{total}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


# -- CSV -----------------------------------------------------------------------------------

def write_csv(rows: Sequence[SweepRow], stream: IO[str]) -> None:
    """Rows under ``SWEEP_HEADER``; floats in full precision, unchecked ``wrong`` as N/A."""
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(SWEEP_COLUMNS)
    for row in rows:
        values = [repr(v) if isinstance(v, float) else v for v in astuple(row)]
        values[-1] = "N/A" if row.wrong is None else row.wrong
        writer.writerow(values)


def _convert(path: str, line: int, column: str, text: str, kind: type) -> Any:
    if column == "wrong" and text == "N/A":
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{path} line {line}: {column}: expected {kind.__name__}, "
                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{path} line {line}: {column}: expected a finite number, "
                         f"got {text!r}")
    return value


def _read_rows(path: str | os.PathLike[str], columns: Sequence[str]
               ) -> tuple[list[str], list[dict[str, Any]]]:
    """The header of a CSV with at least ``columns``, and its rows: those columns typed as
    ``SweepRow``'s fields, any other column as text."""
    kinds = {f.name: (int if f.name in ("ranks", "size", "count", "root", "wrong") else
                      float if f.name.endswith(("_us", "_GBps")) else str)
             for f in fields(SweepRow)}
    name = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            header = list(reader.fieldnames or ())
            missing = [c for c in columns if c not in header]
            if missing:
                raise ValueError(f"{name}: not a results CSV: no column {', '.join(missing)} "
                                 f"(expected the header {','.join(columns)})")
            rows = []
            for line, raw in enumerate(reader, 2):
                if None in raw or None in raw.values():
                    raise ValueError(f"{name} line {line}: expected {len(header)} fields")
                rows.append({c: _convert(name, line, c, text.strip(), kinds.get(c, str))
                             for c, text in raw.items()})
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {name!r}: {error}") from None
    if not rows:
        raise ValueError(f"{name}: no rows")
    return header, rows


def read_csv(path: str | os.PathLike[str]) -> list[SweepRow]:
    """The rows of a CSV that ``write_csv`` wrote."""
    _, rows = _read_rows(path, SWEEP_COLUMNS)
    return [SweepRow(**{c: row[c] for c in SWEEP_COLUMNS}) for row in rows]


@dataclass(frozen=True)
class Series:
    """One line of a plot: times and bus bandwidths against size, sorted by size.

    Series with the same ``color`` key share a colour and those with the same ``style`` key
    a line style and marker (by default each series has its own colour)."""

    label: str
    sizes: tuple[int, ...]  # bytes
    time_us: tuple[float, ...]
    busbw_GBps: tuple[float, ...]
    color: str = ""
    style: str = ""


def _series(label: str, rows: Iterable[Any], color: str = "", style: str = "") -> Series:
    ordered = sorted(rows, key=lambda row: row.size)
    return Series(label, tuple(r.size for r in ordered), tuple(r.time_us for r in ordered),
                  tuple(r.busbw_GBps for r in ordered), color, style)


def read_bench_csv(path: str | os.PathLike[str], label: str) -> list[Series]:
    """Measured (or simulated) results in the bench columns, as ``realcomm bench --format
    csv`` prints them: one series named ``label``; a sweep's CSV gives one series per
    algorithm, topology, ranks, bandwidth and latency, labelled with them."""
    bench_columns = CSV_HEADER.split(",")
    header, rows = _read_rows(path, bench_columns)
    setting = [c for c in SWEEP_COLUMNS[:5] if c in header]
    by_name: dict[str, list[BenchRow]] = {}
    for row in rows:
        parts = [str(row[c]) for c in setting if row[c] != ""]
        name = f"{label}: {' '.join(parts)}" if parts else label
        by_name.setdefault(name, []).append(BenchRow(**{c: row[c] for c in bench_columns}))
    return [_series(name, group) for name, group in by_name.items()]


def measured_spec(text: str) -> tuple[str, str]:
    """``LABEL=FILE`` or ``FILE`` (labelled by its name without the extension) as
    ``(label, path)``."""
    label, sep, path = text.partition("=")
    if not sep:
        return Path(text).stem, text
    if not label.strip() or not path.strip():
        raise ValueError(f"--measured {text!r}: write LABEL=FILE or FILE")
    return label.strip(), path.strip()


# -- crossovers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Crossover:
    """The fastest algorithm over a range of sizes of one collective on one setting.

    ``winner`` names several algorithms joined by `` = `` when they tie."""

    collective: str
    topology: str
    ranks: int
    bandwidth: str
    latency: str
    first_size: int  # bytes
    last_size: int
    winner: str


def _collective_kind(algorithm: str) -> str:
    known = COLLECTIVES.get(algorithm.partition(":")[0])
    return known.kind if known else ""


def crossovers(rows: Sequence[SweepRow]) -> list[Crossover]:
    """Per collective, topology, ranks, bandwidth and latency (in order of first
    appearance): the runs of consecutive sizes that one algorithm (or a tie) wins."""
    groups: dict[tuple[str, str, int, str, str], dict[int, list[SweepRow]]] = {}
    for row in rows:
        key = (_collective_kind(row.algorithm), row.topology, row.ranks, row.bandwidth,
               row.latency)
        groups.setdefault(key, {}).setdefault(row.size, []).append(row)
    table = []
    for key, by_size in groups.items():
        runs: list[list[Any]] = []  # [first size, last size, winner]
        for size in sorted(by_size):
            contenders = by_size[size]
            best = min(r.time_us for r in contenders)
            winners = dict.fromkeys(r.algorithm for r in contenders
                                    if r.time_us <= best * (1 + TIE_TOLERANCE))
            winner = " = ".join(winners)
            if runs and runs[-1][2] == winner:
                runs[-1][1] = size
            else:
                runs.append([size, size, winner])
        table += [Crossover(*key, first, last, winner) for first, last, winner in runs]
    return table


def _size_range(first: int, last: int) -> str:
    if first == last:
        return format_bytes(first)
    return f"{format_bytes(first)} - {format_bytes(last)}"


def format_crossovers(table: Sequence[Crossover]) -> str:
    """The crossover table in markdown; a collective column only when there are several."""
    several = len({c.collective for c in table}) > 1
    header = ["topology", "ranks", "bandwidth", "latency", "sizes", "fastest"]
    if several:
        header.insert(0, "collective")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for c in table:
        cells = [c.topology, str(c.ranks), c.bandwidth or "(own)", c.latency or "(own)",
                 _size_range(c.first_size, c.last_size), c.winner]
        if several:
            cells.insert(0, c.collective or "?")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- plots ---------------------------------------------------------------------------------

def figure_groups(rows: Sequence[SweepRow]) -> dict[tuple[int, str, str], list[Series]]:
    """Rows split into one figure per (ranks, bandwidth, latency), a series per algorithm
    (its colour) and topology (its line style); labels name the topology only where the
    figure has several."""
    groups: dict[tuple[int, str, str], dict[tuple[str, str], list[SweepRow]]] = {}
    for row in rows:
        groups.setdefault((row.ranks, row.bandwidth, row.latency), {}).setdefault(
            (row.algorithm, row.topology), []).append(row)
    figures = {}
    for key, lines in groups.items():
        several = len({topology for _, topology in lines}) > 1
        figures[key] = [_series(f"{algorithm} @ {topology}" if several else algorithm, group,
                                color=algorithm, style=topology)
                        for (algorithm, topology), group in lines.items()]
    return figures


def _file_part(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "." else "p" if ch == "/" else "_"
                   for ch in text)


def write_plots(rows: Sequence[SweepRow], out_dir: str | os.PathLike[str],
                measured: Sequence[Series] = ()) -> list[Path]:
    """One PNG per (ranks, bandwidth, latency) of ``rows`` under ``out_dir`` (time and busbw
    against size), with the ``measured`` series drawn on each; the paths written. With no
    rows, one PNG of the measured series alone."""
    from simcomm.plots import save_png, sweep_figure  # matplotlib only where plots are drawn

    out = Path(out_dir)
    paths = []
    groups = figure_groups(rows)
    if not groups:
        groups = {(0, "", ""): []}
    for (ranks, bandwidth, latency), series in groups.items():
        if ranks == 0:
            title, name = "measured", "measured"
        elif bandwidth or latency:
            title = f"{ranks} ranks, links {bandwidth} and {latency}"
            name = f"{ranks}ranks_{_file_part(bandwidth)}_{_file_part(latency)}"
        else:
            title, name = f"{ranks} ranks, preset or file topologies", f"{ranks}ranks"
        path = out / f"sweep_{name}.png"
        save_png(sweep_figure(title, series, measured), path)
        paths.append(path)
    return paths
