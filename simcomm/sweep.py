"""Sweeps: simulate a grid of algorithms x sizes x topologies x ranks x bandwidths x latencies.

* ``Grid`` holds the axes; ``Grid.points()`` checks every axis and lists the grid points.
  Builder topologies (``ring``, ``fully_connected``, ``switch``, ``hierarchical``) take every
  ranks x bandwidth x latency combination; a preset or a topology file brings its own ranks
  and links, so it is one point per algorithm and size, with empty bandwidth and latency.
* ``run_point(point)`` is one ``simcomm bench`` run (``simcomm.bench``) of one size.
* ``run_sweep(points, jobs, scheduler=...)`` simulates them, size-only and without a trace,
  in ``jobs`` local processes or on a dask.distributed cluster (one task per point); rows
  come back in the order of the points whatever the order in which they finish, so the
  output does not depend on where they ran, and each is handed on as it finishes.

What becomes of the rows is elsewhere: ``simcomm.sweep_csv`` writes and reads them,
``simcomm.crossover`` finds which algorithm wins where, ``simcomm.plots`` draws them.

An algorithm is written ``NAME`` or ``NAME:key=value,key=value`` with the algorithm's keyword
arguments (``reduce_broadcast_allreduce:tree=true``), where a user's own algorithm is named
``module.path:function`` (of the collective ``Grid.kind``, an all-reduce unless it says); a
preset takes its parameters the same way (``cluster-h100:nodes=4``). In a comma list such
parameters stay with their name: ``split_list("switch,fattree-h100:nodes=8,nodes_per_leaf=2")``
is two topologies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass

from algorithms.harness.bench import CSV_HEADER, size_range
from algorithms.harness.catalog import is_user_algorithm, kind_name
from simcomm.bench import (
    algorithm_config, bench_size, build_topology, is_builder, load_named_topology,
    split_algorithm_spec,
)
from simcomm.executors import executor
from simcomm.sweep_csv import SweepRow

DEFAULT_ALGORITHMS = ("ring_allreduce", "reduce_broadcast_allreduce", "alltoall_allreduce")
DEFAULT_SIZES = size_range(1024, 1024**3, 4)  # 1 KiB, 4 KiB, ..., 1 GiB
DEFAULT_TOPOLOGIES = ("switch",)
DEFAULT_RANKS = (8,)
DEFAULT_BANDWIDTHS = ("100GB/s",)
DEFAULT_LATENCIES = ("5us",)


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
    kind: str | None = None  # what a module:function algorithm implements
    level: str = "message"  # as simulate's


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
    kind: str | None = None  # what the module:function algorithms implement (allreduce)
    level: str = "message"  # every point's, as simulate's

    def points(self) -> list[Point]:
        """Check every axis (raising ``ValueError`` naming the bad value) and list the
        points: topology by topology, then ranks, bandwidth, latency, algorithm and size."""
        for axis in ("algorithms", "sizes", "topologies", "ranks", "bandwidths", "latencies"):
            if not getattr(self, axis):
                raise ValueError(f"the sweep has no {axis}")
        for ranks in self.ranks:
            if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
                raise ValueError(f"ranks must be ints >= 1, got {ranks!r}")
        if self.kind is not None:
            kind_name(self.kind)  # an unknown one refused, as bench refuses it
            if not any(self._kind(spec) is not None for spec in self.algorithms):
                raise ValueError(f"--kind {self.kind} says what an algorithm of your own "
                                 "(module.path:function) implements, and the sweep has "
                                 "none: the built-in ones implement their own")
        configs = {spec: algorithm_config(spec, self.sizes, self.dtype, self._kind(spec))
                   for spec in self.algorithms}
        points = []
        for topology in self.topologies:
            for ranks, local_size, bandwidth, latency in self._settings(topology):
                for spec, config in configs.items():
                    config.check_world(ranks, local_size)
                    points += [Point(spec, topology, ranks, bandwidth, latency, size,
                                     self.dtype, self.reduce_bandwidth, self._kind(spec),
                                     self.level)
                               for size in self.sizes]
        return points

    def _kind(self, spec: str) -> str | None:
        """``kind`` for an algorithm of the user's own (``module:function``), else None: a
        built-in one has its own."""
        return self.kind if is_user_algorithm(split_algorithm_spec(spec)[0]) else None

    def _settings(self, topology: str) -> list[tuple[int, int | None, str, str]]:
        """(ranks, ranks per node, bandwidth, latency) of each topology made from
        ``topology``; each is built once here, so a bad value is reported before any work
        starts."""
        if not is_builder(topology):
            named = load_named_topology(topology)
            return [(named.size, named.local_size, "", "")]
        settings = []
        for ranks in self.ranks:
            for bandwidth in self.bandwidths:
                for latency in self.latencies:
                    built = build_topology(topology, ranks, bandwidth, latency,
                                           self.reduce_bandwidth)
                    settings.append((ranks, built.local_size, bandwidth, latency))
        return settings


def point_key(point: Point, type_name: str) -> tuple[object, ...]:
    """What names a point's row (``row_key``): ``type_name`` is nccl-tests' name of its
    dtype (``BenchConfig.type_name``)."""
    return (point.algorithm, point.topology, point.ranks, point.bandwidth, point.latency,
            point.size, type_name)


def row_key(row: SweepRow) -> tuple[object, ...]:
    """The ``point_key`` of the point ``row`` came from."""
    return (row.algorithm, row.topology, row.ranks, row.bandwidth, row.latency, row.size,
            row.type)


# -- running -------------------------------------------------------------------------------

def run_point(point: Point) -> SweepRow:
    """Simulate one grid point (size-only, no trace)."""
    config = algorithm_config(point.algorithm, (point.size,), point.dtype, point.kind)
    topology = build_topology(point.topology, point.ranks, point.bandwidth, point.latency,
                              point.reduce_bandwidth)
    row = bench_size(config, topology, point.size, level=point.level)
    return SweepRow(point.algorithm, point.topology, topology.size, point.bandwidth,
                    point.latency, *(getattr(row, column) for column in CSV_HEADER.split(",")))


def run_sweep(points: Sequence[Point], jobs: int = 1,
              on_done: Callable[[int, int], None] | None = None, scheduler: str | None = None,
              on_row: Callable[[SweepRow], None] | None = None) -> list[SweepRow]:
    """Simulate every point: in this process (``jobs`` 1), in ``jobs`` local processes, or
    on the dask.distributed cluster whose scheduler is at ``scheduler`` (``tcp://host:8786``;
    its workers need this package installed). Rows come back in the order of ``points``;
    ``on_row(row)`` is called with each as it finishes (to stream it to a file), then
    ``on_done(done, total)``. A point that fails stops the sweep at once."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    total = len(points)
    results: list[SweepRow | None] = [None] * total

    def finished(i: int, row: SweepRow, done: int) -> None:
        results[i] = row
        if on_row:
            on_row(row)
        if on_done:
            on_done(done, total)

    with executor(jobs, scheduler, total) as pool:
        if pool is None:
            for i, point in enumerate(points):
                finished(i, run_point(point), i + 1)
        else:
            index = {pool.submit(run_point, point): i for i, point in enumerate(points)}
            try:
                for done, future in enumerate(as_completed(index), 1):
                    finished(index[future], future.result(), done)
            except BaseException:
                for future in index:
                    future.cancel()
                raise
    return [row for row in results if row is not None]
