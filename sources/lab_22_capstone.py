# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · Assemble the training script

Notebook 22's script combines every technique of the course behind flags. In this lab you write the heart of such a script yourself: the training step, from the wrapping of the model to the optimizer, for data parallelism by DDP or by FSDP2, with gradient accumulation and gradient clipping. The check launches it the way you would, with `torchrun`, and holds it to the standard of notebook 22 §2: the **gradients** of its first step and its parameters after every step must match one process's, not only its losses.

By the end you will have written, and seen pass against one process:
- a training step that wraps a model in `DistributedDataParallel` or shards it with `fully_shard` on an explicit CPU mesh;
- gradient accumulation that communicates once per step (`no_sync`, `set_requires_gradient_sync`) and divides each micro-batch's loss so the step's gradient is the mean over the global batch;
- gradient clipping once per step with the norm of the whole gradient, across ranks;
- the records a comparison with one process needs: the first step's gradients, whole, before clipping.

This lab assumes notebooks 08 (accumulation), 11 (DDP), 19 (FSDP2) and 22 §2. Expected time: about an hour.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Write the body of `train()` in the cell below (about 33 lines): its docstring at the top of the file is the specification. The model, the data, the loss, the optimizer and saving come from `course_lib.labs.capstone`, so that the check can compute the one-process reference from the very same pieces. Run the cell (it writes `_runs/lab_capstone.py`), then the check.

What decides right from wrong:

1. **The step's gradient is the mean over the global batch**, exactly as one process computes it: each rank takes its own rows, each micro-batch's loss is divided by the number of micro-batches, and the ranks' gradients are averaged (by DDP or FSDP2) on the last micro-batch only.
2. **Clipping happens once per step**, after the last micro-batch and before the optimizer, on the norm of the whole gradient.
3. **The records are whole**: a gradient of an FSDP2 model is a DTensor holding this rank's shard; `.full_tensor()` gathers it.
"""

# %% slideshow={"slide_type": "-"}
import os

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_capstone.py
"""Lab: the training step of the capstone, assembled from flags, launched with torchrun.

    torchrun --nproc_per_node=2 lab_capstone.py --out DIR --dp ddp|fsdp2 --accum K --clip C --optim sgd|adamw

`train(args, rank, world)` trains the course's small model (`build_model()`, the same weights on every rank) for
`args.steps` steps. Each step's global batch (`global_batch(step)`, the same on every rank) is split between the
ranks (rank r takes rows r, r + world, ...), and each rank's rows into `args.accum` micro-batches:

- `--dp ddp`: the model wrapped in `DistributedDataParallel`; every micro-batch but the last inside `no_sync()`;
- `--dp fsdp2`: `fully_shard` on each `nn.Linear`, then on the model (an explicit CPU mesh: `init_device_mesh("cpu",
  (world,))`); `set_requires_gradient_sync(False)` for every micro-batch but the last, `True` for the last;
- each micro-batch's loss (`loss_fn`) divided by `args.accum` before `backward()`, so the step's gradient is the mean
  over the global batch, as one process computes it;
- `--clip C` (C > 0): `torch.nn.utils.clip_grad_norm_(model.parameters(), C)` once per step, after the last
  micro-batch (it computes the norm of the whole gradient, across ranks, on DTensors too);
- the optimizer: `make_optimizer(args.optim, parameters)`.

It returns what the check compares with one process, on every rank (rank 0's is saved):
- "first_grads": {name: the whole gradient of step 0, before clipping and before the optimizer} (a DTensor's
  gradient gathered with `.full_tensor()`);
- "params": {name: the whole parameter after the last step};
- "losses": [the global batch's loss, for each step].
"""

import argparse

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: notebook 11, section 10.2)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.labs.capstone import build_model, global_batch, loss_fn, make_optimizer, save
from course_lib.teardown import end_process_group


def whole(t):
    """A tensor whole on every rank: a DTensor's pieces gathered (a collective: every rank calls it)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def train(args, rank, world):
    model = build_model()
    # YOUR CODE HERE
    raise NotImplementedError()
    return {"first_grads": first_grads, "params": params, "losses": losses}


def parse(argv=None):
    p = argparse.ArgumentParser(description="the capstone's training step, assembled from flags")
    p.add_argument("--out", required=True)
    p.add_argument("--dp", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--optim", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    dist.init_process_group("gloo")
    finished = False
    try:
        result = train(args, dist.get_rank(), dist.get_world_size())
        save(result, args.out)
        del result
        finished = True
    finally:
        end_process_group(barrier=finished)


if __name__ == "__main__":
    main()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_capstone_lab()` runs your script on 2 processes (gloo, CPU) with three sets of flags: DDP with 2 micro-batches and SGD (launched with `torchrun`, through your `main()`), FSDP2 with 2 micro-batches, clipping at 0.5 and AdamW, and DDP with clipping and AdamW (these two as forked processes that call your `train()`, the same code started faster). For each, it computes one process on the whole global batch with the same model, data and optimizer, and checks:

- the first step's gradients against one process's, relative to their size, within 1e-5 (`course_lib.equivalence.compare_gradients`: it names a sum where a mean belongs, or an accumulation that forgot to divide);
- the parameters after 3 steps within 1e-5 of one process's.

Why 1e-5: the two ranks' rows are summed in another order than one process sums them, so the last bits differ (the largest differences are printed after `~`). Why gradients and not only parameters: with AdamW the parameters and the losses would not see a gradient multiplied by a constant (notebook 22 §2), and a wrong clipping point changes the gradients' size too.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.capstone import check_capstone_lab

print(check_capstone_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- The FSDP2 model is `model` itself after `fully_shard(model, ...)`: its class changes, and it gains `set_requires_gradient_sync`. Shard each `nn.Linear` first, then the whole model (notebook 19).
- DDP's `no_sync()` is a context manager; on the last micro-batch use any context that does nothing (`torch.enable_grad()` or `contextlib.nullcontext()`).
- `torch.nn.utils.clip_grad_norm_` returns the norm before clipping: print it on rank 0 if you want to see what clipping does to each step.
- The losses are for you: average them over the ranks with one `dist.all_reduce` per step.

## Summary

- A distributed training step equals one process when each rank takes its own rows, the micro-batch losses are divided by their number, the gradients are averaged once per step, and clipping sees the whole gradient.
- The proof is on the gradients: a comparison of losses or of Adam's parameters cannot see a constant factor on every gradient.

## References

- PyTorch: [`DistributedDataParallel.no_sync`](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), [`fully_shard` and `set_requires_gradient_sync`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), [`clip_grad_norm_`](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html).
- The `torchtitan` repository: the training loop of PyTorch's reference stack for large models.
"""
