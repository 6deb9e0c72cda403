"""What the ``simcomm`` and ``realcomm`` command lines share: a parser whose mistakes raise
instead of printing the usage and exiting; one way out for every error, a single line
``PROG: error: ...`` on stderr and exit status 2; and the flags of both ``bench`` commands
(``add_bench_arguments``), read into ``BenchConfig``s by ``configs_from_args``.

The bench flags are nccl-tests' (src/common.cu), spelled and meant as there, where they
apply: ``-b -e -f -i`` sizes, ``-d`` type, ``-o`` op, ``-r`` root, ``-c`` check, and, added
by each transport, ``-w -n -a``. Those that do not apply (threads and GPUs per process,
CUDA graphs, ...; ``NCCL_TESTS_REFUSED``, and what a transport adds) are refused with the
reason, except at nccl-tests' default value, which changes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from algorithms.harness.bench import (
    DTYPES, BenchConfig, bench_config, parse_size, parse_sizes, size_range, size_steps,
)
from algorithms.harness.catalog import KINDS
from algorithms.ops import ReduceOp

USAGE_ERROR = 2
# The shells' status for a command ended by Ctrl-C: 128 + SIGINT.
INTERRUPTED = 130
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
    be written (or is "")."""
    if not text:  # Path("") is the working folder
        raise argparse.ArgumentTypeError("an empty path names no file")
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
    prints one line on stderr and returns ``USAGE_ERROR``; Ctrl-C prints ``PROG:
    interrupted`` and returns ``INTERRUPTED``; a reader that leaves early (``... | head``)
    ends the output quietly."""
    try:
        return command()
    except KeyboardInterrupt:
        # Whatever the command started has been stopped on the way out (realcomm's
        # LocalGroup terminates its processes); the traceback would only say where it was.
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, *errors) as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_ERROR


# -- the bench flags --------------------------------------------------------------------

@dataclass(frozen=True)
class Refused:
    """An nccl-tests flag that does not apply here: refused with ``reason``, but at
    nccl-tests' ``default`` value (if it has one), which changes nothing."""

    flags: tuple[str, ...]
    default: str | None
    reason: str


NCCL_TESTS_REFUSED = (
    Refused(("-t", "--nthreads"), "1", "threads per process do not apply: each rank is a "
            "process of its own (realcomm) or one simulated GPU (simcomm)"),
    Refused(("-g", "--ngpus"), "1", "GPUs per process do not apply: a rank drives one GPU; "
            "give the number of ranks (simcomm: --ranks or a preset; realcomm: --nprocs or "
            "torchrun)"),
    Refused(("-m", "--agg_iters"), "1", "aggregated iterations (several collectives in one "
            "NCCL group call) are not supported: each run is one collective"),
    Refused(("-p", "--parallel_init"), "0", "there is no NCCL communicator to initialise in "
            "parallel threads: one process group per process (realcomm), none (simcomm)"),
    Refused(("-z", "--blocking"), "0", "nccl-tests' blocking mode (a host wait and barrier "
            "after each collective) is not offered; the timed runs go back to back"),
    Refused(("-y", "--stream_null"), "0", "there is no CUDA stream to choose: realcomm uses "
            "torch.distributed's, and the simulator has none"),
    Refused(("-G", "--cudagraph"), "0", "CUDA graphs do not apply: an algorithm is a Python "
            "generator run op by op, which no graph can capture"),
    Refused(("-C", "--report_cputime"), "0", "CPU time is not reported: realcomm reports "
            "wall-clock time and simcomm simulated time"),
    Refused(("-F", "--output_file"), None, "nccl-tests' CSV layout is not written; use "
            "--format csv (or json) and redirect the output to a file"),
)


class _Refuse(argparse.Action):
    """Refuse the flag with its reason, unless it is given nccl-tests' default value."""

    def __init__(self, option_strings: Sequence[str], dest: str, refused: Refused,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", metavar="VALUE",
                         default=argparse.SUPPRESS, **kwargs)
        self.refused = refused

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values is None or values.strip() != self.refused.default:
            raise argparse.ArgumentError(self, self.refused.reason)


def _add_refused_arguments(parser: argparse.ArgumentParser, refused: Sequence[Refused]
                           ) -> None:
    """Add nccl-tests' flags that do not apply, each refused with its reason."""
    group = parser.add_argument_group(
        "nccl-tests flags that do not apply", "refused with the reason, but at nccl-tests' "
        "default value, which changes nothing")
    for item in refused:
        default = f" ({item.default} is accepted)" if item.default is not None else ""
        group.add_argument(*item.flags, action=_Refuse, refused=item,
                           help=item.reason + default)


def _check_flag(text: str) -> bool:
    """``-c``'s value: 0 (off) or 1 (on)."""
    if text.strip() not in ("0", "1"):
        raise argparse.ArgumentTypeError(
            f"takes 0 (off) or 1 (on), got {text!r} (one data check runs per size)")
    return text.strip() == "1"


def add_bench_arguments(parser: argparse.ArgumentParser,
                        refused: Sequence[Refused] = NCCL_TESTS_REFUSED) -> None:
    """Add the benchmark flags that every transport's ``bench`` command shares, and the
    nccl-tests flags it does not take, ``refused``, each refused with its reason."""
    parser.add_argument("--algorithm", required=True, metavar="NAME|MODULE:FUNCTION",
                        help="collective to run: a built-in one by its Python name (e.g. "
                             "ring_allreduce), or your own generator function taking (comm, x, "
                             "...) as module.path:function, imported from the working folder")
    parser.add_argument("--kind", metavar="COLLECTIVE",
                        help="which nccl-tests collective your module:function implements, "
                             "for its sizes, bus bandwidth and --check reference: "
                             f"{', '.join(KINDS)} (or all_reduce, ...; default allreduce)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the algorithm, e.g. tree=true (repeatable)")
    parser.add_argument("--sizes", metavar="LIST",
                        help="comma-separated sizes in bytes, e.g. 1KiB,1MiB,1GiB (1K and 1M "
                             "are 1024-based, as nccl-tests; 1KB 1000; 1Kb is refused)")
    parser.add_argument("-b", "--minbytes", metavar="SIZE",
                        help="smallest size, as nccl-tests (default 32M)")
    parser.add_argument("-e", "--maxbytes", metavar="SIZE",
                        help="largest size, as nccl-tests (default 32M)")
    parser.add_argument("-f", "--stepfactor", type=int, metavar="N",
                        help="multiply the size by N between runs (default 2)")
    parser.add_argument("-i", "--stepbytes", metavar="SIZE",
                        help="add SIZE between runs instead of multiplying, as nccl-tests' -i")
    parser.add_argument("-d", "--datatype", "--dtype", dest="dtype", default="float",
                        metavar="TYPE",
                        help=f"nccl-tests' type: {', '.join(DTYPES)}, or all (each in turn); "
                             "float16, float32 and float64 also (default float)")
    parser.add_argument("-o", "--op", metavar="OP",
                        help="reduction: sum, prod, max, min, avg, or all (each in turn; "
                             "default sum)")
    parser.add_argument("-r", "--root", type=int, metavar="RANK",
                        help="root rank of broadcast and reduce (default 0)")
    parser.add_argument("-c", "--check", nargs="?", type=_check_flag, const=True,
                        default=False, metavar="0|1",
                        help="1 (or a bare --check): run real data and count wrong elements "
                             "(default 0, unlike nccl-tests' 1)")
    parser.add_argument("--format", default="table", metavar="FORMAT",
                        help="table (as nccl-tests prints), csv or json (default table); the "
                             "table and csv print each row as soon as it is done, json the "
                             "whole list at the end")
    _add_refused_arguments(parser, refused)


def configs_from_args(args: argparse.Namespace,
                      unsupported_dtypes: Mapping[str, str] = MappingProxyType({})
                      ) -> list[BenchConfig]:
    """The flags of ``add_bench_arguments``, checked and typed by ``bench_config``: one
    configuration per type and op, ``-d all`` and ``-o all`` each in turn in nccl-tests'
    order (types, then ops within each). A type of ``unsupported_dtypes`` (name -> why) is
    refused if named and left out of ``-d all``."""
    dtypes = ([name for name in DTYPES if name not in unsupported_dtypes]
              if args.dtype == "all" else [args.dtype])
    for name in dtypes:
        if name in unsupported_dtypes:
            raise ValueError(f"--dtype {name}: {unsupported_dtypes[name]}")
    ops = [op.value for op in ReduceOp] if args.op == "all" else [args.op]
    sizes = _sizes_from_args(args)
    return [bench_config(args.algorithm, sizes, dtype, op, args.root, args.param, args.check,
                         args.format, args.kind)
            for dtype in dtypes for op in ops]


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The one configuration of ``add_bench_arguments``' flags (``configs_from_args``);
    ``-d all`` and ``-o all``, which make several, raise ``ValueError``."""
    configs = configs_from_args(args)
    if len(configs) > 1:
        raise ValueError("-d all and -o all make several configurations: read them with "
                         "configs_from_args")
    return configs[0]


def _sizes_from_args(args: argparse.Namespace) -> tuple[int, ...]:
    stepped = (args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    if args.sizes is not None:
        if any(value is not None for value in stepped):
            raise ValueError("give either --sizes or -b/-e/-f/-i, not both")
        return parse_sizes(args.sizes)
    minbytes = DEFAULT_BYTES if args.minbytes is None else _flag_size("-b", args.minbytes)
    maxbytes = DEFAULT_BYTES if args.maxbytes is None else _flag_size("-e", args.maxbytes)
    if args.stepbytes is not None:
        if args.stepfactor is not None:
            raise ValueError("give either -f/--stepfactor or -i/--stepbytes, not both")
        return size_steps(minbytes, maxbytes, _flag_size("-i", args.stepbytes))
    return size_range(minbytes, maxbytes, 2 if args.stepfactor is None else args.stepfactor)


def _flag_size(flag: str, text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
