"""Checks for notebook 08 (gradient accumulation)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .core import NotDone, Wrong, call_learner, exercise, grads_of, is_placeholder

__all__ = ["check_micro_batch_weights", "check_accumulate", "check_scaled_accumulation_step", "check_accumulate_tokens"]

_SIZES_CASES = [[32, 32, 32, 32], [32, 32, 32, 4], [5], [1, 2, 3], [10, 0, 6]]


@exercise(
    "micro-batch weights",
    todo="write micro_batch_weights(sizes) returning the factor for each micro-batch's mean loss",
)
def check_micro_batch_weights(fn: Any) -> str:
    for sizes in _SIZES_CASES:
        got = call_learner(fn, list(sizes))
        try:
            got = [float(w) for w in got]
        except (TypeError, ValueError):
            raise Wrong(f"micro_batch_weights({sizes}) should return a list of numbers, got {got!r}") from None
        if len(got) != len(sizes):
            raise Wrong(f"micro_batch_weights({sizes}) returned {len(got)} weights; one per micro-batch, please")
        want = [n / sum(sizes) for n in sizes]
        if not all(abs(g - w) < 1e-9 for g, w in zip(got, want)):
            if all(abs(g - 1 / len(sizes)) < 1e-9 for g in got):
                raise Wrong(
                    f"for sizes {sizes} you gave every micro-batch 1/k: that is exact only when all sizes are "
                    "equal. A micro-batch of n samples holds n/N of the big batch's samples."
                )
            raise Wrong(
                f"micro_batch_weights({sizes}) gave {got}; sum_i w_i * mean_i must equal the mean over all samples"
            )
    return "weights n_i / N make the accumulated gradient equal the big batch's, even with a short last batch"


def _run_in_place(fn: Any, *args: Any) -> None:
    """Call a learner function that works by side effect (its return value is ignored)."""
    if is_placeholder(fn):
        raise NotDone
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    try:
        fn(*args)
    except NotImplementedError:
        raise NotDone from None
    except Exception as e:  # the learner's code failed: explain, do not crash the notebook
        raise Wrong(f"your code raised {type(e).__name__}: {e}") from None


def _setup(seed: int) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    x = torch.randn(23, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (23,), generator=g)
    micro = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 23, 6)]  # 6, 6, 6, 5
    return model, micro


def _big_batch_grads(model: nn.Module, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    ref = copy.deepcopy(model)
    x = torch.cat([m[0] for m in micro])
    y = torch.cat([m[1] for m in micro])
    nn.functional.cross_entropy(ref(x), y).backward()
    return grads_of(ref.parameters())


@exercise(
    "accumulate",
    todo="write accumulate(model, micro_batches) that leaves in .grad the big batch's mean-loss gradient",
)
def check_accumulate(fn: Any) -> str:
    for seed in (0, 1):
        model, micro = _setup(seed)
        want = _big_batch_grads(model, micro)
        model.zero_grad(set_to_none=True)
        _run_in_place(fn, model, micro)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if len(grads) != len(want):
            raise Wrong("after accumulate(...) some parameters have no .grad: call backward() on each micro-batch loss")
        first = grads[0] / want[0]
        ratio = float(first[want[0].abs() > 1e-6].median())
        if not all(torch.allclose(g, w, atol=1e-10) for g, w in zip(grads, want)):
            if abs(ratio - len(micro)) < 0.1:
                raise Wrong("the gradients are k times too large: scale each micro-batch's mean loss before backward()")
            raise Wrong(
                "the gradients differ from the big batch's. The last micro-batch has 5 samples, the others 6: "
                "weight each mean loss by n_i / N, not 1/k"
            )
    return "your accumulated gradients equal the big batch's gradients (allclose), short last batch included"


@exercise(
    "accumulation with a loss scaler",
    todo="write my_scaled_step(model, optimizer, scaler, micro_batches) doing one optimizer step with a GradScaler",
)
def check_scaled_accumulation_step(fn: Any) -> str:
    model, micro = _setup(2)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    x = torch.cat([m[0] for m in micro])
    y = torch.cat([m[1] for m in micro])
    nn.functional.cross_entropy(ref(x), y).backward()
    ref_opt.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)  # grows x2 per clean update
    _run_in_place(fn, model, opt, scaler, micro)
    if scaler.get_scale() != 2048.0:
        updates = (
            "no" if scaler.get_scale() == 1024.0 else f"{torch.log2(torch.tensor(scaler.get_scale() / 1024.0)):.0f}"
        )
        raise Wrong(
            f"the scaler saw {updates} update() calls: call scaler.update() exactly once per optimizer step, "
            "after scaler.step(optimizer)"
        )
    if all(torch.equal(p, q) for p, q in zip(model.parameters(), _setup(2)[0].parameters())):
        raise Wrong("the parameters did not change: call scaler.step(optimizer) after the last micro-batch")
    for p, q in zip(model.parameters(), ref.parameters()):
        if not torch.allclose(p, q, atol=1e-10):
            if p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad * 1024.0, rtol=1e-6):
                raise Wrong("the step used scaled gradients: let scaler.step (or scaler.unscale_) divide them back")
            raise Wrong("after your step the parameters differ from one plain SGD step on the big batch")
    return "scale every micro-batch loss, then one unscale_/step/update per optimizer step: same as the big batch"


_PAD = -100


def _token_setup(seed: int) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A token model and 3 micro-batches of 3, 2 and 1 padded sequences (15, 7 and 2 tokens)."""
    g = torch.Generator().manual_seed(seed)
    vocab, length = 11, 7
    model = nn.Sequential(nn.Embedding(vocab, 5), nn.Linear(5, vocab)).double()
    for p in model.parameters():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    lengths = torch.tensor([7, 6, 2, 2, 5, 2])  # tokens per micro-batch: 15, 7, 2
    tokens = torch.randint(0, vocab, (6, length), generator=g)
    targets = torch.randint(0, vocab, (6, length), generator=g)
    targets[torch.arange(length) >= lengths[:, None]] = _PAD
    return model, list(zip(tokens.split([3, 2, 1]), targets.split([3, 2, 1])))


def _token_grads(model: nn.Module, micro: list[tuple[torch.Tensor, torch.Tensor]], how: str) -> list[torch.Tensor]:
    ref = copy.deepcopy(model)
    n_tokens = sum(int((t != _PAD).sum()) for _, t in micro)
    for x, t in micro:
        out = ref(x)
        logits = out.reshape(-1, out.shape[-1])
        if how == "right":
            loss = nn.functional.cross_entropy(logits, t.reshape(-1), ignore_index=_PAD, reduction="sum") / n_tokens
        elif how == "mean / k":
            loss = nn.functional.cross_entropy(logits, t.reshape(-1), ignore_index=_PAD) / len(micro)
        else:  # "sequences": mean per micro-batch weighted by its share of the sequences
            share = len(x) / sum(len(m[0]) for m in micro)
            loss = nn.functional.cross_entropy(logits, t.reshape(-1), ignore_index=_PAD) * share
        loss.backward()
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in ref.parameters()]


@exercise(
    "token-level accumulation",
    todo="write accumulate_tokens(model, micro_batches) so that .grad holds the token-mean loss's gradient",
)
def check_accumulate_tokens(fn: Any) -> str:
    for seed in (0, 1):
        model, micro = _token_setup(seed)
        want = _token_grads(model, micro, "right")
        model.zero_grad(set_to_none=True)
        _run_in_place(fn, model, micro)
        maybe = [p.grad for p in model.parameters()]
        grads = [g for g in maybe if g is not None]
        if len(grads) != len(maybe):
            raise Wrong("after accumulate_tokens(...) some parameters have no .grad: call backward() on each loss")
        if all(torch.allclose(g, w, atol=1e-10) for g, w in zip(grads, want)):
            continue
        for how, hint in [
            (
                "mean / k",
                "you averaged per micro-batch and divided by k: each micro-batch then weighs the same, "
                "whatever its number of tokens",
            ),
            (
                "sequences",
                "you weighted by sequences (n_i / N): the loss elements are tokens, and sequences "
                "have different lengths",
            ),
        ]:
            if all(torch.allclose(g, w, atol=1e-10) for g, w in zip(grads, _token_grads(model, micro, how))):
                raise Wrong(hint + ". Divide each micro-batch's SUM of token losses by the tokens of all micro-batches")
        raise Wrong(
            "the gradients differ from the token mean of all micro-batches: count the tokens (targets != -100) "
            "of every micro-batch first, then divide each micro-batch's sum of token losses by that total"
        )
    return "each token weighs the same, whatever micro-batch it is in: the big batch's token-mean gradient"
