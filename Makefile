# Entry points used by the README and by .ci/run. Each target installs what it needs into
# a local virtual environment (.venv) on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# On the project's machines this takes the CPU build from local disk; on a GPU machine pass
# TORCH_SPEC=torch (or use your own environment with `pip install -e .`).
TORCH_SPEC  ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0

.PHONY: demo test bench env clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# numpy<2.4: the Triton 3.6 interpreter turns 1-element arrays into ints, which numpy 2.4 refuses
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)" "numpy<2.4"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m fusewise demo

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

env: $(VENV)/.installed
	$(PY) -m fusewise env

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_norms.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
