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
        ### BEGIN SOLUTION
        ctx.unit = unit
        full = torch.empty(unit.padded, dtype=shard.dtype, device=shard.device)
        unit.all_gather(full)
        return full
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_full):
        """Reduce-scatter `grad_full`, divide by N, free the unit's full tensor: (the shard's gradient, None)."""
        ### BEGIN SOLUTION
        unit = ctx.unit
        mine = torch.empty(unit.padded // unit.world_size, dtype=grad_full.dtype, device=grad_full.device)
        dist.reduce_scatter_single(mine, grad_full.contiguous())  # chunk r of the sum over the ranks
        unit.free()  # this unit's backward is done
        return mine.div_(unit.world_size), None  # the mean, for the shard's .grad
        ### END SOLUTION


class Unit:
    """One unit: `places` lists (submodule, name) of its parameters, in order."""

    def __init__(self, module, places):
        self.module, self.places = module, places
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.full = None  # the gathered flat tensor, while it exists
        # Set self.padded (the padded length) and self.shard (chunk `rank`, an nn.Parameter registered on `module`
        # as "flat_shard"); remove the originals from their modules; register before_forward and after_forward.
        ### BEGIN SOLUTION
        params = [getattr(sub, name) for sub, name in places]
        self.shapes = [p.shape for p in params]
        total = sum(p.numel() for p in params)
        self.padded = math.ceil(total / self.world_size) * self.world_size
        flat = torch.zeros(self.padded, dtype=params[0].dtype, device=params[0].device)
        flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
        self.shard = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())
        for sub, name in places:
            del sub._parameters[name]
        module.register_parameter("flat_shard", self.shard)
        module.register_forward_pre_hook(self.before_forward)
        module.register_forward_hook(self.after_forward)
        ### END SOLUTION

    def all_gather(self, out):
        """Every rank's shard, into `out` (a flat tensor of `self.padded` elements)."""
        ### BEGIN SOLUTION
        dist.all_gather_single(out, self.shard.detach())
        ### END SOLUTION

    def free(self):
        """Free the memory of `self.full` (its storage resized to 0 bytes), if there is one."""
        ### BEGIN SOLUTION
        if self.full is not None:
            self.full.untyped_storage().resize_(0)
        ### END SOLUTION

    def before_forward(self, module, args):
        """Forward pre-hook: `self.full` from `Gather.apply`, and each place gets its view of it."""
        ### BEGIN SOLUTION
        self.full = Gather.apply(self.shard, self)
        offset = 0
        for (sub, name), shape in zip(self.places, self.shapes):
            setattr(sub, name, self.full[offset : offset + shape.numel()].view(shape))
            offset += shape.numel()
        ### END SOLUTION

    def after_forward(self, module, args, output):
        """Forward hook: free the full tensor; if `output` requires grad, hook `before_backward` on it."""
        ### BEGIN SOLUTION
        self.free()
        if output.requires_grad:
            output.register_hook(self.before_backward)
        ### END SOLUTION

    def before_backward(self, grad):
        """Hook on the unit's output: give `self.full` its bytes back and all-gather into them again."""
        ### BEGIN SOLUTION
        storage = self.full.untyped_storage()
        storage.resize_(self.full.numel() * self.full.element_size())
        alias = torch.empty(0, dtype=self.full.dtype, device=self.full.device).set_(storage)
        with torch.no_grad():
            self.all_gather(alias)
        ### END SOLUTION


def _all_reduce_mean(p):
    """The post-accumulate-grad hook of a replicated parameter."""
    ### BEGIN SOLUTION
    dist.all_reduce(p.grad)
    p.grad.div_(dist.get_world_size())
    ### END SOLUTION


def shard_model(model, units, replicated=()):
    """A Unit for each module of `units`, then for the root (`model`): the list, root last (see the top)."""
    ### BEGIN SOLUTION
    skip = {id(p) for p in replicated}
    for p in replicated:
        p.register_post_accumulate_grad_hook(_all_reduce_mean)
    done = []
    for module in [*units, model]:
        places = []
        for sub in module.modules():
            for name, p in sub.named_parameters(recurse=False):
                if id(p) not in skip:
                    places.append((sub, name))
                    skip.add(id(p))
        done.append(Unit(module, places))
        skip.add(id(done[-1].shard))
    return done
    ### END SOLUTION
