"""realcomm on a CUDA GPU: every collective checked, a local reduction's rate, DDP and FSDP.

Runs the GPU checks that no test can (the tests run on CPUs alone), on however many GPUs the
machine has; with fewer GPUs than ranks the ranks share them. Prints its results and writes
them, with the versions, to ``--out`` as JSON.

1. Every built-in collective with its data checked (``realcomm bench --check``), at a few
   sizes, in groups of several configurations: NCCL at world size 1, gloo on CUDA tensors at
   2 and 4, and NCCL with two and four ranks on one GPU (``NCCL_MULTI_RANK_GPU_ENABLE=1``,
   NCCL 2.30 and newer); each group also times torch's own collectives (``--baseline
   native``). A group that cannot start says why.
2. The GPU's local reduction rate: an in-place add of two buffers, float32 and bfloat16,
   1 MiB to 1 GiB, as bytes of one buffer per second (the presets' ``reduce_bandwidth``
   unit) and as bytes read and written per second.
3. realcomm's DDP (``BucketedAllreduce``) and FSDP (``FullyShardedSequential``) on CUDA
   tensors against torch's ``DistributedDataParallel`` and ``fully_shard``.

    python benchmarks/gpu_check.py --out gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from algorithms.harness.bench import bench_config, parse_sizes
from algorithms.harness.catalog import COLLECTIVES
from realcomm import Driver, spawn
from realcomm.bench import RunOptions, bench_rank
from realcomm.ddp import BucketedAllreduce
from realcomm.fsdp import FullyShardedSequential

# (name, backend, ranks, environment): the process groups item 1 runs.
GROUPS = (
    ("nccl-1", "nccl", 1, {}),
    ("gloo-cuda-2", "gloo", 2, {}),
    ("gloo-cuda-4", "gloo", 4, {}),
    ("nccl-shared-2", "nccl", 2, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}),
    ("nccl-shared-4", "nccl", 4, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}),
)
# One collective of each kind also timed against torch's own.
NATIVE_OF_KIND = ("ring_allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                  "all_to_all")
GROUP_TIMEOUT = 90.0  # seconds: a silent peer ends a group's run, not the whole check


def versions() -> dict[str, Any]:
    """The software and the device."""
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "devices": torch.cuda.device_count(), "python": sys.version.split()[0]}


def every_collective(sizes: list[int], device: torch.device) -> list[dict[str, Any]]:
    """On every rank: each built-in collective, checked, then torch's own of each kind.
    Rank 0 returns a row per size (or the error that stopped a collective)."""
    options = RunOptions(warmup_iters=2, iters=5, timeout=GROUP_TIMEOUT)
    native = RunOptions(warmup_iters=2, iters=5, timeout=GROUP_TIMEOUT, baseline="native")
    runs = [(name, options) for name in COLLECTIVES]
    runs += [(name, native) for name in NATIVE_OF_KIND]
    results = []
    for name, run_options in runs:
        label = name if run_options.baseline == "none" else f"native {name}"
        try:
            config = bench_config(name, sizes, check=True)
            rows = bench_rank(config, run_options, device)
        except Exception as error:  # noqa: BLE001 - each collective's outcome is a result
            results.append({"collective": label, "error": f"{type(error).__name__}: {error}"})
            continue
        results += [{"collective": label, **asdict(row)} for row in rows]
    return results


def run_group(backend: str, ranks: int, environment: dict[str, str],
              sizes: list[int]) -> list[dict[str, Any]]:
    """Item 1 for one process group, or the one error that kept it from running."""
    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    try:
        return spawn(every_collective, ranks, (sizes, torch.device("cuda")), device="cuda",
                     backend=backend, timeout=GROUP_TIMEOUT)[0]
    except Exception as error:  # noqa: BLE001 - a refused group is a result too
        return [{"error": f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"}]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reduction_rates(sizes: list[int]) -> list[dict[str, Any]]:
    """Item 2: seconds of ``a.add_(b)`` per buffer size and dtype (CUDA events, the mean of
    20 after 3 warm-ups)."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for size in sizes:
            a = torch.ones(size // dtype.itemsize, dtype=dtype, device="cuda")
            b = torch.ones_like(a)
            for _ in range(3):
                a.add_(b)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                a.add_(b)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / 20
            rows.append({"dtype": str(dtype).removeprefix("torch."), "bytes": size,
                         "us": seconds * 1e6, "buffer_GBps": size / seconds / 1e9,
                         "traffic_GBps": 3 * size / seconds / 1e9})
            del a, b
    return rows


def small_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 64), torch.nn.LayerNorm(64), torch.nn.Tanh(),
        torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)).cuda()


def batches(seed: int, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 10, generator=generator).cuda(),
             torch.randint(0, 3, (rows,), generator=generator).cuda()) for _ in range(4)]


def ddp_against_torch() -> float:
    """On every rank: train realcomm's DDP and torch's side by side; the largest parameter
    difference after four steps."""
    from torch.nn.parallel import DistributedDataParallel

    ours, theirs = small_model(), small_model()
    sync = BucketedAllreduce(ours, Driver(), bucket_cap=4096, first_bucket_cap=512)
    reference = DistributedDataParallel(theirs)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, reference)]
    for inputs, targets in batches(100 + dist.get_rank(), 8):
        torch.nn.functional.cross_entropy(ours(inputs), targets).backward()
        sync.finish()
        torch.nn.functional.cross_entropy(reference(inputs), targets).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    sync.close()
    return max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))


def fsdp_against_torch() -> float:
    """On every rank: train realcomm's FSDP and torch's ``fully_shard`` on the same shards;
    the largest difference of losses and full parameters after four steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    ours = FullyShardedSequential(small_model(), forward_prefetch=True)
    theirs = small_model()
    mesh = init_device_mesh("cuda", (world,))
    for layer in theirs:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    worst = 0.0
    for inputs, targets in batches(7, 4 * world):
        mine = slice(rank * 4, (rank + 1) * 4)
        our_loss = ours.train_step(inputs[mine], targets[mine],
                                   torch.nn.functional.cross_entropy)
        their_loss = torch.nn.functional.cross_entropy(theirs(inputs[mine]), targets[mine])
        their_loss.backward()
        worst = max(worst, abs(our_loss - their_loss.item()))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    full = zip(ours.full_parameters(), (p.full_tensor() for p in theirs.parameters()))
    return max(worst, *((a - b).abs().max().item() for a, b in full))


def training(backend: str, ranks: int, environment: dict[str, str]) -> dict[str, Any]:
    """Item 3 in one process group: the largest differences from torch, or the error."""
    os.environ.update(environment)
    result: dict[str, Any] = {}
    for name, fn in (("ddp", ddp_against_torch), ("fsdp", fsdp_against_torch)):
        try:
            result[name] = max(spawn(fn, ranks, device="cuda", backend=backend,
                                     timeout=GROUP_TIMEOUT))
        except Exception as error:  # noqa: BLE001 - a failure is a result too
            result[name] = f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"
    for key in environment:
        os.environ.pop(key, None)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB", help="item 1's sizes")
    parser.add_argument("--groups", default=",".join(g[0] for g in GROUPS),
                        help="which of item 1's process groups to run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check.py: this machine has no CUDA device", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"versions": versions()}
    print(json.dumps(report["versions"]), flush=True)
    sizes = parse_sizes(args.sizes)
    wanted = args.groups.split(",")
    report["collectives"] = {}
    for name, backend, ranks, environment in GROUPS:
        if name not in wanted:
            continue
        began = time.perf_counter()
        rows = run_group(backend, ranks, environment, sizes)
        report["collectives"][name] = rows
        wrong = sum(row.get("wrong") or 0 for row in rows)
        errors = [row for row in rows if "error" in row]
        print(f"\n## {name}: {len(rows) - len(errors)} rows, {wrong} wrong elements, "
              f"{len(errors)} errors, {time.perf_counter() - began:.0f} s", flush=True)
        for row in rows:
            if "error" in row:
                print(f"  {row.get('collective', '(group)')}: {row['error']}")
            else:
                print(f"  {row['collective']:34} {row['size']:>10} B {row['time_us']:>10.1f} us"
                      f" busbw {row['busbw_GBps']:7.2f} GB/s wrong {row['wrong']} {row['algo']}")
        json.dump(report, open(args.out, "w"), indent=1)
    report["reduction"] = reduction_rates([2**k for k in range(20, 31, 2)])
    print("\n## in-place add a += b")
    for row in report["reduction"]:
        print(f"  {row['dtype']:9} {row['bytes']:>11} B {row['us']:9.1f} us  one buffer "
              f"{row['buffer_GBps']:7.1f} GB/s  read+written {row['traffic_GBps']:7.1f} GB/s")
    json.dump(report, open(args.out, "w"), indent=1)
    report["training"] = {}
    for name, backend, ranks, environment in GROUPS:
        if name not in wanted or ranks > 2:  # world sizes 1 and 2 are enough here
            continue
        report["training"][name] = training(backend, ranks, environment)
        print(f"\n## DDP and FSDP, {name}: {report['training'][name]}", flush=True)
    json.dump(report, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
