"""Measure what the simulator's cost model needs on the machine at hand, fit it, and write a
topology file that ``simcomm`` loads.

The model (``simcomm.engine``): a message of n bytes holds each link of its route for
gap + n / bandwidth and arrives a latency later; a receive that reduces costs n / R more on
the receiver. Measured here, each through the realcomm driver, so that the driver's own
cost per message is part of what is fitted:

* exchange: every rank sends n bytes to its right neighbour and receives n bytes from its
  left at once, the step of a ring (on two ranks, a pairwise exchange), so that it is
  measured under the contention the collectives meet;
* ping-pong: half a round trip between ranks 0 and 1, in one run, as dependent one-way
  messages follow each other in a collective;
* stream: 8 messages one way, back to back; not fitted, a check of the fit;
* concurrent sends: rank 0 sends n bytes to two peers at once, against one peer (world size
  3 or more): whether a rank's sends share its bandwidth;
* local reduction: ``add_`` of n bytes into n bytes on the tensor's device, on every rank
  at once (on one host they share its memory bandwidth); fitted as n / R plus a fixed cost,
  weighed against the exchange of the same size.

The links are fitted to the exchange and the ping-pong at once as LogGP's latency L, gap g
and bandwidth B (``fit_links``). When an exchange takes well over a one-way message (the
directions share one medium, as over loopback on few cores) the topology routes every
message over one shared link at p x B; otherwise each pair of ranks gets a link each way at
B (``Calibration.topology``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from algorithms.collectives import Schedule
from algorithms.ops import Comm, Recv, Send, Wait
from realcomm.bench import WARMUP_ITERS, time_runs
from realcomm.driver import Driver
from simcomm.topofile import dump_topology
from simcomm.topology import Link, Topology

BURST = 8  # messages per stream measurement
# An exchange this much slower than a one-way message means the two directions share one
# medium. Measured on a 2-core machine with gloo over loopback: 1.98 to 2.4 from 1 MiB up.
SHARED_MEDIUM_RATIO = 1.4


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
    bandwidth pB; otherwise each pair has a link each way of bandwidth B. ``errors``: per
    measurement, the median and largest relative error of the fit over the sizes."""

    latency: float  # seconds
    gap: float  # seconds
    bandwidth: float  # bytes/second
    shared: bool
    world_size: int
    errors: Mapping[str, tuple[float, float]]

    def predict(self, what: str, nbytes: float) -> float:
        """Seconds the model gives a measurement (``exchange``, ``ping-pong`` or ``stream``,
        per message) of ``nbytes``."""
        p = self.world_size if self.shared else 1
        return _link_terms(what, nbytes, p) @ np.array([self.latency, self.gap,
                                                         1.0 / self.bandwidth])


def _link_terms(what: str, nbytes: float, p: int) -> np.ndarray:
    # The measurement as a linear function of (L, g, 1/B), with p the ranks sharing the
    # medium (1 for full-duplex links). A ring step: p messages one after another on the
    # medium, each g + n/(pB); a one-way message: one of them; a stream of BURST messages
    # back to back: one latency over the burst.
    if what == "exchange":
        return np.array([1.0, p, nbytes])
    if what == "ping-pong":
        return np.array([1.0, 1.0, nbytes / p])
    if what == "stream":
        return np.array([1.0 / BURST, 1.0, nbytes / p])
    raise ValueError(f"unknown measurement {what!r}")


@dataclass(frozen=True)
class Calibration:
    """Everything measured (seconds per size in bytes) and the fits."""

    world_size: int
    device: str
    timing: str  # the statistic of the timed runs: "mean" or "median" (realcomm.bench)
    sizes: tuple[int, ...]
    exchange: tuple[float, ...]
    pingpong: tuple[float, ...]  # one way: half a round trip
    stream: tuple[float, ...]  # per message, back to back, one way
    reduction: tuple[float, ...]
    concurrent_ratio: float | None  # time to two peers at once / to one, at the largest size

    @property
    def link(self) -> LinkFit:
        """The links fitted to the exchange and ping-pong times at once (``fit_links``)."""
        return fit_links(self.sizes, self.exchange, self.pingpong, self.stream,
                         self.world_size, self.shared_medium)

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
        lines = [f"# {name}: fitted by realcomm calibrate on {self.world_size} ranks "
                 f"({self.device}), {self.timing} times"]
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
              stream: Sequence[float], world_size: int, shared: bool) -> LinkFit:
    """Least squares of the exchange and ping-pong times at once, on relative error (so
    that small and large sizes count alike), with L >= 0 and g >= 0: the best of the fits
    with each of them free or held at 0 that keep them non-negative. The stream is not
    fitted; its error says how well the fit predicts a third measurement. With full-duplex
    links an exchange and a one-way message cost alike, L + g + n/B, which cannot tell L from
    g: the gap is then held at 0."""
    p = world_size if shared else 1
    fitted = {"exchange": exchange, "ping-pong": pingpong}
    rows = np.array([_link_terms(what, n, p) for what in fitted for n in sizes])
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
        relative = [abs(_link_terms(what, n, p) @ best[1] - t) / t
                    for n, t in zip(sizes, values)]
        errors[what] = (statistics.median(relative), max(relative))
    return LinkFit(float(latency), float(gap), float(1.0 / inverse_bandwidth), shared,
                   world_size, MappingProxyType(errors))


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


def _ring_step(comm: Comm, x: torch.Tensor, out: torch.Tensor) -> Schedule:
    # Every rank sends to its right neighbour and receives from its left at once: the step
    # of a ring, and on two ranks a pairwise exchange.
    sent = yield Send((comm.rank + 1) % comm.size, x)
    received = yield Recv((comm.rank - 1) % comm.size, out)
    yield Wait(sent, received)


def _round_trip(comm: Comm, x: torch.Tensor, out: torch.Tensor) -> Schedule:
    # Rank 0 sends to rank 1, which sends back once it has the message: two dependent
    # one-way messages in one run, as a reduce then a broadcast chain them.
    if comm.rank == 0:
        yield Wait((yield Send(1, x)))
        yield Wait((yield Recv(1, out)))
    elif comm.rank == 1:
        yield Wait((yield Recv(0, out)))
        yield Wait((yield Send(0, x)))


def _one_way(comm: Comm, x: torch.Tensor, src: int, dst: int, out: Sequence[torch.Tensor]
             ) -> Schedule:
    # One message of x from src to dst per buffer of ``out``, all posted at once.
    handles = []
    for buf in out:
        if comm.rank == src:
            handles.append((yield Send(dst, x)))
        elif comm.rank == dst:
            handles.append((yield Recv(src, buf)))
    if handles:
        yield Wait(*handles)


def _fan_out(comm: Comm, x: torch.Tensor, peers: Sequence[int]) -> Schedule:
    handles = []
    if comm.rank == 0:
        for peer in peers:
            handles.append((yield Send(peer, x)))
    elif comm.rank in peers:
        handles.append((yield Recv(0, x)))
    if handles:
        yield Wait(*handles)


def _timed(run: Callable[[], Any], iters: int, warmup: int, device: torch.device,
           timing: str) -> float:
    """Seconds per run, timed as ``realcomm bench`` times a collective."""
    return time_runs(lambda check_args: run(), warmup, iters, device, timing)


def measure(sizes: Sequence[int], iters: int = 20, warmup: int = WARMUP_ITERS,
            device: torch.device | str = "cpu", timing: str = "mean", rounds: int = 1
            ) -> Calibration:
    """Measure on this process group (collective: every rank calls it).

    ``sizes`` in bytes (float32 buffers, so multiples of 4); at least two ranks. ``timing``
    as ``realcomm bench``'s: calibrate with the statistic the predictions are to match.
    With ``rounds`` > 1 every size is measured once per round and the rounds are combined
    (``combine``).
    """
    world = dist.get_world_size()
    if world < 2:
        raise ValueError("calibration needs at least 2 ranks")
    if len(set(sizes)) < 2 or any(n < 4 or n % 4 for n in sizes):
        raise ValueError(f"give at least two sizes, multiples of 4 bytes, got {list(sizes)}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    driver = Driver()
    return combine([_measure_round(driver, sizes, iters, warmup, torch.device(device), timing)
                    for _ in range(rounds)])


def _measure_round(driver: Driver, sizes: Sequence[int], iters: int, warmup: int,
                   device: torch.device, timing: str) -> Calibration:
    world = driver.comm.size
    exchange, pingpong, stream, reduction = [], [], [], []
    for n in sizes:
        x = torch.ones(n // 4, device=device)
        out = torch.empty_like(x)
        burst_out = [torch.empty_like(x) for _ in range(BURST)]

        def swap() -> None:
            driver.run(_ring_step, x, out=out, check_args=False)

        def round_trip() -> None:
            driver.run(_round_trip, x, out=out, check_args=False)

        def burst() -> None:
            driver.run(_one_way, x, src=0, dst=1, out=burst_out, check_args=False)

        exchange.append(_timed(swap, iters, warmup, device, timing))
        pingpong.append(_timed(round_trip, iters, warmup, device, timing) / 2)
        stream.append(_timed(burst, max(iters // BURST, 1), 1, device, timing) / BURST)
        reduction.append(_local_add_seconds(x, iters))
    concurrent = None
    if world >= 3:
        x = torch.ones(max(sizes) // 4, device=device)
        one = _timed(lambda: driver.run(_fan_out, x, peers=[1], check_args=False), iters,
                     warmup, device, timing)
        two = _timed(lambda: driver.run(_fan_out, x, peers=[1, 2], check_args=False), iters,
                     warmup, device, timing)
        concurrent = two / one
    return Calibration(world, str(device), timing, tuple(sizes), tuple(exchange),
                       tuple(pingpong), tuple(stream), tuple(reduction), concurrent)


def combine(calibrations: Sequence[Calibration]) -> Calibration:
    """Several calibration runs of one machine as one: per size, the median of each
    measurement over the runs. Runs spread over time (``realcomm calibrate --rounds``, or
    taking turns with the runs to be predicted) so that a slow spell of a busy machine
    falls on one run of several rather than on the whole calibration."""
    if not calibrations:
        raise ValueError("nothing to combine")
    first = calibrations[0]
    for other in calibrations[1:]:
        if (other.world_size, other.device, other.timing, other.sizes) != (
                first.world_size, first.device, first.timing, first.sizes):
            raise ValueError("calibrations to combine must share world size, device, timing "
                             "and sizes")

    def median(field: str) -> tuple[float, ...]:
        columns = zip(*(getattr(c, field) for c in calibrations))
        return tuple(statistics.median(column) for column in columns)

    ratios = [c.concurrent_ratio for c in calibrations if c.concurrent_ratio is not None]
    return replace(first, exchange=median("exchange"), pingpong=median("pingpong"),
                   stream=median("stream"), reduction=median("reduction"),
                   concurrent_ratio=statistics.median(ratios) if ratios else None)


def _local_add_seconds(x: torch.Tensor, iters: int) -> float:
    # Every rank adds at once, as in a reduce-scatter or a ring step, where the ranks of one
    # host share its memory bandwidth: on a 2-core CPU machine two concurrent adds of 32 MiB
    # took 1.7x to 2x as long as one alone. The median of the slowest rank's times.
    acc = torch.zeros_like(x)
    samples = []
    for _ in range(iters + 1):
        dist.barrier()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        start = time.perf_counter()
        acc.add_(x)
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        samples.append(time.perf_counter() - start)
    mine = torch.tensor([statistics.median(samples[1:])], dtype=torch.float64, device=x.device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine.item())


DEFAULT_SIZES = tuple(4 * 4**k for k in range(13))  # 16 B .. 64 MiB
