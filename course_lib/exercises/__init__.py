"""Exercise checks, one module per notebook, on the shared API in :mod:`course_lib.exercises.core`.

Import a check from its notebook's module (``from course_lib.exercises.graphs import check_fresh_grad``):

* ``core`` — ``exercise``, ``CheckResult``, ``NotDone``, ``Wrong`` and helpers every check uses
* ``start`` (00), ``tensors`` (01), ``graphs`` (02), ``custom_autograd`` (03), ``checkpointing`` (04, 05),
  ``mixed_precision`` (06, 07), ``accumulation`` (08), ``all_reduce`` (09), ``ddp`` (10),
  ``ddp_knobs`` (11), ``model_parallel`` (12), ``sharding`` (13), ``transformer`` (14),
  ``tensor_parallelism`` (15), ``context_expert_parallelism`` (16), ``fsdp_in_practice`` (17),
  ``compile_overlap_batch`` (18), ``planning`` (19), ``capstone`` (20),
  ``then_and_now`` (21)
"""
