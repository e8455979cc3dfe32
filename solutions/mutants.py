"""The catalogue of typical bugs: for each lab, small patches of its reference solution that its check must reject.

One file per lab, ``solutions/<lab>_mutants.py``, holds its list; this module gathers them into :data:`MUTANTS`.

Each mutant replaces one snippet of the reference (it must occur exactly once) and names what the check's verdict
must say: every string of ``expect`` appears in the printed result (a failed check's name, its detail or its hint),
so a learner who makes that mistake is pointed at it. ``tests/test_labs.py`` runs every mutant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    old: str
    new: str
    expect: tuple[str, ...]
    timeout: float = 120.0  # a mutant that deadlocks is stopped sooner (the process group's timeout follows)


def _load() -> dict[str, list[Mutant]]:
    """Every lab's catalogue: ``solutions/<lab>_mutants.py`` defines ``MUTANTS``, a list of :class:`Mutant`."""
    import importlib.util
    import sys
    from pathlib import Path

    sys.modules.setdefault("mutants", sys.modules[__name__])
    found = {}
    for path in sorted(Path(__file__).parent.glob("lab_*_mutants.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[path.stem.removesuffix("_mutants")] = list(module.MUTANTS)
    return found


MUTANTS: dict[str, list[Mutant]] = _load()
