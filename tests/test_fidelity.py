"""``benchmarks/fidelity.py``: every published table reads, and maps to the preset and
algorithm that model it (or to the reason none does), as its header says."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from simcomm.bench import (
    HOST_SECONDS_PER_CHANNEL, HOST_SECONDS_PER_GPU, HOST_SECONDS_PER_ITERATION,
)

PUBLISHED = Path(__file__).parent.parent / "benchmarks" / "published"
FIDELITY = Path(__file__).parent.parent / "benchmarks" / "fidelity.py"


def _fidelity():
    spec = importlib.util.spec_from_file_location("fidelity", FIDELITY)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fidelity", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fidelity = _fidelity()


@pytest.mark.parametrize("path", sorted(PUBLISHED.glob("*.csv")), ids=lambda p: p.stem)
def test_every_published_table_reads_with_its_source(path) -> None:
    table = fidelity.read_table(path)
    assert table.header["source"].startswith("https://")
    assert table.sizes and len(table.sizes) == len(table.times_us)
    assert list(table.sizes) == sorted(table.sizes)
    assert all(t > 0 for t in table.times_us)
    assert isinstance(fidelity.model_for(table), (tuple, str))


@pytest.mark.parametrize("name, model", [
    ("h100-1node-default-dgxcbench", ("dgx-h100", "nccl_allreduce", {})),
    ("h100-1node-4gpu-default-allgather-ncclcollbench",
     ("dgx-h100:gpus=4", "nccl_all_gather", {})),
    ("h100-2nodes-ring-nccltests309gj",  # NCCL_ALGO=Ring NCCL_MIN_CTAS=24, 2 queue pairs
     ("cluster-h100:nodes=2,channels=24,nvls_channels=24,qps=2", "nccl_allreduce",
      {"algorithm": "ring"})),
    ("h100-2nodes-nvlstree-nccltests294",
     ("cluster-h100:nodes=2", "nccl_allreduce", {"algorithm": "nvls_tree"})),
    ("h200-2nodes-default-ocisuperant", ("cluster-h200:nodes=2", "nccl_allreduce", {})),
    ("h200-2nodes-default-nebiusrunai",  # 2 queue pairs, set by the launcher
     ("cluster-h200:nodes=2,qps=2", "nccl_allreduce", {})),
    ("a100-2nodes-default-ocioke",  # 4 queue pairs a connection
     ("cluster-a100:nodes=2,nic_ports=2,qps=4", "nccl_allreduce", {})),
    ("h100-8nodes-default-tuned-nccltests309gj",  # NCCL_MIN_CTAS=24 (NVLS too), 2 queue pairs;
     # no version printed, posted before NCCL 2.28.3 came out
     ("cluster-h100:nodes=8,channels=24,nvls_channels=24,qps=2,nccl=2.27", "nccl_allreduce",
      {})),
    ("h100-4nodes-default-nccltests309",  # NCCL 2.26.2 printed
     ("cluster-h100:nodes=4,nccl=2.26.2", "nccl_allreduce", {})),
    ("h100-10nodes-default-allreduce-ncclcluster",  # nccl-library=22902
     ("cluster-h100:nodes=10,nccl=2.29.2", "nccl_allreduce", {})),
    ("h100-1node-ring-allreduce-togethernccl",  # NCCL_ALGO=RING
     ("dgx-h100", "nccl_allreduce", {"algorithm": "ring"})),
    ("h100-1node-ring-allgather-togethernccl",  # NCCL_ALGO=RING
     ("dgx-h100", "nccl_all_gather", {"algorithm": "ring"})),
    ("h100-2nodes-default-gcpa3mega", "no preset for a TCP network (GPUDirect-TCPXO)"),
    ("a100-2nodes-ring-deepops",  # NCCL_ALGO=RING; nccl-tests of its age print no root
     ("cluster-a100:nodes=2", "nccl_allreduce", {"algorithm": "ring"})),
    ("b200-2nodes-default-lambdadstack", ("cluster-b200:nodes=2", "nccl_allreduce", {})),
    ("a100-4nodes-default-deepops", ("cluster-a100:nodes=4", "nccl_allreduce", {})),
    ("a100-2nodes-default-azureaksrdma", ("cluster-a100:nodes=2", "nccl_allreduce", {})),
    ("a100-1node-default-galvatron", ("dgx-a100", "nccl_allreduce", {})),
    ("a100-1node-default-superbench", ("dgx-a100", "nccl_allreduce", {})),
    ("a100-1node-default-gcm", ("dgx-a100", "nccl_allreduce", {})),
    ("h100-10nodes-4gpu-default-allgather-ncclcluster",
     ("cluster-h100:nodes=10,gpus=4,nccl=2.29.2", "nccl_all_gather", {})),
    ("h100-10nodes-1gpu-default-allreduce-ncclcluster",
     ("cluster-h100:nodes=10,gpus=1", "nccl_allreduce", {})),
    # EFA: AWS's instances, named in the machine line
    ("h100-2nodes-default-awsp5keitaw", ("aws-p5:nodes=2", "nccl_allreduce", {})),
    ("a100-2nodes-default-awsp4ddlami", ("aws-p4d:nodes=2", "nccl_allreduce", {})),
    ("a100-2nodes-default-awsp4deawsome", ("aws-p4de:nodes=2", "nccl_allreduce", {})),
])
def test_tables_map_to_the_model_their_headers_describe(name, model) -> None:
    assert fidelity.model_for(fidelity.read_table(PUBLISHED / f"{name}.csv")) == model


def test_an_algorithm_the_simulator_lacks_is_named(tmp_path) -> None:
    text = (PUBLISHED / "h100-2nodes-nvlstree-nccltests294.csv").read_text()
    path = tmp_path / "collnet.csv"
    path.write_text(text.replace("NCCL_ALGO=NVLSTree", "NCCL_ALGO=CollnetDirect"))
    assert fidelity.model_for(fidelity.read_table(path)) == "NCCL_ALGO=CollnetDirect not modelled"
    text = (PUBLISHED / "h100-1node-ring-allgather-togethernccl.csv").read_text()
    path.write_text(text.replace("NCCL_ALGO=RING", "NCCL_ALGO=NVLSTree"))
    assert (fidelity.model_for(fidelity.read_table(path))
            == "NCCL_ALGO=NVLSTree not modelled for this collective")


def test_an_efa_machine_without_a_preset_is_named(tmp_path) -> None:
    text = (PUBLISHED / "h100-2nodes-default-awsp5keitaw.csv").read_text()
    path = tmp_path / "p5en.csv"
    path.write_text(text.replace("p5.48xlarge", "p5en.48xlarge"))
    assert fidelity.model_for(fidelity.read_table(path)) == "no preset for this EFA machine"


def test_one_process_driving_eight_gpus_is_read_from_the_test_header() -> None:
    table = fidelity.read_table(PUBLISHED / "h100-1node-ring-reducescatter-togethernccl.csv")
    assert table.gpus_per_process == 8


def test_the_host_floor_fit_recovers_a_floor_despite_an_outlier() -> None:
    # Rows made from a known floor (us): 10 + 3 per GPU + 0.05 per channel and GPU; one row
    # measured far above it, and one whose GPUs take longer than the floor (not its rows).
    def floor(gpus: int, channels: int) -> float:
        return 10.0 + gpus * (3.0 + 0.05 * channels)

    rows = [(g, c, 5.0, floor(g, c)) for g in (4, 8) for c in range(1, 25)]
    rows += [(8, 24, 5.0, 3 * floor(8, 24)), (4, 24, 80.0, 81.0)]
    assert fidelity.fit_host_floor(rows) == pytest.approx((10.0, 3.0, 0.05), rel=0.05)


def test_the_host_floor_in_use_is_the_fit_to_the_published_tables() -> None:
    tables = [fidelity.read_table(path) for path in sorted(PUBLISHED.glob("*.csv"))]
    driven = [t for t in tables
              if not isinstance(fidelity.model_for(t), str) and t.gpus_per_process > 1]
    rows = [row for table in driven for row in fidelity.host_floor_rows(table)]
    per_iteration, per_gpu, per_channel = fidelity.fit_host_floor(rows)
    assert HOST_SECONDS_PER_ITERATION * 1e6 == pytest.approx(per_iteration, abs=0.05)
    assert HOST_SECONDS_PER_GPU * 1e6 == pytest.approx(per_gpu, abs=0.005)
    assert HOST_SECONDS_PER_CHANNEL * 1e6 == pytest.approx(per_channel, abs=0.0005)


def test_the_targets_line_counts_tables_and_regimes_over_their_targets() -> None:
    tables = {
        "good": {"latency": [0.01, 0.03], "transition": [], "bandwidth": [0.02]},
        "slow small sizes": {"latency": [0.30, 0.40, 0.35], "transition": [0.05],
                             "bandwidth": [0.01, 0.02]},
        "bad": {"latency": [0.5], "transition": [0.3], "bandwidth": [0.2]},
        "empty": {"latency": [], "transition": [], "bandwidth": []},
    }
    line = fidelity.against_targets(tables)
    # All 12 rows: median 0.125, above 5%. Tables: good 2%, slow small sizes 17.5%, bad 30%.
    # Regimes: 2 + 3 + 3 = 8, of which slow small sizes' latency and bad's latency and
    # transition are above 25%.
    assert line == ("targets: all rows 12.5% (target 5%: not met); 1 of 3 tables within 10%; "
                    "5 of 8 regimes within 25% (3 above, in 2 tables)")


@pytest.mark.parametrize("folder, table, message", [
    ("missing", None, "--tables: {folder} is not a folder"),
    ("empty", None, "--tables: {folder} holds no .csv table"),
    ("bad", "# source: x\nsize,count\n1,2\n",
     "{folder}/bad.csv, line 3: expected the 8 columns of"),
])
def test_bad_tables_stop_with_one_line(tmp_path, folder, table, message) -> None:
    path = tmp_path / folder
    if folder != "missing":
        path.mkdir()
    if table is not None:
        (path / "bad.csv").write_text(table)
    run = subprocess.run([sys.executable, str(FIDELITY), "--tables", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.startswith("fidelity.py: error: " + message.format(folder=path))
    assert run.stderr.count("\n") == 1
