"""Checks for notebooks 04 (training memory, checkpointing measured) and 05 (checkpointing in practice)."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..checkpointing import OpCounter, deep_chain
from ..memory import measure_peak, state_bytes, step_peak_memory
from ..validation import is_int
from .core import NotDone, Wrong, as_number, call_learner, exercise, grads_of

__all__ = [
    "check_bn_momentum",
    "check_sqrt_checkpointing",
    "check_optimizer_state_bytes",
    "check_sac_policy",
    "check_bn_safe_forward",
]


@exercise(
    "BatchNorm momentum (eager mode)",
    todo="write corrected_momentum(m) returning PyTorch's momentum for a checkpointed BatchNorm, in eager mode",
)
def check_bn_momentum(corrected_momentum: Any) -> str:
    for m in (0.1, 0.01, 0.3, 0.5):
        got = as_number(call_learner(corrected_momentum, m), f"corrected_momentum({m})")
        want = 1 - math.sqrt(1 - m)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if math.isclose(got, math.sqrt(m), rel_tol=1e-6):
            raise Wrong(
                "sqrt(m) is the Tensor post's recipe, right only where momentum weighs the OLD value; "
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


# a Linear with bias runs aten.addmm in forward (and so in a recomputation); its backward uses aten.mm
_FORWARD_MATMUL = "aten.addmm"


@exercise(
    "selective checkpointing policy",
    todo="write policy(ctx, op, *args, **kwargs) returning MUST_SAVE for matrix products, PREFER_RECOMPUTE otherwise",
)
def check_sac_policy(policy: Any) -> str:
    width, batch, depth = 32, 64, 4
    model = deep_chain(depth, width, activation="gelu", seed=5)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(6), requires_grad=True)
    act = batch * width * 4
    returned: set[Any] = set()

    def wrapped(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        choice = call_learner(policy, ctx, op, *args, **kwargs)
        if not isinstance(choice, CheckpointPolicy):
            raise Wrong(f"the policy should return a torch.utils.checkpoint.CheckpointPolicy, got {choice!r}")
        returned.add(choice)
        return choice

    model(x).sum().backward()
    plain = [x.grad.clone()] + grads_of(model.parameters())  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    x.grad = None
    context_fn = functools.partial(create_selective_checkpoint_contexts, wrapped)
    try:
        fwd = measure_peak(
            lambda: checkpoint(model, x, use_reentrant=False, preserve_rng_state=False, context_fn=context_fn)
        )
        with OpCounter() as ops:
            fwd.result.sum().backward()
    except (NotDone, Wrong):
        raise
    except Exception as e:  # the learner's policy broke checkpoint itself
        raise Wrong(f"checkpoint failed with your policy: {type(e).__name__}: {e}") from None
    got = [x.grad] + [p.grad for p in model.parameters()]
    if not all(g is not None and torch.allclose(g, r, atol=1e-6) for g, r in zip(got, plain)):
        raise Wrong("the gradients differ from the model without checkpointing")
    kept = fwd.retained_bytes - act
    if ops.count(_FORWARD_MATMUL):
        raise Wrong(
            f"{ops.count(_FORWARD_MATMUL)} matrix products were recomputed in backward: "
            "return MUST_SAVE for torch.ops.aten.mm.default and torch.ops.aten.addmm.default"
        )
    if not ops.count("aten.gelu"):
        raise Wrong(
            f"nothing was recomputed: the forward kept {kept // act} activations, as without checkpointing; "
            "return PREFER_RECOMPUTE for every other operation"
        )
    if kept != depth * act:
        raise Wrong(f"the forward kept {kept / act:.1f} activations; saving only the {depth} products keeps {depth}")
    return f"the {depth} products are saved ({depth} activations), only {ops.count('aten.gelu')} GELUs recomputed"


@exercise(
    "BatchNorm-safe checkpoint",
    todo="write forward(block, x) that checkpoints block and leaves its running statistics as block(x) would",
)
def check_bn_safe_forward(forward: Any) -> str:
    def block() -> torch.nn.Sequential:
        g = torch.random.get_rng_state()
        torch.manual_seed(7)
        try:
            return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.ReLU())
        finally:
            torch.random.set_rng_state(g)

    ref, mine = block(), block()
    gen = torch.Generator().manual_seed(8)
    recomputed = 0
    for _ in range(5):
        x = torch.randn(32, 6, generator=gen) * 2 + 1  # raw data: does not require grad
        ref(x).square().mean().backward()
        with warnings.catch_warnings():  # the reentrant form warns about inputs without grad; the check explains
            warnings.simplefilter("ignore")
            out = call_learner(forward, mine, x)
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"forward should return the block's output tensor, got {type(out).__name__}")
        if not out.requires_grad:
            raise Wrong(
                "the output does not require grad: with use_reentrant=True and an input that needs no grad, "
                "nothing inside the block gets a gradient (notebook 05 §1.3); use use_reentrant=False"
            )
        with OpCounter() as ops:
            out.square().mean().backward()
        recomputed += ops.count(_FORWARD_MATMUL)
    bn_ref: Any = ref[1]
    bn: Any = mine[1]
    if bn.momentum != 0.1:
        raise Wrong(f"the layer's momentum is now {bn.momentum}: changing the module for good is the eager-only fix")
    if not recomputed:
        raise Wrong("nothing was recomputed in backward: the block is not checkpointed")
    if int(bn.num_batches_tracked) != int(bn_ref.num_batches_tracked):
        raise Wrong(
            f"num_batches_tracked is {int(bn.num_batches_tracked)} after 5 steps, not 5: the recomputation "
            "updated the statistics again; run it inside a guard (context_fn)"
        )
    if not (
        torch.allclose(bn.running_mean, bn_ref.running_mean, atol=1e-6)
        and torch.allclose(bn.running_var, bn_ref.running_var, atol=1e-6)
    ):
        raise Wrong("running_mean or running_var differ from the block run without checkpointing")
    if not all(torch.allclose(a.grad, b.grad, atol=1e-5) for a, b in zip(ref.parameters(), mine.parameters())):  # type: ignore[arg-type]
        raise Wrong("the parameter gradients differ from the block run without checkpointing")
    return "checkpointed, and the running statistics equal the plain block's after 5 steps"
