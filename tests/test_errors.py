"""Faulty algorithms, planted here as small generator functions, must fail with the right
simulator error and name the ranks at fault; bad topologies and parameters must fail at
once with a message that names the problem. No run may hang: every test is guarded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms import (
    SUM, Combine, Comm, Compute, Copy, Join, Recv, Send, Sleep, Spawn, Wait, broadcast, reduce,
    ring_allreduce,
)
from algorithms.harness.catalog import COLLECTIVES
from simcomm import (
    AlgorithmError, DeadlockError, Link, MessageSizeError, ProtocolError, SizeOnly, Topology,
    UnreceivedMessageError, fully_connected, hierarchical, make_topology, ring, simulate, switch,
)

pytestmark = pytest.mark.usefixtures("hang_guard")


def run(algorithm, p: int = 3, length: int = 4, **params):
    inputs = [np.arange(length, dtype=np.float32) + r for r in range(p)]
    return simulate(algorithm, inputs, fully_connected(p, 1e9, 1e-6), **params)


def idle(comm, x):
    yield Compute(1e-3)


def finished_at_once(comm, x):
    return x
    yield  # a generator that ends without yielding


# -- deadlocks: every unfinished task is blocked ---------------------------------------------

def test_two_ranks_that_both_receive_first_deadlock_and_say_what_they_wait_for() -> None:
    def recv_first(comm, x):
        if comm.rank < 2:
            peer = 1 - comm.rank
            yield Wait((yield Recv(peer, x)))
            yield Wait((yield Send(peer, x)))

    with pytest.raises(DeadlockError) as caught:
        run(recv_first)
    message = str(caught.value)
    assert "rank 0 (channel 0) waits for Recv from rank 1" in message
    assert "rank 1 (channel 0) waits for Recv from rank 0" in message
    assert "rank 2" not in message


def test_a_receive_no_one_sends_to_deadlocks() -> None:
    def lonely(comm, x):
        if comm.rank == 2:
            yield Wait((yield Recv(0, x)))

    with pytest.raises(DeadlockError, match=r"rank 2 \(channel 0\) waits for Recv from rank 0"):
        run(lonely)


def test_a_deadlock_names_messages_sent_on_the_wrong_channel() -> None:
    def crossed(comm, x):
        if comm.rank == 0:
            task = yield Spawn(send_to_1(x), 1)
            yield Join(task)
        elif comm.rank == 1:
            yield Wait((yield Recv(0, x)))

    def send_to_1(x):
        yield Wait((yield Send(1, x)))

    with pytest.raises(DeadlockError) as caught:
        run(crossed)
    assert "rank 1 (channel 0) waits for Recv from rank 0" in str(caught.value)
    assert "never received: rank 0 -> rank 1 (4 x float32 on channel 1)" in str(caught.value)


def test_a_join_of_a_blocked_task_deadlocks_naming_both_tasks() -> None:
    def join_blocked(comm, x):
        task = yield Spawn(receive_from_right(comm, x), 1)
        yield Join(task)

    def receive_from_right(comm, x):
        yield Wait((yield Recv((comm.rank + 1) % comm.size, x)))

    with pytest.raises(DeadlockError) as caught:
        run(join_blocked, p=2)
    message = str(caught.value)
    assert "rank 0 (channel 0) waits for Join of its task on channel 1" in message
    assert "rank 0 (channel 1) waits for Recv from rank 1 on channel 1" in message


def test_a_deadlock_of_hundreds_of_ranks_names_the_first_and_counts_the_rest() -> None:
    def send_first(comm, x):
        yield Wait((yield Send((comm.rank + 1) % comm.size, x)))
        yield Wait((yield Recv((comm.rank - 1) % comm.size, x)))

    with pytest.raises(DeadlockError) as caught:
        simulate(send_first, [SizeOnly(4)] * 300, ring(300, 1e9, 1e-6))
    message = str(caught.value)
    assert len(message) < 1500, message
    assert "rank 0 (channel 0) waits for Send to rank 1 on channel 0" in message
    assert "; and 295 more tasks blocked (300 in all); never received: rank 0 -> rank 1" in message
    assert "and 295 more. A Send completes only once its peer has posted" in message
    assert "rank 4 (channel 0)" in message and "rank 5 (channel 0)" not in message


def test_a_task_stuck_on_hundreds_of_handles_names_the_first_and_counts_the_rest() -> None:
    def gather_unsent(comm, x):
        if comm.rank == 0:
            handles = []
            for peer in range(1, comm.size):
                handles.append((yield Recv(peer, x)))
            yield Wait(*handles)

    with pytest.raises(DeadlockError) as caught:
        simulate(gather_unsent, [SizeOnly(4)] * 300, ring(300, 1e9, 1e-6))
    message = str(caught.value)
    assert len(message) < 1000, message
    assert "rank 0 (channel 0) waits for Recv from rank 1 on channel 0" in message
    assert message.endswith("and rank 5 has already returned; and 294 more of its handles")


# -- messages that do not match ----------------------------------------------------------------

@pytest.mark.parametrize("view", [lambda x: x[:3], lambda x: x.view(np.int32)],
                         ids=["length", "dtype"])
def test_a_receive_that_differs_from_its_send_names_both_ranks(view) -> None:
    def mismatch(comm, x):
        if comm.rank == 0:
            yield Wait((yield Send(2, x)))
        elif comm.rank == 2:
            yield Wait((yield Recv(0, view(x))))

    with pytest.raises(MessageSizeError, match=r"rank 2 posted a Recv .* from rank 0"):
        run(mismatch)


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_ranks_with_buffers_of_different_lengths_fail_loudly(name) -> None:
    inputs = [np.zeros(6, np.float32), np.zeros(6, np.float32), np.zeros(9, np.float32)]
    with pytest.raises(MessageSizeError, match="rank 2"):
        simulate(COLLECTIVES[name].function, inputs, ring(3, 1e9, 1e-6))


def unreceived(comm, x):
    if comm.rank == 1:
        yield Wait((yield Send(2, x)))


def test_a_send_never_received_deadlocks_and_says_the_peer_returned() -> None:
    # A send completes only once its receive is posted, as on gloo and NCCL: rank 1 waits
    # for ever, and rank 2, which would have to receive, has returned.
    with pytest.raises(DeadlockError, match=r"rank 1 \(channel 0\) waits for Send to rank 2 .*"
                       r"its Recv was never posted\), and rank 2 has already returned"):
        run(unreceived)


def test_with_eager_sends_a_message_never_received_is_an_error_at_the_end() -> None:
    with pytest.raises(UnreceivedMessageError, match=r"rank 1 -> rank 2 \(4 x float32"):
        run(unreceived, eager_limit=16)


# -- misuse of the ops -------------------------------------------------------------------------

def never_waited(comm, x):
    if comm.rank == 1:
        yield Send(2, x)
    elif comm.rank == 2:
        yield Wait((yield Recv(1, x)))


def never_waited_by_any_task(comm, x):
    # A spawned task may leave its handle for another task to wait on; here none does.
    if comm.rank == 1:
        yield Join((yield Spawn(send_only(x), 1)))


def send_only(x):
    yield Send(2, x)


def waited_twice(comm, x):
    if comm.rank == 1:
        handle = yield Send(2, x)
        yield Wait(handle)
        yield Wait(handle)
    elif comm.rank == 2:
        yield Wait((yield Recv(1, x)))


def peer_out_of_range(comm, x):
    if comm.rank == 1:
        yield Wait((yield Send(3, x)))


def send_to_self(comm, x):
    if comm.rank == 1:
        yield Wait((yield Send(1, x)))


def modified_before_wait(comm, x):
    if comm.rank == 1:
        handle = yield Send(2, x)
        x[0] += 1
        yield Wait(handle)
    elif comm.rank == 2:
        yield Wait((yield Recv(1, x)))


def spawn_on_own_channel(comm, x):
    yield Join((yield Spawn(finished_at_once(comm, x), 0)))


def spawn_on_busy_channel(comm, x):
    first = yield Spawn(idle(comm, x), 1)
    second = yield Spawn(idle(comm, x), 1)
    yield Join(first)
    yield Join(second)


def spawn_one_generator_twice(comm, x):
    schedule = idle(comm, x)
    first = yield Spawn(schedule, 1)
    second = yield Spawn(schedule, 2)
    yield Join(first)
    yield Join(second)


def spawn_a_finished_generator(comm, x):
    schedule = idle(comm, x)
    yield Join((yield Spawn(schedule, 1)))
    yield Join((yield Spawn(schedule, 2)))


def join_not_a_task(comm, x):
    yield Join(42)


def join_a_handle(comm, x):
    if comm.rank == 1:
        yield Join((yield Send(2, x)))
    elif comm.rank == 2:
        yield Wait((yield Recv(1, x)))


def return_without_join(comm, x):
    yield Spawn(idle(comm, x), 1)


def wait_on_a_task(comm, x):
    task = yield Spawn(idle(comm, x), 1)
    yield Wait(task)


def wait_on_a_list(comm, x):
    if comm.rank == 1:
        yield Wait([(yield Send(2, x))])
    elif comm.rank == 2:
        yield Wait((yield Recv(1, x)))


def waits_on_another_ranks_handle():
    # A task may wait on a handle another task of its rank posted, not on another rank's.
    handles = []

    def wait_on_another_ranks_handle(comm, x):
        if comm.rank == 2:
            yield Wait((yield Recv(1, x)))
        elif comm.rank == 1:
            handles.append((yield Send(2, x)))
            yield Sleep(1e-3)
            yield Wait(handles[0])
        else:
            yield Sleep(1e-4)
            yield Wait(handles[0])
    return wait_on_another_ranks_handle


def yield_a_non_op(comm, x):
    yield 42


PROTOCOL_ERRORS = [
    (never_waited, r"rank 1 \(channel 0\) returned without waiting for: Send to rank 2"),
    (never_waited_by_any_task, r"rank 1 \(channel 0\) returned without waiting for: Send to "
                               r"rank 2 on channel 1"),
    (waited_twice, r"rank 1 waited twice on its Send to rank 2"),
    (peer_out_of_range, r"rank 1 posted a Send with peer 3, but the world has 3 ranks"),
    (send_to_self, r"rank 1 posted a Send to itself"),
    (modified_before_wait, r"rank 1 changed the buffer of its Send to rank 2"),
    (spawn_on_own_channel, r"rank 0 spawned a task on channel 0, which a live task"),
    (spawn_on_busy_channel, r"rank 0 spawned a task on channel 1, which a live task"),
    (spawn_one_generator_twice, r"rank 0 spawned a task on channel 2 with a generator already "
                                r"spawned as the task of rank 0 on channel 1 \(still running\): "
                                r"each task needs its own generator object"),
    (spawn_a_finished_generator, r"rank 0 spawned a task on channel 2 with a generator already "
                                 r"spawned as the task of rank 0 on channel 1 \(ended\)"),
    (join_not_a_task, r"rank 0 joined 42, which is not another task of this rank"),
    (join_a_handle, r"rank 1 joined its Send to rank 2 on channel 0 .*, which is not "
                    r"another task of this rank"),
    (wait_on_a_list, r"rank 1 waited on a list of 1 items \(unpack it: Wait\(\*handles\)\), "
                     r"which is not a Send or Recv handle"),
    (return_without_join, r"rank 0 \(channel 0\) returned without joining its tasks on "
                          r"channels \[1\]"),
    (wait_on_a_task, r"rank 0 waited on a task of rank 0 \(channel 1\), which is not a Send "
                     r"or Recv handle"),
    (waits_on_another_ranks_handle(), r"rank 0 \(channel 0\) waited on a handle that rank 1 "
                                      r"posted"),
    (yield_a_non_op, r"rank 0 yielded 42, which is not an op"),
]


@pytest.mark.parametrize("algorithm, message", PROTOCOL_ERRORS,
                         ids=[case[0].__name__ for case in PROTOCOL_ERRORS])
def test_misuse_of_the_ops_is_a_protocol_error(algorithm, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        run(algorithm)


def test_errors_an_algorithm_causes_share_a_base_class() -> None:
    for error in (DeadlockError, MessageSizeError, UnreceivedMessageError, ProtocolError):
        assert issubclass(error, AlgorithmError)


def test_an_algorithm_that_is_not_a_generator_is_a_type_error() -> None:
    def plain_function(comm, x):
        return x

    with pytest.raises(TypeError, match="'plain_function' did not return a generator"):
        run(plain_function)


@pytest.mark.parametrize("delay", [0.0, 1e-3], ids=["at_start", "after_resuming"])
def test_an_exception_inside_an_algorithm_carries_a_note_naming_the_rank(delay) -> None:
    def faulty(comm, x):
        yield Compute(delay)
        if comm.rank == 1:
            raise RuntimeError("bug in the algorithm")

    with pytest.raises(RuntimeError, match="bug in the algorithm") as caught:
        run(faulty)
    assert any("rank 1 (channel 0)" in note for note in caught.value.__notes__)


# -- bad topologies and parameters ---------------------------------------------------------------

@pytest.mark.parametrize("bandwidth", [0.0, -1e9, math.nan])
def test_a_link_needs_a_positive_bandwidth(bandwidth) -> None:
    with pytest.raises(ValueError, match="a->b: bandwidth must be > 0"):
        Link("a", "b", bandwidth, 1e-6)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        ring(4, bandwidth, 1e-6)


@pytest.mark.parametrize("latency", [-1e-6, math.inf, math.nan])
def test_a_link_needs_a_finite_non_negative_latency(latency) -> None:
    with pytest.raises(ValueError, match="a->b: latency must be finite and >= 0"):
        Link("a", "b", 1e9, latency)


@pytest.mark.parametrize("bandwidth, latency", [(1e-300, 1e-6), (1e9, 1e300)])
def test_a_cost_that_comes_to_infinity_is_named_not_an_overflow(bandwidth, latency) -> None:
    # Each figure is valid alone; a message's time in the clock's ticks is not.
    with pytest.raises(ValueError, match="came to infinity: a bandwidth or speed too small"):
        simulate(ring_allreduce, [SizeOnly(1 << 18, np.float32)] * 4,
                 switch(4, bandwidth, latency))


def test_a_link_may_not_loop() -> None:
    with pytest.raises(ValueError, match="connects a node to itself"):
        Link("a", "a", 1e9, 0.0)


def test_topology_rejects_unknown_nodes_and_bad_ranks() -> None:
    link = Link("gpu0", "gpu9", 1e9, 0.0)
    with pytest.raises(ValueError, match="names unknown node 'gpu9'"):
        Topology("t", ("gpu0", "gpu1"), (link,), ("gpu0", "gpu1"), (1.0, 1.0))
    twice = (Link("gpu0", "gpu1", 1e9, 0.0), Link("gpu0", "gpu1", 2e9, 0.0))
    with pytest.raises(ValueError, match="two links from gpu0 to gpu1"):  # one would idle
        Topology("t", ("gpu0", "gpu1"), twice, ("gpu0", "gpu1"), (1.0, 1.0))
    with pytest.raises(ValueError, match="rank 1 is on unknown node 'gpu7'"):
        Topology("t", ("gpu0", "gpu1"), (), ("gpu0", "gpu7"), (1.0, 1.0))
    with pytest.raises(ValueError, match="two ranks share a node"):
        Topology("t", ("gpu0",), (), ("gpu0", "gpu0"), (1.0, 1.0))
    with pytest.raises(ValueError, match="has no ranks"):
        Topology("t", ("gpu0",), (), (), ())
    with pytest.raises(ValueError, match="one reduce bandwidth per rank"):
        Topology("t", ("gpu0",), (), ("gpu0",), (1.0, 1.0))
    with pytest.raises(ValueError, match="rank 0 reduce bandwidth must be > 0"):
        Topology("t", ("gpu0",), (), ("gpu0",), (0.0,))
    with pytest.raises(ValueError, match="node names must be unique"):
        Topology("t", ("gpu0", "gpu0"), (), ("gpu0",), (1.0,))


def test_a_message_with_no_route_is_an_error() -> None:
    one_way = Topology("one_way", ("gpu0", "gpu1"), (Link("gpu0", "gpu1", 1e9, 0.0),),
                       ("gpu0", "gpu1"), (1.0, 1.0))
    with pytest.raises(ValueError, match=r"no route from rank 1 \(gpu1\) to rank 0 \(gpu0\)"):
        simulate(ring_allreduce, [SizeOnly(8)] * 2, one_way)


@pytest.mark.parametrize("kind, ranks, message", [
    ("torus", 4, "unknown topology 'torus'"),
    ("ring", 0, "number of ranks must be an int >= 1"),
    ("switch", 2.5, "number of ranks must be an int >= 1"),
    ("hierarchical", 12, "12 ranks do not fill nodes of 8 GPUs"),
])
def test_make_topology_rejects_bad_requests(kind, ranks, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_topology(kind, ranks, 1e9, 1e-6)


def test_inputs_must_fit_the_topology() -> None:
    topology = switch(3, 1e9, 1e-6)
    with pytest.raises(ValueError, match="got 2 inputs for a topology of 3 ranks"):
        simulate(ring_allreduce, [SizeOnly(4)] * 2, topology)
    with pytest.raises(ValueError, match="inputs mix numpy arrays and SizeOnly buffers"):
        simulate(ring_allreduce, [np.zeros(4), np.zeros(4), SizeOnly(4, np.float64)], topology)
    with pytest.raises(ValueError, match=r"input of rank 0 must be 1-D, got shape \(2, 2\)"):
        simulate(ring_allreduce, [np.zeros((2, 2))] * 3, topology)
    with pytest.raises(TypeError, match="input of rank 0 must be a numpy array or SizeOnly"):
        simulate(ring_allreduce, [[1.0, 2.0]] * 3, topology)


@pytest.mark.parametrize("algorithm", [broadcast, reduce], ids=lambda f: f.__name__)
@pytest.mark.parametrize("root", [3, -1, 1.0])
def test_a_bad_root_is_rejected(algorithm, root) -> None:
    with pytest.raises(ValueError, match=r"root must be a rank in \[0, 3\)") as caught:
        run(algorithm, root=root)
    assert any("rank 0" in note for note in caught.value.__notes__)


@pytest.mark.parametrize("rank, size, message", [
    (3, 3, r"rank must be an int in \[0, 3\), got 3"),
    (-1, 3, r"rank must be an int in \[0, 3\), got -1"),
    (0, 0, "world size must be an int >= 1, got 0"),
    (0, 2.0, "world size must be an int >= 1, got 2.0"),
])
def test_comm_rejects_a_bad_rank_or_size(rank, size, message) -> None:
    with pytest.raises(ValueError, match=message):
        Comm(rank, size)


# -- the Python API's arguments, at either level --------------------------------------------

def _bad_api_calls():
    from algorithms import alltoall_allreduce
    from algorithms.harness.model_presets import preset_model
    from simcomm.training import simulate_ddp, simulate_fsdp
    four, sizes = ring(4, 1e9, 1e-6), [SizeOnly(16)] * 4
    model = preset_model("resnet50")
    return [
        (lambda: simulate(broadcast, sizes, four, tree="false"), "tree must be True or False"),
        (lambda: simulate(broadcast, sizes, four, level="collective", tree="no"),
         "tree must be True or False"),
        (lambda: simulate(broadcast, sizes, four, level="collective", root=True),
         r"root must be a rank in \[0, 4\), got True"),
        (lambda: simulate(alltoall_allreduce, sizes, four, chunked="no"),
         "chunked must be True or False"),
        (lambda: simulate(ring_allreduce, [np.array(list("abcd"))] * 4, four),
         "input of rank 0: dtype <U1 holds no numbers"),
        (lambda: SizeOnly(True), "count must be an int >= 0, got True"),
        (lambda: SizeOnly(4, object), "dtype object holds no numbers"),
        (lambda: simulate(ring_allreduce, sizes, four, level="collective", max_time=-5),
         "max_time must be a number of seconds > 0"),
        (lambda: simulate(ring_allreduce, sizes, four, level="collective", record="x"),
         "record must be True or False"),
        (lambda: simulate(ring_allreduce, [SizeOnly(2**70)] * 4, four, level="collective"),
         "came to infinity"),
        (lambda: ring(True, 1e9, 1e-6), "number of ranks must be an int >= 1, got True"),
        (lambda: hierarchical(2, 0, 1e9, 1e-6, 1e9, 1e-6),
         "gpus_per_node must be an int >= 1, got 0"),
        (lambda: make_topology("ring", 4, 1e9, 1e-6, inter_bandwidth=1e9),
         "ring: inter_bandwidth apply to hierarchical only"),
        (lambda: make_topology("hierarchical", 4, 1e9, 1e-6, gpus_per_node=2,
                               inter_bandwidth=0), "bandwidth must be > 0, got 0"),
        (lambda: Topology("t", ("g0", "sw"), (), ("g0",), (1.0,), reducing_switches="sw"),
         "reducing_switches must be a tuple of node names"),
        (lambda: simulate_ddp(model, switch(2, 1e9, 1e-6), overlap="no"),
         "overlap must be True or False"),
        (lambda: simulate_ddp(model, switch(2, 1e9, 1e-6), bucket_cap=math.nan),
         "the bucket cap must be an int >= 1 byte, got nan"),
        (lambda: simulate_fsdp(model, switch(2, 1e9, 1e-6), forward_prefetch="no"),
         "forward_prefetch must be True or False"),
        (lambda: simulate_fsdp(model, switch(2, 1e9, 1e-6), limit_all_gathers=1.5),
         "limit_all_gathers must be an int >= 1, got 1.5"),
    ]


@pytest.mark.parametrize("case", range(19))
def test_the_apis_bad_arguments_are_named_at_either_level(case) -> None:
    call, message = _bad_api_calls()[case]
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def _misuse_in_a_notebook():
    # Each was taken silently (a latency of True as 1 s, "no" as True, a negative length as
    # two odd chunks) or failed deep inside (AttributeError, ZeroDivisionError, IndexError).
    from algorithms import chunk_bounds, split_sizes
    from algorithms.nccl import rail_ring
    from algorithms.harness.model_presets import model_from_flops, preset_model
    from algorithms.models import Layer, Model
    from simcomm.presets import make_preset
    from simcomm.training import simulate_ddp
    from simcomm import Jitter
    from simcomm.variation import Distribution, Variation
    four, sizes = ring(4, 1e9, 1e-6), [SizeOnly(16)] * 4
    layer = Layer("a", (5,), 1e-3, 1e-3)
    return [
        (lambda: simulate(ring_allreduce, 4, four), "inputs must be a list of one buffer"),
        (lambda: simulate(ring_allreduce, iter(sizes), four), "got list_iterator"),
        (lambda: simulate(ring_allreduce, sizes, "ring"), "topology must be a simcomm.Topology"),
        (lambda: simulate(ring_allreduce, sizes, four, trace=5),
         "trace must be a path or an open text file"),
        (lambda: ring(4, 1e9, True), "latency must be seconds .a number. or a PerProtocol"),
        (lambda: switch(4, 1e9, "5us"), "latency must be seconds .a number. or a PerProtocol"),
        (lambda: ring(4, 1e9, 1e-6, reduce_bandwidth="1e9"), "reduce_bandwidth must be a number"),
        (lambda: ring(4, 1e9, 1e-6, reduce_bandwidth=True), "reduce_bandwidth must be a number"),
        (lambda: hierarchical(2, 2, 1e9, 1e-6, 1e9, 1e-6, nic_per_gpu="no"),
         "nic_per_gpu must be True or False"),
        (lambda: make_topology("hierarchical", "8", 1e9, 1e-6),
         "number of ranks must be an int >= 1, got '8'"),
        (lambda: Topology("t", ("a", "b"), (("a", "b", 1e9, 0.0),), ("a", "b"), (1.0, 1.0)),
         "links must be Link objects"),
        (lambda: Topology("t", ("a",), (), ("a",), ("fast",)),
         "rank 0 reduce bandwidth must be a number"),
        (lambda: Topology("t", ("a",), (), ("a",), 1e9), "one reduce bandwidth per rank"),
        (lambda: four.route(0, 9), "route from rank 0 to rank 9: the topology has ranks 0 to 3"),
        (lambda: four.route(-1, 0), "route from rank -1 to rank 0"),
        (lambda: four.egress_bandwidth(4), "egress bandwidth for rank 4"),
        (lambda: four.with_compute_speed([0.5]), "takes a dict of rank -> factor"),
        (lambda: make_preset(None), "a preset is named by a string"),
        (lambda: Model("m", (layer,), grad_bytes=2.5), "grad_bytes must be an int >= 1"),
        (lambda: Model("m", (layer,), grad_bytes=True), "grad_bytes must be an int >= 1"),
        (lambda: Model("m", (layer,), input_bytes=1.5), "input_bytes must be an int >= 0"),
        (lambda: Model("m", (("a", (5,), 0.0, 0.0),)), "layers must be Layer objects"),
        (lambda: Layer("a", (True,), 0.0, 0.0), "parameter sizes must be a tuple of ints"),
        (lambda: Layer("a", (5,), "1ms", 0.0), "forward_seconds must be a number of seconds"),
        (lambda: model_from_flops("x", [("a", (5,), 1e6)], 1, 0.0),
         "throughput must be a finite FLOP/s > 0"),
        (lambda: preset_model("resnet50", throughput="1e12"), "throughput must be a finite"),
        (lambda: simulate_ddp(None, four), "model must be an algorithms.models.Model"),
        (lambda: simulate_ddp(preset_model("resnet50"), "dgx-h100"),
         "topology must be a simcomm.Topology"),
        (lambda: chunk_bounds(-1, 2), "length must be an int >= 0, got -1"),
        (lambda: chunk_bounds(10, True), "parts must be an int >= 1, got True"),
        (lambda: split_sizes(np.arange(4), [2.5, 1.5]), "chunk sizes must be ints"),
        (lambda: Comm(True, 4), r"rank must be an int in \[0, 4\), got True"),
        (lambda: Comm(0, 4, tuner=5), "tuner must be callable"),
        # A progress callback that took no argument failed after 4,096 messages.
        (lambda: simulate(ring_allreduce, sizes, four, progress=lambda: None),
         "progress must be callable .* cannot take 1 argument"),
        (lambda: simulate(ring_allreduce, sizes, four, tuner=lambda collective: None),
         "tuner must be callable .* cannot take 2 arguments"),
        (lambda: Variation(0, message_delay="normal:1us,0.1us"),
         "message_delay must be a Distribution or None"),
        (lambda: Distribution("normal", "12"), "params must be a tuple of numbers"),
        (lambda: Jitter(-1, 1e-6), "Jitter.seed must be an int >= 0, got -1"),
        # rail_ring(Comm(0, 4, 2), -1) answered [1, 0, 3, 2].
        (lambda: rail_ring(Comm(0, 4, 2), -1), "rail_ring: channel must be an int >= 0"),
    ]


@pytest.mark.parametrize("case", range(len(_misuse_in_a_notebook())))
def test_misuse_of_the_api_is_named_not_taken_or_raised_from_deep_inside(case) -> None:
    call, message = _misuse_in_a_notebook()[case]
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_a_bound_past_the_clocks_range_bounds_nothing() -> None:
    sizes, four = [SizeOnly(16)] * 4, ring(4, 1e9, 1e-6)
    plain = simulate(ring_allreduce, sizes, four).time
    assert simulate(ring_allreduce, sizes, four, max_time=math.inf).time == plain
    assert simulate(ring_allreduce, sizes, four, max_time=1e300).time == plain
    with pytest.raises(TypeError, match="bandwidth must be a number, got True"):
        Link("a", "b", True, 1e-6)


def test_a_tuner_a_trace_and_keywords_are_checked_before_the_run(tmp_path) -> None:
    from algorithms import nccl_allreduce
    sizes, four = [SizeOnly(16)] * 4, ring(4, 1e9, 1e-6)
    with pytest.raises(TypeError, match="the tuner returned 5 for allreduce of 64 bytes, not "
                                        "a Choice"):
        simulate(nccl_allreduce, sizes, four, tuner=lambda collective, nbytes: 5)
    with pytest.raises(TypeError, match="ring_allreduce.. got unexpected keyword arguments "
                                        "chunks"):
        simulate(ring_allreduce, sizes, four, level="collective", chunks=2)
    with pytest.raises(ValueError, match="is a folder: name a file"):
        simulate(ring_allreduce, sizes, four, trace=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        simulate(ring_allreduce, sizes, four, trace=tmp_path / "no" / "trace.json")


# -- buffers an op cannot take ---------------------------------------------------------------

def _pair(send_view, recv_view):
    def algorithm(comm, x):
        if comm.rank == 0:
            yield Wait((yield Send(1, send_view(x))))
        elif comm.rank == 1:
            yield Wait((yield Recv(0, recv_view(x))))
        return x
    return algorithm


@pytest.mark.parametrize("send_view, recv_view", [
    (lambda x: x[:2], lambda x: x.reshape(2, 2)), (lambda x: x.reshape(2, 2), lambda x: x[:2]),
], ids=["fewer", "more"])
def test_a_2d_buffer_is_sized_by_its_elements_not_its_rows(send_view, recv_view) -> None:
    with pytest.raises(MessageSizeError, match=r"rank 1 posted a Recv of \d x float32 from rank 0"):
        run(_pair(send_view, recv_view))


def test_a_message_lands_whole_in_a_buffer_of_another_shape() -> None:
    results = run(_pair(lambda x: x, lambda x: x.reshape(2, 2))).results
    assert results[1].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("send_view, recv_view, message", [
    (lambda x: x[::2], lambda x: x[:2], r"rank 0 posted a Send to rank 1 .*non-contiguous"),
    (lambda x: x[:2], lambda x: x[::2], r"rank 1 posted a Recv from rank 0 .*non-contiguous"),
    (lambda x: x[0], lambda x: x[:1], r"rank 0 posted a Send to rank 1 .*element.*x\[i:i\+1\]"),
    (lambda x: x[:1], lambda x: x[1], r"rank 1 posted a Recv from rank 0 .*single element"),
    (lambda x: list(x), lambda x: x, r"rank 0 posted a Send to rank 1 .*a list: give a numpy"),
], ids=["strided-send", "strided-recv", "element-send", "element-recv", "list"])
def test_a_buffer_an_op_cannot_take_is_refused_when_posted(send_view, recv_view, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        run(_pair(send_view, recv_view))


def test_disjoint_strided_views_are_refused_not_taken_for_overlapping() -> None:
    def algorithm(comm, x):
        if comm.rank == 0:
            yield Wait((yield Send(1, x[::2])), (yield Send(1, x[1::2])))
        elif comm.rank == 1:
            yield Wait((yield Recv(0, x[:2])), (yield Recv(0, x[2:])))

    with pytest.raises(ProtocolError, match="rank 0 posted a Send to rank 1 .*non-contiguous"):
        run(algorithm)


@pytest.mark.parametrize("op, message", [
    (lambda x: Combine(x.reshape(2, 2), x[:2].copy(), SUM), r"rank 0 combined \(2,\) float32"),
    (lambda x: Copy(x[:2].copy(), x[::2]), "rank 0 posted a Copy .*non-contiguous"),
], ids=["combine-shape", "copy-strided"])
def test_a_copy_or_combine_refuses_buffers_that_would_broadcast_or_stride(op, message) -> None:
    def algorithm(comm, x):
        yield op(x)

    with pytest.raises(ProtocolError, match=message):
        run(algorithm)
