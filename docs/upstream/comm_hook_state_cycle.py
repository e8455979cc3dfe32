"""Minimal reproduction, no course code: a DDP communication hook that refers to its DDP module is never freed.

    torchrun --nproc_per_node=2 docs/upstream/comm_hook_state_cycle.py

torch 2.13.0, CPU, gloo. DDP's C++ Reducer keeps the hook and its state as Python objects it owns. A hook that is a
bound method of an object holding the DDP module (a common way to count or log buckets), or a state that holds
the module, makes the cycle module -> reducer -> hook -> module, and the garbage collector cannot see the reducer's
edge: the module, its parameters, and the process group are never freed (prints "freed: False"). A plain function
with a state that does not refer back is freed (prints "freed: True").
"""

import gc
import os
import weakref

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: rules out the other known holder)
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP


class Counter:
    def __init__(self, model):
        self.model, self.bytes = model, 0
        model.register_comm_hook(None, self.hook)  # a bound method: the reducer now holds self, self holds model

    def hook(self, state, bucket):
        self.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
        return allreduce_hook(None, bucket)


def run(bound_method: bool) -> bool:
    model = DDP(torch.nn.Linear(4, 2))
    if bound_method:
        Counter(model)
    else:
        model.register_comm_hook(None, lambda state, bucket: allreduce_hook(None, bucket))
    model(torch.randn(3, 4)).sum().backward()
    alive = weakref.ref(model)
    del model
    gc.collect()
    return alive() is None


dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: plain hook: freed: {run(False)}; bound-method hook: freed: {run(True)}", flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # the leaked module still holds the group: skip interpreter shutdown, where its gloo threads may abort
