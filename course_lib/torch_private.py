"""Every private or testing PyTorch API the course uses, each behind one small function.

A private name (one with a leading underscore, or under ``torch.testing._internal``) can be renamed or removed in
any PyTorch release. Keeping each behind a function here means that when one changes, one function changes, and
``tests/test_torch_private.py`` names the API and the notebooks that use it. Each function's docstring says what it
does, the public API that would replace it (if any), and the PyTorch version it was checked on.

The notebooks still say, where they use one of these, that it is private.
"""

from __future__ import annotations

import functools
import gc
import importlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PRIVATE_APIS", "TorchDispatchMode", "tree_flatten", "tree_map_only", "clear_dtensor_caches"]
__all__ += ["in_backward", "live_process_groups", "missing_private_apis", "ddp_bucket_assignment"]
__all__ += ["ddp_first_bucket_bytes", "set_group_timeout", "dump_flight_recorder", "set_unshard_async_op"]
__all__ += ["checkpoint_wrapper", "dynamo_config", "functorch_config", "dynamo_explain", "aot_autograd", "set_logs"]
__all__ += ["dynamo_unsupported_error", "backend_compiler_failed_error", "aten_linear", "record_memory_history"]
__all__ += ["memory_snapshot", "dump_memory_snapshot", "onednn_bf16_supported", "profiler_memory_events"]
__all__ += ["fake_process_group", "fake_tensor_mode", "fsdp_memory_tracker", "scaled_mm"]

# Every private API behind a function of this module: (module, attribute path, the function that uses it).
# tests/test_torch_private.py checks that each one exists in the installed torch.
PRIVATE_APIS: tuple[tuple[str, str, str], ...] = (
    ("torch._C", "_clear_DTensor_sharding_propagator_cache", "clear_dtensor_caches"),
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache", "clear_dtensor_caches"),
    ("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator", "clear_dtensor_caches"),
    ("torch.distributed.distributed_c10d", "_world.pg_map", "live_process_groups"),
    ("torch._C", "_current_graph_task_id", "in_backward"),
    ("torch.utils._python_dispatch", "TorchDispatchMode", "TorchDispatchMode"),
    ("torch.utils._pytree", "tree_flatten", "tree_flatten"),
    ("torch.utils._pytree", "tree_map_only", "tree_map_only"),
    ("torch.distributed", "_compute_bucket_assignment_by_size", "ddp_bucket_assignment"),
    ("torch.distributed", "_DEFAULT_FIRST_BUCKET_BYTES", "ddp_first_bucket_bytes"),
    ("torch.distributed.distributed_c10d", "_set_pg_timeout", "set_group_timeout"),
    ("torch._C._distributed_c10d", "_dump_fr_trace", "dump_flight_recorder"),
    ("torch.distributed.fsdp", "FSDPModule._set_unshard_async_op", "set_unshard_async_op"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper", "checkpoint_wrapper"),
    ("torch._dynamo", "config.patch", "dynamo_config"),
    ("torch._functorch", "config.patch", "functorch_config"),
    ("torch._dynamo", "explain", "dynamo_explain"),
    ("torch._dynamo.backends.common", "aot_autograd", "aot_autograd"),
    ("torch._logging", "set_logs", "set_logs"),
    ("torch._dynamo.exc", "Unsupported", "dynamo_unsupported_error"),
    ("torch._dynamo.exc", "BackendCompilerFailed", "backend_compiler_failed_error"),
    ("torch._C._nn", "linear", "aten_linear"),
    ("torch.cuda.memory", "_record_memory_history", "record_memory_history"),
    ("torch.cuda.memory", "_snapshot", "memory_snapshot"),
    ("torch.cuda.memory", "_dump_snapshot", "dump_memory_snapshot"),
    ("torch", "ops.mkldnn._is_mkldnn_bf16_supported", "onednn_bf16_supported"),
    ("torch.testing._internal.distributed.fake_pg", "FakeStore", "fake_process_group"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode", "fake_tensor_mode"),
    ("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker", "fsdp_memory_tracker"),
    ("torch", "_scaled_mm", "scaled_mm"),
)

CHECKED_ON = "2.13.0"  # the torch version every function here was checked on

# Re-exported: TorchDispatchMode, the base of a mode that sees every operator below autograd (documented in "Extending
# PyTorch", only under this private module), and the pytree utilities (torch.utils.pytree is not public in 2.13).
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map_only  # noqa: E402

from .validation import check_int, check_items  # noqa: E402


def _resolve(module: str, path: str) -> Any:
    """The object at ``module`` + dotted ``path``; AttributeError/ImportError if PyTorch no longer has it."""
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def missing_private_apis() -> list[str]:
    """The entries of :data:`PRIVATE_APIS` the installed torch lacks, as ``module.path (used by function)``.

    >>> missing_private_apis()
    []
    """
    missing = []
    for module, path, user in PRIVATE_APIS:
        try:
            _resolve(module, path)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path} (used by course_lib.torch_private.{user})")
    return missing


def clear_dtensor_caches() -> None:
    """Empty the caches DTensor keeps for the life of the process, which hold device meshes and their groups.

    Any DTensor operation (``fully_shard`` runs some at construction) stores its sharding decision in a C++ cache
    (``torch._C._clear_DTensor_sharding_propagator_cache`` empties it) and in Python caches of
    ``torch.distributed.tensor``: the sharding propagator's per-thread cache, the redistribution planner cache, and
    ``functools`` caches such as ``MeshTopoInfo.build_from_mesh``. Each entry holds a ``DTensorSpec`` or a mesh, the
    mesh holds its process groups, and ``destroy_process_group()`` empties none of them: without this call the groups,
    and gloo's threads, live on into interpreter shutdown.

    Public replacement: none in torch 2.13 (``destroy_process_group`` should drop these entries; the upstream report is
    in ``docs/crash_at_exit.md``). Safe to call at any time: the caches only make later DTensor operations faster.
    """
    clear_cpp: Callable[[], None] = _resolve("torch._C", "_clear_DTensor_sharding_propagator_cache")
    clear_cpp()
    redistribute = importlib.import_module("torch.distributed.tensor._redistribute")
    redistribute.clear_redistribute_planner_cache()
    propagator = _resolve("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator")
    propagator.propagate_op_sharding.cache_clear()  # per thread: this thread's entries
    # Every other functools cache of torch.distributed (MeshTopoInfo.build_from_mesh keys on the mesh itself, the
    # transform plans and strategies on specs): found by the garbage collector, so that a cache a later release
    # adds is emptied too.
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which a deprecated torch object answers with a warning
        if type(obj) is functools._lru_cache_wrapper and str(getattr(obj, "__module__", "")).startswith(
            "torch.distributed"
        ):
            obj.cache_clear()


def live_process_groups() -> list[weakref.ReferenceType[Any]]:
    """Weak references to every process group this process has created and not destroyed (the default one too).

    Read from ``torch.distributed.distributed_c10d._world.pg_map``, the table ``destroy_process_group()`` empties.
    Public replacement: none (``torch.distributed`` has no call that lists the groups). Empty when ``torch.distributed``
    is unavailable or no group exists.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return []
    table = _resolve("torch.distributed.distributed_c10d", "_world.pg_map")
    return [weakref.ref(group) for group in list(table)]


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread (so a hook being called is inside it).

    ``torch._C._current_graph_task_id()`` is -1 outside backward. Public replacement: none (a hook can be told apart
    only from inside autograd).
    """
    task: Callable[[], int] = _resolve("torch._C", "_current_graph_task_id")
    return task() != -1


def ddp_bucket_assignment(tensors: Sequence[Any], limits: Sequence[int]) -> list[list[int]]:
    """The buckets DDP's reducer forms for ``tensors`` (in arrival order) under the byte caps ``limits``.

    ``limits`` is ``[first_cap, cap]`` (or ``[cap]``): the first bucket closed has the first cap. Wraps
    ``torch.distributed._compute_bucket_assignment_by_size`` and returns only the index lists. Public replacement: none
    (DDP forms its buckets in C++).
    """
    assign: Callable[..., tuple[list[list[int]], Any]] = _resolve(
        "torch.distributed", "_compute_bucket_assignment_by_size"
    )
    tensors = check_items("tensors", tensors, torch.Tensor, "a list of tensors")
    limits = check_items("limits", limits, int, "a list of byte caps (ints)")
    if not 1 <= len(limits) <= 2 or min(limits) < 0:
        raise ValueError(f"limits must be [first_cap, cap] or [cap], bytes >= 0, got {limits}")
    groups, _ = assign(tensors, limits)
    return [list(g) for g in groups]


def ddp_first_bucket_bytes() -> int:
    """The cap of DDP's first bucket under the default ``bucket_cap_mb`` (1 MiB in 2.13).

    ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``. Public replacement: none (the documentation states the rule).
    """
    return int(_resolve("torch.distributed", "_DEFAULT_FIRST_BUCKET_BYTES"))


def set_group_timeout(timeout: Any, group: Any = None) -> None:
    """Change the timeout of a process group that already exists (``timeout``: a ``datetime.timedelta``).

    ``torch.distributed.distributed_c10d._set_pg_timeout``. Public replacement: set it when the group is made,
    ``init_process_group(timeout=...)`` or ``new_group(timeout=...)``.
    """
    import datetime

    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    _resolve("torch.distributed.distributed_c10d", "_set_pg_timeout")(timeout, group)


def dump_flight_recorder() -> bytes:
    """This process's flight-recorder buffer, pickled: what NCCL's watchdog writes to a file on a timeout.

    ``torch._C._distributed_c10d._dump_fr_trace``. Public replacement: the environment variables
    ``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and ``TORCH_FR_DUMP_TEMP_FILE``, which make the watchdog
    write it (NCCL only).
    """
    dump: Callable[[], bytes] = _resolve("torch._C._distributed_c10d", "_dump_fr_trace")
    return dump()


def set_unshard_async_op(module: Any, async_op: bool) -> None:
    """Make an FSDP2 module issue its all-gathers without waiting for them (what overlaps them on a CPU).

    ``FSDPModule._set_unshard_async_op``. Public replacement: none; on a GPU none is needed (the all-gathers run on
    their own stream).
    """
    if not isinstance(async_op, bool):
        raise TypeError(f"async_op must be a bool, got {type(async_op).__name__}")
    if not callable(getattr(module, "_set_unshard_async_op", None)):
        raise TypeError(f"module must be an FSDP2 module (after fully_shard), got {type(module).__name__}")
    module._set_unshard_async_op(async_op)


def checkpoint_wrapper(module: Any, **kwargs: Any) -> Any:
    """``module`` wrapped so that its forward runs under activation checkpointing (the FSDP recipes' wrapper).

    ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper``. Public replacement: call
    ``torch.utils.checkpoint.checkpoint`` in the block's forward.
    """
    wrap: Callable[..., Any] = _resolve(
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper"
    )
    return wrap(module, **kwargs)


def dynamo_config(**flags: Any) -> Any:
    """A context manager that sets Dynamo's settings (``optimize_ddp``, ``compiled_autograd``...) inside it.

    ``torch._dynamo.config.patch``. Public replacement: none for these two in 2.13 (``torch.compile``'s ``options`` are
    Inductor's). An unknown name raises ``ValueError``.
    """
    config = _resolve("torch._dynamo", "config")
    unknown = [name for name in flags if not hasattr(config, name)]
    if unknown:
        raise ValueError(f"torch._dynamo.config has no setting {unknown}")
    return config.patch(**flags)


def functorch_config(**flags: Any) -> Any:
    """A context manager that sets AOTAutograd's settings (``activation_memory_budget``...) inside it.

    ``torch._functorch.config.patch``. Public replacement: none in 2.13. An unknown name raises ``ValueError``.
    """
    config = importlib.import_module("torch._functorch.config")
    unknown = [name for name in flags if not hasattr(config, name)]
    if unknown:
        raise ValueError(f"torch._functorch.config has no setting {unknown}")
    return config.patch(**flags)


def dynamo_explain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``dynamo_explain(fn)(*args)`` runs ``fn`` once under Dynamo and reports its graphs and graph breaks.

    ``torch._dynamo.explain``. Public replacement: ``TORCH_LOGS=graph_breaks`` shows the breaks (not the count).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    explain: Callable[..., Callable[..., Any]] = _resolve("torch._dynamo", "explain")
    return explain(fn)


def aot_autograd(**kwargs: Any) -> Any:
    """A ``torch.compile`` backend built from forward and backward compilers (``fw_compiler=``, ``bw_compiler=``).

    ``torch._dynamo.backends.common.aot_autograd``, the helper of PyTorch's guide to writing a backend. Public
    replacement: none in 2.13.
    """
    make: Callable[..., Any] = _resolve("torch._dynamo.backends.common", "aot_autograd")
    return make(**kwargs)


def set_logs(**kwargs: Any) -> None:
    """Switch ``torch.compile``'s log channels from code (``set_logs(recompiles=True)``; no arguments: all off).

    ``torch._logging.set_logs`` (documented, in a private module). Public replacement: ``TORCH_LOGS=...`` in the
    environment.
    """
    _resolve("torch._logging", "set_logs")(**kwargs)


def dynamo_unsupported_error() -> type[Exception]:
    """The exception ``torch.compile(..., fullgraph=True)`` raises for what Dynamo cannot trace.

    ``torch._dynamo.exc.Unsupported``, a ``RuntimeError``: catch ``RuntimeError`` in your own code.
    """
    error: type[Exception] = _resolve("torch._dynamo.exc", "Unsupported")
    return error


def backend_compiler_failed_error() -> type[Exception]:
    """The exception ``torch.compile`` raises when its backend fails (``torch._dynamo.exc.BackendCompilerFailed``).

    A ``RuntimeError`` subclass: catch ``RuntimeError`` in your own code.
    """
    error: type[Exception] = _resolve("torch._dynamo.exc", "BackendCompilerFailed")
    return error


def aten_linear() -> Any:
    """The C++ function behind ``F.linear`` (``torch._C._nn.linear``): a Dynamo graph's node for a ``Linear``.

    Public replacement: none (a graph's ``call_function`` nodes target it).
    """
    return _resolve("torch._C._nn", "linear")


def record_memory_history(enabled: str | None = "all", max_entries: int = 100_000) -> None:
    """Start (``enabled="all"``) or stop (``enabled=None``) recording every CUDA allocation with its stack.

    ``torch.cuda.memory._record_memory_history``: underscored but documented in "Understanding CUDA memory usage"; no
    public name in 2.13.
    """
    if enabled not in ("all", "state", None):
        raise ValueError(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
    _resolve("torch.cuda.memory", "_record_memory_history")(enabled=enabled, max_entries=max_entries)


def memory_snapshot() -> dict[str, Any]:
    """The CUDA allocator's recorded history and segments (``torch.cuda.memory._snapshot``; documented, underscored)."""
    snapshot: dict[str, Any] = _resolve("torch.cuda.memory", "_snapshot")()
    return snapshot


def dump_memory_snapshot(path: str) -> None:
    """Write the snapshot to ``path`` for pytorch.org/memory_viz (``torch.cuda.memory._dump_snapshot``)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty str, got {path!r}")
    _resolve("torch.cuda.memory", "_dump_snapshot")(path)


def onednn_bf16_supported() -> bool:
    """Whether oneDNN (PyTorch's CPU kernels) has bf16 kernels for this CPU.

    ``torch.ops.mkldnn._is_mkldnn_bf16_supported``. Public replacement: none;
    ``torch.backends.cpu.get_cpu_capability()`` names the vector unit only.
    """
    return bool(_resolve("torch", "ops.mkldnn._is_mkldnn_bf16_supported")())


def profiler_memory_events(prof: Any) -> list[tuple[int, int]]:
    """``(start_ns, nbytes)`` of every CPU ``[memory]`` event a finished ``torch.profiler.profile(profile_memory=True)``
    recorded (allocations positive, frees negative), in the profiler's order.

    Reads ``prof.profiler.kineto_results.events()`` and each event's ``name()``, ``device_type()``, ``start_ns()`` and
    ``nbytes()``: the public ``prof.events()`` has no per-allocation sizes. Public replacement: none in 2.13.
    (``tests/test_torch_private.py`` runs a profile and reads it).
    """
    try:
        raw = prof.profiler.kineto_results.events()
        return [
            (int(e.start_ns()), int(e.nbytes()))
            for e in raw
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        ]
    except AttributeError as err:
        raise RuntimeError(
            f"torch {torch.__version__} changed the profiler's private record (prof.profiler.kineto_results) that "
            f"course_lib.torch_private.profiler_memory_events reads ({err}); update that function"
        ) from err


def fake_process_group(world_size: int, rank: int = 0) -> None:
    """Make this process ``rank`` of a ``world_size`` world whose collectives do nothing (the ``fake`` backend) but
    return outputs of the right shape. ``torch.testing._internal.distributed.fake_pg.FakeStore`` (a testing API);
    public replacement: none. End it with ``destroy_process_group()``."""
    world_size = check_int("world_size", world_size, minimum=1, maximum=1 << 20)
    rank = check_int("rank", rank, minimum=0, maximum=world_size - 1)
    store = _resolve("torch.testing._internal.distributed.fake_pg", "FakeStore")()
    torch.distributed.init_process_group("fake", store=store, rank=rank, world_size=world_size)


def fake_tensor_mode() -> Any:
    """A mode in which new tensors have shape, dtype and device but no storage (an 8B model costs no memory).
    ``torch._subclasses.fake_tensor.FakeTensorMode``; public replacement: none (meta has no device kernels)."""
    return _resolve("torch._subclasses.fake_tensor", "FakeTensorMode")()


def fsdp_memory_tracker(model: Any, optimizer: Any) -> Any:
    """FSDP2's memory tracker (a mode: parameters, gradients, activations, temporaries, optimizer state, the peak)
    for an FSDP2 ``model`` and its ``optimizer``. ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``."""
    if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "reshard", None)):
        raise TypeError(f"model must be an FSDP2 module (after fully_shard), got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return _resolve("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker")(model, optimizer)


def scaled_mm(a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any) -> Any:
    """``(a * scale_a) @ (b * scale_b)`` of float8 operands (a CPU kernel in 2.13; on GPUs, SM 8.9+); fp32 scales, one
    per tensor or per row of ``a`` and column of ``b``. ``torch._scaled_mm``; public: torchao's float8 training."""
    if not all(isinstance(t, torch.Tensor) for t in (a, b, scale_a, scale_b)):
        raise TypeError("a, b, scale_a and scale_b must be tensors")
    return _resolve("torch", "_scaled_mm")(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
