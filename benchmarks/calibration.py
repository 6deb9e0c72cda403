"""How well a calibrated simulator predicts real runs on this machine.

1. calibration run: ``realcomm calibrate`` measures exchanges, one-way messages and local
   reductions and writes a topology file;
2. validation runs, separate: ``realcomm bench`` times each collective at each size,
   ``--repeats`` times, and the median time per size counts (one run of 20 iterations on a
   busy 2-core machine can be off by 2x);
3. ``simcomm validate`` simulates the same collectives and sizes on the calibrated topology
   and prints measured and simulated times, the errors, and per collective the median,
   geometric-mean and largest absolute error.

    python benchmarks/calibration.py [--nprocs 2] [--repeats 5] [--out DIR]

Target (on a 2-core machine, gloo, 2 processes, 64 KiB to 64 MiB): median error <= 10% and
no size off by more than 25%.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

COLLECTIVES = ("ring_allreduce", "reduce_broadcast_allreduce", "alltoall_allreduce",
               "reduce_scatter", "all_gather")


def run(*args: str) -> str:
    """Run a command of this project; its stdout, or exit with its error."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def median_rows(runs: list[list[str]]) -> str:
    """Bench CSVs of repeated runs as one: per size, the row of the median time."""
    header, *first = runs[0]
    time_column = header.split(",").index("time_us")
    lines = [header]
    for i in range(len(first)):
        rows = sorted((r[i + 1] for r in runs), key=lambda row: float(row.split(",")[time_column]))
        lines.append(rows[len(rows) // 2])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--out", default="calibration", help="folder for the files")
    parser.add_argument("-b", "--minbytes", default="64K")
    parser.add_argument("-e", "--maxbytes", default="64M")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed runs per size")
    parser.add_argument("--repeats", type=int, default=5,
                        help="validation runs per collective; the median time per size counts")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    topology = out / f"calibrated_{args.nprocs}.toml"
    print(run("realcomm", "calibrate", "--nprocs", str(args.nprocs), "--out", str(topology),
              "-n", str(args.iters)))
    measured = []
    for name in COLLECTIVES:
        runs = [run("realcomm", "bench", "--nprocs", str(args.nprocs), "--algorithm", name,
                    "-b", args.minbytes, "-e", args.maxbytes, "-f", "4", "--format", "csv",
                    "-n", str(args.iters)).splitlines() for _ in range(args.repeats)]
        csv = out / f"measured_{name}_{args.nprocs}.csv"
        csv.write_text(median_rows(runs))
        measured += ["--measured", f"{name}={csv}"]
    print(run("simcomm", "validate", "--topology", str(topology), *measured,
              "--plot", str(out / f"validation_{args.nprocs}.png")))


if __name__ == "__main__":
    main()
