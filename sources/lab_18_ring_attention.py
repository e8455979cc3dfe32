# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · Ring attention with the online-softmax merge

Notebook 18 §1 split the sequence through attention: each rank keeps its queries, and the key-value blocks travel around a ring, each step's partial result folded into the running one with the log-sum-exp rule of notebook 16 §5. In this lab you write that forward pass yourself, on four real processes, and it is compared with `scaled_dot_product_attention` on the whole sequence.

By the end you will have written, and seen pass against PyTorch:
- the attention of some queries over one block of keys, with its log-sum-exp and the causal mask in global positions;
- the online-softmax merge of two partial results;
- the ring: key-value blocks sent with `isend`/`irecv` (or `batch_isend_irecv`), the next block posted before the current one is computed, blocks entirely in the queries' future skipped;
- the zig-zag layout, which gives every rank the same causal work.

This lab assumes notebook 16 §5 (attention by blocks, `merge_attention`) and notebook 18 §1 (ring attention, the zig-zag split). Expected time: about 75 minutes.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The layouts

A layout says which positions each rank holds: `layout[r]` is a tuple of `(start, length)` chunks, and rank `r`'s `q`, `k`, `v` are those chunks concatenated along the sequence dimension. The contiguous layout is given; you write the zig-zag one. Below, both on the check's sequence, and the query-key pairs each rank computes with the causal mask (`course_lib.context_parallel.ring_work`, which skips the chunk pairs the mask hides entirely).
"""

# %% slideshow={"slide_type": "-"}
import os

from course_lib.context_parallel import contiguous_layout, ring_work, zigzag_layout
from course_lib.labs.ring_attention import BATCH, CASES, HEAD_DIM, HEADS, NPROCS, SEQ, SHARP_TOLERANCE, TOLERANCE

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)
print(f"q, k, v: (batch, heads, seq, head_dim) = ({BATCH}, {HEADS}, {SEQ}, {HEAD_DIM}) on {NPROCS} ranks")
for name, layout_fn in (("contiguous", contiguous_layout), ("zig-zag", zigzag_layout)):
    layout = layout_fn(SEQ, NPROCS)
    print(f"{name:<10}: rank 0 holds {layout[0]}, rank {NPROCS - 1} holds {layout[-1]}; causal query-key pairs "
          f"per rank {[sum(w) for w in ring_work(layout)]}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_ring.py`) and the check after it. The file's docstring is the specification.

The rules that decide right from wrong, each with a check of its own:

1. **The result is attention over the whole sequence**: each rank's output and log-sum-exp are its slice of those of `scaled_dot_product_attention` on the whole `q`, `k`, `v`, on both layouts, causal and not, and with large scores (the queries multiplied by a large factor, so that `exp` of the largest scores overflows float32, as the check's section shows: the merge and the log-sum-exp must subtract the maximum, as `torch.logsumexp` and `torch.logaddexp` do).
2. **The causal mask uses global positions**: query `i` sees key `j` when `j <= i`, positions counted in the whole sequence. A chunk of keys that starts after a chunk of queries ends is skipped, never computed.
3. **The ring goes one way**: rank `r` sends to `r + 1` and receives from `r - 1` (mod n), so at step `s` it holds rank `(r - s) mod n`'s block, and sends `n - 1` key blocks and `n - 1` value blocks in all.
4. **The next block is on its way while the current one is computed**: its receive is posted before, and waited for after, the computation. Wait for each request once.
5. **The zig-zag layout balances the causal work**: rank `r` holds chunks `r` and `2n - 1 - r` of `2n`.
"""

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_ring.py
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
    # YOUR CODE HERE
    raise NotImplementedError()


def block_attention(q, k, v, *, q_start, k_start, causal, scale):
    """Attention of `q` (global positions q_start, q_start + 1, ...) over one block `k`, `v` (k_start, ...).

    Returns `(out, lse)`: `out` (..., q_len, head_dim) is softmax(scale * q k^T) v normalized over this block
    only; `lse` (..., q_len) is the log-sum-exp of the block's scaled (and masked) scores.
    """
    # YOUR CODE HERE
    raise NotImplementedError()
    return out, lse


def merge(out, lse, block_out, block_lse):
    """The running result `(out, lse)` after one more key block's `(block_out, block_lse)`: `(out, lse)`.

    The running `lse` starts at -inf (no key seen yet) and `out` at zeros.
    """
    # YOUR CODE HERE
    raise NotImplementedError()
    return out, new_lse


def post_next(k, v, rank, n):
    """Post the transfers of one ring step, without waiting: `(k_next, v_next, requests)`.

    The block held, `k` and `v`, goes to rank (rank + 1) mod n; the next one comes from rank (rank - 1) mod n
    into new tensors `k_next`, `v_next` (valid once every request in `requests` has been waited for, once).
    """
    # YOUR CODE HERE
    raise NotImplementedError()
    return k_next, v_next, requests


def ring_attention(q, k, v, layout, *, causal=True):
    """This rank's queries' attention over the whole sequence: `(out, lse)`, shaped like `q` and `q[..., 0]`."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"))
    # YOUR CODE HERE
    raise NotImplementedError()
    return out, lse


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_ring_attention_lab()` starts 4 processes (gloo, CPU). In each it imports your file and runs `ring_attention` on the cases listed below, each rank on its slice of the same seeded `q`, `k`, `v`. It compares each rank's output with its slice of `F.scaled_dot_product_attention` on the whole sequence, and the log-sum-exp with the one computed in float64 from the whole scores. It wraps `block_attention` and the point-to-point functions of `torch.distributed` to note every block computed and every send and receive: their peers, their bytes, and when each receive was posted and waited for.

When an output is wrong the check says what it looks like: NaN, attention without the `1/sqrt(head_dim)` scale, a right log-sum-exp with a wrong output (the merge's rescaling), or the position of the first wrong query. The tolerance is relative, `|difference| / (1 + |expected|)`. In the large-scores case float32's relative precision times the size of the scores is near the tolerance of the other cases (printed below), on both sides, so that case has its own, larger, tolerance.
"""

# %% slideshow={"slide_type": "-"}
import math  # noqa: E402

import torch  # noqa: E402

from course_lib.labs.ring_attention import SHARP, case_data  # noqa: E402

q, k, _ = case_data(SHARP)
largest = (q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM)).max().item()
print("cases: " + "; ".join(CASES))
print(f"large scores (queries x {SHARP:g}): the largest score is ~{largest:.0f}, exp() of it in float32: "
      f"{torch.exp(torch.tensor(largest)).item()}; float32's precision x that score: ~{torch.finfo().eps * largest:.0e}")
print(f"tolerance: {TOLERANCE:g} ({SHARP_TOLERANCE:g} for large scores), |difference| / (1 + |expected|)")

# %% slideshow={"slide_type": "-"}
from course_lib.labs.ring_attention import check_ring_attention_lab  # noqa: E402

print(check_ring_attention_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- In `block_attention`, `torch.arange(q_start, q_start + q.shape[-2])` and the same for the keys give global positions; `scores.masked_fill(kj[None, :] > qi[:, None], float("-inf"))` hides the future. `torch.logsumexp(scores, -1)` is the log-sum-exp, and `torch.exp(scores - lse[..., None]) @ v` the block's output.
- In `merge`, `new = torch.logaddexp(lse, block_lse)`; each side is weighted by `torch.exp(its_lse - new)[..., None]`. The first merge, with `lse = -inf`, gives the block's result unchanged.
- `dist.batch_isend_irecv([dist.P2POp(dist.isend, k, right), ..., dist.P2POp(dist.irecv, k_next, left), ...])` posts everything at once and returns the requests; receive into `torch.empty_like(k)`, never into the block you are computing with.
- Walk over the chunks of `layout[rank]` (the queries) and `layout[(rank - step) % n]` (the block held), with running offsets into the local tensors; with the causal mask, skip a pair when the keys' chunk starts after the queries' chunk's last position.

## Summary

- Attention over a sequence split across ranks is exact: partial results over disjoint key blocks merge by their log-sum-exp, in any order.
- The ring sends each key-value block `n - 1` times, and with two buffers each transfer can run while the previous block is computed.
- With a causal mask the contiguous split leaves the first ranks idle; the zig-zag split pairs an early chunk with a late one so that every rank does the same work.

## References

- H. Liu, M. Zaharia, P. Abbeel, *Ring Attention with Blockwise Transformers for Near-Infinite Context*, 2023, [arXiv:2310.01889](https://arxiv.org/abs/2310.01889).
- M. Milakov, N. Gimelshein, *Online normalizer calculation for softmax*, 2018, [arXiv:1805.02867](https://arxiv.org/abs/1805.02867).
- PyTorch: [`torch.distributed.batch_isend_irecv`](https://pytorch.org/docs/stable/distributed.html#torch.distributed.batch_isend_irecv) and [`scaled_dot_product_attention`](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html).
"""
