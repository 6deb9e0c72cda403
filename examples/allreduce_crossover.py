"""Which all-reduce wins on 8 GPUs, and at what size does the winner change?

Ring all-reduce moves the least data per GPU but pays 2(p-1) latencies; the flat
reduce+broadcast pays two latencies but funnels everything through the root; the whole-buffer
all-to-all pays one latency but sends p-1 full copies. Small messages are latency-bound,
large ones bandwidth-bound, so the winner changes with size.

Run: python examples/allreduce_crossover.py [--topology switch] [--bandwidth 100GB/s] [--latency 5us]
"""

from __future__ import annotations

import argparse

from algorithms import alltoall_allreduce, reduce_broadcast_allreduce, ring_allreduce
from simcomm import SizeOnly, make_topology, parse_bandwidth, parse_seconds, simulate
from simcomm.units import format_bytes

ALGORITHMS = {
    "ring": ring_allreduce,
    "reduce+broadcast": reduce_broadcast_allreduce,
    "all-to-all": alltoall_allreduce,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--topology", default="switch")
    parser.add_argument("--bandwidth", default="100GB/s")
    parser.add_argument("--latency", default="5us")
    args = parser.parse_args()
    topology = make_topology(args.topology, args.ranks, parse_bandwidth(args.bandwidth),
                             parse_seconds(args.latency))
    print(f"{args.ranks} ranks, {args.topology}, {args.bandwidth} per link, "
          f"{args.latency} latency; times in microseconds")
    print(f"{'size':>8} " + " ".join(f"{name:>17}" for name in ALGORITHMS) + "  winner")
    for exponent in range(10, 31, 2):  # 1 KiB .. 1 GiB
        nbytes = 2**exponent
        inputs = [SizeOnly(nbytes // 4, "float32")] * args.ranks
        times = {name: simulate(fn, inputs, topology, record=False).time
                 for name, fn in ALGORITHMS.items()}
        winner = min(times, key=times.get)
        print(f"{format_bytes(nbytes):>8} "
              + " ".join(f"{t * 1e6:17.1f}" for t in times.values()) + f"  {winner}")


if __name__ == "__main__":
    main()
