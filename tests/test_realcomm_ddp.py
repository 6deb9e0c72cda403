"""DDP's bucketed all-reduce on a real model over gloo gives the parameters that torch's own
DistributedDataParallel gives, step after step, on the same data and seed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from algorithms import alltoall_allreduce, reduce_broadcast_allreduce, ring_allreduce
from algorithms.collectives import Schedule
from algorithms.ops import SUM, Alloc, Comm, Copy, ReduceOp
from realcomm import Driver, spawn
from realcomm.ddp import BucketedAllreduce

STEPS = 4
BATCH = 8


def ring_allreduce_of_a_copy(comm: Comm, x: Any, op: ReduceOp = SUM) -> Schedule:
    """The right average, returned in a buffer of its own; the bucket is left as it was
    (DDP stepped on unaveraged gradients with it)."""
    work = yield Alloc(len(x), x)
    yield Copy(work, x)
    return (yield from ring_allreduce(comm, work, op))


def allreduce_returning_nothing(comm: Comm, x: Any, op: ReduceOp = SUM) -> Schedule:
    work = yield Alloc(len(x), x)
    yield Copy(work, x)
    yield from ring_allreduce(comm, work, op)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 32), torch.nn.LayerNorm(32), torch.nn.Tanh(),
        torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(BATCH, 10, generator=generator),
             torch.randint(0, 3, (BATCH,), generator=generator)) for _ in range(STEPS)]


def train_both(allreduce_name: str, bucket_cap: int) -> tuple[float, list[float]]:
    """Train our DDP and torch's side by side on this rank's batches; return the largest
    parameter difference between them and our final parameters, flattened."""
    allreduce = {"ring": ring_allreduce, "reduce_broadcast": reduce_broadcast_allreduce,
                 "alltoall": alltoall_allreduce, "copy": ring_allreduce_of_a_copy,
                 }[allreduce_name]
    ours, theirs = make_model(), make_model()
    if dist.get_rank() != 0:  # replicas start apart: both must take rank 0's parameters
        with torch.no_grad():
            for model in (ours, theirs):
                for p in model.parameters():
                    p.add_(1.0)
    sync = BucketedAllreduce(ours, Driver(), bucket_cap=bucket_cap, first_bucket_cap=256,
                             allreduce=allreduce)
    assert len(sync.buckets) > 2
    reference = DistributedDataParallel(theirs)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, reference)]
    loss_fn = torch.nn.CrossEntropyLoss()
    for inputs, targets in batches(dist.get_rank()):
        loss_fn(ours(inputs), targets).backward()
        sync.finish()
        loss_fn(reference(inputs), targets).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    sync.close()
    difference = max((a - b).abs().max().item()
                     for a, b in zip(ours.parameters(), theirs.parameters()))
    flat = torch.cat([p.detach().view(-1) for p in ours.parameters()])
    return difference, flat.tolist()


@pytest.mark.parametrize("nprocs, allreduce_name", [(2, "ring"), (4, "ring"),
                                                    (3, "reduce_broadcast"), (4, "alltoall"),
                                                    (2, "copy")])
def test_parameters_equal_torch_ddp(nprocs: int, allreduce_name: str) -> None:
    results = spawn(train_both, nprocs, (allreduce_name, 2048))
    for rank, (difference, _) in enumerate(results):
        assert difference < 1e-5, f"rank {rank} is {difference} from torch DDP"
    first = results[0][1]
    for _, flat in results[1:]:  # the replicas stay identical
        assert flat == pytest.approx(first, abs=1e-6)


def unused_parameter() -> str:
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 4), "unused": torch.nn.Linear(4, 4)})
    sync = BucketedAllreduce(model, Driver(), bucket_cap=64, first_bucket_cap=64)
    model["used"](torch.ones(2, 4)).sum().backward()
    try:
        sync.finish()
    except RuntimeError as error:
        return str(error)
    finally:
        sync.close()
    return "no error"


def returns_nothing() -> str:
    model = torch.nn.Linear(4, 4)
    sync = BucketedAllreduce(model, Driver(), allreduce=allreduce_returning_nothing)
    model(torch.ones(2, 4)).sum().backward()
    try:
        sync.finish()
    except ValueError as error:
        return str(error)
    finally:
        sync.close()
    return "no error"


def test_an_allreduce_that_returns_no_average_is_named() -> None:
    for message in spawn(returns_nothing, 2):
        assert ("'allreduce_returning_nothing' returned NoneType for a bucket of (20,) "
                "torch.float32: an all-reduce returns the averaged buffer") in message, message


def test_a_parameter_without_gradient_is_reported_not_hung() -> None:
    for message in spawn(unused_parameter, 2):
        assert "without a gradient" in message


def test_model_from_module_reads_parameters_and_times_layers() -> None:
    from realcomm.models import model_from_module

    module = make_model()
    sample = torch.randn(BATCH, 10)
    model = model_from_module(module, sample, name="mlp", repeats=3)
    assert model.name == "mlp"
    assert [layer.name for layer in model.layers] == ["0", "1", "2", "3", "4", "5"]
    assert [layer.params for layer in model.layers] == [
        (320, 32), (32, 32), (), (1024, 32), (), (96, 3)]
    assert model.param_count == sum(p.numel() for p in module.parameters())
    assert all(layer.forward_seconds > 0 and layer.backward_seconds > 0
               for layer in model.layers if layer.params)
    assert model.input_bytes == BATCH * 10 * 4 and model.output_bytes == BATCH * 3 * 4
    assert all(p.grad is None for p in module.parameters())  # left as it was found


def batchnorm_buffers_and_a_missed_finish() -> tuple[float, str]:
    rank = dist.get_rank()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                          torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    ours, theirs = models
    sync = BucketedAllreduce(ours, Driver(), bucket_cap=256, first_bucket_cap=64)
    reference = DistributedDataParallel(theirs)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, reference)]
    generator = torch.Generator().manual_seed(7 + rank)
    for _ in range(3):
        inputs = torch.randn(BATCH, 6, generator=generator)
        ours(inputs).square().mean().backward()
        sync.finish()
        reference(inputs).square().mean().backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    # The running statistics too: both broadcast rank 0's before each forward.
    difference = max((a.float() - b.float()).abs().max().item()
                     for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    ours(inputs).sum().backward()
    try:
        ours(inputs).sum().backward()  # no finish() between the two
        message = "no error"
    except RuntimeError as error:
        message = str(error)
    sync.close()
    return difference, message


def test_buffers_follow_ddp_and_a_missed_finish_says_so() -> None:
    for difference, message in spawn(batchnorm_buffers_and_a_missed_finish, 2):
        assert difference < 1e-5
        assert "call finish() after every backward" in message


def test_an_allreduce_that_is_not_an_algorithm_is_refused_at_once() -> None:
    # Used to be taken, and fail on the comm thread at the first backward. Refused before
    # the driver is used: no process group is needed to see it.
    with pytest.raises(TypeError, match="allreduce must be an algorithm .*, got 5"):
        BucketedAllreduce(torch.nn.Linear(4, 4), None, allreduce=5)  # type: ignore[arg-type]
