# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 01 · Tensors, autograd's attributes, and Parameters

Every training loop rests on a handful of tensor attributes (`requires_grad`, `grad`, `grad_fn`, `is_leaf`) and on one rule of `nn.Module`: only what is *registered* gets trained, saved and moved. This notebook shows each of them by running code.

By the end you will be able to:
- tell, for any tensor, whether it is a leaf, whether autograd tracks it, and whether `backward()` will fill its `.grad`;
- explain what became of the old `torch.autograd.Variable`, and recognise code written for it;
- choose between an `nn.Parameter`, a buffer and a plain tensor attribute, and predict what `parameters()`, `state_dict()`, `.to()` and the optimizer do with each;
- use `retain_grad`, `detach`, `torch.no_grad` and `torch.inference_mode`, and say why `.data` is dangerous;
- freeze part of a model for fine-tuning, and say what backward and the optimizer then skip.

This notebook assumes: notebook 00, basic Python classes, and that you have seen a tensor and a `torch.nn.Linear` before.
"""

# %% slideshow={"slide_type": "fragment"}
import warnings

import torch
from torch import nn

from course_lib.errors import expect_error
from course_lib.seeding import seed_everything

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The attributes autograd reads

A tensor carries, besides its values:

| attribute | what it is |
|---|---|
| `data` | the values, as a tensor that autograd does not track (section 4 explains why you should rarely use it) |
| `requires_grad` | whether autograd records the operations that use this tensor, so that a gradient can flow back to it |
| `grad` | the gradient `backward()` accumulated into it: filled **only for leaves that require grad** (or after `retain_grad()`) |
| `grad_fn` | the backward function of the operation that produced it, or `None` |
| `is_leaf` | `True` exactly when `grad_fn is None` |

Older write-ups (the Tensor post among them) spell the second one `required_grad`. That name does not exist, and the typo fails **silently**: a Python tensor accepts any new attribute, so the line below runs, and nothing is tracked.
"""

# %% slideshow={"slide_type": "fragment"}
t = torch.ones(3)
t.required_grad = True          # typo: creates a new, meaningless Python attribute
assert t.requires_grad is False  # autograd still does not track t
t.requires_grad = True          # the real attribute (or t.requires_grad_())
assert t.requires_grad is True
print("required_grad (typo) changed nothing; requires_grad did")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
A tiny model: an input batch `x` (created by us, no gradient wanted), a weight `w` (created by us, trained), and the tensors computed from them.
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.randn(4, 3)                       # input: created by the user, requires_grad=False
w = torch.randn(3, requires_grad=True)      # weight: created by the user, requires_grad=True
x_scaled = x * 2.0                          # an operation, but on untracked tensors only
h = x_scaled @ w                            # an operation on a tracked tensor
loss = h.pow(2).mean()

tensors = {"x": x, "w": w, "x_scaled": x_scaled, "h": h, "loss": loss}
print(f"{'name':<9} {'requires_grad':<14} {'is_leaf':<8} grad_fn")
for name, v in tensors.items():
    fn = type(v.grad_fn).__name__ if v.grad_fn is not None else "None"
    print(f"{name:<9} {str(v.requires_grad):<14} {str(v.is_leaf):<8} {fn}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The Tensor post says a tensor is a leaf "in two cases: the parameters `W` and the inputs `x`". That is incomplete. The rule is simpler: **a tensor is a leaf exactly when it has no `grad_fn`**. That covers every tensor you create yourself (with or without `requires_grad`), and also the result of an operation on tensors that do not require grad, such as `x_scaled`: autograd recorded nothing, so it is a leaf too.
"""

# %% slideshow={"slide_type": "fragment"}
for name, v in tensors.items():
    assert v.is_leaf == (v.grad_fn is None), name
assert x.is_leaf and not x.requires_grad            # an input: a leaf that does not require grad
assert w.is_leaf and w.requires_grad                # a weight: a leaf that requires grad
assert x_scaled.is_leaf and x_scaled.grad_fn is None  # computed, yet a leaf: nothing to record
assert not h.is_leaf and not loss.is_leaf           # computed from w: recorded, not leaves
print("is_leaf == (grad_fn is None) for all five tensors")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
After `backward()`, only `w` (a leaf that requires grad) has a `.grad`. The input `x` gets none because it does not require grad; `h` gets none because it is not a leaf. Reading `.grad` of a non-leaf returns `None` with a warning.
"""

# %% slideshow={"slide_type": "fragment"}
loss.backward()
assert w.grad is not None and w.grad.shape == w.shape
assert x.grad is None and x_scaled.grad is None     # leaves, but no requires_grad
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert h.grad is None                            # a non-leaf: not populated
print("w.grad =", [round(g, 4) for g in w.grad.tolist()])
print("warning on h.grad:", str(caught[0].message).split(" Its ")[0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`retain_grad()` asks autograd to keep the gradient of a non-leaf as well, which is handy when debugging. `w.grad` equals the chain rule applied by hand: `loss = mean(h²)`, so `dloss/dh = 2h/4` and `dloss/dw = x_scaledᵀ · dloss/dh`.
"""

# %% slideshow={"slide_type": "fragment"}
w.grad = None
h = x_scaled @ w
h.retain_grad()
loss = h.pow(2).mean()
loss.backward()
assert torch.allclose(h.grad, 2 * h.detach() / h.numel())
assert torch.allclose(w.grad, x_scaled.T @ h.grad)
print("h.grad =", [round(g, 4) for g in h.grad.tolist()])

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. What became of `Variable`

Before PyTorch 0.4 (April 2018) a `Tensor` held data only, and autograd worked on `torch.autograd.Variable`, a wrapper with `.data`, `.grad` and `.grad_fn`. Since 0.4 the two are merged: every tensor carries those attributes. `Variable` still exists so old code runs, but calling it simply returns a plain `torch.Tensor` that shares the storage of its argument.
"""

# %% slideshow={"slide_type": "fragment"}
from torch.autograd import Variable

t = torch.ones(3)
v = Variable(t)                                # old style
assert type(v) is torch.Tensor                 # not a wrapper: a plain Tensor
assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()  # same memory
v2 = Variable(t, requires_grad=True)           # old style for torch.ones(3, requires_grad=True)
assert type(v2) is torch.Tensor and v2.requires_grad and v2.is_leaf
print("type(Variable(t)) =", type(v).__name__)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What to write today: `torch.tensor(..., requires_grad=True)` or `t.requires_grad_()` instead of `Variable(t, requires_grad=True)`; `with torch.no_grad():` instead of `volatile=True`, which now only warns and does nothing.
"""

# %% slideshow={"slide_type": "fragment"}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    v3 = Variable(t, volatile=True)
assert v3.requires_grad is False
print("volatile=True ->", caught[0].message)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. `nn.Parameter`, buffers and plain tensor attributes

An `nn.Module` can hold a tensor in three ways. Only the first two are *registered*: the module knows about them.

- **`nn.Parameter`**: a `Tensor` subclass with `requires_grad=True` by default. Assigning one to a module attribute registers it: `parameters()` lists it, `state_dict()` saves it, `.to()`/`.cuda()` move it, and so the optimizer trains it.
- **buffer** (`self.register_buffer(name, tensor)`): state that is not trained, e.g. BatchNorm's running mean. Saved in `state_dict()` (unless `persistent=False`) and moved with the module, never listed by `parameters()`.
- **plain tensor attribute** (`self.t = torch.ones(3)`): invisible to the module. Not listed, not saved, not moved, not trained, even with `requires_grad=True`.
"""


# %% slideshow={"slide_type": "fragment"}
class ThreeWays(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))                  # registered parameter
        self.register_buffer("running", torch.zeros(3))            # registered buffer
        self.register_buffer("scratch", torch.zeros(3), persistent=False)  # buffer, not saved
        self.plain = torch.ones(3, requires_grad=True)             # NOT registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight * self.plain).sum() + self.running.sum()


m = ThreeWays()
print("parameters():", [n for n, _ in m.named_parameters()])
print("buffers():   ", [n for n, _ in m.named_buffers()])
print("state_dict():", list(m.state_dict()))
assert isinstance(m.weight, torch.Tensor) and m.weight.requires_grad and m.weight.is_leaf
assert not m.running.requires_grad

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`module.to(...)` changes the module in place: every parameter and buffer is converted, the plain attribute is left behind. Here the move is a dtype change, which shows the same mechanism as moving to a GPU.
"""

# %% slideshow={"slide_type": "fragment"}
assert m.to(torch.float64) is m          # Module.to returns the same module
for name in ("weight", "running", "scratch", "plain"):
    print(f"{name:<8} {getattr(m, name).dtype}")
assert m.weight.dtype == m.running.dtype == m.scratch.dtype == torch.float64
assert m.plain.dtype == torch.float32    # left behind
assert isinstance(m.weight, nn.Parameter)  # still a Parameter after the move

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The Tensor post says `model.cuda()` moves every Parameter to the GPU. That is true, and buffers move too; plain attributes do not. On a machine with a GPU the next cell shows it; a forward pass would then fail with a device mismatch on `plain`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.device import requires_gpu

if requires_gpu("model.cuda() moves parameters and buffers, not plain attributes"):
    g = ThreeWays().cuda()
    print({name: str(getattr(g, name).device) for name in ("weight", "running", "scratch", "plain")})
    assert g.weight.is_cuda and g.running.is_cuda and g.scratch.is_cuda and not g.plain.is_cuda

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Assigning a plain tensor to a name that holds a Parameter is refused, a guard against replacing a trained weight by accident:
"""

# %% slideshow={"slide_type": "fragment"}
with expect_error(TypeError, match="cannot assign"):
    m.weight = torch.zeros(3)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### How the optimizer finds parameters

An optimizer does not look inside the model: it trains exactly the tensors it was given, usually `model.parameters()`, read **once, when it is built**. The plain attribute gets a gradient (it requires grad), yet the optimizer never updates it, and nothing warns you.
"""

# %% slideshow={"slide_type": "fragment"}
m = ThreeWays()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
loss = m(torch.ones(3))
loss.backward()
opt.step()
def show(t: torch.Tensor) -> list[float]:
    return [round(v, 4) for v in t.tolist()]


print("weight:", show(m.weight), " grad", show(m.weight.grad))
print("plain: ", show(m.plain), " grad", show(m.plain.grad))
assert torch.allclose(m.weight.detach(), torch.full((3,), 0.9))   # trained
assert torch.equal(m.plain.detach(), torch.ones(3))              # silently not trained
assert m.plain.grad is not None                                  # although it has a gradient

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
For the same reason, a Parameter added to the model *after* the optimizer was built is not trained by it: the optimizer's list was fixed at construction.
"""

# %% slideshow={"slide_type": "fragment"}
m.late = nn.Parameter(torch.ones(2))
in_optimizer = {id(p) for group in opt.param_groups for p in group["params"]}
assert "late" in dict(m.named_parameters()) and id(m.late) not in in_optimizer
print("parameters in the model:", len(list(m.parameters())), "| in the optimizer:", len(in_optimizer))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. `detach()`, and why `.data` is dangerous

`t.detach()` returns a new tensor that **shares storage** with `t` but is cut from the graph: `requires_grad=False`, no `grad_fn`, a leaf. No copy is made, so an in-place change through one is seen by the other.
"""

# %% slideshow={"slide_type": "fragment"}
w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
d = w.detach()
assert d.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()  # same memory
assert d.is_leaf and not d.requires_grad and d.grad_fn is None
d[0] = 100.0
print("after d[0] = 100:  w =", w.tolist())
assert w[0].item() == 100.0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`.data` also returns an untracked tensor on the same storage. The difference is what autograd can *see*. Every tensor has a version counter that in-place operations bump; before using a saved tensor, backward checks that its version did not change. `detach()` shares that counter; `.data` does not.

Below, `sigmoid` saves its output `s` for backward (its gradient is `s·(1−s)`). Zeroing `s` in place through `.data` goes unnoticed and backward returns a **silently wrong gradient**; the same change through `detach()` raises an error.
"""

# %% slideshow={"slide_type": "fragment"}
a = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
right = torch.sigmoid(a) * (1 - torch.sigmoid(a))   # d sigmoid / da, computed by hand

s = torch.sigmoid(a)
s.data.zero_()                       # hidden from autograd: the version counter does not move
s.sum().backward()
print("through .data:    a.grad =", [round(g, 4) for g in a.grad.tolist()], " (right:",
      [round(g, 4) for g in right.tolist()], ")")
assert torch.equal(a.grad, torch.zeros(3))   # wrong, and no error

# %% slideshow={"slide_type": "fragment"}
a.grad = None
s = torch.sigmoid(a)
s.detach().zero_()                   # the shared version counter moves: autograd notices
print("version of s after the in-place change:", s._version)
with expect_error(RuntimeError, match="modified by an inplace operation"):
    s.sum().backward()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Use `detach()` to take values out of the graph (logging, targets, EMA copies) and `torch.no_grad()` to change parameters in place (next section). Old code that updates weights through `w.data -= lr * w.grad` still works, but it bypasses the check above.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. `torch.no_grad()` and `torch.inference_mode()`

Both turn recording off for the code inside them. Results do not require grad (they are leaves), no graph is kept, no activations are saved. `no_grad` is also how an optimizer changes a leaf in place: outside it, autograd refuses.
"""

# %% slideshow={"slide_type": "fragment"}
w = torch.ones(3, requires_grad=True)
with torch.no_grad():
    y = w * 2
    w -= 0.1                       # in-place update of a leaf that requires grad: allowed here
assert not y.requires_grad and y.is_leaf and y.grad_fn is None
assert w.is_leaf and w.requires_grad
print("w after the no_grad update:", [round(v, 4) for v in w.tolist()])
with expect_error(RuntimeError, match="leaf Variable that requires grad is being used in an in-place"):
    w -= 0.1                       # the same update, recorded: refused

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
`inference_mode()` goes further: inside it PyTorch skips autograd's bookkeeping (view tracking and version-counter bumps; the `torch.inference_mode` documentation in the References describes the gain), and the tensors it creates are *inference tensors*, which carry no version counter. Outside inference mode an inference tensor can still be an **input** of a recorded operation, as long as autograd never has to keep it: `q + w` is fine, because the gradient of a sum needs neither operand. Autograd refuses exactly three things, each shown below:

1. **saving it for backward**: `q * w` would have to keep `q` to compute `w`'s gradient;
2. **changing it in place** outside inference mode (`q.add_(1)`): it has no version counter to record the change;
3. **making it require grad** (`q.requires_grad_()`): it cannot become a tensor autograd tracks.

A tensor made under `no_grad` is an ordinary tensor, with none of these limits.
"""

# %% slideshow={"slide_type": "fragment"}
with torch.no_grad():
    n = w * 2
with torch.inference_mode():
    q = w * 2
assert not n.is_inference() and q.is_inference()
assert (n * w).requires_grad                     # no_grad result: usable in a later graph, also saved
print("no_grad tensor in a new graph: OK")
w.grad = None
(q + w).sum().backward()                         # an inference tensor as an input, not saved: allowed
assert torch.equal(w.grad, torch.ones(3))
print("inference tensor as an input of a recorded sum: OK, w.grad =", w.grad.tolist())
with expect_error(RuntimeError, match="Inference tensors cannot be saved for backward"):
    (q * w).sum().backward()                     # refusal 1: the product must save q

# %% slideshow={"slide_type": "fragment"}
with expect_error(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
    q.add_(1)                                    # refusal 2: in place, outside inference mode
with expect_error(RuntimeError, match="Setting requires_grad=True on inference tensor outside InferenceMode"):
    q.requires_grad_()                           # refusal 3: it cannot be tracked
q_normal = q.clone()                             # a clone outside inference mode is a normal tensor
assert not q_normal.is_inference() and q_normal.requires_grad_().requires_grad
print("q.clone() is a normal tensor that can require grad:", not q_normal.is_inference())

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Rule of thumb: `inference_mode()` for pure inference (serving, evaluation whose outputs you never train on); `no_grad()` for parameter updates and for anything whose results may later enter a graph.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Freezing: `requires_grad_(False)`

Fine-tuning trains part of a model and leaves the rest as it is: a pretrained backbone under a new head, an embedding kept fixed, adapters beside frozen weights. A parameter is **frozen** by `p.requires_grad_(False)`; `module.requires_grad_(False)` does it for every parameter of a module. It stays a Parameter (registered, saved, moved), but autograd no longer computes its gradient. Three consequences, one cell each:

1. backward leaves its `.grad` at `None`, yet a frozen layer in the middle still passes gradients on to the layers before it;
2. when everything before a point is frozen, autograd does not record those operations at all: backward stops early and nothing is saved for them;
3. the optimizer skips a parameter whose `.grad` is `None`, weight decay included. A parameter frozen after training, whose gradient was zeroed rather than set to `None`, still moves.
"""

# %% slideshow={"slide_type": "fragment"}
seed_everything(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
model[2].requires_grad_(False)                  # freeze the middle layer (its weight and bias)
model(torch.randn(4, 8)).square().mean().backward()
for name, p in model.named_parameters():
    grad = "None" if p.grad is None else f"shape {tuple(p.grad.shape)}"
    print(f"{name:9} requires_grad={p.requires_grad!s:5}  .grad: {grad}")
assert model[2].weight.grad is None and model[2].bias.grad is None
assert model[0].weight.grad is not None       # the gradient went through the frozen layer to layer 0

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The gradient reached layer 0 *through* the frozen layer: backward still multiplies by its weight, it only skips the weight's own gradient. `detach()` would cut the path instead. Freezing the **first** layers is different: their outputs require no gradient, so autograd records nothing for them. The cell counts the nodes of the graph by walking `grad_fn.next_functions` (the structure notebook 02 draws).
"""


# %% slideshow={"slide_type": "fragment"}
def graph_nodes(t):
    """The names of the backward nodes reachable from t.grad_fn."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(f for f, _ in node.next_functions)
    return sorted(type(n).__name__ for n in seen)


seed_everything(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
x = torch.randn(4, 8)
all_trained = graph_nodes(model(x).square().mean())
model[:3].requires_grad_(False)                 # freeze the first two linear layers, as under a new head
head_only = graph_nodes(model(x).square().mean())
print(f"all trained: {len(all_trained)} nodes, {all_trained.count('AddmmBackward0')} matrix products")
print(f"head only:   {len(head_only)} nodes, {head_only.count('AddmmBackward0')} matrix product: {head_only}")
assert all_trained.count("AddmmBackward0") == 3 and head_only.count("AddmmBackward0") == 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Now the optimizer. `optimizer.step()` skips every parameter whose `.grad` is `None`: no update, no momentum, no weight decay. `zero_grad()` sets gradients to `None` by default, so a parameter frozen between two steps stops moving. With `zero_grad(set_to_none=False)`, the style of older code, its gradient is a tensor of zeros, and AdamW updates it anyway: the decay shrinks it, and the running averages from earlier steps keep pushing it.
"""


# %% slideshow={"slide_type": "fragment"}
def frozen_drift(set_to_none):
    """Train a layer one AdamW step, freeze it, step again: how far does the frozen weight move?"""
    seed_everything(0)
    layer = nn.Linear(4, 4)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.1)
    layer(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    layer.requires_grad_(False)                 # frozen from now on
    before = layer.weight.detach().clone()
    opt.step()
    return (layer.weight - before).abs().max().item()


print(f"zero_grad() (set_to_none=True): the frozen weight moved by {frozen_drift(True):.4f}")
print(f"zero_grad(set_to_none=False):   the frozen weight moved by {frozen_drift(False):.4f}")
assert frozen_drift(True) == 0.0 and frozen_drift(False) > 0.01

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The safe habit: build the optimizer from the trainable parameters only, `AdamW(p for p in model.parameters() if p.requires_grad)`, and freeze before building it. Distributed wrappers read `requires_grad` once, when they are built: notebook 10 §1 builds DDP by hand and never sends a frozen parameter's gradient, and notebook 14 §2.3 shows ZeRO leaving it out of the shards.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- A tensor is a **leaf** exactly when `grad_fn is None`: every tensor you create, with or without `requires_grad`, and results of operations that recorded nothing. `backward()` fills `.grad` only for leaves that require grad, unless you call `retain_grad()`.
- The attribute is `requires_grad`; the typo `required_grad` silently does nothing.
- `Variable` was merged into `Tensor` in 0.4: `Variable(t)` returns a plain `Tensor`; `volatile` became `torch.no_grad()`.
- Only **registered** tensors belong to a module: Parameters (trained, saved, moved) and buffers (saved, moved, not trained). A plain tensor attribute is silently not trained, not saved, not moved.
- The optimizer trains the tensors it was given when it was built.
- `detach()` shares storage and the version counter; `.data` shares storage only, so autograd cannot catch in-place changes made through it.
- **Freezing** (`requires_grad_(False)`) leaves `.grad` at `None` but lets gradients pass through to earlier layers; frozen first layers are not recorded at all. The optimizer skips a `None` gradient, not a zero one: build it from the trainable parameters.
- `no_grad()` stops recording and allows in-place updates of leaves; `inference_mode()` also makes inference tensors: later they may be inputs of recorded operations, but autograd refuses to save one for backward, to let it change in place outside inference mode, or to make it require grad.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1. Which tensors are leaves?** For the code below, give `is_leaf` for each name.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.tensors import LEAF_QUESTION, check_leaves

print(LEAF_QUESTION)
answer = ...  # your code here, e.g. {"x": True, "w": ..., "x2": ..., "h": ..., "loss": ...}

check_leaves(answer)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2. A parameter and a buffer.** Write `Counter`, an `nn.Module` with a trainable one-element `scale` (starting at 1.0) and a one-element float buffer `calls` (starting at 0.0). `forward(x)` returns `x * scale` and adds 1 to `calls`. Both must appear in `state_dict()`, only `scale` in `parameters()`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.tensors import check_module_state

Counter = ...  # your code here: class Counter(nn.Module): ...

check_module_state(Counter)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3. An SGD step by hand.** Write `sgd_step(params, lr)`: it updates each tensor of the list in place to `p - lr * p.grad`, keeps it a leaf that requires grad, and resets its gradient to `None`. That is `optimizer.step()` followed by `optimizer.zero_grad()` for plain SGD.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.tensors import check_sgd_step


def sgd_step(params, lr):
    raise NotImplementedError("your code here")


check_sgd_step(sgd_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4. Freeze for fine-tuning.** Write `freeze_for_finetuning(model)` for an `nn.Sequential`: freeze every layer but the last, and return an `AdamW` (`lr=1e-3`, `weight_decay=0.01`) that holds the last layer's parameters and nothing else. The check gives the frozen parameters a zeroed gradient, as earlier training would leave them, then trains two steps with `zero_grad(set_to_none=False)`: a frozen parameter left in the optimizer would move (§6).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.tensors import check_freeze_for_finetuning


def freeze_for_finetuning(model):
    raise NotImplementedError("your code here")


check_freeze_for_finetuning(freeze_for_finetuning)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch documentation: [Autograd mechanics](https://pytorch.org/docs/stable/notes/autograd.html) — leaves, `requires_grad`, in-place correctness checks, `no_grad` and inference mode.
- PyTorch documentation: [`torch.Tensor.is_leaf`](https://pytorch.org/docs/stable/generated/torch.Tensor.is_leaf.html), [`retain_grad`](https://pytorch.org/docs/stable/generated/torch.Tensor.retain_grad.html), [`detach`](https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html).
- PyTorch documentation: [`torch.nn.Module`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html) — `register_buffer`, `register_parameter`, `state_dict`, `to`.
- PyTorch documentation: [`nn.Module.requires_grad_`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.requires_grad_) and the autograd notes' [Setting `requires_grad`](https://pytorch.org/docs/stable/notes/autograd.html#setting-requires-grad) (freezing); [`torch.optim.AdamW`](https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html) (parameters without a gradient are skipped).
- PyTorch documentation: [`torch.inference_mode`](https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html).
- [PyTorch 0.4.0 migration guide](https://pytorch.org/blog/pytorch-0_4_0-migration-guide/) — the merge of `Tensor` and `Variable`, `volatile` replaced by `no_grad`.
- A. Paszke et al., [PyTorch: An Imperative Style, High-Performance Deep Learning Library](https://arxiv.org/abs/1912.01703), NeurIPS 2019.
"""
