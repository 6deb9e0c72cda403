"""How well the simulator predicts measured runs: each measured row (``realcomm bench
--format csv``, or nccl-tests' own printed output) beside the simulated time of the same
collective and size on a topology (a preset, or one that ``simcomm fit`` fitted), with the
relative error, and a summary per collective: median, geometric mean and largest absolute
error (as ASTRA-sim's validation pages report them).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from algorithms.harness.bench import BenchRow
from simcomm.bench import algorithm_config, bench_size
from simcomm.nccl_tests_output import (
    check_measured_rows, looks_like_nccl_tests_output, looks_like_published_table,
    parse_nccl_tests_output, parse_published_table, program_kind,
)
from simcomm.sweep_csv import Series, read_bench_rows
from simcomm.topology import Topology
from simcomm.units import format_bytes


@dataclass(frozen=True)
class Comparison:
    """One size of one collective: measured and simulated microseconds, and the GPUs each
    process of the measured run drove (nccl-tests' ``-g``), which the simulation took."""

    algorithm: str
    size: int
    measured_us: float
    simulated_us: float
    measured_busbw: float  # GB/s
    simulated_busbw: float
    gpus_per_process: int = 1

    @property
    def error(self) -> float:
        """simulated / measured - 1: positive when the simulator is too slow."""
        return self.simulated_us / self.measured_us - 1


def compare(topology: Topology, algorithm: str, path: str | os.PathLike[str]
            ) -> list[Comparison]:
    """Simulate ``algorithm`` (``NAME`` or ``NAME:key=value``) at every size measured in the
    file at ``path`` on ``topology`` and pair each with its measured time.

    The file is a bench CSV (``read_bench_rows``) or what nccl-tests printed
    (``simcomm.nccl_tests_output``): its ranks must be the topology's and its program a
    collective of the algorithm's kind, a run whose processes each drove several GPUs
    (``-g``) is simulated so, and rows of 0 B (nothing moved or launched) are passed over."""
    rows, gpus_per_process, program = read_measured(path, topology.size)
    return compare_rows(topology, algorithm, rows, gpus_per_process, program, path)


def compare_rows(topology: Topology, algorithm: str, rows: Sequence[BenchRow],
                 gpus_per_process: int = 1, program: str = "",
                 path: str | os.PathLike[str] = "<rows>", level: str = "message"
                 ) -> list[Comparison]:
    """``compare`` on rows already read (``read_measured``), simulated at ``level`` (as
    ``simulate``'s: message, collective or auto); ``path`` only names them in errors."""
    out = []
    for row in rows:
        if not (math.isfinite(row.time_us) and row.time_us > 0):  # the error is relative to it
            raise ValueError(f"{path}: the row of size {row.size} has time_us "
                             f"{row.time_us}: a measured time must be finite and > 0")
        config = algorithm_config(algorithm, [row.size], row.type)
        if program_kind(program) not in (None, config.collective.kind):
            raise ValueError(f"{path}: nccl-tests ran {program}, and {algorithm} is "
                             f"{config.collective.kind}")
        simulated = bench_size(config, topology, row.size, level=level,
                               gpus_per_process=gpus_per_process)
        out.append(Comparison(algorithm, row.size, row.time_us, simulated.time_us,
                              row.busbw_GBps, simulated.busbw_GBps, gpus_per_process))
    return out


def read_measured(path: str | os.PathLike[str], ranks: int
                  ) -> tuple[list[BenchRow], int, str]:
    """The measured rows of a bench CSV, of nccl-tests' printed output or of a published
    table (``benchmarks/published/``), the GPUs each of its processes drove and the
    nccl-tests program that ran ("" if not known); nccl-tests' output and a published
    table must have ``ranks`` ranks, if they say, and no file of any of them rows that
    ``check_measured_rows`` refuses (wrong results, a size twice)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if looks_like_published_table(text):
        run = parse_published_table(text, str(path))
    elif looks_like_nccl_tests_output(text):
        run = parse_nccl_tests_output(text, str(path))
    else:
        bench_rows = read_bench_rows(path)
        check_measured_rows(bench_rows, str(path))
        return bench_rows, 1, ""
    if run.ranks and run.ranks != ranks:
        raise ValueError(f"{path}: nccl-tests ran on {run.ranks} ranks, the topology has "
                         f"{ranks}")
    rows = [row for row in run.rows if row.size > 0]
    if not rows:
        raise ValueError(f"{path}: only rows of 0 B, which move nothing and cannot be "
                         "compared: no row to validate")
    return rows, run.gpus_per_process, run.program


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
    for gpus in sorted({c.gpus_per_process for c in comparisons} - {1}):
        lines.append(f"\n-g {gpus}: measured with one process driving {gpus} GPUs, simulated "
                     "so (at least the host's time to launch their kernels, simcomm bench -g)")
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
