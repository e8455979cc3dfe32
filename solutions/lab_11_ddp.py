"""Lab: data parallelism by hand, the way DistributedDataParallel does it.

`BucketedDDP(module, bucket_cap_bytes)` wraps a model on every rank of the default process group:

- at construction every rank takes rank 0's parameters and buffers (a broadcast);
- the trainable parameters (not the frozen ones) are grouped into buckets, in reverse order of
  `module.parameters()` (the order backward produces their gradients), whole tensors, a bucket closed as soon
  as it holds at least `bucket_cap_bytes`; `self.buckets` is that list of lists of parameters;
- a hook per trainable parameter (`register_post_accumulate_grad_hook`) notes that its gradient is ready; when
  a bucket is complete and every earlier bucket has been launched, its gradients are flattened into one
  tensor, divided by the world size and all-reduced asynchronously (`async_op=True`), while backward goes on;
- `finish()`, called after backward, waits for every handle and copies the averaged values back into `.grad`;
- inside `with model.no_sync():` nothing is communicated (gradient accumulation): the next backward outside
  it all-reduces the accumulated sum.
"""

import contextlib
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_bytes=4096):
        super().__init__()
        self.module = module
        self.sync = True  # False inside no_sync()
        ### BEGIN SOLUTION
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.buckets, bucket, size = [], [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_cap_bytes:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)
        self.next = 0
        self.pending = []
        ready = weakref.WeakMethod(self._grad_ready)  # no cycle: parameter -> hook -> wrapper -> parameter
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(lambda p: ready()(p))
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        ### BEGIN SOLUTION
        self.sync = False
        try:
            yield
        finally:
            self.sync = True
        ### END SOLUTION

    def _grad_ready(self, p):
        """Called by p's hook once p.grad holds p's whole gradient for this backward."""
        ### BEGIN SOLUTION
        if not self.sync:
            return
        self.ready[self.bucket_of[p]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            bucket = self.buckets[self.next]
            flat = torch.cat([q.grad.reshape(-1) for q in bucket]).div_(dist.get_world_size())
            self.pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
            self.next += 1
        ### END SOLUTION

    def finish(self):
        ### BEGIN SOLUTION
        for bucket, flat, handle in self.pending:
            handle.wait()
            for q, averaged in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(averaged.view_as(q.grad))
        self.pending, self.next, self.ready = [], 0, [0] * len(self.buckets)
        ### END SOLUTION
