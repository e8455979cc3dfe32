"""Checks for notebook 07 (autocast in practice): which dtype each tensor has under autocast, a float32 island
inside an autocast region, and an fp16 training step with a gradient scaler."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .core import NotDone, Wrong, as_number, call_learner, dict_answer, exercise, is_placeholder

__all__ = ["AUTOCAST_KEYS", "autocast_forward", "check_autocast_dtypes", "check_fp16_step", "check_fp32_gram"]


# ---- notebook 07: autocast ------------------------------------------------------------------
AUTOCAST_KEYS = ("h", "g", "n", "logits", "lp", "loss", "lin1.weight.grad")
_DTYPE_NAMES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
_AUTOCAST_HINTS = {
    "h": "`linear` is on autocast's lower-precision list: its fp32 inputs are cast to bf16 and it returns bf16",
    "logits": "`linear` is on autocast's lower-precision list, whatever its input: it returns bf16",
    "g": "`gelu` is on none of autocast's CPU lists: it runs in its input's dtype, bf16 here (the output of a linear)",
    "n": "on the CPU `layer_norm` is on none of autocast's lists (on CUDA it is on the fp32 list): "
    "given bf16, it returns bf16",
    "lp": "on the CPU `log_softmax` runs in its input's dtype (on CUDA autocast would run it in fp32)",
    "loss": "losses (`nll_loss`, `cross_entropy`, `mse_loss`) are on autocast's fp32 list: they return fp32",
    "lin1.weight.grad": "a gradient has its parameter's dtype: the parameters stay fp32 (autocast casts copies), "
    "and the cast's backward brings the gradient back to fp32",
}


def autocast_forward(x: torch.Tensor, y: torch.Tensor, lin1: torch.nn.Linear, lin2: torch.nn.Linear) -> dict:
    """The small forward of notebook 07's first exercise, every intermediate by name (the check runs it).

    >>> lin1, lin2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    >>> out = autocast_forward(torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0]), lin1, lin2)
    >>> list(out), out["loss"].shape
    (['h', 'g', 'n', 'logits', 'lp', 'loss'], torch.Size([]))
    """
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, layer in (("lin1", lin1), ("lin2", lin2)):
        if not isinstance(layer, torch.nn.Linear):
            raise TypeError(f"{name} must be a torch.nn.Linear, got {type(layer).__name__}")
    h = lin1(x)
    g = torch.nn.functional.gelu(h)
    n = torch.nn.functional.layer_norm(g, (g.shape[-1],))
    logits = lin2(n)
    lp = torch.nn.functional.log_softmax(logits, dim=-1)
    loss = torch.nn.functional.nll_loss(lp, y)
    return {"h": h, "g": g, "n": n, "logits": logits, "lp": lp, "loss": loss}


def _autocast_truth() -> dict[str, torch.dtype]:
    gen = torch.Generator().manual_seed(3)
    lin1, lin2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    x, y = torch.randn(5, 8, generator=gen), torch.randint(0, 4, (5,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = autocast_forward(x, y, lin1, lin2)
    found["loss"].backward()
    assert lin1.weight.grad is not None
    return {**{k: v.dtype for k, v in found.items()}, "lin1.weight.grad": lin1.weight.grad.dtype}


def _as_dtype(value: Any, key: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise Wrong(f"{key!r}: give a dtype such as torch.bfloat16 or torch.float32, not {value!r}")


@exercise(
    "autocast dtypes",
    todo="fill in `dtypes`: the dtype of each tensor of the forward above under torch.autocast('cpu', "
    "dtype=torch.bfloat16), and of lin1.weight.grad after backward",
)
def check_autocast_dtypes(dtypes: Any) -> str:
    answer = dict_answer(dtypes, AUTOCAST_KEYS, name="dtypes")
    truth = _autocast_truth()
    for key in AUTOCAST_KEYS:
        if is_placeholder(answer[key]):
            raise NotDone
        got = _as_dtype(answer[key], key)
        if got != truth[key]:
            raise Wrong(f"{key}: you said {got}, autocast gives {truth[key]}. {_AUTOCAST_HINTS[key]}")
    return "matmuls down to bf16, losses up to fp32, everything else follows its input; parameters stay fp32"


def _gram_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(17)
    x32 = torch.randn(5, 8, generator=gen)
    g32 = torch.randn(5, 5, generator=gen)
    x16 = (torch.randn(4, 8, generator=gen) * 100).half()  # rows whose dot products overflow fp16 (> 65504)
    g16 = torch.randn(4, 4, generator=gen)
    return x32, g32, x16, g16


def _gram_forward(gram: Any, x: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(a leaf copy of x, the learner's Gram of it), with fp16 autocast on or off."""
    x = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        y = call_learner(gram.apply, x)
    if not isinstance(y, torch.Tensor):
        raise Wrong(f"forward should return a tensor, got {type(y).__name__}")
    if y.shape != (x.shape[0], x.shape[0]):
        raise Wrong(f"forward should return x @ x.T, of shape {(x.shape[0], x.shape[0])}, got {tuple(y.shape)}")
    return x, y


def _gram_backward(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    try:
        y.backward(grad.to(y.dtype))
    except NotImplementedError:
        raise NotDone from None
    except Exception as e:  # the learner's backward failed: explain it
        hint = ". Decorate backward with @torch.amp.custom_bwd(device_type='cpu')" if "dtype" in str(e) else ""
        raise Wrong(f"backward raised {type(e).__name__}: {e}{hint}") from None
    if x.grad is None:
        raise Wrong("backward returned no gradient for x: return (grad_output + grad_output.T) @ x")
    return x.grad


@exercise(
    "fp32 Function under autocast",
    todo="write Gram.forward and Gram.backward: y = x @ x.T, computed in fp32 even under autocast",
)
def check_fp32_gram(gram: Any) -> str:
    if is_placeholder(gram):
        raise NotDone
    if not (isinstance(gram, type) and issubclass(gram, torch.autograd.Function)):
        raise Wrong(f"pass your torch.autograd.Function subclass itself (Gram), not {type(gram).__name__}")
    x32, g32, x16, g16 = _gram_inputs()
    x, y = _gram_forward(gram, x32, autocast=False)  # without autocast: the maths
    if not torch.allclose(y, x32 @ x32.T, rtol=1e-5, atol=1e-5):
        raise Wrong("without autocast, forward does not return x @ x.T")
    if not torch.allclose(_gram_backward(x, y, g32), (g32 + g32.T) @ x32, rtol=1e-5, atol=1e-5):
        raise Wrong("the gradient is wrong: for y = x x^T and an output gradient G, dL/dx = (G + G^T) x")
    x, y = _gram_forward(gram, x16, autocast=True)  # fp16 inputs under fp16 autocast
    if y.dtype != torch.float32:
        raise Wrong(
            f"under autocast your forward returned {y.dtype}"
            f"{' (and overflowed to inf)' if not torch.isfinite(y).all() else ''}: autocast is active inside "
            "forward and casts its matmul down. Decorate forward with "
            "@torch.amp.custom_fwd(device_type='cpu', cast_inputs=torch.float32)"
        )
    if not torch.isfinite(y).all() or not torch.allclose(y, x16.float() @ x16.float().T, rtol=1e-5):
        raise Wrong("under autocast the output is not x @ x.T computed in fp32 (did a cast to fp16 overflow?)")
    dx = _gram_backward(x, y, g16)
    if dx.dtype != torch.float16 or not torch.allclose(dx.float(), (g16 + g16.T) @ x16.float(), rtol=1e-2):
        raise Wrong("under autocast the gradient of x is wrong: it should be (G + G^T) x, in x's dtype (fp16)")
    return "with cast_inputs=torch.float32, forward runs in fp32 with autocast off: no overflow, fp32 out"


_STEP_SAMPLES, _STEP_FEATURES, _STEP_CLASSES, _STEP_COUNT = 4096, 16, 4, 14


def _fp16_problem() -> tuple[torch.nn.Linear, torch.optim.SGD, torch.amp.GradScaler, torch.Tensor, torch.Tensor]:
    """A confident linear classifier: its gradients underflow in fp16 unless the loss is scaled, and
    GradScaler's first scale (2^34) overflows, so the scale must back off before the first real step."""
    gen = torch.Generator().manual_seed(13)
    y = torch.arange(_STEP_SAMPLES) % _STEP_CLASSES
    x = torch.randn(_STEP_SAMPLES, _STEP_FEATURES, generator=gen) * 0.05
    x[torch.arange(_STEP_SAMPLES), y] += 4.0
    model = torch.nn.Linear(_STEP_FEATURES, _STEP_CLASSES)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[:, :_STEP_CLASSES] = 2.75 * torch.eye(_STEP_CLASSES)  # logit margin ~11: p(wrong) ~2e-5
        model.bias.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**34, growth_interval=3)
    return model, optimizer, scaler, x, y


def _o1_step(model: Any, optimizer: Any, scaler: Any, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


@exercise(
    "fp16 autocast step on the CPU",
    todo="write fp16_step(model, optimizer, scaler, x, y): fp16 autocast forward and loss, scaled backward, "
    "step and update through the scaler; return the loss",
)
def check_fp16_step(fp16_step: Any) -> str:
    if is_placeholder(fp16_step):
        raise NotDone
    if not callable(fp16_step):
        raise Wrong(f"pass your function itself, not {type(fp16_step).__name__}")
    ref_model, ref_opt, ref_scaler, x, y = _fp16_problem()
    model, optimizer, scaler, _, _ = _fp16_problem()
    out_dtypes: list[torch.dtype] = []
    model.register_forward_hook(lambda mod, inp, out: out_dtypes.append(out.dtype))
    scale_calls: list[int] = []
    scale = scaler.scale

    def counted_scale(outputs: Any) -> Any:
        scale_calls.append(1)
        return scale(outputs)

    scaler.scale = counted_scale  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(_STEP_COUNT):
            scale_used = ref_scaler.get_scale()
            want = _o1_step(ref_model, ref_opt, ref_scaler, x, y)
            got = as_number(
                call_learner(fp16_step, model, optimizer, scaler, x, y), "fp16_step(...)", hint="; return the loss"
            )
            if not out_dtypes or out_dtypes[-1] != torch.float16:
                seen = out_dtypes[-1] if out_dtypes else "no forward at all"
                extra = " (bf16 would need no scaler at all: this one is about fp16)" if seen == torch.bfloat16 else ""
                raise Wrong(
                    f"the model's output was {seen}: run the forward and the loss under "
                    f"torch.autocast('cpu', dtype=torch.float16){extra}"
                )
            if any(p.dtype != torch.float32 for p in model.parameters()):
                raise Wrong("the parameters must stay fp32: autocast casts copies (model.half() is Apex's O3)")
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise Wrong(
                    f"step {step}: the weights took an inf gradient. Step through scaler.step(optimizer), "
                    "which skips a step whose gradients overflowed"
                )
            if not scale_calls:
                raise Wrong(
                    "the loss was never scaled: without the scale these small gradients underflow to 0 in fp16. "
                    "Call scaler.scale(loss).backward()"
                )
            if scaler.get_scale() != ref_scaler.get_scale():
                stuck = scaler.get_scale() == 2.0**34
                raise Wrong(
                    f"after step {step} the scale is {scaler.get_scale():g}, it should be {ref_scaler.get_scale():g}"
                    + (
                        ": call scaler.update() after scaler.step(optimizer)"
                        if stuck
                        else ". The recipe: zero the gradients, forward and loss under autocast, "
                        "scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()"
                    )
                )
            if not all(
                torch.allclose(p, q, rtol=1e-5, atol=1e-7) for p, q in zip(model.parameters(), ref_model.parameters())
            ):
                raise Wrong(
                    f"after step {step} the weights differ from a correct step's. The recipe: zero the gradients, "
                    "forward and loss under autocast, scaler.scale(loss).backward(), scaler.step(optimizer), "
                    "scaler.update()"
                )
            if not math.isclose(got, want, rel_tol=1e-4):
                scaled = math.isclose(got, want * scale_used, rel_tol=1e-2) or not math.isfinite(got)
                raise Wrong(
                    f"step {step}: you returned {got:g}, the loss is {want:g}"
                    + (": return the loss itself, not the scaled one" if scaled else "")
                )
    return (
        "the scaler backed off from 2^34 until the gradients fit in fp16, then kept them from underflowing: "
        "fp16 on the CPU needs GradScaler('cpu') exactly as on CUDA"
    )
