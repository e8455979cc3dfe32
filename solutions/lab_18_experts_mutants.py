"""Typical bugs in the expert-parallel lab (solutions/lab_18_experts.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "input and output split sizes swapped",
        "output_split_sizes=recv, input_split_sizes=send",
        "output_split_sizes=send, input_split_sizes=recv",
        ("✗ the job runs", "split_sizes add up to", "input_split_sizes[r] the rows this rank sends"),
    ),
    Mutant(
        "the capacity not applied: dropped tokens sent too",
        "kept_tokens = torch.nonzero(kept).flatten()",
        "kept_tokens = torch.arange(len(x))",
        ("✗ outputs", "dropped tokens are not returned unchanged", "✗ all-to-alls and their bytes"),
    ),
    Mutant(
        "results put back in the wrong order (the tokens before the sort)",
        "return x.index_add(0, token, back * gate[token].unsqueeze(1))",
        "return x.index_add(0, kept_tokens, back * gate[kept_tokens].unsqueeze(1))",
        ("✗ outputs", "put back in the wrong order", "✗ input gradients"),
    ),
    Mutant(
        "the gate weight not applied",
        "return x.index_add(0, token, back * gate[token].unsqueeze(1))",
        "return x.index_add(0, token, back)",
        ("✗ outputs", "without the gate", "the router got no gradient"),
    ),
    Mutant(
        "the counts exchange missing: the receiver guesses equal splits",
        "counts_in = exchange(counts, [per] * world, [per] * world)",
        "counts_in = torch.full_like(counts, len(token) // n_experts)",
        ("✗ the job runs", "output_split_sizes[", "learned from the counts exchange"),
    ),
    Mutant(
        "tokens sent to the expert's index instead of the expert's rank",
        "owner = expert // per",
        "owner = expert",
        ("✗ the job runs", "has 4 entries for 2 ranks", "lives on rank e // (n_experts // world)"),
    ),
    Mutant(
        "the backward sends with the forward's split sizes",
        "return exchange(grad, ctx.recv, ctx.send), None, None",
        "return exchange(grad, ctx.send, ctx.recv), None, None",
        ("✗ the job runs", "in backward", "input_split_sizes add up to", "the backward of an all-to-all swaps the two"),
    ),
]
