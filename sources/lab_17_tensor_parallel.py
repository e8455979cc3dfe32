# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · Tensor and sequence parallelism by hand

Notebook 17 split a whole transformer across ranks with Megatron-LM's two operators, then replaced their all-reduces with the all-gather and reduce-scatter of sequence parallelism. In this lab you write those pieces yourself for one block, and they run as two real processes beside the same block on one process and beside PyTorch's `parallelize_module`.

By the end you will have written, and seen pass against PyTorch:
- the operators `f` (identity forward, all-reduce backward) and `g` (all-reduce forward, identity backward) as `torch.autograd.Function`s, and their sequence-parallel counterparts built on all-gather and reduce-scatter along the sequence;
- the shards of a block: column-parallel layers split by output features, row-parallel layers split by input features with their bias kept whole;
- an MLP (column then row) and an attention split by heads, each with one collective on the way in and one on the way out;
- sequence parallelism, including the gradients of the parameters every rank holds whole.

This lab assumes notebook 13 §6 (one layer split by columns or rows), notebook 16 (the block) and notebook 17 §1–2 (tensor and sequence parallelism). Expected time: about 75 minutes.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The block

The check builds this block on every rank from the same seed, so every rank starts with the same whole weights; your code keeps each rank's share of them. Pre-norm, causal attention, a GELU MLP. `k` has no bias: a bias `b` on the keys adds `q · b` to every score of a query, the same amount for every key, which the softmax ignores, so its gradient is zero up to rounding (the second cell shows it), and no relative comparison can judge a gradient made of rounding.
"""

# %% slideshow={"slide_type": "-"}
import os

from course_lib.labs.tensor_parallel import BATCH, NPROCS, SEQ, TOLERANCE, Block

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)
block = Block()
print(block)
print(f"input x: (batch, seq, d) = ({BATCH}, {SEQ}, {block.norm1.normalized_shape[0]}); heads of "
      f"{block.attn.head_dim} features; ranks: {NPROCS}")

# %% slideshow={"slide_type": "fragment"}
import torch  # noqa: E402

from course_lib.labs.tensor_parallel import Attention  # noqa: E402

attn = Attention()
attn.k = torch.nn.Linear(*attn.q.weight.shape[::-1])  # with a bias, for this demonstration only
attn(torch.randn(BATCH, SEQ, attn.q.in_features)).square().sum().backward()
k_bias, q_bias = attn.k.bias.grad.norm().item(), attn.q.bias.grad.norm().item()
print(f"gradient of k's bias below 1e-5 x q's: {k_bias < 1e-5 * q_bias}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_tp.py`) and the check after it. The file's docstring is the specification; `ParallelBlock` is written for you and shows how the pieces fit.

The rules that decide right from wrong, each with a check of its own:

1. **The operators are conjugate.** `f` is the identity forward and an all-reduce backward; `g` the other way round. `GatherFromSP` all-gathers along the sequence forward and reduce-scatters backward; `ReduceScatterToSP` the other way round. The check tests each one alone, on tensors whose every rank's value it knows.
2. **A column-parallel layer keeps rows, a row-parallel layer keeps columns.** `nn.Linear` stores its weight as `(out_features, in_features)`: output features are rows (`chunk(n, 0)`), input features are columns (`chunk(n, 1)`). The row-parallel bias stays whole and is added once, after the sum; added before it, it would be counted once per rank.
3. **Each sub-layer communicates once in each direction.** One collective where the region starts and one where it ends: two all-reduces forward and two backward per block with tensor parallelism; with sequence parallelism an all-gather and a reduce-scatter in each direction instead.
4. **With sequence parallelism the whole parameters' gradients are partial.** The norms and the row-parallel biases work on this rank's tokens only, so each rank's gradient of them is a partial sum: `sync_grads()` adds them up over the ranks.
"""

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_tp.py
"""Lab: tensor and sequence parallelism of one transformer block, by hand, the way Megatron-LM splits it.

The check builds the whole block on every rank (the same seed, so the same weights: print it with
`from course_lib.labs.tensor_parallel import Block; print(Block())`):

    Block:  h = x + attn(norm1(x)),  out = h + mlp(norm2(h))        x: (batch, seq, d)
    attn:   q, k, v, o = nn.Linear(d, d), with a bias except k; heads of `attn.head_dim` features; causal
    mlp:    fc1 = nn.Linear(d, ff), GELU, fc2 = nn.Linear(ff, d)

`ParallelBlock(block, sequence_parallel)` is this rank's share of it, on the n ranks of the default group:

- column-parallel layers (q, k, v, fc1) keep their output features `rank` of n: rows of the weight and the
  slice of the bias (`chunk(n, 0)[rank]`), so each rank holds whole heads and a slice of `ff`;
- row-parallel layers (o, fc2) keep their input features: columns of the weight (`chunk(n, 1)[rank]`); the
  bias stays whole and is added once, after the partial sums are added up;
- `f` (CopyToTP: identity forward, all-reduce backward) comes before the column-parallel layers, `g`
  (ReduceFromTP: all-reduce forward, identity backward) after the row-parallel ones;
- with `sequence_parallel=True` the block's input and output are this rank's slice of the sequence
  (dimension 1, n equal contiguous slices in rank order) and the norms run on it: GatherFromSP (all-gather
  along the sequence forward, reduce-scatter backward) replaces f, ReduceScatterToSP (reduce-scatter forward,
  all-gather backward) replaces g; after backward, `sync_grads()` sums over the ranks the gradients of the
  parameters every rank holds whole (the norms', the row-parallel biases'), which each rank computed from its
  own tokens only.

Every parameter keeps the whole block's name (`attn.q.weight`, `mlp.fc2.bias`, `norm1.weight`, ...) and holds
this rank's shard, a copy (the whole block is not modified).
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToTP(torch.autograd.Function):
    """f: the identity forward; backward, the sum over the ranks of the incoming gradient."""

    @staticmethod
    def forward(ctx, x):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


class ReduceFromTP(torch.autograd.Function):
    """g: forward, the sum over the ranks of their partial outputs; the identity backward."""

    @staticmethod
    def forward(ctx, x):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


def all_gather_seq(x):
    """Every rank's `x` (batch, local_seq, ...) concatenated along dimension 1, in rank order: a new tensor."""
    # YOUR CODE HERE
    raise NotImplementedError()


def reduce_scatter_seq(x):
    """This rank's slice along dimension 1 (the rank-th of n equal ones) of the sum of every rank's `x`."""
    # YOUR CODE HERE
    raise NotImplementedError()


class GatherFromSP(torch.autograd.Function):
    """Sequence parallelism's f: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


class ReduceScatterToSP(torch.autograd.Function):
    """Sequence parallelism's g: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


def region(sequence_parallel):
    """The operators `(enter, leave)` around a parallel region, two functions of one tensor."""
    # YOUR CODE HERE
    raise NotImplementedError()


def column_shard(linear, rank, n):
    """A copy of `linear` (an nn.Linear) keeping output features `rank` of `n`: its weight's rows, its bias's slice.

    `linear.bias` may be None (k has no bias)."""
    # YOUR CODE HERE
    raise NotImplementedError()


def row_shard(linear, rank, n):
    """A copy of `linear` that keeps input features `rank` of `n`: its weight's columns; the whole bias."""
    # YOUR CODE HERE
    raise NotImplementedError()


class ParallelMLP(nn.Module):
    """`mlp` split over the ranks: fc1 column-parallel, fc2 row-parallel (its bias added once, after `leave`)."""

    def __init__(self, mlp, sequence_parallel=False):
        super().__init__()
        self.enter, self.leave = region(sequence_parallel)
        rank, n = dist.get_rank(), dist.get_world_size()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


class ParallelAttention(nn.Module):
    """`attn` split by heads: q, k, v column-parallel, o row-parallel (its bias added once, after `leave`)."""

    def __init__(self, attn, sequence_parallel=False):
        super().__init__()
        self.enter, self.leave = region(sequence_parallel)
        self.head_dim = attn.head_dim
        rank, n = dist.get_rank(), dist.get_world_size()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


class ParallelBlock(nn.Module):
    def __init__(self, block, sequence_parallel=False):
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn = ParallelAttention(block.attn, sequence_parallel)
        self.mlp = ParallelMLP(block.mlp, sequence_parallel)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))

    def sync_grads(self):
        """Called after backward: with sequence parallelism, sum the whole-on-every-rank parameters' gradients."""
        # YOUR CODE HERE
        raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_tensor_parallel_lab()` starts 2 processes (gloo, CPU). In each it imports your file and checks, in this order (a failure in the first two stops it there, since the rest would only repeat it):

- **the four operators alone**, forward and backward, on a seeded tensor per rank: the check computes every rank's tensor itself, so it knows the sum, the concatenation and each slice, and names what your operator returned instead;
- **the shards' shapes**, against the whole block's split by rows or columns;
- **against one process**, with and without sequence parallelism: the outputs of your attention, your MLP and your block against the same modules on the whole input (where an output is off by exactly the row-parallel bias times the number of ranks minus one, it says so); the gradient of the block's input; and every weight's gradient, the shards concatenated back into whole tensors, compared with `course_lib.equivalence.compare_gradients`;
- **the collectives** of one forward and one backward (recorded from the `torch.distributed` calls your code makes), and whether `sync_grads()` communicates;
- **against `parallelize_module`**: the block split with `ColwiseParallel` and `RowwiseParallel` (plus `SequenceParallel` on the norms and `PrepareModuleInput` before the attention and the MLP), trained 2 steps with SGD and 2 with AdamW on the same data as yours; each rank's shards of the parameters are compared with the `DTensor`s' local shards.

The tolerance, printed below, is the same everywhere: the largest absolute difference for outputs and parameters, the relative error for gradients. Everything is float32 and both sides add the same numbers, only in another order across the ranks, so a right answer could differ from them in the last bits only, far below it.
"""

# %% slideshow={"slide_type": "-"}
print(f"tolerance: {TOLERANCE:g} (outputs, parameters: largest |difference|; gradients: relative error)")

# %% slideshow={"slide_type": "-"}
from course_lib.labs.tensor_parallel import check_tensor_parallel_lab  # noqa: E402

print(check_tensor_parallel_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- `f`'s forward returns `x.view_as(x)` (a new tensor object for autograd, the same values); its backward clones the gradient before `dist.all_reduce`, which works in place.
- `dist.all_gather_into_tensor(out, x)` and `dist.reduce_scatter_tensor(out, x)` concatenate and split along dimension 0. Put the sequence first (`x.transpose(0, 1).contiguous()`), call them, and put it back.
- `copy.deepcopy(linear)` then `shard.weight = nn.Parameter(linear.weight.detach().chunk(n, 0)[rank].clone())` keeps the module's type and names with a new, smaller parameter.
- In the row-parallel layer call `F.linear(h, self.o.weight)` (no bias), apply `leave`, then add `self.o.bias`.
- In the attention, `view(b, s, -1, head_dim)` finds how many heads this rank has from the shard's width.
- `sync_grads()` with sequence parallelism: `dist.all_reduce(p.grad)` for the two norms' parameters and the two row-parallel biases. A sum, not a mean: the loss is the sum over all tokens, and each rank holds the part from its own.

## Summary

- Tensor parallelism needs one sum per sub-layer: `f` and `g` place it, and each is the other's backward.
- Column-parallel means output features (weight rows), row-parallel means input features (weight columns); a bias that every rank holds is added once, after the sum.
- Sequence parallelism moves the same bytes as the all-reduce it replaces (notebook 17 §2 counts them), splits the norms' work by tokens, and turns the whole parameters' gradients into partial sums that need one more all-reduce.

## References

- M. Shoeybi et al., *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019, [arXiv:1909.08053](https://arxiv.org/abs/1909.08053) (the `f` and `g` operators, §3).
- V. Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*, 2022, [arXiv:2205.05198](https://arxiv.org/abs/2205.05198) (sequence parallelism, §4.2).
- PyTorch: [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html) (`parallelize_module`, `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`).
"""
