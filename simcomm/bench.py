"""What ``simcomm bench`` runs: a collective simulated at each size on a topology and scored
in nccl-tests' columns (``algorithms.harness.bench``).

* ``algorithm_config(spec, sizes, dtype, kind)``: the bench configuration of ``NAME`` or
  ``NAME:key=value,...`` (``reduce_broadcast_allreduce:tree=true``), where a user's own
  algorithm is named ``module.path:function`` (``mymodule:my_allreduce:chunks=4``);
  ``split_algorithm_spec`` splits such a spec.
* ``is_builder``, ``load_named_topology``, ``build_topology``: the topology a name stands
  for: a builder (``ring``, ``fully_connected``, ``switch``, ``hierarchical``) made with
  ranks, bandwidth and latency in human units, a preset or a topology file.
* ``bench_size(config, topology, size, average)`` simulates one size and returns its row
  (with ``gpus_per_process``, as nccl-tests' ``-g`` runs it: ``host_bound_seconds``);
  ``bench_rows`` yields every size's row of the configuration as each is simulated;
  ``sample_seconds`` is one seeded sample of a size under random variation and
  ``sampled_row`` the row of many, with their spread;
  ``traced_run`` one size again with the op trace, for summaries, Chrome traces and
  timelines, and ``traced_messages`` the messages that run steps through.

``simcomm sweep`` runs ``bench_size`` once per grid point and ``simcomm validate`` once per
measured row.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import numpy as np

from tqdm import tqdm

from algorithms.harness.bench import (
    BenchConfig, BenchRow, RunSpread, bench_config, bench_row, buffer_count, check_inputs,
    count_wrong, rank_time,
)
from algorithms.harness.catalog import UserAlgorithmError
from algorithms.ops import Launch, Tuner
from simcomm.buffers import SizeOnly
from simcomm.collective_level import choose_level, has_collective_model
from simcomm.engine import simulate
from simcomm.presets import PRESETS, is_preset_spec
from simcomm.results import SimResult
from simcomm.topofile import load_topology
from simcomm.topology import TOPOLOGIES, Topology, make_topology
from simcomm.units import parse_bandwidth, parse_seconds
from simcomm.variation import Samples, Variation


# The time of a simulated run: when its last rank finishes (nccl-tests' -a 3).
SLOWEST_RANK = 3

# One host thread that drives several GPUs (nccl-tests' -g) launches their kernels one after
# another. NVIDIA's NCCL developers put the higher small-size times of such runs down to CUDA's
# launch overheads in a single process and advise one process per GPU (NVIDIA/nccl-tests
# issue #333). A row of such a run takes at least the host's time per iteration: a fixed
# part, a part per GPU launched and a part per channel of each GPU's kernel, since NCCL's host
# code sets up every channel's work and proxy operation for each call (the loop over a
# task's channels in scheduleCollTasksToPlan, NVIDIA/nccl v2.26.2 src/enqueue.cc), so the
# time climbs as a call spreads over more channels. No source gives the three apart, so they
# are fitted to the rows this floor sets in every published -g table we hold (the
# ncclcollbench, ncclcollbenchquiet, togethernccl, galvatron and superbench tables in
# benchmarks/published: 4 and 8 GPUs; `python benchmarks/fidelity.py --fit-host-floor`). That
# gives 22.65 us for 4 GPUs on one channel; NVIDIA/nccl-tests#333 measures about 22 us for 4
# B200s.
HOST_SECONDS_PER_ITERATION = 9.87e-6
HOST_SECONDS_PER_GPU = 3.155e-6
HOST_SECONDS_PER_CHANNEL = 0.04e-6


def host_floor_seconds(gpus_per_process: int, channels: int = 1) -> float:
    """The least time of one iteration whose host thread launches ``gpus_per_process``
    GPUs' kernels (nccl-tests' ``-g``) of ``channels`` channels each."""
    return (HOST_SECONDS_PER_ITERATION
            + gpus_per_process * (HOST_SECONDS_PER_GPU + channels * HOST_SECONDS_PER_CHANNEL))


def host_bound_seconds(collective_seconds: float, gpus_per_process: int,
                       channels: int = 1) -> float:
    """The time of one of nccl-tests' back-to-back iterations when one host thread drives
    ``gpus_per_process`` GPUs running kernels of ``channels`` channels: the host launches the
    next iteration's kernels while the GPUs run this one, so the slower of the two sets the
    pace (``host_floor_seconds``). With one GPU per process the host keeps ahead (a
    topology's launch latency is the GPU's side of a launch), and an empty collective
    (nothing to move) launches nothing."""
    if gpus_per_process == 1 or collective_seconds == 0:
        return collective_seconds
    return max(collective_seconds, host_floor_seconds(gpus_per_process, channels))


def launched_channels(launches: Iterable[Launch]) -> int:
    """The channels of the widest kernel among ``launches`` (1 where the algorithm names
    none): what the host sets up per GPU for one call."""
    return max((launch.channels for launch in launches), default=1)


def algorithm_config(spec: str, sizes: Iterable[int], dtype: str = "float",
                     kind: str | None = None) -> BenchConfig:
    """The bench configuration of ``spec`` (``split_algorithm_spec``) at ``sizes``, its
    algorithm implementing ``kind`` if it is the user's own; checked as ``simcomm bench``
    checks its flags; errors name the spec."""
    name, params = split_algorithm_spec(spec)
    try:
        return bench_config(name, sizes, dtype, kind=kind, params=params)
    except UserAlgorithmError:
        raise  # it names the algorithm already
    except ValueError as error:
        raise ValueError(f"algorithm {spec!r}: {error}") from None


def split_algorithm_spec(spec: str) -> tuple[str, list[str]]:
    """An algorithm (a built-in name or ``module.path:function``) and its ``key=value``
    parameters, from ``NAME``, ``NAME:key=value,...`` or ``module.path:function:key=value``."""
    name, sep, params = spec.rpartition(":")
    if not sep or not ("=" in params or not params.strip()):
        return spec.strip(), []
    return name.strip(), [p for p in params.split(",") if p.strip()]


def is_builder(spec: str) -> bool:
    """Whether ``spec`` names a topology builder that needs ranks, bandwidth and latency."""
    return spec in TOPOLOGIES


def load_named_topology(spec: str) -> Topology:
    """A preset (``dgx-a100``, ``cluster-h100:nodes=4``) or a topology file (``lab.toml``)."""
    if not (is_preset_spec(spec) or spec.endswith(".toml") or os.path.exists(spec)):
        raise ValueError(f"unknown topology {spec!r}: not a builder ({', '.join(TOPOLOGIES)}), "
                         f"a preset ({', '.join(PRESETS)}) or a topology file (.toml)")
    return load_topology(spec)


def parse_latency(text: str) -> float:
    """A latency a user writes (``5us``, ``0s``), which needs its unit, as a bandwidth and a
    topology file's times do: 1 could mean 1 s or 1 us."""
    return parse_seconds(text, require_unit=True)


def build_topology(spec: str, ranks: int, bandwidth: str, latency: str,
                   reduce_bandwidth: str = "inf") -> Topology:
    """A builder topology from human units (``100GB/s``, ``5us``), or a preset or file
    (then the other arguments are ignored: it has its own)."""
    if not is_builder(spec):
        return load_named_topology(spec)
    return make_topology(spec, ranks, _parse("bandwidth", parse_bandwidth, bandwidth),
                         _parse("latency", parse_latency, latency),
                         _parse("reduce bandwidth", parse_bandwidth, reduce_bandwidth))


def _parse(what: str, parse: Callable[[str], float], text: str) -> float:
    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"{what} {text!r}: {error}") from None


def bench_size(config: BenchConfig, topology: Topology, size: int,
               average: int = SLOWEST_RANK, level: str = "message",
               progress: Callable[[int], None] | None = None,
               variation: Variation | None = None, gpus_per_process: int = 1,
               tuner: Tuner | None = None) -> BenchRow:
    """Simulate ``config``'s collective at ``size`` bytes on ``topology`` and score it; its
    time is the ranks' finish times made one as nccl-tests' ``-a`` says (``rank_time``;
    default the last rank's, when the collective is done), paced by the host when one
    process drives ``gpus_per_process`` GPUs (``host_bound_seconds``).

    Size-only buffers unless ``config.check``, which runs numpy data and counts wrong
    elements. ``level``, ``progress``, ``variation`` and ``tuner``: as ``simulate``'s
    (``bench_level`` says which level a run takes).
    """
    p = topology.size
    count = buffer_count(config.collective, p, size, config.dtype.itemsize)
    if config.check:
        inputs = check_inputs(p, count, config.dtype, config.op)
    else:
        inputs = [SizeOnly(count, config.dtype)] * p  # immutable, so one serves every rank
    result = simulate(config.collective.function, inputs, topology, record=False, level=level,
                      progress=progress, variation=variation, tuner=tuner,
                      **config.algorithm_kwargs())
    wrong = None
    if config.check:
        wrong = count_wrong(config.collective, inputs, result.results, config.op,
                            config.root, dict(config.params))
    algo = "; ".join(dict.fromkeys(launch.describe() for launch in result.launches))
    if level == "auto" and result.level == "collective":
        algo = f"{algo or 'N/A'} (collective level)"
    seconds = host_bound_seconds(rank_time(result.finish_times, average), gpus_per_process,
                                 launched_channels(result.launches))
    return bench_row(config.collective, p, size, config.dtype, config.op, config.root,
                     seconds, wrong, algo)


def sample_seconds(seed: int, config: BenchConfig, topology: Topology, size: int,
                   variation: Variation, average: int = SLOWEST_RANK,
                   level: str = "message", gpus_per_process: int = 1,
                   tuner: Tuner | None = None) -> float:
    """One seeded sample of ``size``: its time with ``variation``'s draws from ``seed``
    (module level, so that worker processes can run it)."""
    row = bench_size(config, topology, size, average, level,
                     variation=replace(variation, seed=seed), gpus_per_process=gpus_per_process,
                     tuner=tuner)
    return row.time_us / 1e6


def sampled_row(config: BenchConfig, world_size: int, size: int, samples: Samples) -> BenchRow:
    """The row of ``size`` from seeded samples: their mean time (as nccl-tests' time is the
    mean of its runs), and their spread."""
    return bench_row(config.collective, world_size, size, config.dtype, config.op, config.root,
                     float(np.mean(samples.times)), None, spread=RunSpread.of(samples.times))


def bench_rows(config: BenchConfig, topology: Topology, average: int = SLOWEST_RANK,
               level: str = "message", progress: Callable[[int], None] | None = None,
               variation: Variation | None = None, gpus_per_process: int = 1,
               tuner: Tuner | None = None) -> Iterator[BenchRow]:
    """Every size of ``config`` on ``topology``, each row as soon as it is simulated (its
    root is checked against the ranks first)."""
    config.check_world(topology.size, topology.local_size)
    for size in config.sizes:
        yield bench_size(config, topology, size, average, level, progress, variation,
                         gpus_per_process, tuner)


def message_progress(total: int | None) -> tqdm:
    """A progress bar, on a terminal, of the messages message-level runs step through
    (``simulate``'s ``progress``; ``update`` is the callback): it shows once a run has gone
    on for a second, with the time left where ``total`` is known."""
    return tqdm(total=total, desc="simulating", unit=" messages", unit_scale=True,
                file=sys.stderr, leave=False, delay=1.0, disable=not sys.stderr.isatty())


def bench_level(config: BenchConfig, topology: Topology, level: str) -> str:
    """The level (``message`` or ``collective``) ``config``'s runs take at ``level``."""
    return choose_level(level, config.collective.function, topology.size, not config.check)


def traced_messages(config: BenchConfig, topology: Topology, size: int,
                    tuner: Tuner | None = None) -> int | None:
    """The messages ``traced_run`` of ``size`` steps through, as the collective level
    counts them without simulating one; None where no model covers the call."""
    if not has_collective_model(config.collective.function):
        return None
    count = buffer_count(config.collective, topology.size, size, config.dtype.itemsize)
    try:
        return simulate(config.collective.function,
                        [SizeOnly(count, config.dtype)] * topology.size, topology,
                        record=False, tuner=tuner, level="collective",
                        **config.algorithm_kwargs()).messages
    except (ValueError, TypeError):
        return None


def traced_run(config: BenchConfig, topology: Topology, size: int,
               trace: str | os.PathLike[str] | None = None,
               tuner: Tuner | None = None) -> SimResult:
    """``size`` again, size-only, with the op trace kept (and written as a Chrome trace to
    ``trace`` if given): timing does not depend on the data."""
    count = buffer_count(config.collective, topology.size, size, config.dtype.itemsize)
    return simulate(config.collective.function, [SizeOnly(count, config.dtype)] * topology.size,
                    topology, trace=trace, tuner=tuner, **config.algorithm_kwargs())
