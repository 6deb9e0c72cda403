"""How NCCL connects two ranks for sends and receives, shown with torch's own sends and receives.

NCCL connects a pair of ranks of a communicator at their first send or receive to each
other, inside the call that posts it. realcomm's driver connects every pair of every channel
when it starts (``Driver._connect_every_pair``); these two ranks show why, each case with and
without connecting first:

``mismatched``: rank 1's first batch with rank 0 holds a send and a receive, rank 0's holds
only the receive (its send follows in a second batch), as a tree's leaf and root post.

``crossed``: two communicators; rank 0 posts on the first, then the second, rank 1 the other
way round, as two channels of a tree whose roots differ.

Needs two GPUs, or one GPU with NCCL 2.30 or newer and ``NCCL_MULTI_RANK_GPU_ENABLE=1``. A
case that hangs does not return: run each under a time limit.

    timeout 40 python benchmarks/nccl_connect.py mismatched
    timeout 40 python benchmarks/nccl_connect.py mismatched --connect-first
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from realcomm import spawn


def connect(group: object, peer: int, device: torch.device) -> None:
    """Both ways to ``peer`` in one batch, which both ranks post alike."""
    ops = [dist.P2POp(dist.isend, torch.zeros(1, device=device), peer, group=group),
           dist.P2POp(dist.irecv, torch.empty(1, device=device), peer, group=group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def mismatched(connect_first: bool) -> float:
    """Rank 1 sends rank 0 a 1, rank 0 adds 1 and sends it back: both ranks end with 2."""
    rank, device = dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    group = dist.new_group([0, 1])
    dist.barrier(group=group)
    peer = 1 - rank
    if connect_first:
        connect(group, peer, device)
    up, down = torch.ones(1, device=device), torch.empty(1, device=device)
    if rank == 1:
        ops = [dist.P2POp(dist.isend, up, 0, group=group),
               dist.P2POp(dist.irecv, down, 0, group=group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return float(down.item())
    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, down, 1, group=group)]):
        work.wait()
    down += 1
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, down, 1, group=group)]):
        work.wait()
    return float(down.item())


def crossed(connect_first: bool) -> float:
    """Each rank sends the other its rank + 1 on one communicator and receives on the other;
    what it received."""
    rank, device = dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    for group in groups:
        dist.barrier(group=group)
    peer = 1 - rank
    if connect_first:
        for group in groups:
            connect(group, peer, device)
    mine, theirs = torch.full((1,), rank + 1.0, device=device), torch.empty(1, device=device)
    # Rank 0 receives on the first communicator and sends on the second; rank 1 does the
    # mirror image, posting on the second first.
    first, second = (dist.P2POp(dist.irecv, theirs, peer, group=groups[0]),
                     dist.P2POp(dist.isend, mine, peer, group=groups[1]))
    if rank == 1:
        first, second = (dist.P2POp(dist.irecv, theirs, peer, group=groups[1]),
                         dist.P2POp(dist.isend, mine, peer, group=groups[0]))
    works = dist.batch_isend_irecv([first]) + dist.batch_isend_irecv([second])
    for work in works:
        work.wait()
    return float(theirs.item())


CASES = {"mismatched": (mismatched, [2.0, 2.0]), "crossed": (crossed, [2.0, 1.0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--connect-first", action="store_true",
                        help="connect the pair both ways before the case's own batches")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("nccl_connect.py: this machine has no CUDA device", file=sys.stderr)
        return 1
    case, expected = CASES[args.case]
    try:
        got = spawn(case, 2, (args.connect_first,), device="cuda", timeout=30.0)
    except Exception as error:  # noqa: BLE001 - the point is to print what NCCL did
        print(f"{args.case} connect_first={args.connect_first}: failed: {error}")
        return 1
    verdict = "right" if got == expected else f"WRONG (expected {expected})"
    print(f"{args.case} connect_first={args.connect_first}: ranks got {got}: {verdict}")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
