from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from checks import assert_check
from course_lib.exercises.custom_autograd import (
    LECUN_A,
    LECUN_B,
    check_backward_checker,
    check_lean_scaled_tanh,
    check_reduce_to_shape,
    check_softplus_function,
)


# ---- 1. softplus ---------------------------------------------------------------------------------
class SoftplusRight(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)


class SoftplusBlank(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("your code here")


class SoftplusForwardOnly(SoftplusRight):
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("your code here")


class SoftplusNoChain(SoftplusRight):
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.sigmoid(x)


class SoftplusWrongDerivative(SoftplusRight):
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.exp(x)


class SoftplusWrongForward(SoftplusRight):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.exp(x)


class SoftplusCrashes(SoftplusRight):
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * torch.sigmoid(ctx.missing)


def test_softplus() -> None:
    assert_check(
        check_softplus_function,
        right=[SoftplusRight],
        not_done=[..., SoftplusBlank, SoftplusForwardOnly],
        wrong=[
            (SoftplusNoChain, "multiply it by grad_output"),
            (SoftplusWrongDerivative, "sigmoid(x)"),
            (SoftplusWrongForward, "forward is not softplus"),
            (SoftplusCrashes, "backward raised AttributeError"),
            (SoftplusRight.apply, "the class itself"),
            ("softplus", "the class itself"),
        ],
    )


# ---- 2. lean scaled tanh -------------------------------------------------------------------------
class TanhSavesOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = LECUN_A * torch.tanh(LECUN_B * x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        t = y / LECUN_A
        return grad_output * (LECUN_A * LECUN_B * (1 - t * t))


class TanhSavesInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return LECUN_A * torch.tanh(LECUN_B * x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        t = torch.tanh(LECUN_B * x)
        return grad_output * (LECUN_A * LECUN_B * (1 - t * t))


class TanhSavesAttribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = LECUN_A * torch.tanh(LECUN_B * x)
        ctx.y = y.detach()
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        t = ctx.y / LECUN_A
        return grad_output * (LECUN_A * LECUN_B * (1 - t * t))


class TanhForgetsScale(TanhSavesOutput):
    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        t = y / LECUN_A
        return grad_output * (1 - t * t)


class TanhPlain(TanhSavesOutput):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y


class TanhBlank(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def test_lean_tanh() -> None:
    assert_check(
        check_lean_scaled_tanh,
        right=[TanhSavesOutput],
        right_says="0 extra bytes",
        not_done=[None, TanhBlank],
        wrong=[
            # 16 x 64 float32 hidden activations = 4096 bytes kept in addition to what the Linears keep
            (TanhSavesInput, "4096 bytes more"),
            (TanhSavesInput, "save y"),
            (TanhSavesAttribute, "not as ctx attributes"),
            (TanhForgetsScale, "A*B*(1 - tanh(B*x)**2)"),
            (TanhPlain, "LECUN_A * tanh(LECUN_B * x)"),
            (42, "the class itself"),
        ],
    )


# ---- 3. backward checker -------------------------------------------------------------------------
def gradcheck_float64(fn: Any) -> bool:
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    return torch.autograd.gradcheck(fn, (x,), raise_exception=False)


def gradcheck_float32(fn: Any) -> bool:
    x = torch.randn(4, requires_grad=True)
    return torch.autograd.gradcheck(fn, (x,), raise_exception=False)


def gradcheck_raises(fn: Any) -> bool:
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    return torch.autograd.gradcheck(fn, (x,))


def always_true(fn: Any) -> bool:
    return True


def returns_tensor(fn: Any) -> Any:
    return torch.tensor(True)


def blank(fn: Any) -> bool:
    raise NotImplementedError("your code here")


def test_backward_checker() -> None:
    torch.manual_seed(0)
    assert_check(
        check_backward_checker,
        right=[gradcheck_float64],
        right_says="3 right and 3 wrong",
        not_done=[..., blank],
        wrong=[
            (gradcheck_float32, "float64"),
            (gradcheck_raises, "raise_exception=False"),
            (always_true, "accepted a wrong backward"),
            (returns_tensor, "True or False"),
            ("gradcheck", "your function itself"),
        ],
    )


def test_the_package_hands_out_no_answer() -> None:
    """The checker's candidates in course_lib must not solve exercise 1 or 2 (learners can read them)."""
    import course_lib.exercises.custom_autograd as module

    functions = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, torch.autograd.Function)]
    assert len(functions) >= 4
    for cls in functions:
        assert check_softplus_function(cls).status != "correct", cls
        assert check_lean_scaled_tanh(cls).status != "correct", cls


# ---- 4. the gradient of a broadcast input --------------------------------------------------------
def reduce_by_hand(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    added = grad.dim() - len(shape)
    out = grad.sum(dim=tuple(range(added))) if added else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(dim=stretched, keepdim=True) if stretched else out


def reduce_builtin(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return grad.sum_to_size(shape)


def reduce_by_autograd(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    leaf = torch.zeros(shape, dtype=grad.dtype, requires_grad=True)
    (g,) = torch.autograd.grad(leaf.expand(grad.shape), leaf, grad)
    return g


def reduce_leading_only(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    added = grad.dim() - len(shape)
    return grad.sum(dim=tuple(range(added))) if added else grad


def reduce_without_keepdim(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    added = grad.dim() - len(shape)
    out = grad.sum(dim=tuple(range(added))) if added else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(dim=stretched) if stretched else out


def reduce_mean(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    added = grad.dim() - len(shape)
    out = grad.mean(dim=tuple(range(added))) if added else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.mean(dim=stretched, keepdim=True) if stretched else out


def reduce_reshape(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return grad.flatten()[: int(torch.Size(shape).numel())].reshape(shape)  # right shape, wrong values


def reduce_blank(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    raise NotImplementedError("your code here")


def test_reduce_to_shape() -> None:
    assert_check(
        check_reduce_to_shape,
        right=[reduce_by_hand, reduce_builtin, reduce_by_autograd],
        right_says="all 7 shape pairs",
        not_done=[..., None, reduce_blank],
        wrong=[
            (lambda g, s: g, "must have the input's shape"),
            (reduce_leading_only, "keepdim=True"),
            (reduce_without_keepdim, "keepdim=True"),
            (lambda g, s: g.sum(), "must have the input's shape"),
            (reduce_mean, "use sum, not mean"),
            (reduce_reshape, "wrong values"),
            (lambda g, s: g.tolist(), "return a tensor"),
            (lambda g, s: g.sum(dim=5), "your code raised IndexError"),
            ("sum", "your function itself"),
        ],
    )
