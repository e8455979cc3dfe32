"""Checks for notebook 02 (computation graphs)."""

from __future__ import annotations

from typing import Any

import torch

from .core import Wrong, call_learner, exercise

__all__ = ["check_grad_norm_logger", "check_mul_saves", "check_fresh_grad", "check_two_backwards"]


def _saved_by_mul_of_input_and_weight() -> set[str]:
    x = torch.randn(3)  # an input: no gradient needed
    w = torch.randn(3, requires_grad=True)  # a weight
    y = x * w
    return {
        a[len("_saved_") :]
        for a in dir(y.grad_fn)
        if a.startswith("_saved_") and isinstance(getattr(y.grad_fn, a), torch.Tensor)
    }


@exercise("what MulBackward0 saves", todo="set `saved` to the set of names MulBackward0 keeps for y = x * w")
def check_mul_saves(saved: Any) -> str:
    if isinstance(saved, (list, tuple)):
        saved = set(saved)
    if not isinstance(saved, (set, frozenset)) or not all(isinstance(s, str) for s in saved):
        raise Wrong("`saved` should be a set of names, e.g. {'self'} or {'self', 'other'}")
    truth = _saved_by_mul_of_input_and_weight()
    if saved == truth:
        return "only x (`self`) is kept: w's gradient is grad * x, and x needs no gradient"
    if saved == {"self", "other"}:
        raise Wrong("both would be kept only if both required grad; x does not, so w itself is not needed")
    if saved == {"other"}:
        raise Wrong("`other` is w. Which value does w's gradient, d(x*w)/dw = x, need?")
    if not saved:
        raise Wrong("something must be kept: w's gradient is grad * x")
    raise Wrong(f"MulBackward0 names its inputs `self` (x) and `other` (w); {sorted(saved)} is not it")


@exercise("a fresh gradient", todo="write fresh_grad(w, loss_fn) as described above")
def check_fresh_grad(fresh_grad: Any) -> str:
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    w.grad = torch.full((3,), 5.0)  # a stale gradient from "an earlier step"

    def loss_fn(t: torch.Tensor) -> torch.Tensor:
        return (t**3).sum()

    expected = 3 * w.detach() ** 2
    result = call_learner(fresh_grad, w, loss_fn)
    if not isinstance(result, torch.Tensor):
        raise Wrong(f"fresh_grad should return a tensor (w.grad), not {type(result).__name__}")
    if result.shape != w.shape:
        raise Wrong(f"the gradient should have w's shape {tuple(w.shape)}, got {tuple(result.shape)}")
    if torch.allclose(result, expected + 5.0):
        raise Wrong("the old gradient (5.0) was added in: backward() accumulates, so set w.grad = None first")
    if torch.allclose(result, torch.full((3,), 5.0)):
        raise Wrong("that is the stale gradient: call loss_fn(w).backward() and return w.grad")
    if not torch.allclose(result, expected):
        raise Wrong("that is not d loss / d w: call loss_fn(w).backward() and return w.grad")
    if w.grad is None or not torch.allclose(w.grad, expected):
        raise Wrong("return the gradient and leave it in w.grad as well")
    return "reset, then backward: exactly what optimizer.zero_grad() is for"


@exercise("two backward passes", todo="write two_backwards(w) as described above")
def check_two_backwards(two_backwards: Any) -> str:
    w = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    result = call_learner(two_backwards, w)
    if not isinstance(result, torch.Tensor):
        raise Wrong(f"two_backwards should return w.grad, a tensor, not {type(result).__name__}")
    expected = 2 * torch.cos(w.detach())
    if result.shape != w.shape:
        raise Wrong(f"the gradient should have w's shape {tuple(w.shape)}, got {tuple(result.shape)}")
    if torch.allclose(result, expected / 2):
        raise Wrong("that is one backward's gradient: the second backward() should add another cos(w)")
    if not torch.allclose(result, expected):
        raise Wrong("after two backward passes through y = sin(w).sum(), w.grad should be 2 * cos(w)")
    return "retain_graph=True on the first backward keeps the saved tensors for the second"


def _logger_model() -> torch.nn.Sequential:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    model[0].bias.requires_grad_(False)  # frozen: it gets no gradient, so no entry
    return model


def _backward_through_hooks(model: torch.nn.Module, batch: torch.Tensor) -> None:
    try:  # the learner's hooks run inside this backward
        model(batch).square().sum().backward()
    except Exception as e:
        raise Wrong(f"your hook raised {type(e).__name__} during backward: {e} (a hook should return None)") from None


def _norms(model: torch.nn.Module) -> dict[str, float]:
    return {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}


@exercise("a gradient-norm logger", todo="write log_grad_norms(model) as described above")
def check_grad_norm_logger(log_grad_norms: Any) -> str:
    model = _logger_model()
    try:
        result = call_learner(log_grad_norms, model)
    except Wrong as e:
        if "doesn't require gradient" in str(e):
            raise Wrong(f"{e} (skip the parameters with requires_grad=False: a frozen one gets no gradient)") from None
        raise
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Wrong("return a pair (norms, handles): the dict the hooks fill, and the list of their handles")
    norms, handles = result
    if not isinstance(norms, dict) or not isinstance(handles, list):
        raise Wrong("return (norms, handles) with norms a dict and handles a list")
    if not handles or not all(callable(getattr(h, "remove", None)) for h in handles):
        raise Wrong("handles should hold what each register_... call returned (they have a .remove())")
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(3, 4, generator=gen) for _ in range(2)]
    _backward_through_hooks(model, batches[0])
    one = _norms(model)
    _backward_through_hooks(model, batches[1])  # a second micro-batch, accumulated
    expected = _norms(model)
    if len(norms) == 1 and len(expected) > 1:
        raise Wrong(
            f"norms has one entry, {sorted(map(str, norms))}: every hook wrote under the same name. A lambda in a "
            "loop reads the loop variable when it runs, not when it was made: bind it as a default "
            "(lambda p, name=name: ...)"
        )
    if set(norms) != set(expected):
        raise Wrong(
            f"norms should have one entry per parameter that gets a gradient, {sorted(expected)}; "
            f"it has {sorted(map(str, norms))} (a frozen parameter gets no gradient and no entry)"
        )
    got = {k: float(v) for k, v in norms.items()}
    if all(abs(got[k] - expected[k]) <= 1e-5 * max(1.0, expected[k]) for k in expected):
        pass
    elif all(abs(got[k] - one[k]) <= 1e-5 * max(1.0, one[k]) for k in one):
        raise Wrong("the norms are the first micro-batch's: record the norm each time the hook runs")
    else:
        raise Wrong(
            "the norms are not those of the accumulated p.grad: a tensor hook (register_hook) sees one "
            "backward's gradient before it is added; register_post_accumulate_grad_hook sees the sum"
        )
    for h in handles:
        h.remove()
    _backward_through_hooks(model, batches[0])
    if any(abs(float(norms[k]) - expected[k]) > 1e-5 * max(1.0, expected[k]) for k in expected):
        raise Wrong("after every handle's remove() the hooks still ran: return the handles of all of them")
    return "post-accumulate hooks see .grad after each accumulation; DDP starts its all-reduces from the same place"
