from __future__ import annotations

import math

import pytest

from course_lib.sharding import (
    PRECISIONS,
    STAGES,
    Precision,
    activation_bytes,
    bytes_per_parameter,
    model_state_bytes,
    rank_memory,
    zero_table,
)


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
        (lambda: zero_table(()), TypeError, "non-empty"),
        (lambda: bytes_per_parameter(True, "ddp"), TypeError, "world_size"),
    ],
)
def test_validation(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()
