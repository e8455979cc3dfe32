"""Checks for notebook 00 (start here)."""

from __future__ import annotations

from typing import Any

import torch

from .core import NotDone, Wrong, call_learner, exercise, is_placeholder

__all__ = ["check_leaf_tensor", "check_same_numbers", "check_gpu_guard"]


@exercise("leaf tensor", todo="set `w` to a 2x3 float tensor of ones that autograd tracks")
def check_leaf_tensor(w: Any) -> str:
    if not isinstance(w, torch.Tensor):
        raise Wrong(f"`w` should be a torch.Tensor, not {type(w).__name__}")
    if tuple(w.shape) != (2, 3):
        raise Wrong(f"`w` has shape {tuple(w.shape)}; make it (2, 3)")
    if not w.is_floating_point():
        raise Wrong(f"`w` has dtype {w.dtype}; only floating-point tensors can require grad")
    if not torch.all(w == 1):
        raise Wrong("every element of `w` should be 1 (torch.ones)")
    if not w.requires_grad:
        raise Wrong("autograd does not track `w`: pass requires_grad=True")
    return "a (2, 3) leaf of ones with requires_grad=True"


@exercise("same numbers twice", todo="write draw() that seeds with seed_everything(42) and returns torch.rand(3)")
def check_same_numbers(draw: Any) -> str:
    first = call_learner(draw)
    torch.rand(5)  # disturb the generator between calls: only a seed inside draw() helps
    second = call_learner(draw)
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor):
        raise Wrong("draw() should return a tensor")
    if not torch.equal(first, second):
        raise Wrong("two calls gave different numbers: seed inside draw(), before drawing")
    torch.manual_seed(42)
    if not torch.equal(first, torch.rand(first.shape)):
        raise Wrong("the numbers repeat, but they are not torch.rand(3) after seeding with 42")
    return "seeding makes the draw repeat exactly"


@exercise("GPU guard", todo="set `ran` to the value returned by requires_gpu('my first GPU cell')")
def check_gpu_guard(ran: Any) -> str:
    if is_placeholder(ran):
        raise NotDone
    if not isinstance(ran, bool):
        raise Wrong("requires_gpu returns a bool: assign its result to `ran`")
    if ran != torch.cuda.is_available():
        raise Wrong("`ran` does not match this machine: call requires_gpu(...) itself")
    return "GPU cells run where a GPU exists, and say what they skipped elsewhere"
