"""Dynamic loss scaling: the course's canonical scaler, the one notebook 06 compares with ``GradScaler``.

Loss scaling exists because of the fp16 format (:mod:`course_lib.float_formats`): small gradients
underflow to zero unless the loss is multiplied by a large scale before backward.

* :func:`update_scale` is the rule alone;
* :class:`DynamicLossScaler` is a scaler built on the same rule. It follows ``torch.amp.GradScaler``
  exactly (skip the step and multiply the scale by ``backoff_factor`` when a gradient is inf/NaN;
  multiply it by ``growth_factor`` after ``growth_interval`` clean steps in a row), so the two give
  the same skip decisions, the same scale trajectory and bit-identical parameters; but it is plain
  Python that can be read in one sitting. Like ``GradScaler`` it keeps the scale, the count of clean
  steps and the inf/NaN flag as tensors on the gradients' device: finding inf/NaN and updating the
  scale never wait for the device, and the one read of the flag is the step's decision to skip
  (``GradScaler`` reads it there too). Its ``state_dict``/``load_state_dict`` checkpoint it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .validation import check_bool, check_int, check_number

__all__ = ["update_scale", "DynamicLossScaler"]


def _check_scaler_args(
    init_scale: Any, growth_factor: Any, backoff_factor: Any, growth_interval: Any, *, scale_name: str = "init_scale"
) -> None:
    for name, x in ((scale_name, init_scale), ("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
        check_number(name, x, finite=True)
    if init_scale <= 0:
        raise ValueError(f"{scale_name} (the loss scale) must be positive, got {init_scale}")
    if not 0 < _fp32(float(init_scale)) < math.inf:
        raise ValueError(f"{scale_name}={init_scale} is not representable in fp32, where the scale is kept")
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
    _check_scaler_args(scale, growth_factor, backoff_factor, growth_interval, scale_name="scale")
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

    The scale, the count of clean steps and the inf/NaN flag are tensors on the loss's device (moved there by
    the first :meth:`scale`). :meth:`unscale_` and :meth:`update` only launch tensor operations, never read a
    value back; :meth:`step` reads the flag once, to decide whether to step, as ``GradScaler`` does.
    Unlike ``GradScaler``, it works on any device, returns whether the step ran, rejects a non-positive scale,
    and keeps a :attr:`history` of ``(scale_used, stepped)`` per update.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
        self._scale = torch.tensor(float(init_scale), dtype=torch.float32)
        self._tracker = torch.zeros((), dtype=torch.int32)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self._history: list[tuple[torch.Tensor, bool]] = []
        self._found_inf: torch.Tensor | None = None  # None: unscale_ not called since the last update
        self._stepped: bool | None = None

    # ---- the loop's four calls ------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current loss scale (reads it from its device)."""
        return float(self._scale.item())

    @property
    def growth_tracker(self) -> int:
        """Clean steps in a row since the scale last changed (reads it from its device)."""
        return int(self._tracker.item())

    @property
    def history(self) -> list[tuple[float, bool]]:
        """``(scale used, stepped)`` for every :meth:`update` so far (read from the device when asked)."""
        return [(float(scale.item()), stepped) for scale, stepped in self._history]

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (the scale as an fp32 scalar tensor, as ``GradScaler`` multiplies)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"scale() takes the loss tensor, got {type(loss).__name__}")
        if self._scale.device != loss.device:
            self._scale, self._tracker = self._scale.to(loss.device), self._tracker.to(loss.device)
        return loss * self._scale

    def unscale_(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Divide every gradient of ``optimizer`` by the scale, in place; return the inf/NaN flag (a 0-d tensor).

        Call it at most once between two :meth:`update` calls (a second call would divide twice).
        """
        _check_optimizer(optimizer)
        if self._found_inf is not None:
            raise RuntimeError("unscale_() has already been called since the last update()")
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        inv = self._scale.double().reciprocal().float()  # GradScaler multiplies by the fp32 reciprocal
        found = torch.zeros((), dtype=torch.bool, device=self._scale.device)
        for g in grads:
            g.mul_(inv.to(device=g.device, dtype=g.dtype))
            found = found | ~torch.isfinite(g).all().to(found.device)
        self._found_inf = found
        return found

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (unless :meth:`unscale_` already did) and run ``optimizer.step()`` unless inf/NaN was found.

        Returns True when the optimizer stepped, False when the step was skipped. Reading the flag here is the
        one wait for the device per iteration (``GradScaler`` waits at the same place).
        """
        if self._found_inf is None:
            self.unscale_(optimizer)
        assert self._found_inf is not None
        self._stepped = not bool(self._found_inf.item())
        if self._stepped:
            optimizer.step()
        return self._stepped

    def update(self) -> None:
        """Apply the rule of :func:`update_scale` once per iteration, after :meth:`step`, on the device."""
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) in this iteration first")
        self._history.append((self._scale.clone(), bool(self._stepped)))
        found, tracker = self._found_inf, self._tracker + 1
        grow = tracker >= self.growth_interval
        grown = self._scale * self.growth_factor
        grown = torch.where(torch.isfinite(grown), grown, self._scale)  # kept only if still finite in fp32
        self._scale = torch.where(found, self._scale * self.backoff_factor, torch.where(grow, grown, self._scale))
        self._tracker = torch.where(found | grow, torch.zeros_like(tracker), tracker)
        self._found_inf = None
        self._stepped = None

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, float | int]:
        """The same keys and values as ``GradScaler.state_dict()``."""
        return {
            "scale": self.get_scale(),
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.growth_tracker,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (or from a ``GradScaler``'s: the same keys)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be the dict state_dict() returned, got {type(state).__name__}")
        missing = sorted(
            {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state)
        )
        if missing:
            raise ValueError(f"state is missing {missing}: pass what state_dict() returned")
        _check_scaler_args(
            state["scale"],
            state["growth_factor"],
            state["backoff_factor"],
            state["growth_interval"],
            scale_name="state['scale']",
        )
        check_int("state['_growth_tracker']", state["_growth_tracker"], minimum=0)
        device = self._scale.device
        self._scale = torch.tensor(float(state["scale"]), dtype=torch.float32, device=device)
        self._tracker = torch.tensor(state["_growth_tracker"], dtype=torch.int32, device=device)
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self.get_scale():g}, growth_factor={self.growth_factor:g}, "
            f"backoff_factor={self.backoff_factor:g}, growth_interval={self.growth_interval}, "
            f"growth_tracker={self.growth_tracker})"
        )


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
