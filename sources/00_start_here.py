# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 00 · Start here: how this course works

**PyTorch training internals, from the Tensor to multi-node DDP** is a course you *run*. Every claim in the text is followed by code that shows it; every number in the text is printed by a cell you run, or names its source (a paper, a specification, a vendor's datasheet); and everything runs on a laptop CPU with 2 cores. Cells that need a GPU come alive where one exists and say what they skipped where it does not.

By the end of this notebook you will be able to:
- check that your environment has what the course needs;
- read the course's conventions: checked claims, demonstrated errors, GPU cells, exercises and slides;
- find your way through the course's notebooks, and know where it comes from (four blog posts).

This notebook assumes: you can run Python in Jupyter and have seen `torch.tensor` before. Nothing else.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Your environment

The first cell reports what this machine has. Its output differs from machine to machine; the cell after it checks what the course actually needs. Two lines of the report use words that come back often:

- **CPU kernels** names the set of vector instructions PyTorch's own kernels use on this CPU: `AVX512` (instructions that work on 512 bits, 16 float32 numbers, at once), `AVX2` (their 256-bit predecessor, which most laptops have), or `DEFAULT` (the baseline kernels, which assume none of these extensions and run on any CPU of its architecture).
- **gloo** is the communication library through which PyTorch processes send each other tensors over the CPU and the network; the distributed notebooks (from 09 on) run on it. Between NVIDIA GPUs its counterpart is **NCCL** (NVIDIA's collective communication library), which notebook 12 §7 compares with gloo.
"""

# %% slideshow={"slide_type": "-"} tags=["nbval-ignore-output"]
import torch

from course_lib.device import environment_report

report = environment_report()
print("\n".join(report.lines()))

# %% slideshow={"slide_type": "fragment"}
from course_lib.device import MIN_TORCH, require_torch

require_torch()  # raises, saying what to install, on an older PyTorch
assert report.distributed and report.gloo, "the distributed notebooks need torch.distributed with gloo"
assert report.cpu_cores >= 1
print(f"Environment OK: PyTorch >= {MIN_TORCH} with torch.distributed and the gloo backend.")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Which of your numbers will match, and which will differ

The outputs you see in these notebooks came from one machine, and yours is another. Kernels (`AVX512`, `AVX2`, `DEFAULT`), thread counts and allocators change the last bits of floats and the size of temporary buffers from one CPU to another; two CPU features also change the speed of 16-bit arithmetic (notebook 07 §5): AVX512-BF16 instructions, which multiply 16-bit `bfloat16` numbers natively (notebook 06 takes `bfloat16` apart), and AMX (Intel's Advanced Matrix Extensions, matrix units for `bfloat16` and 8-bit tiles that some Xeons have). So the course prints three kinds of number:

- **a relation**, printed as one (`allclose: True, largest difference < 1e-6`): the same on every correct machine;
- **exact by construction** (byte counts, bit patterns, counts, seeded random integers): the same to the character;
- **a number right after a `~`** (a timing, a speed ratio, an allocator peak that includes the kernels' temporary buffers, a result of bf16 training): **yours will differ**. The claim made about it (an order, a band, a ratio) is asserted, so it holds on your machine too.
"""

# %% slideshow={"slide_type": "fragment"}
import time

a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
threads = torch.get_num_threads()
torch.set_num_threads(1)          # one thread: other programs on the machine disturb a timing less
start = time.perf_counter()
b = a @ a                         # the first matrix product of this process
first = time.perf_counter() - start
warm = []
for _ in range(50):               # the same product again, warmed up; the fastest run is the least disturbed
    start = time.perf_counter()
    a @ a
    warm.append(time.perf_counter() - start)
torch.set_num_threads(threads)
best = min(warm)

close = torch.allclose(b, (a.double() @ a.double()).float(), rtol=1e-4, atol=1e-4)
print(f"a 256x256 matmul agrees with float64: {close} (a relation)")
print(f"its result takes {b.numel() * b.element_size()} bytes (exact by construction)")
print(f"warmed up, it takes ~{best * 1e3:.3f} ms here, the fastest of 50 runs (yours will differ)")
assert first > best
print(f"the very first call took ~{first * 1e3:.3f} ms: slower than a warmed-up call: {first > best} (~{first / best:.0f}x)")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The first call of an operation in a process pays one-time costs on top of its work (the matrix library sets itself up and picks its kernels for this CPU, memory is requested from the operating system for the first time). How much varies a lot between machines and runs, which is why every timing in the course comes after at least one untimed warm-up call and reports the fastest of several runs, with the cell's threads and the machine's load in mind.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Every claim is shown by running code

A sentence such as *"PyTorch 2.x tensors track gradients only when asked"* is always followed by a cell that checks it. Most checks are an `assert`: if a future PyTorch changes the behaviour, the cell fails instead of printing a claim that is no longer true.
"""

# %% slideshow={"slide_type": "fragment"}
x = torch.ones(3)
assert x.requires_grad is False      # the default: not tracked
w = torch.ones(3, requires_grad=True)
assert w.requires_grad is True       # tracked, because we asked
print("claim checked:", x.requires_grad, w.requires_grad)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every notebook seeds its random generators once at the top with `seed_everything`, so that a second run prints the same numbers, on your machine as in the committed notebook (all but the numbers after a `~`, which §1 explained).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.seeding import seed_everything

seed_everything(0)
first = torch.rand(3)
seed_everything(0)
again = torch.rand(3)
assert torch.equal(first, again)
print("same numbers twice:", [round(v, 4) for v in first.tolist()])

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Errors are part of the lesson

Some lessons are about an error: calling `backward()` twice, or a DDP launch that hangs. Those cells use `expect_error`: it prints the error message for you and **fails the notebook run if the error does not happen**, so the lesson cannot silently go stale.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.errors import expect_error

with expect_error(RuntimeError, match="does not require grad"):
    torch.ones(2).sum().backward()   # nothing in this graph requires grad

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. GPU cells

The course runs everywhere on the CPU. A few demonstrations only make sense on a GPU (the speed of tensor cores, the matrix units of NVIDIA GPUs; NCCL; two devices). Each such cell starts with the same guard, `requires_gpu(...)`: on a machine with a CUDA GPU the cell runs; elsewhere it prints one line saying what it skipped.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.device import requires_gpu

if requires_gpu("a matrix multiply on the GPU"):
    a = torch.randn(1024, 1024, device="cuda")
    print("GPU matmul OK:", (a @ a).shape)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### On a machine with a GPU

On a machine with a CUDA GPU, everything outside those guarded cells still runs on the CPU and prints what the committed notebooks show (the `~` numbers aside). That is a rule of the course, not luck:

- **CPU jobs stay on the CPU.** The distributed notebooks start processes with `course_lib.launch`, which hides every GPU from them (`CUDA_VISIBLE_DEVICES=""`) unless a cell asks for one, and their scripts take the device as an argument (`--device cpu` by default) instead of choosing CUDA because one is visible.
- **The GPU path is one switch.** Start JupyterLab with the environment variable `COURSE_DEVICE=cuda` (`COURSE_DEVICE=cuda jupyter lab notebooks/`) and the training scripts of notebook 11 (sections 2-4), 12 (section 5), 14 (sections 2-3) and 15 (sections 1 and 3) run on your GPUs with NCCL instead: one process per GPU (a single process on a 1-GPU machine), each bound to its GPU by `LOCAL_RANK`, with deterministic kernels where a check compares two runs bit for bit. Their printed numbers then differ from the committed ones (other kernels, other timings); their checks still hold. The other distributed notebooks keep their jobs on the CPU and use the GPU only in guarded cells; the training scripts of notebooks 19 and 22 take `--device cuda` when you launch them yourself.
- **On a Mac with Apple silicon**, `torch.accelerator` reports the GPU (`mps`) to every process, and nothing hides it as `CUDA_VISIBLE_DEVICES=""` hides a CUDA GPU. The course's jobs still run on the CPU (the device is an argument of every script), but notebook 12 §6's probe then prints an accelerator where this notebook shows none, and code that picks "the" accelerator by itself may pick `mps`.
- **Determinism is an opt-in.** `seed_everything(0)` only seeds the random generators (Python's, NumPy's, PyTorch's on the CPU and every GPU): on the CPU that is all the course needs to print the same numbers twice. `seed_everything(0, deterministic=True)` also asks for deterministic kernels (`torch.use_deterministic_algorithms`, cuDNN without autotuning, `CUBLAS_WORKSPACE_CONFIG`): use it on a GPU when you need bit-equal reruns, and know that every timing after it measures the deterministic kernels, which PyTorch's [reproducibility notes](https://pytorch.org/docs/stable/notes/randomness.html) warn may be slower.
"""

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Where the training scripts run on this machine, as the switch says now:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.device import course_device

print("the course's training scripts run on:", course_device())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Exercises are checked for you

Each notebook ends with a few exercises. You write code in the cell; a `check_…` function tells you **✅ Correct**, **❌ Not quite** with a hint, or **⏳ Not done yet** while the blank is still there. A wrong or unfinished answer never stops the notebook. Here is what a check says about a wrong answer and about a right one:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.start import check_leaf_tensor

print(check_leaf_tensor(torch.ones(2, 3)))                      # forgot requires_grad
print(check_leaf_tensor(torch.ones(2, 3, requires_grad=True)))  # right

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Slides, progress bars and widgets

- **Slides.** Every cell carries slide metadata, so an instructor can present any notebook: in JupyterLab with the RISE extension (installed with the course, `View → Render as Reveal Slideshow` or `Alt+R`), or as a reveal.js deck.
- **Progress bars.** Loops that take more than a few seconds show a `tqdm` bar.
- **Widgets.** Interactive explorers use ipywidgets; each has a plain-text version right after it, so the notebook also reads well as a static page.
"""

# %% slideshow={"slide_type": "fragment"}
from tqdm.auto import tqdm

total = 0
for i in tqdm(range(100), desc="a progress bar"):
    total += i
print("sum of 0..99 =", total)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. The map of the course

Each notebook builds on the ones before it, one line each below (README's table adds a one-line summary of each). The distributed notebooks (from 09 on) launch real processes that talk to each other over `gloo`, on your CPU.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.manifest import course, course_map

print(course_map())  # from course.toml, the course's manifest: the same list as README's table

# %% slideshow={"slide_type": "fragment"}
from pathlib import Path

present = sorted(p.stem for p in Path(".").glob("[0-9][0-9]_*.ipynb"))
planned = [n.stem for n in course()]
assert present == planned, f"notebooks here and on the map differ: {sorted(set(present) ^ set(planned))}"
print(f"all {len(planned)} notebooks on the map are in this folder, and nothing else")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. Where the course comes from: four blog posts

The course was built from four blog posts in Chinese, written for older versions of PyTorch. Every point they make is covered; where their advice no longer holds (an API that is gone, a default that changed, a claim that was never quite right), the notebook runs the old code or the claim and says plainly what changed and why. The notebooks refer to each post by a short name:

| short name | title (original) | title (translated) | what it covers |
|---|---|---|---|
| **the Tensor post** | 神经网络——Tensor、计算图、训练方法 | Neural networks: tensors, the computation graph, training methods | `Tensor`/`Variable`/`Parameter` attributes, the computation graph, a custom `autograd.Function` (Swish), gradient checkpointing (Dropout, BatchNorm momentum), mixed precision (fp16, Apex, `torch.amp`, `GradScaler`), DataParallel versus DDP, parameter server versus ring all-reduce, setting up DDP (initialisation, sampler, seeds, rank-0 I/O, `SyncBatchNorm`, launching) |
| **the single-machine post** | pytorch加速训练过程（单机多卡） | Speeding up PyTorch training: one machine, several GPUs | `nn.DataParallel`, DDP with `torch.distributed.launch`, DDP with `mp.spawn`, DDP with Apex |
| **the multi-GPU post** | 详解如何使用Pytorch进行多卡训练 | A detailed guide to multi-GPU training with PyTorch | a complete DDP example, and a "model parallel" example |
| **the cluster post** | no title in the copy used; it opens: 如何使用PyTorch在GPU叢集上設定分散式神經網路訓練 | (untitled) how to set up distributed neural-network training on a GPU cluster with PyTorch | splitting a model across GPUs, gradient accumulation, DataParallel, DDP, multi-node launching, collectives for logging, `SyncBatchNorm` |

A notebook that runs a post's code or checks one of its claims names the post this way (for example notebook 08 §3, "The cluster post's accumulation loop, run as written").
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- The course runs on a CPU; GPU cells are guarded by `requires_gpu` and print what they skip.
- Claims are followed by code (`assert`, measurements, plots); errors are shown with `expect_error`.
- Numbers come in three kinds: relations (`allclose: True`), exact values (bytes, counts), and machine-dependent values after a `~`, whose claim (an order, a band) is asserted. Timings come after a warm-up: the first call of an operation pays one-time setup, and §1 measured it slower than a warmed-up call.
- Runs are seeded with `seed_everything`, so a second run prints the same numbers, except the ones after a `~`.
- Exercises are checked by `check_…` functions: correct, not quite (with a hint), or not done yet.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Make `w` a 2×3 tensor of ones that autograd tracks.
"""

# %% slideshow={"slide_type": "fragment"}
w = ...  # your code here

check_leaf_tensor(w)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Write `draw()` so that it returns the same three random numbers every time it is called: seed with `seed_everything(42)` inside it, then return `torch.rand(3)`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.start import check_same_numbers


def draw():
    raise NotImplementedError("your code here")


check_same_numbers(draw)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write your first GPU cell: set `ran` to what `requires_gpu("my first GPU cell")` returns, and put a GPU computation under `if ran:`.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.start import check_gpu_guard

ran = ...  # your code here

check_gpu_guard(ran)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch documentation: [Reproducibility](https://pytorch.org/docs/stable/notes/randomness.html) — what seeding does and does not guarantee.
- PyTorch documentation: [CUDA semantics](https://pytorch.org/docs/stable/notes/cuda.html) — devices and the default device.
- [RISE for JupyterLab](https://github.com/jupyterlab-contrib/rise) — notebooks as live slides.
"""
