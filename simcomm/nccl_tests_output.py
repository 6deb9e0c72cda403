"""Reading what nccl-tests prints (``all_reduce_perf`` and the others), so that a run on a
real cluster can be put beside the simulator's prediction as it is (``simcomm validate``).

Its result lines hold, in order: size, count, type, redop, root (absent before nccl-tests
2.10), then the out-of-place time, algbw, busbw and error count, and the same four for the
in-place run. The out-of-place columns are read, as nccl-tests' own summary reads them. The
test header (``# nThread 1 nGpus 8 ...``) says how many GPUs each process drove, the device
list (``#  Rank  0 Group  0 Pid ...``) how many ranks ran, and since nccl-tests 2.13 a line
names the test (``# Collective test starting: all_gather_perf``). Lines that mpirun tagged
with their rank (``[1,0]<stdout>:``) are read without the tag.

The published tables of ``benchmarks/published/`` hold the same out-of-place columns as a
CSV (``PUBLISHED_HEADER``) after ``# key: value`` lines that say where they come from;
``parse_published_table`` reads them with their program (``collective:``), ranks
(``ranks:``) and ``-g`` (the ``test header:``'s ``nGpus``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass

from algorithms.harness.bench import DTYPES, BenchRow

_GPUS_PER_PROCESS = re.compile(r"^#.*\bnGpus\s+(\d+)")
_RANK = re.compile(r"^#\s+Rank\s+\d+\s")
_PROGRAM = re.compile(r"^#\s*Collective test starting:\s*(\w+?)(?:_mpi)?\s*$")
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_OUT_OF_PLACE = 4  # time, algbw, busbw, error
PUBLISHED_HEADER = "size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps"
_PUBLISHED_RANKS = re.compile(r"\branks:\s*(\d+)")


@dataclass(frozen=True)
class NcclTestsRun:
    """One printed run: its result rows (out-of-place), the GPUs each process drove (its
    ``-g``), the ranks it listed (0 where the output lists none) and the program that ran
    (``all_reduce_perf``; "" where the output does not say)."""

    rows: list[BenchRow]
    gpus_per_process: int
    ranks: int
    program: str = ""


def program_kind(program: str) -> str | None:
    """The collective an nccl-tests program times, named as ``KINDS`` of
    ``algorithms.harness.catalog`` names them (``all_gather_perf``: ``allgather``;
    ``sendrecv_perf``: ``sendrecv``, which no algorithm of the catalog is), or None for a
    name that is not an nccl-tests program's (``*_perf``)."""
    if not program.endswith("_perf"):
        return None
    return program.removesuffix("_perf").replace("_", "")


def check_measured_rows(rows: Sequence[BenchRow], source: str) -> None:
    """Refuse rows that are no measurement to compare: a row whose results were found
    wrong (``#wrong`` > 0; N/A, not checked, is fine) and a size in two rows (two runs in
    one file). Rows of 0 B may repeat: nccl-tests prints one for each requested size that
    rounds down to no element. Errors name ``source``."""
    seen: set[int] = set()
    for row in rows:
        if row.wrong:
            raise ValueError(f"{source}: the row of size {row.size} has {row.wrong} wrong "
                             "elements (#wrong): the time of a run with wrong results is "
                             "no measurement")
        if row.size in seen:
            raise ValueError(f"{source}: size {row.size} is in two rows (two runs in one "
                             "file?); give each run a file of its own")
        if row.size:
            seen.add(row.size)


def looks_like_nccl_tests_output(text: str) -> bool:
    """Whether ``text`` is nccl-tests' printed output (its test header is there)."""
    return any(_GPUS_PER_PROCESS.match(_MPI_TAG.sub("", line)) for line in text.splitlines())


def parse_nccl_tests_output(text: str, source: str = "input") -> NcclTestsRun:
    """The rows, ``-g``, ranks and program of nccl-tests' printed output of one run; lines
    that are neither comments nor results (log lines of NCCL or MPI mixed in) are passed
    over. Errors name ``source`` and the line; output of several runs is refused, since
    their rows would mix, and so are rows that ``check_measured_rows`` refuses."""
    rows, gpus, ranks, program, headers = [], 1, 0, "", 0
    for number, tagged in enumerate(text.splitlines(), 1):
        line = _MPI_TAG.sub("", tagged)
        if found := _GPUS_PER_PROCESS.match(line):
            gpus, headers = int(found.group(1)), headers + 1
        elif found := _PROGRAM.match(line):
            program = found.group(1)
        elif _RANK.match(line):
            ranks += 1
        elif not line.startswith("#"):
            row = _result_row(line.split(), f"{source}, line {number}")
            if row is not None:
                rows.append(row)
    if headers > 1:
        raise ValueError(f"{source}: holds {headers} runs of nccl-tests (test headers); "
                         "give each run a file of its own")
    if not rows:
        raise ValueError(f"{source}: no result lines of nccl-tests found")
    check_measured_rows(rows, source)
    return NcclTestsRun(rows, gpus, ranks, program)


def looks_like_published_table(text: str) -> bool:
    """Whether ``text`` is a published table: its first line that is not a ``#`` note is
    ``PUBLISHED_HEADER``."""
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip() == PUBLISHED_HEADER
    return False


def published_notes(text: str) -> dict[str, str]:
    """A published table's ``# key: value`` notes (source, machine, command, ...); the
    first of a key repeated wins."""
    notes: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            notes.setdefault(key.strip(), value.strip())
    return notes


def parse_published_table(text: str, source: str = "input") -> NcclTestsRun:
    """The rows, ``-g``, ranks and program of a published table (see the module doc); an
    empty root (tables of nccl-tests before 2.10) is -1. Errors name ``source`` and the
    line; rows that ``check_measured_rows`` refuses are refused."""
    notes = published_notes(text)
    data = [(number, line) for number, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.startswith("#")]
    rows = []
    for number, line in data[1:]:
        fields = [field.strip() for field in next(csv.reader([line]))]
        if len(fields) != 8:
            raise ValueError(f"{source}, line {number}: expected the 8 columns of "
                             f"{PUBLISHED_HEADER}, got {line!r}")
        size, count, dtype, redop, root, time, algbw, busbw = fields
        try:
            rows.append(BenchRow(int(size), int(count), dtype, redop, int(root or -1),
                                 float(time), float(algbw), float(busbw), None))
        except ValueError:
            raise ValueError(f"{source}, line {number}: a column that is not a number: "
                             f"{line!r}") from None
    if not rows:
        raise ValueError(f"{source}: a published table without rows")
    check_measured_rows(rows, source)
    gpus = _GPUS_PER_PROCESS.match("# " + notes.get("test header", ""))
    ranks = _PUBLISHED_RANKS.search(notes.get("gpus_per_node", ""))
    return NcclTestsRun(rows, int(gpus.group(1)) if gpus else 1,
                        int(ranks.group(1)) if ranks else 0,
                        notes.get("collective", "").split(" ")[0])


def _result_row(fields: list[str], where: str) -> BenchRow | None:
    """A result line's out-of-place row, or None for a line that is not one."""
    has_root = len(fields) == 5 + 2 * _OUT_OF_PLACE
    if not (fields and fields[0].isdigit() and len(fields) in (
            4 + 2 * _OUT_OF_PLACE, 5 + 2 * _OUT_OF_PLACE) and fields[2] in DTYPES):
        return None
    size, count, dtype, redop = int(fields[0]), int(fields[1]), fields[2], fields[3]
    root = int(fields[4]) if has_root else -1
    time, algbw, busbw, wrong = fields[4 + has_root:8 + has_root]
    try:  # before nccl-tests 2.10 the error column is the largest error, not a count
        return BenchRow(size, count, dtype, redop, root, float(time), float(algbw),
                        float(busbw), int(wrong) if wrong.isdigit() else None)
    except ValueError:
        raise ValueError(f"{where}: a result line with a column that is not a number: "
                         f"{' '.join(fields)!r}") from None
