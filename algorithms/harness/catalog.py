"""What each collective is, for harnesses: which nccl-tests collective it implements, which
arguments it takes, and how its size and bus bandwidth are counted.

Bus bandwidth factors and size conventions follow nccl-tests (doc/PERFORMANCE.md):
``busbw = algbw * factor(p)`` with ``algbw = size / time``; ``size`` is the all-reduced,
broadcast or reduced buffer, the full gathered / scattered buffer for all-gather and
reduce-scatter, and one rank's send buffer for all-to-all.

Besides the built-in collectives, ``get_collective`` takes a user's own algorithm written
``module.path:function``: a generator function taking ``(comm, x, ...)`` as the built-in ones
do, imported from the working folder first (as ``python -m`` would), which implements one of
nccl-tests' collectives (``KINDS``; an all-reduce unless told otherwise).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from algorithms import collectives, nccl, nccl_tree, nvls, reference, tuned


@dataclass(frozen=True)
class Collective:
    """A collective algorithm and what a harness needs to know to run and score it."""

    name: str
    function: Callable[..., Any]
    kind: str  # nccl-tests name: allreduce, reducescatter, allgather, broadcast, reduce, alltoall
    takes_op: bool
    takes_root: bool
    reference: Callable[..., list[Any]]

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' factor from algorithm bandwidth to bus bandwidth."""
        p = world_size
        if self.kind == "allreduce":
            return 2 * (p - 1) / p
        if self.kind in ("reducescatter", "allgather", "alltoall"):
            return (p - 1) / p
        return 1.0


class UserAlgorithmError(ValueError):
    """A user's ``module.path:function`` that cannot be run; the message names it."""


@dataclass(frozen=True)
class Kind:
    """One of nccl-tests' collectives: whether it reduces, whether it has a root, the
    numpy reference of its results, and whether a result that fits the buffer is left in it
    (``algorithms.collectives``: all but the all-to-all, which returns what it received)."""

    reduces: bool
    rooted: bool
    reference: Callable[..., list[Any]]
    in_place: bool = True


# nccl-tests' collectives, by the names of their kinds (all_reduce_perf is "allreduce").
KINDS: MappingProxyType[str, Kind] = MappingProxyType({
    "allreduce": Kind(True, False, reference.allreduce_reference),
    "reducescatter": Kind(True, False, reference.reduce_scatter_reference),
    "allgather": Kind(False, False, reference.all_gather_reference),
    "broadcast": Kind(False, True, reference.broadcast_reference),
    "reduce": Kind(True, True, reference.reduce_reference),
    "alltoall": Kind(False, False, reference.all_to_all_reference, in_place=False),
})


def _builtin(name: str, fn: Callable[..., Any], kind: str) -> Collective:
    k = KINDS[kind]
    return Collective(name, fn, kind, k.reduces, k.rooted, k.reference)


COLLECTIVES: MappingProxyType[str, Collective] = MappingProxyType({
    c.name: c for c in (
        _builtin("ring_allreduce", collectives.ring_allreduce, "allreduce"),
        _builtin("reduce_broadcast_allreduce", collectives.reduce_broadcast_allreduce,
                 "allreduce"),
        _builtin("alltoall_allreduce", collectives.alltoall_allreduce, "allreduce"),
        _builtin("nccl_ring_allreduce", nccl.nccl_ring_allreduce, "allreduce"),
        _builtin("nccl_tree_allreduce", nccl_tree.nccl_tree_allreduce, "allreduce"),
        _builtin("hierarchical_allreduce", nccl.hierarchical_allreduce, "allreduce"),
        _builtin("nvls_allreduce", nvls.nvls_allreduce, "allreduce"),
        _builtin("nvls_tree_allreduce", nvls.nvls_tree_allreduce, "allreduce"),
        _builtin("nvls_reduce_scatter", nvls.nvls_reduce_scatter, "reducescatter"),
        _builtin("nvls_all_gather", nvls.nvls_all_gather, "allgather"),
        _builtin("nccl_allreduce", tuned.nccl_allreduce, "allreduce"),
        _builtin("nccl_reduce_scatter", tuned.nccl_reduce_scatter, "reducescatter"),
        _builtin("nccl_all_gather", tuned.nccl_all_gather, "allgather"),
        _builtin("reduce_scatter", collectives.reduce_scatter, "reducescatter"),
        _builtin("all_gather", collectives.all_gather, "allgather"),
        _builtin("nccl_ring_reduce_scatter", nccl.nccl_ring_reduce_scatter, "reducescatter"),
        _builtin("nccl_ring_all_gather", nccl.nccl_ring_all_gather, "allgather"),
        _builtin("broadcast", collectives.broadcast, "broadcast"),
        _builtin("reduce", collectives.reduce, "reduce"),
        _builtin("all_to_all", collectives.all_to_all, "alltoall"),
    )
})


# The built-in collectives that ask the tuner (``Comm.tuner``) how to run each call.
TUNED_COLLECTIVES = ("nccl_allreduce", "nccl_reduce_scatter", "nccl_all_gather")
# The built-in collectives that run NCCL's rings on channels of their own.
_RING_COLLECTIVES = ("nccl_ring_allreduce", "nccl_ring_reduce_scatter", "nccl_ring_all_gather",
                     "nccl_reduce_scatter", "nccl_all_gather")


def channel_names(name: str, params: dict[str, Any], ranks_per_node: int) -> list[str]:
    """The channels that the built-in collective ``name`` spawns tasks on, run with the
    keyword arguments ``params`` on ranks ``ranks_per_node`` to a node, with no tuner (so
    the tuned collectives run the ring unless ``algorithm`` says otherwise); empty for one
    that spawns none and for a user's algorithm. A transport that maps each channel to a
    communicator of its own, made before the run (realcomm's ``Driver``), declares these."""
    channels = params.get("channels", 0)
    tuned_allreduce = name == "nccl_allreduce"
    algorithm = tuned.AUTO
    if name in TUNED_COLLECTIVES:
        algorithm = tuned.algorithm_named(name, params.get("algorithm", tuned.AUTO), (
            tuned.ALLREDUCE_ALGORITHMS if tuned_allreduce else tuned.ONE_WAY_ALGORITHMS))
    if name.startswith("nvls_") or algorithm in tuned.IN_SWITCH:
        return nvls.nvls_channels(channels or nvls.NVLS_CHANNELS)
    count = channels or ranks_per_node  # the NCCL-class default: one per rank of a node
    if name == "nccl_tree_allreduce" or (tuned_allreduce and algorithm == "tree"):
        return nccl_tree.tree_channels(count)
    if name in _RING_COLLECTIVES or (tuned_allreduce and algorithm in (tuned.AUTO, "ring")):
        return nccl.ring_channels(count) if count > 1 else []  # one ring runs in the caller
    return []


def get_collective(name: str, kind: str | None = None) -> Collective:
    """A built-in collective by its Python name, or a user's algorithm by
    ``module.path:function`` (``user_collective``), with errors that say what is wrong.

    ``kind`` (nccl-tests' name of a collective, ``KINDS``) says which collective a user's
    algorithm implements (default allreduce); a built-in one has its own, and a different
    ``kind`` is refused.
    """
    if is_user_algorithm(name):
        return user_collective(name, "allreduce" if kind is None else kind)
    try:
        collective = COLLECTIVES[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}; known: {', '.join(sorted(COLLECTIVES))}, or your "
            "own as module.path:function") from None
    if kind is not None and kind_name(kind) != collective.kind:
        raise ValueError(f"--kind {kind}: {name} implements {collective.kind} (--kind says what "
                         "an algorithm of your own, module.path:function, implements)")
    return collective


def is_user_algorithm(name: str) -> bool:
    """Whether ``name`` is a user's ``module.path:function`` rather than a built-in name."""
    return ":" in name


def kind_name(text: str) -> str:
    """The ``KINDS`` name of an nccl-tests collective, written either way: ``allreduce`` or
    ``all_reduce``, ``alltoall`` or ``all_to_all``."""
    name = text.strip().lower().replace("_", "")
    if name not in KINDS:
        raise ValueError(f"unknown --kind {text!r}; known: {', '.join(KINDS)} (or with "
                         "underscores, as nccl-tests' all_reduce_perf)")
    return name


def user_collective(spec: str, kind: str = "allreduce") -> Collective:
    """A user's algorithm, ``module.path:function``, as a collective of ``kind``.

    Raises ``UserAlgorithmError`` in one line if the module cannot be imported, has no such
    function, or the function is not a generator function taking ``(comm, x, ...)``, and
    ``op`` if its kind reduces and ``root`` if it has one, as the built-in ones do.
    """
    module_name, _, function_name = spec.partition(":")
    if not module_name.strip() or not function_name.isidentifier():
        raise _refused(spec, "write a built-in name or module.path:function")
    function = getattr(_import_module(module_name, spec), function_name, None)
    if function is None:
        raise _refused(spec, f"module {module_name} has no {function_name!r}")
    if not inspect.isgeneratorfunction(function):
        raise _refused(spec, f"{function_name} is not a generator function; an algorithm "
                             "yields its ops (def f(comm, x): ... yield Send(...))")
    signature = inspect.signature(function)
    try:
        signature.bind(None, None)
    except TypeError:
        raise _refused(spec, f"{function_name} must take (comm, x, ...), not "
                             f"({', '.join(signature.parameters)})") from None
    name = kind_name(kind)
    k = KINDS[name]
    for needed, argument in ((k.reduces, "op=SUM"), (k.rooted, "root=0")):
        keyword = argument.partition("=")[0]
        if needed and keyword not in signature.parameters:
            raise _refused(spec, f"{name} takes {keyword}, so {function_name} must too (def "
                                 f"{function_name}(comm, x, {argument}, ...)), or give the "
                                 "--kind it implements")
    return Collective(spec, function, name, k.reduces, k.rooted, k.reference)


def _refused(spec: str, why: str) -> UserAlgorithmError:
    return UserAlgorithmError(f"--algorithm {spec!r}: {why}")


def _import_module(module_name: str, spec: str) -> Any:
    """Import ``module_name`` with the working folder first on ``sys.path`` (processes that
    realcomm spawns inherit it), with a one-line error."""
    folder = os.getcwd()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name + ".").startswith(error.name + "."):
            raise _refused(spec, f"no module named {error.name!r} (looked in the working "
                                 f"folder {folder} and sys.path)") from None
        raise _refused(spec, f"importing {module_name} failed: {error}") from None
    except Exception as error:  # the user's module failed as it ran: say how, in one line
        raise _refused(spec, f"importing {module_name} failed: {type(error).__name__}: "
                             f"{error}") from None
