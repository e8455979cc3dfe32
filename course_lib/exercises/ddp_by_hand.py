"""Checks for notebook 10 (DDP by hand: hooks, buckets and overlap)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..ddp_buckets import bucket_assignment
from ..validation import is_int
from .core import NotDone, Wrong, call_learner, exercise, grads_of, is_placeholder
from .simulated_ranks import AsyncAllReduce, SimulatedRankError

__all__ = ["BUCKET_CASES", "check_bucket_boundaries", "check_overlap_hook"]


_HOOK_TODO = (
    "write add_overlap_hooks(model, handles, world_size): give each parameter that needs one a hook that "
    "averages its gradient once and starts its all-reduce without waiting, keeping the handle in `handles`"
)


class _HookNet(nn.Module):
    """A frozen weight (no gradient at all) and a weight tied between the embedding and the head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.hidden = nn.Linear(4, 5)
        self.frozen = nn.Linear(5, 4)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(torch.tanh(self.hidden(self.emb(idx)))))


def _hook_loss(model: nn.Module, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 + rank)
    idx, y = torch.randint(0, 6, (5,), generator=g), torch.randint(0, 6, (5,), generator=g)
    return F.cross_entropy(model(idx), y)


def _run_learner(fn: Any, *args: Any) -> None:
    """Call a learner's function that returns nothing (``call_learner`` would read None as a blank)."""
    try:
        fn(*args)
    except NotImplementedError:
        raise NotDone from None
    except RuntimeError as e:
        if "doesn't require gradient" in str(e):
            raise Wrong(
                "a frozen parameter (requires_grad=False) never gets a gradient, and autograd refuses a hook on it: "
                "give hooks only to the parameters that require grad"
            ) from None
        raise Wrong(f"your code raised RuntimeError: {e}") from None
    except Exception as e:  # the learner's code failed: explain, do not crash the notebook
        raise Wrong(f"your code raised {type(e).__name__}: {e}") from None


@exercise("the overlap hook", todo=_HOOK_TODO)
def check_overlap_hook(add_overlap_hooks: Any) -> str:
    if is_placeholder(add_overlap_hooks):
        raise NotDone
    if not callable(add_overlap_hooks):
        raise Wrong(f"expected a function, got {type(add_overlap_hooks).__name__}")
    n = 3
    torch.manual_seed(0)
    base = _HookNet()
    trainable = [p for p in base.parameters() if p.requires_grad]  # each tensor once: the tied one too
    local = []
    for r in range(n):
        m = copy.deepcopy(base)
        _hook_loss(m, r).backward()
        local.append(grads_of(p for p in m.parameters() if p.requires_grad))
    mean = [torch.stack([local[r][i] for r in range(n)]).mean(0) for i in range(len(trainable))]
    models = [copy.deepcopy(base) for _ in range(n)]
    handles: list[list[Any]] = [[] for _ in range(n)]
    sim = AsyncAllReduce(n)
    # the check's own hooks, registered first so they run first: when each gradient becomes ready (rank 0)
    for i, p in enumerate(q for q in models[0].parameters() if q.requires_grad):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: sim.ready.append(i) if sim.rank == 0 else None)
    with sim.patch():
        for r in range(n):
            sim.rank = r
            _run_learner(add_overlap_hooks, models[r], handles[r], n)
        for r in range(n):
            sim.rank = r
            _run_learner(lambda m=models[r], r=r: _hook_loss(m, r).backward())
    _check_launches(sim, models, handles, len(trainable))
    try:
        sim.resolve()
    except SimulatedRankError as e:
        raise Wrong(str(e)) from None
    for r in range(n):
        for h in handles[r]:
            h.wait()
    return _judge_overlap(sim, models, mean, n)


def _check_launches(sim: AsyncAllReduce, models: list[Any], handles: list[list[Any]], trainable: int) -> None:
    """How the hooks started the all-reduces: asynchronously, one per gradient, as each gradient became ready."""
    calls = [len(c) for c in sim.calls]
    if sim.blocking:
        raise Wrong(
            "the all-reduce in the hook blocks (no async_op=True): backward stalls at every parameter until its "
            "all-reduce is done, so nothing overlaps; start it asynchronously and keep the handle"
        )
    if sim.waited_early:
        raise Wrong(
            "the hook waits for its all-reduce (handle.wait() inside the hook): backward stalls until it is done, "
            "so nothing overlaps; keep the handle, and let the step wait for all of them after backward"
        )
    if calls[0] == 0:
        raise Wrong(
            "no all-reduce was started: register a hook with p.register_post_accumulate_grad_hook(hook) on each "
            "parameter that requires grad, and start dist.all_reduce(param.grad, async_op=True) in it"
        )
    tied = models[0].emb.weight
    if sum(1 for t, _, _ in sim.calls[0] if t is tied.grad) > 1:
        raise Wrong(
            "the tied weight (one tensor used by the embedding and by the head) was all-reduced twice: it got two "
            "hooks. Give each tensor one hook: model.parameters() lists a shared parameter once"
        )
    grads0 = [p.grad for p in models[0].parameters() if p.requires_grad]
    if any(not any(t is g for g in grads0) for t, _, _ in sim.calls[0]):
        raise Wrong(
            "an all-reduce got a tensor other than param.grad (a copy, or the parameter itself): all-reduce "
            "param.grad in place, so that the averaged values land where the optimizer reads them"
        )
    if calls[0] != trainable:
        raise Wrong(
            f"{calls[0]} all-reduces for {trainable} trainable parameters: each gradient must be all-reduced "
            "exactly once per backward"
        )
    if len(handles[0]) != calls[0] or any(not any(h is w for w in sim.works) for h in handles[0]):
        raise Wrong(
            "keep every handle that dist.all_reduce(..., async_op=True) returns in `handles`: the step waits on "
            "them after backward, before optimizer.step()"
        )
    rank0 = sim.launch_points[: calls[0]]
    if trainable > 1 and all(point >= trainable for point in rank0):
        raise Wrong(
            "every all-reduce started after the last gradient was ready (from one hook at the end of backward?): "
            "nothing overlaps backward. Start each gradient's all-reduce from its own parameter's hook"
        )


def _judge_overlap(sim: AsyncAllReduce, models: list[Any], mean: list[torch.Tensor], n: int) -> str:
    """The values after every handle was waited for: the mean over the ranks, divided once."""
    if sim.modified_after_launch:
        raise Wrong(
            "the gradient changed after its all-reduce started (dividing it afterwards?): until wait() returns the "
            "tensor belongs to the collective; divide before starting it (or use ReduceOp.AVG)"
        )
    got = [[p.grad for p in models[r].parameters() if p.requires_grad] for r in range(n)]

    def matches(scale: float) -> bool:
        return all(
            g is not None and torch.allclose(g, want * scale, rtol=1e-5, atol=1e-7)
            for row in got
            for g, want in zip(row, mean)
        )

    if matches(1.0):
        if models[0].frozen.weight.grad is not None:
            raise Wrong("the frozen weight ended with a gradient: it should have none")
        return (
            "each gradient is all-reduced once, as soon as it is ready, while backward goes on; the step waits for "
            "the handles, then every rank holds the mean"
        )
    if matches(n):
        raise Wrong("the gradients are summed, not averaged: divide by world_size once (or use ReduceOp.AVG)")
    if matches(1.0 / n):
        raise Wrong(
            "the gradients are averaged twice (divided by world_size and reduced with ReduceOp.AVG, or divided "
            "twice): divide once"
        )
    raise Wrong("after the all-reduces, param.grad should hold the mean over ranks of the local gradients")


_BUCKET_TODO = (
    "write assign_buckets(param_bytes, cap_bytes): the buckets (lists of parameter indices) in the order "
    "DDP all-reduces them"
)

_MLP_BYTES = [65536, 1024, 262144, 1024, 262144, 1024, 262144, 1024, 10240, 40]  # notebook 11's MLP, width 256
BUCKET_CASES: list[tuple[list[int], int]] = [
    (_MLP_BYTES, 52428),  # bucket_cap_mb=0.05
    (_MLP_BYTES, 524288),  # bucket_cap_mb=0.5
    ([40, 40, 40, 40, 40], 100),
    ([10, 300, 10, 10], 100),
    ([50, 50, 50, 50], 100),
    ([8, 8, 8], 0),
    ([1000], 100),
]


def _reverse_buckets(sizes: list[int], cap: int, rule: str = "ddp") -> list[list[int]]:
    """Buckets as registration indices, in all-reduce order, by DDP's rule or a plausible wrong one."""
    n = len(sizes)
    arrival = list(reversed(sizes))
    groups: list[list[int]] = []
    if rule == "ddp":
        groups = bucket_assignment(arrival, cap)
    else:
        current: list[int] = []
        total = 0
        for i, s in enumerate(arrival):
            if rule == "never_exceed" and current and total + s > cap:
                groups.append(current)
                current, total = [], 0
            current.append(i)
            total += s
            if rule == "strictly_over" and total > cap:
                groups.append(current)
                current, total = [], 0
        if current:
            groups.append(current)
    return [sorted(n - 1 - i for i in g) for g in groups]


def _as_buckets(answer: Any, call: str, n: int) -> list[list[int]]:
    if isinstance(answer, (str, bytes)) or not isinstance(answer, (list, tuple)):
        raise Wrong(f"{call} should return a list of buckets, each a list of parameter indices; got {answer!r}")
    out = []
    for bucket in answer:
        if isinstance(bucket, (str, bytes)) or not isinstance(bucket, (list, tuple, range)):
            raise Wrong(f"{call}: each bucket should be a list of parameter indices, got {bucket!r}")
        if not all(is_int(i) for i in bucket):
            raise Wrong(f"{call}: a bucket holds parameter indices (ints), got {list(bucket)!r}")
        out.append(sorted(bucket))
    flat = sorted(i for b in out for i in b)
    if flat != list(range(n)):
        raise Wrong(
            f"{call}: every parameter index 0..{n - 1} must be in exactly one bucket (got {flat}); "
            "are these indices, not sizes?"
        )
    return out


@exercise("bucket boundaries", todo=_BUCKET_TODO)
def check_bucket_boundaries(assign_buckets: Any) -> str:
    if is_placeholder(assign_buckets):
        raise NotDone
    for sizes, cap in BUCKET_CASES:
        call = f"assign_buckets({sizes}, {cap})"
        got = _as_buckets(call_learner(assign_buckets, list(sizes), cap), call, len(sizes))
        want = _reverse_buckets(sizes, cap)
        if got == want:
            continue
        forward = [sorted(g) for g in bucket_assignment(sizes, cap)]
        if got == forward:
            raise Wrong(
                f"{call}: these are the buckets of the parameters in registration order; gradients arrive in "
                "reverse (the last layer's first), and DDP fills the buckets in that order"
            )
        if got == list(reversed(want)):
            raise Wrong(
                f"{call}: the right buckets, in the wrong order: the first bucket all-reduced holds the last "
                "layer's gradients, which backward computes first"
            )
        if got == _reverse_buckets(sizes, cap, "never_exceed"):
            raise Wrong(
                f"{call}: DDP does not keep a bucket under the cap; it adds the whole tensor, and closes the bucket "
                "once it reaches the cap (so a bucket can exceed it by up to one tensor)"
            )
        if got == _reverse_buckets(sizes, cap, "strictly_over"):
            raise Wrong(f"{call}: a bucket closes as soon as it reaches the cap: size >= cap, not size > cap")
        raise Wrong(
            f"{call} returned {got}, expected {want}: walk the parameters from the last to the first, add each "
            "whole tensor to the open bucket, close it once its size reaches the cap"
        )
    return "reverse registration order, whole tensors, a bucket closes once it reaches the cap: DDP's buckets"
