"""Megatron-LM's conjugate operators as autograd functions, and their sequence-parallel halves.

:func:`copy_to_tp` (``f``: identity forward, all-reduce backward) goes before a column-parallel layer,
:func:`reduce_from_tp` (``g``: all-reduce forward, identity backward) after a row-parallel one (Shoeybi et al.,
2019). Sequence parallelism (Korthikanti et al., 2022) splits ``g`` and ``f`` into their halves:
:func:`reduce_scatter_to_sp` (reduce-scatter forward, all-gather backward) and :func:`gather_from_sp` (all-gather
forward, reduce-scatter backward); :func:`split_to_sp` enters the sequence-sharded region without communication
(its backward is an all-gather). Every collective is counted (:mod:`course_lib.counted_collectives`).
:mod:`course_lib.tensor_parallel` builds sharded blocks with them, and re-exports them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .counted_collectives import all_gather, all_reduce, check_dim, check_tensor, reduce_scatter

__all__ = ["copy_to_tp", "gather_from_sp", "reduce_from_tp", "reduce_scatter_to_sp", "split_to_sp"]


# ---------------------------------------------------------------------------------------------
# The conjugate operators
# ---------------------------------------------------------------------------------------------


class _CopyToTP(torch.autograd.Function):
    """``f``: identity forward; backward, the sum of every rank's input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_reduce(grad.clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """``g``: forward, the sum of every rank's partial output; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """All-gather along ``dim`` forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """Reduce-scatter along ``dim`` forward; all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_gather(grad, ctx.dim, ctx.group), None, None


class _SplitToSP(torch.autograd.Function):
    """This rank's slice along ``dim`` forward (no communication); all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        n, me = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(n, dim)[me].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_gather(grad.contiguous(), ctx.dim, ctx.group), None, None


def copy_to_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's ``f``: ``x`` unchanged; in backward the gradient is all-reduced over ``group``.

    Put it before column-parallel layers: each rank's layers contribute only part of ``x``'s gradient.
    """
    return _CopyToTP.apply(check_tensor("x", x), group)


def reduce_from_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's ``g``: the sum of ``x`` over ``group``; the gradient passes unchanged.

    Put it after a row-parallel layer: each rank holds a partial sum of the output.
    """
    return _ReduceFromTP.apply(check_tensor("x", x), group)


def gather_from_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Leave the sequence-parallel region: all-gather ``x``'s slices along ``dim``; reduce-scatter backward."""
    x = check_tensor("x", x)
    return _GatherFromSP.apply(x, group, check_dim(x, dim))


def reduce_scatter_to_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Enter the sequence-parallel region from partial sums: reduce-scatter along ``dim``; all-gather backward."""
    x = check_tensor("x", x)
    return _ReduceScatterToSP.apply(x, group, check_dim(x, dim))


def split_to_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Enter the sequence-parallel region from a replicated ``x``: keep this rank's slice; all-gather backward."""
    x = check_tensor("x", x)
    dim = check_dim(x, dim)
    if x.shape[dim] % dist.get_world_size(group):
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} does not split into equal slices")
    return _SplitToSP.apply(x, group, dim)
