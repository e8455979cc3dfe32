# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 07 · Mixed precision in practice: `torch.autocast`, bf16 versus fp16, memory and speed

Notebook 06 took the 16-bit formats apart and rebuilt loss scaling and fp32 master weights by hand. In practice you write neither: `torch.autocast` decides, operation by operation, what runs in low precision, and `torch.amp.GradScaler` scales the loss when the format needs it. This notebook measures what autocast does on your machine: which operations it casts, the two rules for code under it, when bf16 replaces fp16 and when a scaler is still needed (on the CPU too), and what mixed precision saves in memory and in time. Apex's O0–O3, which older tutorials use, get one table.

By the end you will be able to:
- find out which operations `torch.autocast` runs in low precision on the CPU (with bf16 or fp16) and on CUDA, and predict the dtype of every tensor of a forward pass under it;
- write code that is correct under autocast: backward outside the region, custom Functions told with `custom_fwd`/`custom_bwd`;
- translate Apex's O0–O3 into today's PyTorch;
- choose between fp16 and bf16, and show when a `GradScaler` is needed (fp16, on the CPU as on CUDA) and when it is not (bf16);
- measure the activation memory that bf16 saves and the speed it gives (or not) on your CPU, and name the controls for TF32, with their defaults, and the formats beyond (fp8).

This notebook assumes: notebook 06 (fp16 and bf16, loss scaling, `GradScaler`, master weights), notebook 03 (custom `autograd.Function`s) and notebook 02 §4 (`SavedTensorMeter`, the bytes autograd saves for backward).
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Setup.** One seed, and one thread: every tensor here is small, and one thread keeps timings steady on a busy machine.
"""

# %% slideshow={"slide_type": "-"}
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.float_formats import round_to, ulp
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)
print("torch", torch.__version__.split("+")[0], "| threads:", torch.get_num_threads())

train, test = digits()
X, Y = train.flat(), train.y
Xt, Yt = test.flat(), test.y


def mlp(width=128, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**From notebook 06, recomputed here**: the MLP trained for 6 epochs with SGD (notebook 06 §3), whose small gradients section 3 follows through autocast; the 300 random batches of notebook 06 §5 and the fp32 Adam run on them, the baseline of section 3's bf16 run.
"""

# %% slideshow={"slide_type": "-"}
net = mlp()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
for epoch in range(6):
    order = torch.randperm(len(Y))
    for i in range(0, len(Y), 64):
        idx = order[i:i + 64]
        opt.zero_grad()
        F.cross_entropy(net(X[idx]), Y[idx]).backward()
        opt.step()

gen = torch.Generator().manual_seed(1)
batches = [torch.randint(0, len(Y), (64,), generator=gen) for _ in range(300)]
baseline = mlp(width=64)
optimizer = torch.optim.Adam(baseline.parameters())
fp32_losses = []
for idx in batches:
    optimizer.zero_grad()
    loss = F.cross_entropy(baseline(X[idx]), Y[idx])
    loss.backward()
    optimizer.step()
    fp32_losses.append(loss.item())
fp32_final = sum(fp32_losses[-50:]) / 50
accuracy = (net(Xt).argmax(1) == Yt).float().mean().item()
print(f"trained MLP: test accuracy {accuracy:.2f}; fp32 Adam: mean loss over the last 50 steps ~{fp32_final:.3f}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. `torch.autocast`: which operations run in low precision?

`torch.autocast(device_type, dtype)` does not convert the model. It intercepts each operation and decides: run it in the low-precision `dtype`, run it in fp32, or leave it alone. Rather than trusting a list, we run operations under CPU autocast and read the output dtype — once with fp32 inputs and once with bf16 inputs. That separates four behaviours:

- **lower precision**: fp32 inputs are cast down (matmul, linear, conv);
- **fp32**: low-precision inputs are cast *up* (losses, and other ops where fp16/bf16 would be inaccurate);
- **promote**: mixed inputs run in the widest dtype (`cat`, `stack`, ...);
- **unchanged**: the op runs in whatever dtype its input already has.
"""


# %% slideshow={"slide_type": "fragment"}
def autocast_table(device, low):
    def ops(dt):
        x = torch.randn(4, 8, device=device, dtype=dt)
        w = torch.randn(8, 8, device=device, dtype=dt)
        img = torch.randn(2, 3, 8, 8, device=device, dtype=dt)
        k = torch.randn(4, 3, 3, 3, device=device, dtype=dt)
        tgt = torch.zeros(4, dtype=torch.long, device=device)
        return {
            "matmul": lambda: x @ w, "linear": lambda: F.linear(x, w), "conv2d": lambda: F.conv2d(img, k),
            "bmm": lambda: torch.bmm(x[None], w[None]),
            "cross_entropy": lambda: F.cross_entropy(x, tgt), "mse_loss": lambda: F.mse_loss(x, x),
            "nll_loss": lambda: F.nll_loss(x, tgt), "prod": lambda: x.prod(),
            "softmax": lambda: F.softmax(x, -1), "log_softmax": lambda: F.log_softmax(x, -1),
            "layer_norm": lambda: F.layer_norm(x, (8,)), "sum": lambda: x.sum(), "exp": lambda: x.exp(),
            "relu": lambda: F.relu(x), "add": lambda: x + x,
            "cat (mixed)": lambda: torch.cat([x, x.float()]), "stack (mixed)": lambda: torch.stack([x, x.float()]),
        }
    table = {}
    with torch.autocast(device, dtype=low):
        hi, lo = ops(torch.float32), ops(low)
        for name in hi:
            out_hi, out_lo = hi[name]().dtype, lo[name]().dtype
            if out_hi == low:
                kind = "lower precision"
            elif out_lo == torch.float32:
                kind = "promote" if "mixed" in name else "fp32"
            else:
                kind = "unchanged"
            table[name] = (out_hi, out_lo, kind)
    return table


cpu_table = autocast_table("cpu", torch.bfloat16)
cpu_fp16_table = autocast_table("cpu", torch.float16)
print(f"{'op':<14} {'fp32 in ->':<16} {'bf16 in ->':<16} {'CPU autocast(bf16)':<19} CPU autocast(fp16)")
for name, (a, b, kind) in cpu_table.items():
    print(f"{name:<14} {str(a):<16} {str(b):<16} {kind:<19} {cpu_fp16_table[name][2]}")
assert {n for n, (_, _, k) in cpu_table.items() if k == "lower precision"} == {"matmul", "linear", "conv2d", "bmm"}
assert {n for n, (_, _, k) in cpu_table.items() if k == "fp32"} == {"cross_entropy", "mse_loss", "nll_loss", "prod"}
same_lists = all(cpu_fp16_table[n][2] == k for n, (_, _, k) in cpu_table.items())
print("fp16 autocast on the CPU sorts every op as bf16 autocast does:", same_lists)
assert same_lists

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So on the CPU, the matmul family runs in bf16, the losses are forced to fp32, and softmax, layer norm and reductions are **unchanged**: given a bf16 input (say, the output of a linear layer), they run in bf16. CPU autocast also accepts `dtype=torch.float16`, and sorts the operations the same way (the last column); section 3 shows what fp16 then needs. The unchanged operations are still computed carefully (CPU kernels accumulate bf16 reductions in fp32 internally), but their output is rounded to bf16:
"""

# %% slideshow={"slide_type": "fragment"}
ones = torch.ones(10000, dtype=torch.bfloat16)
print("sum of 10000 ones in bf16:", ones.sum().item(), "(accumulated in fp32, then rounded to bf16: the gap at 10000 is",
      ulp(10000.0, torch.bfloat16), ")")
assert ones.sum().item() == 9984.0   # not 256, where a bf16 accumulator would stall
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.cpu.amp.autocast():
        pass
print("torch.cpu.amp.autocast ->", [str(w.message) for w in caught if issubclass(w.category, FutureWarning)][0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**On CUDA the lists differ.** CUDA autocast's fp32 list ([PyTorch's autocast op reference](https://pytorch.org/docs/stable/amp.html#autocast-op-reference)) also contains `softmax`, `log_softmax`, `layer_norm`, `group_norm`, `exp`, `log`, `pow`, `sum`, `prod`, `norm` and more, because with fp16 (5 exponent bits) `exp` overflows beyond 11.1, sums of many terms exceed 65504, and norms square their inputs. The GPU cell below prints the same table for `autocast("cuda", torch.float16)`.
"""

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("the autocast table on CUDA with fp16"):
    cuda_table = autocast_table("cuda", torch.float16)
    for name, (a, b, kind) in cuda_table.items():
        cpu_kind = cpu_table[name][2]
        print(f"{name:<14} CUDA: {kind:<16} CPU: {cpu_kind}{'   <- differs' if kind != cpu_kind else ''}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Two rules for code under autocast

**Backward goes outside the region.** Put the forward pass and the loss inside `with torch.autocast(...)`, and call `backward()` after the block. Autograd records which dtype each forward operation ran in, and the backward of each operation runs in that same dtype whether autocast is active or not; the casts themselves (`ToCopyBackward0`) bring the gradients back to fp32 for the fp32 parameters. Running backward inside the region changes nothing here and invites mistakes; PyTorch's AMP documentation advises against it:
"""

# %% slideshow={"slide_type": "fragment"}
small = mlp(width=32)
grads = {}
for inside in (False, True):
    small.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(small(X[:64]), Y[:64])
        if inside:
            loss.backward()
    if not inside:
        loss.backward()
    grads[inside] = [p.grad.clone() for p in small.parameters()]
same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
print("backward outside vs inside autocast: identical gradients:", same, "| gradient dtypes:", sorted({str(g.dtype) for g in grads[False]}))
assert same and all(g.dtype == torch.float32 for g in grads[False])

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
**Custom Functions need to be told** (the bridge to notebook 03). Autocast is active inside your Function's `forward`, so a matmul there runs in bf16; but the engine calls your `backward` later, outside the region, so the same matmul there sees a bf16 gradient and fp32 weights. `torch.amp.custom_fwd(device_type=...)` and `torch.amp.custom_bwd(device_type=...)` fix it: backward runs under the autocast state that forward saw. With `custom_fwd(..., cast_inputs=torch.float32)`, forward instead runs in fp32 with autocast off (for an op that must not run in low precision):
"""


# %% slideshow={"slide_type": "fragment"}
class LinearFn(torch.autograd.Function):               # y = x @ w, backward by hand
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad_output):
        x, w = ctx.saved_tensors
        return grad_output @ w.T, x.T @ grad_output


class LinearAmp(LinearFn):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        return LinearFn.forward(ctx, x, w)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_output):
        return LinearFn.backward(ctx, grad_output)


class LinearFp32(LinearFn):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        return LinearFn.forward(ctx, x, w)


xs, ws = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
for fn in (LinearFn, LinearAmp, LinearFp32):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = fn.apply(xs, ws)
    if fn is LinearFn:
        with expect_error(RuntimeError, match="same dtype"):
            ys.float().sum().backward()                # backward: bf16 gradient @ fp32 weight
    else:
        ys.float().sum().backward()
        print(f"{fn.__name__:<10}: forward output {ys.dtype}, backward ran, weight gradient {ws.grad.dtype}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Apex's O0–O3, in today's terms

The Tensor post introduces NVIDIA Apex's `amp.initialize(model, optimizer, opt_level="O1")`. Apex's `amp` is legacy: its author moved automatic mixed precision into PyTorch core in 2020 (PyTorch 1.6) and recommends the native API instead ([NVIDIA/apex issue #818](https://github.com/NVIDIA/apex/issues/818)); `apex.amp` is deprecated, and nothing in this course needs it. What is worth keeping is the vocabulary, since older code and papers use it:

| Apex level | what it did | today |
|---|---|---|
| O0 | pure fp32 | a normal fp32 loop |
| O1 | per-op casting from allow/deny lists, plus dynamic loss scaling | `torch.autocast` (section 1) + `torch.amp.GradScaler` (notebook 06 §4); with bf16, no scaler (section 3). The recommended path |
| O2 | the model cast to fp16 except BatchNorm, fp32 master weights, dynamic loss scaling; no per-op lists, so a softmax runs in fp16 too | no one-liner: notebook 06 §5's master weights by hand; in sharded training, FSDP's `MixedPrecisionPolicy` computes in bf16 on fp32 shards (notebook 14 §3) |
| O3 | pure fp16, "a speed baseline" | `model.half()`: with Adam the loss is NaN after the first update (notebook 06 §5) |
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### The single-machine post's Apex example, and its order bug

Apex asked for one call in the right place: `amp.initialize(model, optimizer)` after the model **and the optimizer** exist, and before the model is wrapped in `DistributedDataParallel` ([apex.amp](https://nvidia.github.io/apex/amp.html)). The single-machine post's DDP-with-Apex script gets the first half wrong. Its lines, in order:

```python
model = ...
model, optimizer = amp.initialize(model, optimizer)
model = DistributedDataParallel(model, device_ids=[args.local_rank])

optimizer = optim.SGD(model.parameters())
```

`amp.initialize` receives `optimizer` before the optimizer is created, so the script stops with a `NameError` before its first step. (Its imports never bring in `amp` either, a second `NameError` waiting behind the first.) Apex is not installed here, so the cell runs the post's four lines with stand-ins of our own: `amp.initialize` is a function that returns its two arguments unchanged, and `DistributedDataParallel` one that returns the model. Neither is Apex or DDP; they are there only so that what fails is the order. Then the corrected order, with the same stand-ins:
"""

# %% slideshow={"slide_type": "fragment"}
from types import SimpleNamespace

STAND_INS = {
    "amp": SimpleNamespace(initialize=lambda model, optimizer, **opts: (model, optimizer)),  # a stand-in, not Apex
    "DistributedDataParallel": lambda model, device_ids=None: model,                     # a stand-in, not DDP
    "nn": nn, "optim": torch.optim, "args": SimpleNamespace(local_rank=0),
}
POST_ORDER = """
model = nn.Linear(4, 2)
model, optimizer = amp.initialize(model, optimizer)
model = DistributedDataParallel(model, device_ids=[args.local_rank])
optimizer = optim.SGD(model.parameters(), lr=0.1)
"""
FIXED_ORDER = """
model = nn.Linear(4, 2)
optimizer = optim.SGD(model.parameters(), lr=0.1)                     # 1. the optimizer exists
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")   # 2. then Apex patches both
model = DistributedDataParallel(model, device_ids=[args.local_rank])  # 3. then DDP wraps the model
"""
with expect_error(NameError, match="'optimizer' is not defined"):
    exec(POST_ORDER, dict(STAND_INS))       # a fresh namespace: nothing defined before these lines
fixed = dict(STAND_INS)
exec(FIXED_ORDER, fixed)
print("the corrected order runs: optimizer, then amp.initialize, then DistributedDataParallel ->",
      type(fixed["optimizer"]).__name__)

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Today's equivalent has no initialization call, so there is no order to get wrong: `torch.autocast` wraps the forward (O1's per-op casting), `torch.amp.GradScaler` the backward and the step (O1's loss scaling), and the model and optimizer are built as in an fp32 script, DDP included (notebook 11). One fp16 step on the CPU:
"""

# %% slideshow={"slide_type": "fragment"}
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")                    # O1's dynamic loss scaling (bf16 would need none)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
with torch.autocast("cpu", dtype=torch.float16):        # O1's per-op casting
    logits = model(x)
    loss = F.cross_entropy(logits, y)
scaler.scale(loss).backward()                           # backward outside the region (section 1)
scaler.step(optimizer)
scaler.update()
print(f"logits {logits.dtype}, loss {loss.dtype}, weight and its gradient {model.weight.dtype}, {model.weight.grad.dtype}")
assert logits.dtype == torch.float16 and loss.dtype == model.weight.grad.dtype == torch.float32

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. bf16 versus fp16: range versus precision, and who needs a scaler

bf16 keeps fp32's 8 exponent bits and only 7 stored mantissa bits (8 significant bits with the implicit leading 1, notebook 06 §1). It covers the same range as fp32, but its gap at 1.0 is 2^-7 = 0.0078, eight times coarser than fp16's:
"""

# %% slideshow={"slide_type": "fragment"}
print(f"{'value':>10} | {'fp16':>12} | {'bf16':>12}")
for v in (70000.0, 1e-8, 1e-30, 1.001, 1.004, 0.1):
    print(f"{v:>10g} | {round_to(v, torch.float16):>12.6g} | {round_to(v, torch.bfloat16):>12.6g}")
gaps = {dt: ulp(1.0, dt) for dt in (torch.float16, torch.bfloat16)}
print(f"gap above 1.0: fp16 {gaps[torch.float16]}, bf16 {gaps[torch.bfloat16]} ({gaps[torch.bfloat16] / gaps[torch.float16]:.0f} times coarser)")
assert round_to(1.001, torch.bfloat16) == 1.0 and round_to(1.001, torch.float16) != 1.0
assert gaps[torch.bfloat16] == 8 * gaps[torch.float16]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Range decides who needs a scaler.** Under autocast the matmuls return low-precision activations, so the gradients that flow back through them are low precision too: an fp16 gradient at or below 2^-25 is 0 (notebook 06 §1). The cell runs notebook 06 §3's trained MLP on 512 images under CPU autocast and counts the activation gradients that are nonzero in fp32 but 0 under autocast: fp16 without a scaler, fp16 with `torch.amp.GradScaler("cpu")` (its default scale, 65536 as notebook 06 §4 prints, multiplies the loss before `backward()`), and bf16 without one. The fractions come from a trained network's gradients, so they are printed after `~`:
"""


# %% slideshow={"slide_type": "fragment"}
def activation_grads(dtype, scaler=None):
    """Every layer's output gradient for 512 images (as fp32, unscaled) under autocast(dtype); dtype None: fp32."""
    outs = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: (out.retain_grad(), outs.append(out)) and None) for m in net]
    net.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = F.cross_entropy(net(X[:512]), Y[:512])
    (scaler.scale(loss) if scaler else loss).backward()
    for hk in hooks:
        hk.remove()
    scale = scaler.get_scale() if scaler else 1.0
    return torch.cat([o.grad.float().flatten() for o in outs]) / scale, sorted({str(o.grad.dtype) for o in outs})


reference, _ = activation_grads(None)
nonzero = reference != 0
lost = {}
for name, dtype, scaler in (
    ("fp16, no scaler", torch.float16, None),
    ("fp16, GradScaler('cpu')", torch.float16, torch.amp.GradScaler("cpu")),
    ("bf16, no scaler", torch.bfloat16, None),
):
    grads, dtypes = activation_grads(dtype, scaler)
    lost[name] = ((grads == 0) & nonzero).sum().item() / nonzero.sum().item()
    print(f"{name:<24} gradients in {dtypes}: lost to 0 ~{lost[name]:.1%}")
assert lost["fp16, no scaler"] > 0.2 and lost["fp16, GradScaler('cpu')"] < 0.01 and lost["bf16, no scaler"] < 0.001

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So **fp16 autocast needs a `GradScaler` on the CPU exactly as on CUDA** (`torch.amp.GradScaler("cpu")`), and bf16 needs none: this is O1 on a CPU (exercise 3 writes the step). The fraction of a percent that remains with the scale, or in bf16, is not the same loss: the very smallest gradients, still below 2^-25 after the scale, and gradients at the edge of a ReLU, where a pre-activation near 0 rounds to the other side in 16 bits and the ReLU blocks a gradient that fp32 let through. fp16 on the CPU is rarely worth it, though: few CPUs compute in fp16 (section 5 times an fp16 matmul), which is why CPU mixed precision is usually bf16.

bf16's weakness is precision, which is why weights and optimizer state stay fp32 (autocast only casts *copies* for the matmuls) and why accumulation happens in fp32. Same MLP, same batches and Adam as in notebook 06 §5, with bf16 autocast and no scaler:
"""


# %% slideshow={"slide_type": "fragment"}
def train_bf16_autocast():
    model = mlp(width=64)
    optimizer = torch.optim.Adam(model.parameters())
    losses = []
    for idx in batches:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(X[idx]), Y[idx])
        loss.backward()                                  # no scaler
        optimizer.step()
        losses.append(loss.item())
    return losses, model


bf16_losses, bf16_model = train_bf16_autocast()
bf16_final = sum(bf16_losses[-50:]) / 50
print(f"Adam, bf16 autocast, no loss scaling: mean loss over the last 50 steps ~{bf16_final:.3f} (fp32: ~{fp32_final:.3f})")
print("parameters stay", next(bf16_model.parameters()).dtype)
assert abs(bf16_final - fp32_final) < 0.02 and next(bf16_model.parameters()).dtype == torch.float32

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Memory: what autocast saves for backward

Half the bytes per element should mean half the activation memory. We count the tensors autograd saves for backward with `SavedTensorMeter` (notebook 02 §4), leaving out the parameters themselves, and count the loss apart from the model:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.saved_tensors import SavedTensorMeter, format_bytes, saved_cast_copy_bytes

big = mlp(width=256)
xb, yb = X[:512].clone(), Y[:512].clone()   # clones: a slice would share (and be counted as) the whole dataset's storage


def saved_for_backward(low_precision):
    """(what the model's forward saves, what the loss saves), in fp32 or under bf16 autocast."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low_precision):
        with SavedTensorMeter(exclude=big.parameters()) as model_part:
            logits = big(xb)
        with SavedTensorMeter() as loss_part:
            F.cross_entropy(logits, yb)
    return model_part, loss_part


def forward_bf16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(big(xb), yb)


(model32, loss32), (model16, loss16) = saved_for_backward(False), saved_for_backward(True)
copies = saved_cast_copy_bytes(forward_bf16, big.parameters())   # autocast's bf16 copies of the weights
rows = {
    "activations of the model": (model32.bytes, model16.bytes - copies),
    "autocast's bf16 weight copies": (0, copies),
    "loss: fp32 log-probs, targets": (loss32.bytes, loss16.bytes),
    "total": (model32.bytes + loss32.bytes, model16.bytes + loss16.bytes),
}
print(f"{'saved for backward':<31} {'fp32':>9} {'bf16 autocast':>14} {'bf16/fp32':>10}")
for name, (b32, b16) in rows.items():
    print(f"{name:<31} {format_bytes(b32):>9} {format_bytes(b16):>14} {f'{b16 / b32:.3f}' if b32 else '':>10}")
activations_ratio = rows["activations of the model"][1] / rows["activations of the model"][0]
total_ratio = rows["total"][1] / rows["total"][0]
print(f"bf16 autocast keeps {total_ratio:.3f} of fp32's saved bytes: the activations are halved ({activations_ratio:.3f}),"
      " the weight copies and the fp32 loss inputs are not")
print("dtypes saved under autocast:", sorted({str(r.dtype).replace("torch.", "") for r in model16.records + loss16.records}))
assert activations_ratio == 0.5 and 0.55 < total_ratio < 0.7 and loss16.bytes == loss32.bytes

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The activations that the matmuls and ReLUs save are exactly halved (0.500), and that is the only part that is: the total is 0.623 of fp32's bytes, for two reasons. Autocast saves the bf16 *copies* of the weights it made for the matmuls (new tensors, not the fp32 parameters), and the loss's inputs are fp32 (cross-entropy is on autocast's fp32 list). For **this MLP on the CPU**, the weight copies do not grow with the batch while the activations do, so with larger batches the activations dominate and the total approaches 0.5.

The limit of 0.5 is not universal. **On CUDA**, autocast runs `softmax`, `log_softmax`, `layer_norm` and the other ops of its fp32 list (section 1) in fp32, so they save fp32 tensors for backward, and the next matmul saves its own low-precision copy of their output. Take attention's score matrix, often a transformer's largest activation: the softmax saves its output, and the matmul with the values saves it again as its input. This CPU cannot run CUDA autocast, but it can count the bytes each rule saves per score element, applying CUDA's rule by hand (softmax in fp32, the matmul in bf16):
"""

# %% slideshow={"slide_type": "fragment"}
scores_in = torch.randn(4, 64, 64)                   # attention scores: batch 4, 64 queries x 64 keys
values_in = torch.randn(4, 64, 32)


def bytes_per_score(softmax_dtype, matmul_dtype):
    scores = scores_in.to(matmul_dtype).requires_grad_()     # scores come out of a matmul
    values = values_in.to(matmul_dtype).requires_grad_()
    with SavedTensorMeter(exclude=[values]) as meter:          # count what the scores cost
        probs = F.softmax(scores.to(softmax_dtype), dim=-1)    # softmax saves its output
        probs.to(matmul_dtype) @ values                        # the matmul saves its input (a copy if cast)
    return meter.bytes / scores.numel()


per_score = {
    "fp32 training": bytes_per_score(torch.float32, torch.float32),
    "CPU autocast (softmax unchanged, bf16)": bytes_per_score(torch.bfloat16, torch.bfloat16),
    "CUDA autocast's rule (softmax in fp32)": bytes_per_score(torch.float32, torch.bfloat16),
}
for name, b in per_score.items():
    print(f"{name:<40} {b:.0f} bytes saved per attention score")
assert list(per_score.values()) == [4, 2, 6]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Under CUDA autocast the scores cost **more** than in fp32 (6 bytes instead of 4: an fp32 copy for the softmax, a bf16 one for the matmul), so a transformer's activation memory falls by clearly less than half. This is one reason fused attention (`F.scaled_dot_product_attention`, FlashAttention) matters: it does not save the score matrix at all.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**The weight copies are cached for the autocast region.** A weight used several times inside one `with torch.autocast(...)` block is cast once: autocast keeps the low-precision copy of each parameter (a leaf that requires grad) until the block exits, and every use reads it. That saves casts (a weight reused across the steps of an RNN, say), and the cached copies live as long as the region. `torch.autocast(..., cache_enabled=False)` turns the cache off: one copy per use. One `Linear` applied three times (the first use's copy is not saved for backward: its input needs no gradient, notebook 02 §4):
"""

# %% slideshow={"slide_type": "fragment"}
shared = nn.Linear(64, 64)
inp = torch.randn(8, 64)
copies_saved = {}
for cache in (True, False):
    def three_uses(cache=cache):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
            return shared(shared(shared(inp))).float().sum()

    copies_saved[cache] = saved_cast_copy_bytes(three_uses, shared.parameters())
    print(f"cache_enabled={cache!s:<5}: bf16 weight copies saved for backward {format_bytes(copies_saved[cache])}")
assert copies_saved[True] == 64 * 64 * 2 and copies_saved[False] == 2 * 64 * 64 * 2   # one copy vs one per saved use

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
On a GPU, the same comparison in allocator terms:
"""

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("peak GPU memory of a training step, fp32 vs bf16 autocast"):
    gbig = mlp(width=4096).cuda()
    gx, gy = torch.randn(8192, 64, device="cuda"), torch.randint(0, 10, (8192,), device="cuda")
    for name, ctx in (("fp32", torch.autocast("cuda", enabled=False)), ("bf16", torch.autocast("cuda", dtype=torch.bfloat16))):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with ctx:
            out = F.cross_entropy(gbig(gx), gy)
        out.backward()
        gbig.zero_grad(set_to_none=True)
        print(f"{name}: peak above baseline {(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} MiB")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Speed: it depends on the hardware

Mixed precision is fast where the hardware has units for 16-bit math: NVIDIA tensor cores (Volta and later for fp16, Ampere and later for bf16), or CPUs with AVX512-BF16 or AMX. A CPU with only AVX2 has no bf16 arithmetic: PyTorch converts to fp32 and back. So we measure, on this machine: a small matrix product and a larger one, where bf16 units have enough work to pay off, then a training step. The versions being compared are timed in alternation, round after round, and each keeps its fastest round: a busy spell on a shared machine then slows all of them alike, instead of the one that happened to run during it. Each line prints the time, the rate in GFLOP/s (a product of two n×n matrices is 2n³ operations), the ratio to fp32 and the verdict on this CPU: "about the same" within 25 % of fp32's time (a busy machine moves a ratio that much). These outputs come from the machine that ran them, whose bf16 hardware the second line names; compare yours with it. Where the CPU has bf16 units, the cell also asserts that the larger bf16 product takes less time than fp32's:
"""

# %% slideshow={"slide_type": "fragment"} tags=["nbval-ignore-output"]
import time


def best_times(fns, rounds=5, number=10):
    """The fastest per-call time of each fn, the fns interleaved round by round: a busy spell slows them all alike."""
    for fn in fns.values():
        fn()                                     # warm-up
    best = {name: math.inf for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / number)
    return best


BAND = 1.25   # a ratio within 25 % of 1 either way is "about the same": a busy machine moves it that much


def verdict(ratio):
    if 1 / BAND < ratio < BAND:
        return f"x~{ratio:.2f} the fp32 time: about the same as fp32 here"
    return f"x~{ratio:.2f} the fp32 time: {'faster' if ratio < 1 else 'slower'} than fp32 here"


from course_lib.torch_private import onednn_bf16_supported  # torch.ops.mkldnn._is_mkldnn_bf16_supported (private)

try:
    flags = set(open("/proc/cpuinfo").read().split())
except OSError:
    flags = set()
bf16_units = bool(flags & {"avx512_bf16", "amx_bf16"}) and onednn_bf16_supported()
print(f"verdicts: 'about the same' for a time within {BAND - 1:.0%} of fp32's either way")
print("CPU capability used by PyTorch:", torch.backends.cpu.get_cpu_capability())
print("bf16/fp16 hardware flags:", sorted(flags & {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}) or "none",
      "| oneDNN bf16 support:", onednn_bf16_supported())
matmul_ratio = {}
for n, dtypes, number in ((128, (torch.bfloat16, torch.float16), 10), (512, (torch.bfloat16,), 3)):
    a32, b32 = torch.randn(n, n), torch.randn(n, n)
    products = {torch.float32: lambda a=a32, b=b32: a @ b}
    for dt in dtypes:
        if n > 128 and not bf16_units:       # emulated bf16 at this size: seconds, and the AVX2 cell below says it
            print(f"{n}x{n} matmul {dt}: skipped, no bf16 units (emulated, it would take seconds)")
            continue
        products[dt] = lambda a=a32.to(dt), b=b32.to(dt): a @ b
    times = best_times(products, rounds=5, number=number)
    for dt, t in times.items():
        rate = f"~{t * 1e6:.0f} us, ~{2 * n**3 / t / 1e9:.0f} GFLOP/s"
        if dt == torch.float32:
            print(f"{n}x{n} matmul {str(dt):<15}: {rate}")
        else:
            matmul_ratio[n, dt] = t / times[torch.float32]
            print(f"{n}x{n} matmul {str(dt):<15}: {rate}, {verdict(matmul_ratio[n, dt])}")
if bf16_units:
    assert matmul_ratio[512, torch.bfloat16] < 1


# %% slideshow={"slide_type": "fragment"} tags=["nbval-ignore-output"]
def training_step(autocast_dtype):
    model = mlp(width=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xb, yb = X[:128], Y[:128]

    def step():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()

    return step


steps = best_times({"fp32": training_step(None), "bf16": training_step(torch.bfloat16)}, rounds=5, number=3)
s32, s16 = steps["fp32"], steps["bf16"]
print(f"training step (MLP 64-256-256-10, batch 128): fp32 ~{s32 * 1e3:.2f} ms, bf16 autocast ~{s16 * 1e3:.2f} ms")
print(f"bf16 autocast training step: {verdict(s16 / s32)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
And an AVX2-only CPU, a typical laptop without bf16 units, simulated on this one: a new Python process with PyTorch's AVX2 kernels, oneDNN and MKL capped at AVX2 by environment variables, one thread. Capped at AVX2, oneDNN reports no bf16 support, so PyTorch runs bf16 matmuls with its own fallback loop, as on a typical AVX2 machine. The ratio depends on the machine (`~`); the lesson is its size, and its direction:
"""

# %% slideshow={"slide_type": "fragment"}
import os
import subprocess
import sys

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "1"}
probe = """
import math, time, torch
from course_lib.torch_private import onednn_bf16_supported
def best(fn):
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter(); fn(); fn(); fn(); times.append((time.perf_counter() - t0) / 3)
    return min(times)
a, b = torch.randn(128, 128), torch.randn(128, 128)
a16, b16 = a.bfloat16(), b.bfloat16()
print(torch.backends.cpu.get_cpu_capability(), onednn_bf16_supported(), best(lambda: a16 @ b16) / best(lambda: a @ b))
"""
run = subprocess.run([sys.executable, "-c", probe], env=os.environ | AVX2_ENV, capture_output=True, text=True, timeout=120)
capability, onednn_bf16, ratio = run.stdout.split()
if capability == "AVX2":
    print(f"simulated AVX2: oneDNN bf16 support {onednn_bf16}; a 128x128 bf16 matmul takes x~{float(ratio):.0f} the fp32 time:"
          f" {'slower' if float(ratio) > 1 else 'faster'} than fp32")
    assert onednn_bf16 == "False" and float(ratio) > 5
else:
    print(f"this CPU cannot simulate AVX2 (PyTorch ran {capability} kernels): no figure")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read your own numbers. With bf16 units (AVX512-BF16, AMX) the larger bf16 product takes a fraction of fp32's time, while at 128x128 there is too little work to amortise the conversions and the gain is small or absent. A whole training step of this small MLP gains less still, or nothing, since it adds casts and keeps fp32 work (the loss, the optimizer): on a CPU with AVX512-BF16 but no AMX its ratio lands on either side of 1 from run to run, which is why the verdict has a band. Without them, as in the simulated AVX2 run, bf16 is far behind fp32 and autocast makes training much slower. The memory saving of section 4 holds on every CPU (on a GPU, mind section 4's note on CUDA's fp32 ops).

A note on the Tensor post's picture of tensor cores ("one matrix multiply per clock, versus one multiply per clock for a CUDA core"): it is the right idea, loosely put. A CUDA core performs one scalar fused multiply-add per clock; a tensor core performs a small matrix multiply-accumulate per clock (4x4x4 on Volta, larger tiles on later GPUs), with fp16/bf16 inputs and fp32 accumulation, the paper's "multiply in fp16, add in fp32".

**Matrix shapes on tensor cores.** Older guides give a hard rule: an fp16 product whose sizes are not divisible by 8 cannot use the tensor cores at all. That held before cuBLAS 11.0 and cuDNN 7.6.3; since then any size can use them, and the shape decides only how efficiently ([NVIDIA, Matrix Multiplication Background User's Guide](https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html)). Two effects matter: **alignment** (rows of 16 bytes or more are read with wide loads; on A100 the guide recommends multiples of 64 fp16 elements, 128 bytes) and **quantization**: the GPU cuts the output into tiles (say 128x128) and schedules the tiles in waves over its SMs, so a dimension just above a tile size, or a tile count just above a multiple of the SM count, pays for a nearly empty tile or wave. That is why model widths and vocabulary sizes are padded to multiples of 64 or 128. The GPU cell compares an aligned size with the one next to it:
"""

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("matmul throughput: fp32, TF32, fp16, bf16 on tensor cores"):
    from course_lib.timing import matmul_tflops  # CUDA events around 10 products, after 3 warm-up ones

    for n in (4096, 4095):
        print(f"n={n}: fp32 ~{matmul_tflops(n, torch.float32):.1f} | tf32 ~{matmul_tflops(n, torch.float32, tf32=True):.1f} | "
              f"fp16 ~{matmul_tflops(n, torch.float16):.1f} | bf16 ~{matmul_tflops(n, torch.bfloat16):.1f} TFLOP/s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**TF32: the defaults, and the controls to use now.** On Ampere and later GPUs, fp32 matmuls and convolutions may run on tensor cores in TF32: fp32's 8 exponent bits with 10 stored mantissa bits (fp16's), fp32 accumulation, fp16-like input precision at several times fp32's throughput ([PyTorch's CUDA semantics notes](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices)). Out of the box PyTorch treats the two differently: **convolutions use TF32 by default** (cuDNN's `torch.backends.cudnn.conv.fp32_precision` is `"tf32"`, and the legacy `torch.backends.cudnn.allow_tf32` is `True`), **matmuls do not** (`torch.backends.cuda.matmul.fp32_precision` is `"none"`: it follows `torch.get_float32_matmul_precision()`, whose default `"highest"` means full fp32). The portable switch for matmuls is `torch.set_float32_matmul_precision("high")`. Since 2.9 (2.13 here) each backend also has its own `fp32_precision`, `"ieee"` or `"tf32"`; `course_lib.timing.matmul_tflops` (the cell above) sets that one. The documentation says the old `allow_tf32` flags will be deprecated, and mixing them with the new settings makes PyTorch refuse to report the precision. These are global flags, so they can be read and set on this CPU (where they change nothing), and restored:
"""

# %% slideshow={"slide_type": "fragment"}
conv_default = (torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.allow_tf32)
print(f"convolutions: cudnn.conv.fp32_precision {conv_default[0]!r}, cudnn.allow_tf32 {conv_default[1]}: TF32 by default")
backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)   # the global setting moves both
before = (torch.get_float32_matmul_precision(), *(b.fp32_precision for b in backends))
print(f"matmuls: cuda.matmul.fp32_precision {before[1]!r}, following get_float32_matmul_precision() {before[0]!r}: full fp32")
assert conv_default == ("tf32", True) and before[:2] == ("highest", "none")
try:
    torch.set_float32_matmul_precision("high")
    after = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision)
finally:
    torch.set_float32_matmul_precision(before[0])
    for b, old in zip(backends, before[1:]):
        b.fp32_precision = old                   # "none": follow the global setting, as before
print(f"after set_float32_matmul_precision('high'): {after[0]!r}, cuda.matmul.fp32_precision {after[1]!r}; restored")
assert after == ("high", "tf32")
assert (torch.get_float32_matmul_precision(), *(b.fp32_precision for b in backends)) == before   # restored

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**fp8, the next step (not run here).** NVIDIA's Hopper (H100) and Ada GPUs and later have tensor cores for 8-bit floats in two formats: E4M3 (more precision, max 448) for weights and activations and E5M2 (fp16's range, max 57344) for gradients (Micikevicius et al., 2022). With so little range, one loss scale is not enough: fp8 training scales **each tensor** (per tensor, per row, or per block) so that it fits, keeps master weights in higher precision, and runs only the matmuls in fp8. In PyTorch this is `torchao.float8` (`convert_to_float8_training` replaces the `Linear` layers) or NVIDIA's Transformer Engine; Blackwell GPUs add the OCP **MX** formats, such as MXFP8, where each block of 32 values shares one power-of-two scale. The formats themselves are PyTorch dtypes and can be inspected on any machine:
"""

# %% slideshow={"slide_type": "fragment"}
for dt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float16):
    fi = torch.finfo(dt)
    print(f"{str(dt):<20} max {fi.max:>8g} | smallest normal 2^{math.log2(fi.smallest_normal):.0f} | eps 2^{math.log2(fi.eps):.0f}")
assert torch.finfo(torch.float8_e4m3fn).max == 448 and torch.finfo(torch.float8_e5m2).max == 57344

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- `torch.autocast` casts matmul-like ops down and forces losses to fp32; everything else runs in its input's dtype on the CPU, while CUDA also forces softmax, norms and reductions to fp32. CPU autocast sorts ops the same way for fp16 as for bf16. `torch.cuda.amp.*` and `torch.cpu.amp.*` are deprecated: use `torch.amp.autocast(device)` and `torch.amp.GradScaler(device)`.
- Call `backward()` outside the autocast region; a custom `autograd.Function` under autocast needs `torch.amp.custom_fwd`/`custom_bwd(device_type=...)`, with `cast_inputs=torch.float32` for an op that must stay fp32.
- Apex is legacy: O1 is autocast + `GradScaler`, O2 is notebook 06 §5's master weights, O3 is `model.half()`.
- fp16 autocast needs a `GradScaler`, on the CPU (`GradScaler("cpu")`) as on CUDA: without it a large share of this MLP's activation gradients are lost to 0, with it almost none (section 3). bf16 needs no scaler and trained as fp32 did.
- Memory: under bf16 autocast the activations themselves are halved (0.500 here), but the weight copies it saves and the fp32 loss inputs keep the total at 0.623 of fp32's saved bytes (section 4); on CUDA, ops kept in fp32 (softmax, layer norm) save fp32 copies, so a transformer saves clearly less. Autocast caches its weight copies for the region (`cache_enabled`).
- Speed depends on the hardware: section 5 prints the verdict for this CPU. A simulated AVX2 CPU runs a 128x128 bf16 matmul tens of times slower than fp32. TF32: convolutions use it by default, matmuls only after `torch.set_float32_matmul_precision("high")` or the backends' `fp32_precision` (2.9 and later); tensor cores take any matrix size since cuBLAS 11, and aligned, tile-sized shapes run best. fp8 (Hopper and later) scales every tensor (torchao.float8, MXFP8).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Under `torch.autocast("cpu", dtype=torch.bfloat16)`, what dtype does each tensor of this forward have, with fp32 inputs and fp32 `Linear` layers? And what dtype has `lin1.weight.grad` after `loss.backward()`? Predict first, from section 1's rules; the check runs the forward itself.

```python
h = lin1(x)                        # x: fp32, shape (batch, 8); lin1 = nn.Linear(8, 16)
g = F.gelu(h)
n = F.layer_norm(g, (16,))
logits = lin2(n)                   # lin2 = nn.Linear(16, 4)
lp = F.log_softmax(logits, dim=-1)
loss = F.nll_loss(lp, y)
```
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.mixed_precision import autocast_forward, check_autocast_dtypes, check_fp16_step, check_fp32_gram


def forward_shown(x, y, lin1, lin2):   # the code above, as a function: it must be what the check runs
    h = lin1(x)
    g = F.gelu(h)
    n = F.layer_norm(g, (16,))
    logits = lin2(n)
    lp = F.log_softmax(logits, dim=-1)
    return {"h": h, "g": g, "n": n, "logits": logits, "lp": lp, "loss": F.nll_loss(lp, y)}


args = (torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0]), nn.Linear(8, 16), nn.Linear(16, 4))
assert all(torch.equal(a, b) for a, b in zip(forward_shown(*args).values(), autocast_forward(*args).values()))

dtypes = {"h": ..., "g": ..., "n": ..., "logits": ..., "lp": ..., "loss": ..., "lin1.weight.grad": ...}
check_autocast_dtypes(dtypes)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Write `Gram`, an `autograd.Function` computing `x @ x.T` with a hand-written backward (for an output gradient G, the gradient of x is (G + Gᵀ) x), that **runs in fp32 even under autocast**: the check calls it on fp16 inputs of size about 100 under `torch.autocast("cpu", dtype=torch.float16)`, where a dot product of 8 such numbers exceeds fp16's 65504. It wants an fp32 result without inf, and a gradient of x in x's own dtype. (Section 1's `LinearFp32` shows the decorator; try first without it and read the check's message.)
"""


# %% slideshow={"slide_type": "fragment"}
class Gram(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


check_fp32_gram(Gram)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write `fp16_step(model, optimizer, scaler, x, y)`, one step of Apex's O1 on the CPU in today's API: zero the gradients, run the forward and the cross-entropy loss under `torch.autocast("cpu", dtype=torch.float16)`, backward on the scaled loss, step and update through the scaler, and return the loss. The check trains a confident classifier whose gradients underflow in fp16 without a scale, with a `GradScaler("cpu")` whose first scale (2^34) overflows, and compares every step with its own.
"""


# %% slideshow={"slide_type": "fragment"}
def fp16_step(model, optimizer, scaler, x, y):
    raise NotImplementedError("your code here")


check_fp16_step(fp16_step)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch documentation: [Automatic Mixed Precision package – torch.amp](https://pytorch.org/docs/stable/amp.html) — autocast's op lists for CUDA and CPU, `GradScaler`, [`torch.amp.custom_fwd`](https://pytorch.org/docs/stable/amp.html#torch.amp.custom_fwd) for custom Functions.
- PyTorch documentation: [CUDA Automatic Mixed Precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html) — where `backward()` goes, custom Functions under autocast.
- P. Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740), ICLR 2018 — multiply in fp16, accumulate in fp32.
- D. Kalamkar et al., [A Study of BFLOAT16 for Deep Learning Training](https://arxiv.org/abs/1905.12322), 2019 — bf16 without loss scaling.
- NVIDIA Apex, [apex.amp](https://nvidia.github.io/apex/amp.html) — the O0–O3 opt levels; and ["torch.cuda.amp > apex amp"](https://github.com/NVIDIA/apex/issues/818) (M. Carilli, 2020) on why the native API replaced it.
- NVIDIA, [Matrix Multiplication Background User's Guide](https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html) — tensor core requirements by cuBLAS version, tile and wave quantization.
- PyTorch documentation: [CUDA semantics, TF32 on Ampere and later devices](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices) — `set_float32_matmul_precision`, the `fp32_precision` settings, cuDNN's TF32 default.
- P. Micikevicius et al., [FP8 Formats for Deep Learning](https://arxiv.org/abs/2209.05433), 2022 — E4M3 and E5M2; Open Compute Project, [OCP Microscaling Formats (MX) Specification v1.0](https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf), 2023 — MXFP8's shared block scales.
- PyTorch torchao, [float8 training](https://github.com/pytorch/ao/tree/main/torchao/float8) (`convert_to_float8_training`); NVIDIA, [Transformer Engine](https://github.com/NVIDIA/TransformerEngine).
"""
