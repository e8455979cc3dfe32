"""The capstone lab (after notebook 22): the learner's training script, launched with ``torchrun`` under several flag
sets, must match one process on the gradients of its first step and on its parameters after every step.

The script imports its model, data, loss, optimizer and saving from here (:func:`build_model`, :func:`global_batch`,
:func:`loss_fn`, :func:`make_optimizer`, :func:`save`), so the check computes the one-process reference with exactly
the same pieces, in the notebook's own process. The gradients are compared with
:func:`course_lib.equivalence.compare_gradients`: a sum where a mean belongs, or an accumulation that forgets to divide
by the micro-batches, cannot pass it, although it would pass a comparison of AdamW's losses.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..equivalence import compare_gradients
from ..launch import LaunchError, run_ranks, run_torchrun
from ..validation import check_int
from .core import LabCheck, LabResult, NotDoneInRank, deferred_to_grader, first_line, import_solution, lab_timeout

__all__ = [
    "FLAG_SETS",
    "build_model",
    "check_capstone_lab",
    "global_batch",
    "harness",
    "loss_fn",
    "make_optimizer",
    "save",
]

LAB = "lab: the training script, assembled"
# name: (flags, steps); each launched on 2 processes
FLAG_SETS = {
    "ddp, accumulation 2, SGD": ["--dp", "ddp", "--accum", "2", "--optim", "sgd"],
    "fsdp2, accumulation 2, clipping, AdamW": ["--dp", "fsdp2", "--accum", "2", "--clip", "0.5", "--optim", "adamw"],
    "ddp, clipping, AdamW": ["--dp", "ddp", "--clip", "0.5", "--optim", "adamw"],
}
STEPS = 3
GRAD_TOL, PARAM_TOL = 1e-5, 1e-5


def build_model() -> nn.Sequential:
    """The lab's model: the same seeded weights on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def global_batch(step: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: the same on every rank (seeded by the step)."""
    check_int("step", step, minimum=0)
    check_int("rows", rows, minimum=1)
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 16, generator=g), torch.randint(0, 4, (rows,), generator=g)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of a batch."""
    return nn.functional.cross_entropy(logits, targets)


def make_optimizer(name: str, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """``"sgd"`` (lr 0.1, momentum 0.9) or ``"adamw"`` (lr 0.01, weight decay 0.1)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    raise ValueError(f"name must be 'sgd' or 'adamw', got {name!r}")


def save(result: dict[str, Any], out: str | Path) -> None:
    """Rank 0 writes ``result`` to ``out/result.pt`` (the other ranks write nothing)."""
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        torch.save(result, Path(out) / "result.pt")


def _flag(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def reference(flags: list[str], steps: int = STEPS) -> dict[str, Any]:
    """One process on the whole global batch: the first gradients, the parameters after each step, the losses."""
    model = build_model()
    opt = make_optimizer(_flag(flags, "--optim", "sgd"), model.parameters())
    clip = float(_flag(flags, "--clip", "0"))
    first: dict[str, torch.Tensor] = {}
    losses = []
    for step in range(steps):
        x, y = global_batch(step)
        loss = loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            first = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {
        "first_grads": first,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "losses": losses,
    }


def _judge(name: str, flags: list[str], got: dict[str, Any], ref: dict[str, Any]) -> list[LabCheck]:
    accum = int(_flag(flags, "--accum", "1"))
    grads, want = got.get("first_grads", {}), ref["first_grads"]
    if (
        not isinstance(grads, dict)
        or set(grads) != set(want)
        or any(not isinstance(grads[k], torch.Tensor) or grads[k].shape != want[k].shape for k in want)
    ):
        shapes = {k: tuple(v.shape) for k, v in grads.items()} if isinstance(grads, dict) else grads
        detail = (
            f"got {shapes}, expected every parameter's whole gradient: {[(k, tuple(v.shape)) for k, v in want.items()]}"
        )
        match = None
    else:
        match = compare_gradients(grads, want, tolerance=GRAD_TOL, world_size=2, micro_batches=accum)
        detail = str(match)
    checks = [
        LabCheck(
            f"first-step gradients ({name})",
            match is not None and match.ok,
            detail,
            "divide each micro-batch's loss by the number of micro-batches; synchronize on the last micro-batch only; "
            "take your own rows of the global batch; record the gradients whole (.full_tensor()) after the last "
            "micro-batch and before clipping; clip once per step",
        )
    ]
    params = got.get("params", {})
    ok_shapes = (
        isinstance(params, dict)
        and set(params) == set(ref["params"])
        and all(isinstance(params[k], torch.Tensor) and params[k].shape == v.shape for k, v in ref["params"].items())
    )
    worst = max((params[k] - v).abs().max().item() for k, v in ref["params"].items()) if ok_shapes else float("inf")
    checks.append(
        LabCheck(
            f"parameters after {STEPS} steps ({name})",
            worst <= PARAM_TOL,
            f"within {PARAM_TOL:g} of one process's (largest difference ~{worst:.1e})"
            if worst <= PARAM_TOL
            else f"largest difference from one process's: {worst:.3g} (tolerance {PARAM_TOL:g})",
            "clip once per step, after the last micro-batch and before the optimizer, with clip_grad_norm_ (the norm "
            "of the whole gradient, across ranks); return the whole parameters (.full_tensor() for a DTensor)",
        )
    )
    return checks


def harness(rank: int, world_size: int, solution: str, flags: list[str]) -> dict[str, Any]:
    """In each rank of a ``run_ranks`` job: the learner's ``train(parse(flags), rank, world)`` (group ready)."""
    learner = import_solution(solution)
    try:
        result = learner.train(learner.parse([*flags, "--steps", str(STEPS), "--out", "unused"]), rank, world_size)
    except NotImplementedError:
        raise NotDoneInRank from None
    return dict(result) if isinstance(result, dict) else {"returned": repr(result)[:200]}


def _launch(path: Path, flags: list[str], torchrun: bool, timeout: float) -> dict[str, Any]:
    """Rank 0's result: through ``torchrun`` and the script's own ``main()``, or forked ranks calling ``train``."""
    if not torchrun:
        return run_ranks(
            "course_lib.labs.capstone:harness", 2, (str(path.resolve()), flags), timeout=timeout, echo="none"
        )[0]
    with tempfile.TemporaryDirectory(prefix="lab_capstone_") as out:
        run_torchrun(
            path.resolve(),
            nproc_per_node=2,
            args=[*flags, "--steps", STEPS, "--out", out],
            timeout=timeout,
            echo="none",
        )
        result = Path(out) / "result.pt"
        return torch.load(result, weights_only=True) if result.is_file() else {}


def check_capstone_lab(solution: str | Path = "_runs/lab_capstone.py", *, timeout: float | None = None) -> LabResult:
    """Judge ``solution`` under each of :data:`FLAG_SETS` on 2 processes: the first through ``torchrun`` (the script
    as you would launch it), the others as forked ranks calling its ``train`` (the same code, started faster).
    ``timeout`` is per run (default 180 s, or ``$COURSE_LAB_TIMEOUT``)."""
    if not isinstance(solution, (str, Path)):
        raise TypeError(f"solution must be the path of the file to check, got {type(solution).__name__}")
    timeout = lab_timeout(timeout, 180.0)
    deferred = deferred_to_grader(LAB)
    if deferred is not None:
        return deferred
    path = Path(solution)
    todo = f"write the body of train() marked YOUR CODE HERE, run the cell that writes {path.name}, then this check"
    if not path.is_file():
        return LabResult(LAB, "not done yet", f"{path} does not exist yet: {todo}")
    start, checks = time.monotonic(), list[LabCheck]()
    for i, (name, flags) in enumerate(FLAG_SETS.items()):
        how = "torchrun" if i == 0 else "forked ranks"
        try:
            got = _launch(path, flags, i == 0, timeout)
        except LaunchError as error:
            text = error.traceback or str(error)
            if "NotImplementedError" in text or "NotDoneInRank" in text:
                return LabResult(LAB, "not done yet", todo, seconds=time.monotonic() - start)
            last = first_line(text.strip().splitlines()[-1]) if text.strip() else str(error.reason)
            hint = (
                "a parameter has no .grad after the step's backward: the last micro-batch must synchronize (FSDP2: "
                "set_requires_gradient_sync(True), which reduce-scatters the accumulated gradients into the shards)"
                if "NoneType" in last
                else "the traceback's last line says where your code failed"
            )
            checks.append(LabCheck(f"the job runs ({name}, {how})", False, f"{' '.join(flags)}: {last}", hint))
            continue
        checks += _judge(name, flags, got, reference(flags))
    seconds = time.monotonic() - start
    failed = [c for c in checks if not c.passed]
    if failed:
        message = f"{len(failed)} of {len(checks)} checks failed (~{seconds:.0f} s)"
        return LabResult(LAB, "wrong", message, tuple(checks), seconds)
    message = f"every check passed (3 runs of 2 processes, the first under torchrun, ~{seconds:.0f} s)"
    return LabResult(LAB, "correct", message, tuple(checks), seconds)
