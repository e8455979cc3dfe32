"""The checks of notebooks 06 and 07 accept correct answers, reject wrong ones with a hint, and report blanks."""

from __future__ import annotations

import math

import torch

from checks import assert_check
from course_lib.exercises.mixed_precision import (
    check_fp16_spacing,
    check_next_scale,
    check_scaler_step,
    check_static_scale,
)


def _blank(*args):
    raise NotImplementedError


# ---- fp16 spacing ---------------------------------------------------------------------------


def test_fp16_spacing() -> None:
    def spacing_with_torch(x):
        t = torch.tensor(x, dtype=torch.float16)
        return (torch.nextafter(t, torch.tensor(math.inf, dtype=torch.float16)) - t).item()

    assert_check(
        check_fp16_spacing,
        right=[lambda x: 2.0 ** (math.floor(math.log2(x)) - 10), spacing_with_torch],
        not_done=[..., _blank],
        wrong=[
            (lambda x: x * 2.0**-10, "binade"),
            (lambda x: 2.0 ** (math.floor(math.log2(x)) - 9), "factor 2"),
            (lambda x: "tiny", ""),
            (lambda x: 1 / 0, ""),
        ],
    )


# ---- static scale ---------------------------------------------------------------------------


def _largest_safe(grads: torch.Tensor) -> float:
    peak = grads.abs().max().item()
    k = math.floor(math.log2(65504.0 / peak))
    while math.isinf(float(torch.tensor(peak * 2.0**k).half())):
        k -= 1
    while not math.isinf(float(torch.tensor(peak * 2.0 ** (k + 1)).half())):
        k += 1
    return 2.0**k


def test_static_scale() -> None:
    assert_check(
        check_static_scale,
        right=[_largest_safe],
        not_done=[None, _blank],
        wrong=[
            (lambda g: 2.0**40, "overflows"),
            (lambda g: 1.0, "largest safe"),
            (lambda g: 65504.0 / g.abs().max().item(), "power of two"),
            (lambda g: -4.0, ""),
            (lambda g: "big", ""),
        ],
    )


# ---- dynamic update -------------------------------------------------------------------------


def _next_scale(scale, tracker, found_inf, growth_interval):
    if found_inf:
        return scale * 0.5, 0
    tracker += 1
    if tracker == growth_interval:
        return scale * 2.0, 0
    return scale, tracker


def test_next_scale() -> None:
    def no_reset(scale, tracker, found_inf, growth_interval):
        if found_inf:
            return scale * 0.5, tracker  # forgets to restart the count
        return _next_scale(scale, tracker, False, growth_interval)

    def never_grows(scale, tracker, found_inf, growth_interval):
        return (scale * 0.5, 0) if found_inf else (scale, tracker + 1)

    assert_check(
        check_next_scale,
        right=[_next_scale],
        not_done=[..., _blank],
        wrong=[(no_reset, "tracker"), (never_grows, ""), (lambda s, t, f, i: s, "")],
    )


# ---- skip-aware scheduler step --------------------------------------------------------------


def _scaler_step(scaler, optimizer, scheduler):
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    return stepped


def _scaler_step_checks_grads(scaler, optimizer, scheduler):
    # another right answer: look for inf in the (scaled) gradients first
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    stepped = all(torch.isfinite(g).all() for g in grads)
    scaler.step(optimizer)
    scaler.update()
    if stepped:
        scheduler.step()
    return bool(stepped)


def test_scaler_step() -> None:
    def always_schedules(scaler, optimizer, scheduler):
        stepped = _scaler_step(scaler, optimizer, scheduler)
        if not stepped:
            scheduler.step()
        return stepped

    def no_update(scaler, optimizer, scheduler):
        scaler.step(optimizer)
        scheduler.step()
        return True

    def plain_step(scaler, optimizer, scheduler):
        optimizer.step()
        scheduler.step()
        return True

    def no_step(scaler, optimizer, scheduler):
        return False

    def zero_lr(scaler, optimizer, scheduler):
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        return _scaler_step(scaler, optimizer, scheduler)

    def returns_nothing_useful(scaler, optimizer, scheduler):
        _scaler_step(scaler, optimizer, scheduler)
        return "yes"

    def inverted(scaler, optimizer, scheduler):
        return not _scaler_step(scaler, optimizer, scheduler)

    def blank(scaler, optimizer, scheduler):
        raise NotImplementedError("your code here")

    assert_check(
        check_scaler_step,
        right=[_scaler_step, _scaler_step_checks_grads],
        right_says="6 real steps and 4 skipped",
        not_done=[..., blank],
        wrong=[
            (always_schedules, "only when the optimizer stepped"),
            (no_update, "scaler.update()"),
            (plain_step, "not optimizer.step()"),
            (no_step, "call scaler.update()"),
            (zero_lr, "did not move the weights"),
            (returns_nothing_useful, "True or False"),
            (inverted, "compare it before and after"),
            ("step", "your function itself"),
        ],
    )
