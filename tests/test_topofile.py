"""Topology files: a hand-written file reads as intended, every topology survives
dump -> load unchanged, and each kind of mistake is reported with the file and the key."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from algorithms.ops import Protocol
from simcomm import Link, SizeOnly, Topology, parse_bandwidth, parse_seconds, simulate, switch
from simcomm.presets import NCCL_LAUNCH_LATENCY, list_presets, make_preset
from simcomm.topology import NO_LAUNCH_LATENCY, PerProtocol, hierarchical
from simcomm.topofile import (
    TopologyFileError, dump_topology, format_bandwidth, format_latency, load_topology,
    parse_topology,
)
from simcomm.tuning import ModelTuner

LAB_PAIR = """\
# Two lab servers, 4 GPUs each on a PCIe switch, joined through one 100 Gb/s NIC per server.
name = "lab-pair"
gpus = ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
switches = ["a.pcie", "b.pcie", "ethernet"]

[defaults]
bandwidth = "24GB/s"
latency = "2.85us"
reduce_bandwidth = "1935GB/s"

[reduce_bandwidth]
b3 = "1555GB/s"

[[link]]
src = ["a0", "a1", "a2", "a3"]
dst = "a.pcie"

[[link]]
src = ["b0", "b1", "b2", "b3"]
dst = "b.pcie"

[[link]]
src = ["a.pcie", "b.pcie"]
dst = "ethernet"
bandwidth = "100Gbps"
latency = "7us"
"""


def test_hand_written_file_reads_as_written():
    topology = parse_topology(LAB_PAIR)
    assert topology.name == "lab-pair"
    assert topology.nodes == ("a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "a.pcie",
                              "b.pcie", "ethernet")
    assert topology.ranks == topology.nodes[:8]
    assert topology.reduce_bandwidth == (1935e9,) * 7 + (1555e9,)
    assert len(topology.links) == 20
    assert topology.links[:2] == (Link("a0", "a.pcie", 24e9, 2.85e-6),
                                  Link("a.pcie", "a0", 24e9, 2.85e-6))
    assert topology.links[-1] == Link("ethernet", "b.pcie", 12.5e9, 7e-6)
    path = [(topology.links[i].src, topology.links[i].dst) for i in topology.route(3, 4)]
    assert path == [("a3", "a.pcie"), ("a.pcie", "ethernet"), ("ethernet", "b.pcie"),
                    ("b.pcie", "b0")]


def test_a_gap_reads_from_defaults_or_the_link():
    text = GOOD_HEAD + '[defaults]\ngap = "3us"\n' + GOOD_LINK.replace(
        '["gpu0", "gpu1"]', '"gpu0"') + (
        '[[link]]\nsrc = "gpu1"\ndst = "sw"\nbandwidth = "1GB/s"\nlatency = "1us"\n'
        'gap = "0s"\n')
    topology = parse_topology(text)
    assert [link.gap for link in topology.links] == [3e-6] * 2 + [0.0] * 2
    assert parse_topology(dump_topology(topology)) == topology


def test_a_file_without_protocol_figures_has_none_and_writes_none():
    topology = parse_topology(LAB_PAIR)
    assert all(link.ll_latency is None and link.ll128_latency is None
               for link in topology.links)
    assert topology.launch_latency == NO_LAUNCH_LATENCY
    assert topology.links[0].latency_of(Protocol.LL) == 2.85e-6
    dumped = dump_topology(topology)
    assert "latency_ll" not in dumped and "launch_latency" not in dumped


PROTOCOL_FILE = """\
gpus = ["gpu0", "gpu1"]
switches = ["sw"]
launch_latency = "8us"
launch_latency_ll128 = "12us"

[defaults]
bandwidth = "10GB/s"
latency = "2us"
latency_ll = "0.5us"

[[link]]
src = "gpu0"
dst = "sw"
latency_ll128 = "1us"

[[link]]
src = "gpu1"
dst = "sw"
latency = "3us"
latency_ll = "0.25us"
"""


def test_protocol_latencies_read_from_defaults_and_links():
    topology = parse_topology(PROTOCOL_FILE)
    assert topology.links == (
        Link("gpu0", "sw", 10e9, 2e-6, ll_latency=0.5e-6, ll128_latency=1e-6),
        Link("sw", "gpu0", 10e9, 2e-6, ll_latency=0.5e-6, ll128_latency=1e-6),
        Link("gpu1", "sw", 10e9, 3e-6, ll_latency=0.25e-6),
        Link("sw", "gpu1", 10e9, 3e-6, ll_latency=0.25e-6))
    assert topology.links[2].latency_of(Protocol.LL128) == 3e-6  # none given: Simple's
    # launch_latency_ll is not given: it takes launch_latency, not 0
    assert topology.launch_latency == PerProtocol(8e-6, 8e-6, 12e-6)
    assert parse_topology(dump_topology(topology)) == topology


def test_tree_latencies_read_from_defaults_and_links_the_rest_from_the_link():
    # the protocol file with tree figures: a launch's, a default one and one link's
    text = (PROTOCOL_FILE.replace('launch_latency_ll128 = "12us"\n',
                                  'tree_launch_latency_ll = "6.8us"\n')
            .replace('latency_ll = "0.5us"\n', 'latency_ll = "0.5us"\ntree_latency_ll128 = "4us"\n')
            + 'tree_latency = "9us"\n')
    topology = parse_topology(text)
    first, third = topology.links[0], topology.links[2]
    # the tree's LL and Simple figures not given: the link's own under those protocols
    assert first.tree_latency == PerProtocol(2e-6, 0.5e-6, 4e-6)
    assert third.tree_latency == PerProtocol(9e-6, 0.25e-6, 4e-6)
    assert first.latency_of(Protocol.LL128, "tree") == 4e-6
    assert first.latency_of(Protocol.LL128, "ring") == 1e-6
    assert topology.launch_latency == PerProtocol(8e-6, 8e-6, 8e-6,
                                                  tree=PerProtocol(8e-6, 6.8e-6, 8e-6))
    assert topology.launch_latency.of(Protocol.LL, "tree") == 6.8e-6
    assert parse_topology(dump_topology(topology)) == topology


def test_builder_form_takes_tree_latencies():
    text = """
kind = "switch"
ranks = 4
bandwidth = "100GB/s"
latency = "4us"
latency_tree_ll128 = "3us"
"""
    topology = parse_topology(text, default_name="box")
    built = switch(4, 100e9, PerProtocol(4e-6, 4e-6, 4e-6,
                                         tree=PerProtocol(4e-6, 4e-6, 3e-6)))
    assert topology.links == built.links
    assert topology.links[0].tree_latency == PerProtocol(2e-6, 2e-6, 1.5e-6)


def test_launch_latency_alone_applies_to_every_protocol_and_round_trips():
    text = GOOD_HEAD + 'launch_latency = "5us"\n' + GOOD_LINK
    topology = parse_topology(text)
    assert topology.launch_latency == PerProtocol(5e-6, 5e-6, 5e-6)
    dumped = dump_topology(topology)
    assert 'launch_latency = "5us"' in dumped and "launch_latency_ll" not in dumped
    assert parse_topology(dumped) == topology
    only_ll = replace(topology, launch_latency=PerProtocol(0.0, 3e-6, 0.0))
    assert parse_topology(dump_topology(only_ll)) == only_ll


def test_a_default_protocol_latency_is_written_only_when_every_link_has_one():
    mixed = Topology("mixed", ("a", "b", "c"), (
        Link("a", "b", 1e9, 1e-6, ll_latency=0.5e-6), Link("b", "a", 1e9, 1e-6, ll_latency=0.5e-6),
        Link("b", "c", 1e9, 1e-6, ll_latency=0.5e-6), Link("c", "b", 1e9, 1e-6)),
        ("a", "c"), (math.inf, math.inf))
    dumped = dump_topology(mixed)
    import tomllib
    assert tomllib.loads(dumped)["defaults"] == {"bandwidth": "1GB/s", "latency": "1us",
                                                 "reduce_bandwidth": "inf"}
    assert dumped.count('latency_ll = "0.5us"') == 2  # two duplex entries; b -> c one way
    assert "latency_ll128" not in dumped
    assert parse_topology(dumped) == mixed


def test_hand_written_file_round_trips():
    topology = parse_topology(LAB_PAIR)
    assert parse_topology(dump_topology(topology)) == topology


@pytest.mark.parametrize("spec", [name for name, _ in list_presets()] + [
    "cluster-h100:nodes=3", "fattree-h100:nodes=6,nodes_per_leaf=3,oversubscription=1.5",
    "pcie-a100:gpus=1", "cluster-a100:nodes=3,nics=2", "dgx-b200:gpus=4",
    "cluster-h100:nodes=2,qps=2"])
def test_every_preset_round_trips(spec):
    topology = make_preset(spec)
    again = parse_topology(dump_topology(topology))
    assert again == topology
    # equality compares every figure; check that the protocol ones are there to compare
    assert again.launch_latency == NCCL_LAUNCH_LATENCY
    assert [(link.ll_latency, link.ll128_latency) for link in again.links] == [
        (link.ll_latency, link.ll128_latency) for link in topology.links]
    assert any(link.ll_latency is not None for link in again.links)
    assert again.net_channel_bandwidth == topology.net_channel_bandwidth


def test_fattree_spine_links_keep_no_protocol_latencies_through_a_file():
    topology = make_preset("fattree-h100")
    again = parse_topology(dump_topology(topology))
    spine = [link for link in again.links if "spine" in (link.src, link.dst)]
    assert spine and all(link.ll_latency is None and link.ll128_latency is None
                         for link in spine)
    nic = next(link for link in again.links if link.dst == "leaf0")
    assert nic.latency_of(Protocol.LL) == 1.35e-6 and nic.latency_of(Protocol.LL128) == 2e-6


def test_ranks_and_nodes_forms():
    text = """
nodes = ["sw", "x", "y"]
ranks = ["y", "x"]
defaults = { bandwidth = "1GB/s", latency = "1us" }
link = [{ src = ["x", "y"], dst = "sw" }]
"""
    topology = parse_topology(text)
    assert topology.nodes == ("sw", "x", "y")
    assert topology.ranks == ("y", "x")
    assert topology.reduce_bandwidth == (math.inf, math.inf)
    assert topology.name == "topology"
    dumped = dump_topology(topology)
    assert "nodes = " in dumped  # the switch comes first, so gpus/switches cannot say it
    assert parse_topology(dumped) == topology


def test_gpu_count_and_one_way_links():
    text = """
gpus = 3
[defaults]
bandwidth = "50GB/s"
latency = "1us"
duplex = false
[[link]]
src = ["gpu0", "gpu1", "gpu2"]
dst = ["gpu0", "gpu1", "gpu2"]
"""
    topology = parse_topology(text)
    assert topology.ranks == ("gpu0", "gpu1", "gpu2")
    assert [(link.src, link.dst) for link in topology.links] == [
        ("gpu0", "gpu1"), ("gpu0", "gpu2"), ("gpu1", "gpu0"), ("gpu1", "gpu2"),
        ("gpu2", "gpu0"), ("gpu2", "gpu1")]


def test_builder_form_equals_the_builder():
    text = """
kind = "switch"
name = "my-box"
ranks = 8
bandwidth = "370.8GB/s"
latency = "3.4us"
reduce_bandwidth = "3350GB/s"
"""
    built = switch(8, parse_bandwidth("370.8GB/s"), parse_seconds("3.4us"),
                   parse_bandwidth("3350GB/s"))
    topology = parse_topology(text)
    assert topology == Topology("my-box", built.nodes, built.links, built.ranks,
                                built.reduce_bandwidth)
    assert parse_topology(dump_topology(topology)) == topology


def test_builder_form_with_protocol_latencies_equals_the_builder():
    text = """
kind = "switch"
ranks = 4
bandwidth = "100GB/s"
latency = "4us"
latency_ll = "1us"
latency_ll128 = "2us"
launch_latency = "8us"
launch_latency_ll = "6us"
"""
    topology = parse_topology(text, default_name="box")
    built = switch(4, 100e9, PerProtocol(4e-6, 1e-6, 2e-6))
    assert topology == Topology("box", built.nodes, built.links, built.ranks,
                                built.reduce_bandwidth, launch_latency=PerProtocol(8e-6, 6e-6,
                                                                                   8e-6))
    assert topology.links[0].ll_latency == 0.5e-6  # half on each link, as the latency
    assert parse_topology(dump_topology(topology)) == topology


def test_hierarchical_builder_takes_protocol_latencies_per_tier():
    text = """
kind = "hierarchical"
nodes = 2
gpus_per_node = 2
intra_bandwidth = "240GB/s"
intra_latency = "3.4us"
intra_latency_ll = "0.6us"
inter_bandwidth = "200Gbps"
inter_latency = "14us"
inter_latency_ll128 = "4us"
"""
    topology = parse_topology(text, default_name="hierarchical")
    # the figure not given takes the Simple one
    built = hierarchical(2, 2, 240e9, PerProtocol(3.4e-6, 0.6e-6, 3.4e-6), 25e9,
                         PerProtocol(14e-6, 14e-6, 4e-6))
    assert topology == built
    assert topology.launch_latency == NO_LAUNCH_LATENCY


def test_builder_form_without_protocol_keys_has_no_protocol_latencies():
    topology = parse_topology('kind = "ring"\nranks = 3\nbandwidth = "1GB/s"\n'
                              'latency = "1us"\n')
    assert all(link.ll_latency is None and link.ll128_latency is None
               for link in topology.links)
    assert topology.launch_latency == NO_LAUNCH_LATENCY


def test_hierarchical_builder_with_defaults():
    text = """
kind = "hierarchical"
nodes = 2
gpus_per_node = 4
intra_bandwidth = "240GB/s"
intra_latency = "3.4us"
inter_bandwidth = "200Gbps"
inter_latency = "14us"
"""
    topology = parse_topology(text, default_name="two-nodes")
    assert topology.name == "two-nodes"
    assert topology.size == 8
    assert set(topology.reduce_bandwidth) == {math.inf}
    assert any(link.bandwidth == 25e9 for link in topology.links)


def test_load_topology_takes_presets_and_files(tmp_path):
    assert load_topology("dgx-h100") == make_preset("dgx-h100")
    assert load_topology("cluster-h100:nodes=3").size == 24
    path = tmp_path / "lab.toml"
    path.write_text(LAB_PAIR)
    assert load_topology(str(path)) == parse_topology(LAB_PAIR)
    assert load_topology(path) == parse_topology(LAB_PAIR)
    unnamed = tmp_path / "rack7.toml"
    unnamed.write_text(LAB_PAIR.replace('name = "lab-pair"\n', ""))
    assert load_topology(unnamed).name == "rack7"


def test_load_topology_rejects_what_it_cannot_find(tmp_path):
    with pytest.raises(ValueError, match="neither a preset .* nor a topology file"):
        load_topology("dgx-h300")
    missing = tmp_path / "missing.toml"
    with pytest.raises(TopologyFileError, match="cannot read topology file .*missing.toml"):
        load_topology(str(missing))


GOOD_HEAD = 'gpus = ["gpu0", "gpu1"]\nswitches = ["sw"]\n'
GOOD_LINK = '[[link]]\nsrc = ["gpu0", "gpu1"]\ndst = "sw"\nbandwidth = "1GB/s"\nlatency = "1us"\n'


@pytest.mark.parametrize("text, key, problem", [
    ("gpus = 2\ngpu = 3\n", "gpu", "unknown key"),
    ('gpus = 2\n[defaults]\nbandwith = "1GB/s"\n', "defaults.bandwith", "unknown key"),
    (GOOD_HEAD + GOOD_LINK + 'bw = "1GB/s"\n', "link[0].bw", "unknown key"),
    (GOOD_HEAD + '[[link]]\nsrc = "gpu0"\nbandwidth = "1GB/s"\nlatency = "1us"\n',
     "link[0].dst", "missing key"),
    (GOOD_HEAD + '[[link]]\nsrc = "gpu0"\ndst = "sw"\nlatency = "1us"\n',
     "link[0].bandwidth", "missing key"),
    (GOOD_HEAD + GOOD_LINK.replace('"1GB/s"', '"1 GBit/s"'), "link[0].bandwidth",
     "unknown bandwidth unit"),
    (GOOD_HEAD + GOOD_LINK.replace('"1GB/s"', '100e9'), "link[0].bandwidth",
     "must be a string with a unit"),
    (GOOD_HEAD + GOOD_LINK.replace('"1us"', '"5"'), "link[0].latency",
     "time '5' has no unit: write 5s, 5ms, 5us or 5ns"),
    (GOOD_HEAD + GOOD_LINK.replace('"1us"', '"1e-6"'), "link[0].latency",
     "time '1e-6' has no unit"),
    (GOOD_HEAD + '[defaults]\nlatency = "5 parsecs"\n', "defaults.latency",
     "unknown time unit"),
    (GOOD_HEAD + GOOD_LINK.replace('dst = "sw"', 'dst = "sw2"'), "link[0].dst",
     "unknown node 'sw2'"),
    (GOOD_HEAD + GOOD_LINK.replace('src = ["gpu0", "gpu1"]', 'src = "sw"'), "link[0]",
     "src and dst are both 'sw'"),
    (GOOD_HEAD + GOOD_LINK + "duplex = 1\n", "link[0].duplex", "must be true or false"),
    (GOOD_HEAD + GOOD_LINK + 'gap = "5"\n', "link[0].gap", "time '5' has no unit"),
    (GOOD_HEAD, "link", "no route from rank 0 (gpu0) to rank 1 (gpu1)"),
    (GOOD_HEAD + GOOD_LINK.replace('src = ["gpu0", "gpu1"]', 'src = "gpu0"')
     + '[[link]]\nsrc = "gpu1"\ndst = "sw"\nbandwidth = "1GB/s"\nlatency = "1us"\n'
       'duplex = false\n', "link", "no route from rank 0 (gpu0) to rank 1 (gpu1)"),
    ('switches = ["sw"]\n', "gpus", "missing key"),
    ("gpus = 0\n", "gpus", "must be an integer >= 1"),
    # Used to make 10^8 names, and run out of memory, before a word.
    ("gpus = 100000000\n", "gpus", "must be at most 131,072 (the ranks a topology may have), "
                                  "got 100,000,000"),
    ('kind = "fully_connected"\nranks = 100000\nbandwidth = "1GB/s"\nlatency = "1us"\n', "",
     "a fully-connected topology of 100,000 ranks has 9,999,900,000 links"),
    ('gpus = ["a", "a"]\n', "gpus", "node 'a' is declared twice"),
    ('gpus = ["a"]\nswitches = ["a"]\n', "switches", "node 'a' is declared twice"),
    ('gpus = 1\nreduce_bandwidth = "1TB/s"\n', "reduce_bandwidth", "goes in [defaults]"),
    ('nodes = ["a", "b"]\n', "ranks", "missing key"),
    ('nodes = ["a"]\nranks = ["a"]\ngpus = 1\n', "gpus", "not both"),
    (GOOD_HEAD + 'ranks = ["gpu0", "sw"]\n' + GOOD_LINK, "ranks[1]", "'sw' is not a declared GPU"),
    (GOOD_HEAD + 'ranks = ["gpu0", "gpu0"]\n' + GOOD_LINK, "ranks[1]", "already holds a rank"),
    (GOOD_HEAD + '[reduce_bandwidth]\nsw = "1TB/s"\n' + GOOD_LINK, "reduce_bandwidth.sw",
     "names no node that holds a rank"),
    (GOOD_HEAD + '[reduce_bandwidth]\ngpu1 = "fast"\n' + GOOD_LINK, "reduce_bandwidth.gpu1",
     "cannot read 'fast' as a bandwidth"),
    ('kind = "torus"\nranks = 8\n', "kind", "unknown builder 'torus'"),
    ('kind = ["ring"]\nranks = 8\n', "kind", "unknown builder ['ring']"),
    ('kind = "ring"\nbandwidth = "1GB/s"\nlatency = "1us"\n', "ranks", "missing key"),
    ('kind = "ring"\nranks = 4\nbandwidth = "1GB/s"\nlatency = "1us"\nradix = 2\n', "radix",
     "unknown key"),
    ('kind = "ring"\nranks = true\nbandwidth = "1GB/s"\nlatency = "1us"\n', "ranks",
     "must be an integer >= 1"),
    ("gpus = [\n", "", "not valid TOML"),
    # tomllib recurses per level: this used to end in a RecursionError's traceback.
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "", "arrays or tables nested too deep to read"),
    (GOOD_HEAD + GOOD_LINK + 'latency_ll = "-1us"\n', "link[0].latency_ll",
     "cannot read '-1us' as a time"),
    (GOOD_HEAD + GOOD_LINK + 'latency_ll128 = "0.5"\n', "link[0].latency_ll128",
     "time '0.5' has no unit"),
    (GOOD_HEAD + GOOD_LINK + "latency_ll128 = 5e-7\n", "link[0].latency_ll128",
     "must be a string with a unit"),
    (GOOD_HEAD + '[defaults]\nlatency_ll = "1e400us"\n' + GOOD_LINK, "defaults.latency_ll",
     "must be finite and >= 0"),
    (GOOD_HEAD + '[defaults]\nlatency_l = "1us"\n' + GOOD_LINK, "defaults.latency_l",
     "unknown key"),
    ('launch_latency = "-2us"\n' + GOOD_HEAD + GOOD_LINK, "launch_latency",
     "cannot read '-2us' as a time"),
    ('launch_latency_ll = "6.6"\n' + GOOD_HEAD + GOOD_LINK, "launch_latency_ll",
     "time '6.6' has no unit"),
    ('launch_latency_ll128 = "1e999s"\n' + GOOD_HEAD + GOOD_LINK, "launch_latency_ll128",
     "must be finite and >= 0"),
    ('kind = "ring"\nranks = 4\nbandwidth = "1GB/s"\nlatency = "1us"\nlatency_ll = "1"\n',
     "latency_ll", "time '1' has no unit"),
    ('kind = "hierarchical"\nnodes = 1\ngpus_per_node = 2\nintra_bandwidth = "1GB/s"\n'
     'intra_latency = "1us"\ninter_bandwidth = "1GB/s"\ninter_latency = "1us"\n'
     'inter_latency_ll128 = "infus"\n', "inter_latency_ll128", "cannot read 'infus'"),
    ('kind = "ring"\nranks = 4\nbandwidth = "1GB/s"\nlatency = "1us"\n'
     'intra_latency_ll = "1us"\n', "intra_latency_ll", "unknown key"),
    ('kind = "switch"\nranks = 4\nbandwidth = "1GB/s"\nlatency = "1us"\n'
     'launch_latency = "nan us"\n', "launch_latency", "cannot read 'nan us'"),
    # A second entry for a direction used to be read and never used.
    (GOOD_HEAD + GOOD_LINK + GOOD_LINK.replace('["gpu0", "gpu1"]', '"gpu1"'), "link[1]",
     "the link gpu1 -> sw is given twice (first in link[0])"),
    (GOOD_HEAD + GOOD_LINK + '[[link]]\nsrc = "sw"\ndst = "gpu0"\nbandwidth = "2GB/s"\n'
     'latency = "1us"\nduplex = false\n', "link[1]", "the link sw -> gpu0 is given twice"),
])
def test_bad_files_name_the_file_and_the_key(tmp_path, text, key, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TopologyFileError) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: " if key else f"{path}: "), message
    assert problem in message, message


def test_formatted_figures_read_back_exactly():
    assert format_bandwidth(370.8e9) == "370.8GB/s"
    assert format_bandwidth(12.5e9) == "12.5GB/s"
    assert format_bandwidth(math.inf) == "inf"
    assert format_bandwidth(240e9) == "240GB/s"
    assert format_latency(2.85e-6) == "2.85us"
    assert format_latency(0.25) == "250ms"
    assert format_latency(0.0) == "0s"
    assert format_latency(1.7e-6) == "1.7us"  # decimal text reads back as the nearest double
    for seconds in (1.7e-6, parse_seconds("1.7us"), 1e-300):
        assert parse_seconds(format_latency(seconds)) == seconds


NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
BANDWIDTHS = st.floats(min_value=0.0, exclude_min=True, allow_nan=False)
LATENCIES = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)
PROTOCOL_LATENCIES = st.none() | LATENCIES
TREE_LATENCIES = st.none() | st.builds(PerProtocol, LATENCIES, LATENCIES, LATENCIES)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    """Any topology whose ranks all reach each other: a duplex chain through every node in
    some order, some extra one-way links (a file gives each direction once), links
    shuffled."""
    names = draw(st.lists(NAMES, min_size=2, max_size=6, unique=True))
    ranks = draw(st.permutations(names))[:draw(st.integers(1, len(names)))]
    order = draw(st.permutations(names))
    links = []
    for a, b in zip(order, order[1:]):
        links += [Link(a, b, draw(BANDWIDTHS), draw(LATENCIES)),
                  Link(b, a, draw(BANDWIDTHS), draw(LATENCIES), 0.0, draw(PROTOCOL_LATENCIES),
                       draw(PROTOCOL_LATENCIES))]
    extra = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names),
                                    BANDWIDTHS, LATENCIES, LATENCIES, PROTOCOL_LATENCIES,
                                    PROTOCOL_LATENCIES, TREE_LATENCIES), max_size=6))
    taken = {(link.src, link.dst) for link in links}
    for a, b, bw, lat, gap, ll, ll128, tree in extra:
        if a != b and (a, b) not in taken:
            taken.add((a, b))
            links.append(Link(a, b, bw, lat, gap, ll, ll128, tree))
    links = draw(st.permutations(links))
    reduce = draw(st.lists(BANDWIDTHS, min_size=len(ranks), max_size=len(ranks)))
    launch = draw(st.just(NO_LAUNCH_LATENCY) | st.builds(PerProtocol, LATENCIES, LATENCIES,
                                                           LATENCIES, TREE_LATENCIES))
    return Topology(draw(NAMES), tuple(names), tuple(links), tuple(ranks), tuple(reduce),
                    launch_latency=launch, net_overhead=draw(LATENCIES),
                    ring_slice_gap=draw(LATENCIES))


@given(topologies())
@example(Topology('q"\\\x7f\n', ("a.b", "c d"), (Link("a.b", "c d", 5e-324, 0.0),
                                                  Link("c d", "a.b", math.inf, 1e-300)),
                  ("c d",), (math.inf,)))
def test_any_topology_round_trips(topology):
    assert parse_topology(dump_topology(topology)) == topology


def test_local_size_round_trips_and_reaches_the_algorithm() -> None:
    topology = make_preset("cluster-h100:nodes=2")
    assert topology.local_size == 8
    again = parse_topology(dump_topology(topology))
    assert again.local_size == 8 and again == topology

    def node_sizes(comm, x):
        return comm.local_size
        yield

    assert simulate(node_sizes, [SizeOnly(0)] * 16, again).results == [8] * 16


def test_a_channel_count_reaches_the_tuner_and_a_bad_one_is_refused() -> None:
    text = ('gpus = 4\nchannels = 6\ndefaults = { bandwidth = "1GB/s", latency = "1us" }\n'
            'switches = ["sw"]\nlink = [{ src = ["gpu0", "gpu1", "gpu2", "gpu3"], '
            'dst = "sw" }]')
    topology = parse_topology(text)
    assert ModelTuner(topology)("allreduce", 1 << 20).channels == 6
    with pytest.raises(TopologyFileError, match="channels: must be an integer >= 1"):
        parse_topology(text.replace("channels = 6", "channels = 0"))


def test_ll128_left_out_of_the_tuner_by_a_file_is_still_run_when_forced() -> None:
    text = ('gpus = 4\nll128_enabled = false\nll128_channel_bandwidth = "20GB/s"\n'
            'defaults = { bandwidth = "24GB/s", latency = "5.7us", latency_ll = "1us", '
            'latency_ll128 = "2.5us" }\nswitches = ["sw"]\n'
            'link = [{ src = ["gpu0", "gpu1", "gpu2", "gpu3"], dst = "sw" }]')
    topology = parse_topology(text)
    tuner = ModelTuner(topology)
    assert not topology.ll128_enabled and Protocol.LL128 not in tuner.protocols()
    assert all(Protocol.LL128 is not choice.protocol
               for size in (1 << 16, 1 << 20, 1 << 22) for choice in tuner.estimates(
                   "allreduce", size))
    assert parse_topology(dump_topology(topology)) == topology
    with pytest.raises(TopologyFileError, match="ll128_enabled: must be true or false"):
        parse_topology(text.replace("ll128_enabled = false", 'll128_enabled = "no"'))


def test_a_file_can_leave_ll_out_and_give_what_the_tuner_counts_between_machines() -> None:
    text = ('gpus = 4\nlocal_size = 2\nll_enabled = false\nll128_enabled = false\n'
            'tuner_net_latency = "150us"\ntuner_net_latency_ll = "75us"\n'
            'defaults = { bandwidth = "24GB/s", latency = "5us" }\nswitches = ["sw"]\n'
            'link = [{ src = ["gpu0", "gpu1", "gpu2", "gpu3"], dst = "sw" }]')
    topology = parse_topology(text)
    assert not topology.ll_enabled and ModelTuner(topology).protocols() == [Protocol.SIMPLE]
    assert topology.tuner_net_latency == PerProtocol(150e-6, 75e-6, 150e-6)
    assert parse_topology(dump_topology(topology)) == topology
    with pytest.raises(TopologyFileError, match="tuner_net_latency_ll128"):
        parse_topology(text + '\ntuner_net_latency_ll128 = "-1us"')


def test_a_local_size_that_does_not_divide_the_ranks_is_refused() -> None:
    with pytest.raises(TopologyFileError, match="local_size must be an int >= 1 that divides"):
        parse_topology('gpus = 3\nlocal_size = 2\ndefaults = { bandwidth = "1GB/s", '
                       'latency = "1us" }\nlink = [{ src = "gpu0", dst = "gpu1" }, '
                       '{ src = "gpu1", dst = "gpu2" }]')


def test_a_trees_channel_ceiling_reads_round_trips_and_is_checked() -> None:
    text = ('gpus = 4\ntree_channel_bandwidth = "10.35GB/s"\n'
            'defaults = { bandwidth = "48GB/s", latency = "14us" }\nswitches = ["sw"]\n'
            'link = [{ src = ["gpu0", "gpu1", "gpu2", "gpu3"], dst = "sw" }]')
    topology = parse_topology(text)
    assert topology.tree_channel_bandwidth == 10.35e9
    assert parse_topology(dump_topology(topology)) == topology
    with pytest.raises(TopologyFileError, match="tree_channel_bandwidth"):
        parse_topology(text.replace('"10.35GB/s"', '"0GB/s"'))
