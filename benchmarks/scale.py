"""How far the simulator reaches: the message level and the collective level side by side.

For each case the table gives the ranks, the messages the message level steps through,
the wall time of the run, messages per wall second, the peak memory of the process, the
simulated time, and where both levels ran, the collective level's speed-up over the
message level (a ratio of two runs of this invocation) and their difference in simulated
time. Cases: a ring all-reduce of 1 GiB per rank on a ring, a switch and a cluster of DGX
H100 nodes (64 to 131,072 ranks), and a DDP and an FSDP step of llama-7b on that cluster
(64 to 16,384 GPUs).

    python benchmarks/scale.py [--max-message-ranks 512] [--max-ranks 131072] [--ranks LIST]

Each case runs in a fresh process (so its peak resident memory is its own); the message
level runs up to ``--max-message-ranks`` ranks (a 1,024-rank ring takes it about a
minute, and a DDP step of llama-7b on 64 GPUs about 90 s). Topologies are built before the
clock starts: building the 131,072-GPU cluster's 524,288 links takes about 2 s of its own,
printed apart.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

RING_BYTES = 2**30  # per rank
BANDWIDTH, LATENCY = 100e9, 5e-6  # the ring and switch builders' links


@dataclass(frozen=True)
class Case:
    """One run: what (``allreduce``, ``ddp``, ``fsdp``), where, and at which level."""

    what: str
    topology: str  # "ring", "switch", or "cluster" (cluster-h100, 8 GPUs a node)
    ranks: int
    level: str


@dataclass(frozen=True)
class Outcome:
    """What a run cost: wall seconds (the topology built beforehand, its seconds apart),
    messages, peak resident memory, and the simulated seconds."""

    build: float
    wall: float
    messages: int
    peak_mib: float
    simulated: float


def _topology(case: Case):  # -> Topology; imported in the worker only
    from simcomm.presets import make_preset
    from simcomm.topology import ring, switch
    if case.topology == "ring":
        return ring(case.ranks, BANDWIDTH, LATENCY)
    if case.topology == "switch":
        return switch(case.ranks, BANDWIDTH, LATENCY)
    return make_preset(f"cluster-h100:nodes={case.ranks // 8}")


def run_case(case: Case) -> Outcome:
    """Run ``case`` in this process (a fresh worker) and measure it."""
    import numpy as np

    from algorithms.collectives import ring_allreduce
    from algorithms.harness.model_presets import preset_model
    from simcomm import SizeOnly, simulate
    from simcomm.training import simulate_ddp, simulate_fsdp
    started = time.perf_counter()
    topology = _topology(case)
    built = time.perf_counter()
    if case.what == "allreduce":
        result = simulate(ring_allreduce, [SizeOnly(RING_BYTES // 4, np.float32)] * case.ranks,
                          topology, record=False, level=case.level)
        messages, simulated = result.messages, result.time
    else:
        step = simulate_ddp if case.what == "ddp" else simulate_fsdp
        report = step(preset_model("llama-7b"), topology, level=case.level)
        messages, simulated = report.result.messages, report.step
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return Outcome(built - started, done - built, messages, peak, simulated)


def cases(max_message_ranks: int, max_ranks: int, only: set[int] | None = None) -> list[Case]:
    """Every case of the table (of ``only`` these rank counts, if given), message level only
    up to ``max_message_ranks``."""
    out = []
    for what, topology, sizes in (
            ("allreduce", "ring", [64, 256, 512, 1024, 4096, 16384, 131072]),
            ("allreduce", "switch", [64, 256, 512, 1024, 4096, 16384, 131072]),
            ("allreduce", "cluster", [64, 256, 512, 1024, 4096, 16384, 131072]),
            ("ddp", "cluster", [16, 64, 1024, 16384]),
            ("fsdp", "cluster", [16, 64, 1024, 16384])):
        for ranks in sizes:
            if ranks > max_ranks or (only is not None and ranks not in only):
                continue
            if ranks <= max_message_ranks or (what != "allreduce" and ranks <= 16):
                out.append(Case(what, topology, ranks, "message"))
            out.append(Case(what, topology, ranks, "collective"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-message-ranks", type=int, default=512,
                        help="largest run at the message level (default 512)")
    parser.add_argument("--max-ranks", type=int, default=131072,
                        help="largest run at all (default 131072)")
    parser.add_argument("--ranks", help="only these rank counts, e.g. 16384,131072")
    args = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")
    print(f"{'case':<10} {'topology':<8} {'ranks':>7} {'level':<10} {'messages':>14} "
          f"{'wall s':>8} {'msgs/s':>11} {'peak MiB':>9} {'simulated s':>13} "
          f"{'speed-up':>9} {'diff':>9} {'build s':>8}")
    message_runs: dict[tuple[str, str, int], Outcome] = {}
    only = None if args.ranks is None else {int(text) for text in args.ranks.split(",")}
    for case in cases(args.max_message_ranks, args.max_ranks, only):
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as worker:
            outcome = worker.submit(run_case, case).result()
        key = (case.what, case.topology, case.ranks)
        speedup = diff = ""
        if case.level == "message":
            message_runs[key] = outcome
        elif key in message_runs:
            base = message_runs[key]
            speedup = f"{base.wall / outcome.wall:.0f}x"
            diff = f"{(outcome.simulated - base.simulated) / base.simulated:+.1e}"
        rate = outcome.messages / outcome.wall if outcome.wall > 0 else float("inf")
        print(f"{case.what:<10} {case.topology:<8} {case.ranks:>7} {case.level:<10} "
              f"{outcome.messages:>14,} {outcome.wall:>8.3f} {rate:>11,.0f} "
              f"{outcome.peak_mib:>9.0f} {outcome.simulated:>13.6g} {speedup:>9} {diff:>9} "
              f"{outcome.build:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
