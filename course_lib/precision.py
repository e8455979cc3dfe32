"""Floating-point formats and dynamic loss scaling: the helpers behind the mixed-precision notebook.

Two jobs that belong together, because loss scaling exists only because of the fp16 format:

* **Format helpers** for ``torch.float32``, ``torch.float16`` and ``torch.bfloat16``:
  :func:`float_format` (bit layout and limits), :func:`bits_of` / :func:`from_bits` (the bits of a
  value and back), :func:`round_to`, :func:`neighbors` and :func:`ulp` (the nearest representable
  values and their spacing), :func:`classify` and :func:`describe` (the text of the format explorer).
* **Dynamic loss scaling**: :func:`update_scale` (the rule alone) and :class:`DynamicLossScaler`, the
  course's canonical scaler. It follows ``torch.amp.GradScaler``'s rule exactly (skip the step and
  multiply the scale by ``backoff_factor`` when a gradient is inf/NaN; multiply it by ``growth_factor``
  after ``growth_interval`` clean steps in a row), so the two give the same skip decisions, the same
  scale trajectory and bit-identical parameters; but it is plain Python that can be read in one sitting.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .validation import check_bool, check_int, check_number

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
    "has_inf_or_nan",
    "update_scale",
    "DynamicLossScaler",
    "saved_cast_copy_bytes",
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
    return f"{s[0]} {s[1:1 + fmt.exponent_bits]} {s[1 + fmt.exponent_bits:]}"


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
        raise ValueError("NaN has no neighbours")
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
        raise ValueError(f"{value} is not finite in {dtype}, so it has no spacing")
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


# ---- autocast's weight copies ------------------------------------------------------------------


def saved_cast_copy_bytes(run: Callable[[], Any], params: Iterable[torch.Tensor]) -> int:
    """Call ``run()`` and return the bytes autograd saves for backward that are dtype-cast copies of ``params``.

    Under ``torch.autocast`` a matmul casts its fp32 weight to the low-precision dtype; that copy is
    a new tensor (not the parameter), and autograd saves it for backward. A saved-tensor count that
    leaves out the parameters still includes these copies; this function measures them, each storage
    once, so they can be reported apart from the activations.
    """
    if not callable(run):
        raise TypeError(f"run must be a callable that runs the forward pass, got {type(run).__name__}")
    if isinstance(params, torch.Tensor):
        raise TypeError("params takes an iterable of tensors, e.g. model.parameters(), not one tensor")
    wanted = set()
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"params must contain tensors only, got {type(p).__name__}")
        wanted.add(id(p))
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = t._base if t._base is not None else t
        fn = base.grad_fn
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and fn.next_functions:
            source = getattr(fn.next_functions[0][0], "variable", None)
            storage = base.untyped_storage()
            if source is not None and id(source) in wanted and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return total


# ---- dynamic loss scaling ---------------------------------------------------------------------


def has_inf_or_nan(tensors: Iterable[torch.Tensor | None]) -> bool:
    """True when any of ``tensors`` (``None`` entries are skipped, like missing ``.grad``) holds inf or NaN."""
    found = False
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors (or None), got {type(t).__name__}")
        if not bool(torch.isfinite(t).all()):
            found = True
    return found


def _check_scaler_args(init_scale: Any, growth_factor: Any, backoff_factor: Any, growth_interval: Any) -> None:
    for name, x in (("init_scale", init_scale), ("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
        check_number(name, x, finite=True)
    if init_scale <= 0:
        raise ValueError(f"the loss scale must be positive, got {init_scale}")
    if growth_factor <= 1:
        raise ValueError(f"growth_factor must be > 1 (the scale has to grow back), got {growth_factor}")
    if not 0 < backoff_factor < 1:
        raise ValueError(f"backoff_factor must be strictly between 0 and 1 (the scale has to shrink), got {backoff_factor}")
    check_int("growth_interval", growth_interval, minimum=1)


def update_scale(
    scale: float,
    growth_tracker: int,
    found_inf: bool,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """One update of the dynamic loss-scaling rule; returns ``(new_scale, new_growth_tracker)``.

    * inf/NaN found: ``scale * backoff_factor`` and the count of clean steps restarts at 0;
    * otherwise the count grows by one; when it reaches ``growth_interval`` the scale is multiplied by
      ``growth_factor`` (kept only if still finite in fp32, where ``GradScaler`` stores it) and the count
      restarts at 0.

    >>> update_scale(1024.0, 0, True)
    (512.0, 0)
    >>> update_scale(1024.0, 1, False, growth_interval=2)
    (2048.0, 0)
    """
    _check_scaler_args(scale, growth_factor, backoff_factor, growth_interval)
    check_int("growth_tracker", growth_tracker, minimum=0)
    check_bool("found_inf", found_inf)
    if found_inf:
        return _fp32(scale * backoff_factor), 0
    tracker = growth_tracker + 1
    if tracker >= growth_interval:
        grown = _fp32(scale * growth_factor)
        return (grown if math.isfinite(grown) else scale), 0
    return scale, tracker


def _fp32(x: float) -> float:
    """Round a Python float to fp32, the precision ``GradScaler`` keeps its scale in."""
    return float(torch.tensor(x, dtype=torch.float64).to(torch.float32).item())


class DynamicLossScaler:
    """Dynamic loss scaling in plain Python, with the same rule and defaults as ``torch.amp.GradScaler``.

    Use it like ``GradScaler``::

        scaler = DynamicLossScaler()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)        # optional: e.g. to clip the true gradients
        stepped = scaler.step(optimizer)  # False when inf/NaN was found: the step is skipped
        scaler.update()

    Unlike ``GradScaler``, it works on any device, returns whether the step ran, rejects a
    non-positive scale, and keeps a :attr:`history` of ``(scale_used, stepped)`` per update.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
        self._scale = _fp32(float(init_scale))
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self.history: list[tuple[float, bool]] = []
        self._found_inf: bool | None = None  # None: unscale_ not called since the last update
        self._stepped: bool | None = None

    # ---- the loop's four calls ------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current loss scale."""
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (the scale as an fp32 scalar tensor, as ``GradScaler`` multiplies)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"scale() takes the loss tensor, got {type(loss).__name__}")
        return loss * torch.tensor(self._scale, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide every gradient of ``optimizer`` by the scale, in place; return whether any is inf/NaN.

        Call it at most once between two :meth:`update` calls (a second call would divide twice).
        """
        _check_optimizer(optimizer)
        if self._found_inf is not None:
            raise RuntimeError("unscale_() has already been called since the last update()")
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        inv = _fp32(1.0 / self._scale)  # GradScaler multiplies by the fp32 reciprocal
        found = False
        for g in grads:
            g.mul_(torch.tensor(inv, dtype=torch.float32, device=g.device).to(g.dtype))
            found = found or not bool(torch.isfinite(g).all())
        self._found_inf = found
        return found

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (unless :meth:`unscale_` already did) and run ``optimizer.step()`` unless inf/NaN was found.

        Returns True when the optimizer stepped, False when the step was skipped.
        """
        if self._found_inf is None:
            self.unscale_(optimizer)
        assert self._found_inf is not None
        self._stepped = not self._found_inf
        if self._stepped:
            optimizer.step()
        return self._stepped

    def update(self) -> None:
        """Apply the rule of :func:`update_scale` once per iteration, after :meth:`step`."""
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) in this iteration first")
        self.history.append((self._scale, bool(self._stepped)))
        self._scale, self.growth_tracker = update_scale(
            self._scale,
            self.growth_tracker,
            self._found_inf,
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            growth_interval=self.growth_interval,
        )
        self._found_inf = None
        self._stepped = None

    def state_dict(self) -> dict[str, float | int]:
        """The same keys as ``GradScaler.state_dict()``."""
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.growth_tracker,
        }

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self._scale:g}, growth_factor={self.growth_factor:g}, "
            f"backoff_factor={self.backoff_factor:g}, growth_interval={self.growth_interval}, "
            f"growth_tracker={self.growth_tracker})"
        )


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
