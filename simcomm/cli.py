"""The ``simcomm`` command line.

``simcomm bench`` simulates one collective over a range of sizes and prints nccl-tests'
columns (see ``algorithms.bench``), e.g.::

    simcomm bench --algorithm ring_allreduce --ranks 8 --topology ring \\
        --bandwidth 100GB/s --latency 5us --sizes 1KiB,1MiB,1GiB --format csv

Each subcommand lives in its own pair of functions (one adds its parser, one runs it), so
more can be added beside ``bench``. Bad arguments, simulator errors and a ``--check`` too
large for memory print one line, ``simcomm: error: ...``, on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from algorithms.bench import (
    BenchConfig, BenchRow, add_bench_arguments, bench_row, buffer_count, check_inputs, config_from_args,
    count_wrong, format_rows,
)
from simcomm.buffers import SizeOnly
from simcomm.engine import SimulationError, simulate
from simcomm.topology import TOPOLOGIES, Topology, make_topology
from simcomm.units import parse_bandwidth, parse_seconds

USAGE_ERROR = 2


class _UsageError(Exception):
    """A command-line mistake that argparse found."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake raises instead of printing the usage and exiting, so that
    every error leaves the same way: one line and status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{message} (see {self.prog} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``simcomm`` command line on ``argv`` (default ``sys.argv[1:]``); return the
    exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.run(args)
    except (_UsageError, ValueError, SimulationError, MemoryError) as error:
        message = " ".join(str(error).split())
        print(f"simcomm: error: {message}", file=sys.stderr)
        return USAGE_ERROR


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = _Parser(prog="simcomm", description="Simulate collective communication.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bench_parser(commands)
    return parser


# -- bench ------------------------------------------------------------------------------

def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench", help="time a collective over sizes, in nccl-tests' columns",
        description="Simulate a collective at each size and print nccl-tests' columns. "
                    "Buffers are size-only (nothing is allocated) unless --check asks for "
                    "real data.")
    add_bench_arguments(parser)
    topology = parser.add_argument_group("topology")
    topology.add_argument("--ranks", type=int, required=True, metavar="N",
                          help="number of ranks (GPUs)")
    topology.add_argument("--topology", required=True, metavar="KIND",
                          help=f"one of {', '.join(TOPOLOGIES)}")
    topology.add_argument("--bandwidth", required=True, metavar="RATE",
                          help="bandwidth of each link, e.g. 100GB/s or 400Gbps")
    topology.add_argument("--latency", required=True, metavar="TIME",
                          help="latency from GPU to GPU, e.g. 5us")
    topology.add_argument("--reduce-bandwidth", default="inf", metavar="RATE",
                          help="rate of local reductions and copies (default inf: free)")
    topology.add_argument("--gpus-per-node", type=int, metavar="N",
                          help="hierarchical: GPUs per node (default min(ranks, 8))")
    topology.add_argument("--inter-bandwidth", metavar="RATE",
                          help="hierarchical: network link bandwidth (default --bandwidth)")
    topology.add_argument("--inter-latency", metavar="TIME",
                          help="hierarchical: latency across nodes (default --latency)")
    parser.set_defaults(run=bench)


def bench(args: argparse.Namespace) -> int:
    """``simcomm bench``: simulate the collective at every size and print the rows."""
    config = config_from_args(args)
    topology = _topology_from_args(args)
    config.check_world(topology.size)
    rows = [_bench_size(config, topology, size) for size in config.sizes]
    header = [
        f"simcomm bench: {config.collective.name} on {topology.size} ranks, {args.topology} "
        f"topology, links {args.bandwidth} and {args.latency}, reduce bandwidth "
        f"{args.reduce_bandwidth}",
        "data check: on (numpy data)" if config.check else
        "data check: off (size-only buffers; --check runs real data)",
    ]
    if args.topology == "hierarchical":
        header.append(f"network links {args.inter_bandwidth or args.bandwidth} and "
                      f"{args.inter_latency or args.latency}")
    if config.params:
        header.append("params: " + " ".join(f"{k}={v}" for k, v in config.params.items()))
    sys.stdout.write(format_rows(rows, config.format, header))
    return 0


def _bench_size(config: BenchConfig, topology: Topology, size: int) -> BenchRow:
    p = topology.size
    count = buffer_count(config.collective, p, size, config.dtype.itemsize)
    if config.check:
        inputs = check_inputs(p, count, config.dtype, config.op)
    else:
        inputs = [SizeOnly(count, config.dtype)] * p  # immutable, so one serves every rank
    result = simulate(config.collective.function, inputs, topology, record=False,
                      **config.algorithm_kwargs())
    wrong = None
    if config.check:
        wrong = count_wrong(config.collective, inputs, result.results, config.op, config.root,
                            config.params)
    return bench_row(config.collective, p, size, config.dtype, config.op, config.root,
                     result.time, wrong)


def _topology_from_args(args: argparse.Namespace) -> Topology:
    if args.ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {args.ranks}")
    if args.topology != "hierarchical":
        for flag in ("gpus_per_node", "inter_bandwidth", "inter_latency"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies only to "
                                 "--topology hierarchical")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    return make_topology(
        args.topology, args.ranks,
        _flag(parse_bandwidth, "--bandwidth", args.bandwidth),
        _flag(parse_seconds, "--latency", args.latency),
        _flag(parse_bandwidth, "--reduce-bandwidth", args.reduce_bandwidth),
        gpus_per_node=args.gpus_per_node,
        inter_bandwidth=_flag(parse_bandwidth, "--inter-bandwidth", args.inter_bandwidth),
        inter_latency=_flag(parse_seconds, "--inter-latency", args.inter_latency))


def _flag(parse: Callable[[str], float], flag: str, text: str | None) -> float | None:
    """``parse(text)`` with the flag named in its error; None stays None."""
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
