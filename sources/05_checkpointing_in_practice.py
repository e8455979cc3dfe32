# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 05 · Checkpointing in practice: pitfalls, selective checkpointing, offloading and `torch.compile`

Notebook 04 measured what checkpointing saves and what it costs, on models without surprises: a deep chain of `Linear` + `Tanh` blocks and a small CNN. From there you need four facts: a checkpointed block keeps its inputs and runs its forward a second time in backward; the non-reentrant form (`use_reentrant=False`) does it through saved-tensor hooks, the reentrant form through an `autograd.Function`; each call stores the RNG state; and the peak is a maximum over time, measured from the allocator's events (`course_lib.memory`). Real models add what that chain does not have: randomness (Dropout), state that the forward updates (BatchNorm's running statistics), inputs that do not require grad, a choice of *which* tensors to recompute, a compiler that rewrites the graph, and, on a GPU, an allocator with a cache. This notebook takes them one at a time, each measured.

By the end of this notebook you will be able to:
- avoid the three classic pitfalls: Dropout (safe today, and why), BatchNorm's running statistics updated twice (a recompute guard through `context_fn`, and the momentum algebra that explains the problem), and a block whose input does not require grad;
- choose what to save and what to recompute op by op (selective checkpointing, with a `TorchDispatchMode` to count what really runs), or move saved tensors to CPU memory (`save_on_cpu`), and say what offloading costs on a GPU;
- say what `torch.compile` does with a checkpoint and with the tensors autograd saves (Dynamo's graph, AOTAutograd's partitioner and its activation-memory budget), and why BatchNorm's statistics update once in a compiled checkpoint;
- on a GPU, read `memory_allocated` against `memory_reserved`, configure the allocator, and record a memory snapshot;
- decide when and where to checkpoint.

This notebook assumes: notebook 04 (what checkpointing keeps and recomputes, `use_reentrant`, `checkpoint_sequential`, measuring peaks), notebook 03 (a custom `autograd.Function`) and notebook 02 (saved-tensor hooks).
"""

# %% slideshow={"slide_type": "-"}
import inspect
import math
import os
import textwrap
import warnings

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from course_lib.checkpointing import (OpCounter, bn_safe_context_fn, checkpoint_bn_safe, checkpoint_momentum, deep_chain,
                                      frozen_bn_stats)
from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.memory import measure_peak, step_peak_memory
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything

torch.set_num_threads(1)  # one thread: steadier on a shared machine; nothing here needs two
seed_everything(0)
WIDTH = 8  # the width of notebook 04's deep chains
train, test = digits()


class DigitsCNN(nn.Module):
    """Notebook 04's CNN (the Tensor post's CIFAR10Model, adapted to 1x8x8 digits); `checkpointed` blocks are recomputed."""

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


print(f"digits: {len(train)} training images; the CNN of notebook 04 §5 has {sum(p.numel() for p in DigitsCNN().parameters()):,} parameters")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Pitfalls

### 1.1 Dropout inside a checkpoint

The Tensor post says: the forward runs twice, Dropout draws a different mask the second time, so the gradients are wrong; put the checkpoint before or after Dropout. That was a real problem once. Today `checkpoint` has `preserve_rng_state=True` by default: it saves the CPU RNG state (and that of each GPU holding one of the block's tensor *inputs*) before the forward and restores it for the recomputation, so Dropout draws the same mask. Only with `preserve_rng_state=False` do the gradients go wrong:
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
print(f"the price of preserving it on CPU: a {torch.get_rng_state().numel():,}-byte RNG state per checkpoint call")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Which GPUs' states? `checkpoint` asks `torch.utils.checkpoint.get_device_states(*args)`: the devices of the tensors passed *in*. A block that receives CPU tensors and moves them to a GPU inside, or draws random numbers on a GPU none of its inputs lives on, gets no GPU state saved, and its recomputed Dropout masks there differ. Under `torch.compile` the flag is ignored altogether (section 3). On this CPU there is nothing to save; a GPU cell in section 4 shows a block with a GPU input.
"""

# %% slideshow={"slide_type": "-"}
from torch.utils.checkpoint import get_device_states

devices, states = get_device_states(x_d, "not a tensor", 3)
print(f"GPU RNG states saved for a block with CPU inputs: devices {devices}, states {states}")
assert (devices, states) == ([], [])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So keep Dropout wherever the model needs it, and leave `preserve_rng_state=True`. Set it to `False` only for blocks without randomness, to skip saving and restoring the RNG state.

### 1.2 BatchNorm: the running statistics update twice

In training mode, every BatchNorm forward updates `running_mean`, `running_var` and `num_batches_tracked`. A checkpointed block runs its forward twice per step. Before you run the next cell: after one step, how many batches does the checkpointed block's counter say it has seen?
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
**The robust fix: leave the statistics alone while recomputing.** The recomputation exists only to rebuild tensors for backward; it has no business updating statistics. The non-reentrant `checkpoint` has a hook for exactly this: `context_fn`, a function returning two context managers, the first entered around the forward, the second around the recomputation. The second one here sets each BatchNorm layer's momentum to 0 (the update $r \leftarrow (1 - 0)\,r + 0 \cdot x$ leaves $r$ bit for bit unchanged) and hides its `num_batches_tracked` counter by setting the attribute to `None` (the cell after next shows why that stops the count, and why it is safe), then puts both back. The output does not change: in training mode BatchNorm normalises with the batch's own statistics. Written by hand, then checked over 10 steps against the block without checkpointing and against `course_lib.checkpointing.checkpoint_bn_safe`, which does the same:
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
Why does `None` stop the counter? BatchNorm's `forward` adds 1 to the counter only if it is not `None`, and reads it in one other place, to compute a cumulative average when `momentum` is `None`. These are all the lines of its source that touch it:
"""

# %% slideshow={"slide_type": "-"}
forward_source = textwrap.dedent(inspect.getsource(nn.modules.batchnorm._BatchNorm.forward))
print("\n".join(line.split("  #")[0].rstrip() for line in forward_source.splitlines() if "num_batches_tracked" in line))
block = bn_block()
bn, x_demo = block[1], torch.randn(64, WIDTH)
counter, mean_before = bn.num_batches_tracked, bn.running_mean.clone()
with frozen_stats(block):
    inside = bn.num_batches_tracked
    block(x_demo)  # a training-mode forward, as the recomputation runs it
print(f"inside the guard: num_batches_tracked is {inside}; a forward there leaves running_mean unchanged:"
      f" {torch.equal(bn.running_mean, mean_before)}")
print(f"after the guard: the same tensor object is back: {bn.num_batches_tracked is counter} (value {int(counter)}),"
      f" and it is in the state_dict: {'num_batches_tracked' in bn.state_dict()}")
assert inside is None and torch.equal(bn.running_mean, mean_before) and bn.num_batches_tracked is counter and int(counter) == 0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
It is safe for three reasons. The guard is in place only while the recomputation runs, inside backward, and it puts back the very same tensor object, so the `state_dict`, `.to()` and anything else holding the counter see no change. In training mode the output depends on neither the counter nor the running statistics: the batch's own statistics normalise it. And `nn.Module` allows a registered buffer to be `None` for a while (it is left out of `state_dict` and `.to()` meanwhile); the other place that reads the counter, the cumulative average, is not reached, because the guard sets `momentum` to 0.0 at the same time.

The guard's statistics were identical to the plain block's, not merely close: they see the same single update per step as without checkpointing, and nothing about the module changes for good. `context_fn` exists only in the non-reentrant form, one more reason for `use_reentrant=False`; the reentrant form has a BatchNorm surprise of its own: when the block's input does not require grad it is never recomputed at all, so its statistics update once and its parameters learn nothing (section 1.3). Section 3 shows why the guard also matters under `torch.compile`, and why it takes a different form there.
"""

# %% slideshow={"slide_type": "-"}
with expect_error(ValueError, match="only supported when use_reentrant=False"):
    checkpoint(bn_block(), torch.randn(4, WIDTH), use_reentrant=True, context_fn=lambda: (nullcontext(), nullcontext()))

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### The momentum algebra (eager mode only)

The Tensor post fixes the double update another way: replace the momentum by its square root, so that two updates add up to one. This is worth working through, because it explains the problem exactly, but it is a fix for eager mode only, and only when the block is recomputed exactly once per step (section 3 shows it going wrong under `torch.compile`; a forward in training mode without a backward gives the smaller update only), and it changes the module for good. Whether the square root is right depends on what "momentum" means, and the two conventions in use are opposite:

- **old-weight** (the Tensor post, Keras, TensorFlow): $r \leftarrow m\,r + (1-m)\,x$, typically $m = 0.9$;
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
print(f"Tensor post, m = 0.9 (old-weight): m' = sqrt(0.9) = {float(solutions['old-weight'].subs(m_, 0.9)):.4f}")
print(f"PyTorch, m = 0.1                 : m' = 1 - sqrt(0.9) = {float(solutions['pytorch'].subs(m_, 0.1)):.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So the Tensor post is right *in its own convention*, and its recipe is wrong when typed into PyTorch: `momentum=math.sqrt(0.1)` (0.316) or `momentum=math.sqrt(0.9)` (0.949) both weigh the new batch far too much. The correct PyTorch value is `1 - math.sqrt(1 - 0.1)` = 0.0513, which `course_lib.checkpointing.checkpoint_momentum` computes. Checked over 10 eager training steps, against the block without checkpointing:
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
Close, but the counter still says 20 batches for 10 steps. It matters only with `momentum=None`, where BatchNorm keeps a plain cumulative average (momentum $1/n$). In that mode no fix is needed for the statistics: averaging every batch twice gives the same average, and only the counter is wrong, counting each batch twice. The guard gets the counter right too:
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
### 1.3 A checkpointed block whose input does not require grad

The Tensor post warns against checkpointing the first block, whose input is the raw data: the parameters inside would stop learning. That is true of the *reentrant* implementation only. Its `autograd.Function` is recorded in the graph only if an input requires grad; a raw image does not, so backward never reaches the block, and the parameters *inside* it get no gradient, silently apart from a warning. It propagates: the output does not require grad either, so a second reentrant checkpoint right after it is skipped too. The non-reentrant form records the block's operations normally, so its parameters get their gradients.
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
## 2. Choosing what to keep: selective checkpointing and offloading

Plain checkpointing is all or nothing for a block: every tensor it would save is dropped and recomputed. Two tools built on the same saved-tensor mechanism refine that.

### 2.1 Selective activation checkpointing

Recomputing a matrix product costs much more than recomputing a GELU, while their outputs are the same size. *Selective* activation checkpointing (SAC) decides op by op: `torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)` builds the pair of contexts for `context_fn` (section 1.2's hook again), and the policy is a function called for every operation in the forward, `policy(ctx, op, *args, **kwargs)`, returning a `CheckpointPolicy`: `MUST_SAVE`/`PREFER_SAVE` to keep the output, `MUST_RECOMPUTE`/`PREFER_RECOMPUTE` to drop it (`MUST_` tells `torch.compile` not to overrule the choice).

How can a context see "every operation"? Through a **`TorchDispatchMode`** (imported from `torch.utils._python_dispatch`, a private module, although PyTorch's guide to extending it describes the class; 2.13 has no public import path): a context manager whose `__torch_dispatch__` method PyTorch calls for each ATen operation (`aten.addmm`, `aten.tanh`, ...) that runs while it is active, instead of running it; the method decides what to do and usually runs the operation itself. It sits below autograd, so it sees the operations a module is made of, and in backward it sees the backward's operations and any recomputation, not Python calls. A tiny one, which prints what runs, in forward and then in backward:
"""

# %% slideshow={"slide_type": "-"}
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from course_lib.torch_private import TorchDispatchMode  # torch.utils._python_dispatch's class (private module)


class ListOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket).removeprefix("aten."))  # note the operation...
        return func(*args, **(kwargs or {}))                             # ...and run it unchanged


tiny = nn.Linear(4, 4)
x_tiny = torch.randn(2, 4, requires_grad=True)
with ListOps() as forward_ops:
    loss_tiny = tiny(x_tiny).tanh().sum()
with ListOps() as backward_ops:
    loss_tiny.backward()
print("forward :", forward_ops.ops)
print("backward:", backward_ops.ops)
assert "addmm" in forward_ops.ops and "tanh_backward" in backward_ops.ops
sac_contexts = create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE)
print("SAC's two contexts are dispatch modes:", [isinstance(c, TorchDispatchMode) for c in sac_contexts])
assert all(isinstance(c, TorchDispatchMode) for c in sac_contexts)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
SAC's first mode runs around the forward, asks the policy about each operation and keeps the outputs to save; its second runs around the recomputation and answers the saved operations from that cache instead of running them. `course_lib.checkpointing.OpCounter` is a mode like `ListOps` that counts instead of listing. Below, a policy that keeps the products and recomputes everything else, against no checkpointing and plain checkpointing, on 4 blocks `Linear(64, 64)` + GELU. What is kept is read from the allocator (what the forward left allocated, minus its output); what is recomputed is counted by `OpCounter`, which sees only the operations that really run (the profiler would also count the products SAC answers from its cache).
"""

# %% slideshow={"slide_type": "-"}
from functools import partial

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
Selective checkpointing sits between the two: it keeps the 4 product outputs (the GELUs' inputs), recomputes only the cheap GELUs whose outputs the next products need, and never redoes a matrix product. That is section 5's advice, "large activations, cheap recomputation first", as code. In a Transformer the usual policies keep the attention and feed-forward products (or only some of them) and recompute the element-wise work.

### 2.2 Offloading saved tensors: `save_on_cpu`

Another way out: keep every saved tensor, but somewhere else. `torch.autograd.graph.save_on_cpu(pin_memory=True)` copies each tensor autograd saves to CPU memory in forward and copies it back in backward; with `pin_memory=True` the CPU copy goes to page-locked (*pinned*) memory, which the GPU can copy to and from without the CPU waiting for the copy to finish. It is nothing more than a `saved_tensors_hooks` pair (notebook 02): its pack hook sees exactly the tensors `SavedTensorMeter` counts. On this CPU the copy is CPU to CPU and saves nothing, but the mechanism is the same:
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
Offloading costs transfer time instead of recomputation: on a GPU each saved tensor crosses the link between CPU and GPU twice, once each way. That link is PCIe on most machines; on NVIDIA's Grace Hopper superchips it is NVLink-C2C, a chip-to-chip link between the Grace CPU and the Hopper GPU in one package, several times faster than PCIe ([NVIDIA's Grace Hopper page](https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/)).

Can the copies hide behind the compute? Not with `save_on_cpu` as it is in 2.13. `non_blocking=True` makes a copy asynchronous *for the CPU*: Python goes on while the GPU copies. But a GPU runs the work of one CUDA stream in order, and `save_on_cpu` issues its copies on the current stream, the one the forward's and backward's kernels run on; so each copy waits for the kernels before it, and the kernels after it wait for the copy. Its source shows both copies, and no second stream:
"""

# %% slideshow={"slide_type": "-"}
offload_source = inspect.getsource(save_on_cpu.__init__)  # its code: the pack and unpack hooks
print("\n".join(line.strip() for line in offload_source.splitlines() if "non_blocking" in line))
print("a second stream anywhere in that code:", "stream" in offload_source.lower())
assert offload_source.count("non_blocking") == 2 and "stream" not in offload_source.lower()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Overlapping the copies with compute takes a second CUDA stream for them, and events that order them against the compute stream. torchtune's `OffloadActivations` ([torchtune documentation](https://docs.pytorch.org/torchtune/stable/generated/torchtune.training.OffloadActivations.html)) does that with the same saved-tensor hooks, and is the route to use today. (PyTorch 2.13 also has the beginning of a compiler route, not shown here and not for use yet: `CheckpointPolicy` lists `MUST_CPU_OFFLOAD`/`PREFER_CPU_OFFLOAD`, but eager selective checkpointing treats them as recompute, and `torch.compile` offloads only behind `torch._functorch.config.enable_activation_offloading`, a private flag of a private module, marked in its source as for testing; no public API replaces it yet.) Offloading pays when the activations are large and the copies can hide behind compute; checkpointing pays when the arithmetic is cheap.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Checkpointing under `torch.compile`

`torch.compile(fn)` turns `fn` into graphs and runs them. This section needs five terms, in the order they act (notebook 20 uses the same ones for training):

| term | what it is |
|---|---|
| **Dynamo** | the front end: reads `fn`'s Python bytecode and captures the tensor operations it runs |
| **FX graph** | what Dynamo captures (`torch.fx.Graph`): a plain list of nodes, each one call of a function with its arguments and result; the lists printed below are its nodes |
| **AOTAutograd** | traces the FX graph together with its backward into one *joint* graph |
| **partitioner** | cuts the joint graph into a forward graph and a backward graph, and so decides which tensors the forward saves for the backward (§3.2) |
| **backend** | runs the two graphs: **Inductor**, the default, generates fused kernels; **`aot_eager`** runs them with PyTorch's ordinary kernels, which shows the structure without a C++ compiler and in a second rather than tens |

This section uses `aot_eager`. Two more names appear once each and are explained where they do: the higher-order operator `tag_activation_checkpoint` (§3.1) and the partitioner's name, `min_cut_rematerialization_partition` (§3.2).

### 3.1 Dynamo captures `checkpoint` whole

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
The whole checkpointed block became one node, a *higher-order operator* `tag_activation_checkpoint`: an operator that takes a function (here a subgraph, the block's own graph `wrap_body_0`) as an argument, as Python's `map` takes a function, so that the compiler sees the block whole and can decide what to do with it. Nothing of checkpoint's Python code (its hooks, its RNG handling) runs inside the compiled function: AOTAutograd marks the body's operations "recompute" and its partitioner puts them into the backward graph. Catching the two graphs with `aot_autograd`'s `fw_compiler` and `bw_compiler` shows it (`aot_autograd` comes from a private module, `torch._dynamo.backends.common`, the helper PyTorch's own guide to writing a backend uses; there is no public one. `torch.compiler.reset()`, used from here on, is public: it forgets what was compiled, so that the next call compiles again):
"""

# %% slideshow={"slide_type": "-"}
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition

from course_lib.torch_private import aot_autograd  # torch._dynamo.backends.common.aot_autograd (private)


def aot_graphs(fn, *args):
    """The aten operations of the forward and backward graphs AOTAutograd makes of fn, run once."""
    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = [str(n.target).removeprefix("aten.").removesuffix(".default")
                            for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),  # as backend="aot_eager" does
                           partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)
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
Compiled, the checkpointed block's backward graph starts by recomputing `addmm` and `tanh`, and the forward graph is the same in both cases: the recomputation is now a property of the graphs, decided at compile time. Two consequences: `preserve_rng_state` is ignored (the docstring says so; random operations are handled by the compiler), and anything checkpoint's Python code did at run time, such as calling `context_fn`'s second context around the recomputation, does not happen the same way (section 3.3).

### 3.2 The partitioner recomputes without being asked

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


torch.compiler.reset()
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

**The activation-memory budget.** `torch._functorch.config.activation_memory_budget` (default 1.0), a setting in a private module (note the underscore: it may change without a deprecation; PyTorch has no public name for it in 2.13), asks the partitioner to recompute more, down to a fraction of the activations it would otherwise save, choosing what to recompute by estimated cost. That choice is a *knapsack problem*: from items that each have a value and a weight, pick the set of greatest value that fits a capacity; here the items are the tensors the forward could save, the capacity is the budget's share of their bytes, and the value of saving one is the recomputation time it spares. A budget of 0 recomputes everything it can. On two products with `tanh`:
"""


# %% slideshow={"slide_type": "-"}
def two_layers(x, w1, w2):
    return torch.tanh(torch.tanh(x @ w1) @ w2)


from course_lib.torch_private import functorch_config  # torch._functorch.config.patch, a private setting

w2_pm = torch.randn(64, 64, requires_grad=True)
budget_rows = {}
for budget in (1.0, 0.5, 0.0):
    torch.compiler.reset()
    with functorch_config(activation_memory_budget=budget):
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
torch.compiler.reset()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The knob trades memory for recomputation across the whole compiled graph, without marking blocks by hand; `checkpoint` and SAC policies inside a compiled function are hints the partitioner respects (`MUST_` ones always).

### 3.3 BatchNorm in a compiled checkpoint

Section 1.2's problem looks different compiled. Before you read on: a plain `checkpoint` around a BatchNorm block, compiled, updates the running statistics how many times per step?

AOTAutograd works on *functional* graphs, without in-place updates of a module's state. BatchNorm's update of its running statistics becomes a batch-norm operation that *returns* the new statistics, and the forward graph ends by copying them into the buffers (`copy_`), once. The recomputation in the backward graph runs the batch norm again, but only to rebuild what the gradients need: nothing copies its statistics anywhere. The two graphs of one compiled step of a checkpointed `Linear` + `BatchNorm1d` + `ReLU` block show it:
"""

# %% slideshow={"slide_type": "-"}
torch.compiler.reset()
bn_ckpt_block = bn_block()
bn_graphs = aot_graphs(lambda t: checkpoint(bn_ckpt_block, t, use_reentrant=False), torch.randn(64, WIDTH))
for kind in ("forward", "backward"):
    print(f"{kind:8s} graph: {bn_graphs[kind].count('_native_batch_norm_legit_functional')} batch norm,"
          f" {bn_graphs[kind].count('copy_')} copies into the buffers")
print("num_batches_tracked after the step:", int(bn_ckpt_block[1].num_batches_tracked))
assert [bn_graphs[k].count("_native_batch_norm_legit_functional") for k in ("forward", "backward")] == [1, 1]
assert [bn_graphs[k].count("copy_") for k in ("forward", "backward")] == [3, 0]  # running_mean, running_var, the counter
assert int(bn_ckpt_block[1].num_batches_tracked) == 1
torch.compiler.reset()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So the plain `checkpoint` is *right* when compiled: one update per step, as without checkpointing, although the same code updates twice when run eagerly. That is the opposite of section 1.2's lesson, and it has a consequence: the eager momentum fix, which assumes two updates, under-updates when compiled, silently. The guard of section 1.2 assumes nothing, but its `context_fn` returns ordinary context managers, and under `torch.compile` `context_fn` must return two `TorchDispatchMode`s (section 2.1; SAC's contexts are such modes). `checkpoint_bn_safe` therefore asks `torch.compiler.is_compiling()` and passes no guard when compiled, where none is needed. Ten steps each, eager and compiled:
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
        torch.compiler.reset()
        fwd = forward if mode == "eager" else torch.compile(forward, backend="aot_eager")
        bn = run_steps(bn_block(momentum), 10, fwd)
        match = torch.allclose(bn.running_mean, ref_bn.running_mean, atol=1e-6) and torch.allclose(bn.running_var, ref_bn.running_var, atol=1e-6)
        bn_rows[label, mode] = (int(bn.num_batches_tracked), match)
        print(f"{label:18s} {mode:8s}: num_batches_tracked {int(bn.num_batches_tracked):2d} (plain: 10), running stats match: {match}")
assert bn_rows == {("checkpoint", "eager"): (20, False), ("checkpoint", "compiled"): (10, True),
                   ("momentum fix", "eager"): (20, True), ("momentum fix", "compiled"): (10, False),
                   ("checkpoint_bn_safe", "eager"): (10, True), ("checkpoint_bn_safe", "compiled"): (10, True)}
for label in ("checkpoint", "momentum fix", "checkpoint_bn_safe"):
    right = [mode for mode in ("eager", "compiled") if bn_rows[label, mode][1]]
    wrong = [mode for mode in ("eager", "compiled") if mode not in right]
    print(f"{label:18s}: running statistics right {' and '.join(right)}" + (f", wrong {wrong[0]}" if wrong else ""))
block = bn_block()
from course_lib.torch_private import backend_compiler_failed_error

# BackendCompilerFailed is a RuntimeError from a private module, named here only to show the error
with expect_error(backend_compiler_failed_error(), match="must generate a tuple of two `TorchDispatchMode`s",
                  quiet=True) as caught:
    torch.compile(lambda t: checkpoint(block, t, use_reentrant=False, context_fn=bn_safe_context_fn(block)),
                  backend="aot_eager")(torch.randn(8, WIDTH))
reason = next(line for line in str(caught.error).splitlines() if "TorchDispatchMode" in line)
print(f"the eager guard, compiled: {type(caught.error).__name__}: {reason.strip()}")
torch.compiler.reset()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Only the guard is right in both modes, and it never changes the module. That the plain checkpoint is right when compiled is no reason to rely on it: the same code updates twice whenever it runs eagerly: the day someone runs the model uncompiled to debug it, say.

**What Inductor adds, and what you get without a compiler.** `torch.compile`'s default backend, Inductor, takes the same two graphs and generates fused kernels: Triton on GPUs, C++ with OpenMP on CPUs, which needs a working C++ compiler. The fusion is what makes the partitioner's recomputation nearly free. Its first compilation generates and compiles that code, which takes far longer than `aot_eager`'s trace, even for a small step, so this notebook does not run it. To see the cost on your machine, compile a small step with `torch.compile(step)` in a fresh process and time its first call against its second. Without a compiler, `backend="aot_eager"` runs everything in this section: Dynamo's capture, AOTAutograd's joint graph, the partitioner and the memory it saves; only the fused kernels, and so the speed, are missing.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. On a GPU: peaks, the caching allocator and memory snapshots

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
Section 1.1's RNG states, on a GPU: `checkpoint` saves the state of each GPU that holds one of the block's tensor inputs, and only those:
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("checkpoint saves the RNG state of the GPUs holding its inputs"):
    devices, states = get_device_states(torch.ones(2, device="cuda"), torch.ones(2))
    print(f"a block with one GPU input and one CPU input: GPU states saved for devices {devices}")
    assert devices == [torch.cuda.current_device()] and len(states) == 1
    assert get_device_states(torch.ones(2)) == ([], [])  # a block that moves its input to the GPU inside: none

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**The caching allocator.** `cudaMalloc` and `cudaFree` are slow and synchronise the device, so PyTorch keeps freed GPU memory *reserved* in its own cache and reuses it. `torch.cuda.memory_allocated` counts what tensors use; `torch.cuda.memory_reserved` what PyTorch holds from the driver, which is what `nvidia-smi` shows (plus the CUDA context). The gap is reusable by PyTorch but not by another process, and when blocks of different sizes interleave it fragments: a step can fail "out of memory" with gigabytes reserved but free. `torch.cuda.empty_cache()` returns the unused cache to the driver (it does not make your own step fit). The allocator is configured by an environment variable read when CUDA starts: `PYTORCH_ALLOC_CONF` in PyTorch 2.13, the device-generic name its documentation now uses, and `PYTORCH_CUDA_ALLOC_CONF`, the older name, still accepted, which most guides and scripts show. `expandable_segments:True` lets the allocator grow segments in place instead of reserving new fixed-size ones, which avoids much of the fragmentation ([CUDA memory management notes](https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)). The first cell below reads the new name in 2.13's own docstrings, on any machine; the second shows the cache on a GPU.
"""

# %% slideshow={"slide_type": "-"}
names = {name for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF") if name in torch.cuda.memory.get_allocator_backend.__doc__}
print(f"torch {torch.__version__.split('+')[0]}: torch.cuda.memory.get_allocator_backend's docstring names {sorted(names)}")
assert names == {"PYTORCH_ALLOC_CONF"}

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
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        print(f"{name} = {os.environ.get(name, '(not set)')}")
    assert alloc2 == alloc0 and reserved2 - reserved0 >= 256 * 2**20 and reserved3 <= reserved2

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Memory snapshots.** For every real out-of-memory error the tool of choice is the allocator's own history: `torch.cuda.memory._record_memory_history()` starts recording every allocation and free with its Python stack, `torch.cuda.memory._dump_snapshot(path)` writes it to a file, and the viewer at [pytorch.org/memory_viz](https://pytorch.org/memory_viz) (it runs in your browser) draws memory over time, one coloured band per tensor, with the stack that allocated it. A checkpointed step shows each segment's activations coming back during its recomputation and going again (notebook 04 §5 draws such a curve on a CPU, from the profiler's events). The functions start with an underscore but are documented ([Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html)).
"""

# %% slideshow={"slide_type": "-"}
if requires_gpu("a memory snapshot of a checkpointed training step, for pytorch.org/memory_viz"):
    import tempfile
    from pathlib import Path

    # torch.cuda.memory's _record_memory_history, _dump_snapshot, _snapshot: documented, underscored
    from course_lib.torch_private import dump_memory_snapshot, memory_snapshot, record_memory_history

    record_memory_history(max_entries=100_000)
    snap_chain = deep_chain(64, 256).cuda()
    xs_gpu = torch.randn(4096, 256, device="cuda", requires_grad=True)
    checkpoint_sequential(snap_chain, 8, xs_gpu, use_reentrant=False).sum().backward()
    snapshot_path = Path(tempfile.gettempdir()) / "05_checkpointed_step.pickle"
    dump_memory_snapshot(str(snapshot_path))
    snapshot = memory_snapshot()
    record_memory_history(enabled=None)  # stop recording
    n_events = sum(len(trace) for trace in snapshot["device_traces"])
    print(f"{n_events} allocator events recorded; snapshot written to {snapshot_path}: open it at https://pytorch.org/memory_viz")
    assert snapshot_path.stat().st_size > 0 and n_events > 0

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 5. When to checkpoint

Checkpointing trades memory for compute; spend it where it buys the most:

- **Only when memory is the limit.** It never shortens a step: it adds recomputation (notebook 04 §4 measured what it costs). If the batch fits, do not checkpoint; if it almost fits, checkpointing a little may let you double the batch.
- **Measure the peak, not what is kept.** The peak is a maximum over time; a checkpointed block's activations return during its recomputation. In notebook 04 §5's CNN, checkpointing the dominant block cut what the forward holds by more than half and left the peak where it was (to within a few percent), and the Tensor post's block 2 changed nothing. Checkpointing works when the memory is spread over many similar blocks. On a GPU, a memory snapshot shows where the peak is.
- **Large activations, cheap recomputation first.** Element-wise layers (activations, normalisation, Dropout) and high-resolution early layers hold big tensors and cost little to recompute; a big matmul or convolution costs the most to redo. Selective checkpointing (section 2.1) says exactly that, op by op; under `torch.compile` the partitioner already recomputes cheap operations, and the activation-memory budget asks for more (section 3.2).
- **Blocks of a repeated structure, about $\sqrt N$ of them.** For a stack of identical layers (a Transformer, a ResNet stage), checkpoint each layer or group of layers; the memory minimum is near $\sqrt N$ segments and the cost is about one extra forward. Notebook 16 §3 measures what one transformer block keeps for backward, and what full and selective checkpointing change there.
- **Mind the last segment and the head.** `checkpoint_sequential` leaves the last segment plain; the loss and head are usually cheap to keep.
- **Always `use_reentrant=False`**, keep `preserve_rng_state=True` when there is randomness inside, and keep BatchNorm statistics out of the recomputation: `checkpoint_bn_safe` (a recompute guard through `context_fn`, right eager and compiled), or keep BatchNorm outside checkpointed blocks, or use a normalisation without running statistics (LayerNorm, GroupNorm). Do not change the momentum: that fix holds in eager mode only.
- **Offload when the copies can hide behind compute**: `save_on_cpu` trades transfers for recomputation, but in 2.13 it copies on the compute stream (section 2.2); overlap takes a second stream (torchtune's `OffloadActivations`); the compiler's offload policies are still behind a private testing flag in 2.13.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- **Pitfalls (section 1).** Dropout is safe with `preserve_rng_state=True`: the recomputation restores the CPU RNG state (5,056 bytes per call) and that of each GPU holding one of the block's inputs. BatchNorm's running statistics update twice in an eager checkpointed block (20 batches counted in 10 steps); a recompute guard through `context_fn` (`checkpoint_bn_safe`: momentum 0 and the counter set to `None` while recomputing, both put back) makes them identical to the plain block's, eager and compiled. The momentum $1 - \sqrt{1-m}$ explains the problem but holds in eager mode only. The reentrant form silently skips blocks whose input does not require grad; the non-reentrant form does not.
- **What to keep (section 2).** Selective checkpointing chooses op by op what to save, through a policy and a pair of `TorchDispatchMode`s (on the GELU chain: the 4 products kept, only GELUs recomputed). `save_on_cpu` moves saved tensors to CPU memory; in 2.13 its copies are asynchronous for the CPU but run on the compute stream, so they do not overlap with GPU compute.
- **Compiled (section 3).** Dynamo captures `checkpoint` as one higher-order operator; AOTAutograd's partitioner decides what is recomputed, recomputes cheap operations even without checkpointing, and `activation_memory_budget` asks for more. A compiled checkpoint updates BatchNorm's statistics once per step, so there the plain checkpoint is right and the momentum fix wrong; only the guard is right in both modes.
- **On a GPU (section 4).** `memory_allocated` against `memory_reserved`, the allocator's settings (`PYTORCH_ALLOC_CONF`, formerly `PYTORCH_CUDA_ALLOC_CONF`) and memory snapshots explain what `nvidia-smi` shows and where a peak is.
- **When (section 5).** Only when memory is the limit; measure the peak; spread over many similar blocks; cheap recomputation first; always `use_reentrant=False`, with BatchNorm guarded.
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
"""
**2.** Write a selective-checkpointing policy `policy(ctx, op, *args, **kwargs)` that keeps the outputs of matrix products (`torch.ops.aten.mm.default`, `torch.ops.aten.addmm.default`) and recomputes everything else. The check runs it on a GELU chain and counts what is kept and what is recomputed.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_sac_policy


def policy(ctx, op, *args, **kwargs):
    raise NotImplementedError("your code here")


check_sac_policy(policy)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write `forward(block, x)` that checkpoints a block containing BatchNorm so that, step after step, its running statistics and `num_batches_tracked` equal those of `block(x)`, without changing the block for good. `x` is raw data (it does not require grad). Use `checkpoint` and a context manager of your own, not `checkpoint_bn_safe`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.checkpointing import check_bn_safe_forward


def forward(block, x):
    raise NotImplementedError("your code here")


check_bn_safe_forward(forward)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch documentation: [BatchNorm1d](https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm1d.html) — the momentum convention, `momentum=None` and `num_batches_tracked`.
- S. Ioffe, C. Szegedy, [Batch Normalization](https://arxiv.org/abs/1502.03167), 2015.
- PyTorch documentation: [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html) — `preserve_rng_state`, `context_fn`, `create_selective_checkpoint_contexts`, `CheckpointPolicy`; and [torch.autograd.graph.save_on_cpu](https://pytorch.org/docs/stable/autograd.html#torch.autograd.graph.save_on_cpu).
- PyTorch documentation: [Extending PyTorch: `TorchDispatchMode`](https://pytorch.org/docs/stable/notes/extending.html#extending-all-torch-api-with-modes) — modes, and what they see below autograd.
- PyTorch blog: [Current and New Activation Checkpointing Techniques in PyTorch](https://pytorch.org/blog/activation-checkpointing-techniques/), 2025 — selective checkpointing, the compile partitioner and the activation-memory budget.
- torchtune documentation: [OffloadActivations](https://docs.pytorch.org/torchtune/stable/generated/torchtune.training.OffloadActivations.html) — activation offloading on a second CUDA stream.
- J. Ansel et al., [PyTorch 2: Faster Machine Learning Through Dynamic Python Bytecode Transformation and Graph Compilation](https://doi.org/10.1145/3620665.3640366), ASPLOS 2024 — Dynamo, AOTAutograd, Inductor; the [torch.compile documentation](https://pytorch.org/docs/stable/torch.compiler.html); and [torch.fx](https://pytorch.org/docs/stable/fx.html) — the graphs Dynamo captures.
- PyTorch documentation: [Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html) — memory snapshots and the viewer at pytorch.org/memory_viz; [CUDA semantics: memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management) — the caching allocator, `PYTORCH_ALLOC_CONF` and `PYTORCH_CUDA_ALLOC_CONF`.
"""
