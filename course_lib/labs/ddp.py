"""The DDP lab (after notebook 11): ``BucketedDDP``, checked against ``DistributedDataParallel`` on 2 processes.

The harness trains the learner's wrapper and PyTorch's DDP side by side on each rank: the same model (built with a
different seed on each rank, so that only a broadcast makes the replicas equal), the same data, two micro-batches
per step with the first inside ``no_sync()``, two steps with SGD and two with AdamW. The model registers its layers
in another order than its forward uses them, so that gradients become ready out of bucket order, and has a frozen
parameter and a buffer. It records every collective the learner's code issues (:mod:`.recorder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..equivalence import compare_gradients
from .core import LabCheck, LabResult, NotDoneInRank, import_solution, run_lab
from .recorder import CollectiveRecorder

__all__ = ["BUCKET_CAP_BYTES", "check_ddp_lab", "evaluate", "harness"]

BUCKET_CAP_BYTES = 1024  # three buckets for the harness's model
TOLERANCE = 1e-6
LAB = "lab: DDP with overlapped buckets"


class _Net(nn.Module):
    """Registered head first, used last: gradients become ready in another order than reverse registration."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.head = nn.Linear(24, 4)
        self.inp = nn.Linear(12, 24)
        self.mid = nn.Linear(24, 24)
        self.mid.bias.requires_grad_(False)  # frozen
        self.register_buffer("scale", 1 + torch.rand(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale: torch.Tensor = self.scale  # type: ignore[assignment]
        return self.head(torch.tanh(self.mid(torch.tanh(self.inp(x)) * scale)))


def _batch(step: int, micro: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + micro)
    x, y = torch.randn(8 * world, 12, generator=g), torch.randint(0, 4, (8 * world,), generator=g)
    return x[rank::world], y[rank::world]


def _train(model: Any, finish: Any, opt_name: str, rank: int, world: int, recorder: CollectiveRecorder | None) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1) if opt_name == "SGD" else torch.optim.AdamW(params, lr=0.01)
    first: dict[str, torch.Tensor] = {}
    for step in range(2):
        for micro in range(2):
            if recorder is not None:
                recorder.step = 10 * step + micro
            x, y = _batch(step, micro, rank, world)
            context = model.no_sync() if micro == 0 else _nothing()
            with context:
                (F.cross_entropy(model(x), y) / 2).backward()
        finish()
        if step == 0:
            first = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    return {"first_grads": first, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _strip(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): t for n, t in named.items()}


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's BucketedDDP and DDP, side by side (run by :func:`check_ddp_lab`)."""
    recorder = CollectiveRecorder()
    out: dict[str, Any] = {}
    with recorder.installed():
        try:
            learner = import_solution(solution)
            ours = learner.BucketedDDP(_Net(seed=rank), bucket_cap_bytes=BUCKET_CAP_BYTES)
        except NotImplementedError:
            raise NotDoneInRank from None
        out["init"] = {n: t.detach().clone() for n, t in ours.module.state_dict().items()}
        buckets = getattr(ours, "buckets", None)
        names = {id(p): n for n, p in ours.module.named_parameters()}
        out["buckets"] = (
            [[names.get(id(p), "?") for p in b] for b in buckets] if isinstance(buckets, (list, tuple)) else None
        )
        out["bucket_bytes"] = (
            [sum(p.numel() * p.element_size() for p in b) for b in buckets]
            if isinstance(buckets, (list, tuple))
            else None
        )
        recorder.reset()
        try:
            runs = {"SGD": _train(ours, ours.finish, "SGD", rank, world_size, recorder)}
        except NotImplementedError:
            raise NotDoneInRank from None
        out["calls"] = [
            (c.op, c.nbytes, c.async_op, c.in_backward, c.waited_in_backward, c.step) for c in recorder.calls
        ]
        out["frozen_grad"] = ours.module.mid.bias.grad is not None
        adam = learner.BucketedDDP(_Net(seed=rank), bucket_cap_bytes=BUCKET_CAP_BYTES)
        runs["AdamW"] = _train(adam, adam.finish, "AdamW", rank, world_size, None)
    reference: dict[str, Any] = {}
    for opt_name in ("SGD", "AdamW"):
        ddp = nn.parallel.DistributedDataParallel(_Net(seed=rank))
        reference["init"] = _strip({n: t.detach().clone() for n, t in ddp.state_dict().items()})
        result = _train(ddp, lambda: None, opt_name, rank, world_size, None)
        reference[opt_name] = {k: _strip(v) for k, v in result.items()}
        del ddp
    out["runs"] = {k: {kk: _strip(vv) for kk, vv in v.items()} for k, v in runs.items()}
    out["reference"] = reference
    del ours, adam
    dist.barrier()
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in b) if set(a) == set(b) else float("inf")


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    r0, checks = results[0], []
    same_init = all(_max_diff(r["init"], r0["reference"]["init"]) == 0 for r in results)
    checks.append(
        LabCheck(
            "construction",
            same_init,
            "every rank starts from rank 0's parameters and buffers"
            if same_init
            else "the replicas differ after construction (each rank built the model with its own seed)",
            "broadcast every parameter and buffer from rank 0 in __init__ (dist.broadcast(t, src=0))",
        )
    )
    buckets = r0["buckets"]
    trainable_names = {"head.weight", "head.bias", "inp.weight", "inp.bias", "mid.weight"}
    flat = [n for b in buckets or [] for n in b]
    good_buckets = buckets is not None and sorted(flat) == sorted(trainable_names) and not r0["frozen_grad"]
    checks.append(
        LabCheck(
            "buckets",
            good_buckets,
            f"{len(buckets)} buckets of the 5 trainable parameters, the frozen bias in none and without .grad"
            if good_buckets
            else f"self.buckets = {buckets}; frozen bias has a gradient: {r0['frozen_grad']}",
            "self.buckets lists every trainable parameter once (module.parameters() yields a tied one once) and no "
            "frozen one; a parameter with requires_grad=False gets no hook and no bucket",
        )
    )
    for opt_name in ("SGD", "AdamW"):
        worst = max(_max_diff(r["runs"][opt_name]["params"], r["reference"][opt_name]["params"]) for r in results)
        if opt_name == "SGD":
            matches = [
                compare_gradients(
                    r["runs"]["SGD"]["first_grads"],
                    r["reference"]["SGD"]["first_grads"],
                    tolerance=1e-5,
                    world_size=len(results),
                    micro_batches=2,
                    against="DDP",
                )
                if set(r["runs"]["SGD"]["first_grads"]) == set(r["reference"]["SGD"]["first_grads"])
                else None
                for r in results
            ]
            ok = all(m is not None and m.ok for m in matches)
            bad = next((m for m in matches if m is None or not m.ok), None)
            checks.append(
                LabCheck(
                    "gradients of the first step",
                    ok,
                    str(matches[0]) if ok else (str(bad) if bad is not None else "a parameter has no .grad"),
                    "divide each bucket by the world size once, before or after the all-reduce (a sum), and copy "
                    "the averaged values back into .grad in finish(); accumulate across no_sync() and reduce the "
                    "sum on the next backward",
                )
            )
        checks.append(
            LabCheck(
                f"parameters after 2 {opt_name} steps",
                worst <= TOLERANCE,
                f"equal DistributedDataParallel's within {TOLERANCE:g} on every rank (largest difference ~{worst:.1e})"
                if worst <= TOLERANCE
                else f"largest difference from DistributedDataParallel's: {worst:.3g} (tolerance {TOLERANCE:g})",
                "the gradients the optimizer sees must be the mean over the ranks of the accumulated gradients",
            )
        )
    checks += _communication_checks(results, r0["bucket_bytes"])
    return checks


def _communication_checks(results: Sequence[dict[str, Any]], bucket_bytes: list[int] | None) -> list[LabCheck]:
    calls = [c for c in results[0]["calls"] if c[0] == "all_reduce"]
    in_no_sync = [c for c in calls if c[5] % 10 == 0]
    synced = [c[1] for c in calls if c[5] == 1]
    orders = [[c[1] for c in r["calls"] if c[0] == "all_reduce" and c[5] == 1] for r in results]
    checks = [
        LabCheck(
            "no_sync",
            not in_no_sync,
            "no collective inside no_sync()" if not in_no_sync else f"{len(in_no_sync)} all-reduce(s) inside no_sync()",
            "inside no_sync() the hooks must not launch anything: the accumulated gradients are reduced by the next "
            "backward outside it",
        ),
        LabCheck(
            "one all-reduce per bucket, in bucket order",
            bucket_bytes is not None and synced == bucket_bytes and all(o == orders[0] for o in orders),
            f"bytes all-reduced in order: {synced}; the buckets hold {bucket_bytes}",
            "launch bucket i only once buckets 0..i-1 are launched, even when a later bucket is complete first: "
            "every rank must issue the same collectives in the same order",
        ),
    ]
    overlapped = sum(1 for c in calls if c[5] == 1 and c[3] and c[2])
    waited = sum(1 for c in calls if c[4])
    checks.append(
        LabCheck(
            "overlap with backward",
            overlapped >= max(len(synced) - 1, 1) and waited == 0,
            f"{overlapped} of {len(synced)} all-reduces launched asynchronously during backward, {waited} waited for "
            "during backward",
            "launch each complete bucket from the hook with async_op=True and wait for the handles in finish(), "
            "after backward: a wait() inside a hook stalls backward until that bucket is reduced",
        )
    )
    return checks


def check_ddp_lab(solution: str | Path = "_runs/lab_ddp.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``BucketedDDP`` on 2 processes against ``DistributedDataParallel`` (see the module)."""
    return run_lab(LAB, solution, "course_lib.labs.ddp:harness", evaluate, nprocs=2, timeout=timeout)
