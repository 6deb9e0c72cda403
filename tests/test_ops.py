"""The op vocabulary: plain frozen data, checked when an op is made, not when it runs."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from algorithms import (
    SUM, Alloc, Comm, Compute, Copy, Divide, Join, Multicast, Recv, RecvReduce, ReduceOp, Send,
    Spawn, Wait, ring_allreduce,
)
from simcomm import fully_connected, simulate

BUF = np.zeros(4, dtype=np.float32)


@pytest.mark.parametrize("op", [Send, Recv], ids=lambda op: op.__name__)
@pytest.mark.parametrize("peer", [-1, 1.0, "1", True, None, np.int64(-1), np.float64(1.0),
                                  np.True_], ids=repr)
def test_peer_must_be_a_non_negative_int(op, peer) -> None:
    with pytest.raises(ValueError, match=rf"{op.__name__}.peer must be a non-negative int rank, "
                                         rf"got {re.escape(repr(peer))}"):
        op(peer, BUF)


@pytest.mark.parametrize("op", [Multicast, RecvReduce], ids=lambda op: op.__name__)
@pytest.mark.parametrize("peer", [1.0, True, np.float64(1.0), np.True_], ids=repr)
def test_peers_must_be_non_negative_ints(op, peer) -> None:
    with pytest.raises(ValueError, match=rf"{op.__name__}.peers must be a non-negative int "
                                         rf"rank, got {re.escape(repr(peer))}"):
        op((0, peer), BUF)


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint8])
def test_numpy_integer_peers_become_plain_ints(integer) -> None:
    peers = [Send(integer(1), BUF).peer, Recv(integer(1), BUF).peer,
             *Multicast((integer(1), 2), BUF).peers, *RecvReduce((2, integer(1)), BUF).peers]
    assert peers == [1, 1, 1, 2, 2, 1]
    assert all(type(peer) is int for peer in peers)
    with pytest.raises(ValueError, match=r"Multicast.peers names a rank twice"):
        Multicast((integer(1), 1), BUF)


@pytest.mark.parametrize("integer", [np.int64, np.int32])
def test_a_ring_with_numpy_integer_peers_runs_in_the_simulator(integer) -> None:
    def shift(comm, x):
        # Peers computed with numpy, as users do.
        right, left = (integer(r) for r in np.mod(comm.rank + np.array([1, -1]), comm.size))
        incoming = np.empty_like(x)
        yield Wait((yield Send(right, x)), (yield Recv(left, incoming)))
        return incoming

    p = 4
    inputs = [np.full(3, r, dtype=np.float32) for r in range(p)]
    result = simulate(shift, inputs, fully_connected(p, 1e9, 1e-6))
    assert [out.tolist() for out in result.results] == [[(r - 1) % p] * 3 for r in range(p)]


def test_recv_reduce_must_be_a_reduce_op() -> None:
    with pytest.raises(TypeError, match="Recv.reduce must be a ReduceOp or None, got 'sum'"):
        Recv(0, BUF, reduce="sum")
    assert Recv(0, BUF, reduce=SUM).reduce is ReduceOp.SUM
    assert Recv(0, BUF).reduce is None


def test_wait_needs_a_handle_and_keeps_them_in_order() -> None:
    with pytest.raises(ValueError, match="Wait needs at least one handle"):
        Wait()
    assert Wait("a", "b", "c").handles == ("a", "b", "c")


@pytest.mark.parametrize("seconds", [-1e-6, math.inf, math.nan, "1s", None])
def test_compute_needs_finite_non_negative_seconds(seconds) -> None:
    with pytest.raises(ValueError, match="Compute.seconds must be finite and >= 0"):
        Compute(seconds)


def test_compute_takes_a_label() -> None:
    assert Compute(0).label == "compute"
    assert Compute(1e-3, "backward layer 3").label == "backward layer 3"


@pytest.mark.parametrize("divisor", [0, -2, 2.0, None])
def test_divide_needs_a_positive_int(divisor) -> None:
    with pytest.raises(ValueError, match="Divide.divisor must be an int >= 1"):
        Divide(BUF, divisor)


def test_avg_of_bools_is_refused_not_a_numpy_casting_error() -> None:
    # It failed deep in numpy (UFuncTypeError: cannot cast divide output to bool).
    from algorithms import AVG
    from simcomm import SizeOnly
    with pytest.raises(TypeError, match="Divide of a bool buffer"):
        Divide(np.ones(4, dtype=bool), 2)
    for inputs, level in (([np.ones(8, dtype=bool)] * 4, "message"),
                          ([SizeOnly(8, bool)] * 4, "message"),
                          ([SizeOnly(8, bool)] * 4, "collective")):
        with pytest.raises(TypeError, match="a mean of booleans is no boolean"):
            simulate(ring_allreduce, inputs, fully_connected(4, 1e9, 1e-6), op=AVG,
                     level=level)


@pytest.mark.parametrize("count", [-1, 1.5, None])
def test_alloc_needs_a_non_negative_int_count(count) -> None:
    with pytest.raises(ValueError, match="Alloc.count must be an int >= 0"):
        Alloc(count, BUF)


def test_spawn_needs_a_generator() -> None:
    with pytest.raises(TypeError, match="Spawn.schedule must be a generator"):
        Spawn(ring_allreduce, 1)  # the function, not a call of it
    schedule = ring_allreduce(Comm(0, 2), BUF)
    assert Spawn(schedule, "bucket0").schedule is schedule
    with pytest.raises(TypeError, match="Spawn.shares_rate must be a bool, got 1"):
        Spawn(schedule, "bucket0", shares_rate=1)


@pytest.mark.parametrize("op", [
    Send(0, BUF), Recv(0, BUF, SUM), Wait(1), Compute(1.0), Copy(BUF, BUF), Divide(BUF, 2),
    Alloc(3, BUF), Join(None),
], ids=lambda op: type(op).__name__)
def test_ops_are_frozen(op) -> None:
    field = dataclasses.fields(op)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(op, field, 0)


def test_ops_compare_by_identity() -> None:
    # Ops hold buffers, whose == is elementwise; two sends of one buffer are two messages.
    first, second = Send(1, BUF), Send(1, BUF)
    assert first == first
    assert first != second


def test_comm_is_a_value() -> None:
    assert Comm(1, 4) == Comm(1, 4)
    assert {Comm(1, 4), Comm(1, 4)} == {Comm(1, 4)}
    assert (Comm(3, 4).rank, Comm(3, 4).size) == (3, 4)
