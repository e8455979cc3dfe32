"""Checks for notebook 12 (DDP's knobs, hangs and restarts)."""

from __future__ import annotations

from typing import Any

import torch

from ..torch_private import ddp_bucket_assignment
from ..validation import is_int
from .core import NotDone, Wrong, call_learner, dict_answer, exercise, is_placeholder

__all__ = ["KNOBS", "check_bucket_sizes", "check_knob_choices", "check_resume"]


def _ddp_bucket_sizes(param_bytes: list[int], cap_bytes: int, first_cap_bytes: int) -> list[int]:
    """The bucket sizes PyTorch's own assignment gives float32 tensors of these sizes, in this order."""
    tensors = [torch.empty(n // 4) for n in param_bytes]
    limits = [first_cap_bytes, cap_bytes] if first_cap_bytes < cap_bytes else [cap_bytes]
    groups = ddp_bucket_assignment(tensors, limits)
    return [sum(param_bytes[i] for i in group) for group in groups]


_BUCKET_CASES: list[tuple[list[int], int, int]] = [
    ([40, 10240, 1024, 262144, 1024, 262144, 1024, 262144, 1024, 65536], 52428, 52428),  # notebook 11, 0.05 MB
    ([40, 10240, 1024, 262144, 1024, 262144, 1024, 262144, 1024, 65536], 524288, 524288),  # 0.5 MB
    ([40, 10240, 1024, 262144, 1024, 262144, 1024, 262144, 1024, 65536], 26214400, 1048576),  # the defaults
    ([40, 20480, 2048, 1048576, 2048, 1048576, 2048, 1048576, 2048, 131072], 26214400, 1048576),  # width 512
    ([400, 400, 400, 400, 400], 800, 400),  # exactly reaching a cap closes the bucket
    ([4000, 4, 4, 4000, 4], 1000, 100),
]


@exercise(
    "DDP bucket sizes",
    todo="write bucket_sizes(param_bytes_in_arrival_order, cap_bytes, first_cap_bytes) returning the bucket sizes",
)
def check_bucket_sizes(bucket_sizes: Any) -> str:
    for param_bytes, cap, first in _BUCKET_CASES:
        want = _ddp_bucket_sizes(param_bytes, cap, first)
        got = call_learner(bucket_sizes, list(param_bytes), cap, first)
        if not isinstance(got, (list, tuple)) or not all(is_int(g) for g in got):
            raise Wrong(f"bucket_sizes should return a list of ints (bytes per bucket), got {got!r}")
        if list(got) != want:
            hint = ""
            if sum(got) != sum(want):
                hint = " - every tensor goes into exactly one bucket: the sizes add up to the total"
            elif len(got) > len(want):
                hint = " - a bucket closes only once it reaches its cap, whole tensors included"
            elif got[:1] != want[:1]:
                hint = " - the first bucket has its own cap, first_cap_bytes"
            raise Wrong(f"sizes {param_bytes}, cap {cap}, first cap {first}: got {list(got)}, expected {want}{hint}")
    return "whole tensors, a bucket closes on reaching its cap, the first one on reaching first_cap_bytes: as DDP does"


KNOBS = (
    "find_unused_parameters",
    "static_graph",
    "gradient_as_bucket_view",
    "join",
    "forward_sync_buffers=False",
    "comm_hook",
)

_KNOB_ANSWERS = {
    "a model with an auxiliary head used only every other step": (
        "find_unused_parameters",
        "the set of unused parameters changes from step to step, so the graph is not static: only the "
        "per-step graph walk finds them",
    ),
    "the same unused head on every step, and the flag's graph walk is too slow": (
        "static_graph",
        "the same parameters are unused at every step: DDP can learn that once instead of walking the graph",
    ),
    "rank 0 has 10 batches and rank 1 has 12": (
        "join",
        "uneven inputs: the rank that finishes first must shadow the others' all-reduces",
    ),
    "the gradients' second copy does not fit in memory": (
        "gradient_as_bucket_view",
        "the second copy is the buckets; make the gradients views into them",
    ),
    "slow Ethernet between nodes, and gradients tolerate rounding to 16 bits": (
        "comm_hook",
        "a compression hook (fp16 or bf16) halves the bytes on the wire",
    ),
    "each rank must keep its own BatchNorm statistics": (
        "forward_sync_buffers=False",
        "by default rank 0's buffers are broadcast at every forward",
    ),
}


@exercise("choosing the DDP setting", todo="give each situation one of the names listed in the exercise")
def check_knob_choices(answers: Any) -> str:
    given = dict_answer(answers, _KNOB_ANSWERS, name="knobs")
    for situation, (want, why) in _KNOB_ANSWERS.items():
        got = given[situation]
        if is_placeholder(got):
            raise NotDone
        if got not in KNOBS:
            raise Wrong(f"{situation!r}: {got!r} is not one of {', '.join(map(repr, KNOBS))}")
        if got != want:
            raise Wrong(f"{situation!r}: not {got!r} - {why}")
    return "each failure has its setting; prefer fixing the model or the data before paying for a flag"


_NEEDED = frozenset({"model", "optimizer", "step", "rng of every rank"})
_CHOICES = frozenset({"model", "optimizer", "step", "rng of rank 0", "rng of every rank", "loss"})


@exercise(
    "resuming a run",
    todo="write resume_position(step, steps_per_epoch) and set `needed` to the set of checkpoint entries required",
)
def check_resume(resume_position: Any, needed: Any) -> str:
    for step, per_epoch in [(0, 12), (8, 12), (12, 12), (23, 12), (30, 7), (5, 1)]:
        got = call_learner(resume_position, step, per_epoch)
        want = divmod(step, per_epoch)
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(is_int(g) for g in got):
            raise Wrong(
                f"resume_position({step}, {per_epoch}) should return a pair of ints (epoch, batch), got {got!r}"
            )
        if tuple(got) != want:
            raise Wrong(
                f"resume_position({step}, {per_epoch}) = {tuple(got)}, expected {want}: after `step` finished "
                "steps, the next batch is number step % steps_per_epoch of epoch step // steps_per_epoch"
            )
    if is_placeholder(needed):
        raise NotDone
    try:
        chosen = {str(n) for n in needed}
    except TypeError:
        raise Wrong(f"`needed` should be a set of names, got {type(needed).__name__}") from None
    unknown = chosen - _CHOICES
    if unknown:
        raise Wrong(f"unknown entries {sorted(unknown)}: choose among {sorted(_CHOICES)}")
    if "optimizer" not in chosen:
        raise Wrong("without the optimizer's state, SGD's momentum restarts from zero and the runs differ")
    if "rng of every rank" not in chosen:
        raise Wrong("each rank draws its own dropout masks: every rank's generator must be restored, not only rank 0's")
    missing = _NEEDED - chosen
    if missing:
        raise Wrong(f"also needed: {sorted(missing)}")
    extra = chosen - _NEEDED - {"rng of rank 0"}
    if extra:
        raise Wrong(f"not needed to continue identically: {sorted(extra)} (it is recomputed, or derived)")
    return "epoch, batch = divmod(step, steps_per_epoch); model, optimizer, step and every rank's RNG state"
