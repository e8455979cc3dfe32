"""Checks for notebook 21 (planning a layout)."""

from __future__ import annotations

import math
from typing import Any

from ..validation import is_int
from .core import Wrong, as_number, call_learner, exercise

__all__ = ["check_pipeline_step_time", "check_tp_rank_params"]


@exercise(
    "tensor-parallel parameters",
    todo="write tp_rank_params(config, n): the parameters one of n tensor-parallel ranks holds",
)
def check_tp_rank_params(tp_rank_params: Any) -> str:
    import dataclasses

    from ..planner import shard_params
    from ..transformer import PRESETS, param_count

    configs = [dataclasses.replace(PRESETS["tiny"], tie_embeddings=False), PRESETS["llama2-7b"], PRESETS["llama3-8b"]]
    for config in configs:
        for n in (1, 2, 4):
            got = call_learner(tp_rank_params, config, n)
            if not is_int(got):
                raise Wrong(f"tp_rank_params should return an int, got {got!r}")
            want = shard_params(config, n)
            if got != want:
                hint = ""
                if got == param_count(config) // n:
                    hint = " - the norms' scales are not split: every rank keeps them whole"
                elif got == want + (n - 1) * 2 * config.vocab_size * config.d_model // n:
                    hint = " - the embedding and the head are split too, by vocabulary rows"
                raise Wrong(
                    f"{config.d_model}-wide, {config.n_layers} layers, n={n}: got {got:,}, expected {want:,}{hint}"
                )
    return "attention, MLP, embedding and head divide by n; the norms stay whole (the planner's shard_params)"


@exercise(
    "a pipeline's step time",
    todo="write pipeline_step_time(stage_seconds, micro_batches, interleave): one step of a synchronous pipeline",
)
def check_pipeline_step_time(pipeline_step_time: Any) -> str:
    cases = [
        ([1.0, 1.0], 4, 1),
        ([1.0, 1.0, 1.0, 1.0], 8, 1),
        ([1.0, 1.0, 1.0, 1.3], 8, 1),
        ([0.5, 0.6], 16, 2),
        ([2.0, 1.0, 1.0, 2.5], 8, 4),
        ([3.0], 4, 1),
    ]
    for stages, m, v in cases:
        got = as_number(call_learner(pipeline_step_time, list(stages), m, v), f"pipeline_step_time({stages}, {m}, {v})")
        p = len(stages)
        want = max(stages) * (m + (p - 1) / v)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        hint = ""
        if math.isclose(got, sum(stages) / p * (m + (p - 1) / v), rel_tol=1e-9):
            hint = " - a synchronous pipeline runs at its slowest stage, not the average one"
        elif math.isclose(got, max(stages) * (m + p - 1), rel_tol=1e-9):
            hint = " - with v chunks per rank the bubble is (p - 1)/v micro-batch times"
        elif math.isclose(got, sum(stages) * m, rel_tol=1e-9):
            hint = " - the stages work at the same time on different micro-batches"
        elif math.isclose(got, max(stages) * m, rel_tol=1e-9):
            hint = " - the pipeline fills and drains: add the bubble"
        raise Wrong(f"stages {stages}, m={m}, v={v}: got {got:g}, expected {want:g}{hint}")
    return "slowest stage x (micro-batches + (p - 1)/v): the planner's step, without communication"
