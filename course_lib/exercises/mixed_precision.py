"""Checks for notebook 05 (mixed precision)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..float_formats import ulp
from ..loss_scaling import update_scale
from .core import Wrong, as_number, call_learner, exercise

__all__ = ["check_fp16_spacing", "check_static_scale", "check_next_scale"]

_SPACING_POINTS = (1.0, 0.1, 3.5, 1000.0, 1024.0, 2.0**-14, 0.75, 60000.0)


@exercise(
    "fp16 spacing", todo="write fp16_spacing(x): the gap from x (positive, normal in fp16) to the next fp16 number"
)
def check_fp16_spacing(fp16_spacing: Any) -> str:
    for x in _SPACING_POINTS:
        got = as_number(call_learner(fp16_spacing, x), f"fp16_spacing({x})")
        want = ulp(x, torch.float16)
        if got != want:
            hint = ""
            if math.isclose(got, x * 2.0**-10, rel_tol=1e-9):
                hint = ": the gap is constant across a binade [2^e, 2^(e+1)), so use 2^floor(log2 x), not x itself"
            elif math.isclose(got, want * 2, rel_tol=1e-9) or math.isclose(got, want / 2, rel_tol=1e-9):
                hint = ": off by a factor 2; fp16 stores 10 mantissa bits"
            raise Wrong(f"fp16_spacing({x}) = {got!r}, but the next fp16 number is {want!r} away{hint}")
    return "the gap is 2^(floor(log2 x) - 10): it doubles with every power of two"


def _scale_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [
        torch.tensor([1e-3, -2e-7, 5e-9]),
        torch.randn(1000, generator=g) * 1e-5,
        torch.tensor([0.9, 1e-8]),
        torch.tensor([300.0, -1e-6]),
        torch.tensor([65504.0 / 2**20]),
    ]


@exercise(
    "static loss scale",
    todo="write pick_scale(grads): the largest power of two that keeps max|grads| * scale finite in fp16",
)
def check_static_scale(pick_scale: Any) -> str:
    for grads in _scale_cases():
        s = as_number(call_learner(pick_scale, grads.clone()), "pick_scale(grads)", hint="; return e.g. 2.0 ** 12")
        if not s > 0 or not math.isfinite(s) or math.frexp(s)[0] != 0.5:
            raise Wrong(
                f"pick_scale returned {s!r}; a loss scale should be a power of two (exact to multiply and undo)"
            )
        peak = grads.abs().max()
        if torch.isinf((peak * s).to(torch.float16)):
            raise Wrong(f"with scale {s:g} the largest gradient {peak.item():.3g} overflows fp16 to inf")
        if not torch.isinf((peak * 2 * s).to(torch.float16)):
            raise Wrong(
                f"scale {s:g} is safe, but {2 * s:g} would be too: pick the largest safe power of two, "
                "so that as few small gradients as possible underflow"
            )
    return "the largest power of two that keeps the biggest gradient finite saves the most small ones"


@exercise(
    "dynamic scale update", todo="write next_scale(scale, tracker, found_inf, growth_interval) -> (scale, tracker)"
)
def check_next_scale(next_scale: Any) -> str:
    g = torch.Generator().manual_seed(7)
    for interval in (1, 3, 5):
        scale, tracker = 1024.0, 0
        flags = (torch.rand(40, generator=g) < 0.25).tolist()
        for i, found in enumerate(flags):
            got = call_learner(next_scale, scale, tracker, bool(found), interval)
            if not isinstance(got, tuple) or len(got) != 2:
                raise Wrong(f"next_scale should return a pair (scale, tracker), got {got!r}")
            want = update_scale(scale, tracker, bool(found), growth_interval=interval)
            if (float(got[0]), int(got[1])) != want:
                what = "an inf/NaN step" if found else "a clean step"
                raise Wrong(
                    f"growth_interval={interval}, step {i}: after {what} from scale={scale:g}, tracker={tracker} "
                    f"the scale should be {want[0]:g} with tracker {want[1]}, you returned {got!r}"
                )
            scale, tracker = want
    return "back off by 2 on inf/NaN and reset the count; double after growth_interval clean steps"
