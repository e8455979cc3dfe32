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
        ### BEGIN SOLUTION
        return x.view_as(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        ### END SOLUTION


class ReduceFromTP(torch.autograd.Function):
    """g: forward, the sum over the ranks of their partial outputs; the identity backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        x = x.clone()
        dist.all_reduce(x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION


def all_gather_seq(x):
    """Every rank's `x` (batch, local_seq, ...) concatenated along dimension 1, in rank order: a new tensor."""
    ### BEGIN SOLUTION
    front = x.transpose(0, 1).contiguous()  # the collectives work on dimension 0: put the sequence there
    out = torch.empty((dist.get_world_size() * front.shape[0], *front.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, front)
    return out.transpose(0, 1).contiguous()
    ### END SOLUTION


def reduce_scatter_seq(x):
    """This rank's slice along dimension 1 (the rank-th of n equal ones) of the sum of every rank's `x`."""
    ### BEGIN SOLUTION
    seq_first = x.movedim(1, 0).contiguous()
    out = torch.empty((seq_first.shape[0] // dist.get_world_size(), *seq_first.shape[1:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, seq_first)
    return out.movedim(0, 1).contiguous()
    ### END SOLUTION


class GatherFromSP(torch.autograd.Function):
    """Sequence parallelism's f: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return all_gather_seq(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return reduce_scatter_seq(grad)
        ### END SOLUTION


class ReduceScatterToSP(torch.autograd.Function):
    """Sequence parallelism's g: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        ### BEGIN SOLUTION
        return reduce_scatter_seq(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return all_gather_seq(grad)
        ### END SOLUTION


def region(sequence_parallel):
    """The operators `(enter, leave)` around a parallel region, two functions of one tensor."""
    ### BEGIN SOLUTION
    if sequence_parallel:
        return GatherFromSP.apply, ReduceScatterToSP.apply
    return CopyToTP.apply, ReduceFromTP.apply
    ### END SOLUTION


def column_shard(linear, rank, n):
    """A copy of `linear` (an nn.Linear) keeping output features `rank` of `n`: its weight's rows, its bias's slice.

    `linear.bias` may be None (k has no bias)."""
    ### BEGIN SOLUTION
    shard = copy.deepcopy(linear)
    shard.weight = nn.Parameter(linear.weight.detach().chunk(n, 0)[rank].clone())
    if linear.bias is not None:
        shard.bias = nn.Parameter(linear.bias.detach().chunk(n, 0)[rank].clone())
    return shard
    ### END SOLUTION


def row_shard(linear, rank, n):
    """A copy of `linear` that keeps input features `rank` of `n`: its weight's columns; the whole bias."""
    ### BEGIN SOLUTION
    shard = copy.deepcopy(linear)
    shard.weight = nn.Parameter(linear.weight.detach().chunk(n, 1)[rank].clone())
    return shard
    ### END SOLUTION


class ParallelMLP(nn.Module):
    """`mlp` split over the ranks: fc1 column-parallel, fc2 row-parallel (its bias added once, after `leave`)."""

    def __init__(self, mlp, sequence_parallel=False):
        super().__init__()
        self.enter, self.leave = region(sequence_parallel)
        rank, n = dist.get_rank(), dist.get_world_size()
        ### BEGIN SOLUTION
        self.fc1 = column_shard(mlp.fc1, rank, n)
        self.fc2 = row_shard(mlp.fc2, rank, n)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        h = F.gelu(self.fc1(self.enter(x)))
        return self.leave(F.linear(h, self.fc2.weight)) + self.fc2.bias
        ### END SOLUTION


class ParallelAttention(nn.Module):
    """`attn` split by heads: q, k, v column-parallel, o row-parallel (its bias added once, after `leave`)."""

    def __init__(self, attn, sequence_parallel=False):
        super().__init__()
        self.enter, self.leave = region(sequence_parallel)
        self.head_dim = attn.head_dim
        rank, n = dist.get_rank(), dist.get_world_size()
        ### BEGIN SOLUTION
        self.q, self.k, self.v = (column_shard(layer, rank, n) for layer in (attn.q, attn.k, attn.v))
        self.o = row_shard(attn.o, rank, n)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = self.enter(x)
        b, s, _ = x.shape
        q, k, v = (layer(x).view(b, s, -1, self.head_dim).transpose(1, 2) for layer in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # this rank's heads only
        y = y.transpose(1, 2).reshape(b, s, -1)
        return self.leave(F.linear(y, self.o.weight)) + self.o.bias
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        if self.sequence_parallel:
            for p in (*self.norm1.parameters(), *self.norm2.parameters(), self.attn.o.bias, self.mlp.fc2.bias):
                dist.all_reduce(p.grad)
        ### END SOLUTION
