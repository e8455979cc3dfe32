"""Every GPU-only cell's body, run on the CPU as far as its logic allows.

nbval runs the notebooks on a CPU, where ``requires_gpu`` skips each GPU cell; a wrong variable,
a missing environment variable or a renamed API inside one would reach the first learner with a
GPU. Here each notebook that has GPU cells runs (its cells up to the last GPU cell, launches of
other processes left out) with every GPU cell's body mapped to the CPU by ``scripts/gpu_cells.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from nbclient import NotebookClient

from course_lib.manifest import ROOT, notebook_paths
from course_tools import gpu_cells

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _traceback(error) -> str:
    return "\n".join(_ANSI.sub("", "\n".join(error.traceback)).splitlines()[-12:])


WITH_GPU_CELLS = [p for p in notebook_paths() if gpu_cells.gpu_cells(p)]


def test_gpu_cells_are_found_and_classified() -> None:
    cells = [c for p in WITH_GPU_CELLS for c in gpu_cells.gpu_cells(p)]
    assert len(cells) >= 10, f"expected the course's GPU cells, found {len(cells)}"
    names = {c.what for c in cells}
    for table in (gpu_cells.ON_META, gpu_cells.CANNOT_RUN_ON_CPU, gpu_cells.CPU_STOPS_AT):
        stale = set(table) - names
        assert not stale, f"scripts/gpu_cells.py names GPU cells that no notebook has: {stale}"
    cannot = [c for c in cells if c.mode == "cannot"]
    print("GPU cells that cannot run on a CPU (compiled only):")
    for c in cannot:
        print(f"  {c.notebook} cell {c.index}: {c.what} -- {gpu_cells.CANNOT_RUN_ON_CPU[c.what]}")
        compile(c.source, f"{c.notebook}[{c.index}]", "exec")


def test_the_cpu_mapping() -> None:
    src = (
        'if requires_gpu("x", count=2):\n    a = torch.randn(2, device="cuda").cuda(1)\n'
        '    torch.cuda.synchronize()\n    dist.init_process_group("nccl")\n    assert a.is_cuda\n'
        '    with torch.autocast("cuda", dtype=torch.bfloat16):\n        pass\n'
    )
    out = gpu_cells.on_cpu(src, "meta")
    assert out.startswith('if _gpu_dry_run("x", count=2):')
    assert 'device="meta").to("meta")' in out and "_cuda_on_cpu.synchronize()" in out
    assert '"gloo"' in out and "a.is_meta" in out and 'torch.autocast("cpu"' in out
    assert "cuda" not in out.replace("_cuda_on_cpu", "")
    with pytest.raises(ValueError, match="device must be"):
        gpu_cells.on_cpu(src, "xpu")


@pytest.mark.slow  # executes notebooks
@pytest.mark.parametrize("path", WITH_GPU_CELLS, ids=[p.stem for p in WITH_GPU_CELLS])
def test_gpu_cells_run_on_cpu(path: Path, tmp_path: Path) -> None:
    nb, positions = gpu_cells.dry_run_notebook(path)
    client = NotebookClient(
        nb, kernel_name="python3", timeout=240, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    for pos, cell in positions.items():
        outputs = nb.cells[pos].outputs
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        errors = [o for o in outputs if o.output_type == "error"]
        where = f"{cell.notebook} cell {cell.index} ({cell.what})"
        if cell.mode == "cannot":
            assert "[GPU cell skipped]" in text, f"{where}: expected the guard to skip it"
            continue
        assert "[GPU cell dry run on CPU]" in text, f"{where}: the body did not start: {text!r} {errors}"
        if cell.mode == "stops":
            expected = gpu_cells.CPU_STOPS_AT[cell.what]
            assert errors and expected in errors[0].evalue, (
                f"{where}: should run on the CPU until '{expected}', got: "
                + (_traceback(errors[0]) if errors else "no error")
            )
            continue
        assert not errors, f"{where} failed on the CPU:\n" + _traceback(errors[0])
        print(f"{where}: ran on {cell.mode}")


def test_gpu_check_report_fails_on_any_error_cell() -> None:
    import nbformat

    from course_tools import gpu_check

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('if requires_gpu("a"):\n    pass'),
        nbformat.v4.new_code_cell('if requires_gpu("b"):\n    pass'),
        nbformat.v4.new_code_cell("x = 1  # not a GPU cell"),
    ]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42 TFLOP/s\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="boom", traceback=[])]
    nb.cells[2].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="not guarded", traceback=[])]
    cells = [gpu_cells.GpuCell("x.ipynb", i, w, "") for i, w in enumerate("ab")]
    text = "\n".join(gpu_check.cell_report(nb, cells))
    assert "cell 0: a (ran)" in text and "42 TFLOP/s" in text and "cell 1: b (FAILED)" in text
    # an error anywhere fails the check, in a GPU cell or not
    assert gpu_check.error_cells(nb) == [(1, "RuntimeError: boom"), (2, "ValueError: not guarded")]


@pytest.mark.slow  # a fresh interpreter importing torch and nbclient: half a minute on a loaded machine
def test_gpu_check_script_refuses_without_cuda(tmp_path: Path) -> None:
    import subprocess

    if not __import__("torch").cuda.is_available():
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(tmp_path / "r.md")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr
        assert not (tmp_path / "r.md").exists()


def test_the_dry_run_keeps_only_the_cells_gpu_cells_depend_on() -> None:
    sources = [
        "import torch\nfrom course_lib.device import requires_gpu",  # 0: imports
        "x = torch.ones(3)",  # 1: defines x
        "unrelated = torch.zeros(2)\nprint(unrelated)",  # 2: nothing the GPU cell needs
        "x.add_(1)",  # 3: changes x in place
        "%%writefile _runs/job.py\nprint('hi')",  # 4: a script the GPU cell runs by path
        "%matplotlib inline",  # 5: a magic: always kept
        'if requires_gpu("y"):\n    y = x.cuda()\n    run_script(["python", "_runs/job.py"])',  # 6: the GPU cell
        "z = 1",  # 7: after the GPU cell
    ]
    assert gpu_cells.needed_cells(sources, {6}) == {0, 1, 3, 4, 5, 6}
    assert gpu_cells.needed_cells(sources, {6}, {6: {"requires_gpu"}}) == {0, 5, 6}  # a cell that only skips
    assert gpu_cells.names_lost_with_launches(sources, {0, 1, 3, 4, 5, 6}, {6}) == {}
    launching = [
        "from course_lib.launch import run_ranks",
        "def f(): pass\nr = run_ranks(f, nprocs=2)",
        'if requires_gpu("y"):\n    f()',
    ]
    assert gpu_cells.names_lost_with_launches(launching, {0, 1, 2}, {2}) == {1: {"f"}}  # f lives in a launch cell
    assert gpu_cells.names_lost_with_launches(launching, {0, 1, 2}, {2}, {2: {"requires_gpu"}}) == {}
    own = [launching[0], "h = 1\nr = run_ranks(print, nprocs=2)", 'if requires_gpu("y"):\n    h = 2\n    print(h)']
    assert gpu_cells.names_lost_with_launches(own, {0, 1, 2}, {2}) == {}  # the GPU cell's own h (19 §6's case)
    assert gpu_cells.names_of("torch.manual_seed(0)", frozenset({"torch"})) == (set(), {"torch"})
    assert gpu_cells.names_of("!ls") is None
    # What a cell needs from before it: not its own loop variables, but what it changes in place.
    assert gpu_cells.free_names("for k in ks:\n    print(k)") == {"ks", "print"}
    assert gpu_cells.free_names("a[k] = 1\nn += 1\nlog.append(2)") == {"a", "k", "n", "log"}
    assert gpu_cells.free_names("%time x") is None
    loops = ["k = 0\nslow = 1", "ks = [1, 2]", 'if requires_gpu("k"):\n    for k in ks:\n        print(k)']
    assert gpu_cells.needed_cells(loops, {2}) == {1, 2}  # cell 0's k is not the loop's k


def test_gpu_check_layouts_respect_the_users_visible_devices() -> None:
    from course_tools.gpu_check import layout_devices

    assert layout_devices({}, 1) == "0" and layout_devices({}, 2) == "0,1"
    assert layout_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, 1) == "2"
    assert layout_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}, 2) == "2,3"
    with pytest.raises(ValueError, match="shows 1 GPU"):
        layout_devices({"CUDA_VISIBLE_DEVICES": "5"}, 2)
    with pytest.raises(ValueError, match="layout"):
        layout_devices({}, 0)
