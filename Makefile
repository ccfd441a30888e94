# Entry points used by the README and by .ci/run. Each target installs what it needs into
# a local virtual environment on first use: .venv (pinned versions) and, for the suite under the
# newest Triton, .venv-latest.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# On the project's machines this takes the CPU build from local disk; on a GPU machine pass
# TORCH_SPEC=torch (or use your own environment with `pip install -e .`).
TORCH_SPEC  ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
RUFF_SPEC   ?= ruff==0.17.6
# the version on the GPU machine's image; .venv-latest takes the newest release
TRANSFORMERS_SPEC ?= transformers==5.17.0
# The second environment: the same torch, the newest Triton release (what users get with
# `pip install fusewise`). Unpinned on purpose; installed with --upgrade. A fresh clone (CI)
# always gets the newest; locally, `make clean-latest` picks up a newer release.
VENV_LATEST        ?= .venv-latest
PY_LATEST          := $(VENV_LATEST)/bin/python
TRITON_LATEST_SPEC ?= triton
PYTEST_ARGS        ?=
# the suite on this many pytest-xdist workers (0: in one process, as on the GPU machine)
PYTEST_WORKERS     ?= 2

LINT_PATHS := src tests benchmarks

.PHONY: demo test lint test-pinned test-latest bench env clean clean-latest

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	echo '*' > $(VENV)/.gitignore
	# numpy<2.4: the Triton 3.6 interpreter turns 1-element arrays into ints, which numpy 2.4 refuses
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)" "numpy<2.4" "$(RUFF_SPEC)" "$(TRANSFORMERS_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# torch first and pinned (an unpinned torch would pull a multi-GB CUDA build), then Triton
# upgraded to the newest release; the package's own install leaves both as they are. numpy keeps
# the pinned run's cap so that Triton is the one thing that differs (under Triton 3.9 the norm
# and AdamW tests also pass with numpy 2.4.6).
$(VENV_LATEST)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV_LATEST)
	echo '*' > $(VENV_LATEST)/.gitignore
	$(PY_LATEST) -m pip install -q "$(TORCH_SPEC)" "numpy<2.4"
	$(PY_LATEST) -m pip install -q --upgrade "$(TRITON_LATEST_SPEC)"
	$(PY_LATEST) -m pip install -q -e '.[test]'
	@$(PY_LATEST) -c "import torch, triton; print('$(VENV_LATEST): torch', torch.__version__, 'triton', triton.__version__)"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m fusewise demo

# The README's test command and CI's only step: lint, the suite with the pinned Triton, the
# suite with the newest Triton. All three run even when one fails; it fails if any failed.
test:
	@failed=""; \
	$(MAKE) --no-print-directory lint        || failed="$$failed lint"; \
	$(MAKE) --no-print-directory test-pinned || failed="$$failed test-pinned"; \
	$(MAKE) --no-print-directory test-latest || failed="$$failed test-latest"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: lint, test-pinned and test-latest passed"

# both checks run, and it fails if either failed
lint: $(VENV)/.installed
	@rc=0; \
	echo "$(VENV)/bin/ruff check $(LINT_PATHS)"; \
	$(VENV)/bin/ruff check $(LINT_PATHS) || rc=1; \
	echo "$(VENV)/bin/ruff format --check $(LINT_PATHS)"; \
	$(VENV)/bin/ruff format --check $(LINT_PATHS) || rc=1; \
	exit $$rc

test-pinned: $(VENV)/.installed
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS) tests

test-latest: $(VENV_LATEST)/.installed
	@$(PY_LATEST) -c "import torch, triton; print('$(VENV_LATEST): torch', torch.__version__, 'triton', triton.__version__)"
	$(PY_LATEST) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS) tests

env: $(VENV)/.installed
	$(PY) -m fusewise env

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_norms.py

clean-latest:
	rm -rf $(VENV_LATEST)

clean: clean-latest
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
