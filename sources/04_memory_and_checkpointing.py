# %% [markdown] slideshow={"slide_type": "slide"}
r"""
# 04 · Where training memory goes, and gradient checkpointing measured

A training step needs memory for four things: the parameters, their gradients, the optimizer's state, and the *activations* that the forward pass keeps for the backward pass. The first three are fixed by the model; the activations grow with the batch and with the depth, and in deep networks they dominate. *Gradient checkpointing* keeps only some of them and recomputes the rest during backward: memory for compute. Chen et al. (2016) showed that for a chain of $N$ layers this brings activation memory from $O(N)$ down to $O(\sqrt N)$ at the price of one extra forward pass. This notebook measures all of it, in bytes, on a CPU.

By the end of this notebook you will be able to:
- split the memory of a training step into parameters, gradients, optimizer state (SGD vs Adam) and activations, and measure each;
- measure the *peak* memory of a forward + backward step on CPU from the allocator's own events, and say why saved-tensor hooks and `tracemalloc` are not enough;
- explain how checkpointing works, write a minimal checkpoint `autograd.Function` by hand, and choose between `use_reentrant=True` and `False`;
- use `checkpoint` and `checkpoint_sequential` with the current API, and measure the $\sqrt N$ result and the time it costs;
- avoid the three classic pitfalls: Dropout, BatchNorm running statistics, and a block whose input does not require grad;
- choose what to save and what to recompute op by op (selective checkpointing), or move saved tensors elsewhere (`save_on_cpu`);
- say what `torch.compile` does with a checkpoint and with the tensors autograd saves (AOTAutograd's rematerialisation, the activation-memory budget), and read a GPU memory snapshot.

This notebook assumes: notebooks 02 and 03 (the autograd graph, saved tensors, `SavedTensorMeter`, and writing a `torch.autograd.Function`), and a first idea of what an optimizer does.
"""

# %% slideshow={"slide_type": "-"}
import math
import os
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from course_lib.checkpointing import (OpCounter, bn_safe_context_fn, checkpoint_bn_safe, checkpoint_momentum, deep_chain,
                                      frozen_bn_stats)
from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.memory import allocation_events, measure_peak, state_bytes, step_peak_memory, tensor_bytes
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything

seed_everything(0)
train, test = digits()
print(f"digits: {len(train)} training images of shape {tuple(train.x.shape[1:])}, {len(test)} test images")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Where memory goes in one training step

Our model is the small CNN of the seed post, written for CIFAR-10 (3×32×32 images), adapted to scikit-learn's digits (1×8×8): the first convolution takes 1 channel instead of 3, and after two 2×2 poolings the feature map is 64×2×2, so the head's first `Linear` takes 256 inputs instead of 64·8·8. The `checkpointed` argument names the blocks to run through `torch.utils.checkpoint`; we use it from section 5 on.
"""


# %% slideshow={"slide_type": "-"}
class DigitsCNN(nn.Module):
    """The seed's CIFAR10Model, adapted to 1x8x8 digits; `checkpointed` blocks are recomputed in backward."""

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
"""
### What else takes memory

Four parts are the model's; a real step has more, most of them on a GPU:

- **The CUDA context**: each process that touches a GPU first loads CUDA's kernels and state, typically a few hundred MiB that `torch.cuda.memory_allocated` never shows (PyTorch's [CUDA semantics notes](https://pytorch.org/docs/stable/notes/cuda.html#memory-management): `nvidia-smi` shows more than PyTorch reports). GPU only.
- **The allocator's cache**: freed GPU memory stays *reserved* by PyTorch's caching allocator for reuse, so `nvidia-smi` and `memory_reserved` read more than `memory_allocated`; fragmentation can make a step fail with memory free. Section 9 shows it in a GPU cell.
- **DDP's buckets**: `DistributedDataParallel` keeps the gradients in flat communication buckets, a second gradient-sized copy unless `gradient_as_bucket_view=True` ([DDP documentation](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html)); notebook 08 builds the buckets. Multi-process, not shown here.
- **Autocast's weight-cast cache** (notebook 05): inside one `torch.autocast` region each weight is cast to the low precision once and the copy is kept until the region ends. Shown below on CPU.
- **The optimizer step's temporaries**: the default `foreach` implementation of Adam works on whole lists of tensors at once, so its temporaries have the size of *all* parameters, where the one-tensor-at-a-time loop (`foreach=False`) needs temporaries for one tensor at a time (here two of the largest tensor's size); `fused=True` (one kernel per step, on GPUs and CPUs in recent releases) avoids most of them. Shown below on CPU.
"""

# %% slideshow={"slide_type": "-"}
step_peaks = {}
for foreach in (False, True):
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
`tracemalloc` traces Python's allocator, not PyTorch's; `torch.cpu` has no counterpart of `torch.cuda.max_memory_allocated`. What works on CPU is the profiler: with `profile_memory=True`, `torch.profiler` records every call to the allocator as an event carrying its size, positive for an allocation and negative for a free. Adding the sizes up in time order gives the memory in use at each moment; its maximum is the peak. Reading those sizes needs one non-public detail: the public `prof.events()` does not carry them, so `course_lib.memory.allocation_events(prof)` reads the profiler's private record (`prof.profiler.kineto_results`) and returns plain `(time, bytes)` pairs. It is the only place the course touches that record, and a test fails with a clear message if a PyTorch release renames it. The running sum is then ordinary arithmetic, here by hand and checked against `measure_peak`:
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

A checkpointed block runs its forward pass *without recording a graph* and keeps only its inputs. In backward, when its gradient is needed, it runs the forward again, this time recording, and backpropagates through that fresh graph. Its activations exist only during its own backward. The seed post shows PyTorch's old implementation, `CheckpointFunction`. Here is the idea in a dozen lines (no RNG handling yet: section 6):
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
The seed's `CheckpointFunction.forward` wraps the call in `with torch.no_grad()`. The `assert` above shows that it is redundant: `autograd.Function.forward` already runs with grad mode off. What it keeps: the plain chain saves 17 activations (the input and one per block); checkpointed, only the input. The allocator shows what that is worth at the peak, recomputation included:
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
print(f"torch's checkpoint also saves the CPU RNG state per call (section 6.1): {RNG_BYTES:,} bytes = {RNG_BYTES / UNIT:.2f} activations")
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
Where the extra fractions come from: the reentrant `checkpoint` is our `NaiveCheckpoint` plus one saved RNG state per call (section 6.1), 10.18 + 4 × 0.62 = 12.65 activations, to the byte. The non-reentrant one is leaner without RNG states (9.14), and its RNG states add between 4 and 5 states' worth, because with them the peak falls at a different moment of the backward. Checkpointing the whole chain as *one* block does not help at all: in backward it recomputes all 16 activations at once, while also holding the block's output gradient, one activation more than the plain step. The gain comes from *several* checkpointed pieces: with four, at most 4 inputs are stored and 4 blocks recomputed at a time (section 4 finds the best number). Note also what the meter cannot see: it counts what is saved, and the recomputation happens during backward. Inside PyTorch's checkpoint the meter sees nothing at all in backward, which is why this notebook measures peaks with the allocator:
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

- **`use_reentrant=True`** is the seed's `CheckpointFunction` (and our `NaiveCheckpoint`): an `autograd.Function` whose backward calls `torch.autograd.backward` again, *re-entering* the autograd engine. Consequences: the parameters used inside the block are invisible to the outer graph (their `.grad` is filled by the inner backward call), so it only works with `.backward()`, not `torch.autograd.grad`; its output requires grad only if some *input* does (section 6.3), and keyword arguments are not supported.
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
Passing `use_reentrant` is still optional in PyTorch 2.13, and the silent default is still the *reentrant* form. The docstring says "in version 2.9 we will raise an exception"; on 2.13 it is still a warning. Always pass it explicitly.
"""

# %% slideshow={"slide_type": "-"}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint(f, x0)
message = str(caught[0].message)
print(f"{caught[0].category.__name__}: {message[:118]}...")
assert "use_reentrant parameter should be passed explicitly" in message
print("PyTorch", torch.__version__, "- still a warning, and the default is still use_reentrant=True")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
One more practical fact: the first `checkpoint` call in a process is slow. `checkpoint` is decorated with `torch._disable_dynamo`, which keeps Dynamo (the front end of `torch.compile`) from tracing *into* checkpoint's Python code, and that decorator imports `torch._dynamo` on first use: seconds on 2 cores. It does not mean that `torch.compile` leaves checkpoints alone: a compiled function captures the call whole and decides the recomputation itself (section 8). In this notebook something earlier has already imported Dynamo, so we show the import in a fresh Python process. Warm up once before timing anything.
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

`checkpoint_sequential(functions, segments, input, use_reentrant=...)` splits a sequential model into `segments` pieces and checkpoints each. First, the seed's snippet, run as written:
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
Which layers does it actually checkpoint? It counts the `Sequential`'s *children*, so each `ReLU` counts as a layer; it uses `len(children) // segments` layers per segment; and it never checkpoints the *last* segment, which also gets the remainder. We count how many times each child runs its forward in one step: twice means checkpointed (forward + recompute).
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

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
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
Both measured curves have their minimum at $k = \sqrt{64} = 8$, but they sit well above the simple count: at $k = 8$ the default curve is about half as much again (22.22 against 15). The count leaves out what the next cell adds up: the two gradients in flight (section 2), the recomputed segment's extra tensors (its pre-`Tanh` outputs, alive while the recomputation runs), and, in the default curve, the CPU RNG states, 5,056 bytes each, here 0.62 of an activation: one stored per checkpointed segment, and one more taken while a segment is recomputed (the recomputation saves the current state before restoring the stored one, and puts it back after). The default curve climbs faster on the right for that last reason: with 64 one-block segments the RNG states alone are 39 activations, and checkpointing costs *more* than not checkpointing at all (1 segment, which checkpoints nothing). Without the RNG states, 64 one-block segments cost exactly as much as no checkpointing. On realistic layers an activation is megabytes and the RNG state is negligible.
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

Now $\sqrt N$ segments at every depth, against no checkpointing. On log-log axes a power law $N^a$ is a line of slope $a$. (`benchmarks/checkpoint_memory.py` goes deeper, to $N = 1024$.)
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
A backward costs twice a forward in matrix products, so the arithmetic grows by just under a third. (Only when the input needs a gradient: the first layer of a network, whose input is data, skips one product.) We count the recomputed matrix products with the profiler (exact), then time the step (this machine's numbers, after a warm-up).
"""

# %% slideshow={"slide_type": "-"}
extra = count_op(lambda: checkpoint_sequential(chain64, 8, x_chain, use_reentrant=False).sum().backward()) - N
print(f"N = {N}, 8 segments: {extra} of {N} Linear forwards recomputed = {extra / N:.3f} extra forward passes")
assert extra == N - N // 8

def timed(fn, repeat=5):
    """Median seconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


t_plain = timed(lambda: chain64(x_chain).sum().backward())
t_ckpt = timed(lambda: checkpoint_sequential(chain64, 8, x_chain, use_reentrant=False).sum().backward())
print(f"step time: plain ~{t_plain * 1e3:.2f} ms, checkpointed ~{t_ckpt * 1e3:.2f} ms, overhead ~{(t_ckpt / t_plain - 1) * 100:.0f} %")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On this tiny chain (8×8 weights) the measured overhead is usually well above a third: each `checkpoint` call has a fixed cost (saving RNG state, installing hooks, bookkeeping in Python) that dwarfs a 256×8 matrix product. On layers with real arithmetic the fixed cost fades, but not all the way to a third: `benchmarks/checkpoint_memory.py` measures about +50 % on 128-wide layers, and models it term by term. Time is not FLOPs: there a backward costs about 1.5 forwards, not 2 (`tanh` is dear to compute and its derivative, $1 - y^2$, cheap), so one recomputed forward is a larger share of the step, about +34 %; every tensor saved in a checkpointed block passes three times through Python saved-tensor hooks (saved, saved again when recomputed, unpacked), about +10 %; and the calls' fixed costs add about +5 % (each term measured by `benchmarks/checkpoint_memory.py`).
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
**Against the paper.** Chen et al. (2016) split an $n$-layer chain into $\sqrt n$ segments, store only the segment boundaries, and recompute each segment in backward: memory $O(\sqrt n)$ for one extra forward pass; a recursive version reaches $O(\log n)$ memory at $O(n \log n)$ compute. They report a 1,000-layer residual network on ImageNet going from 48 GB to 7 GB. Our measurement shows the same law: the plain peak grows with slope 1, the $\sqrt N$ peak with slope ½, and the minimum over segments is at $\sqrt N$. Our constant factor is about 2 activations per $\sqrt N$ (stored inputs *and* one recomputed segment), plus a few activations of gradients and, in PyTorch, an RNG state per segment. The arithmetic overhead is exactly the paper's one extra forward (minus the last segment); the measured time overhead on this tiny chain is dominated by per-call bookkeeping, and the benchmark measures it on wider layers.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. The seed's CNN, with one block checkpointed, trained on digits

The seed checkpoints `cnn_block_2` only. We train two copies from the same weights for 10 steps of Adam (a few steps keep the notebook fast; they are enough to compare the two runs), one plain and one with block 2 checkpointed (`use_reentrant=False`, Dropout left *inside* the block: section 6 shows why that is fine), with the same seed for each step's Dropout masks. The losses and the final weights agree to float32 rounding.
"""


# %% slideshow={"slide_type": "-"}
def train_steps(model, steps=10, batch=32, seed=1):
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    for step in range(steps):
        seed_everything(seed + step)  # same Dropout masks for both models
        idx = torch.arange(step * batch, (step + 1) * batch) % len(train)
        loss = nn.functional.cross_entropy(model(train.x[idx]), train.y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


seed_everything(0)
plain_cnn = DigitsCNN()
ckpt_cnn = DigitsCNN(checkpointed={"cnn_block_2"})
ckpt_cnn.load_state_dict(plain_cnn.state_dict())
plain_losses = train_steps(plain_cnn)
ckpt_losses = train_steps(ckpt_cnn)
loss_gap = max(abs(a - b) for a, b in zip(plain_losses, ckpt_losses))
weight_gap = max((a - b).abs().max().item() for a, b in zip(plain_cnn.parameters(), ckpt_cnn.parameters()))
assert loss_gap < 1e-5 and weight_gap < 1e-5
print(f"losses, plain: ~{plain_losses[0]:.3f} at step 1 ... ~{plain_losses[-1]:.3f} at step 10")
print("10 steps, plain vs checkpointed: every loss and every weight equal within 1e-5 (float32 rounding)")

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
Now the measured peak of a step with each choice:
"""

# %% slideshow={"slide_type": "-"}
ce = lambda out: nn.functional.cross_entropy(out, yb)  # noqa: E731
cnn_peaks = {}
for label, blocks in [("nothing", ()), ("block 2 (seed)", ("cnn_block_2",)), ("block 1", ("cnn_block_1",)),
                      ("blocks 1 and 2", ("cnn_block_1", "cnn_block_2"))]:
    seed_everything(0)
    model = DigitsCNN(checkpointed=blocks)
    model.load_state_dict(plain_cnn.state_dict())
    cnn_peaks[label] = step_peak_memory(model, xb, loss_fn=ce).peak_bytes
    # the peak includes the convolution kernels' workspace, which differs between CPUs: printed after '~'
    print(f"checkpointing {label:15s}: peak ~{format_bytes(cnn_peaks[label])}, change ~{cnn_peaks[label] / cnn_peaks['nothing'] - 1:+.1%}")
change = {label: peak / cnn_peaks["nothing"] - 1 for label, peak in cnn_peaks.items()}
assert all(abs(c) < 0.05 for c in change.values())
print(f"every choice moves the peak by less than 5 % either way, although block 1 alone keeps "
      f"{format_bytes(kept['cnn_block_1'])} for backward")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Much less than the table above suggests, and nothing for the seed's choice. How much exactly depends on the temporary buffers your CPU's convolution kernels allocate, the one part of these peaks that differs between machines (hence the `~`): checkpointing block 1 lowered the peak by 2.5 % on the CPU that recorded this notebook (AVX-512), by 3.5 % with AVX2 kernels and not at all with PyTorch's portable kernels (`make test-portable` runs this notebook under both); block 2 moved it by less than 3 % either way on all three. The peak is a maximum *over time*, and checkpointing moves part of it into backward: a checkpointed block's activations come back when it is recomputed. Block 2 is recomputed while block 1's activations are still held, which is the moment of the plain peak, so nothing is gained. Block 1 is recomputed last, when everything else is freed, so the step's peak becomes block 1's own activations plus gradients: at best a few percent lower. Checkpointing pays off when there are *many* blocks of similar size, as in the chain of section 4, not one block that dominates. (Block 1's input is the raw image, which does not require grad; with the reentrant implementation that is a trap: section 6.3. With `use_reentrant=False`, as here, it is fine.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Pitfalls

### 6.1 Dropout inside a checkpoint

The seed says: the forward runs twice, Dropout draws a different mask the second time, so the gradients are wrong; put the checkpoint before or after Dropout. That was a real problem once. Today `checkpoint` has `preserve_rng_state=True` by default: it saves the CPU RNG state (and that of each GPU holding one of the block's tensor *inputs*) before the forward and restores it for the recomputation, so Dropout draws the same mask. Only with `preserve_rng_state=False` do the gradients go wrong:
"""

# %% slideshow={"slide_type": "-"}
block = nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, WIDTH))
x_d = torch.randn(32, WIDTH, requires_grad=True)


def dropout_grads(forward):
    block.zero_grad(set_to_none=True)
    seed_everything(7)
    forward(x_d).square().sum().backward()
    return torch.cat([p.grad.flatten() for p in block.parameters()])


g_ref = dropout_grads(block)
for use_reentrant in (False, True):
    for preserve in (True, False):
        g = dropout_grads(lambda t: checkpoint(block, t, use_reentrant=use_reentrant, preserve_rng_state=preserve))
        same = torch.allclose(g, g_ref)
        print(f"use_reentrant={use_reentrant!s:5}, preserve_rng_state={preserve!s:5}: gradients match the plain block: {same}")
        assert same is preserve
print(f"the price of preserving it on CPU: a {torch.get_rng_state().numel()}-byte RNG state per checkpoint call")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Which GPUs' states? `checkpoint` asks `torch.utils.checkpoint.get_device_states(*args)`: the devices of the tensors passed *in*. A block that receives CPU tensors and moves them to a GPU inside, or draws random numbers on a GPU none of its inputs lives on, gets no GPU state saved, and its recomputed Dropout masks there differ. Under `torch.compile` the flag is ignored altogether (section 8). On this CPU there is nothing to save; section 9 shows a GPU input.
"""

# %% slideshow={"slide_type": "-"}
from torch.utils.checkpoint import get_device_states

devices, states = get_device_states(x_d, "not a tensor", 3)
print(f"GPU RNG states saved for a block with CPU inputs: devices {devices}, states {states}")
assert (devices, states) == ([], [])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So keep Dropout wherever the model needs it, and leave `preserve_rng_state=True`. Set it to `False` only for blocks without randomness, to skip saving and restoring the RNG state.

### 6.2 BatchNorm: the running statistics update twice

In training mode, every BatchNorm forward updates `running_mean`, `running_var` and `num_batches_tracked`. A checkpointed block runs its forward twice per step, so the update happens twice:
"""


# %% slideshow={"slide_type": "-"}
def bn_block(momentum=0.1):
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU())


def run_steps(block, steps, forward):
    """`steps` training steps of `block`, each through `forward(block, x)`; returns its BatchNorm layer."""
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        x = torch.randn(64, WIDTH, generator=g) * 2 + 1
        forward(block, x).square().mean().backward()
    return block[1]


def plain_forward(block, x):
    return block(x)


def ckpt_forward(block, x):
    return checkpoint(block, x, use_reentrant=False)


ref_bn = run_steps(bn_block(), 1, plain_forward)
ck_bn = run_steps(bn_block(), 1, ckpt_forward)
print("running_mean[:3], plain       :", [round(v, 4) for v in ref_bn.running_mean[:3].tolist()], " batches:", int(ref_bn.num_batches_tracked))
print("running_mean[:3], checkpointed:", [round(v, 4) for v in ck_bn.running_mean[:3].tolist()], " batches:", int(ck_bn.num_batches_tracked))
assert not torch.allclose(ref_bn.running_mean, ck_bn.running_mean)
assert (int(ref_bn.num_batches_tracked), int(ck_bn.num_batches_tracked)) == (1, 2)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
**The robust fix: leave the statistics alone while recomputing.** The recomputation exists only to rebuild tensors for backward; it has no business updating statistics. The non-reentrant `checkpoint` has a hook for exactly this: `context_fn`, a function returning two context managers, the first entered around the forward, the second around the recomputation. The second one here sets each BatchNorm layer's momentum to 0 (the update $r \leftarrow (1 - 0)\,r + 0 \cdot x$ leaves $r$ bit for bit unchanged) and hides its `num_batches_tracked` counter, then puts both back. The output does not change: in training mode BatchNorm normalises with the batch's own statistics. Written by hand, then checked over 10 steps against the block without checkpointing and against `course_lib.checkpointing.checkpoint_bn_safe`, which does the same:
"""

# %% slideshow={"slide_type": "-"}
from contextlib import contextmanager, nullcontext


@contextmanager
def frozen_stats(block):
    bns = [m for m in block.modules() if isinstance(m, nn.BatchNorm1d)]
    saved = [(bn.momentum, bn.num_batches_tracked) for bn in bns]
    for bn in bns:
        bn.momentum, bn.num_batches_tracked = 0.0, None  # no update, no count
    try:
        yield
    finally:
        for bn, (momentum, counter) in zip(bns, saved):
            bn.momentum, bn.num_batches_tracked = momentum, counter


def guarded_forward(block, x):
    return checkpoint(block, x, use_reentrant=False, context_fn=lambda: (nullcontext(), frozen_stats(block)))


ref_bn = run_steps(bn_block(), 10, plain_forward)
for label, forward in [("by hand", guarded_forward), ("checkpoint_bn_safe", checkpoint_bn_safe)]:
    bn = run_steps(bn_block(), 10, forward)
    same = [torch.equal(getattr(bn, b), getattr(ref_bn, b)) for b in ("running_mean", "running_var", "num_batches_tracked")]
    print(f"{label:18s}: running_mean, running_var, num_batches_tracked identical to the plain block: {same};"
          f" momentum still {bn.momentum}")
    assert all(same) and bn.momentum == 0.1
with frozen_bn_stats(bn_block()) as n_frozen:  # the library's context manager, for any norm layer with running stats
    pass
assert n_frozen == 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Identical, not merely close: the statistics see the same single update per step as without checkpointing, and nothing about the module changes for good. `context_fn` exists only in the non-reentrant form, one more reason for `use_reentrant=False`; the reentrant form has a BatchNorm surprise of its own: when the block's input does not require grad it is never recomputed at all, so its statistics update once and its parameters learn nothing (section 6.3). Section 8 shows why the guard also matters under `torch.compile`, and why it takes a different form there.
"""

# %% slideshow={"slide_type": "-"}
with expect_error(ValueError, match="only supported when use_reentrant=False"):
    checkpoint(bn_block(), torch.randn(4, WIDTH), use_reentrant=True, context_fn=lambda: (nullcontext(), nullcontext()))

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### The momentum algebra (eager mode only)

The seed fixes the double update another way: replace the momentum by its square root, so that two updates add up to one. This is worth working through, because it explains the problem exactly, but it is a fix for eager mode only, and only when the block is recomputed exactly once per step (section 8 shows it going wrong under `torch.compile`; a forward in training mode without a backward gives the smaller update only), and it changes the module for good. Whether the square root is right depends on what "momentum" means, and the two conventions in use are opposite:

- **old-weight** (the seed, Keras, TensorFlow): $r \leftarrow m\,r + (1-m)\,x$, typically $m = 0.9$;
- **PyTorch**: $r \leftarrow (1-m)\,r + m\,x$, default $m = 0.1$.

Both describe the same update (0.9 on the old value is 0.1 on the new one). Two updates with $m'$ on the same batch statistic $x$ must equal one update with $m$, for every $r$ and $x$: the difference of the two, a polynomial in $r$ and $x$, must have both coefficients zero. One equation is enough, because an update is a weighted average of $r$ and $x$ whose weights sum to 1: whatever weight $r$ keeps, $x$ gets the rest, so the coefficient of $x$ in the difference is minus the coefficient of $r$. In PyTorch's convention that equation is $(1 - m')^2 = 1 - m$, quadratic, so it has two roots, and only one of them is a momentum between 0 and 1. SymPy does each step:
"""

# %% slideshow={"slide_type": "-"}
import sympy as sp

m_, mp, r, xs = sp.symbols("m m' r x", positive=True)
conventions = {"old-weight": lambda r_, mom: mom * r_ + (1 - mom) * xs,
               "pytorch": lambda r_, mom: (1 - mom) * r_ + mom * xs}
solutions = {}
for name, update in conventions.items():
    once, twice = update(r, m_), update(update(r, mp), mp)
    difference = sp.expand(twice - once)                            # must vanish for every r and x
    coeff_r, coeff_x = difference.coeff(r), difference.coeff(xs)
    assert sp.expand(difference - coeff_r * r - coeff_x * xs) == 0  # nothing else: it is linear in r and x
    assert sp.expand(coeff_r + coeff_x) == 0                        # weights sum to 1: one equation, not two
    roots = sp.solve(coeff_r, mp)
    in_range = [s for s in roots if all(0 <= s.subs(m_, v) <= 1 for v in (0.01, 0.5, 0.99))]
    assert len(in_range) == 1
    solutions[name] = in_range[0]
    assert sp.simplify(twice.subs(mp, solutions[name]) - once) == 0
    print(f"{name:10s}: coefficient of r: {sp.factor(coeff_r)} = 0;  roots {roots};  the momentum: m' = {solutions[name]}")
assert sp.simplify(solutions["old-weight"] - sp.sqrt(m_)) == 0
assert sp.simplify(solutions["pytorch"] - (1 - sp.sqrt(1 - m_))) == 0
print(f"seed, m = 0.9 (old-weight): m' = sqrt(0.9) = {float(solutions['old-weight'].subs(m_, 0.9)):.4f}")
print(f"PyTorch, m = 0.1         : m' = 1 - sqrt(0.9) = {float(solutions['pytorch'].subs(m_, 0.1)):.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So the seed is right *in its own convention*, and its recipe is wrong when typed into PyTorch: `momentum=math.sqrt(0.1)` (0.316) or `momentum=math.sqrt(0.9)` (0.949) both weigh the new batch far too much. The correct PyTorch value is `1 - math.sqrt(1 - 0.1)` = 0.0513, which `course_lib.checkpointing.checkpoint_momentum` computes. Checked over 10 eager training steps, against the block without checkpointing:
"""

# %% slideshow={"slide_type": "-"}
results = {}
for label, momentum in [("no fix (0.1)", 0.1), ("sqrt(0.1)", math.sqrt(0.1)), ("sqrt(0.9)", math.sqrt(0.9)),
                        ("1 - sqrt(0.9)", 1 - math.sqrt(0.9))]:
    bn = run_steps(bn_block(momentum), 10, ckpt_forward)
    ok = torch.allclose(bn.running_mean, ref_bn.running_mean, atol=1e-6) and torch.allclose(bn.running_var, ref_bn.running_var, atol=1e-6)
    err = (bn.running_mean - ref_bn.running_mean).abs().max().item()
    results[label] = ok
    print(f"momentum {label:14s}= {momentum:.4f}: running stats match: {ok!s:5}  (max error in mean {err:.4f})")
assert results == {"no fix (0.1)": False, "sqrt(0.1)": False, "sqrt(0.9)": False, "1 - sqrt(0.9)": True}
assert checkpoint_momentum(0.1) == 1 - math.sqrt(0.9)
print(f"num_batches_tracked after 10 steps with the momentum fix: {int(bn.num_batches_tracked)} (the guard: 10)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Close, but the counter still says 20 batches for 10 steps. It matters only with `momentum=None`, where BatchNorm keeps a plain cumulative average (momentum $1/n$). In that mode no fix is needed for the statistics: averaging every batch twice gives the same average, and only the counter doubles. The guard gets the counter right too:
"""

# %% slideshow={"slide_type": "-"}
ref_none = run_steps(bn_block(None), 10, plain_forward)
ck_none = run_steps(bn_block(None), 10, ckpt_forward)
safe_none = run_steps(bn_block(None), 10, checkpoint_bn_safe)
assert torch.allclose(ref_none.running_mean, ck_none.running_mean, atol=1e-6)
assert torch.allclose(ref_none.running_var, ck_none.running_var, atol=1e-6)
assert torch.equal(ref_none.running_mean, safe_none.running_mean) and torch.equal(ref_none.running_var, safe_none.running_var)
print(f"momentum=None: running stats match without any fix; num_batches_tracked plain {int(ref_none.num_batches_tracked)},"
      f" checkpointed {int(ck_none.num_batches_tracked)}, with the guard {int(safe_none.num_batches_tracked)}")
assert int(safe_none.num_batches_tracked) == int(ref_none.num_batches_tracked) == 10

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 6.3 A checkpointed block whose input does not require grad

The seed warns against checkpointing the first block, whose input is the raw data: the parameters inside would stop learning. That is true of the *reentrant* implementation only. Its `autograd.Function` is recorded in the graph only if an input requires grad; a raw image does not, so backward never reaches the block, and the parameters *inside* it get no gradient, silently apart from a warning. It propagates: the output does not require grad either, so a second reentrant checkpoint right after it is skipped too. The non-reentrant form records the block's operations normally, so its parameters get their gradients.
"""


# %% slideshow={"slide_type": "-"}
def grads_present(use_reentrant, input_requires_grad=False):
    seed_everything(0)
    model = DigitsCNN(checkpointed={"cnn_block_1", "cnn_block_2"}, use_reentrant=use_reentrant)
    images = train.x[:32].clone().requires_grad_(input_requires_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.functional.cross_entropy(model(images), train.y[:32]).backward()
    present = {name: all(p.grad is not None for p in getattr(model, name).parameters()) for name in ("cnn_block_1", "cnn_block_2", "head")}
    return present, sorted({str(w.message) for w in caught})


for use_reentrant in (True, False):
    present, messages = grads_present(use_reentrant)
    print(f"use_reentrant={use_reentrant!s:5}: parameters with gradients {present}")
    for msg in messages:
        print("   warning:", msg)
assert grads_present(True)[0] == {"cnn_block_1": False, "cnn_block_2": False, "head": True}
assert grads_present(False)[0] == {"cnn_block_1": True, "cnn_block_2": True, "head": True}

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
With `use_reentrant=True`, the old workaround is to make the input require grad (`x.requires_grad_()`), which costs an unneeded input gradient. With `use_reentrant=False` there is nothing to work around.
"""

# %% slideshow={"slide_type": "-"}
present, messages = grads_present(True, input_requires_grad=True)
print(f"use_reentrant=True, images.requires_grad_(): parameters with gradients {present}, warnings: {len(messages)}")
assert present == {"cnn_block_1": True, "cnn_block_2": True, "head": True} and not messages

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. Choosing what to keep: selective checkpointing and offloading

Plain checkpointing is all or nothing for a block: every tensor it would save is dropped and recomputed. Two tools built on the same saved-tensor mechanism refine that.

### 7.1 Selective activation checkpointing

Recomputing a matrix product costs much more than recomputing a GELU, while their outputs are the same size. *Selective* activation checkpointing (SAC) decides op by op: `torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)` builds the pair of contexts for `context_fn` (section 6.2's hook again), and the policy is a function called for every operation in the forward, `policy(ctx, op, *args, **kwargs)`, returning a `CheckpointPolicy`: `MUST_SAVE`/`PREFER_SAVE` to keep the output, `MUST_RECOMPUTE`/`PREFER_RECOMPUTE` to drop it (`MUST_` tells `torch.compile` not to overrule the choice). Below, a policy that keeps the products and recomputes everything else, against no checkpointing and plain checkpointing, on 4 blocks `Linear(64, 64)` + GELU. What is kept is read from the allocator (what the forward left allocated, minus its output); what is recomputed is counted by `course_lib.checkpointing.OpCounter`, a `TorchDispatchMode` that sees every operation that really runs (the profiler would also count the products SAC answers from its cache).
"""

# %% slideshow={"slide_type": "-"}
from functools import partial

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


gelu_chain = deep_chain(4, 64, activation="gelu")
x_sac = torch.randn(512, 64, generator=torch.Generator().manual_seed(5), requires_grad=True)
ACT = 512 * 64 * 4  # bytes of one activation of this chain
# preserve_rng_state=False: nothing random inside, and the byte counts stay free of RNG states
strategies = {
    "no checkpoint": lambda m, x: m(x),
    "checkpoint": lambda m, x: checkpoint(m, x, use_reentrant=False, preserve_rng_state=False),
    "selective": lambda m, x: checkpoint(m, x, use_reentrant=False, preserve_rng_state=False,
                                         context_fn=partial(create_selective_checkpoint_contexts, save_matmuls)),
}
sac_rows, sac_grads = {}, {}
for label, forward in strategies.items():
    gelu_chain.zero_grad(set_to_none=True)
    x_sac.grad = None
    fwd = measure_peak(lambda: forward(gelu_chain, x_sac))
    kept_bytes = fwd.retained_bytes - ACT  # what the forward left allocated, minus its output
    with OpCounter() as ops:
        fwd.result.sum().backward()
    sac_rows[label] = (kept_bytes, ops.count("aten.addmm"), ops.count("aten.gelu"))
    sac_grads[label] = [x_sac.grad.clone()] + [p.grad.clone() for p in gelu_chain.parameters()]
    print(f"{label:14s}: kept for backward {format_bytes(kept_bytes):>9s} = {kept_bytes / ACT:.0f} activations;"
          f" recomputed in backward: {sac_rows[label][1]} matrix products, {sac_rows[label][2]} GELUs")
assert all(torch.allclose(a, b, atol=1e-6) for label in ("checkpoint", "selective")
           for a, b in zip(sac_grads[label], sac_grads["no checkpoint"]))
assert sac_rows["checkpoint"][0] == 0 and sac_rows["selective"][0] == 4 * ACT
assert sac_rows["selective"][1] == 0 < sac_rows["checkpoint"][1] and sac_rows["selective"][2] > 0
print("gradients: all three equal within 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Selective checkpointing sits between the two: it keeps the 4 product outputs (the GELUs' inputs), recomputes only the cheap GELUs whose outputs the next products need, and never redoes a matrix product. That is section 10's advice, "large activations, cheap recomputation first", as code. In a Transformer the usual policies keep the attention and feed-forward products (or only some of them) and recompute the element-wise work.

### 7.2 Offloading saved tensors: `save_on_cpu`

Another way out: keep every saved tensor, but somewhere else. `torch.autograd.graph.save_on_cpu(pin_memory=True)` copies each tensor autograd saves to CPU memory in forward and copies it back in backward; with `pin_memory=True` the CPU copy is in page-locked memory, so the copies can overlap with GPU work. It is nothing more than a `saved_tensors_hooks` pair (notebook 02): its pack hook sees exactly the tensors `SavedTensorMeter` counts. On this CPU the copy is CPU to CPU and saves nothing, but the mechanism is the same:
"""

# %% slideshow={"slide_type": "-"}
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks

offload = save_on_cpu(pin_memory=True)  # pinned only where a GPU exists: here a plain CPU copy
assert isinstance(offload, saved_tensors_hooks)
packed = []
pack_to_cpu = offload.pack_hook
offload.pack_hook = lambda t: packed.append(t.shape) or pack_to_cpu(t)  # count, then do what it does
gelu_chain.zero_grad(set_to_none=True)
x_sac.grad = None
with offload:
    loss = gelu_chain(x_sac).sum()
loss.backward()
offload_grads = [x_sac.grad] + [p.grad for p in gelu_chain.parameters()]
with SavedTensorMeter() as meter:
    gelu_chain(x_sac).sum()
print(f"save_on_cpu packed {len(packed)} tensors; SavedTensorMeter counts {meter.count} saved tensors")
print("what one pack returns:", type(pack_to_cpu(torch.ones(2))).__name__, "(device, CPU copy) - unpack copies it back to that device")
assert len(packed) == meter.count
assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(offload_grads, sac_grads["no checkpoint"]))
print("gradients equal those without offloading, within 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Offloading costs transfer time instead of recomputation: on a GPU each saved tensor crosses the PCIe or NVLink-C2C link twice. It pays when the link is idle during compute and the activations are large; checkpointing pays when the arithmetic is cheap. The two combine: 2.13's `CheckpointPolicy` also has `MUST_CPU_OFFLOAD`/`PREFER_CPU_OFFLOAD`, for the compiler's partitioner to offload chosen operations' outputs (eager selective checkpointing treats them as recompute, as its source in `torch/utils/checkpoint.py` shows).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. Checkpointing under `torch.compile`

`torch.compile(fn)` has two stages that matter here. **Dynamo** reads the Python bytecode and captures the tensor operations as an FX graph; **AOTAutograd** traces that graph together with its backward into one *joint* graph, then *partitions* it into a forward graph and a backward graph, deciding which intermediate tensors the forward saves for the backward. A backend then compiles both graphs: Inductor generates fused kernels; `aot_eager` runs the two graphs with ordinary eager kernels, which shows the structure without a C++ compiler and in a second rather than tens. This section uses `aot_eager`.

### 8.1 Dynamo captures `checkpoint` whole

A `torch.compile` backend is any function that receives the captured graph; this one prints it and runs it unchanged:
"""


# %% slideshow={"slide_type": "-"}
def op_names(gm):
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]


captured = {}


def show_graph(gm, example_inputs):
    """A torch.compile backend: record the graph Dynamo captured, then run it as it is."""
    captured["graph"] = op_names(gm)
    captured.update({name: op_names(sub) for name, sub in gm.named_children()})
    return gm.forward


small = nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, WIDTH))
x_small = torch.randn(4, WIDTH, requires_grad=True)
torch.compile(lambda t: checkpoint(small, t, use_reentrant=False), backend=show_graph)(x_small)
for name, ops_ in captured.items():
    print(f"{name:12s}: {ops_}")
assert captured["graph"][0] == "tag_activation_checkpoint" and captured["wrap_body_0"] == ["linear", "tanh", "linear"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The whole checkpointed block became one node, a *higher-order operator* `tag_activation_checkpoint` whose body is the block's own graph. Nothing of checkpoint's Python code (its hooks, its RNG handling) runs inside the compiled function: AOTAutograd marks the body's operations "recompute" and its partitioner puts them into the backward graph. Catching the two graphs with `aot_autograd`'s `fw_compiler` and `bw_compiler` shows it:
"""

# %% slideshow={"slide_type": "-"}
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd


def aot_graphs(fn, *args):
    """The aten operations of the forward and backward graphs AOTAutograd makes of fn, run once."""
    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = [str(n.target).removeprefix("aten.").removesuffix(".default")
                            for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=min_cut_rematerialization_partition)
    torch.compile(fn, backend=backend)(*args).sum().backward()
    return graphs


for label, fn in [("plain", small), ("checkpointed", lambda t: checkpoint(small, t, use_reentrant=False))]:
    g = aot_graphs(fn, x_small)
    computing = [op for op in g["backward"] if op not in ("t", "view", "detach", "sum.dim_IntList")]
    print(f"{label:12s} forward graph : {g['forward']}")
    print(f"{'':12s} backward graph: {computing}")
    recomputed = [op for op in ("addmm", "tanh") if op in g["backward"]]
    assert recomputed == ([] if label == "plain" else ["addmm", "tanh"])
preserve_note = " ".join(checkpoint.__doc__.split("preserve_rng_state(bool, optional):")[1].split("Default")[0].split())
print("checkpoint's docstring on preserve_rng_state:", preserve_note)
assert "under torch.compile, this flag doesn't take effect" in preserve_note

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Compiled, the checkpointed block's backward graph starts by recomputing `addmm` and `tanh`, and the forward graph is the same in both cases: the recomputation is now a property of the graphs, decided at compile time. Two consequences: `preserve_rng_state` is ignored (the docstring says so; random operations are handled by the compiler), and anything checkpoint's Python code did at run time, such as calling `context_fn`'s second context around the recomputation, does not happen the same way (section 8.3).

### 8.2 The partitioner recomputes without being asked

AOTAutograd's default partitioner for the `aot_eager` and Inductor backends is `min_cut_rematerialization_partition`. It treats "what does the forward save?" as a minimum cut in the joint graph: cheap element-wise operations are recomputed in the backward when that means saving fewer bytes, with no `checkpoint` anywhere. Counted with `SavedTensorMeter`, which also sees the tensors a compiled function saves (they pass through the same hooks), for a product followed by element-wise work:
"""


# %% slideshow={"slide_type": "-"}
def pointwise_after_matmul(x, w):
    h = x @ w
    return (torch.sin(h) * torch.cos(h)).relu()


x_pm = torch.randn(256, 64, requires_grad=True)
w_pm = torch.randn(64, 64, requires_grad=True)
PM = 256 * 64 * 4  # bytes of one 256 x 64 activation


def saved_by(fn):
    with SavedTensorMeter(exclude=[x_pm, w_pm]) as meter:  # the inputs are not activations
        out = fn(x_pm, w_pm)
    return meter.count, meter.bytes, out


torch._dynamo.reset()
pm_rows = {"eager": saved_by(pointwise_after_matmul)}
for backend in ("aot_eager_default_partitioner", "aot_eager"):  # the same graphs, two partitioners
    compiled = torch.compile(pointwise_after_matmul, backend=backend)
    compiled(x_pm, w_pm)  # compile once
    pm_rows[backend] = saved_by(compiled)
reference = torch.autograd.grad(pointwise_after_matmul(x_pm, w_pm).sum(), (x_pm, w_pm))
for label, (count, nbytes, out) in pm_rows.items():
    grads_pm = torch.autograd.grad(out.sum(), (x_pm, w_pm))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_pm, reference))
    print(f"{label:30s}: {count} tensors saved (inputs and weights included), activations {format_bytes(nbytes):>8s} = {nbytes / PM:.0f} of 64 KiB")
assert pm_rows["aot_eager"][1] < pm_rows["aot_eager_default_partitioner"][1] <= pm_rows["eager"][1]
print("gradients: equal within 1e-5 in all three")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Eager saves what each operation asks for: the product's output (for `sin` and for `cos`), `sin` and `cos` of it (for the product rule) and the ReLU's output, 4 activations; the default partitioner saves what the backward graph reads, the same 4. The min-cut partitioner saves 2, the product's output and the ReLU's output, and recomputes `sin` and `cos` in the backward graph. Inductor fuses that recomputation into the backward's own kernels, so on a GPU, where such operations are limited by memory traffic rather than arithmetic, it is almost free.

**The activation-memory budget.** `torch._functorch.config.activation_memory_budget` (default 1.0) asks the partitioner to recompute more, down to a fraction of the activations it would otherwise save, choosing what to recompute by estimated cost (a knapsack problem): 0 recomputes everything it can. On two products with `tanh`:
"""


# %% slideshow={"slide_type": "-"}
def two_layers(x, w1, w2):
    return torch.tanh(torch.tanh(x @ w1) @ w2)


import torch._functorch.config as functorch_config

w2_pm = torch.randn(64, 64, requires_grad=True)
budget_rows = {}
for budget in (1.0, 0.5, 0.0):
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget):
        compiled = torch.compile(two_layers, backend="aot_eager")
        compiled(x_pm, w_pm, w2_pm)
        with SavedTensorMeter(exclude=[x_pm, w_pm, w2_pm]) as meter:
            out = compiled(x_pm, w_pm, w2_pm)
    grads_b = torch.autograd.grad(out.sum(), (x_pm, w_pm, w2_pm))
    budget_rows[budget] = meter.bytes
    print(f"activation_memory_budget={budget:.1f}: activations saved {format_bytes(meter.bytes):>8s} = {meter.bytes / PM:.0f} of 64 KiB")
reference = torch.autograd.grad(two_layers(x_pm, w_pm, w2_pm).sum(), (x_pm, w_pm, w2_pm))
assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_b, reference))
assert budget_rows[1.0] > budget_rows[0.5] > budget_rows[0.0]
torch._dynamo.reset()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The knob trades memory for recomputation across the whole compiled graph, without marking blocks by hand; `checkpoint` and SAC policies inside a compiled function are hints the partitioner respects (`MUST_` ones always).

### 8.3 BatchNorm in a compiled checkpoint

Section 6.2's problem looks different compiled. AOTAutograd turns BatchNorm's update of its running statistics into an output of the forward graph, written back once; the recomputation in the backward graph rebuilds only what the gradients need. So a compiled checkpoint updates the statistics *once* per step, and the eager momentum fix, which assumed two updates, now under-updates, silently. The guard of section 6.2 has no such assumption, but its `context_fn` returns ordinary context managers, and under `torch.compile` `context_fn` must return two `TorchDispatchMode`s (the kind SAC uses). `checkpoint_bn_safe` therefore asks `torch.compiler.is_compiling()` and passes no guard when compiled, where none is needed. Ten steps each, eager and compiled:
"""

# %% slideshow={"slide_type": "-"}
import logging

logging.getLogger("torch._higher_order_ops.wrap").setLevel(logging.ERROR)  # a one-time notice about context_fn
ref_bn = run_steps(bn_block(), 10, plain_forward)
bn_rows = {}
for label, momentum, forward in [("checkpoint", 0.1, ckpt_forward),
                                 ("momentum fix", checkpoint_momentum(0.1), ckpt_forward),
                                 ("checkpoint_bn_safe", 0.1, checkpoint_bn_safe)]:
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        fwd = forward if mode == "eager" else torch.compile(forward, backend="aot_eager")
        bn = run_steps(bn_block(momentum), 10, fwd)
        match = torch.allclose(bn.running_mean, ref_bn.running_mean, atol=1e-6) and torch.allclose(bn.running_var, ref_bn.running_var, atol=1e-6)
        bn_rows[label, mode] = (int(bn.num_batches_tracked), match)
        print(f"{label:18s} {mode:8s}: num_batches_tracked {int(bn.num_batches_tracked):2d} (plain: 10), running stats match: {match}")
assert bn_rows == {("checkpoint", "eager"): (20, False), ("checkpoint", "compiled"): (10, True),
                   ("momentum fix", "eager"): (20, True), ("momentum fix", "compiled"): (10, False),
                   ("checkpoint_bn_safe", "eager"): (10, True), ("checkpoint_bn_safe", "compiled"): (10, True)}
block = bn_block()
with expect_error(torch._dynamo.exc.BackendCompilerFailed, match="must generate a tuple of two `TorchDispatchMode`s",
                  quiet=True) as caught:
    torch.compile(lambda t: checkpoint(block, t, use_reentrant=False, context_fn=bn_safe_context_fn(block)),
                  backend="aot_eager")(torch.randn(8, WIDTH))
reason = next(line for line in str(caught.error).splitlines() if "TorchDispatchMode" in line)
print(f"the eager guard, compiled: {type(caught.error).__name__}: {reason.strip()}")
torch._dynamo.reset()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Only the guard is right in both modes, and it never changes the module. (The plain checkpoint happens to be right when compiled; the same code then double-counts the day someone runs it eagerly, to debug, say.)

**What Inductor adds, and what you get without a compiler.** `torch.compile`'s default backend, Inductor, takes the same two graphs and generates fused kernels: Triton on GPUs, C++ with OpenMP on CPUs, which needs a working C++ compiler. The fusion is what makes the partitioner's recomputation nearly free. Its first compilation is slow: a tiny function took about 21 s on this course's 2-core machine while the course was written (not re-run here, to keep the notebook under a minute). Without a compiler, `backend="aot_eager"` runs everything in this section: Dynamo's capture, AOTAutograd's joint graph, the partitioner and the memory it saves; only the fused kernels, and so the speed, are missing.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 9. On a GPU: peaks, the caching allocator and memory snapshots

On a GPU the same measurements read `torch.cuda.max_memory_allocated`; `measure_peak(..., device="cuda")` does it for you:
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("peak GPU memory of a deep chain with and without checkpointing"):
    gpu_chain = deep_chain(256, 64).cuda()
    xg = torch.randn(4096, 64, device="cuda", requires_grad=True)
    gp = step_peak_memory(gpu_chain, xg)
    gs = step_peak_memory(gpu_chain, xg, forward=lambda m, x: checkpoint_sequential(m, 16, x, use_reentrant=False))
    print(f"CUDA peak: plain {format_bytes(gp.peak_bytes)}, 16 segments {format_bytes(gs.peak_bytes)}, ratio {gp.peak_bytes / gs.peak_bytes:.1f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Section 6.1's RNG states, on a GPU: `checkpoint` saves the state of each GPU that holds one of the block's tensor inputs, and only those:
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("checkpoint saves the RNG state of the GPUs holding its inputs"):
    devices, states = get_device_states(torch.ones(2, device="cuda"), torch.ones(2))
    print(f"a block with one GPU input and one CPU input: GPU states saved for devices {devices}")
    assert devices == [torch.cuda.current_device()] and len(states) == 1
    assert get_device_states(torch.ones(2)) == ([], [])  # a block that moves its input to the GPU inside: none

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**The caching allocator.** `cudaMalloc` and `cudaFree` are slow and synchronise the device, so PyTorch keeps freed GPU memory *reserved* in its own cache and reuses it. `torch.cuda.memory_allocated` counts what tensors use; `torch.cuda.memory_reserved` what PyTorch holds from the driver, which is what `nvidia-smi` shows (plus the CUDA context). The gap is reusable by PyTorch but not by another process, and when blocks of different sizes interleave it fragments: a step can fail "out of memory" with gigabytes reserved but free. `torch.cuda.empty_cache()` returns the unused cache to the driver (it does not make your own step fit). `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, set before CUDA starts, lets the allocator grow segments in place instead of reserving new fixed-size ones, which avoids much of the fragmentation ([CUDA memory management notes](https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)).
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("the caching allocator: memory allocated vs reserved"):
    torch.cuda.empty_cache()
    alloc0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    alloc1, reserved1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    del big
    alloc2, reserved2 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    reserved3 = torch.cuda.memory_reserved()
    print(f"256 MiB tensor: allocated +{format_bytes(alloc1 - alloc0)}, reserved +{format_bytes(reserved1 - reserved0)}")
    print(f"after del     : allocated +{format_bytes(alloc2 - alloc0)}, reserved +{format_bytes(reserved2 - reserved0)} (kept in the cache)")
    print(f"empty_cache() : reserved +{format_bytes(reserved3 - reserved0)}")
    print("PYTORCH_CUDA_ALLOC_CONF =", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(not set)"))
    assert alloc2 == alloc0 and reserved2 - reserved0 >= 256 * 2**20 and reserved3 <= reserved2

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Memory snapshots.** For every real out-of-memory error the tool of choice is the allocator's own history: `torch.cuda.memory._record_memory_history()` starts recording every allocation and free with its Python stack, `torch.cuda.memory._dump_snapshot(path)` writes it to a file, and the viewer at [pytorch.org/memory_viz](https://pytorch.org/memory_viz) (it runs in your browser) draws memory over time, one coloured band per tensor, with the stack that allocated it. A checkpointed step shows the saw-tooth of section 4: each segment's activations come back during its recomputation and go again. The functions start with an underscore but are documented ([Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html)).
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("a memory snapshot of a checkpointed training step, for pytorch.org/memory_viz"):
    import tempfile
    from pathlib import Path

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    snap_chain = deep_chain(64, 256).cuda()
    xs_gpu = torch.randn(4096, 256, device="cuda", requires_grad=True)
    checkpoint_sequential(snap_chain, 8, xs_gpu, use_reentrant=False).sum().backward()
    snapshot_path = Path(tempfile.gettempdir()) / "04_checkpointed_step.pickle"
    torch.cuda.memory._dump_snapshot(str(snapshot_path))
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    n_events = sum(len(trace) for trace in snapshot["device_traces"])
    print(f"{n_events} allocator events recorded; snapshot written to {snapshot_path}: open it at https://pytorch.org/memory_viz")
    assert snapshot_path.stat().st_size > 0 and n_events > 0

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 10. When to checkpoint

Checkpointing trades memory for compute; spend it where it buys the most:

- **Only when memory is the limit.** It never makes a step faster. If the batch fits, do not checkpoint; if it almost fits, checkpointing a little may let you double the batch.
- **Measure the peak, not what is kept.** The peak is a maximum over time; a checkpointed block's activations return during its recomputation. In the CNN, checkpointing the dominant block gained a few percent and the seed's block 2 nothing. Checkpointing works when the memory is spread over many similar blocks. On a GPU, a memory snapshot shows where the peak is.
- **Large activations, cheap recomputation first.** Element-wise layers (activations, normalisation, Dropout) and high-resolution early layers hold big tensors and cost little to recompute; a big matmul or convolution costs the most to redo. Selective checkpointing (section 7.1) says exactly that, op by op; under `torch.compile` the partitioner already recomputes cheap operations, and the activation-memory budget asks for more (section 8.2).
- **Blocks of a repeated structure, about $\sqrt N$ of them.** For a stack of identical layers (a Transformer, a ResNet stage), checkpoint each layer or group of layers; the memory minimum is near $\sqrt N$ segments and the cost is about one extra forward.
- **Mind the last segment and the head.** `checkpoint_sequential` leaves the last segment plain; the loss and head are usually cheap to keep.
- **Always `use_reentrant=False`**, keep `preserve_rng_state=True` when there is randomness inside, and keep BatchNorm statistics out of the recomputation: `checkpoint_bn_safe` (a recompute guard through `context_fn`, right eager and compiled), or keep BatchNorm outside checkpointed blocks, or use a normalisation without running statistics (LayerNorm, GroupNorm). Do not change the momentum: that fix holds in eager mode only.
- **Offload when the link is idle**: `save_on_cpu` trades transfers for recomputation.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- A step's memory is parameters + gradients + optimizer state (0 for SGD, 1× for momentum, 2× plus step counters for Adam) + activations; only the activations grow with batch and depth, and they dominate at large batch. Around them: the CUDA context, the allocator's cache, DDP's buckets, autocast's cast copies and the optimizer step's temporaries (`foreach` ones the size of all parameters).
- Saved-tensor hooks count what is kept; the *peak* needs the allocator: `torch.profiler(profile_memory=True)` events on CPU, `torch.cuda.max_memory_allocated` on GPU (`course_lib.memory`).
- Checkpointing keeps a block's inputs and recomputes its forward in backward. Use `use_reentrant=False` (and always pass it: the silent default is still `True` in 2.13).
- `checkpoint_sequential` counts children, never checkpoints the last segment; with $\sqrt N$ segments the peak grows as $N^{0.5}$ instead of $N^{1}$, for just under one extra forward pass: a third more matrix-product FLOPs, about half as much again in time on small CPU layers (hooks and bookkeeping).
- Dropout is safe with `preserve_rng_state=True` (CPU and the GPUs holding the inputs); BatchNorm's running statistics need a recompute guard through `context_fn` (`checkpoint_bn_safe`), right in eager and compiled mode; the momentum $1 - \sqrt{1-m}$ explains the problem but holds in eager mode only; the reentrant form silently skips blocks whose input does not require grad.
- Selective checkpointing chooses op by op what to save (`create_selective_checkpoint_contexts`); `save_on_cpu` offloads saved tensors; both are saved-tensor mechanisms.
- Under `torch.compile`, `checkpoint` becomes a higher-order op and AOTAutograd's partitioner decides what is recomputed; it recomputes cheap operations even without checkpointing, and `activation_memory_budget` asks for more. On GPUs, `memory_allocated` vs `memory_reserved` and memory snapshots explain what `nvidia-smi` shows.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** (Eager mode.) A BatchNorm layer with PyTorch momentum `m` sits inside a checkpointed block, run eagerly. Write `corrected_momentum(m)` returning the momentum that makes its two updates per step equal one update with `m`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_bn_momentum


def corrected_momentum(m):
    raise NotImplementedError("your code here")


check_bn_momentum(corrected_momentum)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
**2.** Write `forward(model, x)` that runs a `deep_chain` model through `checkpoint_sequential` with about $\sqrt N$ segments (`N = len(model)`), the recommended implementation, and no warning. The check measures the peak of your step against the plain one.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_sqrt_checkpointing


def forward(model, x):
    raise NotImplementedError("your code here")


check_sqrt_checkpointing(forward)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Without running an optimizer, write `state_size(model, name)` returning the bytes of optimizer state after one step, for `name` in `"sgd"`, `"sgd_momentum"` and `"adam"` (float32 parameters).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_optimizer_state_bytes


def state_size(model, name):
    raise NotImplementedError("your code here")


check_optimizer_state_bytes(state_size)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4.** Write a selective-checkpointing policy `policy(ctx, op, *args, **kwargs)` that keeps the outputs of matrix products (`torch.ops.aten.mm.default`, `torch.ops.aten.addmm.default`) and recomputes everything else. The check runs it on a GELU chain and counts what is kept and what is recomputed.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_sac_policy


def policy(ctx, op, *args, **kwargs):
    raise NotImplementedError("your code here")


check_sac_policy(policy)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**5.** Write `forward(block, x)` that checkpoints a block containing BatchNorm so that, step after step, its running statistics and `num_batches_tracked` equal those of `block(x)`, without changing the block for good. `x` is raw data (it does not require grad). Use `checkpoint` and a context manager of your own, not `checkpoint_bn_safe`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_bn_safe_forward


def forward(block, x):
    raise NotImplementedError("your code here")


check_bn_safe_forward(forward)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## References

- T. Chen, B. Xu, C. Zhang, C. Guestrin, [Training Deep Nets with Sublinear Memory Cost](https://arxiv.org/abs/1604.06174), 2016 — the $\sqrt n$ and $\log n$ schedules.
- PyTorch documentation: [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html) — `checkpoint`, `checkpoint_sequential`, `use_reentrant`, `preserve_rng_state`.
- PyTorch documentation: [torch.profiler](https://pytorch.org/docs/stable/profiler.html) — `profile_memory=True`; and [CUDA memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management) — `max_memory_allocated`.
- PyTorch documentation: [BatchNorm1d](https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm1d.html) — the momentum convention, `momentum=None` and `num_batches_tracked`.
- PyTorch documentation: [Hooks for saved tensors](https://pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html) — the mechanism behind the non-reentrant checkpoint.
- S. Ioffe, C. Szegedy, [Batch Normalization](https://arxiv.org/abs/1502.03167), 2015.
- PyTorch documentation: [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html) — `context_fn`, `create_selective_checkpoint_contexts`, `CheckpointPolicy`; and [torch.autograd.graph.save_on_cpu](https://pytorch.org/docs/stable/autograd.html#torch.autograd.graph.save_on_cpu).
- PyTorch blog: [Current and New Activation Checkpointing Techniques in PyTorch](https://pytorch.org/blog/activation-checkpointing-techniques/), 2025 — selective checkpointing, the compile partitioner and the activation-memory budget.
- J. Ansel et al., [PyTorch 2: Faster Machine Learning Through Dynamic Python Bytecode Transformation and Graph Compilation](https://doi.org/10.1145/3620665.3640366), ASPLOS 2024 — Dynamo, AOTAutograd, Inductor; and the [torch.compile documentation](https://pytorch.org/docs/stable/torch.compiler.html).
- PyTorch documentation: [Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html) — memory snapshots and the viewer at pytorch.org/memory_viz; [CUDA semantics: memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management) — the caching allocator and `PYTORCH_CUDA_ALLOC_CONF`.
"""
