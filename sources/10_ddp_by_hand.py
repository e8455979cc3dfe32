# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 10 · DDP by hand: hooks, buckets and overlap
`DistributedDataParallel` (DDP) is notebook 09's average of the gradients, started during backward instead of after it. This notebook writes it, in three stages, each checked bit for bit against PyTorch's own on a model with the two things real models have and toy ones lack, a frozen parameter and a tied one; then it measures what starting the all-reduces during backward hides, on a simulated device.

By the end you will be able to:
- write data parallelism's gradient average three ways: one all-reduce per parameter after backward, one started by a gradient hook during backward, and buckets launched in order;
- say why a frozen parameter gets no hook, why a tied one is all-reduced once, why rank 0's parameters are broadcast first, and why a hook should reach its wrapper through a weak reference;
- check a hand-written DDP against `DistributedDataParallel`, in values (bit for bit) and in messages, with a communication hook that counts DDP's buckets;
- predict DDP's bucket boundaries from the gradient sizes and the cap;
- measure, on a simulated device, how much communication hides behind backward, and say why the whole step's saving is smaller on a busy CPU than on a GPU.

This notebook assumes: notebook 09 (the collectives, the ring all-reduce and the α-β model; `course_lib.launch.run_ranks`, which 09 §3 introduces) and notebook 02 §6 (`register_post_accumulate_grad_hook`). It runs on 2 CPU cores: two processes on the gloo backend; no GPU needed.
"""

# %% slideshow={"slide_type": "-"}
import statistics
from pathlib import Path
import matplotlib.pyplot as plt
import torch
from course_lib.launch import run_ranks
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)   # one thread: steadier timings on a shared machine
runs = Path("_runs")
runs.mkdir(exist_ok=True)   # scratch folder for the scripts this notebook writes (git ignores it)
for old in ("hand_ddp.py", "overlap.py"):
    (runs / old).unlink(missing_ok=True)   # so that %%writefile always says "Writing"
print(f"torch {torch.__version__.split('+')[0]}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Three stages, each equal to DDP
`DistributedDataParallel` computes notebook 09 §2's average, but during backward instead of after it. We now write it ourselves, in three stages, each checked bit for bit against PyTorch's `torch.nn.parallel.DistributedDataParallel` after 4 AdamW steps on the digits. (Bit for bit is the right test here: with 2 ranks, dividing by 2 is exact and a sum of two floats is the same in either order, so any difference would be a bug.) The model has the two things a real one has and a toy one lacks:
- a **frozen parameter** (`requires_grad=False`, like a frozen embedding or backbone; notebook 01 §6): it gets no gradient, so there is nothing to average and it gets no hook;
- a **tied weight** (one `Parameter` used by two layers, like an embedding shared with the output layer): `model.parameters()` lists it once, and autograd adds both uses into its one `.grad` before its hook fires, so it is all-reduced once.

What every stage does first, as DDP does at construction: **broadcast rank 0's parameters and buffers**, so that ranks which initialised differently (here each rank seeds with its own rank) start equal. Then:
1. **After backward, one all-reduce per parameter.** Divide each gradient by the world size once and `all_reduce` it (a sum): every rank holds the mean. Correct, but all communication waits for the end of backward.
2. **A hook per parameter.** `p.register_post_accumulate_grad_hook(hook)` (notebook 02 §6) calls `hook(p)` as soon as `p.grad` holds `p`'s whole gradient, while backward goes on with earlier layers. The hook starts `dist.all_reduce(p.grad, async_op=True)`, which returns a *handle* at once; the step waits for every handle (`handle.wait()`) before `optimizer.step()`. Divide before the launch: once its collective has started, a tensor belongs to it until `wait()` returns. The hook reaches the wrapper through a weak reference (`weakref.WeakMethod`), not the bound method `self.ready`: the parameter holds its hooks, so a bound method would make a cycle (parameter → hook → wrapper → parameter) that reference counting never frees. The objects would wait for the garbage collector, and with them the process group and its threads, possibly into interpreter shutdown, where a gloo thread can abort the process (notebook 11 §10.2).
3. **Buckets.** Each message pays the latency `α` (notebook 09 §5), so DDP groups gradients into buckets. In reverse registration order (the order backward produces them), whole tensors, a bucket is closed as soon as it reaches the cap; a complete bucket is copied into one flat tensor and all-reduced, and `finish()` copies the averages back. Buckets are launched strictly in order, so that every rank issues the same collectives in the same order, even if one rank's hooks fire in another order.

Here `bucket_cap_mb` is passed explicitly, so it caps every bucket; with the default (25 MiB) DDP caps the first bucket at 1 MiB, and its first step uses a single bucket before rebuilding them in the order the gradients arrived (notebook 12 §3.2). The collectives are counted on both sides: our classes note the bytes of each all-reduce, and on DDP a communication hook notes each bucket.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/hand_ddp.py
"""DDP by hand in three stages, each checked against DistributedDataParallel on the same model and data."""
import weakref
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from course_lib.data import digits
from course_lib.hand_ddp import HandDDP

def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(),
                          nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 10))
    model[4].weight = model[2].weight     # tied: one Parameter used by two layers
    model[0].bias.requires_grad_(False)   # frozen: no gradient, nothing to average
    return model

def broadcast_from_rank0(model: nn.Module) -> None:
    """At construction: every rank starts from rank 0's parameters and buffers."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)

def trainable(model: nn.Module) -> list:
    return [p for p in model.parameters() if p.requires_grad]   # parameters() yields a tied tensor once

class AfterBackward:
    """Stage 1: after backward, one all-reduce per parameter."""
    def __init__(self, model: nn.Module):
        broadcast_from_rank0(model)
        self.params, self.sent = trainable(model), []

    def finish(self) -> None:
        for p in reversed(self.params):         # any order gives the same result; this is DDP's
            p.grad.div_(dist.get_world_size())   # average once: the sum over ranks of grad / N
            dist.all_reduce(p.grad)
            self.sent.append(p.grad.numel() * p.grad.element_size())

class HookPerParameter:
    """Stage 2: a hook per parameter starts its all-reduce the moment its gradient is ready."""
    def __init__(self, model: nn.Module):
        broadcast_from_rank0(model)
        self.handles, self.sent = [], []
        ready = weakref.WeakMethod(self.ready)   # not self.ready itself: a cycle (point 2 above)
        for p in trainable(model):
            p.register_post_accumulate_grad_hook(lambda p: ready()(p))

    def ready(self, p: torch.Tensor) -> None:   # autograd calls it once p.grad holds p's whole gradient
        p.grad.div_(dist.get_world_size())
        self.handles.append(dist.all_reduce(p.grad, async_op=True))   # returns at once: backward goes on
        self.sent.append(p.grad.numel() * p.grad.element_size())

    def finish(self) -> None:   # before optimizer.step(): wait for every all-reduce
        for handle in self.handles:
            handle.wait()
        self.handles.clear()

class Buckets:
    """Stage 3: gradients grouped into buckets, in the order they become ready; one all-reduce per bucket."""
    def __init__(self, model: nn.Module, bucket_cap_mb: float):
        broadcast_from_rank0(model)
        cap = int(bucket_cap_mb * 2**20)        # bucket_cap_mb is in MiB
        self.buckets, bucket, size = [], [], 0
        for p in reversed(trainable(model)):   # the last layer's gradients are ready first
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:                     # whole tensors: a bucket closes once it reaches the cap
                self.buckets.append(bucket)
                bucket, size = [], 0
        self.buckets += [bucket] if bucket else []
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.count, self.next, self.pending, self.sent = [0] * len(self.buckets), 0, [], []
        ready = weakref.WeakMethod(self.ready)
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(lambda p: ready()(p))

    def ready(self, p: torch.Tensor) -> None:
        self.count[self.bucket_of[p]] += 1
        while self.next < len(self.buckets) and self.count[self.next] == len(self.buckets[self.next]):
            bucket = self.buckets[self.next]    # complete, and every earlier bucket started: the same order everywhere
            flat = torch.cat([q.grad.reshape(-1) for q in bucket]).div_(dist.get_world_size())
            self.pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
            self.sent.append(flat.numel() * flat.element_size())
            self.next += 1

    def finish(self) -> None:
        for bucket, flat, handle in self.pending:
            handle.wait()
            for q, averaged in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(averaged.view_as(q.grad))   # from the bucket back into each .grad
        self.pending, self.next, self.count = [], 0, [0] * len(self.buckets)

def counting_hook(sent, bucket):   # no annotations: DDP checks them against its own (dist.GradBucket, Future)
    """A DDP communication hook: note the bucket's bytes, then do DDP's own all-reduce."""
    sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
    return allreduce_hook(None, bucket)

def wrap(kind: str, model: nn.Module, cap: float):
    """(the module to call, the object whose finish() ends a step or None, the list of all-reduced bytes)"""
    if kind == "DDP":
        ddp, sent = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap), []
        ddp.register_comm_hook(sent, counting_hook)
        return ddp, None, sent
    if kind.startswith("course_lib"):        # the library's copy of the three stages (its log counts the bytes)
        hand = HandDDP(model, bucket_cap_mb=cap, overlap=not kind.endswith("after backward"))
        return hand, hand, None
    stage = {"after backward": AfterBackward, "hook per parameter": HookPerParameter}.get(kind)
    hand = stage(model) if stage else Buckets(model, cap)
    return model, hand, hand.sent

def train(rank: int, kind: str, cap: float, steps: int = 4) -> dict:
    model = make_model(seed=rank)   # each rank its own random weights: the construction broadcast fixes that
    forward, hand, sent = wrap(kind, model, cap)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    train_set = digits()[0]
    x, y, per_step = train_set.flat(), train_set.y, []
    for step in range(steps):
        rows = slice(64 * step + 32 * rank, 64 * step + 32 * (rank + 1))   # this rank's own 32 samples
        opt.zero_grad()
        F.cross_entropy(forward(x[rows]), y[rows]).backward()
        if hand is not None:
            hand.finish()   # every all-reduce has landed: .grad holds the mean over the ranks
        opt.step()
        if sent is None:
            per_step.append(hand.log.sizes("all_reduce"))
            hand.log.reset()
        else:
            per_step.append(list(sent))
            sent.clear()
    return {"params": [p.detach().clone() for p in model.parameters()], "all-reduced bytes": per_step,
            "frozen has no grad": model[0].bias.grad is None}

def compare(rank: int, world_size: int, cap: float) -> dict:
    runs = {(kind, kind_cap): train(rank, kind, kind_cap) for kind, kind_cap in [
        ("DDP", cap), ("DDP", 0), ("after backward", 0), ("hook per parameter", 0), ("buckets", cap),
        ("course_lib after backward", 0), ("course_lib hooks", 0), ("course_lib buckets", cap)]}
    model = make_model(seed=0)
    slots = [p for m in model if isinstance(m, nn.Linear) for p in (m.weight, m.bias) if p.requires_grad]
    runs["count"] = (len(slots), len(trainable(model)))   # weight and bias slots with a gradient; distinct tensors
    return runs


# %% slideshow={"slide_type": "fragment"}
cap = 0.002   # MiB: 2,097 bytes, so that this small model (23,848 bytes of trainable gradients) gets 3 buckets
runs = run_ranks("_runs/hand_ddp.py:compare", nprocs=2, args=(cap,), timeout=600, echo="none")
rank0 = runs[0]
print("4 AdamW steps, 2 ranks; all-reduced bytes per step (DDP counted by a communication hook):")
for c in (cap, 0):
    print(f"  DDP, {f'bucket_cap_mb={c}:':<20} step 1 {rank0[('DDP', c)]['all-reduced bytes'][0]}, "
          f"steps 2-4 {rank0[('DDP', c)]['all-reduced bytes'][1]}")
for kind, kind_cap, twin in [("after backward", 0, 0), ("hook per parameter", 0, 0), ("buckets", cap, cap)]:
    ours = rank0[(kind, kind_cap)]
    equal = all(torch.equal(a, b) for r in runs for a, b in zip(r[(kind, kind_cap)]["params"], r[("DDP", twin)]["params"]))
    same_messages = ours["all-reduced bytes"][1:] == rank0[("DDP", twin)]["all-reduced bytes"][1:]   # in the same order
    assert equal and same_messages and all(r[(kind, kind_cap)]["frozen has no grad"] for r in runs)
    print(f"{kind:<19} parameters equal to DDP's on both ranks: {equal}; all-reduces per step "
          f"{ours['all-reduced bytes'][0]}, DDP's (bucket_cap_mb={twin}) from step 2 on: {same_messages}")
assert all(torch.equal(a, b) for a, b in zip(runs[0][("buckets", cap)]["params"], runs[1][("buckets", cap)]["params"]))
assert len(rank0[("DDP", cap)]["all-reduced bytes"][0]) == 1   # DDP's first step: one bucket for everything
print("the frozen bias has no gradient on either rank; both ranks end with the same parameters")
slots, tensors = rank0["count"]
assert (slots, tensors) == (7, 6) and all(len(rank0[(k, 0)]["all-reduced bytes"][1]) == tensors
                                          for k in ("after backward", "hook per parameter"))
print(f"{slots} weight and bias slots get a gradient, but the tied weight fills two of them: {tensors} tensors, "
      f"{tensors} all-reduces per step")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
All three stages compute exactly DDP's training, and from step 2 on they send exactly DDP's messages: one all-reduce per trainable tensor for stages 1 and 2 (DDP with `bucket_cap_mb=0` does the same), and the 3 buckets for stage 3. The frozen bias is never sent, and the tied weight is sent once (7 slots, 6 tensors, 6 messages: the last line above). DDP's step 1 differs, as promised: one bucket of everything, before its rebuild.

`course_lib.hand_ddp.HandDDP` is the library's version of these stages, the one section 2 measures, with what a reusable version needs on top (a `no_sync()` for accumulation, DDP's buffer broadcast before forwards, its default first-bucket cap, a log of every collective, a timeline for section 2). The same launch trained it too; it must agree with ours, in values and in messages:
"""

# %% slideshow={"slide_type": "fragment"}
for ours, theirs in [(("after backward", 0), ("course_lib after backward", 0)), (("hook per parameter", 0), ("course_lib hooks", 0)),
                     (("buckets", cap), ("course_lib buckets", cap))]:
    for r in runs:
        assert all(torch.equal(a, b) for a, b in zip(r[ours]["params"], r[theirs]["params"]))
        assert r[ours]["all-reduced bytes"] == r[theirs]["all-reduced bytes"]
    print(f"{ours[0]:<19} = {theirs[0]}: equal parameters, the same all-reduces at every step")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Overlap, measured on a simulated device
Stages 2 and 3 start communicating during backward. What does that buy? On a GPU, backward's kernels run on the device while NCCL moves the finished buckets over the links, so communication hides behind compute. On a CPU the two would fight over the same cores, so we **simulate the device**: `course_lib.simulated_compute.simulated_mlp` builds layers that do their (tiny) real math and then *sleep* for a fixed time, which takes no core and releases the GIL, as a GPU computes without the CPU. 4 layers of 1024 × 1024, each taking 5 ms forward and 30 ms backward: the compute time of a step is known in advance. The all-reduces are real gloo all-reduces, one 4 MiB bucket per layer.

`HandDDP` is stage 3 with a `Timeline` that records each layer's compute and each all-reduce, from its launch to its completion; with `overlap=False` it starts the same buckets from `finish()`, after backward, as stage 1 does. The two settings alternate step by step (8 pairs), so both see the same load. What the cell asserts holds on a busy machine too: with overlap, every bucket but the first layer's starts during backward, and part of the communication is hidden behind compute, where without overlap none is; and the step waits less after backward (the median of the paired differences is positive). The times, after `~`, are this machine's.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/overlap.py
"""HandDDP on a simulated device: the same buckets all-reduced during backward (overlap) or after it."""
import torch
import torch.distributed as dist
from course_lib.hand_ddp import HandDDP
from course_lib.simulated_compute import Timeline, hidden_seconds, simulated_mlp

def measure(rank: int, world_size: int, pairs: int, width: int, depth: int, forward_ms: float, backward_ms: float) -> dict:
    torch.set_num_threads(1)
    timeline = Timeline(rank)
    model = simulated_mlp(width, depth, forward_ms, backward_ms, timeline)   # the same weights on every rank
    hand = HandDDP(model, bucket_cap_mb=4, timeline=timeline)                # 4 MiB: one bucket per layer
    x = torch.randn(2, width, generator=torch.Generator().manual_seed(rank))
    rows, last = {True: [], False: []}, {}
    for step in range(2 * (pairs + 1)):
        hand.overlap = step % 2 == 0          # on, off, on, off, ...: both settings see the same load
        model.zero_grad(set_to_none=False)
        dist.barrier()
        timeline.reset()
        hand(x).square().mean().backward()
        hand.finish()
        done = timeline.now()
        dist.barrier()                        # both ranks done: every completion has been recorded
        spans = timeline.spans
        backward_end = max(s.end for s in spans if s.lane == "compute")
        if step >= 2:                         # the first pair warms up
            rows[hand.overlap].append({
                "step": done, "wait after backward": done - backward_end, "hidden": hidden_seconds(spans),
                "started during backward": sum(s.lane == "comm" and s.start < backward_end for s in spans)})
            last[hand.overlap] = spans
    return {"rows": rows, "spans": last, "buckets": hand.bucket_sizes}


# %% slideshow={"slide_type": "fragment"}
from course_lib.simulated_compute import hidden_seconds, plot_timeline

width, depth, forward_ms, backward_ms, pairs = 1024, 4, 5, 30, 8
result = run_ranks("_runs/overlap.py:measure", nprocs=2, args=(pairs, width, depth, forward_ms, backward_ms),
                   timeout=600, echo="none")[0]
on, off = result["rows"][True], result["rows"][False]

def median_ms(rows: list[dict], key: str) -> float:
    return 1000 * statistics.median(r[key] for r in rows)

print(f"{depth} layers of {width} x {width}, forward {forward_ms} ms + backward {backward_ms} ms each: "
      f"{depth * (forward_ms + backward_ms)} ms of simulated compute per step; {len(result['buckets'])} buckets of "
      f"{result['buckets'][0]:,} bytes; {pairs} pairs of steps, rank 0")
for name, rows in (("overlap on ", on), ("overlap off", off)):
    started = {r["started during backward"] for r in rows}
    assert len(started) == 1   # the same in every step: decided by the code, not by the timing
    print(f"{name}: {started.pop()} of {depth} all-reduces started during backward; medians: communication hidden "
          f"behind compute ~{median_ms(rows, 'hidden'):.0f} ms, wait after backward "
          f"~{median_ms(rows, 'wait after backward'):.0f} ms, step ~{median_ms(rows, 'step'):.0f} ms")
assert all(r["started during backward"] == depth - 1 for r in on) and all(r["started during backward"] == 0 for r in off)
assert all(r["hidden"] == 0 for r in off) and median_ms(on, "hidden") > 0
saving = [b["wait after backward"] - a["wait after backward"] for a, b in zip(on, off)]   # paired: same load
assert statistics.median(saving) > 0
print(f"overlap saves ~{1000 * statistics.median(saving):.0f} ms of waiting after backward per step (median of "
      f"{pairs} paired steps, asserted > 0); the whole step ~{median_ms(off, 'step') - median_ms(on, 'step'):.0f} ms "
      "(not asserted: see below)")

fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True, layout="tight")
for ax, overlap in zip(axes, (True, False)):
    spans = result["spans"][overlap]
    plot_timeline(spans, ax=ax, title=f"overlap {'on' if overlap else 'off'}: one step on rank 0, "
                  f"communication hidden behind compute ~{1000 * hidden_seconds(spans):.0f} ms")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the chart from left to right: the blue forward, then the orange backward, last layer first. A step takes longer than its simulated compute: add the wait after backward, the layers' real math and the hooks' copies, and on a busy machine the time the processes wait for a core (the gaps between the bars). With overlap, each green all-reduce starts as soon as its layer's backward is done and runs under the next layer's backward; only the last bucket's (the first layer's) is left when backward ends. Without overlap, all four wait for the end of backward and run one after the other.

The whole step's saving, printed last, is another matter on a busy machine: smaller than the wait's, and not reliably there. The two processes share two cores with other work, so a step's time moves by tens of milliseconds from one step to the next; and the copies into the buckets (`torch.cat`) and gloo's own copying need those cores too, so with overlap the gaps between the backward layers grow (compare the two charts). On a GPU the copies are kernels, NCCL moves the bytes over its own links, and overlap pays in full.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary
- DDP starts where notebook 09 ended, with one average of the gradients per step, and moves it into backward. At construction it broadcasts rank 0's parameters and buffers, so ranks that initialised differently start equal.
- Stage 1 divides each gradient by the world size and all-reduces it after backward. Stage 2 registers a `register_post_accumulate_grad_hook` per trainable parameter, which starts an asynchronous all-reduce (`async_op=True`) as soon as that gradient is whole; the step waits for the handles before `optimizer.step()`. Stage 3 groups the gradients into buckets, in reverse registration order, whole tensors, closed once they reach the cap, and launches them strictly in order, so that every rank issues the same collectives in the same order.
- A frozen parameter gets no gradient and no hook; a tied one is listed once by `parameters()`, so it is all-reduced once (7 weight and bias slots, 6 tensors, 6 messages here). A hook reaches its wrapper through a weak reference, or parameter, hook and wrapper form a cycle only the garbage collector frees.
- All three stages equal `DistributedDataParallel` bit for bit on 2 ranks and send its messages from its second step on (its first step sends one bucket of everything, then it rebuilds the buckets in the order the gradients arrived). `course_lib.hand_ddp.HandDDP`, the library's copy, agrees with them in values and messages.
- On a simulated device the all-reduces started during backward hide part of their time behind compute, and the step waits less after backward. On a CPU shared with other work the whole step's saving is smaller and not reliable: the copies into buckets and gloo's own work need the same cores. On a GPU they are kernels and NCCL's transfers, and overlap pays in full.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises
**1.** Stage 2 of section 1, from memory. Write `add_overlap_hooks(model, handles, world_size)`: give every parameter that needs one a hook that, as soon as its gradient is ready, averages it once and starts its all-reduce without waiting, keeping the handle in `handles`. The check runs your hooks on 3 simulated ranks, on a model with a frozen weight and a tied one, and waits on your handles as a training step would. *Simulated ranks*: this kernel has no process group, so for the length of the check, `dist.all_reduce`, `dist.get_rank` and `dist.get_world_size` are replaced by stand-ins. Your hooks run once per rank, one rank after the other, on three copies of the model; each `all_reduce` call is recorded with the tensor you handed it (as it was at the call, as a backend reads it) and returns a handle; once all three ranks have run, the stand-in writes the sum into each rank's tensor, as the real collective would, and the check compares the averages with the true ones. So call the collective exactly as a real script does (`dist.all_reduce(grad, async_op=True)`); to debug, print inside your hook: each line is one rank's call.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.ddp_by_hand import check_bucket_boundaries, check_overlap_hook


def add_overlap_hooks(model, handles, world_size):
    """A hook per parameter that needs one: average its gradient once, start its all-reduce, keep the handle."""
    raise NotImplementedError  # your code here

print(check_overlap_hook(add_overlap_hooks))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Stage 3's bucket boundaries as a pure function. Write `assign_buckets(param_bytes, cap_bytes)`: given each parameter's gradient bytes in registration order and a cap in bytes (applied to every bucket, as when you pass `bucket_cap_mb`), return the buckets, as lists of parameter indices, in the order DDP all-reduces them. One of the checked cases is the model of notebook 11 §9.
"""


# %% slideshow={"slide_type": "-"}
def assign_buckets(param_bytes, cap_bytes):
    """param_bytes in registration order -> the buckets (lists of indices), in the order DDP all-reduces them."""
    raise NotImplementedError  # your code here

print(check_bucket_boundaries(assign_buckets))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References
- S. Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020 (DDP's design: buckets, overlap, the first-step rebuild): https://arxiv.org/abs/2006.15704
- PyTorch, *Distributed Data Parallel* design note (the construction broadcast, buckets in reverse order, the autograd hooks): https://pytorch.org/docs/stable/notes/ddp.html
- PyTorch, `torch.nn.parallel.DistributedDataParallel` (`bucket_cap_mb`, `register_comm_hook`): https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
- PyTorch, `torch.Tensor.register_post_accumulate_grad_hook`: https://pytorch.org/docs/stable/generated/torch.Tensor.register_post_accumulate_grad_hook.html
- PyTorch, *DDP Communication Hooks* (`allreduce_hook` and the built-in hooks): https://pytorch.org/docs/stable/ddp_comm_hooks.html
- Python, `weakref.WeakMethod`: https://docs.python.org/3/library/weakref.html#weakref.WeakMethod
"""
