"""Floating-point formats bit by bit: the format explorer of the floating-point notebook (06).

For ``torch.float32``, ``torch.float16`` and ``torch.bfloat16``: :func:`float_format` (bit layout
and limits), :func:`bits_of` / :func:`from_bits` (the bits of a value and back), :func:`round_to`,
:func:`neighbors` and :func:`ulp` (the nearest representable values and their spacing),
:func:`classify` and :func:`describe` (the text of the format explorer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .validation import check_number

__all__ = [
    "FORMATS",
    "FloatFormat",
    "float_format",
    "bits_of",
    "from_bits",
    "round_to",
    "neighbors",
    "ulp",
    "classify",
    "describe",
]

FORMATS: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_EXPONENT_BITS = {torch.float32: 8, torch.float16: 5, torch.bfloat16: 8}


def _check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (one of fp32, fp16, bf16), got {type(dtype).__name__}")
    if dtype not in _SHORT:
        allowed = ", ".join(str(d) for d in FORMATS)
        raise ValueError(f"dtype must be one of {allowed}; got {dtype}")
    return dtype


def _check_value(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"value must be a single number, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    return float(check_number("value", value, what="a real number"))


@dataclass(frozen=True)
class FloatFormat:
    """Bit layout and limits of one floating-point format (all limits are positive values)."""

    dtype: torch.dtype
    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 of a normal number is implicit)
    bias: int
    max: float  # largest finite value
    smallest_normal: float  # 2 ** (1 - bias): below it, numbers lose precision (subnormals)
    smallest_subnormal: float  # 2 ** (1 - bias - mantissa_bits): the smallest positive value
    eps: float  # gap between 1 and the next representable number

    def lines(self) -> list[str]:
        """A short deterministic description, one fact per line."""
        return [
            f"{self.name}: {self.bits} bits = 1 sign + {self.exponent_bits} exponent + {self.mantissa_bits} mantissa"
            f" (bias {self.bias})",
            f"  max                {self.max:.6g}",
            f"  smallest normal    {self.smallest_normal:.6g} = 2^{1 - self.bias}",
            f"  smallest subnormal {self.smallest_subnormal:.6g} = 2^{1 - self.bias - self.mantissa_bits}",
            f"  eps (1 -> next)    {self.eps:.6g} = 2^-{self.mantissa_bits}",
        ]


def float_format(dtype: torch.dtype) -> FloatFormat:
    """The layout and limits of ``dtype``, read from ``torch.finfo`` (which has no smallest subnormal:
    it is computed as ``smallest_normal * eps``).

    >>> float_format(torch.float16).max
    65504.0
    """
    dtype = _check_dtype(dtype)
    fi = torch.finfo(dtype)
    e = _EXPONENT_BITS[dtype]
    m = fi.bits - 1 - e
    return FloatFormat(
        dtype=dtype,
        name=_SHORT[dtype],
        bits=fi.bits,
        exponent_bits=e,
        mantissa_bits=m,
        bias=2 ** (e - 1) - 1,
        max=float(fi.max),
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_normal) * float(fi.eps),
        eps=float(fi.eps),
    )


def round_to(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to the nearest ``dtype`` number (ties to even), as a Python float.

    >>> round_to(1 + 1e-4, torch.float16)
    1.0
    """
    v = _check_value(value)
    return float(torch.tensor(v, dtype=torch.float64).to(_check_dtype(dtype)).item())


def bits_of(value: float, dtype: torch.dtype) -> str:
    """The bits of ``value`` rounded to ``dtype``, as ``"sign exponent mantissa"``.

    >>> bits_of(1.0, torch.float16)
    '0 01111 0000000000'
    """
    dtype = _check_dtype(dtype)
    v = _check_value(value)
    fmt = float_format(dtype)
    raw = int(torch.tensor(v, dtype=torch.float64).to(dtype).view(_INT_VIEW[dtype]).item())
    raw &= (1 << fmt.bits) - 1  # two's complement view -> unsigned bit pattern
    s = format(raw, f"0{fmt.bits}b")
    return f"{s[0]} {s[1 : 1 + fmt.exponent_bits]} {s[1 + fmt.exponent_bits :]}"


def from_bits(bits: str, dtype: torch.dtype) -> float:
    """The value of a bit pattern (spaces allowed), the inverse of :func:`bits_of`.

    >>> from_bits("0 01111 0000000000", torch.float16)
    1.0
    """
    dtype = _check_dtype(dtype)
    if not isinstance(bits, str):
        raise TypeError(f"bits must be a string of 0s and 1s, got {type(bits).__name__}")
    s = bits.replace(" ", "").replace("_", "")
    n = torch.finfo(dtype).bits
    if len(s) != n or set(s) - {"0", "1"}:
        raise ValueError(f"bits must hold exactly {n} characters 0/1 for {dtype} (spaces allowed), got {bits!r}")
    raw = int(s, 2)
    if raw >= 1 << (n - 1):  # back to the signed integer the int view expects
        raw -= 1 << n
    return float(torch.tensor(raw, dtype=_INT_VIEW[dtype]).view(dtype).item())


def neighbors(value: float, dtype: torch.dtype) -> tuple[float, float, float]:
    """``(below, nearest, above)``: ``value`` rounded to ``dtype`` and the representable numbers on each side.

    >>> neighbors(1.0, torch.bfloat16)
    (0.99609375, 1.0, 1.0078125)
    """
    dtype = _check_dtype(dtype)
    v = _check_value(value)
    if math.isnan(v):
        raise ValueError("value must not be NaN: NaN has no neighbours")
    x = torch.tensor(v, dtype=torch.float64).to(dtype)
    inf = torch.tensor(math.inf, dtype=dtype)
    below = torch.nextafter(x, -inf)
    above = torch.nextafter(x, inf)
    return float(below.item()), float(x.item()), float(above.item())


def ulp(value: float, dtype: torch.dtype) -> float:
    """The gap between ``|value|`` rounded to ``dtype`` and the next larger representable number
    (for the largest finite number, the gap to the one below it).

    An update smaller than half of it is lost when added in ``dtype``.

    >>> ulp(1.0, torch.float16)
    0.0009765625
    """
    v = abs(_check_value(value))
    dtype = _check_dtype(dtype)
    if not math.isfinite(v) or abs(round_to(v, dtype)) == math.inf:
        raise ValueError(f"value {value} is not finite in {dtype}, so it has no spacing")
    below, near, above = neighbors(v, dtype)
    return above - near if math.isfinite(above) else near - below  # at max: the spacing below it


def classify(value: float, dtype: torch.dtype) -> str:
    """What ``value`` becomes in ``dtype``: ``'zero'``, ``'subnormal'``, ``'normal'``, ``'inf'`` or ``'nan'``."""
    r = round_to(value, dtype)
    if math.isnan(r):
        return "nan"
    if math.isinf(r):
        return "inf"
    if r == 0:
        return "zero"
    return "subnormal" if abs(r) < float_format(dtype).smallest_normal else "normal"


def describe(value: float, dtypes: Iterable[torch.dtype] = FORMATS) -> str:
    """The format explorer's text: ``value`` in each format, its bits, neighbours and relative error."""
    v = _check_value(value)
    dtypes = list(dtypes)
    if not dtypes:
        raise ValueError("dtypes must name at least one format")
    lines = [f"value {v:.10g}"]
    for dt in dtypes:
        fmt = float_format(dt)
        kind = classify(v, dt)
        r = round_to(v, dt)
        line = f"  {fmt.name}: {bits_of(v, dt):<34} -> {r:.10g} ({kind}"
        if kind in ("normal", "subnormal") and v != 0:
            line += f", rel. error {abs(r - v) / abs(v):.2e}"
        line += ")"
        lines.append(line)
        if kind in ("normal", "subnormal", "zero"):
            below, _, above = neighbors(v, dt)
            lines.append(f"        neighbours {below:.10g} | {above:.10g}")
    return "\n".join(lines)
