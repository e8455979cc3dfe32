"""course_lib.float_formats: bit layouts, rounding, neighbours and the format explorer's text."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.float_formats import (
    FORMATS,
    bits_of,
    classify,
    describe,
    float_format,
    from_bits,
    neighbors,
    round_to,
    ulp,
)


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
