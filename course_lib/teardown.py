"""End a distributed job so that nothing of its process groups outlives the script, and say what holds one if not.

A gloo process group runs worker threads. ``destroy_process_group()`` removes the groups from
``torch.distributed``'s tables, but a group is freed (and its threads joined) only when the last reference to it
goes. If anything still holds it when Python shuts down, a gloo thread that is still dropping its last collective
asks for the GIL, Python ends the thread, a C++ destructor is unwound, and the process aborts with
``terminate called without an active exception`` after all its work is done (``docs/crash_at_exit.md``).

:func:`end_process_group` is the teardown every script the course launches ends with, and what
:func:`course_lib.launch.run_ranks` runs after ``fn``: barrier, drop the caches PyTorch keeps that hold groups,
destroy, collect, then check with weak references that every group is really gone. When one survives, it writes
on stderr a line naming the chain that holds it (:func:`holders`), such as a model kept in a global.
``COURSE_LIB_STRICT_TEARDOWN=1`` makes that an error (the tests run every launch that way).
"""

from __future__ import annotations

import gc
import os
import sys
import types
from typing import Any

from .torch_private import clear_dtensor_caches, live_process_groups
from .validation import check_bool, check_int

__all__ = ["OUTLIVED", "STRICT_ENV", "end_process_group", "holders"]

OUTLIVED = "outlived destroy_process_group()"  # the words of the warning, for tests and launchers to look for
STRICT_ENV = "COURSE_LIB_STRICT_TEARDOWN"
_MAX_COLLECTIONS = 2000  # gc passes: one per link of the longest chain held through C++ (FSDPMemTracker on 32
# blocks: 226; the loop stops at the first pass that frees nothing)


def _describe(obj: Any) -> str:
    if isinstance(obj, types.FrameType):
        code = obj.f_code
        return f"a local variable of {code.co_name}() ({os.path.basename(code.co_filename)}:{obj.f_lineno})"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, dict) and isinstance(obj.get("__name__"), str) and "__builtins__" in obj:
        return f"the globals of {obj['__name__']}"
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return f"{type(obj).__name__} {obj.__qualname__}"
    if isinstance(obj, dict):
        keys = ", ".join(map(str, list(obj)[:3]))
        return f"dict {{{keys}{', ...' if len(obj) > 3 else ''}}}"
    return type(obj).__name__


def _global_name(module_dict: dict[str, Any], child: Any) -> str:
    return next((k for k, v in module_dict.items() if v is child), "?")


def holders(obj: Any, *, limit: int = 3, max_hops: int = 25) -> list[str]:
    """Chains of references that keep ``obj`` alive, shortest first, each ending where the hold starts.

    A chain ends at a module's global, at a function's local variable, or at an object referenced from outside
    Python's heap (a C++ cache or structure: its reference count exceeds the references the garbage collector can
    see). It walks every object reachable from the collector's, so it takes a second or two: for diagnostics.

    >>> box = {"kept": object()}
    >>> any("box" in chain for chain in holders(box["kept"]))
    True
    """
    check_int("limit", limit, minimum=1)
    check_int("max_hops", max_hops, minimum=1)
    mine = {id(f) for f in _own_frames()}
    objects: dict[int, Any] = {}
    referrers: dict[int, list[int]] = {}
    tracked = gc.get_objects()
    # the frames on the stack, made into objects so that their local variables are seen (a running frame is an
    # object only once something asks for it)
    callers: list[types.FrameType] = []
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        if id(f) not in mine:
            callers.append(f)
        f = f.f_back
    junk = {id(tracked), id(objects), id(referrers), id(callers), *mine}
    stack = [o for o in [*tracked, *callers] if id(o) not in junk]
    junk.add(id(stack))
    for o in stack:
        objects[id(o)] = o
    for frame in callers:  # a running frame's local variables are not among its referents: add them by hand
        for value in list(frame.f_locals.values()):
            referrers.setdefault(id(value), []).append(id(frame))
    while stack:
        o = stack.pop()
        for r in gc.get_referents(o):
            referrers.setdefault(id(r), []).append(id(o))
            if id(r) not in objects and id(r) not in junk:
                objects[id(r)] = r
                stack.append(r)
    del tracked
    target = id(obj)
    parent: dict[int, int] = {}
    frontier, seen, chains = [target], {target}, []
    for _ in range(max_hops):
        nxt = []
        for i in frontier:
            node = objects.get(i, obj if i == target else None)
            end = None if i == target else _hold(node, len(referrers.get(i, [])), objects.get(parent[i]))
            if end is not None:
                nodes, j = [], i
                while j != target:
                    nodes.append(objects[j])
                    j = parent[j]
                chain = " <- ".join([_describe(obj), *(_describe(n) for n in reversed(nodes))])
                chains.append(chain + (f" ({end})" if end else ""))
                if len(chains) >= limit:
                    return chains
                continue
            for u in referrers.get(i, []):
                if u not in seen and u not in junk:
                    seen.add(u)
                    parent[u] = i
                    nxt.append(u)
        frontier = nxt
        if not frontier:
            break
    return chains


def _hold(node: Any, visible: int, child: Any) -> str | None:
    """Where a chain of holders ends at ``node`` (a description, "" for a frame), or None to keep walking.

    ``visible``: the references to ``node`` the walk saw. A count beyond them (less the walk's own three: its
    table, ``getrefcount``'s argument and the ``node`` argument) is a hold from outside Python's heap. Tensors are
    walked through: PyTorch's C++ side owns a tensor's Python object whenever it shares the tensor.
    """
    import torch

    if isinstance(node, types.FrameType):
        return ""
    if isinstance(node, dict) and isinstance(node.get("__name__"), str) and "__builtins__" in node:
        return f"global {_global_name(node, child)!r}"
    if not isinstance(node, torch.Tensor) and sys.getrefcount(node) - 4 - visible > 0:
        return "held from outside Python's heap: a C++ structure or cache"
    return None


def _own_frames() -> list[types.FrameType]:
    frames: list[types.FrameType] = []
    f: types.FrameType | None = sys._getframe(1)
    while f is not None and f.f_globals is globals():
        frames.append(f)
        f = f.f_back
    return frames


def end_process_group(*, barrier: bool = True, strict: bool | None = None) -> bool:
    """Tear down every process group of this process and check that each one is really gone.

    In order: ``dist.barrier()`` (``barrier=True``: every rank is done communicating; pass ``False`` on a failure
    path, where a peer may be gone), drop the caches PyTorch keeps that hold groups
    (:func:`course_lib.torch_private.clear_dtensor_caches`), ``dist.destroy_process_group()``, then ``gc.collect()``
    until a pass frees nothing (a chain held through C++, such as the autograd graphs ``CommDebugMode``'s gradient
    hooks keep, goes one link per pass).
    Returns True when every group was freed (its gloo threads joined while Python is fully alive). Otherwise it
    writes ``warning: rank R: a process group outlived destroy_process_group(): held by ...`` on stderr with the
    chains of :func:`holders`, and returns False; with ``strict`` (default: the environment variable
    ``COURSE_LIB_STRICT_TEARDOWN=1``) it raises ``RuntimeError`` with that text instead.

    Call it after the objects of the job are gone: let the model, its optimizer and the last collectives' tensors
    die with the function that trained (a model still referenced here is exactly what it reports). Does nothing
    when no group exists.
    """
    check_bool("barrier", barrier)
    if strict is None:
        strict = os.environ.get(STRICT_ENV, "") == "1"
    check_bool("strict", strict)
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return True
    rank = dist.get_rank()
    if barrier:
        dist.barrier()
    groups = live_process_groups()
    clear_dtensor_caches()
    dist.destroy_process_group()
    # Until a pass frees nothing: a chain of objects held through C++ (autograd nodes hold the hooks that hold
    # them, as CommDebugMode's register_multi_grad_hook does on every module's inputs) is freed one link per pass.
    for _ in range(_MAX_COLLECTIONS):
        if not gc.collect():
            break
    survivors = [ref for ref in groups if ref() is not None]
    if not survivors:
        return True
    lines = [
        f"warning: rank {rank}: {len(survivors)} process group(s) {OUTLIVED}: their gloo threads may abort the "
        "process at exit. Held by:"
    ]
    for chain in holders(survivors[0]()):
        lines.append(f"  {chain}")
    text = "\n".join(lines)
    if strict:
        raise RuntimeError(text)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return False
