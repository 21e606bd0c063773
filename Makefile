# Two commands do all the set-up: `make run` (the pipeline on the embedded corpus) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= artifacts
# Where `make install` takes lexiflow from: this checkout, editable (CI also installs a built wheel).
PROJECT ?= -e .

# Prefect's settings (private PREFECT_HOME, quiet, offline) are set by lexiflow itself, in one place:
# flows/prefect_env.py, applied by the CLI and by tests/conftest.py.

# The locks (docs/design.md, "Installing and locking"): runtime.txt for `make run`, dev.txt (runtime + the
# dev and bench extras) for `make test`; torch apart, in torch.txt.
LOCKS := requirements
TORCH := $(LOCKS)/torch.txt
TORCH_PIN := $(shell grep -m1 '^torch==' $(TORCH))
REQUIRES_PYTHON := $(shell sed -n 's/^requires-python = ">=\([0-9.]*\)"/\1/p' pyproject.toml)

.PHONY: install install-dev python-version lock chromium run test lint bench clean

install: $(VENV)/.installed-runtime
install-dev: $(VENV)/.installed-dev

# A lock, pyproject.toml or setup.py newer than the venv's stamp (a `git pull`) installs again. uv installs: it
# fetches and unpacks in parallel (the runtime lock: 15 s here, pip 155 s). uv itself comes from its own hashed
# lock, through pip. Every package comes from a lock (--no-deps: nothing resolved, nothing else fetched); `uv pip
# check` proves the set complete. torch first, through pip (pip's configuration finds the local CPU wheel, which uv
# would not read), unless one is importable (a GPU machine keeps its own CUDA build). No bytecode is compiled
# ahead: Python compiles what is imported, once (torch's and the locks' whole trees took 50 s more).
UV := $(VENV)/bin/uv
$(VENV)/.installed-%: $(LOCKS)/%.txt $(TORCH) pyproject.toml setup.py | $(UV)
	@test ! -e $@ || echo "$(VENV) was installed before $? changed: installing $< again"
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile --no-deps "$(TORCH_PIN)"
	$(UV) pip install -q --python $(PY) --no-deps --require-hashes -r $<
	$(UV) pip install -q --python $(PY) --no-deps $(PROJECT)
	@$(UV) pip check -q --python $(PY) || $(UV) pip check --python $(PY)
	@touch $@

$(UV): $(LOCKS)/uv.txt | python-version
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --no-deps --require-hashes -r $<
	@touch $@

# The venv's Python, or the one that would create it, against pyproject.toml's requires-python: one line, and
# nothing created, when it is too old.
INTERPRETER = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
TOO_OLD = error: lexiflow needs Python $(REQUIRES_PYTHON)+ and $(INTERPRETER) is %d.%d: \
	run make with PYTHON=python$(REQUIRES_PYTHON)$(if $(wildcard $(PY)), after rm -r $(VENV))
python-version:
	@$(INTERPRETER) -c "import sys; need = tuple(map(int, '$(REQUIRES_PYTHON)'.split('.'))); \
		sys.exit(0 if sys.version_info >= need else '$(TOO_OLD)' % sys.version_info[:2])"

# Resolves pyproject.toml's requirements again, keeping the locked versions that still satisfy them
# (`make lock UPGRADE=1`: the newest that do), for CPython $(REQUIRES_PYTHON) on Linux x86-64. Seconds: uv reads
# the hashes from the index. torch's own requirements are
# resolved from the CPU wheel in pip's wheel folder (TORCH_WHEELS), not PyPI's CUDA build (nvidia-*, triton).
TORCH_WHEELS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
COMPILE = $(UV) pip compile -q --generate-hashes --python-version $(REQUIRES_PYTHON) --python-platform x86_64-manylinux_2_28 \
	$(if $(UPGRADE),--upgrade)
lock: $(UV)
	@test -n "$(TORCH_WHEELS)" || { echo "error: make lock needs the CPU torch wheel's folder: \
		make lock TORCH_WHEELS=DIR (pip config get global.find-links names none)" >&2; exit 1; }
	$(COMPILE) $(LOCKS)/uv.in -o $(LOCKS)/uv.txt
	$(COMPILE) --find-links $(TORCH_WHEELS) --no-emit-package torch -c $(TORCH) pyproject.toml -o $(LOCKS)/runtime.txt
	@test -e $(LOCKS)/dev.txt || cp $(LOCKS)/runtime.txt $(LOCKS)/dev.txt
	$(COMPILE) --find-links $(TORCH_WHEELS) --no-emit-package torch -c $(TORCH) -c $(LOCKS)/runtime.txt \
		--extra dev --extra bench pyproject.toml -o $(LOCKS)/dev.txt

run: install
	$(VENV)/bin/lexiflow run --store $(STORE)

test: install-dev chromium
	$(PY) -m pytest -q

# The UI test renders Prefect's pages in headless Chromium: Debian's package, installed when missing
# (CI runs as root; elsewhere through sudo).
chromium:
	@test -x /usr/bin/chromium || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

lint: install-dev
	$(VENV)/bin/ruff check .

bench: install-dev
	$(PY) -m benchmarks all

clean:
	rm -rf $(STORE) .prefect
