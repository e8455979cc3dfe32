"""The checks of notebook 05 accept correct answers, reject wrong ones with a hint, and report blanks."""

from __future__ import annotations

import math

import torch

from checks import assert_check
from course_lib.exercises.mixed_precision import check_fp16_spacing, check_next_scale, check_static_scale


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
