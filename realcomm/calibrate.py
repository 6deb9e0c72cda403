"""Measure what the simulator's cost model needs on the machine at hand and write it down.

``realcomm calibrate --out FILE.json`` writes the measurements as a file (``Measurements``,
described in docs/calibration.md); ``simcomm fit FILE.json`` fits the model to it and
writes a topology file. Measured here, each through the realcomm driver, so that the
driver's own cost per message is part of what is fitted:

* exchange: every rank sends n bytes to its right neighbour and receives n bytes from its
  left at once, the step of a ring (on two ranks, a pairwise exchange), so that it is
  measured under the contention the collectives meet;
* ping-pong: half a round trip between ranks 0 and 1, in one run, as dependent one-way
  messages follow each other in a collective;
* stream: ``BURST`` messages one way, back to back; not fitted, a check of the fit;
* concurrent sends: rank 0 sends n bytes to two peers at once, against one peer (world size
  3 or more): whether a rank's sends share its bandwidth;
* local reduction: ``add_`` of n bytes into n bytes on the tensor's device, on every rank
  at once (on one host they share its memory bandwidth).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from algorithms.collectives import Schedule
from algorithms.ops import Comm, Recv, Send, Wait
from realcomm.bench import WARMUP_ITERS, time_runs
from realcomm.driver import Driver

FORMAT_NAME = "realcomm-calibration"  # the measurements file, as simcomm fit reads it
FORMAT_VERSION = 1
BURST = 8  # messages per stream measurement


@dataclass(frozen=True)
class Measurements:
    """Everything ``realcomm calibrate`` measured: seconds per size in bytes."""

    world_size: int
    device: str
    timing: str  # the statistic of the timed runs: "mean" or "median" (realcomm.bench)
    sizes: tuple[int, ...]  # bytes
    exchange: tuple[float, ...]  # seconds: a ring step
    pingpong: tuple[float, ...]  # seconds one way: half a round trip
    stream: tuple[float, ...]  # seconds per message, BURST back to back, one way
    reduction: tuple[float, ...]  # seconds
    concurrent_ratio: float | None  # time to two peers at once / to one, at the largest size

    def to_json(self) -> str:
        """The measurements file: a JSON object with the format's name and version, and
        units in the keys (docs/calibration.md)."""
        return json.dumps({
            "format": {"name": FORMAT_NAME, "version": FORMAT_VERSION},
            "world_size": self.world_size,
            "device": self.device,
            "timing": self.timing,
            "burst": BURST,
            "sizes_bytes": list(self.sizes),
            "exchange_seconds": list(self.exchange),
            "pingpong_seconds": list(self.pingpong),
            "stream_seconds": list(self.stream),
            "reduction_seconds": list(self.reduction),
            "concurrent_ratio": self.concurrent_ratio,
        }, indent=2, allow_nan=False) + "\n"

    def format(self) -> str:
        """The measurements as a table."""
        lines = [f"{'size (B)':>10} {'exchange':>9} {'ping-pong':>9} {'stream':>9} "
                 f"{'reduce':>9}   (microseconds)"]
        for row in zip(self.sizes, self.exchange, self.pingpong, self.stream, self.reduction):
            lines.append(f"{row[0]:>10} " + " ".join(f"{t * 1e6:>9.1f}" for t in row[1:]))
        if self.concurrent_ratio is not None:
            lines.append(f"two peers at once / one peer, largest size: "
                         f"{self.concurrent_ratio:.2f} (1 = independent links, 2 = shared)")
        return "\n".join(lines)


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


def check_sizes(sizes: Sequence[int]) -> None:
    """Refuse sizes ``measure`` cannot fit a link to: fewer than two distinct ones, or one
    that is not a multiple of 4 bytes (float32 buffers)."""
    if len(set(sizes)) < 2 or any(n < 4 or n % 4 for n in sizes):
        raise ValueError(f"give at least two sizes, multiples of 4 bytes, got {list(sizes)}")


def measure(sizes: Sequence[int], iters: int = 20, warmup: int = WARMUP_ITERS,
            device: torch.device | str = "cpu", timing: str = "mean", rounds: int = 1
            ) -> Measurements:
    """Measure on this process group (collective: every rank calls it).

    ``sizes`` in bytes (float32 buffers, so multiples of 4); at least two ranks. ``timing``
    as ``realcomm bench``'s: calibrate with the statistic the predictions are to match.
    With ``rounds`` > 1 every size is measured once per round and the rounds are combined
    (``combine``).
    """
    world = dist.get_world_size()
    if world < 2:
        raise ValueError("calibration needs at least 2 ranks")
    check_sizes(sizes)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    driver = Driver()
    return combine([_measure_round(driver, sizes, iters, warmup, torch.device(device), timing)
                    for _ in range(rounds)])


def _measure_round(driver: Driver, sizes: Sequence[int], iters: int, warmup: int,
                   device: torch.device, timing: str) -> Measurements:
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
    return Measurements(world, str(device), timing, tuple(sizes), tuple(exchange),
                        tuple(pingpong), tuple(stream), tuple(reduction), concurrent)


def combine(rounds: Sequence[Measurements]) -> Measurements:
    """Several measurements of one machine as one: per size, the median of each
    measurement over the rounds. Rounds spread over time (``realcomm calibrate --rounds``,
    or taking turns with the runs to be predicted) so that a slow spell of a busy machine
    falls on one round of several rather than on the whole calibration."""
    if not rounds:
        raise ValueError("nothing to combine")
    first = rounds[0]
    for other in rounds[1:]:
        if (other.world_size, other.device, other.timing, other.sizes) != (
                first.world_size, first.device, first.timing, first.sizes):
            raise ValueError("measurements to combine must share world size, device, timing "
                             "and sizes")

    def median(field: str) -> tuple[float, ...]:
        columns = zip(*(getattr(m, field) for m in rounds))
        return tuple(statistics.median(column) for column in columns)

    ratios = [m.concurrent_ratio for m in rounds if m.concurrent_ratio is not None]
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
