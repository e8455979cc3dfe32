"""Checks for notebook 04 (where training memory goes, and gradient checkpointing)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..checkpointing import deep_chain
from ..memory import state_bytes, step_peak_memory
from ..validation import is_int
from .core import Wrong, as_number, call_learner, exercise, grads_of

__all__ = ["check_bn_momentum", "check_sqrt_checkpointing", "check_optimizer_state_bytes"]


@exercise(
    "BatchNorm momentum", todo="write corrected_momentum(m) returning PyTorch's momentum for a checkpointed BatchNorm"
)
def check_bn_momentum(corrected_momentum: Any) -> str:
    for m in (0.1, 0.01, 0.3, 0.5):
        got = as_number(call_learner(corrected_momentum, m), f"corrected_momentum({m})")
        want = 1 - math.sqrt(1 - m)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if math.isclose(got, math.sqrt(m), rel_tol=1e-6):
            raise Wrong(
                "sqrt(m) is the seed's recipe, right only where momentum weighs the OLD value; "
                "PyTorch's weighs the NEW batch statistic"
            )
        if math.isclose(got, math.sqrt(1 - m), rel_tol=1e-6):
            raise Wrong(
                "sqrt(1 - m) is the corrected weight of the OLD value; PyTorch's momentum is the weight of the NEW one"
            )
        if math.isclose(got, m / 2, rel_tol=1e-6):
            raise Wrong("m / 2 is close for small m but not exact: two updates keep (1 - m')**2 of the old value")
        raise Wrong(
            f"corrected_momentum({m}) returned {got:.6f}; "
            "two updates with it must keep the same share (1 - m) of the old running value"
        )
    return "two updates with 1 - sqrt(1 - m) equal one update with m"


@exercise(
    "sqrt(N) checkpointing",
    todo="write forward(model, x) that runs the chain through checkpoint_sequential with about sqrt(N) segments",
)
def check_sqrt_checkpointing(forward: Any) -> str:
    depth, width, batch = 64, 8, 256
    model = deep_chain(depth, width, seed=3)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(4), requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call_learner(forward, model, x)
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"forward should return the model's output tensor, got {type(out).__name__}")
    if any("use_reentrant" in str(w.message) for w in caught):
        raise Wrong("PyTorch warned that use_reentrant was not passed: pass use_reentrant=False explicitly")
    with torch.no_grad():
        ref = model(x)
    if out.shape != ref.shape or not torch.allclose(out, ref, atol=1e-6):
        raise Wrong("the output differs from model(x): run every block, in order")
    if not out.requires_grad:
        raise Wrong("the output does not require grad: do not run the model under torch.no_grad()")
    plain = step_peak_memory(model, x)
    plain_grads = grads_of(model.parameters())
    ckpt = step_peak_memory(model, x, forward=lambda m, t: call_learner(forward, m, t))
    if not all(
        p.grad is not None and torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(model.parameters(), plain_grads)
    ):
        raise Wrong("the parameter gradients differ from the plain model's")
    ratio = plain.peak_bytes / max(ckpt.peak_bytes, 1)
    if ratio < 2.5:
        raise Wrong(
            f"the peak is only {ratio:.1f}x lower than without checkpointing; "
            f"with about sqrt({depth}) = 8 segments expect 3x or more"
        )
    return f"same output and gradients, peak {ratio:.1f}x lower than without checkpointing"


_OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
}


@exercise("optimizer state", todo="write state_size(model, name) predicting the optimizer-state bytes after one step")
def check_optimizer_state_bytes(state_size: Any) -> str:
    model = torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.ReLU(), torch.nn.Linear(30, 7, bias=False))
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0))
    for name, make in _OPTIMIZERS.items():
        predicted = call_learner(state_size, model, name)
        if not is_int(predicted):
            raise Wrong(
                f"state_size(model, {name!r}) should return an int number of bytes, got {type(predicted).__name__}"
            )
        opt = make(model.parameters())
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        measured = state_bytes(model, opt).optimizer_state
        if predicted == measured:
            continue
        n_tensors = len(list(model.parameters()))
        if name == "adam" and measured - predicted == 4 * n_tensors:
            raise Wrong(
                "almost: Adam also keeps a 'step' counter per parameter tensor, a float32 scalar tensor (4 bytes each)"
            )
        raise Wrong(f"for {name!r} you predicted {predicted} bytes, the optimizer holds {measured}")
    return "SGD keeps nothing, momentum one buffer per parameter, Adam two plus a step counter per tensor"
