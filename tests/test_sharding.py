from __future__ import annotations

import math

import pytest
import torch

from course_lib.sharding import (
    PRECISIONS,
    STAGES,
    Precision,
    activation_bytes,
    bytes_per_parameter,
    model_state_bytes,
    rank_memory,
    transformer_activation_bytes,
    zero_table,
)
from course_lib.transformer import PRESETS, block_saved_bytes, model_saved_bytes


def test_zero_paper_numbers() -> None:
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, N = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    psi, n = 7_500_000_000, 64
    got = [model_state_bytes(psi, n, s).total / 1e9 for s in STAGES]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_stages_in_order_and_equal_at_one_rank(precision: str, n: int) -> None:
    totals = [model_state_bytes(1200, n, s, precision).total for s in STAGES]
    assert totals == sorted(totals, reverse=True)
    if n == 1:
        assert len(set(totals)) == 1
    for s in STAGES:  # the limit formula agrees when N divides the count
        assert math.isclose(model_state_bytes(1200, n, s, precision).total / 1200, bytes_per_parameter(n, s, precision))


def test_what_each_stage_shards() -> None:
    ddp, z1, z2, z3 = (model_state_bytes(100, 4, s, "fp32_adam") for s in STAGES)
    assert (ddp.parameters, ddp.gradients, ddp.optimizer_state) == (400, 400, 800)
    assert (z1.parameters, z1.gradients, z1.optimizer_state) == (400, 400, 200)
    assert (z2.parameters, z2.gradients, z2.optimizer_state) == (400, 100, 200)
    assert (z3.parameters, z3.gradients, z3.optimizer_state) == (100, 100, 200)


def test_padding_and_custom_precision() -> None:
    assert model_state_bytes(10, 4, "zero3", Precision(1, 1, 1)).total == 9  # shards of 3
    assert Precision(2, 2, 12).total == 16


def test_activations_and_rank_memory() -> None:
    assert activation_bytes(2, 10, 9, checkpointing=False) == 180
    assert activation_bytes(2, 10, 9, checkpointing=True) == 2 * 10 * (2 + 3)  # notebook 04's k - 1 + N/k, k = 3
    assert activation_bytes(0, 10, 9, checkpointing=True) == 0
    r = rank_memory(1000, 1, "ddp", "fp32_sgd", micro_batch=1, bytes_per_sample_per_layer=8, layers=2)
    assert r == {"parameters": 4000, "gradients": 4000, "optimizer": 0, "activations": 16, "total": 8016}


def test_transformer_activations_use_notebook_14s_formula() -> None:
    llama = PRESETS["llama2-7b"]
    plain = transformer_activation_bytes(llama, 2048, 2)
    assert plain == model_saved_bytes(llama, 2048, batch=2, dtype=torch.bfloat16)
    ckpt = transformer_activation_bytes(llama, 2048, 2, checkpointing=True)
    kept = (
        32 * 2 * 2048 * 4096 * 2
        + model_saved_bytes(llama, 2048, batch=2, dtype=torch.bfloat16)
        - 32 * (block_saved_bytes(llama, 2048, batch=2, dtype=torch.bfloat16))
    )
    assert ckpt == kept + block_saved_bytes(llama, 2048, batch=2, dtype=torch.bfloat16)
    assert ckpt < plain / 8
    assert transformer_activation_bytes(llama, 2048, 0) == 0
    # rank_memory: bf16 activations for 2-byte parameters, float32 for 4-byte ones
    r = rank_memory(1000, 1, "ddp", micro_batch=2, model=llama, seq_len=2048)
    assert r["activations"] == plain and r["total"] == 16000 + plain
    r32 = rank_memory(1000, 1, "ddp", "fp32_adam", micro_batch=1, model=PRESETS["tiny"], seq_len=64)
    assert r32["activations"] == model_saved_bytes(PRESETS["tiny"], 64, dtype=torch.float32)


def test_table() -> None:
    lines = zero_table((1, 2), "fp32_adam").splitlines()
    assert lines[0].split() == ["bytes/param", "N=1", "N=2"]
    assert lines[4].split() == ["zero3", "16", "8"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: model_state_bytes(-1, 2, "ddp"), ValueError, "num_params must be >= 0"),
        (lambda: model_state_bytes(10, 0, "ddp"), ValueError, "world_size must be >= 1"),
        (lambda: model_state_bytes(10.0, 2, "ddp"), TypeError, "num_params must be an int"),
        (lambda: model_state_bytes(10, 2, "zero4"), ValueError, "stage must be one of"),
        (lambda: model_state_bytes(10, 2, 3), TypeError, "stage must be a string"),
        (lambda: model_state_bytes(10, 2, "ddp", "fp8"), ValueError, "precision must be one of"),
        (lambda: model_state_bytes(10, 2, "ddp", 16), TypeError, "precision must be a Precision"),
        (lambda: activation_bytes(1, 1, 0, checkpointing=False), ValueError, "layers must be >= 1"),
        (lambda: activation_bytes(1, 1, 1, checkpointing=1), TypeError, "checkpointing"),
        (lambda: zero_table(()), ValueError, "non-empty"),
        (lambda: zero_table("1, 8"), TypeError, "world_sizes must be a non-empty sequence of ints"),
        (lambda: bytes_per_parameter(True, "ddp"), TypeError, "world_size"),
        (lambda: transformer_activation_bytes("llama", 10, 1), TypeError, "TransformerConfig"),
        (lambda: transformer_activation_bytes(PRESETS["tiny"], 10, -1), ValueError, "micro_batch"),
        (lambda: rank_memory(10, 1, "ddp", model=PRESETS["tiny"]), ValueError, "needs seq_len"),
        (lambda: rank_memory(10, 1, "ddp", seq_len=8), ValueError, "with model only"),
        (
            lambda: rank_memory(10, 1, "ddp", model=PRESETS["tiny"], seq_len=8, bytes_per_sample_per_layer=4),
            ValueError,
            "not both",
        ),
        (
            lambda: rank_memory(10, 1, "ddp", Precision(1, 1, 4), micro_batch=1, model=PRESETS["tiny"], seq_len=8),
            ValueError,
            "2- or 4-byte parameters",
        ),
    ],
)
def test_validation(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()
