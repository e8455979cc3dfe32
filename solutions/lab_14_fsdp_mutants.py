"""Typical bugs in the FSDP lab (solutions/lab_14_fsdp.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "parameters not freed after forward",
        "        self.free()\n        if output.requires_grad:",
        "        if output.requires_grad:",
        ("✗ parameters freed after forward", "resize_(0)"),
    ),
    Mutant(
        "gradients summed, not averaged",
        "return mine.div_(unit.world_size), None",
        "return mine, None",
        ("✗ gradients of the first step", "summed over the ranks"),
    ),
    Mutant(
        "replicated parameters never all-reduced",
        "    for p in replicated:\n        p.register_post_accumulate_grad_hook(_all_reduce_mean)\n",
        "",
        ("✗ replicated parameters agree", "post-accumulate-grad hook", "✗ collectives per step"),
    ),
    Mutant(
        "no gather again before backward",
        "        if output.requires_grad:\n            output.register_hook(self.before_backward)\n",
        "",
        ("✗ the job runs", "all-gather its parameters again"),
    ),
    Mutant(
        "shard padding off by one",
        "self.padded = math.ceil(total / self.world_size) * self.world_size",
        "self.padded = (total // self.world_size + 1) * self.world_size",
        ("✗ shard layout", "next multiple"),
    ),
    Mutant(
        "all-reduces the whole gradient, then keeps its chunk",
        "        dist.reduce_scatter_single(mine, grad_full.contiguous())  # chunk r of the sum over the ranks\n",
        "        summed = grad_full.contiguous().clone()\n"
        "        dist.all_reduce(summed)\n"
        "        mine.copy_(summed.chunk(unit.world_size)[unit.rank])\n",
        ("✗ collectives per step", "not an all-reduce"),
    ),
    Mutant(
        "every rank keeps the first chunk",
        "self.shard = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())",
        "self.shard = nn.Parameter(flat.chunk(self.world_size)[0].clone())",
        ("✗ the shards hold the model", "chunk r"),
    ),
    Mutant(
        "gathers again into the full tensor itself",
        "        alias = torch.empty(0, dtype=self.full.dtype, device=self.full.device).set_(storage)\n"
        "        with torch.no_grad():\n"
        "            self.all_gather(alias)\n",
        "        with torch.no_grad():\n            self.all_gather(self.full)\n",
        ("✗ the job runs", "version counter"),
    ),
]
