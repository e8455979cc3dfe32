"""course_tools: the repository's tooling, installed from ``scripts/`` under the import name ``course_tools``.

``pyproject.toml`` maps the name to this folder (``[tool.setuptools] package-dir``), so tests and scripts
import a tool as ``from course_tools import gpu_cells`` with no ``sys.path`` edit, and each file still runs
as a script (``python scripts/sync_notebooks.py``) or as a module (``python -m course_tools.sync_notebooks``).
None of it is for learners: notebooks import ``course_lib``, never ``course_tools``. One module per job:

* :mod:`course_tools.manifest` — the command behind ``course.toml``: the notebook paths (the Makefile's
  ``NB``), ``--write``/``--check`` of the generated blocks, ``--footprint`` of a notebook or a topic
* :mod:`course_tools.generated` — README's table, the instructor guide's plan and notes, and the comparison
  tables of :mod:`course_lib.facts` rendered as markdown into the text sources
* :mod:`course_tools.footprint` — what belongs to a notebook: its source, exercises, modules, tests, benchmarks
* :mod:`course_tools.execute_notebooks` — ``make execute``: the one way committed outputs are made
* :mod:`course_tools.sync_notebooks` — ``make sync``: text sources to notebooks (and back)
* :mod:`course_tools.gpu_cells`, :mod:`course_tools.gpu_check` — the GPU-only cells: dry-run on the CPU, run live
* :mod:`course_tools.build_slides`, :mod:`course_tools.build_site` — ``make slides``, ``make html``
* :mod:`course_tools.cpu_capability`, :mod:`course_tools.cpu_hog` — ``make test-portable``, ``make test-load``
"""
