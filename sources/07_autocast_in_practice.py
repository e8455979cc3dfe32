# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 07 · Mixed precision in practice: `torch.autocast`, Apex's levels, bf16 versus fp16, memory and speed

Notebook 06 took the 16-bit formats apart and rebuilt loss scaling and fp32 master weights by hand. In practice you rarely write either: `torch.autocast` decides, operation by operation, what runs in low precision, and `torch.amp.GradScaler` scales the loss. This notebook measures what autocast does on your machine: which operations it casts, the two rules for code under it, what Apex's O0–O3 became, when bf16 replaces fp16, and what it saves in memory and in time.

By the end you will be able to:
- find out which operations `torch.autocast` runs in low precision on the CPU and on CUDA, and write code that is correct under it (backward outside the region, custom Functions told with `custom_fwd`/`custom_bwd`);
- map Apex's O0–O3 to native PyTorch, and choose between fp16 and bf16;
- measure the activation memory that bf16 saves, and the speed it does (or does not) give on your CPU, and name the controls for TF32 and the formats beyond (fp8).

This notebook assumes: notebook 06 (fp16 and bf16, loss scaling, `GradScaler`, master weights) and notebook 03 (custom `autograd.Function`s).
"""

# %% slideshow={"slide_type": "-"}
import math
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from tqdm.auto import tqdm

from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.float_formats import round_to, ulp
from course_lib.loss_scaling import DynamicLossScaler
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
**From notebook 06, recomputed here**: the MLP trained for 6 epochs with SGD, and the activation gradients of one batch (notebook 06 §3); the 300 random batches of notebook 06 §5 and the fp32 Adam run on them, the baseline the bf16 runs below are compared with.
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
outputs = []
hooks = [m.register_forward_hook(lambda mod, inp, out: (out.retain_grad(), outputs.append(out)) and None) for m in net]
net.zero_grad()
F.cross_entropy(net(X[:512]), Y[:512]).backward()
for hk in hooks:
    hk.remove()
act_grads = torch.cat([o.grad.flatten() for o in outputs]).abs()
act_grads = act_grads[act_grads > 0]

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
final = {("Adam (defaults)", "fp32"): sum(fp32_losses[-50:]) / 50}
print(f"{len(act_grads):,} nonzero activation gradients; fp32 Adam: mean loss over the last 50 steps ~{final['Adam (defaults)', 'fp32']:.3f}")

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
print(f"{'op':<14} {'fp32 in ->':<16} {'bf16 in ->':<16} behaviour under CPU autocast(bf16)")
for name, (a, b, kind) in cpu_table.items():
    print(f"{name:<14} {str(a):<16} {str(b):<16} {kind}")
assert {n for n, (_, _, k) in cpu_table.items() if k == "lower precision"} == {"matmul", "linear", "conv2d", "bmm"}
assert {n for n, (_, _, k) in cpu_table.items() if k == "fp32"} == {"cross_entropy", "mse_loss", "nll_loss", "prod"}

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So on the CPU, the matmul family runs in bf16, the losses are forced to fp32, and softmax, layer norm and reductions are **unchanged**: given a bf16 input (say, the output of a linear layer), they run in bf16. They are still computed carefully — CPU kernels accumulate bf16 reductions in fp32 internally — but their output is rounded to bf16:
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
**On CUDA the lists differ.** CUDA autocast's fp32 list also contains `softmax`, `log_softmax`, `layer_norm`, `group_norm`, `exp`, `log`, `pow`, `sum`, `prod`, `norm` and more, because with fp16 (5 exponent bits) `exp` overflows beyond 11.1, sums of many terms exceed 65504, and norms square their inputs. The GPU cell below prints the same table for `autocast("cuda", torch.float16)`.
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
## 2. Apex O0–O3, and their native equivalents

The blog post introduces NVIDIA Apex's `amp.initialize(model, optimizer, opt_level="O1")`. **Apex's `amp` is legacy**: its author moved automatic mixed precision into PyTorch core in 2020 (PyTorch 1.6) and recommends the native API instead (NVIDIA/apex issue #818); `apex.amp` is deprecated, needs a CUDA build of an extension, and is not installed here. Each opt level is a recipe we can build natively:

| Apex level | what it did | native PyTorch |
|---|---|---|
| O0 | pure fp32 (baseline) | a normal fp32 loop |
| O1 | per-op casting by allow/deny lists + dynamic loss scaling | `torch.autocast` + `torch.amp.GradScaler` (the recommended path) |
| O2 | model cast to fp16 except BatchNorm, fp32 master weights, dynamic loss scaling | no one-liner: `model.half()`, BatchNorm back to fp32, a master copy (notebook 06 §5) |
| O3 | pure fp16 (a speed baseline, unstable) | `model.half()` |
"""

# %% slideshow={"slide_type": "fragment"}
import importlib.util

print("apex installed:", importlib.util.find_spec("apex") is not None)


# %% slideshow={"slide_type": "fragment"}
def bn_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


def evaluate(model, dtype=torch.float32):
    model.eval()
    with torch.no_grad():
        acc = (model(Xt.to(dtype)).argmax(1) == Yt).float().mean().item()
    model.train()
    return acc


def run_level(level, steps=150):
    model = bn_mlp()
    if level in ("O2", "O3"):
        model = model.half()
    if level == "O2":
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.float()                                   # O2 keeps BatchNorm in fp32
        master = [q.detach().float().requires_grad_() for q in model.parameters()]
        optimizer = torch.optim.Adam(master)
        scaler = DynamicLossScaler()
    else:
        optimizer = torch.optim.Adam(model.parameters())
        scaler = torch.amp.GradScaler("cpu", enabled=(level == "O1"))
    in_dtype = torch.float16 if level in ("O2", "O3") else torch.float32
    for idx in batches[:steps]:
        xb = X[idx].to(in_dtype)
        if level == "O1":
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(xb), Y[idx])
        else:
            loss = F.cross_entropy(model(xb).float(), Y[idx])
        if level == "O2":
            model.zero_grad()
            scaler.scale(loss).backward()
            for w, m32 in zip(model.parameters(), master):
                m32.grad = w.grad.float()
            scaler.step(optimizer)
            scaler.update()
            with torch.no_grad():
                for w, m32 in zip(model.parameters(), master):
                    w.copy_(m32)
        else:
            optimizer.zero_grad()
            scaler.scale(loss).backward()               # with enabled=False, scale() is the identity
            scaler.step(optimizer)
            scaler.update()
    dtypes = sorted({str(q.dtype).replace("torch.", "") for q in model.parameters()})
    return loss.item(), evaluate(model, in_dtype), dtypes


levels = {}
for level in tqdm(["O0", "O1", "O2", "O3"], desc="Apex levels, natively"):
    levels[level] = run_level(level)
for level, (last, acc, dts) in levels.items():
    print(f"{level}: last loss {last:.2f}, test accuracy {acc:.2f}, parameter dtypes {dts}")
assert all(levels[lv][1] > 0.85 for lv in ("O0", "O1", "O2")) and math.isnan(levels["O3"][0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
With Adam, O0, O1 and O2 train to the same accuracy, while O3 — pure fp16, no master weights, no loss scaling — turns to NaN for the reason of notebook 06 §5 (Adam's state in fp16). The blog post calls O3 "very unstable, but a speed baseline": here, with Adam, it is simply broken. O1 is what `torch.autocast` + `GradScaler` give you, and it is the recommended default; O2's fp16 model with fp32 master weights is what some large-model frameworks still do by hand (or with bf16). The blog's description of O2 as "no allow/deny lists, almost everything fp16 except BatchNorm" is right: there is no per-op casting, so a softmax in the model runs in fp16 too.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. bf16 versus fp16: range versus precision

bf16 keeps fp32's 8 exponent bits and keeps only 7 mantissa bits. It covers the same range as fp32 — nothing in notebook 06 §3's histogram underflows — but its gap at 1.0 is 2^-7 = 0.0078, eight times coarser than fp16's:
"""

# %% slideshow={"slide_type": "fragment"}
print(f"{'value':>10} | {'fp16':>12} | {'bf16':>12}")
for v in (70000.0, 1e-8, 1e-30, 1.001, 1.004, 0.1):
    print(f"{v:>10g} | {round_to(v, torch.float16):>12.6g} | {round_to(v, torch.bfloat16):>12.6g}")
lost16 = (act_grads.half() == 0).float().mean().item()
lost_bf = (act_grads.bfloat16() == 0).float().mean().item()
print(f"activation gradients of notebook 06 §3 lost to zero: fp16 {lost16:.0%}, bf16 {lost_bf:.0%}")
assert lost_bf == 0.0 and round_to(1.001, torch.bfloat16) == 1.0 and round_to(1.001, torch.float16) != 1.0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Because bf16 has fp32's range, gradients do not underflow and **bf16 training usually needs no loss scaling** (no `GradScaler`). Its weakness is precision, which is why weights and optimizer state stay fp32 (autocast only casts *copies* for the matmuls) and why accumulation happens in fp32. Same MLP, same batches and Adam as in notebook 06 §5, with bf16 autocast and no scaler:
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
fp32_final = final["Adam (defaults)", "fp32"]
print(f"Adam, bf16 autocast, no loss scaling: mean loss over the last 50 steps {bf16_final:.3f} (fp32: {fp32_final:.3f})")
print("parameters stay", next(bf16_model.parameters()).dtype)
assert abs(bf16_final - fp32_final) < 0.02 and next(bf16_model.parameters()).dtype == torch.float32

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Memory: what autocast saves for backward

Half the bytes per element should mean half the activation memory. We count the tensors autograd saves for backward with `SavedTensorMeter`, leaving out the parameters themselves:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.saved_tensors import SavedTensorMeter, format_bytes, saved_cast_copy_bytes

big = mlp(width=256)
xb, yb = X[:512].clone(), Y[:512]   # clone: a slice would share (and be counted as) the whole dataset's storage
with SavedTensorMeter(exclude=big.parameters()) as m32:
    F.cross_entropy(big(xb), yb)
with SavedTensorMeter(exclude=big.parameters()) as m16:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.cross_entropy(big(xb), yb)


def forward_bf16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(big(xb), yb)


copies = saved_cast_copy_bytes(forward_bf16, big.parameters())   # autocast's bf16 copies of the weights
print("fp32:          ", m32.summary())
print("bf16 autocast: ", m16.summary())
print(f"  of which bf16 copies of weights made by autocast: {format_bytes(copies)}")
ratio = m16.bytes / m32.bytes
print(f"saved bytes bf16/fp32: {ratio:.3f}; activations only (without the weight copies): {(m16.bytes - copies) / m32.bytes:.3f}")
print("dtypes saved under autocast:", sorted({str(r.dtype).replace('torch.', '') for r in m16.records}))
assert 0.4 < ratio < 0.75 and 0.45 < (m16.bytes - copies) / m32.bytes < 0.55

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The activations of the matmuls are saved in bf16 (half the bytes), but two things keep the ratio above 0.5: autocast saves the bf16 *copies* of the weights it made for the matmuls (new tensors, not the fp32 parameters), and the loss's inputs stay fp32. For **this MLP on the CPU**, with large batches the activations dominate and the ratio approaches 0.5 (the activations alone are already at 0.5); `benchmarks/mixed_precision.py` shows it for a wider model and two batch sizes.

That limit is not universal. **On CUDA**, autocast runs `softmax`, `log_softmax`, `layer_norm` and the other ops of its fp32 list (section 1) in fp32, so they save fp32 tensors for backward, and the next matmul saves its own low-precision copy of their output. Take attention's score matrix, often a transformer's largest activation: the softmax saves its output, and the matmul with the values saves it again as its input. This CPU cannot run CUDA autocast, but it can count the bytes each rule saves per score element, applying CUDA's rule by hand (softmax in fp32, the matmul in bf16):
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

Mixed precision is fast where the hardware has units for 16-bit math: NVIDIA tensor cores (Volta and later for fp16, Ampere and later for bf16), or CPUs with AVX512-BF16 / AMX. A CPU with only AVX2 has no bf16 arithmetic: PyTorch converts to fp32 and back, and bf16 matmuls run much slower than fp32 (measured below, on a simulated AVX2 CPU). Other CPUs (AVX512-BF16, AMX) have bf16 units. So we measure, small, on this machine; the first cell also says which hardware support it found. Its output depends on the machine, so the tests do not check it:
"""

# %% slideshow={"slide_type": "fragment"} tags=["nbval-ignore-output"]
import time


def best_time(fn, repeat=3, number=10):
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


try:
    flags = set(open("/proc/cpuinfo").read().split())
except OSError:
    flags = set()
print("CPU capability used by PyTorch:", torch.backends.cpu.get_cpu_capability())
print("bf16/fp16 hardware flags:", sorted(flags & {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}) or "none")
n = 128
a32, b32 = torch.randn(n, n), torch.randn(n, n)
t32 = best_time(lambda: a32 @ b32)
for dt in (torch.bfloat16, torch.float16):
    a, b = a32.to(dt), b32.to(dt)
    t = best_time(lambda: a @ b)
    print(f"{n}x{n} matmul {str(dt):<15}: ~{t * 1e6:.0f} us, time relative to fp32: ~{t / t32:.2f}x")
print(f"{n}x{n} matmul torch.float32 : ~{t32 * 1e6:.0f} us")


# %% slideshow={"slide_type": "fragment"}
def step_time(autocast_dtype):
    model = mlp(width=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xb, yb = X[:128], Y[:128]

    def step():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()

    return best_time(step, repeat=3, number=3)


s32, s16 = step_time(None), step_time(torch.bfloat16)
print(f"training step, fp32: ~{s32 * 1e3:.2f} ms | bf16 autocast: ~{s16 * 1e3:.2f} ms | ratio bf16/fp32: ~{s16 / s32:.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
And an AVX2-only CPU, a typical laptop without bf16 units, simulated on this one: a new Python process with PyTorch's AVX2 kernels, oneDNN and MKL capped at AVX2, one thread (the settings `make test-portable` uses). Capped at AVX2, oneDNN reports no bf16 support, so PyTorch runs bf16 matmuls with its own fallback loop, as on a typical AVX2 machine. The ratio depends on the machine (`~`); the lesson is its size:
"""

# %% slideshow={"slide_type": "fragment"}
import os
import subprocess
import sys

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "1"}
probe = """
import math, time, torch
def best(fn):
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter(); fn(); fn(); fn(); times.append((time.perf_counter() - t0) / 3)
    return min(times)
a, b = torch.randn(128, 128), torch.randn(128, 128)
a16, b16 = a.bfloat16(), b.bfloat16()
print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported(), best(lambda: a16 @ b16) / best(lambda: a @ b))
"""
run = subprocess.run([sys.executable, "-c", probe], env=os.environ | AVX2_ENV, capture_output=True, text=True, timeout=120)
capability, onednn_bf16, ratio = run.stdout.split()
if capability == "AVX2":
    print(f"simulated AVX2: oneDNN bf16 support {onednn_bf16}; a 128x128 bf16 matmul takes ~{float(ratio):.0f}x the fp32 time")
    assert onednn_bf16 == "False" and float(ratio) > 5
else:
    print(f"this CPU cannot simulate AVX2 (PyTorch ran {capability} kernels): no figure")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
A note on the blog's picture of tensor cores ("one matrix multiply per clock, versus one multiply per clock for a CUDA core"): it is the right idea, loosely put. A CUDA core performs one scalar fused multiply-add per clock; a tensor core performs a small matrix multiply-accumulate per clock (4x4x4 on Volta, larger tiles on later GPUs), with fp16/bf16 inputs and fp32 accumulation — the paper's "multiply in fp16, add in fp32".

Read your own numbers: on a CPU with AMX or AVX512-BF16, bf16 matmuls can beat fp32 at larger sizes; on an AVX2-only CPU they are much slower, and autocast makes training *slower*, not faster (it also adds the cost of casting). The memory saving of section 4 holds on every CPU (on a GPU, mind section 4's note on CUDA's fp32 ops). `benchmarks/mixed_precision.py` measures both for two batch sizes. On a GPU, tensor cores make the difference large — if the matrix dimensions are multiples of 8 (fp16/bf16), which is why model widths and vocabulary sizes are padded:
"""

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("matmul throughput: fp32, TF32, fp16, bf16 on tensor cores"):
    from course_lib.timing import matmul_tflops  # CUDA events around 10 products, after 3 warm-up ones

    for n in (4096, 4095):
        print(f"n={n}: fp32 ~{matmul_tflops(n, torch.float32):.1f} | tf32 ~{matmul_tflops(n, torch.float32, tf32=True):.1f} | "
              f"fp16 ~{matmul_tflops(n, torch.float16):.1f} | bf16 ~{matmul_tflops(n, torch.bfloat16):.1f} TFLOP/s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**TF32: the controls to use now.** On Ampere and later GPUs, fp32 matmuls and convolutions may run on tensor cores in TF32 (fp32's 8 exponent bits, 10 mantissa bits, fp32 accumulation): much faster, with fp16-like input precision. The cell above (through `course_lib.timing`) and most older code toggle `torch.backends.cuda.matmul.allow_tf32`. The portable switch is `torch.set_float32_matmul_precision("high")` (`"highest"`, the default, means full fp32); newer releases (2.9 and later; 2.13 here) also give each backend an `fp32_precision` setting, `"ieee"` or `"tf32"` (`torch.backends.cuda.matmul.fp32_precision`, `torch.backends.cudnn.conv.fp32_precision`), and the PyTorch documentation says the old `allow_tf32` flags will be deprecated. These are global flags, so they can be read and set on this CPU (where they change nothing), and restored:
"""

# %% slideshow={"slide_type": "fragment"}
backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)   # the setting moves both
before = (torch.get_float32_matmul_precision(), *(b.fp32_precision for b in backends))
try:
    torch.set_float32_matmul_precision("high")
    after = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision)
finally:
    torch.set_float32_matmul_precision(before[0])
    for b, old in zip(backends, before[1:]):
        b.fp32_precision = old                   # "none": follow the global setting, as before
print(f"matmul precision {before[0]!r}, cuda.matmul.fp32_precision {before[1]!r}"
      f" -> after set_float32_matmul_precision('high'): {after[0]!r}, {after[1]!r}")
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

- `torch.autocast` casts matmul-like ops down, forces losses (and on CUDA, softmax/norms/reductions) to fp32. `torch.cuda.amp.*` and `torch.cpu.amp.*` are deprecated: use `torch.amp.autocast(device)` and `torch.amp.GradScaler(device)`. Apex is legacy; O1 ≈ autocast + GradScaler.
- Call `backward()` outside the autocast region; a custom `autograd.Function` under autocast needs `torch.amp.custom_fwd`/`custom_bwd(device_type=...)`.
- bf16 rarely needs loss scaling. This MLP's saved activations shrink toward half on the CPU; under CUDA autocast, ops kept in fp32 (softmax, layer norm) save fp32 copies, so a transformer saves clearly less. Autocast caches its weight copies for the region (`cache_enabled`).
- Speed depends on the hardware: measure it. A simulated AVX2 CPU runs a bf16 matmul tens of times slower than fp32. TF32 is controlled by `torch.set_float32_matmul_precision("high")` or, since 2.9, the backends' `fp32_precision`; fp8 (Hopper and later) scales every tensor (torchao.float8, MXFP8).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Write `scaler_step(scaler, optimizer, scheduler)` for a loop that has already called `scaler.scale(loss).backward()`: step the optimizer through the scaler, update the scale, step the LR scheduler **only if the optimizer really stepped** (notebook 06 §4), and return `True` when it did. The check runs ten steps, four of them with an injected overflow.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.mixed_precision import check_scaler_step


def scaler_step(scaler, optimizer, scheduler):
    raise NotImplementedError("your code here")


check_scaler_step(scaler_step)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- P. Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740), ICLR 2018 — loss scaling, fp32 master weights, the gradient histogram.
- D. Kalamkar et al., [A Study of BFLOAT16 for Deep Learning Training](https://arxiv.org/abs/1905.12322), 2019.
- PyTorch documentation: [Automatic Mixed Precision package – torch.amp](https://pytorch.org/docs/stable/amp.html) — autocast op lists for CUDA and CPU, `GradScaler`.
- PyTorch documentation: [CUDA Automatic Mixed Precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html) — `unscale_` with gradient clipping, accumulation, multiple models.
- NVIDIA, [Train With Mixed Precision](https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html) — tensor cores and the multiples-of-8 rule.
- NVIDIA Apex, [apex.amp](https://nvidia.github.io/apex/amp.html) — the O0–O3 opt levels; and ["torch.cuda.amp > apex amp"](https://github.com/NVIDIA/apex/issues/818) (M. Carilli, 2020) on why the native API replaced it.
- P. Micikevicius et al., [FP8 Formats for Deep Learning](https://arxiv.org/abs/2209.05433), 2022 — E4M3 and E5M2; Open Compute Project, [OCP Microscaling Formats (MX) Specification v1.0](https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf), 2023 — MXFP8's shared block scales.
- PyTorch torchao, [float8 training](https://github.com/pytorch/ao/tree/main/torchao/float8) (`convert_to_float8_training`); NVIDIA, [Transformer Engine](https://github.com/NVIDIA/TransformerEngine).
- PyTorch documentation: [CUDA semantics, TF32 on Ampere and later devices](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices) — `set_float32_matmul_precision` and the `fp32_precision` settings; [`torch.amp.custom_fwd`](https://pytorch.org/docs/stable/amp.html#torch.amp.custom_fwd) for custom Functions; [`torch.optim.lr_scheduler`](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate).
- D. Goldberg, [What Every Computer Scientist Should Know About Floating-Point Arithmetic](https://docs.oracle.com/cd/E19957-01/806-3568/ncg_goldberg.html), 1991.
"""
