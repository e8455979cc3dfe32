from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.context_expert_parallelism import (
    check_a2a_send_counts,
    check_ring_forward_bytes,
    check_ulysses_forward_bytes,
)


def _blank(*args: object) -> object:
    raise NotImplementedError


def _ring(b: int, h: int, s: int, d: int, n: int, p: int) -> int:
    return 2 * (n - 1) * b * h * (s // n) * d * p


def test_ring_forward_bytes() -> None:
    assert_check(
        check_ring_forward_bytes,
        right=[_ring, lambda *a: float(_ring(*a)), lambda *a: torch.tensor(_ring(*a))],
        right_says="2 (n - 1) blocks",
        not_done=[_blank, ...],
        wrong=[
            (lambda b, h, s, d, n, p: _ring(b, h, s, d, n, p) // 2, "keys AND values"),
            (lambda b, h, s, d, n, p: 2 * n * b * h * (s // n) * d * p, "n - 1 steps"),
            (lambda b, h, s, d, n, p: 2 * b * h * (s // n) * d * p, "that is one step"),
            (lambda b, h, s, d, n, p: 2 * (n - 1) * b * h * s * d * p, "seq_len / n"),
            (lambda b, h, s, d, n, p: 7, "count the blocks"),
            (lambda b, h, s, d, n, p: "a lot", "should return a number"),
        ],
    )


def _ulysses(b: int, h: int, kv: int, s: int, d: int, n: int, p: int) -> int:
    return (n - 1) * (2 * h + 2 * kv) * b * (s // n) * d * p // n


def test_ulysses_forward_bytes() -> None:
    assert_check(
        check_ulysses_forward_bytes,
        right=[_ulysses, lambda *a: float(_ulysses(*a)), lambda *a: torch.tensor(_ulysses(*a))],
        right_says="(n - 1)/n of q, k, v and the output",
        not_done=[_blank, ...],
        wrong=[
            (lambda b, h, kv, s, d, n, p: (2 * h + 2 * kv) * b * (s // n) * d * p, "own 1/n at home"),
            (lambda b, h, kv, s, d, n, p: _ulysses(b, h, h, s, d, n, p), "kv_heads heads"),
            (lambda b, h, kv, s, d, n, p: (n - 1) * (h + 2 * kv) * b * (s // n) * d * p // n, "a fourth all-to-all"),
            (lambda b, h, kv, s, d, n, p: (n - 1) * (2 * h + 2 * kv) * b * (s // n) * d * p, "seq_len / n"),
            (lambda b, h, kv, s, d, n, p: 7, "count what leaves"),
            (lambda b, h, kv, s, d, n, p: "a lot", "should return a number"),
        ],
    )


def _counts(experts: torch.Tensor, kept: torch.Tensor, n_experts: int, n_ranks: int) -> list[int]:
    per = n_experts // n_ranks
    owner = experts[kept] // per
    return [int((owner == r).sum()) for r in range(n_ranks)]


def test_a2a_send_counts() -> None:
    def no_kept(experts, kept, n_experts, n_ranks):  # noqa: ANN001, ANN202
        return _counts(experts, torch.ones_like(kept), n_experts, n_ranks)

    def round_robin(experts, kept, n_experts, n_ranks):  # noqa: ANN001, ANN202
        return [int(((experts[kept] % n_ranks) == r).sum()) for r in range(n_ranks)]

    def tokens(experts, kept, n_experts, n_ranks):  # noqa: ANN001, ANN202
        per = n_experts // n_ranks
        return [int(((experts // per == r) & kept).any(1).sum()) for r in range(n_ranks)]

    assert_check(
        check_a2a_send_counts,
        right=[_counts, lambda *a: torch.tensor(_counts(*a)), lambda *a: tuple(_counts(*a))],
        right_says="input_split_sizes",
        not_done=[_blank, ...],
        wrong=[
            (no_kept, "dropped assignments"),
            (round_robin, "placed in blocks"),
            (tokens, "count assignments, not tokens"),
            (lambda e, k, ne, nr: [0] * nr, "expected"),
            (lambda e, k, ne, nr: [1], "one count per rank"),
        ],
    )
