# Every workflow is a target; README commands call these.
# `make test` is cold-start safe: it creates .venv and the test fixtures start
# PostgreSQL, Kafka and Jaeger (see tests/conftest.py) when none is configured.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEED ?= 17
PYTEST_ARGS ?=

.PHONY: setup stack-up stack-down stack-status test test-unit test-integration \
        test-sim-worker sim-worker evidence lint bench bench-store demo migrate clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

stack-up: setup
	$(BIN)/fencectl stack up

stack-down: setup
	$(BIN)/fencectl stack down

stack-status: setup
	$(BIN)/fencectl stack status

test: setup
	$(BIN)/pytest -q $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest -q tests/unit tests/sim $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/pytest -q tests/integration $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check consumer fencing ops tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
