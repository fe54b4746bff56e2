# The course's single entry point.
#   make lab    -- install (once) and open the course in JupyterLab
#   make test   -- install (once) and run the whole test suite (unit tests + every notebook)
#   make setup  -- only install
#   make reproduce -- run every chapter's measurements headless into results/<timestamp>/report.md
#                     (COURSE_PROFILE=smoke|workshop|full; RESUME=latest continues an interrupted run)
#
# The virtual environment lives outside the clone, keyed by a hash of the pins, so a
# second clone or a CI run reuses it: $(VENV). Override with `make VENV=/path ...`.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PINS_HASH := $(shell cat pyproject.toml | sha256sum | cut -c1-12)
CACHE ?= $(HOME)/.cache/accelerate-course
VENV ?= $(CACHE)/venv-$(PINS_HASH)
BIN := $(VENV)/bin

.PHONY: setup lab test unit execute reproduce bench clean-venv

$(VENV)/.installed: pyproject.toml
	@echo "Creating the course environment in $(VENV) (about 4 minutes, 8 GB, first time only)"
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (found %s)" % sys.version.split()[0]'
	rm -rf "$(VENV)"
	$(PYTHON) -m venv "$(VENV)"
	"$(BIN)/python" -m pip install --quiet --upgrade pip
	"$(BIN)/python" -m pip install --quiet -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
	"$(BIN)/python" -c "import torch, torchvision, helpers"
	touch "$@"

# The editable install points at this clone; re-point it (seconds) in case the cached
# environment was made from another clone.
setup: $(VENV)/.installed
	@cd /tmp && "$(BIN)/python" -c 'import helpers, pathlib, sys; sys.exit(pathlib.Path(helpers.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())' "$(CURDIR)" 2>/dev/null \
		|| "$(BIN)/python" -m pip install --quiet --no-deps -e "$(CURDIR)" 2>&1 | { grep -v "^WARNING: Location" || true; }
	@"$(BIN)/python" -m pip check

lab: setup
	COURSE_PROFILE=$${COURSE_PROFILE_LAB:-workshop} "$(BIN)/jupyter" lab notebooks/

# Unit tests and every notebook (smoke profile, stand-in data) in one pytest run.
test: setup
	COURSE_PROFILE=smoke COURSE_DATA=standin TQDM_DISABLE=1 "$(BIN)/python" -m pytest tests notebooks \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider

unit: setup
	"$(BIN)/python" -m pytest tests -p no:cacheprovider

# Re-execute the notebooks in place at workshop size (how committed outputs are made).
execute: setup
	for nb in $${NB:-notebooks/*.ipynb}; do \
		COURSE_PROFILE=$${PROFILE:-workshop} TQDM_DISABLE=1 "$(BIN)/jupyter" nbconvert --to notebook --execute --inplace \
			--ExecutePreprocessor.timeout=3600 "$$nb" || exit 1; \
	done

reproduce: setup
	"$(BIN)/python" -m helpers.reproduce --profile $${COURSE_PROFILE:-workshop} $${RESUME:+--resume $$RESUME}

# The dlprimitives training-step benchmark at the published settings (see chapter 12).
bench: setup
	"$(BIN)/python" -m helpers.bench $${BENCH_ARGS:---models resnet18}

clean-venv:
	rm -rf "$(VENV)"
