# The course's single entry point.
#   make lab    -- install (once) and open the course in JupyterLab
#   make test   -- install (once) and run the whole test suite (unit tests + every notebook)
#   make setup  -- only install
#   make student -- student copies of the notebooks (no outputs, empty answer cells) in notebooks/student/
#   make reproduce -- run every chapter's measurements headless into results/<timestamp>/report.md
#                     (COURSE_PROFILE=smoke|workshop|full; RESUME=latest continues an interrupted run;
#                      CHAPTERS="01 05" runs only those chapters)
#   make setup-ipex -- the IPEX environment (torch 2.8.0 + Intel's retired extension) for chapter 04's IPEX arms
#   make platforms -- check that the pins resolve on Linux x86-64/aarch64, macOS arm64 and Windows x86-64,
#                     for Python 3.11, 3.12 and 3.13
#   make doctor -- check the setup (first step when something fails); writes results/doctor.json
#   make submit -- pack the latest run's results into one privacy-safe file for a workshop organiser
#   make pool IN="PATHS..." OUT=DIR -- merge submissions / runs into DIR/index.md with figures
#
# The virtual environment lives outside the clone, keyed by the Python minor version and a hash of
# the pins, so a second clone or a CI run on the same Python reuses it: $(VENV). Override with `make VENV=/path ...`.
#
# DEVICE=xpu (Intel GPUs; give it to every make command, e.g. `make lab DEVICE=xpu`): a separate
# environment, venv-xpu-py3.X-<hash>, with torch and torchvision of the pinned versions from PyTorch's
# XPU wheel index and every other pin except the CPU build of IPEX (helpers/course/install.py builds the
# commands). The default (DEVICE=cpu, or cuda: the same environment) installs the pins as written.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# The Python that builds the environments: python3 when it is a supported version (Ubuntu 24.04: 3.12,
# Debian 12: 3.11, Debian 13: 3.13), else the newest supported python3.X on PATH (Ubuntu 22.04's python3
# is 3.10: python3.11). SUPPORTED_PYTHONS is requires-python in pyproject.toml (tests/test_environment.py
# checks they agree). `make PYTHON=/path/to/python3.X ...` picks another one.
SUPPORTED_PYTHONS := 3.11 3.12 3.13
PYTHON_FIX := install one -- Ubuntu 24.04, Debian 12/13: sudo apt-get install python3 python3-venv python3-dev; \
	Ubuntu 22.04: sudo apt-get install python3.11 python3.11-venv python3.11-dev; macOS: brew install python@3.13 -- \
	or name it: make PYTHON=/path/to/python3.13 setup
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3 python3.13 python3.12 python3.11; do \
	"$$p" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] not in "$(SUPPORTED_PYTHONS)".split())' 2>/dev/null \
	&& command -v "$$p" && break; done)
ifeq ($(PYTHON),)
$(error No supported Python found: the course needs Python 3.11, 3.12 or 3.13 as python3 (or python3.11-3.13); $(PYTHON_FIX))
endif
endif
# Stops a recipe when PYTHON (given by hand) is not a supported version.
CHECK_PYTHON = $(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(None if v in "$(SUPPORTED_PYTHONS)".split() \
	else "Python %s ($(PYTHON)) is not supported: the course needs 3.11, 3.12 or 3.13; $(PYTHON_FIX)" % sys.version.split()[0])'
# The environment's key: py3.X (the Python minor version: two clones on different Pythons never share an
# environment) and a hash of the pins only (requires-python, dependencies, extras, as parsed TOML), never of
# file dates, comments or layout: a second clone, or an edit elsewhere in pyproject.toml, reuses it.
ENV_KEY := $(shell $(PYTHON) -m helpers.course.install env-key 2>/dev/null || echo needs-a-supported-python)
# What the editable install of helpers depends on besides the clone's folder: the package layout.
# (Python's hashlib, not sha256sum: macOS has no sha256sum.)
LAYOUT_HASH := $(shell sed -n '/^\[tool.setuptools/,/^\[tool.pytest/p' pyproject.toml | $(PYTHON) -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:12])')
CACHE ?= $(HOME)/.cache/accelerate-course
# The IPEX environment (torch 2.8.0 + IPEX 2.8.0, pins in pyproject's [tool.course.ipex-environment]), keyed
# by its pins and the Python minor version (venv-ipex-py3.X-<hash>; IPEX 2.8.0 has wheels for 3.11-3.13);
# chapter 04 finds its Python through COURSE_IPEX_PYTHON.
IPEX_VENV ?= $(shell $(PYTHON) -m helpers.course.install ipex-venv --cache "$(CACHE)" 2>/dev/null || echo needs-a-supported-python)
export COURSE_IPEX_PYTHON := $(IPEX_VENV)/bin/python
# make test builds the IPEX environment when CI=true or IPEX=1 (learners opt in with make setup-ipex).
WANT_IPEX := $(if $(filter true 1,$(CI) $(IPEX)),yes,)
DEVICE ?= cpu
SETUP_SIZE := about 4 minutes, 8 GB
ifeq ($(DEVICE),xpu)
VENV ?= $(CACHE)/venv-xpu-$(ENV_KEY)
SETUP_SIZE := torch and torchvision from PyTorch's XPU index, no IPEX
else ifeq ($(filter $(DEVICE),cpu cuda),)
$(error DEVICE=$(DEVICE) has no course environment: use DEVICE=xpu for Intel GPUs, or leave DEVICE out (CPU and NVIDIA GPUs))
endif
VENV ?= $(CACHE)/venv-$(ENV_KEY)
BIN := $(VENV)/bin

.PHONY: _build-venv _build-ipex setup setup-ipex lab test unit unit-ipex student execute reproduce bench tune doctor submit pool platforms clean-venv

# Two clones may run `make setup` at the same time into the one shared environment. The build runs
# under a lock (filelock, on <venv>.lock; python -m helpers.course.install lock): the second waits, saying so,
# then finds .installed and reuses the environment; if the first build failed, it builds it itself.
# The system python3 that runs this has no filelock (and a venv is not relocatable, so building in a
# private folder and renaming it into place is no option: its scripts name their folder). So a Python
# without filelock takes the lock through a tiny venv that holds only filelock, <cache>/.lock-tool-py3.X,
# made once in a private folder and renamed into place in one atomic step (racing clones each make one;
# the first rename wins, the others use it). The build itself is the internal target _build-venv.
# The kernel releases the lock of a killed build, so it never blocks the next one.
$(VENV)/.installed:
	@$(CHECK_PYTHON)
	@$(PYTHON) -m helpers.course.install lock --venv "$(VENV)" --cache "$(CACHE)" -- \
		$(SUBMAKE) --no-print-directory _build-venv PYTHON="$(PYTHON)" VENV="$(VENV)" DEVICE="$(DEVICE)" CACHE="$(CACHE)"

# (make -n shows this line without running it: `make -n _build-venv` shows the build's steps.)
SUBMAKE := $(MAKE)
_build-venv:
	@echo "Creating the course environment in $(VENV) ($(SETUP_SIZE); first time only) with Python $$($(PYTHON) -c 'import platform; print(platform.python_version())') ($(PYTHON))"
	rm -rf "$(VENV)"
	$(PYTHON) -m venv "$(VENV)"
	"$(BIN)/python" -m pip install --quiet --upgrade pip
ifeq ($(DEVICE),xpu)
	"$(BIN)/python" -m helpers.course.install setup --device xpu --project "$(CURDIR)"
else
	"$(BIN)/python" -m pip install --quiet -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
endif
	"$(BIN)/python" -c "import torch, torchvision, helpers"
	touch "$(VENV)/.installed"

# The editable install points at one clone; re-point it (seconds) when the cached environment
# was made from another clone or the package layout changed. A JupyterLab started from the
# other clone then imports this clone's helpers.
setup: $(VENV)/.installed
	@if [ "$$(cat "$(VENV)/.editable" 2>/dev/null)" != "$(CURDIR) $(LAYOUT_HASH)" ] || ! (cd /tmp && "$(BIN)/python" -c \
		'import helpers, pathlib, sys; sys.exit(pathlib.Path(helpers.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())' "$(CURDIR)" 2>/dev/null); then \
		echo "Pointing the environment's helpers at $(CURDIR)"; \
		PYTHONWARNINGS=ignore "$(BIN)/python" -m pip install --quiet --no-deps -e "$(CURDIR)" 2>&1 | { grep -v "^WARNING: Location" || true; } \
			&& echo "$(CURDIR) $(LAYOUT_HASH)" > "$(VENV)/.editable"; \
	fi
ifeq ($(DEVICE),xpu)
	@"$(BIN)/python" -m helpers.course.install check --device xpu
else
	@"$(BIN)/python" -m pip check
endif
	@$(PYTHON) -m helpers.course.install environments --cache "$(CACHE)" --keep "$(VENV)" "$(IPEX_VENV)" || true

# The IPEX environment: its own pins, the course package without dependencies (editable: it follows this
# clone). Built under its lock like the default one (above).
$(IPEX_VENV)/.installed:
	@$(CHECK_PYTHON)
	@$(PYTHON) -m helpers.course.install lock --venv "$(IPEX_VENV)" --cache "$(CACHE)" -- \
		$(SUBMAKE) --no-print-directory _build-ipex PYTHON="$(PYTHON)" IPEX_VENV="$(IPEX_VENV)" CACHE="$(CACHE)"

_build-ipex:
	@echo "Creating the IPEX environment in $(IPEX_VENV) (torch 2.8.0 + IPEX 2.8.0, about 2 minutes, 7 GB; first time only)"
	rm -rf "$(IPEX_VENV)"
	$(PYTHON) -m venv "$(IPEX_VENV)"
	"$(IPEX_VENV)/bin/python" -m pip install --quiet --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
	"$(IPEX_VENV)/bin/python" -m helpers.course.install setup-ipex --project "$(CURDIR)" 2>&1 | { grep -v "^WARNING: Location" || true; }
	touch "$(IPEX_VENV)/.installed"

setup-ipex: $(IPEX_VENV)/.installed
	@if ! (cd /tmp && "$(IPEX_VENV)/bin/python" -c 'import helpers, pathlib, sys; sys.exit(pathlib.Path(helpers.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())' "$(CURDIR)" 2>/dev/null); then \
		echo "Pointing the IPEX environment's helpers at $(CURDIR)"; \
		PYTHONWARNINGS=ignore "$(IPEX_VENV)/bin/python" -m pip install --quiet --no-deps -e "$(CURDIR)" 2>&1 | { grep -v "^WARNING: Location" || true; }; \
	fi

# JupyterLab's "receive Jupyter news?" pop-up is answered once for this environment (a settings
# override inside the venv; the user's own JupyterLab settings are not touched and still win).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/accelerate-course.json
lab: setup
	@mkdir -p "$(dir $(LAB_OVERRIDES))" && printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > "$(LAB_OVERRIDES)"
	COURSE_PROFILE=$${COURSE_PROFILE_LAB:-workshop} "$(BIN)/jupyter" lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) notebooks/

# Unit tests, every notebook and every student copy, at the smoke size on stand-in data.
# Chapters that time or pin threads to cores (TEST_SERIAL) run one at a time after the rest; the rest
# run TEST_JOBS at a time, each notebook whole on one worker (--dist loadfile keeps its cells
# in order in one kernel; the long notebooks are handed out first, unit-test files fill the gaps),
# each with TEST_THREADS OpenMP threads so that the workers share the cores instead of fighting.
# Student copies have no outputs: nbval only checks that they run, with COURSE_OPTIONAL=0: the path of a
# reader who skips the optional parts (the notebooks themselves run every optional part).
# Rows that notebooks record during the test go to their own folder, emptied at the start.
TEST_RESULTS := $(CURDIR)/results/make-test
# TORCHINDUCTOR_COMPILE_THREADS=1: Inductor compiles the smoke size's small graphs in-process instead of
# first starting a pool of compile workers (each imports torch: seconds of CPU per compiling process).
# OMP_WAIT_POLICY=PASSIVE, parallel phase only: there the workers and their torchrun ranks share the
# two cores, and an OpenMP thread that spins while it waits burns a core another test needs (the
# serial chapters keep the default: they measure OpenMP settings).
SMOKE := COURSE_PROFILE=smoke COURSE_DATA=standin TQDM_DISABLE=1 COURSE_RESULTS="$(TEST_RESULTS)" \
	TORCHINDUCTOR_COMPILE_THREADS=1
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=300
PYTEST := "$(BIN)/python" -m pytest -p no:cacheprovider
TEST_JOBS ?= 2
TEST_THREADS ?= 1
TEST_SERIAL ?= 02 04 09 11 13
TEST_CHAPTERS = $(wildcard notebooks/[0-9][0-9]_*.ipynb)
TEST_SERIAL_NB = $(foreach n,$(TEST_SERIAL),$(filter notebooks/$(n)_%,$(TEST_CHAPTERS)))
TEST_PARALLEL_NB = $(filter-out $(TEST_SERIAL_NB),$(TEST_CHAPTERS))
# The unit tests of the helpers that chapter 04's IPEX children import, under the IPEX environment's torch 2.8
# (not the process-tree tests of the launchers, which import none of them).
IPEX_UNIT := tests/test_ipex.py tests/test_models.py tests/test_step.py tests/test_seeds.py tests/test_processes.py
IPEX_UNIT_SKIP := not torchrun and not mpirun and not parent and not two_rank
test: setup student $(if $(WANT_IPEX),setup-ipex)
	@echo "make test runs at COURSE_PROFILE=smoke COURSE_DATA=standin (forced; your COURSE_PROFILE is ignored here)"
	@rm -rf "$(TEST_RESULTS)"
	$(if $(WANT_IPEX),$(MAKE) --no-print-directory unit-ipex)
	$(SMOKE) OMP_NUM_THREADS=$(TEST_THREADS) OMP_WAIT_POLICY=PASSIVE $(PYTEST) -n $(TEST_JOBS) --dist loadfile $(TEST_PARALLEL_NB) tests $(NBVAL)
	$(SMOKE) OMP_NUM_THREADS=$(TEST_THREADS) OMP_WAIT_POLICY=PASSIVE COURSE_OPTIONAL=0 $(PYTEST) -n $(TEST_JOBS) --dist loadfile $(TEST_PARALLEL_NB:notebooks/%=notebooks/student/%) $(NBVAL)
	$(SMOKE) $(PYTEST) $(TEST_SERIAL_NB) $(NBVAL)
	$(SMOKE) COURSE_OPTIONAL=0 $(PYTEST) $(TEST_SERIAL_NB:notebooks/%=notebooks/student/%) $(NBVAL)

# Student copies: no outputs, solution cells emptied (git-ignored, regenerated every time).
student: setup
	"$(BIN)/python" -m helpers.course.notebooks student

unit: setup
	"$(BIN)/python" -m pytest tests -p no:cacheprovider

unit-ipex: setup-ipex
	cd /tmp && COURSE_PROFILE=smoke "$(IPEX_VENV)/bin/python" -m pytest -p no:cacheprovider -q --rootdir "$(CURDIR)" -k "$(IPEX_UNIT_SKIP)" $(IPEX_UNIT:%="$(CURDIR)"/%)

# The pins resolve (wheels only) for Linux x86-64 and aarch64, macOS arm64 (14+) and Windows x86-64, each on
# Python 3.11, 3.12 and 3.13, and the IPEX pins for Linux x86-64 on each (uv; needs the package index).
platforms: setup
	"$(BIN)/python" -m helpers.course.install platforms

# Re-execute the notebooks in place at workshop size (how committed outputs are made); at the workshop
# size each chapter's **Time:** sentence is then rewritten from the run (python -m helpers.course.notebooks time).
execute: setup
	@[ ! -x "$(IPEX_VENV)/bin/python" ] || $(SUBMAKE) --no-print-directory setup-ipex   # re-link the IPEX env to this clone
	for nb in $${NB:-notebooks/*.ipynb}; do \
		COURSE_PROFILE=$${PROFILE:-workshop} TQDM_DISABLE=1 "$(BIN)/jupyter" nbconvert --to notebook --execute --inplace \
			--ExecutePreprocessor.timeout=3600 "$$nb" || exit 1; \
		[ "$${PROFILE:-workshop}" != workshop ] || case "$$nb" in */00_*|*/student/*) ;; \
			*) "$(BIN)/python" -m helpers.course.notebooks time "$$nb" || exit 1;; esac; \
	done

reproduce: setup
	@[ ! -x "$(IPEX_VENV)/bin/python" ] || $(SUBMAKE) --no-print-directory setup-ipex   # re-link the IPEX env to this clone
	"$(BIN)/python" -m helpers.course.reproduce --profile $${COURSE_PROFILE:-workshop} $${RESUME:+--resume $$RESUME} $${CHAPTERS:+--chapters $$CHAPTERS}

# The dlprimitives training-step benchmark at the published settings (see chapter 12).
# BENCH_ARGS adds to (and may override) the default --models resnet18, e.g. BENCH_ARGS="--dtype bf16".
bench: setup
	"$(BIN)/python" -m helpers.bench --models resnet18 $${BENCH_ARGS}

# The setup check needs no `make setup` first: it must also run when setup is what fails.
doctor:
	@test -x "$(BIN)/python" || { echo "No course environment in $(VENV) yet: run make setup (or make lab) first"; exit 1; }
	"$(BIN)/python" -m helpers.course.doctor

# Workshop kit: make submit [RUN=results/<run folder>], then the organiser runs make pool.
submit: setup
	"$(BIN)/python" -m helpers.course.workshop submit $${RUN}

pool: setup
	@test -n "$(IN)" || { echo 'usage: make pool IN="submission-*.json results/<run> ..." [OUT=results/pooled]'; exit 2; }
	"$(BIN)/python" -m helpers.course.workshop pool $(IN) --out $${OUT:-results/pooled}

# Tune your own model (chapter 13): make tune MODEL=path/to/model.py:build [BUDGET=300] [OUT=results/tune]
# FUNC() returns (model, inputs, targets, loss_fn[, make_optimizer]); see notebooks/examples/README.md.
tune: setup
	@test -n "$(MODEL)" || { echo "usage: make tune MODEL=path/to/model.py:FUNC [BUDGET=seconds] [OUT=folder] [STEPS=planned steps]"; exit 2; }
	"$(BIN)/python" -m helpers.tune --model "$(MODEL)" --budget $${BUDGET:-300} --planned-steps $${STEPS:-1000} --out $${OUT:-results/tune}

# Every course environment in the cache (this clone's, older pins', the IPEX and XPU ones): about 8 GB each.
clean-venv:
	@$(PYTHON) -m helpers.course.install environments --cache "$(CACHE)" --remove
