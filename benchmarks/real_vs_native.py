"""Our ring all-reduce over realcomm against torch's own all_reduce, in the same processes.

Both run through realcomm's bench harness (nccl-tests' timing: warm-up runs, a barrier,
``-n`` timed runs, the mean averaged over ranks), alternating which goes first, ``--repeats``
times per size. The table gives the median time of each and the ratio of the medians, with
the smallest and largest ratio of one repeat to show the noise, and the CPU time one run
costs a process (all its threads, rank 0), which other people's load disturbs less than
the wall time. Run it on a quiet machine: on a shared one the spread is wide.

    python benchmarks/real_vs_native.py --nprocs 2 --sizes 1MiB,4MiB,16MiB,64MiB
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from algorithms.harness.bench import bench_config, parse_size, parse_sizes
from realcomm.bench import ITERS, WARMUP_ITERS, make_runner, time_runs
from realcomm.driver import DEFAULT_SLICE_BYTES, Driver
from realcomm.launch import spawn


def measure(sizes: list[int], repeats: int, warmup: int, iters: int, slice_bytes: int
            ) -> dict[int, dict[str, list[float]]]:
    """On rank 0: seconds per all-reduce, ours and native, ``repeats`` times per size, and
    the CPU seconds of this process per run (keys ``ours cpu`` and ``native cpu``)."""
    config = bench_config("ring_allreduce", sizes)  # float32, sum
    driver = Driver(slice_bytes=slice_bytes)
    device = torch.device("cpu")
    times: dict[int, dict[str, list[float]]] = {
        s: {key: [] for key in ("ours", "native", "ours cpu", "native cpu")} for s in sizes}
    for repeat in range(repeats):
        for size in sizes:
            x = torch.ones(size // 4)
            order = ("ours", "native") if repeat % 2 == 0 else ("native", "ours")
            for which in order:
                run = make_runner(config, "none" if which == "ours" else "native", driver, x)
                cpu = time.process_time()
                times[size][which].append(time_runs(run, warmup, iters, device))
                # time_runs makes 1 + warmup + iters runs
                times[size][f"{which} cpu"].append(
                    (time.process_time() - cpu) / (1 + warmup + iters))
                x.fill_(1)
    return times if dist.get_rank() == 0 else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-w", "--warmup_iters", type=int, default=WARMUP_ITERS)
    parser.add_argument("-n", "--iters", type=int, default=ITERS)
    parser.add_argument("--slice-bytes", default=str(DEFAULT_SLICE_BYTES))
    args = parser.parse_args()
    sizes = list(parse_sizes(args.sizes))
    load_before = os.getloadavg()[0]
    times = spawn(measure, args.nprocs, (sizes, args.repeats, args.warmup_iters, args.iters,
                                         parse_size(args.slice_bytes)))[0]
    load_after = os.getloadavg()[0]
    print(f"# ring_allreduce over realcomm vs torch all_reduce: gloo, {args.nprocs} processes, "
          f"float32, {args.repeats} repeats of {args.iters} timed runs after "
          f"{args.warmup_iters} warm-up runs, slice_bytes {args.slice_bytes}")
    print(f"# load average (1 min) before {load_before:.2f}, after {load_after:.2f}, on "
          f"{os.cpu_count()} cores")
    print("| size | ours (ms) | native (ms) | ratio | ratio range | CPU ours (ms) | "
          "CPU native (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        ours, native = times[size]["ours"], times[size]["native"]
        ratios = [o / n for o, n in zip(ours, native)]
        print(f"| {size // 2**20} MiB | {statistics.median(ours) * 1e3:.2f} | "
              f"{statistics.median(native) * 1e3:.2f} | "
              f"{statistics.median(ours) / statistics.median(native):.2f} | "
              f"{min(ratios):.2f}-{max(ratios):.2f} | "
              f"{statistics.median(times[size]['ours cpu']) * 1e3:.2f} | "
              f"{statistics.median(times[size]['native cpu']) * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
