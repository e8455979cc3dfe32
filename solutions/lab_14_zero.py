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
        ### BEGIN SOLUTION
        for group in groups:
            options = {k: v for k, v in group.items() if k != "params"}
            trainable = [p for p in group["params"] if p.requires_grad]
            for dtype in dict.fromkeys(p.dtype for p in trainable):
                buffer = self._flatten([p for p in trainable if p.dtype == dtype])
                inner.append({**options, "params": [q for q in buffer["pieces"] if q is not None]})
        ### END SOLUTION
        self.opt = optimizer_class(inner, **defaults)

    def _flatten(self, params):
        """One padded flat buffer for `params` (all of one dtype); the parameters become views of it.

        Returns (and appends to self.buffers) a dict: "params", "flat" (the buffer), "shard" (the chunk length),
        "pieces" (for each parameter, an nn.Parameter viewing its part of this rank's chunk, or None).
        """
        ### BEGIN SOLUTION
        total = sum(p.numel() for p in params)
        shard = math.ceil(total / self.world_size)  # padded: every rank owns the same length
        flat = torch.zeros(shard * self.world_size, dtype=params[0].dtype, device=params[0].device)
        lo, hi = self.rank * shard, (self.rank + 1) * shard
        pieces, offset = [], 0
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            start, end = max(offset, lo), min(offset + n, hi)  # the part of p in my chunk, if any
            pieces.append(nn.Parameter(flat[start:end]) if start < end else None)
            offset += n
        buffer = {"params": params, "flat": flat, "shard": shard, "pieces": pieces}
        self.buffers.append(buffer)
        return buffer
        ### END SOLUTION

    def zero_grad(self):
        """Every parameter's and every piece's .grad set to None."""
        ### BEGIN SOLUTION
        for buffer in self.buffers:
            for p in buffer["params"]:
                p.grad = None
        self.opt.zero_grad()
        ### END SOLUTION

    @torch.no_grad()
    def step(self):
        """Reduce-scatter and average each buffer's gradients, step this rank's pieces, all-gather the buffers."""
        ### BEGIN SOLUTION
        for buffer in self.buffers:
            params, shard = buffer["params"], buffer["shard"]
            grads = torch.zeros_like(buffer["flat"])
            offset = 0
            for p in params:
                if p.grad is not None:
                    grads[offset : offset + p.numel()].copy_(p.grad.reshape(-1))
                offset += p.numel()
            used = torch.tensor([float(p.grad is not None) for p in params])
            dist.all_reduce(used, op=dist.ReduceOp.MAX)  # a gradient on any rank: DDP's rule
            chunk = torch.empty(shard, dtype=grads.dtype, device=grads.device)
            dist.reduce_scatter_single(chunk, grads)  # chunk r of the sum over the ranks
            chunk.div_(self.world_size)  # the mean, once
            del grads
            if self.stage == 2:
                for p in params:
                    p.grad = None  # only my chunk of the gradient is kept
            lo, offset = self.rank * shard, 0
            for p, piece, got in zip(params, buffer["pieces"], used.tolist()):
                if piece is not None:
                    start = max(offset, lo) - lo
                    piece.grad = chunk[start : start + piece.numel()] if got else None
                offset += p.numel()
        self.opt.step()  # my pieces only, with my state only
        for buffer in self.buffers:
            flat, shard = buffer["flat"], buffer["shard"]
            mine = flat[self.rank * shard : (self.rank + 1) * shard].clone()
            dist.all_gather_single(flat, mine)  # every chunk, into every rank's buffer
        ### END SOLUTION
