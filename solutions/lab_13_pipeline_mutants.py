"""Typical bugs in the pipeline lab (solutions/lab_13_pipeline.py): each a small patch its check must reject."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "both stages receive before either sends (warm-up counts swapped)",
        "warmup = min(2 - self.rank, self.n_micro)",
        "warmup = min(1 + self.rank, self.n_micro)",
        ("✗ the job finishes", "stage 0: dist.recv after F0", "stage 1: dist.recv after F0", "both in dist.recv"),
        timeout=30.0,
    ),
    Mutant(
        "blocking sends",
        "self.sends.append((dist.isend(tensor, dst=dst), tensor))",
        "dist.send(tensor, dst=dst)",
        ("✗ the job finishes", "dist.send after F0 F1", "send with dist.isend"),
        timeout=30.0,
    ),
    Mutant(
        "GPipe order: every forward, then every backward",
        "warmup = min(2 - self.rank, self.n_micro)",
        "warmup = self.n_micro",
        ("✗ order of operations", "GPipe", "✗ activations alive at once"),
    ),
    Mutant(
        "the loss not divided by the number of micro-batches",
        "self.kept.append((activation, loss / self.n_micro))",
        "self.kept.append((activation, loss))",
        ("✗ gradients of the first step", "without dividing each loss by their number"),
    ),
    Mutant(
        "gradients zeroed between micro-batches",
        "            self.backward()\n",
        "            self.stage.zero_grad()\n            self.backward()\n",
        ("✗ gradients of the first step", "the last micro-batch's alone", "never zeroed inside a step"),
    ),
    Mutant(
        "the received gradient applied to the wrong micro-batch's activation (last in, first out)",
        "out = self.kept.pop(0)",
        "out = self.kept.pop()",
        ("✗ gradients of the first step", "the gradient received for micro-batch i"),
    ),
    Mutant(
        "a receive buffer of the wrong shape (the whole batch)",
        "activation = torch.empty(len(chunk), HIDDEN)",
        "activation = torch.empty(len(chunk) * self.n_micro, HIDDEN)",
        ("✗ the job runs", "(16, 32) torch.float32 buffer", "the shape of what the other stage sends"),
    ),
]
