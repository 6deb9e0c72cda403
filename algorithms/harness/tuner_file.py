"""Tuner files: which algorithm, protocol and channels to run per size range, in the CSV
format of NCCL's example tuner plugin (NVIDIA/nccl, plugins/tuner/example/README.md)::

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks

``simcomm tune`` writes one from the simulator's choices, so that real NCCL can be run with
them (``NCCL_TUNER_PLUGIN`` with ``NCCL_TUNER_CONFIG_FILE``), and ``TableTuner`` reads one
back as a ``Comm.tuner`` for either transport. Sizes are what NCCL passes its tuner and
nccl-tests prints as ``size``: the bytes of one rank's buffer (all-gather: of the whole
output). ``-1`` matches any node count or rank count. Lines starting with ``#`` and blank
lines are comments; NCCL's optional ninth and tenth fields (numPipeOps: -1 or a count;
regBuff: -1, 0 or 1) are checked and ignored.

Rows are read as the plugin's code reads and applies them (plugin.c, NVIDIA/nccl v2.27.5 to
v2.30.7), where it differs from its README. Names match exactly, in lower case: the plugin
reads any other protocol name as Simple and any other algorithm as the ring, so this reader
refuses them. A call runs on the row's channel count, and ``-1`` means one channel: the
plugin answers one channel unless a row gives a count, and NCCL then runs that many
(``ncclGetAlgoInfo`` in src/enqueue.cc), although the README says ``-1`` keeps NCCL's
default. As the plugin gives a cost only to combinations NCCL can run, a row whose
collective here cannot run its algorithm and protocol (a reduce-scatter by tree, NVLS under
LL) decides nothing. ``benchmarks/nccl_tuner_plugin.py`` checks this reader against the
plugin itself, built from NCCL's source.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from algorithms.harness.catalog import TUNED_COLLECTIVES
from algorithms.ops import MAX_CHANNELS, Choice, Protocol, Tuner
from algorithms.tuned import ALLREDUCE_ALGORITHMS, IN_SWITCH, ONE_WAY_ALGORITHMS

COLUMNS = ("collective_type", "min_bytes", "max_bytes", "algorithm", "protocol", "channels",
           "nNodes", "nRanks")
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")
# NCCL's algorithm names that this project runs (``algorithms.tuned.nccl_allreduce``).
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree")
PROTOCOLS = ("ll", "ll128", "simple")
INTEGER = re.compile(r"[+-]?[0-9]+")  # what C's atoi and strtoull read whole
MAX_BYTES = 2**64 - 1  # size_t's largest: the last range of a file covers every larger size
MAX_LINE = 255  # characters the plugin's fgets reads as one line (MAX_LINE_LENGTH 256)


class TunerFileError(ValueError):
    """A tuner file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class TunerRow:
    """One line of a tuner file: ``choice`` for ``collective`` calls of ``min_bytes`` to
    ``max_bytes`` (inclusive) on ``nodes`` nodes of ``ranks`` ranks (-1: any)."""

    collective: str
    min_bytes: int
    max_bytes: int
    choice: Choice
    nodes: int = -1
    ranks: int = -1

    def matches(self, collective: str, nbytes: int, nodes: int, ranks: int) -> bool:
        """Whether this row decides such a call."""
        return (collective == self.collective and self.min_bytes <= nbytes <= self.max_bytes
                and self.nodes in (-1, nodes) and self.ranks in (-1, ranks)
                and self.runs_here(nodes))

    def runs_here(self, nodes: int) -> bool:
        """Whether this project's collective runs the row's algorithm and protocol on
        ``nodes`` nodes, as NCCL would: the all-reduce every algorithm, the reduce-scatter
        and the all-gather the ring and NVLS; the in-switch ones under Simple only, NVLS on
        one node and NVLS-tree across several; NCCL's broadcast and reduce none."""
        algorithm, protocol = self.choice.algorithm, self.choice.protocol
        known = {"allreduce": ALLREDUCE_ALGORITHMS, "reducescatter": ONE_WAY_ALGORITHMS,
                 "allgather": ONE_WAY_ALGORITHMS}.get(self.collective, ())
        if algorithm not in known:
            return False
        if algorithm in IN_SWITCH:
            return protocol is Protocol.SIMPLE and (nodes == 1) == (algorithm == "nvls")
        return True

    def csv(self) -> str:
        """The row as a line of the file. Its channel count must be given: NCCL's example
        plugin would run ``-1`` (NCCL's default, by its README) on one channel."""
        c = self.choice
        if c.channels < 1:
            raise ValueError(f"a tuner-file row needs a channel count, got {c.channels} "
                             f"({c.algorithm}/{c.protocol.value}): NCCL's example plugin "
                             "runs -1 on one channel")
        return ",".join(str(v) for v in (
            self.collective, self.min_bytes, self.max_bytes, c.algorithm, c.protocol.value,
            c.channels, self.nodes, self.ranks))


def rows_for(collective: str, choices: Sequence[tuple[int, Choice]], nodes: int,
             ranks: int) -> list[TunerRow]:
    """Rows covering every size from 0 up: ``choices`` are (size, choice) by rising size;
    each size's choice covers the sizes above the previous one, the last covers all larger
    ones, and neighbours with the same choice merge into one row."""
    rows: list[TunerRow] = []
    low = 0
    for i, (size, choice) in enumerate(choices):
        high = MAX_BYTES if i == len(choices) - 1 else size
        if rows and rows[-1].choice == choice:
            rows[-1] = TunerRow(collective, rows[-1].min_bytes, high, choice, nodes, ranks)
        else:
            rows.append(TunerRow(collective, low, high, choice, nodes, ranks))
        low = high + 1
    return rows


def format_tuner_file(rows: Iterable[TunerRow], comments: Sequence[str] = ()) -> str:
    """The file's text: ``comments`` as ``#`` lines (wrapped to the plugin's line length),
    the columns, then the rows."""
    lines = [f"# {part}" for line in comments
             for part in textwrap.wrap(line, MAX_LINE - 2, break_on_hyphens=False) or [""]]
    lines.append("# " + ",".join(COLUMNS))
    return "\n".join(lines + [row.csv() for row in rows]) + "\n"


def read_tuner_file(path: str | os.PathLike[str]) -> list[TunerRow]:
    """The rows of a tuner file, checked; errors name the file, the line and the field."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TunerFileError(f"cannot read tuner file {path}: {error}") from None
    if text.startswith("\ufeff"):  # as a spreadsheet's "CSV UTF-8" saves it
        raise TunerFileError(f"{path} starts with a byte-order mark, which NCCL's example "
                             "plugin reads as part of the first field (and then takes the "
                             "row for an allreduce): save it as plain CSV")
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE:  # the plugin would read the rest as a line of its own
            raise TunerFileError(f"{path}, line {number}: {len(line)} characters, more than "
                                 f"the {MAX_LINE} NCCL's example plugin reads as one line")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            rows.append(_parse_row(line))
        except ValueError as error:
            raise TunerFileError(f"{path}, line {number}: {error}") from None
    return rows


def tuner_rows_for(algorithm: str, path: str | os.PathLike[str]) -> list[TunerRow]:
    """The rows of the tuner file ``path`` for runs of ``algorithm`` (a collective's name),
    which must be one that asks its tuner how to run (``TUNED_COLLECTIVES``)."""
    if algorithm not in TUNED_COLLECTIVES:
        raise ValueError(f"--tuner-file decides how {', '.join(TUNED_COLLECTIVES)} run; "
                         f"{algorithm} asks no tuner")
    return read_tuner_file(path)


def _parse_row(line: str) -> TunerRow:
    fields = [f.strip() for f in line.split(",")]
    if not 8 <= len(fields) <= 10:
        raise ValueError(f"expected 8 to 10 comma-separated fields ({','.join(COLUMNS)}), "
                         f"got {len(fields)}")
    collective, low, high, algorithm, protocol, channels, nodes, ranks = fields[:8]
    for name, text, allowed in zip(("numPipeOps", "regBuff"), fields[8:],
                                   ("-1 or >= 1", "-1, 0 or 1")):
        if not (INTEGER.fullmatch(text) and (int(text) in (-1, 0, 1)
                                                      if name == "regBuff"
                                                      else int(text) == -1 or int(text) >= 1)):
            raise ValueError(f"{name} must be {allowed}, got {text!r}")
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective_type {collective!r}; known: "
                         f"{', '.join(COLLECTIVES)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one this project runs "
                         f"({', '.join(ALGORITHMS)}, in lower case as NCCL's example plugin "
                         "matches them)")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be {', '.join(PROTOCOLS)}, in lower case as NCCL's "
                         f"example plugin matches it (it reads any other name as simple), "
                         f"got {protocol!r}")
    numbers = {}
    for name, text in (("min_bytes", low), ("max_bytes", high), ("channels", channels),
                       ("nNodes", nodes), ("nRanks", ranks)):
        if not INTEGER.fullmatch(text):  # int() would also take '1_000', which C reads as 1
            raise ValueError(f"{name} must be an integer, got {text!r}")
        numbers[name] = int(text)
        least = 0 if name.endswith("bytes") else -1
        if numbers[name] < least or numbers[name] == 0 and not name.endswith("bytes"):
            raise ValueError(f"{name} must be {'>= 0' if least == 0 else '-1 or >= 1'}, "
                             f"got {text}")
    if numbers["max_bytes"] > MAX_BYTES:
        raise ValueError(f"max_bytes must be at most {MAX_BYTES} (size_t's largest), got {high}")
    if numbers["min_bytes"] > numbers["max_bytes"]:
        raise ValueError(f"min_bytes {low} is above max_bytes {high}")
    if -1 < numbers["nRanks"] < numbers["nNodes"]:
        raise ValueError(f"nRanks {ranks} is below nNodes {nodes}: every node has a rank")
    if numbers["channels"] > MAX_CHANNELS:
        raise ValueError(f"channels must be -1 or 1 to {MAX_CHANNELS} (NCCL runs at most "
                         f"{MAX_CHANNELS}), got {channels}")
    # -1: the plugin leaves its answer at one channel, and NCCL runs that.
    choice = Choice(algorithm, Protocol(protocol), max(numbers["channels"], 1))
    return TunerRow(collective, numbers["min_bytes"], numbers["max_bytes"], choice,
                    numbers["nNodes"], numbers["nRanks"])


class TableTuner:
    """A ``Comm.tuner`` from tuner-file rows for a group of ``ranks`` ranks on ``nodes``
    nodes: the first row that matches a call decides it, as NCCL's example plugin scans its
    rows. A call no row decides runs ``nccl``'s choice (NCCL's own tuner, such as
    ``simcomm.tuning.ModelTuner``) on one channel, the plugin's answer when no row matches;
    without ``nccl``, it runs ``default``.

    Where NCCL_ALGO or NCCL_PROTO force a choice (``best_for``, ``best_with``), or the switch
    cannot do the reduction (``best_outside_switch``), NCCL marks the other combinations
    ignored and the plugin passes over rows that choose them: so does this tuner."""

    def __init__(self, rows: Sequence[TunerRow], nodes: int, ranks: int,
                 default: Choice = Choice("ring", Protocol.SIMPLE, 0),
                 nccl: Tuner | None = None) -> None:
        self.rows, self.nodes, self.ranks = tuple(rows), nodes, ranks
        self.default, self.nccl = default, nccl

    def __call__(self, collective: str, nbytes: int) -> Choice:
        return self._first(collective, nbytes, lambda choice: True, "__call__",
                           self.default)

    def best_for(self, collective: str, nbytes: int, algorithm: str) -> Choice:
        """The pick when ``algorithm`` is forced (NCCL_ALGO)."""
        return self._first(collective, nbytes, lambda choice: choice.algorithm == algorithm,
                           "best_for", Choice(algorithm, Protocol.SIMPLE, 0), algorithm)

    def best_with(self, collective: str, nbytes: int, protocol: Protocol,
                  algorithm: str | None = None) -> Choice:
        """The pick when ``protocol`` is forced (NCCL_PROTO), and ``algorithm`` if given."""
        return self._first(
            collective, nbytes,
            lambda choice: choice.protocol is protocol and algorithm in (None, choice.algorithm),
            "best_with", Choice(algorithm or "ring", protocol, 0), protocol, algorithm)

    def best_outside_switch(self, collective: str, nbytes: int,
                            protocol: Protocol | None = None) -> Choice:
        """The pick for a reduction the switch cannot do (under ``protocol`` if given)."""
        return self._first(
            collective, nbytes,
            lambda choice: choice.algorithm not in IN_SWITCH and protocol in (None,
                                                                              choice.protocol),
            "best_outside_switch", Choice("ring", protocol or Protocol.SIMPLE, 0), protocol)

    def _first(self, collective: str, nbytes: int, allowed: Callable[[Choice], bool],
               method: str, default: Choice, *args: Any) -> Choice:
        for row in self.rows:
            if allowed(row.choice) and row.matches(collective, nbytes, self.nodes, self.ranks):
                return row.choice
        ask = getattr(self.nccl, method, None)
        if ask is None:
            return default
        return replace(ask(collective, nbytes, *args), channels=1)
