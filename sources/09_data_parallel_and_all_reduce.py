# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 09 · Data parallelism and all-reduce
Data parallelism runs the same model on several devices, each on its own slice of the data, and averages the gradients so that every copy takes the same step. The averaging is a *collective* operation, and how it moves bytes decides how well training scales. This notebook looks briefly at PyTorch's old one-process answer, `nn.DataParallel`, then builds the communication that `DistributedDataParallel` relies on: parameter server versus ring all-reduce, the collectives of `torch.distributed` run for real in several processes, a ring all-reduce written by hand, and a model of its time. Notebook 10 then writes DDP itself on top of it.

By the end you will be able to:
- say what `nn.DataParallel` does in each forward pass (scatter, replicate, parallel apply, gather), why it is slow, what it does on a machine without GPUs, and what becomes of autocast in its threads;
- step through a ring all-reduce and count the bytes each worker sends, against a parameter server;
- use `broadcast`, `reduce`, `all_reduce`, `gather`, `all_gather`, `reduce_scatter`, `all_to_all` and `barrier` in real processes on the gloo backend, and count the bytes each rank sends;
- write a ring all-reduce from point-to-point `isend`/`recv` and check it against `dist.all_reduce`, and see the deadlock that blocking sends cause;
- turn bytes into time: fit the latency-bandwidth (α-β) model to measured gloo messages, predict ring, tree and parameter-server all-reduces and a DDP step's bucketed communication, and compare with measurements.

This notebook assumes: notebook 08 (gradients add up over samples; accumulation), and that you can run a training step. Processes are started with `course_lib.launch.run_ranks`; section 3 says what it does when it is first used (notebook 11 adds `torchrun`).
"""

# %% slideshow={"slide_type": "-"}
import copy
import inspect
import math
import threading
import time
from pathlib import Path
import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch import nn
from course_lib.allreduce_sim import (parameter_server_all_reduce, parameter_server_bytes_formula, render_snapshot,
                                      ring_all_reduce, ring_bytes_formula)
from course_lib.data import digits
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.launch import run_ranks, run_script
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)   # one thread: steadier timings on a shared machine
train, test = digits()
runs = Path("_runs")
runs.mkdir(exist_ok=True)   # scratch folder for the scripts this notebook writes (git ignores it)
for old in ("collectives.py", "ring.py", "deadlock.py", "comm_time.py", "handoff.txt"):
    (runs / old).unlink(missing_ok=True)   # so that %%writefile always says "Writing"
print(f"digits: {len(train)} training images")

def make_mlp() -> nn.Module:
    seed_everything(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. `nn.DataParallel`, briefly: one process, one thread per GPU
`model = nn.DataParallel(model)` is one line, and for years it was the first thing people tried. PyTorch's documentation now recommends `DistributedDataParallel` instead, even on one machine (linked in the references), so this section is short: the four steps, why they are slow, and two facts that still bite. Every forward pass of `DataParallel`:
1. **scatter**: cut the input batch into one chunk per GPU and copy each chunk to its GPU;
2. **replicate**: copy the model (parameters and buffers) from `device_ids[0]` ("GPU 0") to every other GPU;
3. **parallel_apply**: run each replica on its chunk, one Python *thread* per GPU;
4. **gather**: copy the outputs to `output_device` (GPU 0 unless you choose another) and concatenate them.

In backward, the replicas' gradients flow back through the copy of step 2 and are **summed onto GPU 0**, where the one optimizer updates the one real model: `replicate` copies with the autograd function `Broadcast` (`comm.broadcast_coalesced`, NCCL's broadcast when available), and the backward of `Broadcast` sums the gradients with `comm.reduce_add_coalesced`. The installed source says all of this:
"""

# %% slideshow={"slide_type": "fragment"}
from torch.nn.parallel import _functions as parallel_functions, parallel_apply, replicate

src = inspect.getsource(nn.DataParallel.forward)
steps = ["self.scatter(", "self.replicate(", "self.parallel_apply(", "self.gather("]
positions = [src.index(s) for s in steps]
assert positions == sorted(positions), "the four steps appear in this order"
assert "if not self.device_ids:\n                return self.module(*inputs, **kwargs)" in src
print("DataParallel.forward calls, in order:", ", ".join(s.rstrip("(") for s in steps))
assert "_broadcast_coalesced_reshape" in inspect.getsource(replicate)
assert "comm.broadcast_coalesced" in inspect.getsource(parallel_functions.Broadcast.forward)
assert "ReduceAddCoalesced.apply" in inspect.getsource(parallel_functions.Broadcast.backward)
assert "comm.reduce_add_coalesced" in inspect.getsource(parallel_functions.ReduceAddCoalesced.forward)
print("replicate -> Broadcast -> comm.broadcast_coalesced; its backward -> ReduceAddCoalesced -> comm.reduce_add_coalesced")
init_src = inspect.getsource(nn.DataParallel.__init__)
assert "self.src_device_obj = torch.device(device_type, self.device_ids[0])" in init_src
assert "output_device = device_ids[0]" in init_src
print("parameters and summed gradients live on device_ids[0]; output_device (by default the same GPU) receives the outputs")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### On a machine without GPUs, DataParallel is the module itself
With no GPU, `DataParallel` sets `device_ids = []` (even if you pass some) and its forward is a plain call of the wrapped module: one call, on the whole batch, no threads. The only visible change is the `module.` prefix it adds to every key of the `state_dict`, a classic source of "missing keys" errors when a checkpoint saved from a wrapped model is loaded into a bare one.

The demonstration runs as a small **CPU job** (a script started by `course_lib.launch.run_script`, which hides every GPU from the processes it starts), so it shows the no-GPU behaviour on every machine, yours included if it has GPUs: the rule of this course is that CPU jobs stay on the CPU unless asked.
"""

# %% slideshow={"slide_type": "fragment"}
# %%writefile _runs/dp_without_gpus.py
"""DataParallel on a machine without GPUs. Run as a CPU job: course_lib.launch hides any GPU from it."""
import torch
from torch import nn
from course_lib.data import digits
from course_lib.errors import expect_error
from course_lib.seeding import seed_everything

def make_mlp() -> nn.Module:   # the notebook's seeded MLP, again: this script is a process of its own
    seed_everything(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

model, calls = make_mlp(), []
model.register_forward_hook(lambda mod, inputs, output: calls.append(tuple(inputs[0].shape)))
dp = nn.DataParallel(model, device_ids=[0, 1])
x = digits()[0].flat()[:96]
out = dp(x)
assert dp.device_ids == [] and calls == [(96, 64)]  # one call, on the whole batch
torch.testing.assert_close(out, model(x))
print(f"device_ids={dp.device_ids} (asked for [0, 1]); the module ran once, on the whole batch of shape {calls[0]}")
print("state_dict keys:", list(dp.state_dict())[:2], "vs", list(model.state_dict())[:2])
with expect_error(RuntimeError, match="Missing key"):
    make_mlp().load_state_dict(dp.state_dict())
make_mlp().load_state_dict(dp.module.state_dict())  # the fix: save or load the wrapped module's state
print("loading dp.module.state_dict() works")

# %% slideshow={"slide_type": "-"}
model = make_mlp()  # the same seeded MLP, in this kernel, for the rest of the section
loss_fn = nn.CrossEntropyLoss()

# %% slideshow={"slide_type": "-"}
print(run_script(["python", "_runs/dp_without_gpus.py"], timeout=600, echo="none").output("main"))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Why it is slow
- **The GIL.** The replicas run in threads of one Python process, and only one thread runs Python at a time. A replica's forward on a GPU is Python code (module calls, hooks, the forward's own lines) that launches kernels; the kernels then run on the GPU while the thread waits with the GIL released. So the threads overlap their GPUs' work but take turns for the Python work: the more small layers, the less the threads help.
- **A full copy of the model at every step.** Only GPU 0 keeps the real parameters and the optimizer, so step 2 broadcasts the whole model again at every forward.
- **No overlap of the gradient reduction with backward.** The gradients are summed when autograd reaches `Broadcast`'s backward, after the replicas' backward has finished (DDP starts each bucket's all-reduce during backward, notebook 10 §1).
- **GPU 0 does more.** It holds the optimizer state, the gathered outputs and the loss, and receives every gradient: it runs out of memory first, and the other GPUs wait for it.

The cell shows the first point on the CPU with two stand-ins for a replica's forward: pure Python work (a loop of float arithmetic, like the Python lines of a forward, which hold the GIL), and waiting with the GIL released (`time.sleep`, like a thread waiting for its GPU). Two jobs of each kind run one after the other, then in two threads. For the waits, the cell compares the wall-clock times: they overlap. For the Python work it counts how many cores the two threads kept busy (the process's CPU seconds per wall-clock second), a measure that other work on the machine can lower but never raise: the two threads never keep more than one core busy, so they never compute in parallel. (Their wall-clock times are not shown: on a shared machine they say more about the other jobs than about the GIL.) (PyTorch's own operators release the GIL while they run, and so do large matrix products on a CPU; but then two threads also need two free cores, which a shared machine may not give them, so the cell does not time them.) The times after `~` are this machine's; the asserts hold with wide margins on any machine, busy or idle.
"""


# %% slideshow={"slide_type": "fragment"}
def run_in_threads(work, n: int) -> tuple[float, float]:
    """Run ``work`` in ``n`` threads at once: (wall seconds, CPU seconds of this process)."""
    threads = [threading.Thread(target=work) for _ in range(n)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, time.process_time() - cpu0

def run_sequential(work, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        work()
    return time.perf_counter() - t0

def python_bound() -> None:      # pure Python: holds the GIL the whole time, like a forward's Python lines
    x = 0.0
    for i in range(100_000):
        x = x * 0.5 + i

def waits_for_device() -> None:  # a thread waiting for its GPU: the GIL is released while it waits
    for _ in range(5):
        time.sleep(0.01)

speedup, cores, times = {}, {}, {}
for name, work in [("Python-bound work", python_bound), ("waiting, GIL released", waits_for_device)]:
    seq, par = [], []
    for _ in range(5):   # alternate the two, best of 5 each: a burst of other work spoils one round, not one side
        seq.append(run_sequential(work, 2))
        par.append(run_in_threads(work, 2))
    times[name] = (min(seq), min(wall for wall, _ in par))
    speedup[name] = times[name][0] / times[name][1]
    cores[name] = max(cpu / wall for wall, cpu in par)   # CPU seconds per wall second: cores in use at once
assert cores["Python-bound work"] < 1.2        # the GIL: Python threads never compute on two cores at once
assert speedup["waiting, GIL released"] > 1.5  # the waits overlap
print(f"Python-bound work in 2 threads: ~{cores['Python-bound work']:.2f} cores busy at most (asserted below 1.2; "
      "two threads computing in parallel would keep 2 busy)")
one_after_the_other, in_threads = times["waiting, GIL released"]
print(f"waiting in 2 threads: 2 jobs one after the other ~{one_after_the_other * 1e3:.0f} ms, in 2 threads "
      f"~{in_threads * 1e3:.0f} ms, speed-up ~{speedup['waiting, GIL released']:.2f}x (asserted above 1.5x)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### What the source posts said about DataParallel, checked
- *"DataParallel is single-process, multi-threaded, so the GIL limits it"*: **true** (above).
- *"Its parameter update uses a parameter server"*: **essentially true**, with GPU 0 as the server: it broadcasts the weights and receives the summed gradients every step. There is no separate server machine.
- *"It only works on one machine"*: **true**, threads cannot cross machines.
- *"`output_device` is the GPU that sums the gradients, give it the most memory"*: **not quite.** `output_device` is where the outputs are gathered (so where the loss is computed); the parameters live on `device_ids[0]`, and the gradients are summed there (asserted above). By default both are `device_ids[0]`. (The same post's loop reads `images = images.cuda(...)` where the loader yields `data`: a `NameError` as written.)
- *"It does not support mixed precision"*: **half true.** `torch.autocast` around a `DataParallel` call does switch autocast on in the replicas' threads, but only the on/off flag crosses into them: `parallel_apply` reads `torch.is_autocast_enabled()` in the calling thread and enters `torch.amp.autocast(device_type, enabled=...)` in each worker thread, with **no dtype**. Autocast's dtype is per thread, so each worker uses its device's default, `float16` on CUDA: bf16 autocast around `DataParallel` runs the replicas in fp16, with fp16's narrow range (notebook 06 §1). With one GPU, `DataParallel` calls the module in the calling thread and keeps bf16. The fix is the old advice: enter `torch.autocast(..., dtype=...)` inside the model's `forward`, or use DDP. The CPU can show the mechanism, with CPU autocast (its default is bf16, so the caller asks for fp16):
"""

# %% slideshow={"slide_type": "fragment"}
xs, w = train.flat()[:8], torch.randn(64, 64)
seen = {}
with torch.autocast("cpu", dtype=torch.float16):   # not the CPU's default dtype (bfloat16)
    seen["calling thread"] = (torch.is_autocast_enabled("cpu"), (xs @ w).dtype)
    flag = torch.is_autocast_enabled("cpu")          # what parallel_apply carries over: the flag alone

    def replica() -> None:                           # parallel_apply's worker: autocast on, no dtype given
        with torch.amp.autocast("cpu", enabled=flag):
            seen["worker thread"] = (torch.is_autocast_enabled("cpu"), (xs @ w).dtype)
    run_in_threads(replica, 1)                       # one worker thread, started and joined
for where, (enabled, dtype) in seen.items():
    print(f"{where:<15} autocast enabled: {enabled}, a matmul computes in {dtype}")
assert seen == {"calling thread": (True, torch.float16), "worker thread": (True, torch.bfloat16)}
pa_src = inspect.getsource(parallel_apply)
assert "torch.is_autocast_enabled()," in pa_src and "torch.amp.autocast(device_type, enabled=autocast_enabled)" in pa_src
assert "autocast_dtype" not in pa_src and "dtype=" not in pa_src
assert "if len(self.device_ids) == 1:\n                return self.module(" in src   # one GPU: no threads
print("parallel_apply carries autocast's on/off flag into its threads, not its dtype")
print(f"a thread's default autocast dtype: cuda {torch.get_autocast_dtype('cuda')}, cpu {torch.get_autocast_dtype('cpu')}"
      " -> bf16 autocast around DataParallel on 2+ GPUs computes in float16")

# %% slideshow={"slide_type": "subslide"}
if requires_gpu("nn.DataParallel on 2 GPUs: same gradients as one GPU, its step time, fp16 replicas under bf16 autocast", count=2):
    net = make_mlp().cuda()
    dp_net = nn.DataParallel(copy.deepcopy(net))
    xb, yb = train.flat()[:1024].cuda(), train.y[:1024].cuda()
    loss_fn(net(xb), yb).backward()
    loss_fn(dp_net(xb), yb).backward()
    for p, q in zip(net.parameters(), dp_net.module.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    for name, m in [("1 GPU", net), ("DataParallel", dp_net)]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            loss_fn(m(xb), yb).backward()
        torch.cuda.synchronize()
        print(f"{name:<13} ~{(time.perf_counter() - t0) / 20 * 1e3:.2f} ms per forward+backward")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        alone, through_dp = net(xb).dtype, dp_net(xb).dtype
    print(f"bf16 autocast: the model alone computes in {alone}; through DataParallel on "
          f"{len(dp_net.device_ids)} GPUs, in {through_dp}")
    assert alone == torch.bfloat16   # and in the replicas' threads the default dtype, fp16 (one device: no threads)
    assert through_dp == (torch.float16 if len(dp_net.device_ids) > 1 else torch.bfloat16)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Averaging gradients: parameter server versus ring all-reduce
Each of `N` workers has computed a gradient of `S` bytes on its own data. All of them need the average. Two ways:
- **Parameter server**: every worker sends its gradient to a server, the server sums, and sends the result back to every worker. Each worker sends `S` and receives `S`, but the server receives `N·S` and sends `N·S`: its link is the bottleneck and it grows with `N`.
- **Ring all-reduce**: workers form a ring; each gradient is cut into `N` chunks. In `N-1` **scatter-reduce** steps every worker passes one chunk to its right neighbour, which adds it to its own copy; afterwards each worker holds one chunk summed over everyone. In `N-1` **all-gather** steps the summed chunks travel around the ring. Each worker sends `2(N-1)` chunks of `S/N`: **`2(N-1)/N · S`**, less than `2S` whatever `N` is.

Here is a ring simulated in one process, written out in full. Messages of one step are sent at the same time, so each step first collects what everyone sends, then delivers it.
"""


# %% slideshow={"slide_type": "-"}
def ring_sim(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    n = len(grads)
    chunks = [list(g.clone().tensor_split(n)) for g in grads]   # chunks[worker][c]: views into that worker's copy
    sent = [0] * n
    for phase in ("scatter-reduce", "all-gather"):
        for s in range(n - 1):
            messages = []
            for i in range(n):
                c = (i - s) % n if phase == "scatter-reduce" else (i + 1 - s) % n
                messages.append(((i + 1) % n, c, chunks[i][c].clone()))
                sent[i] += chunks[i][c].numel() * chunks[i][c].element_size()
            for dst, c, payload in messages:
                if phase == "scatter-reduce":
                    chunks[dst][c] += payload      # add to my partial sum
                else:
                    chunks[dst][c].copy_(payload)  # overwrite with the finished sum
    return [torch.cat(c) for c in chunks], sent

def parameter_server_sim(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int], int]:
    total = torch.stack(grads).sum(0)                           # the server receives N gradients and sums
    s = grads[0].numel() * grads[0].element_size()
    return [total.clone() for _ in grads], [s] * len(grads), len(grads) * s   # and sends N copies back

grads = [torch.randn(10, generator=torch.Generator().manual_seed(w)) for w in range(4)]
ring_out, ring_sent = ring_sim(grads)
ps_out, ps_sent, server_sent = parameter_server_sim(grads)
expected = torch.stack(grads).sum(0)
for out in [*ring_out, *ps_out]:
    torch.testing.assert_close(out, expected)
lib = ring_all_reduce(grads)                      # course_lib's version, used from here on
assert lib.sent_bytes == ring_sent and all(torch.allclose(a, b) for a, b in zip(lib.outputs, ring_out))
print(f"4 workers, 10 floats (40 bytes) each: ring sends {ring_sent} bytes per worker "
      f"(chunks of 3,3,2,2 floats; formula 2(N-1)/N*S = {ring_bytes_formula(40, 4):.0f});")
print(f"parameter server: each worker sends {ps_sent[0]}, the server sends {server_sent}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Step through it
Move the slider to walk through the 6 steps of a ring of 4 workers. Each cell says whose gradients that worker's copy of that chunk holds summed; `*` marks a chunk summed over all 4. After step 3 (the end of scatter-reduce) each worker owns one complete chunk; the all-gather then copies them around. (Below the slider, the same steps as static text.)
"""

# %% slideshow={"slide_type": "fragment"}
demo = ring_all_reduce([torch.ones(8) for _ in range(4)])
slider = widgets.IntSlider(value=0, min=0, max=len(demo.snapshots) - 1, description="step")
view = widgets.HTML()

def show_step(change=None) -> None:
    view.value = f"<pre>{render_snapshot(demo.snapshots[slider.value])}</pre>"

slider.observe(show_step, names="value")
show_step()
display(widgets.VBox([slider, view]))
for snap in demo.snapshots:
    print(render_snapshot(snap), end="\n\n")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Bytes against the number of workers
Measured with the simulation (a gradient whose size every `N` divides, so chunks are equal) and drawn next to the formulas. The ring's per-worker traffic approaches `2S` and stays there; the server's grows linearly.
"""

# %% slideshow={"slide_type": "fragment"}
ns = [2, 3, 4, 6, 8, 12, 16]
S = 4 * 480                      # 480 float32 numbers: divisible by every N above
rows = []
for n in ns:
    g = [torch.ones(480) for _ in range(n)]
    r, p = ring_all_reduce(g), parameter_server_all_reduce(g)
    assert r.sent_bytes == [ring_bytes_formula(S, n)] * n
    assert p.server_sent_bytes == p.server_received_bytes == parameter_server_bytes_formula(S, n)["server"]
    rows.append((n, r.sent_bytes[0] / S, p.sent_bytes[0] / S, p.server_sent_bytes / S, r.steps))
print(" N | ring, per worker | PS, per worker | PS, server | ring steps")
for n, ring_w, ps_w, ps_s, steps in rows:
    print(f"{n:>2} | {ring_w:>13.3f} S | {ps_w:>12.3f} S | {ps_s:>8.0f} S | {steps:>4}")

fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="tight")
grid = torch.linspace(2, 16, 100)
ax.plot(grid, 2 * (grid - 1) / grid, "-", color="tab:blue", alpha=0.5, label="ring formula 2(N-1)/N")
ax.plot(ns, [r[1] for r in rows], "o", color="tab:blue", label="ring, measured per worker")
ax.plot(grid, grid, "-", color="tab:red", alpha=0.5, label="server formula N")
ax.plot(ns, [r[3] for r in rows], "s", color="tab:red", label="parameter server, measured at the server")
ax.plot(ns, [r[2] for r in rows], "^", color="grey", label="parameter server, measured per worker")
ax.set(xlabel="number of workers N  (S = the gradient size in bytes)", ylabel="bytes sent per all-reduce (x S)",
       title="Who sends how much: ring all-reduce vs parameter server")
ax.legend(fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Bytes are not the whole story. The ring needs `2(N-1)` steps one after the other, and each step pays the network's latency, so for small messages or very many workers it loses to tree-shaped algorithms. NCCL picks ring or tree per message size; gloo has several all-reduce algorithms too. "DDP uses ring all-reduce", as the source post says, is a good mental model, not a precise description: DDP calls the backend's `all_reduce`, and the backend chooses.

### "Effective batch size": what the Tensor post mixed up
The Tensor post says that with a parameter server "the effective batch size is the batch size" but with ring all-reduce "the effective batch is batch × 5" (for 5 GPUs). The communication algorithm has nothing to do with it: both compute the same average of the same gradients. What differs is the API convention: `DataParallel` splits **one** batch across the GPUs (global batch = the batch you pass), while with `DistributedDataParallel` each process loads **its own** batch (global batch = per-process batch × N). Below, 4 workers with 32 digits each: ring and parameter server give the same averaged gradient, and it equals the gradient of one batch of 128.
"""


# %% slideshow={"slide_type": "fragment"}
def flat_grad(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    loss_fn(model(xs), ys).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

net = make_mlp()
xs, ys = train.flat()[:128], train.y[:128]
per_worker = [flat_grad(net, xc, yc) for xc, yc in zip(xs.chunk(4), ys.chunk(4))]   # 4 workers x 32 samples
ring_avg = ring_all_reduce(per_worker, op="mean").outputs[0]
ps_avg = parameter_server_all_reduce(per_worker, op="mean").outputs[0]
torch.testing.assert_close(ring_avg, ps_avg)
torch.testing.assert_close(ring_avg, flat_grad(net, xs, ys))
print(f"{per_worker[0].numel()} gradient numbers: ring average == parameter-server average == gradient of the batch of 128")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. The collectives, for real: several processes on gloo
`torch.distributed` gives each process a **rank** in a **world** of `world_size` processes, connected by a backend: `gloo` on CPUs (and GPUs), `nccl` between NVIDIA GPUs, `mpi` where PyTorch was built with it. Every process must call the same collectives in the same order; a call returns when this rank's part is done, which usually means waiting for the others.

A function defined in a notebook cell cannot run in a freshly started process (the new process cannot import the notebook), so the worker code is written to a file with `%%writefile`, into `_runs/` (git ignores it), and launched with `course_lib.launch.run_ranks`. What it does, since the rest of the course relies on it:
- `run_ranks("file.py:fn", nprocs=N, args=...)` starts `N` new processes (on Linux, forks of a helper process that has imported PyTorch once, the idea of Python's `forkserver` start method; elsewhere, or with `COURSE_LIB_FORKSERVER=0`, fresh interpreters). A fresh interpreter first imports torch, and DDP's constructor imports `torch._dynamo` too: seconds of CPU time per process before any work, which a fork of a process that has already imported them does not pay. Each one gets the environment variables that `torch.distributed`'s `env://` initialization reads (`MASTER_ADDR=127.0.0.1`, `MASTER_PORT` set to a port that was free a moment ago, `RANK`, `WORLD_SIZE`), calls `dist.init_process_group("gloo")`, imports `file.py` and calls `fn(rank, world_size, *args)`; then it tears the group down (`barrier`, `destroy_process_group`) and sends `fn`'s return value back (pickled). `run_ranks` returns the list of values in rank order. (It is not `torch.multiprocessing.spawn`, which calls `fn(i, *args)`, leaves the process group to `fn` and returns nothing: notebook 11 uses that one.)
- The processes see **no GPU** (`CUDA_VISIBLE_DEVICES=""`): these are CPU jobs, and on a machine with GPUs they stay CPU jobs and print what you see here. `device="cuda"` is the opt-in: one GPU per rank, bound before `fn` runs.
- While they run, it shows each rank's printed lines (grouped by rank in a notebook, so the output does not depend on which process printed first).
- It never leaves a process behind: after `timeout` seconds, or as soon as one rank fails, it kills every process it started and raises `LaunchError`, naming the rank that failed and quoting its traceback, or, on a timeout, each rank's last printed line. Section 4 uses that to show a deadlock without hanging the notebook.

Notebook 11 runs the same kind of worker under `torchrun`, PyTorch's own launcher.
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The collectives the worker below runs, one call each, on `N` ranks. `S` is the bytes of the tensor each rank starts with; the last column is what each rank sends with the bandwidth-optimal algorithms (the ring of section 2 and its relatives), the figure that decides their time on large tensors:

| collective | each rank starts with | afterwards | bytes each rank sends |
|---|---|---|---|
| `broadcast(t, src)` | `t` (only `src`'s matters) | `src`'s `t` on every rank | at most `S` (a pipelined chain) |
| `reduce(t, dst)` | `t` | the sum on `dst` only | at most `S` |
| `all_reduce(t)` | `t` | the sum on every rank | `2(N-1)/N · S` (section 2) |
| `gather(t, list, dst)` | `t` | `dst` holds every rank's `t` | `S` (to `dst`) |
| `all_gather(list, t)` | `t` | every rank holds every rank's `t` | `(N-1) · S` |
| `reduce_scatter(out, list)` | `N` pieces of `S/N` | rank `i` holds the sum of every rank's piece `i` | `(N-1)/N · S` |
| `all_to_all_single(out, t)` | `N` pieces of `S/N`, piece `j` meant for rank `j` | rank `i` holds piece `i` of every rank, in rank order | `(N-1)/N · S` |
| `barrier()` | nothing | every rank has arrived | no payload |

`all_to_all` is the one that moves different data to each rank: a transpose of the ranks' pieces. Expert parallelism (a mixture-of-experts layer with its experts spread over ranks) uses it twice per layer, to send each token to the rank holding its expert and to bring the results back.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/collectives.py
"""Each collective of torch.distributed once, on tensors whose values say where they came from."""
import time
from pathlib import Path
import torch
import torch.distributed as dist

def show(name: str, t) -> list:
    values = [round(v, 2) for v in t.tolist()] if isinstance(t, torch.Tensor) else t
    print(f"{name:<15} {values}")
    return values

def demo(rank: int, world_size: int) -> dict:
    out = {}
    # broadcast: rank 0's tensor overwrites everyone's
    t = torch.tensor([42.0, 43.0]) if rank == 0 else torch.zeros(2)
    dist.broadcast(t, src=0)
    out["broadcast"] = show("broadcast", t)
    # reduce: the sum arrives on dst only (other ranks' tensors are left unspecified)
    t = torch.tensor([float(rank + 1)])
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    out["reduce"] = show("reduce", t if rank == 0 else "(not the destination)")
    # all_reduce: everyone gets the sum; ReduceOp.AVG gives the mean (gloo supports it)
    for name, op in [("all_reduce", dist.ReduceOp.SUM), ("all_reduce avg", dist.ReduceOp.AVG)]:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, op=op)
        out[name] = show(name, t)
    # gather: rank 0 receives one tensor from each rank
    bucket = [torch.zeros(1) for _ in range(world_size)] if rank == 0 else None
    dist.gather(torch.tensor([float(10 * rank)]), bucket, dst=0)
    out["gather"] = show("gather", torch.cat(bucket) if rank == 0 else "(not the destination)")
    # all_gather: everyone receives everyone's tensor
    bucket = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(bucket, torch.tensor([float(10 * rank)]))
    out["all_gather"] = show("all_gather", torch.cat(bucket))
    # reduce_scatter: rank r contributes inputs[i] = 10*r + i for every i; rank i gets the sum of the i-th ones
    inputs, t = [torch.tensor([float(10 * rank + i)]) for i in range(world_size)], torch.zeros(1)
    dist.reduce_scatter(t, inputs, op=dist.ReduceOp.SUM)
    out["reduce_scatter"] = show("reduce_scatter", t)
    # all_to_all: rank r's piece j (10*r + j) goes to rank j; rank j receives piece j of every rank
    received = torch.empty(world_size)
    dist.all_to_all_single(received, torch.tensor([float(10 * rank + j) for j in range(world_size)]))
    out["all_to_all"] = show("all_to_all", received)
    # reduce_scatter, then all_gather of the shards, is an all_reduce of the whole vector
    shards, whole = [torch.zeros(1) for _ in range(world_size)], torch.cat(inputs)
    dist.all_gather(shards, t)
    dist.all_reduce(whole)
    out["rs+ag == all_reduce"] = show("rs+ag == ar", [bool(torch.equal(torch.cat(shards), whole))])
    # barrier: nobody passes until everyone has arrived. Rank 1 writes a file late; rank 0 reads it after the barrier
    handoff = Path(__file__).with_name("handoff.txt")
    if rank == 1:
        time.sleep(0.5)
        handoff.write_text("written by rank 1 before the barrier")
    dist.barrier()
    out["barrier"] = show("barrier", handoff.read_text())
    return out


# %% slideshow={"slide_type": "fragment"}
results = run_ranks("_runs/collectives.py:demo", nprocs=3, timeout=600, echo="grouped")

# %% slideshow={"slide_type": "subslide"}
N = 3   # what each rank printed is what the collectives promise; the returned values, checked:
for rank, r in enumerate(results):
    assert r["broadcast"] == [42.0, 43.0]
    assert r["all_reduce"] == [N * (N + 1) / 2] and r["all_reduce avg"] == [(N + 1) / 2]
    assert r["all_gather"] == [10.0 * q for q in range(N)]
    assert r["reduce_scatter"] == [sum(10 * q + rank for q in range(N))]
    assert r["all_to_all"] == [10.0 * q + rank for q in range(N)]   # piece `rank` of every rank q
    assert r["rs+ag == all_reduce"] == [True]
    assert r["barrier"] == "written by rank 1 before the barrier"
assert results[0]["reduce"] == [N * (N + 1) / 2] and results[0]["gather"] == [10.0 * q for q in range(N)]
print(f"all {N} ranks agree with the definitions; reduce_scatter gave {[r['reduce_scatter'][0] for r in results]}")
print(f"all_to_all: each rank kept 1 of its {N} pieces and sent {N - 1}, (N-1)/N of its {4 * N} bytes: "
      f"{4 * (N - 1)} bytes")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Notes on the current API, checked on PyTorch 2.13:
- gloo supports `reduce_scatter` and `ReduceOp.AVG`. Older PyTorch raised `RuntimeError: ProcessGroupGloo does not support reduce_scatter`; support came in 2025 (pytorch/pytorch#149869) as a simple implementation, one all-reduce per rank, so on gloo it is there for correctness and testing, not speed.
- The variants that work on one flat buffer instead of a list of tensors, `dist.reduce_scatter_tensor` and `dist.all_gather_into_tensor`, are what sharded training uses on GPUs, and most current tutorials show them; in 2.13 both are marked deprecated (a `FutureWarning`) in favour of `dist.reduce_scatter_single` and `dist.all_gather_single` (checked in the cell after this list).
- `reduce_scatter` followed by `all_gather` **is** an all-reduce (checked above on every rank): that is exactly the ring's two phases, and what sharded training (ZeRO, FSDP; notebook 14) splits apart to keep only a shard of the gradients and optimizer state per rank.
"""

# %% slideshow={"slide_type": "fragment"}
for old, new in [("reduce_scatter_tensor", "reduce_scatter_single"), ("all_gather_into_tensor", "all_gather_single")]:
    note = getattr(getattr(dist, old), "__deprecated__", None)
    assert note is not None and new in note and callable(getattr(dist, new))
    print(note)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. A ring all-reduce from point-to-point messages
`dist.isend`/`dist.irecv` (non-blocking) and `dist.send`/`dist.recv` (blocking) move one tensor between two ranks. With them, the ring of section 2 becomes real code, one process per worker: each step, send one chunk to the right and receive one from the left.

The send must not block before the receive is posted. On gloo a blocking `send` returns only once the neighbour has posted the matching receive, so if every rank calls `send` first, each waits for its neighbour, in a cycle: a deadlock, even for a 10-float tensor. Below, 2 ranks each `send` 10 floats to the other before receiving. Nothing would ever return. `run_ranks`'s own timeout would end it, but that clock starts with the processes (a few seconds of `import torch` on a busy machine); instead the sends run in a process group created with a 2-second timeout (`dist.new_group(timeout=...)`), so gloo itself gives up inside `send`, and `run_ranks` reports the failed rank with its traceback. (Some MPI libraries buffer small messages, which is why such code can seem to work elsewhere.)
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/deadlock.py
"""Both ranks send first: each send waits for a receive that the other rank never reaches."""
from datetime import timedelta
import torch
import torch.distributed as dist

def send_first(rank: int, world_size: int) -> str:
    group = dist.new_group(timeout=timedelta(seconds=2))   # its operations give up after 2 s
    other, t = 1 - rank, torch.full((10,), float(rank))
    dist.send(t, dst=other, group=group)         # waits until rank `other` posts its recv: never
    dist.recv(t, src=other, group=group)
    return "finished"


# %% slideshow={"slide_type": "fragment"}
from course_lib.launch import LaunchError

with expect_error(LaunchError, match="Timed out waiting 2000ms for send operation", quiet=True) as caught:
    run_ranks("_runs/deadlock.py:send_first", nprocs=2, timeout=600, echo="none")
lines = str(caught.error).splitlines()
assert "in send_first" in str(caught.error) and "dist.send(t, dst=other, group=group)" in str(caught.error)
print("LaunchError: a rank failed inside dist.send(t, dst=other, group=group) with")
print("  RuntimeError: ..." + lines[-1].split("]")[-1])
print("both ranks were waiting in send(): a deadlock. The fix: isend, then recv, then wait.")

# %% slideshow={"slide_type": "fragment"}
# %%writefile _runs/ring.py
"""Ring all-reduce (sum) with point-to-point messages, checked against dist.all_reduce and course_lib's copy.
isend returns at once: each step isends to the right neighbour, recvs from the left, then waits for its send."""
import torch
import torch.distributed as dist
from course_lib.collectives import ring_all_reduce as library_ring

def ring_all_reduce(t: torch.Tensor) -> int:
    """Sum ``t`` over all ranks, in place. Returns the number of bytes this rank sent."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = t.view(-1).tensor_split(n)          # views: writing a chunk writes t
    sent = 0
    for step in range(n - 1):                    # scatter-reduce
        send_c, recv_c = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        request = dist.isend(chunks[send_c], dst=right)
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_c].add_(incoming)
        sent += chunks[send_c].numel() * t.element_size()
    for step in range(n - 1):                    # all-gather
        send_c, recv_c = (rank + 1 - step) % n, (rank - step) % n
        request = dist.isend(chunks[send_c], dst=right)
        dist.recv(chunks[recv_c], src=left)      # receive straight into place
        request.wait()
        sent += chunks[send_c].numel() * t.element_size()
    return sent

def check(rank: int, world_size: int, sizes: list) -> list:
    rows = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))
        mine, reference, twin = x.clone(), x.clone(), x.clone()
        sent = ring_all_reduce(mine)
        dist.all_reduce(reference)
        ints = torch.arange(numel, dtype=torch.float32) * (rank + 1)   # integers: exact in any order
        ints_ref = ints.clone()
        ring_all_reduce(ints)
        dist.all_reduce(ints_ref)
        same_as_library = library_ring(twin) == sent and torch.equal(twin, mine)
        close = torch.allclose(mine, reference, rtol=1e-5, atol=1e-6)
        exact = torch.equal(ints, ints_ref)
        print(f"{numel:>6} floats: sent {sent:>6} bytes; allclose to dist.all_reduce: {close}; integer data identical: {exact}")
        rows.append({"numel": numel, "sent": sent, "close": close, "exact": exact, "library": same_as_library})
    return rows


# %% slideshow={"slide_type": "fragment"}
sizes = [3, 10, 1000, 65536]
ring_results = run_ranks("_runs/ring.py:check", nprocs=3, args=(sizes,), timeout=600, echo="grouped")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every rank's result matches `dist.all_reduce`. The bytes each rank sent are exactly those of the single-process simulation of section 2 (uneven chunks included: 10 floats over 3 ranks are chunks of 4, 3 and 3), and they match the formula `2(N-1)/N · S` when `N` divides the size.

The library's version of this ring, `course_lib.collectives.ring_all_reduce`, which section 5 times against `dist.all_reduce`, gives the same sums and sends the same bytes: the worker above ran both on every rank, and the cell below asserts it. How fast is it? Section 5 answers with a model of time per message, fitted to measurements; the byte counts are exact, while times on a machine whose processes share the cores say as much about the machine as about the algorithms.
"""

# %% slideshow={"slide_type": "fragment"}
n = 3
for rank, rows in enumerate(ring_results):
    for row in rows:
        assert row["close"] and row["exact"] and row["library"]  # and course_lib's twin: same sums, same bytes
        assert row["sent"] == ring_all_reduce([torch.zeros(row["numel"]) for _ in range(n)]).sent_bytes[rank]
for row in ring_results[0]:
    s = row["numel"] * 4
    print(f"{row['numel']:>6} floats (S = {s:>6} B): rank 0 sent {row['sent']:>6} B, formula 2(N-1)/N*S = {ring_bytes_formula(s, n):>9.1f} B")

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 5. From bytes to time: the α-β model
Sections 2 and 4 counted bytes. Time needs one more idea: a message of `m` bytes takes

$$T(m) = \alpha + \frac{m}{\beta}$$

where `α` (alpha, seconds) is the fixed cost of any message (software, system calls, the wire's latency) and `β` (beta, bytes per second) the bandwidth. A collective is a sequence of **steps**, each waiting for the one before, so its time is the sum of its steps' times. For an all-reduce of `S` bytes over `N` ranks:

| algorithm | steps on the critical path | time |
|---|---|---|
| ring | `2(N-1)` messages of `S/N` | `2(N-1)·α + 2(N-1)/N · S/β` |
| binomial tree, unpipelined (reduce onto rank 0, then broadcast back, whole tensors) | `2⌈log2 N⌉` messages of `S` | `2⌈log2 N⌉ · (α + S/β)` |
| parameter server (rank 0 serves, one link) | `2(N-1)` messages of `S` | `2(N-1) · (α + S/β)` |

The ring's bandwidth term hardly grows with `N`, but its latency term grows linearly; this tree pays only `log2 N` latencies but sends the whole `S` at every step. So small messages favour trees and large ones rings, which is why NCCL chooses per message size.

These rows are textbook models, simple enough to fit and check here, not what NCCL runs. NCCL's tree is a *double binary tree* whose tensors are cut into chunks and pipelined, so its bandwidth term comes close to the ring's while its latency still grows with `log2 N` (NVIDIA's NCCL 2.4 announcement, in the references); on recent systems NCCL can also reduce inside the NVLink switch (NVLS, NVLink SHARP) or in InfiniBand switches (CollNet, SHARP), and it picks among its algorithms by size and topology (`NCCL_ALGO` in NCCL's documentation). For large tensors the unpipelined tree above is therefore far too pessimistic about trees.

One assumption hides in the ring's row: in each step every rank sends to its right **and** receives from its left at the same time. On a full-duplex link (NVLink, InfiniBand, Ethernet) the two directions are independent and the step costs one message. Between processes on one machine, the "link" is the CPU copying bytes through the kernel, and sending and receiving share it. So we measure that kind of step too: an **exchange**, both ranks sending and receiving at once.

`course_lib.comm_model` holds the same table (`all_reduce_steps`, `predict_all_reduce`); the cell checks it against the formulas above, on a made-up link of 30 µs and 3 GB/s:
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.comm_model import AlphaBeta, all_reduce_steps, fit_alpha_beta, predict_all_reduce, predict_buckets

S, link = 4 * 2**20, AlphaBeta(alpha=30e-6, beta=3e9)
print(f"a made-up link: alpha = {link.alpha * 1e6:.0f} µs, beta = {link.beta / 1e9:.0f} GB/s")
for n in (2, 3, 4, 8, 16):
    by_hand = {"ring": 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * S / link.beta,
               "tree": 2 * math.ceil(math.log2(n)) * (link.alpha + S / link.beta),
               "parameter_server": 2 * (n - 1) * (link.alpha + S / link.beta)}
    for algorithm, seconds in by_hand.items():
        assert math.isclose(seconds, predict_all_reduce(link, S, n, algorithm))
    steps = {a: len(all_reduce_steps(S, n, a)) for a in by_hand}
    print(f"N={n:>2}: steps {steps}; 4 MiB takes " + ", ".join(f"{a} {t * 1e3:.2f} ms" for a, t in by_hand.items()))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### One launch measures everything
The worker below times, for message sizes from 4 bytes to 4 MiB: one message (half of a ping-pong between ranks 0 and 1), one exchange, `dist.all_reduce`, course_lib's copy of section 4's ring, and a parameter server (`course_lib.collectives` has it, written with `send`/`recv`). It also all-reduces, one after the other, the buckets DDP would make for a 2.1 M-parameter MLP. DDP's rule, which notebook 10 §1 builds by hand: the gradients in reverse order of the parameters, whole tensors, a bucket closed as soon as it holds at least its cap; with the default `bucket_cap_mb=25` (MiB) the cap is 1 MiB for the first bucket and 25 MiB for the others, while a `bucket_cap_mb` you pass caps every bucket. (That is DDP's steady state: its very first step puts every gradient in one bucket and then rebuilds the buckets in the order the gradients arrived, notebook 12 §3.2.)

Each time is the fastest single call over 5 rounds of all sizes (after a warm-up round), with up to 20 calls per size and round: a call that had to wait for a core, because other work holds the machine, only takes longer, so the quickest call is what the link and the software cost. We use 2 ranks, no more than a 2-core laptop has cores: with more processes than cores a message also waits for its receiver to be scheduled, so `α` would measure the operating system's scheduler. With 2 ranks the tree and the parameter server are the same algorithm (one message to rank 0, one back), so only the second is measured.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/comm_time.py
"""Times of messages and all-reduces on gloo, for the alpha-beta model: every size, in one launch."""
import time
import torch
import torch.distributed as dist
from course_lib.collectives import parameter_server_all_reduce, ring_all_reduce

def message(t: torch.Tensor) -> None:     # a ping-pong: rank 0 -> rank 1, then back (two messages)
    if dist.get_rank() == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=1)
    else:
        dist.recv(t, src=0)
        dist.send(t, dst=0)

def exchange(t: torch.Tensor) -> None:    # both ranks send and receive at once (a ring's step)
    other = 1 - dist.get_rank()
    incoming = torch.empty_like(t)
    request = dist.isend(t, dst=other)
    dist.recv(incoming, src=other)
    request.wait()

OPS = {"message": message, "exchange": exchange, "gloo all_reduce": dist.all_reduce,
       "ring": ring_all_reduce, "parameter server": parameter_server_all_reduce}

def seconds_per_call(fn, reps: int) -> float:
    """The quickest of `reps` calls: waiting for a core can only make a call take longer."""
    dist.barrier()                            # start together
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

def measure(rank: int, world_size: int, sizes: list, buckets: list, rounds: int) -> dict:
    torch.set_num_threads(1)
    best = {**{name: [float("inf")] * len(sizes) for name in OPS}, "buckets": [float("inf")]}
    grads = [torch.ones(b // 4) for b in buckets]
    for r in range(rounds + 1):               # round 0 warms up (connections, allocations): not kept
        for i, nbytes in enumerate(sizes):
            t = torch.ones(nbytes // 4)
            reps = max(1, min(20, 2**16 // nbytes))   # small messages: many calls per timing
            for name, fn in OPS.items():
                seconds = seconds_per_call(lambda: fn(t), reps)
                best[name][i] = min(best[name][i], seconds) if r else best[name][i]
        for _ in range(3):                    # DDP's buckets, all-reduced one after the other
            seconds = seconds_per_call(lambda: [dist.all_reduce(g) for g in grads], 1)
            best["buckets"][0] = min(best["buckets"][0], seconds) if r else best["buckets"][0]
    best["message"] = [s / 2 for s in best["message"]]   # one message = half a ping-pong
    return best


# %% slideshow={"slide_type": "fragment"}
def ddp_bucket_bytes(model: nn.Module, first: int = 2**20, cap: int = 25 * 2**20) -> list[int]:
    """DDP's bucketing, simplified: gradients in reverse order, a bucket closes once it reaches its cap."""
    buckets, current = [], 0
    for p in reversed(list(model.parameters())):
        current += p.numel() * p.element_size()
        if current >= (first if not buckets else cap):
            buckets, current = [*buckets, current], 0
    return buckets + [current] if current else buckets

seed_everything(0)
ddp_model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
buckets = ddp_bucket_bytes(ddp_model)
sizes = [4 * 4**i for i in range(11)]             # 4 B, 16 B, ..., 4 MiB
comm = run_ranks("_runs/comm_time.py:measure", nprocs=2, args=(sizes, buckets, 5), timeout=600, echo="none")[0]
print(f"{sum(p.numel() for p in ddp_model.parameters()):,} parameters -> DDP buckets of {buckets} bytes")
print(f"measured {len(sizes)} sizes x {len(comm) - 1} operations, and the {len(buckets)} buckets")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Fitting α and β
Times span four orders of magnitude, so a plain least-squares fit would only care about the largest messages. We minimize the *relative* error instead: divide each equation `α + m/β = t` by `t`. It stays linear in the unknowns `α` and `1/β`, so `torch.linalg.lstsq` solves it. `course_lib.comm_model.fit_alpha_beta` does the same (with the two normal equations), and the cell checks that the two agree.
"""


# %% slideshow={"slide_type": "fragment"}
def fit(m: list[int], t: list[float]) -> tuple[float, float]:
    t_ = torch.tensor(t, dtype=torch.float64)
    A = torch.stack([1 / t_, torch.tensor(m, dtype=torch.float64) / t_], dim=1)   # rows (1/t, m/t)
    alpha, inv_beta = torch.linalg.lstsq(A, torch.ones_like(t_)).solution.tolist()
    return alpha, 1 / inv_beta

links = {}
for kind in ("message", "exchange"):
    alpha, beta = fit(sizes, comm[kind])
    links[kind] = fit_alpha_beta(sizes, comm[kind])
    assert abs(alpha / links[kind].alpha - 1) < 1e-6 and abs(beta / links[kind].beta - 1) < 1e-6
    median_error = sorted(abs(links[kind].time(m) / t - 1) for m, t in zip(sizes, comm[kind]))[len(sizes) // 2]
    assert 1e-6 < alpha < 1e-3 and 5e7 < beta < 1e11      # microseconds, and 0.05 to 100 GB/s
    assert median_error < 0.5                              # the line fits most sizes
    print(f"{kind:<8}: alpha ~{alpha * 1e6:.0f} us, beta ~{beta / 1e9:.2f} GB/s; "
          f"median relative error of the fit ~{median_error:.0%}")
message, exchange = links["message"], links["exchange"]
print("(the fit by hand equals course_lib.comm_model.fit_alpha_beta)")
ratio = comm["exchange"][-1] / comm["message"][-1]
assert ratio > 0.8               # sending and receiving at once is never much cheaper than one message
print(f"an exchange of {sizes[-1] // 2**20} MiB costs ~{ratio:.1f}x one message here (1x on a full-duplex link)")
alpha_us, beta_gbs = round(message.alpha * 1e6), round(message.beta / 1e9, 2)   # as printed above
crossover_kib = alpha_us * 1e-6 * beta_gbs * 1e9 / 1024
print(f"message: the two regimes meet where m = alpha * beta ~{crossover_kib:.0f} KiB (the rounded values above, "
      "multiplied): below it a message costs its latency, above it its bytes")

fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="tight")   # the numbers are printed above; the plot adds no new ones
grid = [4 * 2**i for i in range(21)]
for kind, marker, color in [("message", "o", "tab:blue"), ("exchange", "s", "tab:orange")]:
    ax.plot(sizes, [t * 1e6 for t in comm[kind]], marker, color=color, label=f"{kind}, measured")
    ax.plot(grid, [links[kind].time(m) * 1e6 for m in grid], "-", color=color, alpha=0.6,
            label=f"{kind}: α + m/β fitted")
ax.set_xscale("log", base=2)
ax.set(yscale="log", xlabel="message size m (bytes)", ylabel="time (µs)",
       title="gloo between 2 processes on this machine: latency, then bandwidth")
ax.legend(fontsize=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Small messages cost about `α` whatever their size; above `α·β` bytes (printed above the plot: where the blue line bends) the bytes dominate. An exchange (both directions at once) costs the printed ratio times one message: the bytes of both directions go through the same CPU cores, and a machine with more cores can move them in parallel, so your ratio may be lower (the cell asserts only that it is not far below 1). On a full-duplex network it would cost the same as one message. So the ring's steps are predicted with the exchange fit, the parameter server's with the message fit.

### Predicted against measured
The predictions use only the two fitted lines and the table of steps. Your measured times (after `~`) depend on the machine and on what else it runs; the cell asserts a generous relation: for each algorithm, the measured time is within a factor of 8 of the prediction on average over the sizes (geometric mean), and likewise for DDP's buckets. The margin is for busy machines: there a process also waits for a core to be free, at every message, and gloo's own `all_reduce`, which hands each call to a worker thread, suffers most. The factors are printed after `~`: on a machine shared with many other jobs they are large, and on an idle machine you can expect them closer to 1.
"""

# %% slideshow={"slide_type": "fragment"}
predicted = {"ring": [predict_all_reduce(message, m, 2, "ring", exchange=exchange) for m in sizes],
             "parameter server": [predict_all_reduce(message, m, 2, "parameter_server") for m in sizes]}
predicted["gloo all_reduce"] = [min(r, p) for r, p in zip(predicted["ring"], predicted["parameter server"])]
print(f"{'bytes':>8} | " + " | ".join(f"{name:>25}" for name in predicted))
print(f"{'':>8} | " + " | ".join(f"{'predicted  measured':>25}" for _ in predicted))
for i, m in enumerate(sizes):   # both machine-dependent: the prediction comes from this machine's fit
    cells = [f"~{predicted[k][i] * 1e6:.0f} us ~{comm[k][i] * 1e6:.0f} us" for k in predicted]
    print(f"{m:>8} | " + " | ".join(f"{c:>25}" for c in cells))
margin = 8   # generous: on a busy machine a process also waits for a core, and every measured time grows
for name in predicted:
    ratios = [c / p for c, p in zip(comm[name], predicted[name])]
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"{name:<17} measured / predicted: within {margin}x on average (~{geo:.2f}x)")
    assert 1 / margin < geo < margin, (name, geo)
ddp_pred = sum(min(predict_all_reduce(message, b, 2, "ring", exchange=exchange),   # gloo's choice: the
                   predict_all_reduce(message, b, 2, "parameter_server")) for b in buckets)   # quicker one
print(f"DDP's {len(buckets)} buckets ({sum(buckets) / 2**20:.1f} MiB): predicted ~{ddp_pred * 1e3:.2f} ms, "
      f"measured ~{comm['buckets'][0] * 1e3:.2f} ms (within {margin}x)")
assert 1 / margin < comm["buckets"][0] / ddp_pred < margin

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
For `dist.all_reduce`, and so for DDP's buckets, the prediction is the smaller of the two algorithms' predicted times, since gloo picks its own algorithm (section 2: the backend chooses); `course_lib.comm_model.predict_buckets` adds up one algorithm's all-reduces, bucket by bucket, and is what the next cell uses. Our Python ring pays more than `α` per step at small sizes (an `isend`, a `recv`, a `wait` and an addition in Python), which is why it is the slowest of the three there.

### What changes on GPUs and real networks
The model is the same; `α` and `β` change. The figures below are **cited from vendors' specifications, not measured here**: NVLink 4 on an NVIDIA H100 SXM GPU gives 900 GB/s of total bidirectional bandwidth (450 GB/s each way); one InfiniBand NDR port carries 400 Gb/s (50 GB/s each way). For `α` we *assume* 5 µs on both, the order of magnitude of a small NCCL all-reduce between GPUs; it is an assumption for the sketch, not a specification. Both links are full duplex, so the exchange costs one message. We predict, for 8 ranks, an all-reduce of ResNet-50's 102 MB of float32 gradients, in DDP's 25 MiB buckets, and of a 64 KiB tensor. (The tree column is the unpipelined model of the table above; NCCL's pipelined double binary tree would come much closer to the ring on the 102 MB.)
"""

# %% slideshow={"slide_type": "fragment"}
cited = {"NVLink 4 (H100 SXM)": AlphaBeta(alpha=5e-6, beta=450e9),   # bandwidth per direction, from vendors'
         "InfiniBand NDR port": AlphaBeta(alpha=5e-6, beta=400e9 / 8)}  # specifications; alpha = 5 us is an assumption
resnet50 = 25_557_032 * 4
print(f"{'link':<28} 102 MB: ring, tree, parameter server | 64 KiB: ring, tree")
for name, link in [("this machine (gloo, fitted)", message), *cited.items()]:
    duplex = exchange if link is message else None
    big = {a: predict_all_reduce(link, resnet50, 8, a, exchange=duplex) for a in ("ring", "tree", "parameter_server")}
    small = {a: predict_all_reduce(link, 65536, 8, a, exchange=duplex) for a in ("ring", "tree")}
    if duplex is None:                                            # full duplex, many bytes: the ring wins
        assert big["ring"] < big["tree"] < big["parameter_server"]
    mark = "~" if duplex else ""          # this machine's row comes from its fit: machine-dependent
    print(f"{name:<28} " + " ".join(f"{mark}{big[a] * 1e3:.1f} ms" for a in big) + " | "
          + " ".join(f"{mark}{small[a] * 1e6:.1f} us" for a in small))
for name, link in cited.items():
    ddp_buckets = [25 * 2**20] * (resnet50 // (25 * 2**20)) + [resnet50 % (25 * 2**20)]
    print(f"{name}: DDP's gradient all-reduce of ResNet-50 on 8 ranks, 25 MiB buckets: "
          f"{predict_buckets(link, ddp_buckets, 8) * 1e3:.2f} ms per step")
n_many = 512   # many ranks, small tensor: the ring's 2(N-1) latencies lose to the tree's 2 log2 N
nv = cited["NVLink 4 (H100 SXM)"]
assert predict_all_reduce(nv, 65536, n_many, "tree") < predict_all_reduce(nv, 65536, n_many, "ring")
print(f"64 KiB on {n_many} ranks over NVLink-like links: tree {predict_all_reduce(nv, 65536, n_many, 'tree') * 1e6:.0f} us, "
      f"ring {predict_all_reduce(nv, 65536, n_many, 'ring') * 1e6:.0f} us")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary
- `nn.DataParallel` scatters the batch, replicates the model from GPU 0, runs the replicas in threads and gathers the outputs on GPU 0, every step; gradients are summed back onto GPU 0. Without GPUs it is just the module (plus a `module.` prefix on the `state_dict` keys).
- It is slow because its threads take turns for the Python work (the GIL), it copies the whole model every step, it reduces the gradients only after backward, and GPU 0 does more than the others. Autocast around it reaches its threads only as an on/off flag: each thread uses its device's default dtype, so bf16 autocast runs the replicas in fp16 on CUDA. Prefer DDP, even on one machine.
- A parameter server's link carries `N·S` per step; a ring all-reduce sends `2(N-1)/N·S` per worker, in `2(N-1)` steps (scatter-reduce then all-gather). Both compute the same average; the "effective batch" depends on how the data is split, not on the algorithm.
- The collectives (`broadcast`, `reduce`, `all_reduce`, `gather`, `all_gather`, `reduce_scatter`, `all_to_all`, `barrier`) run on gloo on CPU; `reduce_scatter` + `all_gather` = `all_reduce`; `all_to_all` sends a different piece to each rank, the exchange expert parallelism is built on.
- A ring all-reduce from `isend`/`recv` matches `dist.all_reduce`, byte for byte as predicted. Blocking `send`s in a cycle deadlock; `course_lib.launch.run_ranks`'s timeout turns the hang into an error that shows where each rank stopped.
- Time is `α + m/β` per message, summed over a collective's steps: ring `2(N-1)` steps of `S/N`, an unpipelined binomial tree `2⌈log2 N⌉` of `S`, parameter server `2(N-1)` of `S` on one link. Fitted to gloo here, the model predicts the measured all-reduces and DDP's bucketed communication within a few times, busy machine included; the same formulas with NVLink's or InfiniBand's figures say that large gradients favour the ring and many ranks with small tensors favour the tree (NCCL's pipelined double binary tree narrows the gap for large tensors).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises
**1.** Write `send_chunk(worker, step, n)`: in scatter-reduce step `step` (0 to `n-2`), which chunk does `worker` send to worker `(worker + 1) % n`? The check runs a ring with your schedule and tests that every chunk ends up summed over all workers.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.all_reduce import check_ring_schedule, check_ring_time

def send_chunk(worker: int, step: int, n: int) -> int:
    raise NotImplementedError  # your code here

check_ring_schedule(send_chunk)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Write `ring_time(nbytes, n, alpha, beta)`: the α-β model's time in seconds for a ring all-reduce of `nbytes` bytes over `n` ranks on full-duplex links of latency `alpha` (seconds) and bandwidth `beta` (bytes per second).
"""


# %% slideshow={"slide_type": "-"}
def ring_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    raise NotImplementedError  # your code here

check_ring_time(ring_time)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References
- PyTorch, `torch.nn.DataParallel` (and the note recommending DDP instead): https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
- PyTorch, *Automatic Mixed Precision examples*, "DataParallel in a single process": https://pytorch.org/docs/stable/notes/amp_examples.html#dataparallel-in-a-single-process
- PyTorch, *Distributed communication package* (collectives, backends, point-to-point): https://pytorch.org/docs/stable/distributed.html
- PyTorch tutorial, *Writing Distributed Applications with PyTorch* (includes a ring all-reduce): https://pytorch.org/tutorials/intermediate/dist_tuto.html
- P. Patarasuk, X. Yuan, *Bandwidth optimal all-reduce algorithms for clusters of workstations*, JPDC 2009: https://doi.org/10.1016/j.jpdc.2008.09.002
- A. Sergeev, M. Del Balso, *Horovod: fast and easy distributed deep learning in TensorFlow*, 2018 (ring all-reduce for deep learning): https://arxiv.org/abs/1802.05799
- M. Li et al., *Scaling Distributed Machine Learning with the Parameter Server*, OSDI 2014: https://www.usenix.org/conference/osdi14/technical-sessions/presentation/li_mu
- pytorch/pytorch#149869, *ProcessGroupGloo: support reduce_scatter* (2025): https://github.com/pytorch/pytorch/pull/149869
- S. Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020: https://arxiv.org/abs/2006.15704
- R. Thakur, R. Rabenseifner, W. Gropp, *Optimization of Collective Communication Operations in MPICH*, IJHPCA 2005 (the α-β cost of ring, tree and recursive algorithms): https://doi.org/10.1177/1094342005051521
- R. Hockney, *The communication challenge for MPP: Intel Paragon and Meiko CS-2*, Parallel Computing 20(3), 1994 (the latency-bandwidth model)
- NVIDIA, *H100 Tensor Core GPU* (specifications: NVLink 900 GB/s for H100 SXM): https://www.nvidia.com/en-us/data-center/h100/
- NVIDIA, *ConnectX-7 adapter* (InfiniBand NDR, 400 Gb/s per port): https://www.nvidia.com/en-us/networking/infiniband-adapters/
- NVIDIA, *NCCL environment variables* (`NCCL_ALGO`: Ring, Tree, CollNet, NVLS and others, chosen per size and topology): https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
- S. Jeaugey, *Massively Scale Your Deep Learning Training with NCCL 2.4*, NVIDIA blog, 2019 (double binary trees, pipelined): https://developer.nvidia.com/blog/massively-scale-deep-learning-training-nccl-2-4/
"""
