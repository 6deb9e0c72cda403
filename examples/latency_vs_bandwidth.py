"""Below which size does a latency-bound all-reduce beat the ring, and what sets that size?

Whole-buffer all-to-all (one step) and flat reduce+broadcast (two steps) pay few latencies
but move the whole buffer many times; ring all-reduce pays 2(p-1) latencies and moves the
least data. In the alpha-beta model every time is a + b*n, so the crossover size
n* = (a_ring - a_other) / (b_other - b_ring) is proportional to the latency alpha and to the
bandwidth B: to alpha*B, the bytes a link could send during one latency. This example finds
n* by bisection on simulated times over a grid of latencies and bandwidths and prints
n* / (alpha*B), the same number on every row.

Run: python examples/latency_vs_bandwidth.py [--ranks 8] [--topology switch]
     [--latencies 0.5us,1us,2us,5us,10us,20us,50us] [--bandwidths 25GB/s,100GB/s,400GB/s]
     [--out DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from algorithms import alltoall_allreduce, reduce_broadcast_allreduce, ring_allreduce
from simcomm import SizeOnly, Topology, make_topology, parse_bandwidth, parse_seconds, simulate

CHALLENGERS = {"all-to-all": alltoall_allreduce, "reduce+bcast": reduce_broadcast_allreduce}
LARGEST = 2**40  # bytes; no crossover below this means the ring never wins


def human(nbytes: float) -> str:
    """Bytes in binary units with one decimal: 14464 -> 14.1KiB."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def time_of(algorithm: Callable[..., Any], topology: Topology, count: int) -> float:
    inputs = [SizeOnly(count, "float32")] * topology.size
    return simulate(algorithm, inputs, topology, record=False).time


def crossover(challenger: Callable[..., Any], topology: Topology) -> int | None:
    """Smallest float32 buffer, in bytes and a multiple of 4p, on which the ring is at
    least as fast as ``challenger``; None if there is none up to ``LARGEST``."""
    p = topology.size

    def ring_wins(k: int) -> bool:
        return time_of(ring_allreduce, topology, k * p) <= time_of(challenger, topology, k * p)

    low, high = 0, 1  # the ring loses at k = low (no data: it only pays more latencies)
    while not ring_wins(high):
        low, high = high, high * 2
        if high * p * 4 > LARGEST:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if ring_wins(middle) else (middle, high)
    return high * p * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--topology", default="switch", help="a builder: ring, switch, ...")
    parser.add_argument("--latencies", default="0.5us,1us,2us,5us,10us,20us,50us")
    parser.add_argument("--bandwidths", default="25GB/s,100GB/s,400GB/s")
    parser.add_argument("--out", type=Path, help="folder for a PNG of n* against latency")
    args = parser.parse_args()
    latencies = args.latencies.split(",")
    bandwidths = args.bandwidths.split(",")

    print(f"{args.ranks} ranks, {args.topology}; n* = smallest buffer on which ring "
          "all-reduce is at least as fast; (x) = n* / (latency x bandwidth)")
    print(f"{'latency':>8} {'bandwidth':>10} "
          + " ".join(f"{'n* vs ' + name:>24}" for name in CHALLENGERS))
    found: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for bandwidth in bandwidths:
        for latency in latencies:
            alpha, rate = parse_seconds(latency), parse_bandwidth(bandwidth)
            topology = make_topology(args.topology, args.ranks, rate, alpha)
            cells = []
            for name, challenger in CHALLENGERS.items():
                size = crossover(challenger, topology)
                if size is None:
                    cells.append(f"{'never':>24}")
                    continue
                found.setdefault((name, bandwidth), []).append((alpha, size))
                cells.append(f"{human(size):>14} ({size / (alpha * rate):5.2f})")
            print(f"{latency:>8} {bandwidth:>10} " + " ".join(f"{c:>24}" for c in cells))
    print("alpha-beta fit of the simulated times, t = a + b*n (alpha = latency, "
          "B = bandwidth):")
    explain(args.ranks, args.topology)
    if args.out:
        path = plot(found, args.out / "latency_vs_bandwidth.png",
                    f"ring all-reduce crossover, {args.ranks} ranks, {args.topology}")
        print(f"wrote {path}")


def explain(ranks: int, kind: str) -> None:
    """Fit a + b*n to each algorithm's simulated times and print the crossover they give."""
    alpha, rate = 1e-6, 1e11
    topology = make_topology(kind, ranks, rate, alpha)
    counts = (ranks * 2**10, ranks * 2**20)  # float32 elements, divisible by the ranks
    fits = {}
    for name, algorithm in {"ring": ring_allreduce, **CHALLENGERS}.items():
        small, large = (time_of(algorithm, topology, count) for count in counts)
        per_byte = (large - small) / (4 * (counts[1] - counts[0]))
        fits[name] = (small - per_byte * 4 * counts[0], per_byte)
        print(f"  {name:>12}: t = {fits[name][0] / alpha:5.2f} alpha + "
              f"{fits[name][1] * rate:5.2f} n/B")
    ring_a, ring_b = fits["ring"]
    for name in CHALLENGERS:
        a, b = fits[name]
        print(f"  ring vs {name}: n* / (latency x bandwidth) = (a_ring - a) / (b - b_ring) "
              f"= {(ring_a - a) / (b - ring_b) / (alpha * rate):.3f}")


def plot(found: dict[tuple[str, str], list[tuple[float, int]]], path: Path, title: str
         ) -> Path:
    """Crossover size against latency, one line per challenger and bandwidth."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    colors: dict[str, str] = {}
    for (name, bandwidth), points in found.items():
        axes.plot([alpha * 1e6 for alpha, _ in points], [size for _, size in points],
                  marker="o", linestyle="-" if name == "all-to-all" else "--",
                  color=colors.setdefault(bandwidth, f"C{len(colors)}"),
                  label=f"ring vs {name}, {bandwidth}")
    axes.set_xscale("log")
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: human(y)))
    axes.set_xlabel("latency (us)")
    axes.set_ylabel("crossover size n* (bytes)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


if __name__ == "__main__":
    main()
