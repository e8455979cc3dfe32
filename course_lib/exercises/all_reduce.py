"""Checks for notebook 09 (data parallelism and all-reduce)."""

from __future__ import annotations

from typing import Any

from ..allreduce_sim import parameter_server_bytes_formula, ring_bytes_formula
from ..comm_model import AlphaBeta, predict_all_reduce
from ..validation import is_int
from .core import NotDone, Wrong, as_number, call_learner, dict_answer, exercise, is_placeholder

__all__ = ["COLLECTIVE_TASKS", "check_collective_choice", "check_ring_bytes", "check_ring_schedule", "check_ring_time"]


@exercise("ring traffic", todo="write ring_bytes(nbytes, n): the bytes each worker sends in a ring all-reduce")
def check_ring_bytes(fn: Any) -> str:
    for nbytes, n in [(1200, 2), (1200, 3), (4096, 4), (10**6, 8), (1000, 1)]:
        got = as_number(call_learner(fn, nbytes, n), f"ring_bytes({nbytes}, {n})")
        want = ring_bytes_formula(nbytes, n)
        if abs(got - want) > 1e-6 * max(1.0, want):
            if abs(got - want / 2) < 1e-6 * max(1.0, want) and n > 1:
                raise Wrong("that is one phase only: the ring runs scatter-reduce AND all-gather, N-1 steps each")
            if abs(got - parameter_server_bytes_formula(nbytes, n)["server"]) < 1e-6 * max(1.0, want) and n > 1:
                raise Wrong(
                    "that is what a parameter server's link carries; in a ring each step moves one chunk of S/N"
                )
            raise Wrong(f"ring_bytes({nbytes}, {n}) = {got}: count the steps (2(N-1)) and the size of one chunk (S/N)")
    return "2(N-1)/N x S per worker: it approaches 2S, and does not grow with N"


def _simulate_schedule(fn: Any, n: int) -> list[list[frozenset[int]]]:
    have = [[frozenset({w}) for _ in range(n)] for w in range(n)]
    for s in range(n - 1):
        sends = []
        for i in range(n):
            c = call_learner(fn, i, s, n)
            if not is_int(c) or not 0 <= c < n:
                raise Wrong(f"send_chunk({i}, {s}, {n}) returned {c!r}: it must be a chunk index in 0..{n - 1}")
            sends.append((i, (i + 1) % n, c, have[i][c]))
        for _src, dst, c, contrib in sends:
            have[dst][c] = have[dst][c] | contrib
    return have


@exercise(
    "ring schedule",
    todo="write send_chunk(worker, step, n): which chunk a worker sends to its right neighbour in scatter-reduce",
)
def check_ring_schedule(fn: Any) -> str:
    if is_placeholder(fn):
        raise NotDone
    for n in (2, 3, 4, 5, 8):
        have = _simulate_schedule(fn, n)
        everyone = frozenset(range(n))
        complete = {c for w in range(n) for c in range(n) if have[w][c] == everyone}
        if complete != set(range(n)):
            constant = all(call_learner(fn, 0, s, n) == call_learner(fn, 0, 0, n) for s in range(n - 1))
            if constant and n > 2:
                raise Wrong(
                    "a worker sends the same chunk at every step: it should pass on the chunk it has just "
                    "received and added to (the chunk index moves back by one each step)"
                )
            raise Wrong(
                f"with {n} workers, after {n - 1} steps chunks {sorted(set(range(n)) - complete)} are not fully "
                "summed anywhere: worker i should send the chunk it received at the previous step"
            )
    return "after N-1 steps every chunk is fully summed on exactly one worker, ready for the all-gather"


COLLECTIVE_TASKS = {
    "every rank needs the average loss of all ranks to log it": "all_reduce",
    "rank 0 alone collects each rank's accuracy tensor, one per rank, to save them": "gather",
    "rank 0 loaded the checkpoint and every other rank needs its weights": "broadcast",
    "each rank should end with its own 1/N shard of the summed gradient": "reduce_scatter",
    "every rank needs every rank's list of predictions": "all_gather",
    "rank 0 must not read a file until rank 1 has finished writing it": "barrier",
}
_NAMES = {"broadcast", "reduce", "all_reduce", "gather", "all_gather", "reduce_scatter", "barrier", "scatter"}


@exercise("choose the collective", todo="fill `choices`: for each task in COLLECTIVE_TASKS, the collective's name")
def check_collective_choice(choices: Any) -> str:
    dict_answer(choices, COLLECTIVE_TASKS, name="choices")
    for task, want in COLLECTIVE_TASKS.items():
        got = choices[task]
        name = str(got).replace("dist.", "").replace("torch.distributed.", "").strip().lower()
        if name not in _NAMES:
            raise Wrong(f"{got!r} is not one of the collectives: {sorted(_NAMES)}")
        if name != want:
            raise Wrong(f"for {task!r}, {name} is not the best fit: who has the inputs, and who needs the result?")
    return "each task uses the one collective whose inputs and outputs fit it"


_RING_TIME_CASES = [(4 * 2**20, 2, 30e-6, 2e9), (100e6, 8, 5e-6, 450e9), (65536, 64, 5e-6, 50e9), (1000, 1, 1e-5, 1e9)]


@exercise("ring time", todo="write ring_time(nbytes, n, alpha, beta): the alpha-beta model's time of a ring all-reduce")
def check_ring_time(fn: Any) -> str:
    for nbytes, n, alpha, beta in _RING_TIME_CASES:
        got = as_number(call_learner(fn, nbytes, n, alpha, beta), f"ring_time({nbytes}, {n}, {alpha}, {beta})")
        link = AlphaBeta(alpha=alpha, beta=beta)
        want = predict_all_reduce(link, nbytes, n, "ring")
        if abs(got - want) <= 1e-9 * max(1.0, want) + 1e-15:
            continue
        steps = 2 * (n - 1)

        def close(x: float, got: float = got) -> bool:
            return abs(got - x) <= 1e-6 * max(abs(x), 1e-12)

        if close(steps * nbytes / n / beta):
            raise Wrong("that is the bandwidth term alone: every one of the 2(N-1) steps also pays alpha")
        if close(want / 2):
            raise Wrong("that is one phase only: scatter-reduce AND all-gather, N-1 steps each")
        if close(steps * (alpha + nbytes / beta)):
            raise Wrong("each step of the ring sends one chunk of S/N bytes, not the whole S")
        if close(alpha + nbytes / beta):
            raise Wrong("that is one message of S bytes; the ring is 2(N-1) messages of S/N, one after the other")
        raise Wrong(
            f"ring_time({nbytes}, {n}, {alpha}, {beta}) = {got:.6g} s, expected {want:.6g} s: "
            "add up 2(N-1) steps of alpha + (S/N)/beta"
        )
    return "2(N-1) alpha + 2(N-1)/N S/beta: latency grows with N, bandwidth hardly does"
