"""Launch the DDP training script of notebook 08 many times and count the runs that crash at exit.

    python benchmarks/launch_stress.py [--launches 102] [--epochs 1] [--portable] [--script FILE]

The bug this guards against: a gloo job that did all its work, printed its results, and then
aborted in interpreter shutdown ("terminate called without an active exception", SIGABRT, exit
code 1 through the launcher). It is a race (a gloo worker thread still dropping a finished
collective while Python shuts down; see FIX_NOTES.md), so one launch proves nothing: this script
starts the training script ``--launches`` times in total, round-robin under ``torchrun``, the legacy
``python -m torch.distributed.launch`` and ``course_lib.launch.spawn`` (2 processes each), and
counts a launch as a crash when it exits nonzero or any process printed "terminate called".

The training script is TRAIN_SCRIPT below, the text notebook 08's cell 3 writes to
``_runs/ddp_train.py`` (FIX_NOTES.md has the same text); it is written to a temporary folder, and
``spawn`` calls its ``train`` function. ``--script FILE`` launches another file instead (to measure
an old teardown: its ``train`` is the spawn target). ``--portable`` gives the children the
portable-kernel environment the crash was first seen with (ATEN_CPU_CAPABILITY=default
ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1). The race needs a gloo
thread to lose the CPU at the wrong moment, so its rate depends on how busy the machine is: a
clean run on an idle machine is weaker evidence than one under load.

Prints a table (one row per launcher), then:
RESULT launches=<n> crashes=<n> terminate=<launches with 'terminate called'> nonzero=<launches that exited nonzero> wall_s=<s>
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from course_lib.launch import LaunchError, run_torchrun, spawn

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "OMP_NUM_THREADS": "1",
}
LAUNCHERS = ("torchrun", "launch", "spawn")

# Notebook 08, cell 3 (after its %%writefile line), verbatim.
TRAIN_SCRIPT = r'''
"""Train a small MLP on the digits with DistributedDataParallel; launch with torchrun, the legacy launcher or mp.spawn."""
import argparse
import gc
import os
import sys
import weakref

import torch
import torch.distributed as dist
# Before init_process_group, on purpose. DDP imports this module lazily (through torch._dynamo), and
# its functions take `group=group.WORLD` as a default argument, evaluated at import: imported after
# init_process_group, ten of them hold the default process group for good, destroy_process_group()
# cannot free it, and its gloo threads live on into interpreter shutdown (see the teardown below).
import torch.distributed.nn  # noqa: F401
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib.data import digits_datasets
from course_lib.seeding import seed_everything


def log(*parts):
    # one write per line: processes that share a pipe (mp.spawn's children) cannot cut into each other's lines
    sys.stdout.write(f"[rank{dist.get_rank()}]: {' '.join(map(str, parts))}\n")
    sys.stdout.flush()


def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def train(rank, world_size, epochs=2, batch_size=32, lr=0.1, out="_runs/ddp"):
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if use_cuda else torch.device("cpu")
    # The same seed on every rank: the same initial weights (DDP also broadcasts rank 0's) and the same
    # sampler seed. Randomness that should differ per rank (augmentation) would add the rank to the seed.
    seed_everything(0)

    # Rank-0-only I/O: one process fetches/prepares, the others wait at the barrier, then everyone reads.
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
    model = DDP(make_model().to(device), device_ids=[device.index] if use_cuda else None)
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
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])  # what both launchers set: use this, not the argument
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)  # init_method="env://": MASTER_ADDR/PORT, RANK, WORLD_SIZE from the environment
    r, n = dist.get_rank(), dist.get_world_size()
    log(f"backend={backend} RANK={r} LOCAL_RANK={local_rank} WORLD_SIZE={n} GROUP_RANK={os.environ.get('GROUP_RANK')}")
    # Teardown, in this order. (1) train() returns: the DDP model, its reducer, the optimizer and the
    # results of the last collectives die with its frame (keep none of them in a global). (2) barrier:
    # every rank is done communicating. (3) destroy_process_group() drops the last reference to the
    # group, which joins gloo's worker threads now, while Python is fully alive; a gloo thread still
    # holding a finished collective when the interpreter shuts down aborts the process with
    # "terminate called without an active exception".
    world = weakref.ref(dist.group.WORLD)
    try:
        train(r, n, epochs=args.epochs, out=args.out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    gc.collect()
    if world() is not None:  # something still holds the group: its threads outlive the script
        sys.stderr.write(f"warning: rank {r}: the process group outlived destroy_process_group()\n")
'''.lstrip("\n")


def one_launch(launcher: str, script: Path, epochs: int, out: Path, env: dict[str, str], timeout: float) -> tuple[bool, bool, str]:
    """Run the script once; return (exited nonzero, printed 'terminate called', first error line)."""
    text, nonzero = "", False
    try:
        if launcher == "spawn":
            # spawn initialises the group, calls train(rank, world_size, epochs, batch_size, lr, out), tears down
            spawn(f"{script}:train", 2, (epochs, 32, 0.1, str(out)), timeout=timeout, env=env, cwd=script.parent, echo="none")
        else:
            result = run_torchrun(script.name, args=["--epochs", epochs, "--out", str(out)], module=launcher,
                                  timeout=timeout, env=env, cwd=script.parent, echo="none")
            text = result.output()
    except LaunchError as e:
        nonzero = True
        text = (e.result.output() if e.result is not None else "") + "\n" + str(e)
    terminate = "terminate called" in text
    first = next((line for line in text.splitlines() if "terminate called" in line or "Error" in line), "")
    return nonzero, terminate, first.strip()[:120]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=102, help="launches in total, shared round-robin by the 3 launchers")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per launch (the bug is at exit: 1 is enough)")
    parser.add_argument("--portable", action="store_true", help="children use the portable (default-capability) kernels")
    parser.add_argument("--script", type=Path, default=None, help="launch this training script instead of TRAIN_SCRIPT")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="comma-separated subset of torchrun,launch,spawn")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per launch")
    parser.add_argument("--verbose", action="store_true", help="print one line per crash as it happens")
    args = parser.parse_args(argv)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    if args.launches < 1 or args.epochs < 1 or not launchers or any(name not in LAUNCHERS for name in launchers):
        parser.error("--launches and --epochs must be >= 1, --launchers a subset of torchrun,launch,spawn")
    env = dict(PORTABLE_ENV) if args.portable else {}
    # the training script imports course_lib: this checkout's, whatever the caller's PYTHONPATH
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    counts = {name: {"launches": 0, "nonzero": 0, "terminate": 0, "crashes": 0, "seconds": 0.0} for name in launchers}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="launch_stress_") as tmp:
        if args.script is None:
            script = Path(tmp) / "ddp_train.py"
            script.write_text(TRAIN_SCRIPT)
        else:
            script = args.script.resolve()
            if not script.is_file():
                parser.error(f"--script: no such file {args.script}")
        out = Path(tmp) / "out"
        for i in range(args.launches):
            launcher = launchers[i % len(launchers)]
            t0 = time.perf_counter()
            nonzero, terminate, first = one_launch(launcher, script, args.epochs, out, env, args.timeout)
            row = counts[launcher]
            row["seconds"] += time.perf_counter() - t0
            row["launches"] += 1
            row["nonzero"] += nonzero
            row["terminate"] += terminate
            row["crashes"] += nonzero or terminate
            if args.verbose and (nonzero or terminate):
                print(f"launch {i + 1} ({launcher}): crash: {first}", flush=True)
    wall = time.perf_counter() - start
    total = {key: sum(row[key] for row in counts.values()) for key in ("launches", "nonzero", "terminate", "crashes")}
    print(f"script: {'TRAIN_SCRIPT (notebook 08 cell 3)' if args.script is None else args.script}; --epochs {args.epochs}; "
          f"portable kernels: {'yes' if args.portable else 'no'}; {os.cpu_count()} CPU cores")
    print(f"{'launcher':<10} {'launches':>9} {'crashes':>8} {'nonzero exit':>13} {'terminate called':>17} {'s/launch':>9}")
    for name, row in counts.items():
        print(f"{name:<10} {row['launches']:>9} {row['crashes']:>8} {row['nonzero']:>13} {row['terminate']:>17} "
              f"{row['seconds'] / max(row['launches'], 1):>9.2f}")
    print(f"RESULT launches={total['launches']} crashes={total['crashes']} terminate={total['terminate']} "
          f"nonzero={total['nonzero']} wall_s={wall:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
