# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 18 · Context and expert parallelism, on a 3-D mesh

Notebook 17 split each layer's weights (tensor parallelism) and the tokens between the layers (sequence parallelism). Two things stay whole on every rank: the sequence inside attention, and the experts of a mixture-of-experts layer. A team training a current model splits them too: long context is handled with context parallelism, and mixture-of-experts models need expert parallelism and its all-to-all. Then the dimensions are combined on one mesh.

Every parallel version here runs on CPU processes over gloo, uses notebook 16's transformer, and is checked against one process running the same model on the same data, forward and backward. Every one counts the bytes each rank sends per step and compares them with a formula.

By the end you will be able to:
- write ring attention (key/value blocks passed around a ring, partial results merged with the log-sum-exp rule), check it forward and backward against full causal attention, balance its causal work with the zig-zag split and hide its transfers behind its compute;
- compare it with the all-gather of keys and values (PyTorch's default, Llama 3's choice) and Ulysses' all-to-all over heads, bytes included, and see how PyTorch's `context_parallel` switches between them;
- route tokens to experts (top-k, capacity, dropped tokens), dispatch and combine them across ranks with `all_to_all_single`, and use the auxiliary loss against load imbalance;
- combine three dimensions on a `DeviceMesh` of 8 processes, say which collective runs on which group, with how many bytes, and catch a gradient-scale bug that the losses under Adam do not show;
- pick the dimension for a problem (section 4's table).

This notebook assumes: notebook 09 (the collectives and their bytes), 15 §2 (`DeviceMesh`, DTensor), 16 (the transformer, attention's log-sum-exp merge) and 17 (tensor parallelism, for the mesh). No GPU: every run is CPU processes on gloo, launched with `course_lib.launch.run_ranks`, one launch per section.
"""

# %% slideshow={"slide_type": "-"}
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from course_lib.context_parallel import contiguous_layout, ring_work, zigzag_layout
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.launch import free_port, run_ranks
from course_lib.moe import MoE
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)  # steady on a shared machine; the launched processes run one thread each too
os.makedirs("_runs/n18", exist_ok=True)  # this notebook's worker scripts (git ignores _runs)
sys.path.insert(0, os.path.abspath("_runs/n18"))
notebook_start = time.perf_counter()
print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The model and the data, shared by every script, as in notebook 17: notebook 16's tiny decoder with an untied head, 2 sequences of 64 bytes of Python's documentation, float32. `reference` is the one process every parallel version is compared with.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n18/common.py
"""Notebook 18's shared pieces: the model, the data, the one-process reference."""
import torch

from course_lib.data import text_batch, text_corpus
from course_lib.transformer import Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=172, max_seq_len=128,
                           tie_embeddings=False)
BATCH, SEQ = 2, 64
TOL = 1e-5                                       # float32: every comparison is max |difference| < TOL


def batch(step=0, sequences=BATCH, seq_len=SEQ):
    """Seeded windows of the corpus: the same on every rank and every machine."""
    return text_batch(text_corpus().train, sequences, seq_len, generator=torch.Generator().manual_seed(step))


def reference(ids, targets):
    """One process, the whole model: its loss, with every gradient filled in."""
    model = Transformer(CONFIG, seed=0)
    loss = model.loss(ids, targets)
    loss.backward()
    return model, loss.detach()


def max_diff(a, b):
    return (a - b).abs().max().item()


# %% slideshow={"slide_type": "fragment"}
from common import BATCH, CONFIG, SEQ, TOL  # noqa: E402

print(CONFIG.describe())
print(f"data: {BATCH} sequences x {SEQ} tokens; tolerance of every comparison: max |difference| < {TOL:g}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Context parallelism: the ring, the all-gather and Ulysses

Sequence parallelism (notebook 17 §2) splits the tokens only *between* the parallel regions; attention itself still sees every token on every rank. For a context of a million tokens that is not possible: the keys and values of one layer no longer fit. Context parallelism splits the sequence **through** attention: each rank keeps the queries, keys and values of its slice of the positions. A query needs every key, so the key/value blocks travel: in ring attention (Liu et al., 2023) each rank passes its current key/value block to the next rank and receives one from the previous, `n - 1` times. At each step it computes its queries' attention over the block it holds, with global positions for the causal mask, and folds it into its running result with notebook 16 §5's log-sum-exp merge (`course_lib.attention.merge_attention`): partial softmaxes over disjoint key blocks combine exactly.

Backward passes the blocks around once more, with their gradient accumulators travelling alongside, and recomputes each block's probabilities from the saved log-sum-exp (FlashAttention-2's backward, notebook 16 §5); at the end the accumulators take one last hop home.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n18/ring.py
"""Ring attention by hand (forward, overlapped or not), the library's versions (forward and backward), against full
attention; section 1's job."""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import TOL, max_diff
from course_lib.attention import attention_block, merge_attention
from course_lib.context_parallel import (contiguous_layout, ring_attention, ring_attention_bytes, shard_sequence,
                                         zigzag_layout)
from course_lib.context_parallel_variants import allgather_attention, cp_attention_bytes, ulysses_attention
from course_lib.simulated_compute import Timeline, delay, hidden_seconds
from course_lib.tensor_parallel import CommCounter
from cp_variants import allgather_forward, ulysses_forward   # the next cell's file

SENT, WAITED = {"bytes": 0}, {"s": 0.0}
LINK_MS = 20                                         # the simulated link: one K/V exchange takes 20 ms


def post_right(tensors, into, sim=None):
    """Post the sends to the next rank and the receives (into `into`) from the previous one; returns wait()."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % n) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, (rank - 1) % n) for r in into]
    works, posted = dist.batch_isend_irecv(ops), sim[2].now() if sim else 0.0
    SENT["bytes"] += sum(t.numel() * t.element_size() for t in tensors)

    def wait():
        t0 = time.perf_counter()
        for work in works:
            work.wait()
        if sim:                                     # the simulated link: done link_ms after posting
            time.sleep(max(0.0, posted + sim[1] / 1000 - sim[2].now()))
            sim[2].add("comm", "K/V", posted, posted + sim[1] / 1000)
        WAITED["s"] += time.perf_counter() - t0
        return into
    return wait


def ring_forward(q, k, v, layout, overlap=False, sim=None):
    """This rank's queries against every key/value block, the blocks passed around the ring; returns (out, work).
    overlap: post the next block's exchange before computing on this one. sim = (compute_ms, link_ms, timeline)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"))
    work, spare = [], [[torch.empty_like(k), torch.empty_like(v)] for _ in range(2)]   # two K/V buffers
    for step in range(n):
        if step < n - 1:                            # receive into the buffer not in use; k, v are being sent
            wait = post_right([k, v], spare[step % 2], sim)
            if not overlap:
                k_next, v_next = wait()             # the compute below waits for the whole transfer
        source = (rank - step) % n                  # whose block this rank holds at this step
        done, q_off = 0, 0
        for q_start, q_len in layout[rank]:
            k_off = 0
            for k_start, k_len in layout[source]:
                if k_start <= q_start + q_len - 1:  # otherwise the causal mask hides the whole chunk pair
                    qs, ks = slice(q_off, q_off + q_len), slice(k_off, k_off + k_len)
                    part = attention_block(q[..., qs, :], k[..., ks, :], v[..., ks, :], causal=True,
                                           q_start=q_start, k_start=k_start)
                    out[..., qs, :], lse[..., qs] = merge_attention(out[..., qs, :], lse[..., qs], *part)
                    done += q_len * k_len
                k_off += k_len
            q_off += q_len
        if sim:
            delay(q, sim[0], 0, sim[2], f"block {step}")  # the block's attention, lasting compute_ms (notebook 10 §2)
        work.append(done)
        if step < n - 1:
            k, v = wait() if overlap else (k_next, v_next)
    return out, work


def section1(rank, n, batch=1, heads=4, seq=128, head_dim=16):
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, seq, head_dim, generator=g) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    full = F.scaled_dot_product_attention(*leaves, is_causal=True)
    full.backward(grad)
    results = {}
    for name, layout in (("contiguous", contiguous_layout(seq, n)), ("zig-zag", zigzag_layout(seq, n))):
        local = [shard_sequence(t, layout, rank, 2) for t in (q, k, v)]
        SENT["bytes"] = 0
        out, work = ring_forward(*local, layout)
        hand_sent = SENT["bytes"]
        mine = [t.clone().requires_grad_() for t in local]
        with CommCounter() as counter:
            lib_out = ring_attention(*mine, layout=layout)
            lib_out.backward(shard_sequence(grad, layout, rank, 2))
        results[name] = {
            "hand forward": max_diff(out, shard_sequence(full, layout, rank, 2)),
            "library forward": max_diff(lib_out, shard_sequence(full, layout, rank, 2)),
            "library backward": max(max_diff(a.grad, shard_sequence(b.grad, layout, rank, 2)) for a, b in zip(mine, leaves)),
            "work": work, "hand sent": hand_sent, "library sent": counter.sent(),
            "formula forward": ring_attention_bytes(batch, heads, seq, head_dim, n, backward=False),
            "formula step": ring_attention_bytes(batch, heads, seq, head_dim, n),
            "positions": [list(c) for c in layout[rank]],
        }
    layout = zigzag_layout(seq, n)                  # the other ways, and the overlapped ring, on the zig-zag split
    local, variants = [shard_sequence(t, layout, rank, 2) for t in (q, k, v)], {}
    hand = {"ring": ring_forward(*local, layout)[0], "ring overlapped": ring_forward(*local, layout, True)[0],
            "allgather": allgather_forward(*local, layout), "ulysses": ulysses_forward(*local, layout)}
    for name, fn in (("ring", ring_attention), ("ring overlapped", ring_attention),
                     ("allgather", allgather_attention), ("ulysses", ulysses_attention)):
        mine = [t.clone().requires_grad_() for t in local]
        with CommCounter() as counter:
            out = fn(*mine, layout=layout, **({"overlap": True} if name == "ring overlapped" else {}))
            out.backward(shard_sequence(grad, layout, rank, 2))
        variants[name] = {
            "error": max(max_diff(out, shard_sequence(full, layout, rank, 2)),
                         *(max_diff(a.grad, shard_sequence(b.grad, layout, rank, 2)) for a, b in zip(mine, leaves))),
            "hand = library": torch.equal(hand[name], out), "values": [out.detach()] + [t.grad for t in mine],
            "sent": counter.sent(), "formula": cp_attention_bytes(name.split()[0], batch, heads, seq, head_dim, n)}
    same = [torch.equal(a, b) for a, b in zip(variants["ring"].pop("values"), variants["ring overlapped"].pop("values"))]
    for name in ("allgather", "ulysses"):
        del variants[name]["values"]
    timing = {}
    for compute_ms in (30, 10):                     # a block's compute against a link of LINK_MS
        for overlap in (False, True):
            timeline = Timeline(rank)
            dist.barrier()
            timeline.reset()
            WAITED["s"] = 0.0
            ring_forward(*local, layout, overlap, (compute_ms, LINK_MS, timeline))
            timing[compute_ms, overlap] = (timeline.now(), WAITED["s"], hidden_seconds(timeline.spans))
    return {"results": results, "tol": TOL, "shape": (batch, heads, seq, head_dim), "variants": variants,
            "overlapped = plain": torch.equal(hand["ring"], hand["ring overlapped"]) and all(same), "timing": timing}


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Two other ways: all-gather, and Ulysses' all-to-all over heads

The ring is one of three exchanges in use. **All-gather** (Llama 3's choice): every rank gathers every key and value block at once (put back in position order), and its queries attend to the whole sequence with the causal mask by global position; backward reduce-scatters the keys' and values' gradients to their owners. Llama 3 chose it because the keys and values are small: with grouped-query attention they have 8 heads against 32 query heads in the 8B model, so gathering them costs a fraction of the queries, and a gathered key tensor takes any mask, such as the mask between documents (Llama Team, 2024, the paper's subsection 3.3.2, *Context parallelism*). **Ulysses** (Jacobs et al., 2023) re-splits instead: an all-to-all turns this rank's positions of *every* head into *every* position of `heads / n` heads, plain causal attention runs on those heads unsplit, and a second all-to-all turns the output back. Both, by hand and forward only; the library's versions (`course_lib.context_parallel_variants`, used later) add the backward:
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n18/cp_variants.py
"""All-gather and Ulysses attention by hand (forward): section 1's other two ways."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.context_parallel import shard_sequence, unshard_sequence
from course_lib.counted_collectives import all_gather, all_to_all


def allgather_forward(q, k, v, layout):
    """Gather every rank's keys and values (in position order); this rank's queries attend to all of them."""
    n, rank = dist.get_world_size(), dist.get_rank()
    k_all, v_all = (unshard_sequence(list(all_gather(t, 2).chunk(n, 2)), layout, 2) for t in (k, v))
    q_pos = torch.cat([torch.arange(start, start + length) for start, length in layout[rank]])
    causal = q_pos[:, None] >= torch.arange(k_all.shape[2])[None, :]        # by global position
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=causal)


def ulysses_forward(q, k, v, layout):
    """All-to-all: this rank's positions of every head -> every position of heads/n; attention; all-to-all back."""
    n = dist.get_world_size()

    def to_heads(x):
        b, h, s_local, d = x.shape
        parts = x.reshape(b, n, h // n, s_local, d).movedim(1, 0).contiguous()  # [j]: the heads rank j will own
        return unshard_sequence(list(all_to_all(parts, [1] * n, [1] * n)), layout, 2)  # [j] came from rank j

    out = F.scaled_dot_product_attention(*map(to_heads, (q, k, v)), is_causal=True)
    parts = torch.stack([shard_sequence(out, layout, r, 2) for r in range(n)])  # [j]: rank j's positions
    return all_to_all(parts, [1] * n, [1] * n).movedim(0, 1).flatten(1, 2)      # [j]: head group j, back in place


# %% slideshow={"slide_type": "subslide"}
t0 = time.perf_counter()
cp_runs = run_ranks("_runs/n18/ring.py:section1", nprocs=4, timeout=240, echo="none")
print(f"4 processes, every rank exit code 0 (~{time.perf_counter() - t0:.0f} s)")
b_, h_, s_, d_ = cp_runs[0]["shape"]
print(f"q, k, v: batch {b_}, {h_} heads, {s_} positions, head_dim {d_}; causal")
for name in ("contiguous", "zig-zag"):
    worst = max(max(res["results"][name][k] for k in ("hand forward", "library forward", "library backward")) for res in cp_runs)
    print(f"{name:<10}: ring forward (by hand and library) and backward (library) equal full attention on all 4 ranks "
          f"(< {TOL:g}): {worst < TOL}")
    assert worst < TOL
one = cp_runs[0]["results"]["contiguous"]
block_bytes = b_ * h_ * (s_ // 4) * d_ * 4
print(f"\nbytes one rank sends per call: forward, counted by hand {one['hand sent']:,}, formula 2 (n-1) B = "
      f"{one['formula forward']:,} with B = {block_bytes:,} (one key or value block)")
print(f"forward + backward, counted (library) {one['library sent']:,}, formula 2 (n-1) B + (4n - 2) B = {one['formula step']:,}")
assert all(res["results"][n_]["hand sent"] == one["formula forward"] for res in cp_runs for n_ in ("contiguous", "zig-zag"))
assert all(res["results"][n_]["library sent"] == one["formula step"] for res in cp_runs for n_ in ("contiguous", "zig-zag"))

# %% slideshow={"slide_type": "subslide"}
print("zig-zag split, 4 ranks; bytes one rank sends per attention call, forward + backward (counted = formula):")
for name, formula in (("ring", "2 (n-1) B + (4n-2) B"), ("allgather", "all-gather 2 (n-1) B + reduce-scatter 2 (n-1) B"),
                      ("ulysses", "(n-1)/n (2 B + 2 B) forward, the same backward")):
    v_ = [res["variants"][name] for res in cp_runs]
    assert all(x["error"] < TOL and x["hand = library"] and x["sent"] == x["formula"] for x in v_)
    print(f"  {name:<9} = full attention (< {TOL:g}), by hand = library: True; {v_[0]['sent']:>7,} B = {formula}")
assert all(res["variants"]["ring overlapped"]["sent"] == res["variants"]["ring"]["sent"] for res in cp_runs)
from course_lib.context_parallel_variants import cp_attention_bytes  # noqa: E402
from course_lib.transformer_config import PRESETS  # noqa: E402

L3 = PRESETS["llama3-8b"]
print(f"\nLlama 3 8B ({L3.n_heads} query heads, {L3.kv_heads} key/value heads, head_dim {L3.head_dim}), 131,072 tokens, "
      "bf16: MiB one rank sends per attention layer, forward + backward")
for n_ in (8, 16):
    row = {v: cp_attention_bytes(v, 1, L3.n_heads, 131072, L3.head_dim, n_, kv_heads=L3.kv_heads, bytes_per_element=2)
           for v in ("ring", "allgather", "ulysses") if v != "ulysses" or L3.kv_heads % n_ == 0}
    print(f"  {n_:>2} ranks: " + ", ".join(f"{v} {b / 2**20:,.0f}" for v, b in row.items()) + f"; fewest: "
          f"{min(row, key=row.get)}" + ("" if "ulysses" in row else f" (Ulysses: {n_} ranks > {L3.kv_heads} heads)"))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The ring's forward and the all-gather send the same bytes, `2 (n-1)` key/value slices; backward the ring sends more (the accumulators travel with the blocks), and Ulysses sends least as `n` grows: each all-to-all keeps `1/n` at home and sends every other byte once. Bytes are not the whole choice:

- **ring**: any `n`, memory for two blocks, and each transfer can hide behind a block's compute (below); `n - 1` steps one after the other.
- **all-gather**: one collective and any mask, but every rank holds the whole sequence's keys and values for the layer: cheap when grouped-query attention makes them small (above, the fewest bytes at 16 ranks).
- **Ulysses**: the fewest bytes at 8 ranks and the attention kernel unchanged (whole sequences, fewer heads), but each all-to-all reaches every rank (fast inside a node's NVLink, slow across nodes), and `n` must divide the key/value heads: at 16 ranks Llama 3 8B's cannot split, and tensor parallelism, which splits heads too, shares the same heads.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Balancing the causal mask: the zig-zag split

With a causal mask, a query sees only the keys before it. In the contiguous split the rank with the first slice of positions has work only at the first step (its own block); every later block comes from positions after its queries, and it skips it. The rank with the last slice works at every step. The ring is synchronous (a step ends when the slowest rank has its next block), so the step time is set by the busiest rank.

The zig-zag split (used by Llama 3's context parallelism and by ring-flash-attention) cuts the sequence into `2n` chunks and gives rank `r` chunks `r` and `2n - 1 - r`: an early one and a late one. Below, the query-key pairs each rank computed at each of the 4 ring steps, as counted inside the hand-written loop, next to `course_lib.context_parallel.ring_work`, which counts the same from the layout alone.
"""

# %% slideshow={"slide_type": "fragment"}
for name, layout_fn in (("contiguous", contiguous_layout), ("zig-zag", zigzag_layout)):
    counted = [res["results"][name]["work"] for res in cp_runs]
    assert counted == ring_work(layout_fn(s_, 4))
    per_rank = [sum(w) for w in counted]
    critical = sum(max(col) for col in zip(*counted))              # each step lasts as long as its busiest rank
    print(f"{name}: positions of rank 0 {cp_runs[0]['results'][name]['positions']}")
    for rank, w in enumerate(counted):
        print(f"  rank {rank}: pairs per step {w}, total {sum(w):>6,}")
    print(f"  busiest / least busy rank: {max(per_rank) / min(per_rank):.2f}; steps' critical path {critical:,} pairs "
          f"for {sum(per_rank) // 4:,} per rank on average (ratio {critical / (sum(per_rank) / 4):.2f})")
contig = ring_work(contiguous_layout(s_, 4))
zig = ring_work(zigzag_layout(s_, 4))
crit_c, crit_z = (sum(max(col) for col in zip(*w)) for w in (contig, zig))
print(f"critical path, zig-zag / contiguous: {crit_z / crit_c:.2f} (shorter)")
assert crit_z < crit_c and len({sum(w) for w in zig}) == 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
In the contiguous split the last rank does 4 times the work of the first (the ratio above), and at every step some rank waits. With zig-zag every rank does the same work, and the critical path falls to the average. A partly masked chunk pair is counted whole, as a kernel computes a whole tile; that is why the zig-zag total per rank is slightly above half of the contiguous last rank's.

### Hiding the transfer: post the next exchange, then compute

`ring_forward` above waits for each exchange before it computes (`overlap=False`): a step lasts the block's compute *plus* its transfer. With `overlap=True` it posts the next block's sends and receives first, computes on the block it holds, and only then waits. The block it receives needs a buffer of its own while the current one is being sent and read: two spare key/value buffers, used in turn. The arithmetic is the same, so the result is the same bit for bit (and so for the library's `ring_attention(..., overlap=True)`, forward and backward; backward can prefetch only the keys and values, the accumulators are ready after the compute).

To see the time it hides, `ring_forward` ran again on notebook 10 §2's simulated device: each block's compute lasts `compute_ms` (`course_lib.simulated_compute.delay`, a sleep that holds no core), and each exchange completes `LINK_MS` after it was posted, as over a link of that speed. Overlap hides `min(compute, transfer)` per step; when the compute is the shorter, `transfer - compute` stays exposed:
"""

# %% slideshow={"slide_type": "fragment"}
link_ms, steps = 20, 3                              # ring.py's LINK_MS; 4 ranks: 3 exchanges per forward
assert all(res["overlapped = plain"] for res in cp_runs)
print("overlapped ring = plain ring, bit for bit (by hand forward, library forward and backward), the same bytes: True")
for compute_ms in (30, 10):
    plain, over = ([res["timing"][compute_ms, o] for res in cp_runs] for o in (False, True))
    wall = [max(r[0] for r in runs) for runs in (plain, over)]
    exposed = max(r[1] for r in over) / steps * 1000
    hidden = min(r[2] for r in over) / steps * 1000
    expected = max(0, link_ms - compute_ms)
    print(f"compute {compute_ms} ms per block, transfer {link_ms} ms: forward ~{wall[0] * 1000:.0f} ms plain, "
          f"~{wall[1] * 1000:.0f} ms overlapped; per step hidden ~{hidden:.1f} ms (min = {min(compute_ms, link_ms)}), "
          f"exposed ~{exposed:.1f} ms (max(0, transfer - compute) = {expected})")
    assert abs(exposed - expected) < 0.4 * link_ms and wall[1] < wall[0]
    assert hidden > 0.5 * min(compute_ms, link_ms)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The condition is one block's compute ≥ its transfer. The compute of a block grows with the square of the positions per rank (`(s/n)²` query-key pairs) and the transfer only linearly (`s/n` keys and values), so a long enough sequence always hides it; short sequences over slow links, or many ranks, do not. The all-gather variant has one transfer to hide, behind the local block only.

### PyTorch's `context_parallel`

PyTorch has the same idea as an experimental API: `torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...)` shards the listed tensors along the sequence in place (load balancing included) and, inside the context, replaces `F.scaled_dot_product_attention` with its context-parallel version. Its default exchange is the **all-gather**: its module `torch/distributed/tensor/experimental/_context_parallel/_attention.py` sets `rotate_method = ALL_GATHER` in `_ContextParallelOptions`, and `_create_rotater` builds an `_AllGatherRotater` from it. `set_rotate_method("alltoall")`, in the private module `torch.distributed.tensor.experimental._attention` (no public replacement in 2.13), switches to the ring-style exchange, a `permute_tensor` to the next rank at each step. Either way it posts the exchange before computing the block (as above), and the backward passes the gradients of keys and values around the ring. The cell below reads these lines from the installed source:
"""

# %% slideshow={"slide_type": "fragment"}
import inspect  # noqa: E402

from torch.distributed.tensor.experimental import context_parallel  # noqa: E402

cp_source = inspect.getsourcefile(inspect.unwrap(context_parallel))  # the function under its decorator
cp_lines = open(cp_source).read().splitlines()
print(cp_source.replace(os.sep, "/").split("site-packages/")[-1])
for needle in ("rotate_method: _RotateMethod =", "dkv_rotater = _create_rotater", 'if rotate_method == "alltoall"'):
    found = [(i + 1, ln.strip()) for i, ln in enumerate(cp_lines) if needle in ln]
    assert found, needle
    print(f"  line {found[0][0]}: {found[0][1]}")
assert "ALL_GATHER" in next(ln for ln in cp_lines if "rotate_method: _RotateMethod =" in ln)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
It dispatches on the SDPA *kernel*, and only the CUDA kernels (flash, memory-efficient, cuDNN) have a context-parallel version; on the CPU it refuses:
"""

# %% slideshow={"slide_type": "fragment"}
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("cp",))
qc, kc, vc = (torch.randn(1, 4, 128, 16) for _ in range(3))
with expect_error(NotImplementedError, match="does not have a sharding strategy"):
    with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2]):
        F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
del mesh
dist.destroy_process_group()

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("context_parallel's ring attention with CUDA SDPA, against full attention", count=2, capability=(8, 0)):
    with open("_runs/n18/cp_gpu.py", "w") as fh:
        fh.write('''
import torch, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard, set_rotate_method

def run(rank, n):
    mesh = init_device_mesh("cuda", (n,), mesh_dim_names=("cp",))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    diffs = {}
    for method in ("allgather", "alltoall"):        # private: the all-gather (default) or the ring's exchange
        set_rotate_method(method)
        qs, ks, vs = (t.clone() for t in (q, k, v))   # sharded in place
        with context_parallel(mesh, buffers=[qs, ks, vs], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        (out,) = context_parallel_unshard(mesh, [out], [2])
        diffs[method] = (out.float() - full.float()).abs().max().item()
    return diffs
''')
    diffs = run_ranks("_runs/n18/cp_gpu.py:run", nprocs=2, device="cuda", backend="nccl", timeout=300)
    for method in ("allgather", "alltoall"):
        print(f"context_parallel on 2 GPUs, {method}, against full attention, bf16: largest difference "
              f"~{max(d[method] for d in diffs):.3f}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Expert parallelism

A mixture-of-experts (MoE) layer replaces a block's MLP by `E` smaller MLPs, the experts, and a **router**: a linear layer that scores each token against each expert. Each token goes to its `k` best experts (top-k), and its output is their outputs weighted by the router's probabilities; so a token costs `k` experts' FLOPs while the layer holds `E` experts' parameters. An expert accepts at most a **capacity** of `ceil(capacity_factor x tokens x k / E)` tokens per batch; assignments past that are **dropped** (the token keeps only its residual path for that slot). `course_lib.moe.route` makes these decisions; first choices are served before second choices.

With **expert parallelism** each rank holds `E / n` experts and its own tokens. After routing, each rank sends every kept assignment's token row to the rank of its expert (**dispatch**), the experts run on the rows they received, and the results go back to the tokens' ranks (**combine**). Both moves are an **all-to-all**: every rank sends a different amount to every other rank. `dist.all_to_all_single` takes the split sizes: how many rows go to each rank, and how many come from each; the receivers learn these counts from a first, small all-to-all of the per-expert counts.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n18/ep.py
"""Expert parallelism by hand: dispatch and combine with all_to_all_single; section 2's job."""
import torch
import torch.distributed as dist

from common import TOL, max_diff
from course_lib.moe import MoE, expert_parallel_bytes, expert_parallel_forward, route
from course_lib.tensor_parallel import CommCounter

SENT = {"bytes": 0}
D_MODEL, D_FF, EXPERTS, TOP_K, TOKENS = 64, 128, 4, 2, 128


def exchange(rows, send, recv):
    """all_to_all_single: send[r] rows to rank r, recv[r] rows from rank r."""
    out = torch.empty((sum(recv), *rows.shape[1:]), dtype=rows.dtype)
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send)
    SENT["bytes"] += (sum(send) - send[dist.get_rank()]) * rows[0].numel() * rows.element_size()
    return out


class AllToAll(torch.autograd.Function):        # backward: the same exchange, the other way
    @staticmethod
    def forward(ctx, rows, send, recv):
        ctx.send, ctx.recv = send, recv
        return exchange(rows, send, recv)

    @staticmethod
    def backward(ctx, grad):
        return exchange(grad, ctx.recv, ctx.send), None, None


def ep_forward(moe, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    per = moe.n_experts // n                                        # experts per rank: e lives on rank e // per
    r = route(moe.router(x), moe.top_k, moe.capacity_factor)
    token, slot = torch.nonzero(r.kept, as_tuple=True)              # the kept assignments
    expert = r.experts[token, slot]
    order = torch.argsort(expert, stable=True)                      # grouped by expert, so by destination rank
    token, slot, expert = token[order], slot[order], expert[order]
    per_expert = torch.bincount(expert, minlength=moe.n_experts)
    counts_in = exchange(per_expert.view(n, per), [1] * n, [1] * n)  # rows each rank sends to each of my experts
    send, recv = per_expert.view(n, per).sum(1).tolist(), counts_in.sum(1).tolist()
    rows = AllToAll.apply(x[token], send, recv)                     # dispatch
    which = torch.arange(per).repeat(n).repeat_interleave(counts_in.flatten())  # local expert of each row
    done = torch.zeros_like(rows)
    for j in range(per):
        idx = torch.nonzero(which == j, as_tuple=True)[0]
        done = done.index_copy(0, idx, moe.experts[rank * per + j](rows[idx]))
    back = AllToAll.apply(done, recv, send)                         # combine
    return torch.zeros_like(x).index_add(0, token, back * r.weights[token, slot].unsqueeze(-1)), r, send, recv


def section2(rank, n):
    xs = torch.randn(n, TOKENS, D_MODEL, generator=torch.Generator().manual_seed(0))   # every rank's tokens
    ref = MoE(D_MODEL, D_FF, EXPERTS, TOP_K, capacity_factor=1.25, seed=0)
    ref_x = xs.clone().requires_grad_()
    sum((ref(ref_x[s]) ** 2).mean() for s in range(n)).backward()   # one process: every rank's tokens in turn
    moe = MoE(D_MODEL, D_FF, EXPERTS, TOP_K, capacity_factor=1.25, seed=0)
    x = xs[rank].clone().requires_grad_()
    SENT["bytes"] = 0
    y, routing, send, recv = ep_forward(moe, x)
    (y ** 2).mean().backward()
    dist.all_reduce(moe.router.weight.grad)                         # the router is replicated: sum its gradients
    lib = MoE(D_MODEL, D_FF, EXPERTS, TOP_K, capacity_factor=1.25, seed=0)
    lx = xs[rank].clone().requires_grad_()
    with CommCounter() as counter:
        ly = expert_parallel_forward(lib, lx)
        (ly ** 2).mean().backward()
    per = EXPERTS // n
    mine = range(rank * per, (rank + 1) * per)
    ref_y = MoE(D_MODEL, D_FF, EXPERTS, TOP_K, capacity_factor=1.25, seed=0)(xs[rank])
    expert_diff = max(max_diff(p.grad, q.grad) for e in mine
                      for p, q in zip(moe.experts[e].parameters(), ref.experts[e].parameters()))
    return {
        "forward": max_diff(y, ref_y), "library": max_diff(ly, y), "input grads": max_diff(x.grad, ref_x.grad[rank]),
        "expert grads": expert_diff, "router grads": max_diff(moe.router.weight.grad, ref.router.weight.grad),
        "send": send, "recv": recv, "wanted": routing.wanted.tolist(), "load": routing.load.tolist(),
        "capacity": routing.capacity, "dropped": routing.dropped, "hand sent": SENT["bytes"],
        "library sent": counter.sent(), "library table": counter.table(),
        "formula": expert_parallel_bytes(send, recv, rank, D_MODEL * 4, n_experts=EXPERTS),
        "others' experts untouched": all(p.grad is None for e in range(EXPERTS) if e not in mine
                                         for p in moe.experts[e].parameters()),
    }


# %% slideshow={"slide_type": "subslide"}
t0 = time.perf_counter()
ep_runs = run_ranks("_runs/n18/ep.py:section2", nprocs=2, timeout=240, echo="none")
print(f"2 processes, every rank exit code 0 (~{time.perf_counter() - t0:.0f} s)")
for res in ep_runs:
    assert max(res[k] for k in ("forward", "library", "input grads", "expert grads", "router grads")) < TOL
    assert res["others' experts untouched"]
print(f"expert parallel = one process (< {TOL:g}): outputs, input gradients, each rank's experts' gradients, the router's")
print(f"4 experts, top-2, capacity {ep_runs[0]['capacity']} per expert per rank (capacity factor 1.25, 128 tokens per rank)")
for rank, res in enumerate(ep_runs):
    print(f"rank {rank}: routed per expert {res['wanted']}, kept {res['load']}, dropped {res['dropped']};"
          f" rows sent to ranks {res['send']}, received from ranks {res['recv']}")
for rank, res in enumerate(ep_runs):
    print(f"rank {rank} bytes per step: by hand {res['hand sent']:,}, library {res['library sent']:,}, formula {res['formula']:,}")
    assert res["hand sent"] == res["library sent"] == res["formula"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The formula, per rank and step: the counts (`E - E/n` int64 numbers to the other ranks), then the rows it dispatches to other ranks and the rows it sends back at combine (those it received), each `d_model` floats; backward repeats both exchanges in reverse. The row for the collectives table of notebook 09: an all-to-all sends each rank's `n` pieces to their `n` ranks, a rank sending `sum of its pieces for others` bytes, `(n-1)/n` of its buffer when the split is even, as the all-gather; but here the split is whatever the router decided.

### Load imbalance, and the auxiliary loss

Nothing in the task loss asks the router to spread the tokens. A router that sends most tokens to a few experts overloads their ranks (the all-to-all and the experts' compute wait for the busiest one) and drops the assignments past capacity. Switch Transformers (Fedus et al., 2021) add an auxiliary loss `E x sum over e of f_e P_e`, where `f_e` is the fraction of assignments routed to expert `e` and `P_e` its mean router probability: it equals 1 when both are even, and more when the router concentrates. Below, one process trains the layer on a small regression task, with and without the auxiliary loss (coefficient 0.1), from the same start.
"""

# %% slideshow={"slide_type": "fragment"}
gen = torch.Generator().manual_seed(1)
x_task = torch.randn(256, 16, generator=gen) + 1.0          # inputs with a common direction: an easy one to collapse onto
y_task = torch.tanh(x_task @ torch.randn(16, 16, generator=gen))
AUX, STEPS = 0.1, 80
runs = {}
for coef in tqdm((0.0, AUX), desc="training with and without the auxiliary loss"):
    layer = MoE(16, 32, n_experts=4, top_k=2, capacity_factor=1.25, seed=0)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    layer(x_task)
    start = layer.last_routing
    for _ in range(STEPS):
        out = layer(x_task)
        loss = ((out - y_task) ** 2).mean() + coef * layer.last_routing.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        task = ((layer(x_task) - y_task) ** 2).mean().item()
    runs[coef] = (start, layer.last_routing, task)
start = runs[0.0][0]
print(f"at the start: routed per expert {start.wanted.tolist()}, max/mean {start.wanted.max().item() / start.wanted.float().mean().item():.2f}")
for coef, (_, end, task) in runs.items():
    imbalance = end.wanted.max().item() / end.wanted.float().mean().item()
    print(f"after {STEPS} steps, aux coefficient {coef}: max/mean load ~{imbalance:.2f}, dropped ~{end.dropped} of "
          f"{end.kept.numel()} assignments, aux loss ~{end.aux_loss.item():.2f}, task loss ~{task:.3f}")
imb = {c: e.wanted.max().item() / e.wanted.float().mean().item() for c, (_, e, _) in runs.items()}
assert imb[0.0] > 1.5 and imb[AUX] < 1.2 and runs[AUX][1].dropped < runs[0.0][1].dropped

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Without the auxiliary loss, the router concentrates the tokens on some of the experts (max/mean load well above 1), and the capacity cut drops many assignments; the other experts' parameters are nearly idle. With it the load stays close to even and almost nothing is dropped; on this task the layer even fits better, because all four experts are used. The coefficient is a trade-off (Switch used 0.01); newer models also balance with a per-expert bias on the router's scores instead of a loss (DeepSeek-V3, Liu et al., 2024).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. A 3-D mesh: data × context × tensor parallelism on 8 processes

The dimensions compose. `init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))` arranges 8 processes in a cube; each named dimension has its own process group, of the ranks that differ only in that coordinate. One training step then uses all three:

- **tp**: the model is tensor-parallel over the `tp` group (`course_lib.tensor_parallel.parallelize_transformer_`, the twin of notebook 17 §1's);
- **cp**: each attention's core is replaced by ring attention over the `cp` group, with the zig-zag layout, and the rotary positions are those of the rank's chunks;
- **dp**: each `dp` rank trains on its own sequences;
- the weights are replicated across `dp` and `cp` (each saw different tokens), so after backward their gradients are all-reduced over `cp` and then over `dp`, and divided by 4.

Three Adam steps against one process training on the whole batch (4 sequences of 64 tokens), with every collective counted per group by `CommCounter(tp=..., cp=..., dp=...)`.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n18/mesh.py
"""dp x cp x tp on 8 processes, three Adam steps, against one process; section 3's job."""
import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import course_lib.tensor_parallel as tp
from common import CONFIG, SEQ, TOL, batch, max_diff
from course_lib.context_parallel import ring_attention, shard_sequence, zigzag_layout
from course_lib.transformer import Transformer

STEPS, SEQUENCES, LR = 3, 4, 1e-3


def train(mesh, divisor):
    """Three Adam steps on the mesh, the replicated gradients summed over cp and dp and divided by `divisor`."""
    groups = {d: mesh.get_group(d) for d in ("dp", "cp", "tp")}
    coord = {d: mesh.get_local_rank(d) for d in ("dp", "cp", "tp")}
    layout = zigzag_layout(SEQ, 2)
    model = tp.parallelize_transformer_(Transformer(CONFIG, seed=0), groups["tp"])
    for layer in model.layers:                                     # attention proper: the ring over cp
        layer.attn.core = functools.partial(ring_attention, group=groups["cp"], layout=layout)
    positions = shard_sequence(torch.arange(SEQ).view(1, -1), layout, coord["cp"]).view(-1)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    ref = Transformer(CONFIG, seed=0)
    ref_params = dict(ref.named_parameters())             # the same tensors, updated in place
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    per_dp = SEQUENCES // 2
    losses, ref_losses = [], []
    for step in range(STEPS):
        ids, targets = batch(step, SEQUENCES)
        ref_opt.zero_grad()
        ref_loss = ref.loss(ids, targets)
        ref_loss.backward()
        ref_losses.append(ref_loss.item())
        rows = slice(coord["dp"] * per_dp, (coord["dp"] + 1) * per_dp)        # this dp rank's sequences
        ids_l, targets_l = (shard_sequence(t[rows], layout, coord["cp"]) for t in (ids, targets))  # its positions
        opt.zero_grad()
        with tp.CommCounter(**groups) as counter:
            loss = tp.tensor_parallel_loss(model, ids_l, targets_l, positions=positions)
            loss.backward()
            for p in model.parameters():                           # replicated over cp and dp: average
                tp.all_reduce(p.grad, groups["cp"])
                tp.all_reduce(p.grad, groups["dp"])
                p.grad /= divisor
        if step == 0:                                              # the first step's gradients, this rank's slices
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
            ref_grads = {k: tp.shard_of(k, ref_params[k].grad, coord["tp"], 2) for k in grads}
        opt.step()
        ref_opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole)                                     # (not counted: only to print the global loss)
        losses.append(whole.item() / 8)                            # the 2 tp ranks of a (dp, cp) pair hold the same
    return {
        "coord": coord, "losses": losses, "ref losses": ref_losses, "grads": grads, "ref grads": ref_grads,
        "params": max(max_diff(p, tp.shard_of(k, ref_params[k], coord["tp"], 2)) for k, p in model.named_parameters()),
        "held": sum(p.numel() for p in model.parameters()), "full": sum(p.numel() for p in ref.parameters()),
        "sequences": list(range(SEQUENCES))[rows], "positions": [list(c) for c in layout[coord["cp"]]],
        "table": counter.table(), "tokens": ids_l.numel(), "local heads": model.layers[0].attn.q_proj.weight.shape[0] // CONFIG.head_dim,
        "tol": TOL,
    }


def section3(rank, world):
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    out = train(mesh, divisor=4)                                   # 2 dp x 2 cp copies of each weight: divide by 4
    out["planted"] = train(mesh, divisor=2)                        # a planted bug: divided by the dp size only
    return out


# %% slideshow={"slide_type": "subslide"}
from course_lib.equivalence import compare_gradients  # noqa: E402

t0 = time.perf_counter()
mesh_runs = run_ranks("_runs/n18/mesh.py:section3", nprocs=8, timeout=300, echo="none")
print(f"8 processes, every rank exit code 0 (~{time.perf_counter() - t0:.0f} s)")
print("rank  (dp, cp, tp)  sequences  positions           parameters held")
for rank, res in enumerate(mesh_runs):
    c = res["coord"]
    print(f"{rank:>4}  ({c['dp']}, {c['cp']}, {c['tp']})      {str(res['sequences']):<9}  {str(res['positions']):<18}  "
          f"{res['held']:,} of {res['full']:,}")
for step, (mine, ref) in enumerate(zip(mesh_runs[0]["losses"], mesh_runs[0]["ref losses"])):
    print(f"step {step}: loss, 8 processes {mine:.4f}, one process {ref:.4f}")
assert all(abs(a - b) < TOL for res in mesh_runs for a, b in zip(res["losses"], res["ref losses"]))
assert max(res["params"] for res in mesh_runs) < TOL
print(f"after {len(mesh_runs[0]['losses'])} Adam steps every rank's parameters equal the one-process model's slice (< {TOL:g})")
matches = [compare_gradients(res["grads"], res["ref grads"], world_size=2) for res in mesh_runs]
print(f"first step, rank 0: {matches[0]}")
assert all(matches)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Why the first step's gradients and not only the losses: each weight is replicated over the 2 `cp` and 2 `dp` ranks, so its gradient is summed over 4 copies and must be divided by 4. The job ran a second time with a planted bug, dividing by 2 (the `dp` size only), so every gradient is twice one process's. Adam divides each step by the running root mean square of the gradients, so a constant factor cancels, except against its `eps` (`1e-8`): the losses still agree with one process within the tolerance, and the parameters move apart only where a gradient is not much larger than `eps`. The gradients are twice one process's, and the first step's comparison says so (its "world size" is the 2 `cp` ranks whose sum was never divided).
"""

# %% slideshow={"slide_type": "fragment"}
planted = [res["planted"] for res in mesh_runs]
loss_gap = max(abs(a - b) for res in planted for a, b in zip(res["losses"], res["ref losses"]))
param_gap = max(res["params"] for res in planted)
print(f"planted bug, after {len(planted[0]['losses'])} Adam steps: losses within ~{loss_gap:.1e} of one process's "
      f"(< {TOL:g}: the loss check passes); parameters within ~{param_gap:.1e}")
assert loss_gap < TOL
caught = [compare_gradients(res["grads"], res["ref grads"], world_size=2) for res in planted]
c = caught[0]  # every tensor is off by the same factor: which one rounds to the largest error varies by machine
print(f"first step, rank 0: gradients differ from one process's (relative error {c.max_rel_error:.3g}, tolerance "
      f"{c.tolerance:g}), norm ratio {c.norm_ratio:.4f}: {c.diagnosis}")
assert not any(caught) and all(abs(c.norm_ratio - 2) < 1e-3 for c in caught)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What each rank sent in the last step, by group, against the formulas of notebook 17 §1, the ring's of §1 above and notebook 09's ring all-reduce: on `tp`, notebook 17 §1's count for this rank's `2 x 32` tokens; on `cp`, the ring attention of each of the 2 layers (on the 2 local heads) and the all-reduce of the gradients of the parameters this rank holds; on `dp`, that all-reduce again.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.context_parallel import ring_attention_bytes  # noqa: E402
from course_lib.tensor_parallel import collective_bytes, tp_bytes_per_step  # noqa: E402

res = mesh_runs[0]
grad_bytes = res["held"] * 4
want = {
    "tp": sum(tp_bytes_per_step(CONFIG, res["tokens"], 2).values()),
    "cp": CONFIG.n_layers * ring_attention_bytes(2, res["local heads"], SEQ, CONFIG.head_dim, 2)
    + collective_bytes("all_reduce", grad_bytes, 2),
    "dp": collective_bytes("all_reduce", grad_bytes, 2),
}
print(f"{'group':<6}{'collective':<16}{'calls':>6}{'bytes':>11}")
for (op, group), (calls, sent) in res["table"].items():
    print(f"{group:<6}{op:<16}{calls:>6}{sent:>11,}")
for group, formula_bytes in want.items():
    counted = sum(sent for (op, g), (_, sent) in res["table"].items() if g == group)
    print(f"{group}: counted {counted:,} bytes, formula {formula_bytes:,}")
    assert all(sum(s for (o, g), (_, s) in r["table"].items() if g == group) == formula_bytes for r in mesh_runs)
print(f"notebook so far ~{time.perf_counter() - notebook_start:.0f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The table is the map of a real run at small scale: the per-layer, latency-critical collectives (tensor parallelism's all-reduces, the ring's point-to-point blocks) stay in the innermost groups, and the gradient all-reduce, once per step and overlappable with backward, runs on the outer group. On a cluster the mesh is laid out so that `tp` is inside a node (NVLink) and `dp` spans nodes; `cp` in between. Expert parallelism takes a dimension the same way (often sharing the ranks of `dp` or `cp`: the experts are split over ranks that otherwise hold copies), and pipeline parallelism (notebook 13) another.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Which dimension for which problem

<!-- BEGIN generated: facts-transformer-parallelism -->
| | tensor parallel | sequence parallel | context parallel | expert parallel |
|---|---|---|---|---|
| what is split | each layer's weight matrices | the tokens of the norm and dropout regions between tensor-parallel layers (with tensor parallelism) | the sequence, through attention: each rank keeps the queries, keys and values of its positions | the experts of mixture-of-experts layers; each rank routes its own tokens |
| communicated | activations inside every layer (all-reduce / all-gather) | tensor parallelism's all-reduces become reduce-scatter + all-gather along the sequence: the same bytes; plus an all-reduce of the norms' weight gradients | key/value blocks around a ring, point-to-point: `2 (n-1)` blocks forward, `4n - 2` backward per attention; or all-gathered (PyTorch's default), or two all-to-alls over heads (Ulysses); the gradients all-reduced over the group | two all-to-alls per MoE layer forward (dispatch, combine) and two backward, sizes set by the router |
| idle time | none, but communication on the critical path of every layer | as tensor parallelism | with a causal mask, uneven unless the sequence is split zig-zag; a ring's transfer hides behind a block's compute when posted first and the compute lasts at least as long | load imbalance: the busiest expert's rank sets the pace; capacity drops the excess |
| needs | very fast links: one node, NVLink | tensor parallelism (the same group, the same fast links) | a sequence long enough that one block's attention outweighs passing its keys and values | a balanced router (auxiliary loss or bias) and fast all-to-all |
| use when | single layers too big, or activations per layer; within a node | always with tensor parallelism: the norms' activations are otherwise replicated | long context: the activations of one sequence do not fit one device | mixture-of-experts models: more experts than fit one device |
| shown | notebook 13 §6 (one layer), notebook 17 §1 (a whole block) | notebook 17 §2 | notebook 18 §1 | notebook 18 §2 |
<!-- END generated -->
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- **Context parallelism** keeps each rank's queries and brings it every key and value: around a ring (merged by log-sum-exp; `2 (n-1)` blocks forward, `4n - 2` backward), all-gathered (the same forward bytes, the gradients reduce-scattered; Llama 3's choice, cheap under grouped-query attention) or re-split over heads by Ulysses' two all-to-alls (the fewest bytes, `n` limited by the key/value heads). All three equal full causal attention forward and backward, their counted bytes their formulas. Posting the next exchange before the block's compute hides the transfer when the compute lasts at least as long, and exposes `transfer - compute` per step otherwise. The zig-zag split evens the causal work per rank. PyTorch's `context_parallel` all-gathers by default (`set_rotate_method("alltoall")` gives the ring's exchange) and needs CUDA's SDPA kernels.
- **Expert parallelism** routes each token to its top-k experts, drops what exceeds an expert's capacity, dispatches the kept rows to their experts' ranks and combines them back with two `all_to_all_single` calls, equal to the one-process MoE; the auxiliary loss kept the load close to even where training without it collapsed onto some experts.
- The dimensions compose on a `DeviceMesh`: dp × cp × tp on 8 processes trained like one process, and each group carried its own collectives. Its first step's gradients equalled one process's; a planted bug that divided the replicated gradients by 2 instead of 4 passed the loss check under Adam and failed the gradient check, by a factor of 2.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `ring_forward_bytes(batch, heads, seq_len, head_dim, n, p)`: the bytes one rank sends in the forward pass of one ring-attention call on `n` ranks (`p` bytes per element, heads of key and value equal to the query's).
2. Write `a2a_send_counts(experts, kept, n_experts, n_ranks)`: the rows one rank sends to each rank at dispatch, given its routing (`experts` and `kept` of shape `(tokens, k)`, expert `e` on rank `e // (n_experts / n_ranks)`).
3. Write `ulysses_forward_bytes(batch, heads, kv_heads, seq_len, head_dim, n, p)`: the bytes one rank sends in Ulysses' forward pass (its all-to-alls of q, k, v and of the output), with `kv_heads` key/value heads.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.context_expert_parallelism import (  # noqa: E402
    check_a2a_send_counts, check_ring_forward_bytes, check_ulysses_forward_bytes,
)


def ring_forward_bytes(batch, heads, seq_len, head_dim, n, p):
    raise NotImplementedError  # your code here


print(check_ring_forward_bytes(ring_forward_bytes))


# %% slideshow={"slide_type": "-"}
def a2a_send_counts(experts, kept, n_experts, n_ranks):
    raise NotImplementedError  # your code here


print(check_a2a_send_counts(a2a_send_counts))


# %% slideshow={"slide_type": "-"}
def ulysses_forward_bytes(batch, heads, kv_heads, seq_len, head_dim, n, p):
    raise NotImplementedError  # your code here


print(check_ulysses_forward_bytes(ulysses_forward_bytes))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- H. Liu, M. Zaharia, P. Abbeel, *Ring Attention with Blockwise Transformers for Near-Infinite Context*, 2023, [arXiv:2310.01889](https://arxiv.org/abs/2310.01889); the zig-zag split and the all-gather of keys and values: Llama Team, *The Llama 3 Herd of Models*, 2024, [arXiv:2407.21783](https://arxiv.org/abs/2407.21783) (subsection 3.3.2, *Context parallelism*); S. A. Jacobs et al., *DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence Transformer Models*, 2023, [arXiv:2309.14509](https://arxiv.org/abs/2309.14509). PyTorch's exchange: `torch/distributed/tensor/experimental/_context_parallel/_attention.py` in torch 2.13 (`_ContextParallelOptions`, `_create_rotater`, `set_rotate_method`).
- N. Shazeer et al., *Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer*, 2017, [arXiv:1701.06538](https://arxiv.org/abs/1701.06538); D. Lepikhin et al., *GShard*, 2020, [arXiv:2006.16668](https://arxiv.org/abs/2006.16668); W. Fedus, B. Zoph, N. Shazeer, *Switch Transformers*, 2021, [arXiv:2101.03961](https://arxiv.org/abs/2101.03961) (capacity, the auxiliary loss); DeepSeek-AI, *DeepSeek-V3 Technical Report*, 2024, [arXiv:2412.19437](https://arxiv.org/abs/2412.19437) (bias-based balancing).
- Hugging Face, [*The Ultra-Scale Playbook: Training LLMs on GPU Clusters*](https://huggingface.co/spaces/nanotron/ultrascale-playbook), 2025; [picotron](https://github.com/huggingface/picotron).
- PyTorch docs and tutorials: [Context Parallel tutorial](https://pytorch.org/tutorials/prototype/context_parallel.html), [`all_to_all_single`](https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_to_all_single), [DeviceMesh](https://pytorch.org/tutorials/recipes/distributed_device_mesh.html).
"""
