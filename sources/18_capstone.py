# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 18 · Capstone: one training script, every technique, measured

The course's techniques, side by side in one real training script: bf16 mixed precision (notebooks 06–07), activation checkpointing (04–05), gradient accumulation (08) and DistributedDataParallel (09–11). Each is a flag; the notebook launches the script (one plain process, then `torchrun` with two processes), collects what each combination costs and saves, and turns the numbers into a decision guide. It closes with a cheat sheet: the source posts' APIs next to today's, each replacement run.

By the end you will be able to:
- combine autocast, checkpointing, accumulation and DDP in one training loop without changing what it computes;
- measure peak memory, step time and accuracy for each combination and read the trade-offs;
- pick the technique for a bottleneck (activation memory, batch size, model size, time);
- translate old PyTorch code (`Variable`, `saved_variables`, `apex.amp`, `torch.cuda.amp`, `torch.distributed.launch`, `--local_rank`, ...) into the current API.

This notebook assumes: notebooks 04–13. It runs on 2 CPU cores (the numbers are this machine's; timings are marked `~`). No GPU needed.
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
## 4. Decision guide: which technique for which bottleneck

Find the bottleneck first (notebook 04's memory measurement, a profiler for time), then:

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

They combine: the last single-process row uses three at once and has the smallest peak, and the big training runs use all of them together.
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
- Old code translates mechanically: `Variable` → tensors, `saved_variables` → `saved_tensors`, Apex / `torch.cuda.amp` → `torch.autocast` + `torch.amp.GradScaler`, `torch.distributed.launch --local_rank` → `torchrun` + `LOCAL_RANK`, `DataParallel` → DDP.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `effective_batch(micro, accum, world)`: how many samples go into one optimizer step with micro-batches of `micro`, `accum` accumulation steps and `world` DDP ranks. Combine two rules you have met: one optimizer step adds up the gradients of `accum` micro-batches (notebook 08), and DDP averages the gradients of every rank's batch (notebooks 09–10).
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

- PyTorch docs: [Automatic mixed precision](https://pytorch.org/docs/stable/amp.html), [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html), [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), [torchrun](https://pytorch.org/docs/stable/elastic/run.html), [torch.load and weights_only](https://pytorch.org/docs/stable/generated/torch.load.html), [PyTorch 0.4 migration guide (Variable and Tensor merged)](https://pytorch.org/blog/pytorch-0_4_0-migration-guide/).
- P. Micikevicius et al., *Mixed Precision Training*, ICLR 2018, [arXiv:1710.03740](https://arxiv.org/abs/1710.03740).
- T. Chen et al., *Training Deep Nets with Sublinear Memory Cost*, 2016, [arXiv:1604.06174](https://arxiv.org/abs/1604.06174).
- S. Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054) (sharding: notebook 13).
"""
