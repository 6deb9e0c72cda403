"""How far the simulator's predictions are from published nccl-tests tables.

For every table in ``benchmarks/published/`` whose machine has a preset and whose algorithm
the simulator has, it simulates every row's size and prints the relative error of the time,
as the median and largest absolute error per regime: latency-bound (below 1 MiB),
transition, and bandwidth-bound (64 MiB and up), and over the whole table. Tables whose
machine or network is not modelled yet are listed with the reason and left out of the
summary. A last line weighs the whole against the fidelity issue's targets (all rows
within 5% median, every table within 10%, every regime of every table within 25%). A table
run by one process driving several GPUs (nccl-tests' ``-g``, its header's
``nGpus``) is simulated so too (``simcomm.bench.host_bound_seconds``). Rows of 0 B (a
reduce-scatter or all-gather below one element per rank) are not compared: NCCL moves
nothing and launches nothing, and the row times nccl-tests' own loop.

    python benchmarks/fidelity.py [--tables benchmarks/published] [--rows] [--torch] [--jobs N]
    python benchmarks/fidelity.py --fit-host-floor

The second fits the host's floor of ``-g`` runs (``simcomm.bench.host_floor_seconds``) to
the published ``-g`` tables and prints it beside the constants in use.

Tables are simulated side by side, one process each, ``--jobs`` at once (default: one per
CPU); all of them take about seventeen minutes on two cores.

With ``--torch`` it also prints the same summary for torch's own analytical estimate
(``torch/_inductor/comm_analysis.py``, which mirrors NCCL's tuning model) on the same rows.

The figures depend on nothing but the model, so they are the same on any machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from algorithms.harness.catalog import get_collective
from algorithms.tuned import ONE_WAY_ALGORITHMS
from simcomm import SizeOnly, simulate
from simcomm.bench import (
    HOST_SECONDS_PER_CHANNEL, HOST_SECONDS_PER_GPU, HOST_SECONDS_PER_ITERATION,
    host_bound_seconds, launched_channels)
from simcomm.nccl_tests_output import parse_published_table, published_notes
from simcomm.presets import make_preset

LATENCY_BOUND = 1 << 20  # bytes: below, the latency-bound regime
BANDWIDTH_BOUND = 64 << 20  # bytes: from here, the bandwidth-bound regime
# The fidelity issue's targets, as median relative errors: all rows together, every table,
# every regime of every table.
ALL_ROWS_TARGET = 0.05
TABLE_TARGET = 0.10
REGIME_TARGET = 0.25
# nccl-tests program -> the simulator's collective that chooses per call as NCCL does.
ALGORITHMS = {"all_reduce_perf": "nccl_allreduce", "reduce_scatter_perf": "nccl_reduce_scatter",
              "all_gather_perf": "nccl_all_gather"}
# NCCL_ALGO as a table forced it -> the simulator's algorithm parameter.
# The day NCCL 2.28.3 came out (its tag in NVIDIA/nccl), whose tuner credits NVLS-tree with
# more of the network beyond two nodes than before.
NCCL_2_28_3_RELEASED = "2025-09-02"
FORCED_ALGORITHMS = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree"}


@dataclass(frozen=True)
class Table:
    """One published table: its header facts, its rows (bytes, microseconds) and the GPUs
    each process of its run drove (its test header's ``nGpus``)."""

    path: Path
    header: dict[str, str]
    sizes: tuple[int, ...]
    times_us: tuple[float, ...]
    gpus_per_process: int = 1

    @property
    def name(self) -> str:
        """The file's name without ``.csv``."""
        return self.path.stem


def read_table(path: Path) -> Table:
    """A published CSV (``simcomm.nccl_tests_output.parse_published_table``)."""
    text = path.read_text(encoding="utf-8")
    run = parse_published_table(text, str(path))
    return Table(path, published_notes(text), tuple(row.size for row in run.rows),
                 tuple(row.time_us for row in run.rows), run.gpus_per_process)


def model_for(table: Table) -> tuple[str, str, dict[str, str]] | str:
    """(preset, algorithm, parameters) that model ``table``, or why there is none yet."""
    program = table.header.get("collective", "").split(" ")[0]  # "all_reduce_perf (...)"
    if program not in ALGORITHMS:
        return f"collective {program!r} not modelled"
    params = {}
    forced = re.search(r"NCCL_ALGO=(\w+)", table.header.get("algorithm", ""))
    if forced:
        algorithm = FORCED_ALGORITHMS.get(forced.group(1).lower())
        if algorithm is None:
            return f"NCCL_ALGO={forced.group(1)} not modelled"
        if program != "all_reduce_perf" and algorithm not in ONE_WAY_ALGORITHMS:
            return f"NCCL_ALGO={forced.group(1)} not modelled for this collective"
        params["algorithm"] = algorithm
    if "TCPXO" in table.header.get("nic", ""):
        return "no preset for a TCP network (GPUDirect-TCPXO)"
    layout = table.header.get("gpus_per_node", "")
    nodes = re.search(r"nodes:\s*(\d+)", layout)
    per_node = re.match(r"\s*(\d+)", layout)
    gpu = re.search(r"\b(A100|H100|H200|B200)\b", table.header.get("machine", ""))
    if not (nodes and per_node and gpu):
        return "no preset for this machine"
    count, gpus, kind = int(nodes.group(1)), int(per_node.group(1)), gpu.group(1).lower()
    instance = re.search(r"\b(p4de|p4d|p5)\.", table.header.get("machine", ""))
    if "EFA" in table.header.get("nic", ""):  # AWS's instances, whose NICs are EFA's
        if not (instance and count > 1 and gpus == 8):
            return "no preset for this EFA machine"
        preset = f"aws-{instance.group(1)}:nodes={count}"
    elif count == 1:
        preset = f"dgx-{kind}" if gpus == 8 else f"dgx-{kind}:gpus={gpus}"
    else:  # the first ``gpus`` GPUs of 8-GPU nodes, each with its NIC
        preset = f"cluster-{kind}:nodes={count}" + (f",gpus={gpus}" if gpus != 8 else "")
    ports = re.match(r"\s*(\d+)", table.header.get("nic_ports", ""))
    if ports and count > 1 and int(ports.group(1)) != 1:  # ports that share a NIC's rate
        preset += f",nic_ports={ports.group(1)}"
    settings = table.header.get("algorithm", "") + " " + table.header.get("command", "")
    # NCCL_MIN_CTAS or NCCL_MIN_NCHANNELS raise NCCL's channel count to at least theirs;
    # NCCL_MIN_CTAS raises NVLS's too (src/transport/nvls.cc).
    minimum = re.search(r"NCCL_MIN_(CTAS|NCHANNELS)=(\d+)", settings)
    if minimum:
        least, topology = int(minimum.group(2)), make_preset(preset)
        preset += f"{',' if ':' in preset else ':'}channels={max(least, topology.channels or 0)}"
        if minimum.group(1) == "CTAS" and topology.reducing_switches:
            preset += f",nvls_channels={max(least, topology.nvls_channels)}"
    # Queue pairs per connection lift the ceiling of a channel between nodes.
    qps = re.search(r"NCCL_IB_QPS_PER_CONNECTION=(\d+)", settings)
    if qps and count > 1 and int(qps.group(1)) != 1:
        preset += f",qps={qps.group(1)}"
    # NCCL's tuner weighs NVLS-tree differently from 2.28.3 on, beyond two nodes.
    version = nccl_version_of(table)
    if count > 2 and version and make_preset(preset).reducing_switches:
        preset += f",nccl={version}"
    return preset, ALGORITHMS[program], params


def nccl_version_of(table: Table) -> str | None:
    """The NCCL version a table's run printed (``NCCL 2.26.2``, ``nccl-library=22902``);
    where none is printed, ``2.27`` for a table dated before 2.28.3 was released
    (2025-09-02: the newest line whose tuner weighs as that table's did); else None."""
    software = table.header.get("software", "")
    printed = re.search(r"NCCL (\d+\.\d+\.\d+)", software)
    if printed:
        return printed.group(1)
    code = re.search(r"nccl-library=(\d)(\d\d)(\d\d)\b", software)
    if code:
        return ".".join(str(int(part)) for part in code.groups())
    dated = re.search(r"\d{4}-\d\d-\d\d", table.header.get("date", ""))
    if dated and dated.group(0) < NCCL_2_28_3_RELEASED:
        return "2.27"
    return None


def simulate_sizes(preset: str, algorithm: str, params: dict[str, str], sizes: Sequence[int]
                   ) -> list[tuple[float, int, str]]:
    """Per size (float32 elements, as the tables' runs): the simulated microseconds on the
    GPUs, the channels of the widest kernel launched, and what ran (``ring/LL/8``)."""
    topology = make_preset(preset)
    collective = get_collective(algorithm)
    p = topology.size
    runs = []
    for size in sizes:
        count = size // 4
        if collective.kind in ("reducescatter", "allgather"):
            count = count // p * p
        result = simulate(collective.function, [SizeOnly(count, np.float32)] * p, topology,
                          record=False, **params)
        ran = result.launches[0].describe() if result.launches else "nothing (empty)"
        runs.append((result.time * 1e6, launched_channels(result.launches), ran))
    return runs


def predict(preset: str, algorithm: str, params: dict[str, str], sizes: Sequence[int],
            gpus: int = 1) -> list[tuple[float, str]]:
    """Simulated microseconds per size, each with what ran, with ``gpus`` driven by each
    process (``simulate_sizes``, then the host's floor)."""
    return [(host_bound_seconds(gpu_us / 1e6, gpus, channels) * 1e6, ran)
            for gpu_us, channels, ran in simulate_sizes(preset, algorithm, params, sizes)]


def predict_table(table: Table) -> list[tuple[float, str]]:
    """``predict`` on the model of ``table`` (which has one) at its sizes."""
    preset, algorithm, params = model_for(table)
    return predict(preset, algorithm, params, table.sizes, table.gpus_per_process)


def torch_estimates(program: str, ranks: int, sizes: Sequence[int], preset: str
                    ) -> list[float]:
    """Torch's analytical estimate of each size, in microseconds, on the machines of
    ``preset`` (8 GPUs a node).

    Torch sizes its model by the GPUs it finds; a machine without them would get its
    fallback (Ampere), so its GPU detection is told the table's GPUs here."""
    from torch._inductor import comm_analysis

    gpu = (comm_analysis.NVIDIA_GPU_TYPE.AMPERE if "a100" in preset
           else comm_analysis.NVIDIA_GPU_TYPE.HOPPER)
    comm_analysis.get_gpu_type = lambda: gpu
    collective = {"all_reduce_perf": comm_analysis.NCCL_COLL.ALL_REDUCE,
                  "reduce_scatter_perf": comm_analysis.NCCL_COLL.REDUCE_SCATTER,
                  "all_gather_perf": comm_analysis.NCCL_COLL.ALL_GATHER}[program]
    return [comm_analysis.estimate_nccl_collective_runtime_impl(size, ranks, collective) * 1e3
            for size in sizes]


def regime(size: int) -> str:
    """Which regime a size falls in."""
    if size < LATENCY_BOUND:
        return "latency"
    return "bandwidth" if size >= BANDWIDTH_BOUND else "transition"


def summary(errors: Sequence[float]) -> str:
    """Median and largest absolute relative error, as percentages."""
    if not errors:
        return "        -"
    return f"{statistics.median(errors):6.1%} {max(errors):6.1%}"


def against_targets(tables: dict[str, dict[str, list[float]]]) -> str:
    """One line on how ``tables`` (name -> regime -> relative errors of its rows) meet the
    targets: all rows' median, the tables whose median is above ``TABLE_TARGET`` and the
    regimes whose median is above ``REGIME_TARGET``."""
    every = [e for regimes in tables.values() for errors in regimes.values() for e in errors]
    medians = {name: statistics.median(e for errors in regimes.values() for e in errors)
               for name, regimes in tables.items() if any(regimes.values())}
    over = sum(median > TABLE_TARGET for median in medians.values())
    regimes = [(name, statistics.median(errors)) for name, table in tables.items()
               for errors in table.values() if errors]
    wide = [name for name, median in regimes if median > REGIME_TARGET]
    all_rows = statistics.median(every) if every else 0.0
    return (f"targets: all rows {all_rows:.1%} (target {ALL_ROWS_TARGET:.0%}: "
            f"{'met' if all_rows <= ALL_ROWS_TARGET else 'not met'}); "
            f"{len(medians) - over} of {len(medians)} tables within {TABLE_TARGET:.0%}; "
            f"{len(regimes) - len(wide)} of {len(regimes)} regimes within "
            f"{REGIME_TARGET:.0%} ({len(wide)} above, in {len(set(wide))} tables)")


FLOOR_FIT_LARGEST = 16 << 20  # bytes: above, every -g table's GPUs take longer than its host


def host_floor_rows(table: Table) -> list[tuple[int, int, float, float]]:
    """(GPUs a process drove, channels, simulated GPU microseconds, measured microseconds)
    for each of ``table``'s rows up to ``FLOOR_FIT_LARGEST`` that moves data."""
    preset, algorithm, params = model_for(table)
    gpus = table.gpus_per_process
    rows = [(size, measured) for size, measured in zip(table.sizes, table.times_us)
            if size <= FLOOR_FIT_LARGEST]
    runs = simulate_sizes(preset, algorithm, params, [size for size, _ in rows])
    return [(gpus, channels, gpu_us, measured)
            for (_, measured), (gpu_us, channels, _) in zip(rows, runs) if gpu_us > 0]


def fit_host_floor(rows: Sequence[tuple[int, int, float, float]]) -> tuple[float, float, float]:
    """The host's time per iteration, per GPU and per channel of each GPU's kernel, in
    microseconds (``simcomm.bench.host_floor_seconds``), fitted to the measured times of
    the rows whose simulated GPU time falls below the floor: a robust least-squares fit
    (soft L1 loss, 1 us scale), so that the tables' single outlier rows weigh little. Rows
    are chosen by the floor itself, so the fit is repeated until they stay the same."""
    from scipy.optimize import least_squares

    gpus, channels, gpu_us, measured = (np.array(column, dtype=float) for column in zip(*rows))
    design = np.column_stack([np.ones_like(gpus), gpus, gpus * channels])
    constants = np.array([HOST_SECONDS_PER_ITERATION, HOST_SECONDS_PER_GPU,
                          HOST_SECONDS_PER_CHANNEL]) * 1e6
    chosen = None
    for _ in range(20):
        below = gpu_us < design @ constants
        if chosen is not None and np.array_equal(below, chosen):
            break
        chosen = below
        fit = least_squares(lambda c: design[below] @ c - measured[below], constants,
                            loss="soft_l1", f_scale=1.0)
        constants = fit.x
    return tuple(float(c) for c in constants)


def print_host_floor_fit(tables: Sequence[Table], jobs: int) -> None:
    """Fit the host's floor to every modelled -g table and print it beside the one in use."""
    driven = [t for t in tables if not isinstance(model_for(t), str) and t.gpus_per_process > 1]
    with ProcessPoolExecutor(jobs) as pool:
        rows = [row for found in pool.map(host_floor_rows, driven) for row in found]
    fitted = fit_host_floor(rows)
    in_use = (HOST_SECONDS_PER_ITERATION * 1e6, HOST_SECONDS_PER_GPU * 1e6,
              HOST_SECONDS_PER_CHANNEL * 1e6)
    print(f"host floor fitted to {len(driven)} tables run with -g ({len(rows)} rows up to "
          f"{FLOOR_FIT_LARGEST >> 20} MiB):")
    for name, fit, used in zip(("per iteration", "per GPU", "per channel and GPU"),
                               fitted, in_use):
        print(f"  {name:<20} {fit:8.3f} us   (simcomm.bench: {used:g} us)")


def fail(message: str) -> NoReturn:
    """Stop with ``message`` as one line on stderr and exit status 2."""
    print(f"fidelity.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default=str(Path(__file__).parent / "published"),
                        help="folder of published CSVs (default benchmarks/published)")
    parser.add_argument("--rows", action="store_true",
                        help="also print every row: measured, simulated, error, what ran")
    parser.add_argument("--torch", action="store_true",
                        help="also summarise torch's analytical estimate on the same rows")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="tables simulated at once, each in its own process (default: "
                             "one per CPU)")
    parser.add_argument("--fit-host-floor", action="store_true",
                        help="fit the host's floor of -g runs (simcomm.bench's HOST_SECONDS_*) "
                             "to the -g tables, print it and stop")
    args = parser.parse_args()
    if args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}")
    folder = Path(args.tables)
    if not folder.is_dir():
        fail(f"--tables: {folder} is not a folder")
    paths = sorted(folder.glob("*.csv"))
    if not paths:
        fail(f"--tables: {folder} holds no .csv table")
    try:
        tables = [read_table(path) for path in paths]
    except (ValueError, OSError) as error:
        fail(str(error))
    if args.fit_host_floor:
        print_host_floor_fit(tables, args.jobs)
        return
    models = [model_for(table) for table in tables]
    modelled = [(table, model) for table, model in zip(tables, models)
                if not isinstance(model, str)]
    with ProcessPoolExecutor(args.jobs) as pool:  # the tables take minutes each
        predictions = list(pool.map(predict_table, [table for table, _ in modelled]))
    print(f"{'table':<46} {'model':<50} {'latency':>13} {'transition':>13} "
          f"{'bandwidth':>13} {'all':>13}")
    print(f"{'':<46} {'':<50} " + " ".join(f"{'median   max':>13}" for _ in range(4)))
    every, torch_rows = [], []
    by_table: dict[str, dict[str, list[float]]] = {}
    skipped = [(table.name, model) for table, model in zip(tables, models)
               if isinstance(model, str)]
    for (table, (preset, algorithm, params)), predicted in zip(modelled, predictions):
        gpus = table.gpus_per_process
        errors = {"latency": [], "transition": [], "bandwidth": []}
        for size, measured, (simulated, _) in zip(table.sizes, table.times_us, predicted):
            if simulated > 0:  # 0: nothing to move (see the module's docstring)
                errors[regime(size)].append(abs(simulated - measured) / measured)
        flat = [e for values in errors.values() for e in values]
        every += flat
        by_table[table.name] = errors
        label = " ".join([preset, algorithm] + [f"{k}={v}" for k, v in params.items()]
                         + ([f"-g {gpus}"] if gpus > 1 else []))
        print(f"{table.name:<46} {label:<50} "
              + " ".join(f"{summary(errors[r]):>13}" for r in errors) + f" {summary(flat):>13}")
        if args.rows:
            for size, measured, (simulated, ran) in zip(table.sizes, table.times_us, predicted):
                print(f"    {size:>12} B  measured {measured:>9.1f} us  simulated "
                      f"{simulated:>9.1f} us  {simulated / measured - 1:+7.1%}  {ran}")
        if args.torch:
            program = table.header.get("collective", "").split(" ")[0]
            compared = [(size, measured) for size, measured, (simulated, _)
                        in zip(table.sizes, table.times_us, predicted) if simulated > 0]
            sizes = [size for size, _ in compared]
            estimates = torch_estimates(program, make_preset(preset).size, sizes, preset)
            torch_rows.append((table.name, sizes, [m for _, m in compared], estimates))
    print(f"\nall modelled tables together: median {statistics.median(every):.1%} over "
          f"{len(every)} rows" if every else "\nno table is modelled yet")
    if every:
        print(against_targets(by_table))
    if torch_rows:
        print("\ntorch's analytical estimate (torch/_inductor/comm_analysis.py) on the same "
              "rows:")
        torch_every = []
        for name, sizes, measured_us, estimates in torch_rows:
            errors = {"latency": [], "transition": [], "bandwidth": []}
            for size, measured, estimate in zip(sizes, measured_us, estimates):
                errors[regime(size)].append(abs(estimate - measured) / measured)
            flat = [e for values in errors.values() for e in values]
            torch_every += flat
            print(f"{name:<46} {'torch':<50} "
                  + " ".join(f"{summary(errors[r]):>13}" for r in errors)
                  + f" {summary(flat):>13}")
        print(f"\ntorch's estimate, all tables together: median "
              f"{statistics.median(torch_every):.1%} over {len(torch_every)} rows")
    if skipped:
        print("\nnot modelled yet:")
        for name, why in skipped:
            print(f"  {name}: {why}")


if __name__ == "__main__":
    main()
