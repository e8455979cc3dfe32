"""The expert-parallel lab (after notebook 18): a top-1 mixture of experts over 2 ranks, checked against one process.

The harness builds :class:`course_lib.moe.MoE` (4 SwiGLU experts, top-1, capacity factor 1) from one seed on each
rank; rank ``r`` keeps experts ``2r`` and ``2r + 1`` and its own 32 tokens. It routes them with the replicated router
(:func:`course_lib.moe.route`) and hands the learner's ``moe_forward`` each token's expert, whether it fits that
expert's capacity, and its gate (differentiable); the block's output is ``x + moe(x)``, so a dropped token passes
through unchanged. It trains 2 steps with SGD and 2 with AdamW (the router's gradient summed over the ranks, as a
replicated parameter's is), and the same layer in one process on every rank's tokens. Every ``all_to_all_single``
the learner issues is checked before it runs: one split size per rank, sizes that add up to the tensors' rows, and
what each rank sends to this one equal to what this one expects (a mismatch otherwise aborts the process or mixes
rows); its bytes to other ranks are recorded, to compare with :func:`course_lib.moe.expert_parallel_bytes`.
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
import torch.distributed.distributed_c10d as c10d
from torch import nn

from ..equivalence import compare_gradients
from ..moe import MoE, expert_parallel_bytes, route
from .core import LabCheck, LabResult, NotDoneInRank, import_solution, run_lab
from .recorder import CollectiveRecorder

__all__ = ["check_experts_lab", "evaluate", "harness"]

LAB = "lab: expert parallelism"
D_MODEL, D_FF, EXPERTS, TOKENS, CAPACITY_FACTOR = 16, 32, 4, 32, 1.0
TOLERANCE = 1e-5  # relative, on outputs and gradients
PARAM_TOLERANCE = 1e-6  # absolute, on parameters after the optimizer steps
# The harness's own collectives, taken before any recorder wraps the module's functions: they are not the learner's.
_ALL_GATHER, _ALL_REDUCE = c10d.all_gather, c10d.all_reduce


def _moe() -> MoE:
    return MoE(D_MODEL, D_FF, EXPERTS, top_k=1, capacity_factor=CAPACITY_FACTOR, seed=0)


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(TOKENS, D_MODEL, generator=g), torch.randn(TOKENS, D_MODEL, generator=g)


def _loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((y - target) ** 2).mean()


def _splits(name: str, sizes: Any, rows: int, world: int) -> list[int]:
    if sizes is None or (isinstance(sizes, (list, tuple)) and len(sizes) == 0):
        if rows % world:
            raise ValueError(f"all_to_all_single without {name}: {rows} rows do not split equally over {world} ranks")
        return [rows // world] * world
    sizes = [int(s) for s in sizes]
    if len(sizes) != world:
        raise ValueError(
            f"all_to_all_single: {name} has {len(sizes)} entries for {world} ranks: one per rank, the rows "
            "exchanged with that rank"
        )
    if sum(sizes) != rows:
        raise ValueError(
            f"all_to_all_single: {name} add up to {sum(sizes)}, but its tensor has {rows} rows (input_split_sizes: "
            "the rows sent to each rank, output_split_sizes: the rows received from each)"
        )
    return sizes


@contextmanager
def _guard(recorder: CollectiveRecorder, sent: list[tuple[int, int]]) -> Iterator[None]:
    """Check each ``all_to_all_single`` against every rank's split sizes first; note its bytes to other ranks."""
    saved = dist.all_to_all_single
    modules = [m for m in (dist, c10d) if getattr(m, "all_to_all_single", None) is saved]  # both names, as recorded

    @functools.wraps(saved)
    def call(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None, **kw: Any) -> Any:
        world, me = dist.get_world_size(), dist.get_rank()
        outs = _splits("output_split_sizes", output_split_sizes, output.shape[0], world)
        ins = _splits("input_split_sizes", input_split_sizes, input.shape[0], world)
        table = [torch.zeros(world, dtype=torch.int64) for _ in range(world)]
        _ALL_GATHER(table, torch.tensor(ins, dtype=torch.int64))  # table[s][r]: rows rank s sends to rank r
        for s in range(world):
            if int(table[s][me]) != outs[s]:
                raise ValueError(
                    f"all_to_all_single: rank {s} sends {int(table[s][me])} rows to rank {me}, whose "
                    f"output_split_sizes[{s}] is {outs[s]}: the output split sizes are what each rank sends to this "
                    "one, learned from the counts exchange (input and output sizes swap in the backward)"
                )
        row = input[0].numel() * input.element_size() if input.shape[0] else 0
        sent.append((recorder.step, (sum(ins) - ins[me]) * row))
        return saved(output, input, outs, ins, **kw)

    for m in modules:
        setattr(m, "all_to_all_single", call)  # noqa: B010 - mypy rejects the plain assignment
    try:
        yield
    finally:
        for m in modules:
            setattr(m, "all_to_all_single", saved)  # noqa: B010


def _routing(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = route(moe.router(x), 1, CAPACITY_FACTOR)
    return r.experts[:, 0].clone(), r.kept[:, 0].clone(), r.weights[:, 0]


def _train(
    forward: Callable[..., torch.Tensor], rank: int, world: int, opt_name: str, recorder: CollectiveRecorder
) -> dict[str, Any]:
    """Two steps of this rank's share of the layer: the router (replicated) and its local experts."""
    moe = _moe()
    per = EXPERTS // world
    local = nn.ModuleList(moe.experts[rank * per : (rank + 1) * per])
    named = {"router.weight": moe.router.weight}
    named |= {f"experts.{rank * per + j}.{n}": p for j, e in enumerate(local) for n, p in e.named_parameters()}
    opt = torch.optim.SGD(named.values(), lr=0.1) if opt_name == "SGD" else torch.optim.AdamW(named.values())
    out: dict[str, Any] = {}
    for step in range(2):
        recorder.step = step
        x, target = _data(rank, step)
        x.requires_grad_()
        expert, kept, gate = _routing(moe, x)
        y = forward(x, expert, kept, gate, local, EXPERTS)
        _loss(y, target).backward()
        router = moe.router.weight
        out.setdefault("router_has_grad", router.grad is not None)
        if router.grad is None:
            router.grad = torch.zeros_like(router)
        _ALL_REDUCE(router.grad)  # a replicated parameter: the sum of every rank's gradient (not the learner's)
        if step == 0:
            out["y"], out["x_grad"] = y.detach().clone(), x.grad
            out["grads"] = {n: p.grad.clone() for n, p in named.items() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    out["params"] = {n: p.detach().clone() for n, p in named.items()}
    return out


def _one_process(rank: int, world: int) -> dict[str, Any]:
    """The same layer in one process, every rank's tokens: this rank's outputs, gradients and parameters."""
    per = EXPERTS // world
    mine = {"router.weight"} | {f"experts.{e}." for e in range(rank * per, (rank + 1) * per)}

    def keep(name: str) -> bool:
        return name in mine or any(name.startswith(m) for m in mine if m.endswith("."))

    out: dict[str, Any] = {}
    for opt_name in ("SGD", "AdamW"):
        moe = _moe()
        opt = torch.optim.SGD(moe.parameters(), lr=0.1) if opt_name == "SGD" else torch.optim.AdamW(moe.parameters())
        for step in range(2):
            xs = [_data(s, step) for s in range(world)]
            inputs = [x.clone().requires_grad_() for x, _ in xs]
            outputs = [x + moe(x) for x in inputs]
            torch.stack([_loss(y, t) for y, (_, t) in zip(outputs, xs)]).sum().backward()
            if step == 0 and opt_name == "SGD":
                out["y"], out["x_grad"] = outputs[rank].detach(), inputs[rank].grad
                out["grads"] = {n: p.grad.clone() for n, p in moe.named_parameters() if keep(n) and p.grad is not None}
            opt.step()
            opt.zero_grad()
        out[opt_name] = {n: p.detach().clone() for n, p in moe.named_parameters() if keep(n)}
    moe = _moe()  # what the diagnosis needs: each kept token's expert output, without its gate, and the traffic
    x = _data(rank, 0)[0]
    expert, kept, gate = _routing(moe, x)
    with torch.no_grad():
        raw = torch.stack([moe.experts[int(e)](x[t]) for t, e in enumerate(expert)])
    out["x"], out["kept"], out["gate"], out["raw"] = x, kept, gate.detach(), raw
    owners = [_routing(moe, _data(s, 0)[0]) for s in range(world)]
    counts = [[int(((e // per == r) & k).sum()) for r in range(world)] for e, k, _ in owners]  # counts[s][r]
    out["send"], out["recv"] = counts[rank], [counts[s][rank] for s in range(world)]
    return out


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's moe_forward on this rank's experts, and the layer in one process (the module)."""
    recorder = CollectiveRecorder()
    sent: list[tuple[int, int]] = []
    out: dict[str, Any] = {"rank": rank}
    with recorder.installed(), _guard(recorder, sent):
        try:
            learner = import_solution(solution)
            out["SGD"] = _train(learner.moe_forward, rank, world_size, "SGD", recorder)
            out["calls"] = [(c.op, c.in_backward) for c in recorder.calls if c.step == 0]
            out["sent"] = [b for step, b in sent if step == 0]
            out["AdamW"] = _train(learner.moe_forward, rank, world_size, "AdamW", recorder)
        except NotImplementedError:
            raise NotDoneInRank from None
    del learner
    out["one"] = _one_process(rank, world_size)
    dist.barrier()
    return out


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _output_diagnosis(r: dict[str, Any]) -> str:
    """What is wrong with rank r's outputs, from the one-process pieces: dropped tokens, the gate, the order."""
    one, y = r["one"], r["SGD"]["y"]
    kept, gate, raw, x = one["kept"], one["gate"].unsqueeze(1), one["raw"], one["x"]
    notes = []
    if not torch.allclose(y[~kept], x[~kept], atol=1e-6):
        notes.append(f"the {int((~kept).sum())} dropped tokens are not returned unchanged")
    mine = (y - x)[kept]
    if torch.allclose(mine, raw[kept], atol=1e-5):
        notes.append("the kept tokens' results are the experts' outputs without the gate")
    elif not torch.allclose(mine, (gate * raw)[kept], atol=1e-5):
        near = torch.cdist(mine / gate[kept], raw[kept], compute_mode="donot_use_mm_for_euclid_dist").min(dim=1).values
        if bool((near < 1e-4).all()):
            notes.append("each kept token got an expert result, but another token's: put back in the wrong order")
        else:
            notes.append("the kept tokens' results are not their experts' outputs times the gate")
    return "; ".join(notes)


def _compare(results: Sequence[dict[str, Any]], key: str) -> list[Any]:
    out: list[Any] = []
    for r in results:
        got, ref = r["SGD"][key], r["one"][key]
        if got is None:
            out.append(f"rank {r['rank']}: x has no gradient")
        elif isinstance(ref, dict) and set(got) != set(ref):
            out.append(f"rank {r['rank']}: no gradient for {sorted(set(ref) - set(got))}")
        else:
            m = compare_gradients(got, ref, tolerance=TOLERANCE)
            out.append(m if m.ok else f"rank {r['rank']}: {m}")
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in b) if set(a) == set(b) else float("inf")


def _traffic_check(results: Sequence[dict[str, Any]]) -> LabCheck:
    lines, ok = [], True
    for r in results:
        send, recv, me, world = r["one"]["send"], r["one"]["recv"], r["rank"], len(results)
        row = D_MODEL * 4
        out_rows, in_rows = sum(send) - send[me], sum(recv) - recv[me]
        counts = (EXPERTS - EXPERTS // world) * 8
        expected = [counts, out_rows * row, in_rows * row, out_rows * row, in_rows * row]
        formula = expert_parallel_bytes(send, recv, me, row, n_experts=EXPERTS)
        calls = r["calls"]
        phases = [b for op, b in calls if op == "all_to_all_single"]
        others = sorted({op for op, _ in calls if op != "all_to_all_single"})
        good = r["sent"] == expected and phases == [False] * 3 + [True] * 2 and not others
        ok = ok and good and sum(expected) == formula
        lines.append(
            f"rank {me}: bytes to the other rank per all_to_all_single {r['sent']} ({phases.count(False)} in forward, "
            f"{phases.count(True)} in backward{', and ' + ', '.join(others) if others else ''}); expected "
            f"{expected}, {formula} B in all (expert_parallel_bytes)"
        )
    return LabCheck(
        "all-to-alls and their bytes",
        ok,
        "; ".join(lines),
        "forward: one all-to-all of the per-expert counts (int64, n_experts of them), one of the kept tokens' rows "
        "to their experts' ranks, one of the results back; backward: the combine's reverse, then the dispatch's; "
        "a dropped token is sent nowhere",
    )


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    if len(results) != 2 or not all(isinstance(r, dict) for r in results):
        raise ValueError("results must be the 2 ranks' measurements, one dict per rank")
    errors = [_rel(r["SGD"]["y"], r["one"]["y"]) for r in results]
    worst = max(errors)
    kept = [int(r["one"]["kept"].sum()) for r in results]
    notes = "; ".join(f"rank {r['rank']}: {d}" for r in results if (d := _output_diagnosis(r)))
    checks = [
        LabCheck(
            "outputs",
            worst <= TOLERANCE,
            f"equal one process's within {TOLERANCE:g} (relative; largest error ~{worst:.1e}): {kept} tokens kept, "
            f"{[TOKENS - k for k in kept]} dropped and passed through, on ranks 0 and 1"
            if worst <= TOLERANCE
            else f"relative error {worst:.3g} against one process's (tolerance {TOLERANCE:g})"
            + (f": {notes}" if notes else ""),
            "only kept tokens go to their experts; each result comes back to the token it was sent for (the rows "
            "were sorted by expert before the dispatch), multiplied by that token's gate, plus x; a dropped token's "
            "output is x",
        )
    ]
    for key, name in (("x_grad", "input gradients"), ("grads", "expert and router gradients")):
        found = _compare(results, key)
        bad = [m for m in found if isinstance(m, str)]
        no_router = [r["rank"] for r in results if not r["SGD"]["router_has_grad"]]
        if key == "grads" and no_router:
            bad.append(f"the router got no gradient on ranks {no_router}: the gate is not in the output")
        checks.append(
            LabCheck(
                name,
                not bad,
                f"both ranks: {found[0]}" if not bad else "; ".join(bad),
                "right outputs but wrong gradients point at AllToAll's backward: it sends the gradient back along "
                "the reverse exchange (input and output split sizes swapped), so each expert's weights get the "
                "gradient of every rank's tokens it computed",
            )
        )
    for opt_name in ("SGD", "AdamW"):
        diff = max(_max_diff(r[opt_name]["params"], r["one"][opt_name]) for r in results)
        checks.append(
            LabCheck(
                f"parameters after 2 {opt_name} steps",
                diff <= PARAM_TOLERANCE,
                f"the router and each rank's experts equal one process's within {PARAM_TOLERANCE:g} (largest "
                f"difference ~{diff:.1e})"
                if diff <= PARAM_TOLERANCE
                else f"largest difference from one process's: {diff:.3g} (tolerance {PARAM_TOLERANCE:g})",
                "the optimizer must see the gradients one process computes",
            )
        )
    checks.append(_traffic_check(results))
    return checks


_HINT = (
    "the split sizes are per rank: input_split_sizes[r] the rows this rank sends to rank r (its kept tokens whose "
    "expert e lives on rank e // (n_experts // world)), output_split_sizes[r] the rows rank r sends here, known from "
    "the counts exchange; the backward of an all-to-all swaps the two"
)


def check_experts_lab(solution: str | Path = "_runs/lab_experts.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``moe_forward`` on 2 processes against the layer in one process (see the module)."""
    if not isinstance(solution, (str, Path)):
        raise TypeError(f"solution must be the path of the file to check, got {type(solution).__name__}")
    result = run_lab(LAB, solution, "course_lib.labs.experts:harness", evaluate, nprocs=2, timeout=timeout)
    if result.status == "wrong" and result.checks and result.checks[0].name == "the job runs":
        checks = (dataclasses.replace(result.checks[0], hint=_HINT), *result.checks[1:])
        return dataclasses.replace(result, checks=checks)
    return result
