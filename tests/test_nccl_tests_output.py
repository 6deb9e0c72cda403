"""nccl-tests' printed output read as it is (``simcomm.nccl_tests_output``), and ``simcomm
validate`` on it: the -g of its run, its ranks, old and new column layouts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from algorithms.harness.bench import DTYPES
from simcomm.bench import host_floor_seconds
from simcomm.cli import main
from simcomm.nccl_tests_output import (
    PUBLISHED_HEADER, looks_like_nccl_tests_output, looks_like_published_table,
    parse_nccl_tests_output, parse_published_table, program_kind,
)

DATA = Path(__file__).parent / "data"
# The layout of nccl-tests 2.10 and later (a root column, #wrong counts), one process
# driving 8 GPUs, with a log line of NCCL's among the results as real runs have them.
CURRENT = (DATA / "all_reduce_perf_g8.out").read_text()
# The layout before nccl-tests 2.10: no root column, the largest error instead of a count.
OLD = (DATA / "all_reduce_perf_before_2.10.out").read_text()


def test_both_layouts_read_with_the_runs_gpus_per_process_and_ranks() -> None:
    current = parse_nccl_tests_output(CURRENT)
    assert (current.gpus_per_process, current.ranks) == (8, 8)
    assert [(r.size, r.count, r.type, r.redop, r.root, r.time_us, r.busbw_GBps, r.wrong)
            for r in current.rows] == [(8, 2, "float", "sum", -1, 36.10, 0.0, 0),
                                       (1048576, 262144, "float", "sum", -1, 44.00, 41.70, 0)]
    old = parse_nccl_tests_output(OLD)
    assert (old.gpus_per_process, old.ranks) == (1, 0)
    assert [(r.size, r.time_us, r.wrong) for r in old.rows] == [(0, 10.0, None), (64, 20.5, None)]


def test_only_output_with_nccl_tests_header_counts_as_it() -> None:
    assert looks_like_nccl_tests_output(CURRENT) and looks_like_nccl_tests_output(OLD)
    assert not looks_like_nccl_tests_output("size,count,type\n8,2,float\n")
    with pytest.raises(ValueError, match="run.txt: no result lines of nccl-tests found"):
        parse_nccl_tests_output(CURRENT.split("           8 ")[0], "run.txt")
    broken = CURRENT.replace("    44.00   23.83", "    44.0x   23.83")
    with pytest.raises(ValueError, match=r"run.txt, line 18: a result line with a column that "
                                         r"is not a number"):
        parse_nccl_tests_output(broken, "run.txt")


def validate(tmp_path: Path, text: str, topology: str) -> int:
    """``simcomm validate`` of nccl_allreduce on ``text`` saved as a file."""
    path = tmp_path / "all_reduce_perf.out"
    path.write_text(text)
    return main(["validate", "--topology", topology, "--measured", f"nccl_allreduce={path}"])


def size_rows(out: str) -> dict[str, list[str]]:
    """validate's rows by size (its summary line left out)."""
    lines = (line.split() for line in out.splitlines())
    return {fields[1]: fields for fields in lines
            if fields and fields[0] == "nccl_allreduce" and fields[1].endswith("B")}


def test_validate_takes_nccl_tests_output_as_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The run drove 8 GPUs from one process: the simulated rows take the host's floor, on
    # one channel at 8 B and on NCCL's 24 at 1 MiB (as simcomm bench -g 8 gives them).
    assert validate(tmp_path, CURRENT, "dgx-h100") == 0
    out = capsys.readouterr().out
    assert out.endswith("-g 8: measured with one process driving 8 GPUs, simulated so (at "
                        "least the host's time to launch their kernels, simcomm bench -g)\n")
    rows = size_rows(out)
    assert float(rows["8B"][3]) == pytest.approx(host_floor_seconds(8, 1) * 1e6, abs=0.05)
    assert float(rows["1MiB"][3]) == pytest.approx(host_floor_seconds(8, 24) * 1e6, abs=0.05)
    assert float(rows["1MiB"][2]) == 44.0


def test_validate_refuses_a_run_on_other_ranks_and_passes_over_empty_rows(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert validate(tmp_path, CURRENT, "dgx-h100:gpus=4") == 2
    assert capsys.readouterr().err == (f"simcomm: error: {tmp_path / 'all_reduce_perf.out'}: "
                                       "nccl-tests ran on 8 ranks, the topology has 4\n")
    assert validate(tmp_path, OLD, "dgx-h100") == 0
    out = capsys.readouterr().out
    assert list(size_rows(out)) == ["64B"] and "-g" not in out  # a process per GPU


def test_validate_refuses_a_run_of_only_empty_rows(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert validate(tmp_path, OLD.replace(OLD.splitlines()[-1], ""), "dgx-h100") == 2
    assert capsys.readouterr().err == (f"simcomm: error: {tmp_path / 'all_reduce_perf.out'}: "
                                       "only rows of 0 B, which move nothing and cannot be "
                                       "compared: no row to validate\n")


@pytest.mark.parametrize("time", ["inf", "1e400", "nan", "0.00", "-44.00"])
def test_validate_refuses_a_measured_time_that_is_not_finite_and_positive(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, time: str) -> None:
    # inf and 1e400 used to be shown as "measured inf, error -100%".
    assert validate(tmp_path, CURRENT.replace("    44.00   23.83", f"    {time}   23.83"),
                    "dgx-h100") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (f"the row of size 1048576 has time_us {float(time)}: a measured time must be "
            "finite and > 0") in err


def test_validate_refuses_rows_that_nccl_tests_found_wrong(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The 1 MiB run's out-of-place results had 3 wrong elements: its time is no measurement.
    wrong = CURRENT.replace("41.70      0", "41.70      3")
    assert validate(tmp_path, wrong, "dgx-h100") == 2
    assert capsys.readouterr().err == (
        f"simcomm: error: {tmp_path / 'all_reduce_perf.out'}: the row of size 1048576 has 3 "
        "wrong elements (#wrong): the time of a run with wrong results is no measurement\n")
    # nccl-tests -c 0 checks nothing and prints N/A: read as not checked, and compared.
    unchecked = CURRENT.replace("      0    ", "    N/A    ")
    assert [row.wrong for row in parse_nccl_tests_output(unchecked).rows] == [None, None]
    assert validate(tmp_path, unchecked, "dgx-h100") == 0


def test_a_size_in_two_rows_is_refused_and_0_b_rows_may_repeat(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Two runs' rows in one file (their second test header cut away) used to be compared
    # both, each counted in the summary.
    row = CURRENT.splitlines()[17]
    assert row.split()[0] == "1048576"
    assert validate(tmp_path, CURRENT.replace(row, f"{row}\n{row}"), "dgx-h100") == 2
    assert capsys.readouterr().err == (
        f"simcomm: error: {tmp_path / 'all_reduce_perf.out'}: size 1048576 is in two rows "
        "(two runs in one file?); give each run a file of its own\n")
    table = (PUBLISHED / "a100-1node-default-abci.csv").read_text()
    last = table.splitlines()[-1]
    with pytest.raises(ValueError, match=r"^t.csv: size 33554432 is in two rows"):
        parse_published_table(f"{table}{last}\n", "t.csv")
    # Requested sizes below one element print as 0 B each time (SuperBench's 1 B and 2 B).
    zero = OLD.splitlines()[2]
    assert zero.split()[0] == "0"
    assert [r.size for r in parse_nccl_tests_output(OLD.replace(zero, f"{zero}\n{zero}")).rows
            ] == [0, 0, 64]


def _nccl_tests_line(size: int, count: int, dtype: str, redop: str, root: int,
                     runs: list[tuple[float, float, float, int]]) -> str:
    # As nccl-tests' src/common.cu prints a result: the five columns, then per run (out of
    # place, in place) the time in 7 characters, algbw, busbw and the wrong count.
    line = f"{size:12d}  {count:12d}  {dtype:>8}  {redop:>6}  {root:6d}"
    for time_us, algbw, busbw, wrong in runs:
        time_text = (f"{time_us:7.0f}" if time_us >= 10000 else
                     f"{time_us:7.1f}" if time_us >= 100 else f"{time_us:7.2f}")
        line += f"  {time_text}  {algbw:6.2f}  {busbw:6.2f}  {wrong:5d}"
    return line


def _run(wrong: st.SearchStrategy[int]) -> st.SearchStrategy[tuple[float, float, float, int]]:
    return st.tuples(st.floats(0.01, 1e6), st.floats(0, 999), st.floats(0, 999), wrong)


# Each size once, and no wrong elements out of place (both refused); in place, any.
@given(rows=st.lists(st.tuples(
    st.integers(0, 1 << 36), st.sampled_from(sorted(DTYPES)),
    st.sampled_from(["sum", "prod", "max", "min", "avg", "none"]), st.integers(-1, 7),
    st.tuples(_run(st.just(0)), _run(st.integers(0, 9999))).map(list)),
    min_size=1, max_size=8, unique_by=lambda row: row[0]), gpus=st.integers(1, 8))
def test_every_printed_result_line_reads_back(rows, gpus) -> None:
    text = [f"# nThread 1 nGpus {gpus} minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5"]
    for size, dtype, redop, root, runs in rows:
        text.append(_nccl_tests_line(size, size // 4, dtype, redop, root, runs))
    run = parse_nccl_tests_output("\n".join(text))
    assert run.gpus_per_process == gpus
    assert [(r.size, r.count, r.type, r.redop, r.root, r.wrong) for r in run.rows] == [
        (size, size // 4, dtype, redop, root, runs[0][3])
        for size, dtype, redop, root, runs in rows]
    for row, (*_, runs) in zip(run.rows, rows):
        time_us, algbw, busbw, _ = runs[0]
        assert row.time_us == pytest.approx(time_us, abs=0.5 if time_us >= 10000 else 0.05)
        assert (row.algbw_GBps, row.busbw_GBps) == (round(algbw, 2), round(busbw, 2))


def test_mpi_tags_the_program_and_one_run_a_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # mpirun --tag-output prefixes every line; nccl-tests 2.13 and later name the program.
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in
                       ["# Collective test starting: all_gather_perf_mpi",
                        *CURRENT.splitlines()])
    run = parse_nccl_tests_output(tagged)
    assert (run.program, run.gpus_per_process, run.ranks, len(run.rows)) == (
        "all_gather_perf", 8, 8, 2)
    assert validate(tmp_path, tagged, "dgx-h100") == 2
    assert capsys.readouterr().err.endswith(
        "nccl-tests ran all_gather_perf, and nccl_allreduce is allreduce\n")
    # A program of a collective the catalog has no kind for is another collective too; a
    # name that is no nccl-tests program's (a renamed binary, none printed) is not checked.
    assert [program_kind(p) for p in ("reduce_scatter_perf", "alltoall_perf", "sendrecv_perf",
                                      "my_bench", "")] == [
        "reducescatter", "alltoall", "sendrecv", None, None]
    assert validate(tmp_path, "# Collective test starting: sendrecv_perf\n" + CURRENT,
                    "dgx-h100") == 2  # used to be compared as an all-reduce
    assert capsys.readouterr().err == (f"simcomm: error: {tmp_path / 'all_reduce_perf.out'}: "
                                       "nccl-tests ran sendrecv_perf, and nccl_allreduce is "
                                       "allreduce\n")
    with pytest.raises(ValueError, match="run.txt: holds 2 runs of nccl-tests"):
        parse_nccl_tests_output(CURRENT + OLD, "run.txt")


PUBLISHED = Path(__file__).parent.parent / "benchmarks" / "published"


def test_published_tables_read_with_their_program_ranks_and_gpus_per_process() -> None:
    abci = parse_published_table((PUBLISHED / "a100-1node-default-abci.csv").read_text())
    assert (abci.program, abci.ranks, abci.gpus_per_process, len(abci.rows)) == (
        "all_reduce_perf", 8, 1, 24)
    first = abci.rows[0]  # a table of nccl-tests before 2.10: no root printed
    assert (first.size, first.count, first.type, first.redop, first.root, first.time_us,
            first.wrong) == (4, 1, "float", "sum", -1, 17.29, None)
    together = parse_published_table(
        (PUBLISHED / "h100-1node-ring-allgather-togethernccl.csv").read_text())
    assert (together.program, together.ranks, together.gpus_per_process) == (
        "all_gather_perf", 8, 8)
    for path in PUBLISHED.glob("*.csv"):  # every table is recognised as one, and reads
        text = path.read_text()
        assert looks_like_published_table(text) and parse_published_table(text).rows
    assert not looks_like_published_table(CURRENT)


def test_a_published_table_with_a_bad_row_names_the_line() -> None:
    text = "# collective: all_reduce_perf\n" + PUBLISHED_HEADER + "\n8,2,float,sum,-1,x,0,0\n"
    with pytest.raises(ValueError, match=r"t.csv, line 3: a column that is not a number"):
        parse_published_table(text, "t.csv")
    with pytest.raises(ValueError, match=r"t.csv, line 3: expected the 8 columns"):
        parse_published_table(text.replace(",x,0,0", ",1"), "t.csv")
    with pytest.raises(ValueError, match="t.csv: a published table without rows"):
        parse_published_table(PUBLISHED_HEADER + "\n", "t.csv")


def test_validate_reads_a_published_table(capsys: pytest.CaptureFixture[str]) -> None:
    # The median benchmarks/fidelity.py gives this table (docs/fidelity.md).
    table = PUBLISHED / "a100-1node-default-abci.csv"
    assert main(["validate", "--topology", "dgx-a100", "--measured",
                 f"nccl_allreduce={table}"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert summary[:3] == ["nccl_allreduce", "24", "33.5%"]
    # A table's program is checked as nccl-tests' output's is.
    gather = PUBLISHED / "h100-1node-ring-allgather-togethernccl.csv"
    assert main(["validate", "--topology", "dgx-h100", "--measured",
                 f"nccl_allreduce={gather}"]) == 2
    assert capsys.readouterr().err == (f"simcomm: error: {gather}: nccl-tests ran "
                                       "all_gather_perf, and nccl_allreduce is allreduce\n")
