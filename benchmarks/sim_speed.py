"""Simulator speed: messages per second of ``simulate`` against bare simpy loops.

All simulate ``ring_allreduce`` on a ring: every rank sends 2(p-1) messages to its right
neighbour, each costing ``alpha + chunk / bandwidth``. The bare loops do it in plain simpy
with no algorithm layer, a process per rank: the Store loop as simpy's documentation
writes message passing (a Store per rank as its mailbox, a Timeout per transfer, a put and
a get per message), the lean loop as lean as simpy allows (one Timeout per message, a bare
Event only when a rank must wait for its neighbour's message, a counter otherwise). All are
checked to send the same number of messages and to end at the closed-form time
2(p-1)(alpha + n/(p*B)). "The algorithm alone" runs ``ring_allreduce``'s generators with no
interpreter at all (every op sent back as its own result): what any interpreter of the
ops pays before it does anything.

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

from algorithms import Comm, Send, ring_allreduce
from simcomm import SizeOnly, parse_bandwidth, parse_seconds, ring, simulate

BANDWIDTH_TEXT, LATENCY_TEXT = "100GB/s", "5us"
BANDWIDTH, LATENCY = parse_bandwidth(BANDWIDTH_TEXT), parse_seconds(LATENCY_TEXT)
DTYPE = "float32"
CHUNK_ELEMENTS = 1024  # per rank's chunk: 4 KiB messages, the latency-bound regime


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


def lean_ring(ranks: int, transfer: float) -> tuple[int, float]:
    """The ring in the leanest simpy: returns (messages sent, simulated end time)."""
    env = simpy.Environment()
    steps = 2 * (ranks - 1)
    landed = [0] * ranks  # messages at each rank not yet taken
    waiting: list[simpy.Event | None] = [None] * ranks  # a rank's wait for its next message

    def rank(r: int) -> Generator[simpy.Event, Any, int]:
        right = (r + 1) % ranks
        for _ in range(steps):
            yield env.timeout(transfer)
            wake, waiting[right] = waiting[right], None
            if wake is not None:
                wake.succeed()
            else:
                landed[right] += 1
            if landed[r]:
                landed[r] -= 1
            else:
                waiting[r] = env.event()
                yield waiting[r]
        return steps

    processes = [env.process(rank(r)) for r in range(ranks)]
    env.run()
    return sum(process.value for process in processes), env.now


def algorithm_alone(ranks: int) -> tuple[int, float]:
    """``ring_allreduce``'s generators driven with no interpreter; returns (sends yielded,
    nan: no clock)."""
    sends = 0
    for rank in range(ranks):
        schedule = ring_allreduce(Comm(rank, ranks), SizeOnly(ranks * CHUNK_ELEMENTS, DTYPE))
        value = None
        try:
            while True:
                value = schedule.send(value)
                sends += type(value) is Send
        except StopIteration:
            pass
    return sends, math.nan


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
    if not math.isnan(end) and not math.isclose(end, end_time, rel_tol=1e-9):
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
        "bare simpy, Store loop": lambda: bare_ring(p, transfer),
        "bare simpy, lean loop": lambda: lean_ring(p, transfer),
        "the algorithm alone": lambda: algorithm_alone(p),
        "simulate(record=False)": lambda: ours(p, False),
        "simulate(record=True)": lambda: ours(p, True),
    }
    best = dict.fromkeys(variants, math.inf)
    for _ in range(args.repeats):
        for name, run in variants.items():
            best[name] = min(best[name], timed(run, messages, end_time, name))
    store, lean = best["bare simpy, Store loop"], best["bare simpy, lean loop"]
    print(f"{'':24} {'messages/s':>10} {'seconds':>8} {'x Store loop':>13} {'x lean loop':>12}")
    for name, took in best.items():
        print(f"{name:24} {messages / took:10.0f} {took:8.3f} {store / took:13.2f} "
              f"{lean / took:12.2f}")

if __name__ == "__main__":
    main()
