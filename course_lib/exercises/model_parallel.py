"""Checks for notebook 13 (model and pipeline parallelism)."""

from __future__ import annotations

from typing import Any

import torch

from ..pipeline import bubble_fraction, min_micro_batches
from ..validation import is_int
from .core import Wrong, as_number, call_learner, exercise

__all__ = ["check_bubble", "check_min_micro_batches", "check_row_parallel_partials"]

_PAIRS = [(1, 1), (1, 5), (2, 1), (2, 4), (3, 2), (4, 4), (4, 16), (8, 32)]


@exercise(
    "bubble fraction",
    todo="write bubble(p, m) returning the idle fraction of a GPipe step with p stages and m micro-batches",
)
def check_bubble(bubble: Any) -> str:
    for p, m in _PAIRS:
        got = as_number(call_learner(bubble, p, m), f"bubble({p}, {m})")
        want = bubble_fraction(p, m)
        if abs(got - want) > 1e-9:
            hint = ""
            if m > 0 and abs(got - (p - 1) / m) < 1e-9:
                hint = " - that is idle time relative to busy time; divide by the whole step, m + p - 1 slots"
            elif abs(got - (p - 1) / p) < 1e-9:
                hint = " - that is the naive split (m = 1); micro-batches shrink the bubble"
            raise Wrong(f"bubble({p}, {m}) = {got:.4f}, expected {want:.4f}{hint}")
    return "(p - 1) / (m + p - 1): each stage works m of the m + p - 1 slots of the step"


@exercise(
    "micro-batches for a target bubble",
    todo="write fewest_micro(p, max_bubble) returning the smallest m whose GPipe bubble is at most max_bubble",
)
def check_min_micro_batches(fewest_micro: Any) -> str:
    for p, target in [(2, 0.5), (2, 0.2), (2, 0.1), (4, 0.25), (4, 0.1), (8, 0.05), (1, 0.01)]:
        got = call_learner(fewest_micro, p, target)
        if not is_int(got):
            raise Wrong(f"fewest_micro({p}, {target}) should return an int, got {got!r}")
        want = min_micro_batches(p, target)
        if got != want:
            hint = (
                " (too many: a smaller m already meets the target)"
                if got > want
                else " (too few: the bubble is still above the target)"
            )
            raise Wrong(f"fewest_micro({p}, {target}) = {got}, expected {want}{hint}")
    return (
        "m >= (p - 1)(1 - b) / b, rounded up: the bubble falls like 1/m, so each halving costs twice the micro-batches"
    )


@exercise(
    "row-parallel Linear",
    todo="write partials(x, weight, n) returning the n partial outputs of a Linear split by input features",
)
def check_row_parallel_partials(partials: Any) -> str:
    g = torch.Generator().manual_seed(0)
    for batch, d_in, d_out, n in [(3, 8, 5, 2), (4, 12, 6, 3), (2, 6, 4, 1)]:
        x = torch.randn(batch, d_in, generator=g)
        weight = torch.randn(d_out, d_in, generator=g)
        got = call_learner(partials, x, weight, n)
        if not isinstance(got, (list, tuple)) or len(got) != n:
            raise Wrong(f"with n={n} shards, return a list of {n} tensors (one partial output per shard)")
        if not all(isinstance(t, torch.Tensor) and t.shape == (batch, d_out) for t in got):
            raise Wrong(f"each partial output should be a tensor of shape ({batch}, {d_out}): batch x out_features")
        xs, ws = x.chunk(n, dim=1), weight.chunk(n, dim=1)
        total = torch.stack(list(got)).sum(dim=0)
        for k, (xk, wk, t) in enumerate(zip(xs, ws, got)):
            if not torch.allclose(t, xk @ wk.T, atol=1e-5):
                hint = ""
                if torch.allclose(total, x @ weight.T, atol=1e-5):
                    hint = (
                        " (they sum to the right output, but shard k must use only input features k of n:"
                        " x.chunk(n, dim=1))"
                    )
                raise Wrong(f"partial output {k} of {n} is not x[:, shard {k}] @ weight[:, shard {k}].T{hint}")
        if not torch.allclose(total, x @ weight.T, atol=1e-5):
            raise Wrong("the partial outputs do not sum to x @ weight.T")
    return (
        "each shard multiplies its slice of the inputs by its slice of the weight's columns; "
        "an all-reduce (sum) gives the output"
    )
