# Two commands do all the set-up: `make run` (the pipeline on the embedded corpus) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= artifacts

# Prefect's settings (private PREFECT_HOME, quiet, offline) are set by lexiflow itself, in one place:
# flows/prefect_env.py, applied by the CLI and by tests/conftest.py.

.PHONY: install chromium run test lint bench clean

install: $(VENV)/.installed

# torch first: the CPU wheel (or a GPU machine's own CUDA build) must already satisfy
# the project's torch requirement, or pip pulls several GB of CUDA packages.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,bench]"
	@touch $@

run: install
	$(VENV)/bin/lexiflow run --store $(STORE)

test: install chromium
	$(PY) -m pytest -q

# The UI test renders Prefect's pages in headless Chromium: Debian's package, installed when missing
# (CI runs as root; elsewhere through sudo).
chromium:
	@test -x /usr/bin/chromium || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) -m benchmarks all

clean:
	rm -rf $(STORE) .prefect
