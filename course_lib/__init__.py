"""course_lib: the helpers behind the course *PyTorch training internals, from the Tensor to multi-node DDP*.

Import from the module that does the job (``from course_lib.seeding import seed_everything``);
this package itself exports nothing. One module per job:

* :mod:`course_lib.seeding` — ``seed_everything``: the same numbers on every run
* :mod:`course_lib.device` — ``requires_gpu`` (the guard of GPU-only cells), ``best_device``, ``environment_report``
* :mod:`course_lib.data` — the scikit-learn digits as seeded tensors; Python's documentation as bytes (no downloads)
* :mod:`course_lib.errors` — ``expect_error`` for cells that demonstrate an error
* :mod:`course_lib.graph_view` — draw and describe the autograd graph behind a tensor
* :mod:`course_lib.saved_tensors` — ``SavedTensorMeter``: bytes autograd keeps for backward; autocast's weight copies
* :mod:`course_lib.activations` — the canonical Swish ``autograd.Function`` (notebook 03)
* :mod:`course_lib.memory` — allocator peak of a training step (CPU profiler / CUDA), state bytes
* :mod:`course_lib.checkpointing` — deep chains for checkpointing, the BatchNorm momentum fix
* :mod:`course_lib.float_formats` — float formats bit by bit (notebook 06's explorer)
* :mod:`course_lib.loss_scaling` — the canonical dynamic loss scaler, ``GradScaler``'s rule in plain Python
* :mod:`course_lib.allreduce_sim` — parameter server and ring all-reduce simulated, bytes counted
* :mod:`course_lib.collectives` — the ring all-reduce on real processes (notebook 09 writes it by hand)
* :mod:`course_lib.comm_model` — the alpha-beta cost model of collectives, fitted to measured times
* :mod:`course_lib.timing` — matrix-multiply throughput in TFLOP/s (GPU events or wall clock)
* :mod:`course_lib.transformer` — the course's Llama-style decoder
* :mod:`course_lib.transformer_config` — its configuration and presets
* :mod:`course_lib.transformer_counts` — what a configuration costs: parameters, saved bytes, FLOPs, MFU
* :mod:`course_lib.attention` — attention one key block at a time: partial results, their merge, their backward
* :mod:`course_lib.launch` — run ``torchrun``/spawn jobs from a notebook: free port, timeout, no orphans
* :mod:`course_lib.equivalence` — ``compare_gradients``: a distributed run against one process, scale-sensitive
* :mod:`course_lib.labs` — the labs' checks: the learner's code on real processes against PyTorch's own
* :mod:`course_lib.teardown` — ``end_process_group``: the teardown every launched script ends with, checked
* :mod:`course_lib.torch_private` — every private or testing PyTorch API the course uses, one function each
* :mod:`course_lib.pipeline` — GPipe schedules, the bubble fraction, Gantt charts
* :mod:`course_lib.comm_log` — ``CommLog``: the collectives a hand-written wrapper issued, kind and bytes
* :mod:`course_lib.ddp_buckets` — DDP's bucket rule and caps
* :mod:`course_lib.hand_ddp` — ``HandDDP``: DDP by hand (buckets, overlap), the canonical copy of notebook 10's
* :mod:`course_lib.timelines` — spans of compute and communication per rank, and what compute hid
* :mod:`course_lib.simulated_compute` — layers that take a known time on a CPU, timelines of compute and communication
* :mod:`course_lib.hand_fsdp` — ``HandFSDP``: FSDP by hand (gather, free, reduce-scatter), notebook 14's canonical copy
* :mod:`course_lib.sharded_optim` — ``ShardedOptimizer``: ZeRO-1 around any ``torch.optim`` optimizer
* :mod:`course_lib.sharding` — ZeRO's memory model: state bytes per rank for DDP and ZeRO-1/2/3
* :mod:`course_lib.counted_collectives` — collectives that count the bytes they send
* :mod:`course_lib.tp_operators` — Megatron's f and g operators and their sequence-parallel halves
* :mod:`course_lib.tensor_parallel_bytes` — the bytes tensor and sequence parallelism send and keep
* :mod:`course_lib.tensor_parallel` — tensor and sequence parallelism of the transformer, collectives counted
* :mod:`course_lib.context_parallel` — ring attention (forward and backward), contiguous and zig-zag layouts, its bytes
* :mod:`course_lib.context_parallel_variants` — all-gather and Ulysses attention, the bytes of all three ways
* :mod:`course_lib.planner_layout` — the planner's cluster, layout and prediction
* :mod:`course_lib.planner_model` — memory per rank and time per step of one layout
* :mod:`course_lib.planner` — memory per rank and step time of DP/TP/PP/CP layouts, the feasible ones ranked
* :mod:`course_lib.published_runs` — published layouts and throughput (Megatron-LM, Llama 3) for the planner
* :mod:`course_lib.torchtitan_map` — the course's training scripts' flags mapped onto torchtitan's options, with sources
* :mod:`course_lib.moe` — a top-k mixture-of-experts layer (router, capacity, auxiliary loss) and its expert parallelism
* :mod:`course_lib.manifest` — the course's notebooks in order, from ``course.toml`` (reading only)
* :mod:`course_lib.facts` — each comparison fact stated once, and the statements the course corrected
* :mod:`course_lib.validation` — ``check_int``, ``check_number``, ``check_bool``: argument checks in one wording
* :mod:`course_lib.exercises` — exercise checks, one module per notebook topic, on :mod:`course_lib.exercises.core`
"""
