"""Checks for notebook 06 (floating point and loss scaling); notebook 07's (autocast) are :mod:`.autocast`,
re-exported here, where notebook 07 imports them."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..float_formats import ulp
from ..loss_scaling import update_scale
from .autocast import AUTOCAST_KEYS, autocast_forward, check_autocast_dtypes, check_fp16_step, check_fp32_gram
from .core import NotDone, Wrong, as_number, call_learner, exercise, is_placeholder

__all__ = [
    "AUTOCAST_KEYS",
    "autocast_forward",
    "check_fp16_spacing",
    "check_static_scale",
    "check_next_scale",
    "check_scaler_step",
    "check_autocast_dtypes",
    "check_fp32_gram",
    "check_fp16_step",
]

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


_OVERFLOW_STEPS = {0, 3, 4, 8}  # steps whose gradients the check sets to inf, as an fp16 overflow would
_STEPS = 10


@exercise(
    "skip-aware step",
    todo="write scaler_step(scaler, optimizer, scheduler): step and update through the scaler, step the scheduler "
    "only when the optimizer stepped, return True when it did",
)
def check_scaler_step(scaler_step: Any) -> str:
    if is_placeholder(scaler_step):
        raise NotDone
    if not callable(scaler_step):
        raise Wrong(f"pass your function itself, not {type(scaler_step).__name__}")
    g = torch.Generator().manual_seed(11)
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns when a scheduler steps before its optimizer; the hint says it
        _run_scaler_steps(scaler_step, model, optimizer, scheduler, scaler, g)
    return (
        f"{_STEPS - len(_OVERFLOW_STEPS)} real steps and {len(_OVERFLOW_STEPS)} skipped ones: "
        "the scheduler followed the optimizer, not the loop"
    )


def _run_scaler_steps(
    scaler_step: Any,
    model: torch.nn.Linear,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    g: torch.Generator,
) -> None:
    scale, tracker, real_steps = 2.0**10, 0, 0
    for step in range(_STEPS):
        optimizer.zero_grad()
        x = torch.randn(3, 4, generator=g)
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        overflow = step in _OVERFLOW_STEPS
        weight_grad = model.weight.grad
        if overflow and weight_grad is not None:
            weight_grad[0, 0] = math.inf
        before = [p.detach().clone() for p in model.parameters()]
        stepped = call_learner(scaler_step, scaler, optimizer, scheduler)
        moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        finite = all(torch.isfinite(p).all() for p in model.parameters())
        if not finite or (overflow and moved):
            raise Wrong(
                f"step {step}: the weights took an inf gradient. Step through scaler.step(optimizer), "
                "which skips the optimizer when it finds inf/NaN, not optimizer.step()"
            )
        if not overflow and not moved:
            raise Wrong(f"step {step}: a clean step did not move the weights: call scaler.step(optimizer)")
        scale, tracker = update_scale(scale, tracker, overflow, growth_interval=2)
        if scaler.get_scale() != scale:
            raise Wrong(
                f"step {step}: the scale is {scaler.get_scale():g}, it should be {scale:g}: "
                "call scaler.update() after scaler.step(optimizer)"
            )
        if not isinstance(stepped, bool):
            raise Wrong(f"return True or False (did the optimizer step?), not {type(stepped).__name__}")
        if stepped == overflow:
            raise Wrong(
                f"step {step}: you returned {stepped}, but the optimizer {'was skipped' if overflow else 'stepped'}. "
                "The scale drops exactly when the step was skipped: compare it before and after update()"
            )
        real_steps += not overflow
        if scheduler.last_epoch != real_steps:
            raise Wrong(
                f"after step {step} the scheduler has taken {scheduler.last_epoch} steps, the optimizer {real_steps}: "
                "step the scheduler only when the optimizer stepped"
            )
