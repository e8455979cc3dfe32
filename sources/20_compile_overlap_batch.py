# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 20 · torch.compile with DDP and FSDP2, overlap measured, and the batch size you can afford

Notebook 19 wrote the FSDP2 script a real job runs. Three things stand between that script and a fast, well-trained model, and each is usually learned the hard way: how `torch.compile` cooperates with DDP and FSDP2 (it must cut its graphs where the communication starts, or the overlap is lost), how much that overlap really saves (measured here, not asserted), and what happens to the learning rate when going from one process to `N` multiplies the global batch by `N`.

By the end you will be able to:
- count the graphs that DDPOptimizer cuts a compiled DDP model into and match them to DDP's buckets; compile an FSDP2 model block by block; say what compiled autograd changes;
- find graph breaks and recompiles with `torch._dynamo.explain` and `TORCH_LOGS`, and read their reasons;
- measure the step time that overlapping communication with compute saves in PyTorch's own DDP and FSDP2, draw it, and compare it with the α-β model's prediction;
- export and read a `torch.profiler` trace of a distributed step, tell an input-bound, a compute-bound and a communication-bound step apart, and measure the bus bandwidth of your own machine;
- choose a learning rate and a warmup for a larger global batch (linear scaling for SGD, square-root scaling for Adam) and recognize the critical batch size past which a larger batch stops paying.

This notebook assumes: notebook 05 (`torch.compile` with `aot_eager`, its joint graph), 09 (the α-β model), 10 (HandDDP's overlap on the simulated device), 11 and 12 (DDP's buckets and `no_sync`), 15 and 19 (`fully_shard`, prefetch). No GPU: every distributed run is 2 CPU processes over gloo, launched with `course_lib.launch.run_ranks`; no C++ compiler is needed (the backends used are `aot_eager` and a counting backend of our own).
"""

# %% slideshow={"slide_type": "-"}
import io
import logging
import math
import os
import statistics
import time

import matplotlib.pyplot as plt
import torch
from torch import nn
from tqdm.auto import tqdm

from course_lib.comm_model import AlphaBeta, predict_all_reduce
from course_lib.data import digits
from course_lib.launch import run_ranks
from course_lib.seeding import seed_everything
from course_lib.simulated_compute import plot_timeline

seed_everything(0)
torch.set_num_threads(1)  # one thread: the same arithmetic on every machine, steadier timings on a shared one
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
notebook_start = time.perf_counter()
print(f"torch {torch.__version__.split('+')[0]}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. `torch.compile` with DDP: one graph per bucket

DDP overlaps communication with backward by starting a bucket's all-reduce as soon as all its gradients exist (notebooks 10 and 12). A compiled model breaks that: AOTAutograd turns the whole forward into **one** backward graph, which runs as one opaque operation, so every gradient would appear at its very end and no bucket could start early. Dynamo's answer is **DDPOptimizer** (`torch._dynamo.config.optimize_ddp`, on by default; a setting of the private module `torch._dynamo`, the only switch for it in 2.13; the job sets it through `course_lib.torch_private.dynamo_config`, one small function per private API, so that a rename in PyTorch changes one place, and calls the public `torch.compiler.reset()` between runs): when it compiles the module wrapped by DDP, it walks the graph backwards, adds up the parameter bytes the way DDP fills its buckets, and cuts the graph into one subgraph per bucket. Each subgraph gets its own backward, and DDP's hooks fire between them.

The job below compiles an 8-layer model (`Linear(512, 512)` + `tanh`, 1,050,624 bytes of parameters per layer) under DDP with a **counting backend**: a function that receives each graph Dynamo produces, records how many `Linear` layers it holds (its nodes that call `torch._C._nn.linear`, the private C++ function behind `F.linear`), and runs it unchanged. A DDP communication hook records the buckets DDP really all-reduces. Two bucket caps, then DDPOptimizer switched off. (The model is a class of our own: Dynamo compiles the frames of user code it is called on, and a bare `nn.Sequential` of PyTorch's own modules under DDP is run without being traced.)
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/compile_dist.py
"""torch.compile with DDP (DDPOptimizer's graph splits) and with FSDP2 (per-block compile), on gloo."""
import io
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.torch_private import aten_linear, dynamo_config, set_logs  # private torch APIs, one function each

LINEAR = aten_linear()  # torch._C._nn.linear: the node a Linear layer becomes in a Dynamo graph


class Net(nn.Module):
    def __init__(self, width=512, depth=8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def counting_backend(graphs):
    """A torch.compile backend: note the Linear layers of each graph it receives, run the graph as it is."""
    def backend(gm, example_inputs):
        graphs.append(sum(n.target is LINEAR for n in gm.graph.nodes))
        return gm.forward
    return backend


def ddp_run(cap_mb, optimize_ddp, compiled, world):
    torch.compiler.reset()
    with dynamo_config(optimize_ddp=optimize_ddp):  # torch._dynamo.config.optimize_ddp, inside this block only
        return ddp_steps(cap_mb, compiled, world)


def ddp_steps(cap_mb, compiled, world):
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    buckets = []

    def hook(state, bucket):   # DDP's own buckets, as its reducer hands them over; then the usual mean
        buckets.append(bucket.buffer().numel() * 4)
        return dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    graphs = []
    run = torch.compile(ddp, backend=counting_backend(graphs)) if compiled else ddp
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(dist.get_rank()))
    for _ in range(3):   # DDP rebuilds its buckets after the first step, in the order gradients arrived
        buckets.clear()
        ddp.zero_grad()
        run(x).square().mean().backward()
    return {"graphs": graphs, "buckets": list(buckets), "grads": [p.grad.clone() for p in model.parameters()]}


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def fsdp_run(mode, mesh, steps=3):
    """4 residual blocks, one fully_shard unit each; compiled per block before or after fully_shard, or eager."""
    torch.compiler.reset()
    torch.manual_seed(0)
    blocks = nn.Sequential(*(Block(64) for _ in range(4)))
    graphs = []
    backend = counting_backend(graphs)   # one backend for all blocks: Dynamo's cache is per backend
    for block in blocks:
        if mode == "compile, then fully_shard":
            block.compile(backend=backend)
        fully_shard(block, mesh=mesh)
        if mode == "fully_shard, then compile":
            block.compile(backend=backend)
    fully_shard(blocks, mesh=mesh)
    opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
    g, losses = torch.Generator().manual_seed(0), []
    for _ in range(steps):   # every rank its own half of the same global batch
        x = torch.randn(16, 64, generator=g)[dist.get_rank()::dist.get_world_size()]
        loss = blocks(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total := loss.detach().clone())
        losses.append(total.item() / dist.get_world_size())
    return {"graphs": graphs, "losses": losses}


def recompile_log(fn):
    """Run fn with TORCH_LOGS="recompiles" switched on in code, the log text captured instead of printed."""
    set_logs(recompiles=True)  # torch._logging.set_logs
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    names = ["torch", *(n for n in logging.root.manager.loggerDict if n.startswith("torch."))]
    loggers = [lg for lg in map(logging.getLogger, names) if lg.handlers]   # torch's and Dynamo's own handlers
    saved = {lg: lg.handlers[:] for lg in loggers}
    for lg in loggers:
        lg.handlers = [handler]
    try:
        result = fn()
    finally:
        for lg, handlers in saved.items():
            lg.handlers = handlers
        set_logs()
    return result, buffer.getvalue()


def main(rank, world):
    torch.set_num_threads(1)
    ddp = {name: ddp_run(cap, opt, compiled, world) for name, cap, opt, compiled in [
        ("eager, default cap", None, True, False),
        ("compiled, default cap", None, True, True),
        ("compiled, bucket_cap_mb=2", 2, True, True),
        ("compiled, optimize_ddp=False", 2, False, True)]}
    mesh = init_device_mesh("cpu", (world,))
    fsdp = {"eager": fsdp_run("eager", mesh)}
    fsdp["compile, then fully_shard"], log = recompile_log(lambda: fsdp_run("compile, then fully_shard", mesh))
    fsdp["fully_shard, then compile"] = fsdp_run("fully_shard, then compile", mesh)
    return {"ddp": ddp, "fsdp": fsdp, "log": log}


# %% slideshow={"slide_type": "subslide"}
compiled = run_ranks("_runs/compile_dist.py:main", nprocs=2, timeout=600, echo="none")[0]
MiB, layer_bytes = 2**20, 512 * 513 * 4
for name, r in compiled["ddp"].items():
    if name.startswith("compiled"):
        print(f"{name:<29}: DDP's buckets (layers) {[b // layer_bytes for b in r['buckets']]}, "
              f"graphs received by the backend (layers) {r['graphs']}")
ddp = compiled["ddp"]
grads_equal = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ddp["eager, default cap"]["grads"],
                                                                 ddp["compiled, default cap"]["grads"]))
print(f"compiled DDP's gradients equal eager DDP's within 1e-6: {grads_equal}")
assert grads_equal
assert len(ddp["compiled, default cap"]["graphs"]) == len(ddp["compiled, default cap"]["buckets"]) == 2
assert len(ddp["compiled, bucket_cap_mb=2"]["graphs"]) == len(ddp["compiled, bucket_cap_mb=2"]["buckets"]) + 1 == 5
assert ddp["compiled, optimize_ddp=False"]["graphs"] == [8]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
DDP's buckets are listed in the order they are all-reduced, the graphs in forward order, so read one list backwards against the other: DDP's first bucket holds the **last** layer, whose gradient is ready first. With the default cap (25 MiB, and a first bucket of 1 MiB so that communication starts early) DDP all-reduces 2 buckets, the last layer and then the other 7, and DDPOptimizer cut the graph at the same place: 2 graphs. With `bucket_cap_mb=2` DDP makes 4 buckets of 2 layers, but DDPOptimizer made 5 graphs: it always gives its first piece DDP's *default* first-bucket size (1 MiB), while DDP uses a small first bucket only when the cap is left at its default. The graphs are then cut one layer off DDP's buckets: still correct (a cut only decides when the backward pauses to let hooks run), slightly less overlap. With `optimize_ddp=False` there is one graph: every gradient appears at the end of one backward, and all communication waits for it. Since the model itself never changes, these counts are exact.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. FSDP2 compiled block by block

FSDP2 needs no DDPOptimizer: its all-gathers and reduce-scatters run in hooks **around** each unit, so compiling each block separately leaves those hooks between the compiled pieces. This is what PyTorch recommends (regional compilation): `block.compile()` on every transformer block, in place, keeping `fully_shard`'s units intact. The same job trained 4 residual blocks, one `fully_shard` unit each, three ways for 3 SGD steps: eagerly, compiling each block before `fully_shard`, and after it.
"""

# %% slideshow={"slide_type": "-"}
fsdp = compiled["fsdp"]
for mode, r in fsdp.items():
    print(f"{mode:<25}: graphs compiled {len(r['graphs'])}, losses " + ", ".join(f"~{v:.4f}" for v in r["losses"]))
worst = max(abs(a - b) for mode in fsdp for a, b in zip(fsdp[mode]["losses"], fsdp["eager"]["losses"]))
print(f"compiled losses equal eager within 1e-6: {worst < 1e-6}")
assert worst < 1e-6 and len(fsdp["compile, then fully_shard"]["graphs"]) == len(fsdp["fully_shard, then compile"]["graphs"]) == 2
reasons = sorted({line.strip() for line in compiled["log"].splitlines() if line.strip().startswith("- ")})
print("why the second graph: TORCH_LOGS=recompiles says", reasons)
assert any("requires_grad mismatch" in r for r in reasons)

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Four blocks, two graphs: the blocks share one code object (`Block.forward`), and Dynamo keeps one cache per code object, guarded by what it assumed. The first block's input is the data, which does not require a gradient; every later block's input does. That guard failed once, and the recompile log says exactly that. It was captured in the cell above by switching on `TORCH_LOGS="recompiles"` from code (`torch._logging.set_logs(recompiles=True)`, documented although its module is private; the environment variable is the public route) and pointing the `torch` logger's handler at a string; from a shell, `TORCH_LOGS=recompiles,graph_breaks python train.py` prints the same to stderr. A recompile per distinct input is normal; one per step is a bug to find this way (a Python number that changes, a shape that changes).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Graph breaks, and compiled autograd

A **graph break** is where Dynamo stops tracing, runs a piece of Python eagerly and starts a new graph: each break costs the fusion across it and, under DDP or FSDP, can move where communication starts. `torch._dynamo.explain` runs a function once and reports the graphs and the reason for every break (a function of the private module `torch._dynamo`, which the troubleshooting guide uses; 2.13 has no public equivalent, and `TORCH_LOGS=graph_breaks` is the public way to see the breaks). The classic one: a tensor's value read into Python (`.item()`) to take a branch.
"""


# %% slideshow={"slide_type": "-"}
def scaled(x):
    y = torch.tanh(x) * 2
    if y.sum().item() > 0:   # Python needs the value: Dynamo must run the graph so far to know it
        y = y + 1
    return y.cos()


from course_lib.torch_private import dynamo_explain  # torch._dynamo.explain

torch.compiler.reset()
quiet = logging.getLogger("torch._dynamo")
level, quiet.level = quiet.level, logging.ERROR   # explain's own warning would repeat what it returns
explanation = dynamo_explain(scaled)(torch.randn(8))
quiet.setLevel(level)
print(f"graphs: {explanation.graph_count}, graph breaks: {explanation.graph_break_count}")
print("reason:", str(explanation.break_reasons[0].reason).splitlines()[0])
assert explanation.graph_count == 2 and explanation.graph_break_count == 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Compiled autograd.** Without it, a compiled model's backward is the backward graph AOTAutograd derived at compile time, and the autograd engine still runs it, calls the hooks and accumulates into `.grad` in eager Python. With `torch._dynamo.config.compiled_autograd = True` (a private setting, the one PyTorch's Compiled Autograd tutorial uses; 2.13 has no public switch), a `backward()` call inside a compiled function is captured **when it runs**: the engine's whole graph, gradient accumulation and hooks included, becomes one more Dynamo graph for the backend. That is what lets DDP's and FSDP's communication be traced into the backward instead of cutting it (`optimize_ddp="python_reducer"` builds on it). The cell compiles a training step (forward and `backward()`) with a backend that reports every graph it is given, and the forward and backward graphs AOTAutograd hands it.
"""

# %% slideshow={"slide_type": "-"}
from functorch.compile import make_boxed_func

from course_lib.torch_private import aot_autograd, dynamo_config  # torch._dynamo's aot_autograd and config


def graphs_of_a_step(compiled_autograd: bool) -> tuple[list[str], list[torch.Tensor]]:
    torch.compiler.reset()
    with dynamo_config(compiled_autograd=compiled_autograd):   # read when the compiled step first runs
        return step_graphs()


def step_graphs() -> tuple[list[str], list[torch.Tensor]]:
    seed_everything(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    seen: list[str] = []

    def part(kind):
        def compiler(gm, example_inputs):
            seen.append(f"{kind} ({len(gm.graph.nodes)} nodes)")
            return make_boxed_func(gm.forward)
        return compiler

    aot = aot_autograd(fw_compiler=part("AOT forward"), bw_compiler=part("AOT backward"))

    def backend(gm, example_inputs):
        seen.append(f"Dynamo graph ({len(gm.graph.nodes)} nodes)")
        return aot(gm, example_inputs)

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    torch.compile(step, backend=backend)(torch.ones(4, 64))
    return seen, [p.grad for p in model.parameters()]


plain, plain_grads = graphs_of_a_step(False)
captured, captured_grads = graphs_of_a_step(True)
print("compiled_autograd=False:", plain)
print("compiled_autograd=True: ", captured)
same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, captured_grads))
print(f"gradients equal within 1e-6: {same}")
dynamo_graphs = [sum(s.startswith("Dynamo") for s in seen) for seen in (plain, captured)]
print(f"Dynamo graphs: {dynamo_graphs[0]} without compiled autograd, {dynamo_graphs[1]} with it")
assert same and any("AOT backward" in s for s in plain) and not any("AOT backward" in s for s in captured)
assert dynamo_graphs == [2, 3]

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Without compiled autograd: the forward is a Dynamo graph, AOTAutograd splits it into a forward and a backward, and `loss.backward()` itself is a graph break (the step is split around it). With it: AOTAutograd's backward is never compiled; instead a second, larger Dynamo graph arrives at run time, the autograd engine's own graph of the step, including the accumulation into `.grad`. The gradients are the same.

**What Inductor adds.** Everything above used `aot_eager` or a backend of our own, which run the captured graphs with PyTorch's eager kernels: no speed, but no compiler either. Inductor, the default backend, generates fused kernels from those graphs (Triton on GPUs, C++/OpenMP on CPUs, which needs a C++ compiler), and that is where `torch.compile`'s speed comes from. Its first compilation is expensive: it generates and compiles code, which takes far longer than `aot_eager`'s trace even for a small step (notebook 05 §3.3 says how to time it on your machine), and the cost grows with the model and is paid by every rank; the compile caches (on disk, on by default) let the next run reuse what was compiled.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Overlap, measured: PyTorch's DDP

Notebook 10 measured the overlap of its own `HandDDP`. Here it is PyTorch's `DistributedDataParallel`, on the same simulated device (`simulated_mlp`: each layer does its small real math, then sleeps, which takes no core and releases the GIL, so gloo communicates meanwhile, as NCCL does while a GPU computes). 4 layers of 1024 × 1024, 5 ms forward and 30 ms backward each; `bucket_cap_mb` is set to one layer, so DDP has 4 buckets of 4,198,400 bytes. A communication hook records each bucket's all-reduce on the timeline (from the hook call, when DDP hands the bucket over, to the completion).

- **overlap on**: DDP as shipped; a bucket's all-reduce starts as soon as its layer's backward is done;
- **overlap off**: `no_sync()` for the backward, then the same 4 all-reduces after it.

Both settings alternate step by step (8 pairs), so both see the same load; the savings are medians of the paired differences. The **prediction** from the α-β model: the worker first times all-reduces of 4 sizes with nothing else running and fits `alpha + bytes/beta` to the ring's steps (2 steps of `S/2` on 2 ranks, notebook 09). Without overlap the step waits for 4 all-reduces after backward; with it, only for the last (each of the others runs under a 30 ms layer backward, longer than an all-reduce): the saving predicted is 3 all-reduces.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/overlap_torch.py
"""PyTorch's DDP and FSDP2 on a simulated device: the same step with overlap on and off, alternating."""
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.comm_model import fit_alpha_beta
from course_lib.simulated_compute import Timeline, hidden_seconds, record_collectives, simulated_mlp
from course_lib.torch_private import set_unshard_async_op


def timed(fn, repeats=7):
    """Median seconds of fn() on all ranks, started together (each run after a barrier)."""
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def fit_link(world):
    """The alpha-beta model of one ring step, fitted to all-reduces of 4 sizes (2(N-1) steps of S/N each)."""
    sizes = [2**12, 2**16, 2**20, 2**22]
    seconds = [timed(lambda s=s: dist.all_reduce(torch.zeros(s // 4))) for s in sizes]
    steps = 2 * (world - 1)
    return fit_alpha_beta([s / world for s in sizes], [t / steps for t in seconds])


def ddp_overlap(rank, world, pairs, width, depth, forward_ms, backward_ms):
    torch.set_num_threads(1)
    timeline = Timeline(rank)
    model = simulated_mlp(width, depth, forward_ms, backward_ms, timeline)
    layer_bytes = width * (width + 1) * 4
    ddp = DDP(model, bucket_cap_mb=layer_bytes / 2**20)   # one bucket per layer

    def hook(state, bucket):   # what DDP's default hook does (mean, all-reduce), recorded
        start, label = timeline.now(), f"bucket {bucket.index()}"
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

        def done(f):
            timeline.add("comm", label, start, timeline.now())
            return f.value()[0]
        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    x = torch.randn(2, width, generator=torch.Generator().manual_seed(rank))
    rows, last = {True: [], False: []}, {}
    for step in range(2 * (pairs + 1)):
        overlap = step % 2 == 0            # on, off, on, off, ...: both settings see the same load
        ddp.zero_grad(set_to_none=False)
        dist.barrier()
        timeline.reset()
        if overlap:                        # DDP as shipped
            ddp(x).square().mean().backward()
        else:                              # the same buckets, all-reduced after backward
            with ddp.no_sync():
                ddp(x).square().mean().backward()
            for i in reversed(range(depth)):
                params, start = list(model[i].parameters()), timeline.now()
                flat = torch.cat([p.grad.reshape(-1) for p in params]).div_(world)
                dist.all_reduce(flat)
                torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
                timeline.add("comm", f"bucket {depth - 1 - i}", start, timeline.now())
        done = timeline.now()
        dist.barrier()                     # both ranks done: every completion has been recorded
        spans = timeline.spans
        backward_end = max(s.end for s in spans if s.lane == "compute")
        if step >= 2:                      # the first pair warms up
            rows[overlap].append({"step": done, "wait": done - backward_end, "hidden": hidden_seconds(spans),
                                  "started during backward": sum(s.lane == "comm" and s.start < backward_end
                                                                 for s in spans)})
            last[overlap] = spans
    return {"rows": rows, "spans": last, "bytes": layer_bytes, "link": fit_link(world)}


def fsdp_overlap(rank, world, pairs, width, depth, forward_ms, backward_ms):
    torch.set_num_threads(1)
    timeline = Timeline(rank)
    mesh = init_device_mesh("cpu", (world,))
    models = {}
    for prefetch in (True, False):         # two copies of the same model, one per setting
        model = simulated_mlp(width, depth, forward_ms, backward_ms, timeline)
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for i, layer in enumerate(model):  # explicit prefetch: the next unit's all-gather, or none
            layer.set_modules_to_forward_prefetch(list(model[i + 1:i + 2]) if prefetch else [])
            layer.set_modules_to_backward_prefetch(list(model[max(i - 1, 0):i]) if prefetch else [])
        set_unshard_async_op(model, prefetch)  # private (FSDPModule._set_unshard_async_op): on CPU, issue those
        # all-gathers without waiting for them
        models[prefetch] = model
    x = torch.randn(2, width, generator=torch.Generator().manual_seed(rank))
    rows, last = {True: [], False: []}, {}
    for step in range(2 * (pairs + 1)):
        prefetch = step % 2 == 0
        model = models[prefetch]
        dist.barrier()
        timeline.reset()
        with record_collectives(timeline):
            model(x).square().mean().backward()
            done = timeline.now()
        dist.barrier()
        model.zero_grad()
        spans = timeline.spans
        if step >= 2:
            compute = sum(s.duration for s in spans if s.lane == "compute")
            rows[prefetch].append({"step": done, "not computing": done - compute, "hidden": hidden_seconds(spans),
                                   "gathers": sum(s.label.startswith("all_gather") for s in spans)})
            last[prefetch] = spans
    return {"rows": rows, "spans": last, "bytes": width * (width + 1) * 4, "link": fit_link(world)}


def main(rank, world, pairs, width, depth, forward_ms, backward_ms):
    args = (rank, world, pairs, width, depth, forward_ms, backward_ms)
    return {"ddp": ddp_overlap(*args), "fsdp": fsdp_overlap(*args)}


# %% slideshow={"slide_type": "subslide"}
width, depth, forward_ms, backward_ms, pairs = 1024, 4, 5, 30, 8
overlap = run_ranks("_runs/overlap_torch.py:main", nprocs=2, args=(pairs, width, depth, forward_ms, backward_ms),
                    timeout=600, echo="none")[0]


def median_ms(rows: list[dict], key: str) -> float:
    return 1000 * statistics.median(r[key] for r in rows)


def paired_ms(result: dict, key: str) -> float:
    """Median over the pairs of (off - on): what overlap saved, each pair under the same load."""
    return 1000 * statistics.median(b[key] - a[key] for a, b in zip(result["rows"][True], result["rows"][False]))


ddp_result = overlap["ddp"]
link: AlphaBeta = ddp_result["link"]
bucket_s = predict_all_reduce(link, ddp_result["bytes"], 2)
print(f"{depth} layers, forward {forward_ms} ms + backward {backward_ms} ms each: "
      f"simulated compute per step {depth * (forward_ms + backward_ms)} ms; α-β fit: alpha ~{link.alpha * 1e6:.0f} us, "
      f"beta ~{link.beta / 1e9:.2f} GB/s; one bucket's all-reduce predicted ~{1000 * bucket_s:.1f} ms")
on, off = ddp_result["rows"][True], ddp_result["rows"][False]
for name, rows in (("overlap on ", on), ("overlap off", off)):
    started = {r["started during backward"] for r in rows}
    assert len(started) == 1   # the same in every step: decided by the code, not by the timing
    print(f"{name}: {started.pop()} of {depth} all-reduces started during backward; medians: hidden behind compute "
          f"~{median_ms(rows, 'hidden'):.0f} ms, wait after backward ~{median_ms(rows, 'wait'):.0f} ms, "
          f"step ~{median_ms(rows, 'step'):.0f} ms")
predicted_ms = 1000 * (depth - 1) * min(bucket_s, backward_ms / 1000)
print(f"without overlap the step waits for {depth} all-reduces: predicted ~{1000 * depth * bucket_s:.0f} ms, "
      f"measured ~{median_ms(off, 'wait'):.0f} ms")
print(f"saving per step: predicted ~{predicted_ms:.0f} ms ({depth - 1} all-reduces); measured: wait after backward "
      f"~{paired_ms(ddp_result, 'wait'):.0f} ms, whole step ~{paired_ms(ddp_result, 'step'):.0f} ms (medians of "
      f"{pairs} pairs)")
assert all(r["started during backward"] == depth - 1 for r in on) and all(r["started during backward"] == 0 for r in off)
assert all(r["hidden"] == 0 for r in off) and median_ms(on, "hidden") > 0 and paired_ms(ddp_result, "wait") > 0

fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True)
for ax, setting in zip(axes, (True, False)):
    plot_timeline(ddp_result["spans"][setting], ax=ax, title=f"DDP, overlap {'on' if setting else 'off'}: "
                  "one step on rank 0 (blue forward, orange backward, green all-reduce)")
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
DDP behaves like notebook 10's HandDDP: 3 of its 4 buckets start under the backward of the layers before them, and only the last (the first layer's) is left when backward ends. Prediction and measurement agree in kind and in order of magnitude, not to the millisecond. The α-β fit was made with both processes idle; during a step, gloo's copies compete for the same 2 cores with the processes' own work and with other jobs, so on a busy machine each all-reduce takes longer than the fit says (compare the wait without overlap with its prediction), and then overlap hides more than predicted. The whole step's saving is the same idea with more noise in it (every layer's real math and Python overhead is in it too).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Overlap, measured: FSDP2's prefetch

FSDP2 overlaps differently: it all-gathers a unit's parameters **before** the unit computes, and the trick is to issue the *next* unit's all-gather while this one computes (prefetch). On a GPU this runs on a separate CUDA stream: the CPU issues the all-gather and moves on, so prefetching needs no special setting. On a CPU there are no streams: FSDP2 issues its unshards with `async_op=False` by default, so the process waits for each all-gather, and `set_modules_to_forward_prefetch`/`set_modules_to_backward_prefetch` alone change the order of the all-gathers but hide nothing (notebook 14 §3.2 shows the order). What switches the overlap on is `_set_unshard_async_op(True)`, which issues those all-gathers without waiting. It is a **private** method of the FSDP2 module (the underscore: it can change or go in any release), and 2.13 has no public API that does this on a CPU; on a GPU none is needed, since the separate stream already overlaps. The reduce-scatters of backward stay synchronous on the CPU whatever the setting (they overlap on a GPU's stream).

- **prefetch on**: each unit prefetches the next (forward) and the previous (backward), with `_set_unshard_async_op(True)`;
- **prefetch off**: no explicit prefetch, the default synchronous all-gathers.

The same 4 simulated layers, each its own `fully_shard` unit (an all-gather of 4,198,400 bytes, half from each rank), 8 pairs. `course_lib.simulated_compute.record_collectives` records FSDP2's `all_gather_single` and `reduce_scatter_single` calls. The prediction: the all-gathers of units 2–4 hide under the forward of the unit before (each at most 5 ms of forward), those of units 3–1 under the backward of the unit after; the model's all-gather time is one ring step, `alpha + (S/2)/beta`.
"""

# %% slideshow={"slide_type": "-"}
fsdp_result = overlap["fsdp"]
link = fsdp_result["link"]
gather_s = link.time(fsdp_result["bytes"] / 2)
predicted_fsdp_ms = 1000 * (depth - 1) * (min(gather_s, forward_ms / 1000) + min(gather_s, backward_ms / 1000))
on, off = fsdp_result["rows"][True], fsdp_result["rows"][False]
print(f"{depth} units of {fsdp_result['bytes']:,} bytes, forward {forward_ms} ms + backward {backward_ms} ms each")
for name, rows in (("prefetch on ", on), ("prefetch off", off)):
    print(f"{name}: {rows[0]['gathers']} all-gathers per step; medians: hidden behind compute "
          f"~{median_ms(rows, 'hidden'):.0f} ms, time not computing ~{median_ms(rows, 'not computing'):.0f} ms, "
          f"step ~{median_ms(rows, 'step'):.0f} ms")
print(f"one all-gather predicted ~{1000 * gather_s:.1f} ms; saving per step: predicted ~{predicted_fsdp_ms:.0f} ms, "
      f"measured ~{paired_ms(fsdp_result, 'step'):.0f} ms (median of {pairs} pairs)")
assert all(r["hidden"] == 0 for r in off) and median_ms(on, "hidden") > 0
assert {r["gathers"] for r in on} == {r["gathers"] for r in off}   # the same all-gathers, only their timing differs

fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True)
for ax, setting in zip(axes, (True, False)):
    plot_timeline(fsdp_result["spans"][setting], ax=ax, title=f"FSDP2, prefetch {'on' if setting else 'off'}: "
                  "one step on rank 0 (green: all-gathers and reduce-scatters)", label=lambda s: "")
fig.tight_layout()
plt.show()
print(f"~{time.perf_counter() - notebook_start:.0f} s so far")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
With prefetch the green all-gathers sit under the blue and orange compute; without it every all-gather and reduce-scatter runs between two computations, and the step is the sum of both. What is asserted is what holds on any machine, busy or idle: hidden time is zero without prefetch and positive with it, with the same all-gathers. The saving's size, after `~`, depends on how busy the machine is, for the same reason as DDP's: a busy machine's all-gathers take longer than the idle fit predicts. On a GPU the reduce-scatters hide too, and with them most of FSDP's communication.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. A larger global batch needs another learning rate

Going from 1 to `N` ranks with the same per-rank batch multiplies the **global** batch by `N` (notebook 11 §8 showed that DDP computes exactly the gradient of the big batch). The same number of epochs then takes `N` times fewer steps, and with the learning rate unchanged the model travels much less far. The usual fixes:

- **linear scaling** for SGD (Goyal et al. 2017): multiply the learning rate by `k` when the batch grows `k`-fold, so that one big step moves about as far as `k` small ones; with a **warmup** (the rate grows linearly from small to its target over the first steps), because the first steps of a fresh model do not tolerate a large rate;
- **square-root scaling** for Adam: Adam's update is normalized by the gradient's scale, and a `k` times larger batch reduces the gradient noise by `sqrt(k)`, so `sqrt(k)` is the usual starting point (Malladi et al. 2022); it is a heuristic, to be checked.

Measured here in one process on the digits (an MLP 64–128–10, 10 epochs), simulating the large global batch of 16 ranks by a 16 times larger batch: what DDP would compute, without the processes. Batch 32 against batch 512.
"""

# %% slideshow={"slide_type": "-"}
train, _ = digits()
X, Y = train.flat(), train.y


def train_loss(batch: int, optimizer: str, lr: float, epochs: int = 10, warmup_epochs: int = 0) -> float:
    """Train a fresh MLP for `epochs` epochs at this batch and peak learning rate; the final training loss."""
    seed_everything(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=lr))
    warmup = warmup_epochs * math.ceil(len(Y) / batch)   # steps
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    order = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(len(Y), generator=order)
        for i in range(0, len(Y), batch):
            idx = perm[i:i + batch]
            loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    with torch.no_grad():
        return nn.functional.cross_entropy(model(X), Y).item()


small, k = 32, 16
runs = {  # name: (batch, optimizer, peak learning rate, warmup epochs)
    "SGD, batch 32, lr 0.02": (small, "sgd", 0.02, 0),
    "SGD, batch 512, lr 0.02 (not scaled)": (small * k, "sgd", 0.02, 0),
    "SGD, batch 512, lr 0.32 (linear) + warmup": (small * k, "sgd", 0.02 * k, 1),
    "Adam, batch 32, lr 1e-3": (small, "adam", 1e-3, 0),
    "Adam, batch 512, lr 1e-3 (not scaled)": (small * k, "adam", 1e-3, 0),
    "Adam, batch 512, lr 4e-3 (sqrt) + warmup": (small * k, "adam", 1e-3 * math.sqrt(k), 1),
    "Adam, batch 512, lr 1.6e-2 (linear) + warmup": (small * k, "adam", 1e-3 * k, 1),
}
final = {name: train_loss(b, opt, lr, warmup_epochs=w) for name, (b, opt, lr, w) in tqdm(runs.items(), desc="training runs")}
for name, loss in final.items():
    print(f"{name:<45}: final training loss ~{loss:.3f}")
names = list(final)
for opt_rows in (names[:3], names[3:]):
    base, unscaled, scaled_rows = final[opt_rows[0]], final[opt_rows[1]], [final[n] for n in opt_rows[2:]]
    assert unscaled > 3 * base and all(s < unscaled / 3 for s in scaled_rows)   # wide margins, asserted
assert final[names[2]] < 3 * final[names[0]]
print("not scaling leaves the loss over 3x that of batch 32; every scaled run ends under a third of the unscaled one;"
      " SGD with linear scaling and warmup ends within 3x of batch 32")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Without scaling, 16 times fewer steps of the same size leave the model far behind: its loss is many times that of the small batch. Linear scaling with warmup brings SGD close to the small batch in the same epochs. For Adam, square-root scaling recovers most of the gap, and on this small problem linear scaling does better still: the rules are starting points for a search, not laws, and the search is cheap compared with a run at the wrong rate. The warmup's cost is visible too: its epoch runs below the peak rate. (Why not exact numbers? Each run is deterministic, but a different CPU or PyTorch build rounds the sums differently, and 500 steps carry that into the third digit.)
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. The critical batch size

Scaling the rate does not make every batch size equally good. McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") measured, for many tasks, the **steps** `S` and the **examples** `E` needed to reach a given loss at batch size `B`, each at its best learning rate, and found `S = S_min (1 + B_noise / B)` and `E = E_min (1 + B / B_noise)`. Below `B_noise`, the *critical batch size*, a larger batch cuts the steps almost in proportion: the extra ranks are well spent. Above it, the steps barely fall while the examples (the compute) grow: more ranks buy little. `B_noise` is the scale of the gradient's noise, and it grows as training goes on and the loss falls.

The cell measures the shape on the digits: for each batch size, the steps Adam needs to bring the training loss under 0.2, at the best of 3 learning rates (checked every step).
"""


# %% slideshow={"slide_type": "-"}
def steps_to_loss(batch: int, lr: float, target: float = 0.2, max_steps: int = 2000) -> int:
    seed_everything(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    order, step = torch.Generator().manual_seed(0), 0
    while step < max_steps:
        perm = torch.randperm(len(Y), generator=order)
        for i in range(0, len(Y) - batch + 1, batch):   # full batches only
            idx = perm[i:i + batch]
            loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            with torch.no_grad():
                if nn.functional.cross_entropy(model(X), Y).item() < target:
                    return step
    return max_steps


batches = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
steps = [min(steps_to_loss(b, lr) for lr in (3e-3, 1e-2, 3e-2)) for b in tqdm(batches, desc="batch sizes")]
# S = S_min + S_min * B_noise / B is a straight line in 1/B: least squares gives S_min and B_noise
inv = torch.tensor([1 / b for b in batches], dtype=torch.float64)
A = torch.stack([torch.ones_like(inv), inv], dim=1)
s_min, slope = torch.linalg.lstsq(A, torch.tensor(steps, dtype=torch.float64).unsqueeze(1)).solution.squeeze(1).tolist()
b_noise = slope / s_min
for b, s in zip(batches, steps):
    print(f"batch {b:>5}: ~{s} steps, ~{s * b:,} examples")
print(f"fit S = S_min (1 + B_noise/B): S_min ~{s_min:.0f} steps, critical batch size B_noise ~{b_noise:.0f}")
assert steps[0] > 4 * steps[-1] and steps[-1] * batches[-1] > 4 * steps[0] * batches[0] and 16 < b_noise < 1024
print(f"batch {batches[0]} needs over 4x the steps of batch {batches[-1]}, which uses over 4x the examples; "
      "B_noise between 16 and 1024")

fig, ax = plt.subplots(figsize=(6.5, 3.5))
ax.loglog(batches, steps, "o-", label="measured steps to loss < 0.2")
ax.loglog(batches, [s_min * (1 + b_noise / b) for b in batches], "--", label="S_min (1 + B_noise / B), fitted")
ax.axvline(b_noise, color="grey", lw=0.8)
ax.set_xlabel("batch size (examples)")
ax.set_ylabel("optimizer steps")
ax.set_title("Steps to a target loss against batch size (Adam, digits MLP)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The smallest batch needs over 4 times the steps of the largest, but the largest uses over 4 times the examples of the smallest: the steps fall almost as `1/B` at first, then flatten out, around the fitted `B_noise` (the grey line). On this tiny task the critical batch is of the order of a hundred examples; for large language models it is measured in millions of tokens, and it grows as the loss falls (Kaplan et al. 2020 fit it as a function of the loss). In practice: scale the rate when adding ranks, warm up, and check whether the global batch is already past the critical size, where more data-parallel ranks shorten the run only a little.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. Reading a trace of a distributed step

Sections 4 and 5 measured overlap on a simulated device. On a real job the tool is the profiler: `torch.profiler.profile` records every operator of a few steps, and `export_chrome_trace` writes them as a timeline per rank that [Perfetto](https://ui.perfetto.dev) (or `chrome://tracing`) opens. The script below trains a small MLP for five steps under DDP or FSDP2 on 2 CPU processes, profiles the last three, labels the loading of each batch with `record_function("data")`, and writes each rank's trace. `SCENARIOS` holds a baseline and three variants that each change **one** thing: a loader that takes 200 ms per batch, a batch 128 times larger, and an extra 64 MiB all-reduce every step (a metric or an EMA synchronized too often).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/traced_step.py
"""A few profiled training steps of DDP or FSDP2 on gloo: one Chrome trace per rank."""
import os
import time

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # quiet the profiler's start and stop lines
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

SCENARIOS = {"baseline": dict(batch=64, sleep=0.0, extra=0), "slow loader": dict(batch=64, sleep=0.2, extra=0),
             "big batch": dict(batch=8192, sleep=0.0, extra=0), "big all-reduce": dict(batch=64, sleep=0.0, extra=2**24)}


def batches(n, batch, sleep, seed):
    """The loader: `sleep` seconds per batch stand for reading and decoding it."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        time.sleep(sleep)
        yield torch.randn(batch, 64, generator=gen)


def train(rank, world_size, wrap, scenario, out):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    knobs = SCENARIOS[scenario]
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model[::2]:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = batches(5, knobs["batch"], knobs["sleep"], seed=rank)
    extra = torch.ones(knobs["extra"]) if knobs["extra"] else None
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            with record_function("step"):
                with record_function("data"):
                    x = next(data)
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                if extra is not None:
                    with record_function("comm:extra all-reduce"):  # a wait has no span of its own: name it
                        dist.all_reduce(extra)
            prof.step()
    path = os.path.abspath(f"{out}/{wrap} {scenario} rank{rank}.json")
    os.makedirs(out, exist_ok=True)
    prof.export_chrome_trace(path)
    return path


def all_reduce_times(rank, world_size, sizes, repeats=7):
    """The shortest time of an all-reduce of each size (bytes), after one warm-up: the least disturbed run."""
    out = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        out.append(min(times))
    return out


# %% slideshow={"slide_type": "subslide"}
import json

from course_lib.launch import run_ranks as launch_ranks

traces = {(wrap, "baseline"): launch_ranks("_runs/traced_step.py:train", 2, args=(wrap, "baseline", "_runs/traces"),
                                           timeout=120, echo="none") for wrap in ("ddp", "fsdp")}


def spans(path):
    """The complete events ("X") of a trace: name, thread, start and end in microseconds."""
    events = json.load(open(path))["traceEvents"]
    return [(e["name"], e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and "dur" in e]


for wrap in ("ddp", "fsdp"):
    events = spans(traces[wrap, "baseline"][0])
    main = next(tid for name, tid, *_ in events if name == "step")
    names = sorted({(name.split(" (")[0], "main thread" if tid == main else "gloo's thread") for name, tid, *_ in events
                    if name.startswith(("gloo:", "c10d::", "FSDP::all_gather", "FSDP::post_backward_reduce"))})
    print(f"{wrap}, rank 0, the communication in the trace:")
    for name, thread in names:
        print(f"   {name:<32} on {thread}")

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
What the two traces show:

- Each collective appears **twice**. On the training thread, `c10d::allreduce_` (or `_allgather_base_`, `_reduce_scatter_base_`) only *hands* it to the backend and returns; the transfer itself is a `gloo:all_reduce` or `gloo:all_gather` span on gloo's own thread, and it runs while the training thread goes on. On GPUs the second span is an NCCL kernel (`ncclDevKernel_...`) on a communication stream, beside the CPU-side `nccl:all_reduce` annotation.
- FSDP2 names its phases: `FSDP::all_gather` before each unit's forward and backward, `FSDP::post_backward_reduce` after. gloo has no reduce-scatter of its own: it runs an all-reduce (`gloo:all_reduce`) and keeps the rank's part.
- Waiting has **no span of its own**. When the training thread blocks on a collective, the time shows as a gap inside the enclosing span (DDP's wait at the end of backward, or `FSDP::all_gather`). A wait you add yourself is worth a `record_function` label, as the script does for its extra all-reduce.
- On a CPU there is no device time: the profiler's "CPU time" of a span is its wall-clock length on its thread, so it also grows when the machine is busy.

To say what bounds a step, split each step's time into four parts: loading (the `data` spans), computing (the `aten::` operators on the training thread), communicating while nothing else runs (a collective in flight, `gloo:` on any thread or a `c10d::`/`FSDP::`/`comm:` span on the training thread, minus the two before), and the rest (Python, the optimizer's glue). One rank's trace can mislead: a rank that finished its backward early waits inside the next collective for its partner, still computing, and that wait looks like communication. So take, step by step, the **least** communication over the ranks (the last rank to arrive waits only for the transfer) and the **most** computing and loading.
"""


# %% slideshow={"slide_type": "-"}
def union(intervals):
    """Sorted, non-overlapping intervals covering the same time."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def minus(intervals, cut):
    """The parts of (union) `intervals` that (union) `cut` does not cover."""
    out = []
    for a, b in intervals:
        for c, d in cut:
            if c < b and d > a:
                if c > a:
                    out.append([a, c])
                a = max(a, d)
        if a < b:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def step_parts(path):
    """For each profiled step of one rank: microseconds loading, computing, communicating alone, and in total."""
    events = spans(path)
    main = next(tid for name, tid, *_ in events if name == "step")
    rows = []
    for _, _, lo, hi in sorted((e for e in events if e[0] == "step"), key=lambda e: e[2]):
        inside = [(n, tid, max(a, lo), min(b, hi)) for n, tid, a, b in events if a < hi and b > lo]
        data = union([[a, b] for n, tid, a, b in inside if tid == main and n == "data"])
        launch = union([[a, b] for n, tid, a, b in inside if tid == main and n.startswith(("c10d::", "FSDP::", "comm:"))])
        ops = union([[a, b] for n, tid, a, b in inside if tid == main and n.startswith("aten::")])
        compute = minus(minus(ops, data), launch)
        comm = minus(minus(union(launch + [[a, b] for n, tid, a, b in inside if n.startswith("gloo:")]), data), compute)
        rows.append({"data": length(data), "compute": length(compute), "comm": length(comm), "step": hi - lo})
    return rows


def bound(paths):
    """What bounds the steps of a job, from every rank's trace: the largest share of the critical path."""
    per_rank = [step_parts(p) for p in paths]
    total = {k: 0.0 for k in ("data", "compute", "comm", "step")}
    for steps in zip(*per_rank):
        for k in ("data", "compute"):
            total[k] += max(s[k] for s in steps)
        total["comm"] += min(s["comm"] for s in steps)
        total["step"] += max(s["step"] for s in steps)
    shares = {k: total[k] / total["step"] for k in ("data", "compute", "comm")}
    return max(shares, key=shares.get), shares


LABEL = {"data": "input-bound", "compute": "compute-bound", "comm": "communication-bound"}
expected = {"slow loader": "data", "big batch": "compute", "big all-reduce": "comm"}
for scenario, kind in expected.items():
    paths = launch_ranks("_runs/traced_step.py:train", 2, args=("ddp", scenario, "_runs/traces"), timeout=120,
                         echo="none")
    found, shares = bound(paths)
    print(f"DDP, {scenario:<15}: {LABEL[found]:<20} (loading ~{shares['data']:.0%}, computing ~{shares['compute']:.0%}, "
          f"communicating ~{shares['comm']:.0%} of the step)")
    assert found == kind and shares[kind] > 0.5

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Each change moved the step to another bound, and the trace says which: the fix differs for each. An input-bound step wants loader workers (notebook 11 §7) or faster storage; a compute-bound step wants faster kernels (`torch.compile`, bf16, a better GPU) and can afford more communication; a communication-bound step wants fewer or smaller messages (buckets, `no_sync`, a sparser metric) or overlap. The same reading works on a GPU trace, where the compute is kernels on a stream; notebook 19 §6 runs Holistic Trace Analysis on the GPU traces of `fsdp_train.py --profile`, which splits each rank's GPU time into computation, non-computation and idleness (its "temporal breakdown") and measures how much of the communication ran under compute.

On GPUs, one effect never shows in a CPU trace or in the simulated device of section 4: overlapped communication is not free. NCCL's kernels run on the same GPU as the compute, take some of its streaming multiprocessors and memory bandwidth, and slow the compute kernels they overlap; a trace shows it as compute kernels that run longer while an NCCL kernel is active than when it is not (Rashidi et al. measure this interference in the references).

### Bus bandwidth of your own machine

The number to know about a cluster is the bandwidth its all-reduce reaches. `nccl-tests`, NVIDIA's benchmark, reports two: the *algorithm bandwidth* (bytes / time) and the *bus bandwidth*, the algorithm bandwidth × 2(n − 1)/n for an all-reduce over n ranks. The factor is the share of the data a ring all-reduce sends over each link (notebook 09 §2), so the bus bandwidth can be compared with the link's own speed whatever n is; the cell prints the factor for a few n. With 2 processes it is 1, and the two columns agree. Measured on this machine's 2 processes, with notebook 09's α-β model fitted to it:
"""

# %% slideshow={"slide_type": "-"}
from course_lib.comm_model import fit_alpha_beta

sizes = [2**k for k in range(12, 25, 2)]  # 4 KiB to 16 MiB
times = launch_ranks("_runs/traced_step.py:all_reduce_times", 2, args=(sizes,), timeout=120, echo="none")[0]
n = 2
print(f"{'message':>11} {'time':>12} {'algbw':>13} {'busbw':>13}")
for nbytes, t in zip(sizes, times):
    algbw = nbytes / t
    busbw = algbw * 2 * (n - 1) / n
    print(f"{nbytes / 2**10:>7,.0f} KiB {f'~{t * 1e6:.0f}':>9} us {f'~{algbw / 1e9:.2f}':>8} GB/s {f'~{busbw / 1e9:.2f}':>8} GB/s")
print("bus bandwidth / algorithm bandwidth, 2(n - 1)/n: " + ", ".join(f"n = {k}: {2 * (k - 1) / k:.2f}" for k in (2, 4, 8, 64)))
fit = fit_alpha_beta(sizes, times)
print(f"alpha-beta fit: latency ~{fit.alpha * 1e6:.0f} us, bandwidth ~{fit.beta / 1e9:.2f} GB/s "
      f"(worst relative error ~{fit.max_rel_error:.0%})")
assert fit.alpha > 0 and fit.beta > 0 and times[-1] > times[0]

fig, ax = plt.subplots(figsize=(6.5, 3.5))
ax.loglog(sizes, [s / t / 1e9 for s, t in zip(sizes, times)], "o-", label="measured (algorithm = bus bandwidth for n = 2)")
ax.loglog(sizes, [s / (fit.alpha + s / fit.beta) / 1e9 for s in sizes], "--", label="alpha-beta fit")
ax.set_xlabel("message size (bytes)")
ax.set_ylabel("bus bandwidth (GB/s)")
ax.set_title("All-reduce bus bandwidth between 2 CPU processes (gloo)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Small messages are latency-bound (the bandwidth climbs with the size), large ones approach the link's rate: the α-β curve says the same, with α and β of this machine. On a GPU cluster, `all_reduce_perf` from nccl-tests, run over 2 to N GPUs inside a node and then across nodes, gives the two bus bandwidths that the planner's `Cluster(intra=..., inter=...)` expects (notebook 21).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Under DDP, `torch.compile`'s DDPOptimizer cuts the graph where DDP's buckets begin, so each bucket's all-reduce can start between the subgraphs' backwards: 2 graphs for DDP's 2 default buckets; with `bucket_cap_mb=2`, 5 graphs for DDP's 4 buckets (it always assumes a 1 MiB first bucket); 1 graph with `optimize_ddp=False`.
- FSDP2: compile each block (`block.compile()`) before or after `fully_shard`; the hooks stay between the compiled pieces and the losses equal eager.
- `torch._dynamo.explain` lists graph breaks and their reasons, `TORCH_LOGS=recompiles` the guard that failed; compiled autograd captures the backward at run time as one more graph.
- Overlap measured with PyTorch's own DDP and FSDP2 on a simulated device: DDP hid 3 of 4 all-reduces under backward; FSDP2's prefetch on a CPU needs the private `_set_unshard_async_op(True)` and hides the all-gathers only; both savings agree with the α-β prediction in order of magnitude (the printed `~` numbers; on a busy machine the collectives take longer than the idle fit predicts, and overlap hides more).
- A profiler trace shows each collective twice (handed over on the training thread, run on the backend's thread); waiting has no span. Split each step into loading, computing and communicating alone, taking the least communication over the ranks: one change each made the step input-, compute- or communication-bound. The bus bandwidth (algorithm bandwidth × 2(n − 1)/n) and the α-β fit describe a cluster's links.
- A `k` times larger global batch needs a larger learning rate (linear for SGD, about `sqrt(k)` for Adam, with warmup), and past the critical batch size a larger batch buys few steps.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `ddp_optimizer_graphs(layer_bytes, bucket_cap_bytes, first_bucket_cap_bytes=2**20)`: the number of graphs DDPOptimizer cuts a model into, given the parameter bytes of its layers in forward order. It walks the layers backwards, adding each layer's bytes to the current bucket, and closes the bucket as soon as its bytes reach the cap (the first bucket's cap for the first bucket).
2. Write `scaled_lr(step, base_lr, base_batch, batch, rule, warmup_steps)`: the learning rate at optimizer step `step` (0-based) when the batch grows from `base_batch` to `batch`, for `rule` in `"none"`, `"linear"`, `"sqrt"`, with a linear warmup to the peak rate over the first `warmup_steps` steps (rate × `(step + 1) / warmup_steps`, as in section 6; no warmup when `warmup_steps` is 0).
3. Section 4's prediction, for any layers. Write `exposed_wait(backward_ms, allreduce_ms)`: how long a DDP step waits after backward with overlap, given each layer's backward time and its bucket's all-reduce time, both in the order backward runs the layers (last layer first). A bucket's all-reduce starts when its layer's backward is done **and** the previous all-reduce has finished (one link, one message at a time).
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.compile_overlap_batch import (check_ddp_optimizer_graphs, check_exposed_comm,
                                                        check_exposed_wait, check_scaled_lr)


def ddp_optimizer_graphs(layer_bytes, bucket_cap_bytes, first_bucket_cap_bytes=2**20):
    raise NotImplementedError  # your code here


print(check_ddp_optimizer_graphs(ddp_optimizer_graphs))


# %% slideshow={"slide_type": "-"}
def scaled_lr(step, base_lr, base_batch, batch, rule, warmup_steps):
    raise NotImplementedError  # your code here


print(check_scaled_lr(scaled_lr))


# %% slideshow={"slide_type": "-"}
def exposed_wait(backward_ms, allreduce_ms):
    raise NotImplementedError  # your code here


print(check_exposed_wait(exposed_wait))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
4. Section 8's reading of a trace, for any spans. Write `exposed_comm(compute, comm)`: given the `(start, end)` intervals in which the training thread computed and those in which a collective was in flight (either list may overlap itself, as nested or concurrent spans of a trace do), return how long communication ran while nothing computed.
"""


# %% slideshow={"slide_type": "-"}
def exposed_comm(compute, comm):
    raise NotImplementedError  # your code here


print(check_exposed_comm(exposed_comm))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [`torch.compile`](https://pytorch.org/docs/stable/generated/torch.compile.html), [torch.compiler troubleshooting](https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html) (`TORCH_LOGS`, `torch._dynamo.explain`, graph breaks and recompiles), [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html) (`bucket_cap_mb`, `no_sync`, communication hooks), [`fully_shard`](https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) (`set_modules_to_forward_prefetch`).
- PyTorch tutorials: [Compiled Autograd](https://pytorch.org/tutorials/intermediate/compiled_autograd_tutorial.html), [Regional compilation](https://pytorch.org/tutorials/recipes/regional_compilation.html); the DDPOptimizer's design is described in the docstring of `torch/_dynamo/backends/distributed.py`.
- P. Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*, 2017, [arXiv:1706.02677](https://arxiv.org/abs/1706.02677) (linear scaling, warmup).
- PyTorch docs: [`torch.profiler`](https://pytorch.org/docs/stable/profiler.html) and the tutorial [Profiling your PyTorch module](https://pytorch.org/tutorials/beginner/profiler.html); [Perfetto](https://ui.perfetto.dev); [Holistic Trace Analysis](https://hta.readthedocs.io).
- S. Rashidi et al., *T3: Transparent Tracking & Triggering for Fine-grained Overlap of Compute & Collectives*, ASPLOS 2024, [arXiv:2401.16677](https://arxiv.org/abs/2401.16677) (overlapped collectives slow the compute they share the GPU with).
- NVIDIA, [nccl-tests: performance reported](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md) (algorithm and bus bandwidth).
- S. Malladi et al., *On the SDEs and Scaling Rules for Adaptive Gradient Algorithms*, NeurIPS 2022, [arXiv:2205.10287](https://arxiv.org/abs/2205.10287) (square-root scaling for Adam).
- S. McCandlish, J. Kaplan, D. Amodei et al., *An Empirical Model of Large-Batch Training*, 2018, [arXiv:1812.06162](https://arxiv.org/abs/1812.06162) (the critical batch size).
- J. Kaplan et al., *Scaling Laws for Neural Language Models*, 2020, [arXiv:2001.08361](https://arxiv.org/abs/2001.08361) (the critical batch size against the loss).
"""
