"""The tensor-parallel lab (after notebook 17): f and g, a block split by heads and MLP columns, sequence parallelism.

The learner's file defines ``CopyToTP`` (f), ``ReduceFromTP`` (g), ``GatherFromSP``, ``ReduceScatterToSP`` and
``ParallelBlock(block, sequence_parallel)``. On 2 processes the harness first tests the four operators alone
(forward and backward against the values every rank can compute), then the shards' shapes, then the block, with
and without sequence parallelism, against the same :class:`Block` on one process: outputs (of the attention, the
MLP and the block), the input's gradient, and every weight's gradient reassembled from the ranks' shards
(:func:`~course_lib.equivalence.compare_gradients`). It counts the collectives of one forward and one backward
(:mod:`.recorder`), and trains the block 2 steps with SGD and with AdamW beside PyTorch's ``parallelize_module``
(``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``) on the same data, comparing the parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..equivalence import compare_gradients
from ..validation import check_int
from .core import LabCheck, LabResult, NotDoneInRank, first_line, import_solution, run_lab
from .recorder import CollectiveRecorder

__all__ = ["Block", "check_tensor_parallel_lab", "evaluate", "harness"]

D, HEADS, FF, BATCH, SEQ, NPROCS = 32, 4, 64, 2, 8, 2
TOLERANCE = 1e-5  # outputs and parameters: largest absolute difference; gradients: relative (compare_gradients)
LAB = "lab: tensor and sequence parallelism by hand"
COLUMN, ROW = ("attn.q", "attn.k", "attn.v", "mlp.fc1"), ("attn.o", "mlp.fc2")
MODES = {False: "tensor parallel", True: "sequence parallel"}
GATHER, SCATTER = ("all_gather", "all_gather_into_tensor"), ("reduce_scatter", "reduce_scatter_tensor")


class Attention(nn.Module):
    """Causal multi-head self-attention; ``view(b, s, -1, head_dim)`` so that a rank's local heads work too.

    ``k`` has no bias: its gradient would be zero (up to rounding), which no relative comparison can judge.
    """

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = D // HEADS
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D, bias=False)  # a bias on k moves every score of a query alike: softmax ignores it
        self.v, self.o = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """The lab's transformer block (pre-norm), built from ``seed``: the same weights on every rank."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(check_int("seed", seed, minimum=0))
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), MLP()
        with torch.no_grad():  # LayerNorm starts at (1, 0): make its gradients and updates visible
            for norm in (self.norm1, self.norm2):
                norm.weight.add_(0.1 * torch.randn(D))
                norm.bias.add_(0.1 * torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


def _split_dim(name: str) -> int | None:
    """The dimension along which a parameter is sharded (None: whole on every rank)."""
    layer = name.rsplit(".", 1)[0]
    return 0 if layer in COLUMN else 1 if layer in ROW and name.endswith("weight") else None


def _randn(shape: Sequence[int], seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() <= TOLERANCE)


_SUM, _SLICE, _CAT = "summed over the ranks", "this rank's slice of the sum", "the ranks' slices concatenated"
_WANT = {"f": ("unchanged", _SUM), "g": (_SUM, "unchanged"), "gather": (_CAT, _SLICE), "scatter": (_SLICE, _CAT)}


def _op_test(fn: Callable[..., torch.Tensor], kind: str, rank: int, n: int) -> tuple[bool, str]:
    """One operator on every rank's seeded tensor: (passed, what its forward and backward computed)."""
    small, big = (BATCH, SEQ // n, D), (BATCH, SEQ, D)
    shape_in, shape_out = {"gather": (small, big), "scatter": (big, small)}.get(kind, (big, big))
    xs = [_randn(shape_in, 100 + r) for r in range(n)]
    gs = [_randn(shape_out, 200 + r) for r in range(n)]
    x = xs[rank].clone().requires_grad_()
    y = fn(x)
    out_names = _candidates(xs, rank, n, shape_out)
    grad_names = _candidates(gs, rank, n, shape_in)
    want_fwd, want_bwd = _WANT[kind]
    got_fwd = _which(y, out_names)
    if y.shape != torch.Size(shape_out):
        return False, f"forward returned shape {tuple(y.shape)}, expected {shape_out}"
    try:
        y.backward(gs[rank])
    except RuntimeError as error:
        return False, f"forward {got_fwd}, backward failed: {first_line(str(error))}"
    got_bwd = "no gradient" if x.grad is None else _which(x.grad, grad_names)
    fwd, bwd = (
        f"{got}" + ("" if got == want else f" (expected {want})")
        for got, want in ((got_fwd, want_fwd), (got_bwd, want_bwd))
    )
    return got_fwd == want_fwd and got_bwd == want_bwd, f"forward {fwd}, backward {bwd}"


def _candidates(ts: list[torch.Tensor], rank: int, n: int, shape: Sequence[int]) -> dict[str, torch.Tensor]:
    total = torch.stack(ts).sum(0)
    out = {"unchanged": ts[rank], _SUM: total, _SLICE: total.chunk(n, 1)[rank], _CAT: torch.cat(ts, 1)}
    out[f"multiplied by {n}"] = n * ts[rank]
    return {k: v for k, v in out.items() if v.shape == torch.Size(shape)}


def _which(t: torch.Tensor, names: dict[str, torch.Tensor]) -> str:
    return next((k for k, v in names.items() if _same(t.detach(), v)), f"something else (shape {tuple(t.shape)})")


def _agree(ok: bool) -> bool:
    """Every rank's verdict, so that all ranks stop (or go on) together."""
    flag = torch.tensor([0.0 if ok else 1.0])
    dist.all_reduce(flag)
    return bool(flag.item() == 0)


def _bias_diagnosis(got: torch.Tensor, want: torch.Tensor, bias: torch.Tensor, n: int) -> str:
    if _same(got - want, (n - 1) * bias.detach().expand_as(got)):
        return f"the output is off by {n - 1} x the row-parallel bias: the bias added on every rank, before the sum"
    return f"largest difference {(got - want).abs().max().item():.3g}"


def _run_mode(learner: Any, recorder: CollectiveRecorder, rank: int, n: int, sp: bool) -> dict[str, Any]:
    """The learner's block against one process, with ``sequence_parallel=sp``: outputs, gradients, collectives."""
    ref, mine = Block(), learner.ParallelBlock(Block(), sequence_parallel=sp)
    x, z, w = _randn((BATCH, SEQ, D), 1), _randn((BATCH, SEQ, D), 2), _randn((BATCH, SEQ, D), 3)
    local = (lambda t: t.chunk(n, 1)[rank]) if sp else (lambda t: t)
    outputs = {}
    with torch.no_grad():
        for part, fn, bias in (("attention", "attn", ref.attn.o.bias), ("MLP", "mlp", ref.mlp.fc2.bias)):
            got, want = getattr(mine, fn)(local(z)), local(getattr(ref, fn)(z))
            outputs[part] = "" if _same(got, want) else _bias_diagnosis(got, want, bias, n)
    recorder.reset()
    x_mine, x_ref = local(x).clone().requires_grad_(), x.clone().requires_grad_()
    recorder.step = 0
    out = mine(x_mine)
    outputs["block"] = "" if _same(out.detach(), local(ref(x_ref)).detach()) else "differs"
    recorder.step = 1
    (out * local(w)).sum().backward()
    recorder.step = 2
    mine.sync_grads()
    (ref(x_ref) * w).sum().backward()
    grads = {k: p.grad.clone() if p.grad is not None else None for k, p in mine.named_parameters()}
    reference = {k: p.grad for k, p in ref.named_parameters() if p.grad is not None}
    assert x_ref.grad is not None
    x_err = (x_mine.grad - local(x_ref.grad)).abs().max().item() if x_mine.grad is not None else float("inf")
    calls = [(c.op, c.nbytes, c.step) for c in recorder.calls]
    del mine
    return {"outputs": outputs, "x_error": x_err, "grads": grads, "reference": reference, "calls": calls}


def _plan(sp: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    plan: dict[str, Any] = {name: ColwiseParallel() for name in COLUMN}
    plan |= {name: RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()) for name in ROW}
    if sp:
        plan |= {"norm1": SequenceParallel(), "norm2": SequenceParallel()}
        for part in ("attn", "mlp"):
            plan[part] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def _train(model: nn.Module, sync: Callable[[], None], opt_name: str, rank: int, n: int, sp: bool) -> dict:
    opt = getattr(torch.optim, opt_name)(model.parameters(), lr={"SGD": 0.1, "AdamW": 0.01}[opt_name])
    for step in range(2):
        x, w = _randn((BATCH, SEQ, D), 10 + step), _randn((BATCH, SEQ, D), 20 + step)
        if sp:
            x, w = x.chunk(n, 1)[rank], w.chunk(n, 1)[rank]
        (model(x) * w).sum().backward()
        sync()
        opt.step()
        opt.zero_grad()
    return {k: (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for k, p in model.named_parameters()}


def _training(learner: Any, rank: int, n: int) -> dict[str, float]:
    """Largest parameter difference from parallelize_module's after 2 steps, per (mode, optimizer)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (n,))
    worst = {}
    for sp in (False, True):
        for opt_name in ("SGD", "AdamW"):
            mine = learner.ParallelBlock(Block(), sequence_parallel=sp)
            got = _train(mine, mine.sync_grads, opt_name, rank, n, sp)
            api = parallelize_module(Block(), mesh, _plan(sp))
            want = _train(api, lambda: None, opt_name, rank, n, sp)
            same = set(got) == set(want) and all(got[k].shape == want[k].shape for k in want)
            worst[f"{MODES[sp]}, {opt_name}"] = (
                max((got[k] - want[k]).abs().max().item() for k in want) if same else float("inf")
            )
            del mine, api
    del mesh
    return worst


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's operators and block, one process's, and parallelize_module's."""
    recorder, out = CollectiveRecorder(), dict[str, Any]()
    try:
        with recorder.installed():
            learner = import_solution(solution)
            ops = {"f": "CopyToTP", "g": "ReduceFromTP", "gather": "GatherFromSP", "scatter": "ReduceScatterToSP"}
            out["ops"] = {
                kind: _op_test(getattr(learner, name).apply, kind, rank, world_size) for kind, name in ops.items()
            }
        if not _agree(all(ok for ok, _ in out["ops"].values())):
            return out
        with recorder.installed():
            out["shapes"] = {k: tuple(p.shape) for k, p in learner.ParallelBlock(Block()).named_parameters()}
        if not _agree(out["shapes"] == _expected_shapes(world_size)):
            return out
        for sp in (False, True):
            with recorder.installed():
                out[MODES[sp]] = _run_mode(learner, recorder, rank, world_size, sp)
        out["training"] = _training(learner, rank, world_size)
    except NotImplementedError:
        raise NotDoneInRank from None
    dist.barrier()
    return out


def _expected_shapes(n: int) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, p in Block().named_parameters():
        shape, dim = list(p.shape), _split_dim(name)
        if dim is not None:
            shape[dim] //= n
        out[name] = tuple(shape)
    return out


def _assembled(results: Sequence[dict[str, Any]], mode: str, rank: int) -> dict[str, torch.Tensor] | None:
    """Rank ``rank``'s view of the whole block's gradients: the shards concatenated, its own whole parameters."""
    out = {}
    for name in _expected_shapes(1):
        parts = [r[mode]["grads"].get(name) for r in results]
        if any(p is None for p in parts):
            return None
        dim = _split_dim(name)
        out[name] = parts[rank] if dim is None else torch.cat(parts, dim)
    return out


def _count(calls: list[tuple[str, int, int]], step: int) -> str:
    counts: dict[str, int] = {}
    for op, _, s in calls:
        if s == step:
            name = "all-gather" if op in GATHER else "reduce-scatter" if op in SCATTER else op.replace("_", "-")
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing"


_HINTS = {
    "f and g": "f (CopyToTP): the identity forward, an all-reduce of the gradient backward; g (ReduceFromTP): an "
    "all-reduce forward, the gradient unchanged backward. Each is the other's backward: a double all-reduce (in "
    "both backwards) multiplies the gradients by the number of ranks",
    "sequence-parallel operators": "all-gather and reduce-scatter along dimension 1, the sequence: the collectives "
    "work on dimension 0, so move the sequence there (transpose(0, 1).contiguous()) and back; each operator's "
    "backward is the other collective",
    "shards": "column-parallel layers (q, k, v, fc1) keep their output features: rows of the weight (chunk(n, 0)) "
    "and the bias's slice; row-parallel layers (o, fc2) keep their input features: columns (chunk(n, 1)), the "
    "whole bias",
    "outputs": "f (identity forward) goes before the column-parallel layers and g (all-reduce forward) after the "
    "row-parallel one (with sequence parallelism, the all-gather before and the reduce-scatter after); the "
    "row-parallel bias is added once, after the sum",
    "input gradient": "the input's gradient is the sum over the ranks of their heads' and columns' shares: f's "
    "backward (or the all-gather's backward, a reduce-scatter) adds them up",
    "tensor-parallel weight gradients": "without sequence parallelism the shards' gradients are right once the "
    "outputs and the input's gradient are (f and g in their places): sync_grads() must not communicate",
    "weight gradients": "with sequence parallelism each rank computes the gradients of the norms and of the "
    "row-parallel biases from its own tokens: sync_grads() must all-reduce them with a sum, without dividing "
    "(the loss is a sum over the ranks' tokens); without it, nothing needs reducing",
    "collectives": "one collective where each operator is used, per sub-layer: tensor parallelism, an all-reduce "
    "forward (g) and one backward (f) for the attention and for the MLP; sequence parallelism, an all-gather and "
    "a reduce-scatter in each direction instead",
}
_EXPECTED_CALLS = {
    "tensor parallel": ("2 all-reduce", "2 all-reduce"),
    "sequence parallel": ("2 all-gather, 2 reduce-scatter", "2 all-gather, 2 reduce-scatter"),
}


def _check(name: str, ok: bool, good: str, bad: str, hint: str = "") -> LabCheck:
    """A check whose detail says what held, or what went wrong."""
    return LabCheck(name, ok, good if ok else bad, hint or _HINTS.get(name.split(": ")[-1], ""))


def _mode_checks(results: Sequence[dict[str, Any]], mode: str) -> list[LabCheck]:
    n, r0 = len(results), results[0]
    bad = [(r, k, v) for r, res in enumerate(results) for k, v in res[mode]["outputs"].items() if v]
    good = f"attention, MLP and block equal one process's within {TOLERANCE:g} on all {n} ranks"
    checks = [_check(f"{mode}: outputs", not bad, good, "; ".join(f"rank {r}, {k}: {v}" for r, k, v in bad[:3]))]
    x_err = max(res[mode]["x_error"] for res in results)
    text = f"the input's gradient differs from one process's by {x_err:.3g} at most (tolerance {TOLERANCE:g})"
    checks.append(_check(f"{mode}: input gradient", x_err <= TOLERANCE, text, text))
    reference, matches = r0[mode]["reference"], []
    for rank in range(n):
        got = _assembled(results, mode, rank)
        matches.append(None if got is None else compare_gradients(got, reference, tolerance=TOLERANCE))
    worst = next((m for m in matches if m is None or not m.ok), matches[0])
    text = "a parameter has no .grad" if worst is None else f"reassembled from the shards, {worst}"
    hint = _HINTS["weight gradients" if mode == MODES[True] else "tensor-parallel weight gradients"]
    checks.append(_check(f"{mode}: weight gradients", worst is not None and worst.ok, text, text, hint))
    calls = r0[mode]["calls"]
    fwd, bwd = _count(calls, 0), _count(calls, 1)
    nbytes = ", ".join(f"{b:,}" for b in sorted({b for op, b, s in calls if s in (0, 1)}))
    sync = _count(calls, 2)
    ok = (fwd, bwd) == _EXPECTED_CALLS[mode] and (sync == "nothing") == (mode == MODES[False])
    text = f"forward: {fwd}; backward: {bwd} (outputs of {nbytes} bytes); sync_grads: {sync}"
    want = (
        f"; expected {' / '.join(_EXPECTED_CALLS[mode])}, and sync_grads communicating only with sequence parallelism"
    )
    return [*checks, _check(f"{mode}: collectives", ok, text, text + want)]


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    n, r0, checks = len(results), results[0], []
    names = {"f": "f", "g": "g", "gather": "GatherFromSP", "scatter": "ReduceScatterToSP"}
    for title, kinds in (("f and g", ("f", "g")), ("sequence-parallel operators", ("gather", "scatter"))):
        bad = [(r, k, res["ops"][k][1]) for r, res in enumerate(results) for k in kinds if not res["ops"][k][0]]
        good = "; ".join(f"{names[k]}: {r0['ops'][k][1]}" for k in kinds)
        checks.append(_check(title, not bad, good, "; ".join(f"rank {r}, {names[k]}: {d}" for r, k, d in bad[:2])))
    if "shapes" not in r0:
        return checks
    want = _expected_shapes(n)
    wrong = [f"{k} {v} (expected {want.get(k)})" for k, v in r0["shapes"].items() if want.get(k) != v]
    wrong += [f"{k} missing" for k in want if k not in r0["shapes"]]
    some = ", ".join(f"{k} {r0['shapes'][k]}" for k in ("attn.q.weight", "attn.o.weight", "mlp.fc2.bias"))
    checks.append(_check("shards", not wrong, f"rank 0 holds {some}", "rank 0 holds " + "; ".join(wrong[:3])))
    if wrong:
        return checks
    for mode in MODES.values():
        checks += _mode_checks(results, mode)
    for key in r0["training"]:
        mode, opt_name = key.split(", ")
        worst = max(res["training"][key] for res in results)
        checks.append(
            _check(
                f"{mode}: parameters after 2 {opt_name} steps",
                worst <= TOLERANCE,
                f"equal parallelize_module's within {TOLERANCE:g} on every rank (largest difference ~{worst:.1e})",
                f"largest difference from parallelize_module's: {worst:.3g} (tolerance {TOLERANCE:g})",
                "the optimizer must see each shard's gradient of the whole block's loss (see the checks above)",
            )
        )
    return checks


def check_tensor_parallel_lab(solution: str | Path = "_runs/lab_tp.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s operators and ``ParallelBlock`` on 2 processes against one process and parallelize_module."""
    return run_lab(LAB, solution, "course_lib.labs.tensor_parallel:harness", evaluate, nprocs=NPROCS, timeout=timeout)
