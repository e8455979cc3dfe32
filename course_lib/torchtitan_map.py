"""The course's training scripts mapped onto torchtitan, PyTorch's reference stack for large-scale training.

Each flag of notebook 19's ``fsdp_train.py`` and notebook 22's ``capstone_train.py`` gets the torchtitan option that
does the same job, as torchtitan spells it on its command line (``--section.option``), with the line of
``torchtitan/config/job_config.py`` that defines it. The lines are those of :data:`TORCHTITAN_COMMIT`, the last
commit with that file (pytorch/torchtitan, 2026-02-23; its options equal tag v0.2.2's); newer torchtitan builds the
same configuration as Python dataclasses (``torchtitan/config/configs.py``) and keeps these flags only so that old
scripts still run. ``None`` means torchtitan has no such option, and the note says why.

>>> rows = torchtitan_rows("fsdp_train.py", ["--steps", "--bf16"])
>>> rows[0][:2]
('--steps', '--training.steps')
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "TORCHTITAN_COMMIT",
    "TORCHTITAN_EXTRAS",
    "TORCHTITAN_FLAGS",
    "script_flags",
    "torchtitan_rows",
    "torchtitan_table",
]

TORCHTITAN_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"
_JOB = "torchtitan/config/job_config.py"

# (torchtitan option or None, line in job_config.py or None, what to know)
_Row = tuple[str | None, int | None, str]

_SHARED: dict[str, _Row] = {
    "--out": ("--job.dump_folder", 22, "logs, checkpoints and traces go under it"),
    "--device": (
        None,
        None,
        "torchtitan runs on accelerators; `--comm.mode fake_backend` dry-runs a config on one CPU",
    ),
    "--steps": ("--training.steps", 267, ""),
    "--batch": ("--training.global_batch_size", 256, "in sequences; -1 (the default) means local batch x DP degree"),
    "--seq-len": ("--training.seq_len", 261, ""),
    "--lr": ("--optimizer.lr", 138, "AdamW by default (`--optimizer.name`)"),
}

TORCHTITAN_FLAGS: dict[str, dict[str, _Row]] = {
    "fsdp_train.py": {
        **_SHARED,
        "--replicate": ("--parallelism.data_parallel_replicate_degree", 313, "HSDP when the shard degree is > 1 too"),
        "--micro-batches": (
            "--training.local_batch_size",
            253,
            "no flag of its own: accumulation = global batch / (local batch x DP degree)",
        ),
        "--clip": ("--training.max_norm", 264, ""),
        "--seed": ("--debug.seed", 986, ""),
        "--bf16": (
            "--training.mixed_precision_param",
            282,
            "bfloat16 is the default; reduce with `--training.mixed_precision_reduce float32` (line 290)",
        ),
        "--checkpointing": ("--activation_checkpoint.mode", 652, "`full`; the default is `selective`"),
        "--cpu-offload": ("--training.enable_cpu_offload", 270, ""),
        "--no-prefetch": (
            None,
            None,
            "torchtitan relies on FSDP2's implicit prefetch; explicit orders are set in code",
        ),
        "--defer-grad-sync": (
            None,
            None,
            "torchtitan reduce-scatters every micro-batch, the script's default; deferring is "
            "`set_requires_gradient_sync(False)` in code",
        ),
        "--save-at": ("--checkpoint.interval", 519, "with `--checkpoint.enable` (line 488)"),
        "--async-save": ("--checkpoint.async_mode", 591, "`async` (a thread, as here) or `async_with_pinned_mem`"),
        "--resume": ("--checkpoint.initial_load_path", 522, "without it, the newest step in the folder is loaded"),
        "--from-step": ("--checkpoint.load_step", 616, ""),
        "--profile": ("--profiling.enable_profiling", 43, "traces under `--profiling.save_traces_folder` (line 46)"),
    },
    "capstone_train.py": {
        **_SHARED,
        "--dp": (
            "--parallelism.data_parallel_shard_degree",
            324,
            "`ddp`: shard degree 1 and `--parallelism.data_parallel_replicate_degree` N (line 313)",
        ),
        "--tp": ("--parallelism.tensor_parallel_degree", 351, ""),
        "--pp": ("--parallelism.pipeline_parallel_degree", 360, ""),
        "--schedule": (
            "--parallelism.pipeline_parallel_schedule",
            396,
            "`1F1B` by default; `Interleaved1F1B`, `GPipe`, zero-bubble ones",
        ),
        "--cp": (
            "--parallelism.context_parallel_degree",
            428,
            "PyTorch's `context_parallel` (all-gather of K/V by default, line 446), not the course's ring",
        ),
        "--layers": ("--model.flavor", 104, "a named model size (`debugmodel` by default), not a block count"),
        "--bf16": ("--training.mixed_precision_param", 282, "autocast under DDP, the FSDP2 policy under FSDP2"),
        "--checkpointing": ("--activation_checkpoint.mode", 652, "`none`, `full` or `selective`"),
        "--accum": ("--training.global_batch_size", 256, "accumulation = global batch / (local batch x DP degree)"),
        "--compile": ("--compile.enable", 722, "`--compile.components` picks model and/or loss"),
        "--save-every": ("--checkpoint.interval", 519, "with `--checkpoint.enable` (line 488)"),
        "--resume": ("--checkpoint.enable", 488, "an enabled checkpointer resumes from the newest step by itself"),
        "--ckpt": ("--checkpoint.folder", 513, "relative to `--job.dump_folder`"),
        "--resume-at": ("--checkpoint.load_step", 616, ""),
        "--crash-at": (
            None,
            None,
            "a fault injected for the lesson; torchft (`--fault_tolerance.enable`) survives one",
        ),
        "--runs": (None, None, "the course's several runs in one launch"),
        "--plant-bug": (None, None, "the course's planted bug"),
    },
}

# What torchtitan has that the course's scripts leave to other notebooks or to a GPU cluster.
TORCHTITAN_EXTRAS: dict[str, _Row] = {
    "async tensor parallelism": ("--parallelism.enable_async_tensor_parallel", 357, "needs `--compile.enable`"),
    "float8 training": (
        "--model.converters quantize.linear.float8",
        118,
        "recipe: `--quantize.linear.float8.recipe_name`",
    ),
    "float8 all-gather in FSDP2": ("--quantize.linear.float8.enable_fsdp_float8_all_gather", 732, "tensorwise only"),
    "fault tolerance (torchft)": ("--fault_tolerance.enable", 886, "replica groups: `--fault_tolerance.group_size`"),
}


def _check_script(script: object) -> dict[str, _Row]:
    if not isinstance(script, str):
        raise TypeError(f"script must be a str, got {type(script).__name__}")
    if script not in TORCHTITAN_FLAGS:
        raise ValueError(f"script must be one of {sorted(TORCHTITAN_FLAGS)}, got {script!r}")
    return TORCHTITAN_FLAGS[script]


_ADD_ARGUMENT = re.compile(r'add_argument\("(--[a-z0-9-]+)"')


def script_flags(text: str) -> list[str]:
    """The options an argparse script defines, in order: the first name of each ``add_argument("--...")``.

    >>> script_flags('p.add_argument("--steps", type=int); p.add_argument("--bf16", action="store_true")')
    ['--steps', '--bf16']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be the script's source as a str, got {type(text).__name__}")
    flags = _ADD_ARGUMENT.findall(text)
    if not flags:
        raise ValueError('the text defines no option: expected add_argument("--name", ...) lines')
    return flags


def torchtitan_rows(script: str, flags: Iterable[str]) -> list[tuple[str, str, str]]:
    """``(flag, torchtitan option, note)`` for each of ``flags``, the options ``script``'s parser defines.

    Raises ``ValueError`` naming the flags the map does not know, so a flag added to a script without its row fails.
    """
    table = _check_script(script)
    if isinstance(flags, str) or not isinstance(flags, Iterable):
        raise TypeError("flags must be an iterable of option strings such as '--steps'")
    flags = list(flags)
    if not all(isinstance(f, str) for f in flags):
        raise TypeError("flags must be strings such as '--steps'")
    if not flags:
        raise ValueError("flags must name at least one option")
    unknown = [f for f in flags if f not in table]
    if unknown:
        raise ValueError(f"no torchtitan row for {script}'s {', '.join(unknown)}: add it to TORCHTITAN_FLAGS")
    rows = []
    for f in flags:
        option, line, note = table[f]
        where = f"`{option}` ({_JOB}:{line})" if option and line else "none"
        rows.append((f, option or "none", f"{where}{'; ' + note if note else ''}"))
    return rows


def torchtitan_table(script: str, flags: Iterable[str]) -> str:
    """A markdown table of :func:`torchtitan_rows`: the course's flag, torchtitan's option and its source line."""
    rows = torchtitan_rows(script, flags)
    lines = [f"| `{script}` | torchtitan ({TORCHTITAN_COMMIT[:8]}) |", "|---|---|"]
    lines += [f"| `{flag}` | {note} |" for flag, _, note in rows]
    return "\n".join(lines)
