# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 13 · Sharded data parallel: ZeRO by hand, FSDP2, DTensor and distributed checkpoints

DDP (notebooks 09–10) keeps a full copy of the model on every rank: the parameters, their gradients and the optimizer's state, on each of `N` devices. With Adam that state is most of the memory, and it is the same on every rank. Sharded data parallelism keeps the data parallelism (every rank trains on its own slice of the batch) but stores each piece of model state on **one** rank only, and moves it with the two halves of an all-reduce: reduce-scatter and all-gather. This is ZeRO (Rajbhandari et al., 2020) and PyTorch's FSDP; when model state does not fit on one device, it is the first remedy to try.

By the end you will be able to:
- compute the bytes per rank of DDP and ZeRO stages 1, 2 and 3 for any model size, world size and optimizer, and check them against what real processes hold;
- write ZeRO-1 and ZeRO-2 by hand with `reduce_scatter_single` and `all_gather_single`, prove they train exactly like DDP, and explain why they send the same bytes;
- shard a model with FSDP2's `fully_shard`, and reason about `reshard_after_forward`, `MixedPrecisionPolicy` and gradient scaling;
- use `DeviceMesh` and `DTensor` (`Shard`, `Replicate`, `redistribute`, `full_tensor`), including a 2-D mesh of data × tensor parallelism;
- save a sharded training run with `torch.distributed.checkpoint` and resume it on a different number of processes, exactly.

This notebook assumes: notebook 04 (where training memory goes), 06 (master weights in mixed precision), 09 (reduce-scatter + all-gather = all-reduce), 10 (DDP, launching, checkpoints) and 12 (tensor parallelism, for the 2-D mesh). No GPU: every distributed run here is CPU processes talking over gloo, launched with `course_lib.launch`.
"""

# %% slideshow={"slide_type": "-"}
import os
import sys
import time

import torch
import torch.distributed as dist

from course_lib.allreduce_sim import ring_bytes_formula
from course_lib.launch import run_ranks
from course_lib.seeding import seed_everything
from course_lib.sharding import STAGES, model_state_bytes, rank_memory, zero_table

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
sys.path.insert(0, os.path.abspath("_runs"))
notebook_start = time.perf_counter()
print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Memory per rank: the ZeRO count

Notebook 04 counted what training keeps between steps; per parameter, with `Ψ` parameters:

- **parameters**, `P` bytes each, **gradients**, `G` bytes each, and the **optimizer state**, `K` bytes each;
- mixed-precision Adam (notebook 06): bf16/fp16 parameters and gradients (`P = G = 2`), and in fp32 a master copy of the weights plus Adam's `m` and `v` (`K = 4 + 4 + 4 = 12`): **16 bytes per parameter**;
- plain fp32 Adam, what runs on this CPU: `P = G = 4`, `K = 8` (`m`, `v`): 16 bytes as well.

DDP keeps all 16 on every rank. ZeRO's three stages shard more and more of it over the `N` data-parallel ranks: stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the parameters (FSDP is stage 3). `course_lib.sharding` holds the count; its table for mixed-precision Adam:
"""

# %% slideshow={"slide_type": "fragment"}
print(zero_table((1, 2, 4, 8, 64)))
psi = 7_500_000_000  # the ZeRO paper's example: 7.5B parameters on 64 GPUs
paper = [round(model_state_bytes(psi, 64, s).total / 1e9, 1) for s in STAGES]
print("7.5B parameters, N=64, GB per rank:", dict(zip(STAGES, paper)))
assert paper == [120.0, 31.4, 16.6, 1.9]  # the numbers of the paper's figure 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the table by rows. Stage 1 removes the largest term (12 of the 16 bytes) but stops at 4 bytes per parameter, however many ranks; stage 2 stops at 2; only stage 3 goes to zero as `N` grows. The paper's example checks out: 120 GB per GPU for DDP, 1.9 GB with stage 3.

What the table leaves out is the **activations**. No ZeRO stage shards them: each rank keeps the activations of its own micro-batch, as in notebook 04, and gradient checkpointing, not sharding, is the remedy there (`course_lib.sharding.activation_bytes` counts both cases with notebook 04's √L segments). The calculator below adds them up; its static version after it prints the same text for a few settings.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets
from IPython.display import display


def describe(params_b, world_size, precision, stage, checkpointing, micro_batch):
    """What one rank holds, in GB: a 7B-like transformer layer stack (32 layers, 4096 wide, sequence 2048)."""
    per_layer = 2048 * 4096 * 2 * 16  # bytes of activations per sample and layer (bf16, ~16 tensors of the width)
    r = rank_memory(int(params_b * 1e9), world_size, stage, precision, micro_batch=micro_batch,
                    bytes_per_sample_per_layer=per_layer, layers=32, checkpointing=checkpointing)
    parts = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in r.items() if k != "total")
    return f"{params_b:g}B params, N={world_size}, {precision}, {stage}: {parts}; total {r['total'] / 1e9:.1f} GB per rank"


controls = dict(
    params_b=widgets.FloatText(value=7.0, description="params (B):"),
    world_size=widgets.IntSlider(value=8, min=1, max=256, description="world size:"),
    precision=widgets.Dropdown(options=["mixed_adam", "fp32_adam", "fp32_sgd_momentum"], description="precision:"),
    stage=widgets.Dropdown(options=list(STAGES), value="zero3", description="stage:"),
    checkpointing=widgets.Checkbox(value=False, description="checkpointing"),
    micro_batch=widgets.IntSlider(value=1, min=0, max=16, description="micro-batch:"),
)
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
For a 7B model on 8 devices, DDP needs 112 GB of model state per rank and ZeRO-3 14 GB; the activations of one sequence of 2048 tokens (8.6 GB without checkpointing, 3.0 GB with it, in this rough estimate) stay the same whatever the stage. The rest of this notebook checks the count on real processes: each stage is implemented, run on 2 gloo processes, and what each rank holds is measured.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. ZeRO-1 and ZeRO-2 by hand

DDP all-reduces the gradients, then every rank runs the same optimizer step on the same full state. ZeRO-1 notices that this step is done `N` times over, and splits it:

1. backward as usual, into one flat gradient buffer;
2. **reduce-scatter** the buffer: rank `r` receives only chunk `r` of the summed gradient;
3. each rank runs Adam on **its chunk of the parameters only**, with optimizer state for that chunk only (`K Ψ / N` bytes);
4. **all-gather** the parameter chunks, so every rank again holds the full, updated parameters for the next forward.

ZeRO-2 is the same step, but after the reduce-scatter a rank keeps only its chunk of the gradients (`G Ψ / N`) and drops the rest. (Real implementations reduce-scatter bucket by bucket during backward, so the full gradient never exists at once; here it does, briefly, which shows in the peak but not in what is kept.)

The script below (`_runs/zero.py`) has the hand-written version, `HandZero`, and a `build` function for five ways to train the same model: DDP, ZeRO-1 and ZeRO-2 by hand, PyTorch's built-in ZeRO-1 (`ZeroRedundancyOptimizer`, which shards the optimizer by whole parameters and broadcasts each updated parameter from its owner) and FSDP2 (section 3). `measure_stage` trains each for 3 steps inside the course's allocator meter (`course_lib.memory.measure_peak`, notebook 04), counts the bytes of the tensors the rank holds, and returns the final parameters. The collectives work **in place** on the flat buffers: rank `r`'s output is chunk `r` of the input, which is how NCCL defines in-place reduce-scatter and all-gather too, so no extra buffer is needed.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/zero.py
"""ZeRO-1 and ZeRO-2 by hand, next to DDP, ZeroRedundancyOptimizer and FSDP2; what each rank holds."""
import math
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.memory import measure_peak

# FSDP2's hooks warn about patterns this small model does not use (in-place ops on outputs, inputs without grad)
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message="Full backward hook is firing.*")

WIDTH, DEPTH, LR = 256, 4, 1e-3


def make_model(width=WIDTH, depth=DEPTH):
    torch.manual_seed(0)  # the same initial weights in every process
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, width))


def batch(step, rank, world_size, per_rank=8, width=WIDTH):
    """The global batch of a step (the same draw on every rank); rank r keeps rows r, r + N, ..."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(per_rank * world_size, width, generator=g)
    y = torch.randn(per_rank * world_size, width, generator=g)
    return x[rank::world_size], y[rank::world_size]


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


class HandZero:
    """ZeRO stage 1 or 2: the parameters live in one flat buffer; rank r owns chunk r of it."""

    def __init__(self, model, stage, lr=LR):
        self.model, self.stage = model, stage
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        total = sum(p.numel() for p in model.parameters())
        self.shard = math.ceil(total / self.n)                  # padded: every rank owns the same length
        self.flat = torch.zeros(self.shard * self.n)
        offset = 0
        for p in model.parameters():                            # the parameters become views of the buffer
            self.flat[offset:offset + p.numel()].copy_(p.detach().flatten())
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        lo = self.rank * self.shard
        self.mine = nn.Parameter(self.flat[lo:lo + self.shard])  # my chunk: a view, updated in place
        self.opt = torch.optim.Adam([self.mine], lr=lr)         # optimizer state for my chunk only
        self.grads = None                                       # the full flat gradient buffer
        self.sent = 0                                           # bytes this rank sends (ring algorithms)

    def _gradient_buffer(self):
        if self.grads is None:                                  # stage 2 makes it anew for every step
            self.grads = torch.zeros_like(self.flat)
            offset = 0
            for p in self.model.parameters():                   # backward accumulates into these views
                p.grad = self.grads[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        else:                                                   # stage 1 keeps it between steps
            self.grads.zero_()

    def step(self, x, y):
        self._gradient_buffer()
        loss_fn(self.model, x, y).backward()
        lo = self.rank * self.shard
        chunk = self.grads[lo:lo + self.shard]
        dist.reduce_scatter_single(chunk, self.grads)           # in place: chunk r receives chunk r of the sum
        self.sent += (self.n - 1) * self.shard * 4              # a ring reduce-scatter sends (N-1)/N of it
        if self.stage == 1:
            self.mine.grad = chunk.div_(self.n)                 # the mean; a view: no new memory
        else:                                                   # stage 2: keep my chunk, drop the rest
            if self.mine.grad is None:
                self.mine.grad = torch.empty(self.shard)
            self.mine.grad.copy_(chunk).div_(self.n)
            for p in self.model.parameters():
                p.grad = None
            # free the full buffer now, on this thread (gloo's thread may still hold a reference to it)
            self.grads.untyped_storage().resize_(0)
            self.grads = None
        self.opt.step()                                         # Adam on my chunk, with my state only
        dist.all_gather_single(self.flat, self.mine.detach())   # in place: my chunk in, the whole buffer out
        self.sent += (self.n - 1) * self.shard * 4              # a ring all-gather sends (N-1)/N of it


class DDPStep:
    """DDP's step, counting the bytes of the gradient buckets it all-reduces (a communication hook)."""

    def __init__(self, model, opt):
        self.model, self.opt, self.bucket_bytes = model, opt, 0
        model.register_comm_hook(None, self.hook)

    def hook(self, state, bucket):
        self.bucket_bytes += bucket.buffer().numel() * bucket.buffer().element_size()
        return allreduce_hook(None, bucket)                     # DDP's default: all-reduce, divide by N

    def __call__(self, x, y):
        self.opt.zero_grad(set_to_none=False)
        loss_fn(self.model, x, y).backward()
        self.opt.step()


def plain_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss_fn(model, x, y).backward()
        opt.step()
    return step


def shard_model(model, **kwargs):
    """FSDP2: every Linear is one unit (gathered and freed together), then the root.

    The mesh is given, on the CPU: without one, fully_shard builds a mesh on the accelerator it
    finds (torch._C._get_accelerator()), so on a GPU machine a CPU job would move its inputs to CUDA.
    """
    kwargs.setdefault("mesh", init_device_mesh("cpu", (dist.get_world_size(),)))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def build(kind):
    """A model, the object holding its optimizer, and a step function."""
    model = make_model()
    if kind in ("ddp", "zero1_builtin"):
        # init_sync=False: every rank built the same seeded weights, so skip DDP's initial broadcast;
        # gradient_as_bucket_view=True: .grad are views of DDP's buckets, not a second copy
        model = DDP(model, gradient_as_bucket_view=True, init_sync=False)
        if kind == "ddp":
            opt = torch.optim.Adam(model.parameters(), lr=LR)
        else:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
        step = DDPStep(model, opt)
        return model, opt, step
    if kind in ("zero1", "zero2"):
        z = HandZero(model, stage=int(kind[-1]))
        return model, z, z.step
    if kind == "fsdp2":
        shard_model(model)
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        return model, opt, plain_step(model, opt)
    raise ValueError(f"unknown kind {kind!r}")


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
        grads = [opt.grads] if opt.grads is not None else [opt.mine.grad]
        states = opt.opt.state.values()
    else:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        states = (opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt).state.values()
    state = [v for s in states for k, v in s.items() if k != "step"]  # Adam's step counter: a scalar
    return {"parameters": storages(model.parameters()), "gradients": storages(grads), "optimizer": storages(state)}


def measure_stage(rank, n, kind, steps=3):
    def run():
        model, opt, step = build(kind)
        for s in range(steps):
            step(*batch(s, rank, n))
        return model, opt, step

    memory = measure_peak(run)                                  # everything returned stays allocated
    model, opt, step = memory.result
    params = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    sent = opt.sent if isinstance(opt, HandZero) else None
    return {
        "held": held_bytes(model, opt),
        "retained": memory.retained_bytes,
        "peak": memory.peak_bytes,
        "params": torch.cat([p.detach().flatten() for p in params]),
        "numel": sum(p.numel() for p in params),
        "sent": sent,
        "ddp_bucket_bytes": getattr(step, "bucket_bytes", None),
    }


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Section 6 runs it; here is what it checks. With `Ψ` parameters in fp32 Adam on `N = 2` ranks, the model of section 1 predicts per rank `4Ψ + 4Ψ + 8Ψ` bytes for DDP, `4Ψ + 4Ψ + 4Ψ` for ZeRO-1 and `4Ψ + 2Ψ + 4Ψ` for ZeRO-2. After 3 steps every version must hold the same parameters as DDP.

**Bytes sent.** A ring reduce-scatter sends `(N-1)/N` of the buffer and a ring all-gather another `(N-1)/N`: together `2 (N-1)/N · S`, which is exactly what a ring all-reduce sends (notebook 09). That is not a coincidence: a ring all-reduce *is* a reduce-scatter followed by an all-gather. DDP all-gathers the reduced gradients and then every rank computes the same update; ZeRO all-gathers the *updated parameters* instead. Same traffic, and the optimizer's work and memory are divided by `N`. (Gloo itself implements reduce-scatter as one all-reduce per rank, so on gloo it is slower than that; the byte count is that of the algorithms NCCL uses.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. ZeRO-3 with FSDP2: `fully_shard`

Stage 3 also shards the parameters, so a layer's weights must be gathered before it can run, and freed after. PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`, the successor of the `FullyShardedDataParallel` wrapper, Zhao et al. 2023) does this per *unit*: `fully_shard(layer)` makes each `Linear` a unit, `fully_shard(model)` the root. Each parameter becomes a `DTensor` sharded on dimension 0 (`Shard(0)`): rank `r` stores rows `r·rows/N ...` of each weight. In one training step:

- **forward**: before each unit runs, all-gather its parameters; after it, free them again (`reshard_after_forward=True`, the default);
- **backward**: all-gather each unit's parameters again, compute its gradients, **reduce-scatter** them: each rank keeps the gradient of its own rows;
- **optimizer step**: a plain `torch.optim.Adam`, on the local shards.

`reshard_after_forward=False` keeps the gathered parameters from forward to backward: one all-gather per unit per step instead of two, for the memory of full parameters during that time (ZeRO-2's memory, between forward and backward). `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` gathers bf16 copies for compute while the shards and the optimizer stay fp32: notebook 06's master weights, sharded.

**Gradient scaling.** bf16 has fp32's range, so bf16 training needs no loss scaling (notebook 07 §3). fp16 does, and with sharded gradients a scaler must see an overflow in *any* rank's shard, or ranks skip different steps and drift apart. The old FSDP wrapper needed `ShardedGradScaler`, which all-reduces the overflow flag. With FSDP2 the gradients are DTensors, and DTensor's dispatch reduces the overflow flag of `torch.amp.GradScaler`'s unscale across the mesh: the ordinary scaler works. The script checks it by putting an `inf` into rank 1's shard only.

The script below measures all of it: FSDP2 against one process training on the whole batch, the collectives of one step counted with `CommDebugMode` (from `torch.distributed.tensor.debug`, a dispatch mode that records every collective), which units stay gathered after forward, bf16 compute, and both scalers.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/fsdp2_demo.py
"""FSDP2 on gloo: equal to one process; collectives per step; reshard_after_forward; bf16; GradScaler."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor.debug import CommDebugMode

from zero import LR, batch, loss_fn, make_model, shard_model


def against_one_process(rank, n, steps=3):
    reference = make_model()                                    # one process, the whole global batch
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    model = shard_model(make_model())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for s in range(steps):
        ref_opt.zero_grad()
        loss_fn(reference, *batch(s, 0, 1, per_rank=8 * n)).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_fn(model, *batch(s, rank, n)).backward()           # my rows of the same global batch
        opt.step()
    w = model[0].weight
    return {
        "max_diff": max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())),
        "type": type(w).__name__, "placements": str(w.placements),
        "global_shape": tuple(w.shape), "local_shape": tuple(w.to_local().shape),
    }


def one_step_collectives(rank, n, reshard):
    model = shard_model(make_model(), reshard_after_forward=reshard)
    x, y = batch(0, rank, n)
    loss_fn(model, x, y).backward()                             # a first step: lazy initialisation
    units = [m for m in model if isinstance(m, nn.Linear)]
    with CommDebugMode() as comm:
        loss = loss_fn(model, x, y)
        # between forward and backward: which units still hold their gathered parameters?
        # (_fsdp_param_group is FSDP2's private state: no public API says it)
        gathered = [u._get_fsdp_state()._fsdp_param_group.is_unsharded for u in units]
        loss.backward()
    counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
    full_bytes = sum(p.numel() * 4 for u, g in zip(units, gathered) if g for p in u.parameters())
    return {"counts": counts, "gathered_units": sum(gathered), "gathered_bytes": full_bytes}


def bf16_compute(rank, n):
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard_model(make_model(), mp_policy=policy)
    x, y = batch(0, rank, n)
    out = model(x)
    F.mse_loss(out.float(), y).backward()
    w = model[0].weight
    return {"output": str(out.dtype), "shard": str(w.dtype), "grad": str(w.grad.dtype)}


def scalers(rank, n):
    out = {}
    makers = {"torch.amp.GradScaler": lambda: torch.amp.GradScaler("cpu", init_scale=1024.0),
              "ShardedGradScaler": lambda: ShardedGradScaler(device="cpu", init_scale=1024.0)}
    for name, make in makers.items():
        model = shard_model(make_model(width=8, depth=1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make()
        before = model[0].weight.to_local().clone()
        scaler.scale(loss_fn(model, *batch(0, rank, n, width=8))).backward()
        if rank == 1:
            model[0].weight.grad.to_local()[0, 0] = float("inf")  # an overflow in rank 1's shard only
        scaler.step(opt)
        scaler.update()
        out[name] = {"stepped": not torch.equal(model[0].weight.to_local(), before), "scale": scaler.get_scale()}
    return out


def fsdp2_report(rank, n):
    return {"one_process": against_one_process(rank, n),
            "reshard": {r: one_step_collectives(rank, n, r) for r in (True, False)},
            "bf16": bf16_compute(rank, n), "scalers": scalers(rank, n)}


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. DTensor and DeviceMesh

FSDP2's parameters are `DTensor`s: a tensor whose data lives on the processes of a `DeviceMesh` (an n-dimensional array of ranks, each dimension with its own process group), described by one *placement* per mesh dimension:

- `Shard(d)`: split along dimension `d`, one piece per rank;
- `Replicate()`: a full copy on every rank;
- `Partial()`: every rank holds a summand; the value is their sum (what a reduction over a sharded dimension produces, before anyone communicates).

`distribute_tensor` places a tensor, `to_local()` is this rank's piece, `full_tensor()` gathers the whole, and `redistribute` changes placements with the matching collective (`Shard → Replicate` is an all-gather, `Partial → Replicate` an all-reduce, `Partial → Shard` a reduce-scatter).

A mesh with two dimensions combines parallelisms. On 4 processes arranged as a 2×2 mesh named `("dp", "tp")`, `parallelize_module` splits each layer's weights across the `tp` ranks (notebook 12's tensor parallelism: `ColwiseParallel` splits the first `Linear` by outputs, `RowwiseParallel` the second by inputs, so the only communication is one all-reduce of the output), and `fully_shard(..., mesh=mesh["dp"])` shards what remains across the `dp` ranks, which see different data. Each weight is then sharded twice, once per mesh dimension.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/dtensor_demo.py
"""DTensor placements on a 1-D mesh; data parallel x tensor parallel on a 2-D mesh, against one process."""
import gc
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from zero import LR, batch, loss_fn, make_model, shard_model


def placements(rank, n):
    world = dist.group.WORLD                                    # the default process group
    before = sys.getrefcount(world)
    result = _placements(rank, n)                               # its mesh and DTensors are gone when it returns
    gc.collect()
    result["extra references to the group"] = sys.getrefcount(world) - before
    return result


def _placements(rank, n):
    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(8.0).reshape(4, 2)                      # the same tensor on every rank
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    replicated = distribute_tensor(full, mesh, [Replicate()])
    gathered = sharded.redistribute(mesh, [Replicate()])        # an all-gather
    total = (sharded * 2).sum()                                 # each rank sums its rows: Partial
    return {"shard local": sharded.to_local().tolist(), "replicate local": replicated.to_local().tolist(),
            "full_tensor": sharded.full_tensor().tolist(), "redistributed": gathered.to_local().tolist(),
            "sum placement": str(total.placements), "sum": total.full_tensor().item()}


def two_d(rank, n, steps=3, width=64):
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
    dp, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    reference, model = make_model(width, depth=2), make_model(width, depth=2)  # Linear, Tanh, Linear
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    shard_model(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for s in range(steps):
        x, y = batch(s, 0, 1, per_rank=8, width=width)          # the global batch
        ref_opt.zero_grad()
        loss_fn(reference, x, y).backward()
        ref_opt.step()
        opt.zero_grad()
        with CommDebugMode() as comm:                           # the collectives of the forward pass
            loss = loss_fn(model, x[dp::dp_size], y[dp::dp_size])  # dp ranks split it; tp ranks share it
        loss.backward()
        opt.step()
    w = model[0].weight
    return {"mesh": mesh.mesh.tolist(), "placements": [type(p).__name__ for p in w.placements],
            "forward": {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()},
            "global": tuple(w.shape), "local": tuple(w.to_local().shape),
            "max_diff": max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))}


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Checkpoints of a sharded model

Notebook 10 saved a DDP checkpoint the simple way: every rank holds everything, rank 0 writes. With sharding nobody holds everything, and two ways remain:

- **gather, then rank 0 writes** (`get_model_state_dict(..., StateDictOptions(full_state_dict=True, cpu_offload=True))`, then `torch.save`): one ordinary file, loadable anywhere, but rank 0 must hold the whole model in CPU memory and write it alone;
- **every rank writes its own shards** with `torch.distributed.checkpoint` (DCP): `dcp.save(state, checkpoint_id=dir)` writes one file per rank plus a `.metadata` file that records which piece of which tensor is where. `dcp.load` reads into whatever sharding the *loading* run has, so a checkpoint saved by 2 processes can be loaded by 1 or by 4.

`get_state_dict(model, optimizer)` and `set_state_dict(...)` (from `torch.distributed.checkpoint.state_dict`) give model and optimizer state keyed by parameter names, the same for a plain, a DDP or an FSDP2 model, which is what makes the resharding work.

A checkpoint that resumes a run **exactly** holds the whole training state, not just the weights: the model, the optimizer (Adam's `m`, `v` and step), the step counter, the epoch the `DistributedSampler` is in (notebook 10's `set_epoch`), and the state of every random generator the run draws from (here a generator for data augmentation noise). The script below trains 8 steps, saving everything at step 4. Another run loads it, at a different world size, and trains steps 5 to 8.

Resuming at a different world size is only equal if the runs see the same *global* batches. `DistributedSampler` gives rank `r` the indices `r, r + N, r + 2N, ...` of the epoch's shuffled order, so with a per-rank batch of `16 / N` the step's global batch is the same 16 samples for `N = 1, 2, 4`; the mean loss over them does not depend on how they are split. The noise is drawn for the whole global batch on every rank (the same generator, the same state) and each rank takes its rows, for the same reason.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/resume.py
"""Train with the whole state checkpointed by torch.distributed.checkpoint; resume at any world size."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.tensor import DTensor
from torch.utils.data import DistributedSampler, TensorDataset

from zero import LR, WIDTH, loss_fn, make_model, shard_model

GLOBAL_BATCH, SAMPLES = 16, 48                                  # 3 steps per epoch
PARTS = ("model", "optim", "progress", "rng")                  # the whole training state


def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(SAMPLES, WIDTH, generator=g), torch.randn(SAMPLES, WIDTH, generator=g))


def train(rank, n, stop, save_dir=None, save_at=None, resume_from=None, full_path=None, keep=PARTS):
    """Train to step `stop`; save everything at step `save_at`, or start from a saved run (the parts in `keep`)."""
    model = make_model()
    if dist.is_initialized():
        shard_model(model)                                      # FSDP2 when launched; a plain model otherwise
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=n, rank=rank, shuffle=True, seed=0)
    noise = torch.Generator().manual_seed(123)                  # augmentation noise: its state is training state
    progress = {"step": 0, "epoch": 0}

    def everything():
        model_sd, optim_sd = get_state_dict(model, opt)
        return {"model": model_sd, "optim": optim_sd, "progress": dict(progress), "rng": noise.get_state()}

    if resume_from is not None:
        state = {k: v for k, v in everything().items() if k in keep}  # the layout to load into: ours
        dcp.load(state, checkpoint_id=resume_from)              # in place, resharded as needed
        if "optim" in state:
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            set_model_state_dict(model, state["model"])
        progress = state.get("progress", progress)
        if "rng" in keep:
            noise.set_state(state["rng"])
    per_rank, steps_per_epoch = GLOBAL_BATCH // n, SAMPLES // GLOBAL_BATCH
    while progress["step"] < stop:
        sampler.set_epoch(progress["epoch"])
        order = list(sampler)
        for i in range(progress["step"] % steps_per_epoch, steps_per_epoch):  # resume mid-epoch
            idx = order[i * per_rank:(i + 1) * per_rank]
            eps = 0.1 * torch.randn(GLOBAL_BATCH, WIDTH, generator=noise)  # the same draw on every rank
            x, y = data.tensors[0][idx] + eps[rank::n], data.tensors[1][idx]
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            opt.step()
            progress["step"] += 1
            if progress["step"] == save_at:
                dcp.save(everything(), checkpoint_id=save_dir)  # every rank writes its shards
                if full_path is not None:                       # the old way: gather, rank 0 writes
                    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                    if rank == 0:
                        torch.save(full, full_path)
            if progress["step"] == stop:
                break
        else:
            progress["epoch"] += 1
    params = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    return torch.cat([p.detach().flatten() for p in params])


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Running it: one launch per world size

Starting a process costs seconds (Python, then `import torch`, then the distributed modules), so the whole notebook runs **two** launches: one job of 2 processes doing everything of sections 2–5 that needs 2 ranks, and one of 4 processes for the 2-D mesh and the resume at `N = 4`. The job functions return dictionaries, which the cells after them check. The resume at `N = 1` runs right here, in the notebook's own process: `dcp.load` works without a process group.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/jobs.py
"""The two jobs of notebook 13: everything at 2 processes, then the 2-D mesh and a resume at 4."""
import dtensor_demo
import fsdp2_demo
import resume
import zero


def at_two(rank, n, ckpt_dir, full_path):
    return {
        "dtensor": dtensor_demo.placements(rank, n),            # first: it checks what DTensor leaves behind
        "memory": {kind: zero.measure_stage(rank, n, kind) for kind in ("ddp", "zero1", "zero1_builtin", "zero2", "fsdp2")},
        "fsdp2": fsdp2_demo.fsdp2_report(rank, n),
        "uninterrupted": resume.train(rank, n, stop=8, save_dir=ckpt_dir, save_at=4, full_path=full_path),
    }


def at_four(rank, n, ckpt_dir):
    return {"two_d": dtensor_demo.two_d(rank, n), "resumed": resume.train(rank, n, stop=8, resume_from=ckpt_dir)}


# %% slideshow={"slide_type": "fragment"}
import shutil

shutil.rmtree("_runs/dcp_step4", ignore_errors=True)
two = run_ranks("_runs/jobs.py:at_two", nprocs=2, args=("_runs/dcp_step4", "_runs/full_step4.pt"), timeout=180, echo="none")
four = run_ranks("_runs/jobs.py:at_four", nprocs=4, args=("_runs/dcp_step4",), timeout=180, echo="none")
print(f"2 processes, then 4: both jobs finished, every rank with exit code 0; ~{time.perf_counter() - notebook_start:.0f} s so far")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 6.1 What each rank holds, against the model

For every way of training, on each rank: the bytes of the parameters, gradients and optimizer state it holds after 3 steps (counted from the tensors, each storage once: exact), against the model of section 1 for the same stage (fp32 Adam, `N = 2`); and the highest point the allocator meter saw during the 3 steps (`~`: it includes activations and temporaries, and depends on the machine).
"""

# %% slideshow={"slide_type": "fragment"}
stage_of = {"ddp": "ddp", "zero1": "zero1", "zero1_builtin": "zero1", "zero2": "zero2", "fsdp2": "zero3"}
numel = two[0]["memory"]["ddp"]["numel"]
print(f"model: {numel:,} parameters, fp32 Adam, N=2; bytes per rank")
print(f"{'':<14}{'parameters':>11}{'gradients':>11}{'optimizer':>11}{'held':>11}{'model':>11}   allocator peak")
for kind, stage in stage_of.items():
    model = model_state_bytes(numel, 2, stage, "fp32_adam")
    for rank in (0, 1):
        r = two[rank]["memory"][kind]
        h = r["held"]
        assert (h["parameters"], h["gradients"], h["optimizer"]) == (model.parameters, model.gradients, model.optimizer)
        assert r["peak"] >= model.total  # the allocator saw at least the state at some point
    h, r = two[0]["memory"][kind]["held"], two[0]["memory"][kind]
    print(f"{kind:<14}{h['parameters']:>11,}{h['gradients']:>11,}{h['optimizer']:>11,}{sum(h.values()):>11,}"
          f"{model.total:>11,}   ~{r['peak'] / 1e6:.2f} MB")
print("held bytes = the model's, part by part, on both ranks")
assert two[0]["memory"]["fsdp2"]["peak"] < two[0]["memory"]["ddp"]["peak"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The tensors each rank holds are exactly the model's count, part by part: ZeRO-1 (both versions) halves the optimizer state, ZeRO-2 also the gradients, FSDP2 everything, to half of DDP's 16 bytes per parameter. The peaks include the activations and temporaries of a step (ZeRO-2's full gradient exists for a moment in every step here), so with this small model sharding lowers them less than it lowers what is kept.

Why count tensors rather than read the allocator's "still allocated" total? On gloo, a collective's work object keeps references to its tensors, and to any temporary it made, until gloo's worker thread is done with it, and the last reference is often dropped **on that thread**. The profiler behind `measure_peak` records allocations and frees of the threads it profiles, so such a free goes unseen, and the running total ends higher than what is really allocated, by a different amount from run to run. (`benchmarks/sharding_memory.py` prints both numbers for N = 1, 2 and 4: the retained total matches the held bytes for DDP and `ZeroRedundancyOptimizer`, and exceeds them by whole buffers, differently from rank to rank, where gloo's reduce-scatter is involved.) On a GPU, `torch.cuda.memory_allocated` has no such blind spot.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 6.2 ZeRO trains exactly like DDP, and sends the same bytes

After 3 Adam steps, every sharded version holds the parameters DDP holds. The byte counts: `HandZero` added up `(N-1)/N` of the buffer per collective; DDP's communication hook saw its gradient buckets, whose ring all-reduce costs `2 (N-1)/N` of their size (`ring_bytes_formula`, from notebook 09).
"""

# %% slideshow={"slide_type": "fragment"}
ddp = two[0]["memory"]["ddp"]
for kind in ("zero1", "zero1_builtin", "zero2", "fsdp2"):
    for rank in (0, 1):
        theirs = two[rank]["memory"][kind]["params"]
        assert torch.allclose(theirs, ddp["params"], rtol=0, atol=1e-6), kind
    print(f"{kind:<14} parameters after 3 steps allclose to DDP's (atol 1e-6): True")
ddp_sent = ring_bytes_formula(ddp["ddp_bucket_bytes"], 2)
for kind in ("zero1", "zero2"):
    sent = two[0]["memory"][kind]["sent"]
    print(f"{kind}: reduce-scatter + all-gather sent {sent:,} bytes in 3 steps; DDP's ring all-reduce {ddp_sent:,.0f}")
    assert sent == ddp_sent == 3 * 2 * (2 - 1) / 2 * 4 * numel

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 6.3 FSDP2

FSDP2 on 2 processes against one process training on the whole batch; where its parameters live; and the collectives of one training step with each `reshard_after_forward`.
"""

# %% slideshow={"slide_type": "fragment"}
f = two[0]["fsdp2"]
one = f["one_process"]
print(f"weight of the first Linear: a {one['type']} {one['placements']}, global {one['global_shape']}, local {one['local_shape']}")
assert one["type"] == "DTensor" and one["local_shape"] == (one["global_shape"][0] // 2, one["global_shape"][1])
assert all(two[r]["fsdp2"]["one_process"]["max_diff"] < 1e-4 for r in (0, 1))
print("FSDP2 (2 processes) after 3 Adam steps allclose to one process on the whole batch (atol 1e-4): True")
for reshard, r in f["reshard"].items():
    print(f"reshard_after_forward={reshard!s:<5}: one step = {r['counts']}; units still gathered after forward: "
          f"{r['gathered_units']} of 4 ({r['gathered_bytes']:,} bytes of full parameters)")
units = 4
for reshard, r in f["reshard"].items():  # each collective moves (N-1)/N of a unit's bytes; DDP's all-reduce: 2 of those
    print(f"reshard_after_forward={reshard!s:<5}: bytes sent over DDP's: {sum(r['counts'].values()) / (2 * units):.1f}x")
assert f["reshard"][True]["counts"] == {"_allgather_base_": 2 * units, "_reduce_scatter_base_": units}
assert f["reshard"][False]["counts"] == {"_allgather_base_": units, "_reduce_scatter_base_": units}
assert f["reshard"][True]["gathered_units"] == 0 and f["reshard"][False]["gathered_bytes"] == 4 * numel

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
(`_allgather_base_` and `_reduce_scatter_base_` are the operators behind `all_gather_single` and `reduce_scatter_single`.) Per step, with the default, each of the 4 units is all-gathered twice (forward, backward) and reduce-scattered once: **1.5 times DDP's traffic** (three collectives of `(N-1)/N · S` against an all-reduce's two). With `reshard_after_forward=False` it is one all-gather per unit, the traffic of DDP, but all 4 units keep their full parameters from forward to backward (4 bytes × every parameter, here 1,052,672 bytes on each rank). With `True`, no unit stays gathered between forward and backward (0 of 4 above): a unit's full parameters exist only around the moment it runs.

The difference from one process (below 1e-4, not bit-exact) is that of summing the same numbers in another order; Adam's division by `√v` can magnify such differences where gradients are near zero.

bf16 compute, and the gradient scalers:
"""

# %% slideshow={"slide_type": "fragment"}
print("MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32):", f["bf16"])
assert f["bf16"] == {"output": "torch.bfloat16", "shard": "torch.float32", "grad": "torch.float32"}
for name in ("torch.amp.GradScaler", "ShardedGradScaler"):
    seen = [two[r]["fsdp2"]["scalers"][name] for r in (0, 1)]
    print(f"{name:<21} inf in rank 1's shard only: stepped {[s['stepped'] for s in seen]}, scale 1024 -> {[s['scale'] for s in seen]}")
    assert all(not s["stepped"] and s["scale"] == 512.0 for s in seen)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The forward ran in bf16 while the shards, their gradients and so Adam's state stayed fp32. Both scalers made **both** ranks skip the step and halve the scale, although only rank 1's shard overflowed: with FSDP2, `torch.amp.GradScaler` is enough.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 6.4 DTensor placements, and the 2-D mesh
"""

# %% slideshow={"slide_type": "fragment"}
for rank in (0, 1):
    d = two[rank]["dtensor"]
    print(f"rank {rank}: Shard(0) holds {d['shard local']}, Replicate() holds {d['replicate local']}")
d = two[0]["dtensor"]
print(f"full_tensor(): {d['full_tensor']}; (2 * t).sum() is {d['sum placement']} until asked: {d['sum']}")
full = torch.arange(8.0).reshape(4, 2)
assert two[0]["dtensor"]["shard local"] == full[:2].tolist() and two[1]["dtensor"]["shard local"] == full[2:].tolist()
assert all(two[r]["dtensor"]["full_tensor"] == two[r]["dtensor"]["redistributed"] == full.tolist() for r in (0, 1))
assert d["sum placement"] == "(Partial(sum),)" and d["sum"] == 2 * full.sum().item()
refs = [two[r]["dtensor"]["extra references to the group"] for r in (0, 1)]
print(f"references to the default process group left behind by one DTensor computation, per rank: {refs}")
assert refs == [1, 1]

# %% slideshow={"slide_type": "fragment"}
t = four[0]["two_d"]
print(f"mesh (dp rows, tp columns): {t['mesh']}; first weight {t['global']} placed {t['placements']}, local piece {t['local']}")
print(f"collectives of one forward pass: {t['forward']}")
assert t["local"] == (t["global"][0] // 4, t["global"][1])    # sharded by tp, then again by dp
assert t["forward"] == {"_allgather_base_": 2, "all_reduce": 1}
assert all(four[r]["two_d"]["max_diff"] < 1e-5 for r in range(4))
print("4 processes, data parallel x tensor parallel, after 3 Adam steps: allclose to one process (atol 1e-5): True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On the 2×2 mesh the first weight (64×64) is split into 4 row blocks of 16: by its output features across `tp` (`ColwiseParallel`), and each of those again across `dp` by FSDP2. `_StridedShard` is how DTensor records that the `dp` split happened *inside* the `tp` split. A forward pass communicates twice on the `dp` dimension (FSDP2 all-gathers each `Linear`'s shards) and once on `tp`: the single all-reduce that sums the row-parallel layer's partial outputs (notebook 12). And the four processes trained exactly the model one process trains.

One wart, found while writing this notebook and checked in the cell before the 2-D mesh: after a DTensor computation, PyTorch 2.13 keeps one reference to the default process group somewhere in its C++ side (not in any Python object `gc` can find; it survives deleting the mesh and the tensors). `destroy_process_group()` then cannot free the group, and `course_lib.launch`'s workers print a warning that its gloo threads may outlive the script. They did not cause a crash in any run here: both jobs above ended with exit code 0 on every rank, which `run_ranks` checks (the warning is not shown because the jobs run with `echo="none"`).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 6.5 Checkpoints: saved by 2 processes, resumed by 1 and by 4
"""

# %% slideshow={"slide_type": "fragment"}
import warnings

from resume import train

# dcp.load in a process without a process group warns that it assumes one process: that is the intent here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
files = sorted(os.listdir("_runs/dcp_step4"))
print("DCP checkpoint at step 4:", files)
assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file per saving rank, and the index

uninterrupted = two[0]["uninterrupted"]
assert torch.equal(uninterrupted, two[1]["uninterrupted"])
resumed_one = train(0, 1, stop=8, resume_from="_runs/dcp_step4")    # here, in the notebook's process
resumed_four = four[0]["resumed"]
for name, resumed, atol in (("N=1", resumed_one, 1e-6), ("N=4", resumed_four, 2e-5)):
    assert torch.allclose(resumed, uninterrupted, rtol=0, atol=atol)
    print(f"saved at N=2, resumed at {name}, steps 5-8: allclose to the uninterrupted N=2 run (atol {atol:g}): True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The run resumed at step 4 of the 8, in epoch 1, one step into it, with the noise generator where it was; on 1 process and on 4 it ends where the uninterrupted 2-process run ends. Drop a part of the state and it does not: the check below also resumes without the optimizer state (a fresh Adam: no `m`, `v`, step count) and without the generator's state (different noise).

The second file, written by rank 0 from a gathered state dict, holds the same weights as the DCP checkpoint: the portable alternative, with its cost paid by rank 0.
"""

# %% slideshow={"slide_type": "fragment"}
import resume
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

full = torch.load("_runs/full_step4.pt", map_location="cpu", weights_only=True)
model = resume.make_model()
weights = get_model_state_dict(model)
dcp.load({"model": weights}, checkpoint_id="_runs/dcp_step4")       # only the model part of the checkpoint
assert full.keys() == weights.keys() and all(torch.equal(full[k], weights[k]) for k in full)
print(f"rank 0's gathered torch.save file = the DCP shards, tensor for tensor ({len(full)} tensors): True")

for dropped in ("optim", "rng"):                              # resume at N=1 without one part of the state
    partial = train(0, 1, stop=8, resume_from="_runs/dcp_step4", keep=tuple(p for p in resume.PARTS if p != dropped))
    gap = (partial - uninterrupted).abs().max().item()
    print(f"resumed without {dropped!r}: largest difference from the uninterrupted run ~{gap:.0e}")
    assert gap > 5e-4

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. When to shard, and when to split the model

When the **model state** (parameters, gradients, optimizer state) does not fit on one device, shard it across the data-parallel ranks first: ZeRO-1 or 2 if dividing the optimizer state (and gradients) is enough, ZeRO-3/FSDP when the parameters too must be divided. It keeps the data-parallel program: every rank runs the whole model on its own data, the code barely changes (`fully_shard` and a state-dict API), and the traffic is DDP's (stages 1–2) or 1.5 times it (stage 3). On GPUs FSDP hides much of it behind compute by all-gathering the next unit while the current one runs (communication on its own CUDA stream); on these CPU processes there is nothing to overlap with, so that part is not measured here.

Pipeline and tensor parallelism (notebook 12) come in when sharding is not enough or not efficient: when the **activations** of even one micro-batch do not fit (sharding does not divide them; tensor parallelism does, inside each layer), when a single layer's gathered parameters are too big for one device, or at a scale where all-gathering every parameter over the slower links between nodes costs more than the compute it overlaps with. Large runs then combine them on a multi-dimensional `DeviceMesh`, as in section 6.4: FSDP across the data-parallel dimension, tensor parallelism within a node, pipeline stages across nodes.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Per parameter, training keeps `P + G + K` bytes (16 for mixed-precision Adam, 12 of them optimizer state). ZeRO-1 divides `K` by the number of ranks `N`, ZeRO-2 also `G`, ZeRO-3/FSDP also `P`; activations are never sharded. Measured on 2 processes, the tensors each rank held were the model's count exactly, part by part.
- ZeRO-1/2 by hand is reduce-scatter the gradients, update your own shard with your own optimizer state, all-gather the parameters: exactly DDP's result and exactly DDP's bytes, because an all-reduce is a reduce-scatter and an all-gather. `ZeroRedundancyOptimizer` is the built-in ZeRO-1.
- FSDP2's `fully_shard` makes parameters `Shard(0)` DTensors; a step is an all-gather per unit in forward, another in backward and a reduce-scatter (1.5× DDP's traffic), or one all-gather with `reshard_after_forward=False` at the cost of keeping the gathered parameters. `MixedPrecisionPolicy` computes in bf16 on fp32 shards; bf16 needs no scaler and fp16's `torch.amp.GradScaler` skips on every rank when any shard overflows.
- DTensor placements (`Shard`, `Replicate`, `Partial`) and `redistribute` are the collectives with names; a 2-D mesh ran data × tensor parallelism on 4 processes, equal to one process.
- `torch.distributed.checkpoint` writes each rank's shards and reloads them into any world size; with the whole training state (model, optimizer, step, sampler epoch, generator states) a run saved at 2 processes and resumed at 1 or 4 ends where the uninterrupted run ends.
- Shard first when model state does not fit; pipeline and tensor parallelism (notebook 12) when activations or single layers do not, or at scale.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `rank_bytes(num_params, world_size, stage)`: the bytes of model state one rank holds with mixed-precision Adam (2 + 2 + 12 bytes per parameter), for `stage` in `"ddp"`, `"zero1"`, `"zero2"`, `"zero3"`; a shard is `ceil(num_params / world_size)` elements.
2. For each case in `FIT_SCENARIOS` (parameters, world size, device memory, activations per rank; mixed-precision Adam), give the **first** of `ddp`, `zero1`, `zero2`, `zero3` whose model state plus activations fits (each stage communicates or reorganises more than the one before).
3. Write `bytes_sent(num_params, world_size, stage)`: the bytes one rank sends per training step with bf16 parameters and gradients (2 bytes each) and ring algorithms, for the four stages (ZeRO-3 with `reshard_after_forward=True`).
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.sharding import FIT_SCENARIOS, check_bytes_sent, check_rank_bytes, check_stage_that_fits


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

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054).
- Y. Zhao et al., *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*, VLDB 2023, [arXiv:2304.11277](https://arxiv.org/abs/2304.11277).
- PyTorch docs: [`torch.distributed.fsdp.fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), [DTensor and DeviceMesh](https://pytorch.org/docs/stable/distributed.tensor.html), [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html), [`torch.distributed.checkpoint`](https://pytorch.org/docs/stable/distributed.checkpoint.html), [`ZeroRedundancyOptimizer`](https://pytorch.org/docs/stable/distributed.optim.html), [collective communication](https://pytorch.org/docs/stable/distributed.html#collective-functions).
- PyTorch tutorials: [Getting started with FSDP2](https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html), [Getting started with DeviceMesh](https://pytorch.org/tutorials/recipes/distributed_device_mesh.html), [Distributed checkpoint recipe](https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html).
- NVIDIA NCCL documentation, "In-place operations" (reduce-scatter and all-gather in place when the rank's chunk is the input or output).
"""
