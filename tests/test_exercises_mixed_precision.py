"""The checks of notebook 05 accept correct answers, reject wrong ones with a hint, and report blanks."""
from __future__ import annotations

import math

import torch

from course_lib.exercises.mixed_precision import check_fp16_spacing, check_next_scale, check_static_scale


def _blank(*args):
    raise NotImplementedError


# ---- fp16 spacing ---------------------------------------------------------------------------


def test_fp16_spacing_correct() -> None:
    result = check_fp16_spacing(lambda x: 2.0 ** (math.floor(math.log2(x)) - 10))
    assert result.status == "correct", result


def test_fp16_spacing_correct_with_torch() -> None:
    def spacing(x):
        t = torch.tensor(x, dtype=torch.float16)
        return (torch.nextafter(t, torch.tensor(math.inf, dtype=torch.float16)) - t).item()

    assert check_fp16_spacing(spacing).status == "correct"


def test_fp16_spacing_wrong_answers() -> None:
    relative = check_fp16_spacing(lambda x: x * 2.0**-10)
    assert relative.status == "wrong" and "binade" in relative.message
    factor = check_fp16_spacing(lambda x: 2.0 ** (math.floor(math.log2(x)) - 9))
    assert factor.status == "wrong" and "factor 2" in factor.message
    assert check_fp16_spacing(lambda x: "tiny").status == "wrong"
    assert check_fp16_spacing(lambda x: 1 / 0).status == "wrong"


def test_fp16_spacing_not_done() -> None:
    assert check_fp16_spacing(...).status == "not done yet"
    assert check_fp16_spacing(_blank).status == "not done yet"


# ---- static scale ---------------------------------------------------------------------------


def _largest_safe(grads: torch.Tensor) -> float:
    peak = grads.abs().max().item()
    k = math.floor(math.log2(65504.0 / peak))
    while math.isinf(float(torch.tensor(peak * 2.0**k).half())):
        k -= 1
    while not math.isinf(float(torch.tensor(peak * 2.0 ** (k + 1)).half())):
        k += 1
    return 2.0**k


def test_static_scale_correct() -> None:
    assert check_static_scale(_largest_safe).status == "correct"


def test_static_scale_wrong_answers() -> None:
    too_big = check_static_scale(lambda g: 2.0**40)
    assert too_big.status == "wrong" and "overflows" in too_big.message
    too_small = check_static_scale(lambda g: 1.0)
    assert too_small.status == "wrong" and "largest safe" in too_small.message
    not_pow2 = check_static_scale(lambda g: 65504.0 / g.abs().max().item())
    assert not_pow2.status == "wrong" and "power of two" in not_pow2.message
    assert check_static_scale(lambda g: -4.0).status == "wrong"
    assert check_static_scale(lambda g: "big").status == "wrong"


def test_static_scale_not_done() -> None:
    assert check_static_scale(None).status == "not done yet"
    assert check_static_scale(_blank).status == "not done yet"


# ---- dynamic update -------------------------------------------------------------------------


def _next_scale(scale, tracker, found_inf, growth_interval):
    if found_inf:
        return scale * 0.5, 0
    tracker += 1
    if tracker == growth_interval:
        return scale * 2.0, 0
    return scale, tracker


def test_next_scale_correct() -> None:
    assert check_next_scale(_next_scale).status == "correct"


def test_next_scale_wrong_answers() -> None:
    def no_reset(scale, tracker, found_inf, growth_interval):
        if found_inf:
            return scale * 0.5, tracker  # forgets to restart the count
        return _next_scale(scale, tracker, False, growth_interval)

    r = check_next_scale(no_reset)
    assert r.status == "wrong" and "tracker" in r.message

    def never_grows(scale, tracker, found_inf, growth_interval):
        return (scale * 0.5, 0) if found_inf else (scale, tracker + 1)

    assert check_next_scale(never_grows).status == "wrong"
    assert check_next_scale(lambda s, t, f, i: s).status == "wrong"


def test_next_scale_not_done() -> None:
    assert check_next_scale(...).status == "not done yet"
    assert check_next_scale(_blank).status == "not done yet"
