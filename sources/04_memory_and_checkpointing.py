# %% [markdown] slideshow={"slide_type": "slide"}
r"""
# 04 · Where training memory goes, and gradient checkpointing measured

A training step needs memory for four things: the parameters, their gradients, the optimizer's state, and the *activations* that the forward pass keeps for the backward pass. The first three are fixed by the model; the activations grow with the batch and with the depth, and in deep networks they dominate. *Gradient checkpointing* keeps only some of them and recomputes the rest during backward: memory for compute. Chen et al. (2016) showed that for a chain of $N$ layers this brings activation memory from $O(N)$ down to $O(\sqrt N)$ at the price of one extra forward pass. This notebook measures all of it, in bytes, on a CPU.

By the end of this notebook you will be able to:
- split the memory of a training step into parameters, gradients, optimizer state (SGD vs Adam) and activations, measure each, and name what else a real step holds (the optimizer's temporaries, autocast's copies, and on GPUs the CUDA context, the allocator's cache and DDP's buckets);
- measure the *peak* memory of a forward + backward step on CPU from the allocator's own events, and say why saved-tensor hooks and `tracemalloc` are not enough;
- explain how checkpointing works, write a minimal checkpoint `autograd.Function` by hand, account for every byte of its peak, and choose between `use_reentrant=True` and `False`;
- use `checkpoint` and `checkpoint_sequential` with the current API, find the best number of segments, measure the $\sqrt N$ law, and say what it costs in arithmetic and in time;
- train a small CNN with one block checkpointed, check that it learns exactly what the plain CNN learns, and explain why checkpointing one block barely moves its peak.

This notebook assumes: notebooks 02 and 03 (the autograd graph, saved tensors, `SavedTensorMeter`, saved-tensor hooks, and writing a `torch.autograd.Function`), and a first idea of what an optimizer does.

It is the first of two. Here checkpointing is measured on models without surprises: a deep chain of `Linear` + `Tanh` blocks, where every number can be counted in activations, and the Tensor post's CNN. Notebook 05 takes it into practice: what randomness, BatchNorm's running statistics and inputs without gradients do to a checkpoint, choosing op by op what to keep, offloading, what `torch.compile` makes of it all, and the GPU's memory tools.
"""

# %% slideshow={"slide_type": "-"}
import math
import textwrap
import time
import warnings
from collections import Counter
from contextlib import contextmanager

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential
from tqdm.auto import tqdm

from course_lib.checkpointing import deep_chain
from course_lib.data import digits
from course_lib.errors import expect_error
from course_lib.memory import allocation_events, measure_peak, state_bytes, step_peak_memory
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything

torch.set_num_threads(1)  # one thread: steadier timings on a shared machine, kernel buffers independent of the core count
seed_everything(0)
train, test = digits()
print(f"digits: {len(train)} training images of shape {tuple(train.x.shape[1:])}, {len(test)} test images")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Where memory goes in one training step

Our model is the small CNN of the Tensor post, written for CIFAR-10 (3×32×32 images), adapted to scikit-learn's digits (1×8×8): the first convolution takes 1 channel instead of 3, and after two 2×2 poolings the feature map is 64×2×2, so the head's first `Linear` takes 256 inputs instead of 64·8·8. The `checkpointed` argument names the blocks to run through `torch.utils.checkpoint`; we use it from section 5 on.
"""


# %% slideshow={"slide_type": "-"}
class DigitsCNN(nn.Module):
    """The Tensor post's CIFAR10Model, adapted to 1x8x8 digits; `checkpointed` blocks are recomputed in backward."""

    def __init__(self, checkpointed=(), use_reentrant=False, preserve_rng_state=True):
        super().__init__()
        self.cnn_block_1 = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                                         nn.MaxPool2d(kernel_size=2), nn.Dropout(0.25))
        self.cnn_block_2 = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                                         nn.MaxPool2d(kernel_size=2), nn.Dropout(0.25))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 2 * 2, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))
        self.checkpointed = set(checkpointed)
        self.use_reentrant = use_reentrant
        self.preserve_rng_state = preserve_rng_state

    def forward(self, x):
        for name in ("cnn_block_1", "cnn_block_2"):
            block = getattr(self, name)
            if name in self.checkpointed:
                x = checkpoint(block, x, use_reentrant=self.use_reentrant, preserve_rng_state=self.preserve_rng_state)
            else:
                x = block(x)
        return self.head(x)


seed_everything(0)
cnn = DigitsCNN()
n_params = sum(p.numel() for p in cnn.parameters())
print(f"{n_params:,} parameters = {format_bytes(n_params * 4)} in float32")
assert cnn(train.x[:4]).shape == (4, 10)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Parameters, gradients and optimizer state are tensors we can add up (`state_bytes` counts each storage once). Gradients exist once a backward has run; optimizer state once the optimizer has stepped. Plain SGD keeps nothing, SGD with momentum one buffer per parameter, Adam two (`exp_avg`, `exp_avg_sq`) plus a `step` counter, a 4-byte scalar tensor per parameter tensor.
"""


# %% slideshow={"slide_type": "-"}
def one_step(model, optimizer, batch):
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(train.x[:batch]), train.y[:batch]).backward()
    optimizer.step()


rows = {}
for name, make in {"SGD": lambda ps: torch.optim.SGD(ps, lr=0.05),
                   "SGD + momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                   "Adam": lambda ps: torch.optim.Adam(ps, lr=1e-3)}.items():
    seed_everything(0)
    model = DigitsCNN()
    opt = make(model.parameters())
    assert state_bytes(model, opt).gradients == 0  # no backward yet: no .grad
    one_step(model, opt, 32)
    rows[name] = state_bytes(model, opt)
    print(f"{name:15s} parameters {format_bytes(rows[name].parameters):>9s}  gradients {format_bytes(rows[name].gradients):>9s}"
          f"  optimizer state {format_bytes(rows[name].optimizer_state):>9s}")
P = n_params * 4
n_tensors = len(list(cnn.parameters()))
assert rows["SGD"].optimizer_state == 0
assert rows["SGD + momentum"].optimizer_state == P
assert rows["Adam"].optimizer_state == 2 * P + 4 * n_tensors
print(f"Adam keeps 2 x {format_bytes(P)} + {n_tensors} step counters x 4 B")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Activations are what autograd saves between forward and backward. `SavedTensorMeter` (notebook 02) counts them; the parameters it also sees (a `Conv2d` saves its weight) are reported apart. We measure the CNN at three batch sizes and stack the four parts: the fixed parts do not move, the activations grow with the batch, in exact proportion.
"""

# %% slideshow={"slide_type": "-"}
batches = [16, 64, 256]
activations = {}
for b in batches:
    seed_everything(0)
    with SavedTensorMeter(exclude=cnn.parameters()) as meter:
        # .clone(): a slice train.x[:b] is a view of the whole dataset's storage, which the meter would count
        loss = nn.functional.cross_entropy(cnn(train.x[:b].clone()), train.y[:b].clone())
    activations[b] = meter.bytes
    del loss
    print(f"batch {b:3d}: activations kept for backward {format_bytes(meter.bytes):>9s}")
# exactly 4x per 4x batch, apart from one 4-byte scalar that cross_entropy keeps (its total weight)
assert activations[64] - 4 == 4 * (activations[16] - 4) and activations[256] - 4 == 4 * (activations[64] - 4)

adam = rows["Adam"]
parts = {"parameters": [adam.parameters] * 3, "gradients": [adam.gradients] * 3,
         "Adam state": [adam.optimizer_state] * 3, "activations": [activations[b] for b in batches]}
fig, ax = plt.subplots(figsize=(6, 3.5))
bottom = np.zeros(3)
for label, values in parts.items():
    ax.bar([str(b) for b in batches], np.array(values) / 2**20, bottom=bottom, label=label)
    bottom += np.array(values) / 2**20
ax.set(title="Memory of one training step of the digits CNN (Adam)", xlabel="batch size", ylabel="memory (MiB)")
ax.legend()
plt.show()
for i, b in enumerate(batches):
    share = activations[b] / (adam.total + activations[b])
    print(f"batch {b:3d}: total {format_bytes(adam.total + activations[b])}, activations {share:.0%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
At batch 16 the model's state dominates; at batch 256 the activations do. Activations also grow with depth: each layer adds what it saves. To see that cleanly we use a deep, narrow chain from `course_lib.checkpointing.deep_chain`: `N` blocks `Linear(w, w)` + `Tanh`, each of which keeps exactly one `batch × w` tensor (the `Tanh` output, which is also the next `Linear`'s input). With a batch of 256 and `w = 8`, that tensor is 8 KiB, far more than the block's 288 bytes of parameters.
"""

# %% slideshow={"slide_type": "-"}
BATCH, WIDTH = 256, 8
UNIT = BATCH * WIDTH * 4  # bytes of one activation of the chain
x_chain = torch.randn(BATCH, WIDTH, requires_grad=True)
saved = {}
for depth in (4, 16, 64):
    chain = deep_chain(depth, WIDTH)
    with SavedTensorMeter(exclude=chain.parameters()) as meter:
        chain(x_chain).sum()
    saved[depth] = meter.bytes
    print(f"N = {depth:2d}: {meter.bytes // UNIT} activations of {format_bytes(UNIT)} kept for backward")
assert all(saved[d] == (d + 1) * UNIT for d in saved)  # the input plus one per block

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### What else takes memory

Four parts are the model's; a real step has more, most of them on a GPU:

- **The CUDA context**: each process that touches a GPU first loads CUDA's kernels and state, typically a few hundred MiB that `torch.cuda.memory_allocated` never shows (PyTorch's [CUDA semantics notes](https://pytorch.org/docs/stable/notes/cuda.html#memory-management): `nvidia-smi` shows more than PyTorch reports). GPU only.
- **The allocator's cache**: freed GPU memory stays *reserved* by PyTorch's caching allocator for reuse, so `nvidia-smi` and `memory_reserved` read more than `memory_allocated`; fragmentation can make a step fail with memory free. notebook 05 §4 shows it in a GPU cell.
- **DDP's buckets**: `DistributedDataParallel` keeps the gradients in flat communication buckets, a second gradient-sized copy unless `gradient_as_bucket_view=True` ([DDP documentation](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html)); notebook 12 §3.1 measures that copy and the flag that removes it. Multi-process, not shown here.
- **Autocast's weight-cast cache** (notebook 07): inside one `torch.autocast` region each weight is cast to the low precision once and the copy is kept until the region ends. Shown below on CPU.
- **The optimizer step's temporaries**: Adam can update one parameter tensor at a time (the per-tensor loop, `foreach=False`: temporaries for one tensor at a time, here two of the largest tensor's size), whole lists of tensors at once (`foreach=True`: fewer, larger kernel launches, and temporaries the size of *all* parameters), or in one fused kernel per step (`fused=True`, on GPUs and CPUs in recent releases), which avoids most temporaries. Left to itself (`foreach=None`, the default), Adam picks `foreach` only when all its parameters are on a GPU-like device (CUDA, XPU, MTIA); on the CPU it runs the per-tensor loop. Shown below on CPU.

A transformer's activations have a shape of their own (attention's $s \times s$ scores, a wide MLP, the loss over a large vocabulary): notebook 16 §3 points this notebook's meters at one decoder block.
"""

# %% slideshow={"slide_type": "-"}
from torch.optim.optimizer import _default_to_fused_or_foreach, _get_foreach_kernels_supported_devices

step_peaks = {}
for foreach in (False, True, None):
    seed_everything(0)
    mlp = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3, foreach=foreach)
    mlp(torch.ones(4, 256)).sum().backward()
    opt.step()  # the first step creates Adam's state; measure the second
    mlp(torch.ones(4, 256)).sum().backward()
    step_peaks[foreach] = measure_peak(opt.step).peak_bytes
P_mlp = sum(p.numel() for p in mlp.parameters()) * 4
largest = 256 * 256 * 4
print(f"Adam step, parameters {format_bytes(P_mlp)}, largest tensor {format_bytes(largest)}:")
for foreach, peak in step_peaks.items():
    print(f"  foreach={foreach!s:5}: temporaries peak at {format_bytes(peak)} = {peak / P_mlp:.2f} x the parameters")
assert step_peaks[True] > 3 * step_peaks[False] and step_peaks[False] < 3 * largest
# the default, foreach=None, is resolved at each step by a private helper of torch.optim, from the parameters' device
fused, foreach_default = _default_to_fused_or_foreach(list(mlp.parameters()), differentiable=False, use_fused=False)
print(f"Adam(...).defaults['foreach'] = {opt.defaults['foreach']}; for these CPU parameters it resolves to foreach={foreach_default}"
      f" (the per-tensor loop); foreach is the default only on {', '.join(_get_foreach_kernels_supported_devices())}")
assert opt.defaults["foreach"] is None and not foreach_default and step_peaks[None] == step_peaks[False]

lin = nn.Linear(512, 512)
cast = {}
for cache_enabled in (True, False):
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
        cast[cache_enabled] = measure_peak(lambda: lin(torch.ones(8, 512)).float().sum()).retained_bytes
kept = cast[True] - cast[False]


def whole_region():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return lin(torch.ones(8, 512)).float().sum()


print(f"inside an autocast region: {format_bytes(kept)} still held after the forward = bf16 copies of the weight and bias "
      f"({(512 * 512 + 512) * 2:,} bytes); after the region: {measure_peak(whole_region).retained_bytes - cast[False]} bytes")
assert kept == (512 * 512 + 512) * 2 and measure_peak(whole_region).retained_bytes == cast[False]

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Measuring the peak: ask the allocator

The meter answers *what is kept*. The question that decides whether a step fits in memory is *what is the highest point reached*, and that includes memory that is allocated and freed while backward runs: gradient buffers, temporaries, and (section 3) recomputed activations. Two tools that look like they should answer it do not:
"""

# %% slideshow={"slide_type": "-"}
import tracemalloc

tracemalloc.start()
big = torch.ones(1_000_000)  # 4 MB from PyTorch's allocator
current, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(f"tracemalloc saw a peak of ~{peak} bytes (Python objects only) while a 4,000,000-byte tensor was allocated")
assert peak < 100_000
cpu_memory_api = [a for a in dir(torch.cpu) if "memory" in a.lower()]
print("memory functions in torch.cpu:", cpu_memory_api)
assert not cpu_memory_api
del big

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`tracemalloc` traces Python's allocator, not PyTorch's; `torch.cpu` has no counterpart of `torch.cuda.max_memory_allocated`. What works on CPU is the profiler: with `profile_memory=True`, `torch.profiler` records every call to the allocator as an event carrying its size, positive for an allocation and negative for a free. Adding the sizes up in time order gives the memory in use at each moment; its maximum is the peak. Reading those sizes needs one non-public detail: the public `prof.events()` does not carry them, so `course_lib.memory.allocation_events(prof)` reads the profiler's private record (`prof.profiler.kineto_results`) and returns plain `(time, bytes)` pairs. It is the one place the course touches that private record (the PyTorch profiler's public API has no allocation sizes in 2.13), so if a PyTorch release renames it, only `allocation_events` needs to change, and it raises with a clear message instead of returning wrong numbers. The running sum is then ordinary arithmetic, here by hand and checked against `measure_peak`:
"""

# %% slideshow={"slide_type": "-"}
from torch.profiler import ProfilerActivity, profile


def work():
    a = torch.empty(1024)      # 4 KiB
    b = torch.empty(2048)      # 8 KiB -> 12 KiB in use
    del a, b
    return torch.empty(512)    # 2 KiB still in use at the end


with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    kept = work()
events = allocation_events(prof)  # (time in ns, bytes) of each allocation (+) and free (-), in time order
running = np.cumsum([nbytes for _, nbytes in events])
print("bytes per event:", [nbytes for _, nbytes in events])
print("in use         :", running.tolist())
by_hand = int(running.max())
lib = measure_peak(work)
assert (by_hand, int(running[-1])) == (lib.peak_bytes, lib.retained_bytes) == (12288, 2048)
print(f"peak {by_hand} B, still allocated at the end {lib.retained_bytes} B (library agrees)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`step_peak_memory(model, x)` measures one forward + backward this way (gradients set to `None` first, loss `output.sum()` by default). Measured against depth, the peak of the chain grows by exactly one activation per block: a straight line. The peak is reached as backward starts, when every saved activation is still alive. The numbers are bytes, identical on every run.
"""

# %% slideshow={"slide_type": "-"}
depths = [4, 8, 16, 32, 64]
peaks = []
for depth in depths:
    peaks.append(step_peak_memory(deep_chain(depth, WIDTH), x_chain).peak_bytes)
    print(f"N = {depth:2d}: peak {format_bytes(peaks[-1]):>10s} = {peaks[-1] / UNIT:6.2f} activations")
steps = np.diff(peaks) / np.diff(depths)
assert np.all(steps == UNIT), steps
slope = np.polyfit(depths, np.array(peaks) / UNIT, 1)[0]
print(f"fitted: {slope:.3f} activations per block")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(depths, np.array(peaks) / 2**10, "o-")
ax.set(title="Peak memory of a step grows linearly with depth", xlabel="depth N (blocks)", ylabel="peak memory (KiB)")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Why 6.04 activations at $N = 4$, when the meter counted 5 kept? The meter's 5 include the input, which existed before the step and is not in the peak: the step itself allocates the 4 `Tanh` outputs it keeps. The backward then holds two gradients of an activation's size at once, the one arriving at a block and the one it computes for its input: 4 + 2 = 6. What is left is a few hundred bytes, the small tensors alive at that moment (parameter gradients, the loss and its gradient). Each block adds 1, as the slope says:
"""

# %% slideshow={"slide_type": "-"}
rest = peaks[0] - (4 + 2) * UNIT
print(f"N = 4: peak {peaks[0]:,} B = 4 kept outputs + 2 gradients in flight ({6 * UNIT:,} B) + {rest} B of small tensors")
print(f"one block's parameters: {sum(p.numel() for p in deep_chain(1, WIDTH).parameters()) * 4} B")
assert 0 < rest < 1024 and all(peak - (d + 2) * UNIT == rest for d, peak in zip(depths, peaks))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. How checkpointing works

A checkpointed block runs its forward pass *without recording a graph* and keeps only its inputs. In backward, when its gradient is needed, it runs the forward again, this time recording, and backpropagates through that fresh graph. Its activations exist only during its own backward. The Tensor post shows PyTorch's old implementation, `CheckpointFunction`. Here is the idea in a dozen lines (no RNG handling yet: notebook 05 §1):
"""


# %% slideshow={"slide_type": "-"}
class NaiveCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, *inputs):
        assert not torch.is_grad_enabled()  # Function.forward already runs without recording a graph
        ctx.run_function = run_function
        ctx.save_for_backward(*inputs)      # keep the inputs only
        return run_function(*inputs)

    @staticmethod
    def backward(ctx, grad_output):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with torch.enable_grad():
            output = ctx.run_function(*inputs)           # recompute, recording this time
        torch.autograd.backward(output, grad_output)     # parameters' .grad accumulate here
        return (None, *(t.grad for t in inputs))


def grads_of(model, x, forward):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    forward(model, x).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


chain = deep_chain(16, WIDTH)
reference = grads_of(chain, x_chain, lambda m, x: m(x))
mine = grads_of(chain, x_chain, lambda m, x: NaiveCheckpoint.apply(m, x))
torchs = grads_of(chain, x_chain, lambda m, x: checkpoint(m, x, use_reentrant=False))
assert all(torch.allclose(a, b) for a, b in zip(mine, reference))
assert all(torch.allclose(a, b) for a, b in zip(mine, torchs))
print(f"{len(mine)} gradients (input + {len(mine) - 1} parameters) agree with the plain model and with torch.utils.checkpoint")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The Tensor post's `CheckpointFunction.forward` wraps the call in `with torch.no_grad()`. The `assert` above shows that it is redundant: `autograd.Function.forward` already runs with grad mode off. What it keeps: the plain chain saves 17 activations (the input and one per block); checkpointed, only the input. The allocator shows what that is worth at the peak, recomputation included:
"""

# %% slideshow={"slide_type": "-"}
with SavedTensorMeter(exclude=chain.parameters()) as plain_meter:
    chain(x_chain)
with SavedTensorMeter(exclude=chain.parameters()) as ckpt_meter:
    NaiveCheckpoint.apply(chain, x_chain)
print(f"kept for backward: plain {plain_meter.bytes // UNIT} activations, checkpointed {ckpt_meter.bytes // UNIT}")
assert (plain_meter.bytes, ckpt_meter.bytes) == (17 * UNIT, UNIT)

def in_segments(run, n_segments):
    """Run the chain as n_segments consecutive checkpointed pieces."""
    def forward(model, x):
        size = len(model) // n_segments
        for i in range(n_segments):
            x = run(model[i * size:(i + 1) * size], x)
        return x
    return forward


plain = step_peak_memory(chain, x_chain)
whole = step_peak_memory(chain, x_chain, forward=lambda m, x: NaiveCheckpoint.apply(m, x))
four = step_peak_memory(chain, x_chain, forward=in_segments(NaiveCheckpoint.apply, 4))
print(f"peak of a step, in activations: plain {plain.peak_bytes / UNIT:.2f}, one checkpoint {whole.peak_bytes / UNIT:.2f},"
      f" four checkpoints of 4 blocks {four.peak_bytes / UNIT:.2f}")
assert four.peak_bytes < plain.peak_bytes < whole.peak_bytes
torch_peaks = {}
for use_reentrant in (True, False):
    for preserve in (True, False):
        run = lambda seg, x, r=use_reentrant, p=preserve: checkpoint(seg, x, use_reentrant=r, preserve_rng_state=p)  # noqa: E731
        torch_peaks[use_reentrant, preserve] = step_peak_memory(chain, x_chain, forward=in_segments(run, 4)).peak_bytes
RNG_BYTES = torch.get_rng_state().numel()
print(f"torch's checkpoint also saves the CPU RNG state per call (notebook 05 §1.1): {RNG_BYTES:,} bytes = {RNG_BYTES / UNIT:.2f} activations")
for use_reentrant in (True, False):
    peak, bare = torch_peaks[use_reentrant, True], torch_peaks[use_reentrant, False]
    print(f"torch checkpoint, use_reentrant={use_reentrant!s:5}, same four segments: {peak / UNIT:.2f}"
          f" = {bare / UNIT:.2f} with preserve_rng_state=False + {(peak - bare) / RNG_BYTES:.2f} RNG states")
    assert peak < plain.peak_bytes
# the reentrant form is the hand-written algorithm plus one RNG state per call, to the byte
assert torch_peaks[True, False] == four.peak_bytes and torch_peaks[True, True] - four.peak_bytes == 4 * RNG_BYTES
assert torch_peaks[False, False] < four.peak_bytes and 4 * RNG_BYTES < torch_peaks[False, True] - torch_peaks[False, False] < 5 * RNG_BYTES

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What to take from these lines: the reentrant `checkpoint` is our `NaiveCheckpoint` plus one saved RNG state per call (notebook 05 §1.1), 10.18 + 4 × 0.62 = 12.65 activations, to the byte; the non-reentrant one is leaner (9.14 without RNG states). An RNG state is 5,056 bytes whatever the model, so at real scale it is negligible.

*An optional detail, skip it on a first read:* why do the non-reentrant form's RNG states add 4.77 states' worth, not a whole number? Because a peak is a maximum over time, and the states move it to another moment of the backward. The next cell lists the allocations alive at each peak (in the allocator's event list up to the peak, an allocation of a size counts +1 and a free of that size −1).
"""


# %% slideshow={"slide_type": "-"}
def live_at_peak(step):
    """Run step() under the profiler; return its peak and the sizes of the allocations alive then, {bytes: count}."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes = [nbytes for _, nbytes in allocation_events(prof)]
    at_peak = int(np.argmax(np.cumsum(sizes)))
    live = Counter()
    for nbytes in sizes[:at_peak + 1]:
        live[abs(nbytes)] += 1 if nbytes > 0 else -1
    return sum(sizes[:at_peak + 1]), +live


def nonreentrant_step(preserve):
    out = in_segments(lambda seg, x: checkpoint(seg, x, use_reentrant=False, preserve_rng_state=preserve), 4)(chain, x_chain)
    out.sum().backward()


rest = {}
for preserve in (True, False):
    chain.zero_grad(set_to_none=True)
    x_chain.grad = None
    peak, live = live_at_peak(lambda p=preserve: nonreentrant_step(p))
    assert peak == torch_peaks[False, preserve]  # the same step as above
    rest[preserve] = peak - live[UNIT] * UNIT - live[RNG_BYTES] * RNG_BYTES
    print(f"preserve_rng_state={preserve!s:5}: at the peak, {live[UNIT]} activations + {live[RNG_BYTES]} RNG states"
          f" + {rest[preserve]:,} B of small tensors")
last_segment_grads = sum(p.numel() for p in chain[12:].parameters()) * 4
print(f"the last segment's parameter gradients: {last_segment_grads:,} B; "
      f"5 - {last_segment_grads:,} / {RNG_BYTES:,} = {5 - last_segment_grads / RNG_BYTES:.2f} RNG states' worth")
assert rest[False] - rest[True] == last_segment_grads

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The same activations are alive at both peaks; what differs is *when*. With RNG states the peak comes during the first recomputation (the last segment's), when all 4 stored states are alive plus a fifth, the generator's current state, kept to restore it afterwards. Without them it comes one segment later, when the last segment's parameter gradients (1,152 bytes) also exist. So the states add 5 states' worth minus those gradients: 4.77.

Checkpointing the whole chain as *one* block does not help at all: in backward it recomputes all 16 activations at once, while also holding the block's output gradient, one activation more than the plain step. The gain comes from *several* checkpointed pieces: with four, at most 4 inputs are stored and 4 blocks recomputed at a time (section 4 finds the best number). Note also what the meter cannot see: it counts what is saved, and the recomputation happens during backward. Inside PyTorch's checkpoint the meter sees nothing at all in backward, which is why this notebook measures peaks with the allocator:
"""

# %% slideshow={"slide_type": "-"}
y = checkpoint(chain, x_chain, use_reentrant=False)
with SavedTensorMeter() as meter_in_backward:
    y.sum().backward()
print(f"saved-tensor hooks during the backward of a non-reentrant checkpoint: {meter_in_backward.count} tensors")
assert meter_in_backward.count == 0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### `use_reentrant=True` or `False`?

`torch.utils.checkpoint.checkpoint` has two implementations:

- **`use_reentrant=True`** is the Tensor post's `CheckpointFunction` (and our `NaiveCheckpoint`): an `autograd.Function` whose backward calls `torch.autograd.backward` again, *re-entering* the autograd engine. Consequences: the parameters used inside the block are invisible to the outer graph (their `.grad` is filled by the inner backward call), so it only works with `.backward()`, not `torch.autograd.grad`; its output requires grad only if some *input* does (notebook 05 §1.3), and keyword arguments are not supported.
- **`use_reentrant=False`** (recommended) runs the forward normally, with grad mode on, but intercepts every tensor autograd would save with saved-tensor hooks (notebook 02) and drops it, keeping a way to recompute it. The first time backward needs a dropped tensor, the block is re-run up to the point where everything needed is recomputed. The graph is an ordinary graph, so `torch.autograd.grad`, inputs that do not require grad and keyword arguments all work.
"""

# %% slideshow={"slide_type": "-"}
w = torch.randn(WIDTH, WIDTH, requires_grad=True)
f = lambda t: torch.tanh(t @ w)  # noqa: E731
x0 = x_chain.detach().requires_grad_()

g_plain = torch.autograd.grad(f(x0).sum(), (x0, w))
g_nonre = torch.autograd.grad(checkpoint(f, x0, use_reentrant=False).sum(), (x0, w))
assert all(torch.allclose(a, b) for a, b in zip(g_plain, g_nonre))
print("use_reentrant=False works with torch.autograd.grad")
with expect_error(RuntimeError, match="incompatible with .grad"):
    torch.autograd.grad(checkpoint(f, x0, use_reentrant=True).sum(), x0)
# the weight w is used inside the block, but the outer graph never sees it:
with expect_error(RuntimeError, match="not have been used in the graph"):
    torch.autograd.grad(checkpoint(f, x0, use_reentrant=True).sum(), w)
# keyword arguments reach the block only through the non-reentrant form:
scaled = lambda t, scale=1.0: f(t) * scale  # noqa: E731
assert torch.allclose(checkpoint(scaled, x0, use_reentrant=False, scale=2.0), 2 * f(x0))
with expect_error(ValueError, match="Unexpected keyword arguments"):
    checkpoint(scaled, x0, use_reentrant=True, scale=2.0)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Passing `use_reentrant` is still optional in PyTorch 2.13. What a call without it does, as the cell below shows: it warns, then runs the *reentrant* form. The warning and `checkpoint`'s docstring both announce an exception "in 2.9", a promise that 2.13 has not kept; a later release may keep it, and then the same call raises. So the behaviour of a call without the argument depends on the version, while a call with it does the same thing in every version: always pass it, `use_reentrant=False`.
"""

# %% slideshow={"slide_type": "-"}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint(f, x0)
message = str(caught[0].message)
print(textwrap.fill(f"{caught[0].category.__name__}: {message}", 120))
assert "use_reentrant parameter should be passed explicitly" in message
promise = next(s for s in " ".join(checkpoint.__doc__.split()).split(". ") if "we will raise an exception" in s)
print(f"checkpoint's docstring: \"{promise}.\"")
assert "2.9" in promise and "2.9" in message
print("PyTorch", torch.__version__.split("+")[0], "- still a warning, and the default is still use_reentrant=True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
One more practical fact: the first `checkpoint` call in a process is slow. `checkpoint` is decorated with `torch._disable_dynamo`, which keeps Dynamo (the front end of `torch.compile`) from tracing *into* checkpoint's Python code, and that decorator imports `torch._dynamo` on first use: seconds on 2 cores. It does not mean that `torch.compile` leaves checkpoints alone: a compiled function captures the call whole and decides the recomputation itself (notebook 05 §3). In this notebook something earlier has already imported Dynamo, so we show the import in a fresh Python process. Warm up once before timing anything.
"""

# %% slideshow={"slide_type": "-"}
import subprocess
import sys

probe = """
import sys, time, torch
from torch.utils.checkpoint import checkpoint
lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8, requires_grad=True)
before = "torch._dynamo" in sys.modules
t0 = time.perf_counter(); checkpoint(lin, x, use_reentrant=False).sum().backward(); t1 = time.perf_counter()
checkpoint(lin, x, use_reentrant=False).sum().backward(); t2 = time.perf_counter()
print(before, "torch._dynamo" in sys.modules, t1 - t0, t2 - t1)
"""
out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout.split()
before, after, first_s, second_s = out[0] == "True", out[1] == "True", float(out[2]), float(out[3])
print(f"fresh process: torch._dynamo imported before the first call: {before}, after: {after}")
print(f"first checkpoint call ~{first_s:.2f} s, second ~{second_s * 1e3:.2f} ms")
assert not before and after

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 4. `checkpoint_sequential` and the $\sqrt N$ result

`checkpoint_sequential(functions, segments, input, use_reentrant=...)` splits a sequential model into `segments` pieces and checkpoints each. First, the Tensor post's snippet, run as written:
"""

# %% slideshow={"slide_type": "-"}
model = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(), nn.Linear(20, 5), nn.ReLU())
input_var = torch.randn(1, 100, requires_grad=True)
segments = 2
with expect_error(AttributeError, match="modulles"):
    modules = [module for k, module in model.modulles.items()]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`modulles` is a typo; and `model.modules` would not help either (it is a method that yields every submodule, the `Sequential` itself included). What `checkpoint_sequential` wants is the `Sequential` itself, or the list of its children. With that fixed, the last line fails too:
"""

# %% slideshow={"slide_type": "-"}
modules = list(model.children())  # or simply pass `model`
out = checkpoint_sequential(modules, segments, input_var, use_reentrant=False)
with expect_error(AttributeError, match="backwards"):
    out.sum().backwards()

# %% slideshow={"slide_type": "fragment"}
out = checkpoint_sequential(model, segments, input_var, use_reentrant=False)
out.sum().backward()
assert input_var.grad.shape == (1, 100) and all(p.grad is not None for p in model.parameters())
print("corrected snippet: checkpoint_sequential(model, 2, x, use_reentrant=False) ... .backward()")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Which layers does it actually checkpoint? It counts the `Sequential`'s *children*, so each `ReLU` counts as a layer; it uses `len(children) // segments` layers per segment; and it never checkpoints the *last* segment, which also gets the remainder. We count how many times each child runs its forward in one step: twice means checkpointed (forward + recompute). Mind the switch of meaning: in section 3, "four segments" were four checkpointed pieces; from here on, $k$ segments means `checkpoint_sequential`'s $k$, of which $k - 1$ are checkpointed and the last runs plain, keeping its activations. The last line compares the two on section 3's chain.
"""


# %% slideshow={"slide_type": "-"}
def forward_counts(model, segments, x, use_reentrant):
    counts = [0] * len(model)
    hooks = [child.register_forward_hook(lambda mod, inp, out, i=i: counts.__setitem__(i, counts[i] + 1))
             for i, child in enumerate(model)]
    checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant).sum().backward()
    for h in hooks:
        h.remove()
    return counts


ten = nn.Sequential(*[nn.Linear(4, 4) for _ in range(10)])
x4 = torch.randn(2, 4, requires_grad=True)
print("6 children, 2 segments :", forward_counts(model, 2, input_var, use_reentrant=True))
print("10 children, 4 segments:", forward_counts(ten, 4, x4, use_reentrant=True))
assert forward_counts(model, 2, input_var, use_reentrant=True) == [2, 2, 2, 1, 1, 1]
assert forward_counts(ten, 4, x4, use_reentrant=True) == [2] * 6 + [1] * 4  # 3 checkpointed segments of 2, the last keeps 4
# more segments than children: 10 // 20 = 0 layers per segment, and an unhelpful error
with expect_error(ValueError, match="range"):
    checkpoint_sequential(ten, 20, x4, use_reentrant=False)
# "4 segments" in section 3 meant 4 checkpointed pieces; here it means 3 checkpointed and a plain last one
seq4 = step_peak_memory(chain, x_chain, forward=lambda m, x: checkpoint_sequential(m, 4, x, use_reentrant=False,
                                                                                     preserve_rng_state=False)).peak_bytes
print(f"16-block chain, 4 segments, no RNG states: section 3's 4 checkpointed pieces {torch_peaks[False, False] / UNIT:.2f}"
      f" activations, checkpoint_sequential(4) {seq4 / UNIT:.2f}: the same peak, without recomputing the last 4 blocks")
assert seq4 == torch_peaks[False, False]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The last line shows why the last segment is left plain: both give the same peak. Backward starts with the last segment, so a checkpointed last segment would be recomputed at once, and its activations would be back before anything else is freed; keeping them from the forward costs no more, and saves recomputing them.

Forward hooks are not a reliable counter with `use_reentrant=False`. That implementation stops recomputing as soon as the last tensor backward needs has been saved again (*early stop*), by raising an internal exception from inside the segment's last layer: the layer's operation has run, but its module never returns, so its hook never fires. Counting the matrix products with the profiler shows that both implementations do the same work: 10 `Linear` forwards plus 6 recomputed.
"""


# %% slideshow={"slide_type": "-"}
def count_op(fn, op="aten::addmm"):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == op)


print("hooks, use_reentrant=False, 6 children:", forward_counts(model, 2, input_var, use_reentrant=False))
assert forward_counts(model, 2, input_var, use_reentrant=False) == [2, 2, 1, 1, 1, 1]
for use_reentrant in (True, False):
    n_mm = count_op(lambda: checkpoint_sequential(ten, 4, x4, use_reentrant=use_reentrant).sum().backward())
    print(f"use_reentrant={use_reentrant!s:5}: {n_mm} Linear forwards (aten::addmm) in a step of the 10-layer model")
    assert n_mm == 16

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### The U-shaped curve

With $N$ blocks in $k$ segments, the forward keeps the $k-1$ inputs of the checkpointed segments plus the $N/k$ activations of the last, plain segment; backward then recomputes one segment of $N/k$ blocks at a time. The simple count is therefore $k - 1 + N/k$ activations: large for few segments (long segments), large for many (many stored inputs), smallest at $k = \sqrt N$, where it is $2\sqrt N - 1$. Measured on a 64-block chain, against that count:
"""

# %% slideshow={"slide_type": "-"}
N = 64
chain64 = deep_chain(N, WIDTH)
seg_list = [1, 2, 4, 8, 16, 32, 64]
seg_peaks = {True: {}, False: {}}
for preserve in (True, False):
    for k in seg_list:
        run = lambda mod, x, k=k, p=preserve: checkpoint_sequential(mod, k, x, use_reentrant=False, preserve_rng_state=p)  # noqa: E731
        seg_peaks[preserve][k] = step_peak_memory(chain64, x_chain, forward=run).peak_bytes / UNIT
print(" k   peak (default)   peak (preserve_rng_state=False)   k - 1 + N/k")
for k in seg_list:
    print(f"{k:2d}   {seg_peaks[True][k]:14.2f}   {seg_peaks[False][k]:31.2f}   {k - 1 + N / k:11.1f}")
for preserve, peaks_k in seg_peaks.items():
    best = min(peaks_k, key=peaks_k.get)
    print(f"preserve_rng_state={preserve!s:5}: minimum at {best} segments; sqrt({N}) = {math.isqrt(N)}")
    assert best == math.isqrt(N)
# one segment checkpoints nothing; without RNG states, 64 one-block segments cost exactly as much
assert seg_peaks[False][64] == seg_peaks[False][1] == seg_peaks[True][1]

fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(seg_list, [seg_peaks[True][k] for k in seg_list], "o-", label="measured (default)")
ax.plot(seg_list, [seg_peaks[False][k] for k in seg_list], "s-", label="measured, preserve_rng_state=False")
ax.plot(seg_list, [k - 1 + N / k for k in seg_list], "--", label="k - 1 + N/k")
ax.axvline(math.sqrt(N), color="grey", lw=0.8)
ax.set_xscale("log")
ax.set_xticks(seg_list, [str(k) for k in seg_list])
ax.minorticks_off()
ax.set( title=f"Peak memory vs segments, chain of N = {N} blocks", xlabel="segments k (log scale)",
       ylabel="peak (activations of 8 KiB)")
ax.legend(fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
Both measured curves have their minimum at $k = \sqrt{64} = 8$, but they sit well above the simple count: at $k = 8$ the default curve is about half as much again (22.22 against 15). The count leaves out what the next cell adds up: the two gradients in flight (section 2), the recomputed segment's extra tensors (its pre-`Tanh` outputs, alive while the recomputation runs), and, in the default curve, the CPU RNG states, 5,056 bytes each, here 0.62 of an activation: one stored per checkpointed segment, and one more taken while a segment is recomputed (the recomputation saves the current state before restoring the stored one, and puts it back after). The default curve rises more steeply on the right for that last reason: with 64 one-block segments the RNG states alone are 39 activations, and checkpointing costs *more* than not checkpointing at all (1 segment, which checkpoints nothing). Without the RNG states, 64 one-block segments cost exactly as much as no checkpointing. On realistic layers an activation is megabytes and the RNG state is negligible.
"""

# %% slideshow={"slide_type": "-"}
k = 8
simple = k - 1 + N / k
rng_part = (seg_peaks[True][k] - seg_peaks[False][k]) * UNIT / RNG_BYTES
rest_k = seg_peaks[False][k] - simple
print(f"k = {k}: measured {seg_peaks[True][k]:.2f} = simple count {simple:.0f} + {rest_k:.2f} (gradients, recomputed pre-Tanh outputs)"
      f" + {rng_part:.0f} RNG states x {RNG_BYTES / UNIT:.3f}; {seg_peaks[True][k] / simple - 1:.0%} above the simple count")
assert rng_part == k and 0 < rest_k < 5  # k - 1 stored states, and one more while a segment is recomputed

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Peak against depth: slope 1 versus slope ½

Now $\sqrt N$ segments at every depth, against no checkpointing. On log-log axes a power law $N^a$ is a line of slope $a$.
"""

# %% slideshow={"slide_type": "-"}
sweep = [16, 64, 256]
plain_peaks, sqrt_peaks = [], []
for depth in sweep:
    c = deep_chain(depth, WIDTH)
    plain_peaks.append(step_peak_memory(c, x_chain).peak_bytes)
    sqrt_peaks.append(step_peak_memory(c, x_chain, forward=lambda mod, x, k=math.isqrt(depth): checkpoint_sequential(mod, k, x, use_reentrant=False)).peak_bytes)
    print(f"N = {depth:3d}: plain {plain_peaks[-1] / UNIT:7.2f}, sqrt(N) = {math.isqrt(depth):2d} segments {sqrt_peaks[-1] / UNIT:6.2f} activations,"
          f" ratio {plain_peaks[-1] / sqrt_peaks[-1]:.2f}")
slope_plain = np.polyfit(np.log(sweep), np.log(plain_peaks), 1)[0]
slope_sqrt = np.polyfit(np.log(sweep), np.log(sqrt_peaks), 1)[0]
print(f"log-log slopes: plain {slope_plain:.3f}, sqrt(N) segments {slope_sqrt:.3f}")
assert abs(slope_plain - 1) < 0.1 and abs(slope_sqrt - 0.5) < 0.1

fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.loglog(sweep, np.array(plain_peaks) / 2**10, "o-", label=f"no checkpointing (slope {slope_plain:.2f})")
ax.loglog(sweep, np.array(sqrt_peaks) / 2**10, "s-", label=f"sqrt(N) segments (slope {slope_sqrt:.2f})")
ax.set_xticks(sweep, [str(d) for d in sweep])
ax.minorticks_off()
ax.set(title="Peak memory vs depth", xlabel="depth N (blocks, log scale)", ylabel="peak memory (KiB, log scale)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### What it costs: one more forward, mostly

Every checkpointed block runs its forward twice. With $\sqrt N$ segments that is all blocks except the last segment: $N - N/\sqrt N$ extra block forwards, just under one extra forward pass. How much is that against a whole step? A backward through a `Linear` layer computes two matrix products where the forward computed one: one for the gradient of its input, one for the gradient of its weight. `torch.utils.flop_counter.FlopCounterMode` counts the floating-point operations of the matrix products (exactly, from their shapes):
"""

# %% slideshow={"slide_type": "-"}
from torch.utils.flop_counter import FlopCounterMode

with FlopCounterMode(display=False) as forward_flops:
    loss64 = chain64(x_chain).sum()
with FlopCounterMode(display=False) as backward_flops:
    loss64.backward()
f_fwd, f_bwd = forward_flops.get_total_flops(), backward_flops.get_total_flops()
print(f"matrix-product FLOPs of one step: forward {f_fwd:,}, backward {f_bwd:,} = {f_bwd / f_fwd:.0f} x the forward")
assert f_bwd == 2 * f_fwd
print(f"so recomputing {N - N // 8} of {N} blocks adds {(N - N // 8) / N:.3f} / 3 = {(N - N // 8) / N / 3:.1%} to the step's arithmetic")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
A backward costs twice a forward in matrix products, so the arithmetic grows by just under a third. (Only when the input needs a gradient: the first layer of a network, whose input is data, skips one product.) We count the recomputed matrix products with the profiler (exact), then time the step. A timing is only as good as its conditions: other programs on a busy machine slow a step down by whatever share of the cores they take. So we time the CPU time of this thread (`time.thread_time`): PyTorch runs on one thread in this notebook (the setup cell says so), and that thread runs the whole step, backward included; we alternate the two variants round by round, and take the median of the per-round ratios. The numbers are this machine's, hence the `~`.
"""

# %% slideshow={"slide_type": "-"}
extra = count_op(lambda: checkpoint_sequential(chain64, 8, x_chain, use_reentrant=False).sum().backward()) - N
print(f"N = {N}, 8 segments: {extra} of {N} Linear forwards recomputed = {extra / N:.3f} extra forward passes")
assert extra == N - N // 8


def thread_times(fns, rounds=9):
    """Per round, this thread's CPU seconds for each fn(), the fns interleaved, after a warm-up."""
    assert torch.get_num_threads() == 1  # (setup cell) so the whole step, backward included, runs on this thread
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.thread_time()
            fn()
            times[name].append(time.thread_time() - t0)
    return times


times = thread_times({"plain": lambda: chain64(x_chain).sum().backward(),
                      "checkpointed": lambda: checkpoint_sequential(chain64, 8, x_chain, use_reentrant=False).sum().backward()})
overhead = float(np.median(np.array(times["checkpointed"]) / np.array(times["plain"]))) - 1
flop_share = (N - N // 8) / N / 3
print(f"step time: plain ~{np.median(times['plain']) * 1e3:.2f} ms, checkpointed ~{np.median(times['checkpointed']) * 1e3:.2f} ms;"
      f" overhead ~{overhead:.0%}, more than twice the {flop_share:.1%} of extra arithmetic")
assert overhead > 2 * flop_share

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On this tiny chain (8×8 weights) the time overhead is far above the third that the arithmetic predicts: each `checkpoint` call has a fixed cost (saving the RNG state, installing hooks, bookkeeping in Python) that dwarfs a 256×8 matrix product. On layers with real arithmetic the fixed cost fades, but the overhead still stays above the arithmetic's share, for two reasons. Time is not FLOPs: in these blocks `tanh` is dear to compute and its derivative, $1 - y^2$, cheap, so a backward can cost less than two forwards in time, and the recomputed forwards are then a larger share of the step than of its FLOPs. And every tensor saved in a checkpointed block passes three times through saved-tensor hooks (saved, saved again when recomputed, unpacked), Python work that plain autograd does not do. To see both, run `thread_times` above on a `deep_chain` with wider layers and a larger batch.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
**Against the paper.** Chen et al. (2016) split an $n$-layer chain into $\sqrt n$ segments, store only the segment boundaries, and recompute each segment in backward: memory $O(\sqrt n)$ for one extra forward pass; a recursive version reaches $O(\log n)$ memory at $O(n \log n)$ compute. They report a 1,000-layer residual network on ImageNet going from 48 GB to 7 GB. Our measurement shows the same law: the plain peak grows with slope 1, the $\sqrt N$ peak with slope ½, and the minimum over segments is at $\sqrt N$. Our constant factor is about 2 activations per $\sqrt N$ (stored inputs *and* one recomputed segment), plus a few activations of gradients and, in PyTorch, an RNG state per segment. The arithmetic overhead is exactly the paper's one extra forward (minus the last segment); the measured time overhead on this tiny chain is dominated by per-call bookkeeping.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. The Tensor post's CNN, trained with one block checkpointed

The Tensor post checkpoints `cnn_block_2` only. We train two copies from the same weights, one plain and one with block 2 checkpointed (`use_reentrant=False`, Dropout left *inside* the block: notebook 05 §1.1 shows why that is fine), with the same seed for each step's Dropout masks: Adam on batches of 32, for one pass over the training images. The plain copy learns: its loss falls, and its accuracy on the held-out test images is far above guessing. The checkpointed copy learns exactly the same: every loss and every weight agree to float32 rounding.
"""


# %% slideshow={"slide_type": "-"}
def train_steps(model, steps, batch=32, seed=1, desc=None):
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    for step in tqdm(range(steps), desc=desc):
        seed_everything(seed + step)  # same Dropout masks for both models
        idx = torch.arange(step * batch, (step + 1) * batch) % len(train)
        loss = nn.functional.cross_entropy(model(train.x[idx]), train.y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def accuracy(model, data):
    model.eval()  # no Dropout
    with torch.no_grad():
        correct = (model(data.x).argmax(dim=1) == data.y).float().mean().item()
    model.train()
    return correct


STEPS = math.ceil(len(train) / 32)
seed_everything(0)
plain_cnn = DigitsCNN()
ckpt_cnn = DigitsCNN(checkpointed={"cnn_block_2"})
ckpt_cnn.load_state_dict(plain_cnn.state_dict())
plain_losses = train_steps(plain_cnn, STEPS, desc="plain CNN")
ckpt_losses = train_steps(ckpt_cnn, STEPS, desc="block 2 checkpointed")
loss_gap = max(abs(a - b) for a, b in zip(plain_losses, ckpt_losses))
weight_gap = max((a - b).abs().max().item() for a, b in zip(plain_cnn.parameters(), ckpt_cnn.parameters()))
assert loss_gap < 1e-5 and weight_gap < 1e-5
first, last, acc = plain_losses[0], float(np.mean(plain_losses[-5:])), accuracy(plain_cnn, test)
print(f"{STEPS} steps of 32 images, one pass over the {len(train)} training images")
print(f"loss ~{first:.3f} at step 1, ~{last:.3f} over the last 5 steps; test accuracy ~{acc:.1%} (guessing: {1 / 10:.0%})")
assert last < first / 2 and acc > 0.5
print(f"plain vs checkpointed: all {STEPS} losses and every weight equal within 1e-5 (float32 rounding)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
How much does checkpointing one block save in this CNN? First, what each part keeps for backward at batch 128: block 1 works at 8×8 resolution, block 2 at 4×4 after pooling, so block 1 holds most of it.
"""

# %% slideshow={"slide_type": "-"}
xb, yb = train.x[:128].clone(), train.y[:128].clone()
kept = {}
h = xb
for name in ("cnn_block_1", "cnn_block_2", "head"):
    part = getattr(plain_cnn, name)
    with SavedTensorMeter(exclude=part.parameters()) as meter:
        h = part(h)
    kept[name] = meter.bytes
    print(f"{name:12s} keeps {format_bytes(meter.bytes):>9s} for backward")
assert kept["cnn_block_1"] > kept["cnn_block_2"] > kept["head"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Now, for each choice, what the step holds when backward starts (what the forward left allocated) and its peak. The peak includes the temporary buffers of the convolution kernels, which differ between machines: PyTorch's default convolutions on CPUs come from the oneDNN library, whose buffers depend on the CPU's instruction set (and on the number of threads, one in this notebook). So we measure the peak twice: with the default kernels (printed after `~`), and with PyTorch's own convolution kernels (`torch.backends.mkldnn.enabled = False`), whose buffers depend only on the shapes: those bytes are the same on every machine.
"""


# %% slideshow={"slide_type": "-"}
@contextmanager
def pytorch_conv_kernels():
    """Convolutions by PyTorch's own kernels, not oneDNN's, for as long as the block runs."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


ce = lambda out: nn.functional.cross_entropy(out, yb)  # noqa: E731


def forward_and_loss(model):
    """The forward of step_peak_memory's step: the output and the loss, both kept until backward."""
    out = model(xb)
    return out, ce(out)


choices = {"nothing": (), "block 2 (the post's)": ("cnn_block_2",), "block 1": ("cnn_block_1",),
           "blocks 1 and 2": ("cnn_block_1", "cnn_block_2")}
held, own_peak, default_peak = {}, {}, {}
for label, blocks in choices.items():
    model = DigitsCNN(checkpointed=blocks)
    model.load_state_dict(plain_cnn.state_dict())
    held[label] = measure_peak(lambda: forward_and_loss(model)).retained_bytes
    default_peak[label] = step_peak_memory(model, xb, loss_fn=ce).peak_bytes
    with pytorch_conv_kernels():
        own_peak[label] = step_peak_memory(model, xb, loss_fn=ce).peak_bytes
print(f"{'checkpointing':21s} {'held when backward starts':>25s} {'peak, PyTorch kernels':>22s} {'peak, default kernels':>22s}")
for label in choices:
    print(f"{label:21s} {format_bytes(held[label]):>25s} {format_bytes(own_peak[label]):>22s} {own_peak[label] - own_peak['nothing']:+7,} B"
          f"   ~{format_bytes(default_peak[label])} (~{default_peak[label] / default_peak['nothing'] - 1:+.1%})")
assert held["block 1"] < held["nothing"] / 2
assert own_peak["block 2 (the post's)"] == own_peak["nothing"] and own_peak["block 1"] - own_peak["nothing"] == RNG_BYTES
assert all(abs(p / default_peak["nothing"] - 1) < 0.05 for p in default_peak.values())
print(f"checkpointing block 1 holds {format_bytes(held['nothing'] - held['block 1'])} less when backward starts; with PyTorch's"
      f" kernels its peak is one RNG state ({RNG_BYTES:,} B) higher, with the default kernels within 5 % either way")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Checkpointing block 1 cuts what the step holds when backward starts by more than half, and yet the peak does not go down: with PyTorch's kernels it goes *up*, by exactly one RNG state; with the default kernels it moves by a few percent, on this machine by the amount printed. The peak is a maximum over time, and it does not fall at the end of the forward. The memory in use through the whole step (PyTorch's kernels, so the same on every machine) shows where it falls:
"""

# %% slideshow={"slide_type": "-"}
timeline = {}
with pytorch_conv_kernels():
    for label in ("nothing", "block 1"):
        model = DigitsCNN(checkpointed=choices[label])
        model.load_state_dict(plain_cnn.state_dict())
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            held_out, held_loss = forward_and_loss(model)
        n_forward = len(allocation_events(prof))  # the step below makes the same allocations first
        del held_out, held_loss
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step_out, step_loss = forward_and_loss(model)  # the output is kept until backward ends
            step_loss.backward()
        del step_out, step_loss
        timeline[label] = (allocation_events(prof), n_forward)
fig, ax = plt.subplots(figsize=(6.5, 3.2))
for label, (events, n_forward) in timeline.items():
    t_ms = (np.array([t for t, _ in events]) - events[0][0]) / 1e6
    sizes = [nbytes for _, nbytes in events]
    in_use = np.cumsum(sizes)
    at_peak, forward_end_ms = int(np.argmax(in_use)), t_ms[n_forward - 1]
    line, = ax.step(t_ms, in_use / 2**20, where="post", label=f"checkpointing {label}")
    ax.axvline(forward_end_ms, color=line.get_color(), ls=":", lw=1)
    print(f"checkpointing {label:7s}: the forward ends ~{forward_end_ms:.1f} ms in, holding {format_bytes(int(in_use[n_forward - 1]))};"
          f" the peak, {format_bytes(int(in_use[at_peak]))}, comes in backward, reached by allocating {sizes[at_peak]:,} B")
    assert in_use[n_forward - 1] == held[label] and in_use[at_peak] == own_peak[label]  # the table's numbers, to the byte
    assert at_peak >= n_forward and sizes[at_peak] == 128 * 64 * 8 * 8 * 4
ax.set(title="Memory in use during one step of the CNN (PyTorch's kernels)", xlabel="time into the step (ms)",
       ylabel="memory in use (MiB)")
ax.legend(fontsize=8)
plt.show()
print(f"{128 * 64 * 8 * 8 * 4:,} B = {format_bytes(128 * 64 * 8 * 8 * 4)} = one float32 gradient of block 1's 128 x 64 x 8 x 8 feature maps")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The dotted lines mark the end of each forward. In the plain step the memory keeps climbing in backward: gradients are allocated for each layer while the activations of the layers below are still held, and the peak is reached inside block 1's backward, by a 2 MiB gradient of its 64×8×8 feature maps, with all of block 1's activations alive. Checkpointing block 2 removes memory that is already freed by that moment. Checkpointing block 1 keeps the forward low (the lower curve on the left), but backward recomputes block 1's activations right before that moment, so the peak is the same, plus the RNG state the checkpoint stored. The default oneDNN kernels add their buffers to whichever moments they run in, which can shift the peak by a few percent either way. Checkpointing pays when the memory is spread over *many* blocks of similar size, as in the chain of section 4, not when one block dominates. (Block 1's input is the raw image, which does not require grad; with the reentrant implementation that is a trap: notebook 05 §1.3. With `use_reentrant=False`, as here, it is fine.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- A step's memory is parameters + gradients + optimizer state (0 for SGD, 1× for momentum, 2× plus a 4-byte step counter per tensor for Adam) + activations; only the activations grow with batch and depth, and they dominate at large batch (81 % of the CNN's step at batch 256). Around them: the optimizer step's temporaries (on the CPU, Adam's default is the per-tensor loop; `foreach`, the default on GPUs, needs temporaries the size of all parameters), autocast's cast copies, and on GPUs the CUDA context, the allocator's cache and DDP's buckets.
- Saved-tensor hooks count what is kept; the *peak* needs the allocator: `torch.profiler(profile_memory=True)` events on CPU, `torch.cuda.max_memory_allocated` on GPU (`course_lib.memory`). The peak is a maximum over time, the moment of the step when the most is alive, and checkpointing can move that moment.
- Checkpointing keeps a block's inputs and recomputes its forward in backward. Use `use_reentrant=False`, and always pass it: the silent default is still `True` in 2.13, although an exception was announced for 2.9. Each call also stores the CPU RNG state, 5,056 bytes.
- `checkpoint_sequential` counts children and never checkpoints its last segment. The peak is smallest near $k = \sqrt N$ segments, and with $\sqrt N$ segments it grows as $N^{0.5}$ instead of $N^{1}$ (fitted slopes 0.476 and 0.960). The price is just under one extra forward pass: 29.2 % more matrix-product FLOPs. In time it costs more: on section 4's 8-wide chain, per-call bookkeeping dominates and the time overhead is more than twice that (section 4 prints this machine's figure); on wider layers the fixed cost fades, but time is still not FLOPs.
- A CNN with a checkpointed block learns exactly what the plain one learns. Checkpointing one dominant block barely moves its peak, because backward brings the block's activations back at the moment of the peak: checkpointing pays when the memory is spread over many similar blocks.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Exercises

**1.** Write `forward(model, x)` that runs a `deep_chain` model through `checkpoint_sequential` with about $\sqrt N$ segments (`N = len(model)`), the recommended implementation, and no warning. The check measures the peak of your step against the plain one.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_sqrt_checkpointing


def forward(model, x):
    raise NotImplementedError("your code here")


check_sqrt_checkpointing(forward)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Without running an optimizer, write `state_size(model, name)` returning the bytes of optimizer state after one step, for `name` in `"sgd"`, `"sgd_momentum"` and `"adam"` (float32 parameters).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_optimizer_state_bytes


def state_size(model, name):
    raise NotImplementedError("your code here")


check_optimizer_state_bytes(state_size)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## References

- T. Chen, B. Xu, C. Zhang, C. Guestrin, [Training Deep Nets with Sublinear Memory Cost](https://arxiv.org/abs/1604.06174), 2016 — the $\sqrt n$ and $\log n$ schedules.
- PyTorch documentation: [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html) — `checkpoint`, `checkpoint_sequential`, `use_reentrant`, `preserve_rng_state`.
- PyTorch documentation: [Hooks for saved tensors](https://pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html) — the mechanism behind the non-reentrant checkpoint.
- PyTorch documentation: [torch.profiler](https://pytorch.org/docs/stable/profiler.html) — `profile_memory=True`; and [CUDA semantics: memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management) — `max_memory_allocated`, the caching allocator, the CUDA context.
- PyTorch documentation: [torch.optim](https://pytorch.org/docs/stable/optim.html) — the per-tensor, `foreach` and `fused` implementations, and which one is the default.
- PyTorch documentation: [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html) — `gradient_as_bucket_view`.
- Notebook 05 goes on with Dropout, BatchNorm, selective checkpointing, offloading, `torch.compile` and the GPU's memory tools; its references cover them.
"""
