"""The ``realcomm`` command line.

``realcomm bench`` runs one collective over torch.distributed at each size and prints
nccl-tests' columns, the same as ``simcomm bench`` (see ``algorithms.harness.bench``), e.g.::

    realcomm bench --nprocs 2 --algorithm ring_allreduce --sizes 1MiB,16MiB --check
    torchrun --nproc_per_node 2 -m realcomm bench --algorithm ring_allreduce -b 1M -e 64M

With ``--nprocs N`` it spawns N local processes itself (CPU and gloo unless ``--device``
says otherwise) and hands each the checked configurations; without, it expects torchrun's
environment and every process reads its own command line. Either way rank 0 prints, as
nccl-tests does: the header first, then each row as soon as it is done. Bad
arguments and failed runs print one line, ``realcomm: error: ...``, on stderr and exit with
status 2.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from algorithms.harness.bench import AVERAGES, BenchConfig, RowWriter, parse_size, parse_sizes
from algorithms.harness.cli import (
    Parser, add_bench_arguments, configs_from_args, output_file, run_command,
)
from algorithms.harness.tuner_file import TunerRow, tuner_rows_for
from algorithms.protocol import AlgorithmError
from realcomm.bench import (
    BASELINES, DEFAULT_AVERAGE, ITERS, NATIVE_NAMES, TIMINGS, UNSUPPORTED_DTYPES, WARMUP_ITERS,
    RunOptions, bench_rank,
)
from realcomm.calibrate import DEFAULT_SIZES, Measurements, check_sizes, measure
from realcomm.driver import (
    DEFAULT_SLICE_BYTES, DEFAULT_TIMEOUT, MAX_TIMEOUT, MIN_TIMEOUT, RealcommError, check_timeout,
)
from realcomm.launch import (
    backend_for, default_device, in_launcher_env, init_from_env, load_kernels_eagerly_for_nccl,
    spawn,
)

# Each local process is a Python interpreter with torch loaded (about 250 MB) on this one
# machine; more ranks than this belong on several machines, under torchrun.
MAX_NPROCS = 256


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``realcomm`` command line on ``argv`` (default ``sys.argv[1:]``); return the
    exit status."""
    def command() -> int:
        args = build_parser().parse_args(argv)
        return args.run(args)
    return run_command("realcomm", command,
                       (ValueError, RuntimeError, AlgorithmError, RealcommError))


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = Parser(prog="realcomm",
                    description="Run collective-communication algorithms over "
                                "torch.distributed.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bench_parser(commands)
    _add_calibrate_parser(commands)
    return parser


# -- bench ------------------------------------------------------------------------------

def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench", help="time a collective over sizes, in nccl-tests' columns",
        description="Run a collective at each size over torch.distributed and print "
                    "nccl-tests' columns. Start it under torchrun, or give --nprocs.")
    add_bench_arguments(parser)
    run = parser.add_argument_group("processes and timing")
    run.add_argument("--nprocs", type=int, metavar="N",
                     help=f"spawn N local processes (not under torchrun), at most "
                          f"{MAX_NPROCS}: each is a Python interpreter with torch loaded")
    run.add_argument("--device", choices=("cpu", "cuda"),
                     help="where the buffers live (default: cpu with --nprocs, else cuda "
                          "if there is one)")
    run.add_argument("--backend", choices=("gloo", "nccl"),
                     help="default: nccl for cuda, gloo for cpu")
    run.add_argument("-w", "--warmup_iters", type=int, default=WARMUP_ITERS, metavar="N",
                     help=f"untimed runs before timing each size (default {WARMUP_ITERS}, "
                          "as nccl-tests)")
    run.add_argument("-n", "--iters", type=int, default=ITERS, metavar="N",
                     help=f"timed runs per size (default {ITERS}, as nccl-tests)")
    _add_timing_argument(run)
    run.add_argument("-a", "--average", type=int, choices=sorted(AVERAGES), metavar="0-3",
                     help="which time of the ranks a row shows, as nccl-tests' -a: "
                          + ", ".join(f"{k} {v}" for k, v in AVERAGES.items())
                          + f" (default {DEFAULT_AVERAGE['mean']}, as nccl-tests; with "
                            f"--timing median, {DEFAULT_AVERAGE['median']} for each run)")
    run.add_argument("-I", "--per-iteration", action="store_true",
                     help="time every run and add their spread to each row: least, median, "
                          "90th and 99th percentile, most (us) and coefficient of variation; "
                          "JSON keeps every run's time")
    run.add_argument("--baseline", default="none", choices=BASELINES,
                     help="native: time torch's own collective of the same kind instead")
    run.add_argument("-T", "--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"give up on a silent peer after this long, {MIN_TIMEOUT:g} to "
                          f"{MAX_TIMEOUT:g} (default {DEFAULT_TIMEOUT:g}; nccl-tests' -T)")
    run.add_argument("--slice-bytes", default=str(DEFAULT_SLICE_BYTES), metavar="SIZE",
                     help="send larger messages in slices of this size, 0 for whole "
                          f"(default {DEFAULT_SLICE_BYTES})")
    run.add_argument("--tuner-file", metavar="FILE.csv",
                     help="choose how nccl_allreduce, nccl_reduce_scatter and nccl_all_gather "
                          "run each call from this tuner file (simcomm tune writes one); a "
                          "call no row covers runs the ring on one channel")
    run.add_argument("--check-messages", action="store_true",
                     help="check every message's length and dtype against its receive, and "
                          "every send buffer against changes before its Wait (a header per "
                          "message: slower)")
    parser.set_defaults(run=bench)


def bench(args: argparse.Namespace) -> int:
    """``realcomm bench``: time the collective at every size (``-d all`` and ``-o all``:
    every type and op in turn); rank 0 prints each row as it is done."""
    configs = configs_from_args(args, UNSUPPORTED_DTYPES)
    options = _options_from_args(args)
    outcome = _on_every_rank(args, bench_and_print, (configs, options, args.backend),
                             minimum=1, timeout=options.timeout,
                             check_world=configs[0].check_world)
    return 1 if outcome is not None and outcome[0] else 0  # rank 0 found wrong values


def bench_and_print(configs: Sequence[BenchConfig], options: RunOptions, backend: str | None,
                    device: torch.device) -> bool:
    """On every rank: run every configuration in turn. Rank 0 prints the header first and
    each row as soon as it is done (``RowWriter``), as nccl-tests' rank 0 does. Whether
    rank 0 found wrong values (False elsewhere)."""
    writer = None
    if dist.get_rank() == 0:
        header = _bench_header(configs[0], options, backend or backend_for(device),
                               dist.get_world_size(), device)
        writer = RowWriter(sys.stdout, configs[0].format, header, algo_column=False,
                           spread=options.per_iteration)
        _quietly(writer.start)
    for config in configs:
        bench_rank(config, options, device,
                   None if writer is None else functools.partial(_quietly, writer.write))
    if writer is None:
        return False
    _quietly(writer.finish)
    return writer.failed


def _quietly(write: Callable[..., None], *args: Any) -> None:
    """``write(*args)``; once the reader has gone (``... | head``), the rest of the output
    goes nowhere and the run goes on, as the other ranks need this one."""
    try:
        write(*args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _bench_header(config: BenchConfig, options: RunOptions, backend: str, world_size: int,
                  device: torch.device) -> list[str]:
    """What ``realcomm bench`` runs, for the table's ``#`` lines."""
    what = (f"torch's {NATIVE_NAMES[config.collective.kind]} (baseline for "
            f"{config.collective.name})" if options.baseline == "native"
            else config.collective.name)
    timing = ("elapsed time over the timed runs" if options.timing == "mean"
              else "the median run")
    header = [
        f"realcomm bench: {what} on {world_size} ranks, {backend} on {device.type}, "
        f"{options.iters} timed runs after {options.warmup_iters} warm-up runs, time: "
        f"{timing}, {AVERAGES[options.rank_average]} (-a {options.rank_average})",
        "data check: on" if config.check else "data check: off (-c 1 counts wrong elements)",
    ]
    if options.per_iteration:
        header.append(f"per run (-I): each run timed alone, {AVERAGES[options.rank_average]}"
                      + (", synchronised after each" if device.type == "cuda" else ""))
    if options.check_messages:
        header.append("message check: not used by the native baseline"
                      if options.baseline == "native"
                      else "message check: on (a header per message, included in the times)")
    if options.tuner_rows:
        header.append(f"tuner file: {len(options.tuner_rows)} rows choose each call (a call no "
                      "row covers runs the ring on one channel)")
    if config.params:
        header.append("params: " + " ".join(f"{k}={v}" for k, v in config.params)
                      + (" (not used by the native baseline)"
                         if options.baseline == "native" else ""))
    return header


def _options_from_args(args: argparse.Namespace) -> RunOptions:
    check_timeout("-T/--timeout", args.timeout)
    try:
        slice_bytes = parse_size(args.slice_bytes)
    except ValueError as error:
        raise ValueError(f"--slice-bytes: {error}") from None
    return RunOptions(args.warmup_iters, args.iters, args.baseline, args.timeout, slice_bytes,
                      args.timing, args.check_messages, args.average, args.per_iteration,
                      _tuner_rows(args))


def _tuner_rows(args: argparse.Namespace) -> tuple[TunerRow, ...]:
    """``--tuner-file``'s rows, read here so that a bad file fails before any process
    starts; () without the flag."""
    if args.tuner_file is None:
        return ()
    if args.baseline != "none":
        raise ValueError("--tuner-file chooses how this project's collectives run; "
                         "--baseline native times torch's own instead")
    return tuple(tuner_rows_for(args.algorithm, args.tuner_file))


def _add_timing_argument(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--timing", default="mean", choices=TIMINGS,
                        help="mean: elapsed time over the timed runs, as nccl-tests; median: "
                             "the median run, which a few late runs do not move (default "
                             "mean)")


def _device_from_args(args: argparse.Namespace, default: torch.device) -> torch.device:
    device = default if args.device is None else torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device")
    if args.backend == "nccl" and device.type != "cuda":
        raise ValueError("--backend nccl needs CUDA tensors: give --device cuda")
    return device


def _on_every_rank(args: argparse.Namespace, fn: Callable[..., Any], fn_args: tuple[Any, ...],
                   *, minimum: int, timeout: float, reason: str = "",
                   check_world: Callable[[int], None] | None = None, **fn_kwargs: Any
                   ) -> tuple[Any, int, torch.device] | None:
    """Run ``fn(*fn_args, device, **fn_kwargs)`` on every rank: in ``--nprocs`` spawned
    processes, or in this one under torchrun. Rank 0's result, the world size and the
    device; None on the other ranks under torchrun."""
    if args.nprocs is not None:
        if args.nprocs < minimum:
            raise ValueError(f"--nprocs must be >= {minimum}{reason}, got {args.nprocs}")
        if args.nprocs > MAX_NPROCS:
            raise ValueError(f"--nprocs must be at most {MAX_NPROCS} (each is a Python "
                             f"interpreter with torch on this machine; run more under "
                             f"torchrun on several), got {args.nprocs}")
        if in_launcher_env():
            raise ValueError("--nprocs spawns processes itself: do not give it under torchrun")
        if check_world is not None:
            check_world(args.nprocs)
        device = _device_from_args(args, torch.device("cpu"))
        result = spawn(functools.partial(fn, **fn_kwargs), args.nprocs, (*fn_args, device),
                       device=device, backend=args.backend, timeout=timeout)[0]
        return result, args.nprocs, device
    if not in_launcher_env():
        raise ValueError("no torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, "
                         "MASTER_PORT): start under torchrun, or give --nprocs N")
    load_kernels_eagerly_for_nccl(args.device, args.backend)  # before CUDA is first asked
    device = init_from_env(_device_from_args(args, default_device()), args.backend, timeout)
    try:
        result = fn(*fn_args, device, **fn_kwargs)
        world_size, rank = dist.get_world_size(), dist.get_rank()
        dist.barrier()  # no rank tears its group down while a peer still uses it
    finally:
        dist.destroy_process_group()
    return (result, world_size, device) if rank == 0 else None


# -- calibrate --------------------------------------------------------------------------

def _add_calibrate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate", help="measure this machine for simcomm fit",
        description="Measure point-to-point exchanges, one-way messages, concurrent sends "
                    "and local reductions through the realcomm driver, print them and write "
                    "them to a measurements file (JSON), from which simcomm fit makes a "
                    "topology file. Start it under torchrun, or give --nprocs.")
    parser.add_argument("--nprocs", type=int, metavar="N",
                        help=f"spawn N local processes (not under torchrun); at least 2, at "
                             f"most {MAX_NPROCS}: each is a Python interpreter with torch "
                             "loaded")
    parser.add_argument("--out", required=True, metavar="FILE.json", type=output_file,
                        help="where to write the measurements")
    parser.add_argument("--sizes", metavar="LIST",
                        help="message sizes, multiples of 4 bytes (default 16B to 64MiB, x4)")
    parser.add_argument("-n", "--iters", type=int, default=20, metavar="N",
                        help="timed runs per size, back to back as realcomm bench times them "
                             "(default 20)")
    _add_timing_argument(parser)
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="measure every size R times, in turns, and keep the median of "
                             "each: a slow spell of a busy machine then spoils one round, not "
                             "the calibration (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="default: cpu with --nprocs, else cuda if there is one")
    parser.add_argument("--backend", choices=("gloo", "nccl"),
                        help="default: nccl for cuda, gloo for cpu")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"give up on a silent peer after this long, {MIN_TIMEOUT:g} to "
                             f"{MAX_TIMEOUT:g} (default {DEFAULT_TIMEOUT:g})")
    parser.set_defaults(run=calibrate)


def calibrate(args: argparse.Namespace) -> int:
    """``realcomm calibrate``: measure, print, write the measurements file."""
    sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    if args.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {args.iters}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    check_timeout("--timeout", args.timeout)
    check_sizes(sizes)  # here, not after the processes have started
    ran = _on_every_rank(args, measure, (tuple(sizes), args.iters, WARMUP_ITERS),
                         minimum=2, reason=" to measure links", timeout=args.timeout,
                         timing=args.timing, rounds=args.rounds)
    if ran is not None:
        _report_measurements(ran[0], args.out)
    return 0


def _report_measurements(result: Measurements, path: str) -> None:
    print(result.format())
    try:
        Path(path).write_text(result.to_json(), encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot write {path}: {error}") from None
    print(f"wrote {path} (fit with: simcomm fit {path} --out topology.toml)")
