# The course's entry points. Two commands on a fresh machine:
#   make lab    set up the learner's environment and open the course in JupyterLab
#   make test   set up the developer's environment too and run every test: pytest and nbval (CI runs it, then
#               its extra passes: .ci/run)
# The edit-test loop of a contributor: make check (under 2 minutes: lint, types, doctests, fast unit tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# The notebooks, in course order, from the manifest (course.toml); expanded when a recipe runs,
# after the venv exists.
NB     ?= $(shell $(BIN)/python -m course_tools.manifest)
# nbval runs NBVAL_WORKERS notebooks at once (pytest-xdist; each notebook's cells stay in order in one kernel, on one
# worker: --dist loadfile). A notebook keeps less than a core busy on average (it waits on its ranks, sleeps,
# timeouts): two at a time on 2 cores took ~0.6 of the time of one at a time, and with the fork server's quick ranks
# three at a time beat two (make test's pytest 7 min 32 s against 8 min 30 s, same machine, one after the other; the
# cores were busy 1.64 of 2 on average against 1.42). Every notebook must print the same under that load anyway
# (make test-load). NBVAL_WORKERS=1 runs them one after another, in one process.
NBVAL_WORKERS ?= 3
XDIST := $(if $(filter-out 0 1,$(NBVAL_WORKERS)),-n $(NBVAL_WORKERS) --dist loadfile)
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg $(XDIST)
# nbval's order: the notebooks last in the course first. They are the long ones (launches: 22, 19, 11, 12 take
# 80-125 s each), and a long notebook started last leaves one worker idle while the other finishes it; make test
# runs the unit tests after them, whose many small files even out the end. (Longest first: the usual rule for
# scheduling on few workers; the notebooks are named NN_*, so it is their reverse sort. pytest 9 collects a folder in its own order, so only the order of notebooks is ours.)
NB_LONGEST_FIRST = $(shell printf '%s\n' $(NB) | sort -r)
CHROMIUM ?= /usr/bin/chromium
# Every test, execution and benchmark the Makefile runs treats a process group that outlives its job as an error
# (course_lib.teardown.end_process_group raises instead of warning, in every rank of every launch): the crash at exit
# that such a group can cause is a race, so the check is what catches it every time. The learner's `make lab` warns.
export COURSE_LIB_STRICT_TEARDOWN := 1
NPM_STAMP := node_modules/.package-lock.json

.PHONY: help venv venv-learner lab test check static lint lint-sources test-lib test-notebooks test-portable test-gpu-visible test-load test-extra test-browser test-slurm test-learner-install execute sync generated footprint slides html lock benchmarks clean student-edition instructor-edition editions grade grade-demo

help:
	@echo "make lab        - create $(VENV), install the pinned learner environment, open JupyterLab in notebooks/"
	@echo "make test       - create/update $(VENV) with the developer extras, lint, pytest, nbval over every notebook"
	@echo "                  (.ci/run adds the extra passes: test-extra, test-browser, test-slurm, test-learner-install)"
	@echo "make check      - the edit-test loop (< 2 min): lint, types, doctests, the unit tests not marked slow"
	@echo "make static     - ruff (lint and format), mypy course_lib, ruff's notebook rules over sources/ (seconds)"
	@echo "make lint       - make static, then course_lib's doctests"
	@echo "make lint-sources - ruff's notebook rules (pyflakes-level) over the text sources in sources/"
	@echo "make execute    - re-execute notebooks in place (NB='notebooks/01_*.ipynb' for some)"
	@echo "make sync       - update notebooks/*.ipynb from their edited text sources in sources/ (FROM=ipynb: the reverse)"
	@echo "make slides     - a reveal.js deck per notebook in _site/slides/, offline (needs npm for the pinned assets)"
	@echo "make html       - the whole course as offline static HTML in _site/ (index.html), decks included"
	@echo "make test-portable - nbval over every notebook under simulated CPUs (portable kernels, AVX2)"
	@echo "make test-gpu-visible - nbval over every notebook with a CPU-only torch made to report 2 CUDA GPUs"
	@echo "make test-load  - nbval over every notebook while a CPU hog keeps every core busy"
	@echo "make test-extra - CI's extra nbval pass: portable CPU + 2 simulated GPUs + every core busy (TEST_CPU=avx2: make test on AVX2)"
	@echo "make test-browser - the real-browser tests (JupyterLab, decks, site) with $(CHROMIUM)"
	@echo "make test-slurm - the real-Slurm tests: a two-node cluster on this machine (needs slurm-wlm, munge)"
	@echo "make test-learner-install - the learner's install alone in a fresh venv: imports, no dev tools"
	@echo "make benchmarks - run every script in benchmarks/ and print its RESULT line"
	@echo "make generated  - rewrite what is generated from course.toml and course_lib.facts (README, guide, tables)"
	@echo "make footprint NB=09 - what belongs to a notebook (NB=ring: to every notebook about the ring)"
	@echo "make lock       - regenerate the lock files from fresh installs of pyproject.toml (learner, dev)"
	@echo "make student-edition    - _editions/student: the notebooks, the labs as handed out (nbgrader), course_lib"
	@echo "make instructor-edition - _editions/instructor: the nbgrader course (solutions, hidden tests), the guide"
	@echo "make grade SUBMISSIONS=dir - grade the labs handed in: _grading/grades.csv, _grading/feedback/ (docs/classroom.md)"
	@echo "make grade-demo - grade six sample students (right, wrong, blank, hanging, hostile) and print the scores"

# Two environments in one venv: the learner set (requirements.lock: what the notebooks and JupyterLab need)
# for `make lab`, and the developer extras on top (requirements-dev.lock: tests, nbval, lint, types,
# browser tests, pre-commit) for everything that tests or builds.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs torch from that index first (the CPU build: on Linux,
# none of the CUDA packages PyPI's torch pulls; README, "Without a GPU").
TORCH_INDEX ?=
TORCH_PIN := $(shell grep '^torch==' requirements.lock)
venv: $(DEV_STAMP)
venv-learner: $(STAMP)

$(STAMP): requirements.lock requirements-linux-cuda.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet "$(TORCH_PIN)" --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@# JupyterLab defaults for the course: RISE's "white" theme ships its font (the default theme
	@# pulls web fonts), and no news/update checks, so live slides and the lab work offline.
	mkdir -p $(VENV)/share/jupyter/lab/settings
	printf '%s\n' '{"jupyterlab-rise:plugin": {"theme": "white"},' \
	  ' "@jupyterlab/apputils-extension:notification": {"checkForUpdates": false, "fetchNews": "false"}}' \
	  > $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/python -m pip install --quiet -r requirements-dev.lock
	touch $(DEV_STAMP)

lab: $(STAMP)
	env -u COURSE_LIB_STRICT_TEARDOWN $(BIN)/jupyter lab notebooks/

# TEST_CPU=avx2 or TEST_CPU=portable runs make test's pytest (unit tests and nbval) under that simulated CPU (see
# test-portable below); empty: this machine's own CPU. .ci/run's main pass is the AVX2 laptop and its extra pass
# (test-extra) the portable CPU, so CI covers both simulated CPUs in two executions of every notebook, not three.
TEST_CPU ?=
TEST_CPU_ENV = $(if $(filter avx2,$(TEST_CPU)),$(CPU_AVX2),$(if $(filter portable,$(TEST_CPU)),$(CPU_PORTABLE)))

test: $(DEV_STAMP)
	$(if $(filter-out avx2 portable,$(TEST_CPU)),$(error TEST_CPU='$(TEST_CPU)': use avx2, portable, or leave it empty))
	@$(MAKE) --no-print-directory lint
	$(if $(TEST_CPU),env $(TEST_CPU_ENV) $(BIN)/python scripts/cpu_capability.py)
	$(if $(TEST_CPU),env $(TEST_CPU_ENV)) $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB_LONGEST_FIRST) tests
	@echo; echo "make test: done. The real-browser and real-Slurm tests are separate passes (.ci/run runs them):"
	@echo "  make test-browser (needs chromium and npm), make test-slurm (needs slurm-wlm and munge)."

test-lib: $(DEV_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests

# The edit-test loop, under 2 minutes on 2 cores: `make static` (ruff, format, mypy, the sources' rules) and every
# unit test not marked slow, the doctests and tests in one pytest process (one torch import). The slow tests execute
# notebooks, launch process trees or drive a browser: `make test` runs them (the marker is declared in
# pyproject.toml's [tool.pytest.ini_options]). CHECK_ARGS=... passes pytest options (CHECK_ARGS=--durations=10).
check: static
	$(BIN)/python -m pytest -p no:cacheprovider -q -m "not slow" --doctest-modules $(CHECK_ARGS) course_lib tests

# Style and types of the library, tooling, tests and benchmarks (pyproject.toml's [tool.ruff] and
# [tool.mypy] say what is left out), and the text sources (LINT_SOURCES below): the static half that `make lint`
# and `make check` share, in seconds. `make lint` adds every example in course_lib's docstrings, run as a doctest;
# `make check` runs those and the unit tests in one pytest process.
static: $(DEV_STAMP)
	$(BIN)/ruff check course_lib scripts tests benchmarks solutions
	$(BIN)/ruff format --check course_lib scripts tests benchmarks solutions
	$(BIN)/mypy course_lib
	$(if $(filter 1,$(LINT_SOURCES)),$(BIN)/ruff check --config ruff-sources.toml sources)

lint: static
	$(BIN)/python -m pytest -p no:cacheprovider -q --doctest-modules course_lib

# The text sources, linted as notebooks (ruff-sources.toml: pyflakes-level rules, no style). Part of `make lint`
# and `make check` (LINT_SOURCES=0 leaves it out). It caught a notebook calling a name its setup never imported.
LINT_SOURCES ?= 1
lint-sources: $(DEV_STAMP)
	$(BIN)/ruff check --config ruff-sources.toml sources

test-notebooks: $(DEV_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB_LONGEST_FIRST)

# The committed outputs must hold on any CPU, not only on the one that recorded them: nbval again
# under simulated CPUs. Each entry is one CPU, as environment variables: PyTorch's portable kernels
# with one thread (what an old or unusual CPU gets), and AVX2 (a typical laptop). CONTRIBUTING.md
# gives the rule for outputs that pass on all of them.
CPU_PORTABLE := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1
CPU_AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
PORTABLE_CPUS ?= "$(CPU_PORTABLE)" "$(CPU_AVX2)"

test-portable: $(DEV_STAMP)
	@for cpu in $(PORTABLE_CPUS); do \
	  echo "== nbval under a simulated CPU: $$cpu"; \
	  env $$cpu $(BIN)/python scripts/cpu_capability.py || exit 1; \
	  env $$cpu $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB_LONGEST_FIRST) || exit 1; \
	done

# A machine with GPUs must print what the committed notebooks show: CPU jobs stay on the CPU, and
# only guarded GPU cells may differ. tests/gpu_visible/sitecustomize.py makes this CPU-only torch report
# $(SIMULATED_GPUS) CUDA devices to every process (kernel and launched ranks, honouring
# CUDA_VISIBLE_DEVICES); guarded cells skip as usual, because course_lib.device knows they are simulated.
SIMULATED_GPUS ?= 2
GPU_VISIBLE_ENV := PYTHONPATH=$(CURDIR)/tests/gpu_visible$(if $(PYTHONPATH),:$(PYTHONPATH)) COURSE_SIMULATED_GPUS=$(SIMULATED_GPUS)

# UNDER_LOAD=1 runs it while scripts/cpu_hog.py keeps every core busy (test-load's condition; test-extra uses it).
test-gpu-visible: $(DEV_STAMP)
	@echo "== nbval with $(SIMULATED_GPUS) simulated CUDA GPUs visible$(if $(UNDER_LOAD), on a loaded machine)"
	env $(GPU_VISIBLE_ENV) $(BIN)/python -c "import torch; assert torch.cuda.device_count() == $(SIMULATED_GPUS)"
	env $(GPU_VISIBLE_ENV) $(if $(UNDER_LOAD),$(BIN)/python scripts/cpu_hog.py --) \
	  $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB_LONGEST_FIRST)

# No output may depend on how busy the machine is: nbval while scripts/cpu_hog.py keeps every core busy.
test-load: $(DEV_STAMP)
	@echo "== nbval on a loaded machine"
	$(BIN)/python scripts/cpu_hog.py -- $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB_LONGEST_FIRST)

# CI's extra pass over every notebook, three conditions in one nbval run: the portable CPU (one thread), with
# $(SIMULATED_GPUS) simulated GPUs visible, while every core is kept busy. Each condition alone is a target above
# (test-portable, test-gpu-visible, test-load). The other simulated CPU, AVX2, is .ci/run's `make test TEST_CPU=avx2`.
test-extra: $(DEV_STAMP)
	env $(CPU_PORTABLE) $(BIN)/python scripts/cpu_capability.py
	env $(CPU_PORTABLE) $(MAKE) --no-print-directory test-gpu-visible UNDER_LOAD=1

# The real-browser tests (tests/browser): JupyterLab opens every notebook and runs each explorer's cells live, the
# decks and the site are stepped through offline. Playwright drives $(CHROMIUM); it never downloads a browser.
test-browser: $(DEV_STAMP)
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory $(NPM_STAMP); fi
	COURSE_BROWSER_TESTS=1 CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -p no:cacheprovider --durations=5 tests/browser

# The real-Slurm tests (tests/test_slurm.py): scripts/slurm_cluster.py starts a two-node cluster on this
# machine (munged, slurmctld, two slurmd, no root), runs torchrun jobs, scancel and a node failure.
# Without Slurm they skip and say how to install it; COURSE_REQUIRE_SLURM=1 (.ci/run) makes that a failure.
test-slurm: $(DEV_STAMP)
	COURSE_SLURM_TESTS=1 $(BIN)/python -m pytest -p no:cacheprovider --durations=5 tests/test_slurm.py

# The learner's install, apart from the developer's: a fresh venv from requirements.lock alone (what `make lab`
# installs), `pip check`, then every module the notebooks and course_lib import, and no developer tool
# (scripts/learner_check.py). CI runs it; pip's cache (and, here, the local wheels) keep it to minutes. The venv
# stays in build/ (removing 1.5 GB took minutes on a busy disk); the next run starts afresh.
LEARNER_VENV := build/learner-venv
test-learner-install:
	rm -rf $(LEARNER_VENV)
	$(PYTHON) -m venv $(LEARNER_VENV)
	$(LEARNER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LEARNER_VENV)/bin/python -m pip install --quiet -r requirements.lock
	$(LEARNER_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(LEARNER_VENV)/bin/python -m pip check
	$(LEARNER_VENV)/bin/python -m course_tools.learner_check

# The decks' and site's browser libraries, at the versions package-lock.json pins.
$(NPM_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund
	@touch $(NPM_STAMP)

slides: $(DEV_STAMP) $(NPM_STAMP)
	$(BIN)/python scripts/build_slides.py $(NB)

html: $(DEV_STAMP) $(NPM_STAMP)
	$(BIN)/python scripts/build_slides.py
	$(BIN)/python scripts/build_site.py

execute: $(DEV_STAMP)
	$(BIN)/python scripts/execute_notebooks.py $(NB)

# Edit sources/NN_topic.py, then `make sync`: the notebook gets the new cells, keeps its cell ids and
# outputs, and is re-executed only if code changed. FROM=ipynb writes the text sources from the notebooks.
sync: $(DEV_STAMP)
	$(BIN)/python scripts/sync_notebooks.py $(if $(filter ipynb,$(FROM)),--from-ipynb) $(NB)

# What is generated from course.toml and course_lib.facts: README's table, the instructor guide's plan and
# notes, the comparison tables in the text sources (then `make sync` for the notebooks whose tables changed).
generated: $(DEV_STAMP)
	$(BIN)/python -m course_tools.manifest --write

# What belongs to a notebook (NB=09, or a word such as NB=ring): the files to touch when changing what it teaches.
footprint: $(DEV_STAMP)
	@$(BIN)/python -m course_tools.manifest --footprint "$(NB)"

# The classroom editions (docs/classroom.md), derived with nbgrader from the same files as the self-study course.
student-edition: $(DEV_STAMP)
	$(BIN)/python -m course_tools.classroom student
instructor-edition: $(DEV_STAMP)
	$(BIN)/python -m course_tools.classroom instructor
editions: student-edition instructor-edition

# Grade a folder of submissions (one folder per student, the lab notebooks in it) into _grading/: nbgrader's
# gradebook, grades.csv, feedback per student. LAB_TIMEOUT: seconds per launch of a lab's job; CELL_TIMEOUT: any
# other cell; DISK_MB: what a notebook may write.
SUBMISSIONS ?=
GRADES ?= _grading
LAB_TIMEOUT ?= 120
CELL_TIMEOUT ?= 60
DISK_MB ?= 512
grade: $(DEV_STAMP)
	$(if $(SUBMISSIONS),,$(error SUBMISSIONS=dir: the folder with one folder per student))
	test -f _editions/instructor/nbgrader/gradebook.db || $(MAKE) --no-print-directory instructor-edition
	env -u COURSE_LIB_STRICT_TEARDOWN $(BIN)/python -m course_tools.grading "$(SUBMISSIONS)" --out $(GRADES) \
	  --lab-timeout $(LAB_TIMEOUT) --cell-timeout $(CELL_TIMEOUT) --disk-mb $(DISK_MB)
grade-demo: editions
	rm -rf _grading-demo
	$(BIN)/python -m course_tools.grading_samples _grading-demo/submissions --secret $(CURDIR)/solutions/lab_11_ddp.py
	$(MAKE) --no-print-directory grade SUBMISSIONS=_grading-demo/submissions GRADES=_grading-demo/grades \
	  LAB_TIMEOUT=90 CELL_TIMEOUT=20 DISK_MB=64

benchmarks: $(DEV_STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The lock files from fresh installs (scripts/lock.py says how): requirements.lock (learner),
# requirements-dev.lock (+ the dev extra), requirements-linux-cuda.lock (what PyPI's torch pulls on Linux).
lock:
	$(PYTHON) scripts/lock.py --python $(PYTHON)

clean:
	rm -rf $(VENV) build .pytest_cache
