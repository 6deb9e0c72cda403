"""How badly does a master GPU slow down an all-reduce as the number of GPUs grows?

Flat reduce+broadcast (PyTorch's old DataParallel pattern) sends every buffer to one root
and every copy back from it. On a switch each GPU has one link up and one link down, so the
root's down-link carries (p-1)n during the reduce and its up-link (p-1)n during the
broadcast: the time grows linearly with p. A binomial tree spreads the load over log2(p)
rounds; ring all-reduce moves 2(p-1)/p n per link and stays near 2n/B. The per-link
statistics of each run name the hot link and how many buffers it carried.

Run: python examples/master_gpu_bottleneck.py [--size 64MiB] [--bandwidth 100GB/s]
     [--latency 5us] [--ranks 2,4,8,16,32,64] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from algorithms import reduce_broadcast_allreduce, ring_allreduce
from simcomm import SizeOnly, parse_bandwidth, parse_bytes, parse_seconds, simulate, switch
from simcomm.summary import busiest_links

ALGORITHMS = {
    "flat reduce+bcast": (reduce_broadcast_allreduce, {}),
    "tree reduce+bcast": (reduce_broadcast_allreduce, {"tree": True}),
    "ring": (ring_allreduce, {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64MiB", help="all-reduced buffer per GPU")
    parser.add_argument("--bandwidth", default="100GB/s", help="each GPU's link, per direction")
    parser.add_argument("--latency", default="5us", help="GPU to GPU through the switch")
    parser.add_argument("--ranks", default="2,4,8,16,32,64", help="comma list of GPU counts")
    parser.add_argument("--out", type=Path, help="folder for a PNG of time against GPUs")
    args = parser.parse_args()
    nbytes, bandwidth = parse_bytes(args.size), parse_bandwidth(args.bandwidth)
    latency = parse_seconds(args.latency)
    counts = [int(p) for p in args.ranks.split(",")]

    print(f"all-reduce of {args.size} float32 on a switch, {args.bandwidth} and {args.latency} "
          "per GPU; times in ms")
    print(f"{'GPUs':>5} " + " ".join(f"{name:>18}" for name in ALGORITHMS)
          + "   flat: busiest links, bytes (n = buffer), busy share of the run")
    times: dict[str, list[float]] = {name: [] for name in ALGORITHMS}
    for p in counts:
        topology = switch(p, bandwidth, latency)
        inputs = [SizeOnly(nbytes // 4, "float32")] * p
        hot = []
        for name, (algorithm, params) in ALGORITHMS.items():
            result = simulate(algorithm, inputs, topology, record=False, **params)
            times[name].append(result.time)
            if name.startswith("flat"):
                hot = busiest_links(result, top=2)
        row = f"{p:>5} " + " ".join(f"{times[name][-1] * 1e3:18.3f}" for name in ALGORITHMS)
        row += "   " + ", ".join(f"{u.src}->{u.dst} {u.bytes / nbytes:.0f}n {u.utilization:.1%}"
                                  for u in hot)
        print(row)
    flat, ring = times["flat reduce+bcast"][-1], times["ring"][-1]
    print(f"\nOn {counts[-1]} GPUs the flat all-reduce takes {flat / ring:.1f}x the ring's time: "
          f"the root's links carry (p-1)n = {counts[-1] - 1}n each way, close to the bound "
          f"2(p-1)n/B = {2 * (counts[-1] - 1) * nbytes / bandwidth * 1e3:.3f} ms.")
    if args.out:
        path = plot(counts, times, args.out / "master_gpu_bottleneck.png",
                    f"{args.size} all-reduce, switch, {args.bandwidth}, {args.latency}")
        print(f"wrote {path}")


def plot(counts: list[int], times: dict[str, list[float]], path: Path, title: str) -> Path:
    """Time against GPU count, one line per algorithm, on log axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for name, values in times.items():
        axes.plot(counts, [t * 1e3 for t in values], marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.set_xticks(counts, [str(p) for p in counts])
    axes.set_yscale("log")
    axes.set_xlabel("GPUs")
    axes.set_ylabel("time (ms)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


if __name__ == "__main__":
    main()
