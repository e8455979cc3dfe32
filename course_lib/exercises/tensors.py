"""Checks for notebook 01 (tensors and parameters)."""

from __future__ import annotations

from typing import Any

import torch

from .core import NotDone, Wrong, call_learner, exercise, grads_of, is_placeholder

__all__ = ["LEAF_QUESTION", "check_freeze_for_finetuning", "check_leaves", "check_module_state", "check_sgd_step"]

# The code the leaf exercise asks about; the notebook prints it, the check runs it.
LEAF_QUESTION = """\
x = torch.randn(3)                      # an input batch
w = torch.randn(3, requires_grad=True)  # a weight
x2 = x * 2                              # preprocessing of the input
h = x2 * w
loss = h.sum()
"""


def _leaf_facts() -> dict[str, bool]:
    scope: dict[str, Any] = {"torch": torch}
    exec(LEAF_QUESTION, scope)
    return {name: bool(scope[name].is_leaf) for name in ("x", "w", "x2", "h", "loss")}


_LEAF_HINTS = {
    "x": "`x` was created by you (torch.randn) and has no grad_fn: it is a leaf, even without requires_grad",
    "w": "`w` was created by you with requires_grad=True: grad_fn is None, so it is a leaf",
    "x2": "`x2 = x * 2` came from an operation, but nothing in it requires grad, so autograd recorded "
    "nothing: grad_fn is None and it is a leaf",
    "h": "`h = x2 * w` involves `w`, which requires grad: autograd recorded MulBackward0 as its grad_fn, "
    "so it is not a leaf",
    "loss": "`loss` has grad_fn SumBackward0: not a leaf",
}


@exercise("which tensors are leaves", todo="set `answer` to a dict {name: is_leaf} for x, w, x2, h and loss")
def check_leaves(answer: Any) -> str:
    if not isinstance(answer, dict):
        raise Wrong(f"`answer` should be a dict such as {{'x': True, ...}}, not {type(answer).__name__}")
    facts = _leaf_facts()
    missing = [k for k in facts if k not in answer]
    if missing:
        raise Wrong(f"give an answer for every name; missing: {', '.join(missing)}")
    extra = sorted(set(answer) - set(facts))
    if extra:
        raise Wrong(f"only x, w, x2, h and loss are asked about; remove: {', '.join(map(str, extra))}")
    for name, truth in facts.items():
        given = answer[name]
        if is_placeholder(given):
            raise NotDone
        if not isinstance(given, bool):
            raise Wrong(f"answer[{name!r}] should be True or False, not {given!r}")
        if given != truth:
            raise Wrong(_LEAF_HINTS[name])
    return "a tensor is a leaf exactly when its grad_fn is None; only w (a leaf that requires grad) gets .grad"


@exercise("parameter and buffer", todo="write the class `Counter` (an nn.Module) described above")
def check_module_state(cls: Any) -> str:
    if is_placeholder(cls):
        raise NotDone
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise Wrong("`Counter` should be a class that subclasses torch.nn.Module")
    m = call_learner(cls)
    params = dict(m.named_parameters())
    buffers = dict(m.named_buffers())
    if "scale" not in params:
        if isinstance(getattr(m, "scale", None), torch.Tensor):
            raise Wrong("`scale` is a plain tensor attribute: wrap it in nn.Parameter so parameters() lists it")
        raise Wrong("the module has no parameter named `scale`")
    if set(params) != {"scale"}:
        raise Wrong(f"only `scale` should be a parameter; parameters() also lists {sorted(set(params) - {'scale'})}")
    if "calls" in params:
        raise Wrong("`calls` is a Parameter: the optimizer would train it; register it as a buffer")
    if "calls" not in buffers:
        raise Wrong("`calls` should be registered with self.register_buffer('calls', ...)")
    if set(m.state_dict()) != {"scale", "calls"}:
        raise Wrong(f"state_dict should hold exactly scale and calls, it holds {sorted(m.state_dict())}")
    if not torch.equal(params["scale"].detach(), torch.ones_like(params["scale"])) or params["scale"].numel() != 1:
        raise Wrong("`scale` should start as a one-element tensor holding 1.0")
    if not buffers["calls"].is_floating_point() or buffers["calls"].numel() != 1 or buffers["calls"].item() != 0:
        raise Wrong("`calls` should start as a one-element float tensor holding 0.0 (torch.zeros(1))")
    x = torch.tensor([1.0, 2.0])
    out = call_learner(m, x)
    if not isinstance(out, torch.Tensor) or not torch.allclose(out.detach(), x):
        raise Wrong("forward(x) should return x * scale (equal to x while scale is 1)")
    if not out.requires_grad:
        raise Wrong("the output should depend on `scale` so that autograd can train it")
    call_learner(m, x)
    if m.calls.item() != 2:
        raise Wrong(
            f"after two forward calls `calls` holds {m.calls.item()}; add 1 to it in forward, in place, "
            "under torch.no_grad()"
        )
    m.to(torch.float64)
    if m.scale.dtype != torch.float64 or m.calls.dtype != torch.float64:
        raise Wrong(
            "after .to(torch.float64) both scale and calls should be float64: register them, "
            "do not keep them in a list or dict"
        )
    return "one trained Parameter, one buffer saved and moved with the module but never trained"


@exercise("an SGD step by hand", todo="write sgd_step(params, lr) as described above")
def check_sgd_step(sgd_step: Any) -> str:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(3, generator=gen, requires_grad=True), torch.randn(2, 2, generator=gen, requires_grad=True)]
    ((params[0] ** 2).sum() + (params[1] ** 3).sum()).backward()
    before = [p.detach().clone() for p in params]
    grads = grads_of(params)
    objects = [id(p) for p in params]
    if not callable(sgd_step):
        raise Wrong(f"expected a function, got {type(sgd_step).__name__}")
    try:  # not call_learner: sgd_step returns None, and only its effect on `params` counts
        sgd_step(params, 0.1)
    except NotImplementedError:
        raise NotDone from None
    except Exception as e:  # the learner's code failed: explain, do not crash the notebook
        hint = " (update parameters under torch.no_grad())" if "in-place" in str(e) else ""
        raise Wrong(f"your code raised {type(e).__name__}: {e}{hint}") from None
    if [id(p) for p in params] != objects:
        raise Wrong("update the tensors in the list in place; do not replace them with new tensors")
    for p, b, g in zip(params, before, grads):
        if torch.equal(p.detach(), b):
            raise Wrong(
                "the parameters did not change: `p = p - lr * p.grad` only rebinds a name; "
                "update in place (p -= lr * p.grad) under torch.no_grad()"
            )
        if not torch.allclose(p.detach(), b - 0.1 * g):
            raise Wrong("each parameter should become p - lr * p.grad")
        if not (p.is_leaf and p.requires_grad and p.grad_fn is None):
            raise Wrong("a parameter must stay a leaf that requires grad: do the update under torch.no_grad()")
        if p.grad is not None:
            raise Wrong("reset each gradient afterwards (p.grad = None), or the next backward adds to it")
    return "this is what optimizer.step() and optimizer.zero_grad() do for plain SGD"


def _finetuning_model() -> torch.nn.Sequential:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@exercise("freeze for fine-tuning", todo="write freeze_for_finetuning(model) as described above")
def check_freeze_for_finetuning(freeze_for_finetuning: Any) -> str:
    model = _finetuning_model()
    opt = call_learner(freeze_for_finetuning, model)
    if not isinstance(opt, torch.optim.AdamW):
        raise Wrong(f"return a torch.optim.AdamW, not {type(opt).__name__}")
    head = {id(p) for p in model[-1].parameters()}
    for name, p in model.named_parameters():
        if p.requires_grad != (id(p) in head):
            which = "train" if id(p) in head else "freeze"
            raise Wrong(f"{name}: requires_grad is {p.requires_grad}; {which} it (only the last layer trains)")
    given = [p for g in opt.param_groups for p in g["params"]]
    if any(g.get("lr") != 1e-3 or g.get("weight_decay") != 0.01 for g in opt.param_groups):
        raise Wrong("use lr=1e-3 and weight_decay=0.01")
    frozen = [(p, p.detach().clone()) for p in model.parameters() if id(p) not in head]
    for (
        p,
        _,
    ) in frozen:  # as after earlier training: a zeroed gradient, not None (what zero_grad(set_to_none=False) leaves)
        p.grad = torch.zeros_like(p)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        opt.zero_grad(set_to_none=False)
        model(torch.randn(5, 6, generator=gen)).square().mean().backward()
        opt.step()
    if any(not torch.equal(p, before) for p, before in frozen):
        raise Wrong(
            "a frozen parameter moved: it was in the optimizer with a zeroed gradient, and AdamW's weight decay "
            "changed it; give the optimizer the parameters that require grad only"
        )
    if {id(p) for p in given} != head or len(given) != len(head):
        raise Wrong("the optimizer should hold the last layer's parameters and nothing else")
    fresh_head = _finetuning_model()[-1]
    if all(torch.equal(p.detach(), q) for p, q in zip(model[-1].parameters(), fresh_head.parameters())):
        raise Wrong("the last layer did not train")
    return "only the head trains; backward records nothing for the frozen layers and the optimizer never sees them"
