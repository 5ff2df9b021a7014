# The two set-up commands (README): `make demo` runs the main job, `make test` passes the tests.
# Each installs into .venv on first use, so a fresh clone needs nothing else.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/dagster_home
export SDL_VIDEODRIVER ?= dummy

.PHONY: install demo test test-fast lint format ui clean-state

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first, pinned to the CPU wheel: left to the resolver, pip would fetch a CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/aiinfra demo

# --durations: every CI log names the slowest tests (the suite's time budget is 25 min).
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q --durations=30

# Skips the slow end-to-end tests (CI runs everything).
test-fast: install
	$(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

ui: install
	$(BIN)/dagster dev -w workspace.yaml

# Wipe local runtime state (runs, lake, keys) but keep dagster.yaml.
clean-state:
	find dagster_home -mindepth 1 -not -name dagster.yaml -not -name README.md -delete
