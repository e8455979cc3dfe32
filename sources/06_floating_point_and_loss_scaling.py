# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 06 · Floating point and loss scaling: from the bits of fp16 to `GradScaler`

Training in 16-bit floating point stores each number in 2 bytes instead of 4 and, on hardware built for it, runs matrix products at a multiple of the fp32 rate. It also breaks training in a few precise ways. This notebook takes fp16 and bf16 apart bit by bit, shows each failure on real numbers, and rebuilds the two fixes, loss scaling and fp32 master weights, by hand before checking them against PyTorch's own `torch.amp.GradScaler`.

By the end you will be able to:
- read the bits of an fp32, fp16 or bf16 number and state each format's range, smallest normal and subnormal, and epsilon;
- show overflow, underflow, lost updates and accumulation error in fp16, and measure how much of a real network's gradient would vanish;
- write static and dynamic loss scaling from scratch and prove it makes the same decisions as `torch.amp.GradScaler`;
- use `GradScaler` in a real loop: `unscale_` before gradient clipping, its state in checkpoints, an LR scheduler that follows skipped steps;
- explain why fp32 master weights are kept, and count the bytes per parameter that mixed-precision Adam holds.

Notebook 07 continues with mixed precision in practice: `torch.autocast`, bf16 versus fp16, and the memory and speed they give.

This notebook assumes: notebooks 01–02 (tensors, autograd, `backward`). You know what an optimizer step and a learning-rate schedule are.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Setup.** One seed for the whole notebook. Every tensor here is small, so PyTorch runs on one thread: for tensors this size, splitting work between threads costs more than it saves, and one thread keeps timings steady on a busy machine.
"""

# %% slideshow={"slide_type": "-"}
import math
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.data import digits
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

where *M* is the number of **stored mantissa bits**, the width of the field. A normal number's value also has the implicit leading 1, which is not stored: it has $M + 1$ **significant bits**. The course always says which of the two it counts: "7 stored mantissa bits" and "8 significant bits" are the same fact about bf16. When the exponent field is all zeros the number is *subnormal*: $(-1)^s \cdot 2^{1-\text{bias}} \cdot m / 2^M$ — no implicit leading 1, so it trades precision for reaching closer to zero. An exponent field of all ones means inf (m = 0) or NaN.

| format | bits | exponent | stored mantissa bits | significant bits | what it is for |
|---|---|---|---|---|---|
| fp32 (`torch.float32`) | 32 | 8 | 23 | 24 | the default |
| fp16 (`torch.float16`) | 16 | 5 | 10 | 11 | IEEE half: precise, narrow range |
| bf16 (`torch.bfloat16`) | 16 | 8 | 7 | 8 | "brain float": fp32's range, little precision |

The limits come from `torch.finfo`; `course_lib.float_formats.float_format` adds the bit layout (its "mantissa" is the stored field) and the smallest subnormal, which `finfo` does not report.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.float_formats import FORMATS, bits_of, describe, float_format, from_bits, ulp

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

The Tensor post (notebook 00 §8) says fp16's range is "[-65504, -66504]" and that numbers below "2^-24" become 0. The first is a typo (both ends negative; the upper end is **+65504**); the second is imprecise: 2^-24 ≈ 5.96e-8 is the **smallest subnormal**, the smallest *normal* number is 2^-14 ≈ 6.10e-5, and the values that round to zero are those **at or below** *half* the smallest subnormal, 2^-25 (2^-25 itself lies exactly halfway between 0 and 2^-24, and a tie rounds to the neighbour whose last bit is even, which is 0). Between 2^-24 and 2^-14 numbers survive but with fewer and fewer significant bits.
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
# The exponents of fp16's limits, from course_lib.float_formats (hence torch.finfo): the figures below draw these.
NORMAL_LOG2 = round(math.log2(h.smallest_normal))          # -14
SUBNORMAL_LOG2 = round(math.log2(h.smallest_subnormal))    # -24
ZERO_LOG2 = SUBNORMAL_LOG2 - 1                             # -25: at or below it, a value becomes 0
MAX_LOG2 = math.log2(h.max)                                # 65504 = 2^15.999...
assert fp16(2.0**ZERO_LOG2) == 0.0 and fp16(2.0**ZERO_LOG2 * 1.01) == h.smallest_subnormal
print(f"fp16 range [{-h.max:g}, {h.max:g}]; 65520 -> {fp16(65520.0)}")
print(f"smallest normal {h.smallest_normal:.4g} = 2^{NORMAL_LOG2}, smallest subnormal {h.smallest_subnormal:.4g} = 2^{SUBNORMAL_LOG2}, "
      f"zero at or below {2.0**ZERO_LOG2:.4g} = 2^{ZERO_LOG2}")
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
**Accumulation.** Adding many small numbers one by one into an fp16 accumulator stalls: once the running sum is large, each new term is below half the gap and is lost. Here 4,096 copies of 0.1 are summed. The inputs are fp16, and 0.1 is not an fp16 number: it is stored as 0.0999756 (§1 decoded its bits), so the exact sum of these inputs is 4,096 × 0.0999756 = 409.5, not 409.6. The cell prints both:
"""

# %% slideshow={"slide_type": "fragment"}
values = torch.full((4096,), 0.1, dtype=torch.float16)
exact = values.double().sum().item()   # the same fp16 inputs, summed in float64: exact here
print(f"0.1 in fp16 is {values[0].item():.7f}; the exact sum of the {len(values)} inputs is {exact}, not 409.6")
assert exact == 409.5
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
    zero = (h16 == 0).float().mean().item()
    return zero, (h16.float().abs() < h.smallest_normal).float().mean().item() - zero, h16.isinf().float().mean().item()


zero0, sub0, inf0 = fp16_fate(act_grads)
print(f"cast to fp16 without scaling: {zero0:.0%} become 0, {sub0:.0%} subnormal, {inf0:.0%} inf")
assert zero0 > 0.2

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(11, 3.5))
ax.hist(log2g.numpy(), bins=60, color="tab:blue")
ax.axvspan(ZERO_LOG2, MAX_LOG2, color="tab:green", alpha=0.12, label=f"survives in fp16 (above 2^{ZERO_LOG2}; subnormal below 2^{NORMAL_LOG2})")
ax.axvspan(NORMAL_LOG2, MAX_LOG2, color="tab:green", alpha=0.18, label=f"fp16 normal range (2^{NORMAL_LOG2} .. {h.max:g})")
ax.axvline(ZERO_LOG2, color="tab:red", ls="--", lw=1, label=f"at or below 2^{ZERO_LOG2}: becomes 0")
top = ax.get_ylim()[1]
ax.set_ylim(0, top * 1.15)
ax.text(ZERO_LOG2 - 0.5, top * 1.03, f"← {zero0:.0%} become 0", ha="right", color="tab:red")
ax.set_xlim(-70, 20)
ax.set_xlabel("log2 |activation gradient| (dimensionless)")
ax.set_ylabel("count of gradient values")
ax.set_title("Activation gradients of a trained MLP on digits vs fp16's range")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.tight_layout()
plt.show()
print(f"lines drawn: zero at or below 2^{ZERO_LOG2}, normal from 2^{NORMAL_LOG2}, max 2^{MAX_LOG2:.3f} = {h.max:g}; "
      f"{zero0:.0%} of the gradients lie at or below the zero line")

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
ax.axvline(ZERO_LOG2, color="tab:red", ls="--", lw=1, label=f"fp16: at or below 2^{ZERO_LOG2} becomes 0")
ax.set_xlabel("log2 |gradient| (dimensionless)")
ax.set_ylabel("fraction of values per bin")
ax.set_title("Same network, same batch: weight gradients sit far above fp16's underflow")
ax.legend(fontsize=8)
plt.show()
print(f"line drawn at 2^{ZERO_LOG2}, the same zero line as section 3's figure")

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
Gradients 2^12 times smaller lose about a third of the weight gradients, and the norm of what is left is off by about a fifth (the last column): that is training on a different, biased gradient. Micikevicius et al. (2018) report both sides: their ImageNet classifiers trained in mixed precision without loss scaling, while their SSD object detector did not train without it and matched fp32 with a scale of only 8. Since a scale costs one multiplication, fp16 training always uses one (`GradScaler`); bf16 (notebook 07 §3) has fp32's range and needs none.
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
Now the proof that it is the same algorithm as PyTorch's. Three copies of a model train on the same batches with three scalers: ours, `course_lib.loss_scaling.DynamicLossScaler` (the library's version of the same algorithm, which rejects nonsensical settings with a clear error, as shown below), and `torch.amp.GradScaler("cpu")`. At a few steps we inject an overflow (an inf in one gradient, as fp16 would produce). A short `growth_interval=3` makes growth visible. We record, per step, the scale used and whether the weights moved.
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

The Tensor post, like many tutorials, uses `from torch.cuda.amp import autocast, GradScaler`. In PyTorch 2.13 both still exist but are **deprecated**: constructing them emits a `FutureWarning` pointing at the device-generic API `torch.amp.autocast("cuda")` / `torch.amp.GradScaler("cuda")`. (On this CPU-only machine they also warn that CUDA is unavailable and disable themselves.) The defaults it lists (init_scale 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000) are right; we read them from the object rather than trust the text.
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
**A skipped step is still a step for the LR scheduler.** `scaler.step(optimizer)` skips `optimizer.step()` when it found an inf, but a loop that calls `scheduler.step()` after every batch advances the schedule anyway (PyTorch notices the first time and warns that `lr_scheduler.step()` came before `optimizer.step()`). Over a long run that is a handful of steps early on, usually harmless; for a short schedule or a warm-up it shifts the learning rate. The skip is visible in the scale: `update()` lowers it exactly when the step was skipped. So compare the scale before and after `update()`, and call `scheduler.step()` only when the scale did **not** drop, that is, only when the optimizer really stepped. Two overflows in six steps, with a scheduler that multiplies the learning rate by 0.5 at each of its own steps (`StepLR(step_size=1, gamma=0.5)`):
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

The update is $w \leftarrow w - \eta \, g$ (a **minus**: we step *against* the gradient; the Tensor post writes "+", which would climb the loss). `torch.optim.SGD` does exactly that:
"""

# %% slideshow={"slide_type": "fragment"}
p = nn.Parameter(torch.tensor([1.0, 2.0]))
p.grad = torch.tensor([0.5, -1.0])
torch.optim.SGD([p], lr=0.1).step()
assert torch.allclose(p.detach(), torch.tensor([1.0 - 0.1 * 0.5, 2.0 + 0.1 * 1.0]))
print("after one SGD step:", [round(v, 4) for v in p.tolist()], "= w - lr * grad")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
If *w* lives in fp16, every $\eta g$ smaller than half the gap around *w* is lost (section 2). The paper's fix: keep an **fp32 master copy** of the weights. Each step (`master_step` below): copy the master to an fp16 model, run forward and backward in fp16 (with loss scaling), copy the gradients to fp32, unscale, and update the master in fp32, so the optimizer and its state live in fp32. The fp32 gradient copies are needed only for that update: the step frees them again.

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


def master_step(model, master, optimizer, scaler, idx):
    """One step of fp16 compute with fp32 master weights; returns the loss."""
    with torch.no_grad():
        for w16, w32 in zip(model.parameters(), master.parameters()):
            w16.copy_(w32)                            # master -> fp16 copy (rounds)
    model.zero_grad()
    loss = F.cross_entropy(model(X[idx].half()).float(), Y[idx])
    scaler.scale(loss).backward()
    for w16, w32 in zip(model.parameters(), master.parameters()):
        w32.grad = w16.grad.float()                   # fp16 grads -> fp32 copies, for this update only
    scaler.step(optimizer)                            # unscale in fp32, skip on inf, update the master
    scaler.update()
    optimizer.zero_grad(set_to_none=True)             # free the fp32 gradient copies
    return loss.item()


def train_master_fp32(make_opt):
    master = mlp(width=64)                            # fp32 master weights, updated by the optimizer
    model = copy.deepcopy(master).half()              # fp16 working copy for forward/backward
    optimizer = make_opt(master.parameters())
    scaler = DynamicLossScaler()
    return [master_step(model, master, optimizer, scaler, idx) for idx in batches], 0.0


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
### What the fix costs: bytes per parameter

The count of mixed-precision Adam that the ZeRO paper uses, and notebook 14 §1 with it, is **16 bytes per parameter**: 2 for the fp16 weights, 2 for their fp16 gradients, and 12 in fp32 for the master weights and Adam's `m` and `v`. `master_step` also makes an fp32 copy of every gradient, 4 bytes more. The count leaves that copy out because it need not outlive the update: `master_step` frees it at the end of the step, and a real implementation can convert and apply the gradients one tensor (or one bucket) at a time, so that only a small part of it ever exists at once. Some frameworks do keep a persistent fp32 gradient buffer, to accumulate micro-batches in fp32 (Megatron-LM's `--accumulate-allreduce-grads-in-fp32`), and pay those 4 bytes per parameter. The cell counts what one step of Adam with master weights holds, from the tensors themselves, and the same for plain fp32 Adam:
"""

# %% slideshow={"slide_type": "fragment"}
master = mlp(width=64)
model16 = copy.deepcopy(master).half()
adam = torch.optim.Adam(master.parameters())
fp32_grads_during_update = []
adam.register_step_pre_hook(                          # runs inside the update, when the fp32 copies exist
    lambda opt, args, kwargs: fp32_grads_during_update.append(sum(p.grad.nbytes for p in master.parameters()))
)
scaler = DynamicLossScaler()
for idx in batches:                                   # until one step is not skipped (normally the first)
    master_step(model16, master, adam, scaler, idx)
    if adam.state:
        break
n_params = sum(p.numel() for p in master.parameters())
held = {
    "fp16 weights": sum(p.nbytes for p in model16.parameters()),
    "fp16 gradients": sum(p.grad.nbytes for p in model16.parameters()),
    "fp32 master weights": sum(p.nbytes for p in master.parameters()),
    "fp32 Adam m and v": sum(st[k].nbytes for st in adam.state.values() for k in ("exp_avg", "exp_avg_sq")),
}
for name, b in held.items():
    print(f"{name:<24} {b / n_params:3.0f} B/param")
print(f"{'held between steps':<24} {sum(held.values()) / n_params:3.0f} B/param  (notebook 14 §1's count)")
print(f"{'fp32 gradient copies':<24} {fp32_grads_during_update[0] / n_params:3.0f} B/param during the update only;"
      f" freed after it: {all(p.grad is None for p in master.parameters())}")

plain = mlp(width=64)
plain_adam = torch.optim.Adam(plain.parameters())
F.cross_entropy(plain(X[:64]), Y[:64]).backward()
plain_adam.step()
plain_bytes = sum(p.nbytes + p.grad.nbytes for p in plain.parameters()) + sum(
    st[k].nbytes for st in plain_adam.state.values() for k in ("exp_avg", "exp_avg_sq"))
print(f"{'plain fp32 Adam':<24} {plain_bytes / n_params:3.0f} B/param  (4 weights + 4 gradients + 8 for m and v)")
assert sum(held.values()) == 16 * n_params == plain_bytes and fp32_grads_during_update[0] == 4 * n_params

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
So mixed precision with master weights holds exactly as many bytes of model state as plain fp32 Adam (16 per parameter, the two counts above): it saves nothing on the weights and the optimizer. Its memory savings come from the *activations* (notebook 07 §4).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- fp16 has 5 exponent and 10 stored mantissa bits (11 significant): range **[-65504, 65504]**, smallest normal 2^-14 ≈ 6.1e-5, smallest subnormal 2^-24 ≈ 5.96e-8; values at or below 2^-25 round to 0 (2^-25 is a tie, rounded to even: 0). Both figures draw their zero line from that one constant. bf16 has fp32's range with 7 stored mantissa bits, 8 significant (eps 2^-7).
- fp16 breaks training by overflow (inf/NaN), underflow of small gradients (39 % of a trained MLP's activation gradients in section 3), lost updates when `lr * grad` is below half a gap, and stalled fp16 accumulators.
- Weight gradients sum over the batch and sit far above activation gradients (about 2^13 times larger here, section 4), so unscaled fp16 loses few of them in this shallow MLP; shrink the gradients and the loss grows fast, which is why fp16 always uses a scale.
- Loss scaling shifts gradients into range; the dynamic rule (skip and halve the scale on inf/NaN, double it after `growth_interval` clean steps) is a few lines, and `torch.amp.GradScaler` makes exactly the same decisions. Call `scaler.unscale_(optimizer)` before clipping or inspecting gradients; save `scaler.state_dict()` in checkpoints; call `scheduler.step()` only when the optimizer really stepped, which is when `update()` did not lower the scale.
- fp32 master weights keep small updates; the update is `w - lr * grad`. `GradScaler` refuses fp16 gradients for that reason. With Adam they hold 16 bytes per parameter between steps, the same as plain fp32 Adam; the fp32 gradient copies (4 bytes per parameter) live only during the update.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Write `fp16_spacing(x)`: the gap between a positive, normal fp16 number `x` and the next larger fp16 number (no `torch.nextafter` — use the exponent).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.mixed_precision import check_fp16_spacing, check_next_scale, check_scaler_step, check_static_scale


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
def scaler_step(scaler, optimizer, scheduler):
    raise NotImplementedError("your code here")


check_scaler_step(scaler_step)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- P. Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740), ICLR 2018 — loss scaling, fp32 master weights, the gradient histogram.
- D. Kalamkar et al., [A Study of BFLOAT16 for Deep Learning Training](https://arxiv.org/abs/1905.12322), 2019.
- PyTorch documentation: [Automatic Mixed Precision package – torch.amp](https://pytorch.org/docs/stable/amp.html) — autocast op lists for CUDA and CPU, `GradScaler`.
- PyTorch documentation: [CUDA Automatic Mixed Precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html) — `unscale_` with gradient clipping, accumulation, multiple models; [`torch.optim.lr_scheduler`](https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate) — the scheduler steps after the optimizer.
- S. Rajbhandari et al., [ZeRO: Memory Optimizations Toward Training Trillion Parameter Models](https://arxiv.org/abs/1910.02054), SC 2020 — the 16 bytes per parameter of mixed-precision Adam (notebook 14 §1).
- NVIDIA Megatron-LM, [`megatron/training/arguments.py`](https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py) — `--accumulate-allreduce-grads-in-fp32`, a persistent fp32 gradient buffer.
- D. Goldberg, [What Every Computer Scientist Should Know About Floating-Point Arithmetic](https://docs.oracle.com/cd/E19957-01/806-3568/ncg_goldberg.html), 1991.
"""
