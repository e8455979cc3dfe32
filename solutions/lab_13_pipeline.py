"""Lab: the 1F1B schedule of a 2-stage pipeline, with point-to-point sends and receives.

A model is split in two stages: rank 0 holds the first (inputs -> activation of width HIDDEN), rank 1 the second
(activation -> class scores). A batch is split into `n_micro` equal micro-batches (`batch.chunk(n_micro)`).
`OneFOneB(stage, rank, n_micro).step(batch)` runs one training step on this rank; `batch` is the inputs on rank 0
and the targets on rank 1. The gradients accumulate in the stage's `.grad`: the caller zeroes them between steps.

- forward of a micro-batch: rank 0 runs its stage on the inputs, sends the activation to rank 1 and keeps its
  output for the backward; rank 1 receives the activation, makes it require grad, runs its stage and computes
  the loss, `F.cross_entropy(scores, targets) / n_micro` (the mean over the batch is the mean of the means);
- backward of a micro-batch (the oldest one whose forward has run): rank 1 runs the loss's backward and sends
  the activation's gradient to rank 0; rank 0 receives it and runs the backward of the output it kept for that
  micro-batch (`out.backward(grad)`);
- the 1F1B order: stage `s` of `p = 2` runs `p - s` forwards first (warm-up), then one backward and one forward
  as long as forwards remain, then the remaining backwards (cool-down);
- sends never block: `dist.isend`, the handle and the tensor kept until the end of the step, where every handle
  is waited for (a blocking `dist.send` waits for the other stage's receive). Receives are `dist.recv` into a
  buffer of the shape sent;
- `step` returns, on rank 1, each micro-batch's loss as a float, before the division by `n_micro`; on rank 0 [].
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

HIDDEN = 32  # the width of the activation stage 0 sends to stage 1


class OneFOneB:
    def __init__(self, stage, rank, n_micro):
        self.stage, self.rank, self.n_micro = stage, rank, n_micro
        self.kept = []  # what each micro-batch's backward needs, oldest first
        self.sends = []  # (handle, tensor) of the sends in flight
        self.losses = []  # rank 1: each micro-batch's loss, a float

    def send(self, tensor, dst):
        """Send `tensor` to rank `dst` without waiting; keep the handle and the tensor until the end of the step."""
        ### BEGIN SOLUTION
        self.sends.append((dist.isend(tensor, dst=dst), tensor))
        ### END SOLUTION

    def forward(self, chunk):
        """The forward of the next micro-batch; `chunk` is its inputs (rank 0) or its targets (rank 1)."""
        ### BEGIN SOLUTION
        if self.rank == 0:
            out = self.stage(chunk)
            self.send(out.detach(), dst=1)
            self.kept.append(out)
        else:
            activation = torch.empty(len(chunk), HIDDEN)
            dist.recv(activation, src=0)
            activation.requires_grad_()
            loss = F.cross_entropy(self.stage(activation), chunk)
            self.losses.append(loss.item())
            self.kept.append((activation, loss / self.n_micro))
        ### END SOLUTION

    def backward(self):
        """The backward of the oldest micro-batch whose forward has run and whose backward has not."""
        ### BEGIN SOLUTION
        if self.rank == 0:
            out = self.kept.pop(0)
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            out.backward(grad)
        else:
            activation, loss = self.kept.pop(0)
            loss.backward()
            self.send(activation.grad, dst=0)
        ### END SOLUTION

    def step(self, batch):
        """One training step, 1F1B order; returns rank 1's micro-batch losses (floats), [] on rank 0."""
        ### BEGIN SOLUTION
        chunks = batch.chunk(self.n_micro)
        warmup = min(2 - self.rank, self.n_micro)  # forwards before the first backward
        for i in range(warmup):
            self.forward(chunks[i])
        for i in range(self.n_micro):
            self.backward()
            if warmup + i < self.n_micro:
                self.forward(chunks[warmup + i])
        for handle, _ in self.sends:
            handle.wait()
        self.sends = []
        losses, self.losses = self.losses, []
        return losses
        ### END SOLUTION
