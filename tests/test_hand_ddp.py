"""DDP by hand against PyTorch's DistributedDataParallel, on 2 gloo ranks (one launch for every check).

Tolerance: the parameters after several AdamW steps must be **equal** (max difference 0.0). With 2
ranks, dividing by 2 is exact and a sum of two floats is the same in either order, so HandDDP and
DDP compute the same bits; the tests assert exact equality, and it holds.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.hand_ddp import (
    DEFAULT_BUCKET_CAP_MB,
    FIRST_BUCKET_BYTES,
    CommLog,
    HandDDP,
    bucket_assignment,
    ddp_bucket_caps,
)
from course_lib.launch import run_ranks
from course_lib.simulated_compute import Timeline, hidden_seconds, record_collectives, simulated_mlp
from course_lib.torch_private import ddp_bucket_assignment, ddp_first_bucket_bytes

# -- the pure parts ------------------------------------------------------------------------------


def test_bucket_assignment_follows_ddps_rule() -> None:
    assert bucket_assignment([40] * 5, 100) == [[0, 1, 2], [3, 4]]  # closes on reaching the cap
    assert bucket_assignment([50, 50, 1], 100) == [[0, 1], [2]]  # 100 >= 100: reached
    assert bucket_assignment([40] * 5, 100, first_cap_bytes=50) == [[0, 1], [2, 3, 4]]
    assert bucket_assignment([10, 300, 10], 100) == [[0, 1], [2]]  # a big tensor joins the open bucket
    assert bucket_assignment([8, 8], 0) == [[0], [1]]
    assert bucket_assignment([], 10) == []
    # one bucket stream per key (dtype), each with its own first cap, ordered by first tensor
    assert bucket_assignment([40, 40, 120, 10], 40, 100, keys=["f32", "f16", "f32", "f16"]) == [[0, 2], [1, 3]]


@pytest.mark.parametrize("seed", range(6))
def test_bucket_assignment_equals_pytorchs(seed: int) -> None:
    rng = random.Random(seed)
    tensors = [
        torch.empty(rng.choice([1, 7, 100, 1000, 5000]), dtype=rng.choice([torch.float32, torch.float16]))
        for _ in range(rng.randint(1, 25))
    ]
    cap, first = rng.choice([(4000, 4000), (10_000, 1000), (0, 0), (2**20, 2**20)])
    theirs = ddp_bucket_assignment(tensors, [first, cap])
    sizes = [t.numel() * t.element_size() for t in tensors]
    assert bucket_assignment(sizes, cap, first, keys=[t.dtype for t in tensors]) == theirs


def test_ddp_bucket_caps_and_validation() -> None:
    assert ddp_bucket_caps(None) == (int(DEFAULT_BUCKET_CAP_MB * 2**20), FIRST_BUCKET_BYTES)
    assert FIRST_BUCKET_BYTES == ddp_first_bucket_bytes()
    assert ddp_bucket_caps(0) == (0, 0) and ddp_bucket_caps(0.05) == (52428, 52428)
    with pytest.raises(ValueError, match="bucket_cap_mb must be >= 0"):
        ddp_bucket_caps(-1)
    with pytest.raises(TypeError, match="bucket_cap_mb must be a number"):
        ddp_bucket_caps("25")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sizes must be a sequence"):
        bucket_assignment(100, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="each size must be >= 0"):
        bucket_assignment([-1], 10)
    with pytest.raises(ValueError, match="one key per size"):
        bucket_assignment([1, 2], 10, keys=["a"])


def test_comm_log() -> None:
    log = CommLog()
    log.record("all_reduce", 8)
    log.record("broadcast", 4)
    log.record("all_reduce", 2)
    assert log.sizes("all_reduce") == [8, 2] and log.summary() == {"all_reduce": (2, 10), "broadcast": (1, 4)}
    assert log.calls() == 3 and log.bytes() == 14
    log.reset()
    assert log.calls() == 0
    with pytest.raises(TypeError, match="kind must be a non-empty string"):
        log.record("", 1)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        log.record("x", -1)


def test_hand_ddp_checks_its_arguments_before_needing_a_process_group() -> None:
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        HandDDP(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="overlap must be a bool"):
        HandDDP(nn.Linear(2, 2), overlap=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bucket_cap_mb must be >= 0"):
        HandDDP(nn.Linear(2, 2), bucket_cap_mb=-2)
    with pytest.raises(TypeError, match="timeline must be a Timeline"):
        HandDDP(nn.Linear(2, 2), timeline=object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="needs a process group"):
        HandDDP(nn.Linear(2, 2))


# -- the worker, run on 2 gloo ranks -------------------------------------------------------------


class Tied(nn.Module):
    """Frozen weight, tied embedding/head, BatchNorm buffers, sizes not divisible by 2."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 7)
        self.hidden = nn.Linear(7, 13)
        self.norm = nn.BatchNorm1d(13)
        self.frozen = nn.Linear(13, 7)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(7, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.hidden(self.emb(idx).mean(1))))
        return self.head(self.frozen(h))


def _mlp() -> nn.Sequential:  # registration order = execution order: DDP's rebuilt buckets are ours
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 33), nn.Tanh(), nn.Linear(33, 5))


def _counting_hook(state, bucket):  # no annotations: DDP checks real ones (dist.GradBucket)
    """A DDP communication hook: note the bucket's bytes, then do the default all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buf = bucket.buffer()
    state.append(buf.numel() * buf.element_size())
    return allreduce_hook(None, bucket)


def _batches(step: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [(torch.randint(0, 11, (8, 3), generator=g), torch.randint(0, 11, (8,), generator=g)) for _ in range(2)]


def _train_tied(rank: int, kind: str, cap: float | None, overlap: bool = True, steps: int = 4) -> dict[str, Any]:
    torch.manual_seed(rank)  # different weights on each rank: the construction broadcast must fix that
    model = Tied()
    wrapped: nn.Module
    if kind == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    else:
        wrapped = HandDDP(model, bucket_cap_mb=cap, overlap=overlap)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1)
    in_no_sync = []
    for step in range(steps):
        (x0, y0), (x1, y1) = _batches(step, rank)
        opt.zero_grad()
        before = wrapped.log.calls("all_reduce") if isinstance(wrapped, HandDDP) else 0
        with wrapped.no_sync():  # type: ignore[operator]
            F.cross_entropy(wrapped(x0), y0).backward()  # accumulate locally
        if isinstance(wrapped, HandDDP):
            wrapped.finish()  # nothing to wait for after a no_sync backward
            in_no_sync.append(wrapped.log.calls("all_reduce") - before)
        F.cross_entropy(wrapped(x1), y1).backward()  # the sum of both micro-batches is all-reduced
        if isinstance(wrapped, HandDDP):
            wrapped.finish()
        opt.step()
    out: dict[str, Any] = {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    if isinstance(wrapped, HandDDP):
        out["log"] = wrapped.log.summary()
        out["in_no_sync"] = in_no_sync
        out["frozen_grad_is_none"] = model.frozen.weight.grad is None
        out["trainable_bytes"] = sum(p.numel() * p.element_size() for p in wrapped.trainable_parameters)
        out["n_trainable"] = len(wrapped.trainable_parameters)
        out["last_bucket_bytes"] = wrapped.last_bucket_bytes
    return out


def _buckets_against_ddp(cap: float | None) -> dict[str, Any]:
    ddp = nn.parallel.DistributedDataParallel(_mlp(), bucket_cap_mb=cap)
    seen: list[int] = []
    ddp.register_comm_hook(seen, _counting_hook)
    hand = HandDDP(_mlp(), bucket_cap_mb=cap)
    x = torch.randn(4, 8)
    per_step = []
    for _ in range(3):
        seen.clear()
        ddp(x).sum().backward()
        hand(x).sum().backward()
        hand.finish()
        per_step.append((list(seen), list(hand.last_bucket_bytes)))
    return {"per_step": per_step, "planned": hand.bucket_sizes}


def _errors(rank: int) -> dict[str, str]:
    out = {}
    hand = HandDDP(_mlp())
    hand(torch.randn(2, 8)).sum().backward()
    try:
        hand(torch.randn(2, 8))  # finish() forgotten
    except RuntimeError as e:
        out["forgot_finish"] = str(e)
    hand.finish()
    try:
        a, b = hand(torch.randn(2, 8)), hand(torch.randn(2, 8))
        a.sum().backward()
        b.sum().backward()  # a second backward before finish()
    except RuntimeError as e:
        out["twice"] = str(e)
    hand.finish()  # the first backward's step is still whole: finish it
    model = _mlp()
    model.register_parameter("unused", nn.Parameter(torch.ones(3)))
    hand = HandDDP(model, overlap=False)
    hand(torch.randn(2, 8)).sum().backward()
    try:
        hand.finish()
    except RuntimeError as e:
        out["unused"] = str(e)
    return out


def _overlap(rank: int) -> dict[str, Any]:
    timeline = Timeline(rank)
    model = simulated_mlp(256, 4, forward_ms=2, backward_ms=15, timeline=timeline)
    hand = HandDDP(model, bucket_cap_mb=0.25, timeline=timeline)  # one bucket per layer
    hidden: dict[str, Any] = {}
    for overlap in (True, False):
        hand.overlap = overlap
        total = 0.0
        for _ in range(3):
            dist.barrier()
            timeline.reset()
            hand(torch.randn(2, 256)).sum().backward()
            hand.finish()
            dist.barrier()  # every completion callback has run once both ranks are here
            total += hidden_seconds(timeline.spans)
        hidden[str(overlap)] = total
    # the same all-reduces, seen from outside by record_collectives
    seen = Timeline(rank)
    with record_collectives(seen):
        hand(torch.randn(2, 256)).sum().backward()
        hand.finish()
    dist.barrier()
    hidden["recorded"] = [s.label for s in seen.spans]
    hidden["buckets"] = hand.bucket_sizes
    return hidden


def worker(rank: int, world_size: int) -> dict[str, Any]:
    runs = {}
    for cap in (None, 0.0001, 0):
        runs[("ddp", cap, True)] = _train_tied(rank, "ddp", cap)
        runs[("hand", cap, True)] = _train_tied(rank, "hand", cap)
    runs[("hand", 0, False)] = _train_tied(rank, "hand", 0, overlap=False)  # stage 1: after backward
    return {
        "runs": runs,
        "buckets": {cap: _buckets_against_ddp(cap) for cap in (None, 0.0005, 0)},
        "errors": _errors(rank),
        "overlap": _overlap(rank),
    }


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    return run_ranks(f"{__file__}:worker", 2, timeout=240, echo="none")


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_equal_to_ddp_with_frozen_tied_buffers_and_no_sync(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        runs = r["runs"]
        for cap in (None, 0.0001, 0):
            ddp, hand = runs[("ddp", cap, True)]["state"], runs[("hand", cap, True)]["state"]
            assert ddp.keys() == hand.keys()
            for k in ddp:  # parameters and BatchNorm's running statistics alike
                assert torch.equal(ddp[k], hand[k]), (cap, k)
        stage1 = runs[("hand", 0, False)]["state"]
        assert all(torch.equal(stage1[k], runs[("ddp", 0, True)]["state"][k]) for k in stage1)
    # every rank ends with the same parameters, although each started from its own random weights (the
    # buffers differ: each rank's last forward updated its BatchNorm statistics, broadcast at the next forward)
    for k, v in reports[0]["runs"][("hand", None, True)]["state"].items():
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(v, reports[1]["runs"][("hand", None, True)]["state"][k]), k


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_frozen_skipped_tied_counted_once_and_no_sync_silent(reports: list[dict[str, Any]]) -> None:
    run = reports[0]["runs"][("hand", 0, True)]
    assert run["frozen_grad_is_none"]
    # emb/head (tied: once), hidden.weight, hidden.bias, norm.weight, norm.bias, frozen.bias
    assert run["n_trainable"] == 6
    assert run["in_no_sync"] == [0, 0, 0, 0]  # no all-reduce inside no_sync (and finish() after it: none)
    calls, nbytes = run["log"]["all_reduce"]
    assert calls == 4 * 6 and nbytes == 4 * run["trainable_bytes"]  # per step: each trainable tensor once
    b_calls, _ = run["log"]["broadcast"]
    # construction: parameters and buffers, one flat tensor per dtype (float32, int64); then, as DDP does,
    # the buffers before each forward that follows a synchronising one (here the no_sync forward of each step)
    assert b_calls == 2 + 4 * 2


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_bucket_counts_equal_ddps_from_the_second_step(reports: list[dict[str, Any]]) -> None:
    for cap, rep in reports[0]["buckets"].items():
        steps = rep["per_step"]
        assert len(steps[0][0]) == 1  # DDP's first step: one bucket for everything
        for theirs, ours in steps[1:]:
            assert theirs == ours == rep["planned"], cap
    assert len(reports[0]["buckets"][0]["planned"]) == 6  # a cap of 0: one bucket per parameter
    assert len(reports[0]["buckets"][None]["planned"]) == 1  # the 1 MiB first bucket holds this small model


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_mistakes_raise_clear_errors(reports: list[dict[str, Any]]) -> None:
    errors = reports[0]["errors"]
    assert "call finish() after backward()" in errors["forgot_finish"]
    assert "ready twice in one step" in errors["twice"]
    assert "1 trainable parameter(s) got no gradient" in errors["unused"]


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_overlap_hides_communication(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        assert r["overlap"]["True"] > 0  # all-reduces ran while earlier layers computed
        assert r["overlap"]["False"] == 0  # started after backward: nothing can hide them


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_record_collectives_sees_the_same_all_reduces(reports: list[dict[str, Any]]) -> None:
    o = reports[0]["overlap"]
    assert sorted(o["recorded"]) == sorted(f"all_reduce {b:,} B" for b in o["buckets"])
    assert len(o["buckets"]) == 4
