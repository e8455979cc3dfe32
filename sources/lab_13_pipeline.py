# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · a 1F1B pipeline schedule, with send and receive

Notebook 13 split a model over two processes, ran its micro-batches in GPipe order (every forward, then every backward) by hand and with `ScheduleGPipe`, and simulated 1F1B, the order real pipelines use: the same bubble, fewer activations kept alive. In this lab you write 1F1B yourself, with point-to-point messages, and it runs as two real processes beside `torch.distributed.pipelining`'s `Schedule1F1B` on the same stages and data.

By the end you will have written, and seen pass against PyTorch's pipeline and against one process:
- the forward of one micro-batch on each stage, its activation sent to the next stage;
- its backward, the gradient of that activation sent back and applied to the right micro-batch;
- the 1F1B order: a warm-up of forwards, then one backward and one forward, then a cool-down of backwards;
- sends that do not block, so that two stages never wait for each other.

This lab assumes notebook 13 (§2, two stages by hand; §3, micro-batches; §4, `torch.distributed.pipelining` and 1F1B) and notebook 09 §4 (blocking and non-blocking sends). Expected time: about an hour.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the four places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_pipeline.py`) and the check after it. The module's docstring is the specification. About 35 lines.

Three rules decide whether it is right, and each has a check of its own:

1. **The gradients are those of the mean loss over the whole batch.** Each micro-batch's loss is divided by the number of micro-batches, every backward adds into the same `.grad`, and stage 0 runs the backward of micro-batch `i` with the gradient stage 1 sent for micro-batch `i`.
2. **The order is 1F1B.** With `p = 2` stages, stage `s` runs `p - s` forwards before its first backward: stage 0 runs `F0 F1 B0 F2 B1 F3 B2 B3`, stage 1 `F0 B0 F1 B1 F2 B2 F3 B3`. So stage 0 never holds more than 2 micro-batches' activations, where GPipe holds all 4.
3. **No two stages wait for each other.** On gloo a blocking `dist.send` returns only once the other side has posted the matching receive (notebook 09 §4). In the steady state stage 0 sends an activation while stage 1 sends a gradient: if both sends block, neither returns. Send with `dist.isend`, keep the handle and the tensor, and wait for the handles at the end of the step.
"""

# %% slideshow={"slide_type": "-"}
import os

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_pipeline.py
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
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, chunk):
        """The forward of the next micro-batch; `chunk` is its inputs (rank 0) or its targets (rank 1)."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def backward(self):
        """The backward of the oldest micro-batch whose forward has run and whose backward has not."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def step(self, batch):
        """One training step, 1F1B order; returns rank 1's micro-batch losses (floats), [] on rank 0."""
        # YOUR CODE HERE
        raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_pipeline_lab()` starts 2 processes (gloo, CPU). Each builds its half of a small MLP (rank 0: inputs to an activation of width 32; rank 1: that activation to 4 class scores) and runs your `OneFOneB` for 2 steps of 4 micro-batches of 4 samples, once with SGD and once with AdamW. In the same processes it runs the same stages with `PipelineStage` and `Schedule1F1B`, and the whole model in one process on the whole batch. It records each forward of your stages and the moment each micro-batch's backward reaches them (hooks on the stage and on its outputs), and every message your code sends or receives. It checks:

- the first step's gradients, on both stages, equal one process's and `Schedule1F1B`'s (relative error ≤ 1e-5, `course_lib.equivalence.compare_gradients`, which names a forgotten division by the number of micro-batches when it sees one);
- the micro-batch losses stage 1 returns equal `Schedule1F1B`'s;
- the order of forwards and backwards on each stage is 1F1B, the order `Schedule1F1B` runs, and stage 0 holds at most 2 micro-batches' activations at once;
- the parameters after 2 SGD steps and after 2 AdamW steps equal `Schedule1F1B`'s and one process's within 1e-6: the three runs compute the same sums in different orders (per micro-batch or over the whole batch), so only the rounding of float32 differs;
- stage 0 sends 4 activations and receives 4 gradients per step, and nothing else is communicated.

A message whose buffer does not have the shape of an activation stops the job at once with that shape in the error. A hang ends at the timeout, with each stage's last messages and the micro-batches it had run.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.pipeline import check_pipeline_lab

print(check_pipeline_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- Notebook 13 §2's `pipeline_step` has the forward and backward of each stage, in GPipe order and with blocking sends: the body of `forward` and `backward` is close to its two loops; what changes is when each runs, and how the sends are posted.
- `batch.chunk(n_micro)` gives the micro-batches. Stage 1 receives into `torch.empty(len(chunk), HIDDEN)`, then calls `requires_grad_()` on it, so that after `loss.backward()` its `.grad` is the gradient to send back.
- Keep the tensor you send with `isend` alive until its handle has been waited for: `out.detach()` and `activation.grad` are new tensors that nothing else holds.
- A list used as a queue (append at the end, `pop(0)` at the front) gives each backward the oldest micro-batch whose forward has run; in 1F1B that is the micro-batch whose gradient arrives next.
- The loop of `step`: `warmup` forwards, then for each micro-batch one backward followed by one forward while forwards remain. With `warmup = n_micro` it is GPipe, and the order check says so.

## Summary

- A pipeline stage does two things per micro-batch: a forward whose output goes downstream, and a backward whose input gradient goes upstream. The schedule only decides their order; the gradients are the same as one process's in any order that keeps each micro-batch's backward after its forward.
- 1F1B runs each backward as early as its gradient can arrive, so stage `s` of `p` holds at most `p - s` micro-batches' activations, instead of all of them.
- Point-to-point messages need a send and a receive posted on both sides; stages that send to each other at the same moment must not block in their sends.

## References

- PyTorch: [`torch.distributed.pipelining`](https://pytorch.org/docs/stable/distributed.pipelining.html) (`PipelineStage`, `Schedule1F1B`) and [point-to-point communication](https://pytorch.org/docs/stable/distributed.html#point-to-point-communication) (`send`, `recv`, `isend`, `irecv`).
- D. Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP 2019 (the 1F1B schedule), and *Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC 2021, [arXiv:2104.04473](https://arxiv.org/abs/2104.04473).
"""
