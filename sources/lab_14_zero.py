# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · A ZeRO-1/2 sharded optimizer

Notebook 14 §2 built `HandZero`, a sharded optimizer, and compared it with DDP and with PyTorch's `ZeroRedundancyOptimizer`. In this lab you write your own, `ZeroOptimizer`, from its specification, and it runs as two real processes beside DDP with the same `torch.optim` optimizer, on a model with the awkward parts of a real fine-tuning run.

By the end you will have written, and seen pass against DDP:
- a wrapper around any element-wise `torch.optim` class that keeps the parameter groups and their options;
- the flat, padded layout: one buffer per group and dtype, cut into equal chunks, one per rank, the parameters turned into views of it;
- the step: gradients reduce-scattered and averaged, each rank's chunk stepped by an optimizer whose state covers that chunk only, the chunks all-gathered back;
- the rules `torch.optim` follows and a sharded optimizer must keep: a frozen parameter is left alone, a parameter without a gradient is skipped;
- stage 2, which drops the full gradient once it is reduce-scattered.

This lab assumes notebook 14 (§2, ZeRO-1 and ZeRO-2 by hand) and the collectives of notebook 09. Expected time: about an hour.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the four places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_zero.py`) and the check after it. The module's docstring is the specification. About 50 lines.

Four rules decide whether it is right, and each has a check of its own:

1. **The optimizer steps with the mean gradient**, divided by the world size once, exactly as under DDP.
2. **What `torch.optim` would not touch, you do not touch.** A frozen parameter stays out of the buffers. A parameter that got no gradient is skipped: its pieces keep `.grad = None`. Stepped with a zero gradient instead, it still moves, as the cell after this one shows.
3. **Each element is stepped by exactly one rank, and every rank ends the step with every parameter.** Each rank's optimizer holds the state of its chunk only, about 1/N of DDP's, and an all-gather brings every chunk to every rank.
4. **Stage 2 keeps only its chunk of the gradient** after the step.
"""

# %% slideshow={"slide_type": "-"}
import os

import torch

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)

# Rule 2: a parameter stepped with a zero gradient, and one with no gradient at all (.grad None)
for name, optimizer_class, options in (
    ("AdamW", torch.optim.AdamW, {"lr": 0.1, "weight_decay": 0.1}),
    ("SGD, momentum, weight decay", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
):
    zero_grad, no_grad = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    zero_grad.grad = torch.zeros(3)
    optimizer_class([zero_grad, no_grad], **options).step()
    print(f"{name:<28} zero gradient: {zero_grad[0].item():.4f}   no gradient: {no_grad[0].item():.4f}   (from 1)")

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_zero.py
"""Lab: a ZeRO-1/2 sharded optimizer, around any element-wise torch.optim class.

`ZeroOptimizer(params, optimizer_class, stage=1, **defaults)` runs on every rank of the default process group.
It replaces both DDP's gradient all-reduce and the optimizer: the model is not wrapped in DDP, every rank starts
from the same parameters and runs backward on its own batch, then calls `step()`.

- `params`: parameters, or parameter groups (dicts with "params" and the group's own options, such as
  "weight_decay"); `optimizer_class` (torch.optim.SGD, AdamW, ...) and `defaults` (lr=...), as torch.optim takes them.
- A parameter with `requires_grad=False` (frozen) is left alone: not flattened, never stepped, never decayed.
- Each group's trainable parameters are flattened, in the group's order, into one buffer per dtype, padded with
  zeros to a multiple of the world size N and cut into N equal chunks: rank r owns chunk r. The parameters become
  views of their buffer (`p.data = ...`), so that writing the buffer writes the parameters.
- `self.opt` is `optimizer_class` built on this rank's *pieces* only: for each parameter, the part of it that lies
  in this rank's chunk (an `nn.Parameter` viewing the buffer), in a group with its group's options. Its state
  then covers 1/N of the model.
- `zero_grad()` clears the gradients (`p.grad = None`, as torch.optim does); backward fills `p.grad` as usual.
- `step()`, for each buffer: the gradients are laid out like the buffer (zeros where a parameter has no gradient)
  and reduce-scattered, so that rank r receives the sum of chunk r; divide it by N once (the mean). Each piece
  gets its part of the chunk as `.grad`, except the pieces of a parameter that got no gradient on any rank: their
  `.grad` stays None, so that torch.optim skips them as it skips such a parameter under DDP (no decay, no
  momentum). Then `self.opt.step()`, and each buffer is all-gathered from its chunks: every rank holds every
  updated parameter again.
- Stage 2: right after the reduce-scatter, the full gradients are dropped (`p.grad = None` for every parameter,
  and no reference kept to a flat copy): only this rank's chunk survives the step. Stage 1 keeps `p.grad`.

Use `dist.reduce_scatter_single(output, input)` and `dist.all_gather_single(output, input)`: the input of the
first and the output of the second are N times as long as the other tensor.
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from course_lib.sharded_optim import ELEMENTWISE_OPTIMIZERS  # SGD, Adam, AdamW, ...: notebook 14, section 2.3


class ZeroOptimizer:
    def __init__(self, params, optimizer_class, stage=1, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage!r}")
        if not issubclass(optimizer_class, ELEMENTWISE_OPTIMIZERS):
            raise ValueError(f"{optimizer_class.__name__} is not element-wise: a chunk would cut its tensors")
        self.stage, self.rank, self.world_size = stage, dist.get_rank(), dist.get_world_size()
        groups = list(params)
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]  # plain parameters: one group
        self.buffers = []  # one entry per (group, dtype): what _flatten returns
        inner = []  # the groups of self.opt: this rank's pieces, each group with its options
        # For each group, its trainable parameters: one _flatten per dtype, and an inner group of its pieces.
        # YOUR CODE HERE
        raise NotImplementedError()
        self.opt = optimizer_class(inner, **defaults)

    def _flatten(self, params):
        """One padded flat buffer for `params` (all of one dtype); the parameters become views of it.

        Returns (and appends to self.buffers) a dict: "params", "flat" (the buffer), "shard" (the chunk length),
        "pieces" (for each parameter, an nn.Parameter viewing its part of this rank's chunk, or None).
        """
        # YOUR CODE HERE
        raise NotImplementedError()

    def zero_grad(self):
        """Every parameter's and every piece's .grad set to None."""
        # YOUR CODE HERE
        raise NotImplementedError()

    @torch.no_grad()
    def step(self):
        """Reduce-scatter and average each buffer's gradients, step this rank's pieces, all-gather the buffers."""
        # YOUR CODE HERE
        raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_zero_lab()` starts 2 processes (gloo, CPU). Each builds the same small model: a frozen first layer, a parameter forward never uses, and a float64 gain beside float32 layers, so that one group holds two dtypes. The optimizer gets two groups, weight decay 0.1 on the weights (the frozen layer's weight among them) and 0 on the rest. Your `ZeroOptimizer` and `DistributedDataParallel` with the same optimizer train it for 3 steps on the same data, with SGD (momentum 0.9) and with AdamW, each at stage 1 and stage 2; `ZeroRedundancyOptimizer` trains it too, and its agreement with DDP is printed beside yours. The check records the collectives your code issues and looks into your optimizer after the step. It checks:

- the gradient your optimizer steps with: a float64 copy of the model, plain SGD with `lr=1` and no weight decay, whose first update is minus that gradient; it must equal DDP's averaged gradient within 1e-9 (relative, `course_lib.equivalence.compare_gradients`, which names a sum or a double division when it sees one). In float64, `p - (p - g)` gives back `g` up to rounding far below that;
- the frozen parameters are never moved into a buffer and never change; the unused parameter never changes;
- the parameters after 3 steps of each optimizer, at each stage, equal DDP's within 1e-6 (absolute): both runs average the same two gradients and apply the same element-wise update, so only the last bits could differ; every rank holds the same parameters;
- together, the ranks' optimizers step each trainable element once; each holds about 1/2 of DDP's optimizer state;
- after a stage-2 step, the gradient tensors your optimizer keeps are about the size of one chunk;
- per step, a rank all-gathers the trainable parameters' bytes (plus padding), reduce-scatters the gradient, and all-reduces nothing large.

A wrong answer names the check that failed, what was measured, and the mistake that usually causes it. A hang (a rank waiting in a collective the other never calls) ends at the timeout with each rank's last lines.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.zero import check_zero_lab

print(check_zero_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- `dict.fromkeys(p.dtype for p in params)` lists the dtypes in their order of first appearance: one buffer per group and dtype.
- Pad with `math.ceil(total / N)`: rank `r` owns `[r * shard, (r + 1) * shard)` of the buffer. The part of a parameter that lies in it runs from `max(offset, lo)` to `min(offset + numel, hi)`; when that is empty, the parameter has no piece on this rank.
- `p.data = flat[offset : offset + n].view_as(p)` makes `p` a view of the buffer, and `nn.Parameter(flat[start:end])` a piece that shares its memory: the inner optimizer's in-place update then writes the buffer, and the all-gather writes every parameter.
- A parameter that got a gradient on one rank but not on another still has one under DDP. One small all-reduce (`op=dist.ReduceOp.MAX`) of a 0/1 flag per parameter makes the ranks agree.
- `piece.grad` must have the piece's shape and dtype: a slice of the averaged chunk, `chunk[start - lo : start - lo + piece.numel()]`.
- Work under `torch.no_grad()` in `step()` (the decorator is already there).

## Summary

- ZeRO-1 and ZeRO-2 change where the optimizer runs, not what it computes: the same mean gradient, the same element-wise update, each element done once instead of N times.
- Sharding by element is right for element-wise optimizers only, and it must keep `torch.optim`'s rules: groups and their options, frozen parameters out, parameters without a gradient skipped.
- Stage 2 differs from stage 1 only in what survives the step: the chunk of the gradient instead of all of it.

## References

- S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054).
- PyTorch: [`ZeroRedundancyOptimizer`](https://pytorch.org/docs/stable/distributed.optim.html) and the [`torch.optim`](https://pytorch.org/docs/stable/optim.html) documentation (parameter groups, and parameters whose `.grad` is `None`).
- PyTorch: [`reduce_scatter_single` and `all_gather_single`](https://pytorch.org/docs/stable/distributed.html#collective-functions).
"""
