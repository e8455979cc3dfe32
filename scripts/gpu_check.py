"""Run the whole course on a machine with CUDA GPUs, on its GPU path, and write down what it measured.

    python scripts/gpu_check.py --out gpu_results.md [--layouts 1,2] [--notebooks 11,13]

For each **layout** (how many GPUs are visible: ``1`` is ``CUDA_VISIBLE_DEVICES=0``, ``2`` the first
two, or the first of those your own ``CUDA_VISIBLE_DEVICES`` lists, if you set it; layouts the machine cannot
give are reported as skipped):

1. Every notebook runs top to bottom in a fresh kernel (working directory: a temporary copy of
   ``notebooks/``) with ``COURSE_DEVICE=cuda``, so the training scripts that follow that switch (notebook 11
   sections 2-4, 12 section 5, 14 sections 2-3, 15 sections 1 and 3) run on the GPUs with NCCL (one process
   per GPU), and the ``requires_gpu`` cells of every notebook run live. **Any
   cell that raises fails the check, guarded or not.** What each GPU cell printed is recorded, and
   so are the lines of the GPU-path launches.
2. Then, once, every benchmark with a CUDA half (``benchmarks/mixed_precision.py``).

The report (markdown) names the GPUs, torch and CUDA versions. Exit status: 0 if everything ran,
1 if a cell or a benchmark failed, 2 if there is no CUDA GPU here (the CPU half is ``make test``; its
GPU-visible pass, ``make test-gpu-visible``, checks that a GPU machine prints what the committed
notebooks show). The committed notebooks are never touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_lib.manifest import ROOT, notebook_paths
from course_tools import gpu_cells

CUDA_BENCHMARKS = ["benchmarks/mixed_precision.py"]


def cell_report(nb: nbformat.NotebookNode, cells: list[gpu_cells.GpuCell]) -> list[str]:
    """Markdown lines with what each GPU cell of an executed notebook printed."""
    lines = []
    for cell in cells:
        outputs = nb.cells[cell.index].get("outputs", [])
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        errors = [o for o in outputs if o.get("output_type") == "error"]
        status = "FAILED" if errors else ("skipped" if "[GPU cell skipped]" in text else "ran")
        lines += [f"#### cell {cell.index}: {cell.what} ({status})", "```", text.rstrip(), "```", ""]
    return lines


def error_cells(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(index, 'Ename: value') of every code cell whose outputs hold an error, guarded or not."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                found.append((i, f"{out['ename']}: {out['evalue']}"[:300]))
    return found


def run_notebook(path: Path, workdir: Path, env: dict[str, str]) -> tuple[list[str], int]:
    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(
            nb, kernel_name="python3", timeout=900, allow_errors=True, resources={"metadata": {"path": str(workdir)}}
        )
        start = time.perf_counter()
        client.execute()
        wall = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    errors = error_cells(nb)
    lines = [f"### {path.name} ({'FAILED' if errors else 'ok'}, {wall:.1f} s)", ""]
    lines += [f"- cell {i} raised {text}" for i, text in errors]
    lines += cell_report(nb, gpu_cells.gpu_cells(path))
    return lines, len(errors)


def run_benchmark(script: str) -> tuple[list[str], int]:
    proc = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    lines = [f"### {script} (exit {proc.returncode})", "```", (proc.stdout + proc.stderr).rstrip(), "```", ""]
    return lines, int(proc.returncode != 0)


def layout_devices(environ: dict[str, str] | os._Environ[str], layout: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a layout of ``layout`` GPUs: the first ones of those the user made visible.

    A user who set ``CUDA_VISIBLE_DEVICES=2,3`` (the free GPUs of a shared machine) gets ``2`` and ``2,3``, never
    GPUs 0 and 1, which someone else may be using.

    >>> layout_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, 1), layout_devices({}, 2)
    ('2', '0,1')
    """
    if not isinstance(layout, int) or layout < 1:
        raise ValueError(f"layout must be a number of GPUs >= 1, got {layout!r}")
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return ",".join(str(i) for i in range(layout))
    visible = [d.strip() for d in given.split(",") if d.strip()]
    if len(visible) < layout:
        raise ValueError(f"CUDA_VISIBLE_DEVICES={given!r} shows {len(visible)} GPU(s), the layout needs {layout}")
    return ",".join(visible[:layout])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_results.md"), help="the report to write")
    parser.add_argument("--layouts", default="1,2", help="numbers of visible GPUs to run the course with")
    parser.add_argument("--notebooks", default="", help="comma-separated notebook numbers (default: all)")
    parser.add_argument("--no-benchmarks", action="store_true", help="skip the benchmarks")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing to check here (the CPU half is `make test`)", file=sys.stderr)
        return 2
    have = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(have))
    report = [f"# GPU check: {names}", "", f"torch {torch.__version__}, CUDA {torch.version.cuda}, {have} GPU(s)", ""]
    wanted = {n.strip() for n in args.notebooks.split(",") if n.strip()}
    paths = [p for p in notebook_paths() if not wanted or p.name[:2] in wanted]
    failed = 0
    for layout in (int(n) for n in args.layouts.split(",")):
        if layout > have:
            report += [f"## {layout} GPU(s): skipped, this machine has {have}", ""]
            continue
        env = {"COURSE_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": layout_devices(os.environ, layout)}
        report += [
            f"## {layout} GPU(s) visible (COURSE_DEVICE=cuda CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})",
            "",
        ]
        with tempfile.TemporaryDirectory(prefix="course_gpu_") as tmp:
            work = Path(tmp) / "notebooks"
            shutil.copytree(ROOT / "notebooks", work, ignore=shutil.ignore_patterns("_runs", "*.pt"))
            for path in paths:
                lines, bad = run_notebook(path, work, env)
                report += lines
                failed += bad
                print(f"[{layout} GPU] {path.name}: {bad} cell(s) raised", flush=True)
    if not args.no_benchmarks:
        for script in CUDA_BENCHMARKS:
            lines, bad = run_benchmark(script)
            report += lines
            failed += bad
            print(f"{script}: {'failed' if bad else 'ok'}", flush=True)
    args.out.write_text("\n".join(report) + "\n")
    print(f"wrote {args.out}; {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
