# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 14 · Sharded data parallel: ZeRO and FSDP by hand

DDP (notebooks 09–11) keeps a full copy of the model on every rank: the parameters, their gradients and the optimizer's state, on each of `N` devices. With Adam that state is most of the memory, and it is the same on every rank. Sharded data parallelism keeps the data parallelism (every rank trains on its own slice of the batch) but stores each piece of model state on **one** rank only, and moves it with the two phases of an all-reduce: reduce-scatter and all-gather. This is ZeRO (Rajbhandari et al., 2020) and PyTorch's FSDP; when model state does not fit on one device, it is the first remedy to try.

By the end you will be able to:
- compute the bytes per rank of DDP and ZeRO stages 1, 2 and 3 for any model size, world size and optimizer, and check them against what real processes hold;
- write ZeRO-1 and ZeRO-2 as a sharded optimizer that takes parameter groups and any element-wise optimizer, skips frozen parameters, trains exactly like DDP and `ZeroRedundancyOptimizer`, and say which optimizers sharding by element suits;
- write FSDP (ZeRO-3) by hand: units flattened, padded and sharded, gathered by hooks before forward and again for backward, gradients reduce-scattered, an fp32 master shard with bf16 compute, equal to FSDP2;
- say what PyTorch's FSDP2 must match, collective for collective, and check that it does (notebook 15 then uses it).

This notebook assumes: notebook 04 (where training memory goes), 06 (master weights in mixed precision), 09 (reduce-scatter + all-gather = all-reduce), 10 (DDP by hand, its hooks) and 11 (DDP and launching). Its jobs hold FSDP2's parameters, which are `DTensor`s: `to_local()` is a rank's shard and `full_tensor()` gathers the whole (notebook 15 §2 explains them). No GPU: every distributed run here is CPU processes talking over gloo, launched with `course_lib.launch`, one launch per section, with the results right after the code that produced them. On a GPU machine, `COURSE_DEVICE=cuda` (notebook 00) runs the training jobs on GPUs with NCCL instead, one process per GPU.
"""

# %% slideshow={"slide_type": "-"}
import os
import sys
import time

import torch
import torch.distributed as dist

from course_lib.device import backend_for, course_device, course_ranks
from course_lib.equivalence import compare_gradients
from course_lib.launch import run_ranks
from course_lib.seeding import seed_everything
from course_lib.sharding import STAGES, model_state_bytes, rank_memory, zero_table

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
sys.path.insert(0, os.path.abspath("_runs"))
DEVICE = course_device()  # "cpu", unless COURSE_DEVICE=cuda asks for the GPU path (notebook 00)
RANKS = course_ranks(2)  # 2 processes on the CPU; on the GPU path one per GPU, at most 2

def launch(job, nprocs=None, args=(), device=None):
    """Run job(rank, world_size, device, *args) in new processes (gloo on the CPU, NCCL on GPUs); their results."""
    nprocs, device, start = nprocs or RANKS, device or DEVICE, time.perf_counter()
    results = run_ranks(job, nprocs=nprocs, args=(device, *args), device=device, backend=backend_for(device),
                        timeout=300, echo="none")
    print(f"{nprocs} processes: every rank finished with exit code 0 (~{time.perf_counter() - start:.0f} s)")
    return results

print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Memory per rank: the ZeRO count

Notebook 04 counted what training keeps between steps; per parameter, with `Ψ` parameters:

- **parameters**, `P` bytes each, **gradients**, `G` bytes each, and the **optimizer state**, `K` bytes each;
- mixed-precision Adam (notebook 06): bf16/fp16 parameters and gradients (`P = G = 2`), and in fp32 a master copy of the weights plus Adam's `m` and `v` (`K = 4 + 4 + 4 = 12`): **16 bytes per parameter**;
- plain fp32 Adam, what runs on this CPU: `P = G = 4`, `K = 8` (`m`, `v`): 16 bytes as well.

Notebook 06 §5's master-weight loop holds more at its peak: it turns each fp16 gradient into a new fp32 tensor before the step (`w32.grad = w16.grad.float()`), 4 bytes per parameter on top, 20 in all. That fp32 gradient is transient: it is needed only while the optimizer steps, so implementations make it one bucket or one shard at a time, or never (a fused optimizer reads the 16-bit gradient and converts it in registers). The count here is what is kept between steps, and it stays 16. (FSDP with fp32 gradient reduction, §3, keeps the fp32 gradient instead and no 16-bit copy of the parameters: 16 again.)

DDP keeps all 16 on every rank. ZeRO's three stages shard more and more of it over the `N` data-parallel ranks: stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the parameters (FSDP is stage 3). `course_lib.sharding` holds the count; its table for mixed-precision Adam:
"""

# %% slideshow={"slide_type": "fragment"}
print(zero_table((1, 2, 4, 8, 64)))
psi = 7_500_000_000  # the ZeRO paper's example: 7.5B parameters on 64 GPUs
paper = [round(model_state_bytes(psi, 64, s).total / 1e9, 1) for s in STAGES]
print("7.5B parameters, N=64, GB (10^9 bytes) per rank:", dict(zip(STAGES, paper)))
assert paper == [120.0, 31.4, 16.6, 1.9]  # the numbers of the paper's figure 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the table by rows. Stage 1 removes the largest term (12 of the 16 bytes) but stops at 4 bytes per parameter, however many ranks; stage 2 stops at 2; only stage 3 goes to zero as `N` grows. The paper's example checks out: 120 GB per GPU for DDP, 1.9 GB with stage 3. (GB here are 10⁹ bytes, as in the paper; the measured peaks below are in MiB, 2²⁰ bytes.)

What the table leaves out is the **activations**. No ZeRO stage shards them: each rank keeps the activations of its own micro-batch, as in notebook 04, and gradient checkpointing, not sharding, is the remedy there (`course_lib.sharding.activation_bytes` counts both cases with notebook 04's √L segments). The calculator below adds them up; its static version after it prints the same text for a few settings.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets

def describe(params_b, world_size, precision, stage, checkpointing, micro_batch):
    """What one rank holds, in GB: a 7B-like transformer layer stack (32 layers, 4096 wide, sequence 2048)."""
    per_layer = 2048 * 4096 * 2 * 16  # bytes of activations per sample and layer (bf16, ~16 tensors of the width)
    r = rank_memory(int(params_b * 1e9), world_size, stage, precision, micro_batch=micro_batch,
                    bytes_per_sample_per_layer=per_layer, layers=32, checkpointing=checkpointing)
    parts = ", ".join(f"{k} {r[k] / 1e9:.1f}" for k in ("parameters", "gradients", "optimizer"))
    state = r["total"] - r["activations"]
    return (f"{params_b:g}B params, N={world_size}, {precision}, {stage}: {parts}; model state {state / 1e9:.1f} GB "
            f"+ activations {r['activations'] / 1e9:.1f} GB = {r['total'] / 1e9:.1f} GB per rank")

controls = dict(
    params_b=widgets.FloatText(value=7.0, description="params (B):"),
    world_size=widgets.IntSlider(value=8, min=1, max=256, description="world size:"),
    precision=widgets.Dropdown(options=["mixed_adam", "fp32_adam", "fp32_sgd_momentum"], description="precision:"),
    stage=widgets.Dropdown(options=list(STAGES), value="zero3", description="stage:"),
    checkpointing=widgets.Checkbox(value=False, description="checkpointing"),
    micro_batch=widgets.IntSlider(value=1, min=0, max=16, description="micro-batch:"))
shown = widgets.Output()

def update(change=None):
    shown.outputs = ()
    shown.append_stdout(describe(**{k: w.value for k, w in controls.items()}) + "\n")

for w in controls.values():
    w.observe(update, names="value")
update()
display(widgets.VBox([*controls.values(), shown]))

# %% slideshow={"slide_type": "fragment"}
for stage in STAGES:  # static fallback: the same text for a few settings
    print(describe(7.0, 8, "mixed_adam", stage, False, 1))
print(describe(7.0, 8, "mixed_adam", "zero3", True, 1))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
For a 7B model on 8 devices, DDP needs 112.0 GB of model state per rank and ZeRO-3 14.0 GB; the activations of one sequence of 2048 tokens (8.6 GB without checkpointing, 3.0 GB with it, in this rough estimate) stay the same whatever the stage. The rest of this notebook checks the count on real processes: each stage is implemented, run, and what each rank holds is counted.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. ZeRO-1 and ZeRO-2 by hand: a sharded optimizer

DDP all-reduces the gradients, then every rank runs the same optimizer step on the same full state. ZeRO-1 notices that this step is done `N` times over, and splits it:

1. backward as usual, into one flat gradient buffer;
2. **reduce-scatter** the buffer: rank `r` receives only chunk `r` of the summed gradient, and divides it by `N` (the mean);
3. each rank runs the optimizer on **its chunk of the parameters only**, with optimizer state for that chunk only (`K Ψ / N` bytes);
4. **all-gather** the parameter chunks, so every rank again holds the full, updated parameters for the next forward.

ZeRO-2 is the same step, but after the reduce-scatter a rank keeps only its chunk of the gradients (`G Ψ / N`) and drops the rest. (Real implementations reduce-scatter bucket by bucket during backward, so the full gradient never exists at once; here it does, briefly, which shows in the peak but not in what is kept.)

Every section trains the same model, written first (`_runs/model.py`): four `Linear` layers of 256, the same seeded weights in every process, and a global batch per step of which rank `r` takes rows `r, r + N, ...`. Its `shard_model` is FSDP2's (notebook 15 §1 takes it apart), used from section 3 on.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/model.py
"""The model every section of notebook 14 trains, its batches and its loss; FSDP2's sharding of it (notebook 15 §1)."""
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from course_lib.seeding import seed_everything

# FSDP2's hooks warn about patterns this small model does not use (in-place ops on outputs, inputs without grad)
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message="Full backward hook is firing.*")

WIDTH, DEPTH, LR = 256, 4, 1e-3

def make_model(width=WIDTH, depth=DEPTH, device="cpu"):
    # the same weights in every process; on a GPU deterministic kernels too: runs are compared bit for bit (notebook 00)
    seed_everything(0, deterministic=str(device).startswith("cuda"))
    layers = [m for _ in range(depth - 1) for m in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(*layers, nn.Linear(width, width)).to(device)

def batch(step, rank, world_size, per_rank=8, width=WIDTH, device="cpu"):
    """The global batch of a step (the same draw on every rank); rank r keeps rows r, r + N, ..."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(per_rank * world_size, width, generator=g)
    y = torch.randn(per_rank * world_size, width, generator=g)
    return x[rank::world_size].to(device), y[rank::world_size].to(device)

def loss_fn(model, x, y):
    return F.mse_loss(model(x).float(), y)  # the loss in fp32, also when the model computes in bf16

def train_step(model, opt, x, y, **zero_grad_options):
    opt.zero_grad(**zero_grad_options)
    loss_fn(model, x, y).backward()
    opt.step()

def shard_model(model, **kwargs):
    """FSDP2: every Linear is one unit (gathered and freed together), then the root. The mesh is given, on the model's
    device: without one, fully_shard builds one on the accelerator it finds (torch._C._get_accelerator()), so on a GPU
    machine a CPU job would move its inputs to CUDA."""
    device = next(model.parameters()).device.type
    kwargs.setdefault("mesh", init_device_mesh(device, (dist.get_world_size(),)))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`HandZero` below is written as an optimizer a real training script can use, not only for this model:

- it takes **parameters or parameter groups** (each group with its own options, such as weight decay on the weights only) and the **optimizer class** to run on the chunks, with its options: `HandZero(groups, torch.optim.AdamW, stage=1, lr=1e-3)`;
- it **leaves out every parameter that does not require grad** (freezing: notebook 01 §6): a frozen parameter is not sharded, not stepped, and never decayed (§2.3 shows why "never");
- it flattens each group into one buffer per dtype (a bf16 model stays bf16), padded so that every rank owns the same length, so a chunk may cut a tensor in two: right only for **element-wise** optimizers, which it checks (§2.3). The inner optimizer gets one piece per parameter (the part of it in this rank's chunk), so that, as in `torch.optim`, a parameter that got no gradient in a step is skipped, not decayed: a post-accumulate-grad hook marks the parameters backward reached, and one small all-reduce makes the ranks agree;
- it **replaces DDP**: its reduce-scatter is the gradient communication, and it divides by `N` once. Wrapped in DDP as well, the gradients would arrive averaged and be averaged again; `course_lib.sharded_optim.ShardedOptimizer`, the library's version, reads already-averaged gradients under DDP and averages them itself only when asked (`reduce_gradients=True`).

The collectives work **in place** on the flat buffers: rank `r`'s output is chunk `r` of the input, which is how NCCL defines in-place reduce-scatter and all-gather too, so no extra buffer is needed.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/zero.py
"""ZeRO stage 1 or 2 by hand: a sharded optimizer around any element-wise torch.optim class."""
import math
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

from course_lib.sharded_optim import ELEMENTWISE_OPTIMIZERS  # SGD, Adam, AdamW, ...: see section 2.3

class HandZero:
    """ZeRO stage 1 or 2: each group's trainable parameters live in flat buffers (one per dtype); rank r owns chunk r."""

    def __init__(self, params, optimizer_class, stage=1, **defaults):
        if not issubclass(optimizer_class, ELEMENTWISE_OPTIMIZERS):
            raise ValueError(f"{optimizer_class.__name__} is not element-wise: shard it by whole parameters instead")
        groups = list(params)
        groups = groups if isinstance(groups[0], dict) else [{"params": groups}]  # plain parameters: one group
        self.stage, self.rank, self.n = stage, dist.get_rank(), dist.get_world_size()
        self.flats, inner = [], []
        for group in groups:
            options = {k: v for k, v in group.items() if k != "params"}
            trainable = [p for p in group["params"] if p.requires_grad]  # frozen: not sharded, stepped or decayed
            for dtype in dict.fromkeys(p.dtype for p in trainable):      # one buffer per dtype: bf16 stays bf16
                flat = self._flatten([p for p in trainable if p.dtype == dtype])
                inner.append({**options, "params": [q for q in flat["pieces"] if q is not None]})
        self.opt = optimizer_class(inner, **defaults)                  # optimizer state for my pieces only
        self.sent = 0                                                   # bytes this rank sends (ring algorithms)
        used = weakref.WeakMethod(self._used)   # a weak reference, as in notebook 10 §1: the hooks make no cycle
        for f in self.flats:
            for p in f["params"]:
                p.register_post_accumulate_grad_hook(lambda p: used()(p))

    def _flatten(self, params):
        shard = math.ceil(sum(p.numel() for p in params) / self.n)      # padded: every rank owns the same length
        flat = torch.zeros(shard * self.n, dtype=params[0].dtype, device=params[0].device)
        lo, hi, offset, pieces = self.rank * shard, (self.rank + 1) * shard, 0, []
        for p in params:                                                # the parameters become views of the buffer
            flat[offset:offset + p.numel()].copy_(p.detach().flatten())
            p.data = flat[offset:offset + p.numel()].view_as(p)
            start, end = max(offset, lo), min(offset + p.numel(), hi)   # the part of p in my chunk, if any
            pieces.append(nn.Parameter(flat[start:end]) if start < end else None)  # a view: updated in place
            offset += p.numel()
        f = {"params": params, "flat": flat, "shard": shard, "pieces": pieces, "grads": None,
             "used": torch.zeros(len(params), device=flat.device)}      # which parameters got a gradient this step
        self.flats.append(f)
        return f

    def _used(self, p):
        for f in self.flats:
            for i, q in enumerate(f["params"]):
                if q is p:
                    f["used"][i] = 1

    def zero_grad(self):
        for f in self.flats:
            if f["grads"] is None:                                      # stage 2 makes it anew for every step
                f["grads"] = torch.zeros_like(f["flat"])
                offset = 0
                for p in f["params"]:                                   # backward accumulates into these views
                    p.grad = f["grads"][offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
            else:                                                       # stage 1 keeps it between steps
                f["grads"].zero_()

    def step(self):
        for f in self.flats:
            grads, lo = f["grads"], self.rank * f["shard"]
            dist.all_reduce(f["used"], op=dist.ReduceOp.MAX)            # got a gradient on any rank: DDP's rule
            chunk = grads[lo:lo + f["shard"]]
            dist.reduce_scatter_single(chunk, grads)                    # in place: chunk r receives chunk r of the sum
            self.sent += (self.n - 1) * chunk.numel() * chunk.element_size()  # a ring reduce-scatter: (N-1)/N of it
            chunk.div_(self.n)                                          # the mean, once
            if self.stage == 2:                                         # keep my chunk, drop the rest
                chunk = chunk.clone()
                for p in f["params"]:
                    p.grad = None
                # free the full buffer now, on this thread (gloo's thread may still hold a reference to it)
                grads.untyped_storage().resize_(0)
                f["grads"] = None
            offset = 0
            for p, piece, used in zip(f["params"], f["pieces"], f["used"].tolist()):
                if piece is not None:                                   # a parameter without a gradient is skipped,
                    start = max(offset, lo) - lo                        # as torch.optim skips p.grad = None
                    piece.grad = chunk[start:start + piece.numel()] if used else None
                offset += p.numel()
        self.opt.step()                                                 # the optimizer on my pieces, my state only
        for f in self.flats:
            lo = self.rank * f["shard"]
            dist.all_gather_single(f["flat"], f["flat"][lo:lo + f["shard"]])  # in place: my chunk in, the whole buffer out
            self.sent += (self.n - 1) * f["shard"] * f["flat"].element_size()  # (N-1)/N of it again
            f["used"].zero_()


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The job of this section (`_runs/zero_job.py`) trains the model four ways for 3 Adam steps: DDP, ZeRO-1 and ZeRO-2 by hand, and PyTorch's built-in ZeRO-1, `ZeroRedundancyOptimizer` (which shards the optimizer by whole parameters and broadcasts each updated parameter from its owner). `measure_stage` runs each inside the course's allocator meter (`course_lib.memory.measure_peak`, notebook 04), counts the bytes of the tensors the rank holds, and keeps the final parameters. `fine_tuning` then trains a fine-tuning setup for §2.3: the first layer frozen, AdamW with weight decay on the weights only.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/zero_job.py
"""Section 2's job: DDP, ZeRO-1/2 by hand and ZeroRedundancyOptimizer; what each rank holds; first gradients; fine-tuning."""
import math
from functools import partial

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.memory import measure_peak
from course_lib.sharded_optim import ShardedOptimizer
from model import LR, batch, make_model, train_step
from zero import HandZero

def counting_hook(count, bucket):
    """A communication hook; its state, `count`, adds up the bytes of the gradient buckets DDP all-reduced."""
    count["bucket_bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return allreduce_hook(None, bucket)                         # DDP's default: all-reduce, divide by N

def build(kind, device="cpu"):
    """A model, the object holding its optimizer, a step function, and the bytes DDP all-reduced (a dict)."""
    model, count = make_model(device=device), {"bucket_bytes": 0}
    if kind in ("ddp", "zero1_builtin"):
        # init_sync=False: every rank built the same seeded weights, so skip DDP's initial broadcast;
        # gradient_as_bucket_view=True: .grad are views of DDP's buckets, not a second copy
        model = DDP(model, gradient_as_bucket_view=True, init_sync=False)
        # DDP's C++ reducer keeps the hook and its state: neither may refer back to the model (a method of an object
        # holding it would), or model -> reducer -> hook -> model is a cycle no garbage collector can see
        model.register_comm_hook(count, counting_hook)
        opt = (torch.optim.Adam(model.parameters(), lr=LR) if kind == "ddp"
               else ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR))
        return model, opt, partial(train_step, model, opt, set_to_none=False), count  # .grad: the bucket views
    if kind in ("zero1", "zero2"):
        opt = HandZero(model.parameters(), torch.optim.Adam, stage=int(kind[-1]), lr=LR)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return model, opt, partial(train_step, model, opt), count

class SummedZero(HandZero):
    """A planted bug: ZeRO-1 that keeps the reduce-scatter's sum and never divides it by N."""

    def step(self):
        n, self.n = self.n, 1                                   # HandZero.step's chunk.div_(self.n) now divides by 1
        try:
            super().step()
        finally:
            self.n = n

def first_step(rank, n, kind, steps=3, device="cpu"):
    """The first step's averaged gradient as this rank's optimizer sees it (ZeRO: its chunk; DDP: the same range of
    its all-reduced gradient), and the parameters after `steps` Adam steps."""
    model = make_model(device=device)
    if kind == "ddp":
        net, opt = DDP(model, init_sync=False), torch.optim.Adam(model.parameters(), lr=LR)
    else:
        net, zero = model, {"zero1": HandZero, "zero2": HandZero, "summed": SummedZero}[kind]
        opt = zero(model.parameters(), torch.optim.Adam, stage=2 if kind == "zero2" else 1, lr=LR)
    for s in range(steps):
        train_step(net, opt, *batch(s, rank, n, device=device))
        if s == 0 and kind == "ddp":                            # cut like HandZero's flat buffer: chunk `rank`
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            shard = math.ceil(flat.numel() / n)
            grad = flat[rank * shard:(rank + 1) * shard].clone()
        elif s == 0:                                            # the pieces' .grad: my chunk of the mean
            grad = torch.cat([q.grad.flatten() for f in opt.flats for q in f["pieces"] if q is not None]).clone()
    return {"grad": grad.cpu(), "params": torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()}

def held_bytes(model, opt):
    """Bytes of the tensors this rank holds: parameters, gradients, optimizer state (each storage once)."""
    def storages(tensors):
        seen, total = set(), 0
        for t in tensors:
            s = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
            if s.nbytes() and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        return total

    if isinstance(opt, HandZero):
        grads = []                                              # stage 1: the flat buffer; stage 2: my chunk
        for f in opt.flats:
            kept = [q.grad for q in f["pieces"] if q is not None and q.grad is not None]
            grads += [f["grads"]] if f["grads"] is not None else kept
        states = opt.opt.state.values()
    else:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        states = (opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt).state.values()
    state = [v for s in states for k, v in s.items() if k != "step"]  # Adam's step counter: a scalar
    return {"parameters": storages(model.parameters()), "gradients": storages(grads), "optimizer": storages(state)}

def measure_stage(rank, n, kind, steps=3, device="cpu"):
    def run():
        model, opt, step, count = build(kind, device)
        for s in range(steps):
            step(*batch(s, rank, n, device=device))
        return model, opt, count

    memory = measure_peak(run, device=device)                   # everything returned stays allocated
    model, opt, count = memory.result
    params = list(model.parameters())                           # DDP or ZeRO: plain tensors, whole on every rank
    return {"held": held_bytes(model, opt), "retained": memory.retained_bytes, "peak": memory.peak_bytes,
            "params": torch.cat([p.detach().flatten() for p in params]).cpu(), "numel": sum(p.numel() for p in params),
            "sent": getattr(opt, "sent", None), "ddp_bucket_bytes": count["bucket_bytes"]}

def fine_tuning(rank, n, kind, steps=5, device="cpu"):
    """The first layer frozen, AdamW with weight decay on the weights only; the final parameters."""
    model = make_model(device=device)
    model[0].requires_grad_(False)                              # frozen, as in fine-tuning
    frozen = model[0].weight.detach().clone()
    groups = [{"params": [m.weight for m in model if isinstance(m, nn.Linear)], "weight_decay": 0.1},
              {"params": [m.bias for m in model if isinstance(m, nn.Linear)], "weight_decay": 0.0}]
    net = model if kind in ("zero1", "zero2", "library_element") else DDP(model, init_sync=False)
    if kind == "ddp":
        opt = torch.optim.AdamW(groups, lr=LR)
    elif kind == "zero1_builtin":                               # ZeroRedundancyOptimizer, under DDP
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=0.1)
        opt.add_param_group(groups[1])
    elif kind in ("zero1", "zero2"):                             # ours, without DDP: its reduce-scatter averages
        opt = HandZero(groups, torch.optim.AdamW, stage=int(kind[-1]), lr=LR)
    elif kind == "library_element":                             # course_lib's twin of ours, without DDP
        opt = ShardedOptimizer(groups, torch.optim.AdamW, shard_by="element", reduce_gradients=True, lr=LR)
    else:                                                       # course_lib's, by whole parameters, under DDP
        opt = ShardedOptimizer(groups, torch.optim.AdamW, shard_by="parameter", lr=LR)
    for s in range(steps):
        train_step(net, opt, *batch(s, rank, n, device=device))
    return {"params": torch.cat([p.detach().flatten() for p in model.parameters()]).cpu(),
            "frozen unchanged": torch.equal(model[0].weight, frozen)}

def report(rank, n, device):
    tuning = ["ddp", "zero1_builtin", "zero1", "zero2", "library_element", "library_parameter"]
    return {"memory": {kind: measure_stage(rank, n, kind, device=device) for kind in ("ddp", "zero1", "zero1_builtin", "zero2")},
            "first_step": {kind: first_step(rank, n, kind, device=device) for kind in ("ddp", "zero1", "zero2", "summed")},
            "fine_tuning": {kind: fine_tuning(rank, n, kind, device=device) for kind in tuning}}


# %% slideshow={"slide_type": "fragment"}
zero_runs = launch("_runs/zero_job.py:report")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 2.1 What each rank holds, against the model

For every way of training, on each rank: the bytes of the parameters, gradients and optimizer state it holds after 3 steps (counted from the tensors, each storage once: exact), against the model of section 1 for the same stage (fp32 Adam); and the highest point the allocator meter saw during the 3 steps (`~`: it includes activations and temporaries, and depends on the machine).
"""

# %% slideshow={"slide_type": "fragment"}
memory = [r["memory"] for r in zero_runs]
numel = memory[0]["ddp"]["numel"]
print(f"model: {numel:,} parameters, fp32 Adam, N={RANKS}; bytes per rank")
print(f"{'':<14}{'parameters':>11}{'gradients':>11}{'optimizer':>11}{'held':>11}{'model':>11}   allocator peak")
for kind, stage in {"ddp": "ddp", "zero1": "zero1", "zero1_builtin": "zero1", "zero2": "zero2"}.items():
    model = model_state_bytes(numel, RANKS, stage, "fp32_adam")
    for r in memory:
        h = r[kind]["held"]
        assert (h["parameters"], h["gradients"], h["optimizer"]) == (model.parameters, model.gradients, model.optimizer_state)
        assert r[kind]["peak"] >= model.total  # the allocator saw at least the state at some point
    h = memory[0][kind]["held"]
    print(f"{kind:<14}{h['parameters']:>11,}{h['gradients']:>11,}{h['optimizer']:>11,}{sum(h.values()):>11,}"
          f"{model.total:>11,}   ~{memory[0][kind]['peak'] / 2**20:.2f} MiB")
print("held bytes = the model's, part by part, on every rank")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The tensors each rank holds are exactly the model's count, part by part: both versions of ZeRO-1 keep half of DDP's optimizer state on each of the 2 ranks, ZeRO-2 also half the gradients. The peaks are another matter: our ZeRO-1 and ZeRO-2 peak **higher** than DDP here, not lower (only `ZeroRedundancyOptimizer`, which sends parameter by parameter, peaks lower). A peak is the most that exists at one moment of a step, and sharding shrinks what is kept, not what a step makes for a moment. On gloo, a reduce-scatter or an all-gather of the whole flat buffer makes a temporary about as large as the buffer (gloo builds its reduce-scatter from all-reduces, §2.2), where DDP's in-place all-reduce of a bucket makes none; and ZeRO-2's full flat gradient buffer exists in every step until its reduce-scatter. On this small model, the optimizer state that sharding saves (half of Adam's state, the 1,052,672 bytes of the optimizer column) is the size of those temporaries, so they decide the peak. Real implementations reduce-scatter bucket by bucket during backward, so neither the full buffer nor a temporary of its size exists at once, and at scale the optimizer state dwarfs a bucket: there the peak falls with what is kept.

Why count tensors rather than read the allocator's "still allocated" total? On gloo, a collective's work object keeps references to its tensors, and to any temporary it made, until gloo's worker thread is done with it, and the last reference is often dropped **on that thread**. The profiler behind `measure_peak` records allocations and frees of the threads it profiles, so such a free goes unseen, and the running total ends higher than what is really allocated, by a different amount from run to run. On a GPU, `torch.cuda.memory_allocated` has no such blind spot.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 2.2 ZeRO trains exactly like DDP, and sends the same bytes

After 3 Adam steps, every sharded version holds the parameters DDP holds. The byte counts: `HandZero` added up `(N-1)/N` of the buffer per collective; DDP's communication hook saw its gradient buckets, whose ring all-reduce costs `2 (N-1)/N` of their size (`ring_bytes_formula`, from notebook 09).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.allreduce_sim import ring_bytes_formula

ddp = memory[0]["ddp"]
for kind in ("zero1", "zero1_builtin", "zero2"):
    assert all(torch.allclose(r[kind]["params"], ddp["params"], rtol=0, atol=1e-6) for r in memory), kind
    print(f"{kind:<14} parameters after 3 steps allclose to DDP's (atol 1e-6): True")
ddp_sent = ring_bytes_formula(ddp["ddp_bucket_bytes"], RANKS)
for kind in ("zero1", "zero2"):
    sent = memory[0][kind]["sent"]
    print(f"{kind}: reduce-scatter + all-gather sent {sent:,} bytes in 3 steps; DDP's ring all-reduce {ddp_sent:,.0f}")
    assert sent == ddp_sent == 3 * 2 * (RANKS - 1) / RANKS * 4 * numel

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Same bytes.** A ring reduce-scatter sends `(N-1)/N` of the buffer and a ring all-gather another `(N-1)/N`: together `2 (N-1)/N · S`, which is exactly what a ring all-reduce sends (notebook 09). That is not a coincidence: a ring all-reduce *is* a reduce-scatter followed by an all-gather. DDP all-gathers the reduced gradients and then every rank computes the same update; ZeRO all-gathers the *updated parameters* instead. Same traffic, and the optimizer's work and memory are divided by `N`. (Gloo itself implements reduce-scatter with all-reduces, so it sends more than this count; the count is that of the ring algorithms NCCL uses.)
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Same gradients, and a check that can fail.** Parameters after Adam's steps are a weak witness. Adam divides each step by the running root mean square of the gradients, so a gradient off by a constant factor moves the weights almost as the right one does. The job therefore also kept the first step's averaged gradient as each rank's optimizer received it: for ZeRO, the reduce-scattered chunk; for DDP, the same range of its all-reduced gradient. It also ran a planted bug, `SummedZero`: our ZeRO-1 with the division by `N` left out, so its gradients are `N` times the mean. On Adam's first step the update is `lr · g / (|g| + eps)`, so scaling `g` changes it by only about `lr · eps / |g|` (`eps` = 1e-8): the planted run drifts from DDP's only where gradients are small.
"""

# %% slideshow={"slide_type": "fragment"}
first = [r["first_step"] for r in zero_runs]
for kind in ("zero1", "zero2"):
    checks = [compare_gradients(f[kind]["grad"], f["ddp"]["grad"], world_size=RANKS, against="DDP") for f in first]
    assert all(checks), kind
    print(f"{kind}: first step, rank 0's chunk: {checks[0]}")
if RANKS > 1:  # on one rank a sum is the mean: there is no bug to plant
    gaps = torch.cat([(f["summed"]["params"] - f["ddp"]["params"]).abs() for f in first])
    close = (gaps <= 1e-6).float().mean().item()
    print(f"planted bug (the sum, not the mean): after 3 Adam steps ~{close:.1%} of the parameters are within 1e-6 "
          f"of DDP's, the largest gap ~{gaps.max().item():.0e}")
    caught = [compare_gradients(f["summed"]["grad"], f["ddp"]["grad"], world_size=RANKS, against="DDP") for f in first]
    c = caught[0]
    print(f"its first step, rank 0: relative error {c.max_rel_error:.3g}, norm ratio {c.norm_ratio:.4f}: {c.diagnosis}")
    assert close > 0.9 and not any(caught) and all(abs(c.norm_ratio - RANKS) < 1e-3 for c in caught)

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
A parameter check with a tight tolerance happens to notice this bug here, through the few parameters with small gradients; a looser one, a loss curve, or a model with larger gradients would not. The gradient check names it on the first step: every gradient is `N` times DDP's.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 2.3 Real models: parameter groups, frozen parameters, which optimizers

The fine-tuning run: the first layer frozen, AdamW with weight decay 0.1 on the weights and none on the biases, 5 steps. Every way of sharding the optimizer must end where DDP with a plain AdamW ends, with the frozen layer untouched. Two of them run under DDP, which averages the gradients: `ZeroRedundancyOptimizer`, and `course_lib`'s `ShardedOptimizer` sharding by whole parameters. Three run without it and average in their reduce-scatter: ours at stages 1 and 2, and `ShardedOptimizer(shard_by="element", reduce_gradients=True)`, the library's version of ours.
"""

# %% slideshow={"slide_type": "fragment"}
tuned = [r["fine_tuning"] for r in zero_runs]
for kind in [k for k in tuned[0] if k != "ddp"]:
    same = all(torch.equal(t[kind]["params"], t["ddp"]["params"]) for t in tuned)
    frozen = all(t[kind]["frozen unchanged"] for t in tuned)
    print(f"{kind:<18} equal to DDP + AdamW (torch.equal): {same}; frozen layer unchanged: {frozen}")
    assert same and frozen

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Equal to the bit: the same element-wise AdamW on the same averaged gradients (summing two numbers and halving is exact in floating point, whichever rank adds first). And under DDP nothing was averaged twice: `ShardedOptimizer` there communicates only parameters.

Why must the frozen layer be **left out**, not merely given no gradient to speak of? A version that puts every parameter into its flat buffer hands the frozen one a gradient of zeros instead of none, and AdamW's decoupled weight decay shrinks every parameter it steps, gradient or not. One parameter at 2.0, a zero gradient, AdamW with learning rate 0.1 and weight decay 0.1, 10 steps:
"""

# %% slideshow={"slide_type": "fragment"}
w = torch.full((1,), 2.0, requires_grad=True)
opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.1)
for _ in range(10):
    w.grad = torch.zeros_like(w)  # what a frozen parameter gets inside a flat buffer
    opt.step()
print(f"a zero gradient, 10 AdamW steps: 2.0 -> {w.item():.4f} (= 2.0 x (1 - 0.1 x 0.1)^10 = {2.0 * 0.99 ** 10:.4f})")
assert abs(w.item() - 2.0 * 0.99**10) < 1e-6

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Which optimizers can be sharded by element?** Cutting a flat buffer into chunks, as `HandZero` does (and FSDP, section 3), is right only when each element's update depends on that element's gradient and state alone: SGD, Adam, AdamW and the others in `course_lib.sharded_optim.ELEMENTWISE_OPTIMIZERS`. An optimizer that looks at a whole tensor (Adafactor's second moment, factored over the rows and columns of a matrix; LAMB's per-tensor norms; Muon's orthogonalised matrix update) computes something else on a chunk. Sharding by **whole parameters**, as `ZeroRedundancyOptimizer` and `ShardedOptimizer(shard_by="parameter")` do, suits every optimizer, at the price of uneven shares (a large embedding is one rank's alone). The check below steps a 6×4 matrix whole, and as two flat chunks:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.errors import expect_error
from course_lib.sharded_optim import ELEMENTWISE_OPTIMIZERS
from zero import HandZero

w0, g = torch.randn(6, 4), torch.randn(6, 4)

def step_once(optimizer_class, w, grad):
    w = w.clone().requires_grad_()
    w.grad = grad.clone()
    optimizer_class([w], lr=0.1).step()
    return w.detach()

for cls in (torch.optim.AdamW, torch.optim.Adafactor):
    whole = step_once(cls, w0, g)
    chunks = torch.cat([step_once(cls, c, d) for c, d in zip(w0.flatten().chunk(2), g.flatten().chunk(2))])
    same = torch.equal(chunks.view(6, 4), whole)
    print(f"{cls.__name__:<9} stepped as two flat chunks = stepped whole: {same}")
    assert same == (cls in ELEMENTWISE_OPTIMIZERS)
with expect_error(ValueError, match="not element-wise"):
    HandZero([torch.nn.Parameter(w0)], torch.optim.Adafactor, lr=0.1)
print("element-wise:", ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. ZeRO-3 by hand: FSDP in one page

Stage 3 also shards the parameters, so a layer's weights must be gathered before it runs and freed after. FSDP does this per **unit**, a module whose parameters are gathered and freed together (here: each `Linear`). The script below writes it by hand, with notebook 06's master weights built in:

- **flatten, pad, shard**: a unit's parameters are concatenated into one flat vector, padded to a multiple of `N`, and rank `r` keeps chunk `r` as an fp32 `nn.Parameter`, the **master shard**: the only copy of those weights on the rank. It is registered on the unit, so `model.parameters()` yields the shards and any optimizer steps them; the original parameters are removed from their modules;
- **pre-forward hook**: all-gather the shards, cast to the compute dtype first (bf16: half the bytes on the wire), into a full flat tensor; give each module views of it in place of its parameters; cast the unit's inputs to bf16;
- **post-forward hook**: free the full tensor's memory (`untyped_storage().resize_(0)`: the tensor object stays, and so do the views autograd saved for backward, but their bytes go), and hook the unit's output;
- **before the unit's backward** (the hook on its output fires when the gradient reaches it): all-gather again, into the same storage, so the saved views see the weights again;
- **backward of the gather**: the gather is an `autograd.Function`, so its backward receives the gradient of the whole flat tensor; cast it to fp32, **reduce-scatter** it, divide by `N` once, and return it as the master shard's gradient; free the full tensor again;
- **optimizer step**: a plain `torch.optim.AdamW` on the fp32 master shards.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/fsdp_by_hand.py
"""FSDP by hand (ZeRO-3): each unit's parameters flattened, padded and sharded; gathered before forward, freed,
gathered again for backward; gradients reduce-scattered in fp32; an fp32 master shard, compute in bf16."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

class Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards into its full flat parameters. Backward: reduce-scatter their gradient."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        full = torch.empty(unit.padded, dtype=unit.dtype, device=shard.device)
        unit.all_gather(full)
        return full

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        grad = grad_full.float()                                  # reduce in fp32, not in the compute dtype
        mine = torch.empty(unit.padded // unit.n, device=grad.device)
        dist.reduce_scatter_single(mine, grad)                    # chunk r of the sum over the ranks
        unit.log.append(("reduce_scatter", grad.numel() * grad.element_size()))
        unit.free()                                               # this unit's backward is done
        return mine.div_(unit.n), None                            # the mean, for the fp32 master shard

class Unit:
    def __init__(self, module, dtype, log, gathered):
        self.dtype, self.log, self.gathered = dtype, log, gathered
        self.n, rank = dist.get_world_size(), dist.get_rank()
        self.places = [(m, name, p) for m in module.modules() for name, p in m.named_parameters(recurse=False)]
        total = sum(p.numel() for *_, p in self.places)
        self.padded = math.ceil(total / self.n) * self.n            # padded: every rank owns the same length
        flat = torch.zeros(self.padded, device=self.places[0][2].device)
        flat[:total] = torch.cat([p.detach().flatten() for *_, p in self.places])
        self.shard = nn.Parameter(flat.chunk(self.n)[rank].clone())  # the fp32 master shard: all this rank keeps
        for m, name, _ in self.places:
            del m._parameters[name]                               # the modules no longer own their parameters
        module.register_parameter("flat_shard", self.shard)       # model.parameters() yields the shards
        module.register_forward_pre_hook(self.before_forward)
        module.register_forward_hook(self.after_forward)

    def all_gather(self, out):
        dist.all_gather_single(out, self.shard.detach().to(self.dtype))  # each shard, cast, into the full tensor
        self.log.append(("all_gather", out.numel() * out.element_size()))
        self.gathered["now"] += out.numel() * out.element_size()  # bytes of full parameters held right now
        self.gathered["peak"] = max(self.gathered["peak"], self.gathered["now"])

    def free(self):
        if self.full.untyped_storage().nbytes():
            self.full.untyped_storage().resize_(0)                # the memory goes; the tensor object stays
            self.gathered["now"] -= self.full.numel() * self.full.element_size()

    def before_forward(self, module, args):
        self.full = Gather.apply(self.shard, self)
        offset = 0
        for m, name, p in self.places:                            # each module gets views of the full tensor
            setattr(m, name, self.full[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return tuple(a.to(self.dtype) if a.is_floating_point() else a for a in args)  # compute in self.dtype

    def after_forward(self, module, args, output):
        self.free()
        if output.requires_grad:
            output.register_hook(self.before_backward)            # fires when the gradient reaches the output
        return output

    def before_backward(self, grad):
        storage = self.full.untyped_storage()                     # autograd's saved views point at this storage
        storage.resize_(self.full.numel() * self.full.element_size())
        with torch.no_grad():                                     # refill it through a second tensor on it
            self.all_gather(torch.empty(0, dtype=self.dtype, device=self.full.device).set_(storage))

def hand_fsdp(model, dtype=torch.bfloat16):
    """Make every Linear of `model` a unit; return the log of its collectives and the gathered-bytes meter."""
    log, gathered = [], {"now": 0, "peak": 0}
    for module in model:
        if isinstance(module, nn.Linear):
            Unit(module, dtype, log, gathered)
    return log, gathered


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
This version handles what this model needs (every parameter trainable, each in a `Linear` unit). `course_lib.hand_fsdp.HandFSDP` is the library's version, with the rest: frozen and tied parameters, a root unit for parameters outside the units, `reshard_after_forward=False`. The job below trains three copies of the model for 3 AdamW steps on `N` ranks: ours, the library's (`HandFSDP(model, units, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`), and FSDP2's `fully_shard` (notebook 15 §1) with the matching `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`. It records the collectives of each one's third step (FSDP2's with `course_lib.simulated_compute.record_collectives`, which wraps `torch.distributed`'s functions) and counts the bytes each rank holds.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/fsdp_job.py
"""Section 3's job: FSDP by hand against course_lib's HandFSDP and FSDP2, with bf16 compute on fp32 master shards."""
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from course_lib.hand_fsdp import HandFSDP
from course_lib.simulated_compute import Timeline, record_collectives
from fsdp_by_hand import hand_fsdp
from model import LR, batch, loss_fn, make_model, shard_model
from zero_job import held_bytes

BF16 = torch.bfloat16

def whole_grads(model, n):
    """The mean gradient of every Linear, gathered whole: FSDP2's DTensors, or our units' fp32 flat shards."""
    out = []
    for m in (m for m in model if isinstance(m, nn.Linear)):
        if isinstance(m.weight, DTensor):                       # FSDP2: one DTensor gradient per parameter
            out += [p.grad.full_tensor().flatten() for p in (m.weight, m.bias)]
        else:                                                   # ours: the unit's shard of its flat gradient
            full = torch.empty(m.flat_shard.numel() * n, device=m.flat_shard.device)
            dist.all_gather_single(full, m.flat_shard.grad.detach())
            out.append(full[:m.weight.numel() + m.bias.numel()])  # without the padding
    return torch.cat(out).cpu()

def train(model, rank, n, device, steps=3, timeline=None, first=None):
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for s in range(steps):
        opt.zero_grad()
        last = s == steps - 1 and timeline is not None          # record the last step's collectives, in order
        with record_collectives(timeline) if last else nullcontext():
            loss_fn(model, *batch(s, rank, n, device=device)).backward()
        if s == 0 and first is not None:                        # the first step's gradients: Adam hides a constant factor
            first.append(whole_grads(model, n))
        opt.step()
    return opt

def report(rank, n, device):
    ours = make_model(device=device)
    (log, gathered), first = hand_fsdp(ours, dtype=BF16), []
    opt = train(ours, rank, n, device, first=first)
    held = held_bytes(ours, opt)
    shards = []
    for shard in ours.parameters():                             # gather the fp32 master shards, to compare
        full = torch.empty(shard.numel() * n, device=device)
        dist.all_gather_single(full, shard.detach())
        shards.append(full)
    lib = None
    if device == "cpu":                                         # course_lib.hand_fsdp works on CPU tensors
        library = make_model()
        lib = HandFSDP(library, units=[m for m in library if isinstance(m, nn.Linear)], param_dtype=BF16,
                       reduce_dtype=torch.float32)
        train(library, rank, n, device)
    fsdp2 = shard_model(make_model(device=device), mp_policy=MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32))
    timeline = Timeline(rank)
    opt2 = train(fsdp2, rank, n, device, timeline=timeline, first=first)
    labels = [span.label.split() for span in timeline.spans]    # such as "all_gather_single 131,584 B"
    fsdp2_log = [(name.removesuffix("_single"), int(size.replace(",", ""))) for name, size, _ in labels]
    step = len(log) // 3
    return {"ours": torch.cat(shards).cpu(),
            "library": torch.cat([v.flatten() for v in lib.full_parameters().values()]) if lib else None,
            "fsdp2": torch.cat([p.full_tensor().detach().flatten() for p in fsdp2.parameters()]).cpu(),
            "log": log[-step:], "library_log": lib.log.entries[-step:] if lib else None, "fsdp2_log": fsdp2_log,
            "gathered_peak": gathered["peak"], "gathered_after_step": gathered["now"], "held": held,
            "fsdp2_held": held_bytes(fsdp2, opt2), "numel": sum(p.numel() for p in make_model().parameters()),
            "first_grads": first}


# %% slideshow={"slide_type": "fragment"}
fsdp_runs = launch("_runs/fsdp_job.py:report")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 3.1 Equal to the library's version, and to FSDP2

Ours and `course_lib`'s do the same operations in the same order, so they must agree to the bit. FSDP2 shards each parameter along its first dimension instead of a flat vector, but AdamW is element-wise and the bf16 gather and the fp32 reduction are the same, so it must agree too; the check allows 1e-6. The first step's mean gradients are compared too, gathered whole: a gradient off by a constant factor hardly moves AdamW's parameters (§2.2 planted one), but it cannot pass that comparison.
"""

# %% slideshow={"slide_type": "fragment"}
TOL = "1e-6" if DEVICE == "cpu" else "1e-4"  # on GPUs the two may pick different bf16 matmul kernels
tol = float(TOL)
for r in fsdp_runs:
    if r["library"] is not None:  # the CPU path (course_lib.hand_fsdp works on CPU tensors)
        assert torch.equal(r["ours"], r["library"]) and r["log"] == r["library_log"]
    assert torch.allclose(r["ours"], r["fsdp2"], rtol=0, atol=tol)
gtol = tol if DEVICE == "cpu" else 1e-2  # GPUs: bf16 products of other kernels differ by bf16's rounding, ~4e-3
firsts = [compare_gradients(r["first_grads"][0], r["first_grads"][1], tolerance=gtol, world_size=RANKS, against="FSDP2")
          for r in fsdp_runs]  # the first step's mean gradients, gathered whole: what Adam would hide a factor in
assert all(firsts)
print("FSDP by hand after 3 AdamW steps (bf16 compute, fp32 master shards), on every rank:")
print(f"  = course_lib.hand_fsdp.HandFSDP (torch.equal, and the same collectives): {fsdp_runs[0]['library'] is not None}")
print(f"  allclose to fully_shard with MixedPrecisionPolicy(bf16, fp32) (atol {TOL}): True")
print(f"  its first step's {firsts[0]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 3.2 The collectives of one step, and their bytes

Per step each unit is all-gathered twice (forward, backward) in bf16 and reduce-scattered once in fp32: with `Ψ` parameters, all-gathers of `2 × 2Ψ` bytes and a reduce-scatter of `4Ψ`, of which a ring sends `(N-1)/N` per rank. Exercise 3 counts the same three collectives per unit, with bf16 gradients (a reduce-scatter of `2Ψ`).
"""

# %% slideshow={"slide_type": "fragment"}
r = fsdp_runs[0]
psi = r["numel"]
kinds = {"all_gather": "AG", "reduce_scatter": "RS"}
for kind in kinds:
    sizes = [b for k, b in r["log"] if k == kind]
    print(f"ours, one step: {len(sizes)} x {kind} of {sizes[0]:,} B = {sum(sizes):,} B")
ag, rs = (sum(b for k, b in r["log"] if k == kind) for kind in kinds)
assert ag == 2 * 2 * psi and rs == 4 * psi  # bf16 parameters twice, fp32 gradients once
sent = (RANKS - 1) / RANKS * (ag + rs)
print(f"psi = {psi:,}: all-gathered 4 psi, reduce-scattered 4 psi; a ring sends (N-1)/N of it: {sent:,.0f} B per rank")
same = sorted(r["fsdp2_log"]) == sorted(r["log"])
print(f"FSDP2, one step: the same collectives with the same bytes: {same}")
assert same
from model import DEPTH  # the number of units: one per Linear
for who, log in (("ours", r["log"]), ("FSDP2", r["fsdp2_log"])):
    order = [kinds[k] for k, _ in log]
    print(f"order, {who + ':':<6} forward {' '.join(order[:DEPTH])} | backward {' '.join(order[DEPTH:])}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Same collectives, same bytes, and in forward the same order: four gathers (`AG`), one per unit. In backward the order differs. Ours gathers a unit, runs its backward, reduce-scatters its gradient (`RS`), then gathers the next. FSDP2 gathers the *next* unit before it reduce-scatters the current one: that is **prefetch**. On a GPU, FSDP2 issues its collectives on separate CUDA streams, so the next unit's gather runs while the current unit computes; here, on gloo, every collective completes before the next operation starts, and only the order shows (notebook 20 §5 makes FSDP2 issue them without waiting, on a CPU, and measures what that hides).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 3.3 What each rank holds

The master shards, their gradients and AdamW's two states, all fp32, counted from the tensors after the 3 steps; and the most bytes of gathered bf16 parameters that existed at once during them.
"""

# %% slideshow={"slide_type": "fragment"}
zero3 = model_state_bytes(psi, RANKS, "zero3", "fp32_adam")
mixed = model_state_bytes(psi, RANKS, "zero3", "mixed_adam")
for r in fsdp_runs:
    for held in (r["held"], r["fsdp2_held"]):
        assert (held["parameters"], held["gradients"], held["optimizer"]) == (zero3.parameters, zero3.gradients, zero3.optimizer_state)
h = fsdp_runs[0]["held"]
print(f"held per rank, ours and FSDP2's: master shards {h['parameters']:,} + gradients {h['gradients']:,} + "
      f"AdamW {h['optimizer']:,} = {sum(h.values()):,} B")
print(f"  = ZeRO-3 with fp32 Adam, part by part: True; = 16 psi / N, mixed-precision Adam's total: {sum(h.values()) == mixed.total}")
unit_bf16 = 2 * psi // DEPTH  # one of the equal units, in bf16
print(f"gathered bf16 parameters, at most: {r['gathered_peak']:,} B = one unit ({unit_bf16:,} B); "
      f"all units at once would be {2 * psi:,} B; after the step: {r['gathered_after_step']} B")
assert all(r["gathered_peak"] == unit_bf16 and r["gathered_after_step"] == 0 for r in fsdp_runs)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Between steps each rank holds exactly ZeRO-3's count for fp32 Adam: `16Ψ / N` bytes, which is also the total section 1 gives mixed-precision Adam, split differently. There is no persistent 16-bit copy of the parameters (the bf16 weights exist only while their unit runs, one unit at a time here), and the gradient is kept in fp32, the reduction's dtype. The transient bytes are one unit's gathered parameters: the size of the units, not of the model, sets them, which is why FSDP is applied to each transformer block, as the FSDP2 tutorial in the references does.

Exercise 4 asks for the heart of the backward: the reduce-scatter step of `Gather.backward`.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Per parameter, training keeps `P + G + K` bytes (16 for mixed-precision Adam, 12 of them optimizer state; a transient fp32 gradient is not kept). ZeRO-1 divides `K` by the number of ranks `N`, ZeRO-2 also `G`, ZeRO-3/FSDP also `P`; activations are never sharded. Measured on 2 processes, the tensors each rank held were the model's count exactly, part by part.
- ZeRO-1/2 by hand is reduce-scatter the gradients, update your own shard with your own optimizer state, all-gather the parameters: exactly DDP's result and exactly DDP's bytes, because an all-reduce is a reduce-scatter and an all-gather. The first step's gradient chunks equal DDP's; a planted sum in place of the mean leaves most parameters within 1e-6 of DDP's after Adam's steps, and the gradient check catches it at once (norm ratio `N`). A sharded optimizer for real models takes parameter groups, leaves frozen parameters out (a zero gradient is not no gradient: AdamW decayed one from 2.0 to 1.8088 in 10 steps), and averages once; sharding by element suits element-wise optimizers only, sharding by whole parameters (`ZeroRedundancyOptimizer`) every optimizer.
- FSDP by hand is a pre-forward hook that all-gathers a unit's flat shards (in bf16), a post-forward hook that frees them, a gather again when the gradient reaches the unit, and a reduce-scatter (in fp32) in the gather's backward; the optimizer steps fp32 master shards. It equals `course_lib.hand_fsdp` to the bit and FSDP2 with the matching `MixedPrecisionPolicy` within 1e-6, first-step gradients included, with the same collectives; each rank holds ZeRO-3's `16Ψ/N` and one unit's gathered parameters at a time.
- PyTorch's FSDP2 does what the hand version does, on DTensor parameters; notebook 15 uses it, with DTensor and distributed checkpoints.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `rank_bytes(num_params, world_size, stage)`: the bytes of model state one rank holds with mixed-precision Adam (2 + 2 + 12 bytes per parameter), for `stage` in `"ddp"`, `"zero1"`, `"zero2"`, `"zero3"`; a shard is `ceil(num_params / world_size)` elements.
2. For each case in `FIT_SCENARIOS` (parameters, world size, device memory, activations per rank; mixed-precision Adam), give the **first** of `ddp`, `zero1`, `zero2`, `zero3` whose model state plus activations fits (each stage communicates or reorganises more than the one before).
3. Write `bytes_sent(num_params, world_size, stage)`: the bytes one rank sends per training step with bf16 parameters and gradients (2 bytes each) and ring algorithms, for the four stages (ZeRO-3 with `reshard_after_forward=True`).
4. Write the reduce-scatter step of section 3's FSDP: `shard_gradient(full_grad, world_size, reduce_dtype, shard_dtype)` gets this rank's gradient of a unit's gathered flat parameters (padded, in the compute dtype) and returns this rank's shard of the **mean** gradient over the ranks, in `shard_dtype`. Use `dist.reduce_scatter_single`. The check runs it on *simulated ranks*: this kernel has no process group, so for the length of the check `dist.reduce_scatter_single`, `dist.get_rank` and `dist.get_world_size` are replaced by stand-ins. Your function runs twice for every rank, one rank after the other: the first pass records the gradient each rank hands to the reduce-scatter, the second gives each call the reduction of those recorded gradients, as the real collective would. So your function must give the same result when called twice with the same input (the check says so if it does not); to debug, print inside it: each line is one rank's call.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.sharding import (FIT_SCENARIOS, check_bytes_sent, check_rank_bytes, check_reduce_scatter_step,
                                           check_stage_that_fits)

def rank_bytes(num_params, world_size, stage):
    raise NotImplementedError  # your code here

print(check_rank_bytes(rank_bytes))

# %% slideshow={"slide_type": "-"}
for name in FIT_SCENARIOS:
    print(name)
answer = {name: ... for name in FIT_SCENARIOS}  # "ddp", "zero1", "zero2" or "zero3"
print(check_stage_that_fits(answer))


# %% slideshow={"slide_type": "-"}
def bytes_sent(num_params, world_size, stage):
    raise NotImplementedError  # your code here

print(check_bytes_sent(bytes_sent))


# %% slideshow={"slide_type": "-"}
def shard_gradient(full_grad, world_size, reduce_dtype, shard_dtype):
    """full_grad: this rank's gradient of a unit's gathered flat parameters (padded, compute dtype).
    Return this rank's shard of the mean gradient over the ranks, in shard_dtype."""
    raise NotImplementedError  # your code here

print(check_reduce_scatter_step(shard_gradient))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054).
- Y. Zhao et al., *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*, VLDB 2023, [arXiv:2304.11277](https://arxiv.org/abs/2304.11277).
- PyTorch docs: [`torch.distributed.fsdp.fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), [`ZeroRedundancyOptimizer`](https://pytorch.org/docs/stable/distributed.optim.html), [collective communication](https://pytorch.org/docs/stable/distributed.html#collective-functions).
- PyTorch tutorial: [Getting started with FSDP2](https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html) (one unit per transformer block).
- NVIDIA NCCL documentation, "In-place operations" (reduce-scatter and all-gather in place when the rank's chunk is the input or output).
- N. Shazeer, M. Stern, *Adafactor: Adaptive Learning Rates with Sublinear Memory Cost*, ICML 2018, [arXiv:1804.04235](https://arxiv.org/abs/1804.04235) (the factored second moment of section 2.3).
"""
