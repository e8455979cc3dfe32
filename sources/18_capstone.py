# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 18 · Capstone: one training script, every technique, measured

The course's techniques, side by side in one real training script: bf16 mixed precision (notebooks 06–07), activation checkpointing (04–05), gradient accumulation (08) and DistributedDataParallel (09–11). Each is a flag; the notebook launches the script (one plain process, then `torchrun` with two processes), collects what each combination costs and saves. Then it sizes parallel layouts by counting: a planner built from the course's formulas predicts memory per rank and time per step, seven layouts of the transformer run on 4 and 8 processes check its memory to within 5%, and the same planner sizes Llama 3 on H100 clusters next to the layout Meta published. It closes with a cheat sheet: the source posts' APIs next to today's, each replacement run.

By the end you will be able to:
- combine autocast, checkpointing, accumulation and DDP in one training loop without changing what it computes;
- measure peak memory, step time and accuracy for each combination and read the trade-offs;
- pick the technique for a bottleneck (activation memory, batch size, model size, time);
- predict memory per rank and step time of a data, tensor, pipeline and context parallel layout with ZeRO and checkpointing, check the memory against a real run, and rank the layouts that fit a cluster;
- translate old PyTorch code (`Variable`, `saved_variables`, `apex.amp`, `torch.cuda.amp`, `torch.distributed.launch`, `--local_rank`, ...) into the current API.

This notebook assumes: notebooks 04–16. It runs on 2 CPU cores (the numbers are this machine's; timings are marked `~`). No GPU needed.
"""

# %% slideshow={"slide_type": "-"}
import json
import os
import pickle
import sys
import warnings

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.errors import expect_error
from course_lib.launch import run_script, run_torchrun
from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
print(f"torch {torch.__version__.split('+')[0]}, gloo: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The script

A residual MLP (4 blocks, each `Linear(64→256) → ReLU → Linear(256→64)`, wider inside as in a transformer) on the digits (1,438 training images, 359 test). Every configuration trains **30 optimizer steps on the same global batches of 512 samples**, so they compute the same thing:

- `--accum K`: each step is K micro-batches of 512/K, each loss divided by K (notebook 08);
- `--ddp`: each of the ranks takes its share of the global batch; DDP averages the gradients; with accumulation the first K-1 micro-batches run under `no_sync()` (notebook 10);
- `--checkpoint`: each block keeps only its input and recomputes its inside during backward (`use_reentrant=False`, notebook 04);
- `--amp`: the forward runs under `torch.autocast("cpu", dtype=torch.bfloat16)`; bf16 has float32's exponent range, so no loss scaling is needed (notebook 07 §3).

It measures the **peak memory** of one warm step with `course_lib.memory.measure_peak` (the allocator's record: parameters' gradients, saved activations, temporaries), the **median step time**, and the **test accuracy** at the end. Under DDP it reports the worst rank. Each process uses one thread, so one process and two DDP ranks compare fairly on two cores.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/capstone_train.py
"""Train an MLP on the digits with optional bf16 autocast, activation checkpointing, gradient accumulation and DDP.

  python capstone_train.py [--amp] [--checkpoint] [--accum K]            one process
  torchrun --nproc_per_node=2 capstone_train.py --ddp [--amp] ...        DDP, one process per rank
  --configs baseline,amp,ckpt+accum4,...   several configurations in turn (names as in the results)
"""
import argparse
import json
import os
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from course_lib.data import digits
from course_lib.memory import measure_peak


class MLP(nn.Module):
    """Residual MLP blocks (Linear -> ReLU -> Linear, 4x wider inside, as in a transformer)."""

    def __init__(self, hidden=64, depth=4):
        super().__init__()
        self.inp = nn.Linear(64, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.ReLU(), nn.Linear(4 * hidden, hidden))
                                    for _ in range(depth))
        self.out = nn.Linear(hidden, 10)
        self.use_checkpoint = False

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            # checkpointing: keep only each block's input; recompute its 4x wider inside during backward
            x = x + (checkpoint(block, x, use_reentrant=False) if self.use_checkpoint and self.training else block(x))
        return self.out(x)


def log(*parts):
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"[rank{rank}]:", *parts, flush=True)


def run(amp=False, use_checkpoint=False, accum=1, ddp=False, steps=30, batch=512, lr=0.05, hidden=64, depth=4):
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    if batch % (world * accum):
        raise ValueError(f"the global batch {batch} must split into {world} ranks x {accum} micro-batches")
    micro = batch // (world * accum)
    train, test = digits()
    x, y = train.flat(), train.y
    torch.manual_seed(0)
    model = MLP(hidden, depth)
    model.use_checkpoint = use_checkpoint
    net = DDP(model) if ddp else model
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else nullcontext
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))

    def step(s):
        start = (s * batch) % (len(y) - batch + 1)
        idx = order[start:start + batch]                    # the same global batch for every configuration
        mine = idx[rank * batch // world:(rank + 1) * batch // world]  # this rank's share (DDP)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accum):
            part = mine[k * micro:(k + 1) * micro]
            sync = nullcontext() if (not ddp or k == accum - 1) else net.no_sync()  # all-reduce once per step
            with sync:
                with autocast():
                    loss = F.cross_entropy(net(x[part]), y[part]) / accum  # mean over this rank's share
                loss.backward()
            total += loss.item()
        opt.step()
        return total

    times, losses = [], []
    for s in range(steps):
        if s == 1:  # a warm step (momentum buffers exist): measure its peak memory
            opt.zero_grad(set_to_none=True)  # free last step's gradients before the measurement starts
            mem = measure_peak(lambda: step(s))
            losses.append(mem.result)
            continue
        t = time.perf_counter()
        losses.append(step(s))
        times.append(time.perf_counter() - t)
    peak, step_s = float(mem.peak_bytes), statistics.median(times)
    if ddp:  # report the worst rank: the biggest memory and the slowest step set the limits
        worst = torch.tensor([peak, step_s], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        peak, step_s = worst.tolist()
    model.eval()
    with torch.no_grad():
        acc = (model(test.flat()).argmax(1) == test.y).float().mean().item()
    name = "+".join(n for n, on in (("amp", amp), ("ckpt", use_checkpoint), (f"accum{accum}", accum > 1), ("ddp", ddp)) if on) or "baseline"
    return {"config": name, "amp": amp, "checkpoint": use_checkpoint, "accum": accum, "world": world,
            "peak_mib": peak / 2**20, "step_ms": 1000 * step_s,
            "accuracy": acc, "final_loss": statistics.mean(losses[-5:])}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--amp", action="store_true", help="mixed precision: bf16 autocast on CPU")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing of each block")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel; launch with torchrun")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--configs", default=None, help="comma-separated configurations to run in turn, e.g. baseline,amp,ckpt+accum4")
    p.add_argument("--out", default=None, help="write the results (rank 0) to this JSON file")
    args = p.parse_args()
    torch.set_num_threads(1)  # one core per process: 1 process and 2 DDP ranks compare fairly on 2 cores
    if args.ddp:
        dist.init_process_group("gloo")  # rank, world size, address: from torchrun's environment
        log(f"LOCAL_RANK={os.environ['LOCAL_RANK']} of WORLD_SIZE={os.environ['WORLD_SIZE']}")
    combos = [(args.amp, args.checkpoint, args.accum)]
    if args.configs:
        combos = []
        for name in args.configs.split(","):
            parts = set(name.split("+")) - {"baseline"}
            accum = [int(q[5:]) for q in parts if q.startswith("accum")] or [1]
            if not parts <= {"amp", "ckpt", f"accum{accum[0]}"}:
                p.error(f"unknown configuration {name!r}: join amp, ckpt, accumK with '+', or say baseline")
            combos.append(("amp" in parts, "ckpt" in parts, accum[0]))
    results = []
    for amp, ckpt, accum in combos:
        r = run(amp, ckpt, accum, args.ddp, args.steps)
        log(f"{r['config']:<22} peak {r['peak_mib']:6.2f} MiB  step ~{r['step_ms']:.2f} ms  accuracy {r['accuracy']:.3f}")
        results.append(r)
    if args.ddp:
        dist.barrier()  # every rank done communicating before anyone tears the group down
        dist.destroy_process_group()
    if args.out and (not args.ddp or int(os.environ["RANK"]) == 0):
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Launch: one process, then DDP with `torchrun`

Two launches cover all the rows: the script runs several configurations in turn (`--configs`). The DDP one is started by `torchrun`, which sets `RANK`, `LOCAL_RANK` and `WORLD_SIZE` for each process; the script reads them from the environment (no `--local_rank` argument). Each launch writes its results as JSON; the live output is not echoed here because it holds timings.
"""

# %% slideshow={"slide_type": "-"}
SINGLE = "baseline,amp,ckpt,accum4,amp+ckpt,amp+ckpt+accum4"
DDP_CONFIGS = "baseline,amp,accum4,amp+ckpt+accum4"
single = run_script([sys.executable, "_runs/capstone_train.py", "--configs", SINGLE, "--out", "_runs/capstone_single.json"],
                    timeout=240, echo="none")
print("python _runs/capstone_train.py --configs", SINGLE)
ddp = run_torchrun("_runs/capstone_train.py", nproc_per_node=2, timeout=240, echo="none",
                   args=["--ddp", "--configs", DDP_CONFIGS, "--out", "_runs/capstone_ddp.json"])
print("torchrun --nproc_per_node=2 _runs/capstone_train.py --ddp --configs", DDP_CONFIGS)
assert "LOCAL_RANK=1 of WORLD_SIZE=2" in ddp.output(1)
print(f"wall time: one process ~{single.wall_time:.1f} s, torchrun ~{ddp.wall_time:.1f} s")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Results
"""

# %% slideshow={"slide_type": "-"}
rows = json.load(open("_runs/capstone_single.json")) + json.load(open("_runs/capstone_ddp.json"))
res = {r["config"]: r for r in rows}
def cpu_dependent(r, value, spec, width):
    """bf16 rows: the value depends on this CPU's bf16 kernels, so it is printed right after a '~'."""
    return f"{('~' if r['amp'] else '') + format(value, spec):>{width}}"


print(f"{'configuration':<22} {'processes':>9} {'peak MiB':>8} {'accuracy':>9}   step ms")
for r in rows:  # the timing goes last, right after '~', so its width cannot shift the other columns
    print(f"{r['config']:<22} {r['world']:>9} {cpu_dependent(r, r['peak_mib'], '.2f', 8)} "
          f"{cpu_dependent(r, r['accuracy'], '.3f', 9)}   ~{r['step_ms']:.1f}")

# %% slideshow={"slide_type": "-"}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
names = [r["config"] for r in rows]
colors = ["tab:blue" if r["world"] == 1 else "tab:green" for r in rows]
axes[0].barh(names, [r["peak_mib"] for r in rows], color=colors)
axes[0].set(xlabel="peak memory of one step (MiB, per process)", title="memory (green: 2 DDP ranks, worst rank)")
axes[1].barh(names, [r["step_ms"] for r in rows], color=colors)
axes[1].set(xlabel="median step time (ms)", title="time per optimizer step (2 shared CPU cores)")
for ax in axes:
    ax.invert_yaxis()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What the table shows. Memory is the allocator's record, the same on every run; for the float32 rows it is the same on every CPU too. The bf16 rows depend on how this CPU does bf16 (native instructions such as AVX-512 BF16 or AMX, or emulation through float32), whose kernels allocate different temporary buffers and round differently, so their peak and accuracy are printed after `~`: expect your numbers there to differ slightly. The assertions below hold on any CPU, and the cell prints each configuration's peak and step time as a ratio to the baseline:

- **Checkpointing** cuts the peak: each block's 4×-wide inside is no longer kept for backward. It costs a second forward of each block: about a third more compute for large layers, and far more on this tiny model, where every `checkpoint` call's fixed cost (stashing the RNG state, running the block's Python again) is comparable to the block's arithmetic. Notebook 04 measures and models that overhead; here it shows in the step-time ratio.
- **Accumulation** cuts the activation part of the peak in proportion to the micro-batch (a quarter of the batch, a quarter of the activations); the gradients and the step's temporaries stay. It pays with more, smaller, less efficient matmuls.
- **bf16 autocast** stores the saved activations in 2 bytes instead of 4; notebook 07 §4 counts them (exactly half) and shows why the total saved bytes fall less than that. Its step time depends on the hardware: notebook 07 §5 measures bf16 against float32 on your CPU, and on a GPU with tensor cores bf16 is the one technique here that also shortens the step. The ratio printed below is this machine's, after `~`.
- **DDP** gives each of the 2 ranks half of the batch, so each rank's activation memory drops too, but its model, gradients and optimizer state are full copies. It is the only technique here whose aim is speed: each process does half the work, plus one all-reduce per step. Whether that shows here depends on whether the two cores are free: other processes on the machine compete for them, so its step-time ratio is printed after `~` and not asserted.
- **Accuracy is the same** for every float32 configuration: they compute the same gradients up to rounding. bf16 rounds more and may differ in the last digit.
"""

# %% slideshow={"slide_type": "-"}
base = res["baseline"]
for name in ("ckpt", "accum4", "amp", "amp+ckpt+accum4"):
    assert res[name]["peak_mib"] < base["peak_mib"], name
assert res["amp+ckpt+accum4"]["peak_mib"] == min(r["peak_mib"] for r in rows if r["world"] == 1)
assert res["ddp"]["peak_mib"] < base["peak_mib"]
fp32 = [r["accuracy"] for r in rows if not r["amp"]]
assert max(fp32) - min(fp32) <= 0.01 and all(abs(r["accuracy"] - base["accuracy"]) <= 0.02 for r in rows)
for name in ("ckpt", "accum4", "amp", "amp+ckpt+accum4", "ddp"):
    ratio = res[name]["peak_mib"] / base["peak_mib"]
    print(f"{name:<16} peak memory x{'~' if res[name]['amp'] else ''}{ratio:.2f} of baseline, step time x~{res[name]['step_ms'] / base['step_ms']:.2f}")
print(f"test accuracy: float32 configurations {min(fp32):.3f}-{max(fp32):.3f}, baseline {base['accuracy']:.3f}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Plan a layout by counting, and check the count

Which technique, and how much of each, is arithmetic before it is an experiment. Practitioners size a run by counting two things:

- **memory per rank**: the model state (parameters, gradients, optimizer state; ZeRO shards it over the data-parallel ranks, tensor and pipeline parallelism split the parameters themselves) plus the activations of the micro-batches in flight;
- **time per step**: the model's FLOPs over the peak, plus the communication that nothing hides, plus the pipeline's bubble.

The course owns every piece, and `course_lib.planner` puts them together without a new formula: `course_lib.sharding.model_state_bytes` (notebook 13), `course_lib.tensor_parallel.tp_saved_bytes` and `tp_bytes_per_step` (notebook 15; the blocks' saved tensors are notebook 14's `block_saved_terms`), `course_lib.context_parallel.ring_attention_bytes`, `course_lib.pipeline.bubble_fraction` (notebook 12), the α-β model of `course_lib.comm_model` (notebook 09) and `course_lib.transformer.training_flops_per_token`. A `Layout` names the degrees (data, tensor, pipeline, context), the ZeRO stage, the micro-batch and accumulation, and the checkpointing; `predict` returns the bytes per rank and the seconds per step, part by part; `plan` ranks every layout that fits.

What it assumes is hidden: the data-parallel gradient all-reduce (ZeRO-2's reduce-scatters, ZeRO-3's all-gathers) overlaps the backward pass (ZeRO-3's gathers the whole step), so only what is longer than that counts. Tensor-parallel collectives, the context-parallel ring and the pipeline's sends sit on the critical path and count in full.
"""

# %% slideshow={"slide_type": "-"}
import dataclasses

from course_lib.comm_model import AlphaBeta
from course_lib.launch import run_ranks
from course_lib.planner import Cluster, Layout, PlanError, format_plan, plan, predict
from course_lib.sharding import Precision
from course_lib.transformer import PRESETS, TransformerConfig, param_count

# the tiny transformer of notebook 14, untied (tensor parallelism splits the embedding and the head apart)
# and with hand-written attention (so that selective checkpointing has its s^2 probabilities to drop)
TINY = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False, attention="naive")
SEQ, BATCH = 64, 16  # 16 sequences of 64 tokens per optimizer step, on every layout
# this machine as a "cluster" of CPU processes: nominal numbers, assumed (not measured): 5 GFLOP/s per process,
# gloo over loopback with 100 us per message and 2 GB/s
CPU = Cluster(devices_per_node=8, memory_bytes=2**30, peak_flops=5e9, intra=AlphaBeta(100e-6, 2e9), inter=AlphaBeta(100e-6, 2e9))
FP32_ADAM = Precision(4, 4, 8)  # float32 parameters and gradients, Adam's m and v
SHARDED_ADAM = Precision(4, 4, 12)  # + ShardedOptimizer's own float32 copy of its shard (like mixed precision's master weights)
LAYOUTS = {  # name: (processes of the launch, layout)
    "DDP": (4, Layout(data=4, micro_batch=4)),
    "ZeRO-1": (4, Layout(data=4, zero=1, micro_batch=4)),
    "DDP + full ckpt": (4, Layout(data=4, micro_batch=4, checkpointing="full")),
    "DDP + selective": (4, Layout(data=4, micro_batch=4, checkpointing="selective")),
    "DDP, 2 x accum 2": (4, Layout(data=4, micro_batch=2, accumulation=2)),
    "DDP on 8": (8, Layout(data=8, micro_batch=2)),
    "TP 2 x DP 4": (8, Layout(data=4, tensor=2, micro_batch=4)),
}
predicted = {name: predict(TINY, CPU, lay, seq_len=SEQ, global_batch=BATCH, precision=SHARDED_ADAM if lay.zero else FP32_ADAM)
             for name, (_, lay) in LAYOUTS.items()}
print(f"{TINY.describe()}\n{param_count(TINY):,} parameters; global batch {BATCH} x {SEQ} tokens")
print(f"this machine, assumed: {CPU.peak_flops / 1e9:g} GFLOP/s per process, links of {CPU.intra.alpha * 1e6:g} µs per message"
      f" and {CPU.intra.beta / 1e9:g} GB/s\n")
print(f"{'layout':<17}" + "".join(f"{k:>17}" for k in predicted["DDP"].memory) + f"{'step ms':>9}")
for name, p in predicted.items():
    print(f"{name:<17}" + "".join(f"{v:>17,}" for v in p.memory.values()) + f"{1e3 * p.step_time:>9.1f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Checked here: seven layouts on 4 and 8 processes

The script below runs each layout for real on the tiny transformer: DDP (its gradients views of its buckets, so there is no second copy), ZeRO-1 (`course_lib.sharded_optim.ShardedOptimizer`, sharded by element), full and selective checkpointing, a smaller micro-batch with accumulation, and tensor parallelism (`course_lib.tensor_parallel`, notebook 15) on pairs of ranks with data parallelism across the pairs. One launch per process count runs its layouts in turn. Each rank counts what it holds exactly, as notebook 13 does: the model state from the tensors themselves (`course_lib.memory.state_bytes`; Adam's 0-d step counters, 4 bytes per tensor, left out as the model leaves them out), the activations with `course_lib.saved_tensors.SavedTensorMeter` around one micro-batch's forward (parameters and the rotary tables, which are model buffers, excluded). Step times are the median of three steps, after `~`.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/capstone_layouts.py
"""Run transformer layouts for real on the CPU ranks of one launch; count each rank's bytes exactly."""
import dataclasses
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.memory import state_bytes
from course_lib.saved_tensors import SavedTensorMeter
from course_lib.sharded_optim import ShardedOptimizer
from course_lib.tensor_parallel import parallelize_transformer_, tensor_parallel_loss
from course_lib.transformer import Transformer


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def run_layout(rank, world, config, lay, groups, seq_len, global_batch, steps):
    T, D, mb, accum = lay["tensor"], lay["data"], lay["micro_batch"], lay["accumulation"]
    tp_group, dp_group = groups[T]["tp"], groups[T]["dp"]
    dp_rank = rank // T
    config = dataclasses.replace(config, checkpointing=lay["checkpointing"])
    model = Transformer(config, seed=0)
    if T > 1:
        parallelize_transformer_(model, tp_group)
        net = model
    else:
        net = DDP(model, gradient_as_bucket_view=True)  # gradients are views of DDP's buckets: no second copy
    if lay["zero"] == 1:
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, shard_by="element", group=dp_group, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randint(0, config.vocab_size, (global_batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    mine = data[dp_rank * mb * accum:(dp_rank + 1) * mb * accum]

    def forward(k):
        part = mine[k * mb:(k + 1) * mb]
        ids, tg = part[:, :-1].clone(), part[:, 1:].clone()  # their own storage, as a data loader's batch
        if T > 1:
            return tensor_parallel_loss(model, ids, tg)
        logits = net(ids)  # DDP's forward (its hooks), the loss as Transformer.loss computes it
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tg.flatten())

    def step():
        opt.zero_grad(set_to_none=False)
        for k in range(accum):
            sync = net.no_sync() if (T == 1 and k < accum - 1) else nullcontext()
            with sync:
                (forward(k) / accum).backward()
        if T > 1:  # data parallel by hand across the tp groups' twins
            for p in model.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= D
        opt.step()

    step()  # warm: gradients and optimizer state exist
    with SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:  # rotary tables: model's
        loss = forward(0)
    loss.backward()  # frees what the meter saw
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    st = state_bytes(model, opt.optim if isinstance(opt, ShardedOptimizer) else opt)
    scalars = 0
    inner = opt.optim if isinstance(opt, ShardedOptimizer) else opt
    for s in inner.state.values():  # Adam's step counters: one 0-d float per tensor, left out as the model does
        scalars += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() == 0)
    optimizer = st.optimizer_state - scalars
    if isinstance(opt, ShardedOptimizer):  # its shard's own float32 copy of the parameters: optimizer state too
        optimizer += nbytes(p for g in opt.optim.param_groups for p in g["params"])
    return {"name": lay["name"], "parameters": st.parameters, "gradients": st.gradients, "optimizer state": optimizer,
            "activations": meter.bytes, "step_s": statistics.median(times)}


def measure(rank, world, config, layouts, seq_len, global_batch, steps=3):
    torch.set_num_threads(1)
    groups = {}
    for T in sorted({lay["tensor"] for lay in layouts}):  # every rank creates every group, in the same order
        tps = [dist.new_group(list(range(d * T, (d + 1) * T))) for d in range(world // T)]
        dps = [dist.new_group(list(range(t, world, T))) for t in range(T)]
        groups[T] = {"tp": tps[rank // T], "dp": dps[rank % T]}
    return [run_layout(rank, world, config, lay, groups, seq_len, global_batch, steps) for lay in layouts]


# %% slideshow={"slide_type": "-"}
def spec(name, lay):
    return {"name": name, "data": lay.data, "tensor": lay.tensor, "zero": lay.zero, "micro_batch": lay.micro_batch,
            "accumulation": lay.accumulation, "checkpointing": lay.checkpointing}


measured = {}
for world in (4, 8):
    group = [spec(name, lay) for name, (n, lay) in LAYOUTS.items() if n == world]
    ranks = run_ranks("_runs/capstone_layouts.py:measure", nprocs=world, args=(TINY, group, SEQ, BATCH), timeout=600, echo="none")
    for i, row in enumerate(ranks[0]):
        worst = {k: max(r[i][k] for r in ranks) for k in ("parameters", "gradients", "optimizer state", "activations")}
        worst["step_s"] = max(r[i]["step_s"] for r in ranks)  # the slowest rank sets the step
        measured[row["name"]] = worst
print(f"{'layout':<17} {'part':<16} {'predicted':>10} {'measured':>10} {'error':>8}")
worst_error = 0.0
for name, p in predicted.items():
    for part in ("parameters", "gradients", "optimizer state", "activations"):
        pred, meas = p.memory[part], measured[name][part]
        error = (pred - meas) / meas
        worst_error = max(worst_error, abs(error))
        print(f"{name:<17} {part:<16} {pred:>10,} {meas:>10,} {error:>+8.2%}")
assert worst_error <= 0.05
print(f"every part of every layout within 5%: largest error {worst_error:.2%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every data-parallel row matches to the byte: the model state is `model_state_bytes` of the rank's parameters (ZeRO-1's optimizer state is `ceil(Ψ / 4)` elements of the padded flat shard: m, v and the shard's own copy), and the activations are notebook 14's count. Under tensor parallelism the parameters, gradients and optimizer state match exactly too (the blocks, the embedding and the head split in two, the norms whole); its activations are 0.06% over the prediction: the vocabulary-parallel embedding and loss keep masks and local targets that the planner leaves out. Full checkpointing's row is what a rank holds after its forward (each block's input); in backward one recomputed block comes on top, the planner's "recompute buffer".

Now the step times. The prediction is FLOPs over a nominal peak plus the unhidden communication; the measurement is this loaded machine's. Each launch's layouts are ranked by both (1 = fastest):
"""

# %% slideshow={"slide_type": "-"}
for world in (4, 8):
    names = [name for name, (n, _) in LAYOUTS.items() if n == world]
    by_pred = sorted(names, key=lambda n: predicted[n].step_time)
    by_meas = sorted(names, key=lambda n: measured[n]["step_s"])
    print(f"{world} processes: {'layout':<17} {'predicted ms':>12} {'rank':>5}   measured ms, rank")
    for name in names:
        tied = sum(predicted[n].step_time < predicted[name].step_time - 1e-12 for n in names) + 1
        print(f"{'':<13}{name:<17} {1e3 * predicted[name].step_time:>12.1f} {tied:>5}   "
              f"~{1e3 * measured[name]['step_s']:.1f}, ~{by_meas.index(name) + 1}")
    base = names[0]
    for name in names[1:]:
        ratio = predicted[name].step_time / predicted[base].step_time
        print(f"{'':<13}{name} / {base}: predicted x{ratio:.2f} ({'slower' if ratio > 1 + 1e-9 else 'the same'}), "
              f"measured x~{measured[name]['step_s'] / measured[base]['step_s']:.2f}")
assert predicted["DDP + full ckpt"].step_time > predicted["DDP"].step_time  # one more forward: +1/3 of the FLOPs
assert predicted["TP 2 x DP 4"].step_time > predicted["DDP on 8"].step_time  # its collectives are on the critical path

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Where the orders differ, and why. The planner counts FLOPs and bytes; on two shared CPU cores a model of 0.13 M parameters is dominated by what it does not count:

- **accumulation** and **ZeRO-1** tie with DDP in the prediction (the same FLOPs; the extra communication is assumed hidden). Measured, accumulation pays each micro-batch's fixed cost (Python, kernel calls, one more forward and backward) twice, and ZeRO-1's parameter all-gather and copies run on the same CPU cores as the compute: on a CPU nothing overlaps for free.
- **Selective checkpointing** is predicted a few percent slower (attention proper recomputed); measured, its extra Python per block costs more than its arithmetic, as notebook 04 showed for small layers.
- **Tensor parallelism** is predicted a little slower than DDP on 8 (a ring all-reduce of 2 steps for each of its 13 collectives per micro-batch, at 100 µs per message); measured, it is several times slower on this machine (the ratio above): 8 processes on 2 cores wait for each other at every one of those collectives, and each waits for the slowest.

On a GPU cluster the compute term dominates and the prediction is closer; the memory is what the planner gets exactly, and memory decides what fits. That is why only the memory is asserted here.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### Applied there: Llama 3 on H100s

The same planner on published models and hardware. The specifications, with their sources:

- **H100 SXM** (NVIDIA H100 Tensor Core GPU datasheet): 80 GB of HBM3; 989 TFLOP/s dense bf16 (the datasheet's 1,979 is with 2:4 sparsity); NVLink 900 GB/s per GPU in total, so 450 GB/s each way.
- **A node** (NVIDIA DGX H100 user guide): 8 H100s on NVLink, one 400 Gb/s InfiniBand port (ConnectX-7) per GPU: 50 GB/s each way between nodes.
- **Latencies** α: assumed 5 µs inside a node and 10 µs between nodes (an order of magnitude, not a datasheet number).
- **Models** (Llama Team, *The Llama 3 Herd of Models*, arXiv:2407.21783, Table 3): 8B (32 layers, width 4,096, FFN 14,336, 32 heads), 70B (80 layers, 8,192, 28,672, 64 heads), 405B (126 layers, 16,384, 53,248, 128 heads), all with 8 key/value heads and a 128K vocabulary; 8,192-token sequences in pre-training.
- **The published layout** (same paper, Table 4): the 405B model on 8,192 GPUs with TP 8, CP 1, PP 16, DP 64, sequences of 8,192 tokens, 16M tokens per batch, 430 TFLOP/s per GPU (43% bf16 MFU).

The planner needs equal pipeline stages: for the 405B model it plans a 128-layer twin (1.6% more parameters), since 126 layers do not split into 16 equal stages (the paper gives its first and last stages one layer fewer). Its FLOPs run at the full peak (`efficiency=1.0`), so its MFU is an upper bound.
"""

# %% slideshow={"slide_type": "-"}
H100 = dict(devices_per_node=8, memory_bytes=80 * 10**9, peak_flops=989e12,
            intra=AlphaBeta(5e-6, 450e9), inter=AlphaBeta(10e-6, 50e9))
LLAMA3 = dict(vocab_size=128256, n_kv_heads=8, max_seq_len=8192, tie_embeddings=False, rope_theta=500000.0)
MODELS = {
    "Llama 3 8B": PRESETS["llama3-8b"],
    "Llama 3 70B": TransformerConfig(d_model=8192, n_layers=80, n_heads=64, d_ff=28672, **LLAMA3),
    "Llama 3 405B (128 layers)": TransformerConfig(d_model=16384, n_layers=128, n_heads=128, d_ff=53248, **LLAMA3),
}
full_405b = dataclasses.replace(MODELS["Llama 3 405B (128 layers)"], n_layers=126)
print(f"the 128-layer twin of the 405B model: {param_count(MODELS['Llama 3 405B (128 layers)']) / param_count(full_405b) - 1:.1%}"
      f" more parameters than the 126 layers ({param_count(full_405b) / 1e9:.1f}B)\n")
CASES = [("Llama 3 8B", 1, 64), ("Llama 3 8B", 8, 512), ("Llama 3 70B", 64, 1024), ("Llama 3 405B (128 layers)", 1024, 2048)]
plans = {}
for model, nodes, batch in CASES:
    gpus = 8 * nodes
    plans[model, gpus] = plan(MODELS[model], Cluster(nodes=nodes, **H100), global_batch=batch, seq_len=8192)
    print(f"{model}, {param_count(MODELS[model]) / 1e9:.1f}B parameters, on {gpus} H100s, {batch} sequences of 8192 per step:")
    print(format_plan(plans[model, gpus], top=3), end="\n\n")

# %% slideshow={"slide_type": "-"}
l405 = MODELS["Llama 3 405B (128 layers)"]
ours = plans["Llama 3 405B (128 layers)", 8192]
degrees = lambda lay: (lay.data, lay.tensor, lay.pipeline, lay.context)  # noqa: E731
same = [(i, p) for i, p in enumerate(ours, 1) if degrees(p.layout) == (64, 8, 16, 1)]  # Table 4's degrees
position, theirs = same[0]
print(f"published degrees (Table 4): DP 64 x TP 8 x PP 16 x CP 1; {len(same)} of the planner's {len(ours)} feasible layouts have them")
print(f"  their checkpointing: {sorted({p.layout.checkpointing for _, p in same})}; ZeRO stages {sorted(p.layout.zero for _, p in same)}")
print(f"  the best of them: {theirs.layout.describe()}, rank {position}")
print(f"  predicted {theirs.memory_total / 2**30:.1f} GiB per rank, step {theirs.step_time:.2f} s, MFU at most {theirs.mfu:.0%}")
print("  time by part:", ", ".join(f"{k} {v:.2f} s" for k, v in theirs.time.items() if v))
print(f"planner's first: {ours[0].layout.describe()}")
print(f"  predicted {ours[0].memory_total / 2**30:.1f} GiB per rank, step {ours[0].step_time:.2f} s, MFU at most {ours[0].mfu:.0%}")
print("  time by part:", ", ".join(f"{k} {v:.2f} s" for k, v in ours[0].time.items() if v))
print(f"published: 430 TFLOP/s per GPU, {430 / 989:.0%} of the dense peak (the paper reports 43% MFU)")
assert ours[0].step_time <= theirs.step_time

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What the comparison shows. The published degrees fit, but only with checkpointing that the planner adds to keep the 16 micro-batches a 1F1B pipeline holds in flight on its first stage inside 80 GB; their predicted time is compute plus the pipeline bubble plus TP's collectives. The planner prefers fewer tensor-parallel ranks, more context parallelism and very deep pipelines with many micro-batches, because in its model

- a matrix product costs its FLOPs over the peak whatever its size: it does not see that splitting a layer 8 ways or a model into 1-layer stages makes each product smaller and less efficient, nor the fixed cost of every micro-batch and stage;
- the context-parallel ring moves only the 8 key/value heads (grouped-query attention makes it cheap) and is assumed perfectly balanced;
- TP 8 inside a node pays its 4 all-reduces per block at NVLink's full bandwidth on the critical path, which the published run overlaps in part.

For the published degrees themselves the planner predicts an MFU of at most 46%, and the run measured 43%: where the model is told the layout, its arithmetic lands close. The paper chose TP 8 and PP 16 from measured throughput, and CP only for the 128K-token stage (its Table 4 switches to CP 16 there). The planner is the first cut, not the last: it tells you what fits and roughly what it costs; the last few choices are made by measuring, as this notebook's checked section does for memory.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
### Your numbers

The planner, for your model and your cluster. Choose a model, the number of GPUs, what each has and the batch; it prints the five fastest layouts that fit, or why none does. The static version after it prints the same text for two cases. The short table after that says which technique answers which bottleneck; the planner's columns are the numbers behind it.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets
from IPython.display import display

CHOICES = {"tiny (this notebook)": TINY, **MODELS}


def advise(model, gpus, gpus_per_node, memory_gb, tflops, nvlink_gb_s, network_gb_s, batch, seq_len):
    """The planner's five fastest layouts for these numbers, or why nothing fits."""
    config = CHOICES[model]
    if gpus % gpus_per_node:
        return f"{gpus} GPUs do not make whole nodes of {gpus_per_node}"
    cluster = Cluster(gpus_per_node, int(memory_gb * 1e9), tflops * 1e12, AlphaBeta(5e-6, nvlink_gb_s * 1e9),
                      AlphaBeta(10e-6, network_gb_s * 1e9), nodes=gpus // gpus_per_node)
    try:
        return f"{model} on {gpus} GPUs, {batch} x {seq_len} tokens per step:\n" + format_plan(
            plan(config, cluster, global_batch=batch, seq_len=seq_len, precision="mixed_adam"), top=5)
    except (PlanError, ValueError) as e:
        return f"{model} on {gpus} GPUs: {e}"


knobs = dict(
    model=widgets.Dropdown(options=list(CHOICES), value="Llama 3 8B", description="model:"),
    gpus=widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=8, description="GPUs:"),
    gpus_per_node=widgets.Dropdown(options=[1, 2, 4, 8], value=8, description="per node:"),
    memory_gb=widgets.FloatText(value=80.0, description="GB each:"),
    tflops=widgets.FloatText(value=989.0, description="TFLOP/s:"),
    nvlink_gb_s=widgets.FloatText(value=450.0, description="node GB/s:"),
    network_gb_s=widgets.FloatText(value=50.0, description="net GB/s:"),
    batch=widgets.IntText(value=64, description="batch:"),
    seq_len=widgets.IntText(value=8192, description="seq len:"),
)
advice = widgets.Output()


def refresh(change=None):
    advice.outputs = ()
    advice.append_stdout(advise(**{k: w.value for k, w in knobs.items()}) + "\n")


for w in knobs.values():
    w.observe(refresh, names="value")
refresh()
display(widgets.VBox([*knobs.values(), advice]))

# %% slideshow={"slide_type": "fragment"}
# static fallback: the same text for two cases (one that fits, one that does not)
print(advise("Llama 3 8B", 8, 8, 80.0, 989.0, 450.0, 50.0, 64, 8192), end="\n\n")
print(advise("Llama 3 70B", 8, 8, 80.0, 989.0, 450.0, 50.0, 8, 8192))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The short version, by bottleneck (find it first: notebook 04's memory measurement, a profiler for time):

<!-- BEGIN generated: facts-remedies -->
| bottleneck | first remedy | what it costs | shown |
|---|---|---|---|
| activations do not fit (deep or wide model, long sequences) | activation checkpointing (selective: recompute the cheap ops) | up to one extra forward per step (about +30% compute at scale; more for small layers, notebook 04) | peak down, step slower (above; notebook 04) |
| the wanted batch does not fit on your one device | gradient accumulation | more, smaller steps; BatchNorm and batch-coupled losses see micro-batches | peak down in proportion (above; notebook 08) |
| memory and speed on a device with bf16/fp16 matrix units | mixed precision: bf16 autocast (fp16 + `GradScaler` where bf16 is missing) | rounding; loss scaling for fp16 | activations halved (above; notebook 07) |
| the model fits, training takes too long, you have several devices | DDP (`torchrun`) | one all-reduce of the gradients per step, mostly overlapped | per-rank batch halved (above); notebooks 10, 11 |
| the parameters + gradients + optimizer state do not fit one device | sharded data parallel: ZeRO-1/2 (optimizer state, gradients), then FSDP (`fully_shard`, ZeRO-3) | more communication (ZeRO-3: 1.5x DDP's bytes); a sharded checkpoint format | notebook 13 |
| sharding is not enough: one layer's parameters or activations do not fit, or links between nodes are slow | pipeline (between layers, across nodes) and tensor parallel (inside layers, within a node) | the bubble; communication inside every layer | notebook 12 |
<!-- END generated -->

They combine: the last single-process row of section 3 uses three at once and has the smallest peak, and the big training runs use all of them together, in the proportions the planner's arithmetic suggests.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Cheat sheet: the source posts' APIs and today's

| the source posts write | PyTorch 2.13 | why |
|---|---|---|
| `Variable(x, requires_grad=True)` | `x.requires_grad_()` or `torch.tensor(..., requires_grad=True)` | `Variable` merged into `Tensor` in 0.4; it now just returns a tensor |
| `ctx.saved_variables` | `ctx.saved_tensors` | deprecated alias, warns |
| `from apex import amp`; `amp.initialize(model, opt, opt_level="O1")`; `with amp.scale_loss(loss, opt)` | `torch.autocast(device_type, dtype)` + `torch.amp.GradScaler(device)` | autocast is built in; Apex's amp is retired |
| `torch.cuda.amp.autocast()`, `torch.cuda.amp.GradScaler()` | `torch.autocast("cuda", ...)`, `torch.amp.GradScaler("cuda")` | device-generic; the old names warn (`FutureWarning`) |
| `model.half()` for "mixed" precision | `torch.autocast` (weights stay float32) | pure fp16 weights lose small updates |
| `checkpoint(fn, x)` | `checkpoint(fn, x, use_reentrant=False)` | the reentrant default is deprecated and warns |
| `python -m torch.distributed.launch --nproc_per_node=N` | `torchrun --nproc_per_node=N` | the old launcher is deprecated |
| `parser.add_argument("--local_rank")` | `int(os.environ["LOCAL_RANK"])` | torchrun passes no argument; the old launcher now passes `--local-rank` |
| `nn.DataParallel(model)` | `DistributedDataParallel` | one process per device, no GIL, multi-node |
| `dist.allreduce`, `dist.allgather` | `dist.all_reduce`, `dist.all_gather` | the source posts' names never existed |
| `init_process_group("nccl")` everywhere | `"gloo"` on CPU, `"nccl"` on GPUs | NCCL needs CUDA |
| `x.cuda()`, `model.cuda(0)` | `x.to(device)` with `device = torch.device(...)` | runs on any device |
| `torch.load(path)` | `torch.load(path, weights_only=True)` (the default since 2.6) | unpickling arbitrary objects runs code |
| `loss.backward(retain_graph=True)` "to keep gradients" | `loss.backward()` | gradients accumulate anyway; retain only keeps the graph |

Each replacement, run (the GPU-only ones in their CPU form):
"""

# %% slideshow={"slide_type": "-"}
from torch.autograd import Variable

v = Variable(torch.ones(3), requires_grad=True)
assert type(v) is torch.Tensor and v.requires_grad  # Variable(...) just gives a Tensor
w = torch.ones(3).requires_grad_()
print("Variable(...) is a", type(v).__name__, "| today: torch.ones(3).requires_grad_() ->", w.requires_grad)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # not ctx.saved_variables
        return 2 * x * grad


xg = torch.randn(4, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(Square.apply, (xg,))
print("custom Function with ctx.saved_tensors passes gradcheck")

# %% slideshow={"slide_type": "-"}
with expect_error(ModuleNotFoundError, match="apex"):
    import apex  # noqa: F401  (NVIDIA's Apex is not part of PyTorch and not installed)

seed_everything(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
xb, yb = torch.randn(16, 64), torch.randint(0, 10, (16,))
with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16: float32's range, no loss scaling
    out = model(xb)
    loss = F.cross_entropy(out, yb)
loss.backward()  # backward outside the autocast region
opt.step()
assert out.dtype == torch.bfloat16 and model[0].weight.dtype == torch.float32
print(f"bf16 autocast: activations {out.dtype}, weights {model[0].weight.dtype}, no scaler")

opt.zero_grad()
scaler = torch.amp.GradScaler("cpu")  # float16 needs loss scaling (notebook 06)
with torch.autocast("cpu", dtype=torch.float16):
    out = model(xb)
    loss = F.cross_entropy(out, yb)
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
assert out.dtype == torch.float16
print(f"fp16 autocast: activations {out.dtype}, with torch.amp.GradScaler('cpu'), scale now {scaler.get_scale():.0f}")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.GradScaler()
    torch.cuda.amp.autocast()
future = [str(c.message).split(". ")[0] for c in caught if c.category is FutureWarning]
print("\n".join(future))
assert len(future) == 2

# %% slideshow={"slide_type": "-"}
from torch.utils.checkpoint import checkpoint

block = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
xc = torch.randn(4, 8, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint(block, xc)  # the old call
print("checkpoint without use_reentrant warns:", str(caught[0].message).split(". ")[0])
checkpoint(block, xc, use_reentrant=False).sum().backward()
print("checkpoint(..., use_reentrant=False): gradient of the input", tuple(xc.grad.shape))

device = torch.device("cpu")  # a choice; a script takes it as an argument, e.g. --device cuda
moved = model.to(device)  # instead of .cuda(): the same line runs on any device
print("model.to(device) ->", next(moved.parameters()).device)

torch.save(model.state_dict(), "_runs/cheat_sheet_model.pt")
state = torch.load("_runs/cheat_sheet_model.pt", weights_only=True)
model.load_state_dict(state)
print("torch.load(..., weights_only=True):", len(state), "tensors loaded")


class RunConfig:  # any Python object that is not a tensor, a number, a string or a container of those
    lr = 0.1


torch.save({"model": model.state_dict(), "config": RunConfig()}, "_runs/cheat_sheet_pickle.pt")
with expect_error(pickle.UnpicklingError, match="default value of the `weights_only` argument", quiet=True) as refused:
    torch.load("_runs/cheat_sheet_pickle.pt")  # no argument: weights_only=True since 2.6, so the class is refused
print("torch.load(path) refused a pickled class:", str(refused.error).split(". ")[0])
print("its message says why:", next(line.strip() for line in str(refused.error).splitlines() if "2.6" in line).split(". ")[0])
full = torch.load("_runs/cheat_sheet_pickle.pt", weights_only=False)  # only for files you trust: it runs their code
print("with weights_only=False:", type(full["config"]).__name__, "unpickled")

assert hasattr(dist, "all_reduce") and not hasattr(dist, "allreduce") and not hasattr(dist, "allgather")
print("dist.all_reduce / dist.all_gather exist; allreduce / allgather do not")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The rest of the table ran in section 2: `torchrun` instead of `torch.distributed.launch`, `LOCAL_RANK` from the environment instead of `--local_rank` (asserted on rank 1's output), DDP instead of `DataParallel`, gloo on CPU. Notebook 10 shows the legacy launcher failing on the source posts' `--local_rank`.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- One script, four flags: autocast, checkpointing, accumulation and DDP change memory and time, not the result (same accuracy for every float32 configuration).
- Measured here: checkpointing, accumulation, bf16 autocast and DDP each lower the peak memory of a step (asserted, with their ratios to the baseline printed); checkpointing and accumulation pay with step time; bf16's step time depends on the hardware (notebook 07 §5); DDP lowers the per-rank batch and needs free devices to pay off.
- Choose by bottleneck: activations → checkpointing (or smaller micro-batches, bf16); batch → accumulation; time with more devices → DDP; model state too big → sharding (ZeRO, FSDP) first, then pipeline or tensor parallelism.
- Size a layout by counting: `course_lib.planner` adds up the course's formulas; on seven real layouts of the transformer (DDP, ZeRO-1, full and selective checkpointing, accumulation, tensor × data parallel) its memory per rank is within 5% of what the ranks hold (exact for every data-parallel one). Its time ranking is a first cut: on a CPU the fixed costs it does not count decide the order, and for Llama 3 405B it prefers layouts that the published run's measurements ruled out.
- Old code translates mechanically: `Variable` → tensors, `saved_variables` → `saved_tensors`, Apex / `torch.cuda.amp` → `torch.autocast` + `torch.amp.GradScaler`, `torch.distributed.launch --local_rank` → `torchrun` + `LOCAL_RANK`, `DataParallel` → DDP.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `effective_batch(micro, accum, world)`: how many samples go into one optimizer step with micro-batches of `micro`, `accum` accumulation steps and `world` DDP ranks. Combine two rules you have met: one optimizer step adds up the gradients of `accum` micro-batches (notebook 08), and DDP averages the gradients of every rank's batch (notebooks 09–10).
2. Fill in `choice`: for each bottleneck, the first technique to try, one of `TECHNIQUES`.
3. Write `tp_rank_params(config, n)`: how many parameters one of `n` tensor-parallel ranks holds for a `TransformerConfig` with an untied head, as `course_lib.tensor_parallel` splits it (section 4's "TP 2 x DP 4" row). `course_lib.transformer.param_counts(config)` gives the parts; decide which of them divide by `n`.
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

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.capstone import check_tp_rank_params


def tp_rank_params(config, n):
    raise NotImplementedError  # your code here: course_lib.transformer.param_counts(config) has the parts


print(check_tp_rank_params(tp_rank_params))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [Automatic mixed precision](https://pytorch.org/docs/stable/amp.html), [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html), [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), [torchrun](https://pytorch.org/docs/stable/elastic/run.html), [torch.load and weights_only](https://pytorch.org/docs/stable/generated/torch.load.html), [PyTorch 0.4 migration guide (Variable and Tensor merged)](https://pytorch.org/blog/pytorch-0_4_0-migration-guide/).
- P. Micikevicius et al., *Mixed Precision Training*, ICLR 2018, [arXiv:1710.03740](https://arxiv.org/abs/1710.03740).
- T. Chen et al., *Training Deep Nets with Sublinear Memory Cost*, 2016, [arXiv:1604.06174](https://arxiv.org/abs/1604.06174).
- Llama Team, AI @ Meta, *The Llama 3 Herd of Models*, 2024, [arXiv:2407.21783](https://arxiv.org/abs/2407.21783) (Table 3: model shapes; Table 4: the 405B run's parallel layouts).
- NVIDIA, [H100 Tensor Core GPU datasheet](https://www.nvidia.com/en-us/data-center/h100/) (80 GB HBM3, 989 TFLOP/s dense bf16, NVLink 900 GB/s) and [DGX H100 user guide](https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html) (8 GPUs per node, ConnectX-7 400 Gb/s per GPU).
- V. Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*, 2022, [arXiv:2205.05198](https://arxiv.org/abs/2205.05198) (selective recomputation, sequence parallelism).
- S. Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054) (sharding: notebook 13).
"""
