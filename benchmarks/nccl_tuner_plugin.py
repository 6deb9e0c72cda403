"""Check tuner files against NCCL's own example tuner plugin, built from NCCL's source.

``simcomm tune`` writes the CSV that NCCL's example tuner plugin reads
(plugins/tuner/example/plugin.c; ext-tuner/example/plugin.c before NCCL 2.29.7), and
``algorithms.harness.tuner_file`` reads it back. This script builds that plugin with the C
compiler, loads it and asks it, as NCCL's ``ncclGetAlgoInfo`` does, for each collective at
each power of two from 1 B to 16 GiB and at both edges of every row: it sets the cost of
the combination NCCL should run to 0 and answers a channel count. Each answer is compared
with this project's reader of the same file (``TableTuner``), which must agree everywhere,
and with the simulator's own choice (``ModelTuner``, what ``simcomm bench`` runs), which
the file records at the powers of two ``simcomm tune`` weighed. A hand-written file with
comments, wildcards, optional fields, overlapping rows and ``-1`` channels is checked the
same way on several node and rank counts.

    python benchmarks/nccl_tuner_plugin.py --nccl PATH_TO_NCCL_SOURCE dgx-h100 cluster-h100:nodes=2

Needs a C compiler (``cc``, or ``$CC``) and a checkout of NVIDIA/nccl whose example plugin
speaks the v5 tuner interface; no GPU. Exits 1 if the plugin and the reader disagree
anywhere, or if the plugin crashes on a call a row matches, as those of NCCL 2.27.5 to
2.29.7 do (fixed in 2.30.3): real NCCL with those crashes the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from algorithms.harness.tuner_file import MAX_BYTES, TableTuner, read_tuner_file
from algorithms.ops import Choice, Protocol
from simcomm.cli import main as simcomm_main
from simcomm.bench import load_named_topology
from simcomm.tuning import ModelTuner

COLLECTIVES = {"allreduce": "AllReduce", "reducescatter": "ReduceScatter",
               "allgather": "AllGather"}
PLUGIN_DIRS = ("plugins/tuner/example", "ext-tuner/example")
# A hand-written file: comments, a blank line, nine and ten fields, wildcards, rows for
# other node counts, overlapping rows (the first decides), -1 and signed channel counts.
HAND_WRITTEN = """\
# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
allreduce,0,65536,tree,ll,-1,2,-1

allreduce,0,1048576,ring,ll128,+4,-1,-1,-1
allreduce,1048577,18446744073709551615,ring,simple,16,-1,16,-1,-1
allreduce,1048577,18446744073709551615,tree,simple,8,-1,-1,1,0
allgather,0,4096,ring,ll,2,1,8
allgather,0,18446744073709551615,ring,simple,-1,-1,-1
reducescatter,100,200,ring,ll128,3,4,32
"""


class TunerV5(ctypes.Structure):
    """NCCL's ``ncclTuner_v5_t`` (plugins/tuner/example/nccl/tuner.h)."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("init", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)),
        ("getCollInfo", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                         ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_int))),
        ("finalize", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
    ]


class Plugin:
    """NCCL's example tuner plugin, built from ``source`` into ``workdir`` and loaded."""

    def __init__(self, source: Path, workdir: Path) -> None:
        directory = next((source / d for d in PLUGIN_DIRS if (source / d / "plugin.c").is_file()),
                         None)
        if directory is None:
            raise SystemExit(f"error: no example tuner plugin under {source} (looked for "
                             f"{' and '.join(d + '/plugin.c' for d in PLUGIN_DIRS)})")
        library = workdir / "libnccl-tuner-example.so"
        build = [os.environ.get("CC", "cc"), f"-I{directory / 'nccl'}", "-fPIC", "-shared",
                 "-o", str(library), str(directory / "plugin.c")]
        done = subprocess.run(build, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"error: building the plugin failed: {' '.join(build)}\n"
                             f"{done.stderr.strip()}")
        header = (directory / "nccl" / "tuner.h").read_text()
        defines = dict((name, int(value)) for name, value in
                       re.findall(r"#define (NCCL_\w+) (-?\d+)\b", header))
        functions = dict((name, int(value)) for name, value in
                         re.findall(r"ncclFunc(\w+) = (\d+)", header))
        self.algorithms = {value: name[len("NCCL_ALGO_"):].lower()
                           for name, value in defines.items()
                           if name.startswith("NCCL_ALGO_") and value >= 0}
        self.protocols = {value: name[len("NCCL_PROTO_"):].lower()
                          for name, value in defines.items()
                          if name.startswith("NCCL_PROTO_") and value >= 0}
        self.shape = defines["NCCL_NUM_ALGORITHMS"], defines["NCCL_NUM_PROTOCOLS"]
        self.functions = {ours: functions[theirs] for ours, theirs in COLLECTIVES.items()}
        try:
            self.tuner = TunerV5.in_dll(ctypes.CDLL(str(library)), "ncclTunerPlugin_v5")
        except ValueError:
            raise SystemExit(f"error: {directory / 'plugin.c'} exports no ncclTunerPlugin_v5 "
                             "(NCCL 2.28 or newer has it)") from None

    @contextlib.contextmanager
    def context(self, path: Path, nodes: int, ranks: int) -> Iterator[ctypes.c_void_p]:
        """The plugin set up, as NCCL sets it up for a communicator, on the file ``path``."""
        os.environ["NCCL_TUNER_CONFIG_FILE"] = str(path)
        handle = ctypes.c_void_p()
        if self.tuner.init(ctypes.byref(handle), 0, ranks, nodes, None, None, None):
            raise SystemExit(f"error: the plugin's init failed on {path}")
        try:
            yield handle
        finally:
            self.tuner.finalize(handle)

    def choice(self, handle: ctypes.c_void_p, collective: str, nbytes: int) -> str:
        """What NCCL would run: the combination whose cost the plugin set to 0 (``nccl``
        when it set none: NCCL's own choice) and its channel count."""
        algorithms, protocols = self.shape
        costs = (ctypes.c_float * (algorithms * protocols))(*[1.0] * (algorithms * protocols))
        channels = ctypes.c_int(0)
        if self.tuner.getCollInfo(handle, self.functions[collective], nbytes, 1,
                                  ctypes.cast(costs, ctypes.c_void_p), algorithms, protocols,
                                  0, ctypes.byref(channels)):
            raise SystemExit(f"error: the plugin's getCollInfo failed ({collective}, {nbytes})")
        chosen = [i for i, cost in enumerate(costs) if cost == 0.0]
        if not chosen:
            return f"nccl/{channels.value}"
        algorithm, protocol = divmod(chosen[0], protocols)
        return f"{self.algorithms[algorithm]}/{self.protocols[protocol]}/{channels.value}"


def named(choice: Choice | None) -> str:
    """A choice written as the plugin's answers are; None: the reader has no row for it."""
    if choice is None:
        return "nccl/1"
    return f"{choice.algorithm}/{choice.protocol.value}/{choice.channels}"


def probe_sizes(path: Path) -> list[int]:
    """Powers of two from 1 B to 16 GiB and every row's edges (and the sizes beside them)."""
    sizes = {1 << k for k in range(35)}
    for row in read_tuner_file(path):
        sizes.update(n for n in (row.min_bytes - 1, row.min_bytes, row.max_bytes,
                                 row.max_bytes + 1) if 0 <= n <= MAX_BYTES)
    return sorted(sizes)


def compare(plugin: Plugin, path: Path, nodes: int, ranks: int,
            model: ModelTuner | None = None) -> tuple[int, list[str], int, int]:
    """Probes, disagreements with the reader, and (with ``model``) agreements with the
    model at the sampled powers of two and how many of them there were."""
    # The reader's fallback marks "no row": the plugin then leaves NCCL to choose.
    no_row = Choice("none", Protocol.SIMPLE, 0)
    reader = TableTuner(read_tuner_file(path), nodes, ranks, default=no_row)
    probes, differences, agree, sampled = 0, [], 0, 0
    collectives = {row.collective for row in reader.rows} & set(COLLECTIVES)
    with plugin.context(path, nodes, ranks) as handle:
        for collective in sorted(collectives):
            for nbytes in probe_sizes(path):
                probes += 1
                theirs = plugin.choice(handle, collective, nbytes)
                ours = reader(collective, nbytes)
                if theirs != named(None if ours == no_row else ours):
                    differences.append(f"{collective} {nbytes} B: plugin {theirs}, "
                                       f"reader {named(ours)}")
                if model is not None and 8 <= nbytes <= 1 << 34 and nbytes & (nbytes - 1) == 0:
                    sampled += 1
                    agree += theirs == named(model(collective, nbytes))
    return probes, differences, agree, sampled


def survives_a_match(plugin: Plugin, workdir: Path) -> bool:
    """Whether the plugin answers a call one of its rows matches without crashing, tried
    in a child process: the example plugins of NCCL 2.27.5 to 2.29.7 index NCCL's cost
    table as a ``float**`` where NCCL passes a two-dimensional array, and crash there."""
    path = workdir / "one-row.csv"
    path.write_text("allreduce,0,100,ring,simple,1,-1,-1\n")
    child = os.fork()
    if child == 0:
        with plugin.context(path, 1, 8) as handle:
            plugin.choice(handle, "allreduce", 8)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def check_preset(plugin: Plugin, preset: str, workdir: Path) -> list[str]:
    """``simcomm tune`` on ``preset``, then the plugin against the reader and the model."""
    path = workdir / f"{re.sub(r'[^A-Za-z0-9]+', '-', preset)}.csv"
    with contextlib.redirect_stdout(io.StringIO()):
        if simcomm_main(["tune", "--topology", preset, "--out", str(path)]):
            raise SystemExit(f"error: simcomm tune --topology {preset} failed")
    topology = load_named_topology(preset)
    rows = len(read_tuner_file(path))
    probes, differences, agree, sampled = compare(plugin, path, topology.node_count,
                                                  topology.size, ModelTuner(topology))
    print(f"{preset:28} {rows:4} rows {probes:5} calls  plugin = reader: "
          f"{probes - len(differences):5}/{probes}  plugin = model: {agree}/{sampled}")
    return differences


def check_hand_written(plugin: Plugin, workdir: Path) -> list[str]:
    """The hand-written file on one, two and four nodes."""
    path = workdir / "hand-written.csv"
    path.write_text(HAND_WRITTEN)
    differences = []
    for nodes, ranks in ((1, 8), (2, 16), (4, 32)):
        probes, found, _, _ = compare(plugin, path, nodes, ranks)
        print(f"{f'hand-written, {nodes} x {ranks // nodes}':28} "
              f"{len(read_tuner_file(path)):4} rows {probes:5} calls  plugin = reader: "
              f"{probes - len(found):5}/{probes}")
        differences += found
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl", required=True, type=Path, metavar="DIR",
                        help="a checkout of NVIDIA/nccl (2.28 or newer)")
    parser.add_argument("presets", nargs="*", default=["dgx-h100", "cluster-h100:nodes=2"],
                        help="topologies to tune and check (default: dgx-h100 "
                             "cluster-h100:nodes=2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        plugin = Plugin(args.nccl, workdir)
        if not survives_a_match(plugin, workdir):
            print(f"error: the example tuner plugin of {args.nccl} crashes on the first call a "
                  "row matches (NCCL 2.27.5 to 2.29.7; fixed in 2.30.3 by NVIDIA/nccl commit "
                  "3c40c825, \"fix the crash caused by the lack of pointer type cast\")",
                  file=sys.stderr)
            return 1
        differences = check_hand_written(plugin, workdir)
        for preset in args.presets:
            differences += check_preset(plugin, preset, workdir)
    for line in differences:
        print("  differs:", line)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
