from __future__ import annotations

import math

import torch

from course_lib.exercises.model_parallel import check_bubble, check_min_micro_batches, check_row_parallel_partials


def test_bubble_check() -> None:
    assert check_bubble(lambda p, m: (p - 1) / (m + p - 1)).status == "correct"
    assert check_bubble(...).status == "not done yet"

    def blank(p, m):
        raise NotImplementedError

    assert check_bubble(blank).status == "not done yet"
    wrong = check_bubble(lambda p, m: (p - 1) / m)
    assert wrong.status == "wrong" and "relative to busy time" in wrong.message
    naive = check_bubble(lambda p, m: (p - 1) / p)
    assert naive.status == "wrong" and "naive split" in naive.message
    assert check_bubble(lambda p, m: "half").status == "wrong"


def test_min_micro_check() -> None:
    def right(p, b):
        return max(1, math.ceil((p - 1) * (1 - b) / b - 1e-12))

    assert check_min_micro_batches(right).status == "correct"
    assert check_min_micro_batches(lambda p, b: right(p, b) + 1).status == "wrong"
    short = check_min_micro_batches(lambda p, b: max(1, right(p, b) - 1))
    assert short.status == "wrong" and "too few" in short.message
    assert check_min_micro_batches(lambda p, b: float(right(p, b))).status == "wrong"


def test_row_parallel_check() -> None:
    def right(x, weight, n):
        return [xk @ wk.T for xk, wk in zip(x.chunk(n, dim=1), weight.chunk(n, dim=1))]

    assert check_row_parallel_partials(right).status == "correct"

    def column_split(x, weight, n):  # splits the outputs instead: wrong shapes
        return [x @ wk.T for wk in weight.chunk(n, dim=0)]

    assert check_row_parallel_partials(column_split).status == "wrong"

    def full_then_divide(x, weight, n):  # right sum, but no shard uses only its slice
        return [x @ weight.T / n for _ in range(n)]

    r = check_row_parallel_partials(full_then_divide)
    assert r.status == "wrong" and "sum to the right output" in r.message
    assert check_row_parallel_partials(lambda x, w, n: x @ w.T).status == "wrong"
    assert check_row_parallel_partials(lambda x, w, n: torch.zeros(1)).status == "wrong"
    assert check_row_parallel_partials(None).status == "not done yet"
