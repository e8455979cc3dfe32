"""Typical bugs in the ZeRO lab (solutions/lab_14_zero.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "frozen parameters flattened with the trainable ones",
        'trainable = [p for p in group["params"] if p.requires_grad]',
        'trainable = list(group["params"])',
        ("✗ frozen parameters", "moved into a flat buffer", "✗ communication per step"),
    ),
    Mutant(
        "sums the gradients instead of averaging",
        "            chunk.div_(self.world_size)  # the mean, once\n",
        "",
        ("✗ gradients of the first step", "summed over the ranks"),
    ),
    Mutant(
        "chunk bounds off by one: the last element of each chunk is never updated",
        "start, end = max(offset, lo), min(offset + n, hi)",
        "start, end = max(offset, lo), min(offset + n, hi - 1)",
        ("✗ each rank steps its chunk", "off by one"),
    ),
    Mutant(
        "no all-gather after the step",
        "            dist.all_gather_single(flat, mine)  # every chunk, into every rank's buffer\n",
        "",
        ("✗ every rank holds the same parameters", "all-gather"),
    ),
    Mutant(
        "an unused parameter stepped with a zero gradient",
        "piece.grad = chunk[start : start + piece.numel()] if got else None",
        "piece.grad = chunk[start : start + piece.numel()]",
        ("✗ a parameter without a gradient", "never uses moved"),
    ),
    Mutant(
        "one optimizer group for all, ignoring each group's options",
        'inner.append({**options, "params": [q for q in buffer["pieces"] if q is not None]})',
        'inner.append({"params": [q for q in buffer["pieces"] if q is not None]})',
        ("✗ parameters after 3 AdamW steps", "group's options"),
    ),
    Mutant(
        "stage 2 keeps the full gradient",
        "                    p.grad = None  # only my chunk of the gradient is kept\n",
        "                    pass\n",
        ("✗ stage 2 drops the full gradient",),
    ),
    Mutant(
        "all-reduces the whole gradient, then keeps its chunk",
        "            dist.reduce_scatter_single(chunk, grads)  # chunk r of the sum over the ranks\n",
        "            dist.all_reduce(grads)\n"
        "            chunk.copy_(grads[self.rank * shard : (self.rank + 1) * shard])\n",
        ("✗ communication per step", "not an all-reduce"),
    ),
]
