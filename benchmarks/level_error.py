"""How far the collective level is from the message level, collective by collective.

For each topology and collective the table gives the collective level's relative error
against the message level (collective / message - 1) over sizes from 8 B to 256 MiB per
rank: the least, the median and the largest, and whether the collective level called its
times exact. Where it says exact, every error must be zero to rounding; elsewhere the
figures are the model's measured error (the NCCL-class collectives are timed by the
tuner's estimate).

    python benchmarks/level_error.py [--max-bytes 256MiB]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import algorithms
from algorithms.harness.units import parse_bytes
from simcomm import SizeOnly, simulate
from simcomm.presets import make_preset

TOPOLOGIES = ["dgx-h100", "dgx-a100", "cluster-h100:nodes=2", "cluster-h100:nodes=4",
              "fattree-h100:nodes=4,oversubscription=2"]
CASES = [  # (algorithm, params)
    ("ring_allreduce", {}), ("reduce_scatter", {}), ("all_gather", {}),
    ("reduce_broadcast_allreduce", {"tree": True}),
    ("nccl_allreduce", {}), ("nccl_allreduce", {"algorithm": "ring"}),
    ("nccl_allreduce", {"algorithm": "tree"}), ("nccl_reduce_scatter", {}),
    ("nccl_all_gather", {}), ("nvls_allreduce", {}), ("hierarchical_allreduce", {}),
    ("nvls_tree_allreduce", {}), ("nvls_reduce_scatter", {}), ("nvls_all_gather", {}),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", default="256MiB", help="largest size per rank")
    args = parser.parse_args()
    try:
        largest = parse_bytes(args.max_bytes)
    except ValueError as error:
        print(f"level_error.py: error: --max-bytes: {error}", file=sys.stderr)
        return 2
    sizes = [8 * 4**k for k in range(40) if 8 * 4**k <= largest]
    print(f"{'topology':<40} {'collective':<40} {'least':>8} {'median':>8} {'largest':>8} "
          f"{'exact':>6}")
    for spec in TOPOLOGIES:
        topology = make_preset(spec)
        for name, params in CASES:
            function = getattr(algorithms, name)
            errors, exact = [], set()
            for nbytes in sizes:
                inputs = [SizeOnly(nbytes // 4, np.float32)] * topology.size
                try:
                    collective = simulate(function, inputs, topology, level="collective",
                                          **params)
                except ValueError:
                    break  # no model here (NVLS across nodes, say)
                message = simulate(function, inputs, topology, record=False, **params)
                errors.append(collective.time / message.time - 1 if message.time else 0.0)
                exact.add(collective.exact)
            if errors:
                label = name + "".join(f" {k}={v}" for k, v in params.items())
                print(f"{spec:<40} {label:<40} {min(errors):>+8.1%} "
                      f"{statistics.median(errors):>+8.1%} {max(errors):>+8.1%} "
                      f"{'/'.join(sorted(str(e).lower() for e in exact)):>6}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
