"""What the ``simcomm`` and ``realcomm`` command lines share: a parser whose mistakes raise
instead of printing the usage and exiting; one way out for every error, a single line
``PROG: error: ...`` on stderr and exit status 2; and the flags of both ``bench`` commands
(``add_bench_arguments``), read into a ``BenchConfig`` by ``config_from_args``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from algorithms.harness.bench import BenchConfig, bench_config, parse_size, parse_sizes, size_range

USAGE_ERROR = 2
# nccl-tests' default -b and -e (src/common.cu): 32 MiB.
DEFAULT_BYTES = 32 * 1024**2


class UsageError(Exception):
    """A command-line mistake."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake raises ``UsageError`` so that it leaves as every other error
    does."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def output_file(text: str) -> str:
    """An argparse ``type`` for a file the command writes: refused when the command line is
    read (not after a long run) if it is a folder, its folder does not exist or it cannot
    be written."""
    target = Path(text)
    folder = target.parent
    if target.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"{folder} is not a folder" if folder.exists() else f"folder {folder} does not exist")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be written")
    return text


def run_command(prog: str, command: Callable[[], int],
                errors: tuple[type[BaseException], ...]) -> int:
    """Run ``command`` and return its exit status. A ``UsageError`` or one of ``errors``
    prints one line on stderr and returns ``USAGE_ERROR``; a reader that leaves early
    (``... | head``) ends the output quietly."""
    try:
        return command()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, *errors) as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_ERROR


# -- the bench flags --------------------------------------------------------------------

def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark flags that every transport's ``bench`` command shares."""
    parser.add_argument("--algorithm", required=True, metavar="NAME",
                        help="collective to run, by its Python name (e.g. ring_allreduce)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the algorithm, e.g. tree=true (repeatable)")
    parser.add_argument("--sizes", metavar="LIST",
                        help="comma-separated sizes in bytes, e.g. 1KiB,1MiB,1GiB")
    parser.add_argument("-b", "--minbytes", metavar="SIZE",
                        help="smallest size, as nccl-tests (default 32M)")
    parser.add_argument("-e", "--maxbytes", metavar="SIZE",
                        help="largest size, as nccl-tests (default 32M)")
    parser.add_argument("-f", "--stepfactor", type=int, metavar="N",
                        help="multiply the size by N between runs (default 2)")
    parser.add_argument("--dtype", default="float", metavar="TYPE",
                        help="float16/half, float32/float, float64/double, int32 or int64 "
                             "(default float)")
    parser.add_argument("--op", metavar="OP",
                        help="reduction: sum, prod, max, min or avg (default sum)")
    parser.add_argument("--root", type=int, metavar="RANK",
                        help="root rank of broadcast and reduce (default 0)")
    parser.add_argument("--check", action="store_true",
                        help="run on real data and count wrong elements")
    parser.add_argument("--format", default="table", metavar="FORMAT",
                        help="table (as nccl-tests prints), csv or json (default table)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The flags of ``add_bench_arguments``, checked and typed by ``bench_config``."""
    return bench_config(args.algorithm, _sizes_from_args(args), args.dtype, args.op,
                        args.root, args.param, args.check, args.format)


def _sizes_from_args(args: argparse.Namespace) -> tuple[int, ...]:
    stepped = (args.minbytes, args.maxbytes, args.stepfactor)
    if args.sizes is not None:
        if any(value is not None for value in stepped):
            raise ValueError("give either --sizes or -b/-e/-f, not both")
        return parse_sizes(args.sizes)
    minbytes = DEFAULT_BYTES if args.minbytes is None else parse_size(args.minbytes)
    maxbytes = DEFAULT_BYTES if args.maxbytes is None else parse_size(args.maxbytes)
    return size_range(minbytes, maxbytes, 2 if args.stepfactor is None else args.stepfactor)
