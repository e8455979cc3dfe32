# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 13 · Model and pipeline parallelism: splitting one model across devices

Data parallelism (notebooks 09–11) copies the whole model to every device. When the model itself does not fit, it has to be **split**: by layers (pipeline parallelism) or inside a layer (tensor parallelism). Here a model is split for real across two CPU processes that pass activations forward and gradients backward with point-to-point messages, and the idle time this creates is drawn, computed and measured.

By the end you will be able to:
- split a model across devices (the cluster post's `split_gpus` network) and explain why the naive split keeps only one device busy at a time;
- write a two-stage pipeline by hand with `dist.send` / `dist.recv` and prove it trains exactly like one process;
- schedule micro-batches GPipe-style, draw the schedule, compute the bubble `(p-1)/(m+p-1)` and measure it;
- use PyTorch's own `torch.distributed.pipelining`, say what changes when the stages talk over NCCL, and say what the multi-GPU post's second "model parallel" example really does;
- split a `Linear` layer by output features (column-parallel) and by input features (row-parallel), and choose between data, pipeline and tensor parallelism.

This notebook assumes: notebooks 02 (autograd graphs), 08 (gradient accumulation: micro-batches whose gradients add up) and 11 (launching processes, gloo). No GPU needed: the stages are CPU processes; the one cell for two real GPUs says what it skipped.
"""

# %% slideshow={"slide_type": "-"}
import os
import sys
from datetime import timedelta

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.launch import free_port, run_ranks
from course_lib.pipeline import Task, bubble_fraction, gpipe_schedule, idle_fraction, min_micro_batches, plot_gantt
from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
sys.path.insert(0, os.path.abspath("_runs"))
train_split, _ = digits()
x_all, y_all = train_split.flat(), train_split.y  # 1438 digit images as 64-pixel vectors, labels 0..9
print(f"torch {torch.__version__.split('+')[0]}, gloo: {dist.is_gloo_available()}, data {tuple(x_all.shape)}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Splitting a model across devices

The cluster post's first case: the model is too big for one GPU, so put `module1` on GPU 0 and `module2` on GPU 1, and move the activation between them in `forward`. Written with device arguments instead of the post's hard-coded `.cuda(0)` / `.cuda(1)`, the same class runs on two GPUs or, with both devices `"cpu"`, here:
"""


# %% slideshow={"slide_type": "-"}
class TwoDeviceNet(nn.Module):
    """The cluster post's split_gpus network: first half on dev0, second half on dev1."""

    def __init__(self, dev0="cpu", dev1="cpu"):
        super().__init__()
        self.dev0, self.dev1 = torch.device(dev0), torch.device(dev1)
        self.module1 = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()).to(self.dev0)
        self.module2 = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)).to(self.dev1)

    def forward(self, x):
        x = self.module1(x.to(self.dev0))
        x = x.to(self.dev1)  # the activation crosses devices; autograd sends its gradient back
        return self.module2(x)


torch.manual_seed(0)
net = TwoDeviceNet()
n1 = sum(p.numel() for p in net.module1.parameters())
n2 = sum(p.numel() for p in net.module2.parameters())
print(f"module1: {n1} parameters on {net.dev0}, module2: {n2} on {net.dev1}: each device holds only its half")
print("output:", tuple(net(x_all[:5]).shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On two GPUs the same code places `module1` and `module2` on two devices. `x.to(dev1)` is recorded by autograd (`ToCopyBackward0`), so `backward()` copies the gradient back to GPU 0 by itself: nothing else changes in the training loop.
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("the split network on two real GPUs", count=2):
    torch.manual_seed(0)
    gpu_net = TwoDeviceNet("cuda:0", "cuda:1")
    out = gpu_net(x_all[:5])
    print("output on", out.device, "| module1 on", next(gpu_net.module1.parameters()).device)
    hidden = gpu_net.module1(x_all[:5].cuda(0)).to("cuda:1")
    print("the crossing is recorded:", type(hidden.grad_fn).__name__)
    out.sum().backward()
    print("module1's gradient lives on", gpu_net.module1[0].weight.grad.device)
    assert torch.allclose(out.cpu(), net(x_all[:5]), atol=1e-5)  # same weights (same seed), same function

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Why the naive split leaves devices idle

`forward` is sequential: GPU 1 waits while GPU 0 computes `module1`, then GPU 0 waits while GPU 1 computes `module2`, and backward runs the other way. Only one device works at any moment. The chart below is that schedule for 2 and 4 stages (forward `F` = 1 time slot, backward `B` = 2 slots, the usual ratio: backward computes gradients for both inputs and weights). The idle share is `(p-1)/p`: splitting a model over `p` devices buys memory, not speed.
"""

# %% slideshow={"slide_type": "-"}
fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), constrained_layout=True)
for ax, p in zip(axes, (2, 4)):
    naive = gpipe_schedule(p, 1, forward_time=1.0, backward_time=2.0)
    plot_gantt(naive, ax, title=f"naive split over {p} devices: idle {idle_fraction(naive):.0%} of device time")
    assert abs(idle_fraction(naive) - (p - 1) / p) < 1e-12
plt.show()
print("idle fraction of the naive split: 2 devices 50%, 4 devices 75%")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Two processes, one stage each: activations forward, gradients backward

Real model parallelism across machines (or across GPUs without a shared address space) is a message protocol. Process 0 holds the first half of the layers, process 1 the second half. Per step:

1. rank 0 computes its half and **sends the activation** `a` to rank 1 (`dist.send`);
2. rank 1 **receives** it into an empty tensor, marks it `requires_grad_()`, finishes the forward and the loss, and calls `backward()`; that fills `a.grad` = ∂loss/∂a;
3. rank 1 **sends `a.grad`** back; rank 0 receives it and calls `out.backward(grad)`: the chain rule across the process boundary;
4. each rank steps its own optimizer on its own parameters.

The file also splits the batch into `n_micro` micro-batches (section 3); with `n_micro=1` it is the plain split. Each micro-batch loss is scaled by its share of the batch so that the gradients add up to those of the full-batch mean (notebook 08).

Notebook 09 warned that a blocking gloo `dist.send` waits until the receiver has posted its `recv`, and that a ring of ranks that all send first deadlocks. Here plain blocking `send` is safe because the messages never form a cycle: in the forward, rank 1 starts by posting its `recv` and rank 0 sends; in the backward, rank 0 posts its `recv` and rank 1 sends. At every moment one side is receiving, so every `send` finds its partner. A chain of `p` stages keeps that property (each stage receives from the previous one before it sends to the next); the deadlock needs every rank to send before any receives.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/mp_stages.py
"""A model split over two processes: activations forward, gradients backward, over gloo."""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def make_model(width=64, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),  # stage 0
                         nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 10))              # stage 1


def split(model, rank):
    return model[:4] if rank == 0 else model[4:]


def pipeline_step(rank, stage, x, y, n_micro, events=None, t0=0.0, simulate=None):
    """One training step of the 2-stage pipeline, GPipe order: every forward, then every backward.

    events: if a list, gets (stage, micro, "F"/"B", start, end) of each task, seconds after t0.
    simulate=(f, b): each forward also sleeps f / n_micro s and each backward b / n_micro s,
    standing in for a device that computes while the CPU waits.
    """
    xs, ys = x.chunk(n_micro), y.chunk(n_micro)
    kept = []
    for i in range(n_micro):                                   # forwards, micro-batches in order
        if rank == 0:
            t = time.perf_counter()
            out = stage(xs[i])
            if simulate:
                time.sleep(simulate[0] / n_micro)
            e = time.perf_counter()
            dist.send(out.detach(), dst=1)                     # activation -> next stage
            kept.append(out)
        else:
            a = torch.empty(len(xs[i]), stage[0].in_features)
            dist.recv(a, src=0)
            a.requires_grad_()                                 # we want d loss / d activation
            t = time.perf_counter()
            loss = F.cross_entropy(stage(a), ys[i]) * len(ys[i]) / len(y)  # share of the batch mean
            if simulate:
                time.sleep(simulate[0] / n_micro)
            e = time.perf_counter()
            kept.append((a, loss))
        if events is not None:
            events.append((rank, i, "F", t - t0, e - t0))
    for i in reversed(range(n_micro)):                         # backwards, last micro-batch first
        if rank == 0:
            g = torch.empty_like(kept[i])
            dist.recv(g, src=1)                                # gradient <- next stage
            t = time.perf_counter()
            kept[i].backward(g)                                # chain rule across the process boundary
            if simulate:
                time.sleep(simulate[1] / n_micro)
            e = time.perf_counter()
        else:
            a, loss = kept[i]
            t = time.perf_counter()
            loss.backward()
            if simulate:
                time.sleep(simulate[1] / n_micro)
            e = time.perf_counter()
            dist.send(a.grad, dst=0)                           # d loss / d activation -> previous stage
        if events is not None:
            events.append((rank, i, "B", t - t0, e - t0))


def train(rank, world_size, x, y, steps=5, micro_list=(1, 4), lr=0.1):
    """Train the split model for a few steps per micro-batch count; return first gradients and final parameters."""
    torch.set_num_threads(1)
    results = {}
    for n_micro in micro_list:
        stage = split(make_model(), rank)
        opt = torch.optim.SGD(stage.parameters(), lr=lr)
        first_grads = None
        for _ in range(steps):
            opt.zero_grad()
            pipeline_step(rank, stage, x, y, n_micro)
            if first_grads is None:
                first_grads = {k: p.grad.clone() for k, p in stage.named_parameters()}
            opt.step()
        results[n_micro] = {"grads": first_grads, "params": {k: p.detach().clone() for k, p in stage.named_parameters()},
                            "n_params": sum(p.numel() for p in stage.parameters())}
    return results


def measure(rank, world_size, micro_list=(1, 2, 4, 8), width=64, batch=256, repeats=2, simulate=None):
    """Time GPipe steps for each number of micro-batches; return every task's (stage, micro, kind, start, end)."""
    torch.set_num_threads(1)
    stage = split(make_model(width), rank)
    torch.manual_seed(1)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    out = {}
    for m in micro_list:
        runs = []
        for r in range(repeats + 1):                           # run 0 warms up and is dropped
            events = []
            dist.barrier()                                     # both ranks start together
            t0 = time.perf_counter()                           # one clock: both processes share this machine
            pipeline_step(rank, stage, x, y, m, events, t0, simulate)
            stage.zero_grad()
            if r:
                runs.append(events)
        out[m] = runs
    return out


SIMULATED = (0.12, 0.24)  # seconds of simulated device time per stage and step: forward, backward (split over m)


def measure_both(rank, world_size, micro_list=(1, 2, 4, 8)):
    """The two settings of the notebook in one launch: simulated device time, then real compute."""
    return {"simulated": measure(rank, world_size, micro_list, 64, 256, 2, SIMULATED),
            "real": measure(rank, world_size, micro_list, 512, 512, 2, None)}


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The reference is one process training the whole model on the same batch. `run_ranks` (from `course_lib.launch`) starts two processes with a gloo group and returns what each rank's function returns.
"""

# %% slideshow={"slide_type": "-"}
from mp_stages import make_model, split

x_batch, y_batch = x_all[:256], y_all[:256]
two = run_ranks("_runs/mp_stages.py:train", nprocs=2, args=(x_batch, y_batch, 5, (1, 4)), timeout=180)

ref = make_model()
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    F.cross_entropy(ref(x_batch), y_batch).backward()
    if step == 0:
        ref_grads = {k: p.grad.clone() for k, p in ref.named_parameters()}
    opt.step()

for n_micro in (1, 4):
    worst = 0.0
    for rank in (0, 1):
        got = two[rank][n_micro]
        for k, p in split(ref, rank).named_parameters():
            assert torch.allclose(got["grads"][k], ref_grads[k], atol=1e-6)  # a slice keeps the layer names
            assert torch.allclose(got["params"][k], p.detach(), atol=1e-6)
            worst = max(worst, (got["params"][k] - p.detach()).abs().max().item())
    print(f"{n_micro} micro-batch(es): first-step gradients and parameters after 5 steps allclose to one process "
          f"(largest difference ~{worst:.0e})")
print(f"parameters held: rank 0 {two[0][1]['n_params']}, rank 1 {two[1][1]['n_params']}, "
      f"whole model {sum(p.numel() for p in ref.parameters())}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The differences are float rounding (sums taken in another order), not algorithm: the split is exact. Each process holds only its stage's parameters, gradients and optimizer state, which is the point of model parallelism.

What crossed the process boundary per micro-batch: one activation forward and one gradient of the same shape backward (`batch × width` floats). Compare data parallelism, which all-reduces every parameter's gradient each step: a pipeline sends little when the layers are wide and the activations at the cut are small.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 3. Pipelining with micro-batches (GPipe)

Split the batch into `m` micro-batches. As soon as stage 0 has finished the forward of micro-batch 0, stage 1 can start on it while stage 0 moves on to micro-batch 1. GPipe runs all forwards, then all backwards (in reverse order), and steps the optimizer once: gradients of the micro-batches add up, as in gradient accumulation, so the result equals the full-batch step (checked above for `m=4`).

The idle time left at the start and the end is the **bubble**. With `p` stages and equal task times, a step lasts `m + p - 1` slots (per direction) of which each stage works `m`:

$$\text{bubble} = \frac{p-1}{m+p-1}$$
"""

# %% slideshow={"slide_type": "-"}
fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), constrained_layout=True)
plot_gantt(gpipe_schedule(2, 4), axes[0], title=f"GPipe, 2 stages, 4 micro-batches: idle {bubble_fraction(2, 4):.0%}")
plot_gantt(gpipe_schedule(4, 8), axes[1], title=f"GPipe, 4 stages, 8 micro-batches: idle {bubble_fraction(4, 8):.0%}")
plt.show()
print(f"{'m':>3} | bubble p=2 | bubble p=4 | bubble p=8")
for m in (1, 2, 4, 8, 16, 32):
    sims = [idle_fraction(gpipe_schedule(p, m)) for p in (2, 4, 8)]
    assert all(abs(s - bubble_fraction(p, m)) < 1e-12 for s, p in zip(sims, (2, 4, 8)))
    print(f"{m:>3} | " + " | ".join(f"{s:10.3f}" for s in sims))
print("simulated schedules agree with (p-1)/(m+p-1); for p=4, a bubble <= 10% needs m >=", min_micro_batches(4, 0.1))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Measured on two processes

Now the real thing: the two processes of section 2 run GPipe steps for `m = 1, 2, 4, 8`, recording each task's start and end on the machine's monotonic clock (shared by both processes), and the idle fraction is computed from those timestamps. Two settings:

- **simulated device time**: each stage's forward of the whole batch takes 120 ms and its backward 240 ms (a `sleep` split evenly over micro-batches, as if a GPU computed while the CPU waits: the cell prints the two values), plus the real tiny model and the real messages;
- **real compute**: a wider model (width 512, batch 512) whose stages compute on one core each. On a 2-core machine the two stages then share the cores with everything else that runs.
"""

# %% slideshow={"slide_type": "-"}
from mp_stages import SIMULATED

both = run_ranks("_runs/mp_stages.py:measure_both", nprocs=2, timeout=180)
sim = [both[rank]["simulated"] for rank in (0, 1)]
real = [both[rank]["real"] for rank in (0, 1)]


def measured_tasks(results, m, run):
    return [Task(s, i, kind, start, end) for rank in (0, 1) for (s, i, kind, start, end) in results[rank][m][run]]


def replayed(tasks, m):
    """The bubble GPipe would have with these measured task times and free, instant messages."""
    mean = lambda stage, kind: sum(t.duration for t in tasks if (t.stage, t.kind) == (stage, kind)) / m
    return idle_fraction(gpipe_schedule(2, m, [mean(0, "F"), mean(1, "F")], [mean(0, "B"), mean(1, "B")]))


print(f"simulated device time per stage and step: forward {SIMULATED[0] * 1000:.0f} ms, "
      f"backward {SIMULATED[1] * 1000:.0f} ms, split evenly over the m micro-batches\n")
print(f"{'m':>3} | formula | simulated device time: measured (replayed) | real compute: measured (replayed)")
ms = [1, 2, 4, 8]
measured = {}
for m in ms:
    best = {}
    for name, results in (("sim", sim), ("real", real)):
        runs = [measured_tasks(results, m, r) for r in range(2)]
        tasks = min(runs, key=idle_fraction)                    # best of 2 runs: the least disturbed
        best[name] = (idle_fraction(tasks), replayed(tasks, m))
    measured[m] = (best["sim"][0], best["real"][0])
    print(f"{m:>3} | {bubble_fraction(2, m):7.3f} | ~{best['sim'][0]:.3f} (~{best['sim'][1]:.3f})"
          f"{'':>22} | ~{best['real'][0]:.3f} (~{best['real'][1]:.3f})")
curve = [measured[m][0] for m in ms]
falls = curve[0] > curve[1] > curve[2] and curve[3] < curve[1]
above = max(curve[i] - bubble_fraction(2, m) for i, m in enumerate(ms))
print(f"\nsimulated device time: the measured bubble falls with m (m=1 > m=2 > m=4, and m=8 below m=2): {falls}; "
      f"at most ~{above:.3f} above the formula")
assert falls and all(curve[i] > bubble_fraction(2, m) - 0.03 for i, m in enumerate(ms)) and above < 0.15

# %% slideshow={"slide_type": "-"}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), constrained_layout=True)
tasks4 = measured_tasks(sim, 4, 0)
plot_gantt([Task(t.stage, t.micro, t.kind, 1000 * t.start, 1000 * t.end) for t in tasks4], axes[0], time_unit="ms",
           title="measured: 2 processes, 4 micro-batches (simulated device time)")
axes[1].plot(ms, [bubble_fraction(2, m) for m in ms], "k-o", label="(p-1)/(m+p-1)")
axes[1].plot(ms, curve, "s--", label="measured, simulated device time")
axes[1].set(xscale="log", xticks=ms, xticklabels=ms, xlabel="micro-batches m", ylabel="idle fraction of device time",
            title="bubble of a 2-stage GPipe step", ylim=(0, 0.6))
axes[1].minorticks_off()
axes[1].legend(fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
How to read the numbers (yours will differ run to run). "Replayed" feeds each stage's measured average task times into the GPipe simulator of `course_lib.pipeline`, with messages that cost nothing: it is the bubble due to the schedule and to unequal stages alone; the measured value minus the replayed one is what the messages and the waiting cost.

- With simulated device time the measured bubble follows the formula down from 50% at `m=1`, as the cell asserts. What it adds on top is the **per-micro-batch cost**: each micro-batch is one more message each way, one more Python round of the loop, one more wake-up of a sleeping process. Those costs grow with `m` while the work per micro-batch shrinks, so the gap to the formula widens with `m` (on a busy machine most at `m=8`, where a micro-batch's forward is an eighth of the 120 ms), and past some `m` the bubble stops falling: `m` has an optimum. The stages sleep rather than compute so that the outcome holds on a loaded machine: a sleeping stage does not compete for a core. GPipe's authors (Huang et al. 2019) found the bubble overhead negligible for `m ≥ 4p`: by the formula that is a bubble below 20 % for every `p` (the cell after this list computes it).
- With real compute the two stages are processes competing for the same two cores, with everything else the machine runs; the plot leaves this column out, because it does not measure a pipeline's bubble. The replayed bubble is already above the formula (the stages are not equally fast, and the backward is not exactly twice the forward), and the measured one is far above that: every message makes one process wait for the other to be scheduled, and any other process steals a core from one stage and leaves the other waiting. From one run to the next it may even grow with `m`. The formula assumes dedicated devices with equal, fixed task times; on GPUs a related effect appears when micro-batches get too small to fill the device.

Two ways to state the bubble appear in the literature: as a fraction of the whole step, `(p-1)/(m+p-1)` (this notebook), or relative to the ideal compute time of `m` slots, `(p-1)/m` (Megatron-LM's paper and the Hugging Face ultrascale playbook). They count the same idle slots; the second is larger and reads as "extra time".
"""

# %% slideshow={"slide_type": "-"}
print(f"{'p':>3} | m = 4p | bubble of the step (p-1)/(m+p-1) | extra time (p-1)/m")
for p in (2, 4, 8, 16, 64):
    m = 4 * p
    of_step, extra = bubble_fraction(p, m), (p - 1) / m
    assert of_step < 0.2 and extra < 0.25 and abs(of_step - (p - 1) / (5 * p - 1)) < 1e-12
    print(f"{p:>3} | {m:>6} | {of_step:32.3f} | {extra:18.3f}")
print("m >= 4p keeps the bubble below 20% of the step (below 25% extra time) for any number of stages")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. PyTorch's own pipelining: `torch.distributed.pipelining`

PyTorch 2.13 ships the machinery we wrote by hand: `PipelineStage` wraps one stage's module (and does the sends and receives), and a schedule runs the micro-batches: `ScheduleGPipe`, `Schedule1F1B` (one forward, one backward: same bubble, fewer activations kept alive; simulated below), interleaved and zero-bubble variants. It works on CPU with gloo: the check below runs the same split model with `ScheduleGPipe` and 4 micro-batches and compares the gradients with one process on the full batch. The schedule averages the micro-batch losses' gradients itself (its `scale_grads=True` default), so the loss function is the plain mean cross-entropy.
"""

# %% slideshow={"slide_type": "-"}
import torch.distributed.pipelining as pipelining

print("schedules in torch.distributed.pipelining:", ", ".join(n for n in dir(pipelining) if n.startswith("Schedule")))

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/pp_api.py
import torch
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from mp_stages import make_model, split


def api_step(rank, world_size, x, y, n_micro=4):
    """One GPipe step of the split model with PyTorch's pipelining API; return this stage's gradients."""
    torch.set_num_threads(1)
    stage_module = split(make_model(), rank)
    stage = PipelineStage(stage_module, stage_index=rank, num_stages=world_size, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=F.cross_entropy)
    losses = []
    if rank == 0:
        schedule.step(x)                          # the first stage feeds the inputs
    else:
        schedule.step(target=y, losses=losses)    # the last stage gets the targets and computes the loss
    return {"grads": {k: p.grad.clone() for k, p in stage_module.named_parameters()},
            "losses": [loss.item() for loss in losses]}


# %% slideshow={"slide_type": "-"}
api = run_ranks("_runs/pp_api.py:api_step", nprocs=2, args=(x_batch, y_batch, 4), timeout=180)
for rank in (0, 1):
    for k, g in api[rank]["grads"].items():
        assert torch.allclose(g, ref_grads[k], atol=1e-6)
print("ScheduleGPipe, 2 stages x 4 micro-batches: gradients allclose to one process on the full batch")
print("micro-batch losses on the last stage:", [round(v, 4) for v in api[1]["losses"]])
assert abs(sum(api[1]["losses"]) / 4 - F.cross_entropy(make_model()(x_batch), y_batch).item()) < 1e-5

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**1F1B versus GPipe.** GPipe runs every forward before any backward, so at its peak each stage holds the activations of all `m` micro-batches. 1F1B, the schedule called PipeDream-Flush in D. Narayanan et al., *Memory-Efficient Pipeline-Parallel DNN Training* (ICML 2021), lets stage `s` of `p` run only `p - s` forwards ahead (the warm-up), then alternate one backward and one forward, so each backward frees a micro-batch's activations as early as possible. Only the order of work within each stage changes, not the dependencies. A small event simulation, with a forward costing 1 time unit and a backward 2, gives each schedule's step time and the most micro-batches whose activations a stage holds at once:
"""


# %% slideshow={"slide_type": "-"}
def stage_orders(p, m, kind, v=1):
    """Each stage's task order, (kind, chunk, i) for micro-batch i: kind "F" or "B" (for "zb-h1", B is the input
    gradient and "W" the weight gradient); chunk 0 except in "interleaved", whose stage s holds v chunks, chunk c
    being virtual stage c * p + s. Kinds: "gpipe", "1f1b", "interleaved" (1F1B over v chunks), "zb-h1"."""
    orders = []
    for s in range(p):
        if kind == "gpipe":
            orders.append([("F", 0, i) for i in range(m)] + [("B", 0, i) for i in reversed(range(m))])
        elif kind in ("1f1b", "zb-h1"):
            warm = min(p - s, m)  # forwards in flight before the first backward
            order, waiting = [("F", 0, i) for i in range(warm)], []
            for i in range(m):
                order.append(("B", 0, i))
                if kind == "zb-h1":  # stage s runs its weight gradients s micro-batches late
                    waiting.append(("W", 0, i))
                    if len(waiting) > s:
                        order.append(waiting.pop(0))
                if warm + i < m:
                    order.append(("F", 0, warm + i))
            orders.append(order + waiting)
        else:  # interleaved, Megatron-LM's order: the k-th forward runs chunk (k // p) % v on micro-batch
            total = m * v  # (k // (p v)) p + k % p; the k-th backward goes through the chunks in reverse
            fwd = [("F", (k // p) % v, k // (p * v) * p + k % p) for k in range(total)]
            bwd = [("B", v - 1 - (k // p) % v, k // (p * v) * p + k % p) for k in range(total)]
            warm = min((p - s - 1) * 2 + (v - 1) * p, total)
            order = fwd[:warm]
            for k in range(total - warm):
                order += [fwd[warm + k], bwd[k]]
            orders.append(order + bwd[total - warm:])
    return orders


def simulate(p, m, kind, f=1.0, b=2.0, v=1, w=0.0):
    """Run each stage's order under the dependencies; return the step time, each stage's peak of micro-batches in
    flight (forward done, backward, or W for "zb-h1", not yet) and when each task ends ({(stage, kind, chunk, i):
    end}). A chunk's F and B cost f / v and b / v; for "zb-h1", B costs b - w and W costs w."""
    orders, done, free = stage_orders(p, m, kind, v), {}, [0.0] * p
    cost = {"F": f / v, "B": (b - w) / v, "W": w}
    freed_by = "W" if kind == "zb-h1" else "B"
    pos, live, peak = [0] * p, [0] * p, [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind_, c, i = orders[s][pos[s]]
            k = c * p + s  # the virtual stage
            up, down = ((k - 1) % p, "F", (k - 1) // p, i), ((k + 1) % p, "B", (k + 1) // p, i)
            need = [up] if kind_ == "F" and k > 0 else []                # the activation from upstream
            need += [down] if kind_ == "B" and k < p * v - 1 else []     # the gradient from downstream
            need += [(s, "F", c, i)] if kind_ == "B" else []
            need += [(s, "B", c, i)] if kind_ == "W" else []             # W needs this stage's B
            if all(d in done for d in need):
                start = max([free[s]] + [done[d] for d in need])
                free[s] = done[(s, kind_, c, i)] = start + cost[kind_]
                live[s] += 1 if kind_ == "F" else -1 if kind_ == freed_by else 0
                peak[s] = max(peak[s], live[s])
                pos[s] += 1
                progressed = True
        assert progressed, "the schedule deadlocked"
    return max(free), peak, done


# the GPipe order here is what course_lib.pipeline.gpipe_schedule simulates: the two agree task by task
for p_, m_ in ((2, 1), (2, 4), (4, 8), (3, 5)):
    ends = {(t.stage, t.kind, 0, t.micro): t.end for t in gpipe_schedule(p_, m_, forward_time=1.0, backward_time=2.0)}
    assert simulate(p_, m_, "gpipe")[2] == ends
print("this simulator's GPipe = course_lib.pipeline.gpipe_schedule, every task's end time, for (p, m) in "
      "(2, 1), (2, 4), (4, 8), (3, 5): True")

p, m = 4, 8
t_g, peak_g, _ = simulate(p, m, "gpipe")
t_1, peak_1, _ = simulate(p, m, "1f1b")
print(f"p={p} stages, m={m} micro-batches: step time GPipe {t_g:.0f}, 1F1B {t_1:.0f} (units of one forward)")
print(f"micro-batches whose activations each stage holds at its peak: GPipe {peak_g}, 1F1B {peak_1}")
assert t_g == t_1 == (m + p - 1) * 3.0  # same step time, so the same bubble (p-1)/(m+p-1)
assert peak_g == [m] * p and peak_1 == [p - s for s in range(p)]

# %% [markdown] slideshow={"slide_type": "-"}
"""
Same step time, so the same bubble; but the first stage holds at most `p` micro-batches' activations instead of `m`, and the last stage only one. With `m ≥ 4p` micro-batches to keep the bubble small, that is the difference between activation memory growing with `m` and staying bounded by `p`, which is why real pipelines use 1F1B or its interleaved and zero-bubble successors.

The API also has a tracing front end, `pipeline(module, mb_args, split_spec={...: SplitPoint.BEGINNING})`, which cuts one `nn.Module` into stages automatically; the manual `PipelineStage` used here needs no tracing: each rank simply builds its own stage module.

**On GPUs** the stages pass tensors with NCCL, and three things change (notebook 12 §7 shows them on gloo, with a GPU cell for the first):
- NCCL's sends and receives are kernels queued on a CUDA stream: the Python call returns before the transfer has happened, so a stage whose partner never posts the matching receive does not stop where the bug is; the hang surfaces at the next synchronisation, or as the watchdog's timeout;
- the first send/receive between two ranks creates a communicator for that pair on the spot, and in a 1F1B steady state a stage sends an activation downstream while it receives a gradient from downstream: issued one by one in a different order on the two sides, such transfers can wait for each other. Schedules post a step's sends and receives together with `dist.batch_isend_irecv` (one NCCL group call, in which their order does not matter), as `torch.distributed.pipelining` does whenever a step both sends and receives;
- `device=` in `PipelineStage` must be the rank's own GPU (`torch.cuda.set_device(local_rank)` before anything else, as notebook 12 §6 recommends with `device_id=`).
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Interleaved and zero-bubble schedules.** 1F1B's bubble is still `(p - 1)/m` of the compute time: the warm-up and the cool-down each cost `p - 1` stages' worth of work. Two ways to shrink it:

- **Interleaved 1F1B** (Narayanan et al., SC 2021, the Megatron-LM paper): each rank holds `v` smaller chunks of the model instead of one block of consecutive layers, chunk `c` of rank `s` being virtual stage `c·p + s` (with `v = 2`, rank 0 holds the first chunk and the one halfway down the model). A chunk's forward and backward cost `1/v` of a stage's, so the warm-up and the cool-down shrink `v` times: bubble `(p - 1)/(v·m)`. The price: `v` times the point-to-point messages, and more activations in flight on the first ranks. Megatron-LM's order wants `m` to be a multiple of `p`.
- **Zero bubble, ZB-H1** (P. Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024): split each backward into **B**, the gradient with respect to the stage's input (what the stage before waits for), and **W**, the gradient with respect to its weights (which only the optimizer step needs). The B's then travel upstream without waiting for any W, and the W's fill what would be the cool-down's bubble. In ZB-H1, stage `s` runs each W `s` micro-batches after its B, so that every stage has at most `p` micro-batches in flight (forward done, W not yet), the first stage's peak under 1F1B. With F = B = W the bubble is a third of 1F1B's, `(p - 1)/(3m)`.

The simulator above runs both; a forward costs 1 and a backward 2, split as B = W = 1 for ZB-H1:
"""

# %% slideshow={"slide_type": "-"}
SCHEDULES = {  # name: (kind, the simulator's options, the bubble's formula in p and m)
    "1F1B": ("1f1b", {}, lambda p, m: (p - 1) / m),
    "interleaved, v=2": ("interleaved", {"v": 2}, lambda p, m: (p - 1) / (2 * m)),
    "interleaved, v=4": ("interleaved", {"v": 4}, lambda p, m: (p - 1) / (4 * m)),
    "ZB-H1, F = B = W": ("zb-h1", {"w": 1.0}, lambda p, m: (p - 1) / (3 * m)),
}
p, m = 4, 8
compute = 3.0 * m  # each stage's work: m forwards and m backwards
runs = {}
print(f"p={p} stages, m={m} micro-batches; bubble = (step time - compute) / compute, compute = {compute:.0f} units")
for name, (kind, options, formula) in SCHEDULES.items():
    runs[name] = simulate(p, m, kind, **options)
    step, peak = runs[name][0], [n / options.get("v", 1) for n in runs[name][1]]
    print(f"{name:<17}: step {step:5.2f}, bubble {step / compute - 1:.4f}, formula {formula(p, m):.4f}; "
          f"micro-batches in flight at each stage's peak {peak}")
    assert abs(step / compute - 1 - formula(p, m)) < 1e-9
cases = [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)]
agree = all(abs(simulate(p_, m_, kind, **options)[0] / (3.0 * m_) - 1 - formula(p_, m_)) < 1e-9
            for p_, m_ in cases for kind, options, formula in SCHEDULES.values())
print(f"every schedule's simulated bubble = its formula for (p, m) in {cases}: {agree}")
assert agree and runs["ZB-H1, F = B = W"][1] == [p] * p

# %% slideshow={"slide_type": "subslide"}
fig, axes = plt.subplots(3, 1, figsize=(10, 6.6), sharex=True)
for ax, name in zip(axes, ("1F1B", "interleaved, v=2", "ZB-H1, F = B = W")):
    kind, options, _ = SCHEDULES[name]
    v, w = options.get("v", 1), options.get("w", 0.0)
    cost = {"F": 1.0 / v, "B": (2.0 - w) / v, "W": w}
    tasks = [Task(s, i, k, end - cost[k], end, chunk=c) for (s, k, c, i), end in runs[name][2].items()]
    plot_gantt(tasks, ax=ax, title=f"{name}: {p} stages, {m} micro-batches, bubble {runs[name][0] / compute - 1:.1%} "
               "of the compute (hatched: chunk 1; green: W)", time_unit="units of one forward")
    if ax is not axes[-1]:
        ax.set_xlabel("")
axes[-1].set_xlim(0, max(r[0] for r in runs.values()))
plt.tight_layout()
plt.show()

# %% slideshow={"slide_type": "-"}
fig, ax = plt.subplots(figsize=(7, 3.6))
ms = list(range(4, 33, 4))
for name, (kind, options, formula) in SCHEDULES.items():
    line, = ax.plot(ms, [100 * formula(p, m_) for m_ in ms], label=f"{name} (formula)")
    ax.plot(ms, [100 * (simulate(p, m_, kind, **options)[0] / (3.0 * m_) - 1) for m_ in ms], "o",
            color=line.get_color())
ax.set_title(f"Pipeline bubble with {p} stages: simulated (dots) and the formulas (lines)")
ax.set_xlabel("micro-batches per step, m")
ax.set_ylabel("bubble (% of the compute time)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Interleaving divides the bubble by `v` and buys it with activations: the first rank's peak grows from 4 micro-batches' worth to 5.5 with `v = 2` (the printed peaks are in whole stages' worth, a chunk holding `1/v` of a stage's activations). ZB-H1 keeps 1F1B's peak on the first stage, lets the other stages rise to it, and cuts the bubble to a third. In the Gantt chart the later stages run their W's late: the last stage's final W's run while the B's of the last micro-batches travel up to the first stage, the time in which 1F1B's cool-down idles.

`torch.distributed.pipelining` has both families: `ScheduleInterleaved1F1B` (Megatron-LM's order), `ScheduleInterleavedZeroBubble` (the B/W split on interleaved chunks), `ScheduleZBVZeroBubble` (ZB-V: two chunks per rank in a V, the first and last virtual stages on the same rank) and `ScheduleDualPipeV` (DeepSeek-V3's). A stage holds several chunks by passing several `PipelineStage`s to the schedule. The two interleaved ones run here on gloo: the MLP's 7 modules cut into 4 virtual stages, 2 per rank, 4 micro-batches; each schedule's `pipeline_order` is its order of actions per rank (`1F0`: virtual stage 1, forward, micro-batch 0; `I` is B, the input gradient).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/pp_interleaved.py
import torch
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

from mp_stages import make_model

CHUNKS = [(0, 2), (2, 4), (4, 6), (6, 7)]  # the model's modules as 4 virtual stages: rank s holds s and s + 2


def interleaved_step(rank, world_size, x, y, n_micro=4):
    """One step of each interleaved schedule; return its order of actions on this rank and this rank's gradients."""
    torch.set_num_threads(1)
    out = {}
    for schedule_class in (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble):
        model = make_model()
        mine = (rank, rank + world_size)
        chunks = [model[slice(*CHUNKS[k])] for k in mine]  # a slice keeps the layer names
        stages = [PipelineStage(c, stage_index=k, num_stages=len(CHUNKS), device=torch.device("cpu"))
                  for c, k in zip(chunks, mine)]
        schedule = schedule_class(stages, n_microbatches=n_micro, loss_fn=F.cross_entropy)
        if rank == 0:
            schedule.step(x)            # virtual stage 0 is here: the inputs
        else:
            schedule.step(target=y)     # the last virtual stage is here: the targets
        out[schedule_class.__name__] = {"order": [str(a) for a in schedule.pipeline_order[rank] if a is not None],
                                        "grads": {k: p.grad.clone() for c in chunks for k, p in c.named_parameters()}}
    return out


# %% slideshow={"slide_type": "-"}
inter = run_ranks("_runs/pp_interleaved.py:interleaved_step", nprocs=2, args=(x_batch, y_batch, 4), timeout=180)
for name in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
    assert all(torch.allclose(g, ref_grads[k], atol=1e-6) for r in (0, 1) for k, g in inter[r][name]["grads"].items())
    print(f"{name}, 2 ranks x 2 chunks x 4 micro-batches: gradients allclose to one process on the full batch")
    for r in (0, 1):
        print(f"  rank {r}: {' '.join(inter[r][name]['order'])}")
simulated = stage_orders(2, 4, "interleaved", v=2)
same = all(inter[r]["ScheduleInterleaved1F1B"]["order"] == [f"{c * 2 + r}{k}{i}" for k, c, i in simulated[r]]
           for r in (0, 1))
print(f"ScheduleInterleaved1F1B's order = the simulator's interleaved order, action by action: {same}")
assert same

# %% [markdown] slideshow={"slide_type": "-"}
"""
PyTorch's interleaved 1F1B is Megatron-LM's order, as simulated. In its zero-bubble schedule every W comes after the I of the same micro-batch and virtual stage, and on rank 1 some wait behind later work (`3W0` after `3F1` and `3I1`): that is where the W's fill the gaps.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. The multi-GPU post's second "model parallel" example: what it really does

The multi-GPU post presents a second script as model parallelism: a `Net` made of three `SubNet`s, and one process per sub-network started with `mp.Process(target=train, args=(i, args))`. Read what each process does:

- it calls `init_process_group(..., rank=subnet_id)` and `torch.cuda.set_device(subnet_id)`: `subnet_id` only picks a GPU;
- it builds **the whole** `Net()` and moves all of it to that GPU: every process holds all three sub-networks;
- it trains on its own `DataLoader` with its own optimizer and **never communicates**: no send, no receive, no all-reduce, no DDP.

So it is neither model parallelism (nothing is split; each device needs memory for the whole model) nor data parallelism (the replicas are never synchronised): it is *N independent trainings* of the same architecture that drift apart. The process group it initialises is never used. Below, the same script on CPU and gloo, with the post's layer sizes:
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/multigpu_post_second.py
import torch
import torch.nn as nn
import torch.nn.functional as F


class SubNet(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.subnets = nn.ModuleList([SubNet(1024, 512), SubNet(512, 256), SubNet(256, 100)])

    def forward(self, x):
        for subnet in self.subnets:
            x = subnet(x)
        return x


def train(subnet_id, world_size, steps=3):
    # the group is already initialised by the launcher, as the multi-GPU post's init_process_group would do
    torch.set_num_threads(1)
    torch.manual_seed(0)                       # even with the same initial weights ...
    model = Net()                              # the WHOLE model, in every process
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + subnet_id)  # ... each process reads its own data
    for _ in range(steps):
        inputs, labels = torch.randn(32, 1024, generator=gen), torch.randint(0, 100, (32,), generator=gen)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward(retain_graph=True)       # as in the post: keeps this graph's buffers alive for nothing
        optimizer.step()
    return {"n_params": sum(p.numel() for p in model.parameters()),
            "subnets": len(model.subnets),
            "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}


# %% slideshow={"slide_type": "-"}
post2 = run_ranks("_runs/multigpu_post_second.py:train", nprocs=2, timeout=180)
for rank in (0, 1):
    print(f"rank {rank}: holds {post2[rank]['subnets']} of 3 sub-networks, {post2[rank]['n_params']:,} parameters (the whole model)")
drift = (post2[0]["weights"] - post2[1]["weights"]).abs().max().item()
assert post2[0]["n_params"] == post2[1]["n_params"] == 1024 * 512 + 512 + 512 * 256 + 256 + 256 * 100 + 100
assert drift > 0
print(f"after 3 steps the two copies differ by up to {drift:.4f}: two unrelated trainings, not one model")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Three more problems in that script, checked on 2.13:

- **`loss.backward(retain_graph=True)`** is not "keeping the gradient for later error propagation". Gradients accumulate in `.grad` with or without it; `retain_graph` only keeps the graph's saved tensors alive after backward, which is needed only to call `backward` a second time on the same graph. Here it just holds memory until the next iteration replaces `loss`.
- **`init_method='env://'`** reads `MASTER_ADDR` and `MASTER_PORT` from the environment, and the script starts its processes with `mp.Process` without setting them (only a launcher like `torchrun` does): it stops right there.
- **`world_size = num_gpus * subnets`** while only `subnets` processes are started: with `num_gpus=2, subnets=2` the group expects 4 ranks, 2 arrive, and `init_process_group` waits for the missing ones until its timeout (gloo's default, 30 minutes, is printed in notebook 12 §4.2). One rank alone, expecting 4, with a 2-second timeout:
"""

# %% slideshow={"slide_type": "-"}
torch.manual_seed(0)
m_small = nn.Linear(4, 1)
xs = torch.randn(8, 4)
m_small(xs).pow(2).mean().backward()
g_plain = m_small.weight.grad.clone()
m_small.zero_grad()
m_small(xs).pow(2).mean().backward(retain_graph=True)
assert torch.equal(m_small.weight.grad, g_plain)
print("gradients with and without retain_graph=True: identical")

saved_env = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
with expect_error(ValueError, match="MASTER_ADDR expected, but not set"):
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=2)
os.environ.update(saved_env)

with expect_error(dist.DistStoreError, match="1/4 clients joined", quiet=True) as waited:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=4,
                            timeout=timedelta(seconds=2))
assert not dist.is_initialized()
print("init_process_group gave up:", type(waited.error).__name__, "-", str(waited.error).split(". ")[-1].strip())

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What model parallelism of that `Net` would be: sub-network 0 in process 0, sub-networks 1–2 in process 1, the 512-wide activation sent forward and its gradient sent back, exactly the protocol of section 2. What data parallelism of it would be: wrap the model in `DistributedDataParallel` (notebook 11). The multi-GPU post's script does neither.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Tensor parallelism: splitting inside a layer

A pipeline splits *between* layers; tensor parallelism (Megatron-LM) splits *inside* one. For a `Linear` layer `y = x Wᵀ + b` with `W` of shape `out × in` (PyTorch's layout), there are two ways to cut `W` across 2 devices. Their names come from the Megatron-LM paper, which writes the layer as `y = x A` with `A = Wᵀ` of shape `in × out`, so each name says the opposite of what happens to PyTorch's `W`. This table is the translation; the rest of the section says "by output features" and "by input features", with the name in brackets:

| name (Megatron; PyTorch's class) | splits | PyTorch's `W` (`out × in`) | Megatron's `A = Wᵀ` (`in × out`) | the outputs are |
|---|---|---|---|---|
| column-parallel (`ColwiseParallel`) | output features | **rows** of `W` (dim 0) | columns of `A` | concatenated (all-gather) |
| row-parallel (`RowwiseParallel`) | input features | **columns** of `W` (dim 1) | rows of `A` | summed (all-reduce), `b` added once |

- **by output features** (column-parallel): each device holds some rows of `W` and computes some of the outputs; **concatenate** them (an all-gather) to get `y`;
- **by input features** (row-parallel): each device holds some columns of `W` and the matching slice of `x`, and computes a partial `y` over its inputs; **sum** them (an all-reduce) and add `b` once.

Both are exact, forward and backward. Here the two devices are simulated by tensor slices in one process:
"""

# %% slideshow={"slide_type": "-"}
torch.manual_seed(0)
layer = nn.Linear(8, 6)
x = torch.randn(5, 8, requires_grad=True)
y = layer(x)
A = layer.weight.T  # Megatron's A in y = x A: in x out
assert torch.equal(layer.weight[:3], A[:, :3].T)
print(f"W {tuple(layer.weight.shape)} (out x in), A = W.T {tuple(A.shape)} (in x out): rows 0-2 of W are columns 0-2 of A")
print(f"by output features (column-parallel): shard 0 is W[:3, :], {tuple(layer.weight.chunk(2, dim=0)[0].shape)}; "
      f"by input features (row-parallel): shard 0 is W[:, :4], {tuple(layer.weight.chunk(2, dim=1)[0].shape)}")
y.backward(torch.ones_like(y))
full_dw, full_dx = layer.weight.grad.clone(), x.grad.clone()

# by output features: shard k holds rows k of W and entries k of b
w_out = [w.detach().clone().requires_grad_() for w in layer.weight.chunk(2, dim=0)]
b_out = [b.detach().clone().requires_grad_() for b in layer.bias.chunk(2, dim=0)]
x1 = x.detach().clone().requires_grad_()
y_col = torch.cat([F.linear(x1, w, b) for w, b in zip(w_out, b_out)], dim=1)          # all-gather
y_col.backward(torch.ones_like(y_col))
assert torch.allclose(y_col, y) and torch.allclose(torch.cat([w.grad for w in w_out]), full_dw)
assert torch.allclose(x1.grad, full_dx)  # each shard contributes to dx: in a real run, an all-reduce of dx

# by input features: shard k holds columns k of W and features k of x; the bias is added once
w_in = [w.detach().clone().requires_grad_() for w in layer.weight.chunk(2, dim=1)]
x2 = x.detach().clone().requires_grad_()
y_row = sum(F.linear(xk, w) for xk, w in zip(x2.chunk(2, dim=1), w_in)) + layer.bias   # all-reduce
y_row.backward(torch.ones_like(y_row))
assert torch.allclose(y_row, y, atol=1e-6) and torch.allclose(torch.cat([w.grad for w in w_in], dim=1), full_dw)
assert torch.allclose(x2.grad, full_dx)
print("split by output features (concat) and by input features (sum): outputs, dW and dx equal the unsplit layer")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Megatron's MLP block chains the two: the first `Linear` split by output features (column-parallel), the activation applied shard by shard (it is elementwise), the second `Linear` split by input features (row-parallel), and **one all-reduce** per MLP block in forward (one more in backward). "Block" here means the MLP alone: a transformer block has two such pairs, attention and MLP, hence the four all-reduces per transformer block, two forward and two backward, that notebook 17 §1 counts. That communication happens in every layer, on the critical path, which is why tensor parallelism stays inside a node with fast links (NVLink). PyTorch's version is `torch.distributed.tensor.parallel` (`ColwiseParallel`, `RowwiseParallel`, `parallelize_module`), built on `DTensor`, a tensor that knows how it is split across the devices of a mesh (notebook 15 §2 introduces it; notebooks 17 and 18 take tensor parallelism further, to sequence, context and expert parallelism). The cell checks, in the classes' own source, which dimension of `W` each one shards: the table's. Exercise 3 asks for the split by input features by hand.
"""

# %% slideshow={"slide_type": "-"}
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import inspect
import re

for cls in (ColwiseParallel, RowwiseParallel):
    placement = re.search(r"\[Shard\((\d)\)\]", inspect.getsource(cls._partition_linear_fn)).group(0)
    print(f"{cls.__name__} places an nn.Linear's weight as {placement}: "
          f"{'rows' if placement == '[Shard(0)]' else 'columns'} of W")
assert "[Shard(0)]" in inspect.getsource(ColwiseParallel._partition_linear_fn)
assert "[Shard(1)]" in inspect.getsource(RowwiseParallel._partition_linear_fn)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. The map: data, sharded, pipeline or tensor parallelism?

<!-- BEGIN generated: facts-parallelism -->
| | data parallel (DDP) | sharded data parallel (ZeRO, FSDP) | pipeline parallel | tensor parallel |
|---|---|---|---|---|
| what is split | the batch; each device holds the whole model, its gradients and optimizer state | the batch, and the model state: each of N ranks keeps 1/N of the optimizer state (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3, FSDP) | the layers, in consecutive stages | each layer's weight matrices |
| communicated | all gradients, once per step (all-reduce, 2(N-1)/N of their bytes per rank) | reduce-scatter of gradients + all-gather of parameters: DDP's bytes for ZeRO-1/2, 1.5x for ZeRO-3 (parameters gathered again for backward; notebook 14) | activations at the cuts, forward and back (point-to-point) | activations inside every layer (all-reduce / all-gather) |
| idle time | little: the last bucket's all-reduce and the optimizer step are exposed; stragglers make every rank wait | little: FSDP prefetches the next all-gather during compute | the bubble, `(p-1)/(m+p-1)` of the step (`(p-1)/m` of the ideal compute) | none, but communication on the critical path of every layer |
| needs | the model, its gradients and optimizer state fit on one device | one layer's full parameters (ZeRO-3) and the activations fit on one device | a batch big enough for `m ≫ p` micro-batches; balanced stages | very fast links: one node, NVLink |
| use when | the model state fits: the first choice | the model state does not fit one device: the first remedy for that | sharding is not enough: across nodes with slow links; very deep models | single layers too big, or activations per layer; within a node |
<!-- END generated -->

The columns are in the order in which to reach for them. Before any of these, the single-device savings of notebooks 04–08 (checkpointing, mixed precision, accumulation) often make the model fit. When the model *state* is what does not fit, sharding it over the data-parallel ranks (ZeRO, FSDP: notebook 14) comes next: it keeps data parallelism's simple program and cuts no layer. Pipeline and tensor parallelism come in when sharding is not enough, or for speed at scale. Large runs combine them. "3-D parallelism" meant tensor parallel inside a node, pipeline across nodes and data parallel over copies of the whole. Today's runs add sharded data parallelism (FSDP, or HSDP: sharded within a node, replicated across nodes), sequence and context parallelism (the sequence split across devices, for long inputs) and expert parallelism (a mixture-of-experts layer's experts on different devices), hence "4-D" and "5-D" parallelism. Notebooks 17 and 18 take these on (tensor, sequence, context and expert parallelism), and notebook 19 puts FSDP2 into practice.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Splitting a model across devices (the cluster post's `split_gpus`) saves memory but not time: naively only one of `p` devices works at a time, idle `(p-1)/p`.
- Across processes a split is a message protocol: activations forward with `send`, `∂loss/∂activation` backward, `out.backward(grad)` on the sender. Two processes trained exactly like one (allclose gradients and parameters), with half the parameters each.
- Micro-batches (GPipe) shrink the bubble to `(p-1)/(m+p-1)`; measured on two processes with simulated device time it falls with `m` as the formula says, plus a per-micro-batch cost that grows with `m`, so `m` has an optimum; real compute on two shared CPU cores does not follow the formula (the stages compete for the cores).
- 1F1B has GPipe's bubble with activations bounded by `p`; interleaving `v` chunks per rank divides the bubble by `v` (`(p-1)/(v·m)` of the compute, more activations and messages), and ZB-H1's split of the backward into B and W cuts it to a third when F = B = W, at 1F1B's peak; the simulator matched every formula.
- `torch.distributed.pipelining` (`PipelineStage`, `ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`, ...) runs on CPU/gloo and gave the full-batch gradients; its interleaved 1F1B order is the simulator's. On GPUs the stages' transfers are NCCL kernels on CUDA streams, posted together with `batch_isend_irecv` (notebook 12 §7).
- The multi-GPU post's "model parallel" script builds the whole model in every process and never communicates: independent trainings. `retain_graph=True` there only wastes memory.
- Tensor parallelism splits a `Linear` by output features (column-parallel: rows of `W`; concatenate) or by input features (row-parallel: columns of `W`; sum), exactly; it communicates inside every layer.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `bubble(p, m)`: the idle fraction of a GPipe step with `p` stages and `m` micro-batches, equal task times.
2. Write `fewest_micro(p, max_bubble)`: the smallest number of micro-batches whose bubble is at most `max_bubble`.
3. Write `partials(x, weight, n)`: the `n` partial outputs of a `Linear` (no bias) split by **input** features into `n` shards; their sum must be `x @ weight.T`.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.model_parallel import check_bubble, check_min_micro_batches, check_row_parallel_partials


def bubble(p, m):
    raise NotImplementedError  # your code here


print(check_bubble(bubble))


# %% slideshow={"slide_type": "-"}
def fewest_micro(p, max_bubble):
    raise NotImplementedError  # your code here


print(check_min_micro_batches(fewest_micro))


# %% slideshow={"slide_type": "-"}
def partials(x, weight, n):
    raise NotImplementedError  # your code here


print(check_row_parallel_partials(partials))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- Y. Huang et al., *GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism*, NeurIPS 2019, [arXiv:1811.06965](https://arxiv.org/abs/1811.06965).
- D. Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP 2019 (the 1F1B schedule); D. Narayanan et al., *Memory-Efficient Pipeline-Parallel DNN Training*, ICML 2021, [arXiv:2006.09503](https://arxiv.org/abs/2006.09503) (PipeDream-2BW and PipeDream-Flush, the 1F1B schedule with a flush that synchronous pipelines use); and *Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC 2021, [arXiv:2104.04473](https://arxiv.org/abs/2104.04473).
- P. Qi, X. Wan, G. Huang, M. Lin, *Zero Bubble Pipeline Parallelism*, ICLR 2024, [arXiv:2401.10241](https://arxiv.org/abs/2401.10241) (the B/W split, ZB-H1, ZB-H2, ZB-V).
- M. Shoeybi et al., *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019, [arXiv:1909.08053](https://arxiv.org/abs/1909.08053).
- PyTorch docs: [torch.distributed.pipelining](https://pytorch.org/docs/stable/distributed.pipelining.html), [point-to-point communication](https://pytorch.org/docs/stable/distributed.html#point-to-point-communication), [Tensor Parallelism](https://pytorch.org/docs/stable/distributed.tensor.parallel.html).
- PyTorch tutorials: [Writing distributed applications](https://pytorch.org/tutorials/intermediate/dist_tuto.html) (send/recv), [Introduction to distributed pipeline parallelism](https://pytorch.org/tutorials/intermediate/pipelining_tutorial.html).
"""
