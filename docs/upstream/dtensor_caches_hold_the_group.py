"""Minimal reproduction, no course code: after one DTensor operation, destroy_process_group() cannot free the group.

    torchrun --nproc_per_node=2 docs/upstream/dtensor_caches_hold_the_group.py

torch 2.13.0, CPU, gloo. Prints, on each rank, whether the default group was freed and how many threads the process
still runs, after barrier + destroy_process_group() + gc.collect(), then again after DTensor's caches are emptied.
On 2.13.0 every rank prints "freed: False, threads: 4" then "freed: True, threads: 1": DTensor's sharding caches
hold the DeviceMesh, the mesh holds the group, and the group's two gloo worker threads and its TCP loop live on
into interpreter shutdown, where a worker thread that still drops a finished collective aborts the process
("terminate called without an active exception"; the stacks are in docs/crash_at_exit.md).
"""

import functools
import gc
import os
import weakref

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: rules out the other known holder)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def job() -> None:
    model = torch.nn.Linear(8, 8)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))  # runs a few DTensor operations
    model(torch.randn(2, 8)).sum().backward()
    torch.optim.AdamW(model.parameters()).step()  # foreach ops on DTensors: MeshTopoInfo.build_from_mesh's cache


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


dist.init_process_group("gloo")
rank = dist.get_rank()
job()
world = weakref.ref(dist.group.WORLD)
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(f"rank {rank}: after destroy_process_group(): freed: {world() is None}, threads: {threads()}", flush=True)

# What holds it: the C++ sharding-propagation cache, and Python caches of torch.distributed.tensor.
torch._C._clear_DTensor_sharding_propagator_cache()
import torch.distributed.tensor._redistribute as redistribute  # noqa: E402

redistribute.clear_redistribute_planner_cache()  # keyed by weakref(mesh), but its values hold the mesh strongly
for obj in gc.get_objects():  # functools caches keyed by meshes or specs (MeshTopoInfo.build_from_mesh, ...)
    if type(obj) is functools._lru_cache_wrapper and str(getattr(obj, "__module__", "")).startswith("torch.distributed"):
        obj.cache_clear()
from torch.distributed.tensor import DTensor  # noqa: E402

DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
gc.collect()
print(f"rank {rank}: after emptying DTensor's caches: freed: {world() is None}, threads: {threads()}", flush=True)
