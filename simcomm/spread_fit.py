"""Fit the random variation under which simulated runs spread as measured runs do.

Measured: every timed run of each size (``realcomm bench -I -a 3 --format json`` keeps them).
Modelled: the topology gives a typical run (a topology that ``simcomm fit`` made from
``realcomm calibrate``'s measurements, say), and ``Variation`` adds two draws per message:

* ``message_slowdown``, lognormal(m, s): the message holds its links m times as long, give
  or take a factor exp(s); noise in throughput, whose effect grows with the message;
* ``message_delay``, lognormal(d, t) seconds: it leaves late; a fixed cost whatever its
  size, such as a process that waits for a core before it can send, which weighs most on
  small messages.

``fit_spread`` chooses m, s, d and t so that the simulated median and 90th percentile of
every size come as close as they can to the measured ones: least squares on the logarithm
of their ratios, by Nelder-Mead (scipy), with the same seeds at every trial so that the
objective moves with the parameters only, not with the draws.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simcomm.variation import Distribution, Variation

PERCENTILES = (50, 90)  # the statistics fitted, and reported
SAMPLES = 200  # seeded runs a size, at every trial
MAX_SAMPLES = 10_000  # beyond this a fit runs for days; the percentiles are steady long before
MAX_TRIALS = 400  # of the optimiser, each SAMPLES runs of every size
# A run of one size with a variation, in seconds: the simulator, for the fit.
Runner = Callable[[int, Variation], float]


@dataclass(frozen=True)
class SizeSpread:
    """The fitted statistics of one size beside the measured ones (seconds)."""

    size: int  # bytes
    measured: tuple[float, ...]  # PERCENTILES of the measured runs
    simulated: tuple[float, ...]  # the same of the simulated runs, fitted variation
    nominal: float  # the simulated run without variation

    def errors(self) -> tuple[float, ...]:
        """Simulated over measured, less 1, per percentile."""
        return tuple(s / m - 1 for s, m in zip(self.simulated, self.measured))


@dataclass(frozen=True)
class SpreadFit:
    """A fitted variation and how each size's spread compares."""

    variation: Variation  # seed 0
    sizes: tuple[SizeSpread, ...]
    trials: int  # of the optimiser
    samples: int  # seeded runs a size at each trial

    def flags(self) -> str:
        """The fitted variation as the commands' flags."""
        delay, slowdown = self.variation.message_delay, self.variation.message_slowdown
        assert delay is not None and slowdown is not None
        return (f"--message-delay lognormal:{delay.params[0] * 1e6:.4g}us,"
                f"{delay.params[1]:.4g} --message-slowdown lognormal:"
                f"{slowdown.params[0]:.4g},{slowdown.params[1]:.4g}")

    def format(self) -> str:
        """A table of each size's measured and simulated percentiles, then the flags."""
        names = [f"p{q}" for q in PERCENTILES]
        lines = ["# size (B)   nominal (ms)  " + "  ".join(
            f"{'measured ' + n:>12}  {'simulated ' + n:>13}  {'error':>7}" for n in names)]
        for row in self.sizes:
            cells = "  ".join(f"{m * 1e3:12.3f}  {s * 1e3:13.3f}  {e * 100:+6.1f}%"
                              for m, s, e in zip(row.measured, row.simulated, row.errors()))
            lines.append(f"{row.size:11d}  {row.nominal * 1e3:13.3f}  {cells}")
        worst = max(abs(e) for row in self.sizes for e in row.errors())
        lines.append(f"# largest error {worst * 100:.1f}% ({self.trials} trials of "
                     f"{self.samples} seeded runs a size)")
        lines.append(f"# fitted: {self.flags()}")
        return "\n".join(lines)


def fit_spread(run: Runner, measured: Mapping[int, Sequence[float]], samples: int = SAMPLES,
               max_trials: int = MAX_TRIALS,
               progress: Callable[[], None] | None = None) -> SpreadFit:
    """The lognormal delay and slowdown (see the module doc) under which ``run(size,
    variation)`` spreads as the ``measured`` runs of each size (seconds) do; ``progress()``
    is told of every trial (at most ``max_trials``, each ``samples`` runs of every size)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not (
            5 <= samples <= MAX_SAMPLES):
        raise ValueError(f"samples must be an int from 5 to {MAX_SAMPLES}, got {samples!r}")
    if not measured:
        raise ValueError("no measured sizes to fit")
    for size, times in measured.items():
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size {size!r}: sizes are bytes > 0 (a run of 0 B moves no "
                             "message whose spread could be fitted)")
        if len(times) < 5 or any(not (math.isfinite(t) and t > 0) for t in times):
            raise ValueError(f"size {size}: need 5 or more measured runs, each finite and "
                             f"> 0 seconds (realcomm bench -I keeps them), got {len(times)}")
    try:
        from scipy.optimize import minimize
    except ImportError:
        raise ValueError("fitting the spread needs scipy: pip install 'simcomm[fit]'") from None
    sizes = sorted(measured)
    targets = np.log([[np.percentile(measured[s], q) for q in PERCENTILES] for s in sizes])

    def percentiles(x: np.ndarray) -> np.ndarray:
        variation = _variation(x)
        return np.array([np.percentile([run(size, replace(variation, seed=seed))
                                        for seed in range(samples)], PERCENTILES)
                         for size in sizes])

    def loss(x: np.ndarray) -> float:
        if progress is not None:
            progress()
        return float(np.sum((np.log(percentiles(x)) - targets) ** 2))

    # Start where the largest size's median says the slowdown is, with a small delay, and
    # take first steps of a factor e in the delay and of 10% in the slowdown.
    nominal = [run(size, Variation(0)) for size in sizes]
    if min(nominal) <= 0:
        raise ValueError("the simulated run takes no time (one rank?): there is no spread of "
                         "messages to fit")
    slowdown = max(float(np.exp(targets[-1, 0])) / nominal[-1], 0.1)
    start = np.array([math.log(0.02 * float(np.exp(targets[0, 0]))), 1.0,
                      math.log(slowdown), 0.1])
    simplex = np.vstack([start, start + np.diag([1.0, 0.5, 0.1, 0.1])])
    result = minimize(loss, start, method="Nelder-Mead",
                      options={"maxfev": max_trials, "xatol": 1e-3, "fatol": 1e-6,
                               "initial_simplex": simplex})
    fitted = percentiles(result.x)
    rows = tuple(SizeSpread(size, tuple(float(np.exp(t)) for t in target),
                            tuple(float(v) for v in values), base)
                 for size, target, values, base in zip(sizes, targets, fitted, nominal))
    return SpreadFit(_variation(result.x), rows, int(result.nfev), samples)


def _variation(x: np.ndarray) -> Variation:
    """The variation of the optimiser's point: log delay, its sigma, log slowdown, its
    sigma (the sigmas' signs do not matter)."""
    # Kept within what a machine can show, so that no trial over- or underflows.
    log_delay, delay_sigma, log_slowdown, slowdown_sigma = np.clip(
        x, [-30.0, -10.0, -5.0, -5.0], [5.0, 10.0, 5.0, 5.0]).tolist()
    return Variation(0, Distribution("lognormal", (math.exp(log_delay), abs(delay_sigma))),
                     message_slowdown=Distribution("lognormal", (math.exp(log_slowdown),
                                                                 abs(slowdown_sigma))))


def read_runs(path: str | Path) -> dict[int, list[float]]:
    """Every run's seconds by size, from ``realcomm bench -I --format json``'s output."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read measured runs: {error}") from None
    except RecursionError:  # json recurses once per level of nesting
        raise ValueError(f"{path}: cannot read measured runs: arrays or objects nested too "
                         "deep") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a JSON list of rows (realcomm bench -I --format "
                         "json)")
    runs = {}
    for number, row in enumerate(rows, 1):
        spread = row.get("spread") if isinstance(row, dict) else None
        if not isinstance(spread, dict) or not isinstance(spread.get("runs_us"), list):
            raise ValueError(f"{path}: row {number} has no runs: measure with realcomm bench "
                             "-I --format json")
        if not isinstance(row.get("size"), int) or row["size"] in runs:
            raise ValueError(f"{path}: row {number}: its size is missing or repeated")
        times = spread["runs_us"]
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
            raise ValueError(f"{path}: row {number}: runs_us holds something other than "
                             "numbers")
        try:
            runs[row["size"]] = [float(t) / 1e6 for t in times]
        except OverflowError:  # an int past a float's range
            raise ValueError(f"{path}: row {number}: runs_us holds a number too large for a "
                             "float") from None
    return runs
