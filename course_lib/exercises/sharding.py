"""Checks for notebook 13 (sharded data parallel: ZeRO, FSDP2, DTensor, distributed checkpoints)."""

from __future__ import annotations

import math
from typing import Any

from ..sharding import STAGES, model_state_bytes, rank_memory
from .core import Wrong, as_number, call_learner, dict_answer, exercise

__all__ = ["check_bytes_sent", "check_rank_bytes", "check_stage_that_fits", "FIT_SCENARIOS"]

GB = 10**9

# name: (parameters, world size, device memory, activations per rank), all mixed-precision Adam
FIT_SCENARIOS: dict[str, tuple[int, int, int, int]] = {
    "1.3B on 8 x 24 GB, 2 GB of activations": (1_300_000_000, 8, 24 * GB, 2 * GB),
    "7B on 8 x 80 GB, 10 GB of activations": (7_000_000_000, 8, 80 * GB, 10 * GB),
    "7B on 8 x 40 GB, 10 GB of activations": (7_000_000_000, 8, 40 * GB, 10 * GB),
    "70B on 64 x 80 GB, 10 GB of activations": (70_000_000_000, 64, 80 * GB, 10 * GB),
}


def _first_stage_that_fits(params: int, n: int, memory: int, activations: int) -> str:
    for stage in STAGES:  # in order of growing communication and complexity
        if model_state_bytes(params, n, stage).total + activations <= memory:
            return stage
    return "none"


@exercise("bytes per rank", todo="write rank_bytes(num_params, world_size, stage) for mixed-precision Adam")
def check_rank_bytes(rank_bytes: Any) -> str:
    cases = [(1_000_000, 1, "ddp"), (1_000_000, 4, "ddp"), (1_000_000, 4, "zero1"), (1_000_000, 4, "zero2")]
    cases += [(1_000_000, 4, "zero3"), (7_000_000_000, 8, "zero1"), (7_000_000_000, 64, "zero3"), (1000, 3, "zero2")]
    for params, n, stage in cases:
        call = f"rank_bytes({params}, {n}, {stage!r})"
        got = as_number(call_learner(rank_bytes, params, n, stage), call)
        want = model_state_bytes(params, n, stage).total
        if math.isclose(got, want, rel_tol=1e-3):
            continue
        wrong_k = {s: model_state_bytes(params, n, s).total for s in STAGES}
        if n > 1 and stage != "zero3" and math.isclose(got, 16 * params / n, rel_tol=1e-3):
            raise Wrong(
                f"{call} = {got:,.0f} divides everything by N: "
                "DDP shards nothing, and only ZeRO-3 shards the parameters"
            )
        for other, value in wrong_k.items():
            if other != stage and math.isclose(got, value, rel_tol=1e-3):
                raise Wrong(f"{call} returned what {other!r} keeps; {stage!r} shards a different set")
        raise Wrong(
            f"{call} returned {got:,.0f}: count 2 bytes of parameters, 2 of gradients "
            "and 12 of optimizer state per parameter, and divide the sharded ones by N"
        )
    return "2 + 2 + 12 bytes per parameter, each part divided by N once its stage shards it"


@exercise(
    "which stage fits", todo="fill `answer` with the first stage (in the order ddp, zero1, zero2, zero3) that fits"
)
def check_stage_that_fits(answer: Any) -> str:
    answer = dict_answer(answer, FIT_SCENARIOS, name="answer")
    for name, (params, n, memory, acts) in FIT_SCENARIOS.items():
        got = answer[name]
        if got not in (*STAGES, "none"):
            raise Wrong(f"answer[{name!r}] must be one of {', '.join(STAGES)} or 'none', got {got!r}")
        want = _first_stage_that_fits(params, n, memory, acts)
        if got == want:
            continue
        need = rank_memory(params, n, got)["total"] + acts if got != "none" else None
        if need is not None and need > memory:
            raise Wrong(
                f"{name}: {got} needs {need / GB:.1f} GB per rank (model state plus activations), "
                f"more than {memory / GB:.0f} GB"
            )
        raise Wrong(f"{name}: {got} is not the first stage that fits; an earlier one communicates less and fits too")
    return "the first stage that fits, for each case (activations are not sharded: they stay per rank)"


def _sent(params: int, n: int, stage: str) -> float:
    """Bytes one rank sends per step, ring algorithms, 2-byte (bf16) parameters and gradients."""
    collectives = 3 if stage == "zero3" else 2  # zero3: all-gather twice (forward, backward) + reduce-scatter
    return collectives * (n - 1) / n * 2 * params


@exercise(
    "bytes sent per step",
    todo="write bytes_sent(num_params, world_size, stage): what one rank sends per step (bf16, ring algorithms)",
)
def check_bytes_sent(bytes_sent: Any) -> str:
    cases = [(1_000_000, 4, "ddp"), (1_000_000, 4, "zero1"), (1_000_000, 4, "zero2"), (1_000_000, 4, "zero3")]
    cases += [(7_000_000_000, 8, "ddp"), (7_000_000_000, 8, "zero3"), (1_000_000, 1, "zero3"), (6_000, 3, "zero2")]
    for params, n, stage in cases:
        call = f"bytes_sent({params}, {n}, {stage!r})"
        got = as_number(call_learner(bytes_sent, params, n, stage), call)
        want = _sent(params, n, stage)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        if n == 1:
            raise Wrong(f"{call} returned {got:g}: with one rank there is nobody to send to")
        if stage == "zero3" and math.isclose(got, _sent(params, n, "ddp"), rel_tol=1e-6):
            raise Wrong(f"{call}: that is DDP's traffic; ZeRO-3 all-gathers the parameters twice per step")
        if stage != "zero3" and math.isclose(got, _sent(params, n, "zero3"), rel_tol=1e-6):
            raise Wrong(
                f"{call}: only ZeRO-3 gathers the parameters twice; DDP all-reduces the gradients, and stages 1 "
                "and 2 reduce-scatter them and all-gather the parameters once"
            )
        if math.isclose(got, 2 * want, rel_tol=1e-6):
            raise Wrong(f"{call} is twice too much: parameters and gradients are 2 bytes each in bf16, not 4")
        if math.isclose(got, want * n / (n - 1), rel_tol=1e-6):
            raise Wrong(f"{call}: a ring collective sends (N-1)/N of the tensor, not all of it")
        raise Wrong(f"{call} returned {got:,.0f}: count each collective as (N-1)/N of a 2-byte-per-parameter tensor")
    return "DDP, ZeRO-1 and ZeRO-2 send the same 2(N-1)/N of the gradients' bytes; ZeRO-3 half as much again"
