"""Typical bugs in the capstone lab (solutions/lab_22_capstone.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "the micro-batch loss not divided by the number of micro-batches",
        "y[k * size : (k + 1) * size]) / args.accum",
        "y[k * size : (k + 1) * size])",
        ("✗ first-step gradients (ddp, accumulation 2, SGD)", "without dividing each loss"),
    ),
    Mutant(
        "never synchronizes under DDP (no_sync on every micro-batch)",
        'context = net.no_sync() if args.dp == "ddp" and not last else torch.enable_grad()',
        'context = net.no_sync() if args.dp == "ddp" else torch.enable_grad()',
        ("✗ first-step gradients (ddp, accumulation 2, SGD)", "synchronize on the last micro-batch"),
    ),
    Mutant(
        "every rank trains on the same rows",
        "x, y = x[rank::world], y[rank::world]",
        "x, y = x[: len(x) // world], y[: len(y) // world]",
        ("✗ first-step gradients", "take your own rows"),
    ),
    Mutant(
        "clips after every micro-batch",
        "            total += loss.detach()\n",
        "            total += loss.detach()\n"
        "            if args.clip > 0:\n"
        "                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n",
        ("✗ first-step gradients (ddp, clipping, AdamW)", "clip once per step"),
    ),
    Mutant(
        "records the gradients after clipping",
        "        if step == 0:\n"
        "            first_grads = {name: whole(p.grad) for name, p in model.named_parameters()}\n"
        "        if args.clip > 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n",
        "        if args.clip > 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n"
        "        if step == 0:\n"
        "            first_grads = {name: whole(p.grad) for name, p in model.named_parameters()}\n",
        ("✗ first-step gradients (ddp, clipping, AdamW)", "before clipping"),
    ),
    Mutant(
        "records this rank's shard of an FSDP2 gradient, not the whole",
        '    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()',
        '    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()',
        ("✗ first-step gradients (fsdp2, accumulation 2, clipping, AdamW)", "whole gradient"),
    ),
    Mutant(
        "FSDP2 never told to synchronize on the last micro-batch",
        "                net.set_requires_gradient_sync(last)",
        "                net.set_requires_gradient_sync(False)",
        ("✗ the job runs (fsdp2", "set_requires_gradient_sync(True)"),
    ),
]
