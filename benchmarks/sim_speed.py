"""Simulator speed: messages per second of ``simulate`` against a bare simpy loop.

Both simulate ``ring_allreduce`` on a ring: every rank sends 2(p-1) messages to its right
neighbour, each costing ``alpha + chunk / bandwidth``. The bare loop does it in plain simpy
with no algorithm layer (a process per rank, a Store per rank as its mailbox, a Timeout per
transfer), so it is the floor of what simpy costs per message, and ``ours / bare`` says what
the op interpreter adds on top. Both are checked to send the same number of messages and to
end at the closed-form time 2(p-1)(alpha + n/(p*B)).

    python benchmarks/sim_speed.py [--ranks 256] [--repeats 3]

Each figure is the best (shortest) of ``repeats`` runs in this one process, the usual way to
time code: slower runs only add noise from whatever else the machine is doing. The variants
take turns (bare, ours, ours with the trace, and again), so that a busy spell of the machine
falls on all of them. Times are the
process's CPU time, which on a quiet machine equals wall time for this single-threaded work and
on a busy one leaves out the time other programs held the CPU.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Generator
from typing import Any, NoReturn

import simpy

from algorithms import ring_allreduce
from simcomm import SizeOnly, parse_bandwidth, parse_seconds, ring, simulate

BANDWIDTH_TEXT, LATENCY_TEXT = "100GB/s", "5us"
BANDWIDTH, LATENCY = parse_bandwidth(BANDWIDTH_TEXT), parse_seconds(LATENCY_TEXT)
DTYPE = "float32"
CHUNK_ELEMENTS = 1024  # per rank's chunk: 4 KiB messages, the latency-bound regime
TARGET_RATIO = 0.5  # ours / bare: the op layer may at most double simpy's cost per message


def _bare_rank(env: simpy.Environment, inbox: simpy.Store, outbox: simpy.Store, steps: int,
               transfer: float) -> Generator[simpy.Event, Any, int]:
    for step in range(steps):
        yield env.timeout(transfer)  # the message crosses the link...
        yield outbox.put(step)  # ...and lands in the right neighbour's mailbox
        yield inbox.get()  # this step ends when the left neighbour's message is here
    return steps


def bare_ring(ranks: int, transfer: float) -> tuple[int, float]:
    """The ring in plain simpy; returns (messages sent, simulated end time in seconds)."""
    env = simpy.Environment()
    mailboxes = [simpy.Store(env) for _ in range(ranks)]
    steps = 2 * (ranks - 1)
    processes = [env.process(_bare_rank(env, mailboxes[r], mailboxes[(r + 1) % ranks], steps,
                                        transfer))
                 for r in range(ranks)]
    env.run()
    return sum(process.value for process in processes), env.now


def ours(ranks: int, record: bool) -> tuple[int, float]:
    """``ring_allreduce`` through ``simulate`` on a fresh topology (so finding routes is
    part of the time); returns (messages sent, end time)."""
    topology = ring(ranks, BANDWIDTH, LATENCY)
    inputs = [SizeOnly(ranks * CHUNK_ELEMENTS, DTYPE) for _ in range(ranks)]
    result = simulate(ring_allreduce, inputs, topology, record=record)
    if record and len(result.sends()) != result.messages:
        raise AssertionError(f"trace holds {len(result.sends())} sends, "
                             f"but {result.messages} messages were counted")
    return result.messages, result.time


def timed(run: Callable[[], tuple[int, float]], messages: int, end_time: float, name: str
          ) -> float:
    """CPU time of one run, checked against the expected counts."""
    start = time.process_time()
    sent, end = run()
    took = time.process_time() - start
    if sent != messages:
        raise AssertionError(f"{name}: {sent} messages, expected {messages}")
    if not math.isclose(end, end_time, rel_tol=1e-9):
        raise AssertionError(f"{name}: ended at {end!r}s, closed form says {end_time!r}s")
    return took


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")  # one line, no usage dump


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print messages per second and the ratio to the bare loop."""
    parser = _Parser(prog="sim_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=_at_least(2), default=256, help="ring size (256)")
    parser.add_argument("--repeats", type=_at_least(1), default=3,
                        help="runs of each variant; the best is reported (3)")
    args = parser.parse_args(argv)

    p = args.ranks
    chunk_bytes = SizeOnly(CHUNK_ELEMENTS, DTYPE).nbytes
    transfer = LATENCY + chunk_bytes / BANDWIDTH
    messages = p * 2 * (p - 1)
    end_time = 2 * (p - 1) * transfer  # closed form; free reductions on this ring
    print(f"ring_allreduce, ring of {p} ranks, {chunk_bytes}-byte messages, {BANDWIDTH_TEXT}, "
          f"{LATENCY_TEXT}: {messages} messages, {end_time * 1e3:.4f} ms simulated; "
          f"best of {args.repeats} runs (CPU time)")

    # The variants take turns, so that a busy spell of the machine slows all of them alike.
    variants: dict[str, Callable[[], tuple[int, float]]] = {
        "bare simpy loop": lambda: bare_ring(p, transfer),
        "simulate(record=False)": lambda: ours(p, False),
        "simulate(record=True)": lambda: ours(p, True),
    }
    best = dict.fromkeys(variants, math.inf)
    for _ in range(args.repeats):
        for name, run in variants.items():
            best[name] = min(best[name], timed(run, messages, end_time, name))
    bare = best["bare simpy loop"]
    for name, took in best.items():
        ratio = "" if took is bare else f"  ours/bare {bare / took:.2f} (target >= {TARGET_RATIO})"
        print(f"{name:24} {messages / took:10.0f} messages/s  ({took:.3f} s){ratio}")

if __name__ == "__main__":
    main()
