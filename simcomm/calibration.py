"""Fit the simulator's cost model to a machine's measurements and make a topology of it.

The measurements come as a file that ``realcomm calibrate --out FILE.json`` writes (JSON,
described in docs/calibration.md); ``simcomm fit`` reads it (``load_calibration``), prints
each measurement beside its fit and writes the fitted topology file.

The model (``simcomm.engine``): a message of n bytes holds each link of its route for
gap + n / bandwidth and arrives a latency later; a receive that reduces costs n / R more on
the receiver. The measurements, each a time in seconds per size in bytes:

* exchange: every rank sends n bytes to its right neighbour and receives n bytes from its
  left at once, the step of a ring (on two ranks, a pairwise exchange);
* ping-pong: half a round trip between ranks 0 and 1, timed in one run;
* stream: a burst of messages one way, back to back, per message; not fitted, a check of
  the fit;
* reduction: a local reduction of n bytes into n bytes, on every rank at once;
* concurrent ratio (world size 3 or more): a rank's sends to two peers at once against one,
  reported, not fitted.

The links are fitted to the exchange and the ping-pong at once as LogGP's latency L, gap g
and bandwidth B (``fit_links``). When an exchange takes well over a one-way message (the
directions share one medium, as over loopback on few cores) the topology routes every
message over one shared link at p x B; otherwise each pair of ranks gets a link each way at
B (``Calibration.topology``). The reduction is fitted as n / R (``fit_line``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from simcomm.topofile import dump_topology
from simcomm.topology import MAX_RANKS, Link, Topology, check_full_mesh

FORMAT_NAME = "realcomm-calibration"  # the measurements file this module reads
FORMAT_VERSION = 1
# An exchange this much slower than a one-way message means the two directions share one
# medium. Measured on a 2-core machine with gloo over loopback: 1.98 to 2.4 from 1 MiB up.
SHARED_MEDIUM_RATIO = 1.4


class CalibrationFileError(ValueError):
    """A measurements file that cannot be read; the message names the file and the key."""


@dataclass(frozen=True)
class Fit:
    """t(n) = fixed + n / rate, and how well it holds: the median and largest error of the
    fit over the measured sizes, relative to what it was fitted against (``fit_line``)."""

    fixed: float  # seconds
    rate: float  # bytes/second
    median_error: float
    max_error: float

    def predict(self, nbytes: float) -> float:
        """Seconds for ``nbytes``."""
        return self.fixed + nbytes / self.rate


@dataclass(frozen=True)
class LinkFit:
    """The links in LogGP's terms (Alexandrov et al., 1995): latency L, a gap g that each
    message holds the link for, and a bandwidth B, per rank's share of a ring step. On a
    shared medium (``shared``) the p messages of a ring step take turns on one link of
    bandwidth pB; otherwise each pair has a link each way of bandwidth B. ``burst``: the
    messages of a stream measurement. ``errors``: per measurement, the median and largest
    relative error of the fit over the sizes."""

    latency: float  # seconds
    gap: float  # seconds
    bandwidth: float  # bytes/second
    shared: bool
    world_size: int
    burst: int
    errors: Mapping[str, tuple[float, float]]

    def predict(self, what: str, nbytes: float) -> float:
        """Seconds the model gives a measurement (``exchange``, ``ping-pong`` or ``stream``,
        per message) of ``nbytes``."""
        p = self.world_size if self.shared else 1
        return _link_terms(what, nbytes, p, self.burst) @ np.array(
            [self.latency, self.gap, 1.0 / self.bandwidth])


def _link_terms(what: str, nbytes: float, p: int, burst: int) -> np.ndarray:
    # The measurement as a linear function of (L, g, 1/B), with p the ranks sharing the
    # medium (1 for full-duplex links). A ring step: p messages one after another on the
    # medium, each g + n/(pB); a one-way message: one of them; a stream of ``burst`` messages
    # back to back: one latency over the burst.
    if what == "exchange":
        return np.array([1.0, p, nbytes])
    if what == "ping-pong":
        return np.array([1.0, 1.0, nbytes / p])
    if what == "stream":
        return np.array([1.0 / burst, 1.0, nbytes / p])
    raise ValueError(f"unknown measurement {what!r}")


@dataclass(frozen=True)
class Calibration:
    """A machine's measurements (seconds per size in bytes, as ``realcomm calibrate`` wrote
    them) and the fits."""

    world_size: int
    device: str
    timing: str  # the statistic of the timed runs: "mean" or "median"
    burst: int  # messages per stream measurement
    sizes: tuple[int, ...]  # bytes
    exchange: tuple[float, ...]  # seconds
    pingpong: tuple[float, ...]  # seconds one way: half a round trip
    stream: tuple[float, ...]  # seconds per message, back to back, one way
    reduction: tuple[float, ...]  # seconds
    concurrent_ratio: float | None  # time to two peers at once / to one, at the largest size

    @property
    def link(self) -> LinkFit:
        """The links fitted to the exchange and ping-pong times at once (``fit_links``)."""
        return fit_links(self.sizes, self.exchange, self.pingpong, self.stream,
                         self.world_size, self.shared_medium, self.burst)

    @property
    def reduce(self) -> Fit:
        """The local reduction fitted as n / R (plus a fixed cost the model leaves out).
        Its error matters as a share of the step it is part of, so it is weighed against
        the exchange of the same size: the fit follows the large sizes, where a reduction
        runs at memory speed, rather than the cache speed of small ones."""
        return fit_line(self.sizes, self.reduction, scale=self.exchange)

    @property
    def duplex_ratio(self) -> float:
        """Exchange time over one-way time (median over sizes from 1 MiB): about 1 when the
        two directions do not slow each other (full-duplex links), about 2 when they share
        one medium."""
        ratios = [e / p for n, e, p in zip(self.sizes, self.exchange, self.pingpong)
                  if n >= 2**20] or [e / p for e, p in zip(self.exchange, self.pingpong)]
        return statistics.median(ratios)

    @property
    def shared_medium(self) -> bool:
        """Whether the measurements call for one shared medium rather than a link per pair
        and direction (the exchange takes well over a one-way message)."""
        return self.duplex_ratio > SHARED_MEDIUM_RATIO

    def topology(self, name: str = "calibrated") -> Topology:
        """The fitted model. Full-duplex: a link each way between every pair of ranks, at B.
        Shared medium: every rank's messages cross one link, ``bus.in -> bus.out``, which
        serves one message at a time at pB (a ring step of p messages then takes
        L + pg + pn / pB, as measured)."""
        fit, reduce_bandwidth = self.link, self.reduce.rate
        gpus = tuple(f"gpu{r}" for r in range(self.world_size))
        if not fit.shared:
            check_full_mesh(self.world_size)
            links = tuple(Link(a, b, fit.bandwidth, fit.latency, fit.gap)
                          for a in gpus for b in gpus if a != b)
            return Topology(name, gpus, links, gpus, (reduce_bandwidth,) * len(gpus))
        bus = Link("bus.in", "bus.out", self.world_size * fit.bandwidth, fit.latency, fit.gap)
        links = (tuple(Link(g, "bus.in", math.inf, 0.0) for g in gpus) + (bus,)
                 + tuple(Link("bus.out", g, math.inf, 0.0) for g in gpus))
        return Topology(name, gpus + ("bus.in", "bus.out"), links, gpus,
                        (reduce_bandwidth,) * len(gpus))

    def topology_toml(self, name: str = "calibrated") -> str:
        """``topology`` as a topology file, with how well the fits hold in its comments."""
        fit, reduce = self.link, self.reduce
        lines = [f"# {name}: fitted by simcomm fit to measurements of realcomm calibrate on "
                 f"{self.world_size} ranks ({self.device}), {self.timing} times"]
        lines += [f"# {what}: median error {median:.1%}, largest {largest:.1%}"
                  + (" (predicted, not fitted)" if what == "stream" else "")
                  for what, (median, largest) in fit.errors.items()]
        lines.append(f"# reduction fit: n/R, median error {reduce.median_error:.1%}, "
                     f"largest {reduce.max_error:.1%} of an exchange of the same size")
        lines.append(f"# exchange / one-way from 1 MiB: {self.duplex_ratio:.2f} -> "
                     + ("one shared medium" if fit.shared else "full-duplex links"))
        return "\n".join(lines) + "\n" + dump_topology(self.topology(name))

    def format(self) -> str:
        """The measurements beside their fits, and the fitted figures."""
        fit, reduce = self.link, self.reduce
        lines = [f"{'size (B)':>10} {'exchange':>9} {'fit':>9} {'ping-pong':>9} {'fit':>9} "
                 f"{'stream':>9} {'fit':>9} {'reduce':>9} {'fit':>9}   (microseconds)"]
        for i, n in enumerate(self.sizes):
            lines.append(f"{n:>10} " + " ".join(f"{t * 1e6:>9.1f}" for t in (
                self.exchange[i], fit.predict("exchange", n), self.pingpong[i],
                fit.predict("ping-pong", n), self.stream[i], fit.predict("stream", n),
                self.reduction[i], reduce.predict(n))))
        medium = (f"one medium shared by the {self.world_size} ranks, at pB = "
                  f"{self.world_size * fit.bandwidth / 1e9:.3f} GB/s" if fit.shared
                  else "a full-duplex link per pair and direction")
        lines.append(f"links: L {fit.latency * 1e6:.2f} us, g {fit.gap * 1e6:.2f} us a message, "
                     f"B {fit.bandwidth / 1e9:.3f} GB/s a rank; {medium}")
        lines.append("link fit errors: " + "; ".join(
            f"{what} median {median:.1%}, largest {largest:.1%}"
            for what, (median, largest) in fit.errors.items()))
        lines.append(f"reduction: R {reduce.rate / 1e9:.3f} GB/s (plus "
                     f"{reduce.fixed * 1e6:.2f} us a call, not modelled); fit error as a "
                     f"share of an exchange of the same size: median "
                     f"{reduce.median_error:.1%}, largest {reduce.max_error:.1%}")
        lines.append(f"exchange / one-way ping-pong from 1 MiB: {self.duplex_ratio:.2f} "
                     f"(1 = full-duplex, 2 = shared)")
        if self.concurrent_ratio is not None:
            lines.append(f"two peers at once / one peer, largest size: "
                         f"{self.concurrent_ratio:.2f} (1 = independent links, 2 = shared)")
        return "\n".join(lines)


def fit_links(sizes: Sequence[int], exchange: Sequence[float], pingpong: Sequence[float],
              stream: Sequence[float], world_size: int, shared: bool, burst: int) -> LinkFit:
    """Least squares of the exchange and ping-pong times at once, on relative error (so
    that small and large sizes count alike), with L >= 0 and g >= 0: the best of the fits
    with each of them free or held at 0 that keep them non-negative. The stream (``burst``
    messages back to back) is not fitted; its error says how well the fit predicts a third
    measurement. With full-duplex links an exchange and a one-way message cost alike,
    L + g + n/B, which cannot tell L from g: the gap is then held at 0."""
    p = world_size if shared else 1
    fitted = {"exchange": exchange, "ping-pong": pingpong}
    rows = np.array([_link_terms(what, n, p, burst) for what in fitted for n in sizes])
    times = np.concatenate([np.asarray(values, dtype=float) for values in fitted.values()])
    weighted_rows, ones = rows / times[:, None], np.ones(len(times))
    best: tuple[float, np.ndarray] | None = None
    faces = ((0, 1, 2), (1, 2), (0, 2), (2,)) if shared else ((0, 2), (2,))
    for free in faces:
        solution = np.zeros(3)
        solution[list(free)] = np.linalg.lstsq(weighted_rows[:, free], ones, rcond=None)[0]
        if solution[0] < 0 or solution[1] < 0 or not solution[2] > 0:
            continue
        residual = float(np.sum((weighted_rows @ solution - ones) ** 2))
        if best is None or residual < best[0]:
            best = (residual, solution)
    if best is None:
        raise ValueError("the measured times do not grow with size: too noisy to fit; "
                         "measure more iterations or larger sizes")
    latency, gap, inverse_bandwidth = best[1]
    errors = {}
    for what, values in {**fitted, "stream": stream}.items():
        relative = [abs(_link_terms(what, n, p, burst) @ best[1] - t) / t
                    for n, t in zip(sizes, values)]
        errors[what] = (statistics.median(relative), max(relative))
    return LinkFit(float(latency), float(gap), float(1.0 / inverse_bandwidth), shared,
                   world_size, burst, MappingProxyType(errors))


def fit_line(sizes: Sequence[int], seconds: Sequence[float],
             scale: Sequence[float] | None = None) -> Fit:
    """Least squares of t = fixed + n / rate, each point's error taken relative to its
    ``scale`` (default: the measured time itself, so that small and large sizes count
    alike). ``fixed`` may come out slightly negative when it is lost in the noise; ``rate``
    must come out positive."""
    w = [1.0 / t for t in (seconds if scale is None else scale)]
    # Minimise sum((w_i (a + b n_i - t_i))^2) over a, b: the 2x2 normal equations.
    s_ww = sum(x * x for x in w)
    s_wwn = sum(x * x * n for x, n in zip(w, sizes))
    s_wwnn = sum(x * x * n * n for x, n in zip(w, sizes))
    s_wwt = sum(x * x * t for x, t in zip(w, seconds))
    s_wwnt = sum(x * x * n * t for x, n, t in zip(w, sizes, seconds))
    det = s_ww * s_wwnn - s_wwn * s_wwn
    if det <= 0:
        raise ValueError("a fit needs at least two different sizes")
    a = (s_wwt * s_wwnn - s_wwn * s_wwnt) / det
    b = (s_ww * s_wwnt - s_wwn * s_wwt) / det
    if not b > 0:
        raise ValueError(f"the measured times do not grow with size (slope {b!r}): too noisy "
                         "to fit; measure more iterations or larger sizes")
    errors = [abs(a + b * n - t) * x for n, t, x in zip(sizes, seconds, w)]
    return Fit(a, 1.0 / b, statistics.median(errors), max(errors))


# -- the measurements file ---------------------------------------------------------------

_TIMES = {"exchange_seconds": "exchange", "pingpong_seconds": "pingpong",
          "stream_seconds": "stream", "reduction_seconds": "reduction"}
_KEYS = ("format", "world_size", "device", "timing", "burst", "sizes_bytes", *_TIMES,
         "concurrent_ratio")


def parse_calibration(text: str, source: str = "<string>") -> Calibration:
    """Read the measurements from the text of a measurements file; ``source`` names it in
    errors. Refuses another format or version, missing or unknown keys, lists of another
    length than ``sizes_bytes`` and times that are not finite and positive."""
    def error(key: str, problem: str) -> CalibrationFileError:
        return CalibrationFileError(f"{source}: {key}: {problem}" if key
                                    else f"{source}: {problem}")

    try:
        data = json.loads(text)
    except json.JSONDecodeError as decode_error:
        raise error("", f"not JSON: {decode_error}") from None
    except RecursionError:  # json recurses once per level of nesting
        raise error("", "arrays or objects nested too deep to read") from None
    if not isinstance(data, dict):
        raise error("", f"must be a JSON object, got {type(data).__name__}")
    expected = {"name": FORMAT_NAME, "version": FORMAT_VERSION}
    form = data.get("format")
    if not isinstance(form, dict) or form.get("name") != FORMAT_NAME:
        raise error("format", f"not a measurements file of realcomm calibrate (expected "
                              f"{json.dumps(expected)}, got {json.dumps(form)})")
    if not _is_int(form.get("version")) or form["version"] != FORMAT_VERSION:
        raise error("format", f"version {json.dumps(form.get('version'))} is not one this "
                              f"simcomm reads (it reads version {FORMAT_VERSION})")
    missing = [key for key in _KEYS if key not in data]
    if missing:
        raise error("", f"missing keys: {', '.join(missing)}")
    unknown = [key for key in data if key not in _KEYS]
    if unknown:
        raise error("", f"unknown keys: {', '.join(unknown)} (allowed: {', '.join(_KEYS)})")

    def count(key: str, least: int) -> int:
        value = data[key]
        if not _is_int(value) or value < least:
            raise error(key, f"must be an integer >= {least}, got {json.dumps(value)}")
        return value

    def text_value(key: str) -> str:
        if not isinstance(data[key], str) or not data[key]:
            raise error(key, f"must be a non-empty string, got {json.dumps(data[key])}")
        return data[key]

    def positive(value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise error(key, f"must be a finite number > 0, got {json.dumps(value)}")
        return float(value)

    def numbers(key: str) -> list[Any]:
        values = data[key]
        if not isinstance(values, list):
            raise error(key, f"must be a list, got {json.dumps(values)}")
        if key != "sizes_bytes" and len(values) != len(data["sizes_bytes"]):
            raise error(key, f"has {len(values)} values for {len(data['sizes_bytes'])} sizes")
        return values

    world_size = count("world_size", 2)
    if world_size > MAX_RANKS:
        raise error("world_size", f"must be at most {MAX_RANKS:,} ranks, got {world_size:,}")
    sizes = numbers("sizes_bytes")
    for i, n in enumerate(sizes):
        if not _is_int(n) or n < 1:
            raise error(f"sizes_bytes[{i}]", f"must be an integer >= 1, got {json.dumps(n)}")
        if n > sys.maxsize:
            raise error(f"sizes_bytes[{i}]", f"{n} B is too large; at most {sys.maxsize} B")
    if len(set(sizes)) < 2:
        raise error("sizes_bytes", f"a fit needs at least two different sizes, got {sizes}")
    times = {field: tuple(positive(t, f"{key}[{i}]") for i, t in enumerate(numbers(key)))
             for key, field in _TIMES.items()}
    ratio = data["concurrent_ratio"]
    return Calibration(
        world_size=world_size, device=text_value("device"),
        timing=text_value("timing"), burst=count("burst", 1), sizes=tuple(sizes), **times,
        concurrent_ratio=None if ratio is None else positive(ratio, "concurrent_ratio"))


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a measurements file (``realcomm calibrate --out FILE.json``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationFileError(f"cannot read measurements file {str(path)!r}: "
                                   f"{error}") from None
    return parse_calibration(text, source=str(path))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
