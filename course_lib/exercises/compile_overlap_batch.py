"""Checks for notebook 20 (torch.compile with DDP, overlap measured, batch size and learning rate)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..validation import check_int, check_number
from .core import Wrong, as_number, call_learner, exercise

__all__ = [
    "RULES",
    "check_ddp_optimizer_graphs",
    "check_exposed_comm",
    "check_exposed_wait",
    "check_scaled_lr",
    "ddp_optimizer_graphs",
    "exposed_comm",
    "exposed_wait",
    "scaled_lr",
]

RULES = ("none", "linear", "sqrt")


def ddp_optimizer_graphs(layer_bytes: Sequence[int], bucket_cap_bytes: int, first_bucket_cap_bytes: int = 2**20) -> int:
    """The graphs DDPOptimizer cuts a compiled DDP model into: walking the layers backwards, each
    layer's parameter bytes join the current bucket, which closes as soon as it reaches its cap
    (``first_bucket_cap_bytes`` for the first bucket, DDP's default 1 MiB; ``bucket_cap_bytes`` after).

    >>> ddp_optimizer_graphs([1_050_624] * 8, 25 * 2**20), ddp_optimizer_graphs([1_050_624] * 8, 2 * 2**20)
    (2, 5)
    """
    if isinstance(layer_bytes, (str, bytes)) or not isinstance(layer_bytes, Sequence):
        raise TypeError("layer_bytes must be a sequence of byte counts, one per layer in forward order")
    sizes = [check_int("each layer's bytes", b, minimum=0) for b in layer_bytes]
    cap = check_int("bucket_cap_bytes", bucket_cap_bytes, minimum=1)
    first = check_int("first_bucket_cap_bytes", first_bucket_cap_bytes, minimum=1)
    graphs, current = 0, 0
    for size in reversed(sizes):
        current += size
        if current >= (first if graphs == 0 else cap):
            graphs, current = graphs + 1, 0
    return graphs + (current > 0)


def scaled_lr(step: int, base_lr: float, base_batch: int, batch: int, rule: str, warmup_steps: int = 0) -> float:
    """The learning rate at optimizer step ``step`` (0-based) for ``batch``, scaled from ``base_lr`` at
    ``base_batch`` by ``rule`` (``"none"``, ``"linear"``: times ``batch/base_batch``, ``"sqrt"``: times its
    square root), with a linear warmup over the first ``warmup_steps`` steps (times ``(step+1)/warmup_steps``).

    >>> scaled_lr(0, 0.1, 32, 512, "linear", 4), scaled_lr(10, 1e-3, 32, 512, "sqrt")
    (0.4, 0.004)
    """
    step = check_int("step", step, minimum=0)
    base_lr = float(check_number("base_lr", base_lr, finite=True))
    base_batch = check_int("base_batch", base_batch, minimum=1)
    batch = check_int("batch", batch, minimum=1)
    warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    k = batch / base_batch
    peak = base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
    return peak * min(1.0, (step + 1) / warmup_steps) if warmup_steps else peak


def exposed_wait(backward_ms: Sequence[float], allreduce_ms: Sequence[float]) -> float:
    """How long a DDP step waits after backward, with overlap: layer ``i``'s backward (in the order backward
    runs them, last layer first) takes ``backward_ms[i]``, then its bucket's all-reduce, ``allreduce_ms[i]``,
    starts as soon as both the bucket is ready and the previous all-reduce is done (one link, one at a time).

    >>> exposed_wait([30, 30, 30, 30], [6, 6, 6, 6]), exposed_wait([5, 5], [20, 20])
    (6.0, 35.0)
    """
    for name, seq in (("backward_ms", backward_ms), ("allreduce_ms", allreduce_ms)):
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a sequence of milliseconds")
    if len(backward_ms) != len(allreduce_ms):
        raise ValueError(f"one all-reduce per layer: got {len(backward_ms)} layers and {len(allreduce_ms)} all-reduces")
    ready = link_free = 0.0
    for b, c in zip(backward_ms, allreduce_ms):
        ready += float(check_number("each backward time", b, finite=True))
        link_free = max(ready, link_free) + float(check_number("each all-reduce time", c, finite=True))
    return max(0.0, link_free - ready) if backward_ms else 0.0


MB = 1_050_624  # one Linear(512, 512): the layer of the notebook's DDP model


@exercise(
    "DDPOptimizer's graphs",
    todo="write ddp_optimizer_graphs(layer_bytes, bucket_cap_bytes, first_bucket_cap_bytes=2**20)",
)
def check_ddp_optimizer_graphs(fn: Any) -> str:
    cases: list[tuple[list[int], int, int]] = [
        ([MB] * 8, 2 * 2**20, 2 * 2**20),
        ([MB] * 8, 25 * 2**20, 2**20),
        ([MB] * 8, 2 * 2**20, 2**20),
        ([MB] * 8, 4 * 2**20, 2**20),
        ([2_000_000, 300_000, 300_000, 300_000], 2**20, 2**20),
        ([10] * 5, 2**20, 2**20),
    ]
    for layers, cap, first in cases:
        call = f"ddp_optimizer_graphs(<{len(layers)} layers>, {cap:,}, {first:,})"
        got = as_number(call_learner(fn, list(layers), cap, first), call)
        want = ddp_optimizer_graphs(layers, cap, first)
        if got == want:
            continue
        if got == ddp_optimizer_graphs(layers, cap, cap):
            raise Wrong(f"{call} = {got:g}: the first bucket (the last layers) closes at first_bucket_cap_bytes")
        if got == ddp_optimizer_graphs(layers[::-1], cap, first):
            raise Wrong(f"{call} = {got:g}: walk the layers backwards, the last layer's gradient is ready first")
        if got == want - 1 and sum(layers) > 0:
            raise Wrong(f"{call} = {got:g}: the layers left in a bucket that never reached its cap make a graph too")
        raise Wrong(f"{call} = {got:g}; add each layer's bytes, close the bucket once it reaches the cap")
    return "one graph per bucket, counted from the last layer, with DDP's default 1 MiB first bucket"


@exercise(
    "learning rate for a larger batch",
    todo="write scaled_lr(step, base_lr, base_batch, batch, rule, warmup_steps)",
)
def check_scaled_lr(fn: Any) -> str:
    cases = [
        (0, 0.02, 32, 512, "linear", 0),
        (5, 0.02, 32, 512, "none", 0),
        (0, 1e-3, 32, 512, "sqrt", 0),
        (0, 0.1, 32, 512, "linear", 4),
        (1, 0.1, 32, 512, "linear", 4),
        (3, 0.1, 32, 512, "linear", 4),
        (100, 0.1, 32, 512, "linear", 4),
        (2, 1e-3, 64, 256, "sqrt", 10),
        (0, 1e-3, 64, 64, "linear", 0),
    ]
    for step, lr, b0, b, rule, warm in cases:
        call = f"scaled_lr({step}, {lr}, {b0}, {b}, {rule!r}, {warm})"
        got = as_number(call_learner(fn, step, lr, b0, b, rule, warm), call)
        want = scaled_lr(step, lr, b0, b, rule, warm)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        k = b / b0
        if rule == "sqrt" and math.isclose(got, want * math.sqrt(k), rel_tol=1e-9):
            raise Wrong(f"{call} = {got:g}: square-root scaling multiplies by sqrt(batch/base_batch), not the ratio")
        if rule == "linear" and math.isclose(got, want / k, rel_tol=1e-9):
            raise Wrong(f"{call} = {got:g}: linear scaling multiplies the rate by batch/base_batch")
        if warm and math.isclose(got, scaled_lr(step, lr, b0, b, rule, 0), rel_tol=1e-9):
            raise Wrong(f"{call} = {got:g}: during the first warmup_steps steps the rate is still growing")
        if warm and math.isclose(got, want * warm / (step + 1) * step / warm, rel_tol=1e-9):
            raise Wrong(f"{call} = {got:g}: step 0 is the first step, its rate is peak * 1 / warmup_steps")
        raise Wrong(f"{call} = {got:g}, expected {want:g}")
    return "peak = base_lr x (1, k or sqrt(k)); warmup multiplies it by (step + 1) / warmup_steps"


@exercise("the wait after backward, with overlap", todo="write exposed_wait(backward_ms, allreduce_ms)")
def check_exposed_wait(fn: Any) -> str:
    cases: list[tuple[list[float], list[float]]] = [
        ([30, 30, 30, 30], [6, 6, 6, 6]),
        ([5, 5], [20, 20]),
        ([10, 1, 1, 10], [4, 15, 2, 3]),
        ([30, 30, 30], [1, 1, 50]),
        ([8], [3]),
    ]
    for backward, comm in cases:
        call = f"exposed_wait({backward}, {comm})"
        got = as_number(call_learner(fn, list(backward), list(comm)), call)
        want = exposed_wait(backward, comm)
        if math.isclose(got, want, abs_tol=1e-9):
            continue
        if math.isclose(got, sum(comm)):
            raise Wrong(f"{call} = {got:g} is the wait without overlap: each all-reduce starts when its layer is done")
        if math.isclose(got, comm[-1]):
            raise Wrong(f"{call} = {got:g}: an all-reduce waits for the one before it (one link), which may end late")
        ends = [sum(backward[: i + 1]) + c for i, c in enumerate(comm)]
        if math.isclose(got, max(0.0, max(ends) - sum(backward))):
            raise Wrong(f"{call} = {got:g}: the all-reduces share one link, so they run one after the other")
        raise Wrong(f"{call} = {got:g}, expected {want:g}")
    return "each all-reduce starts when its bucket is ready and the link is free; the step waits for the last"


def exposed_comm(compute: Sequence[Sequence[float]], comm: Sequence[Sequence[float]]) -> float:
    """How long communication runs while nothing computes: the length of the union of the ``comm`` intervals
    (start, end) minus the union of the ``compute`` intervals, as read from a trace (notebook 20 §8).

    >>> exposed_comm([(0, 4), (6, 8)], [(3, 7), (7.5, 10)])
    4.0
    """

    def union(iv: Sequence[Sequence[float]]) -> list[list[float]]:
        out: list[list[float]] = []
        for a, b in sorted((float(check_number("start", p[0])), float(check_number("end", p[1]))) for p in iv):
            if b < a:
                raise ValueError(f"an interval ends before it starts: ({a}, {b})")
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out

    busy, left = union(compute), 0.0
    for a, b in union(comm):
        covered = sum(max(0.0, min(b, d) - max(a, c)) for c, d in busy)
        left += (b - a) - covered
    return left


_COMM_CASES: list[tuple[list[tuple[float, float]], list[tuple[float, float]]]] = [
    ([(0, 4), (6, 8)], [(3, 7), (7.5, 10)]),
    ([(0, 10)], [(2, 3)]),
    ([], [(1, 2), (1.5, 3)]),
    ([(0, 1), (0.5, 2)], [(1, 5)]),
    ([(2, 3)], [(0, 1)]),
]


@exercise("communication not hidden by compute", todo="write exposed_comm(compute, comm)")
def check_exposed_comm(fn: Any) -> str:
    for compute, comm in _COMM_CASES:
        got = as_number(call_learner(fn, list(compute), list(comm)), "exposed_comm")
        want = exposed_comm(compute, comm)
        if compute and math.isclose(got, sum(b - a for a, b in comm)) and not math.isclose(got, want):
            raise Wrong(f"compute {compute}, comm {comm}: {got} is all the communication; subtract what compute covers")
        if not math.isclose(got, want, abs_tol=1e-9):
            hint = " (overlapping intervals count once: merge them first)" if len(comm) > 1 or len(compute) > 1 else ""
            raise Wrong(f"compute {compute}, comm {comm}: expected {want}, got {got}{hint}")
    return "merge each kind first, then subtract: what a trace calls exposed communication"
