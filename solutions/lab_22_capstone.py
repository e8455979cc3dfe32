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
    ### BEGIN SOLUTION
    if args.dp == "ddp":
        net = DDP(model)
    else:
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    opt = make_optimizer(args.optim, model.parameters())
    first_grads, losses = {}, []
    for step in range(args.steps):
        x, y = global_batch(step)
        x, y = x[rank::world], y[rank::world]
        size = len(x) // args.accum
        total = torch.zeros(())
        for k in range(args.accum):
            last = k == args.accum - 1
            if args.dp == "fsdp2":
                net.set_requires_gradient_sync(last)
            context = net.no_sync() if args.dp == "ddp" and not last else torch.enable_grad()
            with context:
                loss = loss_fn(net(x[k * size : (k + 1) * size]), y[k * size : (k + 1) * size]) / args.accum
                loss.backward()
            total += loss.detach()
        if step == 0:
            first_grads = {name: whole(p.grad) for name, p in model.named_parameters()}
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    params = {name: whole(p) for name, p in model.named_parameters()}
    ### END SOLUTION
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
