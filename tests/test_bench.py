"""The transport-free benchmark harness: the configuration and its flags, nccl-tests'
size/count/bandwidth rules, the data check and the output formats."""

from __future__ import annotations

import argparse
import json
import pickle

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms import ReduceOp
from algorithms.harness.bench import (
    CSV_HEADER, BenchRow, bench_config, bench_row, buffer_count, check_inputs, count_wrong,
    format_csv, format_json, format_table, parse_size, parse_sizes, size_range,
)
from algorithms.harness.catalog import COLLECTIVES, get_collective
from algorithms.harness.cli import add_bench_arguments, config_from_args
from algorithms.reference import reduced
from simcomm import fully_connected, simulate

# nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md), written out independently of the
# catalog so the two are checked against each other.
BUS_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reducescatter": lambda p: (p - 1) / p, "allgather": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0,
}
SPLIT = ("allgather", "reducescatter", "alltoall")
PARAM_VARIANTS = [(name, {}) for name in COLLECTIVES] + [
    ("reduce", {"tree": True}), ("broadcast", {"tree": True}),
    ("reduce_broadcast_allreduce", {"tree": True}), ("alltoall_allreduce", {"chunked": True}),
]
DTYPES = ["float16", "float32", "float64", "int32", "int64"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


# -- sizes ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("512", 512), ("1KiB", 1024), ("1KB", 1000), ("1K", 1024), ("4M", 4 * 2**20),
    ("1GiB", 2**30), ("1.5KiB", 1536), ("2GB", 2 * 10**9), ("0", 0),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["1XB", "-1K", "KiB", "0.5", "1e-3K"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_parse_sizes_list() -> None:
    assert parse_sizes("1KiB,1MiB, 1GiB") == (1024, 2**20, 2**30)
    with pytest.raises(ValueError, match="names no size"):
        parse_sizes(",")


def test_size_range_steps_like_nccl_tests() -> None:
    assert size_range(8, 128, 2) == (8, 16, 32, 64, 128)
    assert size_range(1024, 10**6, 4) == (1024, 4096, 16384, 65536, 262144)
    assert size_range(64, 64, 2) == (64,)


@pytest.mark.parametrize("args, message", [
    ((8, 128, 1), "stepfactor"), ((0, 128, 2), "minbytes"), ((256, 128, 2), "larger"),
])
def test_size_range_rejects(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        size_range(*args)


# -- flags ------------------------------------------------------------------------------

def test_config_defaults_and_types() -> None:
    config = config_from_args(parse("--algorithm", "reduce", "--sizes", "1KiB",
                                     "--param", "tree=true", "--dtype", "double"))
    assert config.sizes == (1024,)
    assert config.dtype == np.float64 and config.type_name == "double"
    assert config.op is ReduceOp.SUM and config.root == 0
    assert config.algorithm_kwargs() == {"tree": True, "op": ReduceOp.SUM, "root": 0}
    assert not config.check and config.format == "table"
    assert config_from_args(parse("--algorithm", "all_gather")).sizes == (32 * 2**20,)


def test_config_without_op_or_root() -> None:
    config = config_from_args(parse("--algorithm", "all_to_all", "-b", "1K", "-e", "8K",
                                    "-f", "2", "--dtype", "half", "--format", "csv"))
    assert config.op is None and config.root is None
    assert config.sizes == (1024, 2048, 4096, 8192)
    assert config.algorithm_kwargs() == {}


@pytest.mark.parametrize("text, value", [
    ("root=3", 3), ("tree=false", False), ("tree=TRUE", True),
])
def test_param_values_are_typed(text: str, value: object) -> None:
    config = config_from_args(parse("--algorithm", "reduce_broadcast_allreduce",
                                    "--sizes", "4", "--param", text))
    key = text.split("=")[0]
    assert config.params == ((key, value),) and type(config.params[0][1]) is type(value)


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "nope"], "unknown algorithm 'nope'; known: all_gather, all_to_all"),
    (["--algorithm", "ring_allreduce", "--sizes", "6"], "not a multiple of the float"),
    (["--algorithm", "ring_allreduce", "--sizes", "1KiB", "-b", "1K"], "not both"),
    (["--algorithm", "ring_allreduce", "--sizes", "1QB"], "unknown size unit"),
    (["--algorithm", "ring_allreduce", "--dtype", "bfloat16"], "unknown --dtype"),
    (["--algorithm", "ring_allreduce", "--op", "xor"], "unknown --op"),
    (["--algorithm", "ring_allreduce", "--format", "xml"], "unknown --format"),
    (["--algorithm", "all_gather", "--op", "sum"], "all_gather does not reduce"),
    (["--algorithm", "ring_allreduce", "--root", "1"], "ring_allreduce has no root"),
    (["--algorithm", "reduce", "--root", "-1"], "--root must be a rank >= 0"),
    (["--algorithm", "ring_allreduce", "--param", "tree=true"], "has no such parameter"),
    (["--algorithm", "reduce", "--param", "root=1"], "give it with --root"),
    (["--algorithm", "reduce", "--param", "op=max"], "give it with --op"),
    (["--algorithm", "reduce", "--param", "tree=1"], "expected a bool"),
    (["--algorithm", "reduce", "--param", "tree"], "key=value"),
    (["--algorithm", "reduce", "--param", "tree=true", "--param", "tree=false"], "twice"),
    (["--algorithm", "all_to_all", "--param", "split_sizes_matrix=1"], "cannot be written"),
    (["--algorithm", "ring_allreduce", "-b", "1K", "-e", "2K", "-f", "1"], "stepfactor"),
    (["--algorithm", "ring_allreduce", "-e", "1K"], "larger than -e"),
])
def test_config_errors_name_the_problem(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        config_from_args(parse(*argv))


def test_bench_config_without_flags() -> None:
    config = bench_config("reduce", [8, 1024], "float64", op="max", root=1,
                          params=["tree=true"], check=True, format="json")
    assert config == config_from_args(parse(
        "--algorithm", "reduce", "--sizes", "8,1KiB", "--dtype", "double", "--op", "MAX",
        "--root", "1", "--param", "tree=true", "--check", "--format", "json"))
    assert config.algorithm_kwargs() == {"tree": True, "op": ReduceOp.MAX, "root": 1}


@pytest.mark.parametrize("kwargs, message", [
    ({"sizes": []}, "--sizes names no size"),
    ({"sizes": [-4]}, "--sizes: a size must be an int >= 0 bytes, got -4"),
    ({"sizes": [4.0]}, "--sizes: a size must be an int"),
    ({"root": True}, "--root must be a rank"),
    ({"params": ["tree=yes"]}, "--param tree=yes: expected a bool"),
])
def test_bench_config_errors_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bench_config(**{"algorithm": "reduce", "sizes": [4], **kwargs})


@pytest.mark.parametrize("name, params", PARAM_VARIANTS)
def test_config_pickles(name: str, params: dict) -> None:
    config = bench_config(name, [1024, 4096], "half",
                          params=[f"{key}={value}" for key, value in params.items()])
    assert pickle.loads(pickle.dumps(config)) == config


def test_root_checked_against_world_size() -> None:
    config = config_from_args(parse("--algorithm", "broadcast", "--root", "4", "--sizes", "4"))
    config.check_world(5)
    with pytest.raises(ValueError, match=r"--root 4 is not a rank of a world of 4"):
        config.check_world(4)
    config = config_from_args(parse("--algorithm", "reduce_broadcast_allreduce",
                                    "--param", "root=2", "--sizes", "4"))
    with pytest.raises(ValueError, match=r"--param root 2 is not a rank"):
        config.check_world(2)


# -- rows -------------------------------------------------------------------------------

@given(name=st.sampled_from(sorted(COLLECTIVES)), p=st.integers(1, 64),
       count=st.integers(0, 10**6), dtype=st.sampled_from(DTYPES),
       seconds=st.floats(1e-7, 10.0))
@example(name="all_gather", p=3, count=256, dtype="float32", seconds=1e-3)
def test_row_follows_nccl_tests(name: str, p: int, count: int, dtype: str, seconds: float
                                ) -> None:
    collective = get_collective(name)
    itemsize = np.dtype(dtype).itemsize
    op = ReduceOp.SUM if collective.takes_op else None
    root = 0 if collective.takes_root else None
    row = bench_row(collective, p, count * itemsize, dtype, op, root, seconds, None)
    if collective.kind in SPLIT:  # per-rank count printed, size of the whole moved
        assert row.count == count // p
        assert row.size == row.count * p * itemsize
    else:
        assert (row.count, row.size) == (count, count * itemsize)
    assert row.size == buffer_count(collective, p, count * itemsize, itemsize) * itemsize
    assert row.time_us == pytest.approx(seconds * 1e6, rel=1e-15)
    assert row.algbw_GBps == pytest.approx(row.size / seconds / 1e9, rel=1e-12)
    assert row.busbw_GBps == pytest.approx(
        row.algbw_GBps * BUS_FACTOR[collective.kind](p), rel=1e-12)
    assert row.redop == ("sum" if collective.takes_op else "none")
    assert row.root == (0 if collective.takes_root else -1)


def test_row_examples() -> None:
    row = bench_row(get_collective("all_gather"), 3, 1024, np.float32, None, None, 1e-6, 0)
    assert row == BenchRow(1020, 85, "float", "none", -1, 1.0, 1.02, row.busbw_GBps, 0)
    assert row.busbw_GBps == pytest.approx(0.68, rel=1e-12)
    row = bench_row(get_collective("reduce"), 4, 64, np.int64, ReduceOp.MAX, 2, 2e-6, None)
    assert (row.size, row.count, row.type, row.redop, row.root) == (64, 8, "int64", "max", 2)
    assert row.busbw_GBps == row.algbw_GBps == pytest.approx(0.032)
    one_rank = bench_row(get_collective("ring_allreduce"), 1, 64, np.float16, ReduceOp.SUM,
                         None, 0.0, None)
    assert (one_rank.type, one_rank.algbw_GBps, one_rank.busbw_GBps) == ("half", 0.0, 0.0)
    with pytest.raises(ValueError, match="time"):
        bench_row(get_collective("reduce"), 2, 8, np.float32, None, 0, float("nan"), None)


# -- data check -------------------------------------------------------------------------

@given(p=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       op=st.sampled_from(list(ReduceOp)), seed=st.integers(0, 2**32 - 1),
       data=st.data())
@example(p=16, dtype="float16", op=ReduceOp.PROD, seed=0, data=None)
def test_check_inputs_reduce_exactly_in_any_order(p: int, dtype: str, op: ReduceOp,
                                                  seed: int, data: st.DataObject | None
                                                  ) -> None:
    inputs = check_inputs(p, 64, dtype, op, seed)
    assert all(a.dtype == np.dtype(dtype) and len(a) == 64 for a in inputs)
    assert all(np.array_equal(a, b) for a, b in zip(inputs, check_inputs(p, 64, dtype, op, seed)))
    order = list(range(p)) if data is None else data.draw(st.permutations(range(p)))
    forward = reduced(inputs, op)
    shuffled = reduced([inputs[r] for r in order], op)
    backward = reduced(inputs[::-1], op)
    assert np.array_equal(forward, shuffled) and np.array_equal(forward, backward)
    if p > 1:
        assert any(not np.array_equal(inputs[0], a) for a in inputs[1:])


def test_check_inputs_value_ranges() -> None:
    assert max(np.abs(a).max() for a in check_inputs(8, 1000, "float32", ReduceOp.SUM)) == 3
    assert max(np.abs(a).max() for a in check_inputs(8, 1000, "int32", ReduceOp.PROD)) == 2
    assert max(np.abs(a).max() for a in check_inputs(16, 1000, "float16", ReduceOp.PROD)) == 1
    assert max(np.abs(a).max() for a in check_inputs(1000, 50, "float16", ReduceOp.SUM)) == 2
    with pytest.raises(ValueError, match="half sums exact on 4096 ranks"):
        check_inputs(4096, 1, "float16", ReduceOp.AVG)


@pytest.mark.parametrize("name, params", PARAM_VARIANTS)
@pytest.mark.parametrize("p", [1, 3, 4])
def test_count_wrong_is_zero_for_simulated_results(name: str, params: dict, p: int) -> None:
    collective = get_collective(name)
    op = ReduceOp.MAX if collective.takes_op else None
    root = p - 1 if collective.takes_root else None
    count = buffer_count(collective, p, 4 * 23, 4)
    inputs = check_inputs(p, count, np.float32, op)
    kwargs = dict(params, **({"op": op} if op else {}), **({"root": root} if root else {}))
    result = simulate(collective.function, inputs, fully_connected(p, 1e9, 1e-6), **kwargs)
    assert count_wrong(collective, inputs, result.results, op, root, params) == 0


def test_count_wrong_counts_differences() -> None:
    allreduce = get_collective("ring_allreduce")
    inputs = check_inputs(3, 10, np.int32, ReduceOp.SUM)
    good = allreduce.reference(inputs, ReduceOp.SUM)
    bad = [a.copy() for a in good]
    bad[1][4] += 1
    bad[2][:3] += 1
    assert count_wrong(allreduce, inputs, good, ReduceOp.SUM, None, {}) == 0
    assert count_wrong(allreduce, inputs, bad, ReduceOp.SUM, None, {}) == 4
    assert count_wrong(allreduce, inputs, [good[0], None, good[2][:7]], ReduceOp.SUM,
                       None, {}) == 13
    reduce = get_collective("reduce")
    expected = reduce.reference(inputs, root=1, op=ReduceOp.SUM)
    assert count_wrong(reduce, inputs, [None, expected[1], None], ReduceOp.SUM, 1, {}) == 0
    # root 0 has no result: all 10 elements wrong; rank 1's result is not defined, not checked
    assert count_wrong(reduce, inputs, [None, expected[1], None], ReduceOp.SUM, 0, {}) == 10


# -- output -----------------------------------------------------------------------------

ROWS = [
    BenchRow(1024, 256, "float", "sum", -1, 70.01792, 0.0146, 0.0256, None),
    BenchRow(1073741824, 268435456, "float", "sum", -1, 18860.48192, 56.93, 99.63, None),
]


def test_csv_header_and_full_precision() -> None:
    lines = format_csv(ROWS).splitlines()
    assert lines[0] == CSV_HEADER == (
        "size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong")
    assert lines[1] == "1024,256,float,sum,-1,70.01792,0.0146,0.0256,N/A"
    checked = BenchRow(8, 2, "int32", "max", 0, 1 / 3, 0.1, 0.1, 0)
    assert float(format_csv([checked]).splitlines()[1].split(",")[5]) == 1 / 3
    assert format_csv([checked]).splitlines()[1].endswith(",0")


def test_table_looks_like_nccl_tests() -> None:
    text = format_table(ROWS, ["simcomm bench: test"])
    lines = text.splitlines()
    assert lines[0] == "# simcomm bench: test"
    assert lines[2].split() == ["#", "size", "count", "type", "redop", "root", "time",
                                "algbw", "busbw", "#wrong"]
    assert lines[3].split() == ["#", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"]
    assert lines[4] == ("        1024           256     float     sum      -1    70.02"
                        "    0.01    0.03    N/A")
    assert lines[5].split()[5] == "18860"  # 7.0f from 10000 us on, as nccl-tests
    assert len({len(line) for line in lines[4:6]}) == 1  # right-aligned columns
    assert lines[-3] == "# Out of bounds values : 0 OK"
    assert lines[-2] == f"# Avg bus bandwidth    : {(0.0256 + 99.63) / 2:g}"
    wrong = format_table([BenchRow(8, 2, "float", "sum", -1, 150.0, 1.0, 1.0, 3)])
    assert "  150.0  " in wrong and wrong.splitlines()[3].endswith("    3")
    assert "# Out of bounds values : 1 FAILED" in wrong


def test_json_rows() -> None:
    rows = json.loads(format_json(ROWS + [BenchRow(8, 2, "int32", "max", 0, 1.5, 0, 0, 0)]))
    assert list(rows[0]) == CSV_HEADER.split(",")
    assert rows[0]["time_us"] == 70.01792 and rows[0]["wrong"] is None
    assert rows[2]["wrong"] == 0
    ran = json.loads(format_json([BenchRow(8, 2, "int32", "max", 0, 1.5, 0, 0, 0, "ring/LL/8")]))
    assert ran[0]["algo"] == "ring/LL/8"


def test_rows_that_say_what_ran_show_it_in_a_last_column() -> None:
    row = BenchRow(8, 2, "float", "sum", -1, 20.4, 0.0, 0.0, None, "tree/LL/8")
    lines = format_table([row]).splitlines()
    assert lines[1].endswith("#wrong  algo/proto/channels")
    assert lines[3].endswith("N/A  tree/LL/8")
    assert "algo" not in format_table(ROWS)
