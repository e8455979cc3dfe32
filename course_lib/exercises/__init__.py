"""Exercise checks, one module per notebook, on the shared API in :mod:`course_lib.exercises.core`.

Import a check from its notebook's module (``from course_lib.exercises.graphs import check_fresh_grad``):

* ``core`` — ``exercise``, ``CheckResult``, ``NotDone``, ``Wrong`` and helpers every check uses
* ``start`` (00), ``tensors`` (01), ``graphs`` (02), ``custom_autograd`` (03), ``checkpointing`` (04, 05),
  ``mixed_precision`` (06, 07), ``accumulation`` (08), ``all_reduce`` (09), ``ddp_by_hand`` (10),
  ``ddp`` (11), ``ddp_knobs`` (12), ``model_parallel`` (13), ``sharding`` (14), ``fsdp2_dtensor`` (15),
  ``transformer`` (16), ``tensor_parallelism`` (17), ``context_expert_parallelism`` (18),
  ``fsdp_in_practice`` (19), ``compile_overlap_batch`` (20), ``planning`` (21), ``capstone`` (22),
  ``then_and_now`` (23)
"""
