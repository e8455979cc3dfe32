"""Context parallelism: ring attention over a process group, its load balance, and its bytes.

Each of ``n`` ranks holds a slice of the sequence: its queries, keys and values. Ring attention
(Liu et al., 2023) keeps the queries where they are and passes the key/value blocks around the ring:
at step ``i`` rank ``r`` holds the block of rank ``r - i``, computes its queries' attention over it
with :func:`course_lib.attention.attention_block` (global positions, so the causal mask is right),
and folds the partial result into its running one with the log-sum-exp rule of
:func:`course_lib.attention.merge_attention`. After ``n`` steps every query has seen every key,
and only ``n - 1`` key/value blocks were sent per rank. The backward pass sends the blocks around
once more, with their gradient accumulators travelling alongside, and recomputes each block's
probabilities from the saved log-sum-exp (:func:`course_lib.attention.attention_block_backward`).

With a causal mask the contiguous split is unbalanced: the rank with the last slice computes with
every block, the first rank with its own only. :func:`zigzag_layout` gives rank ``r`` the chunks
``r`` and ``2n - 1 - r`` of ``2n``, so every rank computes the same number of query-key pairs
(:func:`ring_work` counts them before and after).

* :func:`contiguous_layout`, :func:`zigzag_layout` — which ``(start, length)`` chunks each rank holds;
  :func:`shard_sequence` cuts a rank's slice out of a full tensor, :func:`unshard_sequence` puts the
  slices back.
* :func:`ring_attention` — the autograd function (forward and backward over the ring); ``overlap=True`` posts
  each exchange before the block's compute, into one of two spare key/value buffers.
* :func:`ring_work` — query-key pairs each rank computes at each ring step (skipping chunk pairs the
  causal mask hides entirely).
* :func:`ring_attention_bytes` — bytes one rank sends per call, forward and backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .attention import attention_block, attention_block_backward, merge_attention
from .counted_collectives import record, ring_exchange
from .validation import check_bool, check_int

__all__ = [
    "Layout",
    "contiguous_layout",
    "ring_attention",
    "ring_attention_bytes",
    "ring_work",
    "shard_sequence",
    "unshard_sequence",
    "zigzag_layout",
]

# layout[rank] = the (start, length) chunks of the sequence that rank holds, in order.
Layout = tuple[tuple[tuple[int, int], ...], ...]


def _check_split(seq_len: int, n: int, parts: int) -> tuple[int, int]:
    seq_len = check_int("seq_len", seq_len, minimum=1)
    n = check_int("n", n, minimum=1)
    if seq_len % (parts * n):
        raise ValueError(f"seq_len ({seq_len}) must be divisible by {parts * n} for this layout on {n} ranks")
    return seq_len, n


def contiguous_layout(seq_len: int, n: int) -> Layout:
    """Rank ``r`` holds positions ``[r s/n, (r+1) s/n)``: one chunk each.

    >>> contiguous_layout(8, 2)
    (((0, 4),), ((4, 4),))
    """
    seq_len, n = _check_split(seq_len, n, 1)
    c = seq_len // n
    return tuple(((r * c, c),) for r in range(n))


def zigzag_layout(seq_len: int, n: int) -> Layout:
    """``2n`` chunks; rank ``r`` holds chunks ``r`` and ``2n - 1 - r`` (an early and a late one).

    >>> zigzag_layout(8, 2)
    (((0, 2), (6, 2)), ((2, 2), (4, 2)))
    """
    seq_len, n = _check_split(seq_len, n, 2)
    c = seq_len // (2 * n)
    return tuple(((r * c, c), ((2 * n - 1 - r) * c, c)) for r in range(n))


def _check_layout(layout: object) -> Layout:
    if not isinstance(layout, tuple) or not layout:
        raise TypeError("layout must be a non-empty tuple per rank of (start, length) chunks (contiguous_layout)")
    for chunks in layout:
        if not isinstance(chunks, tuple) or not chunks:
            raise TypeError("each rank's entry of layout must be a non-empty tuple of (start, length) pairs")
        for chunk in chunks:
            if not (isinstance(chunk, tuple) and len(chunk) == 2 and all(isinstance(v, int) for v in chunk)):
                raise TypeError(f"a chunk must be a (start, length) pair of ints, got {chunk!r}")
    return layout


def shard_sequence(x: torch.Tensor, layout: Layout, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s slice of ``x`` along ``dim``: its chunks, concatenated.

    >>> shard_sequence(torch.arange(8).view(1, 8), zigzag_layout(8, 2), 0).tolist()
    [[0, 1, 6, 7]]
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    layout = _check_layout(layout)
    rank = check_int("rank", rank, minimum=0)
    if rank >= len(layout):
        raise ValueError(f"rank must be < {len(layout)} (the layout's ranks), got {rank}")
    dim = check_int("dim", dim, minimum=-x.dim(), maximum=x.dim() - 1, what=f"a dimension of x ({x.dim()}-d)")
    length = sum(n for chunks in layout for _, n in chunks)
    if x.shape[dim] != length:
        raise ValueError(f"x has {x.shape[dim]} positions along dim {dim}; the layout splits {length}")
    return torch.cat([x.narrow(dim, start, length) for start, length in layout[rank]], dim)


def unshard_sequence(parts: Sequence[torch.Tensor], layout: Layout, dim: int = 1) -> torch.Tensor:
    """The full tensor from every rank's slice (``parts[r]`` from :func:`shard_sequence` on rank ``r``).

    >>> lay = zigzag_layout(8, 2)
    >>> x = torch.arange(8).view(1, 8)
    >>> torch.equal(unshard_sequence([shard_sequence(x, lay, r) for r in range(2)], lay), x)
    True
    """
    layout = _check_layout(layout)
    if len(parts) != len(layout):
        raise ValueError(f"expected {len(layout)} parts (one per rank), got {len(parts)}")
    pieces: list[tuple[int, torch.Tensor]] = []
    for part, chunks in zip(parts, layout):
        offset = 0
        for start, length in chunks:
            pieces.append((start, part.narrow(dim, offset, length)))
            offset += length
    return torch.cat([p for _, p in sorted(pieces, key=lambda s: s[0])], dim)


def _visible(q_chunk: tuple[int, int], k_chunk: tuple[int, int], causal: bool) -> bool:
    """Whether any query of ``q_chunk`` may see any key of ``k_chunk``."""
    return not causal or k_chunk[0] <= q_chunk[0] + q_chunk[1] - 1


def ring_work(layout: Layout, *, causal: bool = True) -> list[list[int]]:
    """``work[rank][step]``: query-key pairs rank ``rank`` computes at ring step ``step``.

    A chunk pair the causal mask hides entirely is skipped; a partly hidden one is computed whole (as
    a kernel computes a tile). The ring is synchronous: a step lasts as long as its busiest rank.

    >>> ring_work(contiguous_layout(8, 2))      # rank 0 skips rank 1's keys: idle half the time
    [[16, 0], [16, 16]]
    >>> ring_work(zigzag_layout(8, 2))          # 20 pairs each: even
    [[12, 8], [12, 8]]
    """
    layout = _check_layout(layout)
    check_bool("causal", causal)
    n = len(layout)
    work = []
    for rank in range(n):
        row = []
        for step in range(n):
            src = (rank - step) % n
            row.append(
                sum(
                    ql * kl
                    for q in layout[rank]
                    for k in layout[src]
                    if _visible(q, k, causal)
                    for ql, kl in [(q[1], k[1])]
                )
            )
        work.append(row)
    return work


def ring_attention_bytes(
    batch: int, heads: int, seq_len: int, head_dim: int, n: int, *, bytes_per_element: int = 4, backward: bool = True
) -> int:
    """Bytes one of ``n`` ranks sends in one :func:`ring_attention` call (forward, plus backward if asked).

    One key or value block is ``B = batch x heads x (seq_len / n) x head_dim x p`` bytes. Forward:
    ``n - 1`` steps, each sending a key and a value block: ``2 (n-1) B``. Backward: ``n - 1`` steps
    sending keys, values and their gradient accumulators (``4 B``), then the accumulators one last
    hop home (``2 B``): ``(4n - 2) B``.

    >>> ring_attention_bytes(1, 4, 128, 16, 4, backward=False) == 2 * 3 * (4 * 32 * 16 * 4)
    True
    """
    for name, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim)):
        check_int(name, value, minimum=1)
    n = check_int("n", n, minimum=1)
    p = check_int("bytes_per_element", bytes_per_element, minimum=1)
    check_bool("backward", backward)
    if seq_len % n:
        raise ValueError(f"seq_len ({seq_len}) must be divisible by n ({n})")
    if n == 1:
        return 0
    block = batch * heads * (seq_len // n) * head_dim * p
    return 2 * (n - 1) * block + ((4 * n - 2) * block if backward else 0)


def _post_exchange(
    tensors: list[torch.Tensor], into: list[torch.Tensor], group: Any
) -> Callable[[], list[torch.Tensor]]:
    """Post the sends of ``tensors`` to the next rank and the receives into ``into``; call the result to wait."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    right, left = ((me + d) % n if group is None else dist.get_global_rank(group, (me + d) % n) for d in (1, -1))
    ops = []
    for t, r in zip(tensors, into):
        record("send", group, t)
        ops += [dist.P2POp(dist.isend, t.contiguous(), right, group), dist.P2POp(dist.irecv, r, left, group)]
    works = dist.batch_isend_irecv(ops)

    def wait() -> list[torch.Tensor]:
        for work in works:
            work.wait()
        return into

    return wait


def _pairs(
    mine: tuple[tuple[int, int], ...], theirs: tuple[tuple[int, int], ...], causal: bool
) -> list[tuple[Any, ...]]:
    """(q offset, q chunk, k offset, k chunk) for every visible pair of chunks."""
    out = []
    qo = 0
    for q in mine:
        ko = 0
        for k in theirs:
            if _visible(q, k, causal):
                out.append((qo, q, ko, k))
            ko += k[1]
        qo += q[1]
    return out


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: Any,
        layout: Layout,
        causal: bool,
        scale: float,
        overlap: bool,
    ) -> torch.Tensor:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        out = torch.zeros_like(q)
        lse = torch.full(
            q.shape[:-1], float("-inf"), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32
        )
        kb, vb = k, v
        spare = [[torch.empty_like(k), torch.empty_like(v)] for _ in range(2)] if overlap and n > 1 else []
        for step in range(n):
            src = (rank - step) % n
            if spare and step < n - 1:  # post the next block's exchange first, into the buffer not in use
                pending = _post_exchange([kb, vb], spare[step % 2], group)
            for qo, qc, ko, kc in _pairs(layout[rank], layout[src], causal):
                part = attention_block(
                    q[..., qo : qo + qc[1], :],
                    kb[..., ko : ko + kc[1], :],
                    vb[..., ko : ko + kc[1], :],
                    causal=causal,
                    scale=scale,
                    q_start=qc[0],
                    k_start=kc[0],
                )
                o, s = merge_attention(out[..., qo : qo + qc[1], :], lse[..., qo : qo + qc[1]], *part)
                out[..., qo : qo + qc[1], :], lse[..., qo : qo + qc[1]] = o, s
            if step < n - 1:
                kb, vb = pending() if spare else ring_exchange([kb, vb], group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout, ctx.causal, ctx.scale, ctx.overlap = group, layout, causal, scale, overlap
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        group, layout, causal, scale = ctx.group, ctx.layout, ctx.causal, ctx.scale
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        dq = torch.zeros_like(q)
        kb, vb, dk, dv = k, v, torch.zeros_like(k), torch.zeros_like(v)
        grad_out = grad_out.contiguous()
        spare = [[torch.empty_like(k), torch.empty_like(v)] for _ in range(2)] if ctx.overlap and n > 1 else []
        for step in range(n):
            src = (rank - step) % n
            if spare and step < n - 1:  # the next key/value block travels while this one is used
                pending = _post_exchange([kb, vb], spare[step % 2], group)
            for qo, qc, ko, kc in _pairs(layout[rank], layout[src], causal):
                qs, ks = slice(qo, qo + qc[1]), slice(ko, ko + kc[1])
                gq, gk, gv = attention_block_backward(
                    q[..., qs, :],
                    kb[..., ks, :],
                    vb[..., ks, :],
                    out[..., qs, :],
                    lse[..., qs],
                    grad_out[..., qs, :],
                    causal=causal,
                    scale=scale,
                    q_start=qc[0],
                    k_start=kc[0],
                )
                dq[..., qs, :] += gq
                dk[..., ks, :] += gk
                dv[..., ks, :] += gv
            if step < n - 1 and spare:  # the accumulators are ready only now: they travel after the compute
                dk, dv = ring_exchange([dk, dv], group)
                kb, vb = pending()
            elif step < n - 1:
                kb, vb, dk, dv = ring_exchange([kb, vb, dk, dv], group)
        if n > 1:
            dk, dv = ring_exchange([dk, dv], group)  # the accumulators' last hop: back to their block's owner
        return dq, dk, dv, None, None, None, None, None


def _check_attention_inputs(
    q: object, k: object, v: object, layout: object, causal: object, group: Any, *, same_heads: bool, who: str
) -> tuple[Layout, int, int]:
    """What every context-parallel attention checks (the ring here, the all-gather and Ulysses in
    :mod:`course_lib.context_parallel_variants`): 4-D floating-point q, k, v of this rank's positions, k and v of
    q's heads (``same_heads``) or of a number dividing them, a layout of the group's ranks that gives every rank
    q's positions, a process group. Returns the layout, the group's size and this rank's place in it."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
            raise TypeError(f"{name} must be a floating-point tensor (batch, heads, seq, head_dim)")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if same_heads and (q.shape != k.shape or k.shape != v.shape):
        raise ValueError(
            f"q, k, v must have one shape here (repeat grouped key/value heads first), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"k and v must have one shape, q's batch, positions and head_dim, and a number of heads dividing q's; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    layout = _check_layout(layout)
    check_bool("causal", causal)
    if not dist.is_initialized():
        raise RuntimeError(f"{who} needs a process group: call dist.init_process_group first")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if len(layout) != n:
        raise ValueError(f"layout has {len(layout)} ranks, the group {n}")
    if any(sum(c for _, c in chunks) != q.shape[2] for chunks in layout):
        raise ValueError(f"every rank's chunks must hold q's {q.shape[2]} positions")
    return layout, n, rank


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    *,
    layout: Layout,
    causal: bool = True,
    scale: float | None = None,
    overlap: bool = False,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, the key/value blocks passed around ``group``.

    ``q``, ``k``, ``v`` are ``(batch, heads, local_seq, head_dim)``: this rank's slice in ``layout``
    (:func:`shard_sequence` along dimension 2). The result is this rank's slice of
    ``F.scaled_dot_product_attention(q_full, k_full, v_full, is_causal=causal)``, and so are the
    gradients. ``k`` and ``v`` must have ``q``'s heads (repeat grouped key/value heads first). With
    ``overlap=True`` each step posts the next block's exchange before computing on the current one (two spare
    key/value buffers): the same arithmetic, so the same result, with the transfer hidden behind the compute.
    """
    check_bool("overlap", overlap)
    layout = _check_attention_inputs(q, k, v, layout, causal, group, same_heads=True, who="ring_attention")[0]
    return _RingAttention.apply(
        q, k, v, group, layout, causal, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, overlap
    )
