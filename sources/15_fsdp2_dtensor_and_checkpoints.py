# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 15 · FSDP2, DTensor and distributed checkpoints
Notebook 14 built ZeRO and FSDP by hand and checked them against PyTorch's. This notebook uses PyTorch's own: FSDP2's `fully_shard`, the `DTensor` and `DeviceMesh` it is built on, and `torch.distributed.checkpoint`, which saves a sharded run shard by shard and resumes it on another number of processes. Each is run in real processes and checked against one process.

By the end you will be able to:
- use FSDP2's `fully_shard` and say what it adds to the hand version (DTensor parameters and state dicts, prefetch, `reshard_after_forward`, `MixedPrecisionPolicy`, gradient scaling), and count its collectives per step;
- check a sharded run against one process with a check that sees a gradient-scale bug: the first step's gradients, not only the losses after Adam;
- use `DeviceMesh` and `DTensor` (`Shard`, `Replicate`, `Partial`, `redistribute`, `full_tensor`), including a 2-D mesh of data × tensor parallelism, and name the collective each change of placement runs;
- save a sharded training run with `torch.distributed.checkpoint` and resume it on a different number of processes, exactly, and say what a GPU run must save on top;
- say when to shard, and when to split the model instead.

This notebook assumes: notebook 14 (ZeRO's memory count and FSDP by hand), 11 (DDP, launching, checkpoints), 13 (tensor parallelism, for the 2-D mesh), 06 (loss scaling, `GradScaler`) and 07 (bf16 against fp16). No GPU: every distributed run here is CPU processes talking over gloo, launched with `course_lib.launch`, one launch per section, with the results right after the code that produced them. On a GPU machine, `COURSE_DEVICE=cuda` (notebook 00) runs the FSDP2 and checkpoint jobs on GPUs with NCCL instead, one process per GPU.
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

seed_everything(0)
os.makedirs("_runs/n15", exist_ok=True)  # this notebook's worker scripts (git ignores _runs)
sys.path.insert(0, os.path.abspath("_runs/n15"))
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

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every section trains notebook 14's model again, written here into this notebook's own folder (`_runs/n15/model.py`): four `Linear` layers of 256, the same seeded weights in every process, and a global batch per step of which rank `r` takes rows `r, r + N, ...`. Its `shard_model` applies FSDP2: every `Linear` is a unit, then the root.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n15/model.py
"""The model notebooks 14 and 15 train, its batches and its loss; FSDP2's sharding of it (section 1)."""
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


# %% slideshow={"slide_type": "fragment"}
from model import DEPTH, make_model

psi = sum(p.numel() for p in make_model().parameters())  # the parameters of the model: Ψ
print(f"{DEPTH} units of {psi // DEPTH:,} parameters: psi = {psi:,}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. FSDP2's `fully_shard`: the same, done properly

PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`, the successor of the `FullyShardedDataParallel` wrapper, Zhao et al. 2023) is notebook 14 §3's design: `fully_shard(layer)` makes each `Linear` a unit, `fully_shard(model)` the root (`shard_model` in `_runs/n15/model.py`), and a step gathers, frees, gathers again and reduce-scatters as notebook 14's hand version did. What it adds:

- **DTensor parameters.** It shards each parameter on its first dimension, not a flat vector: each becomes a `DTensor` with placement `Shard(0)` (section 2), so rank `r` stores rows `r·rows/N ...` of each weight. Parameters keep their names and shapes, and the state dict is one of sharded DTensors, which `torch.distributed.checkpoint` saves shard by shard (section 3);
- **prefetch** (notebook 14 §3.2), on separate CUDA streams on a GPU; `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` tune it;
- **`reshard_after_forward`**: `True` (notebook 14's hand version) frees each unit after forward and gathers it again for backward; `False` keeps the gathered parameters from forward to backward: one all-gather per unit per step instead of two, for the memory of full parameters during that time (ZeRO-2's memory, between forward and backward). The default in 2.13 is `None`: `True` for every unit but the root (the outermost `fully_shard`, called last), which keeps its gathered parameters, since backward starts with it at once. Here the root, `fully_shard(model)`, has no parameters of its own (every `Linear` is a unit), so with the default every unit holding parameters is resharded; notebook 19 §3 shows a root that holds some;
- **`MixedPrecisionPolicy`** per unit (notebook 14 §3 used it), gradient scaling with sharded gradients (below), and more than this notebook runs: CPU offload of the shards (`CPUOffloadPolicy`), HSDP (shard within a node, replicate across nodes, on a 2-D mesh), and accumulation without reduce-scatter (`set_requires_gradient_sync(False)`).

**Gradient scaling.** bf16 has fp32's range, so bf16 training needs no loss scaling (notebook 07 §3). fp16 does, and with sharded gradients a scaler must see an overflow in *any* rank's shard, or ranks skip different steps and drift apart. The old FSDP wrapper needed `ShardedGradScaler`, which all-reduces the overflow flag. With FSDP2 the gradients are DTensors, and DTensor's dispatch reduces the overflow flag of `torch.amp.GradScaler`'s unscale across the mesh: the ordinary scaler works. The script checks it by putting an `inf` into the last rank's shard only.

The job: FSDP2 in fp32 against one process training on the whole batch; the collectives of one step counted with `CommDebugMode` (from `torch.distributed.tensor.debug`, a dispatch mode that records every collective) for each `reshard_after_forward`, and whether each unit's weight is still the sharded `DTensor` between forward and backward (a gathered unit's weight is a plain tensor); the state dict's types; both scalers.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n15/fsdp2_demo.py
"""FSDP2: equal to one process; collectives per step; reshard_after_forward; state dicts; GradScaler."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from model import LR, batch, loss_fn, make_model, shard_model, train_step

def against_one_process(rank, n, device, steps=3):
    reference = make_model(device=device)                      # one process, the whole global batch
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    model = shard_model(make_model(device=device))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for s in range(steps):
        train_step(reference, ref_opt, *batch(s, 0, 1, per_rank=8 * n, device=device))
        opt.zero_grad()
        loss_fn(model, *batch(s, rank, n, device=device)).backward()  # my rows of the same global batch
        if s == 0:  # the first gradients, before Adam saw them: Adam hides a constant factor, they do not
            first = {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()}
            reference_first = {name: q.grad.clone().cpu() for name, q in reference.named_parameters()}
        opt.step()
    w = model[0].weight
    return {"first_grads": first, "reference_grads": reference_first, "type": type(w).__name__,
            "max_diff": max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())),
            "placements": str(w.placements), "global_shape": tuple(w.shape), "local_shape": tuple(w.to_local().shape)}

def one_step_collectives(rank, n, device, reshard):
    model = shard_model(make_model(device=device), reshard_after_forward=reshard)
    x, y = batch(0, rank, n, device=device)
    loss_fn(model, x, y).backward()                             # a first step: lazy initialisation
    units = [m for m in model if isinstance(m, nn.Linear)]
    with CommDebugMode() as comm:
        loss = loss_fn(model, x, y)
        sharded = [isinstance(u.weight, DTensor) for u in units]  # between forward and backward
        loss.backward()
    counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
    gathered = sum(p.numel() * p.element_size() for u, s in zip(units, sharded) if not s for p in u.parameters())
    return {"counts": counts, "gathered_units": sharded.count(False), "gathered_bytes": gathered}

def state_dicts(rank, n, device):
    model = shard_model(make_model(device=device))
    sharded = get_model_state_dict(model)["0.weight"]
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"sharded": (type(sharded).__name__, str(sharded.placements), tuple(sharded.to_local().shape)),
            "full": (type(full["0.weight"]).__name__, tuple(full["0.weight"].shape)) if full else "empty"}

def scalers(rank, n, device):
    out = {}
    makers = {"torch.amp.GradScaler": lambda: torch.amp.GradScaler(device, init_scale=1024.0),
              "ShardedGradScaler": lambda: ShardedGradScaler(device=device, init_scale=1024.0)}
    for name, make in makers.items():
        model = shard_model(make_model(width=8, depth=1, device=device))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make()
        before = model[0].weight.to_local().clone()
        scaler.scale(loss_fn(model, *batch(0, rank, n, width=8, device=device))).backward()
        if rank == n - 1:
            model[0].weight.grad.to_local()[0, 0] = float("inf")  # an overflow in the last rank's shard only
        scaler.step(opt)
        scaler.update()
        out[name] = {"stepped": not torch.equal(model[0].weight.to_local(), before), "scale": scaler.get_scale()}
    return out

def report(rank, n, device):
    return {"one_process": against_one_process(rank, n, device),
            "reshard": {r: one_step_collectives(rank, n, device, r) for r in (True, False)},
            "state_dict": state_dicts(rank, n, device), "scalers": scalers(rank, n, device)}


# %% slideshow={"slide_type": "subslide"}
fsdp2_runs = launch("_runs/n15/fsdp2_demo.py:report")
f = fsdp2_runs[0]
one = f["one_process"]
print(f"weight of the first Linear: a {one['type']} {one['placements']}, global {one['global_shape']}, local {one['local_shape']}")
assert one["type"] == "DTensor" and one["local_shape"] == (one["global_shape"][0] // RANKS, one["global_shape"][1])
assert all(r["one_process"]["max_diff"] < 1e-4 for r in fsdp2_runs)
print(f"FSDP2 ({RANKS} processes) after 3 Adam steps allclose to one process on the whole batch (atol 1e-4): True")
first = compare_gradients(one["first_grads"], one["reference_grads"], tolerance=1e-5, world_size=RANKS)
print(f"FSDP2's first-step {first}")  # the check a gradient-scale bug cannot pass (Adam's steps would)
assert first
for reshard, r in f["reshard"].items():
    print(f"reshard_after_forward={reshard!s:<5}: one step = {r['counts']}; units still gathered after forward: "
          f"{r['gathered_units']} of {DEPTH} ({r['gathered_bytes']:,} bytes of full parameters)")
for reshard, r in f["reshard"].items():  # each collective moves (N-1)/N of a unit's bytes; DDP's all-reduce: 2 of those
    print(f"reshard_after_forward={reshard!s:<5}: bytes sent over DDP's: {sum(r['counts'].values()) / (2 * DEPTH):.1f}x")
assert f["reshard"][True]["counts"] == {"_allgather_base_": 2 * DEPTH, "_reduce_scatter_base_": DEPTH}
assert f["reshard"][False]["counts"] == {"_allgather_base_": DEPTH, "_reduce_scatter_base_": DEPTH}
assert f["reshard"][True]["gathered_units"] == 0 and f["reshard"][False]["gathered_bytes"] == 4 * psi

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
(`_allgather_base_` and `_reduce_scatter_base_` are the operators behind `all_gather_single` and `reduce_scatter_single`.) With the default (`None`: `True` for these 4 units, which hold every parameter; the root holds none) each of the 4 units is all-gathered twice and reduce-scattered once per step, as in notebook 14 §3: **1.5 times DDP's traffic** (three collectives of `(N-1)/N · S` against an all-reduce's two). With `reshard_after_forward=False` it is one all-gather per unit, the traffic of DDP, but all 4 units keep their full parameters from forward to backward (4 bytes × every parameter, here 1,052,672 bytes on each rank). With `True`, no unit stays gathered between forward and backward (0 of 4 above).

The difference from one process (below 1e-4, not bit-exact) is that of summing the same numbers in another order; Adam's division by `√v` can magnify such differences where gradients are near zero.

State dicts, and the gradient scalers:
"""

# %% slideshow={"slide_type": "fragment"}
print("get_model_state_dict(model)['0.weight']: a {} {}, local {}".format(*f["state_dict"]["sharded"]))
fulls = [r["state_dict"]["full"] for r in fsdp2_runs]
print(f"with StateDictOptions(full_state_dict=True, cpu_offload=True), per rank: {fulls}")
assert f["state_dict"]["sharded"][0] == "DTensor" and fulls == [("Tensor", one["global_shape"])] + ["empty"] * (RANKS - 1)
for name in ("torch.amp.GradScaler", "ShardedGradScaler"):
    seen = [r["scalers"][name] for r in fsdp2_runs]
    print(f"{name:<21} inf in rank {RANKS - 1}'s shard only: stepped {[s['stepped'] for s in seen]}, scale 1024 -> {[s['scale'] for s in seen]}")
    assert all(not s["stepped"] and s["scale"] == 512.0 for s in seen)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The state dict holds each rank's shard as a DTensor (no rank gathers anything to produce it); the full state dict gathers every parameter, and with `cpu_offload=True` only rank 0 keeps it, in CPU memory (the other ranks get an empty dict). Both scalers made **both** ranks skip the step and halve the scale, although only rank 1's shard overflowed: with FSDP2, `torch.amp.GradScaler` is enough.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. DTensor and DeviceMesh

FSDP2's parameters are `DTensor`s: a tensor whose data lives on the processes of a `DeviceMesh` (an n-dimensional array of ranks, each dimension with its own process group), described by one *placement* per mesh dimension:

- `Shard(d)`: split along dimension `d`, one piece per rank;
- `Replicate()`: a full copy on every rank;
- `Partial()`: every rank holds a summand; the value is their sum (what a reduction over a sharded dimension produces, before anyone communicates).

`distribute_tensor` places a tensor, `to_local()` is this rank's piece, `full_tensor()` gathers the whole, and `redistribute` changes placements with the matching collective (`Shard → Replicate` is an all-gather, `Partial → Replicate` an all-reduce, `Partial → Shard` a reduce-scatter).

A mesh with two dimensions combines parallelisms. On 4 processes arranged as a 2×2 mesh named `("dp", "tp")`, `parallelize_module` splits each layer's weights across the `tp` ranks (notebook 13's tensor parallelism: `ColwiseParallel` splits the first `Linear` by outputs, `RowwiseParallel` the second by inputs, so the only communication is one all-reduce of the output), and `fully_shard(..., mesh=mesh["dp"])` shards what remains across the `dp` ranks, which see different data. Each weight is then sharded twice, once per mesh dimension. This section's job runs on 4 CPU processes (on the GPU path too: it shows placements, not speed).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n15/dtensor_demo.py
"""DTensor placements on a 1-D mesh; data parallel x tensor parallel on a 2-D mesh, against one process."""
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from model import LR, batch, loss_fn, make_model, shard_model, train_step

def placements(rank, n, device):
    mesh = init_device_mesh(device, (n,))
    full = torch.arange(8.0).reshape(4, 2)                      # the same tensor on every rank
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    replicated = distribute_tensor(full, mesh, [Replicate()])
    gathered = sharded.redistribute(mesh, [Replicate()])        # an all-gather
    total = (sharded * 2).sum()                                 # each rank sums its rows: Partial
    return {"shard local": sharded.to_local().tolist(), "replicate local": replicated.to_local().tolist(),
            "full_tensor": sharded.full_tensor().tolist(), "redistributed": gathered.to_local().tolist(),
            "sum placement": str(total.placements), "sum": total.full_tensor().item()}

def two_d(rank, n, device, steps=3, width=64):
    mesh = init_device_mesh(device, (2, n // 2), mesh_dim_names=("dp", "tp"))
    dp, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    reference, model = make_model(width, depth=2), make_model(width, depth=2)  # Linear, Tanh, Linear
    ref_opt = torch.optim.Adam(reference.parameters(), lr=LR)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    shard_model(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for s in range(steps):
        x, y = batch(s, 0, 1, per_rank=8, width=width)          # the global batch
        train_step(reference, ref_opt, x, y)
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

def report(rank, n, device):
    return {"placements": placements(rank, n, device), "two_d": two_d(rank, n, device)}


# %% slideshow={"slide_type": "subslide"}
dtensor_runs = launch("_runs/n15/dtensor_demo.py:report", nprocs=4, device="cpu")  # CPU and gloo, also on the GPU path
full = torch.arange(8.0).reshape(4, 2)
for rank, r in enumerate(dtensor_runs):
    d = r["placements"]
    print(f"rank {rank}: Shard(0) holds {d['shard local']}, Replicate() holds {d['replicate local']}")
    assert d["shard local"] == full[rank:rank + 1].tolist() and d["replicate local"] == full.tolist()
    assert d["full_tensor"] == d["redistributed"] == full.tolist()
d = dtensor_runs[0]["placements"]
print(f"full_tensor(): {d['full_tensor']}; (2 * t).sum() is {d['sum placement']} until asked: {d['sum']}")
assert d["sum placement"] == "(Partial(sum),)" and d["sum"] == 2 * full.sum().item()

# %% slideshow={"slide_type": "fragment"}
t = dtensor_runs[0]["two_d"]
print(f"mesh (dp rows, tp columns): {t['mesh']}; first weight {t['global']} placed {t['placements']}, local piece {t['local']}")
print(f"collectives of one forward pass: {t['forward']}")
assert t["local"] == (t["global"][0] // 4, t["global"][1])    # sharded by tp, then again by dp
assert t["forward"] == {"_allgather_base_": 2, "all_reduce": 1}
assert all(r["two_d"]["max_diff"] < 1e-5 for r in dtensor_runs)
print("4 processes, data parallel x tensor parallel, after 3 Adam steps: allclose to one process (atol 1e-5): True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On the 2×2 mesh the first weight (64×64) is split into 4 row blocks of 16: by its output features across `tp` (`ColwiseParallel`), and each of those again across `dp` by FSDP2. `_StridedShard` is how DTensor records that the `dp` split happened *inside* the `tp` split. A forward pass communicates twice on the `dp` dimension (FSDP2 all-gathers each `Linear`'s shards) and once on `tp`: the single all-reduce that sums the row-parallel layer's partial outputs (notebook 13). And the four processes trained exactly the model one process trains.

One thing DTensor does out of sight matters when a job ends: it caches its sharding decisions, and the cache entries hold the mesh, and through it the process groups, after `destroy_process_group()` (notebook 11 §10.2 shows it, and why it can crash a gloo job at exit). `run_ranks` ends every job with `course_lib.teardown.end_process_group`, which empties those caches before destroying the group, and checks that every rank exited with code 0.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Checkpoints of a sharded model

Notebook 11 saved a DDP checkpoint the simple way: every rank holds everything, rank 0 writes. With sharding nobody holds everything, and two ways remain:

- **gather, then rank 0 writes** (`get_model_state_dict(..., StateDictOptions(full_state_dict=True, cpu_offload=True))`, then `torch.save`): one ordinary file, loadable anywhere, but rank 0 must hold the whole model in CPU memory and write it alone;
- **every rank writes its own shards** with `torch.distributed.checkpoint` (DCP): `dcp.save(state, checkpoint_id=dir)` writes one file per rank plus a `.metadata` file that records which piece of which tensor is where. `dcp.load` reads into whatever sharding the *loading* run has, so a checkpoint saved by 2 processes can be loaded by 1 or by 4.

`get_state_dict(model, optimizer)` and `set_state_dict(...)` (from `torch.distributed.checkpoint.state_dict`) give model and optimizer state keyed by parameter names, the same for a plain, a DDP or an FSDP2 model, which is what makes the resharding work.

A checkpoint that resumes a run **exactly** holds the whole training state, not just the weights: the model, the optimizer (Adam's `m`, `v` and step), the step counter, the epoch the `DistributedSampler` is in (notebook 11's `set_epoch`), and the state of every random generator the run draws from (here a generator for data augmentation noise). The script below trains 8 steps, saving everything at step 4. Another run loads it, at a different world size, and trains steps 5 to 8.

Resuming at a different world size is only equal if the runs see the same *global* batches. `DistributedSampler` gives rank `r` the indices `r, r + N, r + 2N, ...` of the epoch's shuffled order, so with a per-rank batch of `16 / N` the step's global batch is the same 16 samples for `N = 1, 2, 4`; the mean loss over them does not depend on how they are split. The noise is drawn for the whole global batch on every rank (the same generator, the same state) and each rank takes its rows, for the same reason.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/n15/resume.py
"""Train with the whole state checkpointed by torch.distributed.checkpoint; resume at any world size."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.tensor import DTensor
from torch.utils.data import DistributedSampler, TensorDataset

from model import LR, WIDTH, make_model, shard_model, train_step

GLOBAL_BATCH, SAMPLES = 16, 48                                  # 3 steps per epoch
PARTS = ("model", "optim", "progress", "rng")                  # the whole training state

def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(SAMPLES, WIDTH, generator=g), torch.randn(SAMPLES, WIDTH, generator=g))

def train(rank, n, stop, device="cpu", save_dir=None, save_at=None, resume_from=None, full_path=None, keep=PARTS):
    """Train to step `stop`; save everything at step `save_at`, or start from a saved run (the parts in `keep`)."""
    model = make_model(device=device)
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
            train_step(model, opt, x.to(device), y.to(device))
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
    return torch.cat([p.detach().flatten() for p in params]).cpu()

def uninterrupted(rank, n, device, ckpt_dir, full_path):
    return train(rank, n, stop=8, device=device, save_dir=ckpt_dir, save_at=4, full_path=full_path)

def resumed(rank, n, device, ckpt_dir):
    return train(rank, n, stop=8, device=device, resume_from=ckpt_dir)


# %% slideshow={"slide_type": "fragment"}
import shutil

shutil.rmtree("_runs/n15/dcp_step4", ignore_errors=True)
saved_by = launch("_runs/n15/resume.py:uninterrupted", args=("_runs/n15/dcp_step4", "_runs/n15/full_step4.pt"))
files = sorted(os.listdir("_runs/n15/dcp_step4"))
print(f"DCP checkpoint at step 4: {files}")
assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(RANKS)]  # one file per saving rank, and the index

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Resumed at `N = 1` right here, in the notebook's own process (`dcp.load` works without a process group, into a plain model), and at `N = 4` by a new job:
"""

# %% slideshow={"slide_type": "fragment"}
import warnings

import resume

# dcp.load in a process without a process group warns that it assumes one process: that is the intent here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
uninterrupted = saved_by[0]
assert all(torch.equal(uninterrupted, u) for u in saved_by)
resumed_one = resume.train(0, 1, stop=8, resume_from="_runs/n15/dcp_step4")  # on the CPU, in this process
resumed_four = launch("_runs/n15/resume.py:resumed", nprocs=course_ranks(4), args=("_runs/n15/dcp_step4",))[0]
across = 1e-6 if DEVICE == "cpu" else 1e-4  # the GPU path compares a GPU run with this CPU process
for name, result, atol in (("N=1", resumed_one, across), (f"N={course_ranks(4)}", resumed_four, 2e-5)):
    assert torch.allclose(result, uninterrupted, rtol=0, atol=atol)
    print(f"saved at N={RANKS}, resumed at {name}, steps 5-8: allclose to the uninterrupted N={RANKS} run (atol {atol:g}): True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The run resumed at step 4 of the 8, in epoch 1, one step into it, with the noise generator where it was; on 1 process and on 4 it ends where the uninterrupted 2-process run ends (up to the order of sums, which changes with the number of shards). Drop a part of the state and it does not: the check below also resumes without the optimizer state (a fresh Adam: no `m`, `v`, step count) and without the generator's state (different noise).

The second file, written by rank 0 from a gathered state dict, holds the same weights as the DCP checkpoint: the portable alternative, with its cost paid by rank 0.
"""

# %% slideshow={"slide_type": "fragment"}
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

full = torch.load("_runs/n15/full_step4.pt", map_location="cpu", weights_only=True)
model = resume.make_model()
weights = get_model_state_dict(model)
dcp.load({"model": weights}, checkpoint_id="_runs/n15/dcp_step4")       # only the model part of the checkpoint
assert full.keys() == weights.keys() and all(torch.equal(full[k], weights[k]) for k in full)
print(f"rank 0's gathered torch.save file = the DCP shards, tensor for tensor ({len(full)} tensors): True")

for dropped in ("optim", "rng"):                              # resume at N=1 without one part of the state
    partial = resume.train(0, 1, stop=8, resume_from="_runs/n15/dcp_step4", keep=tuple(p for p in resume.PARTS if p != dropped))
    gap = (partial - uninterrupted).abs().max().item()
    print(f"resumed without {dropped!r}: largest difference from the uninterrupted run ~{gap:.0e}")
    assert gap > 5e-4

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**On GPUs, exact resumption needs more state.** This run resumes exactly because everything random it draws comes from one explicit CPU generator, the same on every rank, and because CPU kernels give the same bits every time. A GPU training script must also save and restore:

- **each rank's CUDA generator** (`torch.cuda.get_rng_state()`, one per rank, saved under a key with the rank in it): dropout and any other random op on the GPU draw from it, and ranks may hold different states;
- **each rank's CPU generator** when ranks draw differently (`torch.get_rng_state()`), and Python's and NumPy's if the script uses them;
- **the data loader's position and its workers' generators**: a `DataLoader` with worker processes seeds each worker from the base generator and prefetches ahead, so "the step counter" does not say where it is; `torchdata`'s `StatefulDataLoader` has the `state_dict()` / `load_state_dict()` for that.

And it must run **deterministic kernels**: some GPU backward kernels add with atomics in whatever order threads arrive, so two runs differ in the last bits without any randomness; `torch.use_deterministic_algorithms(True)` (with `CUBLAS_WORKSPACE_CONFIG=:4096:8` for cuBLAS) makes them repeatable, at some cost in speed. DCP's **`Stateful` protocol** keeps all this in one checkpoint: any object with `state_dict()` and `load_state_dict()` placed in the dict given to `dcp.save` / `dcp.load` is saved and restored through those methods, so a training script wraps its loader, its generators and its progress in such objects.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. When to shard, and when to split the model

When the **model state** (parameters, gradients, optimizer state) does not fit on one device, shard it across the data-parallel ranks first: ZeRO-1 or 2 if dividing the optimizer state (and gradients) is enough, ZeRO-3/FSDP when the parameters too must be divided. It keeps the data-parallel program: every rank runs the whole model on its own data, the code barely changes (`fully_shard` and a state-dict API), and the traffic is DDP's (stages 1–2) or 1.5 times it (stage 3). On GPUs FSDP hides much of it behind compute by all-gathering the next unit while the current one runs (the prefetch of notebook 14 §3.2, on its own CUDA stream); on these CPU processes there is nothing to overlap with, so that part is not measured here.

Pipeline and tensor parallelism (notebook 13) come in when sharding is not enough or not efficient: when the **activations** of even one micro-batch do not fit (sharding does not divide them; tensor parallelism divides those inside its column- and row-parallel layers, but leaves the ones around them, the layer norms, dropout and the residual stream, whole on every tensor-parallel rank unless **sequence parallelism** splits them along the sequence: notebook 17), when a single layer's gathered parameters are too big for one device, or at a scale where all-gathering every parameter over the slower links between nodes costs more than the compute it overlaps with. Large runs then combine them on a multi-dimensional `DeviceMesh`, as in section 2: FSDP across the data-parallel dimension, tensor parallelism within a node, pipeline stages across nodes.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- FSDP2's `fully_shard` adds DTensor parameters and state dicts, prefetch, and `reshard_after_forward`: 1.5x DDP's traffic by default, DDP's with `False` at the cost of keeping the gathered parameters. bf16 needs no scaler, and fp16's `torch.amp.GradScaler` skips on every rank when any shard overflows.
- FSDP2 trains like one process on the whole batch, and the check that says so compares the first step's gradients (within 1e-5, relative), which a gradient-scale bug cannot pass; the losses and parameters after Adam's steps would hide it.
- DTensor placements (`Shard`, `Replicate`, `Partial`) and `redistribute` are the collectives with names; a 2-D mesh ran data × tensor parallelism on 4 processes, equal to one process.
- `torch.distributed.checkpoint` writes each rank's shards and reloads them into any world size; with the whole training state (model, optimizer, step, sampler epoch, generator states) a run saved at 2 processes and resumed at 1 or 4 ends where the uninterrupted run ends. A GPU run also saves each rank's CUDA generator and its loader's state, and runs deterministic kernels.
- Shard first when model state does not fit; pipeline and tensor parallelism (notebook 13) when activations or single layers do not, or at scale.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `local_shape(global_shape, mesh_shape, placements, coordinate)`: the shape of the piece of a DTensor held by the rank at `coordinate` on the mesh. `placements` has one entry per mesh dimension: `"R"` for `Replicate()`, or an int `d` for `Shard(d)`. DTensor cuts like `torch.chunk`, and two mesh dimensions that shard the same tensor dimension cut one after the other.
2. For each placement change in `REDISTRIBUTIONS` on a 1-D mesh, name the collective `redistribute` runs (section 2): one of `COLLECTIVES` (`"none"` means no communication).
3. Write `fsdp2_step(unit_params, world_size, reshard_after_forward, param_bytes=2, grad_bytes=4)` for a model whose FSDP2 units hold `unit_params[i]` parameters each (the root holds none). Return a dict with:
   - the number of `"all_gather"`s and `"reduce_scatter"`s in one training step (section 1 counted them);
   - `"sent_bytes"`: what one rank sends (ring algorithms, so (N-1)/N of each collective's bytes; parameters are gathered in `param_bytes`, gradients reduced in `grad_bytes`);
   - `"peak_gathered_bytes"`: the most bytes of gathered parameters alive at once, without prefetch.

   `world_size` may be 1.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.fsdp2_dtensor import COLLECTIVES, REDISTRIBUTIONS, check_fsdp2_step, check_local_shape, check_redistribute_collectives

def local_shape(global_shape, mesh_shape, placements, coordinate):
    raise NotImplementedError  # your code here

print(check_local_shape(local_shape))

# %% slideshow={"slide_type": "-"}
print("placement changes:", "; ".join(REDISTRIBUTIONS))
print("collectives:", ", ".join(COLLECTIVES))
answer = {change: ... for change in REDISTRIBUTIONS}  # one of COLLECTIVES for each
print(check_redistribute_collectives(answer))


# %% slideshow={"slide_type": "-"}
def fsdp2_step(unit_params, world_size, reshard_after_forward, param_bytes=2, grad_bytes=4):
    raise NotImplementedError  # your code here

print(check_fsdp2_step(fsdp2_step))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- Y. Zhao et al., *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*, VLDB 2023, [arXiv:2304.11277](https://arxiv.org/abs/2304.11277).
- S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054).
- PyTorch docs: [`torch.distributed.fsdp.fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), [DTensor and DeviceMesh](https://pytorch.org/docs/stable/distributed.tensor.html), [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html), [`torch.distributed.checkpoint`](https://pytorch.org/docs/stable/distributed.checkpoint.html), [automatic mixed precision, `GradScaler`](https://pytorch.org/docs/stable/amp.html), [reproducibility](https://pytorch.org/docs/stable/notes/randomness.html).
- PyTorch tutorials: [Getting started with FSDP2](https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html), [Getting started with DeviceMesh](https://pytorch.org/tutorials/recipes/distributed_device_mesh.html), [Distributed checkpoint recipe](https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html).
- `torchdata`'s [Stateful DataLoader tutorial](https://pytorch.org/data/0.11/stateful_dataloader_tutorial.html) (`StatefulDataLoader`).
"""
