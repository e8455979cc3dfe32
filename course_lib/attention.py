"""Attention one block of keys at a time: partial results, their merge, and their backward.

Softmax attention over all keys can be computed block by block, if each block's result carries the
log-sum-exp (LSE) of its scores. For queries ``q`` and one block of keys and values ``(k_j, v_j)``:

    out_j = softmax(q k_j^T * scale) v_j,        lse_j = log(sum(exp(q k_j^T * scale)))

and two partial results over disjoint key blocks merge exactly into the result over their union:

    lse = log(exp(lse_1) + exp(lse_2)),          out = exp(lse_1 - lse) out_1 + exp(lse_2 - lse) out_2

This is the online softmax of Milakov & Gimelshein (2018) written on whole blocks; FlashAttention
(Dao et al., 2022; Dao, 2023) runs it tile by tile inside one kernel, and ring attention (notebook
18) runs it across devices, one key block arriving from the neighbour at each step. Notebook 16
writes the tiled version by hand and checks it against these functions.

* :func:`attention_block` — ``(out, lse)`` of queries against one block of keys, causal or not. In
  the causal case positions are global (``q_start``, ``k_start``), so a block of keys from another
  device is masked correctly; a query that sees no key of the block gets ``out = 0``, ``lse = -inf``.
* :func:`merge_attention` — the merge above, safe when either side (or both) saw no key.
* :func:`blockwise_attention` — the fold of the two over key blocks: what a ring computes.
* :func:`attention_block_backward` — FlashAttention-2's backward for one key block, given the
  *final* output and LSE: the gradients with respect to ``q`` (a partial sum over blocks), ``k_j``
  and ``v_j``; the probabilities are recomputed from the LSE, never stored.

Shapes: ``q`` is ``(..., s_q, d)``, ``k`` is ``(..., s_k, d)``, ``v`` is ``(..., s_k, d_v)`` with the same
leading (batch, head) dimensions; ``lse`` is ``(..., s_q)``. The LSE is kept in float32 (float64 for
float64 inputs), whatever the inputs' dtype.
"""

from __future__ import annotations

import math

import torch

from .validation import check_bool, check_int, check_number

__all__ = ["attention_block", "attention_block_backward", "blockwise_attention", "merge_attention"]


def _stat_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _check_qkv(q: object, k: object, v: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seq, dim), got shape {tuple(t.shape)}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"q, k, v must share their leading dimensions and k, v their length: got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension, got {q.shape[-1]} and {k.shape[-1]}")
    return q, k, v


def _scores(
    q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None, q_start: int, k_start: int
) -> torch.Tensor:
    """Scaled scores in the statistics dtype, masked to -inf where a query may not see a key."""
    check_bool("causal", causal)
    check_int("q_start", q_start, minimum=0)
    check_int("k_start", k_start, minimum=0)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        check_number("scale", scale, finite=True)
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
    dt = _stat_dtype(q)
    s = (q.to(dt) @ k.to(dt).transpose(-2, -1)) * scale
    if causal:
        qi = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
        kj = torch.arange(k_start, k_start + k.shape[-2], device=q.device)
        s = s.masked_fill(kj[None, :] > qi[:, None], float("-inf"))
    return s


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf (a query that saw no key) replaced by 0, so that ``exp(x - lse)`` is 0, not NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def attention_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_start: int = 0,
    k_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q`` over one block of keys: ``(out, lse)``.

    ``out`` is normalized over this block only (in ``q``'s dtype); ``lse`` is the log of the block's
    softmax denominator (float32). ``scale`` defaults to ``1/sqrt(d)``. With ``causal=True`` query
    ``i`` (global position ``q_start + i``) sees key ``j`` (position ``k_start + j``) only when
    ``k_start + j <= q_start + i``; a query that sees none gets ``out = 0`` and ``lse = -inf``.

    >>> q, k, v = torch.randn(3, 1, 4, 8).unbind(0)
    >>> out, lse = attention_block(q, k, v)
    >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6), tuple(lse.shape)
    (True, (1, 4))
    """
    q, k, v = _check_qkv(q, k, v)
    s = _scores(q, k, causal, scale, q_start, k_start)
    lse = torch.logsumexp(s, dim=-1)
    probs = torch.exp(s - _finite(lse).unsqueeze(-1))
    return (probs @ v.to(s.dtype)).to(q.dtype), lse


def merge_attention(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key blocks into the result over both.

    ``lse = logaddexp(lse1, lse2)``; each output is weighted by the share of the total softmax mass
    its block holds, ``exp(lse_i - lse)``. A side that saw no key (``lse = -inf``) weighs 0, and when
    neither did, the result stays ``out = 0``, ``lse = -inf`` (no NaN).

    >>> q, k, v = torch.randn(1, 4, 8), torch.randn(1, 6, 8), torch.randn(1, 6, 8)
    >>> whole, lse = attention_block(q, k, v)
    >>> a, b = attention_block(q, k[:, :2], v[:, :2]), attention_block(q, k[:, 2:], v[:, 2:])
    >>> merged, merged_lse = merge_attention(*a, *b)
    >>> torch.allclose(merged, whole, atol=1e-6), torch.allclose(merged_lse, lse)
    (True, True)
    """
    for name, t in (("out1", out1), ("lse1", lse1), ("out2", out2), ("lse2", lse2)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
    if out1.shape != out2.shape or lse1.shape != lse2.shape or out1.shape[:-1] != lse1.shape:
        raise ValueError(
            f"expected out1, out2 of one shape (..., s, d) and lse1, lse2 of shape (..., s); got "
            f"{tuple(out1.shape)}, {tuple(lse1.shape)}, {tuple(out2.shape)}, {tuple(lse2.shape)}"
        )
    lse = torch.logaddexp(lse1, lse2)
    safe = _finite(lse)
    w1 = torch.exp(lse1 - safe).unsqueeze(-1)
    w2 = torch.exp(lse2 - safe).unsqueeze(-1)
    out = w1 * out1.to(w1.dtype) + w2 * out2.to(w2.dtype)
    return out.to(out1.dtype), lse


def blockwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over all keys, one block of ``block_size`` keys at a time, merged: ``(out, lse)``.

    Equal to ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` (up to rounding), with the
    LSE besides. It is the loop a ring runs across devices.

    >>> q, k, v = torch.randn(3, 2, 10, 8).unbind(0)
    >>> out, _ = blockwise_attention(q, k, v, block_size=3, causal=True)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, ref, atol=1e-6)
    True
    """
    q, k, v = _check_qkv(q, k, v)
    block_size = check_int("block_size", block_size, minimum=1)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=_stat_dtype(q), device=q.device)
    for start in range(0, k.shape[-2], block_size):
        part = attention_block(
            q,
            k[..., start : start + block_size, :],
            v[..., start : start + block_size, :],
            causal=causal,
            scale=scale,
            k_start=start,
        )
        out, lse = merge_attention(out, lse, *part)
    return out, lse


def attention_block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_start: int = 0,
    k_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` from one block of keys, given the final ``out`` and ``lse`` of the queries.

    FlashAttention-2's backward: the probabilities of this block are recomputed as
    ``exp(scores - lse)`` (nothing ``s x s`` was stored), then ``dv = P^T dO``, ``dP = dO v^T``,
    ``dS = P * (dP - D)`` with ``D = rowsum(dO * out)``, ``dq = dS k * scale``, ``dk = dS^T q * scale``.
    ``dk`` and ``dv`` are complete for this block; ``dq`` is this block's share, summed over blocks.

    >>> q, k, v, g = torch.randn(4, 1, 6, 8, dtype=torch.float64).unbind(0)
    >>> leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    >>> ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    >>> ref.backward(g)
    >>> out, lse = attention_block(q, k, v, causal=True)
    >>> dq, dk, dv = attention_block_backward(q, k, v, out, lse, g, causal=True)
    >>> all(torch.allclose(a, b.grad) for a, b in zip((dq, dk, dv), leaves))
    True
    """
    q, k, v = _check_qkv(q, k, v)
    for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
    if out.shape != grad_out.shape or out.shape[:-1] != q.shape[:-1] or lse.shape != q.shape[:-1]:
        raise ValueError("out and grad_out must have q's shape (with v's last dimension), lse q's without its last")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = _scores(q, k, causal, scale, q_start, k_start)
    dt = s.dtype
    probs = torch.exp(s - _finite(lse.to(dt)).unsqueeze(-1))
    do = grad_out.to(dt)
    d = (do * out.to(dt)).sum(-1, keepdim=True)
    dv = probs.transpose(-2, -1) @ do
    ds = probs * (do @ v.to(dt).transpose(-2, -1) - d)
    dq = (ds @ k.to(dt)) * scale
    dk = (ds.transpose(-2, -1) @ q.to(dt)) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
