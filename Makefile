# The two commands of the README: `make run` serves the dashboard, `make test` runs the quick tests
# (`make test-all` runs the whole suite, as CI does).
# Both create .venv on first use and reinstall when requirements.txt, requirements-dev.txt or
# pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PORT   ?= 8501
ADDRESS ?= 127.0.0.1
STAMP  := $(VENV)/.installed
BIN    := $(VENV)/bin

# Use the shared data folder of a development checkout when none is configured.
ENGINE_DATA_DIR ?= $(firstword $(wildcard $(abspath ../shared/datasets)))
export ENGINE_DATA_DIR

.PHONY: setup run test test-all bench bundle lint clean

setup: $(STAMP)

# Development installs both sets (requirements-dev.txt includes requirements.txt; the image
# installs only the runtime one) and the checkout itself in editable mode, for the
# `malleability` command. Reinstalls when any of the three files changes.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

run: setup
	$(BIN)/streamlit run app.py --server.port $(PORT) --server.address $(ADDRESS) \
		--server.headless true --browser.gatherUsageStats false

# Tests run in parallel workers, one per core (at most 4), a test file per worker at a time (its
# module fixtures, a Ray head or a server, start once); each worker's torch gets its share of the
# cores. PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= auto
PYTEST_PAR := -n $(PYTEST_WORKERS) --dist loadfile

# The quick suite: every test not marked slow (about 3 minutes on 2 cores).
test: setup
	$(BIN)/python -m pytest $(PYTEST_PAR) -m "not slow"

# Everything: adds memory peaks, AppTest on MNIST, the Ray grid and the browser (CI runs this).
test-all: setup
	$(BIN)/python -m pytest $(PYTEST_PAR) --durations=30

# The shipped bundle of default results (bundle/): every page opened at its defaults, what it
# runs kept, so each opens on its chart. Run after any edit under engine/ (the bundle is refused
# until then).
bundle: setup
	$(BIN)/python -m ui.bundle --out bundle

bench: setup
	$(BIN)/python -m engine bench --quick

# The static checks CI runs before the tests (and .pre-commit-config.yaml runs on commit): the
# Dockerfile, ruff over the tree, mypy over the layers pyproject.toml names.
lint: setup
	$(BIN)/hadolint Dockerfile
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache
