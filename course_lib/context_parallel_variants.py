"""Context parallelism without the ring: all-gather of keys and values, and Ulysses' all-to-all over heads.

Every rank holds its slice of the sequence (a :func:`course_lib.context_parallel.zigzag_layout` or
:func:`~course_lib.context_parallel.contiguous_layout`) of queries, keys and values, as for
:func:`course_lib.context_parallel.ring_attention`; each function returns this rank's slice of full attention, and
autograd gives this rank's slices of the gradients.

* :func:`allgather_attention` — all-gather the keys and values (put back in position order), then this rank's
  queries attend to the whole sequence with the causal mask by global position; backward reduce-scatters their
  gradients to their owners. Llama 3's context parallelism (Llama Team, 2024, section 3.3.2): with grouped-query
  attention the keys and values are a fraction of the queries, so gathering them is cheap. Key/value heads may be
  fewer than query heads (they are repeated after the gather).
* :func:`ulysses_attention` — DeepSpeed-Ulysses (Jacobs et al., 2023): an all-to-all turns a sequence slice of every
  head into the whole sequence of ``heads / n`` heads, attention runs locally and unsharded, and a second
  all-to-all turns the output back. Needs ``n`` to divide the key/value heads.
* :func:`cp_attention_bytes` — bytes one rank sends per call for each of the three, forward and backward.

The collectives are :mod:`course_lib.counted_collectives`' (a :class:`~course_lib.counted_collectives.CommCounter`
counts them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .context_parallel import (
    Layout,
    _check_attention_inputs,
    ring_attention_bytes,
    shard_sequence,
    unshard_sequence,
)
from .counted_collectives import all_gather, all_to_all, reduce_scatter
from .validation import check_bool, check_int

__all__ = ["VARIANTS", "allgather_attention", "cp_attention_bytes", "ulysses_attention"]

VARIANTS: tuple[str, ...] = ("ring", "allgather", "ulysses")
_MAX = 1 << 24  # the largest size any argument of cp_attention_bytes may take


def _positions(chunks: tuple[tuple[int, int], ...]) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + length) for start, length in chunks])


class _GatherSequence(torch.autograd.Function):
    """Every rank's slice, gathered and put in position order; backward: the gradient reduce-scattered back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
        ctx.group, ctx.layout = group, layout
        n = len(layout)
        return unshard_sequence(list(all_gather(x, 2, group).chunk(n, 2)), layout, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        by_rank = torch.cat([shard_sequence(grad, ctx.layout, r, 2) for r in range(len(ctx.layout))], 2)
        return reduce_scatter(by_rank, 2, ctx.group), None, None


def _seq_to_heads(x: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
    """``(b, h, s/n, d)``, this rank's positions of every head -> ``(b, h/n, s, d)``, every position of its heads."""
    n = len(layout)
    b, h, sl, d = x.shape
    parts = x.reshape(b, n, h // n, sl, d).movedim(1, 0).contiguous()  # [j]: the heads rank j will own
    got = all_to_all(parts, [1] * n, [1] * n, group)  # [j]: rank j's positions of this rank's heads
    return unshard_sequence(list(got.unbind(0)), layout, dim=2)


def _heads_to_seq(y: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`."""
    n = len(layout)
    parts = torch.stack([shard_sequence(y, layout, r, 2) for r in range(n)])  # [j]: rank j's positions
    got = all_to_all(parts, [1] * n, [1] * n, group)  # [j]: head group j at this rank's positions
    return got.movedim(0, 1).flatten(1, 2)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
        ctx.group, ctx.layout = group, layout
        return _seq_to_heads(x, group, layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _heads_to_seq(grad, ctx.group, ctx.layout), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
        ctx.group, ctx.layout = group, layout
        return _heads_to_seq(y, group, layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _seq_to_heads(grad.contiguous(), ctx.group, ctx.layout), None, None


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    *,
    layout: Layout,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """This rank's slice of full attention: the keys and values all-gathered, then attended to by its queries.

    ``q`` is ``(batch, heads, local_seq, head_dim)`` (this rank's slice in ``layout``); ``k``, ``v`` the same
    with ``kv_heads`` dividing ``heads`` (grouped-query attention: gathered first, repeated after).
    """
    layout, _, rank = _check_attention_inputs(
        q, k, v, layout, causal, group, same_heads=False, who="allgather_attention"
    )
    full_k, full_v = (_GatherSequence.apply(t, group, layout) for t in (k, v))
    repeat = q.shape[1] // k.shape[1]
    full_k, full_v = full_k.repeat_interleave(repeat, 1), full_v.repeat_interleave(repeat, 1)
    mask = None
    if causal:
        mask = _positions(layout[rank])[:, None] >= torch.arange(full_k.shape[2])[None, :]
    out = F.scaled_dot_product_attention(q, full_k, full_v, attn_mask=mask, scale=scale)
    assert isinstance(out, torch.Tensor)
    return out


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    *,
    layout: Layout,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """This rank's slice of full attention, by two all-to-alls over heads (DeepSpeed-Ulysses).

    Shapes as :func:`allgather_attention`; the group's size must divide the key/value heads (each rank then
    attends with ``heads / n`` query heads and ``kv_heads / n`` key/value heads over the whole sequence).
    """
    layout, n, _ = _check_attention_inputs(q, k, v, layout, causal, group, same_heads=False, who="ulysses_attention")
    if k.shape[1] % n:
        raise ValueError(f"Ulysses splits heads: the {n} ranks must divide the {k.shape[1]} key/value heads")
    qh, kh, vh = (_SeqToHeads.apply(t.contiguous(), group, layout) for t in (q, k, v))
    repeat = q.shape[1] // k.shape[1]
    kh, vh = kh.repeat_interleave(repeat, 1), vh.repeat_interleave(repeat, 1)
    out = _HeadsToSeq.apply(F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale), group, layout)
    assert isinstance(out, torch.Tensor)
    return out


def cp_attention_bytes(
    variant: str,
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    n: int,
    *,
    kv_heads: int | None = None,
    bytes_per_element: int = 4,
    backward: bool = True,
) -> int:
    """Bytes one of ``n`` ranks sends in one attention call of ``variant`` (forward, plus backward if asked).

    With ``Bq = batch x heads x (seq_len/n) x head_dim x p`` (this rank's queries) and ``Bkv`` the same with
    ``kv_heads`` (one key or value slice):

    * ``"ring"``: ``2 (n-1) Bkv`` forward, ``(4n - 2) Bkv`` backward (``ring_attention_bytes``);
    * ``"allgather"``: the all-gather of keys and values, ``2 (n-1) Bkv``; backward reduce-scatters their
      gradients, the same;
    * ``"ulysses"``: all-to-alls keep ``1/n`` of each tensor home: ``(n-1)/n (2 Bq + 2 Bkv)`` forward
      (q, k, v to heads, the output back), the same backward (the output's gradient, then q's, k's and v's).

    >>> [cp_attention_bytes(v, 1, 4, 128, 16, 4) for v in VARIANTS]
    [163840, 98304, 49152]
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    for name, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim)):
        check_int(name, value, minimum=1, maximum=_MAX)
    n = check_int("n", n, minimum=1, maximum=4096)
    kv = heads if kv_heads is None else check_int("kv_heads", kv_heads, minimum=1, maximum=_MAX)
    p = check_int("bytes_per_element", bytes_per_element, minimum=1, maximum=16)
    check_bool("backward", backward)
    if heads % kv:
        raise ValueError(f"kv_heads ({kv}) must divide heads ({heads})")
    if seq_len % n:
        raise ValueError(f"seq_len ({seq_len}) must be divisible by n ({n})")
    if variant == "ring":
        return ring_attention_bytes(batch, kv, seq_len, head_dim, n, bytes_per_element=p, backward=backward)
    b_kv = batch * kv * (seq_len // n) * head_dim * p
    if variant == "allgather":
        return 2 * (n - 1) * b_kv * (2 if backward else 1)
    if kv % n:
        raise ValueError(f"Ulysses splits heads: n ({n}) must divide kv_heads ({kv})")
    b_q = batch * heads * (seq_len // n) * head_dim * p
    return (n - 1) * (2 * b_q + 2 * b_kv) // n * (2 if backward else 1)
