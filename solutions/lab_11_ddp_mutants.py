"""Typical bugs in the DDP lab (solutions/lab_11_ddp.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "sums instead of averaging",
        "flat = torch.cat([q.grad.reshape(-1) for q in bucket]).div_(dist.get_world_size())",
        "flat = torch.cat([q.grad.reshape(-1) for q in bucket])",
        ("✗ gradients of the first step", "summed over the ranks"),
    ),
    Mutant(
        "divides by the world size twice",
        "flat = torch.cat([q.grad.reshape(-1) for q in bucket]).div_(dist.get_world_size())",
        "flat = torch.cat([q.grad.reshape(-1) for q in bucket]).div_(dist.get_world_size() ** 2)",
        ("✗ gradients of the first step", "divided by the world size twice"),
    ),
    Mutant(
        "a hook and a bucket for the frozen parameter",
        "for p in reversed([p for p in module.parameters() if p.requires_grad]):",
        "for p in reversed(list(module.parameters())):",
        ("✗ the job runs", "doesn't require gradient"),
    ),
    Mutant(
        "waits inside the hook",
        "self.pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))",
        "handle = dist.all_reduce(flat, async_op=True)\n            handle.wait()\n"
        "            self.pending.append((bucket, flat, handle))",
        ("✗ overlap with backward", "waited for during backward"),
    ),
    Mutant(
        "launches a bucket as soon as it is complete, out of order",
        "        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):\n"
        "            bucket = self.buckets[self.next]\n",
        "        i = self.bucket_of[p]\n"
        "        while self.ready[i] == len(self.buckets[i]):\n"
        "            bucket = self.buckets[i]\n"
        "            self.ready[i] += 1\n",
        ("✗ one all-reduce per bucket, in bucket order", "same order"),
    ),
    Mutant(
        "communicates inside no_sync",
        "        self.sync = False\n        try:",
        "        self.sync = True\n        try:",
        ("✗ no_sync", "inside no_sync()"),
    ),
    Mutant(
        "no broadcast at construction",
        "            for t in [*module.parameters(), *module.buffers()]:\n                dist.broadcast(t, src=0)\n",
        "            pass\n",
        ("✗ construction", "broadcast every parameter and buffer from rank 0"),
    ),
    Mutant(
        "never copies the averages back into .grad",
        "                q.grad.copy_(averaged.view_as(q.grad))\n",
        "                pass\n",
        ("✗ gradients of the first step",),
    ),
]
