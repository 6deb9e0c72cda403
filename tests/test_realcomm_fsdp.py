"""FSDP's schedule on a real model over gloo trains exactly as one process on the whole
batch does: same losses, same parameters, step after step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from algorithms.fsdp import BACKWARD_POST
from realcomm import spawn
from realcomm.fsdp import FullyShardedSequential

STEPS = 3
BATCH = 4  # per rank


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 15), torch.nn.LayerNorm(15),
        torch.nn.Tanh(), torch.nn.Linear(15, 3))


def global_batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(world * BATCH, 10, generator=generator),
             torch.randint(0, 3, (world * BATCH,), generator=generator))
            for _ in range(STEPS)]


def train_sharded(options: dict) -> tuple[list[float], list[list[float]]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    if rank != 0:  # replicas start apart: the shards must come from rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    sharded = FullyShardedSequential(model, **options)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    losses = []
    for inputs, targets in global_batches(world):
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        losses.append(sharded.train_step(inputs[mine], targets[mine],
                                         torch.nn.functional.cross_entropy))
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.reshape(-1).tolist() for p in sharded.full_parameters()]


def train_alone(world: int) -> tuple[list[float], list[torch.Tensor]]:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, targets in global_batches(world):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.detach().reshape(-1) for p in model.parameters()]


@pytest.mark.parametrize("world, options", [
    (2, {}),
    (3, {"forward_prefetch": True, "backward_prefetch": BACKWARD_POST}),
    (4, {"reshard_after_forward": False, "backward_prefetch": None, "limit_all_gathers": 1}),
])
def test_sharded_training_equals_one_process_on_the_whole_batch(world, options) -> None:
    results = spawn(train_sharded, world, (options,))
    expected_losses, expected_params = train_alone(world)
    for step, expected in enumerate(expected_losses):
        mean = sum(losses[step] for losses, _ in results) / world
        assert mean == pytest.approx(expected, abs=1e-6), f"step {step}"
    for rank, (_, params) in enumerate(results):
        for got, want in zip(params, expected_params):
            assert torch.tensor(got) == pytest.approx(want, abs=1e-6), f"rank {rank}"


def train_fully_shard() -> tuple[list[float], list[list[float]]]:
    """The same training with torch's own FSDP2 (``fully_shard``, one unit per layer)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inputs, targets in global_batches(world):
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        loss = torch.nn.functional.cross_entropy(model(inputs[mine]), targets[mine])
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.full_tensor().reshape(-1).tolist() for p in model.parameters()]


def test_sharded_training_equals_torch_fully_shard() -> None:
    pytest.importorskip("torch.distributed.fsdp", reason="needs torch's FSDP2")
    theirs = spawn(train_fully_shard, 2)
    ours = spawn(train_sharded, 2, ({"forward_prefetch": True},))
    for (our_losses, our_params), (their_losses, their_params) in zip(ours, theirs):
        assert our_losses == pytest.approx(their_losses, abs=1e-6)
        for got, want in zip(our_params, their_params):
            assert got == pytest.approx(want, abs=1e-6)


def evaluate_after_training() -> tuple[float, float, list[str], str]:
    rank, world = dist.get_rank(), dist.get_world_size()
    sharded = FullyShardedSequential(make_model())
    assert isinstance(sharded, torch.nn.Module)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    for inputs, targets in global_batches(world):
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        sharded.train_step(inputs[mine], targets[mine], torch.nn.functional.cross_entropy)
        optimizer.step()
        optimizer.zero_grad()
    # A plain copy of the module with the trained parameters, taken from the state dict.
    state = sharded.state_dict()
    plain = make_model()
    plain.load_state_dict(state)
    probe = torch.randn(5, 10, generator=torch.Generator().manual_seed(3))
    sharded.eval()
    with torch.no_grad():
        evaluated = (sharded(probe) - plain(probe)).abs().max().item()
    full = torch.cat([p.reshape(-1) for p in sharded.full_parameters()])
    stated = torch.cat([v.reshape(-1) for v in state.values()])
    sharded.train()
    try:
        sharded(probe)
        message = "no error"
    except RuntimeError as error:
        message = str(error)
    return evaluated, (full - stated).abs().max().item(), list(state), message


def test_it_is_a_module_that_evaluates_and_saves_its_current_parameters() -> None:
    keys = list(make_model().state_dict())
    for evaluated, stated, state_keys, message in spawn(evaluate_after_training, 2):
        assert evaluated == 0.0  # the trained parameters, not the ones of the last gather
        assert stated == 0.0
        assert state_keys == keys
        assert "trains through train_step" in message


@pytest.mark.parametrize(("options", "message"), [
    ({"limit_all_gathers": 0}, "limit_all_gathers must be an int >= 1, got 0"),
    ({"backward_prefetch": "sideways"}, "backward_prefetch must be 'pre', 'post' or None"),
])
def test_bad_options_are_refused_before_any_collective(options: dict, message: str) -> None:
    # Used to pass the constructor (a driver and a broadcast per unit) and fail at the
    # first train_step. Refused before the driver: no process group is needed to see it.
    with pytest.raises(ValueError, match=message):
        FullyShardedSequential(make_model(), **options)
