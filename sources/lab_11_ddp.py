# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · DDP with overlapped buckets, by hand

Notebook 10 §1 built data parallelism in three stages and notebook 11 ran PyTorch's `DistributedDataParallel` in a real script. In this lab you write the mechanism yourself, whole, and it runs as two real processes beside `DistributedDataParallel` on the same model and data.

By the end you will have written, and seen pass against PyTorch's DDP:
- a wrapper that makes every replica start from rank 0's parameters and buffers;
- buckets built in the order backward produces gradients, with a frozen parameter left out;
- asynchronous all-reduces launched from gradient hooks, strictly in bucket order, while backward goes on;
- gradient accumulation with `no_sync()`, where nothing is communicated until the last micro-batch.

This lab assumes notebook 10 (§1, DDP by hand) and notebook 11 (DDP in practice). Expected time: about an hour.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the four places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_ddp.py`) and the check after it. The class's docstring is the specification. About 35 lines.

Three rules decide whether it is right, and each has a check of its own:

1. **Every rank issues the same collectives in the same order.** A bucket is launched only once every earlier bucket has been; here the model registers its head first and uses it last, so the head's bucket is complete before the others and must wait.
2. **The gradient the optimizer sees is the mean over the ranks**, divided once. The check compares gradients, not only losses or Adam's parameters: Adam's step does not change when every gradient is multiplied by a constant, so a sum where a mean belongs would pass a check on Adam alone.
3. **Communication overlaps backward**: the all-reduces start inside backward (`async_op=True` from the hook) and are waited for after it, in `finish()`.
"""

# %% slideshow={"slide_type": "-"}
import os

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_ddp.py
"""Lab: data parallelism by hand, the way DistributedDataParallel does it.

`BucketedDDP(module, bucket_cap_bytes)` wraps a model on every rank of the default process group:

- at construction every rank takes rank 0's parameters and buffers (a broadcast);
- the trainable parameters (not the frozen ones) are grouped into buckets, in reverse order of
  `module.parameters()` (the order backward produces their gradients), whole tensors, a bucket closed as soon
  as it holds at least `bucket_cap_bytes`; `self.buckets` is that list of lists of parameters;
- a hook per trainable parameter (`register_post_accumulate_grad_hook`) notes that its gradient is ready; when
  a bucket is complete and every earlier bucket has been launched, its gradients are flattened into one
  tensor, divided by the world size and all-reduced asynchronously (`async_op=True`), while backward goes on;
- `finish()`, called after backward, waits for every handle and copies the averaged values back into `.grad`;
- inside `with model.no_sync():` nothing is communicated (gradient accumulation): the next backward outside
  it all-reduces the accumulated sum.
"""

import contextlib
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_bytes=4096):
        super().__init__()
        self.module = module
        self.sync = True  # False inside no_sync()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        # YOUR CODE HERE
        raise NotImplementedError()

    def _grad_ready(self, p):
        """Called by p's hook once p.grad holds p's whole gradient for this backward."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def finish(self):
        # YOUR CODE HERE
        raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_ddp_lab()` starts 2 processes (gloo, CPU). In each, it builds your `BucketedDDP` around a small model created with a **different seed on each rank**, and `DistributedDataParallel` around the same model, then trains both for 2 steps of 2 micro-batches (the first inside `no_sync()`), once with SGD and once with AdamW, on the same data. It records every collective your code issues. It checks:

- after construction, every rank holds rank 0's parameters and buffers;
- `self.buckets` holds the 5 trainable parameters, not the frozen bias, which never gets a `.grad`;
- the first step's gradients equal DDP's (relative error ≤ 1e-5, `course_lib.equivalence.compare_gradients`, which names a sum or a double division when it sees one);
- the parameters after 2 SGD steps and after 2 AdamW steps equal DDP's within 1e-6: both runs add the same two numbers and divide by 2, so only the last bits could differ;
- nothing is communicated inside `no_sync()`; one all-reduce per bucket per step, in bucket order, the same on both ranks;
- the all-reduces start during backward and none is waited for during backward.

A wrong answer names the check that failed, what was measured, and the mistake that usually causes it. A hang (a rank waiting in a collective the other never calls) ends at the timeout with each rank's last lines.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.ddp import check_ddp_lab

print(check_ddp_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- `dist.broadcast(t, src=0)` works in place on each tensor; do it under `torch.no_grad()`.
- `reversed([p for p in module.parameters() if p.requires_grad])` is the order backward produces the gradients of a model that runs its layers in registration order: DDP's assumption, and yours. The head of this model breaks it, which is what the in-order rule is for.
- A hook registered with `p.register_post_accumulate_grad_hook(hook)` is called with `p` once `p.grad` holds its whole gradient. Reach the wrapper through a weak reference (`weakref.WeakMethod`), as notebook 10 §1 explains, so the parameters do not keep it alive.
- `torch.cat([q.grad.reshape(-1) for q in bucket])` is a new tensor: all-reduce it, keep the handle, and in `finish()` split it back (`flat.split([q.numel() for q in bucket])`) into each `q.grad`.
- Reset the per-step state (counts, the next bucket, the handles) at the end of `finish()`.

## Summary

- A replica wrapper does three things: make the replicas equal (broadcast), keep them equal (the mean gradient, on every rank), and hide the communication (asynchronous buckets started by hooks, in an order every rank shares).
- Matching one reference on gradients, not only on Adam's losses, is what catches a gradient-scale bug.

## References

- PyTorch: [`DistributedDataParallel`](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html) and its [design notes](https://pytorch.org/docs/stable/notes/ddp.html) (buckets, hooks, `no_sync`).
- S. Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020, [arXiv:2006.15704](https://arxiv.org/abs/2006.15704).
"""
