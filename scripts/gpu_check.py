"""Run the course's GPU half on a machine with CUDA, and write down what it measured.

    python scripts/gpu_check.py --out gpu_results.md

1. Every notebook that has GPU cells runs top to bottom in a fresh kernel (working directory: a
   temporary copy of ``notebooks/``), so its ``requires_gpu`` cells run live; what each GPU cell
   printed, or the error it raised, is recorded. The committed notebooks are not touched.
2. Every benchmark with a CUDA half runs (``benchmarks/mixed_precision.py``), and its output is
   recorded with its ``RESULT`` line.

The report (markdown) names the GPU, torch and CUDA versions. The script exits 1 if a GPU cell or a
benchmark failed, 2 if there is no CUDA GPU here (nothing to check: the CPU half is ``make test``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_cells  # noqa: E402

from course_lib.manifest import ROOT, notebook_paths  # noqa: E402

CUDA_BENCHMARKS = ["benchmarks/mixed_precision.py"]


def cell_report(nb: nbformat.NotebookNode, cells: list[gpu_cells.GpuCell]) -> tuple[list[str], int]:
    """Markdown lines with what each GPU cell of an executed notebook printed; and how many failed."""
    lines, failed = [], 0
    for cell in cells:
        outputs = nb.cells[cell.index].get("outputs", [])
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        errors = [o for o in outputs if o.get("output_type") == "error"]
        status = "FAILED" if errors else ("skipped" if "[GPU cell skipped]" in text else "ran")
        failed += bool(errors)
        lines += [f"#### cell {cell.index}: {cell.what} ({status})", "```", text.rstrip()]
        if errors:
            lines.append(f"{errors[0]['ename']}: {errors[0]['evalue']}")
        lines += ["```", ""]
    return lines, failed


def run_notebook(path: Path, workdir: Path) -> tuple[list[str], int]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name="python3", timeout=600, allow_errors=True, resources={"metadata": {"path": str(workdir)}}
    )
    start = time.perf_counter()
    client.execute()
    lines, failed = cell_report(nb, gpu_cells.gpu_cells(path))
    return [f"### {path.name} (ran in {time.perf_counter() - start:.1f} s)", "", *lines], failed


def run_benchmark(script: str) -> tuple[list[str], int]:
    proc = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    return [f"### {script} (exit {proc.returncode})", "```", (proc.stdout + proc.stderr).rstrip(), "```", ""], int(
        proc.returncode != 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_results.md"), help="the report to write")
    parser.add_argument("--notebooks-only", action="store_true", help="skip the benchmarks")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing to check here (the CPU half is `make test`)", file=sys.stderr)
        return 2
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    report = [
        f"# GPU check: {names}",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)",
        "",
    ]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="course_gpu_") as tmp:
        work = Path(tmp) / "notebooks"
        shutil.copytree(ROOT / "notebooks", work, ignore=shutil.ignore_patterns("_runs", "*.pt"))
        for path in notebook_paths():
            if gpu_cells.gpu_cells(path):
                lines, bad = run_notebook(path, work)
                report += lines
                failed += bad
                print(f"{path.name}: {bad} GPU cell(s) failed", flush=True)
    if not args.notebooks_only:
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
