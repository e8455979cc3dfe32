"""Notebook 22's capstone script with --pp and --cp: the first step's gradients equal one process's, and the
planted scale bugs (a pipeline that never averages its micro-batches, a context-parallel sum) are caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.equivalence import compare_gradients
from course_lib.launch import run_torchrun
from course_lib.manifest import written_file

pytestmark = pytest.mark.slow

RUNS = {  # name: (flags, reference, micro-batches)
    "pp2": ("--layers 4 --pp 2 --accum 4", "single4", 4),
    "pp2+interleaved": ("--layers 4 --pp 2 --accum 4 --schedule interleaved", "single4", 4),
    "pp2+gpipe": ("--layers 4 --pp 2 --accum 4 --schedule gpipe", "single4", 4),
    "pp2+unscaled": ("--layers 4 --pp 2 --accum 4 --plant-bug unscaled", "single4", 4),
    "cp2": ("--cp 2", "single", None),
    "cp2+summed": ("--cp 2 --plant-bug sum", "single", None),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("capstone")
    (tmp / "capstone_train.py").write_text(written_file("22_capstone", "_runs/capstone_train.py"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    subprocess.run(
        [
            sys.executable,
            "capstone_train.py",
            "--out",
            "out",
            "--runs",
            "single:--steps 2;single4:--layers 4 --steps 2",
        ],
        cwd=tmp,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    runs = ";".join(f"{name}:{flags} --steps 2" for name, (flags, _, _) in RUNS.items())
    run_torchrun(
        "capstone_train.py",
        nproc_per_node=2,
        cwd=tmp,
        timeout=300,
        echo="none",
        env={"COURSE_LIB_STRICT_TEARDOWN": "1"},
        args=["--out", "out", "--runs", runs],
    )
    return tmp / "out"


def _grads(out: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / name / "first_grads.pt", weights_only=True)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_first_gradients_match_one_process_unless_a_bug_is_planted(runs: Path, name: str) -> None:
    _, reference, micro = RUNS[name]
    match = compare_gradients(
        _grads(runs, name), _grads(runs, reference), tolerance=1e-4, world_size=2, micro_batches=micro
    )
    if "+unscaled" in name:
        assert not match and match.diagnosis.startswith("every gradient is 4 x"), str(match)
    elif "+summed" in name:
        assert not match and match.diagnosis.startswith("every gradient is 2 x"), str(match)
    else:
        assert match, str(match)
        losses = json.loads((runs / name / "result.json").read_text())["losses"]
        ref = json.loads((runs / reference / "result.json").read_text())["losses"]
        assert max(abs(losses[s] - ref[s]) for s in ref) < 1e-4


def test_the_first_stage_holds_p_micro_batches_under_1f1b_and_m_under_gpipe(runs: Path) -> None:
    saved = {n: json.loads((runs / n / "result.json").read_text())["first_stage_saved"] for n in ("pp2", "pp2+gpipe")}
    assert saved["pp2"]["peak"] == 2 * saved["pp2"]["micro_batch"]
    assert saved["pp2+gpipe"]["peak"] == 4 * saved["pp2+gpipe"]["micro_batch"]
