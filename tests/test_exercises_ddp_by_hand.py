from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks import assert_check
from course_lib.exercises.ddp_by_hand import BUCKET_CASES, check_bucket_boundaries, check_overlap_hook


def _hooks(body: Any, *, frozen_too: bool = False, per_module: bool = False) -> Any:
    """A learner's add_overlap_hooks whose hook does ``body(param, handles, world_size)``."""

    def add_overlap_hooks(model: nn.Module, handles: list, world_size: int) -> None:
        def hook(param: torch.Tensor) -> None:
            body(param, handles, world_size)

        if per_module:  # walks the modules: a tied weight is met twice
            params = [p for m in model.modules() for p in m.parameters(recurse=False)]
        else:
            params = list(model.parameters())
        for p in params:
            if p.requires_grad or frozen_too:
                p.register_post_accumulate_grad_hook(hook)

    return add_overlap_hooks


def _divide_then_start(param: torch.Tensor, handles: list, n: int) -> None:
    param.grad.div_(n)
    handles.append(dist.all_reduce(param.grad, async_op=True))


def _avg(param: torch.Tensor, handles: list, n: int) -> None:
    handles.append(dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True))


def _blank_hooks(model: nn.Module, handles: list, world_size: int) -> None:
    raise NotImplementedError


def test_overlap_hook() -> None:
    def start_then_divide(param: torch.Tensor, handles: list, n: int) -> None:
        handles.append(dist.all_reduce(param.grad, async_op=True))
        param.grad /= n

    def blocking(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad /= n
        handles.append(dist.all_reduce(param.grad))

    def waits(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad /= n
        work = dist.all_reduce(param.grad, async_op=True)
        work.wait()
        handles.append(work)

    def copy_reduced(param: torch.Tensor, handles: list, n: int) -> None:
        handles.append(dist.all_reduce(param.grad / n, async_op=True))

    def summed(param: torch.Tensor, handles: list, n: int) -> None:
        handles.append(dist.all_reduce(param.grad, async_op=True))

    def twice(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad.div_(n)
        handles.append(dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True))

    def forgets_handles(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad.div_(n)
        dist.all_reduce(param.grad, async_op=True)

    def uses_get_world_size(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad.div_(dist.get_world_size())
        handles.append(dist.all_reduce(param.grad, async_op=True))

    def asks_backend(param: torch.Tensor, handles: list, n: int) -> None:
        if dist.get_backend() == "nccl":  # AVG on NCCL; gloo has no ReduceOp.AVG, so divide first there
            handles.append(dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True))
        else:
            _divide_then_start(param, handles, n)

    def with_future(param: torch.Tensor, handles: list, n: int) -> None:
        param.grad.div_(n)
        work = dist.all_reduce(param.grad, async_op=True)
        work.get_future().then(lambda fut: fut.value())
        handles.append(work)

    def all_at_the_end(model: nn.Module, handles: list, world_size: int) -> None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        ready: list[torch.Tensor] = []

        def hook(param: torch.Tensor) -> None:  # waits for the last gradient, then starts every all-reduce
            ready.append(param)
            if len(ready) == len(trainable):
                for p in trainable:
                    _divide_then_start(p, handles, world_size)

        for p in trainable:
            p.register_post_accumulate_grad_hook(hook)

    assert_check(
        check_overlap_hook,
        right=[_hooks(_divide_then_start), _hooks(_avg), _hooks(uses_get_world_size)]
        + [_hooks(asks_backend), _hooks(with_future)],
        right_says="as soon as it is ready",
        not_done=[..., _blank_hooks, _hooks(lambda p, h, n: _blank_hooks(None, h, n))],  # type: ignore[arg-type]
        wrong=[
            (_hooks(_divide_then_start, frozen_too=True), "frozen parameter"),
            (_hooks(_divide_then_start, per_module=True), "tied weight"),
            (_hooks(blocking), "blocks"),
            (_hooks(waits), "waits for its all-reduce"),
            (_hooks(copy_reduced), "other than param.grad"),
            (_hooks(summed), "summed, not averaged"),
            (_hooks(twice), "averaged twice"),
            (_hooks(start_then_divide), "changed after its all-reduce started"),
            (_hooks(forgets_handles), "keep every handle"),
            (all_at_the_end, "nothing overlaps backward"),
            (lambda model, handles, n: None, "no all-reduce was started"),
            (_hooks(lambda p, h, n: 1 / 0), "ZeroDivisionError"),
            ("hooks", "expected a function"),
        ],
    )
    # the check left torch.distributed as it found it
    assert not dist.is_initialized() and dist.all_reduce.__module__ == "torch.distributed.distributed_c10d"


def _buckets_right(sizes: list[int], cap: int) -> list[list[int]]:
    buckets, current, total = [], [], 0
    for i in reversed(range(len(sizes))):  # gradients arrive last layer first
        current.append(i)
        total += sizes[i]
        if total >= cap:
            buckets.append(current)
            current, total = [], 0
    return buckets + ([current] if current else [])


def test_bucket_boundaries() -> None:
    def forward_order(sizes: list[int], cap: int) -> list[list[int]]:
        n = len(sizes)
        return [sorted(n - 1 - i for i in b) for b in _buckets_right(list(reversed(sizes)), cap)]

    def never_exceed(sizes: list[int], cap: int) -> list[list[int]]:
        buckets, current, total = [], [], 0
        for i in reversed(range(len(sizes))):
            if current and total + sizes[i] > cap:
                buckets.append(current)
                current, total = [], 0
            current.append(i)
            total += sizes[i]
        return buckets + ([current] if current else [])

    def strictly_over(sizes: list[int], cap: int) -> list[list[int]]:
        buckets, current, total = [], [], 0
        for i in reversed(range(len(sizes))):
            current.append(i)
            total += sizes[i]
            if total > cap:
                buckets.append(current)
                current, total = [], 0
        return buckets + ([current] if current else [])

    assert_check(
        check_bucket_boundaries,
        right=[_buckets_right, lambda s, c: [tuple(b) for b in _buckets_right(s, c)]],
        right_says="DDP's buckets",
        not_done=[..., lambda s, c: None, lambda s, c: _blank_hooks(None, s, c)],  # type: ignore[arg-type]
        wrong=[
            (forward_order, "registration order"),
            (lambda s, c: list(reversed(_buckets_right(s, c))), "in the wrong order"),
            (never_exceed, "does not keep a bucket under the cap"),
            (strictly_over, "size >= cap"),
            (lambda s, c: [s], "are these indices"),
            (lambda s, c: [[i] for i in range(len(s))], "expected"),
            (lambda s, c: "buckets", "should return a list of buckets"),
            (lambda s, c: [["0"]], "parameter indices (ints)"),
        ],
    )
    assert BUCKET_CASES[0][1] == int(0.05 * 2**20)
