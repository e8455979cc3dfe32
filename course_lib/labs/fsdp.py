"""The FSDP lab (after notebook 14): ``shard_model`` by hand, checked against ``fully_shard`` and one process.

The harness builds the same small residual MLP on every rank (an input layer, two blocks, a head, and a ``scale``
vector that stays replicated), shards it with the learner's ``shard_model`` (each block a unit, the root holding the
input layer and the head) and with FSDP2's ``fully_shard`` (each block, then the root), and trains both for 3 SGD
steps and 3 AdamW steps on the same data; one process trains the unsharded model on the whole batch. Its own forward
hooks, registered after the learner's, measure the bytes of each block's parameter tensors once gathered and once
freed; it records the learner's collectives (:mod:`.recorder`), and all-gathers the learner's shards and their
gradients to compare them, by name, with the references.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ..equivalence import GradientMatch, compare_gradients
from .core import LabCheck, LabResult, NotDoneInRank, first_line, import_solution, run_lab
from .measure import largest_difference, storage_bytes
from .recorder import CollectiveRecorder

__all__ = ["TOLERANCE", "check_fsdp_lab", "evaluate", "harness"]

TOLERANCE = 1e-6  # parameters after 3 steps, absolute, against fully_shard
GRAD_TOLERANCE = 1e-5  # first-step gradients, relative, against one process
LAB = "lab: FSDP by hand"
STEPS = 3
_OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}
_NOT_REGATHERED = (
    "backward read a unit's freed parameters (storage of size 0): before the unit's backward, all-gather its "
    "parameters again into the same storage (a hook on the unit's output), so that the views autograd saved see them"
)
_WRITTEN_IN_PLACE = (
    "a tensor autograd saved was written in place: all-gather again through a second tensor on the same storage "
    "(torch.empty(0).set_(storage)), since writing the full tensor itself bumps the version counter autograd "
    "checks. PyTorch said: "
)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 25), nn.Linear(25, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class _Net(nn.Module):
    """Blocks of 841 parameters (odd: their shards need padding); a root of 244 (the input layer and the head)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same parameters on every rank
        self.inp = nn.Linear(10, 16)
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(16))  # replicated: not in any unit
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x)) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _batch(step: int, world: int, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, or rank ``rank``'s rows of it."""
    g = torch.Generator().manual_seed(200 + step)
    x, y = torch.randn(8 * world, 10, generator=g), torch.randint(0, 4, (8 * world,), generator=g)
    return (x, y) if rank is None else (x[rank::world], y[rank::world])


def _layout(model: _Net) -> list[tuple[str, list[tuple[str, torch.Size]]]]:
    """Each unit's name and its parameters' (name, shape), in flattening order; the root last."""
    units = [
        (f"blocks.{i}", [(f"blocks.{i}.{n}", p.shape) for n, p in block.named_parameters()])
        for i, block in enumerate(model.blocks)
    ]
    root = [(n, p.shape) for n, p in model.named_parameters() if not n.startswith("blocks.") and n != "scale"]
    return [*units, ("root", root)]


@contextmanager
def _explained() -> Iterator[None]:
    """Re-raise the two errors a wrong re-gather causes in backward with what usually causes them."""
    try:
        yield
    except RuntimeError as error:
        if "storage of size 0" in str(error):
            raise RuntimeError(_NOT_REGATHERED) from error
        if "modified by an inplace operation" in str(error):
            raise RuntimeError(_WRITTEN_IN_PLACE + first_line(str(error))) from error
        raise


def _gather_named(shards: dict[str, list[nn.Parameter]], layout: Any, world: int, grad: bool) -> dict:
    """All-gather each unit's shard (or its gradient) and split it into the unit's parameters, by name."""
    out = {}
    for unit, params in layout:
        local = shards[unit][0].grad if grad else shards[unit][0].detach()
        if local is None:
            continue
        full = torch.empty(local.numel() * world, dtype=local.dtype)
        dist.all_gather_single(full, local.contiguous())
        offsets = [0, *torch.tensor([shape.numel() for _, shape in params]).cumsum(0).tolist()]
        out.update({name: full[o : o + s.numel()].view(s).clone() for (name, s), o in zip(params, offsets)})
    return out


def _watch(model: _Net, layout: Any, meter: dict[str, list[int]]) -> dict[str, list[tuple[nn.Module, str]]]:
    """Forward hooks after the learner's: the bytes of each block's parameters once gathered, once freed."""
    places = {}
    for i, block in enumerate(model.blocks):
        unit = places[f"blocks.{i}"] = [(getattr(block, n.split(".")[2]), n.split(".")[3]) for n, _ in layout[i][1]]

        def pre(module: nn.Module, args: Any, unit: list = unit) -> None:
            meter["gathered"].append(storage_bytes(getattr(sub, name, None) for sub, name in unit))

        def post(module: nn.Module, args: Any, output: Any, unit: list = unit) -> None:
            meter["after forward"].append(storage_bytes(getattr(sub, name, None) for sub, name in unit))

        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)
    return places


def _learner_run(learner: Any, opt_name: str, rank: int, world: int, rec: CollectiveRecorder) -> dict[str, Any]:
    model = _Net()
    layout, modules = _layout(model), {"blocks.0": model.blocks[0], "blocks.1": model.blocks[1], "root": model}
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if n != "scale"}
    originals = list(model.parameters())  # kept alive: a new shard cannot take a freed parameter's id
    before = {id(p) for p in originals}
    learner.shard_model(model, [model.blocks[0], model.blocks[1]], replicated=[model.scale])
    shards = {u: [p for p in m.parameters(recurse=False) if id(p) not in before] for u, m in modules.items()}
    sizes = {u: [p.numel() for p in ps] for u, ps in shards.items()}
    every: list[Any] = [None] * world
    dist.all_gather_object(every, sizes)  # every rank learns every rank's layout, so all stop together if wrong
    expected = {u: [math.ceil(sum(s.numel() for _, s in ps) / world)] for u, ps in layout}
    out: dict[str, Any] = {
        "layout": every,
        "expected_layout": expected,
        "padded": {u: e[0] * world for u, e in expected.items()},
    }
    if any(e != expected for e in every):
        return out
    rec.step = -1  # the harness's own collectives
    gathered = _gather_named(shards, layout, world, grad=False)
    out["construction"] = max((gathered[n] - initial[n]).abs().max().item() for n in initial)
    meter: dict[str, list[int]] = {"gathered": [], "after forward": [], "before backward": []}
    places = _watch(model, layout, meter)
    cls, kwargs = _OPTIMIZERS[opt_name]
    opt = cls(model.parameters(), **kwargs)
    for step in range(STEPS):
        x, y = _batch(step, world, rank)
        rec.step = step
        opt.zero_grad()
        with _explained():
            loss = F.cross_entropy(model(x), y)
            meter["before backward"] += [storage_bytes(getattr(s, n, None) for s, n in p) for p in places.values()]
            loss.backward()
        rec.step = -1
        if step == 0:
            scale = {"scale": model.scale.grad.clone()} if model.scale.grad is not None else {}
            out["first_grads"] = {**_gather_named(shards, layout, world, grad=True), **scale}
        opt.step()
    out["params"] = {**_gather_named(shards, layout, world, grad=False), "scale": model.scale.detach().clone()}
    out["meter"], out["calls"] = meter, [(c.op, c.nbytes, c.in_backward) for c in rec.calls if c.step == 1]
    rec.reset()
    return out


def _reference_run(opt_name: str, rank: int, world: int, sharded: bool) -> dict[str, Any]:
    """``fully_shard`` on each block, then the root; or (``sharded=False``) one process on the whole batch."""
    model = _Net()
    if sharded:
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    cls, kwargs = _OPTIMIZERS[opt_name]
    opt, out = cls(model.parameters(), **kwargs), {}
    for step in range(STEPS):
        x, y = _batch(step, world, rank if sharded else None)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step == 0:
            out["first_grads"] = {n: _full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
    out["params"] = {n: _full(p.detach()) for n, p in model.named_parameters()}
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (an all-gather: every rank calls it), or a copy of the tensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t.clone()


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's shard_model, fully_shard, one process (run by :func:`check_fsdp_lab`)."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")  # FSDP2's hooks, on this small model
    recorder = CollectiveRecorder()
    out: dict[str, Any] = {"runs": {}}
    with recorder.installed():
        try:
            learner = import_solution(solution)
            for opt_name in _OPTIMIZERS:
                out["runs"][opt_name] = run = _learner_run(learner, opt_name, rank, world_size, recorder)
                if "params" not in run:  # a wrong layout: the checks say so, nothing else is run
                    break
        except NotImplementedError:
            raise NotDoneInRank from None
    out["fsdp2"] = {opt_name: _reference_run(opt_name, rank, world_size, True) for opt_name in _OPTIMIZERS}
    out["one"] = {opt_name: _reference_run(opt_name, rank, world_size, False) for opt_name in _OPTIMIZERS}
    dist.barrier()
    return out


def _verdict(name: str, ok: bool, good: str, bad: str, hint: str) -> LabCheck:
    return LabCheck(name, ok, good if ok else bad, hint)


def _layout_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    run, n = results[0]["runs"]["SGD"], len(results)
    expected, every = run["expected_layout"], run["layout"]
    wrong = [(r, u, sizes[u]) for r, sizes in enumerate(every) for u in expected if sizes.get(u) != expected[u]]
    good = "each rank keeps one flat shard per unit: " + ", ".join(f"{u} {e[0]}" for u, e in expected.items())
    bad = (
        f"rank {wrong[0][0]}'s {wrong[0][1]} holds shards of {wrong[0][2]} elements; expected one of " if wrong else ""
    )
    bad += (
        f"{expected[wrong[0][1]][0]} (its parameters, padded to the next multiple of {n}, divided by {n})"
        if wrong
        else ""
    )
    hint = "pad the flat vector with zeros to math.ceil(total / N) * N, no more, no less; register one shard per unit "
    layout = _verdict("shard layout", not wrong, good + " elements", bad, hint + "on the unit's module")
    if wrong:
        return [layout]
    apart = max(r["runs"][opt]["construction"] for r in results for opt in _OPTIMIZERS)
    hint = "rank r keeps chunk r of the padded flat vector (flat.chunk(N)[rank]), flattened in the order "
    hint += "module.named_parameters() yields the parameters"
    good, bad = "the ranks' shards, gathered, are the model's parameters", f"they differ from them by up to {apart:.3g}"
    return [layout, _verdict("the shards hold the model", apart == 0, good, bad, hint)]


def _memory_check(results: Sequence[dict[str, Any]], padded: dict[str, int]) -> LabCheck:
    meters = [r["runs"][opt]["meter"] for r in results for opt in _OPTIMIZERS]
    gathered = min(min(m["gathered"]) for m in meters)
    after = max(max(m["after forward"]) for m in meters)
    before = max(max(m["before backward"]) for m in meters)
    detail = f"a block's parameters hold {gathered} bytes in its forward (its padded flat tensor: "
    detail += f"{padded['blocks.0'] * 4}), {after} after it, {before} between forward and backward"
    hint = "in the forward hook, free the full tensor with full.untyped_storage().resize_(0): dropping the Python "
    hint += "reference frees nothing, since the views autograd saved for backward keep it alive"
    return LabCheck("parameters freed after forward", gathered > 0 and after == 0 and before == 0, detail, hint)


def _gradient_check(results: Sequence[dict[str, Any]]) -> LabCheck:
    """The shards' gradients and the replicated ones, compared apart: each part's scale bug is then named."""
    matches: list[GradientMatch | None] = []
    for r in results:
        got, ref = r["runs"]["SGD"]["first_grads"], r["one"]["SGD"]["first_grads"]
        if set(got) != set(ref):
            matches.append(None)
            continue
        for part in ({k for k in ref if k != "scale"}, {"scale"}):
            matches.append(
                compare_gradients(
                    {k: got[k] for k in part},
                    {k: ref[k] for k in part},
                    tolerance=GRAD_TOLERANCE,
                    world_size=len(results),
                )
            )
    versus = compare_gradients(
        results[0]["fsdp2"]["SGD"]["first_grads"], results[0]["one"]["SGD"]["first_grads"], tolerance=GRAD_TOLERANCE
    )
    failing = [m for m in matches if m is None or not m.ok]
    worst = max((m for m in matches if m is not None), key=lambda m: m.max_rel_error, default=versus)
    good = f"sharded and replicated {str(worst).removeprefix('gradients ')}; fully_shard's: largest error "
    good += f"~{versus.max_rel_error:.1e}"
    hint = "Gather.backward reduce-scatters the full gradient and divides it by N once; a replicated parameter's "
    hint += "gradient is all-reduced and divided by N once it is complete"
    first = failing[0] if failing else None
    bad = str(first) if first is not None else "a shard has no .grad after backward"
    return _verdict("gradients of the first step", not failing, good, bad, hint)


def _parameter_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    checks = []
    for opt_name in _OPTIMIZERS:
        diff, name, rank = max(
            largest_difference(r["runs"][opt_name]["params"], r["fsdp2"][opt_name]["params"]) + (i,)
            for i, r in enumerate(results)
        )
        one = largest_difference(results[0]["fsdp2"][opt_name]["params"], results[0]["one"][opt_name]["params"])[0]
        good = f"equal fully_shard's within {TOLERANCE:g} on every rank (largest difference ~{diff:.1e}; "
        good += f"fully_shard against one process: ~{one:.1e})"
        bad = f"rank {rank}: {name} differs from fully_shard's by {diff:.3g} (tolerance {TOLERANCE:g})"
        hint = "the shard's gradient must be the mean over the ranks; a replicated parameter's gradient must be "
        hint += "all-reduced on every step, or the ranks' copies drift apart"
        checks.append(_verdict(f"parameters after {STEPS} {opt_name} steps", diff <= TOLERANCE, good, bad, hint))
    spread = max(
        (r["runs"][opt]["params"]["scale"] - results[0]["runs"][opt]["params"]["scale"]).abs().max().item()
        for r in results
        for opt in _OPTIMIZERS
    )
    good = "every rank holds the same replicated scale after every step"
    bad = f"the replicated scale differs between ranks by {spread:.3g} after the steps"
    hint = "register a post-accumulate-grad hook on each replicated parameter that all-reduces its gradient and "
    hint += "divides it by N: without it, each rank steps with its own gradient"
    return [*checks, _verdict("replicated parameters agree", spread == 0, good, bad, hint)]


def _communication_check(results: Sequence[dict[str, Any]], padded: dict[str, int]) -> LabCheck:
    n, full, replicated = len(results), {u: p * 4 for u, p in padded.items()}, 16 * 4  # float32
    twice = [full[u] for u in full for _ in range(2)]
    gathers = [sorted(twice), sorted([*twice[:-1]])]  # the root's twice, or once (kept from forward to backward)
    scatters = sorted(full[u] // n for u in full)
    seen = [
        (
            sorted(b for op, b, _ in calls if op.startswith("all_gather")),
            sorted(b for op, b, _ in calls if op.startswith("reduce_scatter")),
            sorted(b for op, b, _ in calls if op == "all_reduce"),
            all(back for op, _, back in calls if op.startswith("reduce_scatter") or op == "all_reduce"),
        )
        for calls in (r["runs"][opt]["calls"] for r in results for opt in _OPTIMIZERS)
    ]
    ok = all(g in gathers and s == scatters and sum(a) == replicated and back for g, s, a, back in seen)
    g, s, a, _ = seen[0]
    detail = f"a rank's step all-gathers {g} bytes, reduce-scatters into {s}, all-reduces {a}; expected all-gathers "
    detail += f"{gathers[0]} (a unit's padded flat tensor before its forward and again before its backward; the "
    detail += f"root's once is fine), reduce-scatters into {scatters} during backward, all-reduces {replicated} "
    detail += "(the replicated scale)"
    hint = "one all-gather per unit in the pre-forward hook and one before its backward; one reduce-scatter per unit "
    hint += "in Gather.backward (not an all-reduce of the whole gradient); one all-reduce of each replicated gradient"
    return LabCheck("collectives per step", ok, detail, hint)


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    if not results:
        raise ValueError("results must hold what each rank measured, in rank order; got none")
    checks = _layout_checks(results)
    if not checks[0].passed:
        return checks
    padded = results[0]["runs"]["SGD"]["padded"]
    checks += [_memory_check(results, padded), _gradient_check(results), *_parameter_checks(results)]
    return [*checks, _communication_check(results, padded)]


def check_fsdp_lab(solution: str | Path = "_runs/lab_fsdp.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``shard_model`` on 2 processes against ``fully_shard`` and one process (see the module)."""
    return run_lab(LAB, solution, "course_lib.labs.fsdp:harness", evaluate, nprocs=2, timeout=timeout)
