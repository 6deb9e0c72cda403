"""Fit a topology to one's own nccl-tests run of a collective: the model with NCCL's figures
gives a well-set-up cluster, and most clusters measured are slower at small sizes, some at
large ones too (docs/fidelity.md). Two figures make a preset into that cluster:

* what the cluster adds to every collective beyond the model (``extra_latency``): the median
  of measured minus simulated time over the rows below ``LATENCY_BOUND``, where a
  collective's time is its latency; it is added to the topology's launch latency under every
  protocol, so every collective pays it once;
* what share of its network links' bandwidth the cluster reaches (``network_rate``): the
  factor on every link between nodes (``network_links``), and on a ring channel's ceiling
  between nodes (``Topology.net_channel_bandwidth``), under which the median of
  simulated over measured time is 1 over the rows from ``BANDWIDTH_BOUND``, found by the
  secant method on the logarithms.

The extra latency is fitted first, then the rate, then the extra latency again at that rate
(the rate moves the small sizes a little). What a fit cannot find (no small rows, no large
rows, no links between nodes) it leaves as in the preset and says so.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from simcomm.topology import Topology
from simcomm.units import format_bytes
from simcomm.validate import Comparison, compare_rows, read_measured

# Rows below this size take their latency; from the other bound, their bytes.
LATENCY_BOUND = 64 * 1024
BANDWIDTH_BOUND = 256 * 1024 * 1024
# The network rate a fit may find, as a factor on the links' bandwidth.
RATE_RANGE = (1 / 64, 2.0)
RATE_TOLERANCE = 0.002  # stop once the large rows' median ratio is this close to 1
MAX_RATE_STEPS = 8
# Below this d log(time) / d log(rate), the network's rate does not set the large rows.
MIN_SLOPE = 0.1


@dataclass(frozen=True)
class ClusterFit:
    """The fitted topology, the two figures (``extra_latency`` seconds; ``network_rate``, a
    factor) and the rows each came from; ``notes`` say what could not be fitted."""

    topology: Topology
    extra_latency: float
    network_rate: float
    latency_rows: int
    bandwidth_rows: int
    notes: tuple[str, ...] = ()


def network_links(topology: Topology) -> list[int]:
    """Indices of the links that routes between nodes cross and routes within a node do
    not (a node: ``Topology.ranks_per_node`` consecutive ranks)."""
    per_node = topology.ranks_per_node
    within: set[int] = set()
    between: set[int] = set()
    for src in range(topology.size):
        for dst in range(topology.size):
            if src != dst:
                same = src // per_node == dst // per_node
                (within if same else between).update(topology.route(src, dst))
    return sorted(between - within)


def with_cluster_costs(topology: Topology, extra_latency: float, network_rate: float,
                       name: str | None = None) -> Topology:
    """``topology`` with ``extra_latency`` seconds more launch latency under every protocol
    and its ``network_links``, and a ring channel's ceiling between nodes
    (``Topology.net_channel_bandwidth``), at ``network_rate`` times their bandwidth."""
    if not (math.isfinite(extra_latency) and extra_latency >= -least_launch(topology)):
        raise ValueError(f"extra latency {extra_latency!r} s would make a launch latency "
                         "negative")
    if not (isinstance(network_rate, (int, float)) and 0 < network_rate < math.inf):
        raise ValueError(f"network rate must be a number > 0, got {network_rate!r}")
    scaled = set(network_links(topology))
    links = tuple(replace(link, bandwidth=link.bandwidth * network_rate) if i in scaled
                  else link for i, link in enumerate(topology.links))
    return replace(topology, name=name or topology.name, links=links,
                   launch_latency=topology.launch_latency.scaled(1.0, extra_latency),
                   net_channel_bandwidth=topology.net_channel_bandwidth * network_rate)


def least_launch(topology: Topology) -> float:
    """The smallest of the topology's launch latencies (seconds), its tree's included."""
    launch = topology.launch_latency
    costs = [launch.simple, launch.ll, launch.ll128]
    if launch.tree is not None:
        costs += [launch.tree.simple, launch.tree.ll, launch.tree.ll128]
    return min(costs)


def fit_cluster(topology: Topology, algorithm: str, path: str | os.PathLike[str],
                level: str = "message") -> ClusterFit:
    """Fit ``topology`` to the measured rows in ``path`` (a bench CSV or nccl-tests'
    output, as ``simcomm validate`` reads them) of ``algorithm``, simulated at ``level``."""
    rows, gpus, program = read_measured(path, topology.size)

    small = [row for row in rows if row.size < LATENCY_BOUND]
    large = [row for row in rows if row.size >= BANDWIDTH_BOUND]
    notes = []
    if not small:
        notes.append(f"no rows below {format_bytes(LATENCY_BOUND)}: no extra latency fitted")
    if not large:
        notes.append(f"no rows from {format_bytes(BANDWIDTH_BOUND)}: no network rate fitted")
    elif not network_links(topology):
        notes.append("one node, no links between nodes: no network rate fitted")
        large = []

    def extra_at(rate: float) -> float:
        if not small:
            return 0.0
        found = statistics.median(
            (c.measured_us - c.simulated_us) * 1e-6
            for c in compare_rows(with_cluster_costs(topology, 0.0, rate), algorithm, small,
                                  gpus, program, path, level))
        return max(found, -least_launch(topology))

    extra = extra_at(1.0)
    rate = 1.0
    if large:
        rate, problem = _fit_rate(lambda r: _median_ratio(compare_rows(
            with_cluster_costs(topology, extra, r), algorithm, large, gpus, program, path,
            level)))
        if problem:
            notes.append(f"network rate: {problem}")
        extra = extra_at(rate)
    name = f"{topology.name} fitted to {os.path.basename(os.fspath(path))}"
    return ClusterFit(with_cluster_costs(topology, extra, rate, name), extra, rate,
                      len(small), len(large), tuple(notes))


def _median_ratio(comparisons: Sequence[Comparison]) -> float:
    return statistics.median(c.simulated_us / c.measured_us for c in comparisons)


def _fit_rate(ratio_at: Callable[[float], float]) -> tuple[float, str]:
    """The rate at which ``ratio_at`` (the large rows' median simulated / measured) is 1,
    and "" or what kept it from being found."""
    # Secant steps on log(ratio) against log(rate): a time all set by the network would
    # scale as 1 / rate (slope -1), which the first step assumes.
    low, high = (math.log(bound) for bound in RATE_RANGE)
    x0, y0 = 0.0, math.log(ratio_at(1.0))
    if abs(y0) <= RATE_TOLERANCE:
        return 1.0, ""
    x1 = min(max(x0 + y0, low), high)
    for _ in range(MAX_RATE_STEPS):
        y1 = math.log(ratio_at(math.exp(x1)))
        if abs(y1) <= RATE_TOLERANCE:
            return math.exp(x1), ""
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        if slope > -MIN_SLOPE:
            return 1.0, (f"left at 1: the rows from {format_bytes(BANDWIDTH_BOUND)} hardly "
                         "change with it, so the network does not set them")
        x0, y0, x1 = x1, y1, min(max(x1 - y1 / slope, low), high)
        if x1 == x0:  # at a bound of the range, still off
            return math.exp(x0), f"at the bound of its range, {math.exp(x0):g}"
    return math.exp(x0), f"not settled within {MAX_RATE_STEPS} steps"


def format_cluster_fit(fit: ClusterFit) -> str:
    """The two figures, where they came from, and what could not be fitted."""
    lines = [f"fitted: {fit.topology.name}",
             f"  every collective: {fit.extra_latency * 1e6:+.2f} us of launch latency "
             f"(median of measured - simulated over {fit.latency_rows} rows below "
             f"{format_bytes(LATENCY_BOUND)})",
             f"  links between nodes (and a ring channel's ceiling there): "
             f"{fit.network_rate:.3f} of their bandwidth (median "
             f"simulated / measured of 1 over {fit.bandwidth_rows} rows from "
             f"{format_bytes(BANDWIDTH_BOUND)})"]
    lines += [f"  note: {note}" for note in fit.notes]
    return "\n".join(lines)
