from __future__ import annotations

import dataclasses

import pytest

from course_lib.planner import MatmulEfficiency
from course_lib.published_runs import (
    LLAMA3,
    MEGATRON,
    PublishedRun,
    compare,
    fit_peak_fraction,
    megatron_flops_per_step,
)
from course_lib.transformer import param_count


def test_the_tables_hold_the_published_rows() -> None:
    assert [r.tflops_per_gpu for r in MEGATRON] == [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]
    assert [(r.gpus, r.data, r.context, r.tflops_per_gpu) for r in LLAMA3] == [
        (8192, 64, 1, 430),
        (16384, 128, 1, 400),
        (16384, 8, 16, 380),
    ]
    assert all(r.global_batch * r.seq_len == 2**24 for r in LLAMA3)  # 16M tokens per batch
    for r in MEGATRON:  # Table 1's parameter counts, rounded (a tied head: the untied one's V h set aside)
        tied = param_count(r.config) - r.config.vocab_size * r.config.d_model
        assert tied == pytest.approx(float(r.name[:-1]) * 1e9, rel=0.035)
        assert r.data * r.tensor * r.pipeline == r.gpus


def test_megatron_flops_are_the_papers_formula() -> None:
    r = MEGATRON[0]
    B, s, L, h, V = 512, 2048, 24, 2304, 51200
    assert megatron_flops_per_step(r.config, B, s) == pytest.approx(
        96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    )
    with pytest.raises(TypeError, match="config must be"):
        megatron_flops_per_step("gpt", 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="global_batch must be in"):
        megatron_flops_per_step(r.config, 0, 2048)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        megatron_flops_per_step(r.config, 1, 2048.0)  # type: ignore[arg-type]


def test_the_fit_on_megatron_is_the_default_and_predicts_every_row_within_20_percent() -> None:
    fitted = fit_peak_fraction(MEGATRON)
    assert fitted == MatmulEfficiency().peak_fraction
    for r in MEGATRON:
        c = compare(r, rank=False, matmul=MatmulEfficiency())
        assert abs(c.error) < 0.2 and c.rank == 0
        assert c.published.layout.zero == 0 and c.published.layout.checkpointing == "full"


def test_compare_ranks_the_published_layout_among_the_planners() -> None:
    c = compare(LLAMA3[0], MatmulEfficiency())
    assert 1 <= c.rank <= c.candidates
    assert c.best.step_time <= c.published.step_time
    d = (c.published.layout.data, c.published.layout.tensor, c.published.layout.pipeline, c.published.layout.context)
    assert d == (64, 8, 16, 1)
    idealized = compare(LLAMA3[0], rank=False)
    assert idealized.tflops_per_gpu > c.tflops_per_gpu


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="run must be a PublishedRun"):
        compare("405B")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="matmul must be a MatmulEfficiency"):
        compare(MEGATRON[0], 0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank must be True or False"):
        compare(MEGATRON[0], rank=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs must not be empty"):
        fit_peak_fraction([])
    with pytest.raises(TypeError, match="runs must be a list of PublishedRuns"):
        fit_peak_fraction([1])  # type: ignore[list-item]
    huge = dataclasses.replace(MEGATRON[-1], gpus=8, tensor=8, pipeline=1, global_batch=8)  # 1T on one node
    assert isinstance(huge, PublishedRun)
    with pytest.raises(ValueError, match="no layout with the published degrees"):
        compare(huge, rank=False)
