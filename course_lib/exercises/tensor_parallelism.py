"""Checks for notebook 17 (tensor and sequence parallelism)."""

from __future__ import annotations

import math
from typing import Any

from ..tensor_parallel import COLUMN_PARALLEL, ROW_PARALLEL, collective_bytes
from .core import Wrong, as_number, call_learner, dict_answer, exercise

__all__ = ["LINEAR_LAYERS", "check_block_tp_bytes", "check_parallel_styles"]

_STYLE = {name.split(".")[-1]: "column" for name in COLUMN_PARALLEL} | {
    name.split(".")[-1]: "row" for name in ROW_PARALLEL
}
LINEAR_LAYERS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@exercise("column or row", todo='give "column" or "row" for each linear layer of LINEAR_LAYERS')
def check_parallel_styles(answer: Any) -> str:
    answer = dict_answer(answer, LINEAR_LAYERS, name="answer")
    for name in LINEAR_LAYERS:
        if answer[name] not in ("column", "row"):
            raise Wrong(f'{name}: answer "column" or "row", got {answer[name]!r}')
    got = {name: answer[name] for name in LINEAR_LAYERS}
    if got == {k: ("row" if v == "column" else "column") for k, v in _STYLE.items()}:
        raise Wrong(
            "every answer is swapped: a column-parallel layer splits its *outputs* (each rank computes some "
            "output features), which is how q, k, v and the MLP's first projections hand whole heads and "
            "slices of d_ff to each rank"
        )
    for name in ("q_proj", "k_proj", "v_proj"):
        if got[name] != "column":
            raise Wrong(
                f"{name}: for a rank to hold whole heads, it computes only its heads' outputs: split by columns"
            )
    if got["o_proj"] != "row":
        raise Wrong(
            "o_proj: its input is the heads' outputs, which each rank holds for its heads only: split it by "
            "rows (inputs), and the partial sums are added by g"
        )
    for name in ("gate_proj", "up_proj"):
        if got[name] != "column":
            raise Wrong(
                f"{name}: SwiGLU multiplies gate and up elementwise; splitting both by columns keeps each "
                "rank's slice of d_ff local"
            )
    if got["down_proj"] != "row":
        raise Wrong("down_proj: its input is the slice of d_ff each rank computed: split it by rows")
    return "column-parallel q, k, v, gate, up; row-parallel o and down: one all-reduce (g) per sub-layer"


# (tokens, d_model, n, p): the tiny model's 2 x 64 tokens, Llama 3 8B's 8,192 in bf16 on 8 ranks, and odd sizes
BLOCK_CASES: list[tuple[int, int, int, int]] = [
    (128, 64, 2, 4),
    (8192, 4096, 8, 2),
    (4096, 5120, 4, 2),
    (30, 12, 3, 8),
    (64, 16, 1, 4),
]


@exercise("a block's tensor-parallel bytes", todo="write block_tp_bytes(tokens, d_model, n, p)")
def check_block_tp_bytes(fn: Any) -> str:
    for t, h, n, p in BLOCK_CASES:
        call = f"block_tp_bytes({t}, {h}, {n}, {p})"
        got = as_number(call_learner(fn, t, h, n, p), call)
        act = t * h * p
        one = collective_bytes("all_reduce", act, n)
        want = 4 * one
        if math.isclose(got, want, rel_tol=1e-12, abs_tol=0.5):
            continue
        if n > 1 and math.isclose(got, 2 * one):
            raise Wrong(
                f"{call}: half the bytes. g runs forward (after attention, after the MLP) and f backward (before "
                "them): 4 all-reduces, and a ring all-reduce is a reduce-scatter plus an all-gather, 2 (n - 1)/n of "
                "the tensor"
            )
        if n > 1 and math.isclose(got, 4 * act):
            raise Wrong(f"{call}: a ring all-reduce sends 2 (n - 1)/n of the tensor per rank, not the tensor once")
        if n > 1 and math.isclose(got, 8 * one):
            raise Wrong(
                f"{call}: one all-reduce per sub-layer and direction: g after attention and after the MLP forward, "
                "f before them backward, 4 in all"
            )
        raise Wrong(f"{call} returned {got:,.0f}, expected {want:,}: count the all-reduces of tokens x d_model values")
    llama = 4 * collective_bytes("all_reduce", 8192 * 4096 * 2, 8)
    return (
        f"4 all-reduces of tokens x d_model x p, each 2 (n - 1)/n of it: {llama / 2**20:,.0f} MiB per block and step "
        "for Llama 3 8B's 8,192 tokens in bf16 on 8 ranks"
    )
