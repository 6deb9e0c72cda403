"""Simulated runs as one torch-profiler-shaped trace per rank, read by Holistic Trace Analysis."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from algorithms import ring_allreduce
from algorithms.harness.model_presets import preset_model
from simcomm import SizeOnly, simulate, switch
from simcomm.kineto_trace import COMM_STREAM, COMPUTE_STREAM, write_kineto_traces
from simcomm.presets import make_preset
from simcomm.summary import covered_time
from simcomm.training import simulate_ddp


@pytest.mark.parametrize("model, spec", [("resnet50", "dgx-h100"),
                                         ("bert-base", "cluster-h100:nodes=2")])
def test_hta_finds_the_overlap_the_simulator_reports(model, spec, tmp_path: Path) -> None:
    from hta.trace_analysis import TraceAnalysis
    logging.getLogger("hta").setLevel(logging.ERROR)
    report = simulate_ddp(preset_model(model), make_preset(spec))
    paths = write_kineto_traces(report.result, tmp_path)
    assert [p.name for p in paths] == [f"rank_{r}.json" for r in range(report.ranks)]
    overlap = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    assert list(overlap["rank"]) == list(range(report.ranks))
    # The report's figures are the last rank's. HTA rounds kernel times to whole
    # microseconds (starts up, ends down), which moves a figure of a hundred kernels by some
    # tenths of a percent.
    last = max(range(report.ranks), key=report.result.finish_times.__getitem__)
    assert overlap["comp_comm_overlap_pctg"][last] == pytest.approx(100 * report.overlap,
                                                                    abs=1.0)
    # Unrounded, the exported kernels overlap as the simulator's step did.
    events = json.loads(paths[last].read_text())["traceEvents"]
    spans = {stream: [(e["ts"], e["ts"] + e["dur"]) for e in events
                      if e["cat"] == "kernel" and e["args"]["stream"] == stream]
             for stream in (COMPUTE_STREAM, COMM_STREAM)}
    hidden = sum(max(0.0, min(end, stop) - max(start, begin))
                 for start, end in spans[COMM_STREAM] for begin, stop in spans[COMPUTE_STREAM])
    assert hidden / covered_time(spans[COMM_STREAM]) == pytest.approx(report.overlap, rel=1e-3)


def test_each_rank_has_its_compute_and_its_communication_as_kernels(tmp_path: Path) -> None:
    result = simulate(ring_allreduce, [SizeOnly(1000)] * 3, switch(3, 1e9, 1e-6))
    trace = json.loads(write_kineto_traces(result, tmp_path)[1].read_text())
    assert trace["distributedInfo"] == {"backend": "nccl", "rank": 1, "world_size": 3}
    kernels = [e for e in trace["traceEvents"] if e["cat"] == "kernel"]
    # A ring step waits for its message and sends the next at once: one span in all.
    assert len(kernels) == 1 and kernels[0]["args"]["stream"] == COMM_STREAM
    assert kernels[0]["name"].startswith("ncclDevKernel_reduce-scatter_0")
    assert kernels[0]["ts"] == 0 and kernels[0]["dur"] == pytest.approx(result.time * 1e6)
    assert COMPUTE_STREAM != COMM_STREAM


def test_a_run_without_its_op_trace_is_refused(tmp_path: Path) -> None:
    result = simulate(ring_allreduce, [SizeOnly(1000)] * 3, switch(3, 1e9, 1e-6),
                      record=False)
    with pytest.raises(ValueError, match="record=True"):
        write_kineto_traces(result, tmp_path)


def test_simcomm_ddp_writes_a_trace_per_rank(tmp_path: Path, capsys) -> None:
    from simcomm.cli import main
    assert main(["ddp", "--model", "resnet50", "--topology", "dgx-h100", "--kineto",
                 str(tmp_path)]) == 0
    assert f"wrote 8 traces to {tmp_path}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank_{r}.json" for r in range(8)]
