"""The checks of notebooks 06 and 07 accept correct answers, reject wrong ones with a hint, and report blanks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from checks import assert_check
from course_lib.exercises.mixed_precision import (
    AUTOCAST_KEYS,
    autocast_forward,
    check_autocast_dtypes,
    check_fp16_spacing,
    check_fp16_step,
    check_fp32_gram,
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


# ---- notebook 07: the dtypes autocast gives ------------------------------------------------

_RIGHT_DTYPES = {
    "h": torch.bfloat16,
    "g": torch.bfloat16,
    "n": torch.bfloat16,
    "logits": torch.bfloat16,
    "lp": torch.bfloat16,
    "loss": torch.float32,
    "lin1.weight.grad": torch.float32,
}


def test_autocast_dtypes() -> None:
    as_words = {k: str(v).removeprefix("torch.") for k, v in _RIGHT_DTYPES.items()}
    short = {k: ("bf16" if v == torch.bfloat16 else "fp32") for k, v in _RIGHT_DTYPES.items()}
    cuda_rule = {**_RIGHT_DTYPES, "n": torch.float32, "lp": torch.float32}  # CUDA's fp32 list applied to the CPU
    all_low = dict.fromkeys(AUTOCAST_KEYS, torch.bfloat16)
    bf16_grads = {**_RIGHT_DTYPES, "lin1.weight.grad": torch.bfloat16}
    follows_input = {**_RIGHT_DTYPES, "h": torch.float32, "g": torch.float32}  # linear assumed to keep fp32
    missing = {k: v for k, v in _RIGHT_DTYPES.items() if k != "loss"}
    assert_check(
        check_autocast_dtypes,
        right=[_RIGHT_DTYPES, as_words, short],
        right_says="losses up to fp32",
        not_done=[..., None, dict.fromkeys(AUTOCAST_KEYS, ...)],
        wrong=[
            (cuda_rule, "on CUDA it is on the fp32 list"),
            (all_low, "losses"),
            (bf16_grads, "parameters stay fp32"),
            (follows_input, "lower-precision list"),
            (missing, "no answer for: 'loss'"),
            ({**_RIGHT_DTYPES, "g": "bf17"}, "give a dtype"),
            ([torch.bfloat16] * 7, "should be a dict"),
        ],
    )


def test_autocast_forward_is_the_forward_described_and_checks_its_inputs() -> None:
    lin1, lin2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0])
    out = autocast_forward(x, y, lin1, lin2)
    lp = F.log_softmax(lin2(F.layer_norm(F.gelu(lin1(x)), (16,))), dim=-1)
    assert torch.allclose(out["lp"], lp) and torch.allclose(out["loss"], F.nll_loss(lp, y))
    with pytest.raises(TypeError, match="lin1 must be a torch.nn.Linear"):
        autocast_forward(x, y, torch.nn.ReLU(), lin2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        autocast_forward([1.0], y, lin1, lin2)  # type: ignore[arg-type]


# ---- notebook 07: a Function that stays fp32 under autocast --------------------------------


class _Gram(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x @ x.T

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return (grad_output + grad_output.T) @ x


class _GramAutocastOff(torch.autograd.Function):  # another right answer: autocast turned off by hand
    @staticmethod
    def forward(ctx, x):
        with torch.autocast("cpu", enabled=False):
            x = x.float()
            ctx.save_for_backward(x)
            return x @ x.T

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return (grad_output + grad_output.T) @ x


class _GramUndecorated(torch.autograd.Function):  # autocast casts the matmul down to fp16: overflow
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x @ x.T

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return (grad_output + grad_output.T) @ x


class _GramFloatCall(_GramUndecorated):  # .float() inside forward: autocast still casts the matmul down
    @staticmethod
    def forward(ctx, x):
        x = x.float()
        ctx.save_for_backward(x)
        return x @ x.T


class _GramCudaDevice(_GramUndecorated):  # decorated for the wrong device: CPU autocast ignores it
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x @ x.T


class _GramHalfGradient(_Gram):  # forgets the transpose term
    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output @ x


class _GramWrongForward(_Gram):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.T @ x


class _GramBlank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


class _GramBlankBackward(_Gram):
    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


def test_fp32_gram() -> None:
    assert_check(
        check_fp32_gram,
        right=[_Gram, _GramAutocastOff],
        right_says="cast_inputs=torch.float32",
        not_done=[..., None, _GramBlank, _GramBlankBackward],
        wrong=[
            (_GramUndecorated, "cast_inputs=torch.float32"),
            (_GramFloatCall, "autocast is active inside forward"),
            (_GramCudaDevice, "device_type='cpu'"),
            (_GramHalfGradient, "(G + G^T) x"),
            (_GramWrongForward, "shape"),
            (lambda x: x @ x.T, "Function subclass"),
        ],
    )


# ---- notebook 07: an fp16 autocast step with GradScaler on the CPU -------------------------


def _fp16_step(model, optimizer, scaler, x, y):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _fp16_step_backward_inside(model, optimizer, scaler, x, y):  # also right: same gradients, a tensor returned
    optimizer.zero_grad(set_to_none=False)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def test_fp16_step() -> None:
    def no_scaler(model, optimizer, scaler, x, y):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    def no_update(model, optimizer, scaler, x, y):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        return loss.item()

    def plain_step(model, optimizer, scaler, x, y):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        optimizer.step()
        return loss.item()

    def plain_step_then_update(model, optimizer, scaler, x, y):
        loss = plain_step(model, optimizer, scaler, x, y)
        scaler.update()
        return loss

    def bf16(model, optimizer, scaler, x, y):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    def no_autocast(model, optimizer, scaler, x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    def half_model(model, optimizer, scaler, x, y):
        model.half()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x.half()).float(), y)
        loss.backward()
        return loss.item()

    def no_zero_grad(model, optimizer, scaler, x, y):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    def returns_scaled(model, optimizer, scaler, x, y):
        scale = scaler.get_scale()
        return _fp16_step(model, optimizer, scaler, x, y) * scale

    def returns_nothing_useful(model, optimizer, scaler, x, y):
        _fp16_step(model, optimizer, scaler, x, y)
        return "done"

    def blank(model, optimizer, scaler, x, y):
        raise NotImplementedError("your code here")

    assert_check(
        check_fp16_step,
        right=[_fp16_step, _fp16_step_backward_inside],
        right_says="GradScaler('cpu')",
        not_done=[..., blank],
        wrong=[
            (no_scaler, "underflow to 0"),
            (no_update, "call scaler.update()"),
            (plain_step, "scaler.step(optimizer)"),
            (plain_step_then_update, "No inf checks were recorded"),
            (bf16, "this one is about fp16"),
            (no_autocast, "torch.float16"),
            (half_model, "stay fp32"),
            (no_zero_grad, "zero the gradients"),
            (returns_scaled, "not the scaled one"),
            (returns_nothing_useful, "return the loss"),
            ("step", "your function itself"),
        ],
    )
