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

# A lock, pyproject.toml or setup.py newer than the venv's stamp (a `git pull`) installs again. Every package
# comes from the lock (--no-deps: pip resolves nothing, downloads nothing else); `pip check` proves the set
# complete. torch first, unless one is importable (a GPU machine keeps its own CUDA build).
$(VENV)/.installed-%: $(LOCKS)/%.txt $(TORCH) pyproject.toml setup.py | python-version
	@test ! -e $@ || echo "$(VENV) was installed before $? changed: installing $< again"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-deps "$(TORCH_PIN)"
	$(PY) -m pip install -q --no-deps --require-hashes -r $<
	$(PY) -m pip install -q --no-deps $(PROJECT)
	@$(PY) -m pip check >/dev/null || { $(PY) -m pip check; exit 1; }
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
# (`make lock UPGRADE=1`: the newest that do). pip-tools runs from its own venv, so it never changes .venv.
LOCK_VENV ?= .lock-venv
COMPILE = $(LOCK_VENV)/bin/pip-compile -q --generate-hashes --strip-extras --no-emit-index-url \
	--no-emit-find-links --unsafe-package torch -c $(TORCH) $(if $(UPGRADE),--upgrade) pyproject.toml
lock:
	@test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_VENV) \
		&& $(LOCK_VENV)/bin/pip install -q pip-tools==7.6.2; }
	$(COMPILE) -o $(LOCKS)/runtime.txt
	@test -e $(LOCKS)/dev.txt || cp $(LOCKS)/runtime.txt $(LOCKS)/dev.txt  # reuses its hashes: hashing is slow
	$(COMPILE) -c $(LOCKS)/runtime.txt --extra dev --extra bench -o $(LOCKS)/dev.txt

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
