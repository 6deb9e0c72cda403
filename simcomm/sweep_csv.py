"""A sweep's rows and their CSV files, measured bench CSVs, and the ``Series`` (one line of a
plot) that either becomes.

* ``SweepRow``: a bench row with the grid point it came from, the columns of
  ``SWEEP_HEADER``: ``algorithm, topology, ranks, bandwidth, latency`` then the bench
  columns (``algorithms.harness.bench.CSV_HEADER``).
* ``write_csv`` / ``read_csv``: sweep rows to and from CSV.
* ``read_bench_csv``: the plain bench columns that ``simcomm bench`` and ``realcomm bench``
  print with ``--format csv``, as series to draw; ``read_bench_rows``: a file of exactly
  those columns, as rows.
* ``Series`` and ``Series.from_rows``: sizes, times and bus bandwidths of one line.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from typing import IO, Any

from algorithms.harness.bench import CSV_HEADER, DTYPES, BenchRow

BENCH_COLUMNS = tuple(CSV_HEADER.split(","))
SWEEP_COLUMNS = ("algorithm", "topology", "ranks", "bandwidth", "latency", *BENCH_COLUMNS)
SWEEP_HEADER = ",".join(SWEEP_COLUMNS)
# Columns that no run gives a negative value in (root is -1 where there is none).
_NOT_NEGATIVE = ("size", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong")


@dataclass(frozen=True)
class SweepRow:
    """A bench row with the grid point it came from (the columns of ``SWEEP_HEADER``)."""

    algorithm: str
    topology: str
    ranks: int
    bandwidth: str  # "" for a preset or file, which has its own links
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


def write_csv(rows: Sequence[SweepRow], stream: IO[str], header: bool = True) -> None:
    """Rows under ``SWEEP_HEADER`` (or without it, to add rows to a file that has it);
    floats in full precision, unchecked ``wrong`` as N/A."""
    writer = csv.writer(stream, lineterminator="\n")
    if header:
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
    if column in _NOT_NEGATIVE and value < 0:
        raise ValueError(f"{path} line {line}: {column}: must be >= 0, got {text!r}")
    if column == "type" and value not in DTYPES:
        raise ValueError(f"{path} line {line}: type: unknown type {text!r}; known: "
                         f"{', '.join(DTYPES)}")
    return value


def _read_rows(path: str | os.PathLike[str], columns: Sequence[str], what: str,
               allow_empty: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    """The header of a CSV with at least ``columns`` (``what``: bench or sweep), and its
    rows: those columns typed as ``SweepRow``'s fields and checked, any other column as
    text. Lines that start with ``#`` (notes) are skipped. A header without rows is an
    error unless ``allow_empty``."""
    kinds = {f.name: (int if f.name in ("ranks", "size", "count", "root", "wrong") else
                      float if f.name.endswith(("_us", "_GBps")) else str)
             for f in fields(SweepRow)}
    name = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            kept = [(number, text) for number, text in enumerate(stream, 1)
                    if not text.startswith("#")]
            reader = csv.DictReader(text for _, text in kept)
            header = list(reader.fieldnames or ())
            missing = [c for c in columns if c not in header]
            if missing:
                raise ValueError(f"{name}: not a results CSV: no column {', '.join(missing)} "
                                 f"(expected the {what} CSV header {','.join(columns)})")
            rows = []
            for raw in reader:
                line = kept[reader.line_num - 1][0]  # the file's, counting the notes
                if None in raw or None in raw.values():
                    raise ValueError(f"{name} line {line}: expected {len(header)} fields")
                rows.append({c: _convert(name, line, c, text.strip(), kinds.get(c, str))
                             for c, text in raw.items()})
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {name!r}: {error}") from None
    if not rows and not allow_empty:
        raise ValueError(f"{name}: no rows")
    return header, rows


def read_csv(path: str | os.PathLike[str], allow_empty: bool = False) -> list[SweepRow]:
    """The rows of a CSV that ``write_csv`` wrote (with ``allow_empty``, a header alone is no
    rows rather than an error: a sweep stopped before its first point ended)."""
    _, rows = _read_rows(path, SWEEP_COLUMNS, "sweep", allow_empty)
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

    @classmethod
    def from_rows(cls, label: str, rows: Iterable[BenchRow | SweepRow], color: str = "",
                  style: str = "") -> Series:
        """The series of bench or sweep rows, sorted by size."""
        ordered = sorted(rows, key=lambda row: row.size)
        return cls(label, tuple(r.size for r in ordered), tuple(r.time_us for r in ordered),
                   tuple(r.busbw_GBps for r in ordered), color, style)


def read_bench_csv(path: str | os.PathLike[str], label: str) -> list[Series]:
    """Measured (or simulated) results in the bench columns, as ``realcomm bench --format
    csv`` prints them: one series named ``label``; a sweep's CSV gives one series per
    algorithm, topology, ranks, bandwidth and latency, labelled with them."""
    header, rows = _read_rows(path, BENCH_COLUMNS, "bench")
    setting = [c for c in SWEEP_COLUMNS[:5] if c in header]
    by_name: dict[str, list[BenchRow]] = {}
    for row in rows:
        parts = [str(row[c]) for c in setting if row[c] != ""]
        name = f"{label}: {' '.join(parts)}" if parts else label
        by_name.setdefault(name, []).append(BenchRow(**{c: row[c] for c in BENCH_COLUMNS}))
    return [Series.from_rows(name, group) for name, group in by_name.items()]


def read_bench_rows(path: str | os.PathLike[str]) -> list[BenchRow]:
    """The rows of a CSV in exactly the bench columns (``CSV_HEADER``), checked as
    ``read_bench_csv`` checks them: one collective's results, which ``simcomm validate``
    compares (a sweep's CSV, with its other columns, holds several)."""
    header, rows = _read_rows(path, BENCH_COLUMNS, "bench")
    if tuple(header) != BENCH_COLUMNS:
        raise ValueError(f"{path}: expected the bench CSV header {CSV_HEADER!r}, got "
                         f"{','.join(header)!r}")
    return [BenchRow(**row) for row in rows]
