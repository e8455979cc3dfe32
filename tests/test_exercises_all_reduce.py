from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks import assert_check
from course_lib.exercises.all_reduce import (
    BUCKET_CASES,
    COLLECTIVE_TASKS,
    check_bucket_boundaries,
    check_collective_choice,
    check_overlap_hook,
    check_ring_bytes,
    check_ring_schedule,
    check_ring_time,
)


def test_ring_bytes() -> None:
    assert_check(
        check_ring_bytes,
        right=[lambda s, n: 2 * (n - 1) / n * s],
        not_done=[...],
        wrong=[
            (lambda s, n: (n - 1) / n * s, "one phase"),
            (lambda s, n: n * s, "parameter server"),
            (lambda s, n: 3 * s, "count the steps"),
            (lambda s, n: "many", ""),
        ],
    )


def test_ring_schedule() -> None:
    def blank(i: int, s: int, n: int) -> int:
        raise NotImplementedError

    assert_check(
        check_ring_schedule,
        right=[lambda i, s, n: (i - s) % n, lambda i, s, n: (i - s + 2) % n],  # any fixed rotation works
        not_done=[..., blank],
        wrong=[
            (lambda i, s, n: i, "same chunk"),
            (lambda i, s, n: (i + s) % n, "not fully"),
            (lambda i, s, n: n, "chunk index"),
        ],
    )


def test_collective_choice() -> None:
    tasks = list(COLLECTIVE_TASKS)
    assert_check(
        check_collective_choice,
        right=[dict(COLLECTIVE_TASKS), {t: f"dist.{v}" for t, v in COLLECTIVE_TASKS.items()}],
        not_done=[..., {t: ... for t in COLLECTIVE_TASKS}],
        wrong=[
            (["all_reduce"], ""),
            ({tasks[0]: "all_reduce"}, "no answer"),
            ({**COLLECTIVE_TASKS, tasks[1]: "reduce"}, "best fit"),
            ({**COLLECTIVE_TASKS, tasks[1]: "shout"}, "not one of"),
        ],
    )


def test_ring_time() -> None:
    def blank(s: float, n: int, a: float, b: float) -> float:
        raise NotImplementedError

    assert_check(
        check_ring_time,
        right=[
            lambda s, n, a, b: 2 * (n - 1) * (a + s / n / b),
            lambda s, n, a, b: 2 * (n - 1) * a + 2 * (n - 1) / n * s / b,
        ],
        right_says="latency grows with N",
        not_done=[..., blank],
        wrong=[
            (lambda s, n, a, b: 2 * (n - 1) / n * s / b, "bandwidth term alone"),
            (lambda s, n, a, b: (n - 1) * (a + s / n / b), "one phase only"),
            (lambda s, n, a, b: 2 * (n - 1) * (a + s / b), "chunk of S/N"),
            (lambda s, n, a, b: a + s / b, "one message of S bytes"),
            (lambda s, n, a, b: 2 * n * (a + s / n / b), "add up 2(N-1) steps"),
            (lambda s, n, a, b: "fast", ""),
        ],
    )


# -- DDP by hand: the overlap hook and the bucket boundaries ------------------------------------


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
