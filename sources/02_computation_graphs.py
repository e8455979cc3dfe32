# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 02 · Computation graphs: what autograd builds, keeps and frees

Every forward pass that involves a tensor with `requires_grad=True` leaves behind a graph of *backward functions*. `backward()` walks that graph from the loss to the leaves. This notebook draws the graph, opens its nodes to see what they saved and what they compute, and measures what the graph costs in memory and when that memory comes back.

By the end you will be able to:
- draw and read the autograd graph of any output tensor, and walk it by hand through `grad_fn.next_functions`;
- predict which tensors a backward function saves (and which it does not), and call one directly;
- explain why gradients accumulate in leaves, and reset them with `zero_grad()`;
- explain what `backward()` frees, the error a second `backward()` raises, and when `retain_graph=True` is the answer;
- measure the bytes a graph holds for backward;
- run your own code inside backward with tensor, module and post-accumulate hooks, and find the operation behind a NaN gradient with anomaly detection.

This notebook assumes: notebook 01 (leaves, `requires_grad`, `grad_fn`, `nn.Parameter`) and the chain rule.
"""

# %% slideshow={"slide_type": "fragment"}
import time
import warnings
import weakref

import matplotlib.pyplot as plt
import torch
from torch import nn

from course_lib.errors import expect_error
from course_lib.graph_view import build_graph, describe_graph, draw_graph, saved_tensors_of
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The graph is built during the forward pass

Autograd does not wait for `backward()`: each operation on a tensor that requires grad records its backward function **as it runs**, and hangs it on the result as `grad_fn`. Here is a one-neuron model, line by line.
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.tensor([1.0, 2.0, 3.0])                        # input: no gradient needed
w = torch.tensor([0.5, -1.0, 0.25], requires_grad=True)  # weight
bias = torch.tensor(0.1, requires_grad=True)

prod = x * w
print("prod.grad_fn:", type(prod.grad_fn).__name__)
z = prod.sum() + bias
print("z.grad_fn:   ", type(z.grad_fn).__name__)
y = torch.sigmoid(z)
print("y.grad_fn:   ", type(y.grad_fn).__name__)
assert w.grad is None    # nothing computed yet: only recorded

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Each backward function links to the backward functions of its inputs through `next_functions`. A leaf that requires grad appears as an `AccumulateGrad` node (it adds the incoming gradient into `.grad`); an input that needs no gradient appears as `None`. Walking these links by hand:
"""


# %% slideshow={"slide_type": "fragment"}
def walk(output: torch.Tensor) -> list[str]:
    """Names of every backward node reachable from output.grad_fn, depth first."""
    seen, names, stack = set(), [], [output.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return names


print(walk(y))
print("MulBackward0.next_functions:", [type(f).__name__ if f is not None else None
                                       for f, _ in prod.grad_fn.next_functions])
assert prod.grad_fn.next_functions[1][0].variable is w   # the AccumulateGrad node points at w itself

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`course_lib.graph_view` does the same walk, and draws it. Its node list agrees with the hand-written one; the text under the drawing is the same graph as `describe_graph` prints it (inputs on the left, the output on the right).
"""

# %% slideshow={"slide_type": "fragment"}
names = {"x": x, "w": w, "bias": bias}
g = build_graph(y, names)
ops = sorted(g.nodes[n]["name"] for n in g if g.nodes[n]["kind"] == "op")
leaves = [n for n in g if g.nodes[n]["kind"] == "leaf"]
hand = walk(y)
assert ops == sorted(n for n in hand if n != "AccumulateGrad")
assert len(leaves) == hand.count("AccumulateGrad") == 2

draw_graph(y, names, title="y = sigmoid(sum(x * w) + bias)")
plt.show()
print(describe_graph(y, names))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The graph is rebuilt on every forward pass ("define-by-run"), so ordinary Python control flow shapes it: a loop that runs `n` times leaves `n` nodes.
"""


# %% slideshow={"slide_type": "fragment"}
def repeat_scale(t: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        t = t * w
    return t.sum()


for n in (1, 3, 5):
    count = walk(repeat_scale(x, n)).count("MulBackward0")
    print(f"loop ran {n} times -> {count} MulBackward0 nodes")
    assert count == n

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. `c = a * b` with a constant `b`: what `MulBackward0` saves and computes

The Tensor post's example: `a` requires grad, `b` (all 3s) does not. For `c = a * b`, the chain rule gives `∂L/∂a = ∂L/∂c · b` and `∂L/∂b = ∂L/∂c · a`. Only the first is needed, and it needs **`b`**, not `a`. So autograd saves `b` alone. Built-in backward nodes expose what they saved as `_saved_<name>` (`self` is the first operand, `other` the second); `saved_tensors_of` reads them.
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
b = torch.full((3,), 3.0)            # a constant
c = a * b

saved = saved_tensors_of(c.grad_fn)
print("saved:", {k: v.tolist() for k, v in saved.items()})
assert set(saved) == {"other"} and saved["other"] is b   # b itself, no copy
assert c.grad_fn._saved_self is None                     # a is not kept
print(describe_graph(c, {"a": a, "b": b}))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
When `b` requires grad too, both operands are saved: each one's gradient needs the other.
"""

# %% slideshow={"slide_type": "fragment"}
b_trainable = torch.full((3,), 3.0, requires_grad=True)
c2 = a * b_trainable
print(describe_graph(c2, {"a": a, "b": b_trainable}))
assert set(saved_tensors_of(c2.grad_fn)) == {"self", "other"}

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
A backward node is callable. Given the incoming gradient `∂L/∂c` (here all ones) it returns one gradient per input of the forward operation. The Tensor post says `MulBackward` computes the gradients of `a` *and* `b`; in fact it returns `None` for `b`, which needs none.
"""

# %% slideshow={"slide_type": "fragment"}
grad_a, grad_b = c.grad_fn(torch.ones(3))
print("grad for a:", grad_a.tolist(), "| grad for b:", grad_b)
assert torch.equal(grad_a, b) and grad_b is None

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`c.backward()` itself needs care: `c` has three elements, and autograd only creates the starting gradient `∂L/∂c = 1` for a **scalar**. Pass it explicitly, or reduce to a scalar first (the usual case: a loss).
"""

# %% slideshow={"slide_type": "fragment"}
with expect_error(RuntimeError, match="only for scalar outputs"):
    c.backward()
c.backward(gradient=torch.ones(3))   # the same as c.sum().backward()
print("a.grad =", a.grad.tolist())
assert torch.equal(a.grad, b)        # d(sum(a*b))/da = b = 3
assert b.grad is None                # b is a constant: no gradient

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Gradients accumulate in leaves

`AccumulateGrad` **adds** into `.grad`; it never overwrites. Two backward passes give twice the gradient. This is deliberate: a leaf used in several places receives the sum of their contributions, and gradient accumulation over micro-batches (notebook 08) relies on it. It is also why every training step starts by resetting gradients.
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
for step in range(1, 4):
    (a * b).sum().backward()        # a fresh graph each time
    print(f"after backward #{step}: a.grad = {a.grad.tolist()}")
assert torch.equal(a.grad, 3 * b)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`optimizer.zero_grad()` (and `model.zero_grad()`) resets them. Since PyTorch 2.0 the default is `set_to_none=True`: `.grad` becomes `None`, which frees its memory and lets the next backward *assign* instead of add. `set_to_none=False` fills zeros instead (the pre-2.0 default).
"""

# %% slideshow={"slide_type": "fragment"}
lin = nn.Linear(3, 1)
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
lin(torch.ones(2, 3)).sum().backward()
opt.zero_grad()
print("zero_grad():                ", lin.weight.grad)
assert lin.weight.grad is None
lin(torch.ones(2, 3)).sum().backward()
opt.zero_grad(set_to_none=False)
print("zero_grad(set_to_none=False):", lin.weight.grad.tolist())
assert torch.equal(lin.weight.grad, torch.zeros(1, 3))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. `backward()` frees what the graph saved

The Tensor post says the graph is freed after backward to save memory. More precisely, `backward()` releases the **saved tensors** of every node it runs through, as soon as it is done with them. A second `backward()` through the same nodes then fails, and the saved slots read as `freed`:
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
c = a * b
loss = c.sum()
loss.backward()
print(describe_graph(c, {"a": a, "b": b}))
assert saved_tensors_of(c.grad_fn) == {"other": "freed"}
with expect_error(RuntimeError, match="backward through the graph a second time"):
    loss.backward()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The nodes themselves stay alive as long as a tensor refers to them; only their saved tensors go. A graph that saved nothing (an addition needs no operand values for its gradient) can even be run through twice:
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
s = (a + b).sum()
assert saved_tensors_of(s.grad_fn.next_functions[0][0]) == {}   # AddBackward0 saved nothing
s.backward()
s.backward()                         # no error: nothing had to be freed
print("a.grad after two backward passes through a + b:", a.grad.tolist())

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`retain_graph=True` keeps the saved tensors, so the same graph can be used again (for example two losses that share a trunk and are back-propagated one after the other). Its cousin `create_graph=True` implies it: that flag makes autograd record the backward pass itself as a new graph, so that the gradient it returns can be differentiated again (a second derivative, a Hessian, a penalty on a gradient's size). This notebook does not need it; notebook 03 §8 shows it at work. The last backward should omit `retain_graph`, so the memory is released.
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
c = a * b
c.sum().backward(retain_graph=True)
assert saved_tensors_of(c.grad_fn)["other"] is b    # still there
c.sum().backward()                                  # the last one frees
print("a.grad =", a.grad.tolist(), "| saved now:", saved_tensors_of(c.grad_fn))
assert torch.equal(a.grad, 2 * b)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### How much memory is that?

`SavedTensorMeter` listens to every tensor autograd saves during a forward pass and adds up their bytes (shared storage counted once, parameters reported apart). For an MLP it counts the input, each hidden activation and the output, so the bytes grow linearly with the batch, while the parameters do not. Its summary line reports the parameters **that the graph saved**, which, as the next cell shows, are not all of them.
"""

# %% slideshow={"slide_type": "fragment"}
mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
param_bytes = sum(p.numel() * p.element_size() for p in mlp.parameters())
per_sample = (256 + 512 + 512 + 10) * 4     # input, two ReLU outputs, output, in float32 bytes

batches = [64, 128, 256, 512, 1024]
saved_bytes, report = [], []
for batch in batches:
    with SavedTensorMeter(exclude=mlp.parameters()) as meter:
        loss = mlp(torch.randn(batch, 256)).pow(2).mean()
    saved_bytes.append(meter.bytes)
    report.append(f"batch {batch:>5}: {meter.summary()}")
    assert meter.bytes == batch * per_sample
crossover = param_bytes // per_sample + 1
report.append(f"activations: (256 + 512 + 512 + 10) x 4 = {per_sample:,} bytes per sample, exactly, at every batch size")
report.append(f"all parameters: {format_bytes(param_bytes)}; activations exceed them from batch {crossover} on")
print("\n".join(report))
assert crossover == 310

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Two numbers in that output need a look: **8** tensors saved where `per_sample` counts 4 (input, two ReLU outputs, output), and **1.02 MiB** of saved parameters where the model has 1.52 MiB. A pack hook that simply keeps a list of what autograd hands it (the same `saved_tensors_hooks` the meter uses; the last cell of this section uses it again) shows the eight, in the order the forward pass saves them:
"""

# %% slideshow={"slide_type": "fragment"}
from torch.autograd.graph import saved_tensors_hooks

x = torch.randn(64, 256)
packed: list[torch.Tensor] = []
with saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
    h1 = mlp[1](mlp[0](x))            # Linear(256, 512), ReLU
    h2 = mlp[3](mlp[2](h1))           # Linear(512, 512), ReLU
    out = mlp[4](h2)                  # Linear(512, 10)
    loss = out.pow(2).mean()
names = {"input x": x, "ReLU 1 output": h1, "ReLU 2 output": h2, "output": out, **dict(mlp.named_parameters())}
by_storage = {t.untyped_storage().data_ptr(): name for name, t in names.items()}
seen: set[int] = set()
for i, t in enumerate(packed, 1):
    key = t.untyped_storage().data_ptr()
    name = by_storage[key]
    kind = "parameter (a transposed view)" if t._base is not None else "activation"
    size = "same storage as above: counted once" if key in seen else format_bytes(t.untyped_storage().nbytes())
    seen.add(key)
    print(f"{i}. {name:<14} {str(tuple(t.shape)):<11} {kind:<30} {size}")
saved_names = {by_storage[t.untyped_storage().data_ptr()] for t in packed}
params = dict(mlp.named_parameters())
saved_param_bytes = sum(p.numel() * 4 for n, p in params.items() if n in saved_names)
activation_bytes = sum(names[n].numel() * 4 for n in saved_names - set(params))
print(f"{len(packed)} packs, {len(seen)} storages: activations {format_bytes(activation_bytes)},"
      f" weights {format_bytes(saved_param_bytes)}")
print("parameters never saved:", {n: format_bytes(p.numel() * 4) for n, p in params.items() if n not in saved_names})
assert len(packed) == 8 and len(seen) == 6 and activation_bytes == 64 * per_sample
assert format_bytes(saved_param_bytes) == "1.02 MiB" and saved_param_bytes == (512 * 512 + 10 * 512) * 4
assert {n for n in params if n not in saved_names} == {"0.weight", "0.bias", "2.bias", "4.bias"}

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
So the 8 packs are 6 storages:
- **4 activations**, the ones `per_sample` counts. Each ReLU output is packed twice, once by `ReluBackward0` (its result, for the mask) and once by the next `addmm` (its input, for the weight's gradient); the meter counts that storage once.
- **2 weights**, `2.weight` and `4.weight`, as transposed views: each `addmm` keeps its weight so it can send a gradient back to its input. Together 1.00 MiB + 20 KiB = **1.02 MiB**.

The other 0.50 MiB of parameters is never saved: the first layer's weight would only be needed for the gradient of `x`, and `x` needs none (the rule of §2: a product keeps an operand only for its partner's gradient; §5 draws it); a bias's gradient is the sum of the incoming gradient over the batch, which needs no stored value at all. That is why the graph holds 1.02 MiB of the model's 1.52 MiB.
"""

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
ax.plot(batches, [v / 2**20 for v in saved_bytes], "o-", label="saved for backward (activations)")
ax.axhline(param_bytes / 2**20, color="gray", ls="--", label="all parameters")
ax.set(title="Bytes a forward pass keeps for backward (MLP 256-512-512-10, float32)",
       xlabel="batch size (samples)", ylabel="memory (MiB)")
ax.legend()
plt.show()
print(f"at batch 1024: activations {format_bytes(saved_bytes[-1])} vs parameters {format_bytes(param_bytes)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
And the claim itself: these bytes are held by the graph until `backward()`, then released. A `saved_tensors_hooks` pair that keeps only a *weak* reference to each saved activation shows when they die (parameters are left out: the model keeps those alive anyway).
"""

# %% slideshow={"slide_type": "fragment"}
param_storages = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
watched: dict[int, tuple[weakref.ref, int]] = {}


def watch(t: torch.Tensor) -> torch.Tensor:
    key = t.untyped_storage().data_ptr()
    if key not in param_storages and key not in watched:
        watched[key] = (weakref.ref(t), t.untyped_storage().nbytes())
    return t                          # autograd keeps t itself, as without the hook


def alive_bytes() -> int:
    return sum(nbytes for ref, nbytes in watched.values() if ref() is not None)


with saved_tensors_hooks(watch, lambda t: t):
    loss = mlp(torch.randn(1024, 256)).pow(2).mean()   # no other reference to the input
before = alive_bytes()
loss.backward()
after = alive_bytes()
print(f"held by the graph before backward: {format_bytes(before)}; after: {format_bytes(after)}")
assert before == saved_bytes[-1] and after == 0

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. A two-layer network's graph

`nn.Linear` computes `x @ weight.T + bias` with one fused `addmm`; the transpose `weight.T` is its own node (`TBackward0`). The same rule as for `a * b` decides what each `addmm` saves: **the operand whose partner needs a gradient**.
"""

# %% slideshow={"slide_type": "fragment"}
seed_everything(0)
net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
xb = torch.randn(5, 4)
target = torch.randn(5, 2)
loss = nn.functional.mse_loss(net(xb), target)

names = {**dict(net.named_parameters()), "x": xb, "target": target}
draw_graph(loss, names, title="Linear(4, 3) -> ReLU -> Linear(3, 2) -> MSE loss")
plt.show()
print(describe_graph(loss, names))
mse = loss.grad_fn
addmm2 = mse.next_functions[0][0]
relu = next(f for f, _ in addmm2.next_functions if type(f).__name__ == "ReluBackward0")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Reading the listing:
- the first `addmm` saves only `x` (for the weight's gradient): `x` needs no gradient, so the weight is not kept;
- the second saves its input (for `2.weight`'s gradient) **and** a view of `2.weight` (for the gradient flowing back to layer 1);
- `ReluBackward0` saves its output, the same storage as the second layer's input, so it is stored once;
- `MseLossBackward0` saves the prediction and the target;
- the leaves are the four parameters; `x` and `target` are not in the graph at all, although their values are saved.
"""

# %% slideshow={"slide_type": "fragment"}
addmms = [n for n in build_graph(loss, names).nodes(data=True) if n[1].get("name") == "AddmmBackward0"]
saved_lists = sorted((d["saved"] for _, d in addmms), key=len)
print(saved_lists)
assert saved_lists[0] == ["mat1 (5, 4) = x"]
assert len(saved_lists[1]) == 2 and "view of 2.weight" in saved_lists[1][1]
assert relu._saved_result.untyped_storage().data_ptr() == addmm2._saved_mat1.untyped_storage().data_ptr()
with SavedTensorMeter(exclude=net.parameters()) as meter:
    nn.functional.mse_loss(net(xb), target)
print(meter.summary())
# x (5x4) + ReLU output (5x3, once) + prediction (5x2) + target (5x2), 4 bytes each
assert meter.bytes == (5 * 4 + 5 * 3 + 5 * 2 + 5 * 2) * 4

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Hooks: your code inside backward

Backward runs in autograd's engine, not in your code, yet distributed training needs to act *during* it: start an all-reduce as soon as a gradient is ready (notebook 10), reduce-scatter a unit's gradients (14), check or rescale gradients (06). Hooks are how. Three kinds do that work:

- **`t.register_hook(fn)`** on any tensor: `fn(grad)` runs when the gradient with respect to `t` is computed; returning a tensor replaces it. On a non-leaf it shows an intermediate's gradient without `retain_grad()`.
- **`module.register_full_backward_hook(fn)`**: `fn(module, grad_input, grad_output)` runs once the gradients with respect to the module's inputs are computed.
- **`p.register_post_accumulate_grad_hook(fn)`** on a leaf: `fn(p)` runs once `p.grad` holds the *accumulated* gradient. This is the moment DDP starts an all-reduce and an optimizer fused into backward steps a parameter.

The cell hooks all three into a two-layer network and prints the order in which backward runs them.
"""

# %% slideshow={"slide_type": "fragment"}
seed_everything(0)
net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
events = []


def shape(t):
    return "None" if t is None else tuple(t.shape)


handles = [
    net[2].register_full_backward_hook(
        lambda m, gin, gout: events.append(f"module hook, layer 2: grad_output {shape(gout[0])}, grad_input {shape(gin[0])}")),
]
for name, p in net.named_parameters():
    handles.append(p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(f"{name}.grad is ready")))
hidden = net[1](net[0](torch.randn(5, 4)))
handles.append(hidden.register_hook(lambda g: events.append(f"tensor hook, hidden activation: grad {shape(g)}")))
net[2](hidden).square().mean().backward()
print("\n".join(f"{i}. {e}" for i, e in enumerate(events, 1)))
order = {e.split(":")[0]: i for i, e in enumerate(events)}
assert order["2.weight.grad is ready"] < order["tensor hook, hidden activation"] < order["0.weight.grad is ready"]
assert order["module hook, layer 2"] < order["tensor hook, hidden activation"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Backward runs from the loss to the inputs: layer 2's hooks fire before the hidden activation's, and layer 0's parameters are ready last. The last layer's gradients are complete long before backward ends, which is what lets DDP overlap communication with the rest of backward.

Two differences between the tensor hook and the post-accumulate hook matter in practice. A tensor hook on a parameter sees the gradient of *this* backward, before it is added to `.grad`, and can change it; the post-accumulate hook sees `.grad` after the addition. With two micro-batches accumulated (notebook 08), only the post-accumulate hook sees the sum, on the second micro-batch. Every `register_*` returns a handle whose `remove()` takes the hook off.
"""

# %% slideshow={"slide_type": "fragment"}
for h in handles:
    h.remove()
w = torch.zeros(3, requires_grad=True)
seen = {"tensor hook": [], "post-accumulate hook": []}
handles = [w.register_hook(lambda g: seen["tensor hook"].append(g.tolist())),
           w.register_post_accumulate_grad_hook(lambda p: seen["post-accumulate hook"].append(p.grad.tolist()))]
for micro_batch in (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0])):
    (w * micro_batch).sum().backward()         # two micro-batches, accumulated in w.grad
for kind, grads in seen.items():
    print(f"{kind:21}: {grads}")
assert seen["tensor hook"][1] == [10.0, 20.0, 30.0] and seen["post-accumulate hook"][1] == [11.0, 22.0, 33.0]

clip = w.register_hook(lambda g: g.clamp(-0.5, 0.5))  # returning a tensor replaces the gradient
w.grad = None
(w * torch.tensor([1.0, -2.0, 0.25])).sum().backward()
print("with a clamping tensor hook, w.grad =", w.grad.tolist())
assert w.grad.tolist() == [0.5, -0.5, 0.25]
for h in [*handles, clip]:
    h.remove()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. Where did the NaN come from? Anomaly detection

A NaN in a gradient shows up after backward, far from the operation that produced it, and the loss can be perfectly finite. The classic case is `torch.where` guarding an operation that is undefined on part of its input: the forward pass picks the safe branch, but backward still differentiates both branches, and the zero that masks the unsafe one times its NaN derivative is NaN.
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.tensor([-1.0, 4.0], requires_grad=True)
loss = torch.where(x > 0, torch.sqrt(x), 0.0).sum()
loss.backward()
print(f"loss = {loss.item()}, x.grad = {x.grad.tolist()}")
assert torch.isfinite(loss) and torch.isnan(x.grad[0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`torch.autograd.detect_anomaly()` (or `torch.autograd.set_detect_anomaly(True)` for a whole script) records each operation's forward traceback and checks every backward node's output for NaN. Backward then stops at the first node that produces one, names it, and warns with the line of the forward pass that created it.
"""

# %% slideshow={"slide_type": "fragment"}
x.grad = None
with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
    warnings.simplefilter("always")
    loss = torch.where(x > 0, torch.sqrt(x), 0.0).sum()
    with expect_error(RuntimeError, match="Function 'SqrtBackward0' returned nan values in its 0th output"):
        loss.backward()
forward_lines = [line.strip() for w in caught for line in str(w.message).splitlines() if "torch.sqrt" in line]
print("the forward line the warning points at:", forward_lines[0])
assert forward_lines

x.grad = None
torch.where(x > 0, torch.sqrt(x.clamp(min=1e-12)), 0.0).sum().backward()   # the fix: a safe input on both branches
print("fixed: x.grad =", x.grad.tolist())
assert torch.isfinite(x.grad).all()

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Anomaly mode records a traceback for every operation and checks every gradient, so it slows training down (the next cell times it); turn it on to hunt a bug, not for a whole run. It also helps with the other common backward error, a saved tensor changed in place: the message itself suggests it.
"""

# %% slideshow={"slide_type": "fragment"}
seed_everything(0)
mlp = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
batch = torch.randn(32, 64)


def step_seconds(anomaly, repeats=20):
    with torch.autograd.set_detect_anomaly(anomaly):
        start = time.perf_counter()
        for _ in range(repeats):
            mlp(batch).sum().backward()
    return (time.perf_counter() - start) / repeats


step_seconds(False)                             # warm-up
print(f"a forward and backward with anomaly detection: ~{step_seconds(True) / step_seconds(False):.1f}x the time without it")

a = torch.ones(3, requires_grad=True)
b = a.exp()                                     # exp saves its output for backward
b.add_(1)                                       # ...which this changes in place
with expect_error(RuntimeError, match="Hint: enable anomaly detection"):
    b.sum().backward()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- The graph is recorded **during** the forward pass: each result's `grad_fn` links through `next_functions` to its inputs' nodes; leaves that require grad appear as `AccumulateGrad`, inputs that need no gradient as `None`. It is rebuilt every pass, so Python control flow shapes it.
- A backward node saves only what the needed gradients use: `a * b` with constant `b` saves `b` alone, and returns `None` as `b`'s gradient.
- `backward()` on a non-scalar needs an explicit `gradient`.
- Gradients **accumulate** in `.grad`; `zero_grad()` resets them to `None` by default.
- **Hooks** put your code inside backward: `register_hook` on a tensor (sees and may replace its gradient), `register_full_backward_hook` on a module, `register_post_accumulate_grad_hook` on a parameter (runs once `.grad` holds the accumulated sum: where DDP starts its all-reduce). Each returns a handle to `remove()`.
- **Anomaly detection** (`torch.autograd.detect_anomaly()`) stops backward at the first node that returns NaN and points at its forward line; `torch.where` over an undefined branch is the classic source. It is slow: use it to hunt, not to train.
- `backward()` frees the saved tensors (a second pass through them raises; `retain_graph=True` keeps them). Those tensors are the activations, which grow with the batch: here 5,160 bytes per sample (§4), more than all the parameters from batch 310 on.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** For `y = x * w`, with `x` an input (no grad) and `w` a weight (requires grad), which names does `y.grad_fn` save: `"self"` (`x`), `"other"` (`w`), both? Answer without running it.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.graphs import check_mul_saves

saved = ...  # your code here, e.g. {"self"}

check_mul_saves(saved)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** `w.grad` may still hold an old gradient. Write `fresh_grad(w, loss_fn)` that computes the gradient of `loss_fn(w)` with respect to `w` with `backward()`, leaves it in `w.grad`, and returns it, without the old value mixed in.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.graphs import check_fresh_grad


def fresh_grad(w, loss_fn):
    raise NotImplementedError("your code here")


check_fresh_grad(fresh_grad)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write `two_backwards(w)`: compute `y = torch.sin(w).sum()` **once**, call `y.backward()` twice on it, and return `w.grad` (which should then be `2 * cos(w)`).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.graphs import check_two_backwards


def two_backwards(w):
    raise NotImplementedError("your code here")


check_two_backwards(two_backwards)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4. A gradient-norm logger.** Write `log_grad_norms(model)`: give every parameter that requires grad a hook that stores `p.grad.norm().item()` in a dict under the parameter's name each time its accumulated gradient is ready, and return `(norms, handles)`: the dict and the list of the hooks' handles. The check accumulates two micro-batches (the dict must hold the norms of the sums), then removes your handles and checks that the hooks are gone. A frozen parameter gets no hook.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.graphs import check_grad_norm_logger


def log_grad_norms(model):
    raise NotImplementedError("your code here")


check_grad_norm_logger(log_grad_norms)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch documentation: [Autograd mechanics](https://pytorch.org/docs/stable/notes/autograd.html) — how the graph is recorded, saved tensors, and hooks for saved tensors.
- PyTorch documentation: [`torch.autograd.graph.saved_tensors_hooks`](https://pytorch.org/docs/stable/autograd.html#hooks-for-saved-tensors) and the tutorial [Hooks for autograd saved tensors](https://pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html).
- PyTorch documentation: [`torch.Tensor.register_hook`](https://pytorch.org/docs/stable/generated/torch.Tensor.register_hook.html), [`register_post_accumulate_grad_hook`](https://pytorch.org/docs/stable/generated/torch.Tensor.register_post_accumulate_grad_hook.html), [`nn.Module.register_full_backward_hook`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_full_backward_hook), and [anomaly detection](https://pytorch.org/docs/stable/autograd.html#anomaly-detection).
- PyTorch documentation: [`torch.optim.Optimizer.zero_grad`](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html) — `set_to_none`.
- A. Paszke et al., [Automatic differentiation in PyTorch](https://openreview.net/forum?id=BJJsrmfCZ), NIPS 2017 Autodiff Workshop.
- A. G. Baydin et al., [Automatic Differentiation in Machine Learning: a Survey](https://arxiv.org/abs/1502.05767), JMLR 2018.
"""
