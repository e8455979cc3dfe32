# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 22 · Capstone: one training script, every technique, measured

The course's techniques in one real training script for notebook 16's transformer: bf16 autocast (notebooks 06–07), full and selective activation checkpointing (04–05, 16), gradient accumulation (08), DDP (09–11) or FSDP2 (14, 15, 19), tensor parallelism on a 2-D mesh (17), pipeline parallelism with `torch.distributed.pipelining` (13), context parallelism with ring attention (18), `torch.compile` (20) and distributed checkpoints (15, 19). Each is a flag. The notebook launches combinations of them and checks that each trains like one plain process; it kills a rank and lets `torchrun` restart the job from its last checkpoint, and resumes a run saved on 4 processes on 2. A Slurm job script launches the same training on two nodes. The course's planner (notebook 21) sizes the capstone's runs by counting, and a table closes the notebook: which technique answers which bottleneck.

By the end you will be able to:
- combine autocast, checkpointing, accumulation, DDP or FSDP2, tensor, pipeline or context parallelism and `torch.compile` in one training script without changing what it computes, and prove it with the first step's gradients;
- save and resume a sharded run with `torch.distributed.checkpoint`, after a crash and on another number of processes;
- launch the same script with Slurm on two nodes (`sbatch`, `srun torchrun` with a c10d rendezvous) and read what `squeue`, `scancel` and a failed node show;
- pick the technique for a bottleneck (activation memory, batch size, model size, time).

Notebook 23 translates the posts' APIs into today's.

This notebook assumes: notebooks 04–21 (21's planner sizes these runs in section 4). It runs on 2 CPU cores; timings are marked `~`. No GPU needed.
"""

# %% slideshow={"slide_type": "-"}
import importlib.util
import json
import os
import shutil
import sys
import warnings

import torch
import torch.distributed as dist

from course_lib.launch import run_torchrun
from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
print(f"torch {torch.__version__.split('+')[0]}, gloo: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The script

The model is notebook 16's tiny transformer (2 blocks, width 64, 256-byte vocabulary), untied and with hand-written attention, as notebook 21 plans it; the data are windows of Python's documentation (`course_lib.data.text_batch`). Every run trains **the same global batches** of 16 sequences of 64 bytes with Adam: step `s` draws its windows from a generator seeded with `1000 + s`, and each data-parallel rank takes its rows. So every layout computes the same losses, up to rounding. The flags:

- `--bf16`: the forward under `torch.autocast(device, dtype=torch.bfloat16)`, parameters and optimizer in float32 (notebook 07);
- `--checkpointing none|full|selective`: the model's own switch (notebook 16): full keeps each block's input, selective drops attention's probabilities;
- `--accum K`: K micro-batches per step, each loss divided by K; DDP skips its all-reduce (`no_sync`) and FSDP2 its reduce-scatter (`set_requires_gradient_sync(False)`) on all but the last;
- `--dp ddp|fsdp2` and `--tp T`: N processes form a 2-D mesh, N/T data-parallel × T tensor-parallel (`init_device_mesh`, notebook 17). `--tp` uses `parallelize_module` with notebook 17's plan (column-parallel in, row-parallel out, the embedding and head split by vocabulary); FSDP2 shards each block, then the root, over the data dimension (notebook 19). DDP with T > 1 all-reduces the tensor-parallel shards' gradients over the data dimension by hand;
- `--pp P` with `--schedule 1f1b|interleaved|gpipe`: N/P data-parallel × P pipeline stages with `torch.distributed.pipelining`, the `--accum` micro-batches run by the schedule; `--cp C`: N/C data-parallel × C context-parallel ranks, each with a zig-zag slice of every sequence and ring attention (section 2.1). Both average their gradients by hand, with DDP's arithmetic; `--layers L` gives the model L blocks (a pipeline needs more than 2);
- `--compile`: `torch.compile` with the `aot_eager` backend on the CPU (traced, run by PyTorch's own kernels: notebook 20's cheap backend);
- `--save-every K` and `--resume`: a DCP checkpoint (`torch.distributed.checkpoint`, notebook 19 §5) of the model, the optimizer, the step and each rank's random-number state every K steps; `--resume` loads the newest on whatever mesh the new run has;
- `--device cpu|cuda` (default cpu, never chosen by availability): the GPU path binds `LOCAL_RANK`'s GPU, uses NCCL and passes `device_id=`, as notebooks 11 and 19 do.

`--runs` runs several flag sets in turn in one launch, so that the processes start once. Each run writes its losses, its step time (the slowest rank's median) and what the fullest rank holds between steps, counted exactly from its local tensors (parameters, gradients, Adam's moments; Adam's 0-d step counters left out, as the planner does).

Two parts of the script are not training practice but workarounds for defects of PyTorch 2.13: the `import torch.distributed.nn` before `init_process_group` (notebook 11 §10.2) and the store with a fresh prefix per restart attempt (notebook 12 §5). Skip them on a first read; a script for a PyTorch without these defects drops both and calls `init_process_group` alone.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/capstone_train.py
"""Train the course's transformer with every technique of the course, each a flag.

  python capstone_train.py --out DIR                         one process: the reference
  torchrun --nproc_per_node=N capstone_train.py --out DIR [--dp ddp|fsdp2] [--tp T | --pp P | --cp C]
      [--schedule 1f1b|interleaved|gpipe] [--layers L] [--bf16] [--checkpointing none|full|selective]
      [--accum K] [--compile] [--save-every K] [--resume] [--device cpu|cuda] [--steps S] [--crash-at S]

N processes form a 2-D mesh: (N/T data-parallel) x (T tensor-parallel), or N/P x (P pipeline stages), or
N/C x (C context-parallel ranks, each a zig-zag slice of every sequence). --pp and --cp average the
gradients over the data-parallel (and context-parallel) ranks by hand; --pp runs --accum K micro-batches
through a torch.distributed.pipelining schedule. Every layout trains on the same global batches (text
windows drawn from a generator seeded by the step), so every layout computes the same losses up to rounding. --save-every K writes a DCP checkpoint (model, optimizer, step, each
rank's RNG state) into DIR/ckpt/step_K; --resume loads the newest one, on any number of processes.
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import warnings
import weakref
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import torch.distributed.nn  # noqa: F401  (before init_process_group: notebook 11, section 10.2)
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from course_lib.context_parallel import ring_attention, shard_sequence, zigzag_layout
from course_lib.data import text_batch, text_corpus
from course_lib.teardown import end_process_group
from course_lib.transformer import PRESETS, Transformer

# notebook 22's tiny transformer: untied (TP splits the embedding and the head apart), hand-written attention
CONFIG = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False, attention="naive")
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message="Full backward hook is firing.*")


def log(*parts):
    if not dist.is_initialized() or dist.get_rank() == 0:
        sys.stdout.write(f"[rank0]: {' '.join(map(str, parts))}\n")
        sys.stdout.flush()


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors):
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def tensor_parallel_(model, mesh):
    """Notebook 17's plan (parallelize_module): column-parallel in, row-parallel out, vocabulary split."""
    parallelize_module(model, mesh, {"embed": RowwiseParallel(input_layouts=Replicate()),
                                     "head": ColwiseParallel(output_layouts=Replicate())})
    plan = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(), "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)


def build(args, device, mesh):
    config = dataclasses.replace(CONFIG, checkpointing=args.checkpointing, n_layers=args.layers or CONFIG.n_layers)
    model = Transformer(config, seed=0).to(device)
    if mesh is not None and args.cp > 1:
        context_parallel_(model, mesh["cp"], args.seq_len)
    if mesh is not None and args.tp > 1:
        tensor_parallel_(model, mesh["tp"])
    net = model
    if mesh is not None and args.dp == "fsdp2":  # one unit per block, then the root (notebook 19)
        for block in model.layers:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif mesh is not None and args.tp == args.pp == args.cp == 1:
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if args.plant_bug == "sum":  # the negative control of section 2: gradients summed over the ranks, not averaged
            net.register_comm_hook(None, summing_hook)
    if args.compile:  # aot_eager: traced and run by PyTorch's own kernels (Inductor compiles C++ first: notebook 05 §3.3)
        net = torch.compile(net, backend="aot_eager" if device.type == "cpu" else "inductor")
    return model, net


def context_parallel_(model, mesh, seq_len):
    """Each block's attention becomes ring attention over the CP ranks; the rotary tables follow the zig-zag layout."""
    group, layout, rank = mesh.get_group(), zigzag_layout(seq_len, mesh.size()), mesh.get_local_rank()

    def ring_core(q, k, v):  # (batch, heads, local positions, head_dim): this rank's zig-zag chunks
        if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat the key/value heads first
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        return ring_attention(q, k, v, group, layout=layout)

    for block in model.layers:
        block.attn.core = ring_core
    # position p's rotation for the positions this rank holds: the rows of its chunks, in order
    model.rope_cos = shard_sequence(model.rope_cos[:seq_len], layout, rank, dim=0)
    model.rope_sin = shard_sequence(model.rope_sin[:seq_len], layout, rank, dim=0)
    return layout


class Stage(nn.Module):
    """One pipeline stage: blocks [lo, hi) of the model, with the embedding if first, the norm and head if last.

    Its parameters keep the whole model's names (layers.3.attn...), so gradients compare name by name."""

    def __init__(self, model, lo, hi, first, last):
        super().__init__()
        self.embed = model.embed if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in range(lo, hi)})
        self.norm, self.head = (model.norm, model.head) if last else (None, None)
        self.rope, self.full = (model.rope_cos, model.rope_sin), model.config.checkpointing == "full"

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            if self.full and torch.is_grad_enabled():
                x = checkpoint(layer, x, self.rope, use_reentrant=False)
            else:
                x = layer(x, self.rope)
        return self.head(self.norm(x)) if self.head is not None else x


def pipeline_(args, model, mesh, device):
    """This rank's stages (1, or 2 for the interleaved schedule) and the schedule that runs them."""
    P, rank = mesh.size(), mesh.get_local_rank()
    V = P * (2 if args.schedule == "interleaved" else 1)  # virtual stages; rank r holds r, r + P, ...
    L = model.config.n_layers
    if L % V:
        raise ValueError(f"{L} blocks do not split into {V} pipeline stages")
    stages = [Stage(model, v * L // V, (v + 1) * L // V, v == 0, v == V - 1) for v in range(rank, V, P)]
    piped = [PipelineStage(m, stage_index=v, num_stages=V, device=device, group=mesh.get_group())
             for m, v in zip(stages, range(rank, V, P))]

    def loss_fn(logits, y):  # one micro-batch's mean; the schedule divides the gradients by the count (scale_grads)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    scale = args.plant_bug != "unscaled"  # the planted bug: each micro-batch's gradient added, never averaged
    if args.schedule == "interleaved":
        return stages, ScheduleInterleaved1F1B(piped, n_microbatches=args.accum, loss_fn=loss_fn, scale_grads=scale)
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    return stages, kind(piped[0], n_microbatches=args.accum, loss_fn=loss_fn, scale_grads=scale)


class Box:  # what a saved tensor is packed into: an object a finalizer can watch
    __slots__ = ("t", "__weakref__")


class LiveSaved:
    """Bytes of floating-point activations autograd keeps for backward, now and at the peak (each storage once).

    Parameters and buffers are left out (they are the model state, not activations)."""

    def __init__(self, module):
        self.skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
        self.now = self.peak = self.base = 0
        self.refs = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda box: box.t)

    def pack(self, t):
        box = Box()
        box.t = t
        key = t.untyped_storage().data_ptr()
        if t.is_floating_point() and key not in self.skip:
            if key not in self.refs:
                self.now += t.untyped_storage().nbytes()
                self.peak = max(self.peak, self.now)
            self.refs[key] = self.refs.get(key, 0) + 1
            weakref.finalize(box, self.release, key, t.untyped_storage().nbytes())
        return box

    def release(self, key, n):  # the graph let go of a saved tensor
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.now -= n


def summing_hook(state, bucket):
    """A DDP communication hook with the bug section 2 plants: all-reduce (a sum) and no division by the world size."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def full_grads(model):
    """Every gradient whole, on the CPU (a DTensor's pieces gathered: a collective, every rank calls it)."""
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().float().cpu().clone()
            for n, p in model.named_parameters()}


def stage_gather(stages, what):
    """what(parameter) for every stage's parameters, by name, gathered from every rank (a collective)."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {n: what(p) for m in stages for n, p in m.named_parameters()})
    return {n: t for mine in every for n, t in mine.items()}


def checkpoint_state(model, opt, step):
    model_sd, optim_sd = get_state_dict(model, opt)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step), f"rng/rank{rank}": torch.get_rng_state()}


def train(args, device):
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    degrees = {"tp": args.tp, "pp": args.pp, "cp": args.cp}
    if sum(d > 1 for d in degrees.values()) > 1:
        raise ValueError("--tp, --pp and --cp each combine with data parallelism here, not with one another")
    if (args.pp > 1 or args.cp > 1) and (args.dp != "ddp" or args.compile or args.save_every or args.resume):
        raise ValueError("--pp and --cp run with --dp ddp (averaged by hand), without --compile and checkpoints")
    name, degree = max(degrees.items(), key=lambda kv: kv[1])  # the mesh's second dimension ("tp" if none)
    if world % degree:
        raise ValueError(f"{world} processes do not split into {name} groups of {degree}")
    mesh = None
    if dist.is_initialized():
        mesh = init_device_mesh(device.type, (world // degree, degree), mesh_dim_names=("dp", name))
    dp_size, dp_rank = (mesh["dp"].size(), mesh["dp"].get_local_rank()) if mesh is not None else (1, 0)
    if args.batch % (dp_size * args.accum):
        raise ValueError(f"the global batch {args.batch} must split into {dp_size} x {args.accum} micro-batches")
    micro = args.batch // (dp_size * args.accum)
    model, net = build(args, device, mesh)
    params, stages, meter, one_micro_batch = list(model.parameters()), [], None, 0
    if mesh is not None and args.pp > 1:  # this rank's stages; only their parameters train here
        stages, schedule = pipeline_(args, model, mesh["pp"], device)
        params = [p for m in stages for p in m.parameters()]
        meter = LiveSaved(model) if mesh["pp"].get_local_rank() == 0 else None  # the first stage's activations
    opt = torch.optim.Adam(params, lr=args.lr)
    data = text_corpus().train
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    ckpt_dir = args.ckpt or f"{args.out}/ckpt"
    start = 0
    saved = sorted(int(d[5:]) for d in os.listdir(ckpt_dir)) if args.resume and os.path.isdir(ckpt_dir) else []
    saved = [s for s in saved if args.resume_at in (None, s)]
    if saved:  # DCP: each rank reads what its layout needs, whatever the layout that wrote it
        state = checkpoint_state(model, opt, 0)
        dcp.load(state, checkpoint_id=f"{ckpt_dir}/step_{saved[-1]}")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
        torch.set_rng_state(state[f"rng/rank{rank}"])
        log(f"attempt {attempt}: {os.path.basename(args.out)} resumed from step {start} on {world} processes")
    losses, times, first_grads = {}, [], {}
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        x, y = text_batch(data, args.batch, args.seq_len, generator=torch.Generator().manual_seed(1000 + step))
        mine = slice(dp_rank * micro * args.accum, (dp_rank + 1) * micro * args.accum)  # my rows of the global batch
        x, y = x[mine].to(device), y[mine].to(device)
        if mesh is not None and args.cp > 1:  # my zig-zag slice of every sequence
            x, y = (shard_sequence(t, zigzag_layout(args.seq_len, args.cp), mesh["cp"].get_local_rank()) for t in (x, y))
        total = torch.zeros((), device=device)
        if stages:  # the schedule runs the --accum micro-batches through the stages, forward and backward
            if meter is not None and step == start:  # one micro-batch's activations on the first stage, alone
                probe = LiveSaved(model)
                with probe.hooks, autocast:
                    stages[0](x[:micro])
                one_micro_batch = probe.peak
            mb_losses, pp_rank = [], mesh["pp"].get_local_rank()
            if meter is not None:  # each step's own peak (the first step also runs the stage once to infer shapes)
                meter.base = meter.peak = meter.now
            with meter.hooks if meter is not None else nullcontext(), autocast:
                if pp_rank == 0:
                    schedule.step(x)
                elif pp_rank == args.pp - 1:
                    schedule.step(target=y, losses=mb_losses)
                else:
                    schedule.step()
            total += sum(loss.detach().float() for loss in mb_losses) / args.accum
        for k in range(args.accum if not stages else 0):
            last = k == args.accum - 1
            sync = net.no_sync() if isinstance(net, DDP) and not last else nullcontext()
            if args.dp == "fsdp2" and mesh is not None:
                model.set_requires_gradient_sync(last)
            with sync:
                with autocast:
                    logits = net(x[k * micro:(k + 1) * micro])
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y[k * micro:(k + 1) * micro].flatten())
                (loss / args.accum).backward()
            total += loss.detach() / args.accum
        if mesh is not None and args.dp == "ddp" and args.tp > 1:  # data parallel by hand across the TP twins
            for p in model.parameters():
                if hasattr(p.grad, "placements") and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(placements=p.placements)  # the embedding's: whole, make it a shard
                dist.all_reduce(local(p.grad), group=mesh["dp"].get_group())
                local(p.grad).div_(dp_size)
        if mesh is not None and (args.pp > 1 or args.cp > 1):  # data (and context) parallel by hand
            group, n = (mesh["dp"].get_group(), dp_size) if args.pp > 1 else (None, world)  # CP: over dp x cp
            for p in params:
                dist.all_reduce(p.grad, group=group)
                if args.plant_bug != "sum":
                    p.grad.div_(n)
        if step == 0:  # the first step's gradients, before any optimizer saw them: what section 2 compares
            first_grads = stage_gather(stages, lambda p: p.grad.detach().float().cpu().clone()) if stages else full_grads(model)
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep the gradients allocated: they are counted below
        if mesh is not None and args.pp == args.cp == 1:
            dist.all_reduce(total, group=mesh["dp"].get_group())
            total /= dp_size
        elif mesh is not None:  # PP: the last stage holds the loss; CP: each rank the mean over its slice
            dist.all_reduce(total)
            total /= world // args.pp
        losses[step] = total.item()
        times.append(time.perf_counter() - t0)
        if args.crash_at is not None and attempt == 0 and rank == world - 1 and step + 1 == args.crash_at:
            sys.stdout.write(f"[rank{rank}]: attempt {attempt}: dying after step {step + 1}\n")
            sys.stdout.flush()
            os._exit(1)  # no cleanup, no exception: as a killed process dies
        if args.save_every and (step + 1) % args.save_every == 0:
            dcp.save(checkpoint_state(model, opt, step + 1), checkpoint_id=f"{ckpt_dir}/step_{step + 1}")
    # what this rank holds between steps, counted exactly (Adam's 0-d step counters left out, as the planner does)
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and local(v).dim() > 0]
    held = {"parameters": nbytes(params), "gradients": nbytes(p.grad for p in params), "optimizer state": nbytes(state)}
    if stages:
        full = stage_gather(stages, lambda p: p.detach().cpu().clone())
    else:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    saved = {"peak": meter.peak - meter.base, "micro_batch": one_micro_batch} if meter is not None else None
    return {"losses": losses, "held": held, "step_s": statistics.median(times) if times else 0.0, "world": world,
            "full": full, "first_grads": first_grads, "first_stage_saved": saved}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")  # a choice, never chosen by availability
    p.add_argument("--dp", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (the mesh's second dimension)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (the mesh's second dimension)")
    p.add_argument("--schedule", choices=["1f1b", "interleaved", "gpipe"], default="1f1b",
                   help="the pipeline schedule; interleaved: 2 stages per rank")
    p.add_argument("--cp", type=int, default=1, help="context-parallel degree: ring attention, zig-zag slices")
    p.add_argument("--layers", type=int, default=0, help="blocks in the model (default: CONFIG's)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--checkpointing", choices=["none", "full", "selective"], default="none")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--compile", action="store_true", help="torch.compile (aot_eager on the CPU)")
    p.add_argument("--save-every", type=int, default=0, help="a DCP checkpoint every K steps")
    p.add_argument("--resume", action="store_true", help="start from the newest checkpoint, if there is one")
    p.add_argument("--ckpt", default="", help="the checkpoint folder (default OUT/ckpt)")
    p.add_argument("--resume-at", type=int, default=None, help="resume from this step's checkpoint, not the newest")
    p.add_argument("--crash-at", type=int, default=None, help="the last rank dies after this step (first attempt)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch per step, in sequences")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--runs", default="", help="several runs in one launch: 'NAME:FLAGS;NAME:FLAGS', each into OUT/NAME")
    p.add_argument("--plant-bug", choices=["none", "sum", "unscaled"], default="none",
                   help="sum: the gradients summed over the ranks, not averaged (section 2's negative control); "
                        "unscaled: the pipeline adds its micro-batches' gradients without dividing by their count")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(1)
    runs = [(args.out, args)]
    if args.runs:  # one launch, several runs in turn: the processes start once
        runs = [(f"{args.out}/{name}", parse([*flags.split(), "--out", f"{args.out}/{name}"]))
                for name, flags in (r.split(":", 1) for r in args.runs.split(";"))]
    if "WORLD_SIZE" not in os.environ:  # `python capstone_train.py`: one process, nothing distributed
        for out, run in runs:
            report(train(run, torch.device("cpu")), run)
    else:
        # notebook 12 §5's workaround for torch 2.13's restarted gloo groups: a fresh store prefix per attempt
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        bound = {}
        if args.device == "cuda":  # one GPU per process, chosen by LOCAL_RANK; NCCL between them
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
            bound = {"device_id": device}
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), **bound)
        node = f" on node {os.environ['SLURMD_NODENAME']}" if "SLURMD_NODENAME" in os.environ else ""  # under Slurm
        print(f"[rank{dist.get_rank()}]: rank {dist.get_rank()} of {dist.get_world_size()}{node}", flush=True)
        finished = False
        try:
            for out, run in runs:
                result = train(run, device)
                held = [None] * dist.get_world_size()
                dist.all_gather_object(held, result["held"])
                result["held"] = {k: max(h[k] for h in held) for k in held[0]}  # the fullest rank
                worst = torch.tensor(result["step_s"], dtype=torch.float64)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                result["step_s"] = worst.item()  # the slowest rank sets the step
                report(result, run)
            finished = True
        finally:
            end_process_group(barrier=finished)  # barrier, destroy, check the group is gone (notebook 11, 10.2)


def report(result, args):
    """Rank 0 writes the losses, the bytes, the step time and the full final parameters into args.out."""
    if int(os.environ.get("RANK", 0)) == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(result.pop("full"), f"{args.out}/final.pt")
        torch.save(result.pop("first_grads"), f"{args.out}/first_grads.pt")
        with open(f"{args.out}/result.json", "w") as f:
            json.dump({**result, "args": vars(args)}, f)
        log(f"{args.out}: {len(result['losses'])} steps, last loss ~{list(result['losses'].values())[-1]:.4f}")


if __name__ == "__main__":
    main()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Every flag, against one process

The reference is the script itself as one plain process (no `torchrun`: no group, nothing sharded), run here in the notebook's kernel. One `torchrun` launch of 4 processes then runs six combinations that together use every flag but `--resume` (section 3 resumes); the last two are a 2 × 2 mesh of data parallelism with 2 pipeline stages (interleaved schedule) and with 2 context-parallel ranks, which section 2.1 explains. A pipeline needs more blocks than the model's 2, so the pipelined runs use `--layers 4` and their reference is a second one-process run with 4 blocks. Each combination's loss at every step is compared with the reference's: float32 combinations must agree to within `FP32_TOL`, bf16 ones within `BF16_TOL` (bf16 keeps 8 significant bits, 7 of them stored, so a rounding is off by at most half its spacing, 2^-8 or about 0.4% of the value, notebook 06 §1; over 4 steps the loss moves by far less).
"""

# %% slideshow={"slide_type": "-"}
spec = importlib.util.spec_from_file_location("capstone_train", "_runs/capstone_train.py")
capstone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(capstone)
shutil.rmtree("_runs/capstone", ignore_errors=True)
threads = torch.get_num_threads()
capstone.main(["--out", "_runs/capstone", "--runs", "single:;single4:--layers 4"])  # one process: the references
torch.set_num_threads(threads)  # the script takes one thread per process; give the kernel its own back
COMBOS = {  # name: flags; 4 processes each
    "ddp+bf16+compile": "--dp ddp --bf16 --compile",
    "ddp+tp2+full+accum2": "--dp ddp --tp 2 --checkpointing full --accum 2",
    "fsdp2+tp2+bf16+selective": "--dp fsdp2 --tp 2 --bf16 --checkpointing selective",
    "fsdp2+full+accum2+save": "--dp fsdp2 --checkpointing full --accum 2 --save-every 2",
    "dp2+pp2+interleaved": "--layers 4 --pp 2 --schedule interleaved --accum 4",
    "dp2+cp2+full": "--cp 2 --checkpointing full",
}
launch4 = run_torchrun("_runs/capstone_train.py", nproc_per_node=4, timeout=600, echo="none",
                       args=["--out", "_runs/capstone", "--runs", ";".join(f"{n}:{f}" for n, f in COMBOS.items())])
print(f"torchrun --nproc_per_node=4: {len(COMBOS)} runs in one launch, wall time ~{launch4.wall_time:.0f} s")


def result(name):
    with open(f"_runs/capstone/{name}/result.json") as f:
        return json.load(f)


def reference(flags):  # the one-process run with the same model: 4 blocks for the pipelines
    return result("single4" if "--layers 4" in flags else "single")


FP32_TOL, BF16_TOL = 1e-4, 1e-2
single = result("single")
print(f"one process: losses {', '.join(f'{v:.4f}' for v in single['losses'].values())}")
print(f"{'combination':<26} {'processes':>9} {'tolerance':>10}   largest |loss - one process|")
for name, flags in COMBOS.items():
    r = result(name)
    diff = max(abs(r["losses"][s] - reference(flags)["losses"][s]) for s in single["losses"])
    tol = BF16_TOL if "--bf16" in flags else FP32_TOL
    assert diff < tol, (name, diff)
    print(f"{name:<26} {r['world']:>9} {tol:>10g}   ~{diff:.1e}")
print("every combination's loss at every step agrees with one process within its tolerance")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The differences are printed after `~`: they are rounding, and rounding depends on the machine's kernels and on the order in which the ranks' contributions are added; the tolerances are what is asserted. What each row exercised: the DDP rows average gradients with an all-reduce, the FSDP2 rows reduce-scatter them into shards; the tensor-parallel rows split every matrix of a block across the 2 ranks of a mesh row, and `fsdp2+tp2` shards those pieces again over the mesh's columns (2-D: each rank holds a quarter of each block matrix). `dp2+pp2+interleaved` runs 4 micro-batches through 4 stages of one block, two per rank, and `dp2+cp2+full` passes key and value blocks around a ring of 2 ranks (section 2.1). Checkpointing and accumulation change what is kept and when, not what is computed.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Losses after Adam steps are not enough. **Adam's step does not change when every gradient is multiplied by a constant**: it divides each gradient by the root of its own running mean square, so a factor `c` scales both and cancels. A rank that sums where it should average (`c` = the number of data-parallel ranks), or an accumulation loop that forgets to divide by the number of micro-batches, trains exactly like the right one, and a check on Adam's losses passes it. The check that can see it compares the **gradients of the first step**, before any optimizer touched them, with the one-process run's, relative to their size: `course_lib.equivalence.compare_gradients`, which the labs use too. Each run saved its first gradients, whole (a DTensor's pieces gathered with `full_tensor()`):
"""

# %% slideshow={"slide_type": "-"}
from course_lib.equivalence import compare_gradients



def first_grads(name):
    return torch.load(f"_runs/capstone/{name}/first_grads.pt", weights_only=True)


def accum(flags):
    return int(flags.split("--accum ")[1].split()[0]) if "--accum" in flags else None


single_grads = first_grads("single")
GRAD_TOL = {"fp32": 1e-4, "bf16": 2e-2}  # relative to each gradient's size: summation order, and bf16's rounding
for name, flags in COMBOS.items():
    precision = "bf16" if "--bf16" in flags else "fp32"
    match = compare_gradients(first_grads(name), first_grads("single4" if "--layers 4" in flags else "single"),
                              tolerance=GRAD_TOL[precision], world_size=result(name)["world"],
                              micro_batches=accum(flags))
    print(f"{name:<26} {match}")
    assert match, (name, str(match))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**The check must be able to fail on the bug it guards against.** A negative control plants one: `--plant-bug sum` gives DDP a communication hook that all-reduces the gradient buckets and never divides by the world size, so every rank steps with twice the gradient. A pipeline has a bug of the same kind: its schedule applies the loss function to each micro-batch, and `scale_grads=True` (the default) divides the accumulated gradients by the number of micro-batches; `--plant-bug unscaled` turns that off, so a pipeline of 4 micro-batches steps with 4 times the gradient. The same 4 Adam steps, on 2 processes (`pp2`: 2 stages of 2 blocks, 1F1B, 4 micro-batches); both checks are applied to the bugs and to the same runs without them:
"""

# %% slideshow={"slide_type": "-"}
CONTROL = {"ddp": "--dp ddp", "ddp+summed": "--dp ddp --plant-bug sum", "pp2": "--layers 4 --pp 2 --accum 4",
           "pp2+unscaled": "--layers 4 --pp 2 --accum 4 --plant-bug unscaled"}
GPIPE = {"pp2+gpipe": "--layers 4 --pp 2 --accum 4 --schedule gpipe"}  # read in section 2.1
run_torchrun("_runs/capstone_train.py", nproc_per_node=2, timeout=600, echo="none",
             args=["--out", "_runs/capstone", "--runs", ";".join(f"{n}:{f}" for n, f in {**CONTROL, **GPIPE}.items())])
print(f"{'run':<13} {'loss check (Adam, within FP32_TOL)':<36} gradient check")
verdicts = {}
for name, flags in CONTROL.items():
    loss_gap = max(abs(result(name)["losses"][s] - reference(flags)["losses"][s]) for s in single["losses"])
    match = compare_gradients(first_grads(name), first_grads("single4" if "--layers 4" in flags else "single"),
                              tolerance=GRAD_TOL["fp32"], world_size=2, micro_batches=accum(flags))
    verdicts[name] = (loss_gap < FP32_TOL, bool(match))
    print(f"{name:<13} {'passes' if loss_gap < FP32_TOL else 'fails':<7}(largest gap ~{loss_gap:.1e})".ljust(50)
          + ("passes" if match else f"fails: {match.diagnosis}"))
assert verdicts == {"ddp": (True, True), "ddp+summed": (True, False), "pp2": (True, True), "pp2+unscaled": (True, False)}

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The loss check passes both bugs; the gradient check names them. Comparing losses remains useful for what it tests (the whole run, step after step); it is the gradients, or the global gradient norm before clipping, that must match to prove the scale.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 2.1 Pipeline and context parallelism on the transformer

Two of the rows above split what tensor and data parallelism leave whole.

- **`--pp P`** cuts the model into stages with `torch.distributed.pipelining` (notebook 13 §4): each rank builds the whole model (the same weights on every rank), keeps its blocks, the first stage also the embedding, the last the final norm and the head, and wraps them in a `PipelineStage`; the loss function runs on the last stage, once per micro-batch (`--accum` of them). `--schedule` picks `Schedule1F1B`, `ScheduleGPipe` or `ScheduleInterleaved1F1B`, which gives each rank two stages (rank 0 the first and the third of 4), so the 4-block model is cut into 4 stages of one block. Each stage keeps its parameters' names in the whole model (`layers.3.mlp.up_proj.weight`), so the gradients compare name by name; the data-parallel ranks of a stage average its gradients by hand.
- **`--cp C`** gives each rank 2 chunks of every sequence in notebook 18's zig-zag layout, one early and one late (`course_lib.context_parallel.zigzag_layout`), and every block's attention becomes `ring_attention` over the context-parallel ranks: the key and value blocks travel around the ring, causally masked by their global positions. The rotary tables are cut with the same layout, so each position keeps its own rotation. Every weight is replicated over the context-parallel ranks, and each rank's gradient covers only its own slice of the tokens, so the gradients are averaged over data × context-parallel ranks (here by hand, 4 ranks). PyTorch's own `context_parallel` is notebook 18 §1's subject and needs a GPU.

**Activations on the first stage.** The course's planner (`course_lib.planner`, notebook 21) counts, for a pipeline of `p` stages under 1F1B, the activations of `p` micro-batches on the first stage (notebook 13 §4: the first stage runs `p` forwards before its first backward). The script measures it: a `saved_tensors_hooks` pair on rank 0 adds up the floating-point tensors autograd keeps for backward (each storage once, parameters and the rotary tables left out) and drops each when the graph lets go of it, so it knows how many bytes are alive at every moment of the schedule; it also runs one micro-batch through the first stage alone.
"""

# %% slideshow={"slide_type": "-"}
import dataclasses

from course_lib.planner import Layout, h100_cluster, predict
from course_lib.transformer import model_saved_terms

config4 = dataclasses.replace(capstone.CONFIG, n_layers=4)
m, p_stages, mb = 4, 2, 16 // 4  # pp2: 4 micro-batches of 4 sequences of 64 bytes on 2 stages
planned = predict(config4, h100_cluster(1), Layout(pipeline=p_stages, micro_batch=mb, accumulation=m), seq_len=64,
                  global_batch=16, precision="fp32_adam").memory["activations"]
outside = model_saved_terms(config4, 64, batch=mb, dtype=torch.float32)
outside.pop("blocks")  # what lies outside the blocks: the ids, the final norm, the head, the loss
one = result("pp2")["first_stage_saved"]["micro_batch"]  # one micro-batch through the first stage's 2 blocks
in_flight = (planned - sum(outside.values())) / one  # the planner's count, read back from its prediction
print(f"planner: activations {planned:,} B = {planned - sum(outside.values()):,} B in the blocks "
      f"+ {sum(outside.values()):,} B outside them; one micro-batch on the first stage measured {one:,} B, "
      f"so the planner holds {in_flight:g} micro-batches in flight")
for name, rule in (("pp2", "1F1B: p"), ("pp2+gpipe", "GPipe: m")):
    peak = result(name)["first_stage_saved"]["peak"]
    print(f"{name:<10} first stage's peak: {peak:>10,} B = {peak / one:g} x one micro-batch ({rule})")
assert in_flight == p_stages == result("pp2")["first_stage_saved"]["peak"] / one
assert result("pp2+gpipe")["first_stage_saved"]["peak"] == m * one
inter = result("dp2+pp2+interleaved")["first_stage_saved"]
print(f"interleaved (2 stages per rank, DP 2): rank 0's peak {inter['peak']:,} B = {inter['peak'] / inter['micro_batch']:g} "
      f"x one micro-batch of its first stage, which holds half the blocks: {inter['peak'] / inter['micro_batch'] / 2:g} whole-stage micro-batches")
assert inter["peak"] / inter["micro_batch"] / 2 > p_stages

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The planner's count holds byte for byte for the blocks: 1F1B's first stage peaks at exactly `p` = 2 micro-batches' activations, and GPipe's at `m` = 4, as notebook 13's simulation said. The planner also puts what lies outside the blocks (the final norm, the head, the loss's log-probabilities) on the first stage, where they are not: they belong to the last stage, so its total is an upper bound for either end. The interleaved schedule holds more on rank 0 than 1F1B: its first forward pass reaches the end of the pipeline only after both of rank 0's stages ran, so more micro-batches start before the first backward returns.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. A crash, a restart, and 4 processes resumed on 2

Two demonstrations in one launch of 2 processes with `torchrun --max-restarts=1`:

- **crash**: the run `crashed` (DDP, compiled, a checkpoint every 2 steps, `--resume`) kills its last rank with `os._exit(1)` after step 3 in the first attempt only. `torchrun` sees the failure, stops the other rank and starts both again; `--resume` finds the checkpoint of step 2 and carries on. The run `plain` is the same without the crash. The script opens its group with notebook 12 §5's workaround for torch 2.13's restarted gloo groups (a `PrefixStore` per attempt).
- **reshard**: the run `from4` resumes `fsdp2+full+accum2+save`'s checkpoint of step 2, written by 4 processes, on 2. DCP saved each parameter as a global tensor with the pieces each rank held; on load each of the 2 ranks reads the rows its new shard needs.
"""

# %% slideshow={"slide_type": "-"}
RUNS2 = {
    "crashed": "--dp ddp --compile --save-every 2 --resume --crash-at 3",
    "from4": "--dp fsdp2 --checkpointing full --accum 2 --resume --ckpt _runs/capstone/fsdp2+full+accum2+save/ckpt --resume-at 2",
    "plain": "--dp ddp --compile --save-every 2",
}
launch2 = run_torchrun("_runs/capstone_train.py", nproc_per_node=2, timeout=600, echo="none", launcher_args=["--max-restarts=1"],
                       args=["--out", "_runs/capstone", "--runs", ";".join(f"{n}:{f}" for n, f in RUNS2.items())])
for rank in range(2):  # the lines about attempts (the rest: the connection errors at the crash, the agent's log)
    print("\n".join(f"[rank {rank}] attempt{line.split('attempt', 1)[1]}" for line in launch2.output(rank).splitlines() if "attempt" in line))
assert "attempt 0: dying after step 3" in launch2.output(1)
assert "attempt 1: crashed resumed from step 2 on 2 processes" in launch2.output(0)
assert "attempt 1: from4 resumed from step 2 on 2 processes" in launch2.output(0)


def final(name):
    return torch.load(f"_runs/capstone/{name}/final.pt", map_location="cpu", weights_only=True)


crashed, plain, saved4, from4 = (final(n) for n in ("crashed", "plain", "fsdp2+full+accum2+save", "from4"))
same = all(torch.equal(crashed[k], plain[k]) for k in plain)
print(f"\ncrash: restarted from step 2; final parameters equal to the uninterrupted run's, bit for bit: {same}; "
      f"last loss {result('crashed')['losses']['3']:.4f} and {result('plain')['losses']['3']:.4f}")
assert same and result("crashed")["losses"]["3"] == result("plain")["losses"]["3"]
loss_gap = max(abs(result("from4")["losses"][s] - result("fsdp2+full+accum2+save")["losses"][s]) for s in ("2", "3"))
gaps = torch.cat([(from4[k] - saved4[k]).abs().flatten() for k in saved4])
lr = result("from4")["args"]["lr"]  # Adam's step size: about the most one step moves an element
close = (gaps <= 1e-6).double().mean().item()  # the share of elements within 1e-6
largest = gaps.max().item()
print(f"reshard: saved on {result('fsdp2+full+accum2+save')['world']} processes, resumed on {result('from4')['world']} at step 2; "
      f"losses of steps 2-3 within {FP32_TOL:g} of the 4-process run: {loss_gap < FP32_TOL}; "
      f"final parameters: at least 99.9% of the {gaps.numel():,} within 1e-6: {close >= 0.999}, every one within lr/10 = {lr / 10:g}: "
      f"{largest < lr / 10} (largest gap ~{largest:.0e}, {(gaps > 1e-6).sum().item()} beyond 1e-6)")
assert loss_gap < FP32_TOL and close >= 0.999 and largest < lr / 10
print(f"wall time ~{launch2.wall_time:.0f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The restart is bit-exact because nothing in the resumed attempt differs from the uninterrupted one: the same layout, the same data per step (drawn from the step number, not from a stream the crash interrupted), the same saved optimizer state and random-number state. The resharded run is equal up to rounding only: 2 ranks add the gradients of a step in another order than 4 do (a reduce-scatter over 2 instead of 4), so the last bits of the sums differ. Almost every parameter then agrees to within 1e-6, but not always every one, and how many stray depends on the machine's kernels (the cell prints the largest gap and the count after `~`: the kernels decide the order of the additions, and with it how many elements stray and how far, so no fixed bound near the rounding holds on every machine). The reason is Adam: it divides each gradient by its own running size, so its step does not shrink with the gradient (below). Where a gradient is a sum that nearly cancels, rounding is a large part of it, and Adam turns that into a visible part of a step. So the check asserts what holds on every machine: almost every element within 1e-6, and every one within a tenth of a step. A wrong reshard, a shard loaded into another rank's rows, moves elements by whole steps and the losses by far more than `FP32_TOL`.
"""

# %% slideshow={"slide_type": "-"}
for g in (1e-2, 1e-6):  # one Adam step on a parameter whose gradient is g
    w = torch.zeros(1, requires_grad=True)
    step = torch.optim.Adam([w], lr=lr)
    w.grad = torch.full((1,), g)
    step.step()
    print(f"gradient {g:g}: the parameter moves by {w.item():+.3e} (lr = {lr:g})")
print("a gradient 10,000 times smaller moves it by", f"{w.item() / -lr:.0%} of a step: Adam's step does not shrink with the gradient")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. The planner's count for these runs

Notebook 21 built a planner that counts each rank's memory and a step's time from the course's formulas (`course_lib.planner`). Here it sizes the layouts section 2 ran: DDP is ZeRO-0, FSDP2 is ZeRO-3, `--tp 2` on 4 processes is DP 2 × TP 2. The script counted each rank's model state from its local tensors; the planner's bytes are asserted within 5%, its step time is printed next to the measured one after `~`.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.planner import Layout, cpu_cluster, predict

TINY, SEQ, BATCH = capstone.CONFIG, 64, 16  # the script's model and its global batch: 16 sequences of 64 tokens
CPU = cpu_cluster()  # this machine's processes as a cluster: nominal 5 GFLOP/s each, assumed (notebook 21)

# %% slideshow={"slide_type": "fragment"}
CAPSTONE_LAYOUTS = {  # the runs of section 2, as planner layouts (16 sequences per step in every one)
    "single": Layout(data=1, micro_batch=16),
    "ddp+bf16+compile": Layout(data=4, micro_batch=4),
    "ddp+tp2+full+accum2": Layout(data=2, tensor=2, micro_batch=4, accumulation=2, checkpointing="full"),
    "fsdp2+tp2+bf16+selective": Layout(data=2, tensor=2, zero=3, micro_batch=8, checkpointing="selective"),
    "fsdp2+full+accum2+save": Layout(data=4, zero=3, micro_batch=2, accumulation=2, checkpointing="full"),
}
STATE = ("parameters", "gradients", "optimizer state")
print(f"{'run':<26} {'model state, predicted':>22} {'measured':>10} {'error':>8}   step ms, predicted / measured")
worst_capstone = 0.0
for name, lay in CAPSTONE_LAYOUTS.items():
    pred = predict(TINY, CPU, lay, seq_len=SEQ, global_batch=BATCH, precision="fp32_adam")  # fp32 state, Adam
    r = result(name)
    p_bytes, m_bytes = sum(pred.memory[k] for k in STATE), sum(r["held"][k] for k in STATE)
    errors = [abs(pred.memory[k] - r["held"][k]) / r["held"][k] for k in STATE]
    worst_capstone = max(worst_capstone, *errors)
    print(f"{name:<26} {p_bytes:>22,} {m_bytes:>10,} {(p_bytes - m_bytes) / m_bytes:>+8.2%}   "
          f"{1e3 * pred.step_time:.1f} / ~{1e3 * r['step_s']:.0f}")
assert worst_capstone <= 0.05
print(f"parameters, gradients and optimizer state of every run within 5% of the planner: largest error {worst_capstone:.2%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The model state is counted exactly by both: the planner's `model_state_bytes` of each rank's share, the script's sum over its local shards. FSDP2 pads each parameter's first dimension to a multiple of the data degree; the tiny model's dimensions divide evenly, so nothing is padded here. The step times are far apart, as in notebook 21's layouts: the prediction is FLOPs over a nominal 5 GFLOP/s plus unhidden communication; the measurement adds what the planner does not count (Python, kernel calls, `torch.compile`'s guards, FSDP2's and DTensor's bookkeeping, and 4 processes on 2 shared cores).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Launched by Slurm on two nodes

Beyond one machine, a scheduler starts `torchrun`, almost always Slurm. The job script below asks for 2 nodes with one task each; `srun` starts one `torchrun` agent per node, and the agents meet at a c10d rendezvous on the job's first node (`--rdzv-backend=c10d`: the agents number the nodes themselves in the order they join, so `--node-rank` is not needed; a static rendezvous would pass `--node-rank=$SLURM_NODEID`). Each agent starts its node's processes, which run the same `capstone_train.py`.
"""

# %% slideshow={"slide_type": "-"}
CAPSTONE_SBATCH = r"""#!/bin/bash
#SBATCH --job-name=capstone
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
#SBATCH --no-requeue
# CPU ranks over gloo: no GPU, one thread each (on GPUs: --gpus-per-node=N, --nproc-per-node=N, --device cuda)
export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
set -euo pipefail
# The rendezvous runs on the job's first node; ask Slurm for its address.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
HEAD_ADDR=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
RDZV_PORT=${RDZV_PORT:-29500}
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), rendezvous on $head_node at $HEAD_ADDR:$RDZV_PORT"
srun --output=rank-%j-node%n.out torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=1 \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD_ADDR:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" \
    capstone_train.py --out "capstone-$SLURM_JOB_ID" "$@"
"""
with open("_runs/capstone.sbatch", "w") as f:  # the course's job script, next to capstone_train.py
    f.write(CAPSTONE_SBATCH)
print(CAPSTONE_SBATCH)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The live run is an opt-in: it needs Slurm and a running two-node cluster (`python scripts/slurm_cluster.py up` starts one on this machine: two `slurmd` daemons, nodes `n1` and `n2`), and `COURSE_SLURM_LIVE=1` in the notebook's environment. Without both it prints a skip line. The job trains the same global batches as section 2's runs, so its losses are one process's up to rounding.
"""

# %% slideshow={"slide_type": "-"}
if os.environ.get("COURSE_SLURM_LIVE") == "1" and shutil.which("sbatch"):
    import subprocess
    out = subprocess.run(["sbatch", "--parsable", "--wait", "capstone.sbatch"], cwd="_runs", capture_output=True, text=True, timeout=600)
    print(out.stdout, out.stderr)
else:
    print("live Slurm run skipped (set COURSE_SLURM_LIVE=1 with a course cluster up: python scripts/slurm_cluster.py up)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**A recording, not a live run.** The next cell prints a transcript of one run of the job above, kept as text: it is not produced by this notebook, which has no Slurm cluster to run it on. It is what you get by running the job yourself with the job script and training script shown, on a two-node Slurm cluster (Slurm 22.05, here two `slurmd` daemons on one machine, nodes `n1` and `n2`; `python scripts/slurm_cluster.py up` starts one, and the cell above then runs the job live with `COURSE_SLURM_LIVE=1`), 2 nodes × 1 process, `--dp ddp`: the job, `squeue`, `sacct` (a cluster without an accounting database has no `sacct`, so the finished job is read from the job-completion file), the batch log and the two per-rank logs; then `scancel` of a long run; then a node failure (the `slurmd` of `n2` and its processes killed). Long stack traces are cut to their first line. The c10d rendezvous numbered the nodes in the order they joined: rank 0 ran on `n2`.
"""

# %% slideshow={"slide_type": "-"}
RECORDED = r"""$ sinfo
PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST
debug*       up   infinite      2   idle n[1-2]
$ sbatch capstone.sbatch --dp ddp
Submitted batch job 1
$ squeue
             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)
                 1     debug capstone     root  R       0:00      2 n[1-2]
(submitted to COMPLETED in ~18.1 s)
$ scontrol show job 1    # five of its fields
JobState=COMPLETED ExitCode=0:0 RunTime=00:00:16 NodeList=n[1-2] NumNodes=2
$ sacct -j 1
Slurm accounting storage is disabled
$ cat jobcomp.txt    # JobCompType=jobcomp/filetxt: without slurmdbd, sacct has nothing
JobId=1 Name=capstone JobState=COMPLETED NodeList=n[1-2] NodeCnt=2 ProcCnt=2 ExitCode=0:0
$ cat slurm-1.out
job 1: 2 nodes (n[1-2]), rendezvous on n1 at 127.0.0.1:45603
$ cat rank-1-node0.out
[rank1]: rank 1 of 2 on node n1
$ cat rank-1-node1.out
[rank0]: rank 0 of 2 on node n2
[rank0]: capstone-1: 4 steps, last loss ~4.8052
[W...] [c10d] recvVector failed ... Connection was likely closed.   (rank 0's agent, at the end: the rendezvous host's agent left first)
W... dynamic_rendezvous.py ... has failed to shutdown the rendezvous '1' due to an error of type RendezvousConnectionError.
$ sbatch capstone.sbatch --dp ddp --steps 100000
Submitted batch job 2
$ squeue
             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)
                 2     debug capstone     root  R       0:17      2 n[1-2]
$ scancel 2
(job 2: CANCELLED ExitCode=0:15; its 10 processes gone ~2.9 s after scancel)
$ tail -n 3 slurm-2.out
srun: forcing job termination
srun: error: n1: task 0: Exited with exit code 1
srun: error: n2: task 1: Exited with exit code 1
$ sbatch capstone.sbatch --dp ddp --steps 100000
Submitted batch job 3
(slurmd of n2 and its job processes killed: the node fails)
(job 3: NODE_FAIL Reason=NodeDown ExitCode=1:0 ~11.1 s after the kill)
$ sinfo
PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST
debug*       up   infinite      1  down* n2
debug*       up   infinite      1   idle n1
$ tail -n 2 slurm-3.out
srun: got SIGCONT
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
$ grep -m1 Error rank-3-node0.out
[rank0]: RuntimeError: [.../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:PORT: Connection reset by peer. ...
$ grep -m1 Error rank-3-node1.out
(none)
"""  # a recording of one run of the job above: a transcript, not this notebook's output
print("A RECORDING of one run of the job above (not a live run; run it yourself with the cell above):\n")
print(RECORDED)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What you see when a node fails: the job ends `NODE_FAIL` (reason `NodeDown`) after Slurm's timeouts (here `SlurmdTimeout=5`, so about 11 s), the node is `down*` in `sinfo` until it returns, and the surviving rank's log ends in gloo's "Connection reset by peer". Nothing restarts it: with `--no-requeue` the job is over; without it Slurm would requeue the job, and `--resume` (section 3) would carry on from the last DCP checkpoint.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What changes on a real cluster:

- **a shared filesystem**: here both "nodes" are one machine; on a cluster the script, the virtual environment and the checkpoint folder must be on a filesystem every node mounts (or be copied to each node), and DCP's checkpoint folder must be shared for `--resume` to find every rank's pieces;
- **partitions and GPUs**: `#SBATCH --partition=...` picks the queue, `--gpus-per-node=8` (or `--gres=gpu:8`) reserves the GPUs, and torchrun starts `--nproc-per-node=8` processes with `--device cuda` (one GPU per `LOCAL_RANK`, NCCL);
- **the network**: NCCL and gloo pick an interface themselves; where a node has several, `NCCL_SOCKET_IFNAME` (and `GLOO_SOCKET_IFNAME`) name the one to use;
- **`srun` versus `torchrun`'s agent**: here `srun` starts one agent per node and the agents start the processes, rendezvous and restart them (`--max-restarts`); the alternative is `srun --ntasks-per-node=8` starting every process itself, each reading `SLURM_PROCID`, `SLURM_LOCALID` and `SLURM_NTASKS` as its rank, local rank and world size, with Slurm's requeue instead of torchrun's restarts.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Which technique for which bottleneck

The short version, by bottleneck (find it first: notebook 04's memory measurement, a profiler for time):

<!-- BEGIN generated: facts-remedies -->
| bottleneck | first remedy | what it costs | shown |
|---|---|---|---|
| activations do not fit (deep or wide model, long sequences) | activation checkpointing (selective: recompute the cheap ops) | up to one extra forward per step (about +30% compute at scale; more for small layers, notebook 04) | peak down, step slower (notebooks 04, 05); section 2 above |
| the wanted batch does not fit on your one device | gradient accumulation | more, smaller steps; BatchNorm and batch-coupled losses see micro-batches | peak down in proportion (notebook 08); section 2 above |
| memory and speed on a device with bf16/fp16 matrix units | mixed precision: bf16 autocast (fp16 + `GradScaler` where bf16 is missing) | rounding; loss scaling for fp16 | activations halved (notebook 07); section 2 above |
| the model fits, training takes too long, you have several devices | DDP (`torchrun`) | one all-reduce of the gradients per step, mostly overlapped | per-rank batch halved; notebooks 11, 12; section 2 above |
| the parameters + gradients + optimizer state do not fit one device | sharded data parallel: ZeRO-1/2 (optimizer state, gradients), then FSDP (`fully_shard`, ZeRO-3) | more communication (ZeRO-3: 1.5x DDP's bytes); a sharded checkpoint format | notebooks 14 and 15 |
| sharding is not enough: one layer's parameters or activations do not fit, or links between nodes are slow | pipeline (between layers, across nodes) and tensor parallel (inside layers, within a node) | the bubble; communication inside every layer | notebook 13 |
<!-- END generated -->

They combine: each run of section 2 uses three or four at once and computes what one plain process computes, and the big training runs use all of them together, in the proportions a planner's arithmetic suggests (notebook 21).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- One script, every technique a flag: bf16 autocast, full or selective checkpointing, accumulation, DDP or FSDP2, tensor parallelism on a 2-D mesh and `torch.compile` change how and where the transformer's step runs, not what it computes: six combinations on 4 processes matched one plain process's loss at every step (float32 within 1e-4, bf16 within 1e-2) and its first step's gradients, the check that sees a wrong gradient scale: a DDP hook that sums, and a pipeline that adds its micro-batches' gradients without averaging, both pass the loss check and fail the gradient check.
- Pipeline and context parallelism on the transformer: `torch.distributed.pipelining` with the embedding on the first stage and the norm and head on the last (1F1B, GPipe and interleaved 1F1B), and ring attention on zig-zag slices with the rotary positions cut the same way; the first stage's activations peak at exactly the planner's `p` micro-batches under 1F1B, at `m` under GPipe.
- DCP checkpoints make a run restartable and reshardable: killed by a crash under `torchrun --max-restarts=1`, the run resumed from its last checkpoint and ended bit for bit equal to the uninterrupted one; saved on 4 processes, it resumed on 2 and stayed equal up to rounding.
- A Slurm job script runs the same training on two nodes: `srun` starts one `torchrun` agent per node, the agents meet at a c10d rendezvous on the first node; a recorded run shows the job, `scancel` and a failed node.
- Choose by bottleneck: activations → checkpointing (or smaller micro-batches, bf16); batch → accumulation; time with more devices → DDP; model state too big → sharding (ZeRO, FSDP) first, then pipeline or tensor parallelism.
- The planner's count for the capstone's runs (notebook 21 built it): each run's parameters, gradients and optimizer state per rank within 5%.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `effective_batch(micro, accum, world)`: how many samples go into one optimizer step with micro-batches of `micro`, `accum` accumulation steps and `world` DDP ranks. Combine two rules you have met: one optimizer step adds up the gradients of `accum` micro-batches (notebook 08), and DDP averages the gradients of every rank's batch (notebooks 09–11).
2. Fill in `choice`: for each bottleneck, the first technique to try, one of `TECHNIQUES`.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.capstone import BOTTLENECKS, TECHNIQUES, check_effective_batch, check_technique_choice


def effective_batch(micro, accum, world):
    raise NotImplementedError  # your code here


print(check_effective_batch(effective_batch))

# %% slideshow={"slide_type": "-"}
print("techniques:", TECHNIQUES)
choice = {bottleneck: ... for bottleneck in BOTTLENECKS}  # replace each ... with a technique
print(check_technique_choice(choice))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [Automatic mixed precision](https://pytorch.org/docs/stable/amp.html), [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html), [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), [torchrun](https://pytorch.org/docs/stable/elastic/run.html).
- P. Micikevicius et al., *Mixed Precision Training*, ICLR 2018, [arXiv:1710.03740](https://arxiv.org/abs/1710.03740).
- T. Chen et al., *Training Deep Nets with Sublinear Memory Cost*, 2016, [arXiv:1604.06174](https://arxiv.org/abs/1604.06174).
- S. Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054) (sharding: notebook 14).
"""
