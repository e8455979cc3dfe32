"""Checks for notebook 14 (sharded data parallel: ZeRO and FSDP by hand)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ..sharding import STAGES, model_state_bytes, rank_memory
from .core import NotDone, Wrong, as_number, call_learner, dict_answer, exercise, is_placeholder
from .simulated_ranks import ReplayedReduceScatter

__all__ = [
    "check_bytes_sent",
    "check_rank_bytes",
    "check_reduce_scatter_step",
    "check_stage_that_fits",
    "FIT_SCENARIOS",
]

GB = 10**9

# name: (parameters, world size, device memory, activations per rank), all mixed-precision Adam
FIT_SCENARIOS: dict[str, tuple[int, int, int, int]] = {
    "1.3B on 8 x 24 GB, 2 GB of activations": (1_300_000_000, 8, 24 * GB, 2 * GB),
    "7B on 8 x 80 GB, 10 GB of activations": (7_000_000_000, 8, 80 * GB, 10 * GB),
    "7B on 8 x 40 GB, 10 GB of activations": (7_000_000_000, 8, 40 * GB, 10 * GB),
    "70B on 64 x 80 GB, 10 GB of activations": (70_000_000_000, 64, 80 * GB, 10 * GB),
}


def _first_stage_that_fits(params: int, n: int, memory: int, activations: int) -> str:
    for stage in STAGES:  # in order of growing communication and complexity
        if model_state_bytes(params, n, stage).total + activations <= memory:
            return stage
    return "none"


@exercise("bytes per rank", todo="write rank_bytes(num_params, world_size, stage) for mixed-precision Adam")
def check_rank_bytes(rank_bytes: Any) -> str:
    cases = [(1_000_000, 1, "ddp"), (1_000_000, 4, "ddp"), (1_000_000, 4, "zero1"), (1_000_000, 4, "zero2")]
    cases += [(1_000_000, 4, "zero3"), (7_000_000_000, 8, "zero1"), (7_000_000_000, 64, "zero3"), (1000, 3, "zero2")]
    for params, n, stage in cases:
        call = f"rank_bytes({params}, {n}, {stage!r})"
        got = as_number(call_learner(rank_bytes, params, n, stage), call)
        want = model_state_bytes(params, n, stage).total
        if math.isclose(got, want, rel_tol=1e-3):
            continue
        wrong_k = {s: model_state_bytes(params, n, s).total for s in STAGES}
        if n > 1 and stage != "zero3" and math.isclose(got, 16 * params / n, rel_tol=1e-3):
            raise Wrong(
                f"{call} = {got:,.0f} divides everything by N: "
                "DDP shards nothing, and only ZeRO-3 shards the parameters"
            )
        for other, value in wrong_k.items():
            if other != stage and math.isclose(got, value, rel_tol=1e-3):
                raise Wrong(f"{call} returned what {other!r} keeps; {stage!r} shards a different set")
        sharded_bytes = {"ddp": 0, "zero1": 12, "zero2": 14, "zero3": 16}[stage]  # per element, in the shard
        shard = math.ceil(params / n)
        for short, how in ((params // n, "rounds the shard down"), (params / n, "divides without rounding up")):
            if params % n and math.isclose(got, want - sharded_bytes * (shard - short), rel_tol=1e-9):
                raise Wrong(
                    f"{call} = {got:,.0f} {how}: {params} elements over {n} ranks need shards of "
                    f"ceil({params} / {n}) = {shard} elements (the flat buffer is padded), or some elements have "
                    "no owner"
                )
        raise Wrong(
            f"{call} returned {got:,.0f}: count 2 bytes of parameters, 2 of gradients "
            "and 12 of optimizer state per parameter, and divide the sharded ones by N"
        )
    return "2 + 2 + 12 bytes per parameter, each part divided by N once its stage shards it"


@exercise(
    "which stage fits", todo="fill `answer` with the first stage (in the order ddp, zero1, zero2, zero3) that fits"
)
def check_stage_that_fits(answer: Any) -> str:
    answer = dict_answer(answer, FIT_SCENARIOS, name="answer")
    for name, (params, n, memory, acts) in FIT_SCENARIOS.items():
        got = answer[name]
        if got not in (*STAGES, "none"):
            raise Wrong(f"answer[{name!r}] must be one of {', '.join(STAGES)} or 'none', got {got!r}")
        want = _first_stage_that_fits(params, n, memory, acts)
        if got == want:
            continue
        need = rank_memory(params, n, got)["total"] + acts if got != "none" else None
        if need is not None and need > memory:
            raise Wrong(
                f"{name}: {got} needs {need / GB:.1f} GB per rank (model state plus activations), "
                f"more than {memory / GB:.0f} GB"
            )
        raise Wrong(f"{name}: {got} is not the first stage that fits; an earlier one communicates less and fits too")
    return "the first stage that fits, for each case (activations are not sharded: they stay per rank)"


def _sent(params: int, n: int, stage: str) -> float:
    """Bytes one rank sends per step, ring algorithms, 2-byte (bf16) parameters and gradients."""
    collectives = 3 if stage == "zero3" else 2  # zero3: all-gather twice (forward, backward) + reduce-scatter
    return collectives * (n - 1) / n * 2 * params


@exercise(
    "bytes sent per step",
    todo="write bytes_sent(num_params, world_size, stage): what one rank sends per step (bf16, ring algorithms)",
)
def check_bytes_sent(bytes_sent: Any) -> str:
    cases = [(1_000_000, 4, "ddp"), (1_000_000, 4, "zero1"), (1_000_000, 4, "zero2"), (1_000_000, 4, "zero3")]
    cases += [(7_000_000_000, 8, "ddp"), (7_000_000_000, 8, "zero3"), (1_000_000, 1, "zero3"), (6_000, 3, "zero2")]
    for params, n, stage in cases:
        call = f"bytes_sent({params}, {n}, {stage!r})"
        got = as_number(call_learner(bytes_sent, params, n, stage), call)
        want = _sent(params, n, stage)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        if n == 1:
            raise Wrong(f"{call} returned {got:g}: with one rank there is nobody to send to")
        if stage == "zero3" and math.isclose(got, _sent(params, n, "ddp"), rel_tol=1e-6):
            raise Wrong(f"{call}: that is DDP's traffic; ZeRO-3 all-gathers the parameters twice per step")
        if stage != "zero3" and math.isclose(got, _sent(params, n, "zero3"), rel_tol=1e-6):
            raise Wrong(
                f"{call}: only ZeRO-3 gathers the parameters twice; DDP all-reduces the gradients, and stages 1 "
                "and 2 reduce-scatter them and all-gather the parameters once"
            )
        if math.isclose(got, 2 * want, rel_tol=1e-6):
            raise Wrong(f"{call} is twice too much: parameters and gradients are 2 bytes each in bf16, not 4")
        if math.isclose(got, want * n / (n - 1), rel_tol=1e-6):
            raise Wrong(f"{call}: a ring collective sends (N-1)/N of the tensor, not all of it")
        raise Wrong(f"{call} returned {got:,.0f}: count each collective as (N-1)/N of a 2-byte-per-parameter tensor")
    return "DDP, ZeRO-1 and ZeRO-2 send the same 2(N-1)/N of the gradients' bytes; ZeRO-3 half as much again"


# -- FSDP by hand (notebook 14's section "FSDP by hand") --------------------------------------------

_RS_TODO = (
    "write shard_gradient(full_grad, world_size, reduce_dtype, shard_dtype): this rank's shard of the mean "
    "gradient, by a reduce-scatter"
)

# (world size, elements per shard, dtype of the gathered parameters and their gradient, reduce dtype, shard dtype)
_RS_CASES: list[tuple[int, int, torch.dtype, torch.dtype, torch.dtype]] = [
    (2, 8, torch.bfloat16, torch.float32, torch.float32),
    (3, 5, torch.bfloat16, torch.float32, torch.float32),
    (4, 3, torch.float32, torch.float32, torch.float32),
    (2, 6, torch.bfloat16, torch.bfloat16, torch.float32),
]


def _reference_shard_gradient(
    full_grad: torch.Tensor, n: int, reduce_dtype: torch.dtype, shard_dtype: torch.dtype
) -> torch.Tensor:
    grad = full_grad.to(reduce_dtype)
    out = torch.empty(grad.numel() // n, dtype=reduce_dtype)
    dist.reduce_scatter_single(out, grad)
    return out.div_(n).to(shard_dtype)


def _simulate(fn: Any, n: int, grads: list[torch.Tensor], *args: Any) -> tuple[list[Any], ReplayedReduceScatter]:
    """Run ``fn(full_grad, n, *args)`` on ``n`` simulated ranks: record the inputs, then replay with results."""
    sim = ReplayedReduceScatter(n)
    results: list[Any] = []
    with sim.patch():
        for recording in (True, False):
            sim.recording = recording
            results = []
            for r in range(n):
                sim.start_rank(r)
                try:
                    results.append(call_learner(fn, grads[r].clone(), n, *args))
                except Wrong as w:
                    if "SimulatedRankError" in str(w):
                        raise Wrong(str(w).split("SimulatedRankError: ")[-1]) from None
                    raise
    return results, sim


@exercise("the reduce-scatter step", todo=_RS_TODO)
def check_reduce_scatter_step(shard_gradient: Any) -> str:
    if is_placeholder(shard_gradient):
        raise NotDone
    for n, shard_len, compute_dtype, reduce_dtype, shard_dtype in _RS_CASES:
        g = torch.Generator().manual_seed(n * 100 + shard_len)
        grads = [torch.randn(n * shard_len, generator=g).to(compute_dtype) for _ in range(n)]
        call = f"shard_gradient(<{n * shard_len} {str(compute_dtype)[6:]} values>, {n}, {reduce_dtype}, {shard_dtype})"
        got, sim = _simulate(shard_gradient, n, grads, reduce_dtype, shard_dtype)
        want, _ = _simulate(_reference_shard_gradient, n, grads, reduce_dtype, shard_dtype)
        if sim.never_waited():
            raise Wrong(
                f"{call}: an asynchronous reduce-scatter (async_op=True) was never waited for: its output holds "
                "nothing yet when it is read (a real backend writes it later); call .wait() on the handle first"
            )
        for r, (mine, right) in enumerate(zip(got, want)):
            if not isinstance(mine, torch.Tensor):
                raise Wrong(f"{call} should return a tensor (this rank's shard), got {type(mine).__name__}")
            if mine.numel() != shard_len:
                raise Wrong(
                    f"{call} returned {mine.numel()} elements on rank {r}: return only this rank's shard, "
                    f"{n * shard_len} / {n} = {shard_len} elements"
                )
            if mine.dtype != shard_dtype:
                raise Wrong(
                    f"{call} returned {mine.dtype}: the optimizer steps the master shard, so return its dtype, "
                    f"{shard_dtype}"
                )
            tol = 1e-2 if reduce_dtype == torch.bfloat16 else 1e-6
            if torch.allclose(mine.reshape(-1).double(), right.double(), rtol=tol, atol=tol * 1e-2):
                continue
            exact = torch.stack([x.double() for x in grads]).sum(0).view(n, -1)[r]

            def near(x: torch.Tensor, mine: torch.Tensor = mine) -> bool:
                return torch.allclose(mine.reshape(-1).double(), x, rtol=1e-2, atol=1e-4)

            if near(exact):
                raise Wrong(f"{call}: that is the sum over ranks; divide by world_size once to get the mean")
            if near(exact / n**2):
                raise Wrong(f"{call}: the gradient is averaged twice (ReduceOp.AVG and a division, or two divisions)")
            if near(exact / n) and reduce_dtype != compute_dtype:
                sent = sim.inputs[r][0].dtype if sim.inputs[r] else None
                if sent == reduce_dtype:  # reduced in the right dtype: the rounding came before, in the division
                    raise Wrong(
                        f"{call}: close, but divided in {compute_dtype} before the cast: cast the gradient to "
                        f"reduce_dtype ({reduce_dtype}) first, then reduce-scatter and divide there"
                    )
                raise Wrong(
                    f"{call}: close, but reduced in {compute_dtype}: cast the gradient to reduce_dtype "
                    f"({reduce_dtype}) before the reduce-scatter, so the sum over ranks is not rounded to bf16"
                )
            raise Wrong(f"{call} on rank {r}: expected chunk {r} of the mean gradient over the ranks")
        if "all_reduce" in sim.used:
            raise Wrong(
                "right values, but through an all-reduce: every rank then receives the whole sum, twice the bytes "
                "a reduce-scatter sends, to keep 1/N of it; use dist.reduce_scatter_single"
            )
    return "reduce-scatter in reduce_dtype, divide once, keep this rank's chunk in the master's dtype"
