"""Typical bugs in the tensor-parallel lab (solutions/lab_17_tensor_parallel.py): patches its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "f and g swapped",
        "    return CopyToTP.apply, ReduceFromTP.apply\n",
        "    return ReduceFromTP.apply, CopyToTP.apply\n",
        ("✗ tensor parallel: outputs", "g (all-reduce forward) after the row-parallel one"),
    ),
    Mutant(
        "f's backward without the all-reduce",
        "        grad = grad.clone()\n        dist.all_reduce(grad)\n        return grad\n",
        "        return grad\n",
        ("✗ f and g", "f: forward unchanged, backward unchanged (expected summed over the ranks)"),
    ),
    Mutant(
        "g's backward all-reduces too (a double all-reduce)",
        "    def backward(ctx, grad):\n        return grad\n",
        "    def backward(ctx, grad):\n"
        "        grad = grad.clone()\n"
        "        dist.all_reduce(grad)\n"
        "        return grad\n",
        ("✗ f and g", "backward summed over the ranks (expected unchanged)", "double all-reduce"),
    ),
    Mutant(
        "the row-parallel bias added on every rank",
        "        return self.leave(F.linear(h, self.fc2.weight)) + self.fc2.bias\n",
        "        return self.leave(self.fc2(h))\n",
        ("✗ tensor parallel: outputs", "MLP: the output is off by 1 x the row-parallel bias", "on every rank"),
    ),
    Mutant(
        "the column-parallel weight split along the wrong dimension",
        "shard.weight = nn.Parameter(linear.weight.detach().chunk(n, 0)[rank].clone())",
        "shard.weight = nn.Parameter(linear.weight.detach().chunk(n, 1)[rank].clone())",
        ("✗ shards", "attn.q.weight (32, 16) (expected (16, 32))", "output features"),
    ),
    Mutant(
        "sequence parallelism's reduce-scatter along the batch",
        "    seq_first = x.movedim(1, 0).contiguous()\n",
        "    seq_first = x.contiguous()\n",
        ("✗ sequence-parallel operators", "ReduceScatterToSP: forward returned shape", "dimension 1"),
    ),
    Mutant(
        "averages the whole parameters' gradients (a 1/N too many)",
        "                dist.all_reduce(p.grad)\n",
        "                dist.all_reduce(p.grad)\n                p.grad /= dist.get_world_size()\n",
        ("✗ sequence parallel: weight gradients", "relative error 0.5", "without dividing"),
    ),
    Mutant(
        "never sums the whole parameters' gradients under sequence parallelism",
        "        if self.sequence_parallel:\n",
        "        if False:\n",
        (
            "✗ sequence parallel: weight gradients",
            "sync_grads() must all-reduce them",
            "✗ sequence parallel: collectives",
        ),
    ),
]
