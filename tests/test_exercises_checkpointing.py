from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint_sequential

from checks import assert_check
from course_lib.exercises.checkpointing import (
    check_bn_momentum,
    check_bn_safe_forward,
    check_optimizer_state_bytes,
    check_sac_policy,
    check_sqrt_checkpointing,
)


def _blank(*args: object) -> object:
    raise NotImplementedError


def test_bn_momentum() -> None:
    assert_check(
        check_bn_momentum,
        right=[lambda m: 1 - math.sqrt(1 - m), lambda m: torch.tensor(1 - math.sqrt(1 - m), dtype=torch.float64)],
        not_done=[_blank, ...],
        wrong=[
            (lambda m: math.sqrt(m), "OLD value"),
            (lambda m: math.sqrt(1 - m), "NEW one"),
            (lambda m: m / 2, "close for small m"),
            (lambda m: m, "returned 0.1"),
            (lambda m: "0.05", "return a number"),
            (lambda m: 1 / 0, "ZeroDivisionError"),
        ],
    )


def test_sqrt_checkpointing() -> None:
    def under_no_grad(model, x):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return model(x)

    assert_check(
        check_sqrt_checkpointing,
        right=[lambda model, x: checkpoint_sequential(model, 8, x, use_reentrant=False)],
        right_says="lower",
        not_done=[_blank],
        wrong=[
            (lambda model, x: checkpoint_sequential(model, 8, x), "use_reentrant"),
            (lambda model, x: model(x), "only"),  # no checkpointing: no saving
            (lambda model, x: checkpoint_sequential(model, 64, x, use_reentrant=False), "only"),  # too many segments
            (lambda model, x: model[:32](x), "differs"),
            (lambda model, x: 3, "output tensor"),
            (under_no_grad, "no_grad"),
        ],
    )


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_optimizer_state_bytes() -> None:
    def good(model: torch.nn.Module, name: str) -> int:
        n = _numel(model) * 4
        return {"sgd": 0, "sgd_momentum": n, "adam": 2 * n + 4 * len(list(model.parameters()))}[name]

    def no_steps(model: torch.nn.Module, name: str) -> int:
        n = _numel(model) * 4
        return {"sgd": 0, "sgd_momentum": n, "adam": 2 * n}[name]

    def all_same(model: torch.nn.Module, name: str) -> int:
        return _numel(model) * 4

    assert_check(
        check_optimizer_state_bytes,
        right=[good],
        not_done=[_blank],
        wrong=[(no_steps, "step"), (all_same, "'sgd'"), (lambda model, name: 1.5, "int")],
    )


def test_sac_policy() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    def right(ctx, op, *args, **kwargs):  # type: ignore[no-untyped-def]
        return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE

    def prefer(ctx, op, *args, **kwargs):  # type: ignore[no-untyped-def]
        return CheckpointPolicy.PREFER_SAVE if op in matmuls else CheckpointPolicy.MUST_RECOMPUTE

    def inverted(ctx, op, *args, **kwargs):  # type: ignore[no-untyped-def]
        return CheckpointPolicy.PREFER_RECOMPUTE if op in matmuls else CheckpointPolicy.MUST_SAVE

    assert_check(
        check_sac_policy,
        right=[right, prefer],
        right_says="products are saved",
        not_done=[_blank],
        wrong=[
            (lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE, "matrix products were recomputed"),
            (lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE, "nothing was recomputed"),
            (inverted, "matrix products were recomputed"),
            (lambda ctx, op, *a, **k: "save", "CheckpointPolicy"),
            (lambda ctx, op, *a, **k: 1 / 0, "ZeroDivisionError"),
        ],
    )


def test_bn_safe_forward() -> None:
    from contextlib import nullcontext

    from torch.utils.checkpoint import checkpoint

    from course_lib.checkpointing import checkpoint_bn_safe, frozen_bn_stats

    def momentum_fix(block, x):  # type: ignore[no-untyped-def]
        block[1].momentum = 1 - math.sqrt(0.9)
        return checkpoint(block, x, use_reentrant=False)

    assert_check(
        check_bn_safe_forward,
        right=[
            checkpoint_bn_safe,
            lambda b, x: checkpoint(b, x, use_reentrant=False, context_fn=lambda: (nullcontext(), frozen_bn_stats(b))),
        ],
        right_says="running statistics equal",
        not_done=[_blank],
        wrong=[
            (lambda b, x: checkpoint(b, x, use_reentrant=False), "num_batches_tracked is 10"),
            (momentum_fix, "momentum"),
            (lambda b, x: b(x), "not checkpointed"),
            (lambda b, x: checkpoint(b, x, use_reentrant=True), "use_reentrant=False"),
            (lambda b, x: b(x).detach(), "does not require grad"),
            (lambda b, x: 2, "output tensor"),
        ],
    )
