"""The DDP communication hook: torch's DistributedDataParallel with ``allreduce_hook``
averaging its buckets by our algorithms gives the parameters and buffers of DDP's own
all-reduce, step after step, with BatchNorm buffers, gradient accumulation under
``no_sync`` and parameters that take no part in the loss."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from algorithms import nccl_allreduce, reduce_broadcast_allreduce, ring_channels
from realcomm import spawn
from realcomm.ddp import HookState, allreduce_hook

STEPS = 3
BATCH = 6


class Net(torch.nn.Module):
    """BatchNorm (buffers DDP broadcasts) and a head that never takes part in the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.BatchNorm1d(24),
                                        torch.nn.ReLU(), torch.nn.Linear(24, 3))
        self.unused = torch.nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _train(algorithm: str) -> float:
    allreduce = {"reduce_broadcast": reduce_broadcast_allreduce,
                 "nccl": nccl_allreduce}[algorithm]
    rank = dist.get_rank()
    models = [Net(), Net()]
    if rank != 0:  # replicas start apart: DDP hands both rank 0's parameters
        with torch.no_grad():
            for model in models:
                for p in model.parameters():
                    p.add_(0.5)
    ours, theirs = (DistributedDataParallel(m, bucket_cap_mb=0.001,
                                            find_unused_parameters=True) for m in models)
    state = HookState(allreduce, channels=ring_channels(dist.get_world_size()))
    ours.register_comm_hook(state, allreduce_hook)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        micro = [(torch.randn(BATCH, 10, generator=generator),
                  torch.randint(0, 3, (BATCH,), generator=generator)) for _ in range(2)]
        for model in (ours, theirs):
            with model.no_sync():  # the first micro-batch only accumulates
                loss_fn(model(micro[0][0]), micro[0][1]).backward()
            loss_fn(model(micro[1][0]), micro[1][1]).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    state.close()
    pairs = list(zip(ours.module.state_dict().values(), theirs.module.state_dict().values()))
    return max((a.float() - b.float()).abs().max().item() for a, b in pairs)


@pytest.mark.parametrize(("ranks", "algorithm"), [(2, "reduce_broadcast"), (3, "nccl")])
def test_ddp_with_the_hook_matches_ddp(ranks, algorithm) -> None:
    differences = spawn(_train, ranks, (algorithm,), timeout=120)
    # The sums are the same but added in another order: a float32 rounding apart.
    assert max(differences) < 1e-5, differences


def test_the_state_refuses_what_is_not_an_algorithm() -> None:
    with pytest.raises(TypeError, match="allreduce must be an algorithm"):
        HookState("ring_allreduce", driver=object())  # type: ignore[arg-type]
