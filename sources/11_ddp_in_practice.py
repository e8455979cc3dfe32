# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 11 · DDP in practice: launching, sharding, checkpoints, and why it is correct

Notebook 09 ran the collectives by hand. Here the same machinery trains a model: one training script, launched **for real** from this notebook in every way people launch it (`torch.multiprocessing.spawn`, `torchrun`, the legacy `python -m torch.distributed.launch`, and two `torchrun` agents forming a two-node job), on CPU processes talking over gloo. Each process's output streams into the cell, prefixed with its rank.

By the end you will be able to:
- launch a DDP script with `mp.spawn`, `torchrun` (one node or several) and recognise the legacy launcher, and say why a worker defined in a notebook cell cannot be spawned;
- write the parts of a DDP script that people get wrong: `init_process_group` (`env://`, `tcp://`), backend choice, `DistributedSampler` with `set_epoch`, seeding, rank-0-only I/O behind a barrier, checkpoints, metrics gathered with collectives, `SyncBatchNorm`, `no_sync()`;
- prove that 2-process DDP computes the same training as one process on the full batch;
- explain what DDP does inside (parameter broadcast, gradient buckets, overlap) and measure `bucket_cap_mb` and `no_sync`.
- recognise a hang in a collective and a crash at exit (`terminate called without an active exception`), and write the teardown that prevents the crash.

This notebook assumes: notebook 08 (gradient accumulation), 09 (all-reduce and the collectives) and 10 (DDP by hand: hooks and buckets), and a training loop you could write yourself. No GPU: every distributed run here is CPU processes with the gloo backend, also on a machine with GPUs; GPU-only cells say what they skipped. On a GPU machine, `COURSE_DEVICE=cuda` (notebook 00) runs the training script on GPUs with NCCL instead, one process per GPU.
"""

# %% slideshow={"slide_type": "-"}
import os
import re
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DistributedSampler

from course_lib.errors import expect_error
from course_lib.device import course_device, course_ranks, requires_gpu
from course_lib.launch import (LaunchError, child_stderr, free_port, port_in_use, run_ranks, run_script, run_torchrun,
                               torchrun_command)
from course_lib.seeding import seed_everything


def shown(cmd, port=None):
    """A launch command as one would type it (program name only, the free port as <PORT>)."""
    text = " ".join(["torchrun" if os.path.basename(cmd[0]) == "torchrun" else "python", *cmd[1:]])
    return text.replace(f"={port}", "=<PORT>") if port else text


seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
sys.path.insert(0, os.path.abspath("_runs"))
DEVICE = course_device()  # "cpu", unless COURSE_DEVICE=cuda asks for the GPU path (notebook 00)
RANKS = course_ranks(2)  # 2 processes on the CPU; on the GPU path one per GPU, at most 2
print(f"torch {torch.__version__.split('+')[0]}, gloo available: {dist.is_gloo_available()}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. The training script

One file, written by the next cell so you can read all of it. It is launcher-agnostic: `torchrun` and the legacy launcher set `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` in each process's environment, and `init_process_group()` with the default `init_method="env://"` reads them; `mp.spawn` calls `train(rank, world_size)` after initialising the group itself (section 3).

What to look for, in order: **device and backend, chosen by an argument** (`--device cpu`, the default, trains on CPU processes over gloo; `--device cuda` binds each process to the GPU numbered by its `LOCAL_RANK` and uses NCCL); **seeding**; **rank-0-only I/O behind `dist.barrier()`** (rank 0 "downloads" the data, the others wait, then all read it); **`DistributedSampler`** and **`set_epoch`**; **metrics summed with `all_reduce`** (every rank must call it); the **checkpoint** written by rank 0 and loaded by everyone with `torch.load(map_location=device, weights_only=True)`; a final check that the parameters are **equal on every rank**. `log()` prefixes each line with `[rankN]:` so the launcher can sort the output by rank.

**One line is not DDP practice.** The import marked `WORKAROUND` (`import torch.distributed.nn` before `init_process_group`) works around a defect of PyTorch 2.13 that can crash a gloo job at exit; skip it on a first read, §10.2 explains it, and a script for a PyTorch without the defect drops it. Every other line is the practice to keep.

**It assumes a shared filesystem.** Rank 0 writes the data and the checkpoint, and every rank reads them: that works on one machine (every launch in this notebook, the two "nodes" of section 5 included) and on a cluster whose nodes share a filesystem (NFS, Lustre, ...). On nodes with local disks only, the ranks of node 1 would not find the files. Notebook 12 §5's script does without: the first process of each node (`LOCAL_RANK == 0`) prepares that node's copy of the data, and rank 0 alone reads the checkpoint and sends it to every rank with `dist.broadcast_object_list`.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_train.py
"""Train a small MLP on the digits with DistributedDataParallel; launch with torchrun, the legacy launcher or mp.spawn."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
# WORKAROUND for torch 2.13 (section 10.2), not a DDP rule: import before init_process_group. DDP imports it late
# (via torch._dynamo): its 10 `group=group.WORLD` defaults, evaluated at import, would then hold the default group
# for good, destroy_process_group() could not free it, and its gloo threads would live into interpreter shutdown.
import torch.distributed.nn  # noqa: F401
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib.data import digits_datasets
from course_lib.seeding import seed_everything
from course_lib.teardown import end_process_group

def log(*parts):
    # one write per line: processes that share a pipe (mp.spawn's children) cannot cut into each other's lines
    sys.stdout.write(f"[rank{dist.get_rank()}]: {' '.join(map(str, parts))}\n")
    sys.stdout.flush()

def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

def train(rank, world_size, epochs=2, batch_size=32, lr=0.1, out="_runs/ddp", device=torch.device("cpu")):
    # The same seed on every rank: the same initial weights (DDP also broadcasts rank 0's); not the sampler's order
    # (its own seed= and set_epoch, section 7). Per-rank randomness (augmentation) would add the rank to the seed.
    # On a GPU, bit-equal reruns (sections 3 and 4 compare launches) also need deterministic kernels (notebook 00).
    seed_everything(0, deterministic=device.type == "cuda")

    # Rank-0-only I/O: one process prepares, the others wait at the barrier, then all read. Assumes a shared
    # filesystem (one machine, or NFS): without one, see notebook 12's per-node preparation.
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        train_set, _ = digits_datasets()
        torch.save({"x": train_set.tensors[0], "y": train_set.tensors[1]}, f"{out}/train.pt")
        log(f"prepared {len(train_set)} training images in {out}/train.pt")
    dist.barrier()
    data = torch.load(f"{out}/train.pt", weights_only=True)
    dataset = TensorDataset(data["x"], data["y"])

    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # rank and world size come from the group
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    plain = DataLoader(dataset, batch_size=batch_size)  # the multi-GPU post's loader: no sampler (counted, not loaded)
    log(f"without a DistributedSampler this rank would train on {sum(map(len, plain.batch_sampler))} samples per epoch")
    model = DDP(make_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order
        log(f"epoch {epoch}: {len(sampler)} samples, first indices {list(sampler)[:4]}")
        stats = torch.zeros(3, device=device)  # loss sum, correct, count
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()  # DDP averages the gradients over the ranks here
            opt.step()
            stats += torch.stack([loss.detach() * len(y), (logits.argmax(1) == y).sum().float(), torch.tensor(float(len(y)), device=device)])
        dist.all_reduce(stats)  # a collective: every rank calls it, or they all hang
        if rank == 0:
            log(f"epoch {epoch}: loss {stats[0] / stats[2]:.4f}, accuracy {stats[1] / stats[2]:.4f} over {int(stats[2])} samples (all ranks)")

    # Checkpoint: rank 0 writes, the barrier makes sure the file is complete, then every rank loads it.
    if rank == 0:
        torch.save(model.module.state_dict(), f"{out}/checkpoint.pt")
    dist.barrier()
    state = torch.load(f"{out}/checkpoint.pt", map_location=device, weights_only=True)
    fresh = make_model().to(device)
    fresh.load_state_dict(state)
    loaded_ok = all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.module.parameters()))

    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(everyone, flat)
    same = all(torch.equal(t, everyone[0]) for t in everyone)
    log(f"checkpoint loaded = my parameters: {loaded_ok}; parameters identical on all {world_size} ranks: {same}")

if __name__ == "__main__":  # started by torchrun or python -m torch.distributed.launch
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="_runs/ddp")
    # Only the legacy launcher passes this (as --local-rank since torch 2.0); torchrun does not. Accept both spellings.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")  # a choice, not "cuda if available" (§6)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])  # what both launchers set: use this, not the argument
    if args.device == "cuda":  # one GPU per process, chosen by LOCAL_RANK; NCCL between them
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)  # device_id: bound now, NCCL connects eagerly
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")  # init_method="env://": MASTER_ADDR/PORT, RANK, WORLD_SIZE from the environment
    backend = dist.get_backend()
    r, n = dist.get_rank(), dist.get_world_size()
    log(f"backend={backend} RANK={r} LOCAL_RANK={local_rank} WORLD_SIZE={n} GROUP_RANK={os.environ.get('GROUP_RANK')}")
    # Teardown (section 10.2): the DDP model, reducer, optimizer and last collectives' results die with train()'s frame
    # (keep none in a global); end_process_group() then barriers, destroys the group, checks it is gone (gloo threads
    # joined while Python is fully alive) and says on stderr what still holds it if not.
    finished = False
    try:
        train(r, n, epochs=args.epochs, out=args.out, device=device)
        finished = True
    finally:
        end_process_group(barrier=finished)  # no barrier after a failure: a peer may be gone

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. `torchrun --nproc_per_node=2`

`torchrun` (the same program as `python -m torch.distributed.run`) starts an *agent* that starts `nproc_per_node` workers, sets their environment, watches them, and tears the whole group down when one fails. `course_lib.launch.run_torchrun` builds the command (printed below), picks a free port, streams each rank's lines as they arrive, and kills every process if the job fails or exceeds its `timeout`. (While the job runs the lines appear live, in arrival order; when it ends they are printed again grouped by rank, so the cell's final output does not depend on which process printed first.)
"""

# %% slideshow={"slide_type": "-"}
print(shown(torchrun_command("_runs/ddp_train.py", nproc_per_node=2, master_port=29500, tee=False)))
single_node = run_torchrun("_runs/ddp_train.py", nproc_per_node=RANKS, args=["--out", "_runs/ddp", "--device", DEVICE],
                           timeout=600, device=DEVICE)
print(f"wall time ~{single_node.wall_time:.1f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the output against the script. Without a `DistributedSampler` (the multi-GPU post's loader) each rank would train on all **1,438** images, every epoch: N ranks, N copies of the same epoch. With it both ranks saw **719** of the 1,438 images per epoch (disjoint halves), their epoch-1 indices differ from epoch 0's because of `set_epoch`, the loss and accuracy printed by rank 0 are over all **1,438** samples because `all_reduce` summed the two ranks' counts, and both ranks hold identical parameters at the end.
"""

# %% slideshow={"slide_type": "-"}
for rank in range(RANKS):  # RANKS is 2 here (on a 1-GPU machine's GPU path: 1, and the shard is the whole set)
    assert "without a DistributedSampler this rank would train on 1438 samples" in single_node.output(rank)
    assert f"{1438 // RANKS} samples" in single_node.output(rank)
    assert f"parameters identical on all {RANKS} ranks: True" in single_node.output(rank)
assert "over 1438 samples" in single_node.output(0)
print("checked: 1438 per rank without the sampler, disjoint halves of 719 with it, metrics over 1438, identical parameters")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. `torch.multiprocessing.spawn`, and why a notebook cell cannot be spawned

`mp.spawn(fn, args, nprocs)` starts `nprocs` **fresh Python interpreters** (start method *spawn*) and calls `fn(i, *args)` in each. The child receives `fn` pickled, and a function pickles *by reference*: its module and name. A function defined in a notebook cell lives in the kernel's `__main__`, which a fresh interpreter does not have, so the child cannot find it. The parent only sees that the child died; the child's own error goes to the stderr it inherited (collected here with `child_stderr()` to show its last line).
"""


# %% slideshow={"slide_type": "-"}
def worker(rank):
    print("hello from", rank)


with child_stderr() as err, expect_error(mp.ProcessExitedException, match="terminated with exit code 1"):
    mp.spawn(worker, nprocs=1)
print("the child said:", err[0].strip().splitlines()[-1])
assert "Can't get attribute 'worker' on <module '__main__'" in err[0]

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Asking `mp.spawn` for the fork start method does not help: it warns and spawns anyway. `mp.start_processes(..., start_method="fork")` does fork, and then the notebook function works, because a forked child is a copy of the kernel, `__main__` included. Fork is the wrong habit all the same: a process that has initialised CUDA cannot be forked (the child fails with *"Cannot re-initialize CUDA in forked subprocess"*), and forking a process with threads (a Jupyter kernel has several) copies locks in whatever state they were in.
"""

# %% slideshow={"slide_type": "-"}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with child_stderr() as err, expect_error(mp.ProcessExitedException, match="terminated with exit code 1"):
        mp.spawn(worker, nprocs=1, start_method="fork")
assert "Can't get attribute 'worker'" in err[0]  # spawned after all
print("warning:", str(caught[0].message).splitlines()[0])

out = torch.zeros(2).share_memory_()  # forked children write into shared memory

def fill(rank, out):
    out[rank] = 10.0 * (rank + 1)

mp.start_processes(fill, args=(out,), nprocs=2, start_method="fork")
print("filled by 2 forked children:", out.tolist())
assert out.tolist() == [10.0, 20.0]

# %% slideshow={"slide_type": "-"}
if requires_gpu("fork after CUDA initialisation fails in the child"):
    torch.zeros(1, device="cuda")  # initialises CUDA in this process

    def use_cuda(rank):
        torch.zeros(1, device="cuda")

    with expect_error(mp.ProcessRaisedException, match="Cannot re-initialize CUDA in forked subprocess"):
        mp.start_processes(use_cuda, nprocs=1, start_method="fork")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
So the spawn entry point lives in a file, guarded by `if __name__ == "__main__":` (each spawned child imports the file; without the guard every child would spawn again). It initialises the group itself, here with `init_method="tcp://host:port"` instead of environment variables, on a free port. The world size is a number we choose: the source posts pass `nprocs=torch.cuda.device_count()`, which is **0** on a machine without GPUs, and `mp.spawn(..., nprocs=0)` silently does nothing at all:
"""

# %% slideshow={"slide_type": "-"}
assert mp.spawn(worker, nprocs=0) is None  # no process, no error, no training
print("mp.spawn(nprocs=0) returned at once, having trained nothing")

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/spawn_train.py
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (WORKAROUND for torch 2.13: see the note in ddp_train.py)
import torch.multiprocessing as mp

from course_lib.launch import free_port
from course_lib.teardown import end_process_group
from ddp_train import train  # importable: this file's folder is on sys.path

def worker(rank, world_size, port, out, device_type):
    url = f"tcp://127.0.0.1:{port}"
    if device_type == "cuda":  # the GPU path: GPU `rank` for process `rank`, NCCL
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=url, rank=rank, world_size=world_size, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world_size)
    finished = False
    try:
        train(rank, world_size, epochs=2, out=out, device=device)  # the DDP model and the last collectives' tensors die with train()
        finished = True
    finally:
        end_process_group(barrier=finished)  # barrier, destroy, and check that the group is really gone (section 10.2)

if __name__ == "__main__":  # python spawn_train.py OUT [DEVICE [WORLD_SIZE]]
    out, device_type = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cpu"
    world_size = int(sys.argv[3]) if len(sys.argv) > 3 else 2  # a choice, not torch.cuda.device_count()
    mp.spawn(worker, args=(world_size, free_port(), out, device_type), nprocs=world_size, join=True)

# %% slideshow={"slide_type": "-"}
spawned = run_script(["python", "_runs/spawn_train.py", "_runs/ddp_spawn", DEVICE, str(RANKS)], timeout=600, device=DEVICE)
# map_location="cpu": on the GPU path the checkpoints hold CUDA tensors; here they are compared on the CPU
a, b = (torch.load(f"_runs/{run}/checkpoint.pt", map_location="cpu", weights_only=True) for run in ("ddp", "ddp_spawn"))
assert all(torch.equal(a[k], b[k]) for k in a)
print(f"mp.spawn + tcp:// gives the same weights as torchrun + env://, bit for bit; wall time ~{spawned.wall_time:.1f} s")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. The legacy `python -m torch.distributed.launch` and `--local_rank`

PyTorch 2.13 still ships `torch.distributed.launch`, deprecated in favour of `torchrun`. Unlike `torchrun` it passes the local rank as a **command-line argument**, and since PyTorch 2.0 it spells it `--local-rank=N`. The source posts' scripts parse `--local_rank` (underscore), so as written they now die in `argparse`:
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/post_local_rank.py
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=-1, type=int, help="node rank for distributed training")
args = parser.parse_args()
print("local rank", args.local_rank)

# %% slideshow={"slide_type": "-"}
port = free_port()
print(shown(torchrun_command("_runs/post_local_rank.py", nproc_per_node=2, module="launch", master_port=port, tee=False), port))
legacy_cmd = torchrun_command("_runs/post_local_rank.py", nproc_per_node=2, module="launch", master_port=port)
with expect_error(LaunchError, match="unrecognized arguments: --local-rank=", quiet=True) as seen:
    run_script(legacy_cmd, timeout=600, echo="none")
argparse_error = next(line for line in str(seen.error).splitlines() if "unrecognized arguments" in line)
print("LaunchError, the script says:", re.sub(r"rank=\d", "rank=N", argparse_error.split("] ")[-1]))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The training script of section 1 accepts both spellings but reads `LOCAL_RANK` from the environment, which both launchers set: that is the current way. Run under the legacy launcher, it trains exactly as before, and the launcher itself prints its deprecation notice:
"""

# %% slideshow={"slide_type": "-"}
legacy = run_script(torchrun_command("_runs/ddp_train.py", module="launch", master_port=free_port(), nproc_per_node=RANKS,
                                     args=["--out", "_runs/ddp_legacy", "--device", DEVICE]), timeout=600, device=DEVICE)
notice = next(line for line in legacy.output("agent").splitlines() if "deprecated" in line)
print("launcher says:", notice[notice.index("FutureWarning"):].strip())
c = torch.load("_runs/ddp_legacy/checkpoint.pt", map_location="cpu", weights_only=True)
assert all(torch.equal(a[k], c[k]) for k in a)
print("same weights as torchrun: True")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Multi-node, for real: two `torchrun` agents

On two machines you type one command on each, identical except `--node_rank`; they meet at `--master_addr:--master_port` (a port on node 0). Here both "machines" are this one, so the master address is `127.0.0.1`. With `--nnodes=2 --nproc_per_node=1` the world size is 2, so the job must produce exactly the weights of section 2. (This one stays on the CPU even on the GPU path: each "node" runs its only process as `LOCAL_RANK=0`, which on two real machines is GPU 0 of each, but on one machine would put both processes on the same GPU, which NCCL refuses.)
"""

# %% slideshow={"slide_type": "-"}
port = free_port()
for node in (0, 1):
    print(f"node {node}:", shown(torchrun_command("_runs/ddp_train.py", nnodes=2, node_rank=node, nproc_per_node=1,
                                                  master_port=port, tee=False, args=["--out", "_runs/ddp_2nodes"]), port))
two_nodes = run_torchrun("_runs/ddp_train.py", nnodes=2, nproc_per_node=1, master_port=port,
                         args=["--out", "_runs/ddp_2nodes"], timeout=600)
if (DEVICE, RANKS) == ("cpu", 2):
    cpu_ref = a  # section 2's run: 2 CPU processes
else:  # the GPU path trained section 2 on GPUs: the CPU proofs need a 2-process CPU run of their own
    run_torchrun("_runs/ddp_train.py", nproc_per_node=2, args=["--out", "_runs/ddp_cpu"], timeout=600, echo="none")
    cpu_ref = torch.load("_runs/ddp_cpu/checkpoint.pt", weights_only=True)
d = torch.load("_runs/ddp_2nodes/checkpoint.pt", map_location="cpu", weights_only=True)
assert all(torch.equal(cpu_ref[k], d[k]) for k in cpu_ref)
assert "GROUP_RANK=1" in two_nodes.output(1)
print(f"2 nodes x 1 process = 1 node x 2 processes, bit for bit; wall time ~{two_nodes.wall_time:.1f} s")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
On a real cluster (node 0 at 10.0.0.1, 4 GPUs per node), the same two commands with real addresses:

```bash
# on node 0                                           # on node 1
torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 \    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=4 \
  --master_addr=10.0.0.1 --master_port=29500 train.py      --master_addr=10.0.0.1 --master_port=29500 train.py
```

or, without fixed node ranks, the elastic rendezvous. *Rendezvous* is the step in which the `torchrun` agents of a job find each other through one address, agree on how many nodes take part and hand out the node ranks; with the c10d backend it is one identical command on every node, `--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT` with a job id of your choice instead of `--node_rank` and the master address (the cell after next prints it). Under SLURM, one `torchrun` per node started by `srun`:

```bash
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one torchrun agent per node
#SBATCH --gpus-per-node=4
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes="$SLURM_NNODES" --nproc_per_node=4 \
     --rdzv-backend=c10d --rdzv-endpoint="$head:29500" --rdzv-id="$SLURM_JOB_ID" train.py
```

The elastic rendezvous is also what lets a job restart after a failure (`--max-restarts`) or run on a varying number of nodes (`--nnodes=MIN:MAX`); notebook 12 §5 kills a rank and restarts a job for real. The SLURM script is reference material: SLURM starts one `torchrun` per node (`srun`), and the first node's host name serves as the rendezvous endpoint.

The cluster post's two-node commands say `--nnodes=1` on both nodes (each would then form its own one-node job, and node 1's `--node_rank=1` is out of range) and glue `--node_rank=0--master_port` together; the cell below checks that our generator gets both right.
"""

# %% slideshow={"slide_type": "-"}
cmd = torchrun_command("train.py", nnodes=2, node_rank=1, nproc_per_node=4, master_addr="10.0.0.1", master_port=1234, tee=False)
assert "--nnodes=2" in cmd and "--node_rank=1" in cmd and "--master_port=1234" in cmd
with expect_error(ValueError, match="node_rank must be"):
    torchrun_command("train.py", nnodes=1, node_rank=1)  # the cluster post's second node
print("node 1 of 2:", shown(cmd))
elastic = torchrun_command("train.py", nnodes=2, nproc_per_node=4, master_addr="10.0.0.1", master_port=29500,
                           rdzv="c10d", tee=False)
assert "--rdzv-endpoint=10.0.0.1:29500" in elastic and not any(a.startswith("--node_rank") for a in elastic)
print("elastic rendezvous, the same on every node:", shown(elastic))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. `init_process_group`: what it does, `env://` versus `tcp://`, and the fixed port

`init_process_group` **returns** once every rank has joined (the Tensor post says the process is destroyed when it completes: it is not, it goes on with a live group until `destroy_process_group()`). A one-process group in this kernel shows it, and shows the source posts' fixed `MASTER_PORT=29500` failing the moment something else holds the port (another job, or one that did not exit):
"""

# %% slideshow={"slide_type": "-"}
with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    assert port_in_use(taken)
    with expect_error(dist.DistNetworkError, match="EADDRINUSE.*address already in use", quiet=True) as busy_error:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{taken}", rank=0, world_size=1)
print("Raised as expected -> DistNetworkError: ...", str(busy_error.error).split("code: ")[-1])

pid = os.getpid()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
assert dist.is_initialized() and os.getpid() == pid
print(f"after init_process_group: same process, group alive, backend={dist.get_backend()}, world size {dist.get_world_size()}")
del os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]  # keep this kernel's environment clean for the launches below

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**Backend choice.** `gloo` runs collectives on CPU tensors (and on GPU tensors, slowly); `nccl` runs them GPU-to-GPU and is the choice for CUDA training (a CUDA build of PyTorch has it); `mpi` needs PyTorch built against MPI. Choose it with the device, and choose the device on purpose (the script's `--device`): `"nccl" if torch.cuda.is_available() else "gloo"` looks convenient, but it turns every CPU job on a GPU machine into a GPU job, with one GPU needed per process. The script's `--device cuda` path already uses the modern form: `torch.cuda.set_device` from `LOCAL_RANK`, then `init_process_group("nccl", device_id=device)`, and checkpoints loaded with `map_location`. Notebook 12 §6 shows the other device-generic forms of current PyTorch (`torch.accelerator`, `init_process_group()` without a backend).

**SyncBatchNorm.** `nn.SyncBatchNorm.convert_sync_batchnorm(model)` swaps every BatchNorm for one whose batch statistics are all-reduced over the ranks (the cluster post's advice). DDP accepts it only for GPU modules; on CPU it refuses at construction:
"""

# %% slideshow={"slide_type": "-"}
print("gloo available:", dist.is_gloo_available())  # nccl: on CUDA builds only, so not printed here
bn_model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
sync_model = nn.SyncBatchNorm.convert_sync_batchnorm(bn_model)
print("converted:", type(sync_model[1]).__name__)
with expect_error(ValueError, match="SyncBatchNorm layers only work with GPU modules"):
    nn.parallel.DistributedDataParallel(sync_model)
dist.destroy_process_group()
assert not dist.is_initialized()

# %% slideshow={"slide_type": "-"}
if requires_gpu("SyncBatchNorm inside DDP (one-process NCCL group)"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # env:// needs both, removed above
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        ddp_bn = nn.parallel.DistributedDataParallel(sync_model.cuda(), device_ids=[0])
        print("SyncBatchNorm DDP output:", tuple(ddp_bn(torch.randn(4, 8, device="cuda")).shape))
    finally:
        dist.destroy_process_group()
        del os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. `DistributedSampler`: shards, `set_epoch`, padding

The sampler needs only `num_replicas` and `rank` (taken from the process group when not given), so it can be studied right here. Without `set_epoch`, every epoch replays the same order (the source posts copy a training seed to all ranks but never call it):
"""

# %% slideshow={"slide_type": "-"}
ds = list(range(10))
s = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
epoch0, again = list(s), list(s)
s.set_epoch(1)
epoch1 = list(s)
print("rank 0, epoch 0:", epoch0, "| no set_epoch:", again, "| set_epoch(1):", epoch1)
assert epoch0 == again and epoch0 != epoch1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
When the dataset does not divide by the world size, every rank still gets the same number of samples (so all ranks run the same number of steps and no one waits forever in an all-reduce): the index list is **padded by repeating from its start**, so a few samples count twice per epoch. `drop_last=True` drops the tail instead.
"""

# %% slideshow={"slide_type": "-"}
shards = {r: list(DistributedSampler(ds, num_replicas=3, rank=r, shuffle=False)) for r in range(3)}
print("10 samples on 3 ranks:", shards)
flat = sorted(i for v in shards.values() for i in v)
assert all(len(v) == 4 for v in shards.values()) and flat.count(0) == 2 and flat.count(1) == 2
dropped = {r: list(DistributedSampler(ds, num_replicas=3, rank=r, shuffle=False, drop_last=True)) for r in range(3)}
print("with drop_last=True:   ", dropped)
assert sum(len(v) for v in dropped.values()) == 9

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Which seed decides the order? The sampler shuffles with its own generator, seeded with `seed + epoch` (its `seed=` argument, 0 by default, and the epoch from `set_epoch`). The global seed that `seed_everything` sets, and that every rank shares, plays no part in it:
"""

# %% slideshow={"slide_type": "-"}
orders = {}
for global_seed in (0, 1234):
    seed_everything(global_seed)
    orders[global_seed] = list(DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0))
other_seed = list(DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=7))
print("global seed 0:", orders[0], "| global seed 1234:", orders[1234], "| sampler seed=7:", other_seed)
assert orders[0] == orders[1234] != other_seed
_ = seed_everything(0)  # back to the notebook's seed

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Feeding the ranks: workers, their seeds, pinned memory, and resuming mid-epoch

So far every loader read its samples in the training process (`num_workers=0`): while a sample is read, the model waits. With `num_workers=k` the `DataLoader` starts `k` worker processes that read the next batches while the model trains. Four things then need care; the job below shows each on 2 ranks.

1. **Seeds.** Each worker is a copy of the process that made it. PyTorch reseeds `torch`, `random` and NumPy's global generator in every worker (`torch` and `random` from `base_seed + worker_id`, NumPy from a hash of the two), but a generator the *dataset* owns is copied as it is: every worker draws the same "random" augmentations. And `base_seed` itself comes from the global seed, which every rank of a DDP job sets alike: worker *k* of rank 0 and worker *k* of rank 1 draw the same numbers. The fix: a `worker_init_fn` that reseeds what the dataset owns from `get_worker_info().seed`, and `generator=torch.Generator().manual_seed(seed + rank)` for each rank's loader.
2. **Waiting.** A sample that takes 10 ms to read (disk, network, decoding) costs the step 10 ms without workers, and almost nothing with them: the reads overlap the compute, and since waiting for I/O takes no CPU, even more workers than cores help.
3. **`persistent_workers=True`** keeps the workers between epochs; without it, every epoch starts new processes (and pays their start-up again).
4. **Resuming mid-epoch.** A checkpoint taken in the middle of an epoch must also say where in the epoch it was. The job's sampler keeps `(epoch, start)` and skips the first `start` samples; each augmentation is drawn from a generator seeded by `(epoch, index)`, so a sample gets the same augmentation whichever worker, and however many workers, load it.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/loader_job.py
"""The input pipeline of a DDP job: worker seeding, waiting for data, persistent workers, resuming mid-epoch."""
import os
import statistics
import time
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

warnings.filterwarnings("ignore", message="This DataLoader will create")  # I/O-bound workers need no core each

class Reads(Dataset):
    """Sample i takes `delay` seconds to read; two augmentations: from a generator the dataset owns, and from torch's."""

    def __init__(self, n, delay=0.0):
        self.n, self.delay, self.rng = n, delay, np.random.default_rng(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.full((64,), float(i)), (int(self.rng.integers(10**6)), int(torch.randint(10**6, ()))), os.getpid()

class Keyed(Reads):
    def __getitem__(self, key):  # the augmentation of (epoch, i), from a generator seeded by them
        return key[1], int(torch.randint(10**6, (), generator=torch.Generator().manual_seed(1_000_003 * key[0] + key[1])))

class Resumable(DistributedSampler):
    """A DistributedSampler whose place in the epoch, (epoch, start), is saved and restored."""

    start = 0

    def __iter__(self):
        return iter([(self.epoch, i) for i in list(super().__iter__())[self.start:]])

    def __len__(self):
        return self.num_samples - self.start

def reseed(worker_id):  # worker_init_fn: reseed what the dataset owns from this worker's own seed
    get_worker_info().dataset.rng = np.random.default_rng(get_worker_info().seed)

def pipeline(rank, world_size):
    torch.manual_seed(0)  # as every rank of a DDP job does
    data, out = Reads(16), {}
    sampler = DistributedSampler(data, world_size, rank, seed=0)
    for name, extra in (("naive", {}), ("fixed", dict(worker_init_fn=reseed, generator=torch.Generator().manual_seed(rank)))):
        firsts = {}  # each worker's first two augmentations (the dataset's generator, torch's), by its pid
        for _, (owned, from_torch), pid in DataLoader(data, batch_size=2, sampler=sampler, num_workers=2, **extra):
            firsts.setdefault(pid[0].item(), (owned[0].item(), from_torch[0].item()))
        out[name] = list(firsts.values())
    for keep in (False, True):
        loader = DataLoader(data, batch_size=2, sampler=sampler, num_workers=2, persistent_workers=keep)
        out[f"pids, persistent={keep}"] = [sorted({p.item() for *_, pid in loader for p in pid}) for _ in range(3)]
    model, slow = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)), Reads(400, 0.010)
    for workers in (0, 4):
        batches, waits = iter(DataLoader(slow, batch_size=4, sampler=DistributedSampler(slow, world_size, rank, seed=0),
                                         num_workers=workers)), []
        next(batches)  # the workers' start-up is not a step
        for _ in range(12):
            start = time.perf_counter()
            x, _, _ = next(batches)
            waits.append(time.perf_counter() - start)
            for _ in range(8):  # the step's compute
                model(x.repeat(16, 1)).pow(2).mean().backward()
        out[f"wait, {workers} workers"] = statistics.median(waits)
    keyed, samplers = Keyed(32), [Resumable(Keyed(32), world_size, rank, seed=0) for _ in range(3)]
    for s in samplers:
        s.set_epoch(1)
    whole = list(DataLoader(keyed, batch_size=2, sampler=samplers[0], num_workers=2))
    head = [b for _, b in zip(range(3), DataLoader(keyed, batch_size=2, sampler=samplers[1], num_workers=2))]
    out["state"] = {"epoch": samplers[1].epoch, "start": 3 * 2}  # saved with the checkpoint; then the job dies
    samplers[2].set_epoch(out["state"]["epoch"])
    samplers[2].start = out["state"]["start"]
    tail = list(DataLoader(keyed, batch_size=2, sampler=samplers[2], num_workers=0))  # 0 workers on restart
    out["resumed equal"] = len(whole) == len(head + tail) and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole, head + tail))
    return out


# %% slideshow={"slide_type": "subslide"}
r0, r1 = ranks = run_ranks("_runs/loader_job.py:pipeline", 2, timeout=120, echo="none")
fresh, kept = r0["pids, persistent=False"], r0["pids, persistent=True"]
owned, from_torch = ([w[k] for w in r0["naive"] + r1["naive"]] for k in (0, 1))  # workers 0, 1 of rank 0, then rank 1
checks = {"a dataset-owned generator: all 4 workers draw the same": len(set(owned)) == 1,
          "torch's generator: the 2 workers of a rank differ, but worker k of rank 0 = worker k of rank 1":
          from_torch[0] != from_torch[1] and from_torch[:2] == from_torch[2:],
          "with worker_init_fn and a generator per rank, all 4 workers differ, from both generators":
          all(len({w[k] for w in r0["fixed"] + r1["fixed"]}) == 4 for k in (0, 1)), "new worker processes every epoch without persistent_workers":
          all(set(a).isdisjoint(b) for a, b in zip(fresh, fresh[1:])), "the same two, 3 epochs, with it": kept[0] == kept[2],
          "waiting per step without workers >= the 4 reads of 10 ms": all(r["wait, 0 workers"] >= 0.04 for r in ranks),
          "with 4 workers, less than half that": all(r["wait, 4 workers"] < r["wait, 0 workers"] / 2 for r in ranks),
          f"resumed at {r0['state']} with 0 workers instead of 2: the uninterrupted epoch's batches and augmentations":
          r0["resumed equal"] and r1["resumed equal"]}
print("\n".join(f"{ok}: {claim}" for claim, ok in checks.items()))
print(f"median wait for a batch: ~{1e3 * r0['wait, 0 workers']:.1f} ms without workers, ~{1e3 * r0['wait, 4 workers']:.1f} ms with 4")
assert all(checks.values())

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The wait without workers can never be less than the four 10 ms reads of a batch, and with 4 workers it fell below half of that (the printed medians). Two more settings, for jobs on GPUs:

- **`pin_memory=True`** has a thread of the training process copy each batch the workers return into page-locked memory, so that `x.to(device, non_blocking=True)` copies it to the GPU without blocking the training thread. Without an accelerator there is nothing to pin for: the loader warns, when it builds its iterator, that `pin_memory` is set but no accelerator is found (`torch/utils/data/dataloader.py`). Write `pin = torch.accelerator.is_available()` and pass `pin_memory=pin` and `non_blocking=pin`.
- **`prefetch_factor`** (2 by default) is how many batches each worker loads ahead.

`torchdata`'s `StatefulDataLoader` keeps the same `(epoch, position)` bookkeeping inside the loader (`state_dict()` and `load_state_dict()`), including its workers' state; the sampler above needs no new dependency, and its keyed augmentation makes the resumed epoch equal to the uninterrupted one whatever the number of workers.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 8. Proof: 2-process DDP = 1 process on the full batch

Each DDP step, rank *r* computes the mean loss over its 32 samples and DDP **averages** the two ranks' gradients. With equal shard sizes that average is the gradient of the mean loss over the 64-sample global batch (notebook 08: mean of equal means). So one process that trains on the *union* of the two ranks' batches, in the same order, must end with the same weights, up to float rounding (the sums are taken in another order). The reference below rebuilds the ranks' batches from the same `DistributedSampler`s.
"""

# %% slideshow={"slide_type": "-"}
import torch.nn.functional as F
from ddp_train import make_model
from course_lib.data import digits_datasets

train_set, _ = digits_datasets()
x_all, y_all = train_set.tensors
seed_everything(0)
ref = make_model()
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
samplers = [DistributedSampler(train_set, num_replicas=2, rank=r, shuffle=True, seed=0) for r in (0, 1)]
for epoch in range(2):
    for smp in samplers:
        smp.set_epoch(epoch)
    orders = [list(smp) for smp in samplers]
    for start in range(0, len(orders[0]), 32):
        idx = orders[0][start:start + 32] + orders[1][start:start + 32]  # rank 0's batch + rank 1's batch
        opt.zero_grad()
        F.cross_entropy(ref(x_all[idx]), y_all[idx]).backward()
        opt.step()

worst = max((ref.state_dict()[k] - cpu_ref[k]).abs().max().item() for k in cpu_ref)
assert all(torch.allclose(ref.state_dict()[k], cpu_ref[k], atol=1e-5) for k in cpu_ref)
assert worst < 1e-6
print(f"DDP (2 processes) vs 1 process on the 64-sample global batch: allclose, largest difference < 1e-6 (~{worst:.0e})")
seed_everything(0)
assert not all(torch.allclose(make_model().state_dict()[k], cpu_ref[k], atol=1e-3) for k in cpu_ref), "training did move the weights"

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 9. Inside DDP: broadcast, buckets, overlap, `no_sync`

- **Construction** broadcasts rank 0's parameters and buffers to every rank, so the replicas start equal even when each rank initialised differently (the source posts' "same seed or wrong gradients" is too strong: the global seed still matters for dropout and augmentation, not for the initial weights, and not for the sampler's order, which only its `seed=` argument and `set_epoch` decide, §7).
- **Buffers, at the start of a forward**: before every forward that follows a forward run with gradients enabled, DDP broadcasts rank 0's **buffers** again (BatchNorm's running statistics, for instance), in training and in eval mode alike. So DDP is not silent between steps: notebook 12 §1 shows what that does to the statistics, and why an evaluation forward through the DDP model on rank 0 alone hangs.
- **Backward**: DDP registers a hook on every parameter. Gradients are grouped into **buckets**, filled in reverse registration order, whole tensors, a bucket closed as soon as it *reaches* its cap (so it can exceed the cap by up to one tensor); as soon as a bucket is complete its all-reduce starts, **overlapping** communication with the rest of the backward pass. Notebook 10 §1 writes exactly this by hand. The caps, in MiB (`bucket_cap_mb` × 2²⁰ bytes): left at the default, 25 MiB, except the first bucket, capped at 1 MiB so that the last layers' gradients leave early; a `bucket_cap_mb` you pass caps every bucket, the first included. And DDP's very first step puts every gradient in one bucket, then rebuilds the buckets in the order the gradients arrived (notebook 12 §3.2 shows the three rules on every step). Fewer, bigger buckets mean fewer messages; smaller buckets start communicating earlier.
- **`no_sync()`**: inside it, backward only accumulates local gradients; the next backward outside it all-reduces the sum. For k-step accumulation that is one all-reduce instead of k.

The worker below checks each point in a real 2-process job and times the step on rank 0.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/ddp_internals.py
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

def counting_hook(state, bucket):
    """A DDP communication hook: note the bucket's size, then do the default all-reduce (average)."""
    state.append(bucket.buffer().numel() * bucket.buffer().element_size())   # bytes
    return allreduce_hook(None, bucket)

def mlp(width=256, depth=4):
    layers, d = [], 64
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))

def flat_grad(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])

def internals(rank, world_size, steps=10):
    report = {}
    torch.manual_seed(rank)  # deliberately different initial weights on each rank
    model = mlp()
    first = model[0].weight.detach().clone()
    theirs = [torch.empty_like(first) for _ in range(world_size)]
    dist.all_gather(theirs, first)
    report["differ_before"] = not torch.equal(theirs[0], theirs[1])
    ddp = DDP(model)  # broadcasts rank 0's parameters
    dist.all_gather(theirs, model[0].weight.detach().clone())
    report["equal_after"] = torch.equal(theirs[0], theirs[1])

    # the gradient after backward is the mean of the ranks' local gradients
    torch.manual_seed(100 + rank)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    with ddp.no_sync():
        F.cross_entropy(ddp(x), y).backward()  # local only
    local = flat_grad(model).clone()
    ddp.zero_grad()
    F.cross_entropy(ddp(x), y).backward()  # all-reduced
    locals_ = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(locals_, local)
    report["grad_is_mean"] = torch.allclose(flat_grad(model), torch.stack(locals_).mean(0), atol=1e-6)

    # no_sync accumulation = syncing every micro-batch (same sum of averages)
    micro = [(torch.randn(16, 64), torch.randint(0, 10, (16,))) for _ in range(4)]
    ddp.zero_grad()
    for mx, my in micro:
        F.cross_entropy(ddp(mx), my).backward()
    every = flat_grad(model).clone()
    ddp.zero_grad()
    for i, (mx, my) in enumerate(micro):
        with ddp.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():  # the last backward syncs
            F.cross_entropy(ddp(mx), my).backward()
    report["no_sync_same_grad"] = torch.allclose(flat_grad(model), every, atol=1e-6)
    report["params_mb"] = sum(p.numel() * 4 for p in model.parameters()) / 2**20

    # bucket size against step time
    xb, yb = torch.randn(256, 64), torch.randint(0, 10, (256,))
    report["buckets"] = {}
    for cap in (0.05, 0.5, 25.0):
        torch.manual_seed(0)
        m = DDP(mlp(), bucket_cap_mb=cap)
        seen = []
        m.register_comm_hook(seen, counting_hook)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        times = []
        for step in range(steps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            if step < steps + 2:
                seen.clear()  # keep the last step's buckets (DDP rebuilds them after the first step)
        report["buckets"][cap] = (list(seen), 1000 * sorted(times[3:])[len(times[3:]) // 2])

    # no_sync: a 4-micro-batch accumulation step with and without it
    m = DDP(mlp(), bucket_cap_mb=0.5)
    chunks = [(xb[i::4], yb[i::4]) for i in range(4)]
    for mode in ("sync every micro-batch", "no_sync for the first 3"):
        times = []
        for step in range(steps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            m.zero_grad()
            for i, (cx, cy) in enumerate(chunks):
                with m.no_sync() if mode.startswith("no_sync") and i < 3 else contextlib.nullcontext():
                    F.cross_entropy(m(cx), cy).backward()
            times.append(time.perf_counter() - t0)
        report[mode] = 1000 * sorted(times[3:])[len(times[3:]) // 2]
    return report


# %% slideshow={"slide_type": "-"}
from course_lib.hand_ddp import bucket_assignment
from ddp_internals import internals, mlp

reports = run_ranks(internals, nprocs=2, timeout=600)
r0 = reports[0]
assert all(r[key] for r in reports for key in ("differ_before", "equal_after", "grad_is_mean", "no_sync_same_grad"))
print("initial weights differ across ranks before DDP(model):", r0["differ_before"])
print("equal after DDP(model) broadcast rank 0's:            ", r0["equal_after"])
print("gradient after backward = mean of local gradients:    ", r0["grad_is_mean"])
print("no_sync accumulation = syncing every micro-batch:     ", r0["no_sync_same_grad"])
print(f"\nmodel: {r0['params_mb']:.2f} MiB of float32 parameters; step = forward+backward+SGD on 256 samples, median of 10, rank 0")
arrival = [p.numel() * p.element_size() for p in reversed(list(mlp().parameters()))]   # the order gradients arrive
print(f"{'bucket_cap_mb':>14} {'cap in bytes':>13}   {'buckets after the rebuild (bytes each)':<38} step ms")
for cap, (sizes, ms) in r0["buckets"].items():
    predicted = [sum(arrival[i] for i in b) for b in bucket_assignment(arrival, int(cap * 2**20))]
    assert sizes == predicted   # notebook 10 §1's rule: whole tensors, a bucket closes once it reaches the cap
    print(f"{cap:>14} {int(cap * 2**20):>13,}   {str(sizes):<38} ~{ms:.2f}")  # the timing last: its width cannot shift a column
print("every row: what the rule of notebook 10 §1 predicts (course_lib.hand_ddp.bucket_assignment)")
sync_ms, nosync_ms = r0["sync every micro-batch"], r0["no_sync for the first 3"]
print(f"\n4-micro-batch accumulation step: sync every micro-batch ~{sync_ms:.2f} ms, no_sync for the first 3 ~{nosync_ms:.2f} ms")
assert len(r0["buckets"][0.05][0]) == 4 and len(r0["buckets"][0.5][0]) == 2 and len(r0["buckets"][25.0][0]) == 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Why 4 buckets for a 0.83 MiB model at `bucket_cap_mb=0.05`, and not 0.83 / 0.05 ≈ 17? Because tensors go in whole: each of the four weight matrices is larger than the 52,428-byte cap on its own, so each closes a bucket, and the biases ride along. The explicit cap applies to the first bucket too, so the 1 MiB first bucket of the default does not appear here; and the table shows the buckets from step 2 on, after DDP's rebuild (notebook 12 §3.2 prints every step).

What the step times measure, and what they cannot. Each is the median of 10 steps on rank 0, and the three models ran one after the other, on two processes that share the cores with their own compute and with whatever else the machine runs. Two things separate the rows, and one run cannot tell them apart: the number of messages (with 4 buckets a step pays an all-reduce's fixed cost, notebook 09 §5's `α`, and a wake-up of gloo's threads four times; with 1 bucket, once), and the load on the machine while each row ran, which a row measured during a busy spell carries in full. So a gap between rows, even a large one, suggests the cost of messages without measuring it; the cell asserts only the bucket sizes, which are exact. A fair comparison alternates the settings step by step, so that every setting sees the same load: notebook 10 §2 measures overlap that way, on a simulated device. The accumulation line has the same limit: 4 all-reduces against 1 per step, measured one mode after the other. The overlap DDP buys on GPUs (communication over the network while the GPU computes) has little to overlap with here, since communication and compute share the same cores. On GPUs with NCCL the default (25 MiB, first bucket 1 MiB) is the usual choice, and `no_sync` saves one all-reduce of the whole gradient per skipped micro-batch.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 10. What goes wrong: the hang in the cluster post, and a crash after the work is done

### 10.1 Metrics with collectives: every rank calls every collective

Logging a loss averaged over ranks needs a collective, and **every rank must call every collective**, in the same order. The cluster post reduces the loss inside `if args.local_rank == 0:`, so rank 0 waits in `reduce` for a rank 1 that never comes: a hang, not an error. The launcher's timeout turns it into one, and kills both processes.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/cluster_post_logging.py
import time

import torch
import torch.distributed as dist

def get_reduced_loss(loss, dest_rank):
    loss_tensor = loss.clone()
    dist.reduce(loss_tensor, dst=dest_rank)  # a collective: every rank must call it
    return loss_tensor

def cluster_post_logging(rank, world_size):
    loss = torch.tensor(float(rank + 1))
    if rank == 0:  # as in the cluster post: only rank 0 calls reduce -> waits forever
        return get_reduced_loss(loss, 0).item()
    time.sleep(60)  # the other ranks skip the reduce and go on training (stand-in: 60 s of work)
    return None


# %% slideshow={"slide_type": "-"}
with expect_error(LaunchError, match="did not finish within the timeout of 4 s") as hung:
    run_ranks("_runs/cluster_post_logging.py:cluster_post_logging", nprocs=2, timeout=4, echo="none")
print("reason:", hung.error.reason)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The fix: call the collective on every rank, print on one. `reduce` leaves the sum on `dst` only; `all_reduce` leaves it everywhere (what the training script uses, so that every rank could, e.g., stop early on the same condition). The names are `dist.all_reduce` and `dist.all_gather`, not the cluster post's `allreduce`/`allgather`:
"""

# %% slideshow={"slide_type": "-"}
assert not hasattr(dist, "allgather") and not hasattr(dist, "allreduce")
print("dist has all_gather and all_reduce:", hasattr(dist, "all_gather"), hasattr(dist, "all_reduce"))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### 10.2 `terminate called without an active exception`

Learners meet this one in their own DDP scripts on gloo: the job trains, every rank prints its last line, and then one rank dies on the way out:

```
[rank0]: checkpoint loaded = my parameters: True; parameters identical on all 2 ranks: True
terminate called without an active exception
Fatal Python error: Aborted
... failed (exitcode: -6) local_rank: 1 ... ChildFailedError
```

The launcher reports a failure (exit code 1) for a run whose work was complete, and under `torchrun --max-restarts` it is run again. It happens in a few launches in a hundred, more on a busy machine. It is a race, and two things must meet for it.

1. **The process group outlives `destroy_process_group()`.** That call empties `torch.distributed`'s own tables, but the group is freed, and its gloo worker threads joined, only when the last reference to it goes. Anything else that still holds the group keeps those threads alive into interpreter shutdown.
2. **A gloo worker thread lets go of a finished collective late.** `wait()` returns as soon as a collective is marked complete; the worker thread drops its reference a moment after. If the last collective's tensors were created in Python, freeing them needs the GIL. If by then the main thread has left the script and entered interpreter shutdown, Python ends the worker thread instead of giving it the GIL; that forced unwind runs into a C++ destructor declared `noexcept`, and C++ calls `std::terminate()` with no exception in flight, hence the message, then `abort()`.

A core dump of an aborted rank shows exactly that chain: the gloo thread (`ProcessGroupGloo::runLoop`), then `~AsyncAllgatherWork` and `take_gil`, then `pthread_exit` and `std::terminate`, while the main thread is in `Py_FinalizeEx`. The race cannot be shown on demand (it needs a thread to lose the CPU at the wrong millisecond), but its first ingredient can. In PyTorch 2.13 four things hold a group after `destroy_process_group()`:

- **a late import.** The first `DDP(...)` model imports `torch._dynamo`, which imports `torch.distributed.nn.functional`. There, 10 functions are declared with the default argument `group=group.WORLD`, and Python evaluates a default once, at import: imported *after* `init_process_group`, they hold the live default group for good;
- **DTensor's caches.** Every DTensor operation (`fully_shard` runs some while it shards) caches its sharding decision, in C++ and in Python, and each entry holds the device mesh, which holds its groups. Nothing empties these caches when the groups are destroyed;
- **`CommDebugMode`'s module tracker**, which hooks each module's inputs with `register_multi_grad_hook`: those hooks and the autograd graph they hang on hold each other through C++, so every graph it saw, and with it FSDP2's state and mesh, lives to the end of the process;
- **your own hooks**, when a hook is a bound method of the wrapper that owns the parameters (notebook 10 §1): only the garbage collector frees that cycle, perhaps during shutdown itself.

The first is shown below: rank 0 imports `torch.distributed.nn` before `init_process_group`, rank 1 lets DDP import it afterwards; both then tear down in the right order, and a weak reference (one that does not keep its object alive) tells whether the group was really freed:
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/exit_probe.py
"""Does destroy_process_group() free the group? Rank 0 imports torch.distributed.nn before init_process_group;
rank 1 leaves it to DDP, which imports it afterwards (through torch._dynamo), as most DDP scripts do."""
import gc
import os
import sys
import weakref

import torch
import torch.distributed as dist

rank, port = int(sys.argv[1]), sys.argv[2]
if rank == 0:
    import torch.distributed.nn  # noqa: F401  (before init_process_group: its defaults capture no group)

from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
when = "after" if "torch.distributed.nn" not in sys.modules else "before"
model = DDP(torch.nn.Linear(4, 2))  # the first DDP model imports torch._dynamo, and with it torch.distributed.nn
model(torch.randn(3, 4)).sum().backward()
world = weakref.ref(dist.group.WORLD)  # a weak reference: it does not keep the group alive
del model
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(f"[rank{rank}]: torch.distributed.nn imported {when} init_process_group -> "
      f"destroy_process_group() freed the group: {world() is None}", flush=True)
if world() is not None:  # held on purpose here: leave without interpreter shutdown, where its threads could abort us
    os._exit(0)

# %% slideshow={"slide_type": "-"}
port = free_port()
probe = run_script([["python", "_runs/exit_probe.py", str(rank), str(port)] for rank in (0, 1)], timeout=600)
assert "freed the group: True" in probe.output(0) and "freed the group: False" in probe.output(1)
import inspect
import torch.distributed.nn.functional as dist_nn_functional

defaults = inspect.getsource(dist_nn_functional).count("group=group.WORLD")
print(f"torch.distributed.nn.functional: {defaults} functions take group=group.WORLD as a default argument")
assert defaults == 10

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The fix is the general rule, for any backend and any PyTorch: **tear down in order, then check.**

- Let `train()` return, so the DDP model, its reducer, the optimizer and the last collectives' tensors die with its frame; keep none of them in a global.
- `dist.barrier()`: every rank is done communicating.
- Drop what PyTorch caches about the groups (DTensor's caches; `course_lib.torch_private.clear_dtensor_caches`, which uses a private PyTorch function: there is no public one).
- `dist.destroy_process_group()`, then `gc.collect()`: the last reference goes, and the group's threads are joined while Python is fully alive.
- Check with weak references that every group is gone, and if one is not, say what holds it.

`course_lib.teardown.end_process_group()` does exactly these steps; every script in the course ends with it, and `run_ranks` runs it after your function returns. Its check is what makes the rule testable. Below, the same steps run by hand and through `end_process_group` on three small jobs: one keeps a DDP model in a global, one shards a layer with `fully_shard`, and one keeps nothing.

> **Workaround for torch 2.13, not a DDP habit: `import torch.distributed.nn` before `init_process_group`.** The teardown's order is right, but the 10 default arguments above still hold the group when DDP imports the module after `init_process_group` (the probe above). Importing it first leaves nothing for them to capture. Drop the line when a PyTorch release no longer needs it: the probe above then prints `True` for both ranks. Related upstream reports: [pytorch/pytorch#107298](https://github.com/pytorch/pytorch/issues/107298) (threads survive `destroy_process_group`), [#190489](https://github.com/pytorch/pytorch/issues/190489) (the same abort on gloo when `destroy_process_group` is never called), and the unmerged [#179291](https://github.com/pytorch/pytorch/pull/179291) (a gloo thread freeing a tensor during interpreter shutdown).
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/teardown_probe.py
"""What still holds the process group after destroy_process_group()? One small job per case."""
import contextlib
import gc
import io
import weakref

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.teardown import end_process_group
from course_lib.torch_private import clear_dtensor_caches

KEPT = []  # a global: what it holds lives as long as the module

def job(case):
    model = torch.nn.Linear(4, 2)
    if case == "a DDP model kept in a global":
        KEPT.append(DDP(model))
    elif case == "fully_shard":
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    model(torch.randn(3, 4)).sum().backward()

def probe(rank, world_size, case):
    """run_ranks starts the group (import torch.distributed.nn came first, in the worker); we end it here."""
    job(case)
    world = weakref.ref(dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()  # the steps by hand, without dropping DTensor's caches
    gc.collect()
    by_hand = world() is None
    clear_dtensor_caches()  # what end_process_group adds; then what is left can only be ours
    gc.collect()
    cached = by_hand or world() is None
    KEPT.clear()  # let it go before the process exits: a group alive at shutdown is the race above
    gc.collect()
    return {"destroy alone": by_hand, "with the caches dropped": cached, "in the end": world() is None}

def reported(rank, world_size):
    """end_process_group's own report on a job that keeps its DDP model in a global: the text it writes on stderr."""
    job("a DDP model kept in a global")
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        freed = end_process_group(strict=False)  # strict=True (the default under COURSE_LIB_STRICT_TEARDOWN=1) raises
    KEPT.clear()
    gc.collect()
    return freed, said.getvalue()


# %% slideshow={"slide_type": "-"}
expected = {"nothing kept": (True, True), "fully_shard": (False, True), "a DDP model kept in a global": (False, False)}
for case, (alone, dropped) in expected.items():
    held = run_ranks("_runs/teardown_probe.py:probe", nprocs=2, args=(case,), timeout=300, echo="none")[0]
    print(f"{case:<29}: freed by destroy_process_group() alone: {held['destroy alone']!s:<5} | "
          f"with DTensor's caches dropped too: {held['with the caches dropped']}")
    assert (held["destroy alone"], held["with the caches dropped"], held["in the end"]) == (alone, dropped, True)
freed, said = run_ranks("_runs/teardown_probe.py:reported", nprocs=2, timeout=300, echo="none")[0]
print(f"end_process_group() on the last job: freed {freed}; it says:")
print(said.splitlines()[0].split(":", 1)[1].strip())
print("  ... <-", said.splitlines()[1].rsplit("<-", 1)[1].strip())
assert not freed and "global 'KEPT'" in said

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
Each check can fail, and does on the job it is meant for: `fully_shard` leaves the group in DTensor's caches until they are dropped, and the model kept in a global keeps it whatever the teardown does, until the script lets it go. `end_process_group` names the holder at the end of the chain (the global `KEPT`), so the fix is found in one read. With the teardown in order, a rank ends its script with one thread instead of four (the main thread, two gloo workers and gloo's network loop), and nothing is left to race with shutdown. Hiding the crash with `os._exit(0)` after the work also "works", but skips every `atexit` handler and buffer flush.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 11. DataParallel versus DDP, and the source posts checked

Notebook 09 §1 took `nn.DataParallel` apart; this notebook ran DDP. Side by side (the table is generated from `course_lib.facts`, the one place these facts are written):

<!-- BEGIN generated: facts-dp-vs-ddp -->
| | `nn.DataParallel` | `DistributedDataParallel` |
|---|---|---|
| processes | 1, a thread per GPU (GIL-bound, notebook 09 §1) | 1 per device (GPU or CPU worker) |
| machines | one | one or many (`torchrun --nnodes`) |
| per step | scatter the input, replicate the model, gather the outputs | rank 0's buffers broadcast before every forward that follows a grad-enabled one (`forward_sync_buffers`, notebook 12 §1); parameters stay in sync |
| gradient sync | summed onto GPU 0 after backward, with no overlap; GPU 0 also holds the optimizer state and the outputs, so it fills first | the backend's `all_reduce` (ring or tree: the backend chooses, notebook 09 §2), in buckets, overlapped with backward (written by hand in notebook 10 §1) |
| optimizer | runs once, on GPU 0 | runs on every rank, on identical gradients |
| data | one DataLoader; the batch is split in `forward` | a `DistributedSampler` shard per rank |
| BatchNorm | batch statistics per GPU; running statistics kept from GPU 0's replica only (the others are discarded after each forward: `DataParallel` documentation) | batch statistics per rank; running statistics rank 0's, broadcast before forwards (notebook 12 §1); or `SyncBatchNorm` (GPU) for global batch statistics |
| mixed precision | `torch.autocast` around the call: `parallel_apply` carries only its on/off flag into the replicas' threads, each of which uses its device's default dtype, so bf16 autocast runs the replicas in fp16 on CUDA; enter `torch.autocast(..., dtype=...)` inside `forward` (notebook 09 §1) | `torch.autocast` and `torch.amp.GradScaler`, as in one process (Apex `amp` of the single-machine post is retired) |
| launch | `python train.py` | `torchrun` / `mp.spawn` |
| status | not recommended in the PyTorch docs | the recommended way |
<!-- END generated -->

What the source posts say about launching and writing a DDP script, against PyTorch 2.13:

| the source posts say | PyTorch 2.13 does | shown in |
|---|---|---|
| `python -m torch.distributed.launch`, `--local_rank` in argparse | the deprecated launcher passes `--local-rank`, and argparse fails; read `LOCAL_RANK` | §4 |
| `nprocs=torch.cuda.device_count()`; `mp.set_start_method('spawn')`; a worker defined in the notebook | 0 processes on a CPU machine, and no error; `mp.spawn` always spawns; the worker must live in a file, behind a `__main__` guard | §3 |
| `MASTER_PORT = '29500'`; "when `init_process_group` completes the process is destroyed" | a busy port fails, pick a free one; it returns, and the group lives until `destroy_process_group()` | §6 |
| `rank = gpu` with `world_size = num_gpus * nodes` | rank = node_rank × nproc_per_node + local_rank | exercise 1 |
| the same seed everywhere "or the gradients are wrong"; a DDP `DataLoader` without a `DistributedSampler` | DDP broadcasts rank 0's weights; without the sampler every rank trains on the whole dataset, and `set_epoch` reshuffles | §2, §7, §9 |
| `--nnodes=1` on both nodes, `--node_rank=0--master_port=1234` | `--nnodes=2`, with a space | §5 |
| reduce the loss only `if local_rank == 0` | a hang: every rank calls every collective | §10.1 |
| the checkpoint saved only `if not os.path.exists(dir)`; Apex `amp.initialize` | `os.makedirs(exist_ok=True)`, then save every time; `torch.autocast` and `torch.amp.GradScaler` (notebook 07) | §1 |
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Launch with `torchrun` (one command per node, `--nnodes`, `--node_rank`, a master address and port); `mp.spawn` needs an importable worker in a file with a `__main__` guard; `python -m torch.distributed.launch` still exists in 2.13 but is deprecated and passes `--local-rank` (use `LOCAL_RANK`).
- In the script: backend by device, `init_process_group()` (env:// from the launcher, or tcp://), `DistributedSampler` + `set_epoch`, rank-0 I/O behind a barrier, rank-0 checkpoint loaded everywhere with `weights_only=True`, collectives called by every rank.
- DDP is exact: 2 processes on half-batches end allclose to one process on the full batch, and bit-identical across ranks and across launchers.
- Inside: parameters and buffers broadcast at construction, rank 0's buffers again before any forward that follows a grad-enabled one (training or eval mode), bucketed all-reduce overlapped with backward (buckets in MiB, the first one 1 MiB only with the default cap, rebuilt after step 1), `no_sync()` to skip all-reduces during accumulation. Notebook 12 opens DDP's other settings, its failures, and restarts.
- A clean exit: tear down in order (let the DDP model die with `train()`, then `barrier()`, then `destroy_process_group()`); on torch 2.13 also import `torch.distributed.nn` before `init_process_group`, a workaround for a PyTorch defect. Otherwise gloo's threads can outlive the script and abort it with `terminate called without an active exception`.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. The multi-GPU post sets `rank = gpu` with `world_size = num_gpus * nodes`. Write `global_rank(node_rank, local_rank, nproc_per_node)`.
2. Write `shard(n, world_size, rank)` returning the indices `DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False)` gives that rank, padding included.
3. With accumulation over `k` micro-batches in a DDP loop of `n_micro` micro-batches, write `syncs(n_micro, k)`: for each micro-batch, `True` when its backward must run outside `no_sync()`.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.ddp import check_global_rank, check_shard_indices, check_sync_schedule

def global_rank(node_rank, local_rank, nproc_per_node):
    raise NotImplementedError  # your code here

print(check_global_rank(global_rank))


# %% slideshow={"slide_type": "-"}
def shard(n, world_size, rank):
    raise NotImplementedError  # your code here

print(check_shard_indices(shard))


# %% slideshow={"slide_type": "-"}
def syncs(n_micro, k):
    raise NotImplementedError  # your code here

print(check_sync_schedule(syncs))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch docs: [Distributed communication package](https://pytorch.org/docs/stable/distributed.html), [torchrun (elastic launch)](https://pytorch.org/docs/stable/elastic/run.html), [DistributedDataParallel](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), [DistributedSampler](https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler), [SyncBatchNorm](https://pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html), [torch.multiprocessing](https://pytorch.org/docs/stable/multiprocessing.html).
- PyTorch tutorials: [Getting started with DDP](https://pytorch.org/tutorials/intermediate/ddp_tutorial.html), [Writing distributed applications](https://pytorch.org/tutorials/intermediate/dist_tuto.html), [Multi-node training with torchrun](https://pytorch.org/tutorials/intermediate/ddp_series_multinode.html).
- S. Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020 (DDP's buckets and overlap), [arXiv:2006.15704](https://arxiv.org/abs/2006.15704).
- A. Sergeev, M. Del Balso, *Horovod: fast and easy distributed deep learning in TensorFlow* (ring all-reduce), [arXiv:1802.05799](https://arxiv.org/abs/1802.05799).
"""
