"""How well a fitted random variation predicts the spread of real runs on this machine.

In one group of local processes, ``--rounds`` times in turn: a calibration round
(``realcomm.calibrate.measure``) and a round of ``ring_allreduce`` at each size with every
run timed (``realcomm bench -I -a 3``: each run's time is the slowest rank's). Then:

1. the calibration, per-size median over its rounds, is fitted into a topology (as
   ``simcomm fit`` does): the typical run;
2. the even runs of every round fit the variation (``simcomm.spread_fit``, as ``simcomm
   fit-spread`` does): a lognormal delay and a lognormal slowdown of every message;
3. the simulated median and 90th percentile of each size, under the fitted variation, are
   compared with those of the fitting runs and with those of the odd runs, which the fit
   never saw.

Taking turns puts the machine's slow spells on the calibration and the timed runs alike;
taking every other run for the fit puts them on both halves of the runs alike. (Whole
rounds for the fit and the check were tried first: the halves then differed by up to 90%
from each other, the machine moving between rounds, and the check measured that.)

    python benchmarks/spread.py [--nprocs 2] [--rounds 6] [-n 40] [--sizes 1MiB,16MiB,64MiB]

Target: simulated p50 and p90 within 15% of the measured ones at 1, 16 and 64 MiB.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import torch

from algorithms.harness.bench import BenchConfig, BenchRow, bench_config, parse_sizes
from realcomm.bench import RunOptions, bench_rank
from realcomm.calibrate import DEFAULT_SIZES, Measurements, combine, measure
from realcomm.launch import spawn
from simcomm.bench import bench_size
from simcomm.calibration import parse_calibration
from simcomm.spread_fit import PERCENTILES, fit_spread
from simcomm.variation import Variation

ALGORITHM = "ring_allreduce"


def rounds_on_rank(rounds: int, config: BenchConfig, iters: int
                   ) -> list[tuple[Measurements, list[BenchRow]]]:
    """One rank's part: calibration rounds and rounds of every run timed, in turn."""
    options = RunOptions(iters=iters, average=3, per_iteration=True)
    return [(measure(DEFAULT_SIZES, iters, timing="median"),
             bench_rank(config, options, torch.device("cpu"))) for _ in range(rounds)]


def runs_of(rounds: list[list[BenchRow]], parity: int) -> dict[int, list[float]]:
    """The seconds of every other run (the even ones, or the odd ones) by size, over
    ``rounds``."""
    runs: dict[int, list[float]] = {}
    for rows in rounds:
        for row in rows:
            assert row.spread is not None
            runs.setdefault(row.size, []).extend(t / 1e6 for t in row.spread.runs_us[parity::2])
    return runs


def compare(fitted: Variation, run, held_out: dict[int, list[float]],
            fitting: dict[int, list[float]], samples: int) -> list[str]:
    """Each size's held-out percentiles beside the simulated ones and beside the fitting
    runs' own (how far the machine itself moved between the two halves)."""
    lines = []
    for size, times in sorted(held_out.items()):
        simulated = [run(size, replace(fitted, seed=seed)) for seed in range(samples)]
        cells = []
        for q in PERCENTILES:
            m, s, f = (np.percentile(x, q) for x in (times, simulated, fitting[size]))
            cells.append(f"p{q} {m * 1e3:8.3f} ms: simulated {(s / m - 1) * 100:+6.1f}%, "
                         f"fitting runs {(f / m - 1) * 100:+6.1f}%")
        lines.append(f"{size:>10} B  {len(times):4d} runs  " + "   ".join(cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6,
                        help="calibration and timing rounds, in turn")
    parser.add_argument("-n", "--iters", type=int, default=40, help="timed runs a round")
    parser.add_argument("--sizes", default="1MiB,16MiB,64MiB")
    parser.add_argument("--samples", type=int, default=200, help="seeded runs a size")
    args = parser.parse_args()
    config = bench_config(ALGORITHM, parse_sizes(args.sizes))
    rounds = spawn(rounds_on_rank, args.nprocs, (args.rounds, config, args.iters))[0]
    calibration = parse_calibration(combine([c for c, _ in rounds]).to_json())
    print(calibration.format())
    topology = calibration.topology()
    fitting = runs_of([rows for _, rows in rounds], 0)
    held_out = runs_of([rows for _, rows in rounds], 1)

    def run(size: int, variation: Variation) -> float:
        return bench_size(config, topology, size, variation=variation).time_us / 1e6
    fit = fit_spread(run, fitting, args.samples)
    print()
    print(f"{ALGORITHM} on {args.nprocs} processes, fitted to the even runs of every round:")
    print(fit.format())
    print()
    print("the odd runs, which the fit did not see, against the simulated runs and against "
          "the even runs:")
    print("\n".join(compare(fit.variation, run, held_out, fitting, args.samples)))


if __name__ == "__main__":
    main()
