"""The pipeline lab (after notebook 13): a 1F1B schedule of 2 stages, checked against ``Schedule1F1B`` and one process.

The harness splits a small MLP in two stages, one per rank, and runs the learner's ``OneFOneB`` for 2 steps of 4
micro-batches, with SGD and with AdamW; beside it, in the same processes, ``PipelineStage`` and ``Schedule1F1B`` of
``torch.distributed.pipelining`` on the same stages and data, and the whole model in one process. It records the order
of each stage's forwards and backwards (a forward hook on the stage, and a hook on each forward's output, called when
that micro-batch's backward reaches the stage), and every message the learner's code posts; a message whose buffer
does not have an activation's shape is refused at once, with that shape in the error, instead of aborting the rank.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..equivalence import compare_gradients
from .core import LabCheck, LabResult, NotDoneInRank, import_solution, run_lab
from .recorder import CollectiveRecorder

__all__ = ["check_pipeline_lab", "evaluate", "harness"]

LAB = "lab: a 1F1B pipeline"
IN, HIDDEN, CLASSES, BATCH, MICRO = 16, 32, 4, 16, 4
TOLERANCE = 1e-5  # relative, on gradients (compare_gradients)
PARAM_TOLERANCE = 1e-6  # absolute, on parameters after the optimizer steps
EXPECTED = {
    0: ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],  # warm-up F F, then B F, B F, then cool-down B B
    1: ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"],  # the last stage: one forward, its backward at once
}
_P2P = ("send", "recv", "isend", "irecv")


def _stage(rank: int) -> nn.Module:
    """Rank ``rank``'s half of the model (the same weights on every rank: seed 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),  # stage 0
        nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES),  # stage 1
    )  # fmt: skip
    return model if rank < 0 else (model[:4] if rank == 0 else model[4:])


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(BATCH, IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


class _Order:
    """Each forward of a stage, and the start of each micro-batch's backward on it, named by micro-batch."""

    def __init__(self, stage: nn.Module, rank: int) -> None:
        x = _batch(0)[0].chunk(MICRO)  # what the stage gets in the first step, by micro-batch: to name them
        with torch.no_grad():
            self.inputs = list(x) if rank == 0 else [_stage(0)(c) for c in x]
        self.live, self.peak, self.on = 0, 0, True
        self.events: list[str] = []
        self.handle = stage.register_forward_hook(self._forward)

    def _forward(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0] if args else None
        if not self.on or not isinstance(x, torch.Tensor) or x.is_meta or not output.requires_grad:
            return
        hit = [i for i, e in enumerate(self.inputs) if e.shape == x.shape and torch.allclose(e, x.detach(), atol=1e-5)]
        label = str(hit[0]) if hit else "?"
        self.events.append(f"F{label}")
        self.live += 1
        self.peak = max(self.peak, self.live)
        output.register_hook(functools.partial(self._backward, label))

    def _backward(self, label: str, grad: torch.Tensor) -> None:
        if self.on:
            self.events.append(f"B{label}")
            self.live -= 1


@contextmanager
def _shape_guard(
    rank: int, order: list[_Order | None], recorder: CollectiveRecorder, log: list[tuple[str, int]]
) -> Iterator[None]:
    """Around the recorder: refuse a message whose tensor is not one activation's shape; note each message the
    learner's code posts in ``log`` as (operation, step), not the calls ``send``/``recv`` make inside themselves;
    print it with the micro-batches run so far (the last lines a hang shows)."""
    import torch.distributed.distributed_c10d as c10d

    saved = {name: getattr(dist, name) for name in _P2P}
    modules = {name: [m for m in (dist, c10d) if getattr(m, name, None) is saved[name]] for name in _P2P}
    depth = [0]  # dist.recv calls c10d's irecv: only the outermost call is the learner's

    def guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return fn(tensor, *args, **kwargs)
            shape = (BATCH // MICRO, HIDDEN)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape or tensor.dtype != torch.float32:
                what = f"a {tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor) else "no tensor"
                raise ValueError(
                    f"dist.{name} with {what} buffer: every message between the two stages is one micro-batch's "
                    f"activation or its gradient, a {shape} torch.float32 tensor (a receive buffer must have the "
                    "shape of what the other stage sends)"
                )
            log.append((name, recorder.step))
            if order[0] is not None and order[0].on:
                print(f"stage {rank}: dist.{name} after {' '.join(order[0].events) or 'no forward'}", flush=True)
            depth[0] += 1
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    try:
        for name, fn in saved.items():
            wrapper = guarded(name, fn)
            for m in modules[name]:  # one wrapper under both names, as the recorder does (P2POp checks c10d's own)
                setattr(m, name, wrapper)
        yield
    finally:
        for name, fn in saved.items():
            for m in modules[name]:
                setattr(m, name, fn)


def _train(
    step_fn: Callable[[torch.Tensor], Any],
    stage: nn.Module,
    rank: int,
    opt_name: str,
    order: _Order | None,
    recorder: CollectiveRecorder | None = None,
) -> dict:
    """Two steps: ``step_fn(x or y)`` runs a pipeline step on this rank's stage, then the optimizer's step."""
    opt = torch.optim.SGD(stage.parameters(), lr=0.1) if opt_name == "SGD" else torch.optim.AdamW(stage.parameters())
    out: dict[str, Any] = {}
    for step in range(2):
        if recorder is not None:
            recorder.step = step
        x, y = _batch(step)
        losses = step_fn(x if rank == 0 else y)
        if order is not None:
            order.on = False
        if step == 0:
            out["first_grads"] = {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}
            out["losses"] = [float(v) for v in losses] if isinstance(losses, (list, tuple)) else losses
        opt.step()
        opt.zero_grad()
    out["params"] = {n: p.detach().clone() for n, p in stage.named_parameters()}
    return out


def _one_process(rank: int) -> dict[str, Any]:
    """The whole model on the whole batch: this stage's first gradients, its parameters after the steps."""
    names = {n for n, _ in _stage(rank).named_parameters()}

    def mine(model: nn.Module, what: str) -> dict[str, torch.Tensor]:
        found = {n: p.grad if what == "grad" else p for n, p in model.named_parameters() if n in names}
        return {n: t.detach().clone() for n, t in found.items() if t is not None}

    model, (x, y) = _stage(-1), _batch(0)
    (F.cross_entropy(model(x.chunk(MICRO)[-1]), y.chunk(MICRO)[-1]) / MICRO).backward()
    out: dict[str, Any] = {"last_only": mine(model, "grad")}  # what a step that zeroes between micro-batches keeps
    for opt_name in ("SGD", "AdamW"):
        model = _stage(-1)
        opt = (
            torch.optim.SGD(model.parameters(), lr=0.1) if opt_name == "SGD" else torch.optim.AdamW(model.parameters())
        )
        for step in range(2):
            x, y = _batch(step)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if step == 0:
                out["first_grads"], out["loss"] = mine(model, "grad"), loss.item()
            opt.step()
            opt.zero_grad()
        out[opt_name] = {"params": mine(model, "param")}
    return out


def _pytorch(rank: int, world_size: int) -> dict[str, Any]:
    """The same steps with ``PipelineStage`` and ``Schedule1F1B``."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    out: dict[str, Any] = {}
    for opt_name in ("SGD", "AdamW"):
        module = _stage(rank)
        shapes = [(BATCH // MICRO, IN), (BATCH // MICRO, HIDDEN), (BATCH // MICRO, CLASSES)]
        stage = PipelineStage(  # the shapes given: it runs no forward and backward of its own to infer them
            module,
            stage_index=rank,
            num_stages=world_size,
            device=torch.device("cpu"),
            input_args=torch.empty(shapes[rank], requires_grad=rank > 0),
            output_args=torch.empty(shapes[rank + 1]),
            output_grads=torch.zeros(shapes[1]) if rank == 0 else None,
        )
        schedule = Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=F.cross_entropy)

        def step(batch: torch.Tensor, schedule: Any = schedule) -> list[float]:
            losses: list[torch.Tensor] = []
            schedule.step(batch) if rank == 0 else schedule.step(target=batch, losses=losses)
            return [v.item() for v in losses]

        order = _Order(module, rank) if opt_name == "SGD" else None
        out[opt_name] = _train(step, module, rank, opt_name, order)
        if order is not None:
            out["order"], out["peak"] = order.events, order.peak
            order.handle.remove()
        del schedule, stage, module
    return out


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's OneFOneB, Schedule1F1B and one process, side by side (see the module)."""
    recorder = CollectiveRecorder()
    out: dict[str, Any] = {"rank": rank}
    current: list[_Order | None] = [None]  # the order being recorded, for the guard's lines
    messages: list[tuple[str, int]] = []
    with recorder.installed(), _shape_guard(rank, current, recorder, messages):
        try:
            learner = import_solution(solution)
            runs = {}
            for opt_name in ("SGD", "AdamW"):
                stage = _stage(rank)
                runner = learner.OneFOneB(stage, rank, MICRO)
                order = current[0] = _Order(stage, rank) if opt_name == "SGD" else None
                recorder.reset()
                runs[opt_name] = _train(runner.step, stage, rank, opt_name, order, recorder)
                if order is not None:
                    out["order"], out["peak"] = order.events, order.peak
                    out["calls"] = [*messages, *((c.op, c.step) for c in recorder.calls if c.op not in _P2P)]
                    order.handle.remove()
                del runner, stage
        except NotImplementedError:
            raise NotDoneInRank from None
    out["runs"] = runs
    dist.barrier()
    out["pytorch"] = _pytorch(rank, world_size)
    out["one"] = _one_process(rank)
    dist.barrier()
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in b) if set(a) == set(b) else float("inf")


def _gradient_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    checks = []
    for against in ("one process", "Schedule1F1B"):
        matches: list[Any] = []
        extra = ""
        for r in results:
            ref = r["one"]["first_grads"] if against == "one process" else r["pytorch"]["SGD"]["first_grads"]
            got = r["runs"]["SGD"]["first_grads"]
            if set(got) != set(ref):
                matches.append(f"stage {r['rank']}: {len(ref) - len(got)} parameter(s) have no .grad after the step")
                continue
            m = compare_gradients(got, ref, tolerance=TOLERANCE, micro_batches=MICRO, against=against)
            matches.append(m if m.ok else f"stage {r['rank']}: {m}")
            if not m.ok and compare_gradients(got, r["one"]["last_only"], tolerance=TOLERANCE).ok:
                extra = "; they are the last micro-batch's alone: the earlier micro-batches' gradients were lost"
        bad = [m for m in matches if isinstance(m, str)]
        checks.append(
            LabCheck(
                "gradients of the first step" + ("" if against == "one process" else " against Schedule1F1B"),
                not bad,
                (f"both stages: {matches[0]}" if not bad else "; ".join(bad) + extra),
                "divide each micro-batch's loss by the number of micro-batches, and let every backward accumulate "
                "into the same .grad (never zeroed inside a step); stage 0 runs the backward of micro-batch i with the "
                "gradient received for micro-batch i (the oldest activation kept, first in first out)",
            )
        )
    return checks


def _order_checks(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    orders = {r["rank"]: r["order"] for r in results}
    theirs = {r["rank"]: r["pytorch"]["order"] for r in results}
    ok = all(orders[s] == EXPECTED[s] for s in EXPECTED)
    shown = "; ".join(f"stage {s}: {' '.join(orders[s])}" for s in sorted(orders))
    same = all(theirs[s] == EXPECTED[s] for s in EXPECTED)
    checks = [
        LabCheck(
            "order of operations",
            ok,
            f"{shown} (Schedule1F1B: {'the same' if same else theirs})"
            if ok
            else f"{shown}; 1F1B runs "
            + "; ".join(f"stage {s}: {' '.join(EXPECTED[s])}" for s in sorted(EXPECTED))
            + f" (Schedule1F1B: {'the same' if same else theirs})",
            "stage s of p runs p - s forwards first (the warm-up: 2 on stage 0, 1 on stage 1), then one backward "
            "and one forward while forwards remain, then the remaining backwards, each micro-batch's backward in "
            "forward order; every forward first, then every backward, is GPipe",
        )
    ]
    peaks = {r["rank"]: r["peak"] for r in results}
    checks.append(
        LabCheck(
            "activations alive at once",
            peaks.get(0, 99) <= 2 and peaks.get(1, 99) <= 1,
            f"at most {peaks.get(0)} micro-batches' activations on stage 0 and {peaks.get(1)} on stage 1 (1F1B: 2 "
            f"and 1, GPipe: {MICRO} and {MICRO})",
            "a micro-batch's activations are freed by its backward: run it as soon as its gradient can arrive",
        )
    )
    return checks


def _message_check(results: Sequence[dict[str, Any]]) -> LabCheck:
    counts = {}
    for r in results:
        ops = [op for op, step in r["calls"] if step == 0]  # the first step's
        sent, received = sum(op in _P2P[::2] for op in ops), sum(op in _P2P[1::2] for op in ops)
        counts[r["rank"]] = (sent, received, sorted(set(ops) - set(_P2P)))
    ok = all(v == (MICRO, MICRO, []) for v in counts.values())
    shown = "; ".join(
        f"stage {s} sent {n_s} and received {n_r} messages" + (f", and called {', '.join(o)}" if o else "")
        for s, (n_s, n_r, o) in sorted(counts.items())
    )
    return LabCheck(
        "point-to-point messages",
        ok,
        f"{shown} in one step, {BATCH // MICRO * HIDDEN * 4} B each ({MICRO} activations forward, {MICRO} gradients "
        "back)",
        "stage 0 sends each micro-batch's activation once and receives its gradient once; stage 1 the reverse; "
        "nothing else is communicated",
    )


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each stage measured."""
    if len(results) != 2 or not all(isinstance(r, dict) for r in results):
        raise ValueError("results must be the 2 ranks' measurements, one dict per rank")
    checks = _gradient_checks(results)
    last = next(r for r in results if r["rank"] == 1)
    got, theirs = last["runs"]["SGD"]["losses"], last["pytorch"]["SGD"]["losses"]
    ok = isinstance(got, list) and len(got) == len(theirs) and max(abs(a - b) for a, b in zip(got, theirs)) <= 1e-6
    checks.append(
        LabCheck(
            "micro-batch losses",
            ok,
            f"stage 1 returned {[round(v, 4) for v in got] if isinstance(got, list) else got!r}; Schedule1F1B's: "
            f"{[round(v, 4) for v in theirs]}, whose mean is one process's loss {last['one']['loss']:.4f}",
            "step() returns, on stage 1, each micro-batch's mean cross-entropy as a float, before the division by "
            "the number of micro-batches; on stage 0 an empty list",
        )
    )
    checks += _order_checks(results)
    for opt_name in ("SGD", "AdamW"):
        worst = max(
            _max_diff(r["runs"][opt_name]["params"], r[ref][opt_name]["params"])
            for r in results
            for ref in ("pytorch", "one")
        )
        checks.append(
            LabCheck(
                f"parameters after 2 {opt_name} steps",
                worst <= PARAM_TOLERANCE,
                f"equal Schedule1F1B's and one process's within {PARAM_TOLERANCE:g} on both stages (largest "
                f"difference ~{worst:.1e})"
                if worst <= PARAM_TOLERANCE
                else f"largest difference from Schedule1F1B's or one process's: {worst:.3g} (tolerance "
                f"{PARAM_TOLERANCE:g})",
                "the optimizer must see the gradients of the mean loss over the whole batch",
            )
        )
    checks.append(_message_check(results))
    return checks


_HINTS = {
    "the job runs": "a receive buffer has the shape of what the other stage sends (one micro-batch's activation, "
    f"({BATCH // MICRO}, {HIDDEN}))",
    "the job finishes": "here the two stages wait for each other: both in dist.recv (each waits for a message the "
    "other sends later: stage 0 runs 2 forwards before its first backward, stage 1 one), or both in a blocking "
    "dist.send, which returns only once the other stage receives (send with dist.isend, wait at the end of the step)",
}


def check_pipeline_lab(solution: str | Path = "_runs/lab_pipeline.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``OneFOneB`` on 2 processes against ``Schedule1F1B`` and one process (see the module)."""
    if not isinstance(solution, (str, Path)):
        raise TypeError(f"solution must be the path of the file to check, got {type(solution).__name__}")
    result = run_lab(LAB, solution, "course_lib.labs.pipeline:harness", evaluate, nprocs=2, timeout=timeout)
    if result.status == "wrong" and result.checks and result.checks[0].name in _HINTS:
        first = result.checks[0]
        hint = "; ".join(h for h in (first.hint, _HINTS[first.name]) if h)
        return dataclasses.replace(result, checks=(dataclasses.replace(first, hint=hint), *result.checks[1:]))
    return result
