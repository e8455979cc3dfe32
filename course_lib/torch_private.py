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
from collections.abc import Callable
from typing import Any

__all__ = [
    "PRIVATE_APIS",
    "TorchDispatchMode",
    "tree_flatten",
    "tree_map_only",
    "clear_dtensor_caches",
    "in_backward",
    "live_process_groups",
    "missing_private_apis",
]

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
)

CHECKED_ON = "2.13.0"  # the torch version every function here was checked on

# Re-exported classes and functions of private modules. TorchDispatchMode: the base class of a mode that sees every
# operator call below autograd (documented in PyTorch's "Extending PyTorch" notes, but only under this private
# module; no public path in 2.13). tree_flatten, tree_map_only: PyTorch's pytree utilities (torch.utils.pytree is
# not public in 2.13 either). Checked on torch 2.13.0.
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map_only  # noqa: E402


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
    ``functools`` caches such as ``MeshTopoInfo.build_from_mesh``. Each entry holds a ``DTensorSpec`` or a mesh,
    the mesh holds its process groups, and ``destroy_process_group()`` empties none of them: without this call the
    groups, and gloo's threads, live on into interpreter shutdown.

    Public replacement: none in torch 2.13 (``destroy_process_group`` should drop these entries; the upstream report
    is in ``docs/crash_at_exit.md``). Checked on torch 2.13.0. Safe to call at any time: the caches only make later
    DTensor operations faster.
    """
    import torch

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
    del torch


def live_process_groups() -> list[weakref.ReferenceType[Any]]:
    """Weak references to every process group this process has created and not destroyed (the default one too).

    Read from ``torch.distributed.distributed_c10d._world.pg_map``, the table ``destroy_process_group()`` empties.
    Public replacement: none (``torch.distributed`` has no call that lists the groups). Checked on torch 2.13.0.
    Empty when ``torch.distributed`` is unavailable or no group exists.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return []
    table = _resolve("torch.distributed.distributed_c10d", "_world.pg_map")
    return [weakref.ref(group) for group in list(table)]


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread (so a hook being called is inside it).

    ``torch._C._current_graph_task_id()`` is -1 outside backward. Public replacement: none (a hook can be told apart
    only from inside autograd). Checked on torch 2.13.0.
    """
    import torch

    task: Callable[[], int] = _resolve("torch._C", "_current_graph_task_id")
    del torch
    return task() != -1
