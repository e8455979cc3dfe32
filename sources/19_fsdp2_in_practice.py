# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 19 · FSDP2 in practice: a training script you can lift into your project

Notebook 15 showed what `fully_shard` does to a few linear layers. A real job shards a real model, and the way it is written matters: the model must never exist whole on one device (it may not fit), each transformer block must be its own unit so that only one block (two, with prefetch) is gathered at a time, and so must the embedding and the head, which a real vocabulary makes the largest parameters; accumulation must choose between reduce-scattering every micro-batch and keeping whole gradients, and the checkpoint must be written by every rank in parallel. This notebook writes that script once, for notebook 16's transformer, runs it on CPU processes, and checks each of those choices with a measurement.

By the end you will be able to:
- build a model on the `meta` device, shard it block by block with `fully_shard` on an explicit mesh, materialize it with `to_empty` and initialize it exactly like an unsharded model;
- say what each unit's all-gather holds, and count the collectives of an accumulated step with `set_requires_gradient_sync`;
- combine `MixedPrecisionPolicy` and activation checkpointing with `fully_shard`, and say which dtype each tensor has;
- clip gradients that are DTensors and check the norm against one process;
- save a sharded run with `torch.distributed.checkpoint` and resume it exactly;
- run HSDP on a 2-D `replicate × shard` mesh and say which collective runs on which dimension, and say what `CPUOffloadPolicy` moves between host and device;
- size FSDP2's memory for Llama 3 8B on 8 ranks on a laptop, with a fake process group, fake tensors and `FSDPMemTracker`, and say which terms decide whether a step fits;
- take a checkpoint without stopping training (`dcp.async_save`), say what float8 training, async tensor parallelism, the compiler's reordering and torchft add, and map this script onto torchtitan's options.

This notebook assumes: notebook 05 (activation checkpointing), 07 (autocast and bf16), 08 (gradient accumulation), 11 (a DDP training script and `torchrun`), 15 (`fully_shard`, DTensor, `torch.distributed.checkpoint`) and 16 (the transformer and its blocks). No GPU: every run here is CPU processes over gloo, launched with `course_lib.launch`; the script has a `--device cuda` path for a machine with GPUs.
"""

# %% slideshow={"slide_type": "-"}
import json
import os
import shutil
import time
from dataclasses import replace

import torch

from course_lib.exercises.fsdp_in_practice import block_gather_bytes, collectives_per_step
from course_lib.device import requires_gpu
from course_lib.equivalence import compare_gradients
from course_lib.launch import run_script, run_torchrun
from course_lib.seeding import seed_everything
from course_lib.transformer import PRESETS, param_count, param_counts

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
for old in ("fsdp", "fsdp_ref", "fsdp_deferred", "fsdp_bf16", "fsdp_resumed", "fsdp_hsdp"):  # a previous run's outputs and checkpoints
    shutil.rmtree(f"_runs/{old}", ignore_errors=True)
notebook_start = time.perf_counter()
print(f"torch {torch.__version__.split('+')[0]}; the model: {replace(PRESETS['tiny'], tie_embeddings=False).describe()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The script

`_runs/fsdp_train.py` below is the whole program. What to look for, in order:

- **the device is an argument**, never "cuda if available": `--device cpu` (the default) runs gloo between CPU processes, `--device cuda` binds each process to the GPU numbered by its `LOCAL_RANK` and uses NCCL, as in notebook 11's script;
- **an explicit mesh** (`init_device_mesh`) of the device chosen: without one, `fully_shard` builds a mesh on the accelerator it finds, and a CPU job on a GPU machine would move its parameters to the GPU; `--replicate R` makes it 2-D (HSDP: `R` replicas × `N/R` shards);
- **meta-device construction**: `with torch.device("meta")` gives parameters with shapes and no memory; `fully_shard` then turns them into sharded DTensors, still on meta; `to_empty` allocates only this rank's shards and `init_weights` fills them;
- **torchtitan's units**: the embedding, each block, and the final norm with the head, each its own unit, gathered, used and freed on its own; the norm and head unit stays gathered after forward (`reshard_after_forward=False`: the loss needs it at once and backward starts with it); the root keeps what is left, here no parameter. The model's head is untied, as Llama 3's; a tied head shares the embedding's weight and so its unit (the script handles both). An explicit prefetch order (`set_modules_to_forward_prefetch`/`_backward_prefetch`) issues the next unit's all-gather before this one computes, so that two units are gathered at once at most. On a GPU that gather then runs on its own stream while this block computes. On gloo, as in these CPU runs, every collective completes before the block computes: prefetch changes the order of the all-gathers and hides nothing (notebook 14 §3.2; notebook 20 §5 shows the private switch that makes it overlap on a CPU);
- **`--cpu-offload`** passes `CPUOffloadPolicy` to every unit: shards, gradients and AdamW's state stay on the CPU (section 6);
- **accumulation**: every micro-batch's gradients are reduce-scattered into the sharded gradient, as torchtitan does; with HSDP, the all-reduce across replicas waits for the last micro-batch (`set_requires_all_reduce(False)` before it); `--defer-grad-sync` skips the reduce-scatters of all micro-batches but the last instead (`set_requires_gradient_sync(False)`), which holds every gradient unsharded meanwhile (section 3 says when that pays);
- **`clip_grad_norm_` on DTensor gradients**, which computes the norm of the whole gradient across ranks;
- **`torch.distributed.checkpoint`** (`--save-at`, `--resume`): each rank writes and reads its own shards of the model and of AdamW's state;
- at the end, the full parameters gathered to rank 0's CPU (`get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`).

Every rank draws the same global batch for a step and takes its own rows of each micro-batch, so a run on `N` ranks computes the gradient of the same batch as one process.

One line is not FSDP practice: `import torch.distributed.nn` before `init_process_group`, a workaround for a defect of PyTorch 2.13 that can crash a gloo job at exit (notebook 11 §10.2). Skip it on a first read; a script for a PyTorch without the defect drops it.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/fsdp_train.py
"""Train the course's transformer with FSDP2, the way a real job does; lift it into your project.

    torchrun --nproc_per_node=N fsdp_train.py --out DIR [--device cpu|cuda] [--replicate R] [--steps 4]
             [--batch 16] [--micro-batches 2] [--seq-len 64] [--lr 3e-3] [--clip 1.0]
             [--bf16] [--checkpointing] [--cpu-offload] [--no-prefetch] [--defer-grad-sync]
             [--save-at K [--async-save]]
             [--resume DIR --from-step K] [--profile DIR]
    python fsdp_train.py --out DIR       # one process, nothing sharded: the reference

1. process group and mesh: gloo between CPU processes (an explicit CPU mesh), or NCCL with one GPU
   per process (--device cuda); a 1-D mesh (FSDP) or, with --replicate R, R replicas x N/R shards (HSDP);
2. the model built on the meta device (shapes, no memory), sharded as torchtitan does: the embedding,
   each block, and the final norm with the head are units of their own, the root keeps the rest;
   then materialized with to_empty and initialized (with --cpu-offload the shards, their gradients and
   AdamW's state live on the CPU, and each unit's shard is copied to the device for its all-gather);
3. each step accumulates --micro-batches micro-batches, reduce-scattering each one's gradients (HSDP:
   all-reducing across replicas after the last only); --defer-grad-sync reduce-scatters after the last
   micro-batch only and holds every gradient unsharded meanwhile; then clips the global gradient norm
   and steps AdamW;
4. a sharded checkpoint (model and optimizer, torch.distributed.checkpoint) after step --save-at, which
   --resume DIR --from-step K loads to carry on; with --async-save the state is copied to CPU memory and
   written by a background thread while training goes on;
5. the full parameters gathered to rank 0 and saved, with the losses and gradient norms;
6. with --profile DIR, a torch.profiler trace per rank of the steps after the first two, for Perfetto or HTA.
"""
import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: see notebook 11's teardown)
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from course_lib.data import text_batch, text_corpus
from course_lib.teardown import end_process_group
# private torch APIs, one function each: torch.distributed.algorithms._checkpoint's wrapper, and the base class of
# a mode that sees every operator (torch.utils._python_dispatch)
from course_lib.torch_private import TorchDispatchMode, checkpoint_wrapper
from course_lib.transformer import PRESETS, Transformer

CONFIG = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False)  # your model's; an untied head, as Llama 3's
# FSDP2's hooks warn about two patterns this model has and handles: a view as the root's output, no input requiring grad
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message="Full backward hook is firing.*")


def log(*parts):
    """Rank 0 speaks for everyone (every rank runs the same program on its own shard)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        sys.stdout.write(f"[rank0]: {' '.join(map(str, parts))}\n")
        sys.stdout.flush()


def describe(model, names=("embed.weight", "layers.0.attn.q_proj.weight")):
    """Where a few parameters live and what this rank holds of them."""
    out = []
    for name, p in model.named_parameters():
        if name.replace("._checkpoint_wrapped_module", "") in names:
            local = p.to_local() if hasattr(p, "to_local") else p
            out.append(f"{name} {type(p).__name__} {str(p.device)} {tuple(p.shape)} local {tuple(local.shape)}")
    return out


def build_model(mesh, device, args):
    """Meta init, fully_shard unit by unit, then materialize: the model never exists whole on any rank."""
    with torch.device("meta"):
        model = Transformer(CONFIG, seed=args.seed)  # shapes and dtypes only: no memory, no values
    log("built on meta:", *describe(model))
    size = lambda *modules: sum(p.numel() for p in {p for m in modules for p in m.parameters()})  # noqa: E731
    ends = [model.norm, model.head]  # the final norm and the head: one unit
    if CONFIG.tie_embeddings:  # a tied head shares the embedding's weight, and so its unit
        ends.insert(0, model.embed)
    else:
        UNIT_SIZES["embed"] = size(model.embed)
    UNIT_SIZES.update({f"layers.{i}": size(block) for i, block in enumerate(model.layers)})
    UNIT_SIZES[" + ".join(n for n, m in model.named_children() if m in ends)] = size(*ends)
    UNIT_SIZES["root"] = size(model) - sum(UNIT_SIZES.values())
    if mesh is not None:
        kwargs = {"mesh": mesh}
        if args.bf16:  # compute in bf16 on fp32 shards; reduce-scatter gradients in fp32
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if args.cpu_offload:  # shards, gradients and optimizer state on the CPU; pinned memory for fast copies
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        if not CONFIG.tie_embeddings:  # torchtitan's units; first the embedding, gathered in forward and in backward
            fully_shard(model.embed, **kwargs)
        for i, block in enumerate(model.layers):  # one unit per transformer block
            if args.checkpointing:  # checkpointing first, then fully_shard the checkpointed block
                block = model.layers[i] = checkpoint_wrapper(block)
            fully_shard(block, **kwargs)
        # the final norm and the head, kept gathered after forward: the loss needs them at once, backward starts there
        fully_shard(ends, **kwargs, reshard_after_forward=False)
        fully_shard(model, **kwargs)  # the root: what is left (here no parameter, only the rotary tables)
        if not args.no_prefetch:  # explicit order: gather the next unit while this one runs
            chain = [model.embed, *model.layers] + ([] if CONFIG.tie_embeddings else [model.norm])
            for i, unit in enumerate(chain):
                if i + 1 < len(chain):
                    unit.set_modules_to_forward_prefetch([chain[i + 1]])
                if i > 0:
                    unit.set_modules_to_backward_prefetch([chain[i - 1]])
        log("sharded, still on meta:", *describe(model))
    model.to_empty(device="cpu" if args.cpu_offload else device)  # this rank's shards, uninitialized
    model.init_weights(args.seed)  # the same values as a model built whole; each rank writes its shard
    log("materialized:", *describe(model))
    return model


def micro_batches(step, args, rank, world):
    """Step `step`'s global batch (the same draw on every rank), cut into micro-batches; my rows of each."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = text_batch(DATA, args.batch, args.seq_len, generator=g)
    size = args.batch // args.micro_batches
    for m in range(args.micro_batches):
        rows = slice(m * size, (m + 1) * size)
        yield x[rows][rank::world].contiguous(), y[rows][rank::world].contiguous()


def make_mesh(device, replicate):
    """An explicit mesh on the device we chose: without one, fully_shard builds it on the accelerator it
    finds, and a CPU job on a GPU machine would move its parameters to the GPU."""
    world = dist.get_world_size()
    if replicate > 1:  # HSDP: shard within groups of N/R ranks, replicate across the R groups
        return init_device_mesh(device.type, (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))


UNIT_SIZES = {}  # parameters (elements) per fully_shard unit: what one all-gather brings together


class CollectivesByGroup(TorchDispatchMode):
    """Count FSDP2's collectives (every c10d operation this rank issues, as CommDebugMode counts them), by the mesh
    dimension whose process group runs them, with the bytes each rank sends in (an all-gather's input: the shard
    copied to the device under CPU offload) and gets back (a reduce-scatter's output: the gradient shard copied
    back to the CPU). Not CommDebugMode itself, in a training loop: in torch 2.13 its module tracker hooks every
    module's inputs with register_multi_grad_hook, whose hooks and the autograd graph hold each other through C++,
    so every micro-batch's graph, and FSDP2's state and process group with it, stays in memory until the garbage
    collector has run once per module of the chain (notebook 11, section 10.2)."""

    def __init__(self, mesh):
        super().__init__()
        self.dims = {tuple(dist.get_process_group_ranks(mesh.get_group(d))): d for d in mesh.mesh_dim_names}
        self.counts, self.bytes, self.by_op = {}, {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            groups = [dist.ProcessGroup.unbox(a) for a in args
                      if isinstance(a, torch.ScriptObject) and "ProcessGroup" in a._type().qualified_name()]
            dim = self.dims.get(tuple(dist.get_process_group_ranks(groups[0])), "other") if groups else "other"
            name = func.__name__.split(".")[0]
            key = f"{name} on {dim}"
            self.counts[key] = self.counts.get(key, 0) + 1
            self.by_op[name] = self.by_op.get(name, 0) + 1
            moved = args[1] if name == "_allgather_base_" else args[0] if name == "_reduce_scatter_base_" else None
            if moved is not None:
                self.bytes[name] = self.bytes.get(name, 0) + moved.numel() * moved.element_size()
            if name == "_reduce_scatter_base_":  # what it sends in: the unit's whole (unsharded) gradients
                self.bytes["reduce-scatter input"] = self.bytes.get("reduce-scatter input", 0) + args[1].nbytes
        return func(*args, **(kwargs or {}))


def holdings(model, opt, mesh, grad_device):
    """What this rank holds of the embedding, and where its shard, gradient and AdamW state live."""
    p = model.embed.weight
    local = p.to_local()
    coordinate = mesh.get_coordinate()
    return {"rank": dist.get_rank(), "coordinate": dict(zip(mesh.mesh_dim_names, coordinate)),
            "placements": str(tuple(p.placements)), "local shape": tuple(local.shape),
            "rows from": coordinate[-1] * local.shape[0], "digest": hashlib.sha1(local.detach().cpu().numpy().tobytes()).hexdigest(),
            "parameter": str(local.device), "gradient": grad_device,
            "AdamW state": str(opt.state[p]["exp_avg"].device),
            "bytes kept (shards + gradients + AdamW)": 4 * sum(q.to_local().numel() * q.element_size()
                                                               for q in model.parameters())}


def watch_dtypes(model):
    """Record the dtype a block's first linear layer computes with (a forward pre-hook)."""
    seen = {}
    linear = next(m for m in model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_pre_hook(lambda m, inp: seen.update(weight=str(m.weight.dtype), input=str(inp[0].dtype)))
    return seen


def train(args, device):
    mesh = make_mesh(device, args.replicate) if dist.is_initialized() else None
    rank, world = (dist.get_rank(), dist.get_world_size()) if mesh is not None else (0, 1)
    if mesh is not None:
        log(f"backend={dist.get_backend()} world={world} mesh={mesh.mesh.tolist()} {mesh.mesh_dim_names}")
    model = build_model(mesh, device, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    if args.resume:  # each rank reads its own shards of the model and of AdamW's state
        state = {"model": get_model_state_dict(model), "optim": get_state_dict(model, opt)[1]}
        dcp.load(state, checkpoint_id=args.resume)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        log(f"resumed from {args.resume} at step {args.from_step}")
    seen, counts, by_group = watch_dtypes(model), [], []
    losses, norms, held_grad_bytes = [], [], None
    # An asynchronous save runs its collectives from a background thread: they get a gloo group of their own, so
    # that they never interleave with the training loop's collectives on the default group.
    save_group = dist.new_group(backend="gloo") if mesh is not None and args.async_save else None
    pending, stall = None, None  # the save still being written; how long the loop was blocked by the checkpoint
    tracing = contextlib.ExitStack()
    if args.profile:  # one trace per rank of the steps after the first two (warm-up); on a GPU, its kernels too
        kinds = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        profiler = tracing.enter_context(torch.profiler.profile(
            activities=kinds, schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.steps - args.from_step - 2),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.profile)))
    for step in range(args.from_step, args.steps):
        total = torch.zeros((), device=device)
        batches = list(micro_batches(step, args, rank, world))
        for m, (x, y) in enumerate(batches):
            last = m == len(batches) - 1
            if mesh is not None and args.defer_grad_sync:  # reduce-scatter after the last micro-batch only
                model.set_requires_gradient_sync(last)  # meanwhile every unit holds its gradient unsharded
            elif mesh is not None and args.replicate > 1:  # HSDP: reduce-scatter every micro-batch inside the
                model.set_requires_all_reduce(last)  # shard group, all-reduce across replicas after the last only
            groups = CollectivesByGroup(mesh) if mesh is not None else contextlib.nullcontext()
            with groups:  # records every collective issued in this micro-batch, and the mesh dimension it ran on
                loss = model.loss(x.to(device), y.to(device)) / len(batches)
                loss.backward()
            if mesh is not None:
                counts.append(groups.by_op)
                by_group.append({"counts": groups.counts, "bytes": groups.bytes})
            if held_grad_bytes is None:  # the sharded gradients this rank holds after the first micro-batch
                held_grad_bytes = sum(p.grad.to_local().nbytes if hasattr(p.grad, "to_local") else p.grad.nbytes
                                      for p in model.parameters() if p.grad is not None)
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)  # DTensor gradients: the global norm
        grad_dtype = str(next(p for n, p in model.named_parameters() if n.endswith("q_proj.weight")).grad.dtype)
        grad_device = str(model.embed.weight.grad.device)  # where the (sharded) gradient lives before the step
        opt.step()
        opt.zero_grad()
        if mesh is not None:
            dist.all_reduce(total)  # the mean over the ranks' rows: the global batch's loss
            total /= world
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        losses.append(total.item())
        norms.append(norm.item())
        log(f"step {step}: loss ~{losses[-1]:.4f}, gradient norm before clipping ~{norms[-1]:.4f}")
        if args.profile:
            profiler.step()
        if mesh is not None and step + 1 == args.save_at:  # every rank writes its shards, in parallel
            start = time.perf_counter()
            model_sd, optim_sd = get_state_dict(model, opt)
            state, where = {"model": model_sd, "optim": optim_sd}, f"{args.out}/dcp_step{step + 1}"
            if args.async_save:  # copy to CPU memory now; a thread writes the files while the next steps run
                pending = dcp.async_save(state, checkpoint_id=where, process_group=save_group)
            else:
                dcp.save(state, checkpoint_id=where)
            stall = time.perf_counter() - start
            log(f"{'saving' if args.async_save else 'saved'} {where}")
    tracing.close()  # the trace files are written here
    if pending is not None:
        pending.result()  # the files are complete (a job must wait before the next save, and before it exits)
        log(f"saved {args.out}/dcp_step{args.save_at} in the background")
    p = next(p for n, p in model.named_parameters() if n.endswith("q_proj.weight"))
    dtypes = {"stored": str(p.dtype), "forward weight": seen["weight"], "forward input": seen["input"],
              "gradient": grad_dtype, "optimizer state": str(
                  opt.state[p]["exp_avg"].dtype)}
    held = [None] * world  # each rank's holdings, brought to rank 0 to be printed
    if mesh is not None:
        dist.all_gather_object(held, holdings(model, opt, mesh, grad_device))
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0  # device memory, GPU runs
    # Gather the full parameters to rank 0 (on its CPU), save them there.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(full, f"{args.out}/final.pt")
        with open(f"{args.out}/log.json", "w") as f:
            json.dump({"losses": losses, "norms": norms, "world": world, "dtypes": dtypes, "units": UNIT_SIZES,
                       "counts": counts, "by_group": by_group, "holdings": held, "peak_device_bytes": peak,
                       "checkpoint_stall_s": stall,
                       "sharded gradient bytes after a micro-batch": held_grad_bytes}, f)
    return model


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    # The device is a choice, never "cuda if torch.cuda.is_available()": a CPU job stays a CPU job on a GPU machine.
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--replicate", type=int, default=1, help="replicas of an HSDP mesh (1: plain FSDP)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch per step, in sequences")
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--cpu-offload", action="store_true", help="CPUOffloadPolicy: shards and AdamW on the CPU")
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--defer-grad-sync", action="store_true",
                   help="reduce-scatter after the last micro-batch only; gradients held unsharded until then")
    p.add_argument("--save-at", type=int, default=0, help="write a sharded checkpoint after this many steps")
    p.add_argument("--async-save", action="store_true", help="dcp.async_save: write the checkpoint in the background")
    p.add_argument("--resume", default="", help="a checkpoint folder written by --save-at")
    p.add_argument("--from-step", type=int, default=0, help="the step the checkpoint was written after")
    p.add_argument("--profile", default="", help="write a profiler trace per rank into this folder (3+ steps)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if "WORLD_SIZE" not in os.environ:  # `python fsdp_train.py`: one process, no group, no sharding
        return train(args, torch.device("cpu"))
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":  # one GPU per process, chosen by LOCAL_RANK; NCCL between them
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    if args.batch % (args.micro_batches * world):
        raise ValueError(f"--batch {args.batch} must split into {args.micro_batches} micro-batches x {world} ranks")
    finished = False
    try:
        train(args, device)  # the model, its DTensors and the mesh die with train's frame
        finished = True
    finally:
        end_process_group(barrier=finished)  # barrier, destroy, check every group is gone (notebook 11, 10.2)


DATA = text_corpus().train
if __name__ == "__main__":
    main()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Sharded training equals one process

The same script runs twice: as one plain process (no process group, nothing sharded: the reference) and under `torchrun` on 2 CPU processes. Rank 0's lines show a parameter's life: a plain `Parameter` on meta, a sharded `DTensor` still on meta, then a `DTensor` on the CPU holding half the rows.
"""

# %% slideshow={"slide_type": "-"}
reference = run_script(["python", "_runs/fsdp_train.py", "--out", "_runs/fsdp_ref"], timeout=300, echo="none")
sharded = run_torchrun("_runs/fsdp_train.py", nproc_per_node=2, args=["--out", "_runs/fsdp", "--save-at", "2"],
                       timeout=300, echo="none")
for who, line in sharded.lines:  # rank 0's lines; a library's warning (and its source line), if any, left out
    if who == "rank 0" and "Warning:" not in line and not line.startswith((" ", "\t")):
        print(who, "|", line)

# %% slideshow={"slide_type": "subslide"}
ref_log = json.load(open("_runs/fsdp_ref/log.json"))
fsdp_log = json.load(open("_runs/fsdp/log.json"))
loss_diff = max(abs(a - b) for a, b in zip(ref_log["losses"], fsdp_log["losses"]))
ref_final = torch.load("_runs/fsdp_ref/final.pt", weights_only=True)
fsdp_final = torch.load("_runs/fsdp/final.pt", weights_only=True)
param_diff = max((ref_final[k] - fsdp_final[k]).abs().max().item() for k in ref_final)
print(f"{len(fsdp_log['losses'])} steps on {fsdp_log['world']} ranks against 1 process:")
# Parameters get 1e-4: AdamW divides each update by the root of its running squared gradient, so gradients that differ
# in the last bits (sharded sums in another order, other CPU kernels) can move a small-gradient weight by ~1e-5.
print(f"  losses equal within 1e-5: {loss_diff < 1e-5}; final parameters within 1e-4: {param_diff < 1e-4}")
# The gradient norms before clipping, one per step: the part of the comparison that sees the gradients' scale.
norms = compare_gradients(torch.tensor(fsdp_log["norms"]), torch.tensor(ref_log["norms"]), tolerance=1e-5,
                          world_size=fsdp_log["world"], micro_batches=2)
print(f"  global gradient norms before clipping (clip_grad_norm_ on DTensors): {norms}")
assert sorted(ref_final) == sorted(fsdp_final) and loss_diff < 1e-5 and norms and param_diff < 1e-4

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The differences are rounding: each rank sums its own rows and the reduce-scatter adds the two ranks' sums, a different order of additions from one process's. Of the three comparisons, the gradient norms are the one that matters most: AdamW's steps, and so its losses and parameters, do not change when every gradient is multiplied by a constant (notebook 22 §2 shows a summed gradient passing a loss check), while the norm before clipping doubles. The gradient norm that `clip_grad_norm_` returned is the norm of the **whole** gradient, although each rank holds only its shard of it: with DTensor gradients it squares and sums the local pieces and all-reduces the sums. (With hand-made shards, or FSDP1's flat parameters, `torch.nn.utils.clip_grad_norm_` sees only this rank's shard and returns its norm, unreduced; using that local norm as if it were the whole gradient's is a classic bug: the clipping threshold then applies to a different number on every rank. FSDP1's own `model.clip_grad_norm_` reduces it.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Units, all-gathers and accumulation

Each `fully_shard` call makes one unit. FSDP2 keeps each of the unit's parameters as its own `DTensor`, sharded on its first dimension (notebook 15 §1), not flattened into one buffer as FSDP1 did; for the all-gather it copies the unit's shards side by side into one buffer, so that one all-gather brings the whole unit together before it computes. So the largest unit decides the largest temporary buffer, and with one unit per block that is one block's parameters (two blocks' when the next block is prefetched), however deep the model, provided that what is outside the blocks is sharded in units of its own too. A script that shards only the blocks and then the root leaves the embedding and the head in the root, and the root is the largest unit of a model with a real vocabulary; FSDP2 also keeps the root gathered from forward to the end of backward. The script's units, and the count for Llama 3 8B (its untied head included):
"""

# %% slideshow={"slide_type": "-"}
units = fsdp_log["units"]
for name, numel in units.items():
    print(f"unit {name:<11}: " + (f"{numel:>6,} parameters, one all-gather of {4 * numel:>7,} bytes in fp32" if numel
                                   else "no parameter (the rotary tables are buffers), no collective"))
assert units["layers.0"] * 4 == block_gather_bytes(PRESETS["tiny"], torch.float32) and units["root"] == 0
seven_b = block_gather_bytes(PRESETS["llama2-7b"], torch.bfloat16)
print(f"Llama 2 7B, one block gathered in bf16: {seven_b / 2**20:,.0f} MiB (the whole model would be 32 such blocks "
      "plus the embeddings)")
llama8b = PRESETS["llama3-8b"]
parts, block8b = param_counts(llama8b), block_gather_bytes(llama8b, torch.float32) // 4
ends_in_blocks = (parts["embedding"] + parts["head"]) / block8b
print(f"Llama 3 8B: embedding {parts['embedding']:,} + head {parts['head']:,} parameters = {ends_in_blocks:.1f} blocks "
      f"of {block8b:,}; left in the root, one unit of {ends_in_blocks:.1f} blocks, gathered from forward to the end of "
      "backward")
assert ends_in_blocks > 4

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The script recorded every collective of every micro-batch with its own `TorchDispatchMode` (`CollectivesByGroup`; the class comes from the private module `torch.utils._python_dispatch`, as in notebook 05 §2.1), which sees each c10d operation as `CommDebugMode` does (notebook 15 §1) and also notes the mesh dimension it ran on. Each step has 2 micro-batches, and each reduce-scatters its gradients.
"""

# %% slideshow={"slide_type": "-"}
counts = fsdp_log["counts"]
n_blocks, micro = sum(name.startswith("layers.") for name in units), len(counts) // len(fsdp_log["losses"])
for i, c in enumerate(counts[:micro]):
    print(f"micro-batch {i}: all-gathers {c.get('_allgather_base_', 0)}, reduce-scatters {c.get('_reduce_scatter_base_', 0)}")
per_step = {"all_gather": sum(c.get("_allgather_base_", 0) for c in counts[:micro]),
            "reduce_scatter": sum(c.get("_reduce_scatter_base_", 0) for c in counts[:micro])}
print(f"one step: {per_step}; the same counts every step: {all(c == counts[i % micro] for i, c in enumerate(counts))}")
assert per_step == collectives_per_step(n_blocks, micro, sync_every_micro_batch=True)

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Per micro-batch the embedding and each block are gathered twice, in forward and again in backward (`reshard_after_forward` at its default, `None`, is `True` for them, which frees a unit's full parameters after its forward), and the norm and head unit once: `reshard_after_forward=False` keeps it gathered until its backward, which comes right after the loss. The root has no parameter, so no collective. Each unit with parameters reduce-scatters its gradients once per micro-batch, and they are added into the sharded gradient.

### 3.1 Accumulation: reduce-scatter every micro-batch, or hold the whole gradient

`--defer-grad-sync` is the other policy: `set_requires_gradient_sync(False)` on every micro-batch but the last skips their reduce-scatters. It is **not** DDP's `no_sync` trade (notebook 11 §9). DDP keeps a whole gradient anyway, so `no_sync` costs it nothing; FSDP2 must then keep every unit's gradient *unsharded*, in the reduce dtype (fp32 under the bf16 policy), until the last micro-batch's reduce-scatter. The run below repeats section 2's with the flag and checks it against the same one-process run. The bytes held between micro-batches are measured in the runs: the sharded gradients a rank holds after the first micro-batch (public: each parameter's `.grad`, a DTensor), and, for the deferred run, which holds no sharded gradient then, what the last micro-batch's reduce-scatters send in: every unit's whole gradient, accumulated since the first micro-batch.
"""

# %% slideshow={"slide_type": "-"}
deferred = run_torchrun("_runs/fsdp_train.py", nproc_per_node=2, args=["--out", "_runs/fsdp_deferred", "--defer-grad-sync"],
                        timeout=300, echo="none")
deferred_log = json.load(open("_runs/fsdp_deferred/log.json"))
deferred_step = deferred_log["counts"][:micro]
for i, c in enumerate(deferred_step):
    print(f"--defer-grad-sync, micro-batch {i}: all-gathers {c.get('_allgather_base_', 0)}, reduce-scatters "
          f"{c.get('_reduce_scatter_base_', 0)}")
assert {"all_gather": sum(c.get("_allgather_base_", 0) for c in deferred_step),
        "reduce_scatter": sum(c.get("_reduce_scatter_base_", 0) for c in deferred_step)} == collectives_per_step(
            n_blocks, micro, sync_every_micro_batch=False)
checks = {}
for policy, run in (("reduce-scatter every micro-batch", fsdp_log), ("--defer-grad-sync", deferred_log)):
    checks[policy] = compare_gradients(torch.tensor(run["norms"]), torch.tensor(ref_log["norms"]), tolerance=1e-5,
                                       world_size=run["world"], micro_batches=micro)
    print(f"{policy:<33}: gradient norms against one process: {checks[policy]}")
sharded_bytes = fsdp_log["sharded gradient bytes after a micro-batch"]
whole_bytes = deferred_log["by_group"][micro - 1]["bytes"]["reduce-scatter input"]
print(f"gradient bytes per rank held between micro-batches: {sharded_bytes:,} (the sharded gradient) against "
      f"{whole_bytes:,} (--defer-grad-sync: no sharded gradient after the first micro-batch, "
      f"{deferred_log['sharded gradient bytes after a micro-batch']} bytes; the whole fp32 gradient, 4 bytes x "
      f"{sum(units.values()):,} parameters, sent into the last reduce-scatters)")
assert all(checks.values()) and deferred_log["sharded gradient bytes after a micro-batch"] == 0
assert whole_bytes == 4 * sum(units.values()) == fsdp_log["world"] * sharded_bytes
llama_params = param_count(llama8b)
print(f"Llama 3 8B on 8 ranks: gradients kept unsharded in fp32 between syncs {4 * llama_params / 1e9:.1f} GB per rank, "
      f"against a sharded fp32 gradient of {4 * llama_params / 8 / 1e9:.1f} GB; the rank's whole ZeRO-3 state (fp32 "
      f"shards, gradients, AdamW's moments) {16 * llama_params / 8 / 1e9:.1f} GB")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Both policies train like one process; they differ in what a rank holds. Deferring holds the whole gradient, world size times the sharded one, and for Llama 3 8B that is more than the rank's whole sharded state. What it saves are the reduce-scatters of all micro-batches but the last (it does **not** save the all-gathers: every micro-batch gathers the parameters again, unless `reshard_after_forward=False` keeps them, notebook 15 §1). That pays in two cases. A small model, like this one, whose whole gradient is small beside the activations, and whose reduce-scatters cost mostly their fixed latency. And HSDP, where the expensive collective is the all-reduce across replicas, over the links between nodes: the script keeps reduce-scattering inside the shard group every micro-batch, so the gradient it holds stays sharded, and skips only the replicas' all-reduce until the last micro-batch (`set_requires_all_reduce(False)`, section 6). For a large model on one shard group, reduce-scatter every micro-batch, as torchtitan does.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Mixed precision and activation checkpointing

`--bf16` passes `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` to every unit: the shards (and AdamW's state) stay fp32, each unit casts its shard to bf16 before the all-gather, computes in bf16, and the gradients are reduce-scattered and kept in fp32. `--checkpointing` wraps each block with `checkpoint_wrapper` **before** `fully_shard` is applied to it, so that the unit is the checkpointed block: backward re-runs the block's forward inside the unit's gather, and the recomputation uses the gathered parameters. A forward pre-hook on the first block's first linear layer records what it computes with.
"""

# %% slideshow={"slide_type": "-"}
mixed = run_torchrun("_runs/fsdp_train.py", nproc_per_node=2, args=["--out", "_runs/fsdp_bf16", "--bf16", "--checkpointing"],
                     timeout=300, echo="none")
bf16_log = json.load(open("_runs/fsdp_bf16/log.json"))
for what in ("stored", "forward weight", "forward input", "gradient", "optimizer state"):
    print(f"{what:<16}: fp32 run {fsdp_log['dtypes'][what]:<15} bf16 policy + checkpointing {bf16_log['dtypes'][what]}")
bf16_diff = max(abs(a - b) for a, b in zip(fsdp_log["losses"], bf16_log["losses"]))
print(f"losses: bf16 compute stays within 0.05 of fp32 over {len(bf16_log['losses'])} steps: {bf16_diff < 0.05} "
      f"(largest difference ~{bf16_diff:.4f})")
assert bf16_log["dtypes"]["forward weight"] == "torch.bfloat16" and bf16_log["dtypes"]["gradient"] == "torch.float32"
assert bf16_log["dtypes"]["stored"] == "torch.float32" and bf16_diff < 0.05

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The losses differ by bf16 rounding, not by checkpointing: recomputation repeats the same operations on the same values. As notebook 07 showed for autocast, bf16 needs no loss scaler; and here no `autocast` either: the policy casts the parameters, and the activations follow.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. A sharded checkpoint, resumed exactly

The fp32 run of section 2 wrote a checkpoint after step 2 (`--save-at 2`): `get_state_dict(model, opt)` gives the model's and AdamW's state as DTensors, and `dcp.save` has every rank write its own shards, with a metadata file that says which rank holds which piece. A new job builds the model the same way (meta, shard, materialize), loads the checkpoint into it with `dcp.load` and `set_state_dict`, and trains steps 2 and 3.
"""

# %% slideshow={"slide_type": "-"}
print("checkpoint files:", sorted(os.listdir("_runs/fsdp/dcp_step2")))
resumed = run_torchrun("_runs/fsdp_train.py", nproc_per_node=2,
                       args=["--out", "_runs/fsdp_resumed", "--resume", "_runs/fsdp/dcp_step2", "--from-step", "2"],
                       timeout=300, echo="none")
resumed_log = json.load(open("_runs/fsdp_resumed/log.json"))
resumed_final = torch.load("_runs/fsdp_resumed/final.pt", weights_only=True)
same_losses = resumed_log["losses"] == fsdp_log["losses"][2:]
same_params = all(torch.equal(resumed_final[k], fsdp_final[k]) for k in fsdp_final)
print(f"resumed at step 2: losses of steps 2-3 bit for bit those of the uninterrupted run: {same_losses}; "
      f"final parameters bit for bit: {same_params}")
assert same_losses and same_params
print(f"~{time.perf_counter() - notebook_start:.0f} s so far")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Bit for bit, because everything a step depends on came back: the parameters, AdamW's moments and step count, and the data (each step draws its batch from a generator seeded by the step number, so no sampler state needs saving here; notebook 15 §3 saved a sampler's epoch and a generator's state when the data needed it).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. HSDP on a 2-D mesh, with CPU offload

Plain FSDP shards over every rank, so every all-gather crosses the whole job; across many nodes that means the slow inter-node links. **HSDP** (hybrid sharding) lays the ranks out on a 2-D mesh, `replicate × shard`: each group of `N/R` ranks (in practice, one node) shards the model as in section 2, and the `R` groups hold identical copies. The all-gathers and reduce-scatters stay inside a shard group; one all-reduce per unit and step averages the gradient shards across the replicas: the script reduce-scatters every micro-batch and holds back the all-reduce until the last one (`set_requires_all_reduce(False)` before it), so the slow collective runs once per step while the gradient held stays sharded. The script does it with `--replicate R`, which only changes the mesh: `fully_shard` reads the rest from the mesh's placements `(Replicate(), Shard(0))`.

`--cpu-offload` adds `CPUOffloadPolicy` to every unit: the shards, their gradients and AdamW's state live on the CPU (the optimizer steps there), each unit's shard is copied to the device for its all-gather, and each gradient shard is copied back after its reduce-scatter. It trades device memory for host-device copies every step. One run of 4 processes shows both: `--replicate 2 --cpu-offload`, the mesh `[[0, 1], [2, 3]]`. The script's record of its collectives (`CollectivesByGroup`, section 3) also notes on which mesh dimension's process group each one ran, and the bytes each rank sent into it.
"""

# %% slideshow={"slide_type": "-"}
hsdp = run_torchrun("_runs/fsdp_train.py", nproc_per_node=4, args=["--out", "_runs/fsdp_hsdp", "--replicate", "2", "--cpu-offload"],
                    timeout=300, echo="none")
hsdp_log = json.load(open("_runs/fsdp_hsdp/log.json"))
held = hsdp_log["holdings"]
print("what each rank holds of embed.weight (256 x 64):")
for h in held:
    twin = [o["rank"] for o in held if o["rank"] != h["rank"] and o["digest"] == h["digest"]]
    print(f"  rank {h['rank']} {h['coordinate']}: {h['placements']}, local {tuple(h['local shape'])} = rows "
          f"{h['rows from']}-{h['rows from'] + h['local shape'][0] - 1}; the same bytes, bit for bit, as rank {twin[0]}")
assert all([o["rank"] for o in held if o["digest"] == h["digest"]] == [h["rank"] % 2, h["rank"] % 2 + 2] for h in held)

# %% slideshow={"slide_type": "subslide"}
hsdp_micro = len(hsdp_log["by_group"]) // len(hsdp_log["losses"])
step_counts = {}
for m, record in enumerate(hsdp_log["by_group"][:hsdp_micro]):
    print(f"micro-batch {m} (all-reduce {'on' if m == hsdp_micro - 1 else 'off'}):", record["counts"])
    for key, n in record["counts"].items():
        step_counts[key] = step_counts.get(key, 0) + n
print("one step:", step_counts)
expected = collectives_per_step(n_blocks, hsdp_micro, sync_every_micro_batch=True)
assert step_counts == {"_allgather_base_ on shard": expected["all_gather"],
                       "_reduce_scatter_base_ on shard": expected["reduce_scatter"],
                       "allreduce_ on replicate": expected["reduce_scatter"] // hsdp_micro}
hsdp_loss = max(abs(a - b) for a, b in zip(ref_log["losses"], hsdp_log["losses"]))
hsdp_norm = max(abs(a - b) for a, b in zip(ref_log["norms"], hsdp_log["norms"]))
hsdp_final = torch.load("_runs/fsdp_hsdp/final.pt", weights_only=True)
hsdp_param = max((ref_final[k] - hsdp_final[k]).abs().max().item() for k in ref_final)
print(f"HSDP 2 x 2 with CPU offload against 1 process: losses within 1e-5: {hsdp_loss < 1e-5}; gradient norms within "
      f"1e-5: {hsdp_norm < 1e-5}; final parameters within 1e-4: {hsdp_param < 1e-4}")
assert hsdp_loss < 1e-5 and hsdp_norm < 1e-5 and hsdp_param < 1e-4

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Each rank holds half the rows, as with 2-way FSDP, and its replica partner (rank `r ± 2`) holds the same half, bit for bit after four steps. Every all-gather and reduce-scatter ran inside a shard group (`[0, 1]` or `[2, 3]`), every all-reduce across the replicate dimension (`[0, 2]` or `[1, 3]`): one per unit, after its reduce-scatter, on the last micro-batch only. The per-step numbers are section 3's plus one all-reduce per unit with parameters. A replicate all-reduce moves a shard's gradient (half the model here) rather than the whole model's as DDP would, and on a real cluster the shard groups are the fast links inside a node.
"""

# %% slideshow={"slide_type": "subslide"}
first = held[0]
print(f"under CPUOffloadPolicy, rank 0's shard lives on {first['parameter']}, its gradient on {first['gradient']}, "
      f"AdamW's state on {first['AdamW state']}")
moved = hsdp_log["by_group"][:hsdp_micro]
to_device = sum(r["bytes"].get("_allgather_base_", 0) for r in moved)
to_host = moved[-1]["bytes"]["_reduce_scatter_base_"]  # the last micro-batch's, once all-reduced
kept = first["bytes kept (shards + gradients + AdamW)"]
print(f"copied per rank and step: {to_device:,} bytes host -> device (the shard of each all-gather: "
      f"{to_device / (kept / 4):.2f} x the rank's parameter shard), {to_host:,} bytes device -> host (gradient shards)")
print(f"kept off the device per rank: {kept:,} bytes (fp32 shards, gradients and AdamW's two moments)")
assert to_host == kept // 4 and to_device == sum(4 * n // 2 * (1 if k == "norm + head" else 2) * hsdp_micro
                                                 for k, n in units.items())

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
What a CPU-only job can and cannot show. On a CPU mesh the "device" *is* the CPU, so the offload copies are same-device no-ops and the memory they save is memory of the same RAM: what the run shows is the placement (every shard, gradient and moment on the CPU, the training unchanged within section 2's tolerances) and the traffic the policy creates, counted from the collectives' own tensors: each all-gather's input is the shard that a GPU job copies host to device (the embedding and the blocks twice per micro-batch, the norm and head once), and the gradient shard is copied back once per step, after the last micro-batch's reduce-scatter and all-reduce (the earlier micro-batches' reduce-scatters add up on the device). On a GPU the persistent device memory saved is 4 × the shard per rank (parameters, gradients, two AdamW moments), paid for with those copies over PCIe and with AdamW stepping on the CPU. The prefetch order of section 1 issues the next unit's copy and all-gather before this unit computes; on a GPU they overlap its compute, and notebook 20 §5 measures how much of that FSDP2 prefetch hides. The cell below runs the GPU path where there is a GPU.
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("CPU offload's saving of GPU memory (one-process FSDP2 on the GPU)"):
    for flags in ([], ["--cpu-offload"]):
        out = "_runs/fsdp_gpu_offload" if flags else "_runs/fsdp_gpu"
        run_torchrun("_runs/fsdp_train.py", nproc_per_node=1, args=["--out", out, "--device", "cuda", *flags],
                     timeout=300, echo="none", device="cuda")
        gpu_log = json.load(open(f"{out}/log.json"))
        h = gpu_log["holdings"][0]
        print(f"{' '.join(flags) or 'no offload':<13}: shard on {h['parameter']}, gradient on {h['gradient']}, "
              f"AdamW on {h['AdamW state']}; peak GPU memory {gpu_log['peak_device_bytes'] / 2**20:.2f} MiB")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`--profile DIR` writes one `torch.profiler` trace per rank (notebook 20 §8 reads such traces on the CPU). On GPUs the trace also holds every kernel, on its CUDA stream: NCCL's all-gathers and reduce-scatters on their own streams beside the compute kernels. [Holistic Trace Analysis](https://github.com/facebookresearch/HolisticTraceAnalysis) (HTA, `pip install HolisticTraceAnalysis`) reads the folder and answers two questions per rank: how the GPU's time splits into computation, non-computation (communication and memory copies) and idleness, and what fraction of the communication ran while compute kernels were running. HTA reads GPU kernels only, so the cell runs where there are GPUs and HTA is installed.
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("an FSDP2 trace of fsdp_train.py read by Holistic Trace Analysis (needs 2 GPUs and HTA)"):
    import importlib.util

    if torch.cuda.device_count() < 2 or importlib.util.find_spec("hta") is None:
        print("needs 2 GPUs and `pip install HolisticTraceAnalysis`")
    else:
        from hta.trace_analysis import TraceAnalysis

        shutil.rmtree("_runs/fsdp_gpu_trace", ignore_errors=True)
        run_torchrun("_runs/fsdp_train.py", nproc_per_node=2, args=["--out", "_runs/fsdp_gpu_traced", "--device",
                     "cuda", "--bf16", "--steps", "6", "--profile", "_runs/fsdp_gpu_trace"], timeout=600, echo="none",
                     device="cuda")
        analysis = TraceAnalysis(trace_dir="_runs/fsdp_gpu_trace")
        print(analysis.get_temporal_breakdown(visualize=False))   # per rank: compute, communication, memory, idle
        print(analysis.get_comm_comp_overlap(visualize=False))    # per rank: communication hidden under compute

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. Memory at Llama scale, sized on a laptop

The runs above measure a tiny model. Before renting 8 GPUs for Llama 3 8B you want to know whether a step fits, and the course's memory model (notebook 14's ZeRO bytes, notebook 16's activations) is one answer. PyTorch has a second one that runs FSDP2 itself, without the GPUs or the memory:

- a **fake process group** (`init_process_group("fake", ...)`) makes this process the first rank of a world of eight; every collective returns an output of the right shape and moves nothing;
- **`FakeTensorMode`** gives every tensor a shape, a dtype and a device but no storage, so an 8-billion-parameter model and its 8,192-token activations cost no memory, and each operator runs in microseconds;
- **`FSDPMemTracker`**, a dispatch mode, files every tensor created during the step under parameters (sharded or gathered), gradients, activations, temporaries and optimizer state, and keeps the peak.

All three are private or testing APIs of torch 2.13 (`torch.testing._internal`, `torch._subclasses`, `torch.distributed._tools`); the course reaches them through `course_lib.torch_private`. The script builds notebook 16's transformer at Llama 3 8B's configuration, shards it as `fsdp_train.py` does (torchtitan's units) with the bf16 policy, and tracks one forward, backward and AdamW step of 8,192 tokens; then again with the embedding and the head left in the root, as a script that shards only the blocks and then the model would have them.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/fsdp_memory.py
"""FSDP2's memory per rank for a large configuration over N fake ranks, on one CPU: nothing is allocated."""
import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from course_lib.teardown import end_process_group
# private and testing torch APIs: a fake world, fake tensors, FSDP2's memory tracker
from course_lib.torch_private import fake_process_group, fake_tensor_mode, fsdp_memory_tracker
from course_lib.transformer import PRESETS, Transformer


def step_memory(config, mesh, script_units, seq_len):
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with fake_tensor_mode():                         # from here on, no tensor has storage
        model = Transformer(config, device="meta")
        if script_units:  # fsdp_train.py's (torchtitan's): the embedding; the norm with the head, gathered after forward
            fully_shard(model.embed, mesh=mesh, mp_policy=policy)
            fully_shard([model.norm, model.head], mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)  # otherwise the root holds the embedding, the norm and the head
        model.to_empty(device="cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for p in model.parameters():                 # AdamW makes its state in its first step: make it now
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        tokens = torch.randint(0, config.vocab_size, (1, seq_len))
        tracker = fsdp_memory_tracker(model, opt)
        with tracker:
            loss = model.loss(tokens, tokens)
            after_forward = tracker.get_tracker_snapshot("current")
            loss.backward()
            after_backward = tracker.get_tracker_snapshot("current")
            opt.step()
        peak = tracker.get_tracker_snapshot("peak")
    names = lambda snap: {getattr(k, "value", k): v for k, v in snap[torch.device("cpu")].items()}  # noqa: E731
    return {"forward": names(after_forward), "backward": names(after_backward), "peak": names(peak),
            "parameter tensors": len(list(model.parameters()))}


world, seq_len, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
gc.freeze()                                          # the modules' objects: later collections skip them (see the end)
fake_process_group(world)                            # rank 0 of `world`; the collectives move nothing
mesh = init_device_mesh("cpu", (world,))             # outside fake_tensor_mode: the mesh is real
try:
    result = {units: step_memory(PRESETS["llama3-8b"], mesh, units == "script's units", seq_len)
              for units in ("script's units", "ends in root")}
    json.dump(result, open(out, "w"))
finally:
    del mesh
    # FSDPMemTracker's hooks and the autograd graph hold each other through C++: the garbage collector frees that
    # chain one link per pass (notebook 11, 10.2), and with the modules' objects frozen a pass scans this run's only
    for _ in range(1000):
        if not gc.collect():
            break
    gc.unfreeze()                                    # end_process_group empties caches it finds among all objects
    end_process_group(barrier=False)                # destroy the group, check that it is gone

# %% slideshow={"slide_type": "subslide"}
from course_lib.planner import Layout, h100_cluster, predict

start = time.perf_counter()
run_script(["python", "_runs/fsdp_memory.py", "8", "8192", "_runs/fsdp_memory.json"], timeout=300, echo="none")
tracked = json.load(open("_runs/fsdp_memory.json"))
print(f"Llama 3 8B, 8 fake ranks, one step of 8,192 tokens: sized in ~{time.perf_counter() - start:.0f} s")
llama8b, GiB = PRESETS["llama3-8b"], 2**30
node = h100_cluster(nodes=1)  # 8 H100s: 80 GB, 989 TFLOP/s, NVLink inside, 50 GB/s InfiniBand between nodes
course = {prec: predict(llama8b, node, Layout(data=8, zero=3, micro_batch=1), seq_len=8192, global_batch=8,
                        precision=prec).memory for prec in ("fp32_adam", "mixed_adam")}
t = tracked["script's units"]
rows = [("parameters (fp32 shards)", t["peak"]["Sharded Param"], course["fp32_adam"]["parameters"]),
        ("gradients (fp32 shards, after backward)", t["backward"]["Sharded Grad"], course["fp32_adam"]["gradients"]),
        ("AdamW's two moments", t["peak"]["OptState"], course["fp32_adam"]["optimizer state"]),
        ("activations (bf16, after forward)", t["forward"]["Activation"], course["mixed_adam"]["activations"])]
print(f"{'GiB per rank':<42}{'tracker':>9}{'course':>9}")
for what, measured, model in rows:
    print(f"{what:<42}{measured / GiB:>9.2f}{model / GiB:>9.2f}")
counters = 4 * t["parameter tensors"]  # AdamW's step count: one fp32 scalar per parameter tensor
state_equal = rows[0][1] == rows[0][2] and rows[1][1] == rows[1][2] and rows[2][1] == rows[2][2] + counters
act_gap = rows[3][1] / rows[3][2] - 1
print(f"model state equal to the byte (AdamW's {t['parameter tensors']} step counters, {counters:,} bytes, "
      f"aside): {state_equal}; activations within 1 %: {abs(act_gap) < 0.01} ({100 * act_gap:+.1f} %)")
mixed = [course["mixed_adam"][k] / GiB for k in ("parameters", "gradients", "optimizer state")]
print("the mixed_adam row splits the same bytes otherwise: " + ", ".join(f"{x:.2f}" for x in mixed) + " GiB")
rotary = llama8b.n_layers * 2 * 8192 * llama8b.head_dim * 2  # cos and sin tables, bf16, one copy per block
beyond = rows[3][1] - rows[3][2]
print(f"activations beyond the course's count: {beyond / 2**20:.1f} MiB; 32 blocks x the rotary tables cast to bf16: "
      f"{rotary / 2**20:.1f} MiB; within 0.1 MiB: {abs(beyond - rotary) < 0.1 * 2**20}")
assert state_equal and abs(act_gap) < 0.01 and abs(beyond - rotary) < 0.1 * 2**20

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The model state agrees to the byte with the course's `fp32_adam` row, not its `mixed_adam` one: under FSDP2's bf16 policy the fp32 shard *is* the master copy, its gradient is fp32, and AdamW adds its two moments, 4 + 4 + 8 bytes a parameter (the mixed-precision recipe of notebook 14 splits the same 16 bytes as 2 + 2 + 12, the last printed split). The activations differ by the rotary tables, to within a tenth of a MiB: the policy casts them to bf16 on entry to each block, a copy per block that the course's count leaves out. The peak is where the two models part:
"""

# %% slideshow={"slide_type": "-"}
V, tokens = llama8b.vocab_size, 8192
for units, snap in tracked.items():
    peak = snap["peak"]
    print(f"{units:<14}: peak {peak['Total'] / GiB:.2f} GiB = state and activations + gathered parameters "
          f"{peak['Unsharded Param'] / GiB:.2f} + temporaries {peak['Temp'] / GiB:.2f}")
course_total = sum(course["fp32_adam"][k] for k in ("parameters", "gradients", "optimizer state"))
course_total += course["mixed_adam"]["activations"]
print(f"the course's model: {course_total / GiB:.2f} GiB; fp32 logits and their gradient, 2 x tokens x V x 4 bytes: "
      f"{2 * tokens * V * 4 / GiB:.2f} GiB")
planned = predict(llama8b, node, Layout(data=8, zero=3, micro_batch=1), seq_len=8192, global_batch=8, precision="mixed_adam")
transients = {k: v for k, v in planned.memory.items() if k in ("gathered units (ZeRO-3)", "logits gradient (fp32)",
                                                               "communication buffers")}
print("the planner's transients: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in transients.items()) + f" GiB; its total "
      f"{planned.memory_total / GiB:.2f} GiB, the tracker's peaks " + ", ".join(f"{s['peak']['Total'] / GiB:.2f}" for s in tracked.values()))
assert len(transients) == 3 and all(planned.memory_total >= s["peak"]["Total"] for s in tracked.values())
usable = 0.9 * node.memory_bytes  # the planner's limit: 90 % of an 80 GB H100
for units, snap in tracked.items():
    print(f"{units:<14}: {(usable - snap['peak']['Total']) / GiB:.2f} GiB below the planner's limit "
          f"({usable / GiB:.2f} GiB); the course's model leaves {(usable - course_total) / GiB:.2f} GiB")
assert tracked["script's units"]["peak"]["Temp"] == 2 * tokens * V * 4
assert tracked["script's units"]["peak"]["Total"] < tracked["ends in root"]["peak"]["Total"]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Two terms that the course's count leaves out take most of the margin. The **temporaries** are the loss's: the logits are cast to fp32 for the cross-entropy, and backward holds their gradient beside them, 2 × 8,192 × 128,256 × 4 bytes. The **gathered parameters** are the head's, with the norm's, and also the embedding's when the root holds it: with a 128,256-token vocabulary the embedding and the untied head are the largest parameters of the model (4.8 blocks' worth, section 3), and FSDP2 keeps the root gathered from forward to the end of backward. The script's units let the embedding go after forward (the head stays, as the loss needs it), which lowers the peak by the embedding's bf16 copy. The course's model leaves about 7 GiB of margin under the planner's 90 % limit; the tracker's peak leaves under 2 GiB with the script's units and under 1 GiB with the embedding and the head in the root, so a slightly longer sequence, or the allocator's fragmentation, would not fit. That is why the peak, not state plus activations, is what to check before renting the GPUs. The course's planner (notebook 21) adds these transients to its count (ZeRO-3's two gathered units, the fp32 logits' gradient and the communication buffers, printed above): its total lies just over both tracked peaks, so it errs on the safe side.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. What torchtitan adds

[torchtitan](https://github.com/pytorch/torchtitan) is PyTorch's reference stack for training large models: Meta's Llama 3 recipes on the same `fully_shard`, DTensor, `torch.distributed.pipelining` and `torch.distributed.checkpoint` this course teaches, plus the parts below, each switched on by a flag. The script of this notebook maps onto it flag for flag (the table at the end of the section).

### 8.1 Asynchronous checkpoints

`dcp.save` blocks every rank until its shards are on disk. `dcp.async_save` copies the state to CPU memory (the *staging*), hands the write to a background thread, and returns a future: training goes on while the files are written. Three rules come with it, and `--async-save` follows each: wait on the future before the next save and before the job exits; stage before the next optimizer step changes the parameters (the call itself does); and give the background write a gloo group of its own, because it runs collectives (the ranks agree on a plan and on the metadata) from another thread, and on the default group they would interleave with the training loop's and the ranks would disagree on the order. The run below saves after two steps (steps 0 and 1), like section 2's run, and both checkpoints are read back without a process group (`dcp_to_torch_save`).
"""

# %% slideshow={"slide_type": "-"}
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

shutil.rmtree("_runs/fsdp_async", ignore_errors=True)
run_torchrun("_runs/fsdp_train.py", nproc_per_node=2, args=["--out", "_runs/fsdp_async", "--save-at", "2",
                                                            "--async-save"], timeout=300, echo="none")
async_log = json.load(open("_runs/fsdp_async/log.json"))
for name in ("fsdp", "fsdp_async"):
    dcp_to_torch_save(f"_runs/{name}/dcp_step2", f"_runs/{name}/step2.pt")


def flat(tree, prefix=""):
    """The checkpoint's leaves, by their path of keys."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix: tree}


blocking = flat(torch.load("_runs/fsdp/step2.pt", weights_only=False))
background = flat(torch.load("_runs/fsdp_async/step2.pt", weights_only=False))
same = blocking.keys() == background.keys() and all(
    torch.equal(v, background[k]) if torch.is_tensor(v) else v == background[k] for k, v in blocking.items())
print(f"the checkpoint after step 1, written by a background thread while the loop went on: {len(background)} "
      f"entries, equal bit for bit to the blocking save's: {same}")
print(f"the training loop was blocked at the save for ~{1e3 * fsdp_log['checkpoint_stall_s']:.0f} ms by dcp.save and "
      f"~{1e3 * async_log['checkpoint_stall_s']:.0f} ms by dcp.async_save (rank 0)")
assert same and async_log["losses"] == fsdp_log["losses"]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The checkpoint holds the state of the moment of the save, although steps 2 and 3 changed the parameters after the call returned: the staging copy is what the thread writes. What remains of the stall is that copy (and the plan's collectives, which the blocking save runs too). On a GPU it is a device-to-host copy of every rank's shards; torchtitan's `async_with_pinned_mem` mode stages asynchronously into pinned shared memory and writes from a separate process, so that the copy too overlaps training.

### 8.2 float8 training

GPUs of compute capability 8.9 and later (Ada, Hopper, Blackwell) multiply 8-bit floats at twice the bf16 rate (NVIDIA's H100 datasheet: 1,979 against 989 TFLOP/s, dense). Two formats exist, and `torch.finfo` gives their ranges; notebook 06's bit-by-bit view applies to them too.
"""

# %% slideshow={"slide_type": "-"}
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16):
    info = torch.finfo(dtype)
    print(f"{str(dtype):<21} {info.bits} bits, largest {info.max:>9.4g}, smallest normal {info.tiny:.2e}, "
          f"relative step {info.eps}")
e4m3 = torch.finfo(torch.float8_e4m3fn)
print(f"e4m3's normal numbers span largest / smallest normal = {e4m3.max / e4m3.tiny:,.0f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`e4m3` (three stored mantissa bits, largest 448) carries weights and activations, `e5m2` (wider range, coarser) carries gradients in torchao's tensorwise recipe (its rowwise recipes use `e4m3` throughout, with scales rounded to powers of 2). With a range that narrow, every tensor is **scaled** before the cast: divide by `amax / 448` so that its largest element lands on the largest float8, multiply back after the product. torchao's recipes differ in where the scales come from: **tensorwise** (one scale per tensor, the fastest) and **rowwise** (one per row of the activations and per column of the weight, more accurate; `rowwise_with_gw_hp` also keeps the weight gradient's product in bf16). A float8 number keeps the same relative precision across its normal range, which spans 448 / 2⁻⁶ = 28,672: one scale serves a tensor well until its largest element is that many times its typical one. One outlier row past that shows the difference: under a tensorwise scale every other row falls below the smallest normal float8, where precision is lost.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.torch_private import scaled_mm  # torch._scaled_mm: a private API, the kernel under torchao's recipes

seed_everything(0)
x, w = torch.randn(64, 256), torch.randn(256, 128) / 16
x[0] *= 1e5                                                     # one outlier row of activations
F8_MAX = torch.finfo(torch.float8_e4m3fn).max
scale_x = {"tensorwise": x.abs().max() / F8_MAX, "rowwise": x.abs().amax(dim=1, keepdim=True) / F8_MAX}
scale_w = {"tensorwise": w.abs().max() / F8_MAX, "rowwise": w.abs().amax(dim=0, keepdim=True) / F8_MAX}
exact = x @ w
errors = {}
for recipe in ("tensorwise", "rowwise"):
    x8 = (x / scale_x[recipe]).to(torch.float8_e4m3fn)
    w8 = (w / scale_w[recipe]).t().contiguous().to(torch.float8_e4m3fn).t()  # the kernel wants it column-major
    product = scaled_mm(x8, w8, scale_x[recipe], scale_w[recipe], torch.float32)
    rescaled = (x8.float() * scale_x[recipe]) @ (w8.float() * scale_w[recipe])
    assert torch.allclose(product, rescaled, rtol=1e-4, atol=1e-3)           # the kernel = scale, cast, multiply
    errors[recipe] = ((product - exact)[1:].norm() / exact[1:].norm()).item()  # the rows without the outlier
    print(f"{recipe:<10}: relative error of the other rows {errors[recipe]:.4f}")
print(f"rowwise scaling is {errors['tensorwise'] / errors['rowwise']:.0f}x more accurate here")
assert errors["rowwise"] < errors["tensorwise"] / 4

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
float8 also shrinks FSDP2's traffic. With torchao's `enable_fsdp_float8_all_gather` (tensorwise only), each block's linear weights are cast to float8 **before** their all-gather, so they move one byte per parameter instead of bf16's two; the embedding, the norms and the head keep bf16, and the reduce-scatters keep the gradient's precision. Counted for Llama 3 8B with the script's units (the embedding and the blocks gathered twice per micro-batch, the norm and head once), then the planner's `float8_all_gather` flag for ZeRO-3 over 4 nodes of 8 H100s (32 ranks, 2 micro-batches of 8,192 tokens each):
"""

# %% slideshow={"slide_type": "-"}
linear = parts["attention"] + parts["mlp"]  # the blocks' linear weights: what torchao converts to float8
ends = parts["head"] + llama8b.d_model  # the head with the final norm: gathered once per micro-batch
others = param_count(llama8b) - linear - ends  # the embedding and the blocks' norms: bf16, gathered twice
gathered = {dt: 2 * (2 * (linear * lin_bytes + others * 2) + ends * 2) for dt, lin_bytes in (("bf16", 2), ("float8", 1))}
print(f"parameters gathered per rank and step (2 micro-batches): bf16 {gathered['bf16'] / 1e9:.1f} GB, float8 "
      f"{gathered['float8'] / 1e9:.1f} GB ({gathered['float8'] / gathered['bf16']:.2f} of bf16's)")
nodes4 = h100_cluster(nodes=4)
zero3 = Layout(data=32, zero=3, micro_batch=1, accumulation=2)
dp = {f8: predict(llama8b, nodes4, zero3, seq_len=8192, global_batch=64, float8_all_gather=f8).time
      for f8 in (False, True)}
print(f"4 nodes, ZeRO-3 traffic per step beyond what compute hides: {dp[False]['data-parallel (not hidden)']:.3f} s "
      f"with bf16 gathers, {dp[True]['data-parallel (not hidden)']:.3f} s with float8, of {dp[False]['compute']:.3f} s "
      "of compute")
one_node = {f8: predict(llama8b, node, Layout(data=8, zero=3, micro_batch=1, accumulation=8), seq_len=8192,
                        global_batch=64, float8_all_gather=f8).time["data-parallel (not hidden)"] for f8 in (False, True)}
print(f"one node (NVLink), the same per rank: {one_node[False]:.3f} s and {one_node[True]:.3f} s")
assert 0.5 < gathered["float8"] / gathered["bf16"] < 0.6 and one_node[False] == one_node[True] == 0.0
assert dp[True]["data-parallel (not hidden)"] < dp[False]["data-parallel (not hidden)"]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Across nodes the gathers run over the network between the nodes and outlast the compute; float8's smaller gathers remove most of the excess. Inside one node, NVLink hides them either way. The cell below runs on a GPU: it times a bf16 product against the same product in float8 with both scalings (the GPU needs float8 units: compute capability 8.9 or later).
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("a float8 matrix product against bf16 (GPUs with compute capability 8.9 or later)"):
    if torch.cuda.get_device_capability() < (8, 9):
        print(f"{torch.cuda.get_device_name()} has no float8 units (compute capability 8.9 or later)")
    else:
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        cases = {"bf16": lambda: a @ b}
        for recipe in ("tensorwise", "rowwise"):
            sa = (a.abs().amax() if recipe == "tensorwise" else a.abs().amax(1, keepdim=True)).float() / F8_MAX
            sb = (b.abs().amax() if recipe == "tensorwise" else b.abs().amax(0, keepdim=True)).float() / F8_MAX
            a8 = (a / sa).to(torch.float8_e4m3fn)
            b8 = (b / sb).t().contiguous().to(torch.float8_e4m3fn).t()
            cases[f"float8 {recipe}"] = lambda a8=a8, b8=b8, sa=sa, sb=sb: scaled_mm(a8, b8, sa, sb, torch.bfloat16)
        for name, fn in cases.items():
            fn()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(20):
                fn()
            end.record()
            torch.cuda.synchronize()
            seconds = begin.elapsed_time(end) / 1e3 / 20
            print(f"{name:<18}: ~{2 * n**3 / seconds / 1e12:.0f} TFLOP/s")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### 8.3 Async tensor parallelism, the compiler's reordering, fault tolerance

**Async TP.** Notebook 17's tensor parallelism waits for each all-gather before the matrix product that consumes it, and for each product before its reduce-scatter. torchtitan's `--parallelism.enable_async_tensor_parallel` lets Inductor's micro-pipelining pass (`torch._inductor.config._micro_pipeline_tp`, over *symmetric memory*, buffers that every GPU of the node can read and write directly) split each pair into `T` chunks, so that chunk *i*'s transfer runs under chunk *i − 1*'s product. Only the first chunk waits, plus whatever the products cannot cover. The planner's `async_tensor_parallel` flag models exactly that; for Llama 3 8B on 8 nodes with TP 8 inside each node:
"""

# %% slideshow={"slide_type": "-"}
nodes8 = h100_cluster(nodes=8)
tp8 = Layout(data=8, tensor=8, zero=1, micro_batch=1, accumulation=4, checkpointing="full")
tp_time = {a: predict(llama8b, nodes8, tp8, seq_len=8192, global_batch=32, async_tensor_parallel=a).time
           for a in (False, True)}
waits = {a: t["tensor-parallel collectives"] for a, t in tp_time.items()}
print(f"tensor-parallel collectives on the critical path: {waits[False]:.3f} s per step, {waits[True]:.3f} s with "
      f"async TP ({waits[False] / waits[True]:.0f}x less), against {tp_time[False]['compute']:.2f} s of compute")
assert waits[True] < waits[False]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
**The compiler's reordering.** Notebook 20 compiles FSDP2 block by block, and the collectives stay where FSDP2's hooks put them. torchtitan's SimpleFSDP experiment writes FSDP as DTensor redistributions the compiler can see, and Inductor's overlap scheduling pass (`torch._inductor.fx_passes.overlap_scheduling`) then buckets the all-gathers and reduce-scatters and moves them to overlap compute; both it and the older `reorder_for_compute_comm_overlap` setting are off by default in 2.13: SimpleFSDP calls the pass itself (`torchtitan/experiments/simple_fsdp/backend.py`).

**Fault tolerance beyond a restart.** Notebook 12 restarts the whole job from its last checkpoint when a rank dies. [torchft](https://github.com/pytorch/torchft) keeps the job running instead: the ranks are split into *replica groups* that each hold a full copy of the sharded model (HSDP's replicate dimension, section 6); a *lighthouse* server takes a quorum of the healthy groups every step, the data-parallel all-reduce runs among those only, and a group that comes back fetches the weights live from a healthy peer. Its process groups can be torn down and rebuilt without killing the trainer. torchtitan turns it on with `--fault_tolerance.enable`.

### 8.4 This notebook's script in torchtitan's words

Every flag of `fsdp_train.py`, read from the script itself, with the torchtitan option that does the same job and the line of torchtitan's configuration that defines it; then the flags of notebook 22's capstone script, which adds tensor, pipeline and context parallelism, `torch.compile` and restarts:
"""

# %% slideshow={"slide_type": "-"}
from IPython.display import Markdown, display

from course_lib.torchtitan_map import TORCHTITAN_EXTRAS, TORCHTITAN_FLAGS, script_flags, torchtitan_table

flags = script_flags(open("_runs/fsdp_train.py").read())  # the options its argparse defines
display(Markdown(torchtitan_table("fsdp_train.py", flags)))
capstone = [f for f in TORCHTITAN_FLAGS["capstone_train.py"] if f not in flags]  # the flags the two share: above
display(Markdown(torchtitan_table("capstone_train.py", capstone)))
print(f"{len(flags)} + {len(capstone)} flags, each mapped; torchtitan's options for what the scripts leave to other notebooks:")
for feature, (option, line, note) in TORCHTITAN_EXTRAS.items():
    print(f"  {feature:<28} {option} ({note})")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Build on `meta`, `fully_shard` the embedding, each block, the norm with the head (kept gathered after forward) and then the root on an explicit mesh of the device you chose, `to_empty`, initialize: no rank ever holds the whole model, and the sharded run trained like one process (losses and gradient norms within 1e-5, final parameters within 1e-4).
- torchtitan's units: an all-gather holds one block's parameters, or the embedding's, or the norm and head's; left in the root, the embedding and head of Llama 3 8B would be one unit of 4.8 blocks, gathered from forward to the end of backward. Per micro-batch the embedding and each block are gathered twice, the norm and head once. Reduce-scattering every micro-batch holds only the sharded gradient; `set_requires_gradient_sync(False)` skips the reduce-scatters of all micro-batches but the last, not the all-gathers, and holds every gradient unsharded meanwhile (world size times the bytes, measured): right for a small model, not for a large one. With HSDP, `set_requires_all_reduce(False)` defers only the replicas' all-reduce.
- `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` computes in bf16 on fp32 shards, gradients and optimizer state; checkpoint each block first, then shard it.
- `clip_grad_norm_` on DTensor gradients returns the global norm.
- `torch.distributed.checkpoint` writes and reads each rank's shards of the model and the optimizer; with a deterministic data order the resumed run is bit for bit the uninterrupted one.
- HSDP (`--replicate 2` on 4 ranks): replicas hold the same shards bit for bit; all-gathers and reduce-scatters run inside a shard group, one all-reduce per unit and step across replicas; it trained like one process within the same tolerances.
- `CPUOffloadPolicy` keeps shards, gradients and AdamW's state on the CPU (4 × the shard per rank off the device) and copies each gathered shard to the device and each gradient shard back, counted per step from the collectives.
- A fake process group, `FakeTensorMode` and `FSDPMemTracker` size a Llama 3 8B step over 8 ranks on one CPU: the model state agrees with the course's model to the byte, the activations within 1 %, and the peak adds what decides an OOM: the loss's fp32 logits and their gradient, and the gathered head (and embedding, when the root holds it).
- `dcp.async_save` (its own gloo group, the future waited on before the next save) writes the same checkpoint while training goes on; only the staging copy stalls the loop.
- float8 (e4m3 for weights and activations, e5m2 for gradients) needs a scale per tensor or per row; an outlier row ruins a tensorwise scale. FSDP2's float8 all-gather moves one byte per parameter instead of bf16's two; async TP hides all but one chunk of TP's collectives; torchft keeps training when a replica group fails; each flag of the script has its torchtitan option.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `collectives(n_blocks, micro_batches, sync_every_micro_batch)`: the all-gathers and reduce-scatters of one step of this script's model (units: the embedding, one per block, the norm with the head under `reshard_after_forward=False`, and a root with no parameter; the others at the default), as `{"all_gather": ..., "reduce_scatter": ...}`; `sync_every_micro_batch=False` is `--defer-grad-sync`.
2. Write `gather_bytes(config, param_dtype)`: the bytes one block's all-gather brings together for a `TransformerConfig`, when `MixedPrecisionPolicy(param_dtype=param_dtype)` is used (count the parameters of a block of notebook 16's transformer).
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.fsdp_in_practice import (check_block_gather_bytes, check_collectives_per_step,
                                                   check_float8_scales)


def collectives(n_blocks, micro_batches, sync_every_micro_batch):
    raise NotImplementedError  # your code here


print(check_collectives_per_step(collectives))


# %% slideshow={"slide_type": "-"}
def gather_bytes(config, param_dtype):
    raise NotImplementedError  # your code here


print(check_block_gather_bytes(gather_bytes))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
3. §8.2's scales. Write `float8_scales(x, recipe)`: the fp32 scale(s) by which `x` is divided before its cast to `torch.float8_e4m3fn`, so that its largest magnitude lands on e4m3's largest value; for `recipe="tensorwise"` one scale (a 0-d tensor), for `"rowwise"` one per row, shaped `(rows, 1)` so that `x / scale` broadcasts.
"""


# %% slideshow={"slide_type": "-"}
def float8_scales(x, recipe):
    raise NotImplementedError  # your code here


print(check_float8_scales(float8_scales))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [`torch.distributed.fsdp.fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) (`MixedPrecisionPolicy`, `set_requires_gradient_sync`, `set_modules_to_forward_prefetch`), [DeviceMesh](https://pytorch.org/docs/stable/distributed.tensor.html), [`torch.distributed.checkpoint`](https://pytorch.org/docs/stable/distributed.checkpoint.html) and its `state_dict` helpers.
- PyTorch tutorials: [Getting started with FSDP2](https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html), [Distributed checkpoint recipe](https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html).
- The `torchtitan` repository (PyTorch's reference for large-model training): per-block `fully_shard`, meta-device initialization and activation checkpointing applied before sharding.
- Y. Zhao et al., *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*, VLDB 2023, [arXiv:2304.11277](https://arxiv.org/abs/2304.11277).
- torchtitan: W. Liang et al., *TorchTitan: One-stop PyTorch native solution for production ready LLM pre-training*, 2024, [arXiv:2410.06511](https://arxiv.org/abs/2410.06511); [pytorch/torchtitan](https://github.com/pytorch/torchtitan), `torchtitan/config/job_config.py` at commit 238fa99 (the flag table), `torchtitan/models/llama3/infra/parallelize.py` (`apply_fsdp`: the embedding, and the norm with the head, as units of their own).
- PyTorch docs: [`torch.distributed.checkpoint.async_save`](https://pytorch.org/docs/stable/distributed.checkpoint.html); `torch/distributed/_tools/fsdp2_mem_tracker.py` (FSDPMemTracker), and torchtitan's `scripts/estimate/estimation.py`, which sizes memory the same way.
- torchao: [float8 training](https://github.com/pytorch/ao/tree/main/torchao/float8) (`Float8LinearConfig.from_recipe_name`: `tensorwise`, `rowwise`, `rowwise_with_gw_hp`; `enable_fsdp_float8_all_gather`); P. Micikevicius et al., *FP8 Formats for Deep Learning*, 2022, [arXiv:2209.05433](https://arxiv.org/abs/2209.05433).
- Async tensor parallelism: [Distributed w/ TorchTitan: Introducing Async Tensor Parallelism in PyTorch](https://discuss.pytorch.org/t/distributed-w-torchtitan-introducing-async-tensor-parallelism-in-pytorch/209487); Inductor's `torch/_inductor/fx_passes/micro_pipeline_tp.py`.
- [pytorch/torchft](https://github.com/pytorch/torchft): replica groups, the lighthouse, `ProcessGroupBabyNCCL`.
"""
