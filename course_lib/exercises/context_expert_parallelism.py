"""Checks for notebook 18 (context and expert parallelism)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..context_parallel import ring_attention_bytes
from ..context_parallel_variants import cp_attention_bytes
from ..moe import send_counts
from .core import Wrong, as_number, call_learner, exercise

__all__ = ["check_a2a_send_counts", "check_ring_forward_bytes", "check_ulysses_forward_bytes"]

RING_CASES: list[tuple[int, int, int, int, int, int]] = [
    (1, 4, 128, 16, 4, 4),
    (2, 2, 64, 16, 2, 4),
    (1, 32, 8192, 128, 8, 2),
    (4, 8, 4096, 64, 16, 2),
    (1, 1, 6, 2, 3, 8),
]


@exercise("ring-attention bytes", todo="write ring_forward_bytes(batch, heads, seq_len, head_dim, n, p)")
def check_ring_forward_bytes(fn: Any) -> str:
    for b, h, s, d, n, p in RING_CASES:
        call = f"ring_forward_bytes({b}, {h}, {s}, {d}, {n}, {p})"
        got = as_number(call_learner(fn, b, h, s, d, n, p), call)
        want = ring_attention_bytes(b, h, s, d, n, bytes_per_element=p, backward=False)
        if math.isclose(got, want, rel_tol=1e-12, abs_tol=0.5):
            continue
        block = b * h * (s // n) * d * p
        if math.isclose(got, want / 2):
            raise Wrong(f"{call}: keys AND values travel: two blocks per step")
        if math.isclose(got, 2 * n * block):
            raise Wrong(f"{call}: n ranks need n - 1 steps of passing: a rank starts with its own block")
        if math.isclose(got, 2 * block) or math.isclose(got, block):
            raise Wrong(f"{call}: that is one step; the forward pass has n - 1 of them")
        if math.isclose(got, want * n):
            raise Wrong(f"{call}: a block holds this rank's slice of the sequence, seq_len / n positions")
        raise Wrong(f"{call} returned {got:,.0f}, expected {want:,}: count the blocks that leave this rank")
    return "2 (n - 1) blocks of batch x heads x (seq_len / n) x head_dim x p bytes, e.g. 7 x 2 x 8 MiB at 8 ranks"


# (batch, heads, kv_heads, seq_len, head_dim, n, p): grouped-query attention in most
ULYSSES_CASES: list[tuple[int, int, int, int, int, int, int]] = [
    (1, 32, 8, 131072, 128, 8, 2),
    (2, 4, 4, 96, 8, 4, 4),
    (1, 16, 4, 4096, 64, 4, 2),
    (1, 8, 2, 64, 16, 2, 4),
]


@exercise("Ulysses' bytes", todo="write ulysses_forward_bytes(batch, heads, kv_heads, seq_len, head_dim, n, p)")
def check_ulysses_forward_bytes(fn: Any) -> str:
    for b, h, kv, s, d, n, p in ULYSSES_CASES:
        call = f"ulysses_forward_bytes({b}, {h}, {kv}, {s}, {d}, {n}, {p})"
        got = as_number(call_learner(fn, b, h, kv, s, d, n, p), call)
        want = cp_attention_bytes("ulysses", b, h, s, d, n, kv_heads=kv, bytes_per_element=p, backward=False)
        if math.isclose(got, want, rel_tol=1e-12, abs_tol=0.5):
            continue
        bq, bkv = b * h * (s // n) * d * p, b * kv * (s // n) * d * p
        if math.isclose(got, 2 * bq + 2 * bkv):
            raise Wrong(f"{call}: an all-to-all keeps this rank's own 1/n at home: (n - 1)/n of each tensor leaves")
        if kv != h and math.isclose(got, (n - 1) * 4 * bq / n):
            raise Wrong(f"{call}: keys and values have kv_heads heads (grouped-query attention), not heads")
        if math.isclose(got, (n - 1) * (bq + 2 * bkv) / n):
            raise Wrong(f"{call}: the output goes back to its positions' owners too: a fourth all-to-all")
        if math.isclose(got, (n - 1) * (2 * bq + 2 * bkv)):
            raise Wrong(f"{call}: a rank holds seq_len / n positions, and sends (n - 1)/n of them")
        raise Wrong(f"{call} returned {got:,.0f}, expected {want:,}: count what leaves this rank in each all-to-all")
    return "(n - 1)/n of q, k, v and the output: (n - 1)/n (2 Bq + 2 Bkv): 280 MiB forward for Llama 3 8B at 8 ranks"


def _routings() -> list[tuple[str, torch.Tensor, torch.Tensor, int, int]]:
    g = torch.Generator().manual_seed(0)
    cases = []
    for tokens, k, experts, ranks in ((8, 1, 4, 2), (16, 2, 4, 2), (32, 2, 8, 4), (20, 2, 6, 3), (12, 1, 4, 4)):
        logits = torch.randn(tokens, experts, generator=g)
        chosen = logits.topk(k, dim=-1).indices
        kept = torch.rand(tokens, k, generator=g) > 0.2
        cases.append((f"{tokens} tokens, top-{k}, {experts} experts on {ranks} ranks", chosen, kept, experts, ranks))
    cases.append(
        ("4 tokens, all kept", torch.tensor([[0, 3], [1, 2], [3, 2], [0, 1]]), torch.ones(4, 2, dtype=torch.bool), 4, 2)
    )
    return cases


@exercise("all-to-all send counts", todo="write a2a_send_counts(experts, kept, n_experts, n_ranks)")
def check_a2a_send_counts(fn: Any) -> str:
    for name, experts, kept, n_experts, n_ranks in _routings():
        got = call_learner(fn, experts.clone(), kept.clone(), n_experts, n_ranks)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)) or len(got) != n_ranks:
            raise Wrong(f"{name}: return one count per rank ({n_ranks} numbers), got {got!r}")
        got = [int(as_number(c, name)) for c in got]
        want = send_counts(experts, kept, n_experts, n_ranks)
        if got == want:
            continue
        per = n_experts // n_ranks
        if got == [int(((experts // per) == r).sum()) for r in range(n_ranks)]:
            raise Wrong(f"{name}: dropped assignments (kept False) are not sent")
        if got == [int(((experts[kept] % n_ranks) == r).sum()) for r in range(n_ranks)]:
            raise Wrong(
                f"{name}: experts are placed in blocks, expert e on rank e // (n_experts / n_ranks), not e % n_ranks"
            )
        tokens_per_rank = [int(((experts // per == r) & kept).any(1).sum()) for r in range(n_ranks)]
        if got == tokens_per_rank:
            raise Wrong(
                f"{name}: a token with two experts on the same rank is sent twice: count assignments, not tokens"
            )
        raise Wrong(f"{name}: got {got}, expected {want}")
    return "one row per kept assignment, to the rank of its expert: the input_split_sizes of all_to_all_single"
