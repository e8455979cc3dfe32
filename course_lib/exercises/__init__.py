"""Exercise checks, one module per notebook, on the shared API in :mod:`course_lib.exercises.core`.

Import a check from its notebook's module (``from course_lib.exercises.graphs import check_fresh_grad``):

* ``core`` — ``exercise``, ``CheckResult``, ``NotDone``, ``Wrong`` and helpers every check uses
* ``start`` (00), ``tensors`` (01), ``graphs`` (02), ``custom_autograd`` (03), ``checkpointing`` (04),
  ``mixed_precision`` (05), ``accumulation`` (06), ``all_reduce`` (07), ``ddp`` (08),
  ``ddp_knobs`` (09), ``model_parallel`` (10), ``sharding`` (11), ``capstone`` (12), ``transformer`` (14)
"""
