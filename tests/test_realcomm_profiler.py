"""realcomm's runs are named in a torch profiler trace: each collective as
``realcomm:<algorithm>`` and each labelled computation by its label."""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist

from algorithms import Compute, ring_allreduce
from realcomm import Driver, spawn


def labelled_step(comm, x):
    yield Compute(0.0, "forward of layer 3", work=lambda: x.add_(0))
    return x


def _profile() -> list[str]:
    driver = Driver()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        driver.run(ring_allreduce, torch.ones(64))
        driver.run(labelled_step, torch.ones(4))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"trace{dist.get_rank()}.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as file:
            events = json.load(file)["traceEvents"]
    return [event.get("name", "") for event in events]


def test_collectives_and_labelled_steps_are_named_in_a_profiler_trace() -> None:
    for names in spawn(_profile, 2, timeout=120):
        assert "realcomm:ring_allreduce" in names
        assert "realcomm:labelled_step" in names
        assert "forward of layer 3" in names
