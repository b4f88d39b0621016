# Everything a fresh machine needs: `make demo` and `make test` create the virtual
# environment, install the pinned dependencies (constraints.txt) and run. The optional
# extras (plot: matplotlib, tensorboard, export, serve, import, ray) are installed too, so their
# tests run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast test-ray test-avx2 test-torch-range lint demo clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0 -c constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,plot,tensorboard,export,serve,import,ray]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check nmt_cli tests bench
	$(BIN)/ruff format --check nmt_cli tests bench
	$(BIN)/mypy

# The tests run in one worker process a core (pytest-xdist), each test file in one worker so
# that a file's shared fixtures are made once; what several files share (trained models) is
# made once for all workers (tests/fixtures/files.py: built_once). PYTEST_WORKERS=0 runs
# everything in this process.
PYTEST_WORKERS ?= auto
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile
# Python's bytecode caches on whatever the environment says (PYTHONDONTWRITEBYTECODE): the
# suite starts hundreds of Python processes (the commands it tests, their workers), and
# without the caches each one compiles every module it imports again; nmt_cli, installed
# in place, has none precompiled. A cold run took 327-357 s of pytest without, 274 s with.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

# Every test; the 15 slowest named at the end, so that a test that grew slow is seen.
test: lint
	$(PYTEST) tests $(PARALLEL) --durations=15

# `nmt translate --ray` on local two-node Ray clusters alone (make test runs them too).
test-ray: $(STAMP)
	$(PYTEST) tests/integration/test_translate_ray.py

# The quick loop while working: every test but the long end-to-end ones (marked slow:
# trainings, servers, clusters, subprocess start-ups), in under 2 minutes on 2 cores.
test-fast: $(STAMP)
	$(PYTEST) tests $(PARALLEL) -m "not slow"

# The whole suite as an AVX2-only CPU runs it (no AVX-512 kernels, no bf16 units; oneDNN,
# ATen and MKL capped too), on any machine: see nmt_cli/cpu_level.py.
test-avx2: $(STAMP)
	NMT_CPU_LEVEL=avx2 $(PYTEST) tests $(PARALLEL)

# The tests of every stage under the floor, 2.11 and newest torch, each in its own
# virtual environment cached outside the checkout (.ci/torch_range says which).
test-torch-range:
	.ci/torch_range

demo: $(STAMP)
	$(BIN)/nmt run recipes/demo.toml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
