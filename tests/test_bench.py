"""The transport-free benchmark harness: the configuration and its flags, nccl-tests'
size/count/bandwidth rules, the data check and the output formats."""

from __future__ import annotations

import argparse
import io
import json
import pickle

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms import ReduceOp
from algorithms.harness.bench import (
    CSV_HEADER, DTYPES, BenchRow, RowWriter, RunSpread, bench_config, bench_row, buffer_count,
    check_inputs, count_wrong, format_csv, format_json, format_table, parse_size, parse_sizes,
    rank_time, size_range, size_steps,
)
from algorithms.harness.catalog import (
    COLLECTIVES, KINDS, UserAlgorithmError, get_collective, kind_name,
)
from algorithms.harness.cli import (
    NCCL_TESTS_REFUSED, Parser, UsageError, add_bench_arguments, config_from_args,
    configs_from_args,
)
from algorithms.reference import reduced
from simcomm import fully_connected, simulate
from simcomm.bench import bench_rows
from simcomm.presets import make_preset

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
TYPE_NAMES = ["float16", "float32", "float64", "int32", "int64", "int8", "uint8", "uint32",
          "uint64", "bfloat16"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def parse_error(*argv: str) -> str:
    """The one-line message of a command line that the bench flags refuse."""
    parser = Parser(prog="bench")
    add_bench_arguments(parser)
    with pytest.raises(UsageError) as caught:
        parser.parse_args(list(argv))
    return str(caught.value)


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
    (["--algorithm", "ring_allreduce", "--dtype", "float8"], "unknown --dtype"),
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
    # Counted, not built: 4e9 sizes ate the memory.
    (["--algorithm", "ring_allreduce", "-b", "4", "-e", "16G", "-i", "4"],
     "-b 4 -e 17179869184 -i 4 make 4,294,967,296 sizes, more than the 10,000 a run takes"),
    (["--algorithm", "ring_allreduce", "-b", "4", "-e", "40004", "-i", "4"], "make 10,001 sizes"),
    (["--algorithm", "ring_allreduce", "--sizes", ",".join(["4"] * 10_001)],
     "--sizes names 10,001 sizes, more than the 10,000 a run takes"),
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


def test_the_argument_check_needs_no_memory_for_the_smallest_size() -> None:
    # A forced algorithm at 64 GiB (16 Gi float32 each rank): the check starts rank 0's
    # schedule on a view of one element, where it once allocated the whole buffer.
    config = config_from_args(parse("--algorithm", "nccl_allreduce", "--param",
                                    "algorithm=tree", "--sizes", "64GiB"))
    config.check_world(16)
    with pytest.raises(ValueError, match="unknown protocol 'll256'"):
        config_from_args(parse("--algorithm", "nccl_allreduce", "--param", "protocol=ll256",
                               "--sizes", "64GiB")).check_world(16)


def test_the_argument_check_sees_the_ranks_per_node() -> None:
    # A forced protocol on 10 nodes of 8: NCCL's rings run one channel per rank of a node.
    # The check once saw all 80 ranks on one node, asked for 80 channels and refused them.
    config = config_from_args(parse("--algorithm", "nccl_all_gather", "--param",
                                    "protocol=simple", "--sizes", "32MiB"))
    config.check_world(80, local_size=8)
    with pytest.raises(ValueError, match="channels must be an int from 1 to 64"):
        config.check_world(80)  # one node of 80
    row, = bench_rows(config, make_preset("cluster-h100:nodes=10"), level="collective")
    assert row.algo == "ring/SIMPLE/16"

# -- rows -------------------------------------------------------------------------------

@given(name=st.sampled_from(sorted(COLLECTIVES)), p=st.integers(1, 64),
       count=st.integers(0, 10**6), dtype=st.sampled_from(TYPE_NAMES),
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

@given(p=st.integers(1, 40), dtype=st.sampled_from(TYPE_NAMES),
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
    # bfloat16 holds every integer up to 2**8 = 256 exactly
    assert max(np.abs(a).max() for a in check_inputs(100, 50, "bfloat16", ReduceOp.SUM)) == 2
    with pytest.raises(ValueError, match="bfloat16 sums exact on 257 ranks"):
        check_inputs(257, 1, "bfloat16", ReduceOp.SUM)


@pytest.mark.parametrize("op", list(ReduceOp))
def test_bfloat16_runs_and_checks_like_the_other_types(op: ReduceOp) -> None:
    collective = get_collective("ring_allreduce")
    inputs = check_inputs(5, 77, "bfloat16", op)
    assert inputs[0].dtype == DTYPES["bfloat16"] == np.dtype("bfloat16")
    result = simulate(collective.function, inputs, fully_connected(5, 1e9, 1e-6), op=op)
    assert count_wrong(collective, inputs, result.results, op, None, {}) == 0
    assert result.results[0].dtype == DTYPES["bfloat16"]


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


# -- nccl-tests' flags ------------------------------------------------------------------

def test_nccl_tests_short_flags_mean_the_long_ones() -> None:
    short = config_from_args(parse("--algorithm", "reduce", "-b", "1K", "-e", "4K", "-f", "4",
                                   "-d", "double", "-o", "max", "-r", "1", "-c", "1"))
    long = config_from_args(parse("--algorithm", "reduce", "--minbytes", "1K", "--maxbytes",
                                  "4K", "--stepfactor", "4", "--datatype", "double", "--op",
                                  "max", "--root", "1", "--check", "1"))
    old = config_from_args(parse("--algorithm", "reduce", "--sizes", "1KiB,4KiB", "--dtype",
                                 "double", "--op", "max", "--root", "1", "--check"))
    assert short == long == old
    assert (short.sizes, short.type_name, short.op, short.root, short.check) == (
        (1024, 4096), "double", ReduceOp.MAX, 1, True)


@pytest.mark.parametrize("argv, check", [
    ((), False), (("-c", "0"), False), (("-c", "1"), True), (("--check",), True),
    (("--check", "0"), False), (("-c",), True),
])
def test_check_takes_0_or_1_or_nothing(argv: tuple[str, ...], check: bool) -> None:
    assert config_from_args(parse("--algorithm", "reduce", "--sizes", "8", *argv)).check is check


def test_check_refuses_other_counts() -> None:
    assert parse_error("--algorithm", "reduce", "-c", "2") == (
        "argument -c/--check: takes 0 (off) or 1 (on), got '2' (one data check runs per "
        "size) (see bench --help)")


def test_all_types_and_ops_run_each_in_turn_in_nccl_tests_order() -> None:
    configs = configs_from_args(parse("--algorithm", "ring_allreduce", "--sizes", "8",
                                      "-d", "all", "-o", "all"))
    assert [(c.type_name, c.op.value) for c in configs] == [
        (dtype, op.value) for dtype in DTYPES for op in ReduceOp]
    assert list(DTYPES) == ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half",
                            "float", "double", "bfloat16"]
    gathers = configs_from_args(parse("--algorithm", "all_gather", "--sizes", "8", "-d", "all"))
    assert [c.op for c in gathers] == [None] * len(DTYPES)
    with pytest.raises(ValueError, match="all_gather does not reduce"):
        configs_from_args(parse("--algorithm", "all_gather", "--sizes", "8", "-o", "all"))
    with pytest.raises(ValueError, match="-d all and -o all make several configurations"):
        config_from_args(parse("--algorithm", "ring_allreduce", "--sizes", "8", "-o", "all"))


def test_a_transport_leaves_out_the_types_it_cannot_run() -> None:
    unsupported = {"uint32": "no arithmetic"}
    configs = configs_from_args(parse("--algorithm", "ring_allreduce", "--sizes", "8",
                                      "-d", "all"), unsupported)
    assert [c.type_name for c in configs] == [d for d in DTYPES if d != "uint32"]
    with pytest.raises(ValueError, match="^--dtype uint32: no arithmetic$"):
        configs_from_args(parse("--algorithm", "ring_allreduce", "-d", "uint32"), unsupported)


def test_mulsum_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="--op mulsum: NCCL's pre-multiplied sum is not one "
                                         "of the reductions the algorithms implement; use sum"):
        config_from_args(parse("--algorithm", "ring_allreduce", "-o", "mulsum"))


@pytest.mark.parametrize("refused", NCCL_TESTS_REFUSED, ids=lambda r: r.flags[0])
def test_nccl_tests_flags_that_do_not_apply_are_refused_with_the_reason(refused) -> None:
    short, long = refused.flags
    message = parse_error("--algorithm", "ring_allreduce", short, "2")
    assert message == f"argument {short}/{long}: {refused.reason} (see bench --help)"
    assert parse_error("--algorithm", "ring_allreduce", long) == message
    if refused.default is not None:  # nccl-tests' default changes nothing: accepted
        assert parse("--algorithm", "ring_allreduce", short, refused.default)


def test_sizes_stepped_by_bytes() -> None:
    assert size_steps(1024, 4096, 1024) == (1024, 2048, 3072, 4096)
    assert size_steps(8, 20, 8) == (8, 16)
    config = config_from_args(parse("--algorithm", "ring_allreduce", "-b", "1K", "-e", "3K",
                                    "-i", "1K"))
    assert config.sizes == (1024, 2048, 3072)


@pytest.mark.parametrize("argv, message", [
    (["-b", "1K", "-e", "4K", "-i", "0"], "-i/--stepbytes must be >= 1 byte, got 0"),
    (["-b", "1K", "-e", "4K", "-i", "1K", "-f", "2"], "give either -f/--stepfactor or "
                                                     "-i/--stepbytes, not both"),
    (["-b", "1Kb"], "-b: size '1Kb' is ambiguous"),
    (["-e", "1Mb"], "-e: size '1Mb' is ambiguous"),
    (["--sizes", "1Gb"], "size '1Gb' is ambiguous: a small b means bits, as in rates (Gb/s); "
                         "write 1GB for 10^9 bytes, or 1G or 1GiB for 2^30 bytes"),
])
def test_size_flag_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        config_from_args(parse("--algorithm", "ring_allreduce", *argv))
    assert message in str(caught.value)


def test_rank_time_as_nccl_tests_average() -> None:
    seconds = [3.0, 1.0, 2.0, 6.0]
    assert [rank_time(seconds, a) for a in range(4)] == [3.0, 3.0, 1.0, 6.0]
    with pytest.raises(ValueError, match="-a/--average must be one of 0 .rank 0's time."):
        rank_time(seconds, 4)


# -- algorithms of a user's own ---------------------------------------------------------

def test_a_users_algorithm_is_an_allreduce_unless_its_kind_says(user_algorithms: str) -> None:
    mine = get_collective(f"{user_algorithms}:my_allreduce")
    assert (mine.name, mine.kind, mine.takes_op, mine.takes_root) == (
        f"{user_algorithms}:my_allreduce", "allreduce", True, False)
    assert mine.reference is COLLECTIVES["ring_allreduce"].reference
    broadcast = get_collective(f"{user_algorithms}:my_broadcast", "broadcast")
    assert (broadcast.kind, broadcast.takes_op, broadcast.takes_root) == (
        "broadcast", False, True)
    assert broadcast.reference is COLLECTIVES["broadcast"].reference
    assert get_collective(f"{user_algorithms}:my_broadcast", "broadcast") == broadcast
    config = bench_config(f"{user_algorithms}:small_only", [64], "int32", op="max",
                          params=["limit=3"], check=True)
    assert config.algorithm_kwargs() == {"limit": 3, "op": ReduceOp.MAX}
    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.parametrize("text", ["all_reduce", "allreduce", "Reduce_Scatter", "all_to_all"])
def test_kinds_are_written_either_way(text: str) -> None:
    assert kind_name(text) in KINDS


@pytest.mark.parametrize("algorithm, kind, message", [
    ("{m}_nope:f", None, "--algorithm '{m}_nope:f': no module named '{m}_nope' (looked in the "
                         "working folder"),
    ("{m}:nope", None, "--algorithm '{m}:nope': module {m} has no 'nope'"),
    ("{m}:not_a_generator", None, "--algorithm '{m}:not_a_generator': not_a_generator is not "
                                  "a generator function; an algorithm yields its ops"),
    ("{m}:no_buffer", None, "--algorithm '{m}:no_buffer': no_buffer must take (comm, x, ...), "
                            "not (comm)"),
    ("{m}:sums_only", None, "--algorithm '{m}:sums_only': allreduce takes op, so sums_only "
                            "must too (def sums_only(comm, x, op=SUM, ...)), or give the --kind "
                            "it implements"),
    ("{m}:my_allreduce", "reduce", "reduce takes root, so my_allreduce must too"),
    ("{m}_broken:f", None, "--algorithm '{m}_broken:f': importing {m}_broken failed: "
                           "RuntimeError: boom"),
    ("{m}_needs:f", None, "--algorithm '{m}_needs:f': importing {m}_needs failed: No module "
                          "named 'no_such_package_here'"),
    ("{m}:", None, "--algorithm '{m}:': write a built-in name or module.path:function"),
])
def test_a_users_algorithm_that_cannot_run_is_one_line(user_algorithms: str, algorithm: str,
                                                       kind: str | None, message: str) -> None:
    with pytest.raises(UserAlgorithmError) as caught:
        bench_config(algorithm.format(m=user_algorithms), [8], kind=kind)
    assert message.format(m=user_algorithms) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("algorithm, kind, message", [
    ("ring_allreduce", "broadcast", "--kind broadcast: ring_allreduce implements allreduce "
                                    "(--kind says what an algorithm of your own"),
    ("{m}:my_allreduce", "allgathr", "unknown --kind 'allgathr'; known: allreduce, "
                                     "reducescatter, allgather, broadcast, reduce, alltoall"),
])
def test_kind_errors(user_algorithms: str, algorithm: str, kind: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        bench_config(algorithm.format(m=user_algorithms), [8], kind=kind)
    assert message in str(caught.value)


# -- rows as they come ------------------------------------------------------------------

def test_row_writer_prints_the_header_first_and_each_row_at_once() -> None:
    stream = io.StringIO()
    writer = RowWriter(stream, "table", ["what ran"], algo_column=False)
    writer.start()
    header = stream.getvalue()
    assert header.splitlines()[0] == "# what ran"
    assert header.splitlines()[-2].split()[1:] == ["size", "count", "type", "redop", "root",
                                                   "time", "algbw", "busbw", "#wrong"]
    writer.write(ROWS[0])
    assert stream.getvalue() == header + format_table(ROWS[:1]).splitlines(True)[3]
    writer.write(ROWS[1])
    assert "Out of bounds" not in stream.getvalue()
    writer.finish()
    assert stream.getvalue() == format_table(ROWS, ["what ran"])


def test_row_writer_heads_the_columns_with_the_first_row_when_it_must_tell() -> None:
    stream = io.StringIO()
    writer = RowWriter(stream, "table")
    writer.start()
    assert stream.getvalue() == "#\n"
    ran = BenchRow(8, 2, "float", "sum", -1, 20.4, 0.0, 0.0, None, "tree/LL/8")
    writer.write(ran)
    assert stream.getvalue().splitlines()[1].endswith("#wrong  algo/proto/channels")
    assert stream.getvalue().splitlines()[3].endswith("N/A  tree/LL/8")
    stream = io.StringIO()
    empty = RowWriter(stream, "table")
    empty.start()
    empty.finish()  # no row: the heading still comes, before the summary
    assert stream.getvalue().splitlines()[1].endswith("#wrong")


def test_csv_streams_and_json_comes_whole() -> None:
    stream = io.StringIO()
    writer = RowWriter(stream, "csv")
    writer.start()
    writer.write(ROWS[0])
    assert stream.getvalue() == "".join(format_csv(ROWS).splitlines(True)[:2])
    writer.write(ROWS[1])
    writer.finish()
    assert stream.getvalue() == format_csv(ROWS)
    stream = io.StringIO()
    writer = RowWriter(stream, "json")
    writer.start()
    writer.write(ROWS[0])
    assert stream.getvalue() == ""
    writer.finish()
    assert stream.getvalue() == format_json(ROWS[:1])
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        RowWriter(stream, "xml")


def test_a_message_level_run_tells_its_progress() -> None:
    from algorithms import ring_allreduce
    from simcomm import SizeOnly, ring, simulate
    from simcomm.collective_level import expected_messages
    from simcomm.engine import PROGRESS_EVERY
    told: list[int] = []
    result = simulate(ring_allreduce, [SizeOnly(1000)] * 100, ring(100, 1e9, 1e-6),
                      record=False, progress=told.append)
    assert result.messages == expected_messages(ring_allreduce, 100) == 19800
    assert told == [PROGRESS_EVERY] * (19800 // PROGRESS_EVERY)


def test_a_rows_spread_gets_six_more_columns_in_every_format() -> None:
    spread = RunSpread.of([3e-6, 1e-6, 2e-6, 10e-6])
    assert spread.columns()[0] == pytest.approx(1.0) and spread.columns()[4] == pytest.approx(10.0)
    assert spread.percentile(50) == pytest.approx(2.5)
    assert spread.cv == pytest.approx(np.std([3, 1, 2, 10]) / 4)
    row = BenchRow(8, 2, "float", "sum", -1, 4.0, 0.0, 0.0, None, spread=spread)
    plain = BenchRow(16, 4, "float", "sum", -1, 5.0, 0.0, 0.0, None)
    lines = format_csv([row, plain]).splitlines()
    assert lines[0] == CSV_HEADER + ",min_us,p50_us,p90_us,p99_us,max_us,cv"
    assert len(lines[1].split(",")) == len(lines[0].split(",")) == len(lines[2].split(","))
    table = format_table([row]).splitlines()
    assert table[-5].split()[-6:] == ["(us)"] * 5 + ["(%)"]
    assert table[-4].split()[-6:] == ["1.00", "2.50", "7.90", "9.79", "10.00", "88.39"]
    assert json.loads(format_json([row]))[0]["spread"]["runs_us"] == pytest.approx(
        [3.0, 1.0, 2.0, 10.0])
    for bad in ([], [1.0, float("nan")], [-1.0]):
        with pytest.raises(ValueError, match="one or more run times"):
            RunSpread.of(bad)
