"""The ZeRO lab (after notebook 14): ``ZeroOptimizer``, checked against DDP with the same optimizer on 2 processes.

On each rank, the learner's sharded optimizer, DDP with the same ``torch.optim`` class and (for the record)
``ZeroRedundancyOptimizer`` train the same model on the same data: a frozen layer, a parameter forward never uses,
a float64 parameter beside float32 ones; two groups, weight decay on the weights (the frozen one among them). SGD
(momentum) and AdamW, 3 steps each, at stage 1 and 2; and a float64 probe (plain SGD, ``lr=1``) whose first update
is minus the gradient the optimizer saw. The harness records the learner's collectives (:mod:`.recorder`), reads
the inner optimizer's pieces and state, and the tensors kept after ``step()`` besides parameters and state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..equivalence import compare_gradients
from .core import LabCheck, LabResult, NotDoneInRank, import_solution, run_lab
from .measure import largest_difference, storage_bytes
from .recorder import CollectiveRecorder

__all__ = ["TOLERANCE", "check_zero_lab", "evaluate", "harness"]

TOLERANCE = 1e-6  # parameters after 3 steps, absolute
GRAD_TOLERANCE = 1e-9  # the float64 probe's first-step gradient, relative
LAB = "lab: a ZeRO-1/2 sharded optimizer"
STEPS = 3
_OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01}),
}


class _Net(nn.Module):
    """A frozen first layer, a parameter forward never uses, a float64 gain: what a fine-tuning run looks like."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same parameters on every rank
        self.embed = nn.Linear(10, 16)
        self.hidden = nn.Linear(16, 16)
        self.unused = nn.Parameter(0.5 * torch.randn(5))
        self.head = nn.Linear(16, 3)
        self.gain = nn.Parameter(1 + 0.1 * torch.randn(3, dtype=torch.float64))
        self.embed.requires_grad_(False)
        if dtype != torch.float32:
            self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(torch.tanh(self.hidden(torch.tanh(self.embed(x)))))
        return out * self.gain.to(out.dtype)


def _groups(model: _Net, decay: float) -> list[dict[str, Any]]:
    weights = [model.embed.weight, model.hidden.weight, model.unused, model.head.weight]
    others = [model.embed.bias, model.hidden.bias, model.head.bias, model.gain]
    return [{"params": weights, "weight_decay": decay}, {"params": others, "weight_decay": 0.0}]


def _batch(step: int, rank: int, world: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8 * world, 10, generator=g, dtype=dtype), torch.randint(0, 3, (8 * world,), generator=g)
    return x[rank::world], y[rank::world]


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): p.detach().clone() for n, p in model.named_parameters()}


def _state_bytes(opt: Any) -> int:
    """Bytes of an optimizer's state tensors (the step counters left out)."""
    state = getattr(opt, "state", {})
    return storage_bytes(v for s in state.values() for k, v in s.items() if k != "step")


def _kept_bytes(opt: Any, model: nn.Module, module: str) -> int:
    """Bytes of the tensors the learner's optimizer keeps, besides the parameters and the optimizer state.

    Walks the optimizer's attributes (containers, objects of the learner's module, the inner torch.optim
    optimizer) and adds every gradient (``.grad`` of the parameters and of the pieces).
    """
    inner = getattr(opt, "opt", None)
    pieces = [p for g in getattr(inner, "param_groups", []) for p in g["params"]]
    state = [v for s in getattr(inner, "state", {}).values() for v in s.values() if isinstance(v, torch.Tensor)]
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *pieces, *state]}
    found: list[torch.Tensor] = [t.grad for t in [*model.parameters(), *pieces] if t.grad is not None]
    seen, stack = set(), [opt]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__ == module:
            stack.append(vars(obj))
    return storage_bytes(t for t in found if t.untyped_storage().data_ptr() not in owned)


def _learner_run(learner: Any, opt_name: str, stage: int, rank: int, world: int, rec: CollectiveRecorder) -> dict:
    cls, kwargs = _OPTIMIZERS[opt_name]
    model = _Net()
    frozen_ptr = model.embed.weight.data_ptr()
    initial = _params(model)
    opt = learner.ZeroOptimizer(_groups(model, 0.1), cls, stage=stage, **kwargs)
    inner = getattr(opt, "opt", None)
    pieces = [p for g in getattr(inner, "param_groups", []) for p in g["params"]]
    out: dict[str, Any] = {"stepped_numel": sum(p.numel() for p in pieces), "calls": []}
    for step in range(STEPS):
        x, y = _batch(step, rank, world, torch.float32)
        rec.reset()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        out["calls"] = [(c.op, c.nbytes) for c in rec.calls]
    out.update(params=_params(model), initial=initial, frozen_moved=model.embed.weight.data_ptr() != frozen_ptr)
    out.update(state_bytes=_state_bytes(inner), kept=_kept_bytes(opt, model, type(opt).__module__))
    del opt, inner, pieces, model
    return out


def _probe(learner: Any, rank: int, world: int) -> dict[str, torch.Tensor]:
    """Minus the first update of plain SGD with lr=1 in float64: the gradient the learner's optimizer saw."""
    model = _Net(torch.float64)
    before = _params(model)
    opt = learner.ZeroOptimizer(_groups(model, 0.0), torch.optim.SGD, stage=1, lr=1.0)
    x, y = _batch(0, rank, world, torch.float64)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    after = _params(model)
    del opt, model
    return {n: before[n] - after[n] for n in before}


def _reference_runs(rank: int, world: int) -> dict[str, Any]:
    """DDP with each optimizer, ZeroRedundancyOptimizer with each, and DDP's float64 first-step gradients."""
    out: dict[str, Any] = {}
    for opt_name, (cls, kwargs) in _OPTIMIZERS.items():
        for kind in ("ddp", "zero_redundancy"):
            model = _Net()
            ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in _groups(model, 0.1)]
            if kind == "ddp":
                opt: Any = cls(groups, **kwargs)
            else:
                opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls, **kwargs, weight_decay=0.1)
                opt.add_param_group(groups[1])
            for step in range(STEPS):
                x, y = _batch(step, rank, world, torch.float32)
                opt.zero_grad()
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
            out[f"{kind} {opt_name}"] = _params(model)
            if kind == "ddp":
                out[f"state {opt_name}"] = _state_bytes(opt)
            del ddp, opt, model
    model = _Net(torch.float64)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    x, y = _batch(0, rank, world, torch.float64)
    F.cross_entropy(ddp(x), y).backward()
    out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    del ddp, model
    return out


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's ZeroOptimizer, DDP and ZeroRedundancyOptimizer (run by :func:`check_zero_lab`)."""
    recorder = CollectiveRecorder()
    out: dict[str, Any] = {}
    with recorder.installed():
        try:
            learner = import_solution(solution)
            out["probe"] = _probe(learner, rank, world_size)
            out["runs"] = {
                f"{opt_name} {stage}": _learner_run(learner, opt_name, stage, rank, world_size, recorder)
                for opt_name in _OPTIMIZERS
                for stage in (1, 2)
            }
        except NotImplementedError:
            raise NotDoneInRank from None
    out["reference"] = _reference_runs(rank, world_size)
    dist.barrier()
    return out


def _parameter_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    checks, ranks = [], list(enumerate(results))
    for opt_name in _OPTIMIZERS:
        ref = [r["reference"][f"ddp {opt_name}"] for r in results]
        diff, name, stage, rank = max(
            largest_difference(r["runs"][f"{opt_name} {s}"]["params"], ref[i]) + (s, i)
            for i, r in ranks
            for s in (1, 2)
        )
        builtin = max(largest_difference(r["reference"][f"zero_redundancy {opt_name}"], ref[i])[0] for i, r in ranks)
        ok = diff <= TOLERANCE
        good = f"stages 1 and 2 equal DDP + {opt_name}'s within {TOLERANCE:g} on every rank (largest difference "
        good += f"~{diff:.1e}; ZeroRedundancyOptimizer's ~{builtin:.1e})"
        bad = f"stage {stage}, rank {rank}: {name} differs from DDP + {opt_name}'s by {diff:.3g} "
        bad += f"(tolerance {TOLERANCE:g})"
        label = "SGD (momentum 0.9)" if opt_name == "SGD" else "AdamW"
        hint = "each inner group takes its own group's options (weight_decay=0 for the biases, not the default), the "
        hint += "gradient a piece steps with is its part of the averaged chunk, every chunk comes back to every rank"
        checks.append(LabCheck(f"parameters after {STEPS} {label} steps", ok, good if ok else bad, hint))
    apart, name, key, rank = max(
        largest_difference(r["runs"][k]["params"], results[0]["runs"][k]["params"]) + (k, i)
        for i, r in ranks
        for k in r["runs"]
    )
    good = "after every step of every run, the ranks' parameters are identical"
    bad = f"{key}: rank {rank}'s {name} differs from rank 0's by {apart:.3g}"
    hint = "after self.opt.step(), all-gather each buffer from its chunks (dist.all_gather_single(flat, my_chunk)): "
    hint += "each rank updated only its own chunk"
    checks.append(LabCheck("every rank holds the same parameters", apart == 0, good if apart == 0 else bad, hint))
    return checks


def _skipped_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    runs = [(key, i, run) for i, r in enumerate(results) for key, run in r["runs"].items()]
    frozen = [
        f"{key}, rank {i}: the frozen {n} " + ("was moved into a flat buffer" if run["frozen_moved"] else "changed")
        for key, i, run in runs
        for n in ("embed.weight", "embed.bias")
        if run["frozen_moved"] or not torch.equal(run["params"][n], run["initial"][n])
    ]
    unused = [
        f"{key}, rank {i}: the parameter forward never uses moved by "
        f"{(run['params']['unused'] - run['initial']['unused']).abs().max().item():.3g}"
        for key, i, run in runs
        if not torch.equal(run["params"]["unused"], run["initial"]["unused"])
    ]
    hints = (
        "keep only the parameters with requires_grad=True of each group: a frozen parameter in the buffer is "
        "sharded, communicated and, with a zero gradient, decayed by AdamW's weight decay",
        "a piece of a parameter that got no gradient on any rank keeps .grad = None: stepped with a zero "
        "gradient, it is still decayed (AdamW, SGD with weight decay) and pushed by momentum",
    )
    good = (
        "the frozen layer (its weight in the decayed group) is never flattened, stepped or decayed",
        "the parameter forward never uses is skipped, as torch.optim skips it under DDP (.grad None)",
    )
    return [
        LabCheck(name, not found, found[0] if found else ok, hint)
        for name, found, ok, hint in zip(
            ("frozen parameters", "a parameter without a gradient"), (frozen, unused), good, hints
        )
    ]


def _sizes() -> tuple[int, int]:
    """The model's trainable elements, and the bytes of their gradient in a step (the unused parameter has none)."""
    net = _Net()
    trainable = [p for p in net.parameters() if p.requires_grad and p is not net.unused]
    return sum(p.numel() for p in trainable) + net.unused.numel(), sum(p.numel() * p.element_size() for p in trainable)


def _shard_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    n, r0 = len(results), results[0]
    numel, grad_bytes = _sizes()
    stepped = [r["runs"]["AdamW 2"]["stepped_numel"] for r in results]
    cover = sum(stepped) == numel and max(stepped) <= -(-numel // n) + 4
    state = [r["runs"]["AdamW 2"]["state_bytes"] for r in results]
    full_state = r0["reference"]["state AdamW"]
    share = sum(state) >= full_state and max(state) <= full_state / n * 1.1 + 64
    kept_bytes = [r["runs"]["AdamW 2"]["kept"] for r in results]
    stage1 = [r["runs"]["AdamW 1"]["kept"] for r in results]
    dropped = max(kept_bytes) <= grad_bytes / n + 64
    return [
        LabCheck(
            "each rank steps its chunk",
            cover,
            f"the ranks' optimizers step {' + '.join(map(str, stepped))} elements = the {numel} trainable ones"
            if cover
            else f"the ranks' optimizers step {' + '.join(map(str, stepped))} = {sum(stepped)} elements; the model has "
            f"{numel} trainable ones, each to be stepped by exactly one rank",
            "pad each buffer to a multiple of N and give each rank ceil(total / N) elements; a piece is the part of a "
            "parameter in [rank * shard, (rank + 1) * shard): a bound off by one leaves elements that no rank updates",
        ),
        LabCheck(
            "optimizer state",
            share,
            f"AdamW's state on each rank: {', '.join(map(str, state))} bytes; DDP's AdamW holds {full_state} "
            f"(about 1/{n} each, the whole together)",
            "build self.opt on this rank's pieces only: its state is then 1/N of the model's",
        ),
        LabCheck(
            "stage 2 drops the full gradient",
            dropped,
            f"after step(), stage 2 keeps ~{max(kept_bytes)} bytes of gradient on a rank"
            + (" (its chunk)" if dropped else f" (its chunk is ~{grad_bytes // n})")
            + f"; the full gradient is {grad_bytes} bytes (stage 1 keeps ~{max(stage1)})",
            "at stage 2, set every p.grad to None after the reduce-scatter and keep no reference to a flat copy of "
            "the gradient: only this rank's chunk may survive the step",
        ),
    ]


def _communication_check(results: Sequence[dict[str, Any]]) -> LabCheck:
    n, ops = len(results), ("all_gather", "reduce_scatter", "all_reduce")
    total = sum(p.numel() * p.element_size() for p in _Net().parameters() if p.requires_grad)
    sums = [[sum(b for o, b in r["runs"]["AdamW 2"]["calls"] if o.startswith(op)) for op in ops] for r in results]
    slack = 8 * n * 4  # the padding of a few buffers
    ok = all(total <= g <= total + slack and total <= n * s <= total + slack and a < total / 4 for g, s, a in sums)
    gathered, scattered, reduced = sums[0]
    return LabCheck(
        "communication per step",
        ok,
        f"a rank all-gathers {gathered} bytes of parameters, receives {scattered} bytes of reduce-scattered gradient "
        f"and all-reduces {reduced} bytes; the trainable parameters are {total} bytes",
        "reduce-scatter the gradient (not an all-reduce of all of it) and all-gather the parameters, each buffer "
        "once a step, with only the trainable parameters in the buffers",
    )


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    if not results:
        raise ValueError("results must hold what each rank measured, in rank order; got none")
    n = len(results)
    matches = [
        compare_gradients(
            {k: r["probe"][k] for k in r["reference"]["grads"]},
            r["reference"]["grads"],
            tolerance=GRAD_TOLERANCE,
            world_size=n,
            against="DDP",
        )
        for r in results
    ]
    bad = next((m for m in matches if not m.ok), None)
    checks = [
        LabCheck(
            "gradients of the first step",
            bad is None,
            str(matches[0] if bad is None else bad) + " (float64; minus the first update of SGD with lr=1)",
            "reduce-scatter the sum of the gradients and divide the chunk by the world size once",
        )
    ]
    checks += _skipped_checks(results)
    checks += _parameter_checks(results)
    checks += _shard_checks(results)
    checks.append(_communication_check(results))
    return checks


def check_zero_lab(solution: str | Path = "_runs/lab_zero.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``ZeroOptimizer`` on 2 processes against DDP with the same optimizer (see the module)."""
    return run_lab(LAB, solution, "course_lib.labs.zero:harness", evaluate, nprocs=2, timeout=timeout)
