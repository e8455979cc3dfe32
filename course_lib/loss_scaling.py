"""Dynamic loss scaling: the course's canonical scaler, the one notebook 06 compares with ``GradScaler``.

Loss scaling exists because of the fp16 format (:mod:`course_lib.float_formats`): small gradients
underflow to zero unless the loss is multiplied by a large scale before backward.

* :func:`update_scale` is the rule alone;
* :class:`DynamicLossScaler` is a scaler built on it. It follows ``torch.amp.GradScaler``'s rule
  exactly (skip the step and multiply the scale by ``backoff_factor`` when a gradient is inf/NaN;
  multiply it by ``growth_factor`` after ``growth_interval`` clean steps in a row), so the two give
  the same skip decisions, the same scale trajectory and bit-identical parameters; but it is plain
  Python that can be read in one sitting.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .validation import check_bool, check_int, check_number

__all__ = ["update_scale", "DynamicLossScaler"]


def _check_scaler_args(init_scale: Any, growth_factor: Any, backoff_factor: Any, growth_interval: Any) -> None:
    for name, x in (("init_scale", init_scale), ("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
        check_number(name, x, finite=True)
    if init_scale <= 0:
        raise ValueError(f"the loss scale must be positive, got {init_scale}")
    if growth_factor <= 1:
        raise ValueError(f"growth_factor must be > 1 (the scale has to grow back), got {growth_factor}")
    if not 0 < backoff_factor < 1:
        raise ValueError(
            f"backoff_factor must be strictly between 0 and 1 (the scale has to shrink), got {backoff_factor}"
        )
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
