"""Lab: ring attention (forward), the key-value blocks passed around the ranks of the default process group.

Each rank holds a slice of the sequence: its queries, keys and values, `q`, `k`, `v` of shape
(batch, heads, local_len, head_dim). `layout[r]` lists the chunks rank r holds, as (start, length) pairs of
global positions, concatenated in that order along dimension 2 (`contiguous_layout`: one chunk per rank;
`zigzag_layout`: two). Every rank holds as many positions as the others, and every chunk has the same length.

- `block_attention` is the attention of some queries over one block of keys, with its log-sum-exp;
- `merge` folds such a partial result into a running one (the online-softmax rule): partial softmaxes over
  disjoint key blocks combine exactly when each is weighted by its share of the total mass, exp(lse_i - lse);
- `ring_attention` keeps the queries where they are and passes the key-value blocks around the ring: at step
  s = 0 .. n-1 rank r holds the block of rank (r - s) mod n; `post_next` sends that block to rank r + 1 and
  receives the next from rank r - 1 (mod n), into new tensors. The transfer of the next block is posted before
  the current block is computed, and waited for after, so that it could overlap the computation. Every
  computation goes through `block_attention` (the check counts the calls).
  With `causal=True` a query at position i sees the keys at positions j <= i: a chunk of keys entirely after a
  chunk of queries is skipped, not computed;
- `zigzag_layout` cuts the sequence into 2n chunks and gives rank r chunks r and 2n-1-r, so that with the
  causal mask every rank computes the same number of query-key pairs.
"""

import math

import torch
import torch.distributed as dist


def contiguous_layout(seq_len, n):
    """Rank r holds positions [r * seq_len / n, (r + 1) * seq_len / n): one chunk each."""
    c = seq_len // n
    return tuple(((r * c, c),) for r in range(n))


def zigzag_layout(seq_len, n):
    """2n chunks of seq_len / 2n positions; rank r holds chunks r and 2n-1-r, in that order."""
    ### BEGIN SOLUTION
    c = seq_len // (2 * n)
    return tuple(((r * c, c), ((2 * n - 1 - r) * c, c)) for r in range(n))
    ### END SOLUTION


def block_attention(q, k, v, *, q_start, k_start, causal, scale):
    """Attention of `q` (global positions q_start, q_start + 1, ...) over one block `k`, `v` (k_start, ...).

    Returns `(out, lse)`: `out` (..., q_len, head_dim) is softmax(scale * q k^T) v normalized over this block
    only; `lse` (..., q_len) is the log-sum-exp of the block's scaled (and masked) scores.
    """
    ### BEGIN SOLUTION
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        qi = torch.arange(q_start, q_start + q.shape[-2])
        kj = torch.arange(k_start, k_start + k.shape[-2])
        scores = scores.masked_fill(kj[None, :] > qi[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ v
    ### END SOLUTION
    return out, lse


def merge(out, lse, block_out, block_lse):
    """The running result `(out, lse)` after one more key block's `(block_out, block_lse)`: `(out, lse)`.

    The running `lse` starts at -inf (no key seen yet) and `out` at zeros.
    """
    ### BEGIN SOLUTION
    new_lse = torch.logaddexp(lse, block_lse)
    out = torch.exp(lse - new_lse)[..., None] * out + torch.exp(block_lse - new_lse)[..., None] * block_out
    ### END SOLUTION
    return out, new_lse


def post_next(k, v, rank, n):
    """Post the transfers of one ring step, without waiting: `(k_next, v_next, requests)`.

    The block held, `k` and `v`, goes to rank (rank + 1) mod n; the next one comes from rank (rank - 1) mod n
    into new tensors `k_next`, `v_next` (valid once every request in `requests` has been waited for, once).
    """
    ### BEGIN SOLUTION
    k_next, v_next = torch.empty_like(k), torch.empty_like(v)
    requests = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, k, (rank + 1) % n),
            dist.P2POp(dist.isend, v, (rank + 1) % n),
            dist.P2POp(dist.irecv, k_next, (rank - 1) % n),
            dist.P2POp(dist.irecv, v_next, (rank - 1) % n),
        ]
    )
    ### END SOLUTION
    return k_next, v_next, requests


def ring_attention(q, k, v, layout, *, causal=True):
    """This rank's queries' attention over the whole sequence: `(out, lse)`, shaped like `q` and `q[..., 0]`."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"))
    ### BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1])
    for step in range(n):
        source = (rank - step) % n  # whose block this rank holds at this step
        if step < n - 1:  # post the next block's transfer before computing on this one
            k_next, v_next, requests = post_next(k, v, rank, n)
        q_offset = 0
        for q_start, q_len in layout[rank]:
            k_offset = 0
            for k_start, k_len in layout[source]:
                if not causal or k_start <= q_start + q_len - 1:  # else every key is in the queries' future
                    qs, ks = slice(q_offset, q_offset + q_len), slice(k_offset, k_offset + k_len)
                    part = block_attention(
                        q[..., qs, :],
                        k[..., ks, :],
                        v[..., ks, :],
                        q_start=q_start,
                        k_start=k_start,
                        causal=causal,
                        scale=scale,
                    )
                    out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], *part)
                k_offset += k_len
            q_offset += q_len
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    ### END SOLUTION
    return out, lse
