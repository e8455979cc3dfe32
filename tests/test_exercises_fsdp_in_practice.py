from __future__ import annotations

import pytest
import torch

from checks import assert_check
from course_lib.exercises.fsdp_in_practice import (
    block_gather_bytes,
    check_block_gather_bytes,
    check_collectives_per_step,
    check_float8_scales,
    collectives_per_step,
)
from course_lib.transformer import PRESETS


def _blank(*args: object) -> object:
    raise NotImplementedError


def _right(n: int, m: int, sync: bool) -> dict[str, int]:
    return {"all_gather": m * (2 * n + 3), "reduce_scatter": (n + 2) * (m if sync else 1)}


def test_collectives_per_step() -> None:
    assert collectives_per_step(2, 2) == {"all_gather": 14, "reduce_scatter": 8}
    assert collectives_per_step(2, 2, sync_every_micro_batch=False)["reduce_scatter"] == 4
    with pytest.raises(ValueError):
        collectives_per_step(2, 0)
    with pytest.raises(ValueError):
        collectives_per_step(10**7, 2)
    assert_check(
        check_collectives_per_step,
        right=[_right, lambda n, m, s: collectives_per_step(n, m, sync_every_micro_batch=s)],
        not_done=[_blank, ...],
        wrong=[
            (lambda n, m, s: {**_right(n, m, s), "all_gather": m * (2 * n + 4)}, "not gathered again in backward"),
            (lambda n, m, s: {**_right(n, m, s), "all_gather": m * (2 * n + 1)}, "units of their own"),
            (lambda n, m, s: {**_right(n, m, s), "all_gather": m * (n + 2)}, "gathered twice"),
            (lambda n, m, s: {**_right(n, m, s), "all_gather": 2 * n + 3}, "gathers again"),
            (lambda n, m, s: {**_right(n, m, s), "reduce_scatter": (n + 2) * m}, "last micro-batch only"),
            (lambda n, m, s: {**_right(n, m, s), "reduce_scatter": n + 2}, "each micro-batch reduce-scatters"),
            (lambda n, m, s: {**_right(n, m, s), "reduce_scatter": n * (m if s else 1)}, "reduce-scatter too"),
            (lambda n, m, s: {**_right(n, m, s), "reduce_scatter": (n + 3) * (m if s else 1)}, "root has no parameter"),
            (lambda n, m, s: {"all_gather": 1}, "keys"),
            (lambda n, m, s: {**_right(n, m, s), "all_gather": "10"}, "return a number"),
        ],
    )


def _bytes(config: object, dtype: torch.dtype) -> int:
    c = config
    d, f = c.d_model, c.d_ff  # type: ignore[attr-defined]
    kv = c.kv_heads * c.head_dim  # type: ignore[attr-defined]
    return (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) * torch.empty((), dtype=dtype).element_size()


def test_block_gather_bytes() -> None:
    assert block_gather_bytes(PRESETS["tiny"], torch.float32) == _bytes(PRESETS["tiny"], torch.float32)
    with pytest.raises(TypeError):
        block_gather_bytes("tiny", torch.float32)  # type: ignore[arg-type]
    size = lambda dt: torch.empty((), dtype=dt).element_size()  # noqa: E731
    assert_check(
        check_block_gather_bytes,
        right=[_bytes, block_gather_bytes],
        not_done=[_blank, ...],
        wrong=[
            (lambda c, dt: _bytes(c, dt) * 4 // size(dt), "4 bytes per parameter"),
            (lambda c, dt: _bytes(c, dt) - 2 * c.d_model * size(dt), "norm weights"),
            (lambda c, dt: _bytes(c, dt) // size(dt), "number of parameters"),
            (lambda c, dt: _bytes(c, dt) // 2 + 1, "count every parameter"),
        ],
    )


def _scales(x: torch.Tensor, recipe: str) -> torch.Tensor:
    top = torch.finfo(torch.float8_e4m3fn).max
    return x.abs().max() / top if recipe == "tensorwise" else x.abs().amax(dim=1, keepdim=True) / top


def test_float8_scales() -> None:
    assert_check(
        check_float8_scales,
        right=[_scales],
        not_done=[_blank, ...],
        wrong=[
            (lambda x, r: x.abs().max() / 448 if r == "tensorwise" else x.abs().amax(dim=1) / 448, "as a column"),
            (lambda x, r: x.abs().max() / 448, "rowwise: the scale should have shape (6, 1)"),
            (lambda x, r: x.abs().max() if r == "tensorwise" else x.abs().amax(dim=1, keepdim=True), "peaks at 1"),
            (lambda x, r: x.max() / 448 if r == "tensorwise" else x.amax(dim=1, keepdim=True) / 448, "exactly 448"),
            (lambda x, r: 1.0, "tensor of scales"),
        ],
    )
