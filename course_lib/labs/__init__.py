"""The labs: the learner writes a distributed mechanism and launches it as real processes, checked against PyTorch.

Each lab is a notebook (``notebooks/lab_NN_topic.ipynb``, after notebook NN) with a skeleton the learner fills in
and a check, one call in the notebook, that runs the learner's file on 2 to 4 CPU processes over gloo beside
PyTorch's own implementation and judges gradients and parameters with a printed tolerance:

* :mod:`course_lib.labs.ddp` — ``BucketedDDP``: broadcast, buckets, overlapped all-reduces, ``no_sync`` (lab 10);
* :mod:`course_lib.labs.core` — what every lab shares: the launch, the verdict (:class:`~.core.LabResult`);
* :mod:`course_lib.labs.recorder` — the record of the collectives the learner's code issues.

The reference solutions and the catalogues of typical bugs (mutants) live outside the learner's package, in
``solutions/`` (the instructor's material); ``tests/test_labs.py`` runs every lab on its reference (it must pass),
on its skeleton (it must say "not done yet"), and on every mutant (it must fail, naming the mistake).
"""
