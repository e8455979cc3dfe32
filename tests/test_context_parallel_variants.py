"""course_lib.context_parallel_variants (all-gather and Ulysses attention, their bytes) and the overlapped ring."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_lib.context_parallel import ring_attention, ring_attention_bytes, zigzag_layout
from course_lib.context_parallel_variants import VARIANTS, allgather_attention, cp_attention_bytes, ulysses_attention
from course_lib.launch import run_ranks


def test_the_bytes_of_each_variant_follow_their_formulas() -> None:
    b, h, s, d, n, p = 2, 8, 64, 4, 4, 2
    bq = b * h * (s // n) * d * p
    bkv = bq // 4  # kv_heads = 2
    assert cp_attention_bytes("ring", b, h, s, d, n, kv_heads=2, bytes_per_element=p) == (6 * n - 4) * bkv
    assert cp_attention_bytes("ring", b, h, s, d, n, bytes_per_element=p) == ring_attention_bytes(
        b, h, s, d, n, bytes_per_element=p
    )
    assert cp_attention_bytes("allgather", b, h, s, d, n, kv_heads=2, bytes_per_element=p) == 4 * (n - 1) * bkv
    assert (
        cp_attention_bytes("allgather", b, h, s, d, n, kv_heads=2, bytes_per_element=p, backward=False)
        == 2 * (n - 1) * bkv
    )
    ulysses = cp_attention_bytes("ulysses", b, h, s, d, 2, kv_heads=2, bytes_per_element=p)
    bq2, bkv2 = bq * 2, bkv * 2  # n = 2: each rank holds twice the positions
    assert ulysses == 2 * (2 * bq2 + 2 * bkv2) // 2
    assert all(cp_attention_bytes(v, 1, 4, 64, 8, 1) == 0 for v in VARIANTS)  # one rank sends nothing


def test_the_bytes_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="variant"):
        cp_attention_bytes("tree", 1, 4, 64, 8, 4)
    with pytest.raises(ValueError, match="kv_heads"):
        cp_attention_bytes("ulysses", 1, 32, 64, 8, 16, kv_heads=8)  # 16 ranks, 8 key/value heads
    with pytest.raises(ValueError, match="divide heads"):
        cp_attention_bytes("ring", 1, 6, 64, 8, 4, kv_heads=4)
    with pytest.raises(ValueError, match="seq_len"):
        cp_attention_bytes("allgather", 1, 4, 63, 8, 4)
    with pytest.raises(ValueError, match="batch"):
        cp_attention_bytes("ring", 1 << 30, 4, 64, 8, 4)
    with pytest.raises(TypeError, match="backward"):
        cp_attention_bytes("ring", 1, 4, 64, 8, 4, backward=1)  # type: ignore[arg-type]


def test_the_attention_functions_check_their_inputs() -> None:
    q = torch.randn(1, 4, 8, 4)
    lay = zigzag_layout(8, 1)
    for fn in (ring_attention, allgather_attention, ulysses_attention):  # one set of checks, in context_parallel
        with pytest.raises(TypeError, match="q must be"):
            fn(q[0], q, q, layout=lay)  # type: ignore[operator]
        with pytest.raises(ValueError, match="heads"):
            fn(q, q[:, :3], q[:, :3], layout=lay)  # type: ignore[operator]
        with pytest.raises(TypeError, match="layout"):
            fn(q, q, q, layout=[(0, 8)])  # type: ignore[operator]
        with pytest.raises(RuntimeError, match="process group"):
            fn(q, q, q, layout=lay)  # type: ignore[operator]
    with pytest.raises(TypeError, match="overlap"):
        ring_attention(q, q, q, layout=lay, overlap="yes")  # type: ignore[arg-type]


_WORKER = """
import torch
import torch.nn.functional as F

from course_lib.context_parallel import contiguous_layout, ring_attention, shard_sequence, zigzag_layout
from course_lib.context_parallel_variants import allgather_attention, cp_attention_bytes, ulysses_attention
from course_lib.counted_collectives import CommCounter


def diff(a, b):
    return (a - b).abs().max().item()


def check(rank, n):
    out = {}
    g = torch.Generator().manual_seed(0)
    b, h, s, d = 2, 2 * n, 8 * n, 4
    q, dout = (torch.randn(b, h, s, d, dtype=torch.float64, generator=g) for _ in range(2))
    for kv in (h, n):  # plain attention, and grouped-query attention with one key/value head per rank
        k, v = (torch.randn(b, kv, s, d, dtype=torch.float64, generator=g) for _ in range(2))
        for causal in (True, False):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            rep = h // kv
            ref = F.scaled_dot_product_attention(leaves[0], leaves[1].repeat_interleave(rep, 1),
                                                 leaves[2].repeat_interleave(rep, 1), is_causal=causal)
            ref.backward(dout)
            for lname, lay in (("contiguous", contiguous_layout(s, n)), ("zigzag", zigzag_layout(s, n))):
                for name, fn in (("allgather", allgather_attention), ("ulysses", ulysses_attention)):
                    mine = [shard_sequence(t, lay, rank, 2).requires_grad_() for t in (q, k, v)]
                    with CommCounter() as c:
                        o = fn(*mine, layout=lay, causal=causal)
                        o.backward(shard_sequence(dout, lay, rank, 2))
                    key = f"{name} kv={kv} {lname} causal={causal}"
                    out[key] = max(diff(o, shard_sequence(ref, lay, rank, 2)),
                                   *(diff(a.grad, shard_sequence(r.grad, lay, rank, 2)) for a, r in zip(mine, leaves)))
                    out[key + " bytes"] = (c.sent(), cp_attention_bytes(name, b, h, s, d, n, kv_heads=kv,
                                                                        bytes_per_element=8))
    # the overlapped ring: bit for bit the plain ring, and the same bytes
    k, v = (torch.randn(b, h, s, d, dtype=torch.float64, generator=g) for _ in range(2))
    lay = zigzag_layout(s, n)
    runs = []
    for overlap in (False, True):
        mine = [shard_sequence(t, lay, rank, 2).requires_grad_() for t in (q, k, v)]
        with CommCounter() as c:
            o = ring_attention(*mine, layout=lay, overlap=overlap)
            o.backward(shard_sequence(dout, lay, rank, 2))
        runs.append((o.detach(), *(t.grad for t in mine), c.sent()))
    out["overlap equal"] = all(torch.equal(a, b) for a, b in zip(runs[0][:4], runs[1][:4]))
    out["overlap bytes"] = (runs[0][4], runs[1][4])
    return out
"""


@pytest.mark.slow  # launches 2 and 4 ranks
@pytest.mark.parametrize("n", [2, 4])
def test_allgather_ulysses_and_the_overlapped_ring_equal_full_attention(tmp_path: Path, n: int) -> None:
    worker = tmp_path / "cp_worker.py"
    worker.write_text(_WORKER)
    results = run_ranks(f"{worker}:check", nprocs=n, timeout=240, echo="none")
    for rank, res in enumerate(results):
        assert res["overlap equal"], rank
        assert res["overlap bytes"][0] == res["overlap bytes"][1], (rank, res["overlap bytes"])
        for key, value in res.items():
            if key.startswith(("allgather", "ulysses")) and key.endswith("bytes"):
                assert value[0] == value[1], (rank, key, value)
            elif key.startswith(("allgather", "ulysses")):
                assert value < 1e-10, (rank, key, value)
