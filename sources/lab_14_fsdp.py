# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · FSDP by hand

Notebook 14 §3 wrote ZeRO-3 in one page, each `Linear` a unit, and `course_lib.hand_fsdp.HandFSDP` is its complete version. In this lab you write it yourself, from its specification, with the parts a real model adds: units of several modules, a root unit for the parameters outside them, and a parameter left replicated. It runs as two real processes beside FSDP2's `fully_shard` and beside one process training the unsharded model.

By the end you will have written, and seen pass against `fully_shard`:
- the flat, padded layout of a unit, and the shard each rank keeps of it as its only copy of those parameters;
- an `autograd.Function` whose forward all-gathers the shards and whose backward reduce-scatters the gradient;
- forward hooks that gather a unit's parameters before its forward and free them after;
- the gather again before the unit's backward, into the storage autograd's saved views point at;
- the all-reduce of a replicated parameter's gradient, once that gradient is complete.

This lab assumes notebook 14 (§3, FSDP by hand) and the custom `autograd.Function`s of notebook 03. Expected time: about 75 minutes.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_fsdp.py`) and the check after it. The module's docstring is the specification. About 50 lines.

Four rules decide whether it is right, and each has a check of its own:

1. **A rank holds one shard per unit, and nothing more of it between uses.** The shard is the padded flat vector's chunk `r`; the full parameters exist from the unit's forward pre-hook to its forward hook, and again during its backward.
2. **The gradient of a shard is the mean over the ranks**, reduce-scattered once per unit per step, divided by N once. A replicated parameter's gradient is all-reduced and divided the same way.
3. **Backward sees the values forward used.** Autograd saved views of the full tensor, so the gather before backward must refill that very storage, without the in-place write autograd would refuse (the cell below shows both failures).
4. **Every rank issues the same collectives in the same order**: an all-gather per unit before its forward and before its backward, a reduce-scatter per unit, an all-reduce per replicated parameter.

The cell below acts out rule 3 on one process: a tensor stands for the gathered parameters, a view of it is saved by autograd, and its storage is freed and then refilled in three ways.
"""

# %% slideshow={"slide_type": "-"}
import os

import torch

from course_lib.errors import expect_error

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)
values = torch.randn(6, generator=torch.Generator().manual_seed(0))


def saved_then_freed():
    """`full` plays the gathered flat tensor; the product saves a view of it; then its memory is freed."""
    shard = values.clone().requires_grad_()
    full = shard * 1
    x = torch.ones(3, 2, requires_grad=True)
    loss = (x @ full[:4].view(2, 2)).sum()
    full.untyped_storage().resize_(0)
    return full, x, loss


full, x, loss = saved_then_freed()
print(f"after resize_(0): {full.untyped_storage().nbytes()} bytes, the tensor still has {full.numel()} elements")
with expect_error(RuntimeError, match="storage of size 0"):
    loss.backward()  # 1. not gathered again

full, x, loss = saved_then_freed()
full.untyped_storage().resize_(full.numel() * full.element_size())
with torch.no_grad():
    full.copy_(values)  # 2. gathered again by writing `full` itself
with expect_error(RuntimeError, match="modified by an inplace operation"):
    loss.backward()

full, x, loss = saved_then_freed()
storage = full.untyped_storage()
storage.resize_(full.numel() * full.element_size())
with torch.no_grad():
    torch.empty(0).set_(storage).copy_(values)  # 3. through a second tensor on the same storage
loss.backward()
expected = values[:4].view(2, 2).sum(1)  # d(sum of x @ W)/dx: each row of x.grad is W summed over its columns
print(f"gathered again through a second tensor: backward runs, x.grad rows = {expected.tolist()}:", torch.equal(x.grad[0], expected))

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_fsdp.py
"""Lab: FSDP (ZeRO-3) by hand: parameters sharded, gathered for forward, freed, gathered again for backward.

`shard_model(model, units, replicated=())` shards `model` in place, on every rank of the default process group
(every rank built the same model), and returns its `Unit`s, the root last:

- A unit is a module whose parameters are gathered and freed together: each module of `units`, then the root,
  `model` itself, which takes every parameter that is neither in a unit nor in `replicated`. Every parameter of
  the model requires grad, and the units do not overlap.
- At construction, a unit's parameters are flattened in the order `module.named_parameters()` yields them,
  padded with zeros to the next multiple of the world size N, and rank r keeps chunk r as an `nn.Parameter`:
  the unit's *shard*, the only copy of those values on the rank. The shard is registered on the unit's module
  (`module.register_parameter("flat_shard", shard)`), so `model.parameters()` yields it and an optimizer steps
  it; the original parameters are removed from their modules (`del sub._parameters[name]`).
- Before the unit's forward (a forward pre-hook): all-gather the shards into a new full flat tensor, through
  `Gather.apply(shard, unit)` so that autograd sees it, and give each module a view of it where its parameter
  was (`setattr(sub, name, view)`).
- After the unit's forward (a forward hook): free the full tensor's memory, `full.untyped_storage().resize_(0)`
  (the tensor object stays, and so do the views autograd saved for backward, without their bytes), and
  register `before_backward` as a hook on the unit's output.
- `before_backward`, called when the gradient reaches the unit's output, before the unit's backward: resize
  the storage back and all-gather into it again, through a second tensor on the same storage
  (`torch.empty(0).set_(storage)`: writing `full` itself would bump the version counter autograd checks).
- `Gather.backward` receives the gradient of the whole full tensor (autograd has summed every use): reduce-
  scatter it, divide by N once, and return it: autograd puts it in the shard's `.grad`. Free the full tensor.
- A replicated parameter stays whole on every rank, as under DDP: once its gradient is complete
  (`register_post_accumulate_grad_hook`), all-reduce it and divide it by N.

Use `dist.all_gather_single(output, input)` and `dist.reduce_scatter_single(output, input)`: the output of the
first and the input of the second are N times as long as the other tensor.
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn


class Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards into its full flat tensor. Backward: reduce-scatter its gradient."""

    @staticmethod
    def forward(ctx, shard, unit):
        """A new flat tensor of `unit.padded` elements, filled by `unit.all_gather`; keep `unit` for backward."""
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad_full):
        """Reduce-scatter `grad_full`, divide by N, free the unit's full tensor: (the shard's gradient, None)."""
        # YOUR CODE HERE
        raise NotImplementedError()


class Unit:
    """One unit: `places` lists (submodule, name) of its parameters, in order."""

    def __init__(self, module, places):
        self.module, self.places = module, places
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.full = None  # the gathered flat tensor, while it exists
        # Set self.padded (the padded length) and self.shard (chunk `rank`, an nn.Parameter registered on `module`
        # as "flat_shard"); remove the originals from their modules; register before_forward and after_forward.
        # YOUR CODE HERE
        raise NotImplementedError()

    def all_gather(self, out):
        """Every rank's shard, into `out` (a flat tensor of `self.padded` elements)."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def free(self):
        """Free the memory of `self.full` (its storage resized to 0 bytes), if there is one."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def before_forward(self, module, args):
        """Forward pre-hook: `self.full` from `Gather.apply`, and each place gets its view of it."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def after_forward(self, module, args, output):
        """Forward hook: free the full tensor; if `output` requires grad, hook `before_backward` on it."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def before_backward(self, grad):
        """Hook on the unit's output: give `self.full` its bytes back and all-gather into them again."""
        # YOUR CODE HERE
        raise NotImplementedError()


def _all_reduce_mean(p):
    """The post-accumulate-grad hook of a replicated parameter."""
    # YOUR CODE HERE
    raise NotImplementedError()


def shard_model(model, units, replicated=()):
    """A Unit for each module of `units`, then for the root (`model`): the list, root last (see the top)."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_fsdp_lab()` starts 2 processes (gloo, CPU). Each builds the same small residual network: an input layer, two blocks of two `Linear` layers (841 parameters each, an odd number, so a shard needs padding), a head, and a vector `scale` that stays replicated. Your `shard_model` makes each block a unit and the root hold the input layer and the head; `fully_shard` shards each block, then the root; one process trains the unsharded model on the whole batch of both ranks. Each trains 3 SGD steps (momentum 0.9) and 3 AdamW steps on the same data. The check records the collectives your code issues, and its own forward hooks, registered after yours, measure the bytes behind each block's parameter tensors. It checks:

- each rank registered one shard per unit, of `ceil(numel / 2)` elements, and the shards, gathered, are the model's parameters;
- a block's parameters hold its padded flat tensor's bytes during its forward, and 0 bytes after it, until backward;
- the first step's gradients, your shards' gathered and split by name, equal one process's within 1e-5 (relative, `course_lib.equivalence.compare_gradients`, which names a sum or a double division when it sees one), the sharded parameters and the replicated one compared apart. Two ranks of 8 rows and one process of 16 add the same terms in another order, so the last bits differ;
- the parameters after 3 steps of each optimizer equal `fully_shard`'s within 1e-6 (absolute): both average the same two gradients and run the same element-wise update; every rank holds the same replicated `scale`;
- per step, the bytes of each all-gather (a unit's padded flat tensor, before its forward and before its backward; the root's once is accepted too, since the root may keep its parameters from forward to backward), of each reduce-scatter, issued during backward, and of the all-reduce of `scale`.

A wrong answer names the check that failed, what was measured, and the mistake that usually causes it. A hang (a rank waiting in a collective the other never calls) ends at the timeout with each rank's last lines.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.fsdp import check_fsdp_lab

print(check_fsdp_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- Build each unit's `places` in `shard_model`: for every submodule of the unit (`module.modules()`), its parameters (`named_parameters(recurse=False)`) that are neither replicated nor already taken by an earlier unit or shard. Do the units first and the root last: by then the units' parameters are gone from their modules.
- `flat.chunk(N)[rank].clone()`: without the clone, the shard would keep the whole flat vector alive.
- `Gather.forward` receives the shard as a tensor input, so autograd will hand `Gather.backward`'s first result to the shard's `.grad`; `unit` is a plain Python argument (its gradient is `None`).
- `self.full` must be the tensor `Gather.apply` returned: the views autograd saves point at its storage, and `free()` and `before_backward` work on that storage.
- A forward hook that returns `None` leaves the output as it is. Register the hook on the output only when `output.requires_grad` (a forward under `torch.no_grad()` has no backward).
- `dist.all_reduce(p.grad)` sums in place; divide afterwards.

## Summary

- FSDP keeps one shard of each unit per rank and rebuilds the full parameters only while the unit runs, twice a step: for its forward and for its backward.
- The memory goes with `untyped_storage().resize_(0)`, not by dropping a reference, since autograd's saved views share the storage; the same storage is refilled before backward, through a tensor whose version counter autograd does not check.
- Autograd does the bookkeeping of completeness: the backward of the gather runs once, with the gradient of every use of the unit's parameters summed, which is the moment to reduce-scatter.

## References

- S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054).
- Y. Zhao et al., *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*, VLDB 2023, [arXiv:2304.11277](https://arxiv.org/abs/2304.11277).
- PyTorch: [`fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) (FSDP2), and [Extending PyTorch](https://pytorch.org/docs/stable/notes/extending.html) for `autograd.Function`.
"""
