"""Checks for notebook 03 (custom autograd Functions).

* :func:`check_softplus_function` — write ``forward`` and ``backward`` of softplus by hand.
* :func:`check_lean_scaled_tanh` — LeCun's scaled tanh, saving nothing the next layer does not keep already.
* :func:`check_backward_checker` — write a function that tells a right backward from a wrong one with gradcheck.
* :func:`check_reduce_to_shape` — the gradient of a broadcast input: sum over the broadcast dimensions.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

from course_lib.activations import Swish
from course_lib.saved_tensors import SavedTensorMeter

from .core import NotDone, Wrong, call_learner, exercise, is_placeholder

__all__ = [
    "check_softplus_function",
    "check_lean_scaled_tanh",
    "check_backward_checker",
    "check_reduce_to_shape",
    "LECUN_A",
    "LECUN_B",
]

LECUN_A = 1.7159  # f(x) = LECUN_A * tanh(LECUN_B * x): LeCun et al., "Efficient BackProp" (1998)
LECUN_B = 2.0 / 3.0


def _function_class(fn_cls: Any) -> type[torch.autograd.Function]:
    if is_placeholder(fn_cls):
        raise NotDone
    if not (isinstance(fn_cls, type) and issubclass(fn_cls, torch.autograd.Function)):
        raise Wrong(f"pass the class itself (a subclass of torch.autograd.Function), not {type(fn_cls).__name__}")
    return fn_cls


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=g, dtype=dtype) * 3
    grad_out = torch.randn(6, 5, generator=g, dtype=dtype)
    return x, grad_out


def _grad_of(fn: Any, x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, d<output, grad_out>/dx) of the learner's ``fn``, with learner errors turned into hints."""
    x = x.detach().clone().requires_grad_()
    y = call_learner(fn, x)
    if not isinstance(y, torch.Tensor):
        raise Wrong(f"forward should return a tensor, got {type(y).__name__}")
    if y.shape != x.shape:
        raise Wrong(f"forward returned shape {tuple(y.shape)}; an activation keeps the input's shape {tuple(x.shape)}")
    if not y.requires_grad:
        raise Wrong("the output does not require grad: call your Function with .apply(x), and return a tensor")
    try:
        (gx,) = torch.autograd.grad(y, x, grad_out)
    except NotImplementedError:
        raise NotDone from None
    except Exception as e:  # the learner's backward failed
        raise Wrong(f"backward raised {type(e).__name__}: {e}") from None
    if gx is None:
        raise Wrong("backward returned None for x: return grad_output times the derivative")
    return y.detach(), gx


def _compare_backward(
    gx: torch.Tensor, x: torch.Tensor, grad_out: torch.Tensor, derivative: torch.Tensor, formula: str
) -> None:
    if gx.shape != x.shape:
        raise Wrong(f"backward returned shape {tuple(gx.shape)}; it must match the input's shape {tuple(x.shape)}")
    if torch.allclose(gx, grad_out * derivative, rtol=1e-6, atol=1e-9):
        return
    if torch.allclose(gx, derivative, rtol=1e-6, atol=1e-9):
        raise Wrong("backward returns the derivative alone: multiply it by grad_output (the chain rule)")
    raise Wrong(f"backward is not right: the derivative is {formula}; return grad_output times it")


# ---- 1. softplus by hand -----------------------------------------------------------------------
@exercise("softplus Function", todo="fill in forward and backward of MySoftplus, then run the check")
def check_softplus_function(fn_cls: Any) -> str:
    cls = _function_class(fn_cls)
    x, grad_out = _inputs()
    y, gx = _grad_of(cls.apply, x, grad_out)
    if not torch.allclose(y, F.softplus(x), rtol=1e-6, atol=1e-9):
        raise Wrong("forward is not softplus: compute log(1 + exp(x)) (torch.nn.functional.softplus is stable)")
    _compare_backward(gx, x, grad_out, torch.sigmoid(x), "sigmoid(x)")
    xg = x[:2].clone().requires_grad_()
    if not torch.autograd.gradcheck(cls.apply, (xg,), raise_exception=False):
        raise Wrong("gradcheck (float64) disagrees with your backward")
    return "forward is softplus, backward is grad_output * sigmoid(x), and gradcheck agrees"


# ---- 2. scaled tanh that saves nothing extra ---------------------------------------------------
def _block_bytes(act: Any, dtype: torch.dtype = torch.float32) -> tuple[int, torch.Tensor]:
    """Activation bytes that Linear -> act -> Linear keeps for backward (parameters not counted)."""
    g = torch.Generator().manual_seed(0)
    lin1, lin2 = torch.nn.Linear(32, 64).to(dtype), torch.nn.Linear(64, 8).to(dtype)
    with torch.no_grad():
        for p in (*lin1.parameters(), *lin2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.3)
    x = torch.randn(16, 32, generator=g, dtype=dtype)
    params = [*lin1.parameters(), *lin2.parameters()]
    with SavedTensorMeter(exclude=params) as meter:
        out = lin2(act(lin1(x)))
    return meter.bytes, out


@exercise("lean scaled tanh", todo="write LeanScaledTanh (forward and backward) and run the check")
def check_lean_scaled_tanh(fn_cls: Any) -> str:
    cls = _function_class(fn_cls)
    x, grad_out = _inputs()
    y, gx = _grad_of(cls.apply, x, grad_out)
    if not torch.allclose(y, LECUN_A * torch.tanh(LECUN_B * x), rtol=1e-6, atol=1e-9):
        raise Wrong("forward should be LECUN_A * tanh(LECUN_B * x)")
    t = torch.tanh(LECUN_B * x)
    _compare_backward(gx, x, grad_out, LECUN_A * LECUN_B * (1 - t * t), "A*B*(1 - tanh(B*x)**2)")
    with SavedTensorMeter() as alone:
        call_learner(cls.apply, x.detach().clone().requires_grad_())
    if alone.count == 0:
        raise Wrong(
            "your Function saves nothing with ctx.save_for_backward: keep tensors there, not as ctx "
            "attributes, so autograd can check them for in-place changes and free them after backward"
        )
    baseline, _ = _block_bytes(lambda h: h)
    with_act, _ = _block_bytes(cls.apply)
    extra = with_act - baseline
    if extra > 0:
        raise Wrong(
            f"Linear -> your Function -> Linear keeps {extra} bytes more than the two Linears alone. "
            "The next Linear already keeps your output y; write the derivative with y only "
            "(tanh(B*x) = y / A) and save y"
        )
    return "it saves only its output, which the next layer keeps anyway: 0 extra bytes"


# ---- 3. a gradient checker --------------------------------------------------------------------
class _SwishMissingTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)  # forgets the x * s * (1 - s) term


# The candidates are not answers to this notebook's exercises: sine is no exercise, and each
# wrong one is wrong. (A right softplus or scaled tanh here would hand out exercises 1 and 2.)
class _Sine(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.cos(x)


class _SineNoChainRule(_Sine):  # same forward, a wrong backward
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.cos(x)  # forgets grad_output


class _TanhWrongSign(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * (y * y - 1)


_CANDIDATES: list[tuple[str, Any, bool]] = [
    ("Swish (course_lib)", Swish.apply, True),
    ("sine, right", _Sine.apply, True),
    ("torch.tanh (built in)", torch.tanh, True),
    ("Swish missing a term", _SwishMissingTerm.apply, False),
    ("sine without grad_output", _SineNoChainRule.apply, False),
    ("tanh with the wrong sign", _TanhWrongSign.apply, False),
]


@exercise("backward checker", todo="write backward_is_correct(fn) with torch.autograd.gradcheck, then run the check")
def check_backward_checker(backward_is_correct: Any) -> str:
    if is_placeholder(backward_is_correct):
        raise NotDone
    if not callable(backward_is_correct):
        raise Wrong(f"pass your function itself, not {type(backward_is_correct).__name__}")
    for name, fn, right in _CANDIDATES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gradcheck warns about float32 inputs; the hint below explains
            try:
                verdict = call_learner(backward_is_correct, fn)
            except Wrong as w:
                if "GradcheckError" in str(w):
                    raise Wrong(
                        "gradcheck raised instead of answering: pass raise_exception=False "
                        "(or catch GradcheckError, from torch.autograd.gradcheck import GradcheckError) "
                        "and return False"
                    ) from None
                raise
        if not isinstance(verdict, bool):
            raise Wrong(f"return True or False, not {type(verdict).__name__}")
        if verdict and not right:
            raise Wrong(
                f"it accepted a wrong backward ({name}): call gradcheck on fn with an input that "
                "requires grad, and return its result"
            )
        if not verdict and right:
            raise Wrong(
                f"it rejected a correct backward ({name}): use a float64 input (dtype=torch.float64); "
                "in float32, finite differences are too coarse for gradcheck's tolerances"
            )
    n_right = sum(right for *_, right in _CANDIDATES)
    return f"it told {n_right} right and {len(_CANDIDATES) - n_right} wrong backwards apart"


# ---- 4. the gradient of a broadcast input -------------------------------------------------------
# (shape of the broadcast result, shape of the input that was broadcast)
_BROADCAST_CASES: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
    ((4, 3), (4, 3)),  # nothing broadcast
    ((4, 3), ()),  # a scalar
    ((4, 3), (3,)),  # a bias: one dimension added in front
    ((4, 3), (4, 1)),  # a column: a size-1 dimension stretched
    ((2, 4, 3), (4, 3)),
    ((2, 4, 3), (1, 3)),  # both kinds at once
    ((2, 4, 3), (2, 1, 1)),
]


@exercise("broadcast gradient", todo="write reduce_to_shape(grad, shape) with .sum, then run the check")
def check_reduce_to_shape(reduce_to_shape: Any) -> str:
    if is_placeholder(reduce_to_shape):
        raise NotDone
    if not callable(reduce_to_shape):
        raise Wrong(f"pass your function itself, not {type(reduce_to_shape).__name__}")
    g = torch.Generator().manual_seed(5)
    for out_shape, in_shape in _BROADCAST_CASES:
        grad = torch.randn(out_shape, generator=g, dtype=torch.float64)
        expected = grad.sum_to_size(in_shape)
        got = call_learner(reduce_to_shape, grad.clone(), in_shape)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"return a tensor, got {type(got).__name__}")
        if tuple(got.shape) != in_shape:
            hint = (
                "a dimension of size 1 in `shape` is summed with keepdim=True"
                if 1 in in_shape
                else "sum away the leading dimensions that `shape` does not have"
            )
            raise Wrong(
                f"for a gradient of shape {out_shape} and an input of shape {in_shape} it returned shape "
                f"{tuple(got.shape)}; the result must have the input's shape ({hint})"
            )
        if torch.allclose(got, expected, rtol=1e-9, atol=1e-12):
            continue
        n_copies = grad.numel() // max(expected.numel(), 1)
        if torch.allclose(got * n_copies, expected, rtol=1e-9, atol=1e-12):
            raise Wrong(
                "it averages: use sum, not mean. Every broadcast copy of the input contributes its whole gradient"
            )
        raise Wrong(
            f"wrong values for a gradient of shape {out_shape} and an input of shape {in_shape}: sum over the "
            "dimensions added in front and over the dimensions where the input has size 1"
        )
    return f"right for all {len(_BROADCAST_CASES)} shape pairs: the same as autograd's rule (Tensor.sum_to_size)"
