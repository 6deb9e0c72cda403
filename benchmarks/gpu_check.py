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
   tensors against torch's ``DistributedDataParallel`` and ``fully_shard``, and FSDP
   against one process training on the whole batch, at world sizes 1 and 2.
4. What NCCL groups take to start: the whole spawn, the GPU memory in use, and a driver
   with one channel, with nine, and with nine of one CTA each (``nccl_channel_ctas=1``),
   with CUDA loading every kernel when it starts (as realcomm's launcher has it) and
   loading each at its first launch.

``--groups`` and ``--items`` pick what to run.

    python benchmarks/gpu_check.py --out gpu_check.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from algorithms import ring_channels
from algorithms.harness.bench import bench_config, parse_sizes
from algorithms.harness.catalog import COLLECTIVES
from realcomm import Driver, spawn
from realcomm.bench import RunOptions, bench_rank
from realcomm.ddp import BucketedAllreduce
from realcomm.driver import MODULE_LOADING, cuda_loads_kernels_eagerly
from realcomm.fsdp import FullyShardedSequential
from realcomm.launch import nccl_runtime_version

# (name, backend, ranks, environment): the process groups items 1, 3 and 4 run in.
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
    built = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    runs = nccl_runtime_version() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, runs)) if isinstance(runs, tuple) else runs,
            "nccl_built_against": (".".join(map(str, built)) if isinstance(built, tuple)
                                   else built),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "devices": torch.cuda.device_count(), "python": sys.version.split()[0]}


def every_collective(sizes: list[int], device: torch.device,
                     timeout: float) -> list[dict[str, Any]]:
    """On every rank: each built-in collective, checked, then torch's own of each kind, each
    operation given up after ``timeout`` seconds. Rank 0 prints a line as each collective
    ends (so a run cut short still shows how far it got) and returns a row per size (or the
    error that stopped a collective)."""
    options = RunOptions(warmup_iters=2, iters=5, timeout=timeout)
    native = RunOptions(warmup_iters=2, iters=5, timeout=timeout, baseline="native")
    runs = [(name, options) for name in COLLECTIVES]
    runs += [(name, native) for name in NATIVE_OF_KIND]
    eager = cuda_loads_kernels_eagerly()
    results = []
    for name, run_options in runs:
        label = name if run_options.baseline == "none" else f"native {name}"
        began = time.perf_counter()
        try:
            config = bench_config(name, sizes, check=True)
            rows = bench_rank(config, run_options, device)
        except Exception as error:  # noqa: BLE001 - each collective's outcome is a result
            results.append({"collective": label, "error": f"{type(error).__name__}: {error}"})
            outcome = one_line(error)
        else:
            results += [{"collective": label, "eager_kernel_loading": eager, **asdict(row)}
                        for row in rows]
            outcome = f"{sum(row.wrong or 0 for row in rows)} wrong"
        if dist.get_rank() == 0:
            print(f"  ... {label}: {outcome}, {time.perf_counter() - began:.1f} s", flush=True)
    return results


def run_group(backend: str, ranks: int, environment: dict[str, str], sizes: list[int],
              timeout: float) -> list[dict[str, Any]]:
    """Item 1 for one process group, or the one error that kept it from running."""
    with set_environment(environment):
        try:
            return spawn(every_collective, ranks, (sizes, torch.device("cuda"), timeout),
                         device="cuda", backend=backend, timeout=timeout)[0]
        except Exception as error:  # noqa: BLE001 - a refused group is a result too
            return [{"error": one_line(error)}]


@contextlib.contextmanager
def set_environment(environment: dict[str, str]) -> Iterator[None]:
    """Run with ``environment`` added to this process's (and so the spawned ones'), then
    put back what was there."""
    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def one_line(error: Exception) -> str:
    """An error as one line of at most about 600 characters."""
    return f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"


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


def fsdp_ours() -> tuple[list[float], list[list[float]]]:
    """On every rank: realcomm's FSDP for four steps; the losses and full parameters."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = FullyShardedSequential(small_model(), forward_prefetch=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, targets in batches(7, 4 * world):
        mine = slice(rank * 4, (rank + 1) * 4)
        losses.append(model.train_step(inputs[mine], targets[mine],
                                       torch.nn.functional.cross_entropy))
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.detach().reshape(-1).tolist() for p in model.full_parameters()]


def fsdp_torch() -> tuple[list[float], list[list[float]]]:
    """On every rank: torch's ``fully_shard`` (a unit per layer) on the same shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    model = small_model()
    mesh = init_device_mesh("cuda", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, targets in batches(7, 4 * world):
        mine = slice(rank * 4, (rank + 1) * 4)
        loss = torch.nn.functional.cross_entropy(model(inputs[mine]), targets[mine])
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.full_tensor().detach().reshape(-1).tolist() for p in model.parameters()]


def fsdp_alone(world: int) -> tuple[list[float], list[list[float]]]:
    """One process training on the whole batch that ``world`` FSDP ranks split."""
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, targets in batches(7, 4 * world):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.detach().reshape(-1).tolist() for p in model.parameters()]


def _largest_difference(ours: tuple[list[float], list[list[float]]],
                        theirs: tuple[list[float], list[list[float]]]) -> float:
    """The largest difference of losses plus the largest of parameters."""
    return (max(abs(a - b) for a, b in zip(ours[0], theirs[0]))
            + max(abs(a - b) for mine, other in zip(ours[1], theirs[1])
                  for a, b in zip(mine, other)))


def training(backend: str, ranks: int, environment: dict[str, str]) -> dict[str, Any]:
    """Item 3 in one process group: the largest differences from torch and from one
    process training on the whole batch, or the errors."""
    result: dict[str, Any] = {}
    runs = {}
    for name, fn in (("ddp", ddp_against_torch), ("fsdp ours", fsdp_ours),
                     ("fsdp torch", fsdp_torch)):
        try:
            with set_environment(environment):
                runs[name] = spawn(fn, ranks, device="cuda", backend=backend,
                                   timeout=GROUP_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - a failure is a result too
            result[name] = one_line(error)
    if "ddp" in runs:
        result["ddp"] = max(runs["ddp"])
    if "fsdp ours" in runs and "fsdp torch" in runs:
        result["fsdp vs fully_shard"] = max(
            _largest_difference(ours, theirs)
            for ours, theirs in zip(runs["fsdp ours"], runs["fsdp torch"]))
    if "fsdp ours" in runs:  # the ranks' mean loss is the whole batch's
        alone = fsdp_alone(ranks)
        mean_losses = [sum(step) / ranks for step in zip(*(r[0] for r in runs["fsdp ours"]))]
        result["fsdp vs one process"] = max(
            _largest_difference((mean_losses, params), alone)
            for _, params in runs["fsdp ours"])
    return result


def driver_costs() -> dict[str, Any]:
    """Item 4 on every rank: the GPU memory in use on the device (all ranks' together, MiB)
    once the process group has started, after a driver on the main channel alone, after
    one with 8 more channels (on NCCL each connects every pair of ranks on each of its
    channels) and after another with 8 more whose communicators have one CTA each
    (``nccl_channel_ctas=1``), and the seconds each driver took to make. Rank 0's
    figures."""
    def used_mib() -> float:
        torch.cuda.synchronize()
        dist.barrier()
        free, total = torch.cuda.mem_get_info()
        return round((total - free) / 2**20, 1)

    figures: dict[str, Any] = {"eager_kernel_loading": cuda_loads_kernels_eagerly(),
                               "started_MiB": used_mib()}
    drivers = []
    for name, channels, ctas in (("one_channel", (), None),
                                 ("nine_channels", ring_channels(8), None),
                                 ("nine_channels_one_cta", ring_channels(8), 1)):
        began = time.perf_counter()
        drivers.append(Driver(channels=channels, timeout=GROUP_TIMEOUT,
                              nccl_channel_ctas=ctas))
        figures[f"{name}_s"] = round(time.perf_counter() - began, 3)
        figures[f"{name}_MiB"] = used_mib()
    for driver in drivers:
        driver.close()
    return figures


def start_costs(ranks: int, environment: dict[str, str]) -> dict[str, Any]:
    """Item 4 in one NCCL group, with CUDA loading kernels as realcomm's launcher has it
    (eagerly) and lazily: what starting the processes and the drivers took."""
    result: dict[str, Any] = {}
    for label, loading in (("launcher's", {}), ("lazy", {MODULE_LOADING: "LAZY"})):
        began = time.perf_counter()
        try:
            with set_environment({**environment, **loading}):
                figures = spawn(driver_costs, ranks, device="cuda", backend="nccl",
                                timeout=GROUP_TIMEOUT)[0]
        except Exception as error:  # noqa: BLE001 - a failure is a result too
            result[label] = one_line(error)
            continue
        result[label] = {"whole_s": round(time.perf_counter() - began, 1), **figures}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB", help="item 1's sizes")
    parser.add_argument("--groups", default=",".join(g[0] for g in GROUPS),
                        help="which process groups items 1, 3 and 4 run in")
    parser.add_argument("--items", default="1,2,3,4", help="which items to run")
    parser.add_argument("--timeout", type=float, default=GROUP_TIMEOUT,
                        help="item 1: seconds after which a silent operation is given up")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check.py: this machine has no CUDA device", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"versions": versions()}
    print(json.dumps(report["versions"]), flush=True)
    items = args.items.split(",")
    groups = [group for group in GROUPS if group[0] in args.groups.split(",")]
    if "1" in items:
        report["collectives"] = {}
        for name, backend, ranks, environment in groups:
            report["collectives"][name] = print_group(
                name, lambda: run_group(backend, ranks, environment, parse_sizes(args.sizes),
                                  args.timeout))
            save(report, args.out)
    if "2" in items:
        report["reduction"] = reduction_rates([2**k for k in range(20, 31, 2)])
        print("\n## in-place add a += b")
        for row in report["reduction"]:
            print(f"  {row['dtype']:9} {row['bytes']:>11} B {row['us']:9.1f} us  one buffer "
                  f"{row['buffer_GBps']:7.1f} GB/s  read+written {row['traffic_GBps']:7.1f} GB/s")
        save(report, args.out)
    if "3" in items:
        report["training"] = {}
        for name, backend, ranks, environment in groups:
            if ranks <= 2:  # world sizes 1 and 2 are enough here
                report["training"][name] = training(backend, ranks, environment)
                print(f"\n## DDP and FSDP, {name}: {report['training'][name]}", flush=True)
                save(report, args.out)
    if "4" in items:
        report["start"] = {}
        for name, backend, ranks, environment in groups:
            if backend == "nccl":
                report["start"][name] = start_costs(ranks, environment)
                print(f"\n## starting, {name}: {report['start'][name]}", flush=True)
                save(report, args.out)
    return 0


def print_group(name: str, run: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Item 1 for one group: run it and print its rows as they come back."""
    began = time.perf_counter()
    rows = run()
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
    return rows


def save(report: dict[str, Any], path: str) -> None:
    with open(path, "w") as out:
        json.dump(report, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
