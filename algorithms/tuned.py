"""Collectives that choose how to run at each call, as NCCL does.

NCCL picks an algorithm, a protocol and a number of channels for every call from its cost
model, by size (``ncclTopoGetAlgoInfo``, NVIDIA/nccl src/enqueue.cc), or from a tuner
plugin. Here the choice comes from ``Comm.tuner``: the simulator gives its cost model's
fastest (``simcomm.tuning.ModelTuner``); a tuner file (``algorithms.harness.tuner_file``)
gives a fixed table on either transport. Forcing ``algorithm`` or ``protocol`` is what
``NCCL_ALGO`` and ``NCCL_PROTO`` do. Without a tuner, the ring with Simple runs. An empty
buffer costs nothing: NCCL discards empty collectives before launching anything
(``taskAppend``, NVIDIA/nccl v2.26.2 src/enqueue.cc).
"""

from __future__ import annotations

from typing import Any

from algorithms.collectives import Schedule
from algorithms.nccl import (
    as_protocol, hierarchical_allreduce, nccl_ring_all_gather, nccl_ring_allreduce,
    nccl_ring_reduce_scatter,
)
from algorithms.nccl_tree import nccl_tree_allreduce
from algorithms.nvls import (
    NVLS_CHANNELS, dtype_name, nvls_all_gather, nvls_allreduce, nvls_reduce_scatter,
    nvls_tree_allreduce, switch_reduces,
)
from algorithms.ops import SUM, Choice, Comm, Protocol, ReduceOp, check_channels

ALLREDUCE_ALGORITHMS = ("ring", "tree", "hierarchical", "nvls", "nvls_tree")
# NCCL runs reduce-scatter and all-gather in the switch on one node only (across nodes it
# needs CollNet, IB SHARP, which is not modelled).
ONE_WAY_ALGORITHMS = ("ring", "nvls")
IN_SWITCH = ("nvls", "nvls_tree")  # Simple only, as in NCCL
AUTO = "auto"


def choose(comm: Comm, collective: str, nbytes: int, algorithm: str = AUTO,
           protocol: Protocol | str = AUTO, channels: int = 0,
           algorithms: tuple[str, ...] = ("ring",), no_switch: str = "") -> Choice:
    """How to run one call: the tuner's choice (ring with Simple without one), with
    ``algorithm``, ``protocol`` and ``channels`` (0: the choice's) forced where given. A
    forced protocol runs the tuner's fastest algorithm under it, or the forced algorithm on
    the tuner's channels for that pair (``best_with``); a forced algorithm alone runs under
    the tuner's best protocol for it (``best_for``), where the tuner can say (see
    ``algorithms.ops.Tuner``). The in-switch algorithms run under Simple only; forcing
    another protocol on them is an error. ``no_switch``, where not empty, says why the switch cannot
    reduce this call (``switch_reduces``): the in-switch algorithms are then refused if
    forced and passed over if picked (``best_outside_switch``), as NCCL does."""
    algorithm = algorithm_named(collective, algorithm, algorithms)
    if no_switch and algorithm in IN_SWITCH:
        raise ValueError(f"{collective}: NCCL has no {algorithm} kernel for {no_switch}; "
                         "it runs ring or tree")
    try:
        forced = None if str(protocol).lower() == AUTO else as_protocol(protocol)
    except ValueError as error:
        raise ValueError(f"{error} or auto") from None
    check_channels(channels, "the tuner's")
    if algorithm == "hierarchical":  # its own three phases, one ring each on one channel
        if channels > 1:
            raise ValueError(f"{collective}: hierarchical runs each phase on one channel, "
                             f"not {channels}; channels applies to ring and tree")
        channels = 1
    picked = _checked(comm.tuner(collective, nbytes) if comm.tuner is not None
                      else Choice("ring", Protocol.SIMPLE, 0), collective, nbytes)
    wanted = None if algorithm == AUTO else algorithm
    best_for = getattr(comm.tuner, "best_for", None)
    best_with = getattr(comm.tuner, "best_with", None)
    if (forced not in (None, picked.protocol) and best_with is not None
            and wanted not in IN_SWITCH):  # NCCL_PROTO, with or without NCCL_ALGO
        picked = best_with(collective, nbytes, forced, wanted)
    elif wanted not in (None, picked.algorithm) and best_for is not None:
        picked = best_for(collective, nbytes, wanted)  # NCCL_ALGO alone
    elif wanted is None and picked.algorithm in IN_SWITCH and forced not in (
            None, Protocol.SIMPLE):  # the switch runs Simple only: the ring runs instead
        picked = Choice("ring", forced, 0)
    if no_switch and _checked(picked, collective, nbytes).algorithm in IN_SWITCH:
        best_outside = getattr(comm.tuner, "best_outside_switch", None)
        picked = (best_outside(collective, nbytes, forced) if best_outside is not None
                  else Choice("ring", forced or Protocol.SIMPLE, 0))
    picked = _checked(picked, collective, nbytes)
    choice = Choice(wanted or picked.algorithm, picked.protocol if forced is None else forced,
                    channels or (picked.channels if wanted in (None, picked.algorithm) else 0))
    if choice.algorithm in IN_SWITCH and choice.protocol is not Protocol.SIMPLE:
        if forced is not None:  # NCCL runs the switch's kernels under Simple only
            raise ValueError(f"{choice.algorithm} runs under the simple protocol only, not "
                             f"{protocol!r}")
        choice = Choice(choice.algorithm, Protocol.SIMPLE, choice.channels)
    return choice


def _checked(picked: Any, collective: str, nbytes: int) -> Choice:
    if not isinstance(picked, Choice):
        raise TypeError(f"the tuner returned {picked!r} for {collective} of {nbytes} bytes, "
                        "not a Choice(algorithm, protocol, channels)")
    return picked


def no_switch_reason(dtype: Any, op: ReduceOp) -> str:
    """Why NCCL's switch cannot reduce elements of ``dtype`` by ``op`` (``switch_reduces``),
    or "" where it can."""
    if switch_reduces(dtype, op):
        return ""
    what = {"sum": "a sum", "prod": "a product", "max": "a maximum", "min": "a minimum",
            "avg": "an average"}[op.value]
    return f"{what} of {dtype_name(dtype)}"


def algorithm_named(collective: str, algorithm: str, algorithms: tuple[str, ...]) -> str:
    """``algorithm`` as one of ``algorithms`` (or ``AUTO``) names it, from any case and
    NCCL_ALGO's spelling too (``Ring``, ``NVLSTree``); else a ValueError naming them."""
    names = {name.replace("_", ""): name for name in (*algorithms, AUTO)}
    name = names.get(str(algorithm).lower().replace("_", ""))
    if name is None:
        raise ValueError(f"{collective}: unknown algorithm {algorithm!r}; known: "
                         f"{', '.join(algorithms)} or auto")
    return name


def nccl_allreduce(comm: Comm, x: Any, op: ReduceOp = SUM, algorithm: str = AUTO,
                   protocol: str = AUTO, channels: int = 0) -> Schedule:
    """All-reduce as NCCL chooses to run it: ring, tree, hierarchical, NVLS or NVLS-tree (in
    the switch, Simple only), in a protocol, on a number of channels, from ``Comm.tuner``
    (see the module doc) or forced. Returns ``x``, reduced over all ranks."""
    choice = choose(comm, "allreduce", x.nbytes, algorithm, protocol, channels,
                    ALLREDUCE_ALGORITHMS, no_switch_reason(x.dtype, op))
    if len(x) == 0:
        return x
    if choice.algorithm == "nvls":
        yield from nvls_allreduce(comm, x, op, choice.channels or NVLS_CHANNELS)
    elif choice.algorithm == "nvls_tree":
        yield from nvls_tree_allreduce(comm, x, op, choice.channels or NVLS_CHANNELS)
    elif choice.algorithm == "hierarchical":
        yield from hierarchical_allreduce(comm, x, op, choice.protocol)
    elif choice.algorithm == "tree":
        yield from nccl_tree_allreduce(comm, x, op, choice.channels, choice.protocol)
    else:
        yield from nccl_ring_allreduce(comm, x, op, choice.channels, choice.protocol)
    return x


def nccl_reduce_scatter(comm: Comm, x: Any, op: ReduceOp = SUM, algorithm: str = AUTO,
                        protocol: str = AUTO, channels: int = 0) -> Schedule:
    """Reduce-scatter as NCCL chooses to run it: a ring in a protocol on a number of
    channels (``nccl_ring_reduce_scatter``), or on one node NVLS (``nvls_reduce_scatter``),
    from ``Comm.tuner`` or forced; returns this rank's chunk of ``x``, reduced."""
    choice = choose(comm, "reducescatter", x.nbytes, algorithm, protocol, channels,
                    ONE_WAY_ALGORITHMS, no_switch_reason(x.dtype, op))
    if len(x) == 0:
        return x
    if choice.algorithm == "nvls":
        return (yield from nvls_reduce_scatter(comm, x, op, choice.channels or NVLS_CHANNELS))
    return (yield from nccl_ring_reduce_scatter(comm, x, op, choice.channels,
                                                choice.protocol))


def nccl_all_gather(comm: Comm, x: Any, algorithm: str = AUTO, protocol: str = AUTO,
                    channels: int = 0) -> Schedule:
    """All-gather as NCCL chooses to run it: a ring in a protocol on a number of channels
    (``nccl_ring_all_gather``), or on one node NVLS (``nvls_all_gather``), from
    ``Comm.tuner`` or forced."""
    choice = choose(comm, "allgather", x.nbytes, algorithm, protocol, channels,
                    ONE_WAY_ALGORITHMS)
    if len(x) == 0:
        return x
    if choice.algorithm == "nvls":
        return (yield from nvls_all_gather(comm, x, choice.channels or NVLS_CHANNELS))
    return (yield from nccl_ring_all_gather(comm, x, choice.channels, choice.protocol))

