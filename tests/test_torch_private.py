"""The private PyTorch APIs the course uses are all in course_lib.torch_private, and the installed torch has them."""

from __future__ import annotations

import ast
import re

import pytest

import course_lib.torch_private as tp
from course_lib.manifest import ROOT

# A private name of torch: an attribute path under torch with a component that starts with one underscore.
PRIVATE = re.compile(r"\btorch(?:\.\w+)*\.(_[a-zA-Z]\w*)")


def _notebooks_using(function: str) -> list[str]:
    """The notebooks whose code calls ``course_lib.torch_private.<function>``."""
    pattern = re.compile(rf"\b{re.escape(function)}\b")
    return [
        path.stem
        for path in sorted((ROOT / "sources").glob("*.py"))
        if "torch_private" in path.read_text(encoding="utf-8")
        and any(pattern.search(c) for c in _code_cells(path.stem))
    ]


def test_every_private_api_is_in_the_installed_torch() -> None:
    missing = tp.missing_private_apis()
    where = {m: _notebooks_using(m.split("course_lib.torch_private.")[1].rstrip(")")) for m in missing}
    assert missing == [], (
        "the installed torch lacks private APIs the course uses; fix the function in course_lib/torch_private.py "
        "that uses each (and the notebooks that call it): "
        + "; ".join(f"{m}, called in {where[m] or 'no notebook'}" for m in missing)
    )


def test_a_missing_api_is_named_with_the_function_that_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp, "PRIVATE_APIS", (*tp.PRIVATE_APIS, ("torch", "_no_such_thing", "clear_dtensor_caches")))
    assert tp.missing_private_apis() == ["torch._no_such_thing (used by course_lib.torch_private.clear_dtensor_caches)"]


def test_every_listed_api_names_a_function_of_the_module() -> None:
    for _, _, user in tp.PRIVATE_APIS:
        assert user in tp.__all__ and callable(getattr(tp, user)), user


def test_the_rest_of_the_library_reaches_no_private_torch_name() -> None:
    """Outside torch_private.py, course_lib names no private torch attribute (strings and comments aside)."""
    offenders = []
    for path in sorted((ROOT / "course_lib").rglob("*.py")):
        if path.name == "torch_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = ast.unparse(node.value)
                if base == "torch" or base.startswith("torch."):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
                if any(part.startswith("_") for part in node.module.split(".")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert offenders == [], offenders


def test_clearing_the_caches_is_safe_without_any_dtensor() -> None:
    tp.clear_dtensor_caches()
    tp.clear_dtensor_caches()
    assert tp.live_process_groups() == []


def _private_names(code: str) -> list[tuple[int, str]]:
    """The private torch names a piece of code reaches: ``torch.x._y``, ``dist._y``, ``from torch._x import``."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base in ("torch", "dist") or base.startswith(("torch.", "dist.")):
                found.append((node.lineno, f"{base}.{node.attr}"))
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        for module in modules:
            if module.split(".")[0] == "torch" and any(p.startswith("_") for p in module.split(".")):
                found.append((node.lineno, f"import {module}"))
    return found


def _code_cells(stem: str) -> list[str]:
    """The code cells of a notebook's text source, IPython magics and shell lines removed (as comments)."""
    import jupytext

    notebook = jupytext.read(ROOT / "sources" / f"{stem}.py", fmt="py:percent")
    cells = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            lines = [("# " + ln) if ln.lstrip().startswith(("%", "!")) else ln for ln in cell.source.splitlines()]
            cells.append("\n".join(lines))
    return cells


def test_the_notebooks_reach_private_torch_apis_only_through_course_lib() -> None:
    """Every private torch name a notebook's code (its scripts included) uses goes through course_lib.torch_private."""
    offenders = []
    for path in sorted((ROOT / "sources").glob("*.py")):
        for i, code in enumerate(_code_cells(path.stem)):
            offenders += [f"{path.stem}, code cell {i}, line {line}: {name}" for line, name in _private_names(code)]
    assert offenders == [], "call the function of course_lib/torch_private.py instead:\n" + "\n".join(offenders)


def test_the_private_name_finder_sees_each_form() -> None:
    code = "import torch._dynamo\nfrom torch.utils._pytree import tree_map\nx = dist._DEFAULT_FIRST_BUCKET_BYTES\n"
    code += "torch._C._nn.linear\ntorch.__version__\nfrom torch.distributed import fsdp\n"
    names = [name for _, name in _private_names(code)]
    assert names == [
        "import torch._dynamo",
        "import torch.utils._pytree",
        "dist._DEFAULT_FIRST_BUCKET_BYTES",
        "torch._C._nn",
        "torch._C",
    ], names


def test_the_users_of_a_function_are_found() -> None:
    assert _notebooks_using("set_group_timeout") == ["12_ddp_knobs_and_failures"]
    assert "20_compile_overlap_batch" in _notebooks_using("dynamo_config")
    assert _notebooks_using("aten_linear") == ["20_compile_overlap_batch"]


def test_the_profilers_memory_events_are_read() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.ones(1024)
        del x
    sizes = [nbytes for _, nbytes in tp.profiler_memory_events(prof)]
    assert 4096 in sizes and -4096 in sizes, sizes


_FAKE_WORLD = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from course_lib.torch_private import fake_process_group, fake_tensor_mode, fsdp_memory_tracker
fake_process_group(8)
mesh = init_device_mesh("cpu", (8,))
with fake_tensor_mode():
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    tracker = fsdp_memory_tracker(model, opt)
    with tracker:
        model(torch.randn(8, 4096)).sum().backward()
        opt.step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
print(dist.get_world_size(), {getattr(k, "value", k): v for k, v in peak.items()}["Sharded Param"])
dist.destroy_process_group()
"""


def test_a_fake_world_sizes_fsdp_shards_without_memory() -> None:
    """Eight ranks of two 4096 x 4096 layers, in one process: each rank's shard is an eighth, and no storage exists."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FAKE_WORLD], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    world, sharded = out.stdout.split()
    assert int(world) == 8 and int(sharded) == 2 * (4096 * 4096 + 4096) * 4 // 8


def test_the_fake_world_and_the_tracker_check_their_arguments() -> None:
    import torch

    with pytest.raises(ValueError, match="world_size"):
        tp.fake_process_group(0)
    with pytest.raises(ValueError, match="rank"):
        tp.fake_process_group(4, rank=4)
    with pytest.raises(TypeError, match="FSDP2 module"):
        tp.fsdp_memory_tracker(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    assert type(tp.fake_tensor_mode()).__name__ == "FakeTensorMode"


def test_a_float8_product_is_the_scaled_product() -> None:
    """torch._scaled_mm has CPU kernels in 2.13: the float8 product, rescaled, is the product within float8's error."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 32, generator=gen), torch.randn(32, 16, generator=gen)
    sa, sb = a.abs().max() / 448, b.abs().max() / 448
    a8, b8 = (a / sa).to(torch.float8_e4m3fn), (b / sb).t().contiguous().to(torch.float8_e4m3fn).t()
    out = tp.scaled_mm(a8, b8, sa, sb, torch.float32)
    assert (out - a @ b).abs().max() < 0.1 * (a @ b).abs().max()
    with pytest.raises(TypeError, match="tensors"):
        tp.scaled_mm(a8, b8, 1.0, sb, torch.float32)
