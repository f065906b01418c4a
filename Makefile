# The two set-up commands of the README. Both create .venv when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tag_tf_installed
PYTEST_ARGS ?=

.PHONY: test demo venv clean bench

$(STAMP): setup.py pyproject.toml $(wildcard kernels/*.cpp kernels/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip==25.3"
	# torch first, pinned: an unpinned torch would pull GBs of CUDA packages.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q $(PYTEST_ARGS) tests

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/tag-tf demo --out demo_out

# The paper's evaluation, simulated (see benchmarks/paper.py); not a set-up command.
bench: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m benchmarks run all

clean:
	rm -rf $(VENV) build *.egg-info tag_tf/*.so
