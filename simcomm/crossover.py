"""Crossovers: which algorithm is fastest over which range of sizes, per collective,
topology, ranks, bandwidth and latency of a sweep, and that table in markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from algorithms.harness.catalog import COLLECTIVES
from simcomm.sweep_csv import SweepRow
from simcomm.units import format_bytes

# Two times closer than this (relative) are a tie in the crossover table: they differ by
# float rounding only.
TIE_TOLERANCE = 1e-9


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
