# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 17 · Tensor and sequence parallelism: a transformer block split across ranks

Data parallelism and sharding (notebooks 09–15) split the *batch*. Tensor parallelism splits the *model's work on one batch*: the weight matrices of every layer, so that each rank computes part of each layer. Sequence parallelism completes it: the tokens between those layers (the norms, and dropout where a model has it) are split too, so no activation stays whole on every rank. Megatron-LM introduced both; every large run since uses them inside a node. Notebook 18 takes the other two dimensions of a transformer (the sequence through attention, and the experts), then combines data, context and tensor parallelism on a 3-D mesh.

Every parallel version here runs on CPU processes over gloo, uses notebook 16's transformer, and is checked against one process running the same model on the same data, forward and backward. Every one counts the bytes each rank sends per step and compares them with a formula.

By the end you will be able to:
- split a transformer block across ranks by hand (heads and MLP columns, column- then row-parallel), write Megatron's conjugate operators `f` and `g` as `autograd.Function`s, and shard the embedding and the loss over the vocabulary; then do the same with `parallelize_module`;
- count the bytes tensor parallelism sends per step, and say why `parallelize_module` runs more all-reduces than the hand version for the same gradients;
- turn tensor parallelism into sequence parallelism (reduce-scatter plus all-gather instead of all-reduce, the same bytes) and count the activation bytes per rank it saves.

This notebook assumes: notebook 09 (the collectives and their bytes), 13 §6 (tensor parallelism of one layer), 15 §2 (`DeviceMesh`, DTensor) and 16 (the transformer and its activation memory formula). No GPU: every run is CPU processes on gloo, launched with `course_lib.launch.run_ranks`, one launch per section.
"""

# %% slideshow={"slide_type": "-"}
import os
import sys
import time

import torch
import torch.distributed as dist

from course_lib.launch import run_ranks
from course_lib.seeding import seed_everything
from course_lib.tensor_parallel import COLUMN_PARALLEL, ROW_PARALLEL

seed_everything(0)
torch.set_num_threads(1)  # steady on a shared machine; the launched processes run one thread each too
os.makedirs("_runs/n17", exist_ok=True)  # this notebook's worker scripts (git ignores _runs)
sys.path.insert(0, os.path.abspath("_runs/n17"))
notebook_start = time.perf_counter()
print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The model and the data, shared by every script: notebook 16's tiny decoder with an untied head (a tied head is one matrix used twice; sharding it once and using it in both places works, but keeps the code longer), 2 sequences of 64 bytes of Python's documentation, float32. `reference` is the one process every parallel version is compared with.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n17/common.py
"""Notebook 17's shared pieces: the model, the data, the one-process reference."""
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
## 1. Tensor parallelism of a whole block, by hand

Notebook 13 §6 split one linear layer: by its **columns** (outputs; each rank computes some output features from the whole input) or by its **rows** (inputs; each rank computes a partial sum over its share of the input features, and the partial sums are added). A block of notebook 16's transformer chains them so that a block needs one sum per sub-layer (Shoeybi et al., 2019, Megatron-LM):

- **attention**: `q_proj`, `k_proj`, `v_proj` column-parallel, so each rank holds whole *heads* (attention itself then runs on local heads, no communication); `o_proj` row-parallel, its input is exactly the local heads' output;
- **MLP**: `gate_proj` and `up_proj` column-parallel (each rank a slice of `d_ff`), SwiGLU's product elementwise on that slice; `down_proj` row-parallel.

Two operators mark where the ranks meet. **`g`** after a row-parallel layer: forward, an all-reduce of the partial sums; backward, the gradient passes unchanged (every rank needs all of it). **`f`** before the column-parallel layers: forward, the identity (every rank has the whole input); backward, an all-reduce, because each rank's layers give only part of the input's gradient. They are conjugate: each is the other's backward.

The norms sit outside these regions and are computed, whole and identical, on every rank.
"""

# %% slideshow={"slide_type": "fragment"}
print("column-parallel (split by output rows of the weight):", ", ".join(COLUMN_PARALLEL))
print("row-parallel    (split by input columns of the weight):", ", ".join(ROW_PARALLEL))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The embedding and the head are split over the **vocabulary**: each rank holds `vocab_size / n` rows. A rank looks up the ids that fall in its rows and writes zeros for the others, so the lookup is a `g` (the sum over ranks fills every row). The head gives each rank the logits of its slice of the vocabulary, and the cross-entropy never gathers a full row of logits: it needs, per token, the global maximum (for a stable `exp`), the sum of `exp` over the whole vocabulary, and the target's logit, which lives on one rank. Three all-reduces of one number per token, against `vocab_size` numbers per token for gathering the logits.

The script below writes all of it by hand, counts what each all-reduce sends with the ring formula of notebook 09 (`2 (n-1)/n` of the tensor), and compares the loss and every gradient with one process.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n17/tp_hand.py
"""Tensor parallelism of the whole model, by hand: f and g, the sharded blocks, the vocabulary-parallel ends."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SENT = {"bytes": 0}                              # what this rank sent: 2 (n-1)/n of every all-reduced tensor


def all_reduce_(t, op=dist.ReduceOp.SUM):
    n = dist.get_world_size()
    SENT["bytes"] += 2 * (n - 1) * t.numel() * t.element_size() // n
    dist.all_reduce(t, op=op)
    return t


class CopyToTP(torch.autograd.Function):         # f: identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_(grad.clone())


class ReduceFromTP(torch.autograd.Function):     # g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x):
        return all_reduce_(x.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


f, g = CopyToTP.apply, ReduceFromTP.apply


def shard(model, rank, n):
    """Keep this rank's rows (column-parallel layers, embedding, head) or columns (row-parallel layers)."""
    def keep(module, dim):
        module.weight = nn.Parameter(module.weight.detach().chunk(n, dim)[rank].clone())
    for layer in model.layers:
        for column in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
            keep(column, 0)
        for row in (layer.attn.o_proj, layer.mlp.down_proj):
            keep(row, 1)
    keep(model.embed, 0)
    keep(model.head, 0)
    return model


def block(layer, x, rope, enter=f, leave=g):
    h = x + leave(layer.attn(enter(layer.attn_norm(x)), rope))    # attention runs on this rank's heads
    return h + leave(layer.mlp(enter(layer.mlp_norm(h))))


def embed(model, ids, rank, leave=g):
    rows = model.embed.weight.shape[0]
    mine = (ids >= rank * rows) & (ids < (rank + 1) * rows)
    local = F.embedding((ids - rank * rows) * mine, model.embed.weight) * mine.unsqueeze(-1)
    return leave(local)                                         # zeros where another rank holds the row


def cross_entropy(logits, targets, rank):
    """Mean cross-entropy with this rank's slice of the vocabulary: three all-reduces of one number per token."""
    rows = logits.shape[-1]
    top = all_reduce_(logits.detach().max(-1).values, op=dist.ReduceOp.MAX)  # the global max: exp cannot overflow
    total = g(torch.exp(logits - top.unsqueeze(-1)).sum(-1))                  # softmax denominator, whole vocabulary
    mine = (targets >= rank * rows) & (targets < (rank + 1) * rows)
    picked = torch.gather(logits, -1, ((targets - rank * rows) * mine).unsqueeze(-1)).squeeze(-1)
    target_logit = g((picked - top) * mine)                                   # one rank holds it, the others add 0
    return (torch.log(total) - target_logit).mean()


def loss_fn(model, ids, targets, rank, enter=f, leave=g):
    x = embed(model, ids, rank, leave)
    for layer in model.layers:
        x = block(layer, x, (model.rope_cos, model.rope_sin), enter, leave)
    return cross_entropy(model.head(enter(model.norm(x))), targets, rank)


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The same plan with PyTorch's API: `parallelize_module` takes a module and a plan (`{submodule name: style}`) and replaces each named weight by a `DTensor` sharded on a 1-D `DeviceMesh` (notebook 15 §2). `ColwiseParallel` and `RowwiseParallel` are the two splits with `f` and `g` built in; on an `nn.Embedding` `RowwiseParallel` splits the table by vocabulary rows. `use_local_output=False` keeps the head's logits a `DTensor` sharded on the vocabulary, and inside `loss_parallel()` `F.cross_entropy` on them computes the vocabulary-parallel loss. `CommDebugMode` counts the collectives DTensor runs.

The job runs the hand version, the API version and the library's twin (`course_lib.tensor_parallel`, the copy that notebook 18's 3-D mesh and notebook 21's planner reuse, which counts its collectives with `CommCounter`) on 2 processes.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n17/tp_api.py
"""The same tensor parallelism with parallelize_module, and the job of section 1."""
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

import course_lib.tensor_parallel as tp
import tp_hand
from common import CONFIG, TOL, batch, max_diff, reference
from course_lib.transformer import Transformer


def plans(sequence_parallel=False):
    """(the model's plan, each block's plan); with sequence_parallel the norms work on slices of the sequence."""
    if not sequence_parallel:
        model_plan = {"embed": RowwiseParallel(input_layouts=Replicate()), "head": ColwiseParallel(use_local_output=False)}
        block_plan = {}
    else:
        model_plan = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                      "norm": SequenceParallel(),
                      "head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False)}
        block_plan = {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                      "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
                      "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
    out = Shard(1) if sequence_parallel else Replicate()
    block_plan |= {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
                   "attn.o_proj": RowwiseParallel(output_layouts=out),
                   "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                   "mlp.down_proj": RowwiseParallel(output_layouts=out)}
    return model_plan, block_plan


def api_grads(rank, n, ids, targets, sequence_parallel=False):
    """Loss, gradients (this rank's shards) and collective counts of the parallelize_module version."""
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    model = Transformer(CONFIG, seed=0)
    model_plan, block_plan = plans(sequence_parallel)
    parallelize_module(model, mesh, model_plan)
    for layer in model.layers:
        parallelize_module(layer, mesh, block_plan)
    with CommDebugMode() as comm:
        logits = model(ids)
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grads[name] = tp.shard_of(name, grad, rank, n)
    counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
    placement = str(logits.placements[0])
    return loss.full_tensor().item(), grads, counts, placement


def section1(rank, n):
    ids, targets = batch()
    ref, ref_loss = reference(ids, targets)
    full = {name: p.grad for name, p in ref.named_parameters()}
    # by hand
    hand = tp_hand.shard(Transformer(CONFIG, seed=0), rank, n)
    tp_hand.SENT["bytes"] = 0
    loss = tp_hand.loss_fn(hand, ids, targets, rank)
    loss.backward()
    hand_grads = {name: p.grad for name, p in hand.named_parameters()}
    # the library's twin, its collectives counted
    lib = tp.parallelize_transformer_(Transformer(CONFIG, seed=0), None)
    with tp.CommCounter() as counter:
        lib_loss = tp.tensor_parallel_loss(lib, ids, targets)
        lib_loss.backward()
    # parallelize_module
    api_loss, api, counts, placement = api_grads(rank, n, ids, targets)
    return {
        "loss": (ref_loss.item(), loss.item(), lib_loss.item(), api_loss),
        "hand vs one process": max(max_diff(hand_grads[k], tp.shard_of(k, full[k], rank, n)) for k in full),
        "library vs hand": max(max_diff(p.grad, hand_grads[k]) for k, p in lib.named_parameters()),
        "api vs hand": max(max_diff(api[k], hand_grads[k]) for k in full),
        "shapes": {k: (tuple(full[k].shape), tuple(hand_grads[k].shape)) for k in full if k.startswith("layers.0") or k in ("embed.weight", "head.weight")},
        "hand sent": tp_hand.SENT["bytes"], "library sent": counter.sent(), "library table": counter.table(),
        "api counts": counts, "logits placement": placement, "tol": TOL,
    }


# %% slideshow={"slide_type": "subslide"}
t0 = time.perf_counter()
s1 = run_ranks("_runs/n17/tp_api.py:section1", nprocs=2, timeout=240, echo="none")
print(f"2 processes, every rank exit code 0 (~{time.perf_counter() - t0:.0f} s with the start of the processes)")
r = s1[0]
for name, (full_shape, local) in r["shapes"].items():
    print(f"{name:<28} one process {str(full_shape):<10} rank 0 holds {local}")

# %% slideshow={"slide_type": "fragment"}
from course_lib.tensor_parallel import tp_bytes_per_step  # noqa: E402

for rank, res in enumerate(s1):
    ref_loss, hand_loss, lib_loss, api_loss = res["loss"]
    assert max(abs(x - ref_loss) for x in (hand_loss, lib_loss, api_loss)) < TOL
    assert max(res["hand vs one process"], res["library vs hand"], res["api vs hand"]) < TOL
print(f"loss, one process {s1[0]['loss'][0]:.4f}; by hand, library, parallelize_module: the same (|difference| < {TOL:g}) on both ranks")
print(f"every gradient shard: by hand = one process's slice, library = by hand, parallelize_module = by hand (< {TOL:g})")
print(f"logits of the API version: a DTensor placed {s1[0]['logits placement']} (the vocabulary dimension)")

tokens = BATCH * SEQ
formula = tp_bytes_per_step(CONFIG, tokens, 2)
print(f"\nbytes one rank sends per training step, n = 2, {tokens} tokens, float32:")
for part, b in formula.items():
    print(f"  {part:<20} {b:>9,}")
print(f"  {'formula total':<20} {sum(formula.values()):>9,}")
print(f"  {'counted by hand':<20} {s1[0]['hand sent']:>9,}")
print(f"  {'counted (library)':<20} {s1[0]['library sent']:>9,}   {s1[0]['library table']}")
print(f"collectives DTensor ran (CommDebugMode): {s1[0]['api counts']}")
assert all(res["hand sent"] == res["library sent"] == sum(formula.values()) for res in s1)
ours = s1[0]["library table"][("all_reduce", "world")][0]
extra = CONFIG.n_layers * (len(COLUMN_PARALLEL) - 2)  # per block: one f per column-parallel layer instead of 2
print(f"all-reduces: f and g by hand {ours}; parallelize_module {s1[0]['api counts']['all_reduce']} = {ours} + "
      f"{CONFIG.n_layers} blocks x ({len(COLUMN_PARALLEL)} column-parallel layers - 2 f's)")
assert s1[0]["api counts"] == {"all_reduce": ours + extra}

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the count against the code: per transformer block (attention and MLP together), `g` twice forward (after attention, after the MLP) and `f` twice backward, four all-reduces of `tokens x d_model` floats, two per sub-layer: the MLP block alone of notebook 13 §6 had one forward and one backward; the embedding's `g` and the head's `f` add two more; the loss three all-reduces of one float per token.

`parallelize_module` gives the same gradients but runs more all-reduces: each `ColwiseParallel` layer turns its own input into a replicated `DTensor`, so in backward each of `q_proj`, `k_proj`, `v_proj` (and `gate_proj`, `up_proj`) all-reduces its own share of the input's gradient, where the hand-written `f` adds the three shares locally and all-reduces once. A `PrepareModuleInput` on `attn` and `mlp` (as in the sequence-parallel plan of section 2) makes the input a `DTensor` once, and its gradient is reduced once.

The price is in the count: every transformer block waits for four all-reduces of its activations, forward and backward together, on the critical path (the compute cannot go on until the sum arrives). That is why tensor parallelism stays inside a node, on NVLink, in practice: the activations cross the link in every layer.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Sequence parallelism

In section 1 the norms (and, in models that use it, dropout) run whole on every rank: the same computation, and the same saved activations, `n` times. Sequence parallelism (Korthikanti et al., 2022) splits those regions along the **sequence** instead: between the blocks' parallel regions each rank keeps only `1/n` of the tokens. An all-reduce is a reduce-scatter followed by an all-gather (notebook 09 §3), so the communication only moves:

- `g` (all-reduce) becomes a **reduce-scatter** along the sequence: each rank receives the summed output of *its* tokens;
- `f` (identity) becomes an **all-gather** along the sequence: the column-parallel layers need every token;
- and in backward the other way round (the all-gather's backward is a reduce-scatter, and vice versa).

Same bytes: `(n-1)/n` each half, `2 (n-1)/n` together. One new cost: the norms' weights see only a slice of the tokens on each rank, so their gradients are partial and need an all-reduce (`h` floats per norm, small).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n17/sp.py
"""Sequence parallelism by hand, its bytes, its activation memory, and PyTorch's SequenceParallel; the job of section 2."""
import torch
import torch.distributed as dist

import course_lib.tensor_parallel as tp
import tp_api
import tp_hand
from common import BATCH, CONFIG, SEQ, TOL, batch, max_diff, reference
from course_lib.saved_tensors import SavedTensorMeter
from course_lib.transformer import Transformer


def all_gather_seq(x):
    n = dist.get_world_size()
    out = torch.empty((n * x.shape[1], x.shape[0], *x.shape[2:]), dtype=x.dtype)
    tp_hand.SENT["bytes"] += (n - 1) * out.numel() * out.element_size() // n
    dist.all_gather_single(out, x.transpose(0, 1).contiguous())      # 2.13's name (notebook 09 §3)
    return out.transpose(0, 1).contiguous()                         # (batch, n * local tokens, ...)


def reduce_scatter_seq(x):
    n = dist.get_world_size()
    front = x.transpose(0, 1).contiguous()
    out = torch.empty((front.shape[0] // n, *front.shape[1:]), dtype=x.dtype)
    tp_hand.SENT["bytes"] += (n - 1) * front.numel() * front.element_size() // n
    dist.reduce_scatter_single(out, front)                          # 2.13's name (notebook 09 §3)
    return out.transpose(0, 1).contiguous()                         # (batch, local tokens, ...), summed


class GatherSeq(torch.autograd.Function):       # replaces f: all-gather forward, reduce-scatter backward
    @staticmethod
    def forward(ctx, x):
        return all_gather_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_seq(grad)


class ScatterSeq(torch.autograd.Function):      # replaces g: reduce-scatter forward, all-gather backward
    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad)


def saved_per_rank(rank, n):
    """What one block keeps for backward: one process, tensor parallel, tensor + sequence parallel."""
    model = Transformer(CONFIG, seed=0)
    x = torch.randn(BATCH, SEQ, CONFIG.d_model, generator=torch.Generator().manual_seed(1), requires_grad=True)
    rope, layer = (model.rope_cos, model.rope_sin), model.layers[0]
    out = {}
    with SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()]) as m:
        layer(x, rope)
    out["one process"] = m.bytes
    tp_hand.shard(model, rank, n)
    skip = [*model.parameters(), *model.buffers()]
    with SavedTensorMeter(exclude=skip) as m:
        tp_hand.block(layer, x, rope)
    out["tensor parallel"] = m.bytes
    x_slice = x.detach().chunk(n, 1)[rank].contiguous().requires_grad_()
    with SavedTensorMeter(exclude=skip) as m:
        tp_hand.block(layer, x_slice, rope, GatherSeq.apply, ScatterSeq.apply)
    out["tensor + sequence parallel"] = m.bytes
    return out


def section2(rank, n):
    ids, targets = batch()
    ref, ref_loss = reference(ids, targets)
    full = {name: p.grad for name, p in ref.named_parameters()}
    hand = tp_hand.shard(Transformer(CONFIG, seed=0), rank, n)
    tp_hand.SENT["bytes"] = 0
    loss = tp_hand.loss_fn(hand, ids, targets, rank, GatherSeq.apply, ScatterSeq.apply)
    loss.backward()
    for name, p in hand.named_parameters():
        if name.endswith("norm.weight"):
            tp_hand.all_reduce_(p.grad)                             # each rank saw 1/n of the tokens
    hand_grads = {name: p.grad for name, p in hand.named_parameters()}
    lib = tp.parallelize_transformer_(Transformer(CONFIG, seed=0), None, sequence_parallel=True)
    with tp.CommCounter() as counter:
        lib_loss = tp.tensor_parallel_loss(lib, ids, targets)
        lib_loss.backward()
        tp.sync_sequence_parallel_grads(lib)
    api_loss, api, counts, _ = tp_api.api_grads(rank, n, ids, targets, sequence_parallel=True)
    return {
        "loss": (ref_loss.item(), loss.item(), lib_loss.item(), api_loss),
        "hand vs one process": max(max_diff(hand_grads[k], tp.shard_of(k, full[k], rank, n)) for k in full),
        "library vs hand": max(max_diff(p.grad, hand_grads[k]) for k, p in lib.named_parameters()),
        "api vs hand": max(max_diff(api[k], hand_grads[k]) for k in full),
        "hand sent": tp_hand.SENT["bytes"], "library sent": counter.sent(), "library table": counter.table(),
        "api counts": counts, "saved": saved_per_rank(rank, n), "tol": TOL,
    }


# %% slideshow={"slide_type": "subslide"}
t0 = time.perf_counter()
s2 = run_ranks("_runs/n17/sp.py:section2", nprocs=2, timeout=240, echo="none")
print(f"2 processes, every rank exit code 0 (~{time.perf_counter() - t0:.0f} s)")
for res in s2:
    assert max(abs(x - res["loss"][0]) for x in res["loss"][1:]) < TOL
    assert max(res["hand vs one process"], res["library vs hand"], res["api vs hand"]) < TOL
print(f"sequence parallel: loss and every gradient shard equal one process's (< {TOL:g}): by hand, library, SequenceParallel plan")
sp_formula = tp_bytes_per_step(CONFIG, tokens, 2, sequence_parallel=True)
for part, b in sp_formula.items():
    print(f"  {part:<22} {b:>9,}")
print(f"  {'formula total':<22} {sum(sp_formula.values()):>9,}   (tensor parallel alone: {sum(formula.values()):,})")
print(f"  {'counted by hand':<22} {s2[0]['hand sent']:>9,}")
print(f"  {'counted (library)':<22} {s2[0]['library sent']:>9,}   {s2[0]['library table']}")
print(f"collectives DTensor ran (CommDebugMode): {s2[0]['api counts']}")
assert all(res["hand sent"] == res["library sent"] == sum(sp_formula.values()) for res in s2)
activations = sum(v for k, v in sp_formula.items() if k != "norm weight gradients")
print(f"activations' bytes: {activations:,} with sequence parallelism, {sum(formula.values()):,} without: "
      f"{'the same' if activations == sum(formula.values()) else 'different'}")
assert activations == sum(formula.values())
table = s2[0]["library table"]
assert (table[("reduce_scatter", "world")][0], table[("all_gather", "world")][0]) == (s2[0]["api counts"]["reduce_scatter_tensor"], s2[0]["api counts"]["all_gather_into_tensor"])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The names `CommDebugMode` prints for the plan, `reduce_scatter_tensor` and `all_gather_into_tensor`, are the operators of PyTorch's functional collectives, which DTensor calls inside the plan; they are not the Python functions `dist.reduce_scatter_tensor` and `dist.all_gather_into_tensor` that 2.13 deprecates (notebook 09 §3). The hand-written version calls the names 2.13 recommends, `dist.reduce_scatter_single` and `dist.all_gather_single`, with the same arguments (output, then input).

### Activation bytes per rank

What one block keeps for backward, per rank, against notebook 16 §3's formula (`block_saved_terms`) with the right terms divided by `n` (`course_lib.tensor_parallel.tp_saved_bytes`): tensor parallelism divides what lives on the local heads and the local slice of `d_ff`; sequence parallelism also divides the norms' inputs and statistics. The projections' inputs stay whole in both: they are the all-gathered tensors the linear layers keep. (Megatron-LM keeps only the slice and gathers it again in backward, one more all-gather per sub-layer, to divide that term too.)
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.tensor_parallel import tp_saved_bytes  # noqa: E402

expected = {"one process": sum(tp_saved_bytes(CONFIG, SEQ, 1, batch=BATCH).values()),
            "tensor parallel": sum(tp_saved_bytes(CONFIG, SEQ, 2, batch=BATCH).values()),
            "tensor + sequence parallel": sum(tp_saved_bytes(CONFIG, SEQ, 2, batch=BATCH, sequence_parallel=True).values())}
print(f"one block, {BATCH} x {SEQ} tokens, float32, bytes kept for backward per rank (n = 2):")
for kind, want in expected.items():
    got = [res["saved"][kind] for res in s2]
    print(f"  {kind:<28} measured {got[0]:>8,} (both ranks: {got[0] == got[1]})   formula {want:>8,}")
    assert got == [want, want]
sp_over_tp = expected["tensor + sequence parallel"] / expected["tensor parallel"]
tp_over_one = expected["tensor parallel"] / expected["one process"]
print(f"tensor parallel / one process: {tp_over_one:.3f}; with sequence parallelism / without: {sp_over_tp:.3f} (smaller)")
terms_tp, terms_sp = tp_saved_bytes(CONFIG, SEQ, 2, batch=BATCH), tp_saved_bytes(CONFIG, SEQ, 2, batch=BATCH, sequence_parallel=True)
print("terms that sequence parallelism divides:", ", ".join(k for k in terms_tp if terms_sp[k] < terms_tp[k]))
assert expected["tensor + sequence parallel"] < expected["tensor parallel"] < expected["one process"]

print(f"notebook so far ~{time.perf_counter() - notebook_start:.0f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Tensor and sequence parallelism share one group of ranks and communicate inside every layer, on the critical path: they need the fastest links there are, the GPUs of one node. Notebook 18 splits what they leave whole: the sequence inside attention, which long contexts need, and the experts of a mixture-of-experts layer; then it puts context and tensor parallelism on one mesh with data parallelism.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- **Tensor parallelism** splits q/k/v and the MLP's first projections by columns (heads, `d_ff`) and o/down by rows; Megatron's `f` (identity forward, all-reduce backward) and `g` (all-reduce forward, identity backward) are the only communication: 4 all-reduces of the activations per transformer block and step, plus 2 for the vocabulary-parallel embedding and head and 3 small ones for the vocabulary-parallel loss. By hand, `course_lib` and `parallelize_module` gave one process's gradients and the counted bytes matched the formula.
- `parallelize_module` gives the same gradients with more all-reduces in backward: each column-parallel layer makes its own input replicated, so their input gradients are summed one layer at a time, where `f` sums them once.
- **Sequence parallelism** replaces each all-reduce by a reduce-scatter and an all-gather along the sequence, the same activation bytes, plus an all-reduce of the norms' weight gradients; the norms' activations are divided by the ranks, measured to the byte against notebook 16's formula.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. For each linear layer of a block, say whether tensor parallelism splits it by columns (`"column"`) or by rows (`"row"`).
2. Write `block_tp_bytes(tokens, d_model, n, p)`: the bytes one of `n` tensor-parallel ranks sends for one transformer block in one training step (forward and backward, `tokens` = batch × sequence length, `p` bytes per element), each all-reduce sent by the ring algorithm of notebook 09.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.tensor_parallelism import LINEAR_LAYERS, check_block_tp_bytes, check_parallel_styles  # noqa: E402

print(", ".join(LINEAR_LAYERS))
answer = {name: ... for name in LINEAR_LAYERS}  # "column" or "row"
print(check_parallel_styles(answer))


# %% slideshow={"slide_type": "-"}
def block_tp_bytes(tokens, d_model, n, p):
    raise NotImplementedError  # your code here


print(check_block_tp_bytes(block_tp_bytes))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- M. Shoeybi et al., *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019, [arXiv:1909.08053](https://arxiv.org/abs/1909.08053) (the `f` and `g` operators, vocabulary-parallel embedding and loss).
- V. Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*, 2022, [arXiv:2205.05198](https://arxiv.org/abs/2205.05198) (sequence parallelism, the activation formula).
- Hugging Face, [*The Ultra-Scale Playbook: Training LLMs on GPU Clusters*](https://huggingface.co/spaces/nanotron/ultrascale-playbook), 2025; [picotron](https://github.com/huggingface/picotron).
- PyTorch docs and tutorials: [Tensor Parallelism (`torch.distributed.tensor.parallel`)](https://pytorch.org/docs/stable/distributed.tensor.parallel.html), [Large Scale Transformer model training with Tensor Parallel](https://pytorch.org/tutorials/intermediate/TP_tutorial.html), [DeviceMesh](https://pytorch.org/tutorials/recipes/distributed_device_mesh.html).
"""
