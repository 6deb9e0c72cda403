"""Every example runs and prints the answer its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_allreduce_crossover_names_both_winners() -> None:
    winners = [line.split()[-1] for line in run("allreduce_crossover.py").splitlines()[2:]]
    assert winners[0] == "all-to-all" and winners[-1] == "ring"
    assert winners == sorted(winners)  # one crossover: all-to-all, then ring for good


def test_master_gpu_bottleneck_grows_with_the_gpus() -> None:
    out = run("master_gpu_bottleneck.py")
    assert re.search(r"On 64 GPUs the flat all-reduce takes [0-9.]+x the ring's time", out)


def test_latency_vs_bandwidth_finds_a_fixed_multiple() -> None:
    out = run("latency_vs_bandwidth.py")
    ratios = set(re.findall(r"\(\s*([0-9.]+)\)", out))
    assert ratios == {"2.48", "0.98"}


def test_dp_vs_ddp_prints_the_comparison_and_plots_the_sweep(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sweep.png"
    out = run("dp_vs_ddp.py", "--plot", str(plot))
    assert out.count("ddp-no-overlap") == 2 and "<- fastest" in out
    assert re.search(r"the cap alone changes the step time [0-9.]+x", out)
    assert plot.read_bytes()[:4] == b"\x89PNG"
