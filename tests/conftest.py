"""Shared test settings: hypothesis profiles, a guard against runs that never end, and a
module of algorithms of a user's own (``user_algorithms``).

``HYPOTHESIS_PROFILE=ci`` (the default) is derandomized so CI is reproducible;
``HYPOTHESIS_PROFILE=dev`` explores random examples, more of them, while developing.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=50, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=300, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HANG_LIMIT_SECONDS = 30.0


class HangError(Exception):
    """A test ran past the hang guard's limit."""


@pytest.fixture
def hang_guard() -> Iterator[None]:
    """Fail the test with ``HangError`` instead of hanging if it runs too long.

    The simulator should end every run, by finishing or by raising; this guard turns a
    violation into a failure. It needs SIGALRM, so it guards nothing where there is none.
    """
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise HangError(f"test still running after {HANG_LIMIT_SECONDS}s: a hang")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_LIMIT_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


USER_ALGORITHMS = """\
from algorithms import SUM, Recv, Send, Wait, ring_allreduce


def my_allreduce(comm, x, op=SUM):
    return (yield from ring_allreduce(comm, x, op))


def my_broadcast(comm, x, root=0):
    if comm.rank == root:
        for peer in range(comm.size):
            if peer != root:
                yield Wait((yield Send(peer, x)))
    else:
        yield Wait((yield Recv(root, x)))
    return x


def small_only(comm, x, op=SUM, limit=256):
    if len(x) > limit:
        raise ValueError(f"small_only takes at most {limit} elements, got {len(x)}")
    return (yield from ring_allreduce(comm, x, op))


def sums_only(comm, x):
    return (yield from ring_allreduce(comm, x))


def not_a_generator(comm, x):
    return x


def no_buffer(comm):
    yield from ()
"""


@pytest.fixture
def user_algorithms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a module of a user's own algorithms (``USER_ALGORITHMS``), in a folder
    that is now the working folder, beside ``NAME_broken`` (whose import fails) and
    ``NAME_needs`` (which imports a package that does not exist). The name is new for each
    test, so no test meets another's module; ``sys.path`` is restored after the test."""
    name = f"user_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(USER_ALGORITHMS, encoding="utf-8")
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom')\n",
                                                encoding="utf-8")
    (tmp_path / f"{name}_needs.py").write_text("import no_such_package_here\n",
                                               encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return name
