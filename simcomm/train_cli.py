"""``simcomm ddp`` and ``simcomm fsdp``: simulate a training step of a model on a topology.

    simcomm ddp --model bert-base --topology dgx-a100
    simcomm ddp --model resnet50 --topology cluster-h100:nodes=2 --compare
    simcomm ddp --model gpt2-small --topology dgx-a100 --sweep-buckets 1MiB,5MiB,25MiB,100MiB
    simcomm fsdp --model llama-7b --topology cluster-h100:nodes=2 --compare

``ddp`` prints the step report of ``simcomm.training`` (step time, compute, exposed
communication, overlap, per-bucket timings); ``--compare`` adds DDP without overlap and
DataParallel; ``--sweep-buckets`` runs one step per bucket cap and prints a table (and
``--plot`` draws it). ``fsdp`` prints the FSDP report (step, exposed communication, bytes
sent, peak memory); ``--compare`` runs FSDP's prefetch and resharding options side by side
with DDP, and ``--memory-plot`` draws memory over the step.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from algorithms.collectives import all_gather
from algorithms.ddp import DEFAULT_BUCKET_CAP, FIRST_BUCKET_CAP
from algorithms.fsdp import BACKWARD_POST, BACKWARD_PRE
from algorithms.harness.bench import params_from_items
from algorithms.harness.catalog import COLLECTIVES
from algorithms.harness.cli import output_file
from algorithms.harness.model_presets import DEFAULT_THROUGHPUT, PRESET_MODELS, preset_model
from algorithms.models import Model
from simcomm.bench import message_progress
from simcomm.collective_level import describe_level, expected_messages
from simcomm.critical_path import critical_path
from simcomm.executors import default_jobs
from simcomm.kineto_trace import write_kineto_traces
from simcomm.results import SimResult
from simcomm.topology import Topology
from simcomm.training import (
    FSDPReport, StepReport, bucket_sweep, model_buckets, no_sharding_memory, sent_bytes,
    simulate_ddp, simulate_dp, simulate_fsdp,
)
from simcomm.units import format_bytes, parse_bytes, parse_flops
from simcomm.variation import Distribution, Samples, Variation, sample_times

ALLREDUCES = [name for name, c in COLLECTIVES.items() if c.kind == "allreduce"]
# Seeded samples a command runs at most (a typo of a hundred million would run for days and
# hold every sample's time in memory).
MAX_SAMPLES = 1_000_000


def add_ddp_parser(commands: argparse._SubParsersAction,
                   add_topology_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``simcomm ddp`` to the subcommands."""
    parser = commands.add_parser(
        "ddp", help="simulate a DDP training step of a model",
        description="Simulate one data-parallel training step of a preset model: forward, "
                    "backward, and the gradient all-reduce in buckets overlapped with "
                    "backward, as PyTorch DDP does. Prints step time, compute, exposed "
                    "communication, overlap and per-bucket timings.")
    _add_model_arguments(parser)
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
    parser.add_argument("--plot", metavar="FILE.png", type=output_file,
                        help="with --sweep-buckets: draw step and exposed time against the cap")
    parser.add_argument("--trace", metavar="FILE.json", type=output_file,
                        help="write the DDP step as a Chrome trace-event file (Perfetto)")
    _add_kineto_argument(parser)
    _add_critical_path_argument(parser)
    add_variation_arguments(parser, training=True)
    add_topology_arguments(parser)


def add_variation_arguments(parser: argparse.ArgumentParser, training: bool) -> None:
    """The flags of random variation and seeded samples (``--compute-noise`` only where
    there is computation: ``training``)."""
    spread = parser.add_argument_group(
        "random variation", "messages leave late and cross slower"
        + (", computations take longer or shorter" if training else "")
        + ", by seeded draws from these (message level)")
    if training:
        spread.add_argument("--compute-noise", metavar="DIST",
                            help="factor on every computation, e.g. lognormal:1,0.05 (median "
                                 "1, sigma 0.05), normal:1,0.03, uniform:0.95,1.1, "
                                 "empirical:FILE")
    spread.add_argument("--message-delay", metavar="DIST",
                        help="seconds every message leaves late, e.g. normal:2us,1us, "
                             "lognormal:20us,1.5 or empirical:FILE (one time a line)")
    spread.add_argument("--message-slowdown", metavar="DIST",
                        help="factor on every message's time on its links, e.g. "
                             "lognormal:1,0.1 (throughput noise)")
    spread.add_argument("--seed", type=int, default=0, help="of the first draw (default 0)")
    spread.add_argument("--samples", type=int, metavar="N",
                        help="run N seeds (in parallel) and print the median, p90 and p99 "
                             + ("step time" if training else "time of each size, in columns"))
    spread.add_argument("--histogram", metavar="FILE.png", type=output_file,
                        help="with --samples: draw their histogram (needs matplotlib)")
    spread.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                        help="with --samples: run them on this dask.distributed scheduler's "
                             "cluster (default: local processes)")


def variation_from_args(args: argparse.Namespace) -> Variation | None:
    """The ``Variation`` the flags of ``add_variation_arguments`` ask for, or None."""
    if args.samples is not None and not 1 <= args.samples <= MAX_SAMPLES:
        raise ValueError(f"--samples must be from 1 to {MAX_SAMPLES:,}, got {args.samples}")
    if args.seed < 0:  # numpy's generators take none
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    for flag, value in (("--histogram", args.histogram), ("--scheduler", args.scheduler)):
        if value is not None and args.samples is None:
            raise ValueError(f"{flag} goes with --samples N")
    compute = None
    if getattr(args, "compute_noise", None):
        compute = _distribution("--compute-noise", args.compute_noise, seconds=False)
    delay = slowdown = None
    if args.message_delay:
        delay = _distribution("--message-delay", args.message_delay, seconds=True)
    if args.message_slowdown:
        slowdown = _distribution("--message-slowdown", args.message_slowdown, seconds=False)
    if compute is None and delay is None and slowdown is None:
        if args.samples is not None:
            given = "--compute-noise, " if hasattr(args, "compute_noise") else ""
            raise ValueError(f"--samples draws from {given}--message-delay or "
                             "--message-slowdown: give one of them")
        return None
    return Variation(args.seed, delay, compute, slowdown)


def run_samples(args: argparse.Namespace, run: Callable[[int], float]) -> Samples:
    """``args.samples`` seeded runs of ``run(seed)`` from ``args.seed``, where ``--scheduler``
    says, with a progress bar on a terminal."""
    with tqdm(total=args.samples, desc="samples", unit="run", file=sys.stderr,
              disable=not sys.stderr.isatty()) as bar:
        return sample_times(run, args.samples, args.seed, default_jobs(),
                            lambda: bar.update(1), args.scheduler)


def save_histogram(args: argparse.Namespace, samples: dict[str, Samples], title: str) -> None:
    """``--histogram``'s PNG of ``samples`` (one panel each), if asked for."""
    if args.histogram is None:
        return
    from simcomm.plots import samples_figure, save_png  # needs matplotlib

    save_png(samples_figure({label: s.times for label, s in samples.items()}, title),
             args.histogram)
    print(f"# wrote {args.histogram}", file=sys.stderr)


def _times(messages: int | None, calls: int) -> int | None:
    return None if messages is None else messages * calls


def _distribution(flag: str, text: str, seconds: bool) -> Distribution:
    # Without seconds it is a factor, which may not be 0.
    try:
        distribution = Distribution.parse(text, seconds)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
    if not seconds:
        distribution.check_factor(flag)
    return distribution


def _sample_steps(args: argparse.Namespace, what: str, model: Model, topology: Topology,
                  run: Callable[[int], float]) -> None:
    """``--samples`` of a ``what`` (DDP, FSDP) step: their statistics, and the histogram."""
    samples = run_samples(args, run)
    print(f"# {samples.format()}, seeds {args.seed} to {args.seed + args.samples - 1}")
    save_histogram(args, {f"{model.name}, {what} step": samples},
                   f"{args.samples} seeded {what} steps, {model.name} on {topology.name}")


def _ddp_step_time(seed: int, model: Model, topology: Topology, bucket_cap: int, overlap: bool,
                   variation: Variation, options: dict[str, Any]) -> float:
    """One sample of ``simcomm ddp --samples``: the step time with ``variation``'s draws
    from ``seed`` (module level, so that worker processes can run it)."""
    return simulate_ddp(model, topology, bucket_cap=bucket_cap, overlap=overlap,
                        variation=replace(variation, seed=seed), **options).step


def _fsdp_step_time(seed: int, model: Model, topology: Topology, variation: Variation,
                    options: dict[str, Any]) -> float:
    """One sample of ``simcomm fsdp --samples`` (see ``_ddp_step_time``)."""
    return simulate_fsdp(model, topology, variation=replace(variation, seed=seed),
                         **options).step


def _add_critical_path_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--critical-path", action="store_true",
                        help="after the report, the step's critical path: its compute by "
                             "rank and its messages by link (message level), and, where "
                             "ranks compute at different speeds, what that costs the step")


def _print_critical_path(result: SimResult, topology: Topology,
                         step_on: Callable[[Topology], float]) -> None:
    """``--critical-path``: the path of ``result``; where speeds differ, the step again
    (``step_on``) with every rank at the fastest one's speed, and the difference."""
    if result.level != "message":
        print("critical path: not at the collective level, which has no messages to "
              "follow (--level message)")
    else:
        print(critical_path(result).format())
    speeds = [topology.speed_of(r) for r in range(topology.size)]
    if len(set(speeds)) > 1:
        fastest = max(speeds)
        even = step_on(replace(topology, compute_speed=(fastest,) * topology.size))
        slow = [r for r, speed in enumerate(speeds) if speed < fastest]
        named = ", ".join(map(str, slow[:8])) + (f" and {len(slow) - 8} more"
                                                  if len(slow) > 8 else "")
        print(f"  slower ranks ({named}) delay the step by {(result.time - even) * 1e3:.3f} ms: "
              f"{even * 1e3:.3f} ms with every rank at speed {fastest:g}")


def output_folder(text: str) -> str:
    """An argparse ``type`` for a folder the command writes files into, made if missing: as
    ``output_file``, refused when the command line is read (not after a long run) if it is
    a file, the folder to make it in does not exist, or it cannot be written (or is "")."""
    if not text:  # Path("") is the working folder
        raise argparse.ArgumentTypeError("an empty path names no folder")
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder: name a new "
                                         "folder or one to write into")
    parent = folder.parent
    if not (folder.exists() or parent.is_dir()):
        raise argparse.ArgumentTypeError(
            f"{parent} is not a folder" if parent.exists() else f"folder {parent} does not exist")
    if not os.access(folder if folder.exists() else parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be written")
    return text


def _add_kineto_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kineto", metavar="DIR", type=output_folder,
                        help="write the step as one torch-profiler-shaped trace per rank "
                             "(DIR/rank_N.json), for Holistic Trace Analysis; DIR is made "
                             "if missing, in a folder that exists")


def _write_kineto(folder: str | None, result: SimResult) -> None:
    if folder:
        paths = write_kineto_traces(result, folder)
        print(f"# wrote {len(paths)} trace{'s' * (len(paths) > 1)} to {folder}",
              file=sys.stderr)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="NAME",
                        help=f"one of {', '.join(PRESET_MODELS)}")
    parser.add_argument("--batch", type=int, metavar="N",
                        help="samples per rank (default: the preset's, "
                             + ", ".join(f"{n} {b}" for n, (_, b, _) in PRESET_MODELS.items())
                             + ")")
    parser.add_argument("--throughput", default=f"{DEFAULT_THROUGHPUT / 1e12:g}TFLOPS",
                        metavar="RATE", help="achieved compute per GPU, with its unit "
                                             "(GFLOPS, TFLOPS, ...; default "
                                             f"{DEFAULT_THROUGHPUT / 1e12:g}TFLOPS)")
    parser.add_argument("--grad-bytes", type=int, default=4, choices=(2, 4, 8),
                        help="bytes per parameter and gradient element (default 4, float32)")


def _model_from_args(args: argparse.Namespace) -> Model:
    model = preset_model(args.model, args.batch, parse_flops(args.throughput), args.grad_bytes)
    print(f"# {model.name}: {model.param_count:,} parameters "
          f"({model.param_bytes / 2**20:.1f} MiB of gradients), {len(model.layers)} layers; "
          f"forward {model.forward_seconds * 1e3:.3f} ms, backward "
          f"{model.backward_seconds * 1e3:.3f} ms per step at {args.throughput}")
    return model


def run_ddp(args: argparse.Namespace, topology: Topology) -> int:
    """Run ``simcomm ddp`` on ``topology``; print the report(s)."""
    if args.allreduce not in ALLREDUCES:
        raise ValueError(f"--allreduce {args.allreduce!r}: choose one of {', '.join(ALLREDUCES)}")
    collective = COLLECTIVES[args.allreduce]
    options = {"first_bucket_cap": parse_bytes(args.first_bucket_cap),
               "allreduce": collective.function, "level": args.level,
               **params_from_items(collective, args.param)}
    caps = None if args.sweep_buckets is None else _bucket_caps(args.sweep_buckets)
    if args.plot and caps is None:
        raise ValueError("--plot draws the bucket sweep: give --sweep-buckets too")
    variation = variation_from_args(args)
    model = _model_from_args(args)
    cap = parse_bytes(args.bucket_cap)
    calls = len(model_buckets(model, cap, options["first_bucket_cap"]))
    with message_progress(_times(expected_messages(collective.function, topology.size),
                                 calls)) as bar:
        report = simulate_ddp(model, topology, bucket_cap=cap, overlap=not args.no_overlap,
                              trace=args.trace, variation=variation, progress=bar.update,
                              **options)
    print(f"# {describe_level(args.level, report.result.level)}")
    print(report.format())
    _write_kineto(args.kineto, report.result)
    if args.critical_path:
        _print_critical_path(report.result, topology, lambda even: simulate_ddp(
            model, even, bucket_cap=cap, overlap=not args.no_overlap, variation=variation,
            **options).step)
    if args.samples is not None:
        _sample_steps(args, "DDP", model, topology, partial(
            _ddp_step_time, model=model, topology=topology, bucket_cap=cap,
            overlap=not args.no_overlap, variation=variation or Variation(0), options=options))
    if args.compare:
        others = [simulate_ddp(model, topology, bucket_cap=parse_bytes(args.bucket_cap),
                               overlap=args.no_overlap, **options),
                  simulate_dp(model, topology)]
        print()
        print(format_comparison([report, *others]))
    if caps is not None:
        sweep = bucket_sweep(model, topology, caps, overlap=not args.no_overlap, **options)
        print()
        print(format_sweep(sweep))
        if args.plot:
            from simcomm.plots import bucket_sweep_figure, save_png  # needs matplotlib

            save_png(bucket_sweep_figure(sweep, f"{model.name} on {topology.name}"), args.plot)
            print(f"# wrote {args.plot}", file=sys.stderr)
    return 0


def _bucket_caps(text: str) -> list[int]:
    """``--sweep-buckets``' caps, as ``--sizes`` reads its sizes (``1MiB,25MiB``)."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError(f"--sweep-buckets {text!r} names no bucket cap")
    caps = []
    for number, item in enumerate(items, 1):
        if not item:
            raise ValueError(f"--sweep-buckets {text!r}: item {number} is empty")
        try:
            caps.append(parse_bytes(item))
        except ValueError as error:
            raise ValueError(f"--sweep-buckets: {error}") from None
        if caps[-1] < 1:  # refused here, not after the step has been simulated
            raise ValueError(f"--sweep-buckets: a bucket cap must be >= 1 byte, got {item!r}")
    return caps


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


def add_fsdp_parser(commands: argparse._SubParsersAction,
                    add_topology_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``simcomm fsdp`` to the subcommands."""
    parser = commands.add_parser(
        "fsdp", help="simulate an FSDP training step of a model",
        description="Simulate one FSDP training step of a preset model, one unit per layer: "
                    "all-gather each unit before its forward and backward, reduce-scatter "
                    "its gradients after. Prints step time, exposed communication, bytes "
                    "sent and peak memory (parameters and gradients).")
    _add_model_arguments(parser)
    parser.add_argument("--forward-prefetch", action="store_true",
                        help="all-gather the next unit before the current forward")
    parser.add_argument("--backward-prefetch", default=BACKWARD_PRE,
                        choices=(BACKWARD_PRE, BACKWARD_POST, "none"),
                        help="all-gather the next unit before (pre, the default) or after "
                             "(post) the current backward, or only when needed (none)")
    parser.add_argument("--limit-all-gathers", type=int, default=2, metavar="N",
                        help="all-gathers issued ahead of compute at most (default 2)")
    parser.add_argument("--no-reshard-after-forward", action="store_true",
                        help="keep the gathered parameters from forward to backward")
    parser.add_argument("--compare", action="store_true",
                        help="run the prefetch and resharding options and DDP side by side")
    parser.add_argument("--memory-plot", metavar="FILE.png", type=output_file,
                        help="draw each rank's memory over the step")
    parser.add_argument("--trace", metavar="FILE.json", type=output_file,
                        help="write the step as a Chrome trace-event file (Perfetto)")
    _add_kineto_argument(parser)
    _add_critical_path_argument(parser)
    add_variation_arguments(parser, training=True)
    add_topology_arguments(parser)


def run_fsdp(args: argparse.Namespace, topology: Topology) -> int:
    """Run ``simcomm fsdp`` on ``topology``; print the report(s)."""
    model = _model_from_args(args)
    options = {"forward_prefetch": args.forward_prefetch,
               "backward_prefetch": None if args.backward_prefetch == "none"
               else args.backward_prefetch,
               "limit_all_gathers": args.limit_all_gathers,
               "reshard_after_forward": not args.no_reshard_after_forward,
               "level": args.level}
    variation = variation_from_args(args)
    calls = 3 * len(model.layers)  # an all-gather for forward and backward, a reduce-scatter
    with message_progress(_times(expected_messages(all_gather, topology.size), calls)) as bar:
        report = simulate_fsdp(model, topology, trace=args.trace, progress=bar.update,
                               variation=variation, **options)
    print(f"# {describe_level(args.level, report.result.level)}")
    print(report.format())
    _write_kineto(args.kineto, report.result)
    print(f"  (without sharding: {no_sharding_memory(model) / 2**20:.1f} MiB)")
    if args.critical_path:
        _print_critical_path(report.result, topology, lambda even: simulate_fsdp(
            model, even, variation=variation, **options).step)
    if args.samples is not None:
        _sample_steps(args, "FSDP", model, topology, partial(
            _fsdp_step_time, model=model, topology=topology,
            variation=variation or Variation(0), options=options))
    if args.compare:
        variants = {
            "fsdp": {},
            "fsdp, forward prefetch": {"forward_prefetch": True},
            "fsdp, backward post": {"backward_prefetch": BACKWARD_POST},
            "fsdp, no prefetch": {"backward_prefetch": None},
            "fsdp, no reshard": {"reshard_after_forward": False},
        }
        reports = {name: simulate_fsdp(model, topology, level=args.level, **kwargs)
                   for name, kwargs in variants.items()}
        print()
        print(format_fsdp_comparison(reports, simulate_ddp(model, topology, level=args.level),
                                     model))
    if args.memory_plot:
        from simcomm.plots import memory_figure, save_png  # needs matplotlib

        save_png(memory_figure(report, f"FSDP {model.name} on {topology.name}"),
                 args.memory_plot)
        print(f"# wrote {args.memory_plot}", file=sys.stderr)
    return 0


def format_fsdp_comparison(reports: dict[str, FSDPReport], ddp: StepReport, model: Model
                           ) -> str:
    """FSDP variants and DDP: step, exposed communication, bytes sent and peak memory."""
    ddp_sent = sent_bytes(ddp.result, 0)
    lines = [f"{'schedule':<24} {'step (ms)':>10} {'exposed':>10} {'sent (MiB)':>11} "
             f"{'vs DDP':>7} {'peak (MiB)':>11}"]
    rows = [(name, r.step, r.exposed, r.sent_bytes, r.peak_memory) for name, r in reports.items()]
    rows.append(("ddp (no sharding)", ddp.step, ddp.exposed, ddp_sent, no_sharding_memory(model)))
    for name, step, exposed, sent, peak in rows:
        ratio = f"{sent / ddp_sent:.2f}x" if ddp_sent else "-"
        lines.append(f"{name:<24} {step * 1e3:>10.3f} {exposed * 1e3:>10.3f} "
                     f"{sent / 2**20:>11.1f} {ratio:>7} {peak / 2**20:>11.1f}")
    return "\n".join(lines)
