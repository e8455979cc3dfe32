from __future__ import annotations

import math

import torch

from checks import assert_check
from course_lib.exercises.model_parallel import check_bubble, check_min_micro_batches, check_row_parallel_partials


def test_bubble_check() -> None:
    def blank(p, m):
        raise NotImplementedError

    assert_check(
        check_bubble,
        right=[lambda p, m: (p - 1) / (m + p - 1)],
        not_done=[..., blank],
        wrong=[
            (lambda p, m: (p - 1) / m, "relative to busy time"),
            (lambda p, m: (p - 1) / p, "naive split"),
            (lambda p, m: "half", ""),
        ],
    )


def test_min_micro_check() -> None:
    def right(p, b):
        return max(1, math.ceil((p - 1) * (1 - b) / b - 1e-12))

    assert_check(
        check_min_micro_batches,
        right=[right],
        wrong=[
            (lambda p, b: right(p, b) + 1, ""),
            (lambda p, b: max(1, right(p, b) - 1), "too few"),
            (lambda p, b: float(right(p, b)), ""),
        ],
    )


def test_row_parallel_check() -> None:
    def right(x, weight, n):
        return [xk @ wk.T for xk, wk in zip(x.chunk(n, dim=1), weight.chunk(n, dim=1))]

    def column_split(x, weight, n):  # splits the outputs instead: wrong shapes
        return [x @ wk.T for wk in weight.chunk(n, dim=0)]

    def full_then_divide(x, weight, n):  # right sum, but no shard uses only its slice
        return [x @ weight.T / n for _ in range(n)]

    assert_check(
        check_row_parallel_partials,
        right=[right],
        not_done=[None],
        wrong=[
            (column_split, ""),
            (full_then_divide, "sum to the right output"),
            (lambda x, w, n: x @ w.T, ""),
            (lambda x, w, n: torch.zeros(1), ""),
        ],
    )
