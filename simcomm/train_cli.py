"""``simcomm ddp``: simulate a data-parallel training step of a model on a topology.

    simcomm ddp --model bert-base --topology dgx-a100
    simcomm ddp --model resnet50 --topology cluster-h100:nodes=2 --compare
    simcomm ddp --model gpt2-small --topology dgx-a100 --sweep-buckets 1MiB,5MiB,25MiB,100MiB

It prints the step report of ``simcomm.training`` (step time, compute, exposed
communication, overlap, per-bucket timings); ``--compare`` adds DDP without overlap and
DataParallel; ``--sweep-buckets`` runs one step per bucket cap and prints a table (and
``--plot`` draws it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from algorithms.bench import params_from_items
from algorithms.catalog import COLLECTIVES
from algorithms.ddp import DEFAULT_BUCKET_CAP, FIRST_BUCKET_CAP
from algorithms.models import DEFAULT_THROUGHPUT, PRESET_MODELS, preset_model
from simcomm.topology import Topology
from simcomm.training import StepReport, bucket_sweep, simulate_ddp, simulate_dp
from simcomm.units import format_bytes, parse_bytes, parse_flops

ALLREDUCES = [name for name, c in COLLECTIVES.items() if c.kind == "allreduce"]


def add_ddp_parser(commands: argparse._SubParsersAction,
                   add_topology_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``simcomm ddp`` to the subcommands."""
    parser = commands.add_parser(
        "ddp", help="simulate a DDP training step of a model",
        description="Simulate one data-parallel training step of a preset model: forward, "
                    "backward, and the gradient all-reduce in buckets overlapped with "
                    "backward, as PyTorch DDP does. Prints step time, compute, exposed "
                    "communication, overlap and per-bucket timings.")
    parser.add_argument("--model", required=True, metavar="NAME",
                        help=f"one of {', '.join(PRESET_MODELS)}")
    parser.add_argument("--batch", type=int, metavar="N",
                        help="samples per rank (default: the preset's, "
                             + ", ".join(f"{n} {b}" for n, (_, b, _) in PRESET_MODELS.items())
                             + ")")
    parser.add_argument("--throughput", default=f"{DEFAULT_THROUGHPUT / 1e12:g}TFLOPS",
                        metavar="RATE", help="achieved compute per GPU (default "
                                             f"{DEFAULT_THROUGHPUT / 1e12:g}TFLOPS)")
    parser.add_argument("--grad-bytes", type=int, default=4, choices=(2, 4, 8),
                        help="bytes per gradient element (default 4, float32)")
    parser.add_argument("--bucket-cap", default=format_bytes(DEFAULT_BUCKET_CAP),
                        metavar="SIZE", help="bucket cap (default 25MiB, as bucket_cap_mb)")
    parser.add_argument("--first-bucket-cap", default=format_bytes(FIRST_BUCKET_CAP),
                        metavar="SIZE", help="cap of the first bucket (default 1MiB)")
    parser.add_argument("--allreduce", default="ring_allreduce", metavar="NAME",
                        help=f"the all-reduce per bucket: {', '.join(ALLREDUCES)}")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the all-reduce, e.g. tree=true")
    parser.add_argument("--no-overlap", action="store_true",
                        help="all-reduce the buckets one by one after backward instead")
    parser.add_argument("--compare", action="store_true",
                        help="also simulate DDP without overlap and DataParallel (master "
                             "GPU rank 0), and print the three side by side")
    parser.add_argument("--sweep-buckets", metavar="LIST",
                        help="bucket caps to sweep, e.g. 1MiB,5MiB,25MiB,100MiB; prints a "
                             "table of step times")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="with --sweep-buckets: draw step and exposed time against the cap")
    parser.add_argument("--trace", metavar="FILE.json",
                        help="write the DDP step as a Chrome trace-event file (Perfetto)")
    add_topology_arguments(parser)


def run_ddp(args: argparse.Namespace, topology: Topology) -> int:
    """Run ``simcomm ddp`` on ``topology``; print the report(s)."""
    model = preset_model(args.model, args.batch, parse_flops(args.throughput), args.grad_bytes)
    if args.allreduce not in ALLREDUCES:
        raise ValueError(f"--allreduce {args.allreduce!r}: choose one of {', '.join(ALLREDUCES)}")
    collective = COLLECTIVES[args.allreduce]
    options = {"first_bucket_cap": parse_bytes(args.first_bucket_cap),
               "allreduce": collective.function,
               **params_from_items(collective, args.param)}
    if args.plot and not args.sweep_buckets:
        raise ValueError("--plot draws the bucket sweep: give --sweep-buckets too")
    print(f"# {model.name}: {model.param_count:,} parameters "
          f"({model.param_bytes / 2**20:.1f} MiB of gradients), {len(model.layers)} layers; "
          f"forward {model.forward_seconds * 1e3:.3f} ms, backward "
          f"{model.backward_seconds * 1e3:.3f} ms per step at {args.throughput}")
    report = simulate_ddp(model, topology, bucket_cap=parse_bytes(args.bucket_cap),
                          overlap=not args.no_overlap, trace=args.trace, **options)
    print(report.format())
    if args.compare:
        others = [simulate_ddp(model, topology, bucket_cap=parse_bytes(args.bucket_cap),
                               overlap=args.no_overlap, **options),
                  simulate_dp(model, topology)]
        print()
        print(format_comparison([report, *others]))
    if args.sweep_buckets:
        caps = [parse_bytes(text) for text in args.sweep_buckets.split(",") if text.strip()]
        sweep = bucket_sweep(model, topology, caps, overlap=not args.no_overlap, **options)
        print()
        print(format_sweep(sweep))
        if args.plot:
            from simcomm.plots import bucket_sweep_figure, save_png  # needs matplotlib

            save_png(bucket_sweep_figure(sweep, f"{model.name} on {topology.name}"), args.plot)
            print(f"# wrote {args.plot}", file=sys.stderr)
    return 0


def format_comparison(reports: list[StepReport]) -> str:
    """Schedules side by side: step, compute, exposed comm and the speed-up over the slowest."""
    slowest = max(r.step for r in reports)
    lines = [f"{'schedule':<16} {'step (ms)':>10} {'compute':>10} {'exposed':>10} "
             f"{'overlap':>8} {'speed-up':>9}"]
    for r in reports:
        lines.append(f"{r.schedule:<16} {r.step * 1e3:>10.3f} {r.compute * 1e3:>10.3f} "
                     f"{r.exposed * 1e3:>10.3f} {r.overlap:>8.1%} {slowest / r.step:>8.2f}x")
    return "\n".join(lines)


def format_sweep(reports: list[StepReport]) -> str:
    """One row per bucket cap; the fastest marked."""
    best = min(reports, key=lambda r: r.step)
    lines = [f"{'bucket cap':>10} {'buckets':>8} {'step (ms)':>10} {'exposed':>10} "
             f"{'overlap':>8}  vs best"]
    for r in reports:
        mark = "  <- fastest" if r is best else ""
        lines.append(f"{format_bytes(r.bucket_cap or 0):>10} {len(r.buckets):>8} "
                     f"{r.step * 1e3:>10.3f} {r.exposed * 1e3:>10.3f} {r.overlap:>8.1%} "
                     f" {r.step / best.step:.2f}x{mark}")
    return "\n".join(lines)
