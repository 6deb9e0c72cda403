"""The ``simcomm`` command line.

* ``simcomm bench`` simulates one collective over a range of sizes and prints nccl-tests'
  columns (see ``algorithms.harness.bench``), on a builder topology or on a preset or
  file (``simcomm.bench`` runs it)::

      simcomm bench --algorithm ring_allreduce --ranks 8 --topology ring \\
          --bandwidth 100GB/s --latency 5us --sizes 1KiB,1MiB,1GiB --format csv
      simcomm bench --algorithm ring_allreduce --topology dgx-a100 -b 1M -e 1G --summary

* ``simcomm topo list`` lists the presets; ``simcomm topo show NAME|FILE`` describes one.
* ``simcomm sweep`` simulates a grid of algorithms, sizes, topologies, ranks, bandwidths and
  latencies in parallel (``simcomm.sweep``) and writes a CSV (``simcomm.sweep_csv``), plots
  (``simcomm.plots``) and a crossover table (``simcomm.crossover``).
* ``simcomm plot`` draws the plots and the crossover table again from CSVs, with measured
  results (``realcomm bench --format csv``) beside the simulated ones.
* ``simcomm validate`` puts simulated and measured times side by side (``simcomm.validate``).
* ``simcomm fit`` fits the cost model to the measurements that ``realcomm calibrate`` wrote
  and writes a topology file (``simcomm.calibration``); ``simcomm fit-spread`` fits the
  random variation of messages to the spread of measured runs (``simcomm.spread_fit``).
* ``simcomm tune`` writes the simulator's choice of algorithm, protocol and channels per
  size range as a tuner file for NCCL's example tuner plugin
  (``algorithms.harness.tuner_file``, ``simcomm.tuning``).

Each subcommand lives in its own pair of functions (one adds its parser, one runs it). Bad
arguments, simulator errors and a ``--check`` too large for memory print one line,
``simcomm: error: ...``, on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from tqdm import tqdm

from algorithms.harness.bench import (
    AVERAGES, BenchConfig, RowWriter, parse_size, parse_sizes, size_range,
)
from algorithms.harness.cli import (
    NCCL_TESTS_REFUSED, Parser, Refused, UsageError, add_bench_arguments, configs_from_args,
    output_file, run_command,
)
from algorithms.harness.catalog import KINDS
from algorithms.harness.tuner_file import (
    TableTuner, format_tuner_file, rows_for, tuner_rows_for,
)
from algorithms.protocol import AlgorithmError
from simcomm.bench import (
    HOST_SECONDS_PER_CHANNEL, HOST_SECONDS_PER_GPU, HOST_SECONDS_PER_ITERATION, SLOWEST_RANK,
    algorithm_config, bench_level, bench_rows, bench_size, host_floor_seconds, is_builder,
    load_named_topology, message_progress, parse_latency, sample_seconds, sampled_row,
    traced_messages, traced_run,
)
from simcomm.collective_level import (
    AUTO_MESSAGE_LIMIT, LEVELS, describe_level, expected_messages,
)
from simcomm.calibration import load_calibration
from simcomm.cluster_fit import fit_cluster, format_cluster_fit
from simcomm.crossover import crossovers, format_crossovers
from simcomm.engine import DEFAULT_MAX_OPS
from simcomm.executors import default_jobs
from simcomm.files import replacing
from simcomm.presets import describe, list_presets
from simcomm.results import SimResult
from simcomm.spread_fit import MAX_SAMPLES as MAX_SPREAD_SAMPLES
from simcomm.spread_fit import MAX_TRIALS as MAX_SPREAD_TRIALS
from simcomm.spread_fit import SAMPLES as SPREAD_SAMPLES
from simcomm.spread_fit import fit_spread, read_runs
from simcomm.summary import format_summary
from simcomm.sweep import (
    DEFAULT_ALGORITHMS, DEFAULT_BANDWIDTHS, DEFAULT_LATENCIES, DEFAULT_RANKS, DEFAULT_SIZES,
    DEFAULT_TOPOLOGIES, Grid, point_key, row_key, run_sweep, split_list,
)
from simcomm.sweep_csv import Series, SweepRow, read_bench_csv, read_csv, write_csv
from simcomm.topofile import dump_topology
from simcomm.topology import TOPOLOGIES, Topology, make_topology
from simcomm.tuning import CANDIDATES, ModelTuner
from simcomm.train_cli import (
    add_ddp_parser, add_fsdp_parser, add_variation_arguments, output_folder, run_ddp, run_fsdp,
    run_samples, save_histogram, variation_from_args,
)
from simcomm.units import parse_bandwidth
from simcomm.variation import Variation
from simcomm.validate import compare, format_validation, validation_series

def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``simcomm`` command line on ``argv`` (default ``sys.argv[1:]``); return the
    exit status."""
    def command() -> int:
        args = build_parser().parse_args(argv)
        return args.run(args)
    return run_command("simcomm", command, (ValueError, AlgorithmError, MemoryError, OSError))


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = Parser(prog="simcomm", description="Simulate collective communication.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bench_parser(commands)
    _add_topo_parser(commands)
    _add_sweep_parser(commands)
    _add_plot_parser(commands)
    add_ddp_parser(commands, _add_topology_arguments)
    commands.choices["ddp"].set_defaults(run=ddp)
    add_fsdp_parser(commands, _add_topology_arguments)
    commands.choices["fsdp"].set_defaults(run=fsdp)
    for name in ("sweep", "ddp", "fsdp"):
        _add_level_argument(commands.choices[name])
    _add_validate_parser(commands)
    _add_fit_parser(commands)
    _add_fit_spread_parser(commands)
    _add_tune_parser(commands)
    return parser


# -- bench ------------------------------------------------------------------------------

def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench", help="time a collective over sizes, in nccl-tests' columns",
        description="Simulate a collective at each size and print nccl-tests' columns. "
                    "Buffers are size-only (nothing is allocated) unless --check asks for "
                    "real data.")
    add_bench_arguments(parser, _SIMCOMM_REFUSED)
    _add_iteration_arguments(parser)
    parser.add_argument("--summary", action="store_true",
                        help="after the rows, summarise the run of the largest size: busiest "
                             "links and each rank's busy and idle time (on stderr with "
                             "--format csv or json)")
    parser.add_argument("--trace", metavar="FILE.json", type=output_file,
                        help="write the run of the largest size as a Chrome trace-event file "
                             "(open it in ui.perfetto.dev or chrome://tracing)")
    parser.add_argument("--timeline", metavar="FILE.png", type=output_file,
                        help="draw the run of the largest size as a timeline PNG (needs "
                             "matplotlib)")
    parser.add_argument("--tuner-file", metavar="FILE.csv",
                        help="choose how nccl_allreduce, nccl_reduce_scatter and "
                             "nccl_all_gather run each call from this tuner file, as NCCL "
                             "with its example tuner plugin would (simcomm tune writes one); "
                             "a call no row covers runs the model's choice on one channel, "
                             "as the plugin leaves it")
    _add_topology_arguments(parser)
    _add_level_argument(parser)
    add_variation_arguments(parser, training=False)
    parser.set_defaults(run=bench)


# A simulation cannot wait on a silent peer: -T has nothing to bound.
_NO_TIMEOUT = Refused(("-T", "--timeout"), "0", "a simulated run cannot hang: a deadlock is "
                      "reported at once, as an error that names the unposted receives")


# -g is a flag of simcomm's own (_add_iteration_arguments): it models nccl-tests' host.
_SIMCOMM_REFUSED = tuple(r for r in NCCL_TESTS_REFUSED if "-g" not in r.flags) + (_NO_TIMEOUT,)


def _add_iteration_arguments(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' -w, -n, -a and -g, as a simulation takes them."""
    runs = parser.add_argument_group(
        "runs", "a simulated run is deterministic: every run of a size takes the same time, "
                "so -w and -n are accepted from nccl-tests' command lines and change nothing")
    runs.add_argument("-g", "--ngpus", type=int, default=1, metavar="N",
                      help="GPUs one process drives, as nccl-tests' -g: its host launches "
                           "their kernels in turn, so a row takes at least "
                           f"{HOST_SECONDS_PER_ITERATION * 1e6:g} us + N x "
                           f"({HOST_SECONDS_PER_GPU * 1e6:g} us + "
                           f"{HOST_SECONDS_PER_CHANNEL * 1e6:g} us per channel of its kernel) "
                           "(default 1: a process per GPU, the host keeps ahead)")
    runs.add_argument("-w", "--warmup_iters", type=int, metavar="N",
                      help="accepted, changes nothing (nccl-tests: warm-up runs)")
    runs.add_argument("-n", "--iters", type=int, metavar="N",
                      help="accepted, changes nothing (nccl-tests: timed runs)")
    runs.add_argument("-a", "--average", type=int, choices=sorted(AVERAGES), metavar="0-3",
                      help="which time of the ranks a row shows: "
                           + ", ".join(f"{k} {v}" for k, v in AVERAGES.items())
                           + f" (default {SLOWEST_RANK}: when the collective is done; "
                             "nccl-tests' default is 1, its ranks' loops end together)")


def _add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    topology = parser.add_argument_group(
        "topology", "a builder (--ranks, --bandwidth and --latency required), a preset "
                    "(simcomm topo list) or a topology file (.toml), which brings its own "
                    "ranks and links")
    topology.add_argument("--topology", metavar="KIND|PRESET|FILE",
                          help=f"one of {', '.join(TOPOLOGIES)}, a preset or a .toml file")
    topology.add_argument("--ranks", type=int, metavar="N",
                          help="number of ranks (GPUs); with a preset or file, its own")
    topology.add_argument("--bandwidth", metavar="RATE",
                          help="bandwidth of each link, e.g. 100GB/s or 400Gbps")
    topology.add_argument("--latency", metavar="TIME",
                          help="latency from GPU to GPU, e.g. 5us")
    topology.add_argument("--reduce-bandwidth", metavar="RATE",
                          help="rate of local reductions and copies (default inf: free)")
    topology.add_argument("--gpus-per-node", type=int, metavar="N",
                          help="hierarchical: GPUs per node (default min(ranks, 8))")
    topology.add_argument("--inter-bandwidth", metavar="RATE",
                          help="hierarchical: network link bandwidth (default --bandwidth)")
    topology.add_argument("--inter-latency", metavar="TIME",
                          help="hierarchical: latency across nodes (default --latency)")
    topology.add_argument("--link-speed", metavar="SRC:DST=FACTOR,...",
                          help="links at another bandwidth, both ways, e.g. gpu3:net=0.5 (a "
                               "NIC at half rate; node names: simcomm topo show)")
    topology.add_argument("--compute-speed", metavar="RANK=FACTOR,...",
                          help="ranks that compute at another speed than the nominal one, "
                               "e.g. 3=0.8 (rank 3 20%% slow); any topology")
    topology.add_argument("--memory-speed", metavar="RANK=FACTOR,...",
                          help="ranks whose local reductions and copies run at another "
                               "factor of the topology's rate, e.g. 3=0.5 (an older GPU's "
                               "memory); any topology")


def bench(args: argparse.Namespace) -> int:
    """``simcomm bench``: simulate the collective at every size and print each row as it is
    done (``-d all`` and ``-o all``: every type and op in turn)."""
    configs = configs_from_args(args)
    topology = _topology_from_args(args)
    tuner = _tuner_from_args(args, configs[0], topology)
    _check_runs(args)
    if args.ngpus < 1 or topology.size % args.ngpus:
        raise ValueError(f"-g/--ngpus {args.ngpus}: the GPUs one process drives must be a "
                         f"whole share of the {topology.size} ranks (>= 1, dividing them)")
    for config in configs:
        config.check_world(topology.size, topology.local_size)
    average = SLOWEST_RANK if args.average is None else args.average
    variation = variation_from_args(args)
    level = bench_level(configs[0], topology, args.level)
    if args.samples is not None and level == "collective":
        raise ValueError("--samples draws per message: the level is collective here; give "
                         "--level message")
    if args.samples is not None and any(config.check for config in configs):
        raise ValueError("--samples times seeded runs and counts no wrong elements: give -c/"
                         "--check without it")
    if args.level == "message":
        for config in configs:
            _check_message_level(config, topology, tuner)
    else:
        _check_largest_run(args, configs[0], topology, tuner)
    header = _bench_header(args, configs[0], topology)
    if tuner is not None:
        header.append(f"tuner file: {args.tuner_file} ({len(tuner.rows)} rows; a call no row "
                      "covers runs the model's choice on one channel)")
    if args.level == "auto" and level == "message":
        header.append(f"level: auto: every message simulated, but a size that would take more "
                      f"than {AUTO_MESSAGE_LIMIT:,} is costed at the collective level (its last "
                      "column says so)")
    else:
        header.append(describe_level(args.level, level))
    if args.samples is not None:
        header.append(f"{args.samples} seeded samples a size (seeds {args.seed} to "
                      f"{args.seed + args.samples - 1}): time is their mean; min to max their "
                      "spread, cv their coefficient of variation")
    writer = RowWriter(sys.stdout, configs[0].format, header, spread=args.samples is not None)
    writer.start()
    if args.samples is not None:
        _bench_samples(args, configs, topology, average, level, variation or Variation(0),
                       writer, tuner)
    else:
        expected = expected_messages(configs[0].collective.function, topology.size)
        with message_progress(None if expected is None
                              else expected * sum(len(c.sizes) for c in configs)) as bar:
            for config in configs:
                for row in bench_rows(config, topology, average, args.level, bar.update,
                                      variation, args.ngpus, tuner):
                    writer.write(row)
    writer.finish()
    if args.summary or args.trace or args.timeline:
        _largest_run(args, configs[0], topology, tuner)
    return 1 if writer.failed else 0


def _tuner_from_args(args: argparse.Namespace, config: BenchConfig, topology: Topology
                     ) -> TableTuner | None:
    """``--tuner-file``'s rows as the tuner of this run, NCCL's own choice being the
    model's (``ModelTuner``); None without the flag."""
    if args.tuner_file is None:
        return None
    return TableTuner(tuner_rows_for(config.collective.name, args.tuner_file),
                      topology.node_count, topology.size, nccl=ModelTuner(topology))


def _bench_samples(args: argparse.Namespace, configs: Sequence[BenchConfig], topology: Topology,
                   average: int, level: str, variation: Variation, writer: RowWriter,
                   tuner: TableTuner | None) -> None:
    """``--samples``: every size's seeded samples, a row each with their spread."""
    drawn = {}
    for config in configs:
        for size in config.sizes:
            run = partial(sample_seconds, config=config, topology=topology, size=size,
                          variation=variation, average=average, level=level,
                          gpus_per_process=args.ngpus, tuner=tuner)
            name = f"{config.collective.name}, {config.dtype.name}"
            if config.op is not None:
                name += f", {config.op.value}"
            drawn[f"{name}, {size} B"] = samples = run_samples(args, run)
            writer.write(sampled_row(config, topology.size, size, samples))
    save_histogram(args, drawn, f"{args.samples} seeded samples a size on {topology.name}")


def _add_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", choices=LEVELS, default="auto",
                        help="message: simulate every message; collective: cost each "
                             "collective from the topology (the ring collectives, "
                             "size-only; a second at 100,000 ranks); auto (default): the "
                             f"collective level past {AUTO_MESSAGE_LIMIT:,} messages")


def _check_runs(args: argparse.Namespace) -> None:
    """-w and -n change nothing here, but are checked as nccl-tests' would be used."""
    for flag, runs, least in (("-w/--warmup_iters", args.warmup_iters, 0),
                              ("-n/--iters", args.iters, 1)):
        if runs is not None and runs < least:
            raise ValueError(f"{flag} must be >= {least}, got {runs}")


def _bench_header(args: argparse.Namespace, config: BenchConfig, topology: Topology
                  ) -> list[str]:
    """What ``simcomm bench`` ran, for the table's ``#`` lines."""
    name = config.collective.name
    if is_builder(args.topology):
        header = [f"simcomm bench: {name} on {topology.size} ranks, {args.topology} topology, "
                  f"links {args.bandwidth} and {args.latency}, reduce bandwidth "
                  f"{args.reduce_bandwidth or 'inf'}"]
    else:
        header = [f"simcomm bench: {name} on {topology.size} ranks, topology {topology.name} "
                  f"(simcomm topo show {args.topology} lists its links)"]
    header.append("data check: on (numpy data)" if config.check else
                  "data check: off (size-only buffers; -c 1 runs real data)")
    if args.topology == "hierarchical":
        header.append(f"network links {args.inter_bandwidth or args.bandwidth} and "
                      f"{args.inter_latency or args.latency}")
    if config.params:
        header.append("params: " + " ".join(f"{k}={v}" for k, v in config.params))
    if args.warmup_iters is not None or args.iters is not None:
        header.append("-w/-n: one run per size; a simulated run is deterministic, so every "
                      "run takes the same time")
    if args.average is not None:
        header.append(f"time: {AVERAGES[args.average]} (-a {args.average})")
    if args.ngpus > 1:
        header.append(f"one process drives {args.ngpus} GPUs (-g): a row takes at least "
                      f"the host's {host_floor_seconds(args.ngpus) * 1e6:g} us to launch them on "
                      f"one channel each, {HOST_SECONDS_PER_CHANNEL * args.ngpus * 1e6:g} us "
                      "more per further channel")
    return header


def _check_message_level(config: BenchConfig, topology: Topology,
                         tuner: TableTuner | None) -> None:
    """Refuse, before the table, a size whose messages would pass the simulator's op budget
    (``DEFAULT_MAX_OPS``) at the message level: a Send and a Recv each at least, so it
    could only end, hours later, in that error."""
    for size in config.sizes:
        messages = traced_messages(config, topology, size, tuner)
        if messages is not None and 2 * messages > DEFAULT_MAX_OPS:
            raise ValueError(f"--level message: {size} B would send {messages:,} messages, "
                             f"past the {DEFAULT_MAX_OPS:,} ops a run may take (a Send and a "
                             "Recv each): give --level auto or collective, or a smaller size")


def _check_largest_run(args: argparse.Namespace, config: BenchConfig, topology: Topology,
                       tuner: TableTuner | None) -> None:
    """Refuse, before the table, a ``_largest_run`` (every message simulated) that would
    step through more messages than the auto level simulates."""
    flags = [flag for flag, given in (("--summary", args.summary), ("--trace", args.trace),
                                      ("--timeline", args.timeline)) if given]
    if not flags:
        return
    largest = max(config.sizes)
    messages = traced_messages(config, topology, largest, tuner)
    if messages is not None and messages > AUTO_MESSAGE_LIMIT:
        raise ValueError(f"{' and '.join(flags)}: the largest size, {largest} B, would be run "
                         f"again with every message simulated, {messages:,} of them, past the "
                         f"{AUTO_MESSAGE_LIMIT:,} the auto level simulates: leave "
                         f"{'them' if len(flags) > 1 else 'it'} out, or give --level message")


def _largest_run(args: argparse.Namespace, config: BenchConfig, topology: Topology,
                 tuner: TableTuner | None = None) -> None:
    """The run of the largest size again, traced: its summary, trace file and timeline."""
    largest = max(config.sizes)
    result = traced_run(config, topology, largest, args.trace, tuner)
    notes = []
    if args.summary:
        notes.append(f"summary of the largest size, {largest} B:\n" + format_summary(result))
    if args.trace:
        notes.append(f"trace of the largest size, {largest} B: {args.trace}")
    if args.timeline:
        title = f"{config.collective.name}, {largest} B, {topology.size} ranks, {topology.name}"
        _save_timeline(result, title, args.timeline)
        notes.append(f"timeline of the largest size, {largest} B: {args.timeline}")
    stream = sys.stdout if config.format == "table" else sys.stderr
    text = "\n".join(notes)
    stream.write("".join(f"# {line}\n" for line in text.splitlines()) + "#\n")


def _save_timeline(result: SimResult, title: str, path: str) -> None:
    try:
        from simcomm.plots import save_png, timeline_figure
    except ImportError:
        raise UsageError("--timeline needs matplotlib: pip install 'simcomm[plot]'") from None
    save_png(timeline_figure(result, title), path)


_BUILDER_ONLY = ("bandwidth", "latency", "reduce_bandwidth", "gpus_per_node",
                 "inter_bandwidth", "inter_latency")


def _topology_from_args(args: argparse.Namespace) -> Topology:
    topology = _machine_from_args(args)
    if args.compute_speed is not None:
        topology = topology.with_compute_speed(_rank_factors("--compute-speed",
                                                             args.compute_speed))
    if args.memory_speed is not None:
        topology = topology.with_memory_speed(_rank_factors("--memory-speed", args.memory_speed))
    given: set[frozenset[str]] = set()  # the pairs of nodes so far, either way round
    for item in filter(None, (part.strip() for part in (args.link_speed or "").split(","))):
        ends, eq, factor = item.partition("=")
        src, colon, dst = ends.partition(":")
        if not (eq and colon and src and dst):
            raise ValueError(f"--link-speed: {item!r} is not SRC:DST=FACTOR (gpu3:net=0.5: "
                             "the links between gpu3 and net at half their bandwidth)")
        try:
            bandwidth = float(factor)
        except ValueError:
            bandwidth = math.nan
        if not 0 < bandwidth < math.inf:
            raise ValueError(f"--link-speed: {item!r}: the factor must be a finite number > 0")
        pair = frozenset((src.strip(), dst.strip()))
        if pair in given:  # a second factor would multiply the first
            raise ValueError(f"--link-speed: {item!r}: the links between {src.strip()} and "
                             f"{dst.strip()} are given twice")
        given.add(pair)
        topology = topology.with_link_speed(src.strip(), dst.strip(), bandwidth)
    return topology


def _rank_factors(flag: str, text: str) -> dict[int, float]:
    """``--compute-speed 3=0.8,5=0.9`` (or ``--memory-speed``) as {rank: factor}."""
    speeds = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        rank, eq, factor = item.partition("=")
        try:
            number, speed = int(rank), float(factor)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not RANK=FACTOR (3=0.8: rank 3 at 0.8 of "
                             "the nominal speed)") from None
        if not eq or not 0 < speed < float("inf"):
            raise ValueError(f"{flag}: {item!r}: the factor must be a finite number > 0")
        if number in speeds:  # the last would win, unseen
            raise ValueError(f"{flag}: {item!r}: rank {number} is given twice")
        speeds[number] = speed
    return speeds


def _machine_from_args(args: argparse.Namespace) -> Topology:
    if args.topology is None or is_builder(args.topology):
        missing = [f"--{flag}" for flag in ("ranks", "topology", "bandwidth", "latency")
                   if getattr(args, flag) is None]
        if missing:
            raise UsageError(f"the following arguments are required: {', '.join(missing)} "
                              "(see simcomm bench --help)")
        return _builder_from_args(args)
    topology = load_named_topology(args.topology)
    for flag in _BUILDER_ONLY:
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} applies only to the builder "
                             f"topologies ({', '.join(TOPOLOGIES)}); {args.topology} brings "
                             f"its own links (simcomm topo show {args.topology})")
    if args.ranks is not None and args.ranks != topology.size:
        raise ValueError(f"--ranks {args.ranks} does not match {args.topology}, which has "
                         f"{topology.size} ranks (leave --ranks out)")
    return topology


def _builder_from_args(args: argparse.Namespace) -> Topology:
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
        _flag(parse_latency, "--latency", args.latency),
        _flag(parse_bandwidth, "--reduce-bandwidth",
              "inf" if args.reduce_bandwidth is None else args.reduce_bandwidth),
        gpus_per_node=args.gpus_per_node,
        inter_bandwidth=_flag(parse_bandwidth, "--inter-bandwidth", args.inter_bandwidth),
        inter_latency=_flag(parse_latency, "--inter-latency", args.inter_latency))


def _flag(parse: Callable[[str], float], flag: str, text: str | None) -> float | None:
    """``parse(text)`` with the flag named in its error; None stays None."""
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None


def ddp(args: argparse.Namespace) -> int:
    """``simcomm ddp``: simulate a DDP step (``simcomm.train_cli``)."""
    return run_ddp(args, _topology_from_args(args))


def fsdp(args: argparse.Namespace) -> int:
    """``simcomm fsdp``: simulate an FSDP step (``simcomm.train_cli``)."""
    return run_fsdp(args, _topology_from_args(args))


# -- validate ---------------------------------------------------------------------------

def _add_validate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "validate", help="simulated against measured times, with the error",
        description="For each row of measured results (realcomm bench --format csv, "
                    "what nccl-tests printed, -g included, or a published table), simulate "
                    "the same collective "
                    "and size on a topology (a preset, or one that simcomm fit wrote) and "
                    "print both times, the error, and per collective the median, "
                    "geometric-mean and largest absolute error.")
    parser.add_argument("--topology", required=True, metavar="PRESET|FILE",
                        help="a preset or a topology file (.toml)")
    parser.add_argument("--measured", action="append", required=True, metavar="ALGO=FILE",
                        help="an algorithm (NAME or NAME:key=value) and its measured "
                             "results (a bench CSV, nccl-tests' output or a table of "
                             "benchmarks/published), split at the last = (so FILE's name "
                             "cannot hold one); repeatable")
    parser.add_argument("--plot", metavar="FILE.png", type=output_file,
                        help="draw simulated and measured time against size")
    parser.add_argument("--fit", metavar="FILE.toml", type=output_file,
                        help="also fit the topology to the measured rows (one --measured): "
                             "what the cluster adds to every collective, from the rows below "
                             "64 KiB, and the share of its links' bandwidth between nodes it "
                             "reaches, from the rows from 256 MiB; print the comparison on "
                             "the fitted topology and write it here")
    parser.set_defaults(run=validate)


def validate(args: argparse.Namespace) -> int:
    """``simcomm validate``: print the comparison and the summary; draw it if asked."""
    if is_builder(args.topology):
        raise ValueError(f"--topology {args.topology} is a builder: validate takes a preset "
                         "or a .toml file")
    topology = load_named_topology(args.topology)
    if args.fit and len(args.measured) != 1:
        raise ValueError(f"--fit fits one measured collective; got {len(args.measured)} "
                         "--measured")
    measured = []
    for item in args.measured:
        # At the last =: the algorithm's parameters (NAME:key=value) have their own.
        algorithm, sep, path = item.rpartition("=")
        if not sep or not algorithm.strip() or not path.strip():
            raise ValueError(f"--measured {item!r}: write ALGORITHM=FILE")
        measured.append((algorithm.strip(), path.strip()))
    comparisons = [c for algorithm, path in measured for c in compare(topology, algorithm, path)]
    print(format_validation(comparisons))
    if args.fit:
        (algorithm, path), = measured
        fitted = fit_cluster(topology, algorithm, path, level="auto")
        print(f"\n{format_cluster_fit(fitted)}\n")
        comparisons = compare(fitted.topology, algorithm, path)
        print(format_validation(comparisons))
        with replacing(args.fit) as scratch:
            scratch.write_text(dump_topology(fitted.topology), encoding="utf-8")
        print(f"wrote {args.fit} (simcomm bench --topology {args.fit})")
    if args.plot:
        from simcomm.plots import save_png, sweep_figure  # needs matplotlib

        simulated, measured = validation_series(comparisons)
        save_png(sweep_figure(f"simulated (lines) and measured (crosses) on {topology.name}",
                              simulated, measured), args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


# -- fit --------------------------------------------------------------------------------

def _add_fit_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "fit", help="fit the cost model to realcomm calibrate's measurements",
        description="Fit latency, per-message gap and bandwidth of the links and the rate "
                    "of local reductions to a measurements file (realcomm calibrate --out "
                    "FILE.json), print each measurement beside its fit and write the fitted "
                    "topology file.")
    parser.add_argument("measurements", metavar="MEASUREMENTS",
                        help="the measurements file (.json) that realcomm calibrate wrote")
    parser.add_argument("--out", required=True, metavar="TOPOLOGY.toml", type=output_file,
                        help="where to write the fitted topology")
    parser.add_argument("--name", default="calibrated",
                        help="the topology's name (default calibrated)")
    parser.set_defaults(run=fit)


def fit(args: argparse.Namespace) -> int:
    """``simcomm fit``: fit, print, write the topology file."""
    if not (args.name and args.name.isprintable()):
        raise ValueError(f"--name must be a non-empty line of text, got {args.name!r}")
    calibration = load_calibration(args.measurements)
    toml = calibration.topology_toml(args.name)  # refused, if it is, before anything prints
    print(calibration.format())
    with replacing(args.out) as scratch:
        scratch.write_text(toml, encoding="utf-8")
    print(f"wrote {args.out} (simcomm topo show {args.out})")
    return 0


def _add_fit_spread_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "fit-spread", help="fit message delay and slowdown to measured runs' spread",
        description="Fit the random variation (a lognormal delay and a lognormal slowdown "
                    "of every message) under which the simulated runs of a collective "
                    "spread as measured ones do: each size's median and 90th percentile. "
                    "Measure with realcomm bench -I -a 3 --format json.")
    parser.add_argument("runs", metavar="RUNS.json",
                        help="realcomm bench -I --format json's output: every run of each "
                             "size")
    parser.add_argument("--algorithm", required=True, metavar="NAME",
                        help="the collective measured, e.g. ring_allreduce")
    parser.add_argument("--samples", type=int, default=SPREAD_SAMPLES, metavar="N",
                        help=f"seeded runs a size at every trial (default {SPREAD_SAMPLES})")
    _add_topology_arguments(parser)
    parser.set_defaults(run=fit_spread_command)


def fit_spread_command(args: argparse.Namespace) -> int:
    """``simcomm fit-spread``: fit, print the comparison and the flags."""
    if not 5 <= args.samples <= MAX_SPREAD_SAMPLES:
        raise ValueError(f"--samples must be from 5 to {MAX_SPREAD_SAMPLES}, got {args.samples}")
    measured = read_runs(args.runs)
    topology = _topology_from_args(args)
    config = algorithm_config(args.algorithm, sorted(measured))
    config.check_world(topology.size, topology.local_size)

    def run(size: int, variation: Variation) -> float:
        return bench_size(config, topology, size, variation=variation).time_us / 1e6
    with tqdm(total=MAX_SPREAD_TRIALS, desc="fitting", unit="trial", file=sys.stderr,
              leave=False, disable=not sys.stderr.isatty()) as bar:
        fit = fit_spread(run, measured, args.samples, progress=lambda: bar.update(1))
    print(fit.format())
    return 0


# -- tune -------------------------------------------------------------------------------

def _add_tune_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "tune", help="write the model's choice per size as an NCCL tuner file",
        description="Estimate every algorithm and protocol NCCL weighs at each size on a "
                    "topology, and write the fastest per size range in the CSV format of "
                    "NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE).")
    parser.add_argument("--topology", required=True, metavar="PRESET|FILE",
                        help="a preset (simcomm topo list) or a topology file (.toml)")
    parser.add_argument("--collectives", default=",".join(CANDIDATES), metavar="LIST",
                        help=f"comma-separated, of {', '.join(CANDIDATES)} (default all)")
    parser.add_argument("-b", "--minbytes", default="8", metavar="SIZE",
                        help="smallest size to estimate, a power of two (default 8)")
    parser.add_argument("-e", "--maxbytes", default="16GiB", metavar="SIZE",
                        help="largest size to estimate, a power of two (default 16GiB); "
                             "each power of two between is estimated too")
    parser.add_argument("--out", metavar="FILE.csv", type=output_file,
                        help="write the tuner file here (default: print it)")
    parser.set_defaults(run=tune)


def tune(args: argparse.Namespace) -> int:
    """``simcomm tune``: the model's fastest choice per size range, as a tuner file."""
    if is_builder(args.topology):
        raise ValueError(f"--topology {args.topology} is a builder: tune takes a preset or a "
                         ".toml file")
    topology = load_named_topology(args.topology)
    collectives = _items("--collectives", args.collectives)
    for i, collective in enumerate(collectives):
        if collective not in CANDIDATES:
            raise ValueError(f"--collectives: unknown collective {collective!r}; known: "
                             f"{', '.join(CANDIDATES)}")
        if collective in collectives[:i]:  # its rows would be written twice
            raise ValueError(f"--collectives: {collective} is given twice")
    sizes = size_range(_power_of_two("-b/--minbytes", args.minbytes),
                       _power_of_two("-e/--maxbytes", args.maxbytes), 2)
    tuner = ModelTuner(topology)
    nodes = topology.node_count
    rows = [row for collective in collectives
            for row in rows_for(collective, [(n, tuner(collective, n)) for n in sizes],
                                nodes, topology.size)]
    text = format_tuner_file(rows, [
        f"simcomm tune --topology {args.topology}: {topology.size} ranks on {nodes} "
        f"node{'s' * (nodes != 1)}",
        f"the model tuner's choice, as NCCL weighs it, at each power of two from {sizes[0]} to "
        f"{sizes[-1]} bytes",
        "for NCCL's example tuner plugin of NCCL 2.30.3 or newer (those of 2.27.5 to 2.29.7 "
        "crash on a matching row); see docs/tuner-files.md"])
    if args.out:
        with replacing(args.out) as scratch:
            scratch.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: {len(rows)} rows")
    else:
        sys.stdout.write(text)
    return 0


def _power_of_two(flag: str, text: str) -> int:
    """Bytes from ``text``, a power of two of at most ``sys.maxsize`` (bench's cap too)."""
    try:
        size = parse_size(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
    if size > sys.maxsize:
        raise ValueError(f"{flag} {text}: {size} B is too large; at most {sys.maxsize} B")
    if size < 1 or size & (size - 1):
        raise ValueError(f"{flag} {text}: {size} B is not a power of two (tune estimates each "
                         "power of two from -b to -e)")
    return size


# -- topo -------------------------------------------------------------------------------

def _add_topo_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("topo", help="list and describe topology presets and files",
                                 description="List the topology presets, or describe a "
                                             "preset or a topology file.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the presets, each with its description")
    listing.set_defaults(run=topo_list)
    show = actions.add_parser("show", help="describe a preset or a topology file")
    show.add_argument("topology", metavar="NAME|FILE",
                      help="a preset (dgx-a100, cluster-h100:nodes=4) or a .toml file")
    show.add_argument("--toml", action="store_true",
                      help="print it as a topology file instead (to edit and load back)")
    show.set_defaults(run=topo_show)


def topo_list(args: argparse.Namespace) -> int:
    """``simcomm topo list``: each preset with its one-line description."""
    presets = list_presets()
    width = max(len(name) for name, _ in presets)
    for name, description in presets:
        print(f"{name:<{width}}  {description}")
    print(f"\nbuilders (with --ranks, --bandwidth and --latency): {', '.join(TOPOLOGIES)}; "
          "a topology file: any .toml path (docs/topologies.md)")
    return 0


def topo_show(args: argparse.Namespace) -> int:
    """``simcomm topo show``: describe a preset or a topology file."""
    if is_builder(args.topology):
        raise ValueError(f"{args.topology} is a builder: it needs ranks, bandwidth and "
                         "latency, so describe it with simcomm bench; topo show takes a "
                         "preset or a .toml file")
    topology = load_named_topology(args.topology)
    sys.stdout.write(dump_topology(topology) if args.toml else describe(topology) + "\n")
    return 0


# -- sweep ------------------------------------------------------------------------------

def _add_sweep_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sweep", help="simulate a grid in parallel; write a CSV, plots and crossovers",
        description="Simulate every combination of algorithms, sizes, topologies, ranks, "
                    "bandwidths and latencies (size-only), in parallel, and write "
                    "DIR/sweep.csv, a PNG per ranks x bandwidth x latency and "
                    "DIR/crossover.md, the fastest algorithm per size range. Each axis is "
                    "a comma list.")
    grid = parser.add_argument_group("grid")
    grid.add_argument("--algorithm", metavar="LIST", default=",".join(DEFAULT_ALGORITHMS),
                      help="algorithms, NAME or NAME:key=value (e.g. "
                           "reduce_broadcast_allreduce:tree=true), your own as "
                           "module.path:function[:key=value]; default: the three all-reduces")
    grid.add_argument("--kind", metavar="COLLECTIVE",
                      help="which nccl-tests collective your module:function algorithms "
                           f"implement: {', '.join(KINDS)} (default allreduce)")
    grid.add_argument("--sizes", metavar="LIST", help="sizes, e.g. 1KiB,1MiB,1GiB "
                                                      "(default: 1KiB to 1GiB, x4)")
    grid.add_argument("-b", "--minbytes", metavar="SIZE", help="smallest size (default 1K)")
    grid.add_argument("-e", "--maxbytes", metavar="SIZE", help="largest size (default 1G)")
    grid.add_argument("-f", "--stepfactor", type=int, metavar="N",
                      help="multiply the size by N between runs (default 4)")
    grid.add_argument("--dtype", default="float", metavar="TYPE", help="default float")
    grid.add_argument("--topology", metavar="LIST", default=",".join(DEFAULT_TOPOLOGIES),
                      help=f"builders ({', '.join(TOPOLOGIES)}), presets or .toml files "
                           f"(default {','.join(DEFAULT_TOPOLOGIES)})")
    grid.add_argument("--ranks", metavar="LIST",
                      help=f"for the builders (default {','.join(map(str, DEFAULT_RANKS))})")
    grid.add_argument("--bandwidth", metavar="LIST",
                      help=f"for the builders (default {','.join(DEFAULT_BANDWIDTHS)})")
    grid.add_argument("--latency", metavar="LIST",
                      help=f"for the builders (default {','.join(DEFAULT_LATENCIES)})")
    grid.add_argument("--reduce-bandwidth", metavar="RATE",
                      help="for the builders: rate of local reductions (default inf: free)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), metavar="N",
                        help="processes to simulate in (default: every core, here "
                             f"{default_jobs()})")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="run the points on a dask.distributed cluster instead, given its "
                             "scheduler's address (tcp://host:8786); its workers need simcomm "
                             "installed (pip install 'simcomm[dask]')")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of OUT/sweep.csv that belong to this grid (from a "
                             "sweep that was stopped) and simulate only the others")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT/sweep.csv's rows (with --resume: those of another "
                             "grid); without it a sweep refuses to lose rows it holds")
    _add_output_arguments(parser)
    parser.add_argument("--progress", action="store_true",
                        help="draw the progress bar on stderr even when it is not a terminal")
    parser.set_defaults(run=sweep)


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", type=output_folder,
                        help="folder for the results (made if missing, in a folder that "
                             "exists)")
    parser.add_argument("--measured", action="append", default=[], metavar="[LABEL=]FILE",
                        help="measured results in the bench CSV columns (realcomm bench "
                             "--format csv) to draw beside the simulated lines (repeatable)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNGs")


def sweep(args: argparse.Namespace) -> int:
    """``simcomm sweep``: simulate the grid, then write the CSV, the plots and the table."""
    grid = _grid_from_args(args)
    points = grid.points()
    measured = _measured_from_args(args)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    path = out / "sweep.csv"
    type_name = algorithm_config(points[0].algorithm, (points[0].size,), grid.dtype,
                                 points[0].kind).type_name
    wanted = {point_key(point, type_name) for point in points}
    held = read_csv(path, allow_empty=True) if path.exists() and (
        args.resume or not args.overwrite) else []
    kept = [row for row in held if row_key(row) in wanted] if args.resume else []
    lost = len(held) - len(kept)
    if lost and not args.overwrite:
        raise ValueError(
            f"{path} holds {lost} row{'s' * (lost > 1)} "
            + ("of another grid, which --resume would drop" if args.resume else
               "already") + ": give --resume to keep this grid's rows, --overwrite to "
            "replace them, or another --out")
    done = {row_key(row) for row in kept}
    todo = [point for point in points if point_key(point, type_name) not in done]
    # Each row goes to the file as it finishes: a sweep stopped half way keeps what it did,
    # and --resume takes it up from there.
    _replace_csv(path, kept)
    show = args.progress or sys.stderr.isatty()
    started = time.perf_counter()
    with open(path, "a", encoding="utf-8", newline="") as stream:
        def save(row: SweepRow) -> None:
            write_csv([row], stream, header=False)
            stream.flush()
        with tqdm(total=len(todo), desc="sweep", unit="point", file=sys.stderr,
                  disable=not (show and todo), mininterval=0) as bar:
            new = run_sweep(todo, args.jobs, lambda done, total: bar.update(1), args.scheduler,
                            save)
    seconds = time.perf_counter() - started
    order = {point_key(point, type_name): i for i, point in enumerate(points)}
    rows = sorted(kept + new, key=lambda row: order[row_key(row)])
    _replace_csv(path, rows)  # in grid order, now that all are in
    where = (f"on the dask cluster at {args.scheduler}" if args.scheduler else
             f"with {min(args.jobs, max(len(todo), 1))} "
             f"process{'es' * (min(args.jobs, len(todo)) > 1)}")
    print(f"simulated {len(todo)} points in {seconds:.2f} s {where}"
          + (f"; {len(kept)} kept from {path}" if args.resume else ""))
    _report(rows, measured, out, args.no_plots, [path])
    return 0


def _replace_csv(path: Path, rows: list[SweepRow]) -> None:
    """Write ``rows`` to ``path`` whole, so that the old file is there until the new one is."""
    with replacing(path) as scratch, open(scratch, "w", encoding="utf-8", newline="") as stream:
        write_csv(rows, stream)


def _grid_from_args(args: argparse.Namespace) -> Grid:
    topologies = tuple(_items("--topology", args.topology))
    builders = any(is_builder(t) for t in topologies)
    for flag in ("ranks", "bandwidth", "latency", "reduce_bandwidth"):
        if getattr(args, flag) is not None and not builders:
            raise ValueError(f"--{flag.replace('_', '-')} applies only to the builder "
                             f"topologies ({', '.join(TOPOLOGIES)}), and --topology names "
                             "none (presets and files bring their own)")
    latencies = (tuple(_items("--latency", args.latency)) if args.latency is not None
                 else DEFAULT_LATENCIES)
    for latency in latencies:
        _flag(parse_latency, "--latency", latency)
    return Grid(
        algorithms=tuple(_items("--algorithm", args.algorithm)),
        sizes=_sweep_sizes(args),
        topologies=topologies,
        ranks=tuple(_int_item("--ranks", item) for item in _items("--ranks", args.ranks))
        if args.ranks is not None else DEFAULT_RANKS,
        bandwidths=tuple(_items("--bandwidth", args.bandwidth))
        if args.bandwidth is not None else DEFAULT_BANDWIDTHS,
        latencies=latencies,
        dtype=args.dtype,
        reduce_bandwidth="inf" if args.reduce_bandwidth is None else args.reduce_bandwidth,
        kind=args.kind, level=args.level)


def _sweep_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    stepped = (args.minbytes, args.maxbytes, args.stepfactor)
    if args.sizes is not None:
        if any(value is not None for value in stepped):
            raise ValueError("give either --sizes or -b/-e/-f, not both")
        return parse_sizes(args.sizes)
    if all(value is None for value in stepped):
        return DEFAULT_SIZES
    return size_range(parse_size(args.minbytes or "1K"), parse_size(args.maxbytes or "1G"),
                      4 if args.stepfactor is None else args.stepfactor)


def _items(flag: str, text: str) -> list[str]:
    """``split_list(text)``, its error naming ``flag``."""
    try:
        return split_list(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None


def _int_item(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not an int") from None


def _measured_from_args(args: argparse.Namespace) -> list[Series]:
    series: list[Series] = []
    for text in args.measured:
        label, path = _measured_spec(text)
        series += read_bench_csv(path, label)
    return series


def _measured_spec(text: str) -> tuple[str, str]:
    """``LABEL=FILE`` or ``FILE`` (labelled by its name without the extension) as
    ``(label, path)``."""
    label, sep, path = text.partition("=")
    if not sep:
        return Path(text).stem, text
    if not label.strip() or not path.strip():
        raise ValueError(f"--measured {text!r}: write LABEL=FILE or FILE")
    return label.strip(), path.strip()


def _report(rows: Sequence[SweepRow], measured: Sequence[Series], out: Path, no_plots: bool,
            written: list[Path]) -> None:
    """Print and write the crossover table, draw the plots, list the files written."""
    if rows:
        table = format_crossovers(crossovers(rows))
        with replacing(out / "crossover.md") as scratch:
            scratch.write_text(table, encoding="utf-8")
        written.append(out / "crossover.md")
        print("fastest algorithm per size range:")
        sys.stdout.write(table)
    if not no_plots:
        try:
            from simcomm.plots import write_plots  # matplotlib only when plots are drawn

            written += write_plots(rows, out, measured)
        except ImportError as error:
            raise ValueError(f"plots need matplotlib (pip install simcomm[plot]), or pass "
                             f"--no-plots: {error}") from None
    print("wrote: " + ", ".join(str(path) for path in written))


# -- plot -------------------------------------------------------------------------------

def _add_plot_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "plot", help="plot sweep CSVs and measured results without simulating",
        description="Draw the plots and the crossover table of sweep CSVs (simcomm sweep's "
                    "sweep.csv) again, with measured results beside them, without "
                    "simulating anything.")
    parser.add_argument("csv", nargs="*", metavar="SWEEP_CSV", help="CSVs that sweep wrote")
    _add_output_arguments(parser)
    parser.set_defaults(run=plot)


def plot(args: argparse.Namespace) -> int:
    """``simcomm plot``: the sweep's outputs again from CSVs."""
    if not args.csv and not args.measured:
        raise ValueError("nothing to plot: give sweep CSVs or --measured files")
    if not args.csv and args.no_plots:  # measured files are only drawn
        raise ValueError("nothing to do: --measured files are only drawn, and --no-plots "
                         "draws nothing; give sweep CSVs too, or leave --no-plots out")
    rows = [row for path in args.csv for row in read_csv(path)]
    measured = _measured_from_args(args)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    _report(rows, measured, out, args.no_plots, [])
    return 0
