# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 23 · The posts' APIs, then and now

The four posts this course started from were written for an older PyTorch: Apex, `torch.cuda.amp`, `torch.distributed.launch`. Most of their code still runs somewhere, and much of it is copied into new projects; some of it now warns, some fails, and some runs and does something else. This notebook is the translation table: each old API next to today's, each replacement run. Two translations get a section of their own, because they are where old code goes quietly wrong: loading a checkpoint (`torch.load` refuses what it once unpickled, and unpickling runs code) and the float16 training step (Apex's loop and today's `GradScaler` loop, with clipping).

By the end you will be able to:
- translate old PyTorch code (`Variable`, `saved_variables`, `apex.amp`, `torch.cuda.amp`, `torch.distributed.launch`, `--local_rank`, `DataParallel`, `.cuda()`) into the current API, and say why each changed;
- load a checkpoint that holds more than tensors without running its code: `weights_only=True` with a scoped allowlist;
- write the float16 training step with `torch.autocast` and `torch.amp.GradScaler`, clipping the true gradients and skipping the steps whose gradients overflowed.

This notebook assumes: notebooks 03 (custom `Function`s), 04 (checkpointing), 06–07 (loss scaling and autocast) and 11 (launching DDP). It runs on 2 CPU cores in seconds. No GPU needed.
"""

# %% slideshow={"slide_type": "-"}
import io
import os
import pickle
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.errors import expect_error
from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)
print(f"torch {torch.__version__.split('+')[0]}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The posts' APIs and today's

| the posts write | PyTorch 2.13 | why |
|---|---|---|
| `Variable(x, requires_grad=True)` | `x.requires_grad_()` or `torch.tensor(..., requires_grad=True)` | `Variable` merged into `Tensor` in 0.4; it now just returns a tensor |
| `ctx.saved_variables` | `ctx.saved_tensors` | deprecated alias, warns |
| `from apex import amp`; `amp.initialize(model, opt, opt_level="O1")`; `with amp.scale_loss(loss, opt)` | `torch.autocast(device_type, dtype)` + `torch.amp.GradScaler(device)` | autocast is built in; Apex's amp is retired |
| `torch.cuda.amp.autocast()`, `torch.cuda.amp.GradScaler()` | `torch.autocast("cuda", ...)`, `torch.amp.GradScaler("cuda")` | device-generic; the old names warn (`FutureWarning`) |
| `model.half()` for "mixed" precision | `torch.autocast` (weights stay float32) | pure fp16 weights lose small updates |
| `checkpoint(fn, x)` | `checkpoint(fn, x, use_reentrant=False)` | without the argument 2.13 warns and runs the reentrant form; an exception is announced (notebook 04 §3) |
| `python -m torch.distributed.launch --nproc_per_node=N` | `torchrun --nproc_per_node=N` | the old launcher is deprecated |
| `parser.add_argument("--local_rank")` | `int(os.environ["LOCAL_RANK"])` | torchrun passes no argument; the old launcher now passes `--local-rank` |
| `nn.DataParallel(model)` | `DistributedDataParallel` | one process per device, no GIL, multi-node |
| `dist.allreduce`, `dist.allgather` | `dist.all_reduce`, `dist.all_gather` | the posts' names never existed |
| `init_process_group("nccl")` everywhere | `"gloo"` on CPU, `"nccl"` on GPUs | NCCL needs CUDA |
| `x.cuda()`, `model.cuda(0)` | `x.to(device)` with `device = torch.device(...)` | runs on any device |
| `torch.load(path)` | `torch.load(path, weights_only=True)` (the default since 2.6) | unpickling arbitrary objects runs code |
| `loss.backward(retain_graph=True)` "to keep gradients" | `loss.backward()` | gradients accumulate anyway; retain only keeps the graph |

Each replacement, run (the GPU-only ones in their CPU form):
"""

# %% slideshow={"slide_type": "-"}
from torch.autograd import Variable

v = Variable(torch.ones(3), requires_grad=True)
assert type(v) is torch.Tensor and v.requires_grad  # Variable(...) just gives a Tensor
w = torch.ones(3).requires_grad_()
print("Variable(...) is a", type(v).__name__, "| today: torch.ones(3).requires_grad_() ->", w.requires_grad)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # not ctx.saved_variables
        return 2 * x * grad


xg = torch.randn(4, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(Square.apply, (xg,))
print("custom Function with ctx.saved_tensors passes gradcheck")

# %% slideshow={"slide_type": "-"}
with expect_error(ModuleNotFoundError, match="apex"):
    import apex  # noqa: F401  (NVIDIA's Apex is not part of PyTorch and not installed)

seed_everything(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
xb, yb = torch.randn(16, 64), torch.randint(0, 10, (16,))
with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16: float32's range, no loss scaling
    out = model(xb)
    loss = F.cross_entropy(out, yb)
loss.backward()  # backward outside the autocast region
opt.step()
assert out.dtype == torch.bfloat16 and model[0].weight.dtype == torch.float32
print(f"bf16 autocast: activations {out.dtype}, weights {model[0].weight.dtype}, no scaler")

opt.zero_grad()
scaler = torch.amp.GradScaler("cpu")  # float16 needs loss scaling (notebook 06)
with torch.autocast("cpu", dtype=torch.float16):
    out = model(xb)
    loss = F.cross_entropy(out, yb)
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
assert out.dtype == torch.float16
print(f"fp16 autocast: activations {out.dtype}, with torch.amp.GradScaler('cpu'), scale now {scaler.get_scale():.0f}")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.GradScaler()
    torch.cuda.amp.autocast()
future = [str(c.message).split(". ")[0] for c in caught if c.category is FutureWarning]
print("\n".join(future))
assert len(future) == 2

# %% slideshow={"slide_type": "-"}
from torch.utils.checkpoint import checkpoint

block = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
xc = torch.randn(4, 8, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint(block, xc)  # the old call
print("checkpoint without use_reentrant warns:", str(caught[0].message).split(". ")[0])
checkpoint(block, xc, use_reentrant=False).sum().backward()
print("checkpoint(..., use_reentrant=False): gradient of the input", tuple(xc.grad.shape))

device = torch.device("cpu")  # a choice; a script takes it as an argument, e.g. --device cuda
moved = model.to(device)  # instead of .cuda(): the same line runs on any device
print("model.to(device) ->", next(moved.parameters()).device)

torch.save(model.state_dict(), "_runs/cheat_sheet_model.pt")
state = torch.load("_runs/cheat_sheet_model.pt", weights_only=True)
model.load_state_dict(state)
print("torch.load(..., weights_only=True):", len(state), "tensors loaded")


assert hasattr(dist, "all_reduce") and not hasattr(dist, "allreduce") and not hasattr(dist, "allgather")
print("dist.all_reduce / dist.all_gather exist; allreduce / allgather do not")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The rest of the table runs in the capstone (notebook 22): `torchrun` instead of `torch.distributed.launch`, `LOCAL_RANK` from the environment instead of `--local_rank` (the script's GPU path binds it), DDP instead of `DataParallel`, gloo on the CPU. Notebook 11 shows the legacy launcher failing on the posts' `--local_rank`, and notebook 07 shows the single-machine post's Apex script calling `amp.initialize` before its optimizer exists.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Loading a checkpoint you did not write

`torch.save` pickles: tensors, and any Python object next to them. Unpickling an object calls whatever function its pickle names, with the arguments it stores; that is how an object is rebuilt, and it is also how a file runs code. Until PyTorch 2.6, `torch.load(path)` unpickled everything, so loading a downloaded checkpoint could run anything. Since 2.6 `weights_only=True` is the default: the unpickler accepts tensors, containers, numbers, strings and a short list of PyTorch types, and refuses every other global unless you allow it.

Below, a file whose pickle calls `open(path, "w")` when it is loaded: a harmless stand-in for any code. With `weights_only=False` the load creates the file; with the default it is refused before anything runs.
"""


# %% slideshow={"slide_type": "-"}
class Payload:
    """Unpickling this calls io.open(marker, "w"): it creates a file, standing for any code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (io.open, (self.marker, "w"))


marker = "_runs/payload_ran"
if os.path.exists(marker):
    os.remove(marker)
torch.save({"weight": torch.ones(2), "extra": Payload(marker)}, "_runs/hostile.pt")
with expect_error(pickle.UnpicklingError, match="Unsupported global", quiet=True) as refused:
    torch.load("_runs/hostile.pt")  # the default, weights_only=True
ran_default = os.path.exists(marker)
print("default torch.load:", str(refused.error).split("WeightsUnpickler error: ")[1].split(" was not")[0])
print("the file's code ran under the default:", ran_default)
loaded = torch.load("_runs/hostile.pt", weights_only=False)
ran_unsafe = os.path.exists(marker)
print("with weights_only=False the file's code ran:", ran_unsafe, "| 'extra' came back as", type(loaded["extra"]).__name__)
assert not ran_default and ran_unsafe
loaded["extra"].close()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
A checkpoint you wrote yourself often holds a class of your own (a config, a data-loader state). Allow exactly those classes: `torch.serialization.add_safe_globals([Cls])` allows them for every later load in the process, and the context manager `torch.serialization.safe_globals([Cls])` only inside its `with` block. Either way, the file's other globals are still refused.
"""


# %% slideshow={"slide_type": "-"}
class RunConfig:  # a class of your own, saved next to the weights
    def __init__(self, lr):
        self.lr = lr


torch.save({"weight": torch.ones(2), "config": RunConfig(0.1)}, "_runs/own.pt")
with torch.serialization.safe_globals([RunConfig]):
    own = torch.load("_runs/own.pt")  # weights_only=True, RunConfig allowed here
    with expect_error(pickle.UnpicklingError, match="Unsupported global", quiet=True):
        torch.load("_runs/hostile.pt")  # still refused: io.open is not RunConfig
print("inside safe_globals([RunConfig]): config.lr =", own["config"].lr, "| the hostile file still refused")
with expect_error(pickle.UnpicklingError, match="Unsupported global", quiet=True):
    torch.load("_runs/own.pt")
print("after the block, RunConfig is refused again:", RunConfig not in torch.serialization.get_safe_globals())
assert RunConfig not in torch.serialization.get_safe_globals()

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. The float16 step, then and now

The Tensor post's Apex loop and the single-machine post's DDP loop both scale the loss with `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()` and step with `optimizer.step()`; Apex kept float32 master weights and unscaled the gradients itself. Today the same four jobs are explicit: `torch.autocast` runs the forward in float16, `scaler.scale(loss).backward()` scales, `scaler.step(optimizer)` unscales and skips a step whose gradients hold an inf or a NaN, and `scaler.update()` halves the scale after such a step (and doubles it after `growth_interval` clean ones, printed below). Anything that reads the gradients in between, clipping first of all, needs `scaler.unscale_(optimizer)` before it (notebook 06 measures what clipping the scaled gradients does).

The cell below starts the scale at 2^20, too high for this model: float16 gradients overflow, the scaler skips those steps and backs off until they fit. The weights do not move on a skipped step.
"""

# %% slideshow={"slide_type": "-"}
seed_everything(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
print(f"init scale 2^20 = {scaler.get_scale():.0f}; x{scaler.get_backoff_factor()} after an overflow (halves),"
      f" x{scaler.get_growth_factor()} after growth_interval = {scaler.get_growth_interval()} clean steps (doubles)")
for step in range(4):
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scale = scaler.get_scale()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # the true gradients, for clipping (an inf stays inf)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(opt)  # skipped if any gradient is inf or NaN
    scaler.update()
    moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    print(f"step {step}: scale {scale:>9.0f} -> {scaler.get_scale():>7.0f} (x{scaler.get_scale() / scale:g}: {'halves' if scaler.get_scale() < scale else 'kept'}),"
          f" weights moved: {str(moved):<5}, gradient norm ~{norm.item():.3g}")
    assert moved == bool(torch.isfinite(norm)) and scaler.get_scale() / scale == (1.0 if moved else 0.5)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Old code translates mechanically: `Variable` → tensors, `saved_variables` → `saved_tensors`, Apex / `torch.cuda.amp` → `torch.autocast` + `torch.amp.GradScaler`, `torch.distributed.launch --local_rank` → `torchrun` + `LOCAL_RANK`, `DataParallel` → DDP, `.cuda()` → `.to(device)`; the posts' `dist.allreduce` never existed.
- `torch.load` unpickles with `weights_only=True` since 2.6: a file whose pickle would run code is refused before it runs; with `weights_only=False` it ran. Allow your own classes by name, inside `torch.serialization.safe_globals([...])`.
- The float16 step: autocast, `scaler.scale(loss).backward()`, `unscale_` before anything that reads gradients, `scaler.step`, `scaler.update`. A step with an overflowed gradient is skipped and the scale halves; the weights do not move.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. The single-machine post's loop, today: write `modern_step(model, optimizer, scaler, x, y, max_norm)`, one training step in float16 with `torch.autocast("cpu", dtype=torch.float16)`, cross-entropy, the `GradScaler` calls in order and the gradients clipped to `max_norm` (what Apex's `amp.master_params` was for). Return the loss. The check runs five steps from a scale that overflows the first two.
2. Write `load_trusted(path, trusted)`: load a checkpoint with `weights_only=True`, allowing the classes in the list `trusted` and nothing else, and only for this load. The check loads a checkpoint with a `RunConfig` and a hostile one.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.then_and_now import check_load_trusted, check_modern_step


def modern_step(model, optimizer, scaler, x, y, max_norm):
    raise NotImplementedError  # your code here


print(check_modern_step(modern_step))


# %% slideshow={"slide_type": "-"}
def load_trusted(path, trusted):
    raise NotImplementedError  # your code here


print(check_load_trusted(load_trusted))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [torch.load and weights_only](https://pytorch.org/docs/stable/generated/torch.load.html), [`torch.serialization.safe_globals`](https://pytorch.org/docs/stable/notes/serialization.html#weights-only), [Automatic mixed precision](https://pytorch.org/docs/stable/amp.html) and [its examples (gradient clipping)](https://pytorch.org/docs/stable/notes/amp_examples.html), [torch.utils.checkpoint](https://pytorch.org/docs/stable/checkpoint.html), [torchrun](https://pytorch.org/docs/stable/elastic/run.html), [PyTorch 0.4 migration guide (Variable and Tensor merged)](https://pytorch.org/blog/pytorch-0_4_0-migration-guide/).
- Python docs: [`pickle`, "Restricting Globals" and its warning](https://docs.python.org/3/library/pickle.html#restricting-globals).
- NVIDIA Apex: [apex.amp](https://nvidia.github.io/apex/amp.html) and [the move of AMP into PyTorch (issue #818)](https://github.com/NVIDIA/apex/issues/818).
"""
