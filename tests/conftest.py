"""Shared test settings: hypothesis profiles and a guard against runs that never end.

``HYPOTHESIS_PROFILE=ci`` (the default) is derandomized so CI is reproducible;
``HYPOTHESIS_PROFILE=dev`` explores random examples, more of them, while developing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

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
