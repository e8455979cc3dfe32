"""The course's canonical Swish (SiLU): a hand-written ``torch.autograd.Function`` and its module.

Swish is ``swish(x) = x * sigmoid(x)``; its derivative, worked out in notebook 03, is

    swish'(x) = s * (1 + x * (1 - s)),   with s = sigmoid(x).

:class:`Swish` keeps only its input for backward and recomputes ``sigmoid(x)`` there, so it
saves one tensor the size of ``x`` (plain autograd on ``x * torch.sigmoid(x)`` keeps two).
It is written in the modern style (``forward`` without ``ctx`` plus ``setup_context``), with
``generate_vmap_rule = True``, so it also works under ``torch.func`` transforms (``grad``,
``vmap``, ``hessian``; a ``jvp`` gives forward mode). Its backward is made of differentiable
operations, so double backward works too. Values and gradients agree with
``torch.nn.functional.silu`` up to rounding.

* :func:`swish` checks its input and applies :class:`Swish`.
* :class:`SwishModule` wraps it as an ``nn.Module`` for use in ``nn.Sequential``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["Swish", "swish", "SwishModule"]


class Swish(torch.autograd.Function):
    """``x * sigmoid(x)`` with a hand-written backward that saves only ``x``.

    Call it as ``Swish.apply(x)`` (or use :func:`swish`, which also checks the input).
    """

    generate_vmap_rule = True  # lets torch.func.vmap (and hessian, jacrev, ...) batch it

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        (x,) = inputs
        ctx.save_for_backward(x)  # the only tensor kept for backward
        ctx.save_for_forward(x)  # for jvp (forward-mode AD); a reference, not a copy

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor | None:
        if not ctx.needs_input_grad[0]:
            return None
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)  # recomputed: cheaper in memory than saving it
        return grad_output * (s * (1 + x * (1 - s)))

    @staticmethod
    def jvp(ctx: Any, x_tangent: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return x_tangent * (s * (1 + x * (1 - s)))


def _check_input(x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"swish expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():  # False for integer, bool and complex tensors
        raise TypeError(f"swish expects a real floating-point tensor (float16/bfloat16/float32/float64), got {x.dtype}")


def swish(x: torch.Tensor) -> torch.Tensor:
    """Swish / SiLU, ``x * sigmoid(x)``, through the hand-written :class:`Swish` Function.

    Raises ``TypeError`` for anything but a real floating-point tensor (integer tensors cannot
    carry gradients, and the course's derivative is for real inputs).

    >>> swish(torch.tensor([0.0, 1.0])).tolist()
    [0.0, 0.7310585975646973]
    """
    _check_input(x)
    return Swish.apply(x)


class SwishModule(nn.Module):
    """``nn.Module`` form of :func:`swish` (no parameters), e.g. ``nn.Sequential(nn.Linear(4, 8), SwishModule())``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swish(x)
