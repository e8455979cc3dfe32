# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 12 · DDP's knobs, hangs and restarts

Notebook 11 launched DDP and proved it exact. This one opens the settings and the failures people meet next: what DDP does **between** steps (it is not silent), the parameters a step does not use, what the gradient buckets cost in memory and how they are formed, compressing the all-reduce, ranks that run out of batches, tools that find a hang, a job that **restarts after a crash** and must end exactly where an uninterrupted one does, and how NCCL, the GPU backend, changes the way a hang shows. Every claim is shown by real gloo processes on this CPU; each hang is bounded to a second or two, by a short timeout on the one collective that hangs.

By the end you will be able to:
- say when DDP broadcasts rank 0's buffers (before any forward that follows one run with gradients), what that does to BatchNorm statistics, and why evaluating on rank 0 alone through the DDP model hangs;
- read the "Expected to have finished reduction in the prior iteration" error and choose between `find_unused_parameters=True` and `static_graph=True`; combine DDP with activation checkpointing;
- count the memory `gradient_as_bucket_view=True` saves, predict DDP's bucket sizes (the 1 MiB first bucket, the rebuild after step 1), and halve the bytes sent with a compression hook;
- train on uneven inputs with `join()` (and say what it divides by), and find a hang with `monitored_barrier`, `TORCH_DISTRIBUTED_DEBUG` and timeouts;
- write a training script that `torchrun --max-restarts` can restart: the whole training state saved and restored, checked bit for bit against an uninterrupted run, and say what the same needs on GPUs;
- explain how NCCL's stream semantics, watchdog and `batch_isend_irecv` differ from gloo, and read a flight-recorder dump.

This notebook assumes: notebook 11 (a DDP script, `torchrun`, `DistributedSampler`, the teardown), notebook 09 (the collectives), and notebook 04 (activation checkpointing). No GPU: every job is CPU processes on gloo; the two GPU cells (sections 6 and 7) run where GPUs are visible and say what they skipped elsewhere.
"""

# %% slideshow={"slide_type": "-"}
import inspect
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.run

from course_lib.errors import expect_error
from course_lib.device import requires_gpu
from course_lib.launch import LaunchError, run_ranks, run_script, run_torchrun
from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
sys.path.insert(0, os.path.abspath("_runs"))
print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Between steps: DDP broadcasts rank 0's buffers before a forward

Notebook 11 showed the broadcast at construction: every rank starts from rank 0's parameters **and buffers**. It does not stop there. By default DDP broadcasts rank 0's buffers (BatchNorm's `running_mean`, `running_var`, `num_batches_tracked`) to every other rank at the start of a forward, **whenever the previous forward ran with gradients enabled** (and at the first forward). In a training loop that is every forward. The flag is `broadcast_buffers=True`; PyTorch 2.13 deprecates it in favour of `forward_sync_buffers` (default `True`). Two consequences:

- the running statistics that end up in the model are **rank 0's**: whatever rank 1 accumulated from its own batches is overwritten at its next forward, and what it keeps is rank 0's statistics plus one update from its last batch;
- the broadcast is a **collective**, and the rule says nothing about `model.eval()` or `torch.no_grad()`: the first evaluation forward after a training step broadcasts too. A forward through the DDP model on rank 0 alone (a rank-0-only validation loop) then waits for a rank 1 that never comes.

The job below gives the two ranks different data (rank 1's inputs are shifted by 3), runs two training steps, and records the BatchNorm statistics. Then it runs a sequence of forwards, some on both ranks and some on rank 0 alone, and records before each whether DDP is about to broadcast (`ddp.will_sync_module_buffers()`, the test DDP's forward makes).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_buffers.py
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.torch_private import set_group_timeout  # torch.distributed's private _set_pg_timeout

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=0.1))

def buffers(rank, world_size):
    report = {}
    torch.manual_seed(10 + rank)
    x = torch.randn(16, 4) + 3.0 * rank  # each rank's data has its own statistics
    for sync in (True, False):
        model = net()
        ddp = DDP(model, forward_sync_buffers=sync)
        ddp(x).sum().backward()  # step 1
        before = model[1].running_mean.clone()  # each rank updated its own copy
        with torch.no_grad():
            batch_mean = model[0](x).mean(0)  # the batch statistic step 2 will use (weights unchanged: no step)
        ddp(x).sum().backward()  # step 2: (broadcast rank 0's buffers,) then update with this rank's batch
        after = model[1].running_mean.clone()
        everyone = [torch.empty_like(before) for _ in range(world_size)]
        dist.all_gather(everyone, before)
        report[sync] = {"before": before[:2].tolist(), "after": after[:2].tolist(),
                        "from_rank0": torch.allclose(after, 0.9 * everyone[0] + 0.1 * batch_mean, atol=1e-6),
                        "from_own": torch.allclose(after, 0.9 * before + 0.1 * batch_mean, atol=1e-6)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DDP(net(), broadcast_buffers=True)
    report["warning"] = str(caught[0].message)
    report["timeline"] = timeline(rank, x)
    return report

def timeline(rank, x):  # which forwards broadcast? One DDP model; a row: (who runs it, what, broadcasts?, outcome)
    group = dist.new_group()  # the default timeout (30 min): no step both ranks take can time out
    ddp = DDP(net(), process_group=group)
    rows = []

    def forward(who, grad):  # with gradients: a training forward; without: an evaluation one
        ddp.train(grad)
        broadcasts = ddp.will_sync_module_buffers()  # what DDP's forward is about to do
        if rank in who:
            start = time.perf_counter()
            try:
                with torch.set_grad_enabled(grad):
                    out = ddp(x)
                if grad:
                    out.sum().backward()  # the backward's all-reduce: every rank takes part
                outcome = "returned"
            except RuntimeError as e:  # gloo words its timeouts in more than one way
                timed_out = "timed out" in str(e).lower() or "timeout" in str(e).lower()
                outcome = "RuntimeError: " + ("a gloo timeout" if timed_out else str(e).splitlines()[0])
            what = "train forward + backward" if grad else "eval forward, no_grad"
            rows.append((who, what, broadcasts, outcome, time.perf_counter() - start))

    forward((0, 1), True)  # both ranks
    forward((0, 1), False)  # both ranks: the first no_grad forward after one with gradients
    forward((0,), False)  # rank 0 alone: a second no_grad forward in a row
    forward((0, 1), True)  # both ranks
    # rank 0 alone again: its forward waits for rank 1, which never comes (rank 1 is already in the barrier below).
    # That hang is the lesson, and only here does a short timeout bound it (a private helper, section 4.2).
    set_group_timeout(timedelta(seconds=1.5), group)
    forward((0,), False)
    if rank == 0:
        with torch.no_grad():
            rows.append(((0,), "ddp.module(x), no_grad", False, "returned" if ddp.module(x).shape == (16, 4) else "?", 0.0))
    dist.barrier()  # on the default group: rank 1 waits here for rank 0
    return rows


# %% slideshow={"slide_type": "-"}
from ddp_buffers import buffers
r0, r1 = reports = run_ranks(buffers, nprocs=2, timeout=180)
print(f"{'':>22} {'rank 0':>18} {'rank 1':>18}   (running_mean[:2])")
for sync in (True, False):
    print(f"forward_sync_buffers={sync}")
    for step, when in ((1, "before"), (2, "after")):
        print(f"{f'after step {step}':>22}" + "".join(f"{str([round(v, 4) for v in r[sync][when]]):>19}" for r in reports))
assert r1[True]["from_rank0"] and not r1[True]["from_own"]  # rank 1 = rank 0's statistics + its own last batch
assert r1[False]["from_own"] and not r1[False]["from_rank0"]  # without the sync, its own statistics
assert r0[True]["from_own"]  # rank 0 is the source: it keeps its own
print("\nrank 1 after step 2, default: rank 0's statistics updated with rank 1's batch:", r1[True]["from_rank0"])
print("rank 1 after step 2, forward_sync_buffers=False: its own statistics updated:   ", r1[False]["from_own"])
print("\nDDP(..., broadcast_buffers=True) warns:", r0["warning"].split(" IMPORTANT")[0])

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Rank 0's statistics come from rank 0's data only: with the default, what ends up in the saved model is what **one** rank's shard saw, smoothed over steps. That is usually fine when every rank's data comes from the same distribution (the point of a shuffled `DistributedSampler`). Where the batch statistics must cover the global batch, `SyncBatchNorm` all-reduces them during the forward (GPU modules only: notebook 11 §6 shows DDP refusing it on CPU); where each rank must keep its own buffers, `forward_sync_buffers=False` (note the warning: unlike the old `broadcast_buffers=False`, it still broadcasts once at construction). Now the forwards. Each row is one forward; "broadcasts" is what DDP decided before it ran, and the outcome is rank 0's:
"""

# %% slideshow={"slide_type": "-"}
rows = r0["timeline"]
print(f"{'':>3} {'who':<13} {'forward':<27} {'broadcasts':<11} outcome on rank 0")
for i, (who, what, broadcasts, outcome, wait) in enumerate(rows, 1):
    who = "both ranks" if len(who) == 2 else "rank 0 alone"
    waited = f" (after ~{wait:.1f} s)" if outcome != "returned" else ""
    print(f"{i:>3} {who:<13} {what:<27} {'yes' if broadcasts else 'no':<11} {outcome}{waited}")
assert [r[2] for r in rows] == [True, True, False, False, True, False]  # DDP's own decision, row by row
assert [r[3] for r in rows] == ["returned"] * 4 + ["RuntimeError: a gloo timeout", "returned"]
assert rows[4][4] >= 1.0  # the timed-out forward waited for the whole 1.5 s timeout, not less

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the rows against the rule (a forward broadcasts when the previous forward ran with gradients):

- rows 1 and 2: the first evaluation forward after a training step broadcasts, although it runs in `eval()` mode and under `no_grad`; both ranks took part, so it returned;
- row 3: a second `no_grad` forward in a row does **not** broadcast, so rank 0 alone gets through (this is the exception a validation loop sees from its second batch on);
- row 4: the next forward with gradients does not broadcast either (the previous one ran under `no_grad`); the buffers are broadcast again at the forward after it;
- row 5: rank 0 alone, right after a training step: the broadcast waits for rank 1, which is elsewhere. Only here does the job shorten the group's timeout, to 1.5 s (with a private function, section 4.2 says which and what to use instead), so the hang ends in an error; every other row ran with the default timeout, so a process descheduled for seconds changes no outcome;
- row 6: `ddp.module` has no collective at all.

With the default timeout of 30 minutes (section 4.2 prints it) row 5 would sit for half an hour. The fixes: evaluate through **`ddp.module`** (the wrapped model: no collective at all) on the rank that evaluates, or evaluate through the DDP model on **every** rank (each on its shard of the validation set, metrics summed with `all_reduce` as in 10). A rank-0-only `torch.save(ddp.module.state_dict())` is safe: saving is not a forward.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Parameters a step does not use

### 2.1 The error

DDP's reducer waits, in each backward, for a gradient of **every** parameter before a bucket is all-reduced (notebook 11 §9). A parameter that took no part in the loss (an unused branch, a head trained only on some steps, a frozen part left with `requires_grad=True`) never gets one: its bucket never fills, the backward finishes with a reduction still pending, and the **next** forward refuses to start. The model below has two heads and uses only `a`. The job runs with `TORCH_DISTRIBUTED_DEBUG=INFO`, which makes the message name the parameters (section 4.2 has more on it); the launcher re-raises the child's error here:
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_unused.py
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x):
        return self.a(torch.relu(self.body(x)))  # self.b takes no part in the loss

def two_steps(ddp, x):
    for _ in range(2):
        ddp.zero_grad()
        ddp(x).sum().backward()

def no_flag(rank, world_size):
    torch.manual_seed(0)
    two_steps(DDP(TwoHeads()), torch.randn(4, 8))  # fails at the second forward

def fixes(rank, world_size, deep_layers=150, repeats=20):
    report = {}
    x = torch.randn(4, 8)
    for flag in ("find_unused_parameters", "static_graph"):
        torch.manual_seed(0)
        ddp = DDP(TwoHeads(), **{flag: True})
        two_steps(ddp, x)
        report[f"{flag}=True"] = ddp.module.b.weight.grad is None and ddp.module.a.weight.grad is not None
    # the cost of find_unused_parameters: a walk over the autograd graph after every forward.
    # A deep model with every parameter used; two DDP copies timed in alternation (same noise for both)
    torch.manual_seed(0)
    models = {flag: DDP(nn.Sequential(*[nn.Linear(8, 8) for _ in range(deep_layers)]), find_unused_parameters=flag)
              for flag in (False, True)}
    xb = torch.randn(4, 8)
    times = {False: [], True: []}
    for i in range(repeats + 3):
        for flag, ddp in models.items():
            dist.barrier()
            start = time.perf_counter()
            out = ddp(xb)  # the walk happens here, at the end of the forward
            times[flag].append(time.perf_counter() - start)
            out.sum().backward()
    report["forward_ms"] = {flag: 1000 * min(t[3:]) for flag, t in times.items()}  # the minimum: load only adds
    report["nodes"] = deep_layers
    # DDP with activation checkpointing: a checkpointed block, and a parameter the step does not use
    class Checkpointed(nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.block, self.head, self.unused, self.reentrant = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 8), reentrant

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))

    xg = torch.randn(4, 8, requires_grad=True)
    report["checkpoint"] = {}
    for reentrant in (False, True):
        for flag in ("find_unused_parameters", "static_graph"):
            torch.manual_seed(0)
            try:
                for _ in range(3):
                    two_steps(DDP(Checkpointed(reentrant), **{flag: True}), xg)
                report["checkpoint"][(reentrant, f"{flag}=True")] = "works"
            except RuntimeError as e:
                report["checkpoint"][(reentrant, f"{flag}=True")] = str(e).splitlines()[0][:48] + "..."
    return report


# %% slideshow={"slide_type": "-"}
import re
with expect_error(LaunchError, match="Expected to have finished reduction in the prior iteration", quiet=True) as unused:
    run_ranks("_runs/ddp_unused.py:no_flag", nprocs=2, timeout=180, echo="none", env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
message = unused.error.traceback
print("LaunchError, the rank's RuntimeError:", re.search(r"Expected to have finished reduction[^.]*\.", message).group(0))
named = [re.sub(r"rank \d", "rank N", line.strip()) for line in message.splitlines() if "did not receive grad" in line]
print("\n".join(named))
assert any(line.endswith("b.bias, b.weight") for line in named)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 2.2 Two fixes, and what each costs

- **`find_unused_parameters=True`**: after every forward DDP walks the autograd graph from the outputs, marks the parameters it cannot reach as ready at once (with a zero contribution), and the buckets complete. The walk costs time every iteration, proportional to the size of the graph.
- **`static_graph=True`**: you promise that the set of used parameters and the order of the graph never change. DDP records the first iteration and replays that knowledge; no walk after that. It also allows things the default forbids (below).

Both fixes let the same model train; `b`'s gradient stays `None` (no update, rather than a zero gradient): momentum or weight decay does not move it.
"""

# %% slideshow={"slide_type": "-"}
fixed = run_ranks("_runs/ddp_unused.py:fixes", nprocs=2, timeout=180, echo="none")
f0 = fixed[0]
for name in ("find_unused_parameters=True", "static_graph=True"):
    print(f"{name:<28} trains, unused head's grad stays None: {f0[name]}")
    assert all(r[name] for r in fixed)
no_walk, walk = f0["forward_ms"][False], f0["forward_ms"][True]
print(f"\nforward of a {f0['nodes']}-layer model, fastest of 20: default ~{no_walk:.2f} ms, "
      f"find_unused_parameters=True ~{walk:.2f} ms (difference ~{walk - no_walk:.2f} ms)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the two forward times as what they are: the walk is a C++ traversal of the autograd graph, cheap per node next to the Python work of a forward, so on a 150-layer model it is lost in the noise of timing a forward on a shared CPU (the difference printed above can come out either way; the `~` marks numbers that move with the load). It is a real cost where the graph has many thousands of nodes and the rest of the step is short, as on a GPU, where the forward's kernels run asynchronously and the CPU's own time per step is what limits; and it is easy to leave on by habit. Prefer fixing the model where you can (a part that is never trained can be frozen with `requires_grad_(False)` **before** wrapping: DDP only tracks parameters that require a gradient), then `static_graph=True` when the unused set is the same every step, and the flag when it changes from step to step.

### 2.3 DDP with activation checkpointing

Checkpointing (notebook 04) recomputes a block during backward. The **reentrant** implementation (`use_reentrant=True`) runs that recomputation as a separate backward inside the backward, and DDP's reducer, which counts one gradient per parameter per step, can see a parameter twice. The combination that fails: reentrant checkpointing with `find_unused_parameters=True` (the model below also has a parameter it does not use):
"""

# %% slideshow={"slide_type": "-"}
print(f"{'checkpoint':<22} {'find_unused_parameters=True':<56} static_graph=True")
for reentrant in (False, True):
    row = [f0["checkpoint"][(reentrant, name)] for name in ("find_unused_parameters=True", "static_graph=True")]
    print(f"{'use_reentrant=' + str(reentrant):<22} {row[0]:<56} {row[1]}")
assert f0["checkpoint"][(True, "find_unused_parameters=True")].startswith("Expected to mark a variable ready only once")
assert list(f0["checkpoint"].values()).count("works") == 3  # the other three

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So: **non-reentrant checkpointing (`use_reentrant=False`, the recommended form) works with DDP** in either setting; reentrant checkpointing needs `static_graph=True` when there are unused parameters, when the same checkpointed module runs twice in one forward, or when the graph has reentrant backwards of its own (the cases the `static_graph` documentation lists).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Gradient memory and buckets

### 3.1 `gradient_as_bucket_view`: one copy of the gradients fewer

DDP does not all-reduce `param.grad` tensors one by one. It keeps flat **buckets**, each a contiguous buffer holding the gradients of several parameters; after the backward fills `param.grad`, the reducer **copies** each gradient into its bucket, all-reduces the bucket, and copies the averaged values back. That is a second copy of all the gradients, as large as the gradients themselves, for as long as the model lives: a line the memory inventory of notebook 04 did not have. With **`gradient_as_bucket_view=True`** each `param.grad` becomes a **view into its bucket**: the same memory, no copy. The job below checks it by pointer: whether each gradient's storage is a bucket's storage (the buckets' addresses come from a communication hook, a function DDP calls with each bucket, used here only to look), and how many bytes the gradients and buckets occupy together after three steps.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_buckets.py
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP

def mlp(width=256, depth=4):  # notebook 11's model: 0.83 MiB of float32 parameters at width 256
    layers, d = [], 64
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))

def looking_hook(seen, bucket):  # notes each bucket's size and storage, then does the default all-reduce
    buf = bucket.buffer()
    seen.append((buf.numel() * buf.element_size(), buf.untyped_storage().data_ptr()))
    return allreduce_hook(None, bucket)

def three_steps(width=256, cap=None, view=False):  # the mlp under DDP with the looking hook: each step's buckets
    torch.manual_seed(0)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    ddp = DDP(mlp(width), gradient_as_bucket_view=view, **({} if cap is None else {"bucket_cap_mb": cap}))
    seen, steps = [], []
    ddp.register_comm_hook(seen, looking_hook)
    for _ in range(3):
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        steps.append(seen[:])
        seen.clear()
    return ddp, steps

def memory(rank, world_size):
    report = {}
    for view in (False, True):
        ddp, steps = three_steps(cap=0.5, view=view)
        grads, bucket_storages = [p.grad for p in ddp.parameters()], {ptr: nbytes for nbytes, ptr in steps[-1]}
        storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
        storages.update(bucket_storages)  # a bucket's storage holds exactly its buffer
        report[view] = {"grad_bytes": sum(g.numel() * g.element_size() for g in grads), "held_bytes": sum(storages.values()),
                        "in_bucket": sum(g.untyped_storage().data_ptr() in bucket_storages for g in grads),
                        "n_grads": len(grads)}
    return report

def buckets(rank, world_size):
    report = {}
    for width, cap in ((256, 0.05), (256, 0.5), (256, None), (512, None)):
        ddp, steps = three_steps(width, cap)
        report[(width, cap)] = {"steps": [[nbytes for nbytes, _ in step] for step in steps],
                                "param_bytes": [p.numel() * 4 for p in ddp.parameters()]}
    return report

def bf16_hook(process_group, bucket):  # to bfloat16, all-reduce, back: what the built-in bf16_compress_hook does
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(dist.get_world_size())
    # decompress into the bucket when the all-reduce is done (copy_ returns the bucket: what DDP waits for)
    return dist.all_reduce(compressed, async_op=True).get_future().then(lambda fut: buf.copy_(fut.value()[0]))

def hooks(rank, world_size):
    report = {}
    try:
        DDP(mlp()).register_comm_hook(None, bf16_compress_hook)
    except TypeError as e:
        report["bf16_builtin"] = str(e)
    sent, real = [], dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    torch.manual_seed(100 + rank)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    grads = {}
    for name, hook in (("float32 (default)", allreduce_hook), ("fp16_compress_hook", fp16_compress_hook),
                       ("bf16 (our hook)", bf16_hook)):
        torch.manual_seed(0)
        ddp = DDP(mlp())
        ddp.register_comm_hook(None, hook)
        sent.clear()
        with mock.patch.object(dist, "all_reduce", counting_all_reduce):  # counts what reaches the backend
            F.cross_entropy(ddp(x), y).backward()
        grads[name] = torch.cat([p.grad.flatten() for p in ddp.parameters()])
        exact = grads["float32 (default)"]
        report[name] = (sum(sent), ((grads[name] - exact).norm() / exact.norm()).item())
    return report

def all_parts(rank, world_size):
    return {"memory": memory(rank, world_size), "buckets": buckets(rank, world_size), "hooks": hooks(rank, world_size)}


# %% slideshow={"slide_type": "-"}
bucket_reports = run_ranks("_runs/ddp_buckets.py:all_parts", nprocs=2, timeout=180)
mem = bucket_reports[0]["memory"]
for view in (False, True):
    m = mem[view]
    print(f"gradient_as_bucket_view={view!s:<5}: {m['in_bucket']:>2} of {m['n_grads']} grads live in a bucket; "
          f"gradients + buckets hold {m['held_bytes']:,} bytes = {m['held_bytes'] / m['grad_bytes']:.0f} x the gradients' {m['grad_bytes']:,}")
assert mem[False]["held_bytes"] == 2 * mem[False]["grad_bytes"] and mem[False]["in_bucket"] == 0
assert mem[True]["held_bytes"] == mem[True]["grad_bytes"] and mem[True]["in_bucket"] == mem[True]["n_grads"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Exactly one gradient-sized copy saved (866,344 bytes here; 4 bytes per parameter in float32, 2 GB for a half-billion-parameter model). Two caveats from the documentation: the gradients become views only from the first all-reduce on (measure after step 1), and with `zero_grad(set_to_none=True)` (the default) autograd allocates a fresh gradient each step that the reducer copies into the bucket and then replaces by the view, so the saving is in what stays allocated between steps, not in the transient peak of the backward. Do not call `param.grad.detach_()` or replace `param.grad` by another tensor: that breaks the view.

### 3.2 How buckets are formed

The same hook lists each bucket's size at each step. Three rules explain every number (notebook 09 §5 states them for the steady state; the bucket assignment is `dist._compute_bucket_assignment_by_size`, a private function, read here only to compare; the rebuild is in DDP's C++ reducer; PyTorch has no public API for either):

1. **Step 1 uses a single bucket** holding every gradient (unless `find_unused_parameters=True`): DDP does not yet know the order in which backward produces the gradients, and a wrong guess could make a bucket wait.
2. **After step 1 the buckets are rebuilt** in the order the gradients actually arrived (the last layer first), and kept from then on.
3. Gradients go into a bucket **whole**, and a bucket is closed as soon as its size **reaches** the cap; so a bucket can exceed the cap by up to one tensor. With the default `bucket_cap_mb=25`, the **first** bucket's cap is `dist._DEFAULT_FIRST_BUCKET_BYTES` (a private constant) = 1 MiB, so that the last layers' gradients, ready first, go out early instead of waiting in a 25 MiB bucket. When you pass `bucket_cap_mb` yourself, there is no special first bucket: every bucket, the first included, is capped at your value.
"""

# %% slideshow={"slide_type": "-"}
bk = bucket_reports[0]["buckets"]
from course_lib.torch_private import ddp_first_bucket_bytes  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
print("first-bucket cap with the default bucket_cap_mb:", ddp_first_bucket_bytes(), "bytes")
for (width, cap), rep in bk.items():
    total = sum(rep["param_bytes"])
    print(f"width {width}, {total / 2**20:.2f} MiB of parameters, bucket_cap_mb={cap if cap else '25 (default)'}:")
    for step, sizes in enumerate(rep["steps"], 1):
        print(f"   step {step}: {len(sizes)} bucket(s), bytes {sizes}")
assert all(len(rep["steps"][0]) == 1 for rep in bk.values())  # rule 1
assert all(rep["steps"][1] == rep["steps"][2] for rep in bk.values())  # rule 2: rebuilt once, then kept
big, largest = bk[(512, None)]["steps"][1], max(bk[(512, None)]["param_bytes"])
assert len(big) == 2 and big[0] >= ddp_first_bucket_bytes() > big[0] - largest  # rule 3: 1 MiB, by < 1 tensor

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Now the counts notebook 11 §9 printed without explaining them (the same model and caps as the first two runs above): a 0.83 MiB model with `bucket_cap_mb=0.05` gave **4** buckets, not 0.83 / 0.05 ≈ 17. Rule 3: the cap is int(0.05 × 2²⁰) = 52,428 bytes, but each of the four weight matrices is bigger than that on its own (65,536 bytes for the first, 262,144 for each 256 × 256), so each closes a bucket by itself, and the small tensors (biases, the 10 × 256 output layer) ride along with the next big one. With 0.5 MiB = 524,288 bytes, the output layer and two 256 × 256 layers with their biases (10,280 + 2 × 263,168 = 536,616 bytes) reach the cap, and the rest (329,728 bytes) is the second bucket: 2 buckets. The function below replays rule 3 on the gradients in the order they arrive (reverse layer order) and gets both counts:
"""

# %% slideshow={"slide_type": "-"}
arrival = list(reversed(bk[(256, 0.05)]["param_bytes"]))  # the gradients in the order backward produces them

def replay_buckets(sizes_in_arrival_order, cap_bytes):  # rule 3: whole tensors; close a bucket once it reaches the cap
    out, current = [], 0
    for nbytes in sizes_in_arrival_order:
        current += nbytes
        if current >= cap_bytes:
            out.append(current)
            current = 0
    return out + ([current] if current else [])

for cap in (0.05, 0.5):
    replayed = replay_buckets(arrival, int(cap * 2**20))
    print(f"bucket_cap_mb={cap}: replayed {replayed}, DDP {bk[(256, cap)]['steps'][1]}")
    assert replayed == bk[(256, cap)]["steps"][1]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 3.3 Communication hooks: compressing the all-reduce

A **communication hook** replaces what DDP does with each bucket (the default: all-reduce it and divide by the world size). The built-in `fp16_compress_hook` casts the bucket to float16 before the all-reduce and back after: **half the bytes on the wire**, at the price of rounding every averaged gradient to 11 significant bits (notebook 06). `bf16_compress_hook` does the same with bfloat16 (8 significant bits, 7 of them stored; float32's range) but refuses to register without CUDA and NCCL; on this CPU the job registers a six-line hook of its own that does what the built-in does. The job counts the bytes that reach `dist.all_reduce` and compares the gradients with the exact float32 ones:
"""

# %% slideshow={"slide_type": "-"}
hk = bucket_reports[0]["hooks"]
print("bf16_compress_hook on this CPU ->", hk["bf16_builtin"])
exact_bytes = hk["float32 (default)"][0]
print(f"\n{'hook':<20} {'bytes all-reduced':>18} {'x float32':>10}   gradient error (relative, 2-norm)")
for name in ("float32 (default)", "fp16_compress_hook", "bf16 (our hook)"):
    nbytes, err = hk[name]
    print(f"{name:<20} {nbytes:>18,} {nbytes / exact_bytes:>10.2f}   {'0 (exact)' if err == 0 else f'< 1e-2 (~{err:.1e})'}")
assert hk["fp16_compress_hook"][0] * 2 == exact_bytes == hk["bf16 (our hook)"][0] * 2
assert hk["float32 (default)"][1] == 0 and 0 < hk["fp16_compress_hook"][1] < hk["bf16 (our hook)"][1] < 1e-2

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Half the bytes, gradients within a fraction of a percent; bf16's error is about ten times fp16's (3 fewer significant bits: 2³ = 8 times the rounding step), but fp16 can overflow or underflow where bf16, with float32's range, cannot. Compression pays where the network, not the compute, limits the step (many nodes over Ethernet); within one NVLink node it rarely does. Other built-in hooks: PowerSGD (low-rank compression, `ddp_comm_hooks.powerSGD_hook`) and hooks that only change which process group reduces.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Ranks out of step: uneven inputs, and finding a hang

### 4.1 `join()` for uneven inputs

`DistributedSampler` gives every rank the same number of samples (notebook 11 §7), but a sampler of your own, a dataset split by files, or `drop_last=False` with variable-length batching can leave one rank with fewer batches. When rank 0 is done, rank 1's next backward all-reduces with nobody: it hangs. The context manager **`ddp.join()`** lets a finished rank shadow the others' collectives (it contributes zeros to their all-reduces; the job below shows by what the average is then divided) until every rank is done.

### 4.2 Finding a hang

- **Timeouts.** Every collective waits at most the process group's `timeout` (`init_process_group(..., timeout=timedelta(...))`, also per group in `new_group`). The default for gloo is **30 minutes** (printed below; NCCL's is shorter, section 7): a hang looks like a frozen job for half an hour, then an error. This notebook shortens the timeout to a second or two only for the one collective whose hang is the lesson, so that the hang ends in an error; every collective that all ranks do take keeps the default, so no outcome here depends on how busy the machine is. It does so with `dist.distributed_c10d._set_pg_timeout`, a **private** function (the underscore: it can change or go without notice) that changes the timeout of a group that already exists; the public API sets a timeout only when a group is made, `init_process_group(timeout=...)` or `dist.new_group(timeout=...)`, and that is what your own scripts should use.
- **`dist.monitored_barrier(timeout=...)`** (gloo only): rank 0 waits for each other rank in turn and, if one does not arrive, **names it**. Put it where a hang is suspected.
- **`TORCH_DISTRIBUTED_DEBUG`**: `INFO` makes DDP name unused parameters (section 2.1); `DETAIL` also wraps every collective of a process group in a check that all ranks call the **same** collective on tensors of the same shape, and reports the mismatch instead of hanging or corrupting. It costs an extra collective per collective: for debugging only. Which route to take in PyTorch 2.13 is decided by a bug, shown in the box after the job: DDP cannot be built on a group that `DETAIL` checks. So with DDP use `INFO`; to check collectives you call yourself, turn `DETAIL` on for a group of their own with `dist.set_debug_level` (the job below does), or set the environment variable in a script without DDP.
- On GPUs, NCCL has more: `NCCL_DEBUG=INFO`, its watchdog and PyTorch's flight recorder (section 7, which also runs the flight recorder here, on gloo).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_hangs.py
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.torch_private import set_group_timeout  # torch.distributed's private _set_pg_timeout

N_BATCHES = (3, 5)  # rank 0 has 3 batches, rank 1 has 5

def uneven(rank, world_size):
    report = {}
    torch.manual_seed(100 + rank)
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(N_BATCHES[rank])]
    group = dist.new_group()  # the default timeout: the steps both ranks take cannot time out
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(16, 4), process_group=group)
    try:
        for done, (x, y) in enumerate(batches):  # done: the batches trained before this one
            if done == min(N_BATCHES):  # past the shortest rank's data the hang is the lesson: bound it
                set_group_timeout(timedelta(seconds=1.5), group)
            F.cross_entropy(ddp(x), y).backward()
        report["without"] = f"all {len(batches)} batches"
    except RuntimeError as e:
        timed_out = "timed out" in str(e).lower() or "timeout" in str(e).lower()
        report["without"] = f"{done} batches, then: RuntimeError, {'a gloo timeout' if timed_out else str(e)[:80]}"
    dist.barrier()
    for divide in (True, False):
        torch.manual_seed(0)
        ddp = DDP(nn.Linear(16, 4))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with ddp.join(divide_by_initial_world_size=divide):  # a finished rank shadows the others' all-reduces
            for done, (x, y) in enumerate(batches, 1):
                # this rank's own gradient of its batch, without DDP (ddp.module: no collective, no hook)
                own = torch.autograd.grad(F.cross_entropy(ddp.module(x), y), ddp.module.weight)[0]
                opt.zero_grad()
                F.cross_entropy(ddp(x), y).backward()
                if done == len(batches):  # the last batch: on rank 1 the other rank has joined by now
                    report[("scale", divide)] = (ddp.module.weight.grad * own).sum().item() / (own * own).sum().item()
                opt.step()
        flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(everyone, flat)
        report[("with", divide)] = (done, all(torch.equal(t, everyone[0]) for t in everyone))
    return report

def tools(rank, world_size):
    report = {"default_timeout": str(dist.constants.default_pg_timeout)}
    lonely = dist.new_group()
    if rank == 0:  # rank 1 never comes to this barrier
        start = time.perf_counter()
        try:
            dist.monitored_barrier(group=lonely, timeout=timedelta(seconds=1))
        except RuntimeError as e:
            report["monitored"] = str(e).strip().splitlines()[0]
        report["monitored_wait"] = time.perf_counter() - start
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups created from now on check every collective
    checked = dist.new_group()
    dist.set_debug_level(dist.DebugLevel.OFF)
    try:  # rank 0 all-reduces 4 numbers, rank 1 five: without the check, a hang or garbage
        dist.all_reduce(torch.ones(4 + rank), group=checked)
    except RuntimeError as e:
        report["mismatch"] = str(e)
    dist.barrier()
    return report

def both(rank, world_size):
    return {"uneven": uneven(rank, world_size), "tools": tools(rank, world_size)}


# %% slideshow={"slide_type": "-"}
hangs = run_ranks("_runs/ddp_hangs.py:both", nprocs=2, timeout=180, echo="none")
print("\n".join(f"rank {rank}: without join(): {rep['uneven']['without']}" for rank, rep in enumerate(hangs)))
for rank, rep in enumerate(hangs):
    done, same = rep["uneven"][("with", True)]
    print(f"rank {rank}: with join(): trained on all {done} of its batches; parameters equal on both ranks: {same}")
assert hangs[0]["uneven"]["without"] == "all 3 batches"
assert hangs[1]["uneven"]["without"] == "3 batches, then: RuntimeError, a gloo timeout"
assert [h["uneven"][("with", d)] for h in hangs for d in (True, False)] == [(3, True)] * 2 + [(5, True)] * 2
scale = {d: hangs[1]["uneven"][("scale", d)] for d in (True, False)}
print("\nrank 1's last batch, alone (rank 0 has joined): its averaged gradient / its own gradient")
for d in (True, False):
    print(f"  join(divide_by_initial_world_size={d}){' (default)' if d else '':<10}: {scale[d]:.2f}")
assert abs(scale[True] - 0.5) < 1e-6 and abs(scale[False] - 1.0) < 1e-6

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Without `join()`, rank 0 finished its 3 batches and went on; rank 1's fourth backward waited for an all-reduce partner that never came. (The job shortens the group's timeout only once rank 1 is past rank 0's last batch; the three steps both ranks take run with the default timeout, so the outcome cannot depend on how fast either process is.) With `join()`, both finish, and the parameters are still identical: rank 0 took part in rank 1's last two all-reduces with zero gradients (and by default keeps broadcasting buffers, section 1, from the rank that is still training). What rank 1's lone batches weigh: by default (`divide_by_initial_world_size=True`) the all-reduce still divides by the **initial** world size, 2, so a batch trained alone moves the model half as much as its own gradient would (the `0.50` above): every sample keeps the weight it has in a full step. With `divide_by_initial_world_size=False` it divides by the number of ranks that have not joined yet, and the lone batch counts fully (`1.00`). `join()` has a cost: each step, every rank first learns with one extra all-reduce whether any rank has joined (the `Join` documentation). Where the data can be evened out (`DistributedSampler`'s padding, `drop_last=True`), that is cheaper. And the tools:
"""

# %% slideshow={"slide_type": "-"}
t0, minutes = hangs[0]["tools"], dist.constants.default_pg_timeout.total_seconds() / 60
print(f"default gloo timeout: {t0['default_timeout']} = {minutes:.0f} minutes")
print(f"monitored_barrier on rank 0 (after ~{t0['monitored_wait']:.1f} s):", t0["monitored"])
mismatch = t0["mismatch"]
print("\nTORCH_DISTRIBUTED_DEBUG=DETAIL on a mismatched all_reduce:\n ", mismatch.split(". Rank 0 is running")[0] + ".")
print("  what differs:", mismatch.split("differ in the following aspects:")[-1].strip())
shapes = [m.group(0) for m in __import__("re").finditer(r"OpType=\w+, TensorShape=\[\d+\]", mismatch)]
print("  rank 0 called:", shapes[0], "| rank 1 called:", shapes[1])
assert t0["default_timeout"] == "0:30:00" and "Rank 1 failed to pass monitoredBarrier" in t0["monitored"]
assert "Detected mismatch between collectives" in mismatch and "Tensor shapes: 4vs 5" in mismatch
assert "Detected mismatch between collectives" in hangs[1]["tools"]["mismatch"]  # both ranks are told

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
> **A PyTorch 2.13 bug, and the workaround the job above uses.** Constructing `DistributedDataParallel` on a process group that `DETAIL` checks kills the process with a segmentation fault, inside DDP's constructor (its logger's `set_construction_data_and_log`). With `TORCH_DISTRIBUTED_DEBUG=DETAIL` in the environment, every group is checked, the default group included, so any DDP script crashes at `DDP(...)`; collectives of your own run fine. Hence the routes of section 4.2: `INFO` with DDP; `DETAIL` on a group of your own made under `dist.set_debug_level(dist.DebugLevel.DETAIL)`, as the job above does, or through the environment variable in a script without DDP. Check again on newer versions: this box is about one version's bug, not about DDP. One process is enough to show it (`faulthandler` prints the Python line the process was on when it died):
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/detail_ddp.py
"""DDP on a group that TORCH_DISTRIBUTED_DEBUG=DETAIL checks, in PyTorch 2.13: one process is enough."""
import faulthandler

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.launch import free_port

faulthandler.enable()  # if the process crashes, print the Python line it was on
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
print("debug level:", dist.get_debug_level(), flush=True)
dist.all_reduce(torch.ones(2))
print("a collective of our own under it: fine", flush=True)
DDP(nn.Linear(4, 4))
print("DDP constructed", flush=True)
dist.destroy_process_group()

# %% slideshow={"slide_type": "-"}
with expect_error(LaunchError, match="exit code -11", quiet=True) as crashed:
    run_script(["python", "_runs/detail_ddp.py"], timeout=180, echo="none", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
lines = crashed.error.result.output("main").splitlines()
frame = next(line for line in lines if "_ddp_init_helper" in line)  # faulthandler's line for DDP's constructor
print(f"exit code {crashed.error.result.returncode} (SIGSEGV), after printing:")
print("\n".join("  " + line for line in lines[:2]))
print("the frame it died in:", frame.split('"')[1].split("site-packages/")[-1], "in", frame.split(" in ")[-1])
assert crashed.error.result.returncode == -11 and "DDP constructed" not in lines

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Restarts: `torchrun --max-restarts`, and a script that resumes

On many nodes something fails sooner or later: a node is preempted, a process is killed for memory, a network link drops. `torchrun --max-restarts=N` lets the agent react: when **any** worker fails, the agent stops **all** its workers and starts the whole group again (up to N times), with the same command line and `TORCHELASTIC_RESTART_COUNT` set to the attempt number. Nothing carries over in memory, so a restarted script must **resume from its last checkpoint**, or it silently starts training from scratch. What a checkpoint must hold so that the resumed run ends exactly where an uninterrupted one would:
- the model's `state_dict` **and the optimizer's** (momentum buffers, Adam's moments), and the step counter;
- where the data stands: the epoch (for `sampler.set_epoch`) and the position within it;
- the random number generators of **every** rank (each rank draws its own dropout masks), not just rank 0's.

Shared filesystems are not a given on a cluster, and 11's script assumed one: rank 0 wrote the data and the checkpoint, and every rank read them. This script prepares its data per node (`LOCAL_RANK == 0` writes a node-local copy, the others on the node wait) and lets rank 0 alone read the checkpoint and send it to every rank with `dist.broadcast_object_list`, so no rank but rank 0 needs the file.

To make the failure real, rank 1 kills itself with `os._exit(1)` at step 9 of attempt 0, after the checkpoint of step 8. The script trains twice in one job: an uninterrupted reference into one folder, then the run that crashes into another; on the restart both resume, the reference from its final checkpoint (nothing left to do). Two parts of the script are not DDP practice but workarounds for defects of PyTorch 2.13, to skip on a first read: the `import torch.distributed.nn` before `init_process_group` (notebook 11 §10.2) and the store built by hand with a fresh prefix per attempt, marked `WORKAROUND` (the box after the run explains it).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/elastic_train.py
"""DDP training that torchrun --max-restarts can restart: the whole state is checkpointed and restored."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: notebook 11, section 10.2)
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.data import digits_datasets
from course_lib.seeding import seed_everything
from course_lib.teardown import end_process_group

BATCH, EPOCHS, SAVE_EVERY = 64, 2, 4

def log(message):  # one write per line, so that the ranks' lines do not interleave
    print(f"[rank{dist.get_rank()}]: {message}\n", end="", flush=True)

def rng_states(device):  # this rank's generators: the CPU's, and on the GPU path its GPU's (dropout there draws from it)
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}

def set_rng_states(states, device):
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)

def train(out, device, crash_at=None):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    node_dir = f"{out}/node{os.environ.get('GROUP_RANK', 0)}"  # node-local: no shared filesystem assumed
    if int(os.environ["LOCAL_RANK"]) == 0 and not os.path.exists(f"{node_dir}/train.pt"):
        os.makedirs(node_dir, exist_ok=True)
        train_set, _ = digits_datasets()
        torch.save({"x": train_set.tensors[0], "y": train_set.tensors[1]}, f"{node_dir}/train.pt")
    dist.barrier()
    data = {k: v.to(device) for k, v in torch.load(f"{node_dir}/train.pt", weights_only=True).items()}

    # CPU and GPU generators; on a GPU also deterministic kernels: the runs are compared bit for bit (notebook 00)
    seed_everything(0, deterministic=device.type == "cuda")
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 10)).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(range(len(data["y"])), shuffle=True, seed=0)
    steps_per_epoch = -(-len(sampler) // BATCH)
    torch.manual_seed(1000 + rank)  # dropout masks differ per rank

    step, state = 0, [None]
    if rank == 0 and os.path.exists(f"{out}/checkpoint.pt"):
        state = [torch.load(f"{out}/checkpoint.pt", map_location="cpu", weights_only=True)]
    dist.broadcast_object_list(state, src=0)  # rank 0 read the file; every rank gets the state
    if state[0] is not None:
        model.module.load_state_dict(state[0]["model"])
        opt.load_state_dict(state[0]["optimizer"])
        step = state[0]["step"]
        if len(state[0]["rng"]) == world_size:
            set_rng_states(state[0]["rng"][rank], device)  # this rank's own generators
        else:  # an elastic resize: no saved stream per rank; resumes correctly, but not bit for bit
            torch.manual_seed(1000 + rank + step)
        log(f"attempt {attempt}: resumed at step {step} of {EPOCHS * steps_per_epoch}")

    while step < EPOCHS * steps_per_epoch:
        epoch, position = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        idx = list(sampler)[position * BATCH:(position + 1) * BATCH]
        opt.zero_grad()
        F.cross_entropy(model(data["x"][idx]), data["y"][idx]).backward()
        opt.step()
        step += 1
        if crash_at is not None and attempt == 0 and rank == world_size - 1 and step == crash_at:
            log(f"attempt {attempt}: dying at step {step}")
            os._exit(1)  # no cleanup, no exception: as a killed process dies
        if step % SAVE_EVERY == 0 or step == EPOCHS * steps_per_epoch:
            rngs = [None] * world_size
            dist.all_gather_object(rngs, rng_states(device))
            if rank == 0:
                state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step, "rng": rngs}
                torch.save(state, f"{out}/checkpoint.tmp")
                os.replace(f"{out}/checkpoint.tmp", f"{out}/checkpoint.pt")  # never a half-written checkpoint
            dist.barrier()
    if rank == 0:
        log(f"attempt {attempt}: finished {step} steps in {out}")

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="_runs/elastic")
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    # WORKAROUND for torch 2.13, not a DDP habit (the box in the text): the agent's store keeps the dead attempt's gloo
    # addresses; a fresh prefix per attempt keeps new workers off them. Plain init_process_group("gloo") once fixed.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    device, bound = torch.device("cpu"), {}
    if args.device == "cuda":  # the GPU path: one GPU per process, NCCL
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        bound = {"device_id": device}
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), **bound)
    finished = False
    try:
        train(f"{args.out}/uninterrupted", device)
        train(f"{args.out}/restarted", device, crash_at=args.crash_at)
        finished = True
    finally:
        end_process_group(barrier=finished)  # barrier, destroy, check the group is gone (notebook 11, section 10.2)

# %% slideshow={"slide_type": "-"}
import shutil
from course_lib.device import course_device, course_ranks
DEVICE, RANKS = course_device(), course_ranks(2)  # cpu and 2, unless COURSE_DEVICE=cuda (notebook 00)
TOTAL = 2 * -(-(-(-1438 // RANKS)) // 64)  # 2 epochs of ceil(shard / 64) steps: 24 with 2 ranks
shutil.rmtree("_runs/elastic", ignore_errors=True)
elastic = run_torchrun("_runs/elastic_train.py", nproc_per_node=RANKS, launcher_args=["--max-restarts=1"], timeout=300,
                       args=["--out", "_runs/elastic", "--crash-at", "9", "--device", DEVICE], echo="none", device=DEVICE)
for rank in range(RANKS):  # the lines about attempts (the rest: rank 0's connection error at the crash, the agent's log)
    print("\n".join(f"[rank {rank}] {line}" for line in elastic.output(rank).splitlines() if line.startswith("attempt")))
assert "attempt 0: dying at step 9" in elastic.output(RANKS - 1)  # the last rank died ...
assert all(f"attempt 1: resumed at step 8 of {TOTAL}" in elastic.output(r) for r in range(RANKS))  # ... all restarted
a = torch.load("_runs/elastic/uninterrupted/checkpoint.pt", map_location="cpu", weights_only=True)
b = torch.load("_runs/elastic/restarted/checkpoint.pt", map_location="cpu", weights_only=True)
assert a["step"] == b["step"] == TOTAL
same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
same_opt = all(torch.equal(a["optimizer"]["state"][i]["momentum_buffer"], b["optimizer"]["state"][i]["momentum_buffer"])
               for i in a["optimizer"]["state"])
print(f"\ncrashed at step 9, restarted, resumed from step 8: weights equal to the uninterrupted run, bit for bit: {same}; "
      f"momentum buffers too: {same_opt}; wall time ~{elastic.wall_time:.0f} s")
assert same and same_opt

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the output: in attempt 0 rank 1 died at step 9; the agent saw the failure, stopped rank 0 (which was waiting in an all-reduce), and started both again as attempt 1; both resumed at step 8, redid step 9, and finished. The weights **and** the optimizer's momentum are those of the uninterrupted run, bit for bit (exercise 3 asks which entries of the checkpoint that takes, and why). Two things the script needed beyond the checkpoint, on any version:
- **Atomic saves**: write to a temporary file, then `os.replace` (a rename), so a crash during `torch.save` leaves the previous checkpoint intact.
- **Everyone restarts.** The healthy rank 0 was restarted too: a collective group cannot take in one new process in the middle of a step. Tearing down in order (notebook 11 §10) stays the rule for the attempt that ends normally.

> **Workaround for PyTorch 2.13, not a DDP habit: a fresh store prefix per attempt.** With a fixed PyTorch the script would call `init_process_group("gloo")` (the `env://` default) and nothing else. In 2.13 the agent keeps one key-value store for the whole job: the static rendezvous creates its `TCPStore` once, the `c10d` rendezvous creates its shared store at its first round, and the workers of every attempt get a client to it (`torch.distributed.rendezvous._create_c10d_store`, whose comment assumes a new store per retry). The addresses gloo's workers published in the dead attempt are still in it, so a new worker can read a dead worker's address and fail with *"Gloo connectFullMesh failed ... Connection refused"*. It is a race: whether a given restart fails depends on timing. Prefixing the store with `TORCHELASTIC_RESTART_COUNT`, as `elastic_train.py` does, gives each attempt keys of its own. The mechanism is known upstream for the `c10d` rendezvous and NCCL: [pytorch/pytorch#135712](https://github.com/pytorch/pytorch/issues/135712) (a restarted worker read the previous attempt's NCCL id, 2024) was closed by a change that made a new store per retry ([#135957](https://github.com/pytorch/pytorch/pull/135957)), and [#167288](https://github.com/pytorch/pytorch/issues/167288), still open, reports NCCL connections refused after `torchrun` restarts. On a newer PyTorch, try the script without the prefix before keeping it.

**On GPUs** (`COURSE_DEVICE=cuda`, notebook 00), the same cell runs the script with `--device cuda`: each process binds the GPU its `LOCAL_RANK` names (`torch.cuda.set_device`, `init_process_group(..., device_id=...)`), uses NCCL, and saves its GPU's random generator next to the CPU one, since dropout on a GPU draws from the GPU's generator (`rng_states` above). The cell asserts the same bit-for-bit equality there. What else bit-equal resumption can need on GPUs:
- **deterministic kernels**: kernels that add with atomics (the backward of `index_add`, `scatter_add`, embeddings, some convolutions) differ in the last bits from run to run; `torch.use_deterministic_algorithms(True)` selects deterministic implementations or refuses the operation, and cuBLAS needs `CUBLAS_WORKSPACE_CONFIG=:4096:8` in the environment before CUDA starts (its documentation lists both);
- **the loader's state**: this script indexes its tensors itself, so the epoch and the position are the whole data state. A `DataLoader` with worker processes has per-worker random state and batches in flight; `torchdata`'s `StatefulDataLoader` saves and restores both (`state_dict()`/`load_state_dict()`), and DCP's `Stateful` protocol (`torch.distributed.checkpoint.stateful.Stateful`, notebook 15 §3 uses DCP) lets such objects sit in a distributed checkpoint next to the model;
- **the same world size**: after an elastic resize (below) the saved generators no longer match the ranks and a step covers other samples. The script then reseeds each rank from its rank and step (the `else` branch of its resume) instead of failing: the run resumes correctly, but not bit for bit.

**Rendezvous, and elastic sizes.** *Rendezvous* is how the agents of a job find each other and agree on the world: how many nodes, which node rank each gets, where the store is. With `--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT` (notebook 11 §5) the rendezvous is dynamic: `--nnodes=MIN:MAX` (say `2:4`) starts as soon as MIN nodes have joined, and a node that joins or leaves later triggers a new rendezvous and a restart of all workers with the new world size (your script must then re-shard its data, which `DistributedSampler` does from the new world size). `torchrun` also sets `OMP_NUM_THREADS=1` in each worker when you have not set it and run more than one process per node, so that N processes do not each start a thread per core:
"""

# %% slideshow={"slide_type": "-"}
print("--nnodes=2:4 ->", torch.distributed.run.parse_min_max_nnodes("2:4"), "(min, max)")
source = inspect.getsource(torch.distributed.run.config_from_args)
omp = [line.strip() for line in source.splitlines() if "OMP_NUM_THREADS" in line and ("if" in line or "environ[" in line)]
print("torchrun's config_from_args:\n  " + "\n  ".join(omp))
assert omp[0] == 'if "OMP_NUM_THREADS" not in os.environ and nproc_per_node > 1:'

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. The device-generic forms (PyTorch 2.13)

Notebook 11's script chooses the backend by hand, from its `--device` argument: `"nccl"` with `--device cuda`, `"gloo"` otherwise, never from what the machine has (notebook 11 §6 says why). Current PyTorch also has device-generic forms:

- **`torch.accelerator`** asks about whatever accelerator this build has (CUDA, ROCm, XPU, MPS...) without naming it: `is_available()`, `current_accelerator()`, `device_count()`.
- **`init_process_group()` without a backend** registers one backend per device type from `dist.Backend.default_device_backend_map` (`cpu:gloo,cuda:nccl` on a CUDA build): CPU tensors go through gloo, CUDA tensors through NCCL, in one group.
- **`device_id=torch.device("cuda", local_rank)`** binds the process to its GPU and lets NCCL connect at once ("eager init") instead of at the first collective. It needs an accelerator: on a CPU it is refused, as the cell shows; on a GPU machine it is the recommended form (`torch.distributed` documentation, `init_process_group`).

The probe below runs as a CPU job (`run_script` hides the GPUs from the processes it starts), so it answers "no accelerator" on every machine; the GPU cell after it runs the same probe with the GPUs visible.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/device_generic.py
"""What the device-generic calls answer in this process. Launched as a CPU job (GPUs hidden), and on a GPU."""
import torch
import torch.distributed as dist

from course_lib.errors import expect_error
from course_lib.launch import free_port
from course_lib.teardown import end_process_group

print("torch.accelerator: available", torch.accelerator.is_available(), "| current", torch.accelerator.current_accelerator(),
      "| devices", torch.accelerator.device_count())
print("default backend per device type:", dist.Backend.default_device_backend_map)
dist.init_process_group(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)  # no backend given
try:
    print("init_process_group() without a backend ->", dist.get_backend_config())
    assert "cpu:gloo" in dist.get_backend_config()
finally:
    end_process_group(barrier=False)  # destroy, and check the group is gone (notebook 11, section 10.2)
if not torch.accelerator.is_available():
    with expect_error(ValueError, match="device_id parameter must be an accelerator"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cpu"))
    assert not dist.is_initialized()

# %% slideshow={"slide_type": "-"}
print(run_script(["python", "_runs/device_generic.py"], timeout=180, echo="none").output("main"))

# %% slideshow={"slide_type": "-"}
if requires_gpu("torch.accelerator and init_process_group() without a backend, with a GPU visible"):
    print(run_script(["python", "_runs/device_generic.py"], timeout=60, echo="none", device="cuda").output("main"))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. gloo versus NCCL: when a hang surfaces

Every job in this notebook ran on gloo, where a collective is work done by CPU threads and a blocking call returns once the result is in memory. NCCL, the backend of GPU training, behaves differently, and that changes how a failure looks and how you find it. What can be shown on a CPU runs below on gloo; the NCCL-only behaviour is in a GPU cell, and the rest names its source.

### 7.1 Stream semantics: the host does not wait

An NCCL collective or send/receive is a kernel enqueued on a CUDA stream of the process group, ordered after the work already queued on the current stream. The Python call returns as soon as it is enqueued, **even with `async_op=False`**: for NCCL, "blocking" means that the *current CUDA stream* waits for the result, not the host ([torch.distributed: synchronous and asynchronous collective operations](https://pytorch.org/docs/stable/distributed.html#synchronous-and-asynchronous-collective-operations)). So a rank that never arrives does not stop the line that issued the collective: the host runs ahead, queues more work, and the hang surfaces later, at the first call that waits for the GPU (`.item()`, `.cpu()`, `print` of a CUDA tensor, `torch.cuda.synchronize()`), often far from its cause, or as the watchdog's timeout (7.3).

The closest picture on gloo is `async_op=True`: the call returns a `Work` at once and the result is there only after `work.wait()`. In the job below rank 0 starts an all-reduce that rank 1 joins only after rank 0 has looked at it (rank 1 waits for rank 0 on another group first, so the order cannot change), and section 7.2's and 7.4's demonstrations run in the same launch. (Section 7.2's is one step of a pipeline schedule called **1F1B**, "one forward, one backward", which notebook 13 §4 defines and measures: the model is cut into stages on different ranks, and in its steady state each stage alternates the forward of one micro-batch with the backward of an earlier one, so that a stage sends an activation to the next stage while it receives a gradient from it.)

On a GPU the same experiment needs no `async_op` (the GPU cell after the gloo one): rank 1 arrives late (it sleeps `late=2.0` seconds first), and rank 0 times its plain `dist.all_reduce` and then `torch.cuda.synchronize()`. The first returns at once; the wait is in the second. (It needs two GPUs; run with the GPUs visible, it prints both times and NCCL's default timeout.)
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/nccl_vs_gloo.py
"""Section 7 on gloo: a collective that returns before it is done, a batch of sends and receives, a flight-recorder dump."""
import contextlib
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from course_lib.torch_private import dump_flight_recorder, set_group_timeout  # private: _dump_fr_trace, _set_pg_timeout

def returns_early(rank):  # rank 0 starts an all-reduce with async_op=True; rank 1 joins only after rank 0 has looked
    data, signal = dist.new_group(), dist.new_group()  # default timeouts: nothing here can time out
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(t, group=data, async_op=True)  # returns a Work at once
        done_at_return = work.is_completed()  # rank 1 has not joined yet: it cannot be done
        dist.barrier(group=signal)  # now let rank 1 in
        work.wait()
        return {"done_at_return": done_at_return, "done_after_wait": work.is_completed(), "result": t.tolist()}
    dist.barrier(group=signal)
    dist.all_reduce(t, group=data)
    return {}

def exchange(rank):  # a 1F1B steady state: stage 0 sends an activation and receives a gradient, stage 1 the reverse
    group, other = dist.new_group(), 1 - rank
    outgoing = torch.full((4096,), 10.0 + rank)  # rank 0: activation of micro-batch i+1; rank 1: gradient of i
    incoming = torch.empty(4096)
    ops = [dist.P2POp(dist.isend, outgoing, other, group), dist.P2POp(dist.irecv, incoming, other, group)]
    works = dist.batch_isend_irecv(ops)  # both ranks list their send first: no deadlock
    for work in works:
        work.wait()
    return {"works": len(works), "received": incoming.unique().tolist()}

def forgotten_collective(rank, folder):  # rank 0 all-reduces a metric that rank 1 forgot; each rank dumps its recorder
    group = dist.new_group()  # default timeout for what both ranks run
    a = torch.full((3, 4), float(rank))
    for _ in range(2):
        dist.all_reduce(a, group=group)
    if rank == 0:  # a metric only rank 0 logs: it waits for rank 1 forever; bound this one hang to 1.5 s
        set_group_timeout(timedelta(seconds=1.5), group)
        with contextlib.suppress(RuntimeError):  # the timeout's error
            dist.all_reduce(torch.ones(4, 5), group=group)
    with open(f"{folder}/trace_{rank}", "wb") as f:
        f.write(dump_flight_recorder())  # on NCCL, TORCH_NCCL_DUMP_ON_TIMEOUT=1 makes the watchdog do this
    dist.barrier()  # the default group: rank 1 waits here for rank 0
    return {"group": str(dist.get_process_group_ranks(group))}

def on_gloo(rank, world_size, folder):
    return {"returns_early": returns_early(rank), "exchange": exchange(rank),
            "flight_recorder": forgotten_collective(rank, folder)}

def nccl_host_time(rank, world_size, late=2.0):  # NCCL: how long the host waits in all_reduce while rank 1 is late
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()  # warmed up: the communicator exists
    dist.barrier()
    if rank == 1:
        time.sleep(late)
    start = time.perf_counter()
    dist.all_reduce(t)  # async_op=False: "blocking"
    returned = time.perf_counter() - start
    torch.cuda.synchronize()  # the host waits here, for the kernel that waits for rank 1
    return {"returned_s": returned, "synchronized_s": time.perf_counter() - start,
            "nccl_timeout": str(dist.constants.default_pg_nccl_timeout)}


# %% slideshow={"slide_type": "-"}
shutil.rmtree("_runs/fr", ignore_errors=True)
os.makedirs("_runs/fr")
gloo_side = run_ranks("_runs/nccl_vs_gloo.py:on_gloo", nprocs=2, args=(os.path.abspath("_runs/fr"),), timeout=180,
                      echo="none", env={"TORCH_FR_BUFFER_SIZE": "2000"})  # the flight recorder, for 7.4
early = gloo_side[0]["returns_early"]
print("rank 0: all_reduce(async_op=True) returned; done at that moment:", early["done_at_return"])
print("rank 0: after work.wait(): done:", early["done_after_wait"], "| result", early["result"], "(1 + 2 on every element)")
assert early == {"done_at_return": False, "done_after_wait": True, "result": [3.0] * 4}

# %% slideshow={"slide_type": "-"}
if requires_gpu("an NCCL all_reduce returns to the host before it is done", count=2):
    host = run_ranks("_runs/nccl_vs_gloo.py:nccl_host_time", 2, backend="nccl", device="cuda", timeout=120, echo="none")[0]
    print(f"rank 0, rank 1 two seconds late: dist.all_reduce returned after ~{host['returned_s'] * 1e3:.1f} ms; "
          f"torch.cuda.synchronize() returned ~{host['synchronized_s']:.1f} s after the call")
    print("NCCL's default timeout:", host["nccl_timeout"])
    assert host["returned_s"] < 0.5 < 1.5 < host["synchronized_s"]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 7.2 Sends and receives: `batch_isend_irecv`

Notebook 09 §4 showed the simplest deadlock: two ranks that both call a blocking `send` before their `recv`. NCCL adds its own constraints to point-to-point traffic. A send and its receive are kernels that must run at the same time on the two GPUs, each in its stream's order, so even non-blocking `isend`/`irecv` calls issued in a different order on two ranks can wait for each other; and the first send/receive between a pair of ranks creates a communicator for that pair on the spot (a small collective between the two), which both must reach. `dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, u, peer), ...])` posts a list of sends and receives as **one** operation (on NCCL, one NCCL group call), so the order of sends and receives inside the list does not matter; only several transfers between the same pair in the same direction must be listed in the same order on both sides (its documentation). That is what a pipeline needs in its steady state (notebook 13 §4): stage `s` sends the activation of one micro-batch downstream while it receives the gradient of an earlier one from downstream, and the stage below does the reverse, at the same moment. The documentation adds two NCCL rules: call `torch.cuda.set_device` first, and if the batch is the group's first collective call, every rank of the group must take part. On gloo, below: both ranks list their send first, and both transfers arrive.
"""

# %% slideshow={"slide_type": "-"}
for rank in (0, 1):
    ex = gloo_side[rank]["exchange"]
    print(f"rank {rank}: batch_isend_irecv([send, recv]) -> {ex['works']} requests; received {ex['received']} "
          f"(rank {1 - rank}'s tensor)")
assert [g["exchange"]["received"] for g in gloo_side] == [[11.0], [10.0]]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 7.3 Timeouts, the watchdog, and what happens to the process

NCCL's default timeout is 10 minutes, against gloo's 30 (`init_process_group`'s `timeout` in the [torch.distributed documentation](https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group); the GPU cell above prints it). Since the host does not wait for a collective, something else must notice one that never finishes: every NCCL process group runs a **watchdog** thread that checks its outstanding collectives and declares one failed when it runs past the timeout. What follows is set by `TORCH_NCCL_ASYNC_ERROR_HANDLING` ([ProcessGroupNCCL environment variables](https://pytorch.org/docs/stable/torch_nccl_environment_variables.html)): `3`, the default, tears the process down without aborting the NCCL communicator; `1` aborts the communicator, then tears the process down; `2` only aborts the communicator; `0` does nothing, and the job hangs. So a timed-out NCCL collective normally ends the **process**, from the watchdog thread, with a log line naming the collective (its sequence number, type and timeout), instead of raising an exception in your Python code; `TORCH_NCCL_BLOCKING_WAIT=1` makes `wait()` block the host and raise instead, at a cost in overlap. `torchrun` then sees a worker die, stops the others, and restarts them if `--max-restarts` allows (section 5). A second thread, the heartbeat monitor (`TORCH_NCCL_ENABLE_MONITORING`, `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`), kills a process whose watchdog is itself stuck. The general rule is the one notebook 11 applies to gloo: **tear down in order**. Finish every collective, then `destroy_process_group()` before the process exits; PyTorch warns at exit about an NCCL process group that was never destroyed, because a process that leaves with collectives in flight can block the others.

### 7.4 The flight recorder: what each rank was doing

When a job hangs, the question is which rank stopped where. The **flight recorder** keeps, in each process, a ring buffer of the last `N` collectives: process group, sequence number, operation, tensor shapes and dtypes, state, timeout, and the Python stack that issued it. Turn it on with `TORCH_FR_BUFFER_SIZE=N` (2.13's name; the older `TORCH_NCCL_TRACE_BUFFER_SIZE` is still read); with NCCL, `TORCH_NCCL_DUMP_ON_TIMEOUT=1` makes the watchdog write every rank's buffer to a file named by `TORCH_FR_DUMP_TEMP_FILE` (older name `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`) plus the rank when a timeout fires, and `torchfrtrace <folder> --prefix <prefix>` reads the files of all ranks and reports the first collective that not every rank joined ([flight recorder tutorial](https://docs.pytorch.org/tutorials/unstable/flight_recorder_tutorial.html)).

In PyTorch 2.13 the recorder also records gloo's collectives, so the launch above made a real dump, clearly a small one: after two all-reduces on a group, rank 0 all-reduces a metric that rank 1 forgot (the classic hang: a collective inside `if rank == 0`); that one hang is bounded by a 1.5 s timeout. Each rank then dumped its buffer with the function the NCCL watchdog calls, `torch._C._distributed_c10d._dump_fr_trace`: a **private** function of PyTorch's C++ extension, used here because gloo has no watchdog to call it. Its public replacement is the set of environment variables above (`TORCH_FR_BUFFER_SIZE`, `TORCH_NCCL_DUMP_ON_TIMEOUT=1`, `TORCH_FR_DUMP_TEMP_FILE`), which make NCCL's watchdog write the same files on a timeout: use those in your jobs. Here is what the two files hold for that group:
"""

# %% slideshow={"slide_type": "-"}
import pickle
from pathlib import Path
dumps = [pickle.loads(Path(f"_runs/fr/trace_{rank}").read_bytes()) for rank in (0, 1)]
pg = max(dumps[0]["pg_status"], key=int)  # the group made last: the flight-recorder demonstration's

def called_from(entry):  # the first stack frame in our own script: where the collective was issued
    frame = next(f for f in entry["frames"] if f["filename"].endswith("nccl_vs_gloo.py"))
    return f"{frame['name']}, line {frame['line']}"

print(f"dump keys: {sorted(dumps[0])}; process group {pg}, ranks {gloo_side[0]['flight_recorder']['group']}")
for rank, dump in enumerate(dumps):
    print(f"\nrank {rank}: last collective enqueued on the group: #{dump['pg_status'][pg]['last_enqueued_collective']}")
    print(f"  {'#':>2}  {'operation':<16} {'input sizes':<12} {'timeout':>8}  issued by")
    for e in (e for e in dump["entries"] if e["process_group"][0] == pg):
        print(f"  {e['collective_seq_id']:>2}  {e['profiling_name']:<16} {str(e['input_sizes']):<12} "
              f"{e['timeout_ms'] / 1000:>6g} s  {called_from(e)}")

last = [d["pg_status"][pg]["last_enqueued_collective"] for d in dumps]
seq = min(last) + 1
culprit = next(e for e in dumps[0]["entries"] if e["process_group"][0] == pg and e["collective_seq_id"] == seq)
missing = [rank for rank, n in enumerate(last) if n < seq]
print(f"\nfirst collective not every rank enqueued: #{seq} {culprit['profiling_name']} {culprit['input_sizes']}, "
      f"missing rank(s) {missing}, issued by {called_from(culprit)}")
assert last == [3, 2] and missing == [1] and culprit["input_sizes"] == [[4, 5]]

# %% [markdown] slideshow={"slide_type": "-"}
"""
Read it as you would a dump from a hung GPU job: both ranks issued collectives #1 and #2 of the group; rank 0 issued a #3 that rank 1 never did, an all-reduce of shape `[4, 5]` with the shortened timeout, and the stack names the function and line that issued it. On a cluster this is what you look for across hundreds of files: the first sequence number that some ranks have and others lack, and the stacks on both sides. (`torchfrtrace` does that merge for NCCL dumps; on these gloo dumps 2.13's version stops with a `KeyError`, because gloo leaves the dump's table of groups, `pg_config`, empty:)
"""

# %% slideshow={"slide_type": "-"}
print("pg_config in the gloo dump:", dumps[0]["pg_config"])
with expect_error(LaunchError, match="KeyError", quiet=True) as frtrace:
    run_script(["python", "-m", "torch.distributed.flight_recorder.fr_trace", "--prefix", "trace_", "_runs/fr"],
               timeout=180, echo="none")
print("torchfrtrace on the gloo dumps:", frtrace.error.traceback.strip().splitlines()[-1])

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- DDP is not silent between steps: it broadcasts rank 0's buffers at the start of every forward that follows a forward run with gradients enabled (`forward_sync_buffers`, formerly `broadcast_buffers`, default on), in train and eval mode alike; only a second `no_grad` forward in a row skips it. BatchNorm statistics end up rank 0's, and the first evaluation forward after training, run on one rank alone, hangs: evaluate through `ddp.module`, or on every rank.
- A parameter outside the loss breaks the next step ("Expected to have finished reduction..."): `TORCH_DISTRIBUTED_DEBUG=INFO` names it; `find_unused_parameters=True` walks the graph each step, `static_graph=True` learns it once. Non-reentrant checkpointing works with DDP; reentrant needs `static_graph=True` in the cases shown.
- Buckets: one in step 1, rebuilt in arrival order after it; whole tensors, closed on reaching the cap; the first capped at 1 MiB when `bucket_cap_mb` is left at its default. `gradient_as_bucket_view=True` saves one gradient-sized copy (exactly, here 866,344 bytes). fp16/bf16 compression hooks send half the bytes, gradients within a fraction of a percent.
- Uneven inputs: `join()`, which by default still divides by the initial world size (a lone rank's batch moved the model by 0.50 of its own gradient). Hangs: shorten a timeout only where you expect the hang (gloo's default is 30 minutes), `monitored_barrier` names the missing rank, `DETAIL` names a mismatched collective (in 2.13 not on a group DDP uses: it crashes).
- `torchrun --max-restarts` restarts every worker: checkpoint model, optimizer, step, data position and every rank's RNG (the GPU's too), atomically; rank 0 reads, `broadcast_object_list` shares; the resumed run equals the uninterrupted one bit for bit. The per-attempt store prefix is a workaround for a 2.13 bug, not a DDP habit.
- NCCL differs from gloo: its calls return to the host at once, so a hang surfaces at the next synchronisation or as the watchdog's timeout, which by default ends the process; pipelines post their simultaneous sends and receives with `batch_isend_irecv`; the flight recorder's dumps show the first collective a rank never joined.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `bucket_sizes(param_bytes_in_arrival_order, cap_bytes, first_cap_bytes)`: the bucket sizes DDP forms after its rebuild (rule 3 of section 3.2, with a first bucket capped at `first_cap_bytes`). The check compares with PyTorch's own `dist._compute_bucket_assignment_by_size`.
2. For each situation, name the DDP setting that answers it: one of `"find_unused_parameters"`, `"static_graph"`, `"gradient_as_bucket_view"`, `"join"`, `"forward_sync_buffers=False"`, `"comm_hook"`.
3. Write `resume_position(step, steps_per_epoch)` returning `(epoch, batch index within the epoch)` for the first batch a resumed run must train, and list which entries of a checkpoint are needed so that a resumed run with dropout and SGD momentum is identical to an uninterrupted one.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.ddp_knobs import check_bucket_sizes, check_knob_choices, check_resume

def bucket_sizes(param_bytes_in_arrival_order, cap_bytes, first_cap_bytes):
    raise NotImplementedError  # your code here

print(check_bucket_sizes(bucket_sizes))

# %% slideshow={"slide_type": "-"}
knobs = {
    "a model with an auxiliary head used only every other step": ...,
    "the same unused head on every step, and the flag's graph walk is too slow": ...,
    "rank 0 has 10 batches and rank 1 has 12": ...,
    "the gradients' second copy does not fit in memory": ...,
    "slow Ethernet between nodes, and gradients tolerate rounding to 16 bits": ...,
    "each rank must keep its own BatchNorm statistics": ...,
}
print(check_knob_choices(knobs))


# %% slideshow={"slide_type": "-"}
def resume_position(step, steps_per_epoch):
    raise NotImplementedError  # your code here

needed = ...  # a set of names among "model", "optimizer", "step", "rng of rank 0", "rng of every rank", "loss"
print(check_resume(resume_position, needed))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- S. Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020 (buckets, the rebuild, overlap, unused parameters), [arXiv:2006.15704](https://arxiv.org/abs/2006.15704).
- PyTorch docs: [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html) (`forward_sync_buffers`, `find_unused_parameters`, `static_graph`, `gradient_as_bucket_view`), [Distributed Data Parallel design notes](https://pytorch.org/docs/stable/notes/ddp.html), [DDP communication hooks](https://pytorch.org/docs/stable/ddp_comm_hooks.html), [Join: uneven inputs](https://pytorch.org/tutorials/advanced/generic_join.html), [torch.distributed](https://pytorch.org/docs/stable/distributed.html) (`monitored_barrier`, `TORCH_DISTRIBUTED_DEBUG`, timeouts, `init_process_group`'s `device_id`), [torch.accelerator](https://pytorch.org/docs/stable/accelerator.html).
- torchrun and elastic: [torchrun](https://pytorch.org/docs/stable/elastic/run.html) (`--max-restarts`, `--nnodes=MIN:MAX`, rendezvous), [Fault-tolerant training with torchrun](https://pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html), [Rendezvous](https://pytorch.org/docs/stable/elastic/rendezvous.html).
- Y. Lin et al., *Deep Gradient Compression*, ICLR 2018, [arXiv:1712.01887](https://arxiv.org/abs/1712.01887); T. Vogels et al., *PowerSGD*, NeurIPS 2019, [arXiv:1905.13727](https://arxiv.org/abs/1905.13727) (gradient compression beyond a cast).
"""
