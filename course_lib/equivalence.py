"""Is a distributed run the same training as one process? A comparison that can see a gradient-scale bug.

Comparing losses (or parameters) after a few Adam steps cannot tell a right run from one whose gradients are all
multiplied by a constant: Adam divides each step by the root of its running mean of squared gradients, so a
constant factor ``c`` scales both and cancels, and the update, the parameters and the losses do not change. A rank
that sums where it should average (``c`` = world size), or an accumulation loop that forgets to divide by the number
of micro-batches (``c`` = micro-batches), passes such a check. The gradients themselves cannot hide it.

:func:`compare_gradients` compares a run's gradients (the first step's, before any optimizer has touched them;
or the global gradient norm before clipping, one number per step) with the one-process reference, relative to the
reference's size, and names the likely bug when the two differ by a clean factor. The notebooks' equivalence checks
(15 §1, 18 §3, 19 §2, 22 §2) and the labs share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .validation import check_int, check_number

__all__ = ["GradientMatch", "compare_gradients", "global_norm"]

# Clean factors a gradient-scale bug produces, and what usually causes each (k: the world size or micro-batches).
_CAUSES = {
    "world": "summed over the ranks where the mean belongs (divide by the world size once)",
    "1/world": "divided by the world size twice (or averaged a gradient that was already a mean)",
    "micro": "accumulated over the micro-batches without dividing each loss by their number",
    "1/micro": "divided by the number of micro-batches twice",
}


@dataclass(frozen=True)
class GradientMatch:
    """The outcome of :func:`compare_gradients`. Truthy when the gradients match within ``tolerance``."""

    ok: bool
    tolerance: float
    max_rel_error: float  # the largest, over the tensors, of |got - reference| / |reference| (Euclidean norms)
    norm_ratio: float  # |all of got| / |all of reference|: 1 for a right run, 2.0 for a sum over 2 ranks
    worst: str  # the name (or index) of the tensor with the largest relative error
    diagnosis: str  # the likely bug when the gradients differ by a clean factor, else ""
    against: str = "one process"  # what the reference is, for the printed line

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return (
                f"gradients equal {self.against}'s within {self.tolerance:g} (relative; largest error "
                f"~{self.max_rel_error:.1e}, norm ratio ~{self.norm_ratio:.6f})"
            )
        text = (
            f"gradients differ from {self.against}'s: relative error {self.max_rel_error:.3g} in {self.worst} "
            f"(tolerance {self.tolerance:g}), norm ratio {self.norm_ratio:.4f}"
        )
        return text + (f": {self.diagnosis}" if self.diagnosis else "")


def _as_list(grads: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor, name: str) -> list:
    if isinstance(grads, torch.Tensor):
        return [("0", grads)]
    if isinstance(grads, Mapping):
        items = list(grads.items())
    elif isinstance(grads, Sequence) and not isinstance(grads, (str, bytes)):
        items = [(str(i), g) for i, g in enumerate(grads)]
    else:
        raise TypeError(f"{name} must be a tensor, a sequence of tensors or a mapping of names to tensors")
    if not items:
        raise ValueError(f"{name} is empty: there is nothing to compare")
    for key, g in items:
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"{name}[{key!r}] must be a tensor, got {type(g).__name__}")
    return items


def global_norm(grads: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor) -> float:
    """The Euclidean norm of all the tensors together, in float64 (what ``clip_grad_norm_`` computes).

    >>> global_norm([torch.tensor([3.0]), torch.tensor([4.0])])
    5.0
    """
    items = _as_list(grads, "grads")
    return math.sqrt(sum(float(g.detach().double().pow(2).sum()) for _, g in items))


def compare_gradients(
    got: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor,
    reference: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor,
    *,
    tolerance: float = 1e-5,
    world_size: int | None = None,
    micro_batches: int | None = None,
    against: str = "one process",
) -> GradientMatch:
    """Compare a run's gradients with the one-process reference's, tensor by tensor, relative to the reference.

    ``got`` and ``reference``: tensors in the same order, or mappings with the same names (for a per-step gradient
    norm, pass the norms as 0-d tensors). Each tensor's error is ``|got - reference| / |reference|``; the match
    holds when the largest is at most ``tolerance``. When the whole set differs by about ``world_size`` or
    ``micro_batches`` (or their inverses), the result names the bug that usually causes it. ``against`` names the
    reference in the printed line ("one process", "DDP").

    >>> ref = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
    >>> bool(compare_gradients({"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}, ref))
    True
    >>> summed = {k: 2 * v for k, v in ref.items()}
    >>> compare_gradients(summed, ref, world_size=2).diagnosis.split(":")[0]
    "every gradient is 2 x the reference's"
    """
    if not isinstance(against, str) or not against.strip():
        raise ValueError("against must name the reference, such as 'one process'")
    tolerance = float(check_number("tolerance", tolerance, finite=True))
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if world_size is not None:
        check_int("world_size", world_size, minimum=1)
    if micro_batches is not None:
        check_int("micro_batches", micro_batches, minimum=1)
    got_items, ref_items = _as_list(got, "got"), _as_list(reference, "reference")
    if isinstance(got, Mapping) != isinstance(reference, Mapping):
        raise TypeError("got and reference must both be mappings (by name) or both sequences (by position)")
    if isinstance(got, Mapping):
        if set(dict(got_items)) != set(dict(ref_items)):
            missing = sorted(set(dict(ref_items)) - set(dict(got_items)))
            extra = sorted(set(dict(got_items)) - set(dict(ref_items)))
            raise ValueError(f"got and reference name different tensors: missing {missing}, unexpected {extra}")
        ref_map = dict(ref_items)
        pairs = [(k, g, ref_map[k]) for k, g in got_items]
    else:
        if len(got_items) != len(ref_items):
            raise ValueError(f"got has {len(got_items)} tensors, reference {len(ref_items)}")
        pairs = [(k, g, r) for (k, g), (_, r) in zip(got_items, ref_items)]
    worst, max_err = "", 0.0
    for key, g, r in pairs:
        if tuple(g.shape) != tuple(r.shape):
            raise ValueError(f"tensor {key!r}: got shape {tuple(g.shape)}, reference {tuple(r.shape)}")
        g64, r64 = g.detach().double().cpu(), r.detach().double().cpu()
        if not torch.isfinite(g64).all():
            return GradientMatch(False, tolerance, math.inf, math.nan, key, "a gradient holds inf or NaN", against)
        err = float((g64 - r64).norm()) / max(float(r64.norm()), 1e-30)
        if err > max_err or not worst:
            worst, max_err = key, err
    ref_norm = global_norm([r for _, _, r in pairs])
    ratio = global_norm([g for _, g, _ in pairs]) / ref_norm if ref_norm > 0 else math.inf
    ok = max_err <= tolerance
    diagnosis = "" if ok else _diagnose(ratio, world_size, micro_batches)
    return GradientMatch(ok, tolerance, max_err, ratio, worst, diagnosis, against)


def _diagnose(ratio: float, world_size: int | None, micro_batches: int | None) -> str:
    """The bug behind a clean scale factor between the gradients and the reference's, if there is one."""
    if not math.isfinite(ratio) or ratio <= 0:
        return "the gradients are zero where the reference's are not (were they ever reduced, or kept?)"
    candidates = []
    for key, k in (("world", world_size), ("micro", micro_batches)):
        if k is not None and k > 1:
            candidates += [(key, float(k)), (f"1/{key}", 1.0 / k)]
    causes = [(key, factor) for key, factor in candidates if abs(ratio / factor - 1) < 1e-3]
    if causes:  # with as many ranks as micro-batches a factor has two usual causes: name both
        return f"every gradient is {causes[0][1]:g} x the reference's: " + "; or ".join(_CAUSES[k] for k, _ in causes)
    if abs(ratio - 1) > 1e-3:
        return f"the gradients are {ratio:.4g} x the reference's in norm"
    return ""
