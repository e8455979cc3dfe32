"""The ring-attention lab (after notebook 18): key-value blocks around a ring, merged by their log-sum-exp.

The learner's file defines ``block_attention``, ``merge``, ``ring_attention(q, k, v, layout, causal=...)`` and
``zigzag_layout(seq_len, n)``. On 4 processes the harness runs the ring on the contiguous and on the zig-zag
layout, causal and not, and once with large scores (queries multiplied by :data:`SHARP`, where a log-sum-exp
computed without subtracting the maximum overflows). Each rank compares its slice of the output with
``F.scaled_dot_product_attention`` on the whole sequence, and its log-sum-exp with the one computed in float64
from the whole scores. A trace of the point-to-point calls and of the calls to ``block_attention`` gives the bytes
each rank sends, the peers, the query-key pairs computed, and whether each receive was in flight while a block was
computed (posted before, waited for after).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F

from ..context_parallel import Layout, contiguous_layout, ring_attention_bytes, ring_work, shard_sequence, zigzag_layout
from ..validation import check_number
from .core import LabCheck, LabResult, NotDoneInRank, import_solution, run_lab

__all__ = ["case_data", "check_ring_attention_lab", "evaluate", "harness"]

BATCH, HEADS, SEQ, HEAD_DIM, NPROCS = 1, 2, 64, 16, 4
SHARP = 50.0  # the queries' factor in the large-scores case: scores in the hundreds, exp() past float32's range
TOLERANCE = 1e-5  # max |got - expected| / (1 + |expected|), outputs and log-sum-exp
SHARP_TOLERANCE = 1e-4  # with scores in the hundreds, float32 rounds exp(score - lse) to ~1e-5 (both sides)
LAB = "lab: ring attention with the online-softmax merge"
CASES = {  # name: (zig-zag layout?, causal?, the queries' factor)
    "contiguous, causal": (False, True, 1.0),
    "contiguous, not causal": (False, False, 1.0),
    "zig-zag, causal": (True, True, 1.0),
    "zig-zag, not causal": (True, False, 1.0),
    "zig-zag, causal, large scores": (True, True, SHARP),
}


class _Work:
    """A request whose ``wait()`` is noted in the trace."""

    def __init__(self, work: Any, trace: list[tuple[Any, ...]], index: int) -> None:
        self._work, self._trace, self._index = work, trace, index

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._trace.append(("wait", self._index))
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@contextmanager
def _traced(learner: Any) -> Iterator[list[tuple[Any, ...]]]:
    """Note every send and receive (peer, bytes, post and wait) and every call of ``learner.block_attention``.

    ``isend`` and ``irecv`` are replaced in ``torch.distributed`` and in ``distributed_c10d`` both, so that
    ``P2POp`` (which accepts only those two functions) and ``batch_isend_irecv`` take the traced ones.
    """
    trace: list[tuple[Any, ...]] = []
    saved = {name: getattr(c10d, name) for name in ("isend", "irecv", "send", "recv")}
    compute = learner.block_attention

    def wrap(name: str) -> Any:
        def traced(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            keys = ("dst", "group_dst") if "send" in name else ("src", "group_src")
            peer = args[0] if args else next((kwargs[k] for k in keys if kwargs.get(k) is not None), None)
            index = len(trace)
            trace.append(("post", name.lstrip("i"), peer, tensor.numel() * tensor.element_size()))
            work = saved[name](tensor, *args, **kwargs)
            if name in ("send", "recv"):
                trace.append(("wait", index))
                return work
            return _Work(work, trace, index)

        return traced

    def block_attention(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        trace.append(("compute", q.shape[-2] * k.shape[-2]))
        return compute(q, k, *args, **kwargs)

    try:
        for name in saved:
            setattr(c10d, name, wrap(name))
            setattr(dist, name, getattr(c10d, name))
        learner.block_attention = block_attention
        yield trace
    finally:
        for name, fn in saved.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        learner.block_attention = compute


def _summary(trace: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Bytes sent, peers, query-key pairs computed, and the receives in flight while a block was computed."""
    waited = {e[1]: i for i, e in enumerate(trace) if e[0] == "wait"}
    computes = [i for i, e in enumerate(trace) if e[0] == "compute"]
    receives = [i for i, e in enumerate(trace) if e[0] == "post" and e[1] == "recv"]
    overlapped = sum(1 for i in receives if any(i < c < waited.get(i, len(trace)) for c in computes))
    return {
        "sent": sum(e[3] for e in trace if e[0] == "post" and e[1] == "send"),
        "peers": sorted({(e[1], e[2]) for e in trace if e[0] == "post"}, key=str),
        "pairs": sum(e[1] for e in trace if e[0] == "compute"),
        "receives": len(receives),
        "overlapped": overlapped,
    }


def _reference_lse(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return math.inf
    err = ((got.double() - want.double()).abs() / (1 + want.double().abs())).max().item()
    return math.inf if math.isnan(err) else err


def _diagnosis(got: torch.Tensor, qkv: list[torch.Tensor], layout: Layout, rank: int, causal: bool) -> str:
    """What the wrong output looks like: NaN, attention without the scale, or where it first goes wrong."""
    if torch.isnan(got).any():
        return "NaN in the output"
    q, k, v = qkv
    unscaled = shard_sequence(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0), layout, rank, 2)
    if _error(got, unscaled) <= TOLERANCE:
        return "it equals attention without the 1/sqrt(head_dim) scale"
    want = shard_sequence(F.scaled_dot_product_attention(q, k, v, is_causal=causal), layout, rank, 2)
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    positions = shard_sequence(torch.arange(q.shape[2]).view(1, -1), layout, rank, 1)[0]
    bad = ((got - want).abs() > TOLERANCE * (1 + want.abs())).flatten(0, 1).any(0).any(-1)
    return f"the first wrong query is at position {positions[bad].min().item()}"


def case_data(factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole ``q``, ``k``, ``v`` of a case (seeded, the same on every rank), the queries times ``factor``."""
    check_number("factor", factor, finite=True)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g) for _ in range(3))
    return q * factor, k, v


def _run_case(learner: Any, rank: int, n: int, zigzag: bool, causal: bool, factor: float) -> dict[str, Any]:
    q, k, v = case_data(factor)
    layout = (zigzag_layout if zigzag else contiguous_layout)(SEQ, n)
    local = [shard_sequence(t, layout, rank, 2).contiguous() for t in (q, k, v)]
    dist.barrier()
    with _traced(learner) as trace:
        out, lse = learner.ring_attention(*local, layout, causal=causal)
    want = shard_sequence(F.scaled_dot_product_attention(q, k, v, is_causal=causal), layout, rank, 2)
    want_lse = shard_sequence(_reference_lse(q, k, causal, 1 / math.sqrt(HEAD_DIM)), layout, rank, 2)
    result = {"out": _error(out, want), "lse": _error(lse, want_lse), **_summary(trace)}
    if result["out"] > TOLERANCE:
        result["diagnosis"] = _diagnosis(out.detach(), [q, k, v], layout, rank, causal)
    return result


def harness(rank: int, world_size: int, solution: str) -> dict[str, Any]:
    """In each rank: the learner's ring attention on every case, against scaled_dot_product_attention."""
    try:
        learner = import_solution(solution)
        layout = _normal(learner.zigzag_layout(SEQ, world_size))
        out: dict[str, Any] = {"zigzag": repr(layout), "zigzag_work": _work(layout)}
        for name, case in CASES.items():
            out[name] = _run_case(learner, rank, world_size, *case)
    except NotImplementedError:
        raise NotDoneInRank from None
    dist.barrier()
    return out


def _normal(layout: Any) -> Any:
    """``layout`` as tuples of ``(int, int)`` pairs (a list of lists is the same layout), or as it is."""
    try:
        return tuple(tuple((int(start), int(length)) for start, length in chunks) for chunks in layout)
    except (TypeError, ValueError):
        return layout


def _work(layout: Any) -> list[int] | None:
    """Query-key pairs per rank with ``layout`` and the causal mask (None if it is not a layout)."""
    try:
        return [sum(row) for row in ring_work(layout)]
    except (TypeError, ValueError, IndexError):
        return None


_HINTS = {
    "output": "a query at position i sees the keys at positions j <= i, global positions (the chunk's start plus the "
    "index); scores are scaled by 1/sqrt(head_dim); merge weighs the running output by exp(lse - new_lse) and the "
    "block's by exp(block_lse - new_lse); the block held at step s is rank (r - s) mod n's",
    "lse right": "the log-sum-exp is right and the output is not: merge must rescale the running output by "
    "exp(lse - new_lse) as well as weigh the new block by exp(block_lse - new_lse)",
    "NaN": "a NaN comes from a row of scores that is all -inf (a block computed although every key is in the "
    "future, or a query that does not see its own key) or from exp() overflowing: torch.logsumexp and "
    "torch.logaddexp subtract the maximum, log(exp(a) + exp(b)) does not",
    "zig-zag layout": "2n chunks of seq_len / 2n positions: rank r holds chunk r (early) and chunk 2n-1-r (late), "
    "so that every rank has as much causal work as the others",
    "blocks in the future skipped": "with the causal mask, a chunk of keys that starts after the chunk of "
    "queries' last position is skipped: it would add nothing (and its all -inf scores give NaN). The check counts "
    "the pairs of the calls to block_attention: every computation must go through it",
    "ring direction": "send the block you hold to rank (r + 1) mod n and receive the next from rank (r - 1) mod n",
    "bytes sent per forward": "n - 1 transfers of a key and a value block: the last block is not sent on",
    "next block posted before the compute": "post the next block's isend/irecv (or batch_isend_irecv) into new "
    "buffers before computing on the current block, and wait for them after: a blocking recv, or a wait() "
    "before the computation, leaves nothing to overlap",
}


def _case_check(name: str, results: Sequence[dict[str, Any]]) -> LabCheck:
    out, lse = (max(r[name][key] for r in results) for key in ("out", "lse"))
    tol = SHARP_TOLERANCE if CASES[name][2] != 1 else TOLERANCE
    ok = out <= tol and lse <= tol
    detail = f"equal scaled_dot_product_attention's within {tol:g} on all {len(results)} ranks (largest error "
    detail += f"~{out:.1e}, log-sum-exp ~{lse:.1e}; relative, |difference| / (1 + |expected|))"
    hint = _HINTS["output"]
    if not ok:
        rank = next(i for i, r in enumerate(results) if max(r[name]["out"], r[name]["lse"]) > tol)
        why = results[rank][name].get("diagnosis", "")
        detail = f"rank {rank}: output error {results[rank][name]['out']:.3g}, log-sum-exp error "
        detail += f"{results[rank][name]['lse']:.3g} (tolerance {tol:g})" + (f": {why}" if why else "")
        hint = _HINTS["NaN" if "NaN" in why else "lse right" if lse <= tol else "output"]
    return LabCheck(f"{name}: output and log-sum-exp", ok, detail, hint)


def evaluate(results: Sequence[dict[str, Any]]) -> list[LabCheck]:
    """The checks, from what each rank measured."""
    n, r0 = len(results), results[0]
    checks = [_case_check(name, results) for name in CASES]
    want = zigzag_layout(SEQ, n)
    ok = r0["zigzag"] == repr(want)
    work = r0["zigzag_work"]
    detail = f"rank 0 holds {want[0]} of {SEQ} positions; with the causal mask each rank computes {work} query-key "
    detail += f"pairs (contiguous: {[sum(w) for w in ring_work(contiguous_layout(SEQ, n))]})"
    bad = f"zigzag_layout({SEQ}, {n}) = {r0['zigzag']}, expected {want}; query-key pairs per rank: {work}"
    checks.append(LabCheck("zig-zag layout", ok, detail if ok else bad, _HINTS["zig-zag layout"]))
    pairs = {name: [r[name]["pairs"] for r in results] for name in CASES if CASES[name][1]}
    expected = {name: [sum(w) for w in ring_work(_layout(name, n))] for name in pairs}
    ok = pairs == expected
    text = "; ".join(f"{name}: {pairs[name]}" + ("" if ok else f" (expected {expected[name]})") for name in pairs)
    checks.append(_check("blocks in the future skipped", ok, f"query-key pairs per rank, {text}"))
    peers = [
        {op: sorted({p for name in CASES for o, p in r[name]["peers"] if o == op}) for op in ("send", "recv")}
        for r in results
    ]
    wrong = [i for i, p in enumerate(peers) if p != {"send": [(i + 1) % n], "recv": [(i - 1) % n]}]
    bad = "; ".join(
        f"rank {i} sends to {peers[i]['send']} and receives from {peers[i]['recv']} (expected [{(i + 1) % n}] and "
        f"[{(i - 1) % n}])"
        for i in wrong[:2]
    )
    good = "every rank r sends to rank r + 1 and receives from rank r - 1 (mod n)"
    checks.append(_check("ring direction", not wrong, good, bad))
    formula = ring_attention_bytes(BATCH, HEADS, SEQ, HEAD_DIM, n, backward=False)
    sent = sorted({r[name]["sent"] for r in results for name in CASES})
    block = BATCH * HEADS * (SEQ // n) * HEAD_DIM * 4
    text = f"each rank sends {', '.join(f'{s:,}' for s in sent)} bytes per call; 2 (n - 1) blocks of {block:,} bytes"
    checks.append(_check("bytes sent per forward", sent == [formula], f"{text} = {formula:,}", f"{text}: {formula:,}"))
    case = "contiguous, not causal"  # every step computes a block there
    flight = [(r[case]["overlapped"], r[case]["receives"]) for r in results]
    ok = all(o == rec and rec > 0 for o, rec in flight)
    text = ", ".join(f"{o} of {rec}" for o, rec in flight)
    checks.append(
        _check(
            "next block posted before the compute",
            ok,
            f"receives in flight during a block's computation, per rank ({case}): {text}",
        )
    )
    return checks


def _check(name: str, ok: bool, good: str, bad: str | None = None) -> LabCheck:
    return LabCheck(name, ok, good if ok or bad is None else bad, _HINTS[name])


def _layout(name: str, n: int) -> Layout:
    return (zigzag_layout if CASES[name][0] else contiguous_layout)(SEQ, n)


def check_ring_attention_lab(solution: str | Path = "_runs/lab_ring.py", *, timeout: float | None = None) -> LabResult:
    """Run ``solution``'s ``ring_attention`` on 4 processes against ``scaled_dot_product_attention``."""
    return run_lab(LAB, solution, "course_lib.labs.ring_attention:harness", evaluate, nprocs=NPROCS, timeout=timeout)
