from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint_sequential

from course_lib.exercises.checkpointing import check_bn_momentum, check_optimizer_state_bytes, check_sqrt_checkpointing


def _blank(*args: object) -> object:
    raise NotImplementedError


def test_bn_momentum() -> None:
    assert check_bn_momentum(lambda m: 1 - math.sqrt(1 - m))
    assert check_bn_momentum(lambda m: torch.tensor(1 - math.sqrt(1 - m), dtype=torch.float64))
    assert check_bn_momentum(_blank).status == "not done yet"
    assert check_bn_momentum(...).status == "not done yet"
    for wrong, hint in [
        (lambda m: math.sqrt(m), "OLD value"),
        (lambda m: math.sqrt(1 - m), "NEW one"),
        (lambda m: m / 2, "close for small m"),
        (lambda m: m, "returned 0.1"),
        (lambda m: "0.05", "return a number"),
        (lambda m: 1 / 0, "ZeroDivisionError"),
    ]:
        r = check_bn_momentum(wrong)
        assert r.status == "wrong" and hint in r.message, r


def test_sqrt_checkpointing() -> None:
    good = lambda model, x: checkpoint_sequential(model, 8, x, use_reentrant=False)  # noqa: E731
    r = check_sqrt_checkpointing(good)
    assert r and "lower" in r.message
    assert check_sqrt_checkpointing(_blank).status == "not done yet"
    for wrong, hint in [
        (lambda model, x: checkpoint_sequential(model, 8, x), "use_reentrant"),
        (lambda model, x: model(x), "only"),  # no checkpointing: no saving
        (lambda model, x: checkpoint_sequential(model, 64, x, use_reentrant=False), "only"),  # too many segments
        (lambda model, x: model[:32](x), "differs"),
        (lambda model, x: 3, "output tensor"),
    ]:
        r = check_sqrt_checkpointing(wrong)
        assert r.status == "wrong" and hint in r.message, r

    def under_no_grad(model, x):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return model(x)

    r = check_sqrt_checkpointing(under_no_grad)
    assert r.status == "wrong" and "no_grad" in r.message


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_optimizer_state_bytes() -> None:
    def good(model: torch.nn.Module, name: str) -> int:
        n = _numel(model) * 4
        return {"sgd": 0, "sgd_momentum": n, "adam": 2 * n + 4 * len(list(model.parameters()))}[name]

    assert check_optimizer_state_bytes(good)
    assert check_optimizer_state_bytes(_blank).status == "not done yet"

    def no_steps(model: torch.nn.Module, name: str) -> int:
        n = _numel(model) * 4
        return {"sgd": 0, "sgd_momentum": n, "adam": 2 * n}[name]

    def all_same(model: torch.nn.Module, name: str) -> int:
        return _numel(model) * 4

    r = check_optimizer_state_bytes(no_steps)
    assert r.status == "wrong" and "step" in r.message
    r = check_optimizer_state_bytes(all_same)
    assert r.status == "wrong" and "'sgd'" in r.message
    r = check_optimizer_state_bytes(lambda model, name: 1.5)
    assert r.status == "wrong" and "int" in r.message
