"""Where independent runs go: this process, local processes, or a dask.distributed cluster.

``simcomm sweep`` runs its grid points there and ``--samples`` its seeded runs: ``executor(
jobs, scheduler, total)`` yields a ``concurrent.futures.Executor`` (a process pool, or the
cluster's ``Client.get_executor()``), or None where the runs had best stay in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager

SCHEDULER_TIMEOUT = "10s"  # to reach a dask scheduler before giving up


def default_jobs() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextmanager
def executor(jobs: int, scheduler: str | None, total: int) -> Iterator[Executor | None]:
    """The dask.distributed cluster whose scheduler is at ``scheduler`` (``tcp://host:8786``;
    its workers need this package installed), else ``jobs`` local processes, or None (run
    here) for one job or one run."""
    if scheduler is not None:
        try:
            from distributed import Client
        except ImportError:
            raise ValueError("a scheduler needs dask.distributed: pip install "
                             "'simcomm[dask]'") from None
        with Client(scheduler, timeout=SCHEDULER_TIMEOUT) as client:
            yield client.get_executor()
    elif jobs == 1 or total <= 1:
        yield None
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, total)) as pool:
            yield pool
