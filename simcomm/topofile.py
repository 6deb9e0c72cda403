"""Topology files: a TOML format for writing down your own cluster by hand.

Two forms. The explicit form lists nodes and links::

    name = "two-gpus"
    gpus = ["gpu0", "gpu1"]          # nodes that hold ranks; or a count: gpus = 2
    switches = ["sw"]                # other nodes (optional)
    ranks = ["gpu1", "gpu0"]         # rank order (optional; default: the gpus in order)
    local_size = 1                   # ranks per machine, for hierarchical algorithms
                                     # (optional; default: all on one)
    launch_latency = "8.4us"         # what starting one collective costs (NCCL's base
    launch_latency_ll = "6.6us"      # latency) under Simple, LL and LL128 (optional;
    launch_latency_ll128 = "14us"    # default 0; LL's and LL128's default: launch_latency)
    tree_launch_latency_ll = "6.8us" # NCCL's tree's own, as tree_launch_latency and
                                     # tree_launch_latency_ll128 (optional; default: as above)
    ll_bandwidth = "39GB/s"          # what one GPU sends per second under LL, all links
                                     # together (optional; default: no limit)
    injection_bandwidth = "418.8GB/s"  # what one GPU's kernels move per second, all
                                     # channels together (optional; default: no limit)
    ll128_channel_bandwidth = "36.7GB/s"  # what one channel moves per second under LL128
                                     # (optional; default: no limit)
    ll128_bandwidth = "168GB/s"      # what one GPU sends per second under LL128, all
                                     # channels together (optional; default: no limit)
    tree_channel_bandwidth = "10.35GB/s"  # what one channel of NCCL's tree sends per
                                     # second to each peer under Simple (optional; default:
                                     # no limit)
    net_channel_bandwidth = "20.2GB/s"  # what one channel of a ring sends per second to
                                     # a peer on another machine, as local_size tells them
                                     # (optional; default: no limit)
    ring_slice_gap = "2us"           # how long a ring's channel holds each slice it sends
                                     # under Simple besides its bytes (default 0)
    net_message_gap = "8.2us"        # how long each message a ring's channel sends to
    net_message_bandwidth = "24GB/s" # another machine under Simple holds that connection
                                     # besides its bytes at this rate (default 0, no limit)
    ll128_enabled = false            # whether NCCL weighs LL128 unless told (default true;
                                     # NCCL: only where a node's GPUs talk over NVLink)
    ll_enabled = false               # the same for LL (default true; NCCL_PROTO=simple)
    reducing_switches = ["sw"]       # switches that reduce and multicast (NVLS; optional)
    switch_efficiency = 0.8333       # their share of a link's bandwidth (default 1)
    tree_switch_efficiency = 0.78    # the same under NVLS-tree (default: as above)
    tree_network_efficiency = 0.85   # NVLS-tree's share of a NIC beyond two nodes
                                     # (default 1)
    nvls_channels = 16               # how many channels NCCL runs NVLS on (default 16)
    switch_latency = "4.9us"         # what each in-switch op waits there (default 0)
    channels = 16                    # how many channels NCCL runs rings and trees on
                                     # (optional; default: one per rank of a machine)
    net_overhead = "1us"             # what NCCL's tuner takes a host to spend posting a
                                     # network send (default 0; it weighs choices only)
    tuner_nvls_tree_bandwidth = "45.5GB/s"  # the most of a NIC NCCL's tuner credits
                                     # NVLS-tree with beyond two machines (default 0: what
                                     # it reaches; it weighs choices only)
    tuner_net_latency = "129.6us"    # what NCCL's tuner counts on a hop between machines
    tuner_net_latency_ll = "54.6us"  # besides its links' latency (a network plugin's
    tuner_net_latency_ll128 = "54.6us"  # reported latency; LL and LL128 as launch_latency;
                                     # default 0; it weighs choices only)

    [defaults]                       # for every link and GPU that does not say otherwise
    bandwidth = "100GB/s"            # per direction
    latency = "2us"                  # under the Simple protocol
    latency_ll = "0.3us"             # under LL and LL128 (optional; default: the link's
    latency_ll128 = "0.95us"         # latency, as for Simple)
    tree_latency = "2us"             # a hop of NCCL's tree, as tree_latency_ll and
                                     # tree_latency_ll128 (optional; default: as above)
    duplex = true                    # a link entry makes both directions (default true)
    reduce_bandwidth = "2TB/s"       # default: inf (reductions are free)

    [reduce_bandwidth]               # per GPU (optional)
    gpu1 = "1TB/s"

    [compute_speed]                  # per GPU, against the nominal speed (optional):
    gpu1 = 0.8                       # gpu1's Compute ops take 1 / 0.8 as long

    [[link]]
    src = ["gpu0", "gpu1"]           # a name or a list: one link per (src, dst) pair
    dst = "sw"
    latency = "1us"                  # overrides [defaults]; so may latency_ll, tree_latency...
    gap = "0.5us"                    # seconds each message holds the link besides its
                                     # bytes (LogGP's g; default 0)

Instead of ``gpus`` and ``switches`` a file may list ``nodes`` (every node, in order) with
``ranks``. The builder form names a builder of ``simcomm.topology`` and its parameters::

    kind = "switch"                  # ring, fully_connected, switch or hierarchical
    ranks = 8
    bandwidth = "370.8GB/s"
    latency = "3.4us"
    latency_ll = "0.6us"             # optional, as latency_ll128, latency_tree,
                                     # latency_tree_ll, latency_tree_ll128; hierarchical takes
                                     # intra_latency_ll, inter_latency_tree, ...
    reduce_bandwidth = "3350GB/s"
    launch_latency = "8.4us"         # optional, as in the explicit form (ll_bandwidth,
                                     # the switch keys, channels, net_overhead and
                                     # ring_slice_gap too)

A link's LL or LL128 latency that no key gives is None: the link's ``latency`` (Simple's)
applies. A link with no tree latency key has none (its tree messages take its other
latencies); one with some takes the others from its own latency under that protocol. In the
builder form, giving one of a latency's LL and LL128 figures builds with ``PerProtocol``
latencies, and the one not given takes the Simple figure; the tree's likewise. Bandwidths and
latencies need units (``100GB/s``, ``400Gbps``, ``2us``). Each direction between two nodes
comes from one ``[[link]]`` entry only. Mistakes raise ``TopologyFileError`` naming the file
and the key. ``dump_topology`` writes the explicit form, exactly: loading what it wrote gives
an equal ``Topology``.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomli_w

from simcomm.presets import PRESETS, is_preset_spec, make_preset
from simcomm.topology import (
    MAX_RANKS, NO_LAUNCH_LATENCY, Link, PerProtocol, Topology, fully_connected, hierarchical,
    ring, switch,
)
from simcomm.units import parse_bandwidth, parse_seconds


class TopologyFileError(ValueError):
    """A topology file that cannot be read; the message names the file and the key."""


# -- reading ----------------------------------------------------------------------------------

# Top-level keys of the launch latency per protocol, in PerProtocol's field order, and of
# NCCL's tree's own.
_LAUNCH_KEYS = ("launch_latency", "launch_latency_ll", "launch_latency_ll128")
_TREE_LAUNCH_KEYS = ("tree_launch_latency", "tree_launch_latency_ll",
                     "tree_launch_latency_ll128")
# What NCCL's tuner counts on a hop between nodes besides the hop's latency, per protocol.
_TUNER_NET_KEYS = ("tuner_net_latency", "tuner_net_latency_ll", "tuner_net_latency_ll128")
# Keys of what the machine does besides its links, in both forms.
_RATE_KEYS = ("ll_bandwidth", "injection_bandwidth", "ll128_channel_bandwidth",
              "ll128_bandwidth", "tree_channel_bandwidth", "net_channel_bandwidth",
              "net_message_bandwidth")
_MACHINE_KEYS = (*_LAUNCH_KEYS, *_TREE_LAUNCH_KEYS, *_RATE_KEYS, "ll128_enabled",
                 "ll_enabled", "reducing_switches", "switch_efficiency",
                 "tree_switch_efficiency", "tree_network_efficiency", "switch_latency",
                 "nvls_channels", "channels",
                 "net_overhead", "ring_slice_gap", "net_message_gap",
                 "tuner_nvls_tree_bandwidth", *_TUNER_NET_KEYS)
_EXPLICIT_KEYS = ("name", "gpus", "switches", "nodes", "ranks", "local_size", *_MACHINE_KEYS,
                  "defaults", "reduce_bandwidth", "compute_speed", "link")
# A link's optional LL and LL128 latencies: file key -> ``Link`` field.
_PROTOCOL_LATENCIES = (("latency_ll", "ll_latency"), ("latency_ll128", "ll128_latency"))
# A link's optional tree latencies: file key -> ``PerProtocol`` field of ``tree_latency``.
_TREE_LATENCIES = (("tree_latency", "simple"), ("tree_latency_ll", "ll"),
                   ("tree_latency_ll128", "ll128"))
_DEFAULTS_KEYS = ("bandwidth", "latency", "latency_ll", "latency_ll128",
                  *(key for key, _ in _TREE_LATENCIES), "gap", "duplex", "reduce_bandwidth")
_LINK_KEYS = ("src", "dst", "bandwidth", "latency", "latency_ll", "latency_ll128",
              *(key for key, _ in _TREE_LATENCIES), "gap", "duplex")


class _Reader:
    """Checks values of one file, so every error can name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, problem: str) -> TopologyFileError:
        where = f"{key}: " if key else ""
        return TopologyFileError(f"{self.source}: {where}{problem}")

    def check_keys(self, table: dict[str, Any], allowed: Iterable[str], where: str) -> None:
        allowed = tuple(allowed)
        for key in table:
            if key not in allowed:
                raise self.error(f"{where}{key}", f"unknown key (allowed here: "
                                                  f"{', '.join(allowed)})")

    def table(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {value!r}")
        return value

    def name(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(key, f"must be a non-empty string, got {value!r}")
        return value

    def names(self, value: Any, key: str) -> list[str]:
        if isinstance(value, str):
            return [self.name(value, key)]
        if not isinstance(value, list) or not value:
            raise self.error(key, f"must be a name or a non-empty list of names, got {value!r}")
        return [self.name(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def count(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(key, f"must be an integer >= 1, got {value!r}")
        return value

    def flag(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def bandwidth(self, value: Any, key: str) -> float:
        if not isinstance(value, str):
            raise self.error(key, f"must be a string with a unit, e.g. \"100GB/s\", "
                                  f"got {value!r}")
        try:
            return parse_bandwidth(value)
        except ValueError as error:
            raise self.error(key, str(error)) from None

    def latency(self, value: Any, key: str) -> float:
        if not isinstance(value, str):
            raise self.error(key, f"must be a string with a unit, e.g. \"5us\", got {value!r}")
        try:
            seconds = parse_seconds(value, require_unit=True)
        except ValueError as error:
            raise self.error(key, str(error)) from None
        if not (math.isfinite(seconds) and seconds >= 0):
            raise self.error(key, f"must be finite and >= 0, got {value!r}")
        return seconds


def parse_topology(text: str, source: str = "<string>", default_name: str = "topology"
                   ) -> Topology:
    """Read a topology from the text of a TOML file; ``source`` names it in errors."""
    reader = _Reader(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise reader.error("", f"not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and tables
        raise reader.error("", "arrays or tables nested too deep to read") from None
    name = reader.name(data["name"], "name") if "name" in data else default_name
    if "kind" in data:
        topology = _from_builder(reader, data, name)
    else:
        topology = _from_tables(reader, data, name)
    if "compute_speed" in data:
        topology = _read_compute_speed(reader, data["compute_speed"], topology)
    _check_routes(reader, topology)
    return topology


def load_topology_file(path: str | os.PathLike[str]) -> Topology:
    """Read a topology file; its name defaults to the file's stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TopologyFileError(f"cannot read topology file {str(path)!r}: {error}") from None
    return parse_topology(text, source=str(path), default_name=path.stem)


def load_topology(name_or_path: str | os.PathLike[str]) -> Topology:
    """A preset (``dgx-h100``, ``cluster-h100:nodes=4``) or a topology file (``my.toml``).

    A preset name wins over a file of the same name; write ``./NAME`` for the file.
    """
    if isinstance(name_or_path, str):
        if is_preset_spec(name_or_path):
            return make_preset(name_or_path)
        if not (name_or_path.endswith(".toml") or os.path.exists(name_or_path)):
            raise ValueError(f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) "
                             "nor a topology file (.toml)")
    return load_topology_file(name_or_path)


def _from_tables(reader: _Reader, data: dict[str, Any], name: str) -> Topology:
    reader.check_keys(data, _EXPLICIT_KEYS, "")
    nodes, rank_nodes = _read_nodes(reader, data)
    known = set(nodes)
    defaults = _read_defaults(reader, reader.table(data.get("defaults", {}), "defaults"))
    links: list[Link] = []
    entries = data.get("link", [])
    if not isinstance(entries, list):
        raise reader.error("link", "must be a list of tables ([[link]] entries)")
    given: dict[tuple[str, str], str] = {}  # (src, dst) -> the entry that gives the link
    for i, entry in enumerate(entries):
        where = f"link[{i}]"
        for link in _read_link(reader, reader.table(entry, where), where, defaults, known):
            # One entry may make a pair twice (src and dst lists that overlap, both ways);
            # two entries for the same direction would leave the second unused.
            first = given.setdefault((link.src, link.dst), where)
            if first != where:
                raise reader.error(where, f"the link {link.src} -> {link.dst} is given twice "
                                          f"(first in {first})")
            links.append(link)
    reduce_default = defaults.get("reduce_bandwidth", math.inf)
    per_gpu = data.get("reduce_bandwidth", {})
    if not isinstance(per_gpu, dict):
        raise reader.error("reduce_bandwidth", "must be a table of GPU = bandwidth; a reduce "
                                               "bandwidth for every GPU goes in [defaults]")
    for gpu in per_gpu:
        if gpu not in rank_nodes:
            raise reader.error(f"reduce_bandwidth.{gpu}", "names no node that holds a rank")
    reduce = tuple(reader.bandwidth(per_gpu[g], f"reduce_bandwidth.{g}") if g in per_gpu
                   else reduce_default for g in rank_nodes)
    local_size = (reader.count(data["local_size"], "local_size") if "local_size" in data
                  else None)
    machine = _read_machine(reader, data)
    try:
        return Topology(name, tuple(nodes), tuple(links), tuple(rank_nodes), reduce, local_size,
                        **machine)
    except ValueError as error:
        raise reader.error("", str(error)) from None


def _read_compute_speed(reader: _Reader, table: Any, topology: Topology) -> Topology:
    """``[compute_speed]``: GPU = factor of the nominal compute speed, per GPU."""
    if not isinstance(table, dict):
        raise reader.error("compute_speed", "must be a table of GPU = factor (gpu3 = 0.8)")
    rank_of = {node: rank for rank, node in enumerate(topology.ranks)}
    speeds = {}
    for gpu, factor in table.items():
        if gpu not in rank_of:
            raise reader.error(f"compute_speed.{gpu}", "names no node that holds a rank")
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
                and 0 < factor < math.inf):
            raise reader.error(f"compute_speed.{gpu}", f"must be a number > 0, got "
                                                       f"{factor!r}")
        speeds[rank_of[gpu]] = float(factor)
    return topology.with_compute_speed(speeds)


def _read_machine(reader: _Reader, data: dict[str, Any]) -> dict[str, Any]:
    """``Topology`` fields of ``_MACHINE_KEYS``: launch latency, LL bandwidth, switches."""
    machine: dict[str, Any] = {
        "launch_latency": _read_per_protocol(reader, data, _LAUNCH_KEYS, _TREE_LAUNCH_KEYS),
        "tuner_net_latency": _read_per_protocol(reader, data, _TUNER_NET_KEYS)}
    for key in _RATE_KEYS:
        machine[key] = _read_rate(reader, data, key)
    for key in ("ll128_enabled", "ll_enabled"):
        if key in data:
            machine[key] = reader.flag(data[key], key)
    if "reducing_switches" in data:
        machine["reducing_switches"] = tuple(reader.names(data["reducing_switches"],
                                                          "reducing_switches"))
    for key in ("switch_efficiency", "tree_switch_efficiency", "tree_network_efficiency"):
        if key in data:
            share = data[key]
            if not (isinstance(share, (int, float)) and not isinstance(share, bool)
                    and 0 < share <= 1):
                raise reader.error(key, f"must be a number in (0, 1], got {share!r}")
            machine[key] = float(share)
    if "switch_latency" in data:
        machine["switch_latency"] = reader.latency(data["switch_latency"], "switch_latency")
    for key in ("nvls_channels", "channels"):
        if key in data:
            machine[key] = reader.count(data[key], key)
    for key in ("net_overhead", "ring_slice_gap", "net_message_gap"):
        if key in data:
            machine[key] = reader.latency(data[key], key)
    if "tuner_nvls_tree_bandwidth" in data:
        machine["tuner_nvls_tree_bandwidth"] = reader.bandwidth(
            data["tuner_nvls_tree_bandwidth"], "tuner_nvls_tree_bandwidth")
    return machine


def _read_rate(reader: _Reader, data: dict[str, Any], key: str) -> float:
    """A GPU's or a channel's rate at top level, one of ``_RATE_KEYS`` (default inf: no
    limit)."""
    if key not in data:
        return math.inf
    return reader.bandwidth(data[key], key)


def _read_per_protocol(reader: _Reader, data: dict[str, Any], keys: tuple[str, ...],
                       tree_keys: tuple[str, ...] = ()) -> PerProtocol:
    """A latency per protocol (the launch's: ``_LAUNCH_KEYS``): the first key (default 0)
    for Simple, and for LL and LL128 their own key or else the Simple figure; the tree's, if
    any of ``tree_keys`` is given, each its own key or else the figure for every
    algorithm."""
    simple_key, ll_key, ll128_key = keys
    simple = reader.latency(data[simple_key], simple_key) if simple_key in data else 0.0
    ll, ll128 = (reader.latency(data[key], key) if key in data else simple
                 for key in (ll_key, ll128_key))
    costs = PerProtocol(simple, ll, ll128)
    if not any(key in data for key in tree_keys):
        return costs
    tree = (reader.latency(data[key], key) if key in data else fallback
            for key, fallback in zip(tree_keys, (simple, ll, ll128)))
    return replace(costs, tree=PerProtocol(*tree))


def _write_per_protocol(doc: dict[str, Any], costs: PerProtocol, keys: tuple[str, ...],
                        tree_keys: tuple[str, ...] = ()) -> None:
    """Put ``costs`` in ``doc`` as ``_read_per_protocol`` reads them back (nothing where
    every cost is 0)."""
    if costs == NO_LAUNCH_LATENCY:
        return
    simple_key, ll_key, ll128_key = keys
    doc[simple_key] = format_latency(costs.simple)
    for key, seconds in ((ll_key, costs.ll), (ll128_key, costs.ll128)):
        if seconds != costs.simple:
            doc[key] = format_latency(seconds)
    if costs.tree is not None:
        for key, seconds in zip(tree_keys, (costs.tree.simple, costs.tree.ll,
                                            costs.tree.ll128)):
            doc[key] = format_latency(seconds)


def _read_nodes(reader: _Reader, data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """All nodes in order, and the node of each rank."""
    if "nodes" in data:
        for key in ("gpus", "switches"):
            if key in data:
                raise reader.error(key, "give either nodes (with ranks) or gpus and switches, "
                                        "not both")
        if "ranks" not in data:
            raise reader.error("ranks", "missing key: a file that lists nodes must list ranks")
        nodes = reader.names(data["nodes"], "nodes")
        candidates = nodes
        origin = ["nodes"] * len(nodes)
    elif "gpus" in data:
        gpus = data["gpus"]
        if isinstance(gpus, int) and reader.count(gpus, "gpus") > MAX_RANKS:
            raise reader.error("gpus", f"must be at most {MAX_RANKS:,} (the ranks a topology "
                                       f"may have), got {gpus:,}")
        candidates = ([f"gpu{i}" for i in range(gpus)]
                      if isinstance(gpus, int) else reader.names(gpus, "gpus"))
        switches = reader.names(data["switches"], "switches") if "switches" in data else []
        nodes = candidates + switches
        origin = ["gpus"] * len(candidates) + ["switches"] * len(switches)
    else:
        raise reader.error("gpus", "missing key: declare the GPUs (gpus = 8 or a list of "
                                   "names), or nodes with ranks")
    seen: set[str] = set()
    for node, key in zip(nodes, origin):
        if node in seen:
            raise reader.error(key, f"node {node!r} is declared twice")
        seen.add(node)
    if "ranks" not in data:
        return nodes, candidates
    ranks = reader.names(data["ranks"], "ranks")
    allowed = set(candidates)
    placed: set[str] = set()
    for r, node in enumerate(ranks):
        if node not in allowed:
            raise reader.error(f"ranks[{r}]", f"{node!r} is not a declared "
                                              f"{'node' if 'nodes' in data else 'GPU'}")
        if node in placed:
            raise reader.error(f"ranks[{r}]", f"{node!r} already holds a rank")
        placed.add(node)
    return nodes, ranks


def _read_defaults(reader: _Reader, table: dict[str, Any]) -> dict[str, Any]:
    reader.check_keys(table, _DEFAULTS_KEYS, "defaults.")
    parsers = {"bandwidth": reader.bandwidth, "latency": reader.latency,
               "latency_ll": reader.latency, "latency_ll128": reader.latency,
               **{key: reader.latency for key, _ in _TREE_LATENCIES},
               "gap": reader.latency, "duplex": reader.flag,
               "reduce_bandwidth": reader.bandwidth}
    return {key: parsers[key](value, f"defaults.{key}") for key, value in table.items()}


def _read_link(reader: _Reader, entry: dict[str, Any], where: str, defaults: dict[str, Any],
               known: set[str]) -> list[Link]:
    reader.check_keys(entry, _LINK_KEYS, f"{where}.")
    ends = {}
    for end in ("src", "dst"):
        if end not in entry:
            raise reader.error(f"{where}.{end}", "missing key")
        ends[end] = reader.names(entry[end], f"{where}.{end}")
        for node in ends[end]:
            if node not in known:
                raise reader.error(f"{where}.{end}", f"unknown node {node!r}")
    figures = {}
    for key, parse in (("bandwidth", reader.bandwidth), ("latency", reader.latency)):
        if key in entry:
            figures[key] = parse(entry[key], f"{where}.{key}")
        elif key in defaults:
            figures[key] = defaults[key]
        else:
            raise reader.error(f"{where}.{key}", "missing key (and [defaults] gives none)")
    gap = (reader.latency(entry["gap"], f"{where}.gap") if "gap" in entry
           else defaults.get("gap", 0.0))
    duplex = (reader.flag(entry["duplex"], f"{where}.duplex") if "duplex" in entry
              else defaults.get("duplex", True))
    protocols = {field: (reader.latency(entry[key], f"{where}.{key}") if key in entry
                         else defaults.get(key))
                 for key, field in _PROTOCOL_LATENCIES}
    tree = [reader.latency(entry[key], f"{where}.{key}") if key in entry else defaults.get(key)
            for key, _ in _TREE_LATENCIES]
    if any(seconds is not None for seconds in tree):
        simple = figures["latency"]
        own = (simple, *(simple if protocols[field] is None else protocols[field]
                         for _, field in _PROTOCOL_LATENCIES))
        protocols["tree_latency"] = PerProtocol(*(
            fallback if seconds is None else seconds for seconds, fallback in zip(tree, own)))
    links = []
    for src in ends["src"]:
        for dst in ends["dst"]:
            if src == dst:
                if len(ends["src"]) == 1 and len(ends["dst"]) == 1:
                    raise reader.error(where, f"src and dst are both {src!r}")
                continue
            links.append(Link(src, dst, figures["bandwidth"], figures["latency"], gap,
                              **protocols))
            if duplex:
                links.append(Link(dst, src, figures["bandwidth"], figures["latency"], gap,
                                  **protocols))
    return links


# Builder parameters: (key, reader method name, required). Optional ones take the builder's
# own default. Each latency parameter ``L`` also takes optional keys ``L_ll`` and ``L_ll128``.
_Param = tuple[str, str, bool]
_FLAT = (("ranks", "count", True), ("bandwidth", "bandwidth", True),
         ("latency", "latency", True), ("reduce_bandwidth", "bandwidth", False))
_BUILDERS: Mapping[str, tuple[Callable[..., Topology], tuple[_Param, ...]]] = (
    MappingProxyType({
        "ring": (ring, _FLAT),
        "fully_connected": (fully_connected, _FLAT),
        "switch": (switch, _FLAT),
        "hierarchical": (hierarchical, (
            ("nodes", "count", True), ("gpus_per_node", "count", True),
            ("intra_bandwidth", "bandwidth", True), ("intra_latency", "latency", True),
            ("inter_bandwidth", "bandwidth", True), ("inter_latency", "latency", True),
            ("nic_per_gpu", "flag", False), ("reduce_bandwidth", "bandwidth", False))),
    }))
_PROTOCOL_SUFFIXES = ("_ll", "_ll128")
_TREE_SUFFIXES = ("_tree", "_tree_ll", "_tree_ll128")


def _from_builder(reader: _Reader, data: dict[str, Any], name: str) -> Topology:
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in _BUILDERS:
        raise reader.error("kind", f"unknown builder {kind!r} (known: {', '.join(_BUILDERS)})")
    build, params = _BUILDERS[kind]
    latencies = [key for key, parse, _ in params if parse == "latency"]
    reader.check_keys(data, ("kind", "name", *(p[0] for p in params),
                             *(key + suffix for key in latencies
                               for suffix in _PROTOCOL_SUFFIXES + _TREE_SUFFIXES),
                             *_MACHINE_KEYS, "compute_speed"), "")
    kwargs: dict[str, Any] = {}
    for key, parse, required in params:
        if key in data:
            kwargs[key] = getattr(reader, parse)(data[key], key)
        elif required:
            raise reader.error(key, f"missing key (kind = {kind!r} needs it)")
    for key in latencies:
        given = [reader.latency(data[key + suffix], key + suffix)
                 if key + suffix in data else None for suffix in _PROTOCOL_SUFFIXES]
        tree = [reader.latency(data[key + suffix], key + suffix)
                if key + suffix in data else None for suffix in _TREE_SUFFIXES]
        if any(seconds is not None for seconds in given + tree):
            simple = kwargs[key]
            ll, ll128 = (simple if seconds is None else seconds for seconds in given)
            latency = PerProtocol(simple, ll, ll128)
            if any(seconds is not None for seconds in tree):
                latency = replace(latency, tree=PerProtocol(*(
                    fallback if seconds is None else seconds
                    for seconds, fallback in zip(tree, (simple, ll, ll128)))))
            kwargs[key] = latency
    machine = _read_machine(reader, data)
    try:
        topology = build(**kwargs)
        return Topology(name, topology.nodes, topology.links, topology.ranks,
                        topology.reduce_bandwidth, topology.local_size, **machine)
    except ValueError as error:
        raise reader.error("", str(error)) from None


def _check_routes(reader: _Reader, topology: Topology) -> None:
    """Every rank must reach every other: rank 0 reaches all and all reach rank 0."""
    forward: dict[str, list[str]] = {}
    backward: dict[str, list[str]] = {}
    for link in topology.links:
        forward.setdefault(link.src, []).append(link.dst)
        backward.setdefault(link.dst, []).append(link.src)
    first = topology.ranks[0]
    for graph, outbound in ((forward, True), (backward, False)):
        reached, frontier = {first}, [first]
        while frontier:
            for nxt in graph.get(frontier.pop(), ()):
                if nxt not in reached:
                    reached.add(nxt)
                    frontier.append(nxt)
        for r, node in enumerate(topology.ranks):
            if node not in reached:
                a, b = (0, r) if outbound else (r, 0)
                raise reader.error("link", f"no route from rank {a} "
                                           f"({topology.ranks[a]}) to rank {b} "
                                           f"({topology.ranks[b]})")


# -- writing ----------------------------------------------------------------------------------

def _exact(value: float, units: tuple[tuple[float, str], ...],
           parse: Callable[[str], float]) -> str:
    """The shortest text of ``value`` in one of ``units`` that ``parse`` reads back to exactly
    ``value``; ties go to the earlier unit. 17 significant digits always read back."""
    exact = []
    for scale, unit in units:
        scaled = value / scale
        for digits in range(1, 18):
            text = f"{scaled:.{digits}g}{unit}"
            try:
                if parse(text) == value:
                    exact.append(text)
            except ValueError:
                continue
    if not exact:
        raise ValueError(f"cannot write {value!r} exactly")
    return min(exact, key=len)


def format_bandwidth(bandwidth: float) -> str:
    """Bytes/second as a string that ``parse_bandwidth`` reads back exactly."""
    if math.isinf(bandwidth):
        return "inf"
    return _exact(bandwidth, ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1.0, "B/s")),
                  parse_bandwidth)


def format_latency(seconds: float) -> str:
    """Seconds as a string that ``parse_seconds`` reads back exactly."""
    return _exact(seconds, ((1e-6, "us"), (1e-9, "ns"), (1e-3, "ms"), (1.0, "s")),
                  parse_seconds)


def _most_common(values: Iterable[Any]) -> Any:
    return Counter(values).most_common(1)[0][0]


def _tree_figure(link: Link, field: str) -> float | None:
    return None if link.tree_latency is None else getattr(link.tree_latency, field)


def dump_topology(topology: Topology) -> str:
    """The topology as a topology file in the explicit form.

    The most common link bandwidth, latency and reduce bandwidth become ``defaults``, and so
    does the most common LL (LL128) latency when every link has one: the file cannot say that
    a link has none where ``defaults`` gives one. A link followed by its exact reverse is
    written once, as a duplex entry, so link order (which breaks routing ties) survives. A
    topology without launch latencies or LL and LL128 latencies is written without their keys.
    """
    doc: dict[str, Any] = {"name": topology.name}
    ranked = set(topology.ranks)
    gpus = [n for n in topology.nodes if n in ranked]
    switches = [n for n in topology.nodes if n not in ranked]
    if gpus + switches == list(topology.nodes):
        doc["gpus"] = gpus
        if switches:
            doc["switches"] = switches
        if list(topology.ranks) != gpus:
            doc["ranks"] = list(topology.ranks)
    else:
        doc["nodes"], doc["ranks"] = list(topology.nodes), list(topology.ranks)
    if topology.local_size is not None:
        doc["local_size"] = topology.local_size
    _write_per_protocol(doc, topology.launch_latency, _LAUNCH_KEYS, _TREE_LAUNCH_KEYS)
    _write_per_protocol(doc, topology.tuner_net_latency, _TUNER_NET_KEYS)
    for key in _RATE_KEYS:
        rate = getattr(topology, key)
        if math.isfinite(rate):
            doc[key] = format_bandwidth(rate)
    for key in ("ll128_enabled", "ll_enabled"):
        if not getattr(topology, key):
            doc[key] = False
    if topology.reducing_switches:
        doc["reducing_switches"] = list(topology.reducing_switches)
    if topology.switch_efficiency != 1.0:
        doc["switch_efficiency"] = topology.switch_efficiency
    if topology.tree_switch_efficiency is not None:
        doc["tree_switch_efficiency"] = topology.tree_switch_efficiency
    if topology.tree_network_efficiency != 1.0:
        doc["tree_network_efficiency"] = topology.tree_network_efficiency
    if topology.switch_latency:
        doc["switch_latency"] = format_latency(topology.switch_latency)
    if topology.nvls_channels != Topology.nvls_channels:
        doc["nvls_channels"] = topology.nvls_channels
    if topology.channels is not None:
        doc["channels"] = topology.channels
    for key in ("net_overhead", "ring_slice_gap", "net_message_gap"):
        if getattr(topology, key):
            doc[key] = format_latency(getattr(topology, key))
    if topology.tuner_nvls_tree_bandwidth:
        doc["tuner_nvls_tree_bandwidth"] = format_bandwidth(topology.tuner_nvls_tree_bandwidth)
    links = topology.links
    reduce_default = _most_common(topology.reduce_bandwidth)
    defaults = {"reduce_bandwidth": format_bandwidth(reduce_default)}
    figures: dict[str, Any] = {}  # link field -> its default, as read back
    if links:
        figures = {"bandwidth": _most_common(link.bandwidth for link in links),
                   "latency": _most_common(link.latency for link in links)}
        for _, field in _PROTOCOL_LATENCIES:
            values = [getattr(link, field) for link in links]
            figures[field] = None if None in values else _most_common(values)
        for key, field in _TREE_LATENCIES:
            values = [_tree_figure(link, field) for link in links]
            figures[key] = None if None in values else _most_common(values)
        figures["gap"] = _most_common(link.gap for link in links)
        defaults = {"bandwidth": format_bandwidth(figures["bandwidth"]),
                    "latency": format_latency(figures["latency"]),
                    **{key: format_latency(figures[field]) for key, field in _PROTOCOL_LATENCIES
                       if figures[field] is not None},
                    **{key: format_latency(figures[key]) for key, _ in _TREE_LATENCIES
                       if figures[key] is not None},
                    **({"gap": format_latency(figures["gap"])} if figures["gap"] else {}),
                    **defaults}
    doc["defaults"] = defaults
    overrides = {node: format_bandwidth(bw)
                 for node, bw in zip(topology.ranks, topology.reduce_bandwidth)
                 if bw != reduce_default}
    if overrides:
        doc["reduce_bandwidth"] = overrides
    speeds = {node: topology.speed_of(rank) for rank, node in enumerate(topology.ranks)
              if topology.speed_of(rank) != 1.0}
    if speeds:
        doc["compute_speed"] = speeds
    keys = (("bandwidth", "bandwidth", format_bandwidth), ("latency", "latency", format_latency),
            *((key, field, format_latency) for key, field in _PROTOCOL_LATENCIES),
            ("gap", "gap", format_latency))
    entries = []
    i = 0
    while i < len(links):
        link = links[i]
        entry: dict[str, Any] = {"src": link.src, "dst": link.dst}
        for key, field, write in keys:
            value = getattr(link, field)
            if value != figures[field]:  # None only where the default is None too
                entry[key] = write(value)
        for key, field in _TREE_LATENCIES:
            value = _tree_figure(link, field)
            if value is not None and value != figures[key]:
                entry[key] = format_latency(value)
        if i + 1 < len(links) and links[i + 1] == replace(link, src=link.dst, dst=link.src):
            i += 2
        else:
            entry["duplex"] = False
            i += 1
        entries.append(entry)
    doc["link"] = entries
    return "# simcomm topology file: see docs/topologies.md\n" + tomli_w.dumps(doc, indent=2)
