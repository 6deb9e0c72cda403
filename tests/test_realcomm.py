"""realcomm runs the collectives over gloo in real local processes and gets what torch's own
collectives, the numpy references and the simulator get, bit for bit where the order of a
reduction cannot matter.

The cases run in one long-lived pool of four processes (started once for the module):
drivers over ranks 0-1, 0-2 and all four, so world sizes 2, 3 and 4 share the start-up cost,
each with and without slicing of messages. The pool gets cases through pipes and answers
with its results.
"""

from __future__ import annotations

import inspect
import itertools
import multiprocessing
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

from algorithms import (
    AVG, SUM, Comm, Compute, Join, Recv, ReduceOp, Send, Sleep, Spawn, Wait, chunk_bounds,
    nvls_channels, ring_allreduce, ring_channels, split_even, tree_channels,
)
from algorithms.harness.catalog import COLLECTIVES, Collective
from algorithms.reference import allreduce_reference, divide
from realcomm import Driver, PeerError, PeerTimeoutError, spawn, start
from realcomm.driver import divide_
from simcomm import ring, simulate

POOL_SIZE = 4
WORLD_SIZES = (2, 3, 4)
CHANNELS = (1, 2)
RING_CHANNELS = tuple(ring_channels(2)) + tuple(tree_channels(2)) + tuple(nvls_channels(3))
SLICE_BYTES = 1000  # for the pool's slicing drivers: messages of a few thousand elements
DRIVER_TIMEOUT = 20.0  # seconds: a case that goes wrong fails instead of hanging the pool
REPLY_TIMEOUT = 120.0  # seconds the test waits for the pool to answer
LONG_CHUNK_BYTES = 512  # the long inputs' chunk: a part of 1000-odd elements spans several
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64))
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
# A fixed uneven split for all_to_all (row i: what rank i sends to each rank), cut to p x p.
UNEVEN = [[0, 3, 1, 4], [2, 0, 5, 1], [1, 1, 0, 2], [3, 0, 2, 0]]

_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.PROD: dist.ReduceOp.PRODUCT,
    ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.AVG: dist.ReduceOp.AVG,
}
# Newer torch renames the tensor forms of reduce-scatter and all-gather.
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass(frozen=True)
class Case:
    """One run on ranks 0..p-1 of the pool. ``native`` names the kind of torch's collective
    to run on the same inputs, if any."""

    p: int
    algorithm: Callable[..., Any]
    inputs: tuple[np.ndarray, ...]
    params: dict[str, Any] = field(default_factory=dict)
    native: str | None = None
    rank_params: tuple[dict[str, Any], ...] = ()  # more parameters, rank by rank
    sliced: bool = False  # run on a driver that sends messages in slices


# -- the pool (these functions run in the worker processes) --------------------------------

def _pool_worker(conns: list[Connection]) -> None:
    conn = conns[dist.get_rank()]
    for other in conns:  # so that the test sees the end of a worker that dies
        if other is not conn:
            other.close()
    drivers = {(p, sliced): Driver(None if p == POOL_SIZE else range(p),
                                   channels=CHANNELS + RING_CHANNELS,
                                   timeout=DRIVER_TIMEOUT, slice_bytes=sliced * SLICE_BYTES)
               for p in WORLD_SIZES for sliced in (False, True)}
    while (request := conn.recv()) is not None:
        replies = []
        for case in request:
            driver = drivers[case.p, case.sliced]
            if not driver.is_member:
                continue
            try:
                replies.append(("ok", _run_case(driver, case)))
            except Exception as error:
                replies.append(("error", type(error).__name__, str(error)))
        conn.send(replies)


def _run_case(driver: Driver, case: Case) -> tuple[Any, Any]:
    rank = driver.comm.rank
    x = torch.from_numpy(case.inputs[rank].copy())
    uneven = "split_sizes_matrix" in case.params
    params = {**case.params, **(case.rank_params[rank] if case.rank_params else {})}
    result = driver.run(case.algorithm, x, equal_lengths=not uneven, **params)
    ours = None if result is None else result.numpy().copy()
    native = None
    if case.native is not None:
        native = _native(case, driver.group, rank)
    return ours, native


def _native(case: Case, group: Any, rank: int) -> Any:
    """torch's own collective of the case's kind on the same input, or "unsupported"."""
    p, kind, params = case.p, case.native, case.params
    x = torch.from_numpy(case.inputs[rank].copy())
    op = params.get("op", SUM)
    root = params.get("root", 0)
    if op is AVG and not x.is_floating_point():
        return "unsupported"  # gloo: "result type Float can't be cast to ... Long"
    torch_op = _TORCH_OPS[op]
    if kind == "allreduce":
        dist.all_reduce(x, torch_op, group=group)
        return x.numpy()
    if kind == "reducescatter":
        if len(x) % p == 0:
            out = torch.empty(len(x) // p, dtype=x.dtype)
            _reduce_scatter(out, x, torch_op, group=group)
            return out.numpy()
        # torch wants equal chunks: reduce it all, keep chunk r.
        dist.all_reduce(x, torch_op, group=group)
        start, stop = chunk_bounds(len(x), p)[rank]
        return x[start:stop].numpy()
    if kind == "allgather":
        bounds = chunk_bounds(len(x), p)
        width = bounds[0][1] - bounds[0][0]  # the widest chunk; pad the others to it
        start, stop = bounds[rank]
        mine = torch.zeros(width, dtype=x.dtype)
        mine[:stop - start] = x[start:stop]
        out = torch.empty(width * p, dtype=x.dtype)
        _all_gather(out, mine, group=group)
        return np.concatenate([out[i * width:i * width + b - a].numpy()
                               for i, (a, b) in enumerate(bounds)])
    if kind == "broadcast":
        dist.broadcast(x, src=root, group=group)  # the pool's groups: ranks 0..p-1
        return x.numpy()
    if kind == "reduce":
        dist.reduce(x, dst=root, op=torch_op, group=group)
        return x.numpy() if rank == root else None
    if kind == "alltoall":
        matrix = params.get("split_sizes_matrix")
        if matrix is None:
            matrix = [[b - a for a, b in chunk_bounds(len(x), p)]] * p
        out = torch.empty(sum(row[rank] for row in matrix), dtype=x.dtype)
        dist.all_to_all_single(out, x, [row[rank] for row in matrix], list(matrix[rank]),
                               group=group)
        return out.numpy()
    raise AssertionError(f"no native collective for {kind}")


# -- the pool (the test side) --------------------------------------------------------------

class Pool:
    """The test's end of the worker pool."""

    def __init__(self) -> None:
        self.conns, child_ends = [], []
        for _ in range(POOL_SIZE):
            ours, theirs = multiprocessing.get_context("spawn").Pipe()
            self.conns.append(ours)
            child_ends.append(theirs)
        self.group = start(_pool_worker, POOL_SIZE, (child_ends,), timeout=60)
        for end in child_ends:
            end.close()

    def run(self, cases: list[Case]) -> list[list[tuple[Any, ...]]]:
        """Every case's replies, rank by rank."""
        for conn in self.conns:
            conn.send(cases)
        per_rank = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(REPLY_TIMEOUT):
                raise AssertionError(f"pool rank {rank} did not answer in {REPLY_TIMEOUT}s")
            try:
                per_rank.append(iter(conn.recv()))
            except EOFError:
                raise AssertionError(f"pool rank {rank} died (see its stderr)") from None
        return [[next(per_rank[rank]) for rank in range(case.p)] for case in cases]

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        self.group.join()


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    workers = Pool()
    yield workers
    workers.close()


# -- checking ---------------------------------------------------------------------------

def _results(case: Case, replies: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    for rank, reply in enumerate(replies):
        assert reply[0] == "ok", f"rank {rank} raised {reply[1]}: {reply[2]}"
    return [reply[1][0] for reply in replies], [reply[1][1] for reply in replies]


def _equal(got: Any, want: Any, tolerance: float = 0.0) -> bool:
    if got is None or want is None:
        return got is None and want is None
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if tolerance:
        return bool(np.allclose(got, want, rtol=tolerance, atol=tolerance))
    return bool(np.array_equal(got, want, equal_nan=got.dtype.kind == "f"))


def check(case: Case, replies: list[tuple[Any, ...]], collective: Collective | None) -> None:
    """realcomm's results equal the simulator's bit for bit, and the reference's and
    torch's (within the dtype's tolerance for floats: they reduce in another order)."""
    ours, native = _results(case, replies)
    simulated = simulate(case.algorithm, list(case.inputs), ring(case.p, 1e9, 1e-6),
                         **case.params).results
    tolerance = TOLERANCE.get(case.inputs[0].dtype, 0.0)
    for rank in range(case.p):
        assert _equal(ours[rank], simulated[rank]), f"rank {rank}: realcomm != simcomm"
    if collective is not None:
        accepted = inspect.signature(collective.reference).parameters
        expected = collective.reference(
            list(case.inputs), **{k: v for k, v in case.params.items() if k in accepted})
        for rank in range(case.p):
            assert _equal(ours[rank], expected[rank], tolerance), \
                f"rank {rank}: realcomm != reference"
    if case.native is not None:
        for rank in range(case.p):
            if isinstance(native[rank], str):
                continue  # torch cannot run it; the reference has spoken
            assert _equal(ours[rank], native[rank], tolerance), \
                f"rank {rank}: realcomm != torch's {case.native}"


def make_case(name: str, p: int, dtype: np.dtype, length: int, seed: int,
              params: dict[str, Any], sliced: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    matrix = params.get("split_sizes_matrix")
    lengths = [sum(row) for row in matrix] if matrix is not None else [length] * p
    if dtype.kind == "f":
        inputs = tuple(rng.standard_normal(n).astype(dtype) for n in lengths)
    else:
        inputs = tuple(rng.integers(-50, 51, n).astype(dtype) for n in lengths)
    collective = COLLECTIVES[name]
    return Case(p, collective.function, inputs, params, collective.kind, sliced=sliced)


def variants(collective: Collective, p: int) -> Iterator[dict[str, Any]]:
    """Every combination of the collective's parameters: each op, both values of each flag,
    root p-1, and an even and an uneven split."""
    choices: dict[str, list[Any]] = {}
    for name, parameter in list(inspect.signature(collective.function).parameters.items())[2:]:
        if name == "op":
            choices[name] = list(ReduceOp)
        elif name == "root":
            choices[name] = [p - 1]
        elif name == "split_sizes_matrix":
            choices[name] = [None, [row[:p] for row in UNEVEN[:p]]]
        elif isinstance(parameter.default, bool):
            choices[name] = [False, True]
        elif name == "channels":  # rings or trees at once, on the pool's RING_CHANNELS
            choices[name] = [1, 2]
        elif name == "protocol":  # the data are the same under every protocol: one will do
            choices[name] = ["ll128"]
        elif name == "chunk_bytes":  # small chunks: several per part, a pipeline
            choices[name] = [16]
        elif name == "algorithm":  # no tuner on realcomm: each one forced
            # (NVLS runs here as the nvls_* collectives, which this test takes too.)
            choices[name] = (["ring", "tree", "hierarchical"] if collective.kind == "allreduce"
                             else ["ring"])
        else:
            raise AssertionError(f"{collective.name}: no variants for parameter {name!r}")
    for values in itertools.product(*choices.values()):
        params = {k: v for k, v in zip(choices, values) if v is not None}
        if params.get("algorithm") == "hierarchical" and params.get("channels", 1) > 1:
            continue  # one channel a phase: refused, as the simulator's tests check
        yield params


# -- every collective, every variant, every reduce op --------------------------------------

@pytest.mark.parametrize("p", WORLD_SIZES)
def test_every_variant_matches_torch_reference_and_simulator(pool: Pool, p: int) -> None:
    cases, collectives = [], []
    counter = itertools.count()
    for name in sorted(COLLECTIVES):
        for params in variants(COLLECTIVES[name], p):
            for dtype in DTYPES:
                i = next(counter)
                length = (2 * p + 1, 1000 + p, 0)[i % 3]  # uneven splits, and nothing
                case_params = params
                if "chunk_bytes" in params and length > 2 * p + 1:
                    # Still several chunks a part, but not one message per two elements:
                    # 16-byte chunks of the long input took most of this test's time.
                    case_params = {**params, "chunk_bytes": LONG_CHUNK_BYTES}
                cases.append(make_case(name, p, dtype, length, i, case_params,
                                       sliced=i % 2 == 1))
                collectives.append(COLLECTIVES[name])
    for case, collective, replies in zip(cases, collectives, pool.run(cases)):
        check(case, replies, collective)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, Case]:
    p = draw(st.sampled_from(WORLD_SIZES))
    name = draw(st.sampled_from(sorted(COLLECTIVES)))
    params = draw(st.sampled_from(list(variants(COLLECTIVES[name], p))))
    if "root" in params:
        params["root"] = draw(st.integers(0, p - 1))
    if "split_sizes_matrix" in params:
        params["split_sizes_matrix"] = draw(st.lists(
            st.lists(st.integers(0, 600), min_size=p, max_size=p), min_size=p, max_size=p))
    length = draw(st.one_of(st.integers(0, 2 * p + 1), st.integers(0, 3000)))
    dtype = draw(st.sampled_from(DTYPES))
    return name, make_case(name, p, dtype, length, draw(st.integers(0, 2**32 - 1)), params,
                           draw(st.booleans()))


# A case runs in about 10 ms, so the test affords a few times the profile's budget.
@settings(max_examples=3 * settings.default.max_examples)
@given(cases())
@example(("reduce", make_case("reduce", 3, DTYPES[2], 7, 0, {"op": AVG, "root": 1,
                                                             "tree": True})))
def test_any_case_matches_torch_reference_and_simulator(pool: Pool, drawn: tuple[str, Case]
                                                        ) -> None:
    name, case = drawn
    (replies,) = pool.run([case])
    check(case, replies, COLLECTIVES[name])


# -- Divide truncates integers toward zero, as the reference --------------------------------

INTEGER_LIMITS = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -7, -1, 0, 1, 7]


@given(st.sampled_from(["int32", "int64", "float32", "float64"]),
       st.lists(st.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max), max_size=50),
       st.integers(1, 1000))
@example("int64", INTEGER_LIMITS, 3)
@example("int64", INTEGER_LIMITS, 1)
@example("float32", [1, -1, 7], 3)
def test_divide_matches_the_reference_bit_for_bit(dtype: str, values: list[int],
                                                  divisor: int) -> None:
    data = np.array(values, dtype=np.int64).astype(dtype)
    if data.dtype.kind == "f":
        data = (data / 7.3).astype(dtype)  # fractions too, not only whole numbers
    expected = data.copy()
    divide(expected, divisor)
    got = torch.from_numpy(data.copy())
    divide_(got, divisor)
    assert np.array_equal(got.numpy(), expected)


# -- concurrent tasks, channels and compute ------------------------------------------------

def two_buckets(comm: Comm, x: Any, op: ReduceOp = SUM) -> Any:
    """Two all-reduces in flight at once between the same pairs of ranks, on two channels,
    beside compute: their messages must not cross."""
    first, second = split_even(x, 2)
    one = yield Spawn(ring_allreduce(comm, first, op), channel=1)
    yield Compute(0.01, "backward")
    two = yield Spawn(ring_allreduce(comm, second, op), channel=2)
    yield Compute(0.01, "backward")
    yield Join(two)
    yield Join(one)
    return x


def two_computes(comm: Comm, x: Any) -> Any:
    """Two tasks computing at once share the rank's one compute stream."""
    def compute() -> Any:
        yield Compute(0.1)
    one = yield Spawn(compute(), channel=1)
    two = yield Spawn(compute(), channel=2)
    yield Join(one)
    yield Join(two)
    return x


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_concurrent_tasks_on_channels_match_the_simulator(pool: Pool, p: int) -> None:
    cases = [Case(p, two_buckets, make_case("ring_allreduce", p, dtype, 2000 + p, p, {}).inputs,
                  {"op": op}, sliced=sliced)
             for dtype in DTYPES for op in (SUM, ReduceOp.MAX) for sliced in (False, True)]
    for case, replies in zip(cases, pool.run(cases)):
        check(case, replies, None)
        ours, _ = _results(case, replies)
        expected = allreduce_reference(list(case.inputs), case.params["op"])
        tolerance = TOLERANCE.get(case.inputs[0].dtype, 0.0)
        assert all(_equal(got, want, tolerance) for got, want in zip(ours, expected))


def test_computes_share_the_compute_stream(pool: Pool) -> None:
    case = Case(2, two_computes, (np.zeros(1), np.zeros(1)))
    begin = time.monotonic()
    (replies,) = pool.run([case])
    _results(case, replies)
    assert time.monotonic() - begin >= 0.2


def compute_beside_sleep(comm: Comm, x: Any) -> Any:
    """A task sleeping beside a compute; returns the seconds both took together."""
    def sleep() -> Any:
        yield Sleep(0.3, "a slow rank")
    begin = time.monotonic()
    napping = yield Spawn(sleep(), channel=1)
    yield Compute(0.3)
    yield Join(napping)
    x[0] = time.monotonic() - begin
    return x


def test_sleep_holds_its_task_and_no_stream(pool: Pool) -> None:
    # Serialised on the compute stream they would take 0.6 s; side by side, 0.3 s.
    case = Case(2, compute_beside_sleep, (np.zeros(1), np.zeros(1)))
    (replies,) = pool.run([case])
    ours, _ = _results(case, replies)
    assert all(0.3 <= seconds[0] < 0.5 for seconds in ours)


# -- misuse gets a clear error, on every rank -------------------------------------------

def wait_twice(comm: Comm, x: Any) -> Any:
    peer = 1 - comm.rank
    sent = yield Send(peer, x[:1])
    received = yield Recv(peer, x[1:2])
    yield Wait(sent, received)
    yield Wait(sent)


def no_wait(comm: Comm, x: Any) -> Any:
    peer = 1 - comm.rank
    yield Send(peer, x[:1])
    yield Recv(peer, x[1:2])
    return x


def send_to_self(comm: Comm, x: Any) -> Any:
    yield Wait((yield Send(comm.rank, x)))


def strided_send(comm: Comm, x: Any) -> Any:
    yield Wait((yield Send(1 - comm.rank, x[::2])))


def element_send(comm: Comm, x: Any) -> Any:
    yield Wait((yield Send(1 - comm.rank, x[0])))


def undeclared_channel(comm: Comm, x: Any) -> Any:
    yield Join((yield Spawn(ring_allreduce(comm, x), channel="bucket 9")))


def unjoined(comm: Comm, x: Any) -> Any:
    yield Spawn(ring_allreduce(comm, x), channel=1)


def send_over_plain_receive(comm: Comm, x: Any) -> Any:
    peer = 1 - comm.rank
    received = yield Recv(peer, x)
    sent = yield Send(peer, x)
    yield Wait(sent, received)


def not_an_op(comm: Comm, x: Any) -> Any:
    yield "send it"


@pytest.mark.parametrize(("schedule", "message"), [
    (wait_twice, "waited twice on its Send to rank"),
    (no_wait, "returned without waiting for: Send to rank"),
    (send_to_self, "to itself; use Copy"),
    (strided_send, "on channel 0 of a non-contiguous (strided) view"),
    (element_send, "of a single element (Tensor): use a slice such as x[i:i+1]"),
    (undeclared_channel, "declare it: Driver(channels=[...])"),
    (unjoined, "without joining its tasks on channels [1]"),
    (send_over_plain_receive, "which reads memory that its outstanding Recv from rank"),
    (not_an_op, "which is not an op"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_misuse_raises_protocol_error_on_every_rank(pool: Pool, schedule: Any,
                                                     message: str) -> None:
    (replies,) = pool.run([Case(2, schedule, (np.zeros(4), np.zeros(4)))])
    for rank, reply in enumerate(replies):
        assert reply[:2] == ("error", "ProtocolError"), reply
        assert message in reply[2] and f"rank {rank}" in reply[2]


@pytest.mark.parametrize(("inputs", "rank_params", "what"), [
    ((np.zeros(8, np.float32), np.zeros(8, np.float64)), (), "dtype"),
    ((np.zeros(8), np.zeros(9)), (), "length"),
    ((np.zeros(8), np.zeros(8)), ({"op": SUM}, {"op": ReduceOp.MAX}), "params"),
], ids=["dtype", "length", "params"])
def test_mismatched_arguments_raise_on_every_rank(pool: Pool, inputs: Any, rank_params: Any,
                                                  what: str) -> None:
    (replies,) = pool.run([Case(2, ring_allreduce, inputs, rank_params=rank_params)])
    for reply in replies:
        assert reply[:2] == ("error", "ArgumentMismatchError"), reply
        assert f"ranks disagree on the {what}" in reply[2] and "rank 1:" in reply[2]


# -- a dead or silent peer makes the others raise, not hang --------------------------------
# (check_args=False: the point-to-point ops meet the dead peer, not the argument check)

def _exits_early(timeout: float) -> tuple[str, float, str] | None:
    driver = Driver(timeout=timeout)
    if dist.get_rank() == 2:
        return None  # leaves before the run: its process ends
    begin = time.monotonic()
    try:
        driver.run(ring_allreduce, torch.ones(1000), check_args=False)
    except PeerError as error:
        return type(error).__name__, time.monotonic() - begin, str(error)
    return None


def _silent(timeout: float) -> tuple[str, float, str] | None:
    driver = Driver(timeout=timeout)
    if dist.get_rank() == 1:
        time.sleep(timeout + 1)  # alive, but answers nothing in time
        return None
    begin = time.monotonic()
    try:
        driver.run(ring_allreduce, torch.ones(1000), check_args=False)
    except PeerTimeoutError as error:
        return type(error).__name__, time.monotonic() - begin, str(error)
    return None


def test_a_rank_that_exits_early_makes_the_others_raise() -> None:
    timeout = 10.0
    results = spawn(_exits_early, 3, (timeout,), timeout=60)
    assert results[2] is None
    for rank in (0, 1):
        assert results[rank] is not None, f"rank {rank} did not raise"
        kind, waited, text = results[rank]
        assert kind in ("PeerError", "PeerTimeoutError")
        assert waited < timeout + 1
        # While waiting on its op, or already when posting it, if the peer is gone by then.
        assert re.search(rf"rank {rank} gave up on (its|posting) (Send to|Recv from) rank [0-2] ",
                         text), text


def test_a_silent_peer_times_out_naming_it() -> None:
    results = spawn(_silent, 2, (2.0,), timeout=60)
    kind, waited, text = results[0]
    assert kind == "PeerTimeoutError"
    assert 2.0 <= waited < 5.0
    assert "rank 0 gave up on its Recv from rank 1 on channel 0 (500 x torch.float32)" in text


def _mismatched_channels() -> str | None:
    # Process 1 declares a channel that process 0 does not: each would make a different
    # number of process groups and wait in torch's new_group until the timeout.
    channels = ("side",) if dist.get_rank() == 1 else ()
    try:
        Driver(channels=channels, timeout=30.0)
    except ValueError as error:
        return str(error)
    return None


def test_drivers_built_with_different_channels_are_refused_at_once() -> None:
    begin = time.monotonic()
    results = spawn(_mismatched_channels, 2, timeout=60)
    assert time.monotonic() - begin < 20  # named, not waited out
    assert "Driver: process 0 and process 1 construct it with different channels ([] " \
        "against [\"'side'\"])" in results[0], results[0]
    assert "process 1 and process 0" in results[1], results[1]
