# Two commands from a fresh clone (README, "Quick start"); no data folder and no hub needed:
#   make smoke   set up the environment and run the smoke study
#   make test    set up the environment with the test tools and run the unit tests
# The environment: the active virtual environment if there is one, else .venv, created here (seeing the
# interpreter's own packages when that has a torch: a conda or system CUDA build). torch is installed
# only when none is importable, so a CUDA build is kept.

VENV ?= $(or $(VIRTUAL_ENV),.venv)
PYTHON ?= python3
TORCH ?= torch==2.13.0
SMOKE_ARGS ?=  # e.g. --new: another record of a study that already has one (else: report or resume it)
PY := $(VENV)/bin/python

.PHONY: smoke test

smoke: $(VENV)/.clsr-smoke
	$(VENV)/bin/platform study run studies/smoke.yaml $(SMOKE_ARGS)

test: $(VENV)/.clsr-dev
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider --durations=10 -n 2 -m "not e2e" tests

$(PY):
	$(PYTHON) -m venv $$($(PYTHON) -c "import torch" 2>/dev/null && echo --system-site-packages) $(VENV)

# a stamp per set-up, redone when pyproject.toml changes
$(VENV)/.clsr-smoke: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e ".[offline-model]"
	touch $@

$(VENV)/.clsr-dev: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e ".[dev]"
	touch $@ $(VENV)/.clsr-smoke
