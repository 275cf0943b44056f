# Every workflow is a target; README commands call these.
# `make test` is cold-start safe: it creates .venv and the test fixtures start
# PostgreSQL, Kafka, Jaeger and Prometheus (see tests/conftest.py) when none is configured.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEED ?= 18
PYTEST_ARGS ?=

.PHONY: setup stack-up stack-down stack-status test check test-unit test-integration test-monitoring \
        test-sim-worker sim-worker sim-mutants evidence-sweep evidence lint bench bench-store bench-sink bench-profile \
        demo migrate clean crash-matrix docs test-kafka-faults test-handler-blame bench-blame sink-churn \
        sink-routing sink-evolve test-bench test-protocols test-cdc bench-cdc bench-latency bench-lanes

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(STAMP)

stack-up: setup
	$(BIN)/fencectl stack up

stack-down: setup
	$(BIN)/fencectl stack down

stack-status: setup
	$(BIN)/fencectl stack status

# two pytest-xdist workers, a module's tests in one of them, the modules in the order
# tests/conftest.py gives them (not xdist's largest-first); an `exclusive` test runs alone
# (tests/suite_lock.py)
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
test: setup
	$(BIN)/pytest -q $(XDIST) $(PYTEST_ARGS)

# the quick tier for the edit loop: every test but the long scenarios (`slow`: kills,
# rebalances, session timeouts, the three-node cluster, the bench, the doc pages)
check: setup
	$(BIN)/pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest -q tests/unit tests/sim tests/bench tests/docs $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/pytest -q tests/integration $(PYTEST_ARGS)

# make bench's quick mode whole (make test runs it without the scaling, latency and peer
# sections, which take minutes even at quick sizes)
test-bench: setup
	FENCE_BENCH_SMOKE=full $(BIN)/pytest -q tests/integration/test_bench_smoke.py $(PYTEST_ARGS)

# the alert rules (promtool check and test), the dashboard's and rules' metric names against a
# running worker, the stall alert firing and resolving in the local stack's Prometheus
test-monitoring: setup
	$(BIN)/pytest -q tests/monitoring $(PYTEST_ARGS)

# handler blame under process deaths: the killers/poison/flaky scenario 5 times under each
# group protocol and the outcome-uncertain one 5 times (make test runs each once); each
# run's counts go to artifacts/handler-blame/*.jsonl
BLAME_RUNS ?= 5
test-handler-blame: setup
	FENCE_BLAME_RUNS=$(BLAME_RUNS) $(BIN)/pytest -q tests/integration/test_handler_blame.py $(PYTEST_ARGS)

# every protocol-parametrized test under all three group protocols (make test runs one
# protocol of each, rotating over the tests: tests/protocol_rotation.py)
test-protocols: setup
	FENCE_ALL_PROTOCOLS=full $(BIN)/pytest -q -m protocols tests/integration $(PYTEST_ARGS)

test-sim-worker: setup
	$(BIN)/pytest -q tests/sim tests/unit/consumer/test_lifecycle*.py tests/unit/consumer/test_decisions.py tests/unit/fencing/test_memstore*.py $(PYTEST_ARGS)

# the table sink's churn scenario (upsert, bigint key, tombstones; kills, lost COMMIT
# replies) for JSON and Avro under all three group protocols, FENCE_SINK_CHURN_REPEAT times
# each (default 5; make test runs one protocol per format)
sink-churn: setup
	FENCE_SINK_CHURN=full $(BIN)/pytest -q tests/integration/test_sink_rebalance.py \
	  -k upsert_sink $(PYTEST_ARGS)

# replication through a real Debezium (Kafka Connect and Debezium's PostgreSQL connector
# beside the stack: fencectl stack up --with debezium): the source table equals the target
# after kills, a zombie, lost COMMIT replies and a Connect restart, under every group
# protocol (make test runs one)
test-cdc: setup
	FENCE_ALL_PROTOCOLS=full $(BIN)/pytest -q tests/integration/test_cdc.py \
	  tests/integration/test_sink_debezium.py $(PYTEST_ARGS)

# routing (--sink table='{topic}') under a kill, a join and lost COMMITs: every group
# protocol, FENCE_SINK_ROUTING_REPEAT times each (default 5)
sink-routing: setup
	FENCE_SINK_ROUTING=full $(BIN)/pytest -q tests/integration/test_sink_routing.py \
	  -k pattern_routed $(PYTEST_ARGS)

# schema evolution (--sink-evolve add-columns; the count without it): every group-involved
# test under every group protocol, FENCE_SINK_EVOLUTION_REPEAT times each (default 5)
sink-evolve: setup
	FENCE_SINK_EVOLUTION=full FENCE_ALL_PROTOCOLS=full $(BIN)/pytest -q \
	  tests/integration/test_sink_evolve.py $(PYTEST_ARGS)

# the crash-point matrix by family: every family x its points x every group protocol (make
# test runs the reference family's points under one protocol each and one cell of every other
# family); prints the table, writes artifacts/crash-matrix/full.json, keeps failed cells' logs;
# once every cell passed, publishes the JSON to docs/bench/ and regenerates its tables (the
# matrix in docs/crash-matrix.md, the recovery summary in docs/benchmarks.md)
crash-matrix: setup
	FENCE_CRASH_MATRIX=full FENCE_CRASH_MATRIX_ARGS='$(PYTEST_ARGS)' $(BIN)/pytest -q \
	  tests/integration/test_crash_matrix.py $(PYTEST_ARGS)
	cp artifacts/crash-matrix/full.json docs/bench/crash-matrix.json
	$(BIN)/python -m ops.bench.tables --page docs/crash-matrix.md --page docs/benchmarks.md

# Kafka faults on the three-node cluster (started for these tests, stopped after): every fault
# scenario x group protocol, static membership, librdkafka's failover behaviour pinned, the
# crash matrix's three-node column, start-up while PostgreSQL is down. Outcomes append to
# artifacts/kafka-faults/results.jsonl; `$(BIN)/python -m tests.faults.report` prints the
# table (`--docs docs/kafka-failures.md` writes it into the page). make test runs a subset.
test-kafka-faults: setup
	FENCE_KAFKA_FAULTS=full $(BIN)/pytest -q tests/integration/test_kafka_faults.py \
	  tests/integration/test_static_membership.py tests/integration/test_kafka_facts_failover.py \
	  tests/integration/test_startup_outage.py \
	  tests/integration/test_crash_matrix.py::test_crash_point_cell_on_three_nodes \
	  tests/integration/test_quarantine_relay.py::test_follow_relays_through_a_restart_of_the_partition_leader \
	  $(PYTEST_ARGS)

sim-worker: setup
	mkdir -p artifacts
	$(BIN)/fencectl sim-worker --seed $(SEED) --out artifacts/worker-seed-$(SEED).json \
	  --report artifacts/worker-seed-$(SEED)-report.json > /dev/null; \
	  rc=$$?; echo "status: $$($(BIN)/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' artifacts/worker-seed-$(SEED)-report.json) (exit $$rc)"; exit $$rc

# each named rule mutation against the corpus and the sweep 1..$(MUTANT_SEEDS) (2 processes)
MUTANT_SEEDS ?= 1000
sim-mutants: setup
	mkdir -p artifacts/sim
	$(BIN)/python -m ops.sim.mutants --last $(MUTANT_SEEDS) --processes 2 --out artifacts/sim/mutants.json

# the randomized evidence at scale: seeds 1..EVIDENCE_SEEDS x both classes, 2 processes,
# summary + provenance in artifacts/evidence/worker-sweep.json (exit 0 only with no unexpected run)
EVIDENCE_SEEDS ?= 100000
evidence-sweep: setup
	mkdir -p artifacts/evidence
	$(BIN)/fencectl sim-worker --sweep 1..$(EVIDENCE_SEEDS) --jobs 2 \
	  --manifest artifacts/evidence/worker-sweep.json > /dev/null; rc=$$?; \
	  $(BIN)/python -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["runs"], "runs", d["statuses"], "violations", d["violations"], "unexpected", d["unexpected"], d["elapsed_s"], "s", d["seeds_per_s"], "seeds/s")' artifacts/evidence/worker-sweep.json; exit $$rc

# the simulator's evidence, no services needed: its tests (every mutant killed at its pinned
# first killing seed included) as JUnit XML, the corpus manifest, seed $(SEED)'s trace and
# report, all in artifacts/evidence/ (CI runs it after make test: .ci/run)
evidence: setup
	mkdir -p artifacts/evidence
	$(BIN)/pytest -q tests/sim --junitxml=artifacts/evidence/sim-tests.xml $(PYTEST_ARGS)
	$(BIN)/fencectl sim-worker --corpus --manifest artifacts/evidence/worker-corpus.json > /dev/null
	$(MAKE) --no-print-directory sim-worker SEED=$(SEED)
	cp artifacts/worker-seed-$(SEED).json artifacts/worker-seed-$(SEED)-report.json artifacts/evidence/

# the docs site from docs/*.md (docs/mkdocs/mkdocs.yml), strict: a broken link, anchor or
# missing page fails; the site goes to artifacts/site/. make test builds it too (tests/docs/).
# Not --quiet: mkdocs 1.6 then drops the warnings before --strict counts them (exit 0).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f docs/mkdocs/mkdocs.yml

lint: setup
	$(BIN)/ruff check consumer fencing ops tests
	$(BIN)/mypy

# fenced vs unfenced batch commits (uses FENCE_DSN, else starts the stack's PostgreSQL)
bench-store: setup
	$(BIN)/python -m ops.bench.store

# what blaming the right record costs: draining suspect windows after an unclean handover
# (alone, side by side, clean) and the intent of an outcome-uncertain batch
# -> artifacts/bench/blame.json (uses FENCE_DSN, else starts the stack's PostgreSQL)
bench-blame: setup
	$(BIN)/python -m ops.bench.blame

# worker benchmark: baselines a/b/b'/e, fenceworker c/d, the table sink, one process per core
# (--processes 1..cores), latency at 25/50/90% of the capacity, the peer (Quix Streams, from
# its own .venv-peer) and scale -> artifacts/bench/worker.json and PNG charts next to it;
# BENCH_ARGS=--quick for small sizes (the smoke test's mode)
BENCH_ARGS ?=
bench: stack-up
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m ops.bench.peer --ensure-venv
	eval "$$($(BIN)/fencectl stack env)" && \
		FENCE_BENCH_COMMAND='make bench$(if $(BENCH_ARGS), BENCH_ARGS="$(BENCH_ARGS)")' \
		$(BIN)/python -m ops.bench.worker $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-cdc
	$(MAKE) --no-print-directory bench-lanes

# key-ordered lanes: a handler that waits 20 ms per call, --lanes 1/4/16/64 on 1 and 6
# partitions against the ideal -> artifacts/bench/lanes.json; BENCH_ARGS=--quick as above
bench-lanes: stack-up
	eval "$$($(BIN)/fencectl stack env)" && $(BIN)/python -m ops.bench.lanes $(BENCH_ARGS)

# the latency section alone, with the two capacity runs whose shares it offers
# -> artifacts/bench/worker_latency.json (its "latency" replaces that of
# docs/bench/worker-quiet.json, with its own provenance); BENCH_ARGS=--quick as above
bench-latency: stack-up
	$(BIN)/pip install -q -e '.[bench]'
	eval "$$($(BIN)/fencectl stack env)" && \
		FENCE_BENCH_COMMAND='make bench-latency$(if $(BENCH_ARGS), BENCH_ARGS="$(BENCH_ARGS)")' \
		$(BIN)/python -m ops.bench.worker --only c_fenceworker,c_sink_fenceworker --no-scale \
		--extra latency --out artifacts/bench/worker_latency.json $(BENCH_ARGS)

# change events into the sink beside the plain sink, the version guard's cost, and the lag
# through a real Debezium (Kafka Connect started: stack up --with debezium)
# -> artifacts/bench/cdc.json; CDC_ARGS=--quick for small sizes
CDC_ARGS ?=
bench-cdc: stack-up
	$(BIN)/fencectl stack up --with debezium
	eval "$$($(BIN)/fencectl stack env)" && \
		FENCE_BENCH_COMMAND='make bench-cdc$(if $(CDC_ARGS), CDC_ARGS="$(CDC_ARGS)")' \
		$(BIN)/python -m ops.bench.cdc $(CDC_ARGS)

# the table sink alone: its write methods per batch (printed), then its b/b'/e/c runs (same
# clock and registry as make bench) -> artifacts/bench/worker_sink.json and its chart
bench-sink: stack-up
	$(BIN)/pip install -q -e '.[bench]'
	eval "$$($(BIN)/fencectl stack env)" && $(BIN)/python -m ops.bench.sink && \
		$(BIN)/python -m ops.bench.worker --sink-only $(BENCH_ARGS)

# the README's `make demo`: stack, migrate, topic, produce, two workers, one leaves, status, traces
demo: stack-up
	eval "$$($(BIN)/fencectl stack env)" && $(BIN)/python -m ops.demo

# the worker at full speed under py-spy (all threads): top functions -> artifacts/bench/profile.json,
# the same sampling only the thread holding the GIL -> artifacts/bench/profile_gil.json,
# then the table sink's run -> artifacts/bench/profile_sink.json
bench-profile: stack-up
	$(BIN)/pip install -q -e '.[bench]'
	eval "$$($(BIN)/fencectl stack env)" && $(BIN)/python -m ops.bench.profile $(BENCH_ARGS) && \
		$(BIN)/python -m ops.bench.profile --gil $(BENCH_ARGS) && \
		$(BIN)/python -m ops.bench.profile --sink $(BENCH_ARGS)

# apply the fence schema migrations to FENCE_DSN (FENCE_SCHEMA, default fence)
migrate: setup
	$(BIN)/fencectl migrate

clean:
	rm -rf $(VENV) .venv-peer .pytest_cache .mypy_cache .ruff_cache
