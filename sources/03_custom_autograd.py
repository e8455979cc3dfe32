# %% [markdown] slideshow={"slide_type": "slide"}
r"""
# 03 · Custom autograd: Swish by hand, checked, and what it keeps in memory

Autograd differentiates any composition of PyTorch operations for you. Sometimes you want to write the backward pass yourself: to save memory, to fuse work, to call code autograd cannot see, or simply to understand what `loss.backward()` does for one operation. That is what `torch.autograd.Function` is for.

By the end of this notebook you will be able to:
- write a `torch.autograd.Function` with `forward`/`backward` static methods, `ctx.save_for_backward` and `ctx.saved_tensors`, and call it with `.apply`;
- derive the derivative of Swish, $x\,\sigma(x)$, by hand, check it with SymPy, and check your backward with `torch.autograd.gradcheck` in float64;
- measure how many bytes a Function keeps for backward, and compare a hand-written Function with autograd's own graph and with `torch.nn.functional.silu`;
- choose between saving a tensor and recomputing it (the trade-off behind gradient checkpointing);
- return the right gradient for a broadcast input, and say why tensors go through `save_for_backward` rather than `ctx` attributes;
- take a second derivative with `create_graph=True`, and know when `once_differentiable` drops it silently;
- recognise outdated API (`ctx.saved_variables`, non-static `forward`) and use the modern `setup_context` style that `torch.func` and `torch.library.custom_op` build on.

This notebook assumes: notebook 02 (the graph autograd builds, `grad_fn`, saved tensors, and that backward frees them) and the chain rule from calculus.
"""

# %% slideshow={"slide_type": "fragment"}
import gc
import time
import warnings
import weakref

import matplotlib.pyplot as plt
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.errors import expect_error
from course_lib.graph_view import describe_graph
from course_lib.saved_tensors import SavedTensorMeter
from course_lib.seeding import seed_everything

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 1. The anatomy of an `autograd.Function`

A custom Function is a class with two **static** methods:

- `forward(ctx, *inputs)` computes the output. Autograd does **not** record the operations inside it; instead, the whole call becomes *one* node of the graph. Whatever backward will need, `forward` stores on `ctx`: tensors with `ctx.save_for_backward(...)`, anything else (shapes, flags) as plain attributes (why tensors must not be plain attributes: §8).
- `backward(ctx, grad_output)` receives $\partial L/\partial \text{output}$ and returns $\partial L/\partial \text{input}$ for each input (or `None` for an input that needs no gradient). It reads the saved tensors back with `ctx.saved_tensors`.

You never call these methods yourself: `MyFunction.apply(x)` runs `forward`, creates the graph node, and connects it to the inputs. A first example, doubling a tensor:
"""


# %% slideshow={"slide_type": "fragment"}
class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad_output):
        return 2 * grad_output          # d(2x)/dx = 2, times the incoming gradient (chain rule)


x = torch.tensor([1.0, -3.0], requires_grad=True)
y = Double.apply(x)
y.sum().backward()
print("y =", y.tolist(), "| y.grad_fn:", type(y.grad_fn).__name__, "| x.grad =", x.grad.tolist())
assert x.grad.tolist() == [2.0, 2.0]
# one node, wired straight to x: the multiplication inside forward was not recorded (forward runs with grad mode off)
print("DoubleBackward's inputs:", [type(n).__name__ for n, _ in y.grad_fn.next_functions])
assert [type(n).__name__ for n, _ in y.grad_fn.next_functions] == ["AccumulateGrad"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### The Tensor post's Swish, run on PyTorch 2.13

The source material for this part writes Swish like this (reproduced in substance): `forward` saves its input `i` and returns `i * sigmoid(i)`; `backward` reads the input back with **`ctx.saved_variables[0]`**, recomputes the sigmoid and applies the derivative. `saved_variables` dates from before PyTorch 0.4, when tensors that tracked gradients were wrapped in `Variable`. What does PyTorch 2.13 do with it?
"""


# %% slideshow={"slide_type": "fragment"}
class PostSwish(torch.autograd.Function):          # as in the Tensor post, with the deprecated accessor
    @staticmethod
    def forward(ctx, i):
        result = i * torch.sigmoid(i)
        ctx.save_for_backward(i)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        i = ctx.saved_variables[0]                 # deprecated: use ctx.saved_tensors
        sigmoid_i = torch.sigmoid(i)
        return grad_output * (sigmoid_i * (1 + i * (1 - sigmoid_i)))


x = torch.linspace(-3, 3, 7, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    PostSwish.apply(x).sum().backward()
for w in caught:
    print(f"{w.category.__name__}: {w.message}")
assert any(issubclass(w.category, DeprecationWarning) and "saved_tensors" in str(w.message) for w in caught)
print("gradient still computed:", [round(v, 4) for v in x.grad.tolist()])

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
It still works in 2.13, with a `DeprecationWarning`. That warning is easy to miss: Python hides `DeprecationWarning`s by default unless they come from code in `__main__` (the notebook), so once the Function moves into an imported module, nothing is printed. And setups that turn warnings into errors (`pytest -W error`, `python -W error`) make the Tensor post's code fail:
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.linspace(-3, 3, 7, requires_grad=True)
with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    with expect_error(DeprecationWarning, match="saved_tensors"):
        PostSwish.apply(x).sum().backward()

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Older tutorials go further back still and write `forward(self, x)` as an ordinary method and call `MyFunction()(x)`. That style was removed: PyTorch 2.13 refuses to run it.
"""


# %% slideshow={"slide_type": "fragment"}
class LegacyDouble(torch.autograd.Function):       # pre-0.4 style: methods on an instance
    def forward(self, x):
        return 2 * x

    def backward(self, grad_output):
        return 2 * grad_output


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # instantiating a Function also warns
    with expect_error(RuntimeError, match="non-static forward method"):
        LegacyDouble()(torch.ones(2, requires_grad=True))

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 2. The derivative of Swish, by hand

Swish (Ramachandran et al., 2017) is $f(x) = x\,\sigma(\beta x)$; with $\beta = 1$ it is the **SiLU** (named in Hendrycks & Gimpel's GELU paper, 2016, and studied by Elfwing et al., 2017), which PyTorch ships as `torch.nn.functional.silu` / `nn.SiLU` since version 1.7. The course uses $\beta = 1$.

With $\sigma(x) = \dfrac{1}{1+e^{-x}}$, the sigmoid's derivative is
$$\sigma'(x) = \frac{e^{-x}}{(1+e^{-x})^2} = \sigma(x)\,\bigl(1-\sigma(x)\bigr).$$
The product rule on $f(x) = x\,\sigma(x)$ gives
$$f'(x) = \sigma(x) + x\,\sigma(x)\bigl(1-\sigma(x)\bigr) = \sigma(x)\,\bigl(1 + x\,(1-\sigma(x))\bigr).$$
Since $x\,\sigma(x) = f(x)$, the same derivative can also be written with the **output** instead of the input:
$$f'(x) = f(x) + \sigma(x)\,\bigl(1 - f(x)\bigr).$$
The first form needs $x$ (and recomputes $\sigma(x)$); the second needs $f(x)$ and $\sigma(x)$. Which tensors a backward needs is exactly what decides its memory, as §5 measures. SymPy confirms both forms:
"""

# %% slideshow={"slide_type": "fragment"}
t = sp.symbols("x", real=True)
sigma = 1 / (1 + sp.exp(-t))
f = t * sigma
df = sp.diff(f, t)

by_hand = sigma * (1 + t * (1 - sigma))
from_output = f + sigma * (1 - f)
assert sp.simplify(sp.diff(sigma, t) - sigma * (1 - sigma)) == 0
assert sp.simplify(df - by_hand) == 0
assert sp.simplify(df - from_output) == 0
print("SymPy: d/dx[x*sigmoid(x)] == sigmoid*(1 + x*(1 - sigmoid)) == f + sigmoid*(1 - f)")
print("f'(0) =", df.subs(t, 0), "| limits: f'(-oo) =", sp.limit(df, t, -sp.oo), ", f'(+oo) =", sp.limit(df, t, sp.oo))

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
Swish is not monotonic: it dips below zero before rising, and its slope briefly exceeds 1. Its minimum is where $f'(x) = 0$, that is $1 + x(1-\sigma) = 0$, so $\sigma = 1 + 1/x$ and $f = x\sigma = x + 1$ there: the lowest value of Swish is its position plus one.
"""

# %% slideshow={"slide_type": "fragment"}
x_min = float(sp.nsolve(df, t, -1.0))
f_min = float(f.subs(t, x_min))
assert abs(f_min - (x_min + 1)) < 1e-12
print(f"minimum of Swish at x = {x_min:.4f}, value {f_min:.4f} (= x + 1)")
x_peak = float(sp.nsolve(sp.diff(df, t), t, 2.0))          # where the slope itself is largest
slope_peak = float(df.subs(t, x_peak))
assert slope_peak > 1
print(f"largest slope f'({x_peak:.4f}) = {slope_peak:.4f}: unlike ReLU, the slope overshoots 1 before settling to 1")

xs = torch.linspace(-6, 6, 241)
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.plot(xs, xs * torch.sigmoid(xs), label="Swish  $x\\,\\sigma(x)$")
ax.plot(xs, torch.sigmoid(xs) * (1 + xs * (1 - torch.sigmoid(xs))), label="derivative $f'(x)$")
ax.plot(xs, torch.relu(xs), ":", color="grey", label="ReLU, for comparison")
ax.scatter([x_min], [f_min], color="black", zorder=3, label=f"minimum ({x_min:.3f}, {f_min:.3f})")
ax.axhline(0, color="black", lw=0.5)
ax.set(title="Swish and its derivative", xlabel="input x (dimensionless)", ylabel="value (dimensionless)", ylim=(-0.6, 1.3))
ax.legend(loc="upper left", fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Implement it, wrap it, check it

Here is Swish written the current way: `ctx.saved_tensors` (a tuple, unpacked), and an `nn.Module` so it can sit in `nn.Sequential` like any activation.
"""


# %% slideshow={"slide_type": "fragment"}
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)              # keep only the input
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors              # the current API
        s = torch.sigmoid(x)                  # recomputed rather than stored
        return grad_output * (s * (1 + x * (1 - s)))


class SwishModule(nn.Module):
    def forward(self, x):
        return Swish.apply(x)


model = nn.Sequential(nn.Linear(4, 8), SwishModule(), nn.Linear(8, 1))
print(model)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### `gradcheck`: compare the backward with finite differences

`torch.autograd.gradcheck` perturbs each input element by a tiny `eps` (1e-6), measures how the output moves, and compares that numerical Jacobian with the one your `backward` produces. Use **float64** inputs: in float32 the rounding error of $f(x+\epsilon) - f(x-\epsilon)$ is about as large as the difference itself, so even a correct backward fails.
"""

# %% slideshow={"slide_type": "fragment"}
x64 = torch.randn(20, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(Swish.apply, (x64,))
print("float64 gradcheck: passed")

x32 = x64.detach().float().requires_grad_()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)        # gradcheck itself warns about float32 inputs
    ok32 = torch.autograd.gradcheck(Swish.apply, (x32,), raise_exception=False)
assert not ok32
print("float32 gradcheck on the same, correct backward:", ok32)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
`gradcheck` also catches real mistakes. Drop the $x\,\sigma(1-\sigma)$ term from the backward and it fails, and says where:
"""


# %% slideshow={"slide_type": "fragment"}
class SwishMissingTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)          # wrong: only the first term of the product rule


from torch.autograd.gradcheck import GradcheckError

with expect_error(GradcheckError, match="Jacobian mismatch"):
    torch.autograd.gradcheck(SwishMissingTerm.apply, (x64,))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Three ways to compute Swish agree

Autograd's own `x * torch.sigmoid(x)`, the built-in `F.silu` and our Function give the same values and the same gradients. So does the library's Swish in `course_lib.activations`, written in the modern style that §8 teaches (`forward` without `ctx`, plus `setup_context`): it is the one this notebook's exercise checks use, and the cell shows that it computes exactly what we just wrote.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.activations import SwishModule as LibSwishModule
from course_lib.activations import swish as lib_swish

versions = {
    "Swish.apply (ours)": Swish.apply,
    "x * torch.sigmoid(x)": lambda x: x * torch.sigmoid(x),
    "F.silu": F.silu,
    "course_lib swish": lib_swish,
    "course_lib SwishModule": LibSwishModule(),
}
x = torch.randn(1000, dtype=torch.float64) * 4
g = torch.randn(1000, dtype=torch.float64)              # an arbitrary incoming gradient
results = {}
for name, fn in versions.items():
    xi = x.clone().requires_grad_()
    y = fn(xi)
    y.backward(g)
    results[name] = (y.detach(), xi.grad)

y_ref, g_ref = results["Swish.apply (ours)"]
for name, (y, grad) in results.items():
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(grad, g_ref)
    print(f"{name:<24} max|y - ours| = {(y - y_ref).abs().max().item():.1e}   max|grad - ours| = {(grad - g_ref).abs().max().item():.1e}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. What the graph looks like

`.apply` puts **one** node in the graph, named after the class: `SwishBackward`. Autograd's `x * torch.sigmoid(x)` makes two nodes, and `F.silu` one built-in node. `course_lib.graph_view` lists each node with the tensors it saved (`= x` marks the input itself, not a copy):
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.randn(1000, requires_grad=True)
for name, fn in [("custom Function", Swish.apply), ("plain autograd", lambda x: x * torch.sigmoid(x)), ("F.silu", F.silu)]:
    print(f"--- {name}")
    print(describe_graph(fn(x), {"x": x}))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The node of a custom Function is a real object: its class derives from `BackwardCFunction`, `next_functions` links it to the input's node, and `saved_tensors` hands back exactly what `forward` saved: here the input tensor itself, not a copy. After `backward()` autograd frees it; reading it again is an error.
"""

# %% slideshow={"slide_type": "fragment"}
y = Swish.apply(x)
node = y.grad_fn
print("node:", type(node).__name__, "| base class:", type(node).__mro__[1].__name__)
print("next_functions:", [type(n).__name__ for n, _ in node.next_functions])
assert node.saved_tensors[0] is x
print("saved_tensors[0] is x:", node.saved_tensors[0] is x)

y.sum().backward()
with expect_error(RuntimeError, match="already been freed"):
    node.saved_tensors

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. How much does each version keep for backward?

`SavedTensorMeter` (from `course_lib.saved_tensors`) listens to `torch.autograd.graph.saved_tensors_hooks`: every tensor that any node saves for backward passes through it. It counts each storage once, so a tensor saved by two nodes costs its bytes once. We measure one million float32 inputs (4,000,000 bytes), and add a second variant of our Function that saves `sigmoid(x)` as well instead of recomputing it.
"""


# %% slideshow={"slide_type": "fragment"}
class SwishSaveSigmoid(torch.autograd.Function):
    """Same maths, but keeps sigmoid(x) so that backward does not recompute it."""

    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad_output):
        x, s = ctx.saved_tensors
        return grad_output * (s * (1 + x * (1 - s)))


assert torch.autograd.gradcheck(SwishSaveSigmoid.apply, (x64,))

N = 1_000_000
x = torch.randn(N, requires_grad=True)
candidates = {
    "custom Function (saves x)": Swish.apply,
    "custom, saves x and sigmoid(x)": SwishSaveSigmoid.apply,
    "plain x * torch.sigmoid(x)": lambda x: x * torch.sigmoid(x),
    "F.silu": F.silu,
}
saved = {}
print(f"{'version':<32}{'tensors saved':>14}{'bytes kept':>12}{'per element':>13}")
for name, fn in candidates.items():
    with SavedTensorMeter() as meter:
        y = fn(x)
    saved[name] = meter.bytes
    print(f"{name:<32}{meter.count:>14}{meter.bytes:>12,}{meter.bytes / N:>11.0f} B")

assert saved["custom Function (saves x)"] == saved["F.silu"] == 4 * N
assert saved["plain x * torch.sigmoid(x)"] == saved["custom, saves x and sigmoid(x)"] == 8 * N

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
What the numbers say:

- **Our Function** keeps the input only: 4 bytes per element. It pays for that by computing `sigmoid(x)` a second time in backward.
- **Plain autograd** on `x * torch.sigmoid(x)` keeps two tensors: `SigmoidBackward0` saves its **result** $s$ (since $\sigma' = s(1-s)$), and `MulBackward0` saves both factors, $x$ and $s$. That is three saves of two storages, counted once each: 8 bytes per element, twice our Function. Autograd cannot know that $s$ is cheap to recompute; it saves what each elementary operation needs.
- **`F.silu`** is a single fused operation whose backward (`SiluBackward0`) saves only its input (`self`) and recomputes the sigmoid, just like our hand-written Function: 4 bytes per element, with one C++ kernel each way instead of several.
- **Saving `sigmoid(x)` too** brings our Function back to 8 bytes per element, the same as plain autograd.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Is `ctx.save_for_backward(i)` "the activation" kept in memory?

The Tensor post asks this when it says training memory is parameters plus the activations stored in the graph. The answer is **yes, and it is not the only one**. "Activation memory" means every tensor that any node of the graph saves for backward, not just the outputs of activation functions. `save_for_backward(i)` is the part that *this* node adds. The Swish output `result` is not kept by Swish at all; it stays alive only if a later node saves it, and in a network the next `Linear` does, because it needs its input to compute its weight gradient.

(The Tensor post's list of what occupies memory in training is also short by two items: besides parameters and activations, there are the **gradients**, one per parameter, and the **optimizer state**, two more per parameter for Adam. Notebook 04 takes the full inventory; one Adam step shows the point:)
"""

# %% slideshow={"slide_type": "fragment"}
layer = nn.Linear(256, 512)
opt = torch.optim.Adam(layer.parameters())
layer(torch.randn(64, 256)).square().mean().backward()
opt.step()
param_b = sum(p.numel() * p.element_size() for p in layer.parameters())
grad_b = sum(p.grad.numel() * p.grad.element_size() for p in layer.parameters())
state_b = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if v.dim() > 0)
print(f"parameters {param_b:,} B | gradients {grad_b:,} B | Adam state {state_b:,} B (exp_avg + exp_avg_sq)")
assert grad_b == param_b and state_b == 2 * param_b

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Back to activations. We measure a small block, `Linear(256→512) → activation → Linear(512→10)` on a batch of 64, with the parameters excluded from the count so that only activations remain:
"""


# %% slideshow={"slide_type": "fragment"}
def run_block(act):
    """Linear(256->512) -> act -> Linear(512->10) on a batch of 64; returns output, named tensors, meter."""
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(256, 512), nn.Linear(512, 10)
    inp = torch.randn(64, 256)
    params = [*lin1.parameters(), *lin2.parameters()]
    with SavedTensorMeter(exclude=params) as meter:
        h = lin1(inp)
        a = act(h)
        out = lin2(a)
    names = {"input": inp, "h": h, "act_out": a, **{f"lin1.{k}": v for k, v in lin1.named_parameters()},
             **{f"lin2.{k}": v for k, v in lin2.named_parameters()}}
    return out, names, meter


out, names, meter = run_block(Swish.apply)
print(describe_graph(out, names))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Reading the graph (`h` is the first layer's output, `act_out` the Swish output): the first `AddmmBackward0` saves the block's input, `SwishBackward` saves `h` (the Tensor post's `i`), and the second `AddmmBackward0` saves `act_out` and a view of its weight. Now the totals, compared with no activation at all:
"""

# %% slideshow={"slide_type": "fragment"}
per_tensor = 64 * 512 * 4                       # one hidden tensor, 64 x 512 float32
rows = {
    "no activation (Linear -> Linear)": lambda h: h,
    "custom Swish (saves its input)": Swish.apply,
    "F.silu": F.silu,
    "plain x * torch.sigmoid(x)": lambda h: h * torch.sigmoid(h),
    "custom, saves x and sigmoid(x)": SwishSaveSigmoid.apply,
}
block_bytes = {name: run_block(act)[2].bytes for name, act in rows.items()}
base = block_bytes["no activation (Linear -> Linear)"]
print(f"input: {64 * 256 * 4:,} bytes; one hidden tensor: {per_tensor:,} bytes")
for name, b in block_bytes.items():
    print(f"{name:<34} {b:>9,} bytes   (+{(b - base) // per_tensor} hidden tensors over no activation)")
assert base == 64 * 256 * 4 + per_tensor                  # input + what the second Linear keeps
assert block_bytes["custom Swish (saves its input)"] - base == per_tensor
assert block_bytes["plain x * torch.sigmoid(x)"] - base == 2 * per_tensor

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
So in this block:

- the activation memory is input + `h` + `act_out`;
- `ctx.save_for_backward(i)` accounts for exactly one of those tensors, `h`: the cost of putting Swish between the two layers (+1 hidden tensor). Plain autograd adds two, because it also keeps $\sigma(h)$;
- the Swish output `result` is kept by the *next* layer, not by Swish.

This is why memory-saving techniques look at the whole graph: gradient checkpointing (notebook 04) drops *all* the tensors saved inside a segment and recomputes them during backward; mixed precision (notebooks 06–07) stores many of them in 16 bits instead of 32.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. Save or recompute? A first taste of checkpointing

`Swish` and `SwishSaveSigmoid` compute the same gradient. One keeps 4 bytes per element and evaluates the sigmoid twice; the other keeps 8 bytes per element and evaluates it once. Which one costs more time? On a CPU each elementwise operation is one pass over all the numbers, so the first thing to count is how many operations each version runs, forward and backward together. `OpCounter` (from `course_lib.checkpointing`; notebook 05 §2.1 uses it again) counts every elementary PyTorch operation that really runs, exactly:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.checkpointing import OpCounter

x = torch.randn(200_000, requires_grad=True)
g = torch.ones_like(x)
n_ops = {}
for name, fn in candidates.items():
    with OpCounter() as ops:
        torch.autograd.grad(fn(x), x, g)             # forward and backward, no .grad to accumulate into
    counts = {op.removeprefix("aten."): n for op, n in sorted(ops.counts.items()) if op != "aten.detach"}
    n_ops[name] = sum(counts.values())              # (aten.detach, left out, makes a view: no pass over the data)
    print(f"{name:<32} {n_ops[name]} operations: {counts}")
assert n_ops["custom Function (saves x)"] == n_ops["custom, saves x and sigmoid(x)"] + 1 == 8
assert n_ops["plain x * torch.sigmoid(x)"] == 6 and n_ops["F.silu"] == 2

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Our two Functions run 8 and 7 operations: two in forward, and a backward written as five separate PyTorch operations, plus the second sigmoid in the recompute variant. Plain autograd runs 6: two in forward; in backward, the product rule's two multiplications, PyTorch's own `sigmoid_backward`, and one addition that joins the two paths back to `x`. `F.silu` runs 2, one fused kernel each way, and yet it keeps only `x` (4 B/element, §5) and recomputes the sigmoid inside `silu_backward`: **`F.silu` is the recompute variant, fused.**

Now the time of forward + backward, with three precautions for a busy machine: one thread; the CPU time of that thread as the clock (`time.thread_time()`, which does not count the time the thread waits for a core while other programs run); and the four versions taking turns, 30 rounds, each keeping its fastest round, so that a busy spell hits them all alike. The numbers after `~` depend on the machine and on what else it is doing; the relations printed after them are asserted:
"""


# %% slideshow={"slide_type": "fragment"}
def fwd_bwd_ms(fns, x, rounds=30):
    """The least CPU time of one forward + backward of each function, in ms; the functions take turns."""
    g = torch.ones_like(x)
    for fn in fns.values():
        torch.autograd.grad(fn(x), x, g)            # warm-up
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.thread_time()               # CPU time of this thread: waiting for a core is not counted
            torch.autograd.grad(fn(x), x, g)
            best[name] = min(best[name], time.thread_time() - start)
    return {name: t * 1e3 for name, t in best.items()}


threads = torch.get_num_threads()
torch.set_num_threads(1)
ms = fwd_bwd_ms(candidates, x)
torch.set_num_threads(threads)
for name in candidates:
    print(f"{name:<32} keeps {saved[name] // N} B/element, runs {n_ops[name]} operations   forward+backward ~{ms[name]:.3f} ms")
recompute = ms["custom Function (saves x)"]
for other in ("plain x * torch.sigmoid(x)", "F.silu"):
    assert recompute > ms[other]
    print(f"custom recompute ({n_ops['custom Function (saves x)']} operations) vs {other} ({n_ops[other]}): "
          f"~{recompute / ms[other]:.1f}x the time, slower: {recompute > ms[other]}")
print(f"the two custom Functions, 8 against 7 operations: ~{recompute / ms['custom, saves x and sigmoid(x)']:.2f}x "
      "(one operation in eight: not ranked, a busy machine can swap them)")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
So the recompute variant is slower than plain autograd and `F.silu` (both relations asserted) because it runs more operations, not because recomputing is expensive in itself: `F.silu` recomputes the same sigmoid and still beats it, and memory-hungry plain autograd beats it with fewer, partly fused operations. The one-operation gap between the two custom Functions is real work, but small enough that on a shared machine the timings may rank them either way, so the cell prints that ratio without asserting an order. Nor does the cell assert that `F.silu` is the fastest: under PyTorch's portable kernels (the `DEFAULT` kernels of notebook 00 §1, which assume no vector extension), which evaluate each sigmoid without vector instructions, the time follows the number of sigmoids more than the number of operations, and plain autograd can beat `F.silu`, whose `silu` and `silu_backward` each evaluate one. The memory column never moves. Where activation memory limits the batch size (on a GPU, typically), paying one recomputed sigmoid to halve this layer's memory is usually the better deal, which is why `F.silu` works this way, fused into one kernel so that the recomputation costs little.

Gradient checkpointing (`torch.utils.checkpoint`, notebook 04) applies the same idea to whole blocks of layers: keep only the block's input, and run its forward again during backward. It is built from the tools of this notebook. The Tensor post's `CheckpointFunction` (still in `torch.utils.checkpoint`, used when you pass `use_reentrant=True`) is an `autograd.Function` whose `forward` runs the block under `no_grad`, so nothing inside is saved, and whose `backward` re-runs it with grad enabled. The variant PyTorch now recommends, `use_reentrant=False`, is built on `saved_tensors_hooks` instead, the same hooks `SavedTensorMeter` listens to.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. More of the API

### Why tensors go through `save_for_backward`, not `ctx.x = x`

§1 said: tensors with `ctx.save_for_backward`, anything else as plain attributes. Python would let you write `ctx.x = x` in `forward` and read `ctx.x` in `backward`, and the gradient would often come out right. The documentation of `Function.forward` asks you not to ("tensors should not be stored directly on ctx", not enforced, for backward compatibility). Three things go wrong with an attribute, each shown below with `SwishAttr`, our `Swish` with the input stored as `ctx.x`:

1. **No version check.** `save_for_backward` records the tensor's version counter (notebook 01 §4). If the tensor is changed in place before backward, `ctx.saved_tensors` raises; an attribute hands backward the changed values, and the gradient is silently wrong.
"""


# %% slideshow={"slide_type": "fragment"}
class SwishAttr(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x                             # a plain attribute: autograd does not know it is kept
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.x
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


a = torch.tensor([1.0, 2.0], requires_grad=True)
true_grad = torch.autograd.grad(F.silu(a).sum(), a)[0]
for name, fn in [("Swish", Swish.apply), ("SwishAttr", SwishAttr.apply)]:
    h = a * 1                                 # a non-leaf input, so it may be changed in place
    y = fn(h)
    h.mul_(10)                                # changed after forward, before backward
    if name == "Swish":
        with expect_error(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    else:
        (g,) = torch.autograd.grad(y.sum(), a)
        print(f"SwishAttr: gradient {[round(v, 4) for v in g.tolist()]}, true {[round(v, 4) for v in true_grad.tolist()]}")
        assert not torch.allclose(g, true_grad)          # no error, wrong numbers

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
2. **Invisible to the saved-tensor hooks.** Everything that manages activation memory listens to `saved_tensors_hooks`: `SavedTensorMeter`, non-reentrant checkpointing (notebook 04), which drops saved tensors and recomputes them, and `torch.autograd.graph.save_on_cpu`, which moves them to host memory. A tensor kept as an attribute never passes through the hooks, so the meter does not count it, checkpointing cannot drop it and offloading cannot move it:
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.randn(1000, requires_grad=True)
hooks_saw = {}
for name, fn in [("Swish (save_for_backward)", Swish.apply), ("SwishAttr (ctx.x = x)", SwishAttr.apply)]:
    with SavedTensorMeter() as meter:
        y = fn(x)
    hooks_saw[name] = meter.bytes
    print(f"{name:<26} the hooks saw {meter.count} tensor(s), {meter.bytes:,} bytes")
assert list(hooks_saw.values()) == [4000, 0]     # the attribute holds its 4,000 bytes all the same

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
3. **Reference cycles.** Storing the *output* as an attribute makes a cycle: the output refers to its `grad_fn`, which is `ctx`, which refers to the output. Reference counting cannot free a cycle, so the output (and everything it keeps) lives on after its last name is gone, until Python's cycle collector happens to run. `save_for_backward` knows when it is given the output and keeps it without the cycle:
"""


# %% slideshow={"slide_type": "fragment"}
class DoubleKeepOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, as_attribute):
        out = 2 * x
        if as_attribute:
            ctx.out = out
        else:
            ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        return 2 * grad_output, None


gc.disable()                                   # so that the collector cannot run in between
try:
    for as_attribute in (False, True):
        out = DoubleKeepOut.apply(torch.randn(1000, requires_grad=True), as_attribute)
        ref = weakref.ref(out)
        del out                                # the last name of the output is gone
        alive = ref() is not None
        gc.collect()
        print(f"output as {'attribute' if as_attribute else 'save_for_backward'}: alive after del: {alive}, "
              f"after gc.collect(): {ref() is not None}")
        assert alive == as_attribute and ref() is None
finally:
    gc.enable()

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Gradients of broadcast inputs are summed

The Swish paper also has a trainable $\beta$: $f(x, \beta) = x\,\sigma(\beta x)$. One scalar $\beta$ multiplies every element of $x$: PyTorch **broadcasts** it to $x$'s shape. What is the gradient of an input that was broadcast? The same $\beta$ is used at every position $i$ of the output $y$, and each use adds a term (the chain rule, summed over uses, the same reason gradients accumulate in a leaf used twice, notebook 02 §3):
$$\frac{\partial L}{\partial \beta} = \sum_i \frac{\partial L}{\partial y_i}\,\frac{\partial y_i}{\partial \beta}.$$
So the rule is: **the gradient of a broadcast input is the gradient of the result summed over the broadcast dimensions**, then given the input's shape. Broadcasting aligns shapes from the right: a dimension added in front (a bias `(3,)` added to a batch `(4, 3)`) is summed away; a dimension of size 1 that was stretched (a column `(4, 1)`) is summed and kept with size 1. `Tensor.sum_to_size(shape)` does exactly this reduction. Autograd applies the rule for every built-in operation:
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.randn(4, 3)
beta = torch.tensor(1.5, requires_grad=True)          # shape ()     -> broadcast to (4, 3)
bias = torch.zeros(3, requires_grad=True)             # shape (3,)   -> a dimension added in front
col = torch.zeros(4, 1, requires_grad=True)           # shape (4, 1) -> its size-1 dimension stretched
y = x * beta + bias + col
g = torch.randn(4, 3)                                 # an incoming gradient dL/dy
y.backward(g)
assert torch.allclose(beta.grad, (g * x).sum())                   # summed over both dimensions
assert torch.allclose(bias.grad, g.sum(dim=0))                    # summed over the added dimension
assert torch.allclose(col.grad, g.sum(dim=1, keepdim=True))       # summed over the stretched one, kept
for name, leaf, local in [("beta", beta, g * x), ("bias", bias, g), ("col", col, g)]:   # local = dL/dy * dy/d(name)
    assert torch.allclose(leaf.grad, local.sum_to_size(leaf.shape))
    print(f"{name:<4} shape {str(tuple(leaf.shape)):<7} grad shape {str(tuple(leaf.grad.shape)):<7}"
          f" = (dL/dy * dy/d{name}).sum_to_size({tuple(leaf.shape)})")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
In a custom Function you write the backward, so the sum is yours to do. The engine checks the shape of every gradient a backward returns: one in the broadcast shape is reduced for you with the same rule, a shape that cannot come from broadcasting is an error. Write the sum explicitly all the same: it states the rule where the reader sees it, and a gradient of another broadcast-compatible shape (say `(2, 3)` for an input of shape `(3,)`, a slicing mistake) would be reduced without a word.
"""


# %% slideshow={"slide_type": "fragment"}
class ScaleBy(torch.autograd.Function):              # y = x * w, w of shape (3,) broadcast over the rows of x
    @staticmethod
    def forward(ctx, x, w, mistake):
        ctx.save_for_backward(x, w)
        ctx.mistake = mistake                         # a flag, not a tensor: an attribute is right
        return x * w

    @staticmethod
    def backward(ctx, grad_output):
        x, w = ctx.saved_tensors
        grad_w = grad_output * x                      # shape (4, 3), like the output
        if ctx.mistake:
            grad_w = grad_w[:, :2]                    # shape (4, 2): no broadcast gives that
        return grad_output * w, grad_w, None


x, w = torch.randn(4, 3), torch.randn(3, requires_grad=True)
ScaleBy.apply(x, w, False).sum().backward()
assert w.grad.shape == (3,) and torch.allclose(w.grad, x.sum(dim=0))
print("a (4, 3) gradient returned for w of shape (3,): reduced by the engine to", tuple(w.grad.shape))
with expect_error(RuntimeError, match="invalid gradient at index 1"):
    ScaleBy.apply(x, w, True).sum().backward()

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### `ctx.needs_input_grad`: skip gradients nobody wants

With $\partial f/\partial x = \sigma + \beta x\,\sigma(1-\sigma)$ and $\partial f/\partial \beta = x^2\,\sigma(1-\sigma)$, `SwishBeta` below returns both gradients, and sums $\beta$'s over every element, by the rule above. `ctx.needs_input_grad` is a tuple of booleans, one per input of `forward`, so backward can skip work and return `None` for an input that does not need a gradient.
"""

# %% slideshow={"slide_type": "fragment"}
needs_seen = []                                 # what backward was told, call by call


class SwishBeta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        ctx.save_for_backward(x, beta)
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def backward(ctx, grad_output):
        x, beta = ctx.saved_tensors
        needs_seen.append(ctx.needs_input_grad)
        s = torch.sigmoid(beta * x)
        grad_x = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_output * (s + beta * x * s * (1 - s))
        if ctx.needs_input_grad[1]:
            grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)   # beta was broadcast: sum
        return grad_x, grad_beta


x = torch.randn(5, dtype=torch.float64, requires_grad=True)
SwishBeta.apply(x, torch.tensor(1.0, dtype=torch.float64)).sum().backward()
print("beta fixed:     needs_input_grad =", needs_seen[-1])
assert needs_seen[-1] == (True, False)

beta = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
SwishBeta.apply(x, beta).sum().backward()
print("beta trainable: needs_input_grad =", needs_seen[-1], "| beta.grad =", round(beta.grad.item(), 4))
assert torch.autograd.gradcheck(SwishBeta.apply, (x, beta))
print("gradcheck with a trainable beta: passed")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Double backward, step by step

**What it is.** `backward` computes a gradient, and a gradient is a function of the inputs like any other: $f(x) = x^3$ has $f'(x) = 3x^2$, itself differentiable, $f''(x) = 6x$. Differentiating a gradient is called **double backward**. It needs one thing: the gradient must be computed *with* a graph. `torch.autograd.grad(..., create_graph=True)` (or `loss.backward(create_graph=True)`) does that: autograd records the operations of the backward pass itself, so the gradient it returns has a `grad_fn` and can be passed to `grad` again. Without the flag the gradient is a plain tensor:
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.tensor([1.0, 2.0], requires_grad=True)
(g_plain,) = torch.autograd.grad((x**3).sum(), x)
(g,) = torch.autograd.grad((x**3).sum(), x, create_graph=True)
print(f"f'(x) = 3x^2 = {g.tolist()} | without create_graph: requires_grad={g_plain.requires_grad}"
      f" | with it: grad_fn={type(g.grad_fn).__name__}")
(gg,) = torch.autograd.grad(g.sum(), x)
print("f''(x) = 6x =", gg.tolist())
assert not g_plain.requires_grad and g.requires_grad and gg.tolist() == [6.0, 12.0]

# %% [markdown] slideshow={"slide_type": "fragment"}
r"""
**Where it is used.** Hessians and Hessian-vector products (second-order optimisation, sharpness measures), gradient penalties that put $\lVert\nabla_x D(x)\rVert$ into the loss (WGAN-GP), meta-learning that differentiates through an inner update (MAML). For a custom Function it works when `backward` is itself written with differentiable PyTorch operations, as ours is: autograd records it like any other code. `torch.autograd.gradgradcheck` checks the second derivatives against finite differences, and the result matches SymPy's $f''$ (the cell below also adds $x^3$, to have a part whose second derivative does not come from Swish).
"""

# %% slideshow={"slide_type": "fragment"}
assert torch.autograd.gradgradcheck(Swish.apply, (x64,))
x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
d2f = sp.diff(f, t, 2)
exact = [float(d2f.subs(t, v)) + 6 * v for v in x.tolist()]       # d2/dx2 of f(x) + x**3
(gx,) = torch.autograd.grad((Swish.apply(x) + x**3).sum(), x, create_graph=True)
(ggx,) = torch.autograd.grad(gx.sum(), x)
print(f"Swish: second derivative {[round(v, 4) for v in ggx.tolist()]}   exact {[round(v, 4) for v in exact]}")
assert torch.allclose(ggx, torch.tensor(exact, dtype=torch.float64))
print("gradgradcheck: passed")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**The trap of `once_differentiable`.** Decorating `backward` with `@torch.autograd.function.once_differentiable` runs it under `no_grad`: its operations are not recorded even with `create_graph=True`. Use it when backward truly cannot be differentiated (it calls NumPy or a custom kernel). The documentation says a second differentiation then raises an error. In PyTorch 2.13 it often does not: the part of $f''$ that comes through the Function is **silently dropped**, and only the $x^3$ part survives:
"""

# %% slideshow={"slide_type": "fragment"}
from torch.autograd.function import once_differentiable


class SwishOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


(gx,) = torch.autograd.grad((SwishOnce.apply(x) + x**3).sum(), x, create_graph=True)
(ggx,) = torch.autograd.grad(gx.sum(), x)
print(f"SwishOnce: second derivative {[round(v, 4) for v in ggx.tolist()]}   exact {[round(v, 4) for v in exact]}")
assert torch.allclose(ggx, 6 * x.detach())          # only x**3's part: Swish's part is missing, no error

# %% [markdown] slideshow={"slide_type": "fragment"}
r"""
**When does it raise?** `backward(ctx, grad_output)` receives `grad_output`, $\partial L/\partial\,\text{output}$, computed by the nodes *after* the Function. Under `create_graph=True` that incoming gradient is itself a recorded tensor, and it **requires grad** when it depends on the inputs. If the output goes straight into `.sum()`, it is a constant (ones) and does not; if something nonlinear follows, for example `output ** 2`, it is `2 * output`, which does. A probe Function that only reports what it receives shows the difference, and `once_differentiable` raises only in the second case: it then marks the gradient it returns so that differentiating it again is an error, while with a constant incoming gradient nothing is marked:
"""


# %% slideshow={"slide_type": "fragment"}
class Probe(torch.autograd.Function):
    """The identity; backward records whether the incoming gradient requires grad."""

    seen: list[bool] = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad_output):
        Probe.seen.append(grad_output.requires_grad)
        return grad_output


torch.autograd.grad(Probe.apply(x).sum(), x, create_graph=True)
torch.autograd.grad((Probe.apply(x) ** 2).sum(), x, create_graph=True)
print("incoming gradient requires grad? after .sum():", Probe.seen[0], "| after ** 2 then .sum():", Probe.seen[1])
assert Probe.seen == [False, True]
(gx,) = torch.autograd.grad((SwishOnce.apply(x) ** 2).sum(), x, create_graph=True)
print("after ** 2: the first derivative still works, gx requires grad:", gx.requires_grad)
with expect_error(RuntimeError, match="once_differentiable"):
    gx.sum().backward()                                    # the second differentiation refuses

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
So `once_differentiable` protects you only when something nonlinear follows the Function; a Function whose output is summed into the loss loses its second derivative without a word. Do not use such a Function where second derivatives are needed. Two more tools exist for Functions with several outputs: `ctx.mark_non_differentiable(out)` for outputs that carry no gradient (indices, masks), and `ctx.set_materialize_grads(False)` to receive `None` instead of zero-filled gradients for unused outputs.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### `torch.func` in a few lines

So far gradients came from `loss.backward()` (into `.grad`) or `torch.autograd.grad`. `torch.func` offers the same machinery as **function transforms**, in the style of JAX: each takes a function and returns a new function, and they compose.
- `grad(f)` returns a function computing the gradient of a scalar-valued `f`;
- `vmap(f)` runs `f`, written for one sample, over a batch dimension, without a Python loop;
- `jacrev(f)` returns the Jacobian (built from reverse-mode products), `hessian(f)` the matrix of second derivatives;
- `jvp(f, (x,), (v,))` is **forward-mode** AD: it returns $f(x)$ and the directional derivative $J v$ in one forward pass, with nothing saved for a backward pass (reverse mode, what `backward` does, computes $v^\top J$).
"""

# %% slideshow={"slide_type": "fragment"}
from torch.func import grad, hessian, jacrev, jvp, vmap

x = torch.tensor([1.0, 2.0, 3.0])
cube_sum = lambda v: (v**3).sum()                                     # noqa: E731
assert torch.allclose(grad(cube_sum)(x), 3 * x**2)                    # d/dx sum(x^3) = 3x^2
assert torch.allclose(hessian(cube_sum)(x), torch.diag(6 * x))        # second derivatives: diag(6x)
assert torch.allclose(jacrev(torch.sin)(x), torch.diag(torch.cos(x))) # elementwise: a diagonal Jacobian
A, B = torch.randn(5, 3), torch.randn(5, 3)
assert torch.allclose(vmap(torch.dot)(A, B), (A * B).sum(dim=1))      # torch.dot per row, batched
value, tangent = jvp(torch.sin, (x,), (torch.ones(3),))
assert torch.allclose(tangent, torch.cos(x))                          # J v with v = ones
print("grad:", grad(cube_sum)(x).tolist(), "| hessian diagonal:", hessian(cube_sum)(x).diagonal().tolist(),
      "| vmap(dot):", tuple(vmap(torch.dot)(A, B).shape), "| jvp tangent:", [round(v, 4) for v in tangent.tolist()])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### The modern style: `forward` without `ctx`, plus `setup_context`

Since PyTorch 2.0, `forward` may take only the inputs, and a separate `setup_context(ctx, inputs, output)` saves what backward needs. Both styles run under ordinary autograd, but only this one works with `torch.func`. The reason is what a transform does with your Function: `vmap` calls `forward` on its own batched stand-in tensors, `grad` calls it one level deeper than an outer `grad` when they are nested, `jvp` calls it with tangents attached. Each transform must be able to compute the output as a pure function of the inputs, and to decide by itself whether (and at which level) a backward is needed, and only then call `setup_context` to save tensors for it. A `forward(ctx, ...)` mixes the two jobs, so `torch.func` refuses it.

`generate_vmap_rule = True` tells `vmap` how to batch the Function: by running its `forward` (and backward) under `vmap` like ordinary PyTorch code, which works when they use PyTorch operations only (otherwise you write a `vmap` static method by hand).
"""


# %% slideshow={"slide_type": "fragment"}
class SwishModern(torch.autograd.Function):
    generate_vmap_rule = True                 # let torch.func.vmap batch it automatically

    @staticmethod
    def forward(x):
        return x * torch.sigmoid(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


x = torch.randn(6, dtype=torch.float64)
assert torch.autograd.gradcheck(SwishModern.apply, (x.clone().requires_grad_(),))
grad_modern = torch.func.grad(lambda v: SwishModern.apply(v).sum())(x)
torch.testing.assert_close(grad_modern, torch.func.grad(lambda v: F.silu(v).sum())(x))
batched = torch.func.vmap(SwishModern.apply)(x.reshape(3, 2))
print("torch.func.grad and vmap work with setup_context:", [round(v, 4) for v in grad_modern.tolist()[:3]], tuple(batched.shape))

with expect_error(RuntimeError, match="setup_context"):
    torch.func.grad(lambda v: Swish.apply(v).sum())(x)        # the classic style is refused

# %% [markdown] slideshow={"slide_type": "fragment"}
r"""
`course_lib.activations.Swish` is written in this modern style, and also has a `jvp` static method: the forward-mode rule ($J v$, here $f'(x)\,v$ elementwise) that `torch.func.jvp` calls. Without it, `jvp` through the Function fails:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.activations import Swish as LibSwish

v = torch.randn(6, dtype=torch.float64)
_, lib_tangent = jvp(LibSwish.apply, (x,), (v,))
_, silu_tangent = jvp(F.silu, (x,), (v,))
torch.testing.assert_close(lib_tangent, silu_tangent)
print("jvp through course_lib's Swish equals jvp through F.silu")
with expect_error(NotImplementedError, match="jvp"):
    jvp(SwishModern.apply, (x,), (v,))                        # no jvp static method

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Opaque kernels that must work with `torch.compile`: `torch.library.custom_op`

This subsection looks ahead: notebook 05 §3 takes `torch.compile` apart and notebook 20 uses it for training, so skip it on a first read if the terms below are new. Four of them are enough here. `torch.compile(fn)` returns a compiled version of `fn`; its front end, **Dynamo**, reads `fn`'s Python and captures the PyTorch operations it runs as a graph; a **backend** then runs that graph (`backend="aot_eager"` traces the graph's backward too and runs both with PyTorch's ordinary kernels: no code generation, so no C++ compiler needed); **`fullgraph=True`** asks for one graph or an error, where the default would quietly run what Dynamo cannot capture as ordinary Python (a *graph break*). The error is `torch._dynamo.exc.Unsupported`, a class from a private module (`torch._dynamo`), caught here by that name only to show it; it subclasses `RuntimeError`, the public type your own code would catch.

Dynamo reads Python: it follows an `autograd.Function`'s `forward` operation by operation (it even traces NumPy calls). What it cannot read is a compiled kernel, a C++ or CUDA extension or a Triton kernel launched by hand. Below, a function marked `torch.compiler.disable` stands for such a kernel. Called from a Function's `forward`, it stops a `fullgraph=True` compilation (without `fullgraph`, the whole Function would run eagerly, outside the compiled graph). Since PyTorch 2.4 the route for such a kernel is to make it an **operator**: `torch.library.custom_op` registers the function, `register_fake` says what shape and dtype its output has without running it (what the compiler traces with), and `register_autograd` attaches a backward in the same `setup_context` + `backward` form as above (here `SwishModern`'s own). `torch.library.opcheck` tests the registration, including under the compiler's tracing; `torch.compile(..., fullgraph=True)` then compiles through the operator (`aot_eager`: trace and run, no code generation):
"""


# %% slideshow={"slide_type": "fragment"}
@torch.compiler.disable                     # stands for a kernel the compiler cannot look into
def opaque_swish(x):
    return x * torch.sigmoid(x)


class SwishOpaque(SwishModern):             # the autograd.Function route: same context and backward
    @staticmethod
    def forward(x):
        return opaque_swish(x)


from course_lib.torch_private import dynamo_unsupported_error  # torch._dynamo.exc.Unsupported

with expect_error(dynamo_unsupported_error(), match="disable"):
    torch.compile(lambda v: SwishOpaque.apply(v).sum(), backend="aot_eager", fullgraph=True)(x64)


@torch.library.custom_op("course::swish", mutates_args=())
def swish_op(x: torch.Tensor) -> torch.Tensor:
    return opaque_swish(x)                  # the same opaque kernel, now behind an operator


@swish_op.register_fake
def _(x):
    return torch.empty_like(x)              # the output's shape and dtype, no computation


swish_op.register_autograd(SwishModern.backward, setup_context=SwishModern.setup_context)

assert torch.autograd.gradcheck(swish_op, (x64,))
torch.library.opcheck(swish_op, (x64,))
compiled = torch.compile(lambda v: swish_op(v).sum(), backend="aot_eager", fullgraph=True)
(g_compiled,) = torch.autograd.grad(compiled(x64), x64)
torch.testing.assert_close(g_compiled, torch.autograd.grad(F.silu(x64).sum(), x64)[0])
print("custom_op: gradcheck, opcheck and torch.compile(fullgraph=True) passed; its graph node:",
      type(swish_op(x64).grad_fn).__name__)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- A custom `torch.autograd.Function` has static `forward` and `backward` methods and is called with `.apply`; it becomes **one** node of the graph (`SwishBackward`), whose `saved_tensors` are exactly what `forward` saved.
- Save tensors with `ctx.save_for_backward` and read them with `ctx.saved_tensors`. The Tensor post's `ctx.saved_variables` still works in 2.13 but raises a `DeprecationWarning` (an error under `-W error`); non-static, instance-style Functions are refused outright.
- Swish's derivative is $\sigma(x)\,(1 + x(1-\sigma(x)))$, which equals $f + \sigma(1-f)$; SymPy confirms both, and `gradcheck` (in **float64**; float32 fails even a correct backward) confirms the code.
- For one million float32 inputs, our Function and `F.silu` keep 4,000,000 bytes for backward (the input); plain `x * torch.sigmoid(x)` and the save-the-sigmoid variant keep 8,000,000 (input and sigmoid).
- `save_for_backward(i)` is activation memory, but only this node's share: in `Linear → Swish → Linear` the next `Linear` keeps the Swish output. Activation memory is everything any node saves.
- Saving versus recomputing trades memory for compute; gradient checkpointing does this for whole blocks. On a CPU the time follows the operations that run (§7: 8 for our recompute variant, 2 for `F.silu`, which recomputes too, fused into one kernel each way), so a fused recomputation is cheap.
- Tensors go through `save_for_backward`, not `ctx` attributes: an attribute skips the in-place (version) check, so a changed input gives a silently wrong gradient; it is invisible to `saved_tensors_hooks` (the meter, non-reentrant checkpointing, `save_on_cpu`); an output kept as an attribute makes a reference cycle.
- The gradient of a broadcast input is the result's gradient summed over the broadcast dimensions (`sum_to_size`); a custom backward must return it in the input's shape.
- Double backward differentiates a gradient; it needs `create_graph=True` and a backward made of differentiable operations. `once_differentiable` raises only when the incoming gradient requires grad; otherwise it silently drops second-derivative terms. `needs_input_grad` skips unneeded gradients.
- `torch.func` (`grad`, `vmap`, `jacrev`, `hessian`, `jvp`) transforms functions; a Function works under it only with a ctx-free `forward` plus `setup_context`. An opaque kernel that must compose with `torch.compile` becomes a `torch.library.custom_op` with `register_fake` and `register_autograd`.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Exercises

**1. Softplus by hand.** $\text{softplus}(x) = \log(1 + e^x)$ and its derivative is $\sigma(x)$. Fill in `MySoftplus` (use `F.softplus` in `forward` for numerical stability).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.custom_autograd import check_softplus_function


class MySoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


check_softplus_function(MySoftplus)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
**2. Save nothing extra.** LeCun's scaled tanh is $f(x) = A \tanh(Bx)$ with $A = 1.7159$, $B = 2/3$ (`LECUN_A`, `LECUN_B`). Write it so that `Linear → LeanScaledTanh → Linear` keeps **no more bytes** than the two `Linear`s alone. Hint: which tensor does the next `Linear` already keep, and can you write $f'$ with it?
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.custom_autograd import LECUN_A, LECUN_B, check_lean_scaled_tanh  # noqa: F401 (A and B: for your answer)


class LeanScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


check_lean_scaled_tanh(LeanScaledTanh)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3. A backward checker.** Write `backward_is_correct(fn)`: it returns `True` when the single-input function `fn` (e.g. `Swish.apply`) has a correct backward and `False` otherwise, using `torch.autograd.gradcheck`. The check tries it on three right and three wrong backwards.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.custom_autograd import check_backward_checker


def backward_is_correct(fn):
    raise NotImplementedError("your code here")


check_backward_checker(backward_is_correct)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4. The gradient of a broadcast input.** Write `reduce_to_shape(grad, shape)`: `grad` is the gradient of a result of shape `grad.shape`, computed from an input of shape `shape` that was broadcast (§8); return the input's gradient. Use `.sum(dim=..., keepdim=...)`; `Tensor.sum_to_size` is the answer key, so compare with it but do not hand it in. The check tries seven shape pairs, from a scalar to a `(2, 1, 1)` input under a `(2, 4, 3)` result.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.custom_autograd import check_reduce_to_shape


def reduce_to_shape(grad, shape):
    raise NotImplementedError("your code here")


check_reduce_to_shape(reduce_to_shape)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## References

- PyTorch documentation: [Extending torch.autograd](https://pytorch.org/docs/stable/notes/extending.html) — `Function`, `save_for_backward`, `needs_input_grad`, `mark_non_differentiable`, `once_differentiable`.
- PyTorch documentation: [Extending torch.func with autograd.Function](https://pytorch.org/docs/stable/notes/extending.func.html) — `setup_context`, `generate_vmap_rule`, `jvp`; [`torch.func`](https://pytorch.org/docs/stable/func.html) — `grad`, `vmap`, `jacrev`, `hessian`, `jvp`.
- PyTorch documentation: [`torch.autograd.Function.forward`](https://pytorch.org/docs/stable/generated/torch.autograd.Function.forward.html) ("tensors should not be stored directly on ctx"); [Broadcasting semantics](https://pytorch.org/docs/stable/notes/broadcasting.html).
- PyTorch documentation: [Python custom operators](https://pytorch.org/tutorials/advanced/python_custom_ops.html) — `torch.library.custom_op`, `register_fake`, `register_autograd`, `opcheck` (PyTorch 2.4+).
- I. Gulrajani et al., [Improved Training of Wasserstein GANs](https://arxiv.org/abs/1704.00028) (2017) — a gradient penalty, a use of double backward.
- PyTorch documentation: [`torch.autograd.gradcheck`](https://pytorch.org/docs/stable/generated/torch.autograd.gradcheck.gradcheck.html) and [Autograd mechanics: saved tensors](https://pytorch.org/docs/stable/notes/autograd.html#saved-tensors) (`saved_tensors_hooks`).
- P. Ramachandran, B. Zoph, Q. V. Le, [Searching for Activation Functions](https://arxiv.org/abs/1710.05941) (2017) — Swish.
- S. Elfwing, E. Uchibe, K. Doya, [Sigmoid-Weighted Linear Units for Neural Network Function Approximation in Reinforcement Learning](https://arxiv.org/abs/1702.03118) (2017) — SiLU; D. Hendrycks, K. Gimpel, [Gaussian Error Linear Units](https://arxiv.org/abs/1606.08415) (2016).
- Y. LeCun, L. Bottou, G. Orr, K.-R. Müller, *Efficient BackProp* (1998) — the scaled tanh $1.7159\tanh(2x/3)$.
- T. Chen, B. Xu, C. Zhang, C. Guestrin, [Training Deep Nets with Sublinear Memory Cost](https://arxiv.org/abs/1604.06174) (2016) — gradient checkpointing, notebook 04.
"""
