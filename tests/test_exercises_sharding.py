from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from checks import assert_check
from course_lib.exercises.sharding import (
    FIT_SCENARIOS,
    check_bytes_sent,
    check_rank_bytes,
    check_reduce_scatter_step,
    check_stage_that_fits,
)


def _blank(*args: object) -> object:
    raise NotImplementedError


def _right(params: int, n: int, stage: str) -> int:
    shard = -(-params // n)
    sharded = {"ddp": (0, 0, 0), "zero1": (0, 0, 1), "zero2": (0, 1, 1), "zero3": (1, 1, 1)}[stage]
    return sum(b * (shard if s else params) for b, s in zip((2, 2, 12), sharded))


def test_rank_bytes() -> None:
    assert_check(
        check_rank_bytes,
        right=[_right, lambda p, n, s: float(_right(p, n, s))],
        not_done=[_blank, ...],
        wrong=[
            (lambda p, n, s: 16 * p, "'ddp' keeps"),
            (lambda p, n, s: 16 * p / n, "divides everything by N"),
            (lambda p, n, s: _right(p, n, "zero1") if s == "zero2" else _right(p, n, s), "'zero1' keeps"),
            (lambda p, n, s: 3 * p, "count 2 bytes"),
            (lambda p, n, s: "16", "return a number"),
            (lambda p, n, s: 1 / 0, "ZeroDivisionError"),
            (_rounded_down, "rounds the shard down"),
            (_not_rounded, "divides without rounding up"),
        ],
    )


def _rounded_down(params: int, n: int, stage: str) -> int:
    sharded = {"ddp": (0, 0, 0), "zero1": (0, 0, 1), "zero2": (0, 1, 1), "zero3": (1, 1, 1)}[stage]
    return sum(b * (params // n if s else params) for b, s in zip((2, 2, 12), sharded))


def _not_rounded(params: int, n: int, stage: str) -> float:
    sharded = {"ddp": (0, 0, 0), "zero1": (0, 0, 1), "zero2": (0, 1, 1), "zero3": (1, 1, 1)}[stage]
    return sum(b * (params / n if s else params) for b, s in zip((2, 2, 12), sharded))


RIGHT = dict(zip(FIT_SCENARIOS, ["ddp", "zero1", "zero2", "zero3"]))


def test_stage_that_fits() -> None:
    assert_check(
        check_stage_that_fits,
        right=[RIGHT],
        not_done=[..., dict.fromkeys(FIT_SCENARIOS, ...)],
        wrong=[
            ({**RIGHT, list(FIT_SCENARIOS)[1]: "ddp"}, "GB per rank"),
            ({**RIGHT, list(FIT_SCENARIOS)[0]: "zero3"}, "not the first stage"),
            ({**RIGHT, list(FIT_SCENARIOS)[3]: "fsdp"}, "must be one of"),
            ({k: v for k, v in list(RIGHT.items())[:2]}, "no answer for"),
            (["ddp"], "should be a dict"),
        ],
    )


def _sent(params: int, n: int, stage: str) -> float:
    return (3 if stage == "zero3" else 2) * (n - 1) / n * 2 * params


def test_bytes_sent() -> None:
    assert_check(
        check_bytes_sent,
        right=[_sent, lambda p, n, s: torch.tensor(_sent(p, n, s), dtype=torch.float64)],
        not_done=[_blank, ...],
        wrong=[
            (lambda p, n, s: _sent(p, n, "ddp"), "all-gathers the parameters twice"),
            (lambda p, n, s: _sent(p, n, "zero3"), "only ZeRO-3 gathers"),
            (lambda p, n, s: 2 * _sent(p, n, s), "2 bytes each"),
            (lambda p, n, s: _sent(p, n, s) * n / max(n - 1, 1) if n > 1 else 0.0, "(N-1)/N"),
            (lambda p, n, s: _sent(p, n, s) if n > 1 else 5.0, "nobody to send to"),
            (lambda p, n, s: 7, "count each collective"),
            (lambda p, n, s: "1", "return a number"),
        ],
    )


def _shard_gradient(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
    grad = full_grad.to(reduce_dtype)
    shard = torch.empty(grad.numel() // n, dtype=reduce_dtype)
    dist.reduce_scatter_single(shard, grad)
    return shard.div_(n).to(shard_dtype)


def test_reduce_scatter_step() -> None:
    def with_avg(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype)
        shard = torch.empty(grad.numel() // n, dtype=reduce_dtype)
        dist.reduce_scatter_tensor(shard, grad, op=dist.ReduceOp.AVG)
        return shard.to(shard_dtype)

    def divide_first(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype) / n
        shard = torch.empty(grad.numel() // n, dtype=reduce_dtype)
        dist.reduce_scatter(shard, list(grad.chunk(n)))
        return shard.to(shard_dtype)

    def summed(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        return _shard_gradient(full_grad, n, reduce_dtype, shard_dtype) * n

    def twice(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        return _shard_gradient(full_grad, n, reduce_dtype, shard_dtype) / n

    def in_bf16(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        return _shard_gradient(full_grad, n, full_grad.dtype, shard_dtype)

    def bf16_out(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        return _shard_gradient(full_grad, n, reduce_dtype, full_grad.dtype)

    def whole(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype)
        dist.all_reduce(grad)
        return grad.div_(n).to(shard_dtype)

    def all_reduce_then_slice(
        full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype
    ) -> Any:
        grad = full_grad.to(reduce_dtype)
        dist.all_reduce(grad)
        return grad.div_(n).chunk(n)[dist.get_rank()].to(shard_dtype)

    def wrong_chunk(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype)
        dist.all_reduce(grad)
        return grad.div_(n).chunk(n)[0].to(shard_dtype)

    def blank(*args: Any) -> Any:
        raise NotImplementedError

    def waited(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype)
        shard = torch.empty(grad.numel() // n, dtype=reduce_dtype)
        dist.reduce_scatter_tensor(shard, grad, async_op=True).wait()
        return shard.div_(n).to(shard_dtype)

    def never_waited(full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype) -> Any:
        grad = full_grad.to(reduce_dtype)
        shard = torch.zeros(grad.numel() // n, dtype=reduce_dtype)
        dist.reduce_scatter_tensor(shard, grad, async_op=True)  # the handle is dropped: nothing waits
        return shard.div_(n).to(shard_dtype)

    def divided_before_cast(
        full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype
    ) -> Any:
        grad = (full_grad / n).to(reduce_dtype)  # the division rounds in the compute dtype
        shard = torch.empty(grad.numel() // n, dtype=reduce_dtype)
        dist.reduce_scatter_tensor(shard, grad)
        return shard.to(shard_dtype)

    def output_of_other_dtype(
        full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype
    ) -> Any:
        shard = torch.empty(full_grad.numel() // n, dtype=torch.float32)
        dist.reduce_scatter_tensor(shard, full_grad)  # a bf16 input into an fp32 output
        return shard.div_(n).to(shard_dtype)

    assert_check(
        check_reduce_scatter_step,
        right=[_shard_gradient, with_avg, divide_first, waited],
        right_says="divide once",
        not_done=[..., blank, lambda *args: None],
        wrong=[
            (summed, "the sum over ranks"),
            (twice, "averaged twice"),
            (in_bf16, "cast the gradient to reduce_dtype"),
            (bf16_out, "return its dtype"),
            (whole, "return only this rank's shard"),
            (all_reduce_then_slice, "through an all-reduce"),
            (wrong_chunk, "expected chunk 1"),
            (lambda g, n, r, s: [0.0] * (g.numel() // n), "should return a tensor"),
            (lambda g, n, r, s: torch.randn(g.numel() // n), "expected chunk 0"),
            (lambda g, n, r, s: _shard_gradient(g + torch.randn(g.shape).to(g.dtype), n, r, s), "run again"),
            (divided_before_cast, "divided in torch.bfloat16 before the cast"),
            (never_waited, "never waited for"),
            (output_of_other_dtype, "two dtypes"),
        ],
    )
    assert not dist.is_initialized()
