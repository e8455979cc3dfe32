"""The notebooks' GPU-only cells: find them, run them live on a GPU, or dry-run their bodies on the CPU.

Every GPU-only cell starts with ``if requires_gpu("what it shows"):`` (``course_lib.device``). On a
machine without CUDA the guard prints what it skipped, so nbval alone never runs those bodies and
an environment or API mistake inside one would ship unseen. This module serves two tools:

* ``tests/test_gpu_cells.py`` runs each body on the CPU (device ``cuda`` mapped to ``cpu`` or, where
  only shapes and placement matter, to ``meta``; ``nccl`` to ``gloo``; ``torch.cuda``'s timing and
  memory calls to a CPU stand-in), in a kernel that ran the notebook's cells before it, and lists
  the cells whose logic cannot run on a CPU (:data:`CANNOT_RUN_ON_CPU`).
* ``scripts/gpu_check.py`` runs every notebook that has GPU cells on a real GPU and records what
  each GPU cell printed.

A GPU cell is named by the description string it passes to ``requires_gpu``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

GUARD = re.compile(r"^if requires_gpu\((?P<what>\"[^\"]*\"|'[^']*')(?P<rest>(?:[^()]|\([^()]*\))*)\):", re.M)

# Where the body's device is mapped to "meta" instead of "cpu": what it checks is where tensors live
# or that the calls compose (shapes only), and on the CPU everything already lives on the CPU, or the
# real sizes would take minutes.
ON_META = {
    "model.cuda() moves parameters and buffers, not plain attributes": (
        "placement is the claim: on 'cpu' every tensor is already there, on 'meta' plain attributes stay behind"
    ),
    "peak GPU memory of a training step, fp32 vs bf16 autocast": (
        "a width-4096 MLP on 8192 samples is ~1 TFLOP per step: meta runs the same calls on shapes only"
    ),
}
# Cells whose logic has no CPU meaning: the reason is printed by the test.
CANNOT_RUN_ON_CPU = {
    "fork after CUDA initialisation fails in the child": (
        "the error it shows is raised by CUDA itself; a CPU-only process forks without complaint"
    ),
    "matmul throughput: fp32, TF32, fp16, bf16 on tensor cores": (
        "it times tensor cores with CUDA events; the same 4096^3 fp16 matmuls take minutes on a CPU"
    ),
    "checkpoint saves the RNG state of the GPUs holding its inputs": (
        "the claim is which GPU RNG states are saved; a CPU tensor has none, so the cell's GPU answer cannot appear"
    ),
    "the caching allocator: memory allocated vs reserved": (
        "reserved vs allocated is the CUDA caching allocator's own bookkeeping; the CPU allocator has no cache to show"
    ),
    "a memory snapshot of a checkpointed training step, for pytorch.org/memory_viz": (
        "torch.cuda.memory's history recorder and snapshot exist only for the CUDA allocator"
    ),
    "SDPA's flash kernel against the hand-written FlashAttention, forward and backward": (
        "it times 4096-token bf16 attention on a GPU; the hand-written tile loop at that size takes minutes on a CPU,"
        " where notebook 16 checks the same Function at small sizes"
    ),
    "an NCCL all_reduce returns to the host before it is done": (
        "the claim is NCCL's stream semantics; gloo's all_reduce blocks the calling thread until it is done"
    ),
    "a float8 matrix product against bf16 (GPUs with compute capability 8.9 or later)": (
        "it times 8192^3 float8 and bf16 products on tensor cores with CUDA events; on a CPU they take minutes, and"
        " notebook 19 §8.2 runs the same torch._scaled_mm on the CPU at a small size"
    ),
    "an FSDP2 trace of fsdp_train.py read by Holistic Trace Analysis (needs 2 GPUs and HTA)": (
        "HTA reads GPU kernels only (it finds no compute or NCCL kernels in a CPU trace), and the cell launches"
        " two GPU processes"
    ),
    "context_parallel's ring attention with CUDA SDPA, against full attention": (
        "context_parallel dispatches on the CUDA SDPA kernels (flash, efficient, cuDNN); on the CPU kernel it raises"
        " NotImplementedError, which notebook 18 §1 shows in an unguarded cell"
    ),
}
# Cells that run on the CPU up to one call that needs a GPU: everything before it (environment,
# process group, conversion) is checked, and the call must fail with exactly this message.
CPU_STOPS_AT = {
    "SyncBatchNorm inside DDP (one-process NCCL group)": "SyncBatchNorm layers only work with GPU modules",
}

# Run before the notebook's own cells: the marker the test looks for, and the CPU stand-in for the
# parts of torch.cuda the GPU cells use (timing events, synchronize, memory counters).
PREAMBLE = '''
import time as _time


def _gpu_dry_run(what, count=1):
    print(f"[GPU cell dry run on CPU] {what}")
    return True


class _cuda_on_cpu:
    """What the GPU cells call on torch.cuda, on the CPU: no-op synchronize, zero memory counters,
    wall-clock events."""

    @staticmethod
    def synchronize(*args, **kwargs):
        return None

    @staticmethod
    def reset_peak_memory_stats(*args, **kwargs):
        return None

    @staticmethod
    def memory_allocated(*args, **kwargs):
        return 0

    max_memory_allocated = memory_allocated

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 2

    @staticmethod
    def get_device_name(*args):
        return "CPU standing in for CUDA"

    class Event:
        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self, *args):
            self.t = _time.perf_counter()

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3
'''

# Cells that start other processes: skipped in a dry run (nbval runs them), unless they are GPU cells.
LAUNCHES = re.compile(r"\b(?:spawn|run_ranks|run_torchrun|run_script|start_processes)\(")


@dataclass(frozen=True)
class GpuCell:
    notebook: str
    index: int
    what: str
    source: str

    @property
    def mode(self) -> str:
        """``cpu``, ``meta``, ``stops`` (runs until one GPU-only call) or ``cannot``."""
        if self.what in CANNOT_RUN_ON_CPU:
            return "cannot"
        if self.what in CPU_STOPS_AT:
            return "stops"
        return "meta" if self.what in ON_META else "cpu"


def gpu_cells(path: Path) -> list[GpuCell]:
    """The GPU-only cells of one notebook, in order."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        m = GUARD.search(cell.source)
        if m:
            found.append(GpuCell(path.name, i, m.group("what")[1:-1], cell.source))
    return found


def on_cpu(source: str, device: str = "cpu") -> str:
    """A GPU cell's source with the guard replaced by the dry-run marker and CUDA mapped to ``device``."""
    if device not in ("cpu", "meta"):
        raise ValueError(f"device must be 'cpu' or 'meta', got {device!r}")
    m = GUARD.search(source)
    if m is None:
        raise ValueError("not a GPU cell: it has no 'if requires_gpu(...):' line")
    head = source[: m.start()] + f"if _gpu_dry_run({m.group('what')}{m.group('rest')}):"
    return head + _map_body(source[m.end() :], device)


def _map_body(src: str, device: str) -> str:
    src = re.sub(r"\btorch\.cuda\.(?!amp\b)", "_cuda_on_cpu.", src)
    src = re.sub(r"autocast\((['\"])cuda\1", 'autocast("cpu"', src)  # autocast has no meta device
    src = re.sub(r"\.cuda\(\d*\)", f'.to("{device}")', src)
    src = re.sub(r"(['\"])cuda(?::\d+)?\1", f'"{device}"', src)
    src = src.replace(".is_cuda", f".is_{device}")
    src = re.sub(r"(['\"])nccl\1", '"gloo"', src)
    return re.sub(r"device_ids=\[0\]", "device_ids=None", src)


_WRITEFILE = re.compile(r"^%%writefile\s+(?:\S*/)?(\w+)\.py\s*$", re.M)
_SCRIPT_PATH = re.compile(r"(\w+)\.py\b")


def names_of(source: str, modules: frozenset[str] = frozenset()) -> tuple[set[str], set[str]] | None:
    """``(defined, used)`` names of a code cell, or ``None`` when it cannot be read (magics, syntax): run it always.

    Defined: what it binds (assignments, ``def``, ``class``, imports) and what it changes in place (``x.a = ...``,
    ``x[i] = ...``, ``x += ...``, ``x.method(...)`` on a variable, not on an imported module). Used: every name it
    reads. A ``%%writefile _runs/NAME.py`` cell defines the module ``NAME``; ``import NAME`` uses it.
    """
    split = _names(source, modules)
    return None if split is None else (split[0] | split[1], split[2])


def _defined_and_free(source: str, modules: frozenset[str]) -> tuple[set[str], set[str]] | None:
    """:func:`names_of`'s defined names and :func:`free_names`, from one parse of the cell."""
    split = _names(source, modules)
    return None if split is None else (split[0] | split[1], _free(*split))


def free_names(source: str, modules: frozenset[str] = frozenset()) -> set[str] | None:
    """The names a cell needs from the cells before it: what it reads, less what it only binds itself (a loop
    variable, ``x = ...``); a name it changes in place (``x[i] = ...``, ``x.append(...)``) stays needed.
    ``None`` when the cell cannot be read. A cell that reads a name and then rebinds it (``x = f(x)``) is missed."""
    split = _names(source, modules)
    return None if split is None else _free(*split)


def _free(bound: set[str], changed: set[str], used: set[str]) -> set[str]:
    return (used | changed) - (bound - changed)


def _names(source: str, modules: frozenset[str]) -> tuple[set[str], set[str], set[str]] | None:
    """``(bound, changed, used)``: names bound outright, changed in place, and read; ``None`` if unreadable."""
    written = _WRITEFILE.match(source)
    if written:
        return {written.group(1)}, set(), set()
    if any(line.lstrip().startswith(("%", "!")) for line in source.splitlines()):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    bound: set[str] = set()
    changed: set[str] = set()
    used: set[str] = set()

    def base(node: ast.AST) -> str | None:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            used |= set(_SCRIPT_PATH.findall(node.value))  # run_script(["python", "_runs/x.py"]) needs x's cell
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            changed.add(node.target.id)  # x += 1 reads x
        elif isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                used.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                used |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            name = base(node)
            if name:
                changed.add(name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = base(node.func.value)
            if name and name not in modules:
                changed.add(name)
    return bound, changed, used


def _imported_names(sources: list[str]) -> frozenset[str]:
    """The top-level names any cell binds by an import (modules, for :func:`names_of`)."""
    return frozenset(
        name
        for src in sources
        for node in ast.walk(_parse_or_empty(src))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in ((a.asname or a.name).split(".")[0] for a in node.names)
    )


def needed_cells(sources: list[str], targets: set[int], uses: dict[int, set[str]] | None = None) -> set[int]:
    """The cells the ``targets`` depend on, by name, backwards to the first cell (the targets included).

    ``uses`` overrides what a target reads (a GPU cell that cannot run reads only its guard). A cell that cannot
    be read (``names_of`` is ``None``) is always included.
    """
    imported = _imported_names(sources)
    needed = set(targets)
    wanted: set[str] = set()
    for j in range(max(targets, default=-1), -1, -1):
        names = _defined_and_free(sources[j], imported)
        free = names[1] if names else set()
        if j in targets:
            wanted |= (uses or {}).get(j, free)
            continue
        if names is None or names[0] & wanted:
            needed.add(j)
            wanted |= free
    return needed


def names_lost_with_launches(
    sources: list[str], keep: set[int], targets: set[int], uses: dict[int, set[str]] | None = None
) -> dict[int, set[str]]:
    """The names that a kept launch cell defines and a later kept cell reads, by the launch cell's index.

    The dry run leaves launch cells out (nbval has run them; the GPU cells do not need their processes), so such a
    name would be undefined there: the launch cell must keep only the launch, with its definitions in a cell before.
    A name the later cell assigns itself does not count (a cell that reads a name and then rebinds it is missed).
    """
    imported = _imported_names(sources)
    lost: dict[int, set[str]] = {}
    for i in sorted(keep - targets):
        names = names_of(sources[i], imported)
        if not LAUNCHES.search(sources[i]) or names is None:
            continue
        read: set[str] = set()
        for j in sorted(k for k in keep if k > i):
            later = names_of(sources[j], imported)
            if later is None:
                continue
            reads = (uses or {}).get(j, later[1]) if j in targets else later[1]
            read |= reads - later[0]  # a name the later cell assigns itself (h = ...; print(h)) is its own
        if names[0] & read:
            lost[i] = names[0] & read
    return lost


def _parse_or_empty(source: str) -> ast.AST:
    try:
        return ast.parse(source)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def dry_run_notebook(path: Path) -> tuple[nbformat.NotebookNode, dict[int, GpuCell]]:
    """A notebook to execute: the preamble, the GPU cells rewritten for the CPU (those that cannot run keep their
    guard and skip), and before them only the cells they depend on (:func:`needed_cells`); launch cells left out.

    nbval already runs every cell of the notebook; this run proves only what nbval cannot (the GPU cells' bodies),
    so it runs what those bodies need and nothing else.

    Returns the notebook and, by position in it, the GPU cells it runs.
    """
    nb = nbformat.read(path, as_version=4)
    cells = gpu_cells(path)
    out = nbformat.v4.new_notebook()
    out.metadata = nb.metadata
    out.cells = [nbformat.v4.new_code_cell(PREAMBLE)]
    by_index = {c.index: c for c in cells}
    positions: dict[int, GpuCell] = {}
    last = max(by_index) if by_index else -1
    sources = [c.source if c.cell_type == "code" else "" for c in nb.cells]
    guard_only = {c.index: {"requires_gpu"} for c in cells if c.mode == "cannot"}
    keep = needed_cells(sources, set(by_index), guard_only)
    lost = names_lost_with_launches(sources, keep, set(by_index), guard_only)
    if lost:
        where = "; ".join(f"cell {i} defines {sorted(names)}" for i, names in sorted(lost.items()))
        raise ValueError(
            f"{path.name}: the GPU cells' dry run leaves launch cells out, but a later cell it runs reads what they "
            f"define ({where}): move those definitions into a cell before the launch"
        )
    for i, cell in enumerate(nb.cells[: last + 1]):
        if cell.cell_type != "code" or i not in keep:
            continue
        gpu = by_index.get(i)
        if gpu is None:
            if LAUNCHES.search(cell.source):
                continue
            out.cells.append(nbformat.v4.new_code_cell(cell.source))
            continue
        source = gpu.source if gpu.mode == "cannot" else on_cpu(gpu.source, "meta" if gpu.mode == "meta" else "cpu")
        positions[len(out.cells)] = gpu
        out.cells.append(nbformat.v4.new_code_cell(source))
    return out, positions
