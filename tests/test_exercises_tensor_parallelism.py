"""The checks of notebook 17's exercises accept right answers and name the mistake in wrong ones."""

from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.tensor_parallelism import LINEAR_LAYERS, check_block_tp_bytes, check_parallel_styles

RIGHT = {
    "q_proj": "column",
    "k_proj": "column",
    "v_proj": "column",
    "o_proj": "row",
    "gate_proj": "column",
    "up_proj": "column",
    "down_proj": "row",
}


def _blank(*args: object) -> object:
    raise NotImplementedError


def test_parallel_styles() -> None:
    swapped = {k: "row" if v == "column" else "column" for k, v in RIGHT.items()}
    assert_check(
        check_parallel_styles,
        right=[RIGHT, {**RIGHT, "extra": "ignored"}],
        right_says="row-parallel o and down",
        not_done=[..., None, {name: ... for name in LINEAR_LAYERS}],
        wrong=[
            (swapped, "every answer is swapped"),
            ({**RIGHT, "k_proj": "row"}, "k_proj"),
            ({**RIGHT, "o_proj": "column"}, "o_proj"),
            ({**RIGHT, "gate_proj": "row"}, "SwiGLU"),
            ({**RIGHT, "down_proj": "column"}, "down_proj"),
            ({**RIGHT, "q_proj": "col"}, 'answer "column" or "row"'),
            ({"q_proj": "column"}, "no answer for"),
            (["column"] * 7, "should be a dict"),
        ],
    )


def _block(t: int, h: int, n: int, p: int) -> float:
    return 4 * 2 * (n - 1) / n * t * h * p


def test_block_tp_bytes() -> None:
    assert_check(
        check_block_tp_bytes,
        right=[_block, lambda *a: round(_block(*a)), lambda *a: torch.tensor(_block(*a))],
        right_says="4 all-reduces",
        not_done=[_blank, ...],
        wrong=[
            (lambda t, h, n, p: _block(t, h, n, p) / 2, "f backward"),  # forward only
            (lambda t, h, n, p: 4 * (n - 1) / n * t * h * p, "reduce-scatter plus an all-gather"),  # (n - 1)/n
            (lambda t, h, n, p: 4 * t * h * p, "2 (n - 1)/n of the tensor"),
            (lambda t, h, n, p: 2 * _block(t, h, n, p), "one all-reduce per sub-layer"),
            (lambda t, h, n, p: _block(t, h, n, p) + 1000, "expected"),
            (lambda t, h, n, p: "many", "should return a number"),
        ],
    )
