"""Named topologies of machines people use, built from their published figures.

A preset is named alone (``dgx-h100``) or with parameters after a colon, comma-separated
(``cluster-h100:nodes=4``, ``fattree-h100:nodes=8,nodes_per_leaf=2,oversubscription=2``).
``list_presets()`` says what there is, ``make_preset(spec)`` builds one, ``describe(topology)``
summarises any topology in human units.

How the figures become a model (docs/topologies.md has the whole story and the check):

* A link's bandwidth is the data rate NCCL can reach on it, not the line rate: NVLink moves
  128-byte payloads from the GPU's SMs, which leaves about 80% of the line rate for data.
* A GPU-to-GPU latency is the per-step latency of NCCL's own cost model for the ring
  algorithm, under each of its protocols (Simple, LL, LL128), and a collective's launch
  costs NCCL's base latency for its protocol.
* A GPU's reduce bandwidth is its HBM bandwidth from the datasheet. This is a modelling
  choice: the simulator charges a reduction after the chunk has arrived, where NCCL fuses it
  into the transfer and hides it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from algorithms import ring_allreduce
from algorithms.harness.catalog import COLLECTIVES
from algorithms.nvls import NVLS_CHANNELS
from algorithms.ops import MAX_CHANNELS, check_channels
from simcomm.buffers import SizeOnly
from simcomm.engine import simulate
from simcomm.topology import (
    NO_LAUNCH_LATENCY, Link, PerProtocol, Topology, check_rank_count, duplex, hierarchical,
    switch,
)

GB = 1e9  # bytes/second per GB/s
US = 1e-6  # seconds per microsecond
GIB = 1024**3


def microseconds(value: float) -> float:
    """``value`` microseconds in seconds, the double nearest it, as ``"3.4us"`` reads: so a
    preset written as a topology file (``simcomm topo show --toml``) shows 3.4us, not
    3.3999999999999996us."""
    return float(f"{round(value, 9)!r}e-6")


def nccl_latencies(ring: tuple[float, float, float], tree: tuple[float, float, float]
                   ) -> PerProtocol:
    """NCCL's figures in microseconds, (Simple, LL, LL128) for the ring and for the tree."""
    simple, ll, ll128 = (microseconds(us) for us in tree)
    return PerProtocol(*(microseconds(us) for us in ring),
                       tree=PerProtocol(simple, ll, ll128))


# -- published figures ------------------------------------------------------------------------
#
# NVLink. A100 has 12 NVLinks (NVIDIA A100 datasheet: 600 GB/s both directions together),
# H100 has 18 (NVIDIA H100 datasheet: 900 GB/s); each link's line rate is 25 GB/s per
# direction. With the 128-byte payloads that SMs write, a link carries about 20 GB/s of data,
# 240 GB/s for the 12 links of an A100 (S. Jeaugey, NCCL maintainer, NVIDIA/nccl-tests issue
# #149). NCCL's topology model uses the same per-link figures: SM80_NVLINK_BW = 20.0 and
# SM90_NVLINK_BW = 20.6 GB/s (NVIDIA/nccl, src/graph/topo.h).
# B200 has 18 NVLinks of the fifth generation, 1.8 TB/s per GPU both directions together
# (NVIDIA DGX B200 User Guide: 14.4 TB/s for its 8 GPUs), and NCCL gives each SM100_NVLINK_BW
# = 40.0 GB/s of data (the same file). H200 is an H100 with more and faster memory: the same
# 18 NVLinks (NVIDIA H200 Tensor Core GPU datasheet: 900 GB/s).
A100_NVLINKS = 12
H100_NVLINKS = 18
B200_NVLINKS = 18
A100_NVLINK_DATA = 20.0 * GB
H100_NVLINK_DATA = 20.6 * GB
B200_NVLINK_DATA = 40.0 * GB

# PCIe Gen4 x16: 16 GT/s per lane, 128b/130b coding, so 31.5 GB/s per direction on the wire
# (PCI Express Base Specification 4.0). NCCL models a PCIe link as width x rate / 80 GB/s with
# a Gen4 lane rated 120 (in 100 Mb/s), i.e. 24 GB/s for x16 (NVIDIA/nccl, src/graph/topo.cc,
# kvDictPciGen and ncclTopoAddPci); that is what this model uses.
PCIE_GEN4_X16_DATA = 16 * 120 / 80 * GB

# Network: DGX H100 has eight ConnectX-7 ports for the compute fabric, one per GPU (NVIDIA DGX
# H100 User Guide, "Network Modules"), each InfiniBand NDR 400 Gb/s = 50 GB/s per direction.
# An NCCL developer puts what a ConnectX-7 reaches at NDR rate at 48 to 49 GB/s
# (NVIDIA/nccl-tests issue #267); the model takes the lower figure.
NDR_NIC_DATA = 48 * GB
# DGX A100 has eight ConnectX-6 ports for the compute fabric, one per GPU (NVIDIA DGX A100
# User Guide), each InfiniBand HDR 200 Gb/s = 25 GB/s per direction; Oracle's A100 nodes have
# the same 1.6 Tb/s per node over RoCE (Oracle Cloud Infrastructure blog, "Superclusters with
# RDMA"). NCCL's developers count on 24 GB/s from a 200 Gb/s NIC (S. Jeaugey, NVIDIA/nccl-tests
# issue #119).
HDR_NIC_DATA = 24 * GB
# Where a node has fewer NICs than GPUs, a NIC hangs off a PCIe switch that GPUs share. NCCL
# models a PCIe link as width x rate / 80 GB/s with a Gen5 lane rated 240 (in 100 Mb/s):
# 48 GB/s for x16 (src/graph/topo.cc, as above). H100 connects over Gen5, A100 over Gen4.
PCIE_GEN5_X16_DATA = 16 * 240 / 80 * GB

# Per-step latencies of NCCL's cost model, per protocol (Simple, LL, LL128), for its ring and
# (``tree=``) for its tree, and its base latency per collective (hwLat and baseLat in
# NVIDIA/nccl v2.26.2, src/graph/tuning.cc; unchanged in v2.30). Measured, the tree's own
# figures hold: 25.0 us for a small all-reduce on two DGX H100 nodes, 34.8 us on four
# (benchmarks/published), against 25.2 and 35.2 us from them and 20.4 and 25.8 us from the
# ring's.
NVLINK_STEP_LATENCY = nccl_latencies(ring=(3.4, 0.6, 1.9), tree=(4.0, 0.6, 1.25))
PCIE_STEP_LATENCY = nccl_latencies(ring=(5.7, 1.0, 2.5), tree=(4.0, 1.0, 1.9))
NET_RING_US, NET_TREE_US = (14.0, 2.7, 4.0), (14.0, 5.0, 8.5)
NET_STEP_LATENCY = nccl_latencies(ring=NET_RING_US, tree=NET_TREE_US)
NCCL_LAUNCH_LATENCY = nccl_latencies(ring=(8.4, 6.6, 14.0), tree=(8.4, 6.8, 14.0))
# What one GPU sends per second under LL, NCCL's llMaxBw (same file and version): on one
# node by GPU generation, across nodes by host CPU and node count. DGX H100 and DGX B200
# hosts have Intel Xeon CPUs (NVIDIA DGX H100 and DGX B200 User Guides).
A100_LL_BANDWIDTH = 87.7 * GB
H100_LL_BANDWIDTH = 141.0 * GB
B200_LL_BANDWIDTH = 2 * 141.0 * GB
INTEL_HOSTS_LL_BANDWIDTH = {2: 39.0 * GB, 3: 20.4 * GB}  # nodes (3: three or more) -> rate
# DGX A100 hosts have AMD EPYC CPUs (NVIDIA DGX A100 User Guide), as Oracle's A100 nodes do.
AMD_HOSTS_LL_BANDWIDTH = {2: 22.5 * GB, 3: 19.0 * GB}
# What NCCL's tuner takes a host to spend posting one network send, by CPU vendor
# (getNetOverhead, same file and version; unchanged in v2.30.7). Across nodes it charges
# every step of a ring within a node at least that, three times under Simple, so it keeps
# the ring under LL128 to larger sizes on AMD hosts than the ring's time alone would: two
# A100 nodes measure the ring under LL128's time up to 64 MiB (docs/fidelity.md).
INTEL_HOSTS_NET_OVERHEAD = microseconds(1.0)
AMD_HOSTS_NET_OVERHEAD = microseconds(2.0)
# What one channel moves per second under LL128 at most, by GPU generation, on any number of
# nodes: NCCL's perChMaxRingLL128Bws (same file and version; Blackwell's from v2.30.7, below)
# is per channel of its topology search, and NCCL runs every search channel as two (below),
# so each gets half of it.
A100_LL128_CHANNEL_BANDWIDTH = 20.0 / 2 * GB
H100_LL128_CHANNEL_BANDWIDTH = 36.7 / 2 * GB
B200_LL128_CHANNEL_BANDWIDTH = 40.0 / 2 * GB
# What one A100 sends per second under LL128 over all its channels together: 70% of its
# NVLinks' data rate (168 GB/s), where NCCL's model gives a DGX A100's ring 0.92 of 235 GB/s.
# Fitted, not published: the fastest rate at which none of the held one-node A100 tables
# runs its LL128 sizes (4 to 16 MiB) faster than the model; at NCCL's figure they take 1.3
# to 1.9 times the model's time, with NCCL from 2.8.4 to 2.18.5 alike (docs/fidelity.md,
# "LL128 on one A100 node"). H100 nodes measure NCCL's figures (none).
A100_LL128_BANDWIDTH = 168.0 * GB  # 0.7 x A100_NVLINKS x A100_NVLINK_DATA
# What one channel of NCCL's tree sends per second at most to each of its peers, so the most
# it all-reduces per second, by GPU generation and node count (1, 2, 3: three or more), under
# Simple. NCCL's perChMaxTreeBws caps a tree's bus bandwidth per search channel, and
# its algorithm bandwidth is half that (src/graph/tuning.cc); NCCL runs every search channel
# as two, so a quarter. Ampere's and Hopper's figures are v2.26.2's (unchanged in v2.30.7);
# Blackwell's are v2.30.7's (since v2.28.9), which replaced v2.26.2's Hopper figures doubled
# (so did its LL128 ceiling above, 40 GB/s for 2 x 36.7) and give the tree all-reduce that
# one B200 cluster measured on 2 to 8 nodes with v2.28.9 (docs/fidelity.md).
A100_TREE_CHANNEL_BANDWIDTH = {1: 24.0 / 4 * GB, 2: 23.6 / 4 * GB, 3: 17.8 / 4 * GB}
H100_TREE_CHANNEL_BANDWIDTH = {1: 38.7 / 4 * GB, 2: 41.4 / 4 * GB, 3: 36.0 / 4 * GB}
B200_TREE_CHANNEL_BANDWIDTH = {1: 70.0 / 4 * GB, 2: 42.8 / 4 * GB, 3: 24.0 / 4 * GB}
# What one channel of a ring sends per second to a GPU on another node, measured on nodes
# of 8 GPUs, each on its 400 Gb/s NIC, where NCCL runs 16 channels, 2 per NIC: rings
# across 4 to 10 H100 nodes level off at 320.5 to 324.5 GB/s busbw (median 323.5) over six
# published tables of three clusters (benchmarks/published: gj-aion's 4- and 8-node
# all-reduce of nccl-tests #309, Voltage Park's 4-node all-gather, and one cluster's
# 10-node all-reduce, all-gather and reduce-scatter), 20.2 GB/s a channel. The same 10
# nodes with 1, 2 or 4 GPUs each (4 channels per NIC) reach the NIC's 48 GB/s, as does
# gj-aion's 8-node run on 24 channels with 2 queue pairs per connection (docs/fidelity.md),
# so it is a ceiling per channel, not per NIC. Together AI's 4-node B200 report finds the
# same with the same NICs: rings at 307.3 and 308.7 GB/s at NCCL's defaults, 384.0 and
# 376.2 with NCCL_IB_QPS_PER_CONNECTION=2 and more (togethercomputer/together-nccl-tests,
# baselines/flapping-airplanes/2026-07-11_nccl_collective_scaling_report.md, "Finding 2").
# NCCL_IB_QPS_PER_CONNECTION=2, which lifts it, gives a channel two queue pairs, each as
# fast (the presets' ``qps``). NCCL's cost model has no such ceiling. A 200 Gb/s NIC needs
# only 12 GB/s a channel, and no A100 table shows one, so theirs is left open.
NDR_NET_CHANNEL_BANDWIDTH = 20.2 * GB
# Below that ceiling a ring's steps between nodes under Simple take longer than their bytes
# and latency: about 22 us a step at 256 MiB on ten nodes, 8.6 us at 32 MiB (the 10-node
# all-gather and reduce-scatter; 10 us at 32 MiB on Voltage Park's four nodes). The model
# has each message a ring channel sends to another node under Simple hold that connection
# for its bytes at the NIC's share per channel (two channels a NIC at NCCL's defaults) plus
# a fixed time, the time that makes NCCL's largest slice (1 MiB, half of
# ``algorithms.nccl.RING_CHUNK_BYTES``) take the ceiling's: 1 MiB / 20.2 GB/s - 1 MiB / 24
# GB/s = 8.2 us. So the ceiling is what a full slice reaches, and smaller slices pay more
# for their bytes. Fitted, not published; NCCL's network proxy handling a connection's
# steps one at a time would give such a cost (docs/fidelity.md, "A gap per Simple message
# between nodes").
NDR_NET_MESSAGE_BANDWIDTH = NDR_NIC_DATA / 2
NDR_NET_MESSAGE_GAP = microseconds(8.2)
# How long a ring's channel holds each slice it sends under Simple, on top of its bytes
# (``Topology.ring_slice_gap``), by GPU generation: fitted to the one-node tables that run
# NCCL's ring under Simple (benchmarks/published; docs/fidelity.md, "A ring's slices under
# Simple"), Hopper's to the 8- and 4-GPU H100 tables of three hosts, Ampere's to three A100
# tables. No table runs a B200 ring under Simple on one node; DGX B200 takes Hopper's.
A100_RING_SLICE_GAP = microseconds(3.0)
H100_RING_SLICE_GAP = microseconds(2.0)
# How many channels NCCL runs its rings and trees on. Its topology search finds rings of a
# speed from its list for the GPU generation (src/graph/search.cc, NVIDIA/nccl v2.26.2):
# on one node as many of the fastest as the GPU's NVLinks carry (A100: 6 of 40 GB/s in its
# 240; H100: 6 of 60 in 370.8; B200: 8 of 90 in 720), across nodes one per NIC at the NIC's
# speed (48 GB/s for 400 Gb/s, 24 for 200 Gb/s). ``nccl_channels`` does the rest.
A100_ONE_NODE_RINGS = (6, 40 * GB)
H100_ONE_NODE_RINGS = (6, 60 * GB)
B200_ONE_NODE_RINGS = (8, 90 * GB)
# NVLink SHARP (NVLS): the NVSwitches of H100, H200 and B200 nodes reduce and multicast.
# NCCL's cost model gives the NVLS all-reduce 5/6 of the links' bandwidth and a latency of
# 25 us over NVLink, its whole cost with no base latency (the NVLS ratio and hwLat,
# NVIDIA/nccl v2.26.2 src/graph/tuning.cc). Here an NVLS all-reduce pays the Simple launch
# (8.4 us) and two in-switch steps of one GPU-to-GPU latency (3.4 us) each; each step's
# wait in the switch makes up the rest, so the total is NCCL's 25 us.
NVLS_EFFICIENCY = 5 / 6
NVLS_SWITCH_LATENCY = microseconds((25.0 - 8.4 - 2 * 3.4) / 2)
# NVLS-tree's kernel gives a node's copies into and out of the NVLS buffer fewer warps where
# its channel sends up a tree (src/device/all_reduce.h, v2.26.2: 6 and 5 of 20 warps, against
# 8 and 7 for NVLS on one node), and no figure of the pace that leaves is published. Fitted
# to the 2-node tables of four H100 and two H200 clusters (benchmarks/published;
# docs/fidelity.md, "NVLS-tree's pace"); DGX B200, whose NICs set its pace there, borrows it.
NVLS_TREE_EFFICIENCY = 0.78
# On more than two nodes NVLS-tree's sends between nodes reach less than their NICs' rate
# (``Topology.tree_network_efficiency``): no figure is published; fitted to the six H100
# all-reduce tables of four to ten nodes (median error over their 94 rows: 0.8 8.0%, 0.85
# 6.6%, 0.9 7.1%; benchmarks/published; docs/fidelity.md, "NCCL's tuner by version").
NVLS_TREE_NETWORK_EFFICIENCY = 0.85
# What NCCL's cost model credits NVLS-tree's sends between nodes with on more than two nodes
# (``Topology.tuner_nvls_tree_bandwidth``), a channel per NIC: before 2.28.3 half the
# network's rate per channel (``bwInter/2``), times its NVLS ratio of 5/6 (NVIDIA/nccl
# v2.26.2 src/graph/tuning.cc), which with the tree's load of two slices on a node's NICs is
# 5/6 of the NIC; from 2.28.3 the whole rate (``bwInter``) up to ``perChMaxNVLSTreeBws``,
# 45.5 GB/s on Hopper and 80 on Blackwell, with the bytes counted as for the ring
# (v2.28.3 to v2.30.7, same file): the NIC up to that ceiling. The newest version the
# presets follow by default is NEWEST_NCCL (a preset's ``nccl=`` picks another).
NVLS_TREE_WHOLE_NIC = (2, 28, 3)
HOPPER_NVLS_TREE_CHANNEL = 45.5 * GB
BLACKWELL_NVLS_TREE_CHANNEL = 80 * GB
NEWEST_NCCL = "2.30"
# How many channels NCCL runs NVLS on: Hopper's 16 (algorithms.nvls.NVLS_CHANNELS), 32 on
# Blackwell (NVLS_NCHANNELS_SM100, NVIDIA/nccl v2.26.2 src/transport/nvls.cc).
BLACKWELL_NVLS_CHANNELS = 32
# AWS's EFA network (Elastic Fabric Adapter), which NCCL drives through AWS's plugin
# (aws/aws-ofi-nccl; src/platform-aws.c at v1.9.2-aws, the same figures to v1.21.1). A
# p5.48xlarge has 32 EFA devices of 100 Gb/s, four per GPU, which the plugin joins into one
# 400 Gb/s device per GPU ("NIC group", its RDMA protocol); four EFA devices of a p5 write
# 380 Gb/s together (crazyguitar/Libefaxx, experiments/write/README.md, commit a86dbc4e),
# 47.5 GB/s. A p4d.24xlarge or p4de.24xlarge has four 100 Gb/s EFA devices, each on the PCIe
# switch of two GPUs (the plugin's topology/p4d-24xl-topo.xml), which NCCL sees as four
# NICs; at the share of the wire NCCL's developers count on for 200 Gb/s (24 GB/s, above),
# 12 GB/s.
EFA_P5_GPU_DATA = 47.5 * GB
EFA_100G_DATA = 12 * GB
# A message between nodes takes longer over EFA than over InfiniBand: Open MPI's osu_latency
# between two p5.48xlarge measures 20.4 us for 0 bytes (aws/aws-parallelcluster, commit
# 742ba685d, tests/integration-tests/tests/performance_tests/test_osu/test_osu/
# osu_benchmarks/results/alinux2/p5.48xlarge/openmpi/osu_latency). NCCL's figures for a hop
# between nodes hold InfiniBand's own time, small beside that, so a hop over EFA takes them
# plus 20.4 us. Under Simple a p4d's receiver also flushes each message out of the EFA
# device before its GPU reads it (the plugin marks p4d and p4de ``net_flush_required``, p5
# not), one more trip through the device: NCCL's own cost model charges a network's latency
# a second time under Simple for that flush (src/graph/tuning.cc, "Also add the flush extra
# latency"), and so do the p4d presets.
EFA_EXTRA_US = 20.4


def _over_efa(figures: tuple[float, float, float], flushed: bool
              ) -> tuple[float, float, float]:
    """NCCL's (Simple, LL, LL128) microseconds for a network hop, over EFA: each plus EFA's
    time, Simple's twice where the receiver flushes."""
    simple, ll, ll128 = figures
    return (simple + EFA_EXTRA_US * (2 if flushed else 1), ll + EFA_EXTRA_US,
            ll128 + EFA_EXTRA_US)


EFA_STEP_LATENCY = nccl_latencies(ring=_over_efa(NET_RING_US, False),
                                  tree=_over_efa(NET_TREE_US, False))
EFA_FLUSHED_STEP_LATENCY = nccl_latencies(ring=_over_efa(NET_RING_US, True),
                                          tree=_over_efa(NET_TREE_US, True))
# What the plugin reports to NCCL as its devices' latency on p4d, p4de and p5
# (``platform_data_map``, since aws/aws-ofi-nccl commit d87d61e0 of 2023-05-31; a setting,
# not a measurement): NCCL's tuner adds it to its own figure for every hop between nodes,
# twice under Simple, where the links here hold NCCL's figure and EFA's time
# (``Topology.tuner_net_latency``).
EFA_REPORTED_US = 75.0


def _tuner_over_efa(flushed: bool) -> PerProtocol:
    """What NCCL's tuner counts on a hop between nodes over EFA besides the hop's latency
    here: the plugin's reported latency, twice under Simple, less EFA's time (``_over_efa``)."""
    simple = 2 * EFA_REPORTED_US - EFA_EXTRA_US * (2 if flushed else 1)
    other = EFA_REPORTED_US - EFA_EXTRA_US
    return PerProtocol(microseconds(simple), microseconds(other), microseconds(other))


# Modelling choice, no published figure: a hop between leaf and spine switches adds nothing.
# Switch vendors quote sub-microsecond port-to-port latencies, small beside the 14 us above,
# which already covers a message's whole trip across the network.
SPINE_HOP_LATENCY = 0.0

# HBM bandwidth from the datasheets: A100 80GB SXM 2,039 GB/s, A100 40GB SXM 1,555 GB/s and
# A100 80GB PCIe 1,935 GB/s (NVIDIA A100 Tensor Core GPU datasheet); H100 SXM 3.35 TB/s
# (NVIDIA H100 Tensor Core GPU datasheet); H200 SXM 4.8 TB/s (NVIDIA H200 Tensor Core GPU
# datasheet); B200 8 TB/s (NVIDIA DGX B200 datasheet: 64 TB/s for its 8 GPUs).
A100_SXM_HBM = 2039 * GB
A100_40GB_SXM_HBM = 1555 * GB
A100_PCIE_HBM = 1935 * GB
H100_SXM_HBM = 3350 * GB
H200_SXM_HBM = 4800 * GB
B200_HBM = 8000 * GB

GPUS_PER_DGX = 8
# NCCL's search finds at most 32 rings (MAXCHANNELS / 2, NVIDIA/nccl v2.26.2 src/init.cc),
# so 4 ports on each of a node's 8 NICs.
MAX_NIC_PORTS = 4


@dataclass(frozen=True)
class NodeFigures:
    """What the DGX and cluster presets take from one generation's 8-GPU nodes."""

    nvlink: float  # NVLink data rate per GPU per direction, bytes/second
    hbm: float  # bytes/second
    nic: float  # each NIC's data rate per direction, bytes/second
    pcie: float  # a GPU's PCIe link to a NIC it shares, bytes/second
    ll_one_node: float  # NCCL's llMaxBw on one node, bytes/second
    ll_across: Mapping[int, float]  # nodes (3: three or more) -> llMaxBw of the hosts' CPUs
    ll128_channel: float  # half NCCL's perChMaxRingLL128Bw, bytes/second
    tree_channel: Mapping[int, float]  # nodes (3: three or more) -> perChMaxTreeBw / 4
    nvls: bool  # the NVSwitch reduces and multicasts
    compute_capability: int  # 80: Ampere, 90: Hopper, 100: Blackwell
    one_node_rings: tuple[int, float]  # rings NCCL's search finds on one node, their speed
    net_overhead: float  # NCCL's getNetOverhead for the hosts' CPUs, seconds
    net_channel: float = math.inf  # a ring's channel to another node, bytes/second
    net_message_gap: float = 0.0  # seconds each Simple message holds that connection
    net_message_rate: float = math.inf  # besides its bytes at this rate, bytes/second
    ring_slice_gap: float = 0.0  # seconds a ring's channel holds a slice under Simple
    nvls_channels: int = NVLS_CHANNELS  # NCCL's NVLS channels (with ``nvls``)
    nvls_tree_channel: float = 0.0  # NCCL's perChMaxNVLSTreeBw beyond two nodes, bytes/second
    ll128_gpu: float = math.inf  # what one GPU sends under LL128, all channels, bytes/second
    net_latency: PerProtocol = NET_STEP_LATENCY  # a hop between nodes, per protocol
    tuner_net: PerProtocol = NO_LAUNCH_LATENCY  # ``Topology.tuner_net_latency``
    simple_only: bool = False  # the network plugin sets NCCL_PROTO=simple
    nics: int = GPUS_PER_DGX  # the network devices NCCL sees per node

    def ll_bandwidth(self, nodes: int) -> float:
        """NCCL's llMaxBw on ``nodes`` nodes."""
        return self.ll_one_node if nodes == 1 else self.ll_across[min(nodes, 3)]

    def channels(self, nodes: int, nics: int, nic_ports: int = 1) -> int:
        """How many channels NCCL runs rings and trees on over ``nodes`` of these nodes
        with ``nics`` NICs each, of ``nic_ports`` ports that share a NIC's rate: across
        nodes its search finds a ring per port."""
        rings, speed = (self.one_node_rings if nodes == 1
                        else (nics * nic_ports, self.nic / nic_ports))
        return nccl_channels(rings, speed, self.compute_capability)


def nccl_channels(rings: int, ring_speed: float, compute_capability: int) -> int:
    """How many channels NCCL runs its rings and trees on, from the ``rings`` its topology
    search finds at ``ring_speed`` bytes/second each. The search doubles them where each
    carries 25 GB/s or more, except on Hopper and newer past four rings under 50 GB/s
    (``ncclTopoDupChannels``, NVIDIA/nccl v2.26.2 src/graph/search.cc), and every search
    channel runs as two (src/graph/connect.cc; S. Jeaugey in NVIDIA/nccl issue #1041: the
    execution channels are typically twice the search channels). NCCL's logs agree: 24
    channels on H100s joined by NVLink (NVIDIA/nccl issue #1781), 16 on H800s with 8 NVLinks
    each (issue #892)."""
    doubled = ring_speed >= 25 * GB and not (
        compute_capability > 80 and ring_speed < 50 * GB and rings > 4)
    return 2 * rings * (2 if doubled else 1)


@dataclass(frozen=True)
class Published:
    """An all-reduce bus bandwidth that a machine reaches in nccl-tests, and where it is said."""

    busbw: float  # bytes/second
    source: str


# nccl-tests all_reduce_perf busbw with NCCL's ring algorithm on one 8-GPU machine.
PUBLISHED_BUSBW: Mapping[str, Published] = MappingProxyType({
    "dgx-a100": Published(230 * GB, "NVIDIA/nccl-tests issue #149: S. Jeaugey, about 230 GB/s, "
                                    "other GPU bottlenecks keeping it below 240 GB/s"),
    "dgx-h100": Published(370 * GB, "NVIDIA/nccl-tests issue #212: S. Jeaugey, effective NVLink "
                                    "bandwidth 370 GB/s, seen as busbw with NCCL_ALGO=RING"),
})


# -- builders ---------------------------------------------------------------------------------

DGX_A100 = NodeFigures(A100_NVLINKS * A100_NVLINK_DATA, A100_SXM_HBM,
                       HDR_NIC_DATA, PCIE_GEN4_X16_DATA, A100_LL_BANDWIDTH,
                       AMD_HOSTS_LL_BANDWIDTH, A100_LL128_CHANNEL_BANDWIDTH,
                       A100_TREE_CHANNEL_BANDWIDTH, nvls=False,
                       compute_capability=80, one_node_rings=A100_ONE_NODE_RINGS,
                       net_overhead=AMD_HOSTS_NET_OVERHEAD,
                       ring_slice_gap=A100_RING_SLICE_GAP, ll128_gpu=A100_LL128_BANDWIDTH)
DGX_H100 = NodeFigures(H100_NVLINKS * H100_NVLINK_DATA, H100_SXM_HBM,
                       NDR_NIC_DATA, PCIE_GEN5_X16_DATA, H100_LL_BANDWIDTH,
                       INTEL_HOSTS_LL_BANDWIDTH, H100_LL128_CHANNEL_BANDWIDTH,
                       H100_TREE_CHANNEL_BANDWIDTH, nvls=True,
                       compute_capability=90, one_node_rings=H100_ONE_NODE_RINGS,
                       net_overhead=INTEL_HOSTS_NET_OVERHEAD,
                       net_channel=NDR_NET_CHANNEL_BANDWIDTH,
                       net_message_gap=NDR_NET_MESSAGE_GAP,
                       net_message_rate=NDR_NET_MESSAGE_BANDWIDTH,
                       ring_slice_gap=H100_RING_SLICE_GAP,
                       nvls_tree_channel=HOPPER_NVLS_TREE_CHANNEL)
DGX_H200 = replace(DGX_H100, hbm=H200_SXM_HBM)
# DGX B200: eight ConnectX-7 cards for the cluster network, up to 400 Gb/s each (NVIDIA DGX
# B200 User Guide), so NDR's figure as for DGX H100.
DGX_B200 = NodeFigures(B200_NVLINKS * B200_NVLINK_DATA, B200_HBM, NDR_NIC_DATA,
                       PCIE_GEN5_X16_DATA, B200_LL_BANDWIDTH, INTEL_HOSTS_LL_BANDWIDTH,
                       B200_LL128_CHANNEL_BANDWIDTH, B200_TREE_CHANNEL_BANDWIDTH, nvls=True,
                       compute_capability=100, one_node_rings=B200_ONE_NODE_RINGS,
                       net_overhead=INTEL_HOSTS_NET_OVERHEAD,
                       net_channel=NDR_NET_CHANNEL_BANDWIDTH,
                       net_message_gap=NDR_NET_MESSAGE_GAP,
                       net_message_rate=NDR_NET_MESSAGE_BANDWIDTH,
                       ring_slice_gap=H100_RING_SLICE_GAP,
                       nvls_channels=BLACKWELL_NVLS_CHANNELS,
                       nvls_tree_channel=BLACKWELL_NVLS_TREE_CHANNEL)

# AWS's instances with EFA (the figures above): their GPUs and NVSwitches as the DGX nodes'.
# p5.48xlarge hosts have AMD EPYC CPUs (3rd generation), p4d.24xlarge hosts Intel Xeon
# (Cascade Lake) (AWS, "Amazon EC2 P5 Instances" and "Amazon EC2 P4 Instances").
AWS_P4D = replace(DGX_A100, hbm=A100_40GB_SXM_HBM, nic=EFA_100G_DATA, nics=4,
                  ll_across=INTEL_HOSTS_LL_BANDWIDTH, net_overhead=INTEL_HOSTS_NET_OVERHEAD,
                  net_latency=EFA_FLUSHED_STEP_LATENCY,
                  tuner_net=_tuner_over_efa(flushed=True), simple_only=True)
AWS_P4DE = replace(AWS_P4D, hbm=A100_SXM_HBM)
AWS_P5 = replace(DGX_H100, nic=EFA_P5_GPU_DATA, ll_across=AMD_HOSTS_LL_BANDWIDTH,
                 net_overhead=AMD_HOSTS_NET_OVERHEAD, net_channel=math.inf,
                 net_message_gap=0.0, net_message_rate=math.inf, net_latency=EFA_STEP_LATENCY,
                 tuner_net=_tuner_over_efa(flushed=False))


def _on_channels(topology: Topology, channels: int, node: NodeFigures, nodes: int,
                 nics: int, nic_ports: int = 1) -> Topology:
    """``topology`` running rings and trees on ``channels`` (0: NCCL's count for these
    nodes). More channels than NCCL's share its LL128 and tree ceilings: NCCL's cost model
    takes them per channel of its search, however many run (src/graph/tuning.cc). A GPU's
    own LL128 ceiling holds whatever the count."""
    check_channels(channels, "NCCL's count")
    nccls = node.channels(nodes, nics, nic_ports)
    count = channels or nccls
    return replace(topology, channels=count, ll128_bandwidth=node.ll128_gpu,
                   ll128_channel_bandwidth=node.ll128_channel * nccls / count,
                   tree_channel_bandwidth=node.tree_channel[min(nodes, 3)] * nccls / count)


def nccl_version(text: str) -> tuple[int, int, int]:
    """An NCCL version as a comparable triple: ``"2.26"`` -> (2, 26, 0), ``"2.29.2"`` ->
    (2, 29, 2); else a ValueError naming the text."""
    parts = text.split(".") if isinstance(text, str) else []
    if not 2 <= len(parts) <= 3 or not all(part.isdigit() and part.isascii() for part in parts):
        raise ValueError(f"nccl must be a version such as 2.26 or 2.29.2, got {text!r}")
    major, minor, patch = (int(part) for part in (*parts, "0")[:3])
    return major, minor, patch


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def dgx_a100(gpus: int = GPUS_PER_DGX, channels: int = 0) -> Topology:
    """DGX A100 (640 GB): 8 A100 80GB SXM4 on NVSwitch, or the first ``gpus`` of them;
    ``channels`` for rings and trees (0: NCCL's count, ``nccl_channels``)."""
    return _dgx("dgx-a100", DGX_A100, gpus, channels)


def dgx_h100(gpus: int = GPUS_PER_DGX, channels: int = 0,
             nvls_channels: int = 0) -> Topology:
    """DGX H100: 8 H100 SXM5 on NVSwitch, or the first ``gpus`` of them; the NVSwitch
    reduces and multicasts (NVLS). ``channels`` as for ``dgx_a100``; ``nvls_channels`` for
    NVLS and NVLS-tree (NCCL_NVLS_NCHANNELS; 0: NCCL's count, 16, 32 on B200). NCCL_MIN_CTAS
    raises both counts to at least its own."""
    return _dgx("dgx-h100", DGX_H100, gpus, channels, nvls_channels)


def dgx_h200(gpus: int = GPUS_PER_DGX, channels: int = 0,
             nvls_channels: int = 0) -> Topology:
    """DGX H200: DGX H100 with H200's memory (141 GB at 4.8 TB/s), or the first ``gpus``
    of its 8 GPUs. ``channels`` and ``nvls_channels`` as for ``dgx_h100``."""
    return _dgx("dgx-h200", DGX_H200, gpus, channels, nvls_channels)


def dgx_b200(gpus: int = GPUS_PER_DGX, channels: int = 0,
             nvls_channels: int = 0) -> Topology:
    """DGX B200: 8 B200 on fifth-generation NVSwitch (NVLS), or the first ``gpus`` of
    them. ``channels`` and ``nvls_channels`` as for ``dgx_h100``."""
    return _dgx("dgx-b200", DGX_B200, gpus, channels, nvls_channels)


def with_injection(topology: Topology) -> Topology:
    """``topology`` with each GPU's kernels moving at most what its links carry together,
    shared evenly by a collective's channels (``Topology.injection_bandwidth``). A modelling
    choice after NCCL's cost model, which gives a collective nChannels times one channel's
    bandwidth and charges its steps' latency on top (src/graph/tuning.cc)."""
    return replace(topology, injection_bandwidth=topology.egress_bandwidth(0))


def with_nvls(topology: Topology, channels: int = NVLS_CHANNELS) -> Topology:
    """``topology`` with the NVSwitch of each node (a node named ``switch`` or
    ``nodeN.switch``) reducing and multicasting as H100's do (the NVLS figures above), NCCL
    running NVLS on ``channels``."""
    switches = tuple(node for node in topology.nodes
                     if node == "switch" or node.endswith(".switch"))
    return replace(topology, reducing_switches=switches, switch_efficiency=NVLS_EFFICIENCY,
                   tree_switch_efficiency=NVLS_TREE_EFFICIENCY,
                   tree_network_efficiency=NVLS_TREE_NETWORK_EFFICIENCY,
                   switch_latency=NVLS_SWITCH_LATENCY, nvls_channels=channels)


def _dgx(name: str, node: NodeFigures, gpus: int, channels: int,
         nvls_channels: int = 0) -> Topology:
    _positive_int("gpus", gpus)
    if gpus > GPUS_PER_DGX:
        raise ValueError(f"gpus must be at most {GPUS_PER_DGX}, got {gpus}")
    nvls_count = _nvls_count(nvls_channels, node)
    topo = switch(gpus, node.nvlink, NVLINK_STEP_LATENCY, node.hbm)
    given = [f"{key}={value}" for key, value, default in
             (("gpus", gpus, GPUS_PER_DGX), ("channels", channels, 0),
              ("nvls_channels", nvls_channels, 0)) if value != default]
    if given:
        name += ":" + ",".join(given)
    topo = with_injection(replace(topo, name=name, launch_latency=NCCL_LAUNCH_LATENCY,
                                  ll_bandwidth=node.ll_one_node,
                                  ring_slice_gap=node.ring_slice_gap))
    topo = _on_channels(topo, channels, node, 1, GPUS_PER_DGX)
    return with_nvls(topo, nvls_count) if node.nvls else topo


def _nvls_count(nvls_channels: int, node: NodeFigures) -> int:
    # The channels NCCL runs NVLS on: NCCL_NVLS_NCHANNELS where given, else its own count.
    if type(nvls_channels) is not int or not 0 <= nvls_channels <= MAX_CHANNELS:
        raise ValueError(f"nvls_channels must be an int from 0 to {MAX_CHANNELS} (0: NCCL's "
                         f"{node.nvls_channels}), got {nvls_channels!r}")
    return nvls_channels or node.nvls_channels


def pcie_a100(gpus: int = 8) -> Topology:
    """A100 80GB PCIe cards, each on a Gen4 x16 port of one PCIe switch, no NVLink: NCCL
    does not weigh LL128 there (``Topology.ll128_enabled``)."""
    _positive_int("gpus", gpus)
    topo = switch(gpus, PCIE_GEN4_X16_DATA, PCIE_STEP_LATENCY, A100_PCIE_HBM)
    return with_injection(replace(topo, name=f"pcie-a100:gpus={gpus}",
                                  launch_latency=NCCL_LAUNCH_LATENCY,
                                  ll_bandwidth=A100_LL_BANDWIDTH,
                                  ll128_channel_bandwidth=A100_LL128_CHANNEL_BANDWIDTH,
                                  ll128_bandwidth=A100_LL128_BANDWIDTH,
                                  ll128_enabled=False))


def cluster_a100(nodes: int = 2, nics: int = GPUS_PER_DGX, channels: int = 0,
                 nic_ports: int = 1, gpus: int = GPUS_PER_DGX, qps: int = 1) -> Topology:
    """DGX A100 nodes on one network switch: every GPU's 200 Gb/s NIC, or ``nics`` NICs per
    node, each shared by the GPUs of its PCIe switch; ``channels`` for rings and trees (0:
    NCCL's count, ``nccl_channels``; more: as NCCL_MIN_NCHANNELS would). ``nic_ports``
    splits each NIC's rate among that many ports (Oracle's A100 nodes: 16 ports of 100 Gb/s,
    2), each of which NCCL's search gives a ring; the model keeps one link per NIC, which
    carries what the ports do together when the channels use them evenly, as NCCL's do.
    ``gpus`` takes part per node, the first of each node's 8 with their NICs (a job of
    fewer GPUs per node: ``srun --gpus-per-node``), so ``nics`` may be no more than it.
    ``qps`` is NCCL_IB_QPS_PER_CONNECTION: each queue pair of a ring channel's connection
    to another node carries up to the measured ceiling per channel, 20.2 GB/s where the
    preset has one (400 Gb/s NICs: H100, H200, B200; ``NDR_NET_CHANNEL_BANDWIDTH``)."""
    return _cluster("cluster-a100", DGX_A100, nodes, nics, channels, nic_ports, gpus, qps)


def cluster_h100(nodes: int = 2, nics: int = GPUS_PER_DGX, channels: int = 0,
                 nic_ports: int = 1, gpus: int = GPUS_PER_DGX, qps: int = 1,
                 nvls_channels: int = 0, nccl: str = NEWEST_NCCL) -> Topology:
    """DGX H100 nodes on one network switch: every GPU's 400 Gb/s NIC, or ``nics`` NICs per
    node, each shared by the GPUs of its PCIe switch; ``channels`` as for
    ``cluster_a100``, ``nvls_channels`` as for ``dgx_h100``. ``nccl`` is the NCCL version
    whose tuner the collectives that choose follow where versions differ: from 2.28.3
    NCCL's cost model credits NVLS-tree on more than two nodes with more of the network
    than before (``Topology.tuner_nvls_tree_bandwidth``)."""
    return _cluster("cluster-h100", DGX_H100, nodes, nics, channels, nic_ports, gpus, qps,
                    nvls_channels, nccl)


def cluster_h200(nodes: int = 2, nics: int = GPUS_PER_DGX, channels: int = 0,
                 nic_ports: int = 1, gpus: int = GPUS_PER_DGX, qps: int = 1,
                 nvls_channels: int = 0, nccl: str = NEWEST_NCCL) -> Topology:
    """DGX H200 nodes, networked as ``cluster-h100``; parameters as for ``cluster_h100``."""
    return _cluster("cluster-h200", DGX_H200, nodes, nics, channels, nic_ports, gpus, qps,
                    nvls_channels, nccl)


def cluster_b200(nodes: int = 2, nics: int = GPUS_PER_DGX, channels: int = 0,
                 nic_ports: int = 1, gpus: int = GPUS_PER_DGX, qps: int = 1,
                 nvls_channels: int = 0, nccl: str = NEWEST_NCCL) -> Topology:
    """DGX B200 nodes on one network switch: every GPU's 400 Gb/s NIC, or ``nics`` NICs per
    node, each shared by the GPUs of its PCIe switch; parameters as for
    ``cluster_h100``."""
    return _cluster("cluster-b200", DGX_B200, nodes, nics, channels, nic_ports, gpus, qps,
                    nvls_channels, nccl)


def aws_p4d(nodes: int = 2, channels: int = 0) -> Topology:
    """AWS p4d.24xlarge instances on EFA: 8 A100 40GB on NVSwitch and four 100 Gb/s EFA
    devices, each shared by the two GPUs of its PCIe switch; NCCL runs through AWS's plugin,
    which sets NCCL_PROTO=simple there (EFA does not promise the ordering LL and LL128 need)
    and reports 75 us of latency to NCCL's tuner. ``channels`` as for ``cluster_a100``."""
    return _cluster("aws-p4d", AWS_P4D, nodes, AWS_P4D.nics, channels)


def aws_p4de(nodes: int = 2, channels: int = 0) -> Topology:
    """AWS p4de.24xlarge instances on EFA: ``aws_p4d`` with A100 80GB."""
    return _cluster("aws-p4de", AWS_P4DE, nodes, AWS_P4DE.nics, channels)


def aws_p5(nodes: int = 2, channels: int = 0, gpus: int = GPUS_PER_DGX,
           nvls_channels: int = 0, nccl: str = NEWEST_NCCL) -> Topology:
    """AWS p5.48xlarge instances on EFA: 8 H100 on NVSwitch, each GPU with four 100 Gb/s
    EFA devices that AWS's plugin joins into one; the plugin reports 75 us of latency to
    NCCL's tuner and leaves LL and LL128 on. ``channels``, ``gpus``, ``nvls_channels`` and
    ``nccl`` as for ``cluster_h100``."""
    return _cluster("aws-p5", AWS_P5, nodes, GPUS_PER_DGX, channels, gpus=gpus,
                    nvls_channels=nvls_channels, nccl=nccl)


def _cluster(preset: str, node: NodeFigures, nodes: int, nics: int, channels: int,
             nic_ports: int = 1, gpus: int = GPUS_PER_DGX, qps: int = 1,
             nvls_channels: int = 0, nccl: str = NEWEST_NCCL) -> Topology:
    _positive_int("nodes", nodes)
    credited = (min(node.nic, node.nvls_tree_channel)
                if nccl_version(nccl) >= NVLS_TREE_WHOLE_NIC else NVLS_EFFICIENCY * node.nic)
    nvls_count = _nvls_count(nvls_channels, node)
    _positive_int("nics", nics)
    _positive_int("qps", qps)
    if _positive_int("gpus", gpus) > GPUS_PER_DGX:
        raise ValueError(f"gpus must be at most {GPUS_PER_DGX}, got {gpus}")
    if _positive_int("nic_ports", nic_ports) > MAX_NIC_PORTS:
        raise ValueError(f"nic_ports must be at most {MAX_NIC_PORTS}, got {nic_ports}")
    if GPUS_PER_DGX % nics:
        raise ValueError(f"nics must divide the {GPUS_PER_DGX} GPUs of a node, got {nics}")
    if gpus < GPUS_PER_DGX and nics != GPUS_PER_DGX:
        raise ValueError(f"give gpus or nics, not both: with gpus={gpus} every GPU taking part "
                         "uses its own NIC")
    name = f"{preset}:nodes={nodes}"
    if nics == GPUS_PER_DGX:
        if gpus < GPUS_PER_DGX:
            name += f",gpus={gpus}"
        topo = hierarchical(nodes, gpus, node.nvlink, NVLINK_STEP_LATENCY, node.nic,
                            node.net_latency, nic_per_gpu=True, reduce_bandwidth=node.hbm)
    else:
        if nics != node.nics:
            name += f",nics={nics}"
        topo = _shared_nics(nodes, nics, node)
    if channels:
        name += f",channels={channels}"
    if nic_ports != 1:
        name += f",nic_ports={nic_ports}"
    if qps != 1:
        name += f",qps={qps}"
    if nvls_channels:
        name += f",nvls_channels={nvls_channels}"
    if nccl != NEWEST_NCCL:
        name += f",nccl={nccl}"
    topo = with_injection(replace(topo, name=name, launch_latency=NCCL_LAUNCH_LATENCY,
                                  ll_bandwidth=node.ll_bandwidth(nodes),
                                  net_overhead=node.net_overhead,
                                  net_channel_bandwidth=node.net_channel * qps,
                                  net_message_gap=node.net_message_gap / qps,
                                  net_message_bandwidth=node.net_message_rate * qps,
                                  ring_slice_gap=node.ring_slice_gap,
                                  tuner_nvls_tree_bandwidth=credited,
                                  tuner_net_latency=node.tuner_net,
                                  ll_enabled=not node.simple_only,
                                  ll128_enabled=not node.simple_only))
    topo = _on_channels(topo, channels, node, nodes, min(nics, gpus), nic_ports)
    return with_nvls(topo, nvls_count) if node.nvls and gpus > 1 else topo


def _shared_nics(nodes: int, nics: int, figures: NodeFigures) -> Topology:
    """Nodes of 8 GPUs on an NVSwitch, GPU i reaching the network through NIC i // (8 /
    nics) of its node over PCIe. The network's latency lies half on each NIC's link, as it
    does on the GPUs' own NIC links of ``hierarchical``."""
    nvlink, hbm, nic, pcie = figures.nvlink, figures.hbm, figures.nic, figures.pcie
    check_rank_count(nodes * GPUS_PER_DGX)
    gpus = [f"gpu{i}" for i in range(nodes * GPUS_PER_DGX)]
    links: list[Link] = []
    names = list(gpus)
    for node in range(nodes):
        switch_name = f"node{node}.switch"
        cards = [f"node{node}.nic{k}" for k in range(nics)]
        names += [switch_name, *cards]
        for local in range(GPUS_PER_DGX):
            gpu = gpus[node * GPUS_PER_DGX + local]
            links += duplex(gpu, switch_name, nvlink, NVLINK_STEP_LATENCY, 0.5)
            links += duplex(gpu, cards[local * nics // GPUS_PER_DGX], pcie, 0.0)
        for card in cards:
            links += duplex(card, "net", nic, figures.net_latency, 0.5)
    names.append("net")
    return Topology("cluster", tuple(names), tuple(links), tuple(gpus),
                    (hbm,) * len(gpus), GPUS_PER_DGX)


def fattree_h100(nodes: int = 4, nodes_per_leaf: int = 2, oversubscription: float = 1.0
                 ) -> Topology:
    """DGX H100 nodes in a two-level fat-tree.

    The eight NICs of a node go to its leaf switch, ``nodes_per_leaf`` nodes a leaf. A leaf's
    uplink carries its downlinks' bandwidth divided by ``oversubscription``. The spine tier
    is one node: the simulator routes a pair of ranks on one fixed path, so separate spine
    switches would all see their traffic on the first; one spine with each leaf's whole uplink
    bandwidth stands for traffic spread evenly over the spines (ideal ECMP).
    """
    _positive_int("nodes", nodes)
    _positive_int("nodes_per_leaf", nodes_per_leaf)
    if not (isinstance(oversubscription, (int, float)) and not isinstance(oversubscription, bool)
            and math.isfinite(oversubscription) and oversubscription >= 1):
        raise ValueError(f"oversubscription must be a number >= 1, got {oversubscription!r}")
    if nodes % nodes_per_leaf:
        raise ValueError(f"{nodes} nodes do not fill leaves of {nodes_per_leaf} nodes")
    leaves = nodes // nodes_per_leaf
    dgx = DGX_H100
    uplink = nodes_per_leaf * GPUS_PER_DGX * dgx.nic / oversubscription
    check_rank_count(nodes * GPUS_PER_DGX)
    gpus = [f"gpu{i}" for i in range(nodes * GPUS_PER_DGX)]
    links: list[Link] = []
    for i, gpu in enumerate(gpus):  # latencies are GPU to GPU: half on each link of a path
        node = i // GPUS_PER_DGX
        links += duplex(gpu, f"node{node}.switch", dgx.nvlink, NVLINK_STEP_LATENCY, 0.5)
        links += duplex(gpu, f"leaf{node // nodes_per_leaf}", dgx.nic, NET_STEP_LATENCY, 0.5)
    for leaf in range(leaves):
        links += duplex(f"leaf{leaf}", "spine", uplink, SPINE_HOP_LATENCY)
    names = (gpus + [f"node{n}.switch" for n in range(nodes)]
             + [f"leaf{leaf}" for leaf in range(leaves)] + ["spine"])
    ratio = f"{oversubscription:g}"
    if float(ratio) != oversubscription:  # keep the name exact, so it rebuilds this topology
        ratio = repr(float(oversubscription))
    name = (f"fattree-h100:nodes={nodes},nodes_per_leaf={nodes_per_leaf},"
            f"oversubscription={ratio}")
    topo = with_injection(Topology(
        name, tuple(names), tuple(links), tuple(gpus), (dgx.hbm,) * len(gpus),
        GPUS_PER_DGX, NCCL_LAUNCH_LATENCY, dgx.ll_bandwidth(nodes),
        net_overhead=dgx.net_overhead, net_channel_bandwidth=dgx.net_channel,
        net_message_gap=dgx.net_message_gap, net_message_bandwidth=dgx.net_message_rate,
        ring_slice_gap=dgx.ring_slice_gap))
    return with_nvls(_on_channels(topo, 0, dgx, nodes, GPUS_PER_DGX), dgx.nvls_channels)


# -- the registry -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    """A named topology: its one-line description, its builder and the builder's parameters
    as ``(name, default)`` pairs (an int default takes ints, a float default numbers, a
    string default an NCCL version)."""

    name: str
    description: str
    build: Callable[..., Topology]
    params: tuple[tuple[str, int | float | str], ...] = ()


# The parameters of a DGX preset whose NVSwitch reduces: nvls_channels is
# NCCL_NVLS_NCHANNELS, the channels NCCL runs NVLS and NVLS-tree on (0: its own count).
_NVLS_DGX_PARAMS = (("gpus", GPUS_PER_DGX), ("channels", 0), ("nvls_channels", 0))

PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    Preset("dgx-a100", "8x A100 80GB SXM4 on NVSwitch: 240 GB/s NVLink data rate per GPU "
           "per direction, HBM 2039 GB/s (gpus=8: fewer take part; channels=0: NCCL's)",
           dgx_a100, (("gpus", GPUS_PER_DGX), ("channels", 0))),
    Preset("dgx-h100", "8x H100 SXM5 on NVSwitch: 370.8 GB/s NVLink data rate per GPU per "
           "direction, NVLS, HBM 3350 GB/s (gpus=8: fewer take part; channels=0 and "
           "nvls_channels=0: NCCL's)", dgx_h100, _NVLS_DGX_PARAMS),
    Preset("dgx-h200", "8x H200 SXM on NVSwitch: as dgx-h100, HBM 4800 GB/s (gpus=8: fewer "
           "take part; channels=0 and nvls_channels=0: NCCL's)", dgx_h200, _NVLS_DGX_PARAMS),
    Preset("dgx-b200", "8x B200 on NVSwitch: 720 GB/s NVLink data rate per GPU per direction, "
           "NVLS, HBM 8000 GB/s (gpus=8: fewer take part; channels=0 and nvls_channels=0: "
           "NCCL's)", dgx_b200, _NVLS_DGX_PARAMS),
    Preset("pcie-a100", "A100 80GB PCIe cards on one PCIe Gen4 x16 switch, 24 GB/s per GPU "
           "per direction (gpus=8)", pcie_a100, (("gpus", 8),)),
    *(Preset(f"cluster-{gpu}", f"DGX {gpu.upper()} nodes, one {nic} Gb/s NIC per GPU into one "
             "network switch (nodes=2, nics=8: NICs per node, channels=0: NCCL's, "
             "nic_ports=1: ports sharing a NIC's rate, gpus=8: fewer per node take part, "
             "qps=1: NCCL_IB_QPS_PER_CONNECTION"
             + (f", nvls_channels=0: NCCL's, nccl={NEWEST_NCCL}: the version whose tuner "
                "to follow)" if nvls else ")"),
             build, (("nodes", 2), ("nics", GPUS_PER_DGX), ("channels", 0), ("nic_ports", 1),
                     ("gpus", GPUS_PER_DGX), ("qps", 1))
             + (("nvls_channels", 0), ("nccl", NEWEST_NCCL)) * nvls)
      for gpu, nic, build, nvls in (("h100", 400, cluster_h100, True),
                                    ("a100", 200, cluster_a100, False),
                                    ("h200", 400, cluster_h200, True),
                                    ("b200", 400, cluster_b200, True))),
    Preset("aws-p4d", "AWS p4d.24xlarge: 8x A100 40GB on NVSwitch, 4x 100 Gb/s EFA per "
           "node, each shared by two GPUs, Simple only (nodes=2, channels=0: NCCL's)",
           aws_p4d, (("nodes", 2), ("channels", 0))),
    Preset("aws-p4de", "AWS p4de.24xlarge: as aws-p4d with A100 80GB (nodes=2, channels=0: "
           "NCCL's)", aws_p4de, (("nodes", 2), ("channels", 0))),
    Preset("aws-p5", "AWS p5.48xlarge: 8x H100 on NVSwitch, NVLS, 4x 100 Gb/s EFA per GPU "
           f"(nodes=2, channels=0: NCCL's, gpus=8: fewer per node take part, nvls_channels=0: "
           f"NCCL's, nccl={NEWEST_NCCL}: the version whose tuner to follow)", aws_p5,
           (("nodes", 2), ("channels", 0), ("gpus", GPUS_PER_DGX), ("nvls_channels", 0),
            ("nccl", NEWEST_NCCL))),
    Preset("fattree-h100", "DGX H100 nodes on a two-level fat-tree of leaf and spine switches "
           "(nodes=4, nodes_per_leaf=2, oversubscription=1)", fattree_h100,
           (("nodes", 4), ("nodes_per_leaf", 2), ("oversubscription", 1.0))),
)})


def list_presets() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every preset, in a stable order."""
    return [(p.name, p.description) for p in PRESETS.values()]


def is_preset_spec(spec: str) -> bool:
    """Whether ``spec`` names a preset (with or without parameters)."""
    if not isinstance(spec, str):
        raise TypeError(f"a preset is named by a string (NAME or NAME:key=value,...), got "
                        f"{spec!r}")
    return spec.partition(":")[0].strip() in PRESETS


def make_preset(spec: str) -> Topology:
    """Build a preset from ``NAME`` or ``NAME:key=value,key=value``."""
    if not isinstance(spec, str):
        raise TypeError(f"a preset is named by a string (NAME or NAME:key=value,...), got "
                        f"{spec!r}")
    name, _, args = spec.partition(":")
    name = name.strip()
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    params = dict(preset.params)
    kwargs: dict[str, int | float | str] = {}
    for item in filter(None, (part.strip() for part in args.split(","))):
        key, eq, text = (s.strip() for s in item.partition("="))
        if not eq:
            raise ValueError(f"preset {name!r}: write parameters as key=value, got {item!r}")
        if key not in params:
            takes = ", ".join(params) or "no parameters"
            raise ValueError(f"preset {name!r} has no parameter {key!r} (it takes: {takes})")
        if key in kwargs:
            raise ValueError(f"preset {name!r}: parameter {key!r} given twice")
        kwargs[key] = _parse_param(name, key, text, params[key])
    try:
        return preset.build(**kwargs)
    except ValueError as error:
        raise ValueError(f"preset {name!r}: {error}") from None


def _parse_param(preset: str, key: str, text: str, default: int | float | str
                 ) -> int | float | str:
    # Plain figures only: int() and float() would also take 4_0, +2, inf and other digits.
    # A minus sign passes, for the builder's range check to name.
    if isinstance(default, str):  # a version, which its builder reads (``nccl_version``)
        return text
    if isinstance(default, int):
        if not re.fullmatch(r"-?[0-9]+", text):
            raise ValueError(f"preset {preset!r}: {key} must be an int, got {text!r} (write "
                             "plain digits)")
        return int(text)
    if not re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        raise ValueError(f"preset {preset!r}: {key} must be a plain number (e.g. 2 or 1.5), "
                         f"got {text!r}")
    return float(text)


# -- summaries --------------------------------------------------------------------------------

def _pattern(node: str) -> str:
    return re.sub(r"\d+", "N", node)


def _gbps(bandwidth: float) -> str:
    return "inf" if math.isinf(bandwidth) else f"{bandwidth / GB:.4g} GB/s"


def _us(latency: float) -> str:
    return f"{latency / US:.4g} us"


def _per_protocol(costs: PerProtocol) -> str:
    return f"Simple {_us(costs.simple)}, LL {_us(costs.ll)}, LL128 {_us(costs.ll128)}"


def describe(topology: Topology) -> str:
    """A readable summary: nodes, links grouped by class (bandwidth in GB/s per direction,
    latency in us, the LL and LL128 latencies where a link has them, and the gap per message
    where there is one), the launch latency per protocol unless it is zero, the channels of
    rings and trees where the topology gives them, NCCL's charge for posting a network send
    and a ring channel's ceiling between nodes where there are, reduce bandwidths and ranks.

    Links fall in one class when their ends match after replacing digits by ``N`` and their
    bandwidth, latencies and gap agree; a class whose reverse class has as many links is shown
    once, as ``<->``.
    """
    ranked = set(topology.ranks)
    others = [n for n in topology.nodes if n not in ranked]
    lines = [f"{topology.name}: {topology.size} ranks, {len(topology.nodes)} nodes "
             f"({len(others)} without a rank), {len(topology.links)} links"]
    classes = Counter((_pattern(link.src), _pattern(link.dst), link.bandwidth, link.latency,
                       link.ll_latency, link.ll128_latency, link.tree_latency, link.gap)
                      for link in topology.links)
    rows, shown = [], set()
    for key, count in classes.items():
        if key in shown:
            continue
        src, dst, *figures = key
        back = (dst, src, *figures)
        if back != key and classes.get(back) == count:
            shown.add(back)
            rows.append((f"{src} <-> {dst}", 2 * count, *figures))
        else:
            rows.append((f"{src} -> {dst}", count, *figures))
    width = max((len(r[0]) for r in rows), default=0)
    lines.append("links (bandwidth per direction, latency per link):")
    for label, count, bandwidth, latency, ll, ll128, tree, gap in rows:
        protocols = "".join(f"  {name} {_us(seconds)}" for name, seconds in
                            (("LL", ll), ("LL128", ll128)) if seconds is not None)
        if tree is not None:
            protocols += f"  (tree: {_per_protocol(tree)})"
        lines.append(f"  {label:<{width}}  {count:>5} links  {_gbps(bandwidth):>12}  "
                     f"{_us(latency):>9}{protocols}" + (f"  gap {_us(gap)}" if gap else ""))
    launch = topology.launch_latency
    if launch != NO_LAUNCH_LATENCY:
        lines.append(f"launch latency per collective: {_per_protocol(launch)}"
                     + (f" (tree: {_per_protocol(launch.tree)})" if launch.tree else ""))
    if topology.channels is not None:
        lines.append(f"channels of rings and trees: {topology.channels}")
    if topology.net_overhead:
        lines.append(f"NCCL's charge for posting a network send (weighed by the tuner): "
                     f"{_us(topology.net_overhead)}")
    if topology.tuner_net_latency != NO_LAUNCH_LATENCY:
        lines.append(f"NCCL's tuner on a hop between nodes besides its latency (the network "
                     f"plugin's reported latency; weighed by the tuner): "
                     f"{_per_protocol(topology.tuner_net_latency)}")
    disabled = [name for name, on in (("LL", topology.ll_enabled),
                                      ("LL128", topology.ll128_enabled)) if not on]
    if disabled:
        lines.append(f"protocols NCCL leaves out unless told: {', '.join(disabled)}")
    if math.isfinite(topology.net_channel_bandwidth) and topology.node_count > 1:
        lines.append(f"a ring's channel to another node: at most "
                     f"{_gbps(topology.net_channel_bandwidth)}")
    if math.isfinite(topology.ll128_bandwidth):
        lines.append(f"a GPU under LL128, all its channels together: at most "
                     f"{_gbps(topology.ll128_bandwidth)}")
    if topology.ring_slice_gap:
        lines.append(f"a ring's channel per slice under Simple, besides its bytes: "
                     f"{_us(topology.ring_slice_gap)}")
    if topology.net_message_gap and topology.node_count > 1:
        lines.append(f"a ring's channel per message to another node under Simple: "
                     f"{_us(topology.net_message_gap)} besides its bytes at "
                     f"{_gbps(topology.net_message_bandwidth)}")
    if topology.tuner_nvls_tree_bandwidth and topology.node_count > 2:
        lines.append(f"NVLS-tree's NIC as NCCL's tuner credits it (weighed by the tuner): at "
                     f"most {_gbps(topology.tuner_nvls_tree_bandwidth)}")
    if topology.reducing_switches:
        lines.append(f"reduce and multicast in switch (NVLS): "
                     f"{' '.join(topology.reducing_switches[:4])}"
                     + (" ..." if len(topology.reducing_switches) > 4 else "")
                     + f" at {topology.switch_efficiency:.3g} of link bandwidth"
                     + (f" ({topology.tree_switch_efficiency:.3g} under NVLS-tree)"
                        if topology.tree_switch_efficiency is not None else "")
                     + f", {_us(topology.switch_latency)} per op, on "
                       f"{topology.nvls_channels} channels")
    if topology.reducing_switches and topology.tree_network_share() < 1:
        lines.append(f"NVLS-tree's sends to other nodes: at "
                     f"{topology.tree_network_efficiency:.3g} of their way's bandwidth")
    reduce = Counter(topology.reduce_bandwidth)
    if len(reduce) == 1:
        lines.append(f"reduce bandwidth: {_gbps(topology.reduce_bandwidth[0])} on every rank")
    else:
        lines.append("reduce bandwidth: " + ", ".join(
            f"{_gbps(bw)} on {n} rank{'s' * (n > 1)}" for bw, n in reduce.most_common()))
    shown_ranks = " ".join(topology.ranks[:16])
    more = topology.size - 16
    lines.append(f"ranks 0..{topology.size - 1} on: {shown_ranks}"
                 + (f" ... ({more} more)" if more > 0 else ""))
    return "\n".join(lines)


# -- the check against published figures ------------------------------------------------------

def ring_allreduce_busbw(topology: Topology, nbytes: int = GIB) -> float:
    """Simulated nccl-tests bus bandwidth (bytes/second) of ``ring_allreduce`` of ``nbytes``
    of float32 on ``topology``: ``nbytes / time * 2(p-1)/p``."""
    count = nbytes // np.dtype(np.float32).itemsize
    inputs = [SizeOnly(count, np.float32) for _ in range(topology.size)]
    result = simulate(ring_allreduce, inputs, topology, record=False)
    factor = COLLECTIVES["ring_allreduce"].bus_factor(topology.size)
    return count * 4 / result.time * factor


def busbw_table(nbytes: int = GIB) -> str:
    """A markdown table: each preset with a published busbw, its simulated ring all-reduce
    busbw at ``nbytes`` and the relative error."""
    lines = ["| preset | simulated busbw | published busbw | error |",
             "| --- | ---: | ---: | ---: |"]
    for name, published in PUBLISHED_BUSBW.items():
        simulated = ring_allreduce_busbw(make_preset(name), nbytes)
        error = simulated / published.busbw - 1
        lines.append(f"| {name} | {simulated / GB:.1f} GB/s | {published.busbw / GB:.0f} GB/s "
                     f"| {error:+.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(busbw_table())
