from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import attention_block, attention_block_backward, blockwise_attention, merge_attention


def _qkv(n_q: int = 9, n_k: int = 9, d: int = 8, dtype: torch.dtype = torch.float64, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 3, n_q, d, generator=g, dtype=dtype),
        torch.randn(2, 3, n_k, d, generator=g, dtype=dtype),
        torch.randn(2, 3, n_k, d, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("causal", [False, True])
def test_one_block_is_sdpa_with_its_logsumexp(causal: bool) -> None:
    q, k, v = _qkv()
    out, lse = attention_block(q, k, v, causal=causal)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    if causal:
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(scores, -1))


def test_scale_and_offsets() -> None:
    q, k, v = _qkv()
    out, _ = attention_block(q, k, v, scale=0.5)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=0.5))
    # queries at positions 10-18 see every key at 0-8; keys at 20-28 are all in their future
    seen, _ = attention_block(q, k, v, causal=True, q_start=10, k_start=0)
    assert torch.allclose(seen, F.scaled_dot_product_attention(q, k, v))
    none_out, none_lse = attention_block(q, k, v, causal=True, q_start=10, k_start=20)
    assert torch.equal(none_out, torch.zeros_like(none_out)) and torch.isneginf(none_lse).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_merge_of_blocks_is_the_whole(dtype: torch.dtype) -> None:
    q, k, v = _qkv(n_k=12, dtype=dtype)
    whole, whole_lse = attention_block(q, k, v)
    a = attention_block(q, k[..., :5, :], v[..., :5, :])
    b = attention_block(q, k[..., 5:, :], v[..., 5:, :])
    merged, lse = merge_attention(*a, *b)
    swapped, lse2 = merge_attention(*b, *a)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert merged.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert torch.allclose(merged.double(), whole.double(), atol=tol) and torch.allclose(lse, whole_lse, atol=1e-5)
    assert torch.allclose(swapped.double(), merged.double(), atol=tol) and torch.allclose(lse2, lse)


def test_merge_with_empty_sides_has_no_nan() -> None:
    q, k, v = _qkv()
    out, lse = attention_block(q, k, v)
    empty_out, empty_lse = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    merged, merged_lse = merge_attention(out, lse, empty_out, empty_lse)
    assert torch.allclose(merged, out) and torch.equal(merged_lse, lse)
    both, both_lse = merge_attention(empty_out, empty_lse, empty_out, empty_lse)
    assert torch.equal(both, empty_out) and torch.isneginf(both_lse).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 4, 9, 20])
def test_blockwise_equals_sdpa(causal: bool, block_size: int) -> None:
    q, k, v = _qkv()
    out, lse = blockwise_attention(q, k, v, block_size=block_size, causal=causal)
    ref_out, ref_lse = attention_block(q, k, v, causal=causal)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    assert torch.allclose(lse, ref_lse)


@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_summed_over_blocks_is_the_gradient(causal: bool) -> None:
    q, k, v = _qkv(n_q=10, n_k=10)
    g = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(g)
    out, lse = attention_block(q, k, v, causal=causal)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for start in range(0, 10, 3):
        sl = slice(start, start + 3)
        dq_b, dk_b, dv_b = attention_block_backward(
            q, k[..., sl, :], v[..., sl, :], out, lse, g, causal=causal, k_start=start
        )
        dq += dq_b
        dk[..., sl, :], dv[..., sl, :] = dk_b, dv_b
    for mine, leaf in zip((dq, dk, dv), leaves):
        assert torch.allclose(mine, leaf.grad)


def test_block_backward_with_queries_that_see_nothing() -> None:
    q, k, v = _qkv()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64)
    dq, dk, dv = attention_block_backward(q, k, v, out, lse, torch.ones_like(q), causal=True, q_start=0, k_start=50)
    assert not any(torch.isnan(t).any() for t in (dq, dk, dv)) and dq.abs().sum() == 0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda q, k, v: attention_block(q.tolist(), k, v), TypeError, "q must be a torch.Tensor"),
        (lambda q, k, v: attention_block(q.long(), k, v), TypeError, "floating-point"),
        (lambda q, k, v: attention_block(q[0, 0, 0], k, v), ValueError, "at least 2 dimensions"),
        (lambda q, k, v: attention_block(q, k[..., :4, :], v), ValueError, "share their leading"),
        (lambda q, k, v: attention_block(q, k[..., :4], v), ValueError, "same last dimension"),
        (lambda q, k, v: attention_block(q, k, v, scale=0.0), ValueError, "scale must be > 0"),
        (lambda q, k, v: attention_block(q, k, v, causal=1), TypeError, "causal must be a bool"),
        (lambda q, k, v: attention_block(q, k, v, q_start=-1), ValueError, "q_start"),
        (lambda q, k, v: merge_attention(q, q[..., 0], k, "x"), TypeError, "lse2"),
        (lambda q, k, v: merge_attention(q, q[..., 0], k[..., :4, :], q[..., 0]), ValueError, "expected out1"),
        (lambda q, k, v: blockwise_attention(q, k, v, block_size=0), ValueError, "block_size must be >= 1"),
        (lambda q, k, v: attention_block_backward(q, k, v, q, q, q), ValueError, "out and grad_out"),
        (lambda q, k, v: attention_block_backward(q, k, v, q, None, q), TypeError, "lse"),
    ],
)
def test_validation(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call(*_qkv())
