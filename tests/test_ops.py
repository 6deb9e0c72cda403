"""The op vocabulary: plain frozen data, checked when an op is made, not when it runs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from algorithms import (
    SUM, Alloc, Comm, Compute, Copy, Divide, Join, Recv, ReduceOp, Send, Spawn, Wait,
    ring_allreduce,
)

BUF = np.zeros(4, dtype=np.float32)


@pytest.mark.parametrize("op", [Send, Recv], ids=lambda op: op.__name__)
@pytest.mark.parametrize("peer", [-1, 1.0, "1", True, None])
def test_peer_must_be_a_non_negative_int(op, peer) -> None:
    with pytest.raises(ValueError, match=rf"{op.__name__}.peer must be a non-negative int rank, "
                                         rf"got {peer!r}"):
        op(peer, BUF)


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


@pytest.mark.parametrize("count", [-1, 1.5, None])
def test_alloc_needs_a_non_negative_int_count(count) -> None:
    with pytest.raises(ValueError, match="Alloc.count must be an int >= 0"):
        Alloc(count, BUF)


def test_spawn_needs_a_generator() -> None:
    with pytest.raises(TypeError, match="Spawn.schedule must be a generator"):
        Spawn(ring_allreduce, 1)  # the function, not a call of it
    schedule = ring_allreduce(Comm(0, 2), BUF)
    assert Spawn(schedule, "bucket0").schedule is schedule


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
