# %% [markdown] slideshow={"slide_type": "slide"}
r"""
# 04 · Where training memory goes, and gradient checkpointing measured

A training step needs memory for four things: the parameters, their gradients, the optimizer's state, and the *activations* that the forward pass keeps for the backward pass. The first three are fixed by the model; the activations grow with the batch and with the depth, and in deep networks they dominate. *Gradient checkpointing* keeps only some of them and recomputes the rest during backward: memory for compute. Chen et al. (2016) showed that for a chain of $N$ layers this brings activation memory from $O(N)$ down to $O(\sqrt N)$ at the price of one extra forward pass. This notebook measures all of it, in bytes, on a CPU.

By the end of this notebook you will be able to:
- split the memory of a training step into parameters, gradients, optimizer state (SGD vs Adam) and activations, and measure each;
- measure the *peak* memory of a forward + backward step on CPU from the allocator's own events, and say why saved-tensor hooks and `tracemalloc` are not enough;
- explain how checkpointing works, write a minimal checkpoint `autograd.Function` by hand, and choose between `use_reentrant=True` and `False`;
- use `checkpoint` and `checkpoint_sequential` with the current API, and measure the $\sqrt N$ result and the time it costs;
- avoid the three classic pitfalls: Dropout, BatchNorm running statistics, and a block whose input does not require grad.

This notebook assumes: notebooks 02 and 03 (the autograd graph, saved tensors, `SavedTensorMeter`, and writing a `torch.autograd.Function`), and a first idea of what an optimizer does.
"""

# %% slideshow={"slide_type": "-"}
import math
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from course_lib.checkpointing import checkpoint_momentum, deep_chain, prepare_batchnorm_for_checkpointing
from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.memory import measure_peak, state_bytes, step_peak_memory, tensor_bytes
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
`tracemalloc` traces Python's allocator, not PyTorch's; `torch.cpu` has no counterpart of `torch.cuda.max_memory_allocated`. What works on CPU is the profiler: with `profile_memory=True`, `torch.profiler` records every allocation (positive bytes) and free (negative bytes). Adding them up in time order gives the memory in use at each moment; its maximum is the peak. That is all `course_lib.memory.measure_peak` does; here it is by hand, checked against the library:
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
events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
running = np.cumsum([e.nbytes() for e in events])
print("bytes per event:", [e.nbytes() for e in events])
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
for use_reentrant in (True, False):
    run = lambda seg, x, r=use_reentrant: checkpoint(seg, x, use_reentrant=r)  # noqa: E731
    peak = step_peak_memory(chain, x_chain, forward=in_segments(run, 4)).peak_bytes
    print(f"torch checkpoint, use_reentrant={use_reentrant!s:5}, same four segments: {peak / UNIT:.2f}")
    assert peak < plain.peak_bytes
rng_state = torch.get_rng_state()
print(f"torch's checkpoint also saves the CPU RNG state per call (section 6.1): {rng_state.numel()} bytes = {rng_state.numel() / UNIT:.2f} activations")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
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
One more practical fact: the first `checkpoint` call in a process is slow. `checkpoint` is wrapped so that `torch.compile` leaves it alone, and that wrapper imports `torch._dynamo` (the compiler's front end) on first use: seconds on 2 cores. In this notebook something earlier has already imported it, so we show it in a fresh Python process. Warm up once before timing anything.
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

With $N$ blocks in $k$ segments, the forward keeps the $k-1$ segment inputs plus the $N/k$ activations of the last, plain segment; backward then recomputes one segment of $N/k$ blocks at a time. The peak is about $k + N/k$ activations: large for few segments (long segments), large for many (many stored inputs), smallest at $k = \sqrt N$, where it is about $2\sqrt N$. Measured on a 64-block chain:
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
Both measured curves have their minimum at $k = \sqrt{64} = 8$. They sit a few activations above the simple count: the gradients flowing through the block being backpropagated, and the pre-`Tanh` output recomputed alongside. The default curve climbs faster on the right because each `checkpoint` call also stores the CPU RNG state, 5,056 bytes, here 0.62 of an activation per segment: with 64 one-block segments that alone is 39 activations, and checkpointing costs *more* than not checkpointing at all (1 segment, which checkpoints nothing). Without the RNG states, 64 one-block segments cost exactly as much as no checkpointing. On realistic layers an activation is megabytes and the RNG state is negligible.

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

Every checkpointed block runs its forward twice. With $\sqrt N$ segments that is all blocks except the last segment: $N - N/\sqrt N$ extra block forwards, just under one extra forward pass. Since a backward costs about twice a forward, the arithmetic grows by about a third. We count the matrix products with the profiler (exact), then time the step (this machine's numbers, after a warm-up).
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
On this tiny chain (8×8 weights) the measured overhead is usually well above a third: each `checkpoint` call has a fixed cost (saving RNG state, installing hooks, bookkeeping in Python) that dwarfs a 256×8 matrix product. On layers with real arithmetic the fixed cost fades and the overhead approaches the extra forward pass; `benchmarks/checkpoint_memory.py` measures it on 128-wide layers.
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
Much less than the table above suggests, and nothing for the seed's choice. How much exactly depends on the temporary buffers your CPU's convolution kernels allocate, the one part of these peaks that differs between machines (hence the `~`): checkpointing block 1 lowered the peak by 2.5 % on the CPU that recorded this notebook (AVX-512), by 3.5 % with AVX2 kernels and not at all with PyTorch's portable kernels; block 2 moved it by less than 3 % either way on all three. The peak is a maximum *over time*, and checkpointing moves part of it into backward: a checkpointed block's activations come back when it is recomputed. Block 2 is recomputed while block 1's activations are still held, which is the moment of the plain peak, so nothing is gained. Block 1 is recomputed last, when everything else is freed, so the step's peak becomes block 1's own activations plus gradients: at best a few percent lower. Checkpointing pays off when there are *many* blocks of similar size, as in the chain of section 4, not one block that dominates. (Block 1's input is the raw image, which does not require grad; with the reentrant implementation that is a trap: section 6.3. With `use_reentrant=False`, as here, it is fine.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Pitfalls

### 6.1 Dropout inside a checkpoint

The seed says: the forward runs twice, Dropout draws a different mask the second time, so the gradients are wrong; put the checkpoint before or after Dropout. That was a real problem once. Today `checkpoint` has `preserve_rng_state=True` by default: it saves the CPU RNG state (and that of each GPU used) before the forward and restores it for the recomputation, so Dropout draws the same mask. Only with `preserve_rng_state=False` do the gradients go wrong:
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
So keep Dropout wherever the model needs it, and leave `preserve_rng_state=True`. Set it to `False` only for blocks without randomness, to skip saving and restoring the RNG state.

### 6.2 BatchNorm: the running statistics update twice

In training mode, every BatchNorm forward updates `running_mean`, `running_var` and `num_batches_tracked`. A checkpointed block runs its forward twice per step, so the update happens twice:
"""


# %% slideshow={"slide_type": "-"}
def bn_block(momentum=0.1):
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU())


def run_steps(block, steps, ckpt):
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        x = torch.randn(64, WIDTH, generator=g) * 2 + 1
        out = checkpoint(block, x, use_reentrant=False) if ckpt else block(x)
        out.square().mean().backward()
    return block[1]


ref_bn = run_steps(bn_block(), 1, ckpt=False)
ck_bn = run_steps(bn_block(), 1, ckpt=True)
print("running_mean[:3], plain       :", [round(v, 4) for v in ref_bn.running_mean[:3].tolist()], " batches:", int(ref_bn.num_batches_tracked))
print("running_mean[:3], checkpointed:", [round(v, 4) for v in ck_bn.running_mean[:3].tolist()], " batches:", int(ck_bn.num_batches_tracked))
assert not torch.allclose(ref_bn.running_mean, ck_bn.running_mean)
assert (int(ref_bn.num_batches_tracked), int(ck_bn.num_batches_tracked)) == (1, 2)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
The seed's fix: replace the momentum by its square root. Whether that is right depends on what "momentum" means, and the two conventions in use are opposite:

- **old-weight** (the seed, Keras, TensorFlow): $r \leftarrow m\,r + (1-m)\,x$, typically $m = 0.9$;
- **PyTorch**: $r \leftarrow (1-m)\,r + m\,x$, default $m = 0.1$.

Both describe the same update (0.9 on the old value is 0.1 on the new one). Two updates with $m'$ on the same batch statistic $x$ must equal one update with $m$, for every $r$ and $x$. SymPy solves both:
"""

# %% slideshow={"slide_type": "-"}
import sympy as sp

m_, mp, r, xs = sp.symbols("m m' r x", positive=True)
conventions = {"old-weight": lambda r_, mom: mom * r_ + (1 - mom) * xs,
               "pytorch": lambda r_, mom: (1 - mom) * r_ + mom * xs}
solutions = {}
for name, update in conventions.items():
    once, twice = update(r, m_), update(update(r, mp), mp)
    coeffs = sp.Poly(sp.expand(twice - once), r, xs).coeffs()   # must vanish for every r and x
    candidates = sp.solve(coeffs[0], mp)
    sol = [s for s in candidates if all(0 <= s.subs(m_, v) <= 1 for v in (0.01, 0.5, 0.99))][0]
    assert sp.simplify(twice.subs(mp, sol) - once) == 0
    solutions[name] = sol
    print(f"{name:10s}: m' = {sol}   (candidates {candidates})")
assert sp.simplify(solutions["old-weight"] - sp.sqrt(m_)) == 0
assert sp.simplify(solutions["pytorch"] - (1 - sp.sqrt(1 - m_))) == 0
print(f"seed, m = 0.9 (old-weight): m' = sqrt(0.9) = {float(solutions['old-weight'].subs(m_, 0.9)):.4f}")
print(f"PyTorch, m = 0.1         : m' = 1 - sqrt(0.9) = {float(solutions['pytorch'].subs(m_, 0.1)):.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So the seed is right *in its own convention*, and its recipe is wrong when typed into PyTorch: `momentum=math.sqrt(0.1)` (0.316) or `momentum=math.sqrt(0.9)` (0.949) both weigh the new batch far too much. The correct PyTorch value is `1 - math.sqrt(1 - 0.1)` = 0.0513, which `course_lib.checkpointing.checkpoint_momentum` computes and `prepare_batchnorm_for_checkpointing(block)` applies to every BatchNorm layer of a block. Checked over 10 training steps, against the block without checkpointing:
"""

# %% slideshow={"slide_type": "-"}
ref_bn = run_steps(bn_block(), 10, ckpt=False)
results = {}
for label, momentum in [("no fix (0.1)", 0.1), ("sqrt(0.1)", math.sqrt(0.1)), ("sqrt(0.9)", math.sqrt(0.9)),
                        ("1 - sqrt(0.9)", 1 - math.sqrt(0.9))]:
    bn = run_steps(bn_block(momentum), 10, ckpt=True)
    ok = torch.allclose(bn.running_mean, ref_bn.running_mean, atol=1e-6) and torch.allclose(bn.running_var, ref_bn.running_var, atol=1e-6)
    err = (bn.running_mean - ref_bn.running_mean).abs().max().item()
    results[label] = ok
    print(f"momentum {label:14s}= {momentum:.4f}: running stats match: {ok!s:5}  (max error in mean {err:.4f})")
assert results == {"no fix (0.1)": False, "sqrt(0.1)": False, "sqrt(0.9)": False, "1 - sqrt(0.9)": True}

block = bn_block()
changed = prepare_batchnorm_for_checkpointing(block)
print("prepare_batchnorm_for_checkpointing:", {k: (round(a, 4), round(b, 4)) for k, (a, b) in changed.items()})
assert changed["1"][1] == checkpoint_momentum(0.1) == 1 - math.sqrt(0.9)
lib_bn = run_steps(block, 10, ckpt=True)
assert torch.allclose(lib_bn.running_mean, ref_bn.running_mean, atol=1e-6) and torch.allclose(lib_bn.running_var, ref_bn.running_var, atol=1e-6)
print("the helper's block matches the uncheckpointed running_mean and running_var; num_batches_tracked:", int(lib_bn.num_batches_tracked))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Two details. `num_batches_tracked` still counts 20 batches for 10 steps; it matters only with `momentum=None`, where BatchNorm keeps a plain cumulative average (momentum $1/n$). In that mode no fix is needed: averaging every batch twice gives the same average, so the running statistics come out right and only the counter doubles. And the fix assumes the block is recomputed exactly once per step: a forward in training mode that is not followed by a backward (an evaluation loop without `model.eval()`, say) gives the smaller update only.
"""

# %% slideshow={"slide_type": "-"}
ref_none = run_steps(bn_block(None), 10, ckpt=False)
ck_none = run_steps(bn_block(None), 10, ckpt=True)
assert torch.allclose(ref_none.running_mean, ck_none.running_mean, atol=1e-6)
assert torch.allclose(ref_none.running_var, ck_none.running_var, atol=1e-6)
print(f"momentum=None: running stats match without any fix; num_batches_tracked {int(ref_none.num_batches_tracked)} vs {int(ck_none.num_batches_tracked)}")

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
r"""
## 7. When to checkpoint

Checkpointing trades memory for compute; spend it where it buys the most:

- **Only when memory is the limit.** It never makes a step faster. If the batch fits, do not checkpoint; if it almost fits, checkpointing a little may let you double the batch.
- **Measure the peak, not what is kept.** The peak is a maximum over time; a checkpointed block's activations return during its recomputation. In the CNN, checkpointing the dominant block gained a few percent and the seed's block 2 nothing. Checkpointing works when the memory is spread over many similar blocks.
- **Large activations, cheap recomputation first.** Element-wise layers (activations, normalisation, Dropout) and high-resolution early layers hold big tensors and cost little to recompute; a big matmul or convolution costs the most to redo.
- **Blocks of a repeated structure, about $\sqrt N$ of them.** For a stack of identical layers (a Transformer, a ResNet stage), checkpoint each layer or group of layers; the memory minimum is near $\sqrt N$ segments and the cost is about one extra forward.
- **Mind the last segment and the head.** `checkpoint_sequential` leaves the last segment plain; the loss and head are usually cheap to keep.
- **Always `use_reentrant=False`**, keep `preserve_rng_state=True` when there is randomness inside, and fix BatchNorm momentum with `prepare_batchnorm_for_checkpointing`.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
On a GPU the same measurements read `torch.cuda.max_memory_allocated`; `measure_peak(..., device="cuda")` does it for you:
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("peak GPU memory of a deep chain with and without checkpointing"):
    gpu_chain = deep_chain(256, 64).cuda()
    xg = torch.randn(4096, 64, device="cuda", requires_grad=True)
    gp = step_peak_memory(gpu_chain, xg)
    gs = step_peak_memory(gpu_chain, xg, forward=lambda m, x: checkpoint_sequential(m, 16, x, use_reentrant=False))
    print(f"CUDA peak: plain {format_bytes(gp.peak_bytes)}, 16 segments {format_bytes(gs.peak_bytes)}, ratio {gp.peak_bytes / gs.peak_bytes:.1f}")

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- A step's memory is parameters + gradients + optimizer state (0 for SGD, 1× for momentum, 2× plus step counters for Adam) + activations; only the activations grow with batch and depth, and they dominate at large batch.
- Saved-tensor hooks count what is kept; the *peak* needs the allocator: `torch.profiler(profile_memory=True)` events on CPU, `torch.cuda.max_memory_allocated` on GPU (`course_lib.memory`).
- Checkpointing keeps a block's inputs and recomputes its forward in backward. Use `use_reentrant=False` (and always pass it: the silent default is still `True` in 2.13).
- `checkpoint_sequential` counts children, never checkpoints the last segment; with $\sqrt N$ segments the peak grows as $N^{0.5}$ instead of $N^{1}$, for just under one extra forward pass.
- Dropout is safe with `preserve_rng_state=True`; BatchNorm needs momentum $1 - \sqrt{1-m}$ in PyTorch's convention ($\sqrt{m}$ only in the old-weight convention); the reentrant form silently skips blocks whose input does not require grad.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** A BatchNorm layer with PyTorch momentum `m` sits inside a checkpointed block. Write `corrected_momentum(m)` returning the momentum that makes its two updates per step equal one update with `m`.
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

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## References

- T. Chen, B. Xu, C. Zhang, C. Guestrin, [Training Deep Nets with Sublinear Memory Cost](https://arxiv.org/abs/1604.06174), 2016 — the $\sqrt n$ and $\log n$ schedules.
- PyTorch documentation: [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html) — `checkpoint`, `checkpoint_sequential`, `use_reentrant`, `preserve_rng_state`.
- PyTorch documentation: [torch.profiler](https://pytorch.org/docs/stable/profiler.html) — `profile_memory=True`; and [CUDA memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management) — `max_memory_allocated`.
- PyTorch documentation: [BatchNorm1d](https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm1d.html) — the momentum convention, `momentum=None` and `num_batches_tracked`.
- PyTorch documentation: [Hooks for saved tensors](https://pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html) — the mechanism behind the non-reentrant checkpoint.
- S. Ioffe, C. Szegedy, [Batch Normalization](https://arxiv.org/abs/1502.03167), 2015.
"""
