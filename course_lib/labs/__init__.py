"""The labs: the learner writes a distributed mechanism and launches it as real processes, checked against PyTorch.

Each lab is a notebook (``notebooks/lab_NN_topic.ipynb``, after notebook NN) with a skeleton the learner fills in
and a check, one call in the notebook, that runs the learner's file on 2 to 4 CPU processes over gloo beside
PyTorch's own implementation and judges gradients and parameters with a printed tolerance:

* :mod:`course_lib.labs.ddp` — ``BucketedDDP``: broadcast, buckets, overlapped all-reduces, ``no_sync`` (lab 11);
* :mod:`course_lib.labs.pipeline` — a 1F1B schedule of two stages with ``send``/``recv`` (lab 13);
* :mod:`course_lib.labs.zero` — a ZeRO-1/2 sharded optimizer around any element-wise optimizer (lab 14);
* :mod:`course_lib.labs.fsdp` — FSDP by hand: shard, gather, free, reduce-scatter (lab 14);
* :mod:`course_lib.labs.tensor_parallel` — the f/g operators, column- and row-parallel blocks, sequence parallelism
  (lab 17);
* :mod:`course_lib.labs.ring_attention` — ring attention with the online-softmax merge, causal, zig-zag (lab 18);
* :mod:`course_lib.labs.experts` — expert parallelism: the all-to-all dispatch and combine with a capacity (lab 18);
* :mod:`course_lib.labs.capstone` — a training step assembled from flags, launched by ``torchrun`` (lab 22);
* :mod:`course_lib.labs.core` — what every lab shares: the launch, the verdict (:class:`~.core.LabResult`);
* :mod:`course_lib.labs.recorder` — the record of the collectives the learner's code issues;
* :mod:`course_lib.labs.measure` — small measurements the checks share.

The reference solutions and the catalogues of typical bugs (mutants) live outside the learner's package, in
``solutions/`` (the instructor's material); ``tests/test_labs.py`` runs every lab on its reference (it must pass),
on its skeleton (it must say "not done yet"), and on every mutant (it must fail, naming the mistake).
"""

# Every lab's check, by the lab's notebook stem (course.toml's [[lab]] entries agree: tests/test_labs.py).
CHECKS: dict[str, str] = {
    "lab_11_ddp": "course_lib.labs.ddp:check_ddp_lab",
    "lab_13_pipeline": "course_lib.labs.pipeline:check_pipeline_lab",
    "lab_14_fsdp": "course_lib.labs.fsdp:check_fsdp_lab",
    "lab_14_zero": "course_lib.labs.zero:check_zero_lab",
    "lab_18_experts": "course_lib.labs.experts:check_experts_lab",
    "lab_18_ring_attention": "course_lib.labs.ring_attention:check_ring_attention_lab",
    "lab_17_tensor_parallel": "course_lib.labs.tensor_parallel:check_tensor_parallel_lab",
    "lab_22_capstone": "course_lib.labs.capstone:check_capstone_lab",
}
