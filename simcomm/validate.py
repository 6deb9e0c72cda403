"""How well the simulator predicts measured runs: each measured row (``realcomm bench
--format csv``) beside the simulated time of the same collective and size on a topology
(typically one that ``simcomm fit`` fitted), with the relative error, and a summary
per collective: median, geometric mean and largest absolute error (as ASTRA-sim's
validation pages report them).
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from algorithms.harness.bench import CSV_HEADER
from simcomm.bench import algorithm_config, bench_size
from simcomm.sweep_csv import Series
from simcomm.topology import Topology
from simcomm.units import format_bytes


@dataclass(frozen=True)
class Comparison:
    """One size of one collective: measured and simulated microseconds."""

    algorithm: str
    size: int
    measured_us: float
    simulated_us: float
    measured_busbw: float  # GB/s
    simulated_busbw: float

    @property
    def error(self) -> float:
        """simulated / measured - 1: positive when the simulator is too slow."""
        return self.simulated_us / self.measured_us - 1


def compare(topology: Topology, algorithm: str, path: str | os.PathLike[str]
            ) -> list[Comparison]:
    """Simulate ``algorithm`` (``NAME`` or ``NAME:key=value``) at every size of the bench
    CSV at ``path`` on ``topology`` and pair each with its measured time."""
    with open(path, newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(line for line in stream if not line.startswith("#"))
        if reader.fieldnames != CSV_HEADER.split(","):
            raise ValueError(f"{path}: expected the bench CSV header {CSV_HEADER!r}, got "
                             f"{','.join(reader.fieldnames or [])!r}")
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no rows")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            size, measured = int(row["size"]), float(row["time_us"])
            busbw = float(row["busbw_GBps"])
        except ValueError:
            raise ValueError(f"{path}, line {line}: size, time_us and busbw_GBps must be "
                             "numbers") from None
        if not measured > 0:
            raise ValueError(f"{path}, line {line}: time_us must be > 0, got {measured}")
        config = algorithm_config(algorithm, [size], row["type"])
        simulated = bench_size(config, topology, size)
        out.append(Comparison(algorithm, size, measured, simulated.time_us,
                              busbw, simulated.busbw_GBps))
    return out


@dataclass(frozen=True)
class Summary:
    """One collective's errors over its sizes (absolute values, as fractions)."""

    algorithm: str
    sizes: int
    median: float
    geomean: float
    largest: float


def summarize(comparisons: Sequence[Comparison]) -> list[Summary]:
    """Per collective, in the order first seen."""
    by_algorithm: dict[str, list[float]] = {}
    for c in comparisons:
        by_algorithm.setdefault(c.algorithm, []).append(abs(c.error))
    return [Summary(name, len(errors), statistics.median(errors),
                    math.exp(statistics.fmean(math.log(max(e, 1e-12)) for e in errors)),
                    max(errors)) for name, errors in by_algorithm.items()]


def format_validation(comparisons: Sequence[Comparison]) -> str:
    """The rows and the summary as text."""
    width = max(len(c.algorithm) for c in comparisons)
    lines = [f"{'algorithm':<{width}} {'size':>8} {'measured (us)':>14} {'simulated (us)':>15} "
             f"{'error':>8}"]
    for c in comparisons:
        lines.append(f"{c.algorithm:<{width}} {format_bytes(c.size):>8} {c.measured_us:>14.1f} "
                     f"{c.simulated_us:>15.1f} {c.error:>+8.1%}")
    lines.append("")
    lines.append(f"{'algorithm':<{width}} {'sizes':>6} {'median |err|':>13} "
                 f"{'geomean |err|':>14} {'largest |err|':>14}")
    for s in summarize(comparisons):
        lines.append(f"{s.algorithm:<{width}} {s.sizes:>6} {s.median:>13.1%} "
                     f"{s.geomean:>14.1%} {s.largest:>14.1%}")
    return "\n".join(lines)


def validation_series(comparisons: Sequence[Comparison]) -> tuple[list[Series], list[Series]]:
    """(simulated, measured) series per collective, for ``simcomm.plots.sweep_figure``."""
    simulated: list[Series] = []
    measured: list[Series] = []
    names = list(dict.fromkeys(c.algorithm for c in comparisons))
    for name in names:
        rows = sorted((c for c in comparisons if c.algorithm == name), key=lambda c: c.size)
        sizes = tuple(c.size for c in rows)
        simulated.append(Series(f"{name} simulated", sizes, tuple(c.simulated_us for c in rows),
                                tuple(c.simulated_busbw for c in rows), color=name))
        measured.append(Series(f"{name} measured", sizes, tuple(c.measured_us for c in rows),
                               tuple(c.measured_busbw for c in rows), color=name))
    return simulated, measured
