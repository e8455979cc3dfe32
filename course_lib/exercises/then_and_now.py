"""Checks for notebook 23 (the posts' APIs, then and now)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .core import NotDone, Wrong, call_learner, exercise

__all__ = ["RunConfig", "check_modern_step", "check_load_trusted"]

_STEPS = 5
_INIT_SCALE = 2.0**20  # high enough that the first two steps' float16 gradients overflow: the scaler backs off
_MAX_NORM = 0.5


class RunConfig:
    """A training run's settings saved next to the weights: a class, so ``weights_only`` loading refuses it."""

    def __init__(self, lr: float = 0.1, warmup: int = 100) -> None:
        self.lr, self.warmup = lr, warmup

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and (self.lr, self.warmup) == (other.lr, other.warmup)

    __hash__ = None  # type: ignore[assignment]


class _Payload:
    """What a hostile checkpoint holds: unpickling it opens (creates) a file, standing for any code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def _setup() -> tuple[
    nn.Sequential, torch.optim.Optimizer, torch.amp.GradScaler, list[tuple[torch.Tensor, torch.Tensor]]
]:
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=_INIT_SCALE)
    batches = [(torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)) for _ in range(_STEPS)]
    return model, opt, scaler, batches


def _reference(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    x: torch.Tensor,
    y: torch.Tensor,
    max_norm: float,
    unscale: bool = True,
) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if unscale:
        scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return loss


def _run(step: Any, *, learner: bool, unscale: bool = True) -> tuple[list[torch.Tensor], list[float], list[str]]:
    model, opt, scaler, batches = _setup()
    seen: list[str] = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(str(o.dtype).removeprefix("torch.")))
    scales = []
    for x, y in batches:
        if learner:
            got = call_learner(step, model, opt, scaler, x, y, _MAX_NORM)
            if not isinstance(got, torch.Tensor) or got.numel() != 1:
                raise Wrong(f"modern_step should return the loss (a one-element tensor), got {got!r}")
        else:
            _reference(model, opt, scaler, x, y, _MAX_NORM, unscale=unscale)
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in model.parameters()], scales, seen


@exercise(
    "the posts' loop, today",
    todo="write modern_step(model, optimizer, scaler, x, y, max_norm): fp16 autocast, GradScaler, clipping",
)
def check_modern_step(modern_step: Any) -> str:
    params, scales, seen = _run(modern_step, learner=True)
    want_params, want_scales, _ = _run(None, learner=False)
    if seen and any(dtype != "float16" for dtype in seen):
        raise Wrong(
            f"the first layer computed in {seen[0]}: run the forward under torch.autocast('cpu', torch.float16)"
        )
    if scales[-1] == _INIT_SCALE:
        raise Wrong(
            f"the scale stayed at {_INIT_SCALE:.0f} though the first steps' gradients overflowed: call scaler.update()"
            " after scaler.step(optimizer)"
        )
    if any(not torch.isfinite(p).all() for p in params):
        raise Wrong("the weights hold inf or NaN: step through scaler.step(optimizer), which skips overflowed steps")
    if scales != want_scales:
        raise Wrong(
            f"the scale went {scales}, expected {want_scales}: scale the loss once, update once per step, and zero"
            " the gradients every step (a skipped step leaves its inf gradients behind otherwise)"
        )
    if all(torch.allclose(p, q, rtol=1e-5, atol=1e-7) for p, q in zip(params, want_params, strict=True)):
        return (
            f"the scale backed off {want_scales[0]:.0f} -> {want_scales[-1]:.0f} while float16 gradients overflowed,"
            " and clipping saw the true gradients"
        )
    clipped_scaled, _, _ = _run(None, learner=False, unscale=False)
    if all(torch.allclose(p, q, rtol=1e-5, atol=1e-7) for p, q in zip(params, clipped_scaled, strict=True)):
        raise Wrong("clipping saw the scaled gradients: call scaler.unscale_(optimizer) before clip_grad_norm_")
    raise Wrong(
        f"the weights after {_STEPS} steps differ from autocast + scaler.scale(loss).backward() + unscale_ + clipping"
        " to max_norm + scaler.step + scaler.update"
        f" (zero the gradients each step; clip to max_norm={_MAX_NORM})"
    )


@exercise(
    "loading a checkpoint you trust",
    todo="write load_trusted(path, trusted): torch.load with weights_only=True, allowing only the classes in trusted",
)
def check_load_trusted(load_trusted: Any) -> str:
    before = torch.serialization.get_safe_globals()
    state = {"weight": torch.arange(6.0).reshape(2, 3)}
    with tempfile.TemporaryDirectory() as tmp:
        good, bad, marker = (os.path.join(tmp, name) for name in ("good.pt", "bad.pt", "ran_code"))
        torch.save({"model": state, "config": RunConfig(0.3, 7)}, good)
        torch.save({"model": state, "config": _Payload(marker)}, bad)
        try:
            got = call_learner(load_trusted, good, [RunConfig])
        except Wrong as error:
            if "Weights only load failed" in str(error):
                raise Wrong(
                    "the trusted RunConfig was refused: allow the classes in trusted, inside"
                    " torch.serialization.safe_globals(trusted)"
                ) from None
            raise
        finally:
            leaked = [g for g in torch.serialization.get_safe_globals() if g not in before]
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(before)
        if leaked:
            raise Wrong(
                "the allowed classes stayed allowed for every later torch.load in the process: use the"
                " torch.serialization.safe_globals(trusted) context, not add_safe_globals"
            )
        if not isinstance(got, dict) or got.get("config") != RunConfig(0.3, 7):
            raise Wrong(f"load_trusted should return the saved dict with its RunConfig, got {got!r}")
        if not torch.equal(got["model"]["weight"], state["weight"]):
            raise Wrong("the weights loaded differ from the ones saved")
        refused = False
        try:
            call_learner(load_trusted, bad, [RunConfig])
        except Wrong:
            refused = True
        except NotDone:
            refused = False
        if os.path.exists(marker):
            raise Wrong("loading the hostile file ran its code: keep weights_only=True (the default since 2.6)")
        if not refused:
            raise Wrong("the hostile file loaded without an error: only the classes in trusted may be unpickled")
    return "weights_only=True with a scoped allowlist: the trusted class loads, the hostile file is refused unrun"
