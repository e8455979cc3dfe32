# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 05 · Mixed precision: from the bits of fp16 to `GradScaler`

Training in 16-bit floating point halves the bytes of every tensor and, on hardware built for it, multiplies matmul throughput. It also breaks training in three precise ways. This notebook takes fp16 and bf16 apart bit by bit, shows each failure on real numbers, and rebuilds the fixes — loss scaling and fp32 master weights — by hand before checking them against PyTorch's own `torch.amp`.

By the end you will be able to:
- read the bits of an fp32, fp16 or bf16 number and state each format's range, smallest normal and subnormal, and epsilon;
- show overflow, underflow, lost updates and accumulation error in fp16, and measure how much of a real network's gradient would vanish;
- write static and dynamic loss scaling from scratch and prove it makes the same decisions as `torch.amp.GradScaler`;
- explain why `unscale_` comes before gradient clipping and why fp32 master weights are kept;
- find out which operations `torch.autocast` runs in low precision, map Apex's O0–O3 to native PyTorch, and choose between fp16 and bf16;
- measure the activation memory that bf16 saves, and the speed it does (or does not) give on your CPU.

This notebook assumes: notebooks 01–02 (tensors, autograd, `backward`), and the saved-tensor accounting (`SavedTensorMeter`) of the memory notebooks. You know what an optimizer step is.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Setup.** One seed for the whole notebook. Every tensor here is small, so PyTorch runs on one thread: for tensors this size, splitting work between threads costs more than it saves, and one thread keeps timings steady on a busy 2-core machine.
"""

# %% slideshow={"slide_type": "-"}
import math
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)
print("torch", torch.__version__.split("+")[0], "| threads:", torch.get_num_threads())

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 1. Three floating-point formats, bit by bit

A floating-point number is stored as a **sign** bit, an **exponent** field *e* and a **mantissa** (fraction) field *m*. For a *normal* number the value is

$$(-1)^{s} \cdot 2^{\,e - \text{bias}} \cdot \left(1 + \frac{m}{2^{M}}\right),$$

where *M* is the number of mantissa bits. When the exponent field is all zeros the number is *subnormal*: $(-1)^s \cdot 2^{1-\text{bias}} \cdot m / 2^M$ — no implicit leading 1, so it trades precision for reaching closer to zero. An exponent field of all ones means inf (m = 0) or NaN.

| format | bits | exponent | mantissa | what it is for |
|---|---|---|---|---|
| fp32 (`torch.float32`) | 32 | 8 | 23 | the default |
| fp16 (`torch.float16`) | 16 | 5 | 10 | IEEE half: precise, narrow range |
| bf16 (`torch.bfloat16`) | 16 | 8 | 7 | "brain float": fp32's range, little precision |

The limits come from `torch.finfo`; `course_lib.float_formats.float_format` adds the bit layout and the smallest subnormal, which `finfo` does not report.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.float_formats import FORMATS, bits_of, describe, float_format, from_bits, neighbors, round_to, ulp

for dt in FORMATS:
    fi = torch.finfo(dt)
    print(f"torch.finfo({dt}): bits={fi.bits} max={fi.max:.6g} smallest_normal={fi.smallest_normal:.6g} eps={fi.eps:.6g}")
print()
for dt in FORMATS:
    print("\n".join(float_format(dt).lines()))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Decoding bits by hand, with the formula above, gives the same value PyTorch stores. We read the raw 16 bits of an fp16 number by viewing its memory as `int16`:
"""


# %% slideshow={"slide_type": "fragment"}
def decode_fp16(raw: int) -> float:
    """Value of a 16-bit fp16 pattern, written from the formula."""
    sign = -1.0 if raw >> 15 else 1.0
    exponent = (raw >> 10) & 0b11111
    mantissa = raw & 0x3FF
    if exponent == 0b11111:
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 0:                                   # subnormal: no implicit 1
        return sign * 2.0 ** (1 - 15) * mantissa / 2**10
    return sign * 2.0 ** (exponent - 15) * (1 + mantissa / 2**10)


for v in (1.0, -2.5, 0.1, 65504.0, 6.1e-5, 3e-7):
    t = torch.tensor(v, dtype=torch.float16)
    raw = int(t.view(torch.int16).item()) & 0xFFFF
    by_hand = decode_fp16(raw)
    assert by_hand == t.item() == from_bits(bits_of(v, torch.float16), torch.float16)  # hand == torch == course_lib
    print(f"{v:>10g} -> bits {bits_of(v, torch.float16)} -> {by_hand:.10g}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### A widespread mistake about fp16's range, and the true limits by experiment

A popular blog post on training tricks (one of this course's sources) says fp16's range is "[-65504, -66504]" and that numbers below "2^-24" become 0. The first is a typo (both ends negative; the upper end is **+65504**); the second is imprecise: 2^-24 ≈ 5.96e-8 is the **smallest subnormal**, the smallest *normal* number is 2^-14 ≈ 6.10e-5, and the values that round to zero are those **at or below** *half* the smallest subnormal, 2^-25 (2^-25 itself lies exactly halfway between 0 and 2^-24, and a tie rounds to the neighbour whose last bit is even, which is 0). Between 2^-24 and 2^-14 numbers survive but with fewer and fewer significant bits.
"""

# %% slideshow={"slide_type": "fragment"}
h = float_format(torch.float16)
fp16 = lambda v: torch.tensor(v, dtype=torch.float32).to(torch.float16).item()  # noqa: E731

assert (fp16(65504.0), fp16(-65504.0)) == (65504.0, -65504.0)   # the range is [-65504, 65504]
assert fp16(65519.0) == 65504.0 and fp16(65520.0) == math.inf   # 65520 and above round to inf
assert fp16(2.0**-14) == h.smallest_normal == 2.0**-14          # smallest normal
assert fp16(2.0**-24) == h.smallest_subnormal                   # smallest subnormal, 5.96e-8
assert fp16(2.0**-25) == 0.0                                    # exactly half of it: a tie, rounds to even = 0
assert fp16(2.0**-25 * 1.01) == 2.0**-24                        # just above half: rounds up, survives
assert fp16(1e-8) == 0.0                                        # below 2^-25: gone
print(f"fp16 range [{-h.max:g}, {h.max:g}]; 65520 -> {fp16(65520.0)}")
print(f"smallest normal {h.smallest_normal:.4g}, smallest subnormal {h.smallest_subnormal:.4g}, "
      f"zero at or below {h.smallest_subnormal / 2:.4g}")
print(f"relative precision near 3e-7 (subnormal): {abs(fp16(3e-7) - 3e-7) / 3e-7:.1%} error, "
      f"near 1.0 (normal): {abs(fp16(1.0001) - 1.0001) / 1.0001:.3%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Explorer: type a number, see its bits in each format

The widget below shows a number in fp32, fp16 and bf16: its bits, the value actually stored, the nearest representable neighbours on each side, and the relative error. Try `65504`, `65520`, `1e-8`, `3e-8`, `1.0001`, `70000`. The static version after it shows the same text for a few chosen values.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets
from IPython.display import display

number = widgets.Text(value="0.1", description="number:", continuous_update=False)
shown = widgets.Output()


def show_number(change=None):
    try:
        text = describe(float(number.value))
    except ValueError:
        text = "type a number, e.g. 1e-8, 65520 or 1.0001"
    shown.outputs = ()                # set the widget's content directly (no printing to the cell)
    shown.append_stdout(text + "\n")


number.observe(show_number, names="value")
show_number()
display(widgets.VBox([number, shown]))

# %% slideshow={"slide_type": "fragment"}
for v in (0.1, 65520.0, 3e-8, 1.0001):   # static fallback: the same text for a few values
    print(describe(v))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Three ways fp16 breaks training, and a fourth for sums

**Overflow.** Anything above 65504 becomes inf, and inf minus inf is NaN. Activations, logits before a softmax, and the sum of squares inside a norm get there easily:
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([300.0, 12.0], dtype=torch.float16)
print("300 * 300 =", (a[0] * a[0]).item(), "| exp(12) =", a[1].exp().item(), "| fp32 exp(12) =", round(math.exp(12)))
print("x - x for x = inf:", (a[0] * a[0] - a[0] * a[0]).item())
assert math.isinf((a[0] * a[0]).item()) and math.isinf(a[1].exp().item())
norm_input = torch.full((100,), 30.0, dtype=torch.float16)
print("norm of 100 values of 30 (true 300): fp16 pow-sum ->", norm_input.pow(2).sum().item(),
      "| torch.linalg.vector_norm ->", torch.linalg.vector_norm(norm_input).item())

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The explicit sum of squares is done elementwise in fp16 (900 each — fine) and then *summed*; here the sum (90000) is beyond 65504. `vector_norm` on fp16 on this CPU gets it right because the kernel accumulates internally in fp32 — a theme we return to.

**Underflow.** Gradients are often tiny. A gradient of 1e-8 (think: a small activation gradient late in training) does not exist in fp16:
"""

# %% slideshow={"slide_type": "fragment"}
grads = torch.tensor([1e-3, 1e-5, 1e-7, 3e-8, 1e-8, 1e-10])
print("fp32:", [f"{g:.1e}" for g in grads.tolist()])
print("fp16:", [f"{g:.1e}" for g in grads.half().float().tolist()])
assert grads.half()[-2:].eq(0).all()                      # 1e-8 and 1e-10 flush to zero
assert grads.half()[2].item() != grads[2].item()          # 1e-7 survives, but as a coarse subnormal

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Rounding: lost updates.** Near 1.0, consecutive fp16 numbers are 2^-10 ≈ 0.00098 apart. Adding anything smaller than half of that gap rounds back to the same number, so a weight update `w - lr * grad` of size 1e-4 simply does not happen:
"""

# %% slideshow={"slide_type": "fragment"}
w = torch.tensor(1.0, dtype=torch.float16)
print("1 + 1e-4 in fp16 =", (w + 1e-4).item(), "| in fp32 =", f"{(w.float() + 1e-4).item():.6f}")
print("gap above 1.0 in fp16:", ulp(1.0, torch.float16), "| gap above 1024:", ulp(1024.0, torch.float16))
assert (w + 1e-4).item() == 1.0 and (w.float() + 1e-4).item() != 1.0
assert (torch.tensor(1024.0, dtype=torch.float16) + 0.4).item() == 1024.0   # a big weight loses even 0.4

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Accumulation.** Adding many small numbers one by one into an fp16 accumulator stalls: once the running sum is large, each new term is below half the gap and is lost. Summing 0.1 four thousand times (true answer 409.6):
"""

# %% slideshow={"slide_type": "fragment"}
values = torch.full((4096,), 0.1, dtype=torch.float16)
acc16 = torch.zeros((), dtype=torch.float16)
acc32 = torch.zeros((), dtype=torch.float32)
for v in values:                 # a naive loop: the accumulator has the values' precision
    acc16 = acc16 + v
    acc32 = acc32 + v.float()    # same fp16 inputs, fp32 accumulator
print(f"fp16 accumulator: {acc16.item():.1f} | fp32 accumulator: {acc32.item():.1f} | torch.sum(fp16): {values.sum().item():.1f}")
print(f"the fp16 sum stalls at 256 because the gap there is {ulp(256.0, torch.float16)}, and 0.1 < half of it")
assert acc16.item() == 256.0 and abs(acc32.item() - 409.5) < 0.1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
This is why the *Mixed Precision Training* paper multiplies in fp16 but accumulates dot products in fp32, and why tensor cores do exactly that. `torch.sum` on fp16 gives the right answer above because PyTorch's CPU kernels also accumulate in fp32 (the "acc type" of half is float) and round once at the end. The result is still fp16, so a sum larger than 65504 would still overflow.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. How much of a real gradient vanishes in fp16?

The paper's Figure 3 is a histogram of activation gradients of a real network, on a log2 scale: most of them lie below fp16's range. We reproduce the idea: train a small MLP on the real handwritten digits (scikit-learn's, shipped with it) in fp32, then record the gradient of every layer's output in one backward pass.
"""

# %% slideshow={"slide_type": "fragment"}
train, test = digits()
X, Y = train.flat(), train.y
Xt, Yt = test.flat(), test.y
print(f"digits: {len(Y)} training and {len(Yt)} test images of 8x8 = 64 pixels, 10 classes")


def mlp(width=128, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


net = mlp()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
for epoch in range(6):
    order = torch.randperm(len(Y))
    for i in range(0, len(Y), 64):
        idx = order[i:i + 64]
        opt.zero_grad()
        F.cross_entropy(net(X[idx]), Y[idx]).backward()
        opt.step()
accuracy = (net(Xt).argmax(1) == Yt).float().mean().item()
print(f"after 6 epochs: test accuracy {accuracy:.2f}")
assert accuracy > 0.9

# %% slideshow={"slide_type": "fragment"}
outputs = []
hooks = [m.register_forward_hook(lambda mod, inp, out: (out.retain_grad(), outputs.append(out)) and None) for m in net]
net.zero_grad()
loss = F.cross_entropy(net(X[:512]), Y[:512])
loss.backward()
for hk in hooks:
    hk.remove()
act_grads = torch.cat([o.grad.flatten() for o in outputs]).abs()
act_grads = act_grads[act_grads > 0]           # ReLU zeros are exact zeros in any format
log2g = act_grads.log2()
print(f"{len(act_grads) / 1000:.0f} thousand nonzero activation gradients, loss {loss.item():.3f}")
print(f"log2 range: [{log2g.min().item():.0f}, {log2g.max().item():.0f}]")


def fp16_fate(g):
    """Fractions that become zero, stay subnormal, or overflow when g is cast to fp16."""
    h16 = g.half()
    return (h16 == 0).float().mean().item(), (h16.float().abs() < 2**-14).float().mean().item() - (h16 == 0).float().mean().item(), h16.isinf().float().mean().item()


zero0, sub0, inf0 = fp16_fate(act_grads)
print(f"cast to fp16 without scaling: {zero0:.0%} become 0, {sub0:.0%} subnormal, {inf0:.0%} inf")
assert zero0 > 0.2

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.hist(log2g.numpy(), bins=60, color="tab:blue")
ax.axvspan(-24, math.log2(65504), color="tab:green", alpha=0.12, label="fp16 representable (subnormal from 2^-24)")
ax.axvspan(-14, math.log2(65504), color="tab:green", alpha=0.18, label="fp16 normal range (2^-14 .. 65504)")
ax.axvline(-24, color="tab:red", ls="--", lw=1)
ax.text(-24.5, ax.get_ylim()[1] * 0.9, f"{zero0:.0%} become 0 →", ha="right", color="tab:red")
ax.set_xlim(-70, 20)
ax.set_xlabel("log2 |activation gradient| (dimensionless)")
ax.set_ylabel("count of gradient values")
ax.set_title("Activation gradients of a trained MLP on digits vs fp16's range")
ax.legend(loc="upper right", fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Multiplying the loss by $2^k$ multiplies every gradient by $2^k$ (the chain rule is linear), which slides the histogram to the right. The table shows the fate of the same gradients for several shifts: the lost fraction falls until the largest gradients start to overflow. (The gradients come from a network trained on your machine, and float32 training on another CPU ends a few roundings away, so the last digit of each percentage may differ from the one committed here: they are printed after `~`.)
"""

# %% slideshow={"slide_type": "fragment"}
print(" k  | scale    | -> 0    | subnormal | -> inf")
fates = {k: fp16_fate(act_grads * 2.0**k) for k in range(0, 33, 4)}
for k, (z, s, i) in fates.items():  # measured on gradients of a trained net: '~', the last digit depends on the CPU
    z, s, i = ("~" + format(v, ".1%") for v in (z, s, i))
    print(f"{k:>3} | 2^{k:<6} | {z:>6} | {s:>9} | {i:>6}")
zeros = [z for z, _, _ in fates.values()]
assert all(a >= b for a, b in zip(zeros, zeros[1:])) and zeros[0] > 0.2 and zeros[-1] < 0.001  # scaling rescues them
assert fates[0][2] == 0 and fates[32][2] > 0.01  # ... until the largest ones overflow
print("-> 0 falls with every factor of 16; -> inf is 0 until the scale is too large")
largest = act_grads.max().item()
print(f"largest gradient {largest:.3g}: a scale up to 2^{math.floor(math.log2(65504 / largest))} keeps it finite")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Loss scaling

### Static loss scaling, by hand

Here is the whole recipe on a real fp16 backward pass: multiply the loss by a constant S before `backward()`, let the gradients exist in fp16, then divide them by S **in fp32** before the update. We run the trained MLP as an fp16 copy and compare its weight gradients to the fp32 ones.
"""

# %% slideshow={"slide_type": "fragment"}
net16 = mlp().half()
net16.load_state_dict({k: v.half() for k, v in net.state_dict().items()})
xb, yb = X[:512], Y[:512]
net.zero_grad()
F.cross_entropy(net(xb), yb).backward()
reference = [p.grad.clone() for p in net.parameters()]


def fp16_grads(scale):
    net16.zero_grad()
    loss16 = F.cross_entropy(net16(xb.half()).float(), yb)   # loss itself in fp32
    (loss16 * scale).backward()
    return [p.grad.float() / scale for p in net16.parameters()]   # unscale in fp32


for scale in (1.0, 2.0**10, 2.0**16):
    got = fp16_grads(scale)
    lost = sum(((g == 0) & (r != 0)).sum().item() for g, r in zip(got, reference)) / sum((r != 0).sum().item() for r in reference)
    err = max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, reference))
    print(f"scale {scale:>8g}: {lost:5.1%} of nonzero weight gradients lost, max error {err:.0e} (relative to the largest)")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
With the scale, almost nothing underflows. (The error that remains, the same for every scale, is the rounding of the fp16 forward and backward passes themselves.) The catch: the right S depends on the model and changes during training (early gradients are large, late ones small), and a scale too big turns the largest gradients into inf.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Why weight gradients survive better than activation gradients

Section 3 lost 39 % of the activation gradients to zero; at scale 1, the cell above loses only about 1 % of the weight gradients. They are different quantities. An activation gradient is $\partial L/\partial h$ for **one sample** at one position, and since the loss is a mean over the 512 samples of the batch, each one carries a factor 1/512. A weight gradient **adds up the batch**: for a `Linear` layer, $\partial L/\partial W = \sum_n \delta_n\, a_n^\top$, the activation gradients $\delta_n$ of its output times its inputs $a_n$, summed over the 512 samples. The cell checks that formula on the first layer (whose input is the batch itself), then compares the two distributions (statistics of a trained network's gradients, so after `~`):
"""

# %% slideshow={"slide_type": "fragment"}
delta1 = outputs[0].grad                            # section 3's dL/d(first Linear's output), same 512 samples
by_formula = delta1.T @ X[:512]                     # sum over n of delta_n x_n^T
print("dL/dW1 = sum over the batch of delta_n x_n^T: allclose", torch.allclose(by_formula, reference[0], rtol=1e-4, atol=1e-10))
assert torch.allclose(by_formula, reference[0], rtol=1e-4, atol=1e-10)

w_grads = torch.cat([r.flatten() for r in reference]).abs()
w_grads = w_grads[w_grads > 0]
stats = {}
for name, g in (("activation gradients", act_grads), ("weight gradients", w_grads)):
    stats[name] = (g.log2().median().item(), (g.half() == 0).float().mean().item())
    print(f"{name:<21} median log2|g| ~{stats[name][0]:.1f}, become 0 in fp16 ~{stats[name][1]:.1%}")
gap = stats["weight gradients"][0] - stats["activation gradients"][0]
print(f"weight gradients are typically 2^~{gap:.0f} times larger")
assert gap > 8 and stats["weight gradients"][1] < 0.05 < 0.2 < stats["activation gradients"][1]

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 3.2))
bins = torch.linspace(-60, 0, 61).numpy()
ax.hist(act_grads.log2().numpy(), bins=bins, density=True, alpha=0.6, label="activation gradients (per sample)")
ax.hist(w_grads.log2().numpy(), bins=bins, density=True, alpha=0.6, label="weight gradients (summed over the batch)")
ax.axvline(-25, color="tab:red", ls="--", lw=1, label="fp16: at or below 2^-25 becomes 0")
ax.set_xlabel("log2 |gradient| (dimensionless)")
ax.set_ylabel("fraction of values per bin")
ax.set_title("Same network, same batch: weight gradients sit far above fp16's underflow")
ax.legend(fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So how bad is fp16 without scaling for training? For this shallow network at this point of training, hardly at all: at scale 1 the weight gradients, which are what the optimizer uses, lose only about 1 % of their entries, and their error is the same as with a scale. The danger is how little margin that is. The activation gradients that *do* underflow are the ones that carry the signal to earlier layers; in a deeper network, gradients shrink layer after layer, late in training the loss and its gradients are small, and a loss averaged over many more elements (tokens, pixels) divides every gradient further. Emulate that by making the loss $2^k$ times smaller, with no scale to compensate:
"""

# %% slideshow={"slide_type": "fragment"}
print(" loss x  | weight gradients lost | error of their norm (worst layer)")
shrunk = {}
for k in (0, 4, 8, 12):
    got = fp16_grads(2.0**-k)                           # the loss times 2^-k, unscaled back in fp32
    lost = sum(((g == 0) & (r != 0)).sum().item() for g, r in zip(got, reference)) / sum((r != 0).sum().item() for r in reference)
    err = max(((g - r).norm() / r.norm()).item() for g, r in zip(got, reference))
    shrunk[k] = (lost, err)
    print(f" 2^-{k:<4} |               ~{lost:5.1%} | ~{err:.1e}")
assert shrunk[12][0] > 10 * shrunk[0][0] and shrunk[12][1] > 10 * shrunk[0][1]   # the loss grows with the shrink

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Gradients 2^12 times smaller lose about a third of the weight gradients, and the norm of what is left is off by about a fifth (the last column): that is training on a different, biased gradient. Micikevicius et al. (2018) report both sides: their ImageNet classifiers trained in mixed precision without loss scaling, while their SSD object detector did not train without it and matched fp32 with a scale of only 8. Since a scale costs one multiplication, fp16 training always uses one (`GradScaler`); bf16 (section 8) has fp32's range and needs none.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Dynamic loss scaling, from scratch

The dynamic rule picks S on the fly: start large ($2^{16}$); after every backward, check the gradients for inf/NaN. If there is one, **skip** the optimizer step and halve S. If `growth_interval` steps in a row were clean, double S. So S hovers just below the overflow limit. Here it is in a few lines:
"""


# %% slideshow={"slide_type": "fragment"}
class HandScaler:
    def __init__(self, scale=2.0**16, growth_interval=2000):
        self.scale, self.clean_steps, self.growth_interval = scale, 0, growth_interval

    def step(self, optimizer):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        found_inf = any(not torch.isfinite(p.grad).all() for p in params)
        if not found_inf:
            for p in params:
                p.grad.mul_(1.0 / self.scale)      # unscale, then the usual step
            optimizer.step()
        if found_inf:                              # update the scale
            self.scale, self.clean_steps = self.scale * 0.5, 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale, self.clean_steps = self.scale * 2.0, 0
        return not found_inf


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Now the proof that it is the same algorithm as PyTorch's. Three copies of a model train on the same batches with three scalers: ours, `course_lib.loss_scaling.DynamicLossScaler` (the course's second, deliberate copy of the same algorithm, kept equal to ours by this test), and `torch.amp.GradScaler("cpu")`. At a few steps we inject an overflow (an inf in one gradient, as fp16 would produce). A short `growth_interval=3` makes growth visible. We record, per step, the scale used and whether the weights moved.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.loss_scaling import DynamicLossScaler

OVERFLOW_AT = {2, 3, 9, 15}
STEPS = 20


def run_with(scaler):
    model = mlp(width=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trace = []
    for step in range(STEPS):
        idx = torch.arange(step * 32, step * 32 + 32)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[idx]), Y[idx])
        scale_used = scaler.scale if isinstance(scaler, HandScaler) else scaler.get_scale()
        if isinstance(scaler, HandScaler):
            (loss * scaler.scale).backward()
        else:
            scaler.scale(loss).backward()
        if step in OVERFLOW_AT:
            model[0].weight.grad[0, 0] = math.inf
        before = model[0].weight.detach().clone()
        if isinstance(scaler, HandScaler):
            scaler.step(optimizer)
        else:
            scaler.step(optimizer)
            scaler.update()
        trace.append((scale_used, not torch.equal(before, model[0].weight)))
    return trace, [p.detach().clone() for p in model.parameters()]


hand, p_hand = run_with(HandScaler(2.0**10, growth_interval=3))
ours, p_ours = run_with(DynamicLossScaler(2.0**10, growth_interval=3))
torchs, p_torch = run_with(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
assert hand == ours == torchs, "the three scalers disagree"
assert all(torch.equal(a, b) and torch.equal(b, c) for a, b, c in zip(p_hand, p_ours, p_torch))
print("step | scale | stepped?")
for step, (s, moved) in enumerate(torchs):
    print(f"{step:>4} | {s:>5g} | {'yes' if moved else 'SKIPPED (inf)'}")
print("identical skip decisions, scale trajectories and final weights for all three scalers")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(7, 3))
ax.step(range(STEPS), [s for s, _ in torchs], where="post", label="loss scale (all three scalers)")
skipped = [i for i, (_, moved) in enumerate(torchs) if not moved]
ax.scatter(skipped, [torchs[i][0] for i in skipped], color="tab:red", zorder=3, label="step skipped (inf)")
ax.set_yscale("log", base=2)
ax.set_xlabel("training step")
ax.set_ylabel("loss scale (log2 axis)")
ax.set_title("Dynamic loss scaling: halve on overflow, double after 3 clean steps")
ax.legend(fontsize=8)
plt.show()
print("skipped steps:", skipped, "| final scale:", torchs[-1][0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### What older tutorials say about `GradScaler`, checked against 2.13

The blog post, like many tutorials, uses `from torch.cuda.amp import autocast, GradScaler`. In PyTorch 2.13 both still exist but are **deprecated**: constructing them emits a `FutureWarning` pointing at the device-generic API `torch.amp.autocast("cuda")` / `torch.amp.GradScaler("cuda")`. (On this CPU-only machine they also warn that CUDA is unavailable and disable themselves.) The defaults it lists (init_scale 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000) are right; we read them from the object rather than trust the text.
"""

# %% slideshow={"slide_type": "fragment"}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast():
        pass
future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
for msg in future:
    print("FutureWarning:", msg)
assert len(future) == 2 and all("deprecated" in m for m in future)

scaler = torch.amp.GradScaler("cpu")
defaults = scaler.state_dict()
print("torch.amp.GradScaler('cpu') defaults:", defaults)
assert defaults == {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 0}
assert DynamicLossScaler().state_dict() == defaults

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`GradScaler` checks `growth_factor` with an `assert`, but it accepts a negative initial scale without complaint; the course's scaler rejects every nonsensical setting with a clear error:
"""

# %% slideshow={"slide_type": "fragment"}
with expect_error(ValueError, match="positive"):
    DynamicLossScaler(init_scale=-1.0)
with expect_error(ValueError, match="growth_factor"):
    DynamicLossScaler(growth_factor=1.0)
with expect_error(ValueError, match="backoff_factor"):
    DynamicLossScaler(backoff_factor=1.5)
print("GradScaler(init_scale=-1) is accepted:", torch.amp.GradScaler("cpu", init_scale=-1.0).get_scale())

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### `GradScaler` in a real training loop: checkpoints and LR schedulers

**The scale is training state.** After a few thousand steps the scaler has found its level (and counts clean steps towards the next growth). A run resumed with a fresh `GradScaler` starts again at 65536 and spends skipped steps finding it, so save `scaler.state_dict()` in the checkpoint with the model's and the optimizer's, and load it on resume:
"""

# %% slideshow={"slide_type": "fragment"}
import io

model = mlp(width=32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu", growth_interval=3)
for step in range(8):                                   # overflows at steps 0-5: the scale backs off six times
    optimizer.zero_grad()
    scaler.scale(F.cross_entropy(model(X[:32]), Y[:32])).backward()
    if step < 6:
        model[0].weight.grad[0, 0] = math.inf
    scaler.step(optimizer)
    scaler.update()
buffer = io.BytesIO()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, buffer)

buffer.seek(0)
checkpoint = torch.load(buffer)
resumed = torch.amp.GradScaler("cpu")
resumed.load_state_dict(checkpoint["scaler"])
print(f"scale before saving {scaler.get_scale():g} | after loading {resumed.get_scale():g}"
      f" | a fresh GradScaler: {torch.amp.GradScaler('cpu').get_scale():g}")
assert resumed.state_dict() == scaler.state_dict() and resumed.get_scale() == 65536 / 2**6

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
**A skipped step is still a step for the LR scheduler.** `scaler.step(optimizer)` skips `optimizer.step()` when it found an inf, but a loop that calls `scheduler.step()` after every batch advances the schedule anyway (PyTorch notices the first time and warns that `lr_scheduler.step()` came before `optimizer.step()`). Over a long run that is a handful of steps early on, usually harmless; for a short schedule or a warm-up it shifts the learning rate. The skip is visible in the scale: `update()` lowers it exactly when the step was skipped, so step the scheduler only then. Two overflows in six steps, a scheduler that halves the learning rate at each of its steps:
"""


# %% slideshow={"slide_type": "fragment"}
def scheduler_run(only_after_real_steps):
    model = mlp(width=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    real_steps = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            optimizer.zero_grad()
            scaler.scale(F.cross_entropy(model(X[:32]), Y[:32])).backward()
            if step in (0, 3):
                model[0].weight.grad[0, 0] = math.inf       # an overflow, as fp16 would produce
            scale_before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped = scaler.get_scale() < scale_before     # the scale drops exactly when the step was skipped
            real_steps += not skipped
            if not (only_after_real_steps and skipped):
                scheduler.step()
    warned = any("lr_scheduler.step()" in str(w.message) for w in caught)
    return real_steps, scheduler.last_epoch, optimizer.param_groups[0]["lr"], warned


for only in (False, True):
    real, sched, lr, warned = scheduler_run(only)
    print(f"scheduler.step() {'only after real steps' if only else 'after every batch   '}: optimizer steps {real},"
          f" scheduler steps {sched}, lr {lr:g}, warning: {warned}")
assert scheduler_run(False)[:2] == (4, 6) and scheduler_run(True)[:2] == (4, 4)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### `unscale_` before gradient clipping

`scaler.step(optimizer)` unscales the gradients itself. But anything that *reads* gradients between `backward()` and `step()` — gradient clipping, logging the gradient norm — must see the true gradients, so it must come after an explicit `scaler.unscale_(optimizer)`. Clipping the scaled gradients clips against a norm S times too large:
"""


# %% slideshow={"slide_type": "fragment"}
def clipped_norm(unscale_first):
    model = mlp(width=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sc = torch.amp.GradScaler("cpu")                      # scale 65536
    sc.scale(F.cross_entropy(model(X[:64]), Y[:64])).backward()
    if unscale_first:
        sc.unscale_(optimizer)
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0).item()
    if not unscale_first:
        sc.unscale_(optimizer)
    final = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    return seen, final


seen_wrong, final_wrong = clipped_norm(unscale_first=False)
seen_right, final_right = clipped_norm(unscale_first=True)
print(f"clip, then unscale: clip saw norm {seen_wrong:.1f}, the step uses norm {final_wrong:.2e}  (wrong: shrunk 65536x)")
print(f"unscale_, then clip: clip saw norm {seen_right:.3f}, the step uses norm {final_right:.3f}  (right)")
assert math.isclose(seen_wrong, seen_right * 65536, rel_tol=1e-4) and final_wrong < 1e-4

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`GradScaler` also refuses to unscale fp16 gradients — so the parameters the optimizer updates must be fp32. That is the next section:
"""

# %% slideshow={"slide_type": "fragment"}
half_model = nn.Linear(4, 2).half()
half_opt = torch.optim.SGD(half_model.parameters(), lr=0.1)
sc = torch.amp.GradScaler("cpu")
sc.scale(half_model(torch.ones(1, 4, dtype=torch.float16)).float().sum()).backward()
with expect_error(ValueError, match="FP16 gradients"):
    sc.unscale_(half_opt)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 5. fp32 master weights

The update is $w \leftarrow w - \eta \, g$ (a **minus**: we step *against* the gradient — the blog post writes "+", which would climb the loss). `torch.optim.SGD` does exactly that:
"""

# %% slideshow={"slide_type": "fragment"}
p = nn.Parameter(torch.tensor([1.0, 2.0]))
p.grad = torch.tensor([0.5, -1.0])
torch.optim.SGD([p], lr=0.1).step()
assert torch.allclose(p.detach(), torch.tensor([1.0 - 0.1 * 0.5, 2.0 + 0.1 * 1.0]))
print("after one SGD step:", [round(v, 4) for v in p.tolist()], "= w - lr * grad")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
If *w* lives in fp16, every $\eta g$ smaller than half the gap around *w* is lost (section 2). The paper's fix: keep an **fp32 master copy** of the weights. Each step: copy the master to an fp16 model, run forward and backward in fp16 (with loss scaling), copy the gradients to fp32, unscale, and update the master in fp32 — so the optimizer, and its state, live in fp32.

We train the same MLP on the same batches three ways (fp32, pure fp16, fp16 compute + fp32 master), with two optimizers: plain SGD with a small learning rate (where updates are smallest), and Adam with its default settings.
"""

# %% slideshow={"slide_type": "fragment"}
import copy

from tqdm.auto import tqdm

TRAIN_STEPS = 300
gen = torch.Generator().manual_seed(1)
batches = [torch.randint(0, len(Y), (64,), generator=gen) for _ in range(TRAIN_STEPS)]
OPTIMIZERS = {"SGD lr=0.001": lambda ps: torch.optim.SGD(ps, lr=0.001), "Adam (defaults)": lambda ps: torch.optim.Adam(ps)}


def train_fp32(make_opt):
    model = mlp(width=64)
    optimizer = make_opt(model.parameters())
    losses = []
    for idx in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[idx]), Y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, 0.0


def train_pure_fp16(make_opt):
    model = mlp(width=64).half()                      # weights, activations, gradients, update: all fp16
    optimizer = make_opt(model.parameters())
    losses, lost, total = [], 0, 0
    for idx in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[idx].half()), Y[idx])
        loss.backward()
        before = [q.detach().clone() for q in model.parameters()]
        optimizer.step()
        lost += sum(((q.grad != 0) & (q == b)).sum().item() for q, b in zip(model.parameters(), before))
        total += sum((q.grad != 0).sum().item() for q in model.parameters())
        losses.append(loss.item())
    return losses, lost / max(total, 1)


def train_master_fp32(make_opt):
    master = mlp(width=64)                            # fp32 master weights, updated by the optimizer
    model = copy.deepcopy(master).half()              # fp16 working copy for forward/backward
    optimizer = make_opt(master.parameters())
    scaler = DynamicLossScaler()
    losses = []
    for idx in batches:
        with torch.no_grad():
            for w16, w32 in zip(model.parameters(), master.parameters()):
                w16.copy_(w32)                        # master -> fp16 copy (rounds)
        model.zero_grad()
        loss = F.cross_entropy(model(X[idx].half()).float(), Y[idx])
        scaler.scale(loss).backward()
        for w16, w32 in zip(model.parameters(), master.parameters()):
            w32.grad = w16.grad.float()               # fp16 grads -> fp32
        scaler.step(optimizer)                        # unscale in fp32, skip on inf, update the master
        scaler.update()
        losses.append(loss.item())
    return losses, 0.0


WAYS = {"fp32": train_fp32, "pure fp16": train_pure_fp16, "fp16 + fp32 master": train_master_fp32}
runs = {}
for opt_name in tqdm(OPTIMIZERS, desc="two optimizers x three precisions"):
    for way, train_fn in WAYS.items():
        runs[opt_name, way] = train_fn(OPTIMIZERS[opt_name])


# %% slideshow={"slide_type": "fragment"}
def smooth(xs, k=40):
    return [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)]


first_nan = next(i for i, v in enumerate(runs["Adam (defaults)", "pure fp16"][0]) if math.isnan(v))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for ax, opt_name in zip(axes, OPTIMIZERS):
    for way in WAYS:
        ax.plot(smooth(runs[opt_name, way][0]), label=way, ls="--" if "master" in way else "-")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats, 40-step mean)")
    ax.set_title(opt_name)
    ax.legend(fontsize=8)
axes[1].text(0.35, 0.5, f"pure fp16: loss is NaN from step {first_nan}\n(nothing to draw)", transform=axes[1].transAxes, color="tab:orange")
fig.suptitle("Same model, same batches: pure fp16 vs fp16 + fp32 master weights vs fp32", y=1.0)
fig.tight_layout()
plt.show()
final = {key: sum(losses[-50:]) / 50 for key, (losses, _) in runs.items()}
for (opt_name, way), value in final.items():
    print(f"{opt_name:<16} {way:<20} mean loss over the last 50 steps: {value:.3f}")
sgd_lost = runs["SGD lr=0.001", "pure fp16"][1]
print(f"SGD, pure fp16: {sgd_lost:.0%} of weight updates with a nonzero gradient changed nothing")
print(f"Adam, pure fp16: the loss is NaN from step {first_nan} on")
assert final["SGD lr=0.001", "pure fp16"] > final["SGD lr=0.001", "fp32"] + 0.01 and sgd_lost > 0.5
for opt_name in OPTIMIZERS:
    assert abs(final[opt_name, "fp16 + fp32 master"] - final[opt_name, "fp32"]) < 0.01

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
What the curves say. **With fp32 master weights, fp16 compute follows fp32** almost exactly (its forward and backward are fp16, so it is not bit-identical, but updates accumulate in fp32). **Pure fp16 with SGD lags**: most of its small updates round away, so it learns as if with a smaller, uneven learning rate. **Pure fp16 with Adam fails outright**: Adam divides by $\sqrt{v} + \epsilon$, where $v$ averages squared gradients — which underflow in fp16 — and the default $\epsilon = 10^{-8}$ is itself zero in fp16, so $0/0$ gives NaN at once:
"""

# %% slideshow={"slide_type": "fragment"}
print("Adam's eps=1e-8 in fp16:", torch.tensor(1e-8, dtype=torch.float16).item(),
      "| a gradient of 1e-4, squared, in fp16:", (torch.tensor(1e-4, dtype=torch.float16) ** 2).item())
assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The cost of the fix: the master copy adds 4 bytes per parameter on top of the 2-byte fp16 copy, and the optimizer state stays fp32. Memory savings of mixed precision come from the *activations*, not the weights (section 9).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. `torch.autocast`: which operations run in low precision?

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
## 7. Apex O0–O3, and their native equivalents

The blog post introduces NVIDIA Apex's `amp.initialize(model, optimizer, opt_level="O1")`. **Apex's `amp` is legacy**: its author moved automatic mixed precision into PyTorch core in 2020 (PyTorch 1.6) and recommends the native API instead (NVIDIA/apex issue #818); `apex.amp` is deprecated, needs a CUDA build of an extension, and is not installed here. Each opt level is a recipe we can build natively:

| Apex level | what it did | native PyTorch |
|---|---|---|
| O0 | pure fp32 (baseline) | a normal fp32 loop |
| O1 | per-op casting by allow/deny lists + dynamic loss scaling | `torch.autocast` + `torch.amp.GradScaler` (the recommended path) |
| O2 | model cast to fp16 except BatchNorm, fp32 master weights, dynamic loss scaling | no one-liner: `model.half()`, BatchNorm back to fp32, a master copy (section 5) |
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
With Adam, O0, O1 and O2 train to the same accuracy, while O3 — pure fp16, no master weights, no loss scaling — turns to NaN for the reason of section 5 (Adam's state in fp16). The blog post calls O3 "very unstable, but a speed baseline": here, with Adam, it is simply broken. O1 is what `torch.autocast` + `GradScaler` give you, and it is the recommended default; O2's fp16 model with fp32 master weights is what some large-model frameworks still do by hand (or with bf16). The blog's description of O2 as "no allow/deny lists, almost everything fp16 except BatchNorm" is right: there is no per-op casting, so a softmax in the model runs in fp16 too.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. bf16 versus fp16: range versus precision

bf16 keeps fp32's 8 exponent bits and keeps only 7 mantissa bits. It covers the same range as fp32 — nothing in section 3's histogram underflows — but its gap at 1.0 is 2^-7 = 0.0078, eight times coarser than fp16's:
"""

# %% slideshow={"slide_type": "fragment"}
print(f"{'value':>10} | {'fp16':>12} | {'bf16':>12}")
for v in (70000.0, 1e-8, 1e-30, 1.001, 1.004, 0.1):
    print(f"{v:>10g} | {round_to(v, torch.float16):>12.6g} | {round_to(v, torch.bfloat16):>12.6g}")
lost16 = (act_grads.half() == 0).float().mean().item()
lost_bf = (act_grads.bfloat16() == 0).float().mean().item()
print(f"activation gradients of section 3 lost to zero: fp16 {lost16:.0%}, bf16 {lost_bf:.0%}")
assert lost_bf == 0.0 and round_to(1.001, torch.bfloat16) == 1.0 and round_to(1.001, torch.float16) != 1.0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Because bf16 has fp32's range, gradients do not underflow and **bf16 training usually needs no loss scaling** (no `GradScaler`). Its weakness is precision, which is why weights and optimizer state stay fp32 (autocast only casts *copies* for the matmuls) and why accumulation happens in fp32. Same MLP, same batches and Adam as in section 5, with bf16 autocast and no scaler:
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
## 9. Memory: what autocast saves for backward

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

That limit is not universal. **On CUDA**, autocast runs `softmax`, `log_softmax`, `layer_norm` and the other ops of its fp32 list (section 6) in fp32, so they save fp32 tensors for backward, and the next matmul saves its own low-precision copy of their output. Take attention's score matrix, often a transformer's largest activation: the softmax saves its output, and the matmul with the values saves it again as its input. This CPU cannot run CUDA autocast, but it can count the bytes each rule saves per score element, applying CUDA's rule by hand (softmax in fp32, the matmul in bf16):
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
## 10. Speed: it depends on the hardware

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

Read your own numbers: on a CPU with AMX or AVX512-BF16, bf16 matmuls can beat fp32 at larger sizes; on an AVX2-only CPU they are much slower, and autocast makes training *slower*, not faster (it also adds the cost of casting). The memory saving of section 9 holds on every CPU (on a GPU, mind section 9's note on CUDA's fp32 ops). `benchmarks/mixed_precision.py` measures both for two batch sizes. On a GPU, tensor cores make the difference large — if the matrix dimensions are multiples of 8 (fp16/bf16), which is why model widths and vocabulary sizes are padded:
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

- fp16 has 5 exponent and 10 mantissa bits: range **[-65504, 65504]**, smallest normal 2^-14 ≈ 6.1e-5, smallest subnormal 2^-24 ≈ 6.0e-8; values at or below 2^-25 round to 0 (2^-25 is a tie, rounded to even: 0). bf16 has fp32's range with 7 mantissa bits (eps 2^-7).
- fp16 breaks training by overflow (inf/NaN), underflow of small gradients (here a large fraction of a trained MLP's activation gradients), lost updates when `lr * grad` is below half a gap, and stalled fp16 accumulators.
- Weight gradients sum over the batch and sit far above activation gradients (here thousands of times larger), so unscaled fp16 loses few of them in this shallow MLP; shrink the gradients and the loss grows fast, which is why fp16 always uses a scale.
- Loss scaling shifts gradients into range; the dynamic rule (skip + halve on inf/NaN, double after `growth_interval` clean steps) is a few lines, and `torch.amp.GradScaler` makes exactly the same decisions. Call `scaler.unscale_(optimizer)` before clipping or inspecting gradients; save `scaler.state_dict()` in checkpoints; step the LR scheduler only when the optimizer stepped (the scale drops when a step is skipped).
- fp32 master weights keep small updates; the update is `w - lr * grad`. `GradScaler` refuses fp16 gradients for that reason.
- `torch.autocast` casts matmul-like ops down, forces losses (and on CUDA, softmax/norms/reductions) to fp32. `torch.cuda.amp.*` and `torch.cpu.amp.*` are deprecated: use `torch.amp.autocast(device)` and `torch.amp.GradScaler(device)`. Apex is legacy; O1 ≈ autocast + GradScaler.
- Call `backward()` outside the autocast region; a custom `autograd.Function` under autocast needs `torch.amp.custom_fwd`/`custom_bwd(device_type=...)`.
- bf16 rarely needs loss scaling. This MLP's saved activations shrink toward half on the CPU; under CUDA autocast, ops kept in fp32 (softmax, layer norm) save fp32 copies, so a transformer saves clearly less. Autocast caches its weight copies for the region (`cache_enabled`).
- Speed depends on the hardware: measure it. A simulated AVX2 CPU runs a bf16 matmul tens of times slower than fp32. TF32 is controlled by `torch.set_float32_matmul_precision("high")` or, since 2.9, the backends' `fp32_precision`; fp8 (Hopper and later) scales every tensor (torchao.float8, MXFP8).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Write `fp16_spacing(x)`: the gap between a positive, normal fp16 number `x` and the next larger fp16 number (no `torch.nextafter` — use the exponent).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.mixed_precision import check_fp16_spacing, check_next_scale, check_static_scale


def fp16_spacing(x):
    raise NotImplementedError("your code here")


check_fp16_spacing(fp16_spacing)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Write `pick_scale(grads)`: the largest power of two *S* such that `max|grads| * S` is still finite in fp16. (This is the best *static* scale for that batch: it saves the most small gradients.)
"""


# %% slideshow={"slide_type": "fragment"}
def pick_scale(grads):
    raise NotImplementedError("your code here")


check_static_scale(pick_scale)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write the dynamic rule as a pure function: `next_scale(scale, tracker, found_inf, growth_interval)` returns the new `(scale, tracker)`, with backoff 0.5 and growth 2.
"""


# %% slideshow={"slide_type": "fragment"}
def next_scale(scale, tracker, found_inf, growth_interval):
    raise NotImplementedError("your code here")


check_next_scale(next_scale)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4.** Write `scaler_step(scaler, optimizer, scheduler)` for a loop that has already called `scaler.scale(loss).backward()`: step the optimizer through the scaler, update the scale, step the LR scheduler **only if the optimizer really stepped** (section 4), and return `True` when it did. The check runs ten steps, four of them with an injected overflow.
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
