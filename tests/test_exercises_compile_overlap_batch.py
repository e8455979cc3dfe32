from __future__ import annotations

import math

import pytest

from checks import assert_check
from course_lib.exercises.compile_overlap_batch import (
    check_ddp_optimizer_graphs,
    check_exposed_comm,
    check_exposed_wait,
    check_scaled_lr,
    ddp_optimizer_graphs,
    exposed_comm,
    exposed_wait,
    scaled_lr,
)

MB = 1_050_624


def _blank(*args: object) -> object:
    raise NotImplementedError


def _graphs(layers: list[int], cap: int, first: int = 2**20) -> int:
    buckets, size, limit = [], 0, first
    for b in reversed(layers):
        size += b
        if size >= limit:
            buckets.append(size)
            size, limit = 0, cap
    return len(buckets) + (1 if size else 0)


def test_ddp_optimizer_graphs() -> None:
    # the counts the notebook measured: default cap 2 graphs, bucket_cap_mb=2 5 graphs, bucket_cap_mb=4 3 graphs
    assert ddp_optimizer_graphs([MB] * 8, 25 * 2**20) == 2
    assert ddp_optimizer_graphs([MB] * 8, 2 * 2**20) == 5
    assert ddp_optimizer_graphs([MB] * 8, 4 * 2**20) == 3
    assert ddp_optimizer_graphs([], 2**20) == 0
    with pytest.raises(TypeError):
        ddp_optimizer_graphs("8 layers", 2**20)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ddp_optimizer_graphs([MB], 0)
    assert_check(
        check_ddp_optimizer_graphs,
        right=[_graphs, ddp_optimizer_graphs],
        not_done=[_blank, ...],
        wrong=[
            (lambda layers, cap, first: _graphs(layers, cap, cap), "first_bucket_cap_bytes"),
            (lambda layers, cap, first: _graphs(layers[::-1], cap, first), "backwards"),
            (lambda layers, cap, first: _graphs(layers, cap, first) - 1, "never reached its cap"),
            (lambda layers, cap, first: len(layers), "close the bucket"),
            (lambda layers, cap, first: "2", "return a number"),
        ],
    )


def _lr(step: int, lr: float, b0: int, b: int, rule: str, warm: int) -> float:
    k = b / b0
    peak = lr * (k if rule == "linear" else math.sqrt(k) if rule == "sqrt" else 1.0)
    return peak * (min(1.0, (step + 1) / warm) if warm else 1.0)


def test_scaled_lr() -> None:
    assert scaled_lr(0, 0.1, 32, 512, "linear", 4) == pytest.approx(0.4)
    assert scaled_lr(3, 0.1, 32, 512, "linear", 4) == pytest.approx(1.6)
    assert scaled_lr(10, 1e-3, 32, 512, "sqrt") == pytest.approx(4e-3)
    assert scaled_lr(10, 1e-3, 32, 512, "none") == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        scaled_lr(0, 0.1, 32, 512, "cubic")
    with pytest.raises(ValueError):
        scaled_lr(-1, 0.1, 32, 512, "linear")
    with pytest.raises(TypeError):
        scaled_lr(0, "0.1", 32, 512, "linear")  # type: ignore[arg-type]
    assert_check(
        check_scaled_lr,
        right=[_lr, scaled_lr],
        not_done=[_blank, ...],
        wrong=[
            (lambda s, lr, b0, b, rule, w: _lr(s, lr, b0, b, "linear" if rule == "sqrt" else rule, w), "sqrt"),
            (
                lambda s, lr, b0, b, rule, w: _lr(s, lr, b0, b, "none" if rule == "linear" else rule, w),
                "linear scaling",
            ),
            (lambda s, lr, b0, b, rule, w: _lr(s, lr, b0, b, rule, 0), "still growing"),
            (lambda s, lr, b0, b, rule, w: _lr(s, lr, b0, b, rule, 0) * (min(1.0, s / w) if w else 1.0), "step 0"),
            (lambda s, lr, b0, b, rule, w: lr * 2, "expected"),
        ],
    )


def _wait(backward: list[float], comm: list[float]) -> float:
    t, link = 0.0, 0.0
    for b, c in zip(backward, comm):
        t += b
        link = max(t, link) + c
    return max(0.0, link - t)


def test_exposed_wait() -> None:
    assert exposed_wait([30, 30, 30, 30], [6, 6, 6, 6]) == 6
    assert exposed_wait([5, 5], [20, 20]) == 35
    assert exposed_wait([], []) == 0
    with pytest.raises(ValueError):
        exposed_wait([1, 2], [1])
    with pytest.raises(TypeError):
        exposed_wait("30", [6])  # type: ignore[arg-type]
    assert_check(
        check_exposed_wait,
        right=[_wait, exposed_wait],
        not_done=[_blank, ...],
        wrong=[
            (lambda b, c: sum(c), "without overlap"),
            (lambda b, c: c[-1], "waits for the one before it"),
            (lambda b, c: max(0.0, max(sum(b[: i + 1]) + x for i, x in enumerate(c)) - sum(b)), "one link"),
            (lambda b, c: 1.0, "expected"),
        ],
    )


def test_exposed_comm() -> None:
    assert exposed_comm([(0, 4), (6, 8)], [(3, 7), (7.5, 10)]) == 4.0
    assert exposed_comm([], [(1, 2), (1.5, 3)]) == 2.0
    with pytest.raises(ValueError, match="ends before it starts"):
        exposed_comm([], [(3, 1)])

    def no_merge(compute, comm):  # subtracts, but counts overlapping intervals twice
        return sum(b - a for a, b in comm) - sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in compute)

    assert_check(
        check_exposed_comm,
        right=[exposed_comm],
        not_done=[_blank, ...],
        wrong=[
            (lambda compute, comm: sum(b - a for a, b in comm), "subtract what compute covers"),
            (no_merge, "merge them first"),
            (lambda compute, comm: 0.0, "expected"),
        ],
    )
