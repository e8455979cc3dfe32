"""course_lib.precision: float-format helpers and the dynamic loss scaler (checked against GradScaler)."""
from __future__ import annotations

import math

import pytest
import torch

from course_lib.precision import (
    FORMATS,
    DynamicLossScaler,
    bits_of,
    classify,
    describe,
    float_format,
    from_bits,
    has_inf_or_nan,
    neighbors,
    round_to,
    ulp,
    update_scale,
)


# ---- formats --------------------------------------------------------------------------------


def test_float_format_limits_match_ieee_layouts() -> None:
    h = float_format(torch.float16)
    assert (h.bits, h.exponent_bits, h.mantissa_bits, h.bias) == (16, 5, 10, 15)
    assert h.max == 65504.0 and h.smallest_normal == 2.0**-14 and h.smallest_subnormal == 2.0**-24
    assert h.eps == 2.0**-10
    b = float_format(torch.bfloat16)
    assert (b.exponent_bits, b.mantissa_bits, b.bias) == (8, 7, 127)
    assert b.smallest_normal == 2.0**-126 and b.smallest_subnormal == 2.0**-133 and b.eps == 2.0**-7
    f = float_format(torch.float32)
    assert (f.exponent_bits, f.mantissa_bits) == (8, 23) and f.smallest_subnormal == 2.0**-149
    assert f.max == torch.finfo(torch.float32).max
    assert all(line for line in h.lines()) and "65504" in "\n".join(h.lines())


def test_limits_agree_with_what_the_hardware_rounds() -> None:
    for dt in FORMATS:
        fmt = float_format(dt)
        assert round_to(fmt.smallest_subnormal, dt) == fmt.smallest_subnormal
        assert round_to(fmt.smallest_subnormal / 2, dt) == 0.0  # a tie rounds to even: zero
        assert round_to(fmt.smallest_subnormal * 0.51, dt) == fmt.smallest_subnormal
        assert round_to(fmt.max, dt) == fmt.max
        assert round_to(1 + fmt.eps, dt) == 1 + fmt.eps
    assert math.isinf(round_to(65520.0, torch.float16)) and round_to(65519.0, torch.float16) == 65504.0


@pytest.mark.parametrize(
    "value, dtype, bits",
    [
        (1.0, torch.float16, "0 01111 0000000000"),
        (-2.0, torch.float16, "1 10000 0000000000"),
        (65504.0, torch.float16, "0 11110 1111111111"),
        (2.0**-24, torch.float16, "0 00000 0000000001"),
        (math.inf, torch.float16, "0 11111 0000000000"),
        (1.0, torch.bfloat16, "0 01111111 0000000"),
        (1.0, torch.float32, "0 01111111 00000000000000000000000"),
    ],
)
def test_bits_of_known_values_and_back(value: float, dtype: torch.dtype, bits: str) -> None:
    assert bits_of(value, dtype) == bits
    assert from_bits(bits, dtype) == value


@pytest.mark.parametrize("dtype", FORMATS)
def test_from_bits_inverts_bits_of(dtype: torch.dtype) -> None:
    for v in (0.1, -3.75, 1e-6, 123.456, -1e-30, 0.0):
        assert from_bits(bits_of(v, dtype), dtype) == round_to(v, dtype)
    assert math.isnan(from_bits(bits_of(math.nan, dtype), dtype))


def test_neighbors_and_ulp() -> None:
    below, near, above = neighbors(1.0, torch.float16)
    assert (below, near, above) == (1 - 2.0**-11, 1.0, 1 + 2.0**-10)
    assert neighbors(0.0, torch.float16) == (-(2.0**-24), 0.0, 2.0**-24)
    assert ulp(1.0, torch.float16) == 2.0**-10
    assert ulp(-1024.0, torch.float16) == 1.0
    assert ulp(65504.0, torch.float16) == 32.0  # at max: the gap below
    assert ulp(1.0, torch.bfloat16) == 2.0**-7
    with pytest.raises(ValueError, match="not finite"):
        ulp(1e6, torch.float16)
    with pytest.raises(ValueError, match="NaN"):
        neighbors(math.nan, torch.float16)


def test_classify_and_describe() -> None:
    assert classify(1e-8, torch.float16) == "zero"
    assert classify(1e-6, torch.float16) == "subnormal"
    assert classify(1.0, torch.float16) == "normal"
    assert classify(1e5, torch.float16) == "inf"
    assert classify(1e5, torch.bfloat16) == "normal"
    assert classify(math.nan, torch.float32) == "nan"
    text = describe(70000.0)
    assert "fp16" in text and "inf" in text and "bf16" in text and "70144" in text
    assert describe(0.5, [torch.float16]).count("\n") == 2
    with pytest.raises(ValueError, match="at least one"):
        describe(1.0, [])


def test_format_helpers_validate_inputs() -> None:
    with pytest.raises(ValueError, match="one of"):
        float_format(torch.float64)
    with pytest.raises(TypeError, match="torch.dtype"):
        bits_of(1.0, "float16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="real number"):
        round_to("1.0", torch.float16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single number"):
        round_to(torch.ones(2), torch.float16)
    assert round_to(torch.tensor(0.5), torch.float16) == 0.5
    with pytest.raises(ValueError, match="exactly 16"):
        from_bits("0101", torch.float16)
    with pytest.raises(TypeError, match="string"):
        from_bits(5, torch.float16)  # type: ignore[arg-type]


# ---- loss scaling ---------------------------------------------------------------------------


def test_has_inf_or_nan() -> None:
    assert not has_inf_or_nan([torch.ones(3), None])
    assert has_inf_or_nan([torch.ones(3), torch.tensor([1.0, math.nan])])
    assert has_inf_or_nan([torch.tensor([-math.inf], dtype=torch.float16)])
    with pytest.raises(TypeError, match="tensors"):
        has_inf_or_nan([1.0])  # type: ignore[list-item]


def test_update_scale_rule() -> None:
    assert update_scale(1024.0, 5, True) == (512.0, 0)
    assert update_scale(1024.0, 0, False, growth_interval=3) == (1024.0, 1)
    assert update_scale(1024.0, 2, False, growth_interval=3) == (2048.0, 0)
    assert update_scale(1024.0, 0, True, backoff_factor=0.25) == (256.0, 0)
    big = torch.finfo(torch.float32).max
    assert update_scale(big, 0, False, growth_interval=1) == (big, 0)  # growth that would overflow fp32 is dropped


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"init_scale": 0.0}, ValueError, "positive"),
        ({"init_scale": -1.0}, ValueError, "positive"),
        ({"init_scale": math.inf}, ValueError, "finite"),
        ({"growth_factor": 1.0}, ValueError, "> 1"),
        ({"growth_factor": 0.5}, ValueError, "> 1"),
        ({"backoff_factor": 1.0}, ValueError, "between 0 and 1"),
        ({"backoff_factor": 0.0}, ValueError, "between 0 and 1"),
        ({"growth_interval": 0}, ValueError, ">= 1"),
        ({"growth_interval": 2.5}, TypeError, "int"),
        ({"init_scale": "big"}, TypeError, "number"),
    ],
)
def test_scaler_rejects_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DynamicLossScaler(**kwargs)


def test_update_scale_validates() -> None:
    with pytest.raises(ValueError, match="positive"):
        update_scale(-1.0, 0, False)
    with pytest.raises(ValueError, match="growth_tracker"):
        update_scale(1.0, -1, False)
    with pytest.raises(TypeError, match="bool"):
        update_scale(1.0, 0, 1)  # type: ignore[arg-type]


def test_defaults_match_grad_scaler() -> None:
    ours = DynamicLossScaler().state_dict()
    theirs = torch.amp.GradScaler("cpu").state_dict()
    assert ours == theirs


def _train(scaler, inject: set[int], steps: int = 16):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    trace = []
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if i in inject:
            model.bias.grad[1] = math.nan if i % 2 else math.inf
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        trace.append((scaler.get_scale(), not torch.equal(before, model.weight)))
    return trace, [p.detach().clone() for p in model.parameters()]


def test_scaler_matches_grad_scaler_step_by_step() -> None:
    inject = {1, 2, 7, 12}
    ours, p_ours = _train(DynamicLossScaler(2.0**10, growth_interval=3), inject)
    theirs, p_theirs = _train(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3), inject)
    assert ours == theirs
    assert [s for s, stepped in ours if not stepped] == [512.0, 256.0, 256.0, 256.0]
    assert all(torch.equal(a, b) for a, b in zip(p_ours, p_theirs))


def test_scaler_history_and_step_result() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=1.0)
    s = DynamicLossScaler(8.0, growth_interval=1)
    s.scale((w * 2).sum()).backward()
    assert torch.equal(w.grad, torch.full((3,), 16.0))  # scaled gradient
    assert s.step(opt) is True
    assert torch.equal(w.detach(), torch.full((3,), -1.0))  # true gradient 2 was applied
    s.update()
    assert s.get_scale() == 16.0
    opt.zero_grad()
    s.scale((w * math.inf).sum()).backward()
    assert s.step(opt) is False
    s.update()
    assert s.history == [(8.0, True), (16.0, False)] and s.get_scale() == 8.0
    assert "scale=8" in repr(s)


def test_scaler_misuse_raises() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    s = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="needs a step"):
        s.update()
    s.scale(w.sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    with pytest.raises(TypeError, match="Optimizer"):
        DynamicLossScaler().unscale_([w])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loss tensor"):
        s.scale(1.0)  # type: ignore[arg-type]


# ---- autocast weight copies -----------------------------------------------------------------


def test_saved_cast_copy_bytes_counts_autocast_weight_copies() -> None:
    from course_lib.precision import saved_cast_copy_bytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)

    def forward_bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).sum()

    # the first layer's input needs no grad, so only the second weight (16x4 in bf16) is saved
    assert saved_cast_copy_bytes(forward_bf16, model.parameters()) == 16 * 4 * 2
    assert saved_cast_copy_bytes(lambda: model(x).sum(), model.parameters()) == 0
    x.requires_grad_(True)
    assert saved_cast_copy_bytes(forward_bf16, model.parameters()) == (16 * 8 + 16 * 4) * 2
    assert saved_cast_copy_bytes(forward_bf16, []) == 0  # only casts of the given tensors count


def test_saved_cast_copy_bytes_validates() -> None:
    from course_lib.precision import saved_cast_copy_bytes

    with pytest.raises(TypeError, match="callable"):
        saved_cast_copy_bytes(1, [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        saved_cast_copy_bytes(lambda: None, torch.ones(2))
    with pytest.raises(TypeError, match="tensors only"):
        saved_cast_copy_bytes(lambda: None, [1.0])  # type: ignore[list-item]
