"""``simcomm.cluster_fit`` and ``simcomm validate --fit``: which links count as the network,
a fit recovers the extra latency and network rate that made the measured rows, says what it
could not fit, and the command writes a topology that simulates the rows as measured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from algorithms.harness.bench import format_csv
from simcomm.bench import algorithm_config, bench_size
from simcomm.cli import main
from simcomm.cluster_fit import (
    fit_cluster, format_cluster_fit, network_links, with_cluster_costs,
)
from simcomm.presets import make_preset
from simcomm.topofile import dump_topology, load_topology
from simcomm.topology import PerProtocol, hierarchical

US = 1e-6
GB = 1e9


def measured_file(path: Path, topology_: object, sizes: list[int], level: str) -> Path:
    """A bench CSV of nccl_allreduce simulated on ``topology_`` at ``sizes``."""
    rows = [bench_size(algorithm_config("nccl_allreduce", [size]), topology_, size,
                       level=level) for size in sizes]
    path.write_text(format_csv(rows))
    return path


def test_the_network_is_the_links_only_routes_between_nodes_cross() -> None:
    cluster = make_preset("cluster-h100:nodes=2")
    links = network_links(cluster)
    assert {(cluster.links[i].src, cluster.links[i].dst) for i in links} == {
        (link.src, link.dst) for link in cluster.links if "net" in (link.src, link.dst)}
    assert len(links) == 32  # a NIC each way for each of 16 GPUs
    assert network_links(make_preset("dgx-h100")) == []
    slower = with_cluster_costs(cluster, 3 * US, 0.5)
    assert slower.launch_latency == cluster.launch_latency.scaled(1.0, 3 * US)
    for i, (old, new) in enumerate(zip(cluster.links, slower.links)):
        assert new.bandwidth == old.bandwidth * (0.5 if i in links else 1.0)
    # A ring channel's ceiling between nodes is the network's too.
    assert slower.net_channel_bandwidth == cluster.net_channel_bandwidth * 0.5
    with pytest.raises(ValueError, match="launch latency negative"):
        with_cluster_costs(cluster, -1.0, 1.0)
    with pytest.raises(ValueError, match="network rate must be a number > 0"):
        with_cluster_costs(cluster, 0.0, 0.0)


def test_a_fit_recovers_the_latency_and_rate_that_made_the_rows(tmp_path: Path) -> None:
    # Four nodes, where NCCL's ring (which the network's rate sets) runs the large sizes.
    cluster = make_preset("cluster-h100:nodes=4")
    truth = with_cluster_costs(cluster, 10 * US, 0.8)
    sizes = [8, 1024, 16384, 2**20, 256 * 2**20, 2**30, 4 * 2**30]
    path = measured_file(tmp_path / "m.csv", truth, sizes, "collective")
    fit = fit_cluster(cluster, "nccl_allreduce", path, level="collective")
    assert fit.extra_latency == pytest.approx(10 * US, rel=0.01)
    assert fit.network_rate == pytest.approx(0.8, rel=0.01)
    assert (fit.latency_rows, fit.bandwidth_rows, fit.notes) == (3, 3, ())
    text = format_cluster_fit(fit)
    assert "+10.00 us of launch latency" in text and "0.80" in text


def test_a_fit_says_what_it_could_not_fit(tmp_path: Path) -> None:
    one_node = make_preset("dgx-h100")
    path = measured_file(tmp_path / "one.csv", one_node, [2**20, 256 * 2**20], "collective")
    fit = fit_cluster(one_node, "nccl_allreduce", path, level="collective")
    assert (fit.extra_latency, fit.network_rate) == (0.0, 1.0)
    assert fit.notes == ("no rows below 64KiB: no extra latency fitted",
                         "one node, no links between nodes: no network rate fitted")


def test_a_rate_the_large_rows_do_not_follow_is_left_alone(tmp_path: Path) -> None:
    # Two nodes run NVLS-tree from 128 MiB, which the NVLink switches pace, not the NICs:
    # rows 10% slower than the model are no reason to slow the network.
    cluster = make_preset("cluster-h100:nodes=2")
    rows = [bench_size(algorithm_config("nccl_allreduce", [size]), cluster, size,
                       level="collective") for size in (256 * 2**20, 2**30)]
    path = tmp_path / "slow.csv"
    path.write_text(format_csv([replace(row, time_us=row.time_us * 1.1) for row in rows]))
    fit = fit_cluster(cluster, "nccl_allreduce", path, level="collective")
    assert fit.network_rate == 1.0
    assert fit.notes[-1] == ("network rate: left at 1: the rows from 256MiB hardly change "
                             "with it, so the network does not set them")


def test_validate_fit_writes_the_fitted_topology(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    # Two nodes of two GPUs, small enough to simulate every message quickly.
    base = hierarchical(2, 2, 100 * GB, PerProtocol(2 * US, 0.5 * US, 1 * US), 25 * GB,
                        PerProtocol(8 * US, 3 * US, 4 * US))
    base = with_cluster_costs(base, 5 * US, 1.0, "two-by-two")  # a launch latency to add to
    topology_file = tmp_path / "base.toml"
    topology_file.write_text(dump_topology(base))
    truth = with_cluster_costs(base, 7 * US, 0.5)
    measured = measured_file(tmp_path / "m.csv", truth, [64, 4096, 256 * 2**20, 2**30],
                             "message")
    out = tmp_path / "fitted.toml"
    assert main(["validate", "--topology", str(topology_file), "--measured",
                 f"nccl_allreduce={measured}", "--fit", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fitted: two-by-two fitted to m.csv" in printed
    fitted = load_topology(out)
    assert fitted.launch_latency.simple == pytest.approx(12 * US, rel=0.02)
    assert fitted.links[network_links(fitted)[0]].bandwidth == pytest.approx(12.5 * GB,
                                                                              rel=0.02)
    # The comparison on the fitted topology comes last: every row within 2%.
    summary = printed.strip().splitlines()[-2]
    assert summary.split()[0] == "nccl_allreduce" and float(summary.split()[2][:-1]) < 2


def test_validate_fit_takes_one_measured_collective(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    assert main(["validate", "--topology", "dgx-h100", "--measured", "a=x.csv", "--measured",
                 "b=y.csv", "--fit", str(tmp_path / "f.toml")]) == 2
    assert capsys.readouterr().err == (
        "simcomm: error: --fit fits one measured collective; got 2 --measured\n")
