"""Checks for notebook 11 (sharded data parallel: ZeRO, FSDP2, DTensor, distributed checkpoints)."""

from __future__ import annotations

import math
from typing import Any

from ..sharding import STAGES, model_state_bytes, rank_memory
from .core import Wrong, as_number, call_learner, dict_answer, exercise

__all__ = ["check_rank_bytes", "check_stage_that_fits", "check_zero3_traffic", "FIT_SCENARIOS"]

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


@exercise("ZeRO-3 traffic", todo="set `ratio` to the bytes one rank sends per step with ZeRO-3, over DDP's")
def check_zero3_traffic(ratio: Any) -> str:
    got = as_number(ratio, "ratio")
    if math.isclose(got, 1.5, rel_tol=1e-3):
        return "1.5: an all-gather of the parameters in forward, another in backward, a reduce-scatter of the gradients"
    if math.isclose(got, 1.0, rel_tol=1e-3):
        raise Wrong("1.0 is ZeRO-1 and ZeRO-2 (reduce-scatter + all-gather = all-reduce); ZeRO-3 gathers twice")
    if math.isclose(got, 2.0, rel_tol=1e-3):
        raise Wrong("each collective moves (N-1)/N of the tensor; an all-reduce is two of them, not one")
    raise Wrong(f"{got:g}: count each collective as (N-1)/N of the bytes: all-reduce = 2 of those")
