"""Random variation of a machine, seeded: how much later each message leaves, and how much
longer or shorter each computation takes, drawn from named distributions.

* ``Distribution``: ``normal`` (mean, standard deviation; draws below zero count as zero),
  ``lognormal`` (median, sigma of the log), ``uniform`` (low, high) or ``empirical`` (draws
  from measured samples, with replacement). ``Distribution.parse("lognormal:1,0.05")`` reads
  the command line's form; delays take units (``normal:2us,0.5us``).
* ``Variation(seed, message_delay, compute_factor, message_slowdown)``: every message leaves
  a draw of ``message_delay`` seconds late and holds each link of its route a draw of
  ``message_slowdown`` times as long for its bytes (as if it crossed at that fraction of the
  bandwidth: noise in throughput, which grows with the size of a message, where a delay
  does not); every ``Compute`` takes a draw of ``compute_factor`` times its seconds. A
  factor may not be 0 by construction (a uniform from 0, a normal of mean 0, an empirical
  sample of 0): that work would be free. The same seed gives the same run.
* ``sample_times(run, samples, seed, jobs, scheduler=...)`` runs ``run(seed)`` for
  ``samples`` seeds, in local processes or on a dask.distributed cluster, and ``Samples``
  gives the median, the 90th and 99th percentiles.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcomm.executors import executor
from simcomm.units import parse_seconds

KINDS = ("normal", "lognormal", "uniform", "empirical")


@dataclass(frozen=True)
class Distribution:
    """A named distribution of a quantity >= 0 (see the module doc)."""

    kind: str
    params: tuple[float, ...] = ()  # normal: mean, sd; lognormal: median, sigma; uniform: lo, hi
    samples: tuple[float, ...] = ()  # empirical only

    def __post_init__(self) -> None:
        _known(self.kind)
        for name in ("params", "samples"):
            values = getattr(self, name)
            if not isinstance(values, (tuple, list)) or any(
                    isinstance(v, bool) or not isinstance(v, numbers.Real) for v in values):
                raise ValueError(f"{self.kind}: {name} must be a tuple of numbers, got "
                                 f"{values!r}")
        if self.kind == "empirical":
            if not self.samples or any(not (math.isfinite(v) and v >= 0) for v in self.samples):
                raise ValueError("an empirical distribution needs samples, finite and >= 0")
            return
        if len(self.params) != 2 or any(not math.isfinite(v) for v in self.params):
            raise ValueError(f"{self.kind} takes two finite numbers, got {self.params!r}")
        first, second = self.params
        if (second < 0 or first < 0 or (self.kind == "lognormal" and first == 0)
                or (self.kind == "uniform" and second < first)):
            raise ValueError(f"{self.kind}{self.params!r}: " + {
                "normal": "the mean and the standard deviation must be >= 0",
                "lognormal": "the median must be > 0 and sigma >= 0",
                "uniform": "need 0 <= low <= high"}[self.kind])

    def check_factor(self, what: str) -> None:
        """Refuse this distribution as a factor (``what``) if it can draw only 0 or has
        draws of 0 by construction: a factor of 0 makes a message or a computation free."""
        low = (min(self.samples) if self.kind == "empirical" else self.params[0])
        if self.kind != "lognormal" and low <= 0:
            raise ValueError(f"{what}: a factor of 0 makes the work free; " + {
                "normal": "the mean must be > 0",
                "uniform": "the low end must be > 0",
                "empirical": "every sample must be > 0"}[self.kind])

    def draw(self, rng: np.random.Generator) -> float:
        """One draw."""
        if self.kind == "normal":
            return max(0.0, float(rng.normal(*self.params)))
        if self.kind == "lognormal":
            median, sigma = self.params
            return float(rng.lognormal(math.log(median), sigma))
        if self.kind == "uniform":
            return float(rng.uniform(*self.params))
        return self.samples[int(rng.integers(len(self.samples)))]

    @classmethod
    def parse(cls, text: str, seconds: bool = False) -> Distribution:
        """``KIND:A,B`` (``normal:2us,0.5us`` with ``seconds``, ``lognormal:1,0.05``), or
        ``empirical:FILE`` (one sample a line)."""
        kind, colon, rest = text.partition(":")
        kind = kind.strip()
        if not colon:
            raise ValueError(f"{text!r}: give KIND:A,B (one of {', '.join(KINDS)})")
        _known(kind)  # before its numbers, which it gives the meaning of
        if kind == "empirical":
            if not rest.strip():
                raise ValueError(f"{text!r}: give empirical:FILE (one sample a line)")
            path = Path(rest.strip())
            try:
                content = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                reason = getattr(error, "strerror", None) or str(error)
                raise ValueError(f"cannot read {str(path)!r}: {reason}") from None
            lines = [line.strip() for line in content.splitlines() if line.strip()]
            return cls(kind, samples=tuple(_number(line, seconds, text) for line in lines))
        # A lognormal's sigma spreads the log, whatever the median's unit: it has none.
        return cls(kind, tuple(_number(part, seconds and not (kind == "lognormal" and i == 1),
                                       text, unit=seconds)
                               for i, part in enumerate(rest.split(","))))


def _known(kind: str) -> None:
    """Refuse a ``kind`` that is not one of ``KINDS``, naming it."""
    if kind not in KINDS:
        raise ValueError(f"unknown distribution {kind!r}; known: {', '.join(KINDS)}")


def _number(text: str, seconds: bool, whole: str, unit: bool = False) -> float:
    """``text`` as seconds (``unit``: it must have one) or as a plain number. A minus sign
    is read, so that the distribution's own check says why a value below zero is refused."""
    bare = text.strip()
    try:
        if not seconds:
            return float(bare)
        magnitude = parse_seconds(bare.removeprefix("-"), require_unit=unit)
        return -magnitude if bare.startswith("-") else magnitude
    except ValueError:
        what = (" of seconds with a unit (2us, 0.5ms)" if seconds
                else " (a lognormal's sigma has no unit)" if unit else "")
        raise ValueError(f"{whole!r}: {text.strip()!r} is not a number{what}") from None


@dataclass(frozen=True)
class Variation:
    """Seeded random variation of a run (see the module doc)."""

    seed: int
    message_delay: Distribution | None = None  # seconds
    compute_factor: Distribution | None = None  # times each Compute's seconds
    message_slowdown: Distribution | None = None  # times each message's bytes on a link

    def __post_init__(self) -> None:
        if type(self.seed) is not int or self.seed < 0:
            raise ValueError(f"Variation.seed must be an int >= 0, got {self.seed!r}")
        for name in ("message_delay", "compute_factor", "message_slowdown"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Distribution):
                raise TypeError(f"Variation.{name} must be a Distribution or None (parse "
                                f"text with Distribution.parse), got {value!r}")
        for name in ("compute_factor", "message_slowdown"):
            factor = getattr(self, name)
            if factor is not None:
                factor.check_factor(f"Variation.{name}")


@dataclass(frozen=True)
class Samples:
    """Times of seeded runs (seconds), and their statistics."""

    times: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("Samples needs at least one time")

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0 to 100), interpolated."""
        return float(np.percentile(self.times, q))

    def format(self, what: str = "step") -> str:
        """One line: median, p90, p99, least and most, in milliseconds."""
        ms = [f"{self.percentile(q) * 1e3:.3f}" for q in (50, 90, 99)]
        return (f"{len(self.times)} samples: {what} median {ms[0]} ms, p90 {ms[1]} ms, "
                f"p99 {ms[2]} ms (least {min(self.times) * 1e3:.3f}, most "
                f"{max(self.times) * 1e3:.3f})")


def sample_times(run: Callable[[int], float], samples: int, seed: int = 0, jobs: int = 1,
                 on_done: Callable[[], None] | None = None, scheduler: str | None = None
                 ) -> Samples:
    """``run(seed)`` for seeds ``seed``, ``seed + 1``, ... (``samples`` of them): here, in
    ``jobs`` local processes, or on the dask.distributed cluster at ``scheduler``
    (``simcomm.executors``; ``run`` must then pickle: a module-level function or a partial
    of one); ``on_done()`` after each. The times are in the order of the seeds, wherever
    they ran."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    for name, value, least in (("jobs", jobs, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if not callable(run):
        raise TypeError(f"run must be callable (seed) -> seconds, got {run!r}")
    seeds: Sequence[int] = range(seed, seed + samples)
    times = []
    with executor(jobs, scheduler, samples) as pool:
        for time in (map if pool is None else pool.map)(run, seeds):
            times.append(time)
            if on_done:
                on_done()
    return Samples(tuple(times))
