"""How well a calibrated simulator predicts real runs on this machine.

In one group of local processes, ``--rounds`` times in turn:

1. a calibration round: ``realcomm.calibrate.measure`` times exchanges, one-way messages and
   local reductions (none of the collectives below);
2. a validation round: ``realcomm.bench`` times each collective at each size, as
   ``realcomm bench`` does.

The calibration is the per-size median over its rounds (``realcomm.calibrate.combine``),
written as a measurements file as ``realcomm calibrate`` writes one and fitted into a
topology file by ``simcomm fit``; the measured time of a collective at a size is the median
over its rounds. Taking turns puts a slow spell of a busy machine on one round of
each rather than on the whole calibration or on one collective. ``simcomm validate`` then
simulates the same collectives and sizes on the calibrated topology and prints measured and
simulated times, the errors, and per collective the median, geometric-mean and largest
absolute error.

    python benchmarks/calibration.py [--nprocs 2] [--rounds 5] [--timing median] [--out DIR]

Target (on a 2-core machine, gloo, 2 processes, 64 KiB to 64 MiB): median error <= 10% and
no size off by more than 25%.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from algorithms.harness.bench import (
    BenchConfig, BenchRow, bench_config, format_rows, parse_size, size_range,
)
from realcomm.bench import TIMINGS, RunOptions, bench_rank
from realcomm.calibrate import DEFAULT_SIZES, Measurements, combine, measure
from realcomm.launch import spawn

COLLECTIVES = ("ring_allreduce", "reduce_broadcast_allreduce", "alltoall_allreduce",
               "reduce_scatter", "all_gather")

Round = tuple[Measurements, dict[str, list[BenchRow]]]


def rounds_on_rank(rounds: int, configs: list[BenchConfig], iters: int, timing: str
                   ) -> list[Round]:
    """One rank's part: calibration and validation rounds in turn."""
    options = RunOptions(iters=iters, timing=timing)
    out = []
    for r in range(rounds):
        calibration = measure(DEFAULT_SIZES, iters, timing=timing)
        # Start each round at another collective, so none is always first.
        turn = configs[r % len(configs):] + configs[:r % len(configs)]
        rows = {c.collective.name: bench_rank(c, options, torch.device("cpu")) for c in turn}
        out.append((calibration, rows))
    return out


def median_rows(runs: list[list[BenchRow]]) -> list[BenchRow]:
    """Per size, the row whose time is the median over the runs (the lower middle one)."""
    return [sorted(rows, key=lambda row: row.time_us)[(len(rows) - 1) // 2]
            for rows in zip(*runs)]


def spread(runs: list[list[BenchRow]]) -> str:
    """Per size, the slowest round's time over the fastest's: how much the machine moved."""
    return " ".join(f"{max(r.time_us for r in rows) / min(r.time_us for r in rows):.2f}"
                    for rows in zip(*runs))


def simcomm(*args: str) -> str:
    """Run a ``simcomm`` command; its output, or exit with its error."""
    done = subprocess.run([sys.executable, "-m", "simcomm", *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"simcomm {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--out", default="calibration", help="folder for the files")
    parser.add_argument("-b", "--minbytes", default="64K")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-n", "--iters", type=int, default=50, help="timed runs per size")
    parser.add_argument("--rounds", type=int, default=5,
                        help="calibration and validation rounds, in turn")
    parser.add_argument("--timing", default="median", choices=TIMINGS,
                        help="statistic of the timed runs, for calibration and validation alike")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # What realcomm bench --algorithm NAME -b MIN -e MAX -f 4 runs, for each collective.
    sizes = size_range(parse_size(args.minbytes), parse_size(args.maxbytes), 4)
    configs = [bench_config(name, sizes) for name in COLLECTIVES]
    rounds = spawn(rounds_on_rank, args.nprocs, (args.rounds, configs, args.iters,
                                                 args.timing))[0]
    calibration = combine([c for c, _ in rounds])
    measurements = out / f"calibration_{args.nprocs}.json"
    measurements.write_text(calibration.to_json())
    topology = out / f"calibrated_{args.nprocs}.toml"
    print(simcomm("fit", str(measurements), "--out", str(topology)), end="")
    exchange_spread = [max(c.exchange[i] for c, _ in rounds) / min(c.exchange[i] for c, _ in rounds)
                       for i in range(len(calibration.sizes))]
    print(f"exchange, slowest round / fastest, per size: "
          f"{' '.join(f'{x:.2f}' for x in exchange_spread)} "
          f"(median {statistics.median(exchange_spread):.2f})")
    measured = []
    for name in COLLECTIVES:
        runs = [rows[name] for _, rows in rounds]
        print(f"{name}, slowest round / fastest, per size: {spread(runs)}")
        csv = out / f"measured_{name}_{args.nprocs}.csv"
        csv.write_text(format_rows(median_rows(runs), "csv", []))
        measured += ["--measured", f"{name}={csv}"]
    print(simcomm("validate", "--topology", str(topology), *measured, "--plot",
                  str(out / f"validation_{args.nprocs}.png")))


if __name__ == "__main__":
    main()
