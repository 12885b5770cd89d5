# The two commands a newcomer needs: `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
# optional extras (scripts/install.sh --help), e.g. EXTRAS=fsdp: fairscale for --ddp-backend fully_sharded
EXTRAS ?=
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: install demo test test-slow test-all clean help

help:
	@echo "make demo   - set up, then train Post-LN / Pre-LN / DeepNet (paper and source init) at equal depth on an embedded task"
	@echo "make test   - set up, then run the test suite without the tests marked slow (about 4 minutes on 2 cores)"
	@echo "make test-slow - only the tests marked slow: multi-process, fault-injection, inductor and full-pipeline runs (OPUS-100, WMT-17, two nodes, kill -9, the demo, ...); CI runs them after make test"
	@echo "make test-all - both"
	@echo "make install - set up $(VENV) only (idempotent)"

install:
	@VENV=$(VENV) EXTRAS="$(EXTRAS)" bash scripts/install.sh

demo: install
	$(PY) -m deepnet_experiments.demo $(DEMO_ARGS)

# pytest-xdist workers given whole test modules, the longest first (tests/conftest.py); one worker more
# than cores, so that a worker waiting on a subprocess's start leaves its core to the others. Cores as
# nproc counts them without OMP_NUM_THREADS, which nproc would obey (CI sets it to 1).
PARALLEL := -n $(shell echo $$(( $$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1) + 1 ))) --dist loadfile --no-loadscope-reorder

test: install
	$(PY) -m pytest -q $(PARALLEL) -m "not slow" tests $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q $(PARALLEL) -m slow tests $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest -q $(PARALLEL) tests $(PYTEST_ARGS)

clean:
	rm -rf demo_out .pytest_cache
