# The course's entry points. Two commands on a fresh machine:
#   make lab    set everything up and open the course in JupyterLab
#   make test   set everything up and run every test (what CI runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The notebooks, in course order, from the manifest (course.toml); expanded when a recipe runs,
# after the venv exists.
NB     ?= $(shell $(BIN)/python -m course_lib.manifest)
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
CHROMIUM ?= /usr/bin/chromium
NPM_STAMP := node_modules/.package-lock.json

.PHONY: help venv lab test lint test-lib test-notebooks test-portable test-gpu-visible test-load test-browser test-slurm execute sync slides html lock benchmarks clean

help:
	@echo "make lab        - create $(VENV), install the pinned environment, open JupyterLab in notebooks/"
	@echo "make test       - create/update $(VENV), lint, run pytest over course_lib and nbval over every notebook"
	@echo "make lint       - ruff (lint and format), mypy course_lib, course_lib's doctests"
	@echo "make execute    - re-execute notebooks in place (NB='notebooks/01_*.ipynb' for some)"
	@echo "make sync       - update notebooks/*.ipynb from their edited text sources in sources/ (FROM=ipynb: the reverse)"
	@echo "make slides     - a reveal.js deck per notebook in _site/slides/, offline (needs npm for the pinned assets)"
	@echo "make html       - the whole course as offline static HTML in _site/ (index.html), decks included"
	@echo "make test-portable - nbval over every notebook under simulated CPUs (portable kernels, AVX2)"
	@echo "make test-gpu-visible - nbval over every notebook with a CPU-only torch made to report 2 CUDA GPUs"
	@echo "make test-load  - nbval over every notebook while a CPU hog keeps every core busy"
	@echo "make test-browser - the real-browser tests (JupyterLab, decks, site) with $(CHROMIUM)"
	@echo "make test-slurm - the real-Slurm tests: a two-node cluster on this machine (needs slurm-wlm, munge)"
	@echo "make benchmarks - run every script in benchmarks/ and print its RESULT line"
	@echo "make lock       - regenerate requirements.lock from a fresh install of pyproject.toml"

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@# JupyterLab defaults for the course: RISE's "white" theme ships its font (the default theme
	@# pulls web fonts), and no news/update checks, so live slides and the lab work offline.
	mkdir -p $(VENV)/share/jupyter/lab/settings
	printf '%s\n' '{"jupyterlab-rise:plugin": {"theme": "white"},' \
	  ' "@jupyterlab/apputils-extension:notification": {"checkForUpdates": false, "fetchNews": "false"}}' \
	  > $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

test: $(STAMP)
	@$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) tests notebooks
	@if [ -x "$(CHROMIUM)" ]; then $(MAKE) --no-print-directory test-browser; \
	elif [ "$$COURSE_REQUIRE_BROWSER_TESTS" = 1 ]; then \
	  echo "ERROR: the browser tests are required but there is no chromium at $(CHROMIUM)"; exit 1; \
	else echo; echo "*** SKIPPED the browser tests: no chromium at $(CHROMIUM)."; \
	  echo "*** Install it (Debian/Ubuntu: apt-get install chromium) and npm, then run 'make test-browser'."; fi

test-lib: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests

# Style and types of the library, scripts and tests (pyproject.toml's [tool.ruff] and [tool.mypy] say
# what is left out), and every example in course_lib's docstrings run as a doctest.
lint: $(STAMP)
	$(BIN)/ruff check course_lib scripts tests benchmarks
	$(BIN)/ruff format --check course_lib scripts tests benchmarks
	$(BIN)/mypy course_lib
	$(BIN)/python -m pytest -p no:cacheprovider --doctest-modules course_lib

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB)

# The committed outputs must hold on any CPU, not only on the one that recorded them: nbval again
# under simulated CPUs. Each entry is one CPU, as environment variables: PyTorch's portable kernels
# with one thread (what an old or unusual CPU gets), and AVX2 (a typical laptop). CONTRIBUTING.md
# gives the rule for outputs that pass on all of them.
PORTABLE_CPUS ?= \
  "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1" \
  "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"

test-portable: $(STAMP)
	@for cpu in $(PORTABLE_CPUS); do \
	  echo "== nbval under a simulated CPU: $$cpu"; \
	  env $$cpu $(BIN)/python scripts/cpu_capability.py || exit 1; \
	  env $$cpu $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB) || exit 1; \
	done

# A machine with GPUs must print what the committed notebooks show: CPU jobs stay on the CPU, and
# only guarded GPU cells may differ. tests/gpu_visible/sitecustomize.py makes this CPU-only torch report
# $(SIMULATED_GPUS) CUDA devices to every process (kernel and launched ranks, honouring
# CUDA_VISIBLE_DEVICES); guarded cells skip as usual, because course_lib.device knows they are simulated.
SIMULATED_GPUS ?= 2
GPU_VISIBLE_ENV := PYTHONPATH=$(CURDIR)/tests/gpu_visible$(if $(PYTHONPATH),:$(PYTHONPATH)) COURSE_SIMULATED_GPUS=$(SIMULATED_GPUS)

test-gpu-visible: $(STAMP)
	@echo "== nbval with $(SIMULATED_GPUS) simulated CUDA GPUs visible"
	env $(GPU_VISIBLE_ENV) $(BIN)/python -c "import torch; assert torch.cuda.device_count() == $(SIMULATED_GPUS)"
	env $(GPU_VISIBLE_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB)

# No output may depend on how busy the machine is: nbval while scripts/cpu_hog.py keeps every core busy.
test-load: $(STAMP)
	@echo "== nbval on a loaded machine"
	$(BIN)/python scripts/cpu_hog.py -- $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_NBVAL) $(NB)

# The real-browser tests (tests/browser): JupyterLab runs every notebook, the decks and the site
# are stepped through offline. Playwright drives $(CHROMIUM); it never downloads a browser.
test-browser: $(STAMP)
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory $(NPM_STAMP); fi
	COURSE_BROWSER_TESTS=1 CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -p no:cacheprovider --durations=5 tests/browser

# The real-Slurm tests (tests/test_slurm.py): scripts/slurm_cluster.py starts a two-node cluster on this
# machine (munged, slurmctld, two slurmd, no root), runs torchrun jobs, scancel and a node failure.
# Without Slurm they skip and say how to install it; COURSE_REQUIRE_SLURM=1 (.ci/run) makes that a failure.
test-slurm: $(STAMP)
	COURSE_SLURM_TESTS=1 $(BIN)/python -m pytest -p no:cacheprovider --durations=5 tests/test_slurm.py

# The decks' and site's browser libraries, at the versions package-lock.json pins.
$(NPM_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund
	@touch $(NPM_STAMP)

slides: $(STAMP) $(NPM_STAMP)
	$(BIN)/python scripts/build_slides.py $(NB)

html: $(STAMP) $(NPM_STAMP)
	$(BIN)/python scripts/build_slides.py
	$(BIN)/python scripts/build_site.py

execute: $(STAMP)
	$(BIN)/python scripts/execute_notebooks.py $(NB)

# Edit sources/NN_topic.py, then `make sync`: the notebook gets the new cells, keeps its cell ids and
# outputs, and is re-executed only if code changed. FROM=ipynb writes the text sources from the notebooks.
sync: $(STAMP)
	$(BIN)/python scripts/sync_notebooks.py $(if $(filter ipynb,$(FROM)),--from-ipynb) $(NB)

benchmarks: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lock:
	rm -rf build/lock-venv
	$(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install --quiet --upgrade pip
	build/lock-venv/bin/python -m pip install --quiet "torch==2.13.0" .
	{ echo "# Exact versions that reproduce the committed notebook outputs (Python 3.11, CPU)."; \
	  echo "# Regenerate with 'make lock'. torch is pinned without the local '+cpu' suffix so this file"; \
	  echo "# installs on any machine; pip takes the CPU or CUDA build that the machine offers."; \
	  build/lock-venv/bin/python -m pip freeze --exclude course_lib | sed 's/+cpu$$//'; } > requirements.lock
	rm -rf build/lock-venv

clean:
	rm -rf $(VENV) build .pytest_cache
