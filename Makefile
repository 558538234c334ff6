# Entry points: `make test` (lint, types, tests) and `make demo`. Everything runs from a
# local virtualenv that the first target creates.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEPS   := constraints.txt requirements-dev.txt shared/pyproject.toml edge/pyproject.toml server/pyproject.toml

.PHONY: install lint typecheck pytest test test-fast demo bench bench-quick reliability firmware clean

$(STAMP): $(DEPS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt \
		-e shared -e edge -e 'server[chirpstack,parquet]' -r requirements-dev.txt
	# The checkout's root on the venv's path: bench/ and tools/ import tools.testbed
	# without editing sys.path.
	$(BIN)/python -c 'import site, sys; open(site.getsitepackages()[0] + "/zeal-checkout.pth", "w").write(sys.argv[1] + "\n")' "$(CURDIR)"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy

# Most tests two at a time (they mostly wait on brokers, servers and clocks); those marked
# serial (they stop the shared PostgreSQL or time themselves against the machine) alone after.
pytest: install
	$(BIN)/pytest -n 2 --dist loadgroup -m "not serial"
	$(BIN)/pytest -m serial

test: lint typecheck pytest

# The quick loop while editing: no broker, browser, compiler or outside tool, nothing slow
# or serial (the rest runs in make test).
test-fast: install
	$(BIN)/pytest -n 2 -q -m "not slow and not integration and not serial"

demo: install
	$(BIN)/python tools/demo.py

firmware:  # the C library's host tool: edge/firmware/build/zeal-host (docs/firmware.md)
	$(MAKE) -C edge/firmware

bench: install
	$(BIN)/python bench/core_throughput.py
	$(BIN)/python -m zeal_edge.bench
	$(BIN)/python bench/simulate_throughput.py
	$(BIN)/python bench/store_compression.py
	$(BIN)/python bench/comparison.py   # group comparisons on simulated fleets: bench/COMPARISON.md
	$(BIN)/python bench/validity.py     # every /compare method on 32 fleets, about 12 minutes: bench/VALIDITY.md
	$(BIN)/python bench/bayes.py        # Bayes estimates for small windows: bench/BAYES.md
	$(BIN)/python bench/distribution.py --server  # quantiles from codes, about 15 minutes: bench/DISTRIBUTION.md
	$(BIN)/python bench/store_footprint.py --out bench/footprint.json --markdown bench/STORE_FOOTPRINT.md  # bytes on disk, all in
	$(BIN)/python bench/group_latency.py --baseline d89e174 --out bench/group_latency.json --markdown bench/GROUP_LATENCY.md  # against the store with per-device aggregates
	$(BIN)/python bench/lorawan.py      # bytes on the air and airtime against CayenneLPP: bench/LORAWAN.md
	$(BIN)/python bench/report.py   # baselines side by side: writes bench/REPORT.md (+ server speed)
	$(BIN)/python bench/message_cost.py --out bench/message_cost.json  # collector vs a bare subscriber
	$(BIN)/python bench/writer_cost.py --baseline be2b583 --out bench/writer_cost.json  # the writer fed directly, against a row per batch

reliability: install   # the timed parts of docs/reliability.md (not in make test)
	$(BIN)/python bench/flood.py --out bench/flood.json             # about 3 minutes
	$(BIN)/python bench/reliability.py --out bench/reliability.json # 10 minutes
	$(BIN)/python bench/hostile.py --out bench/hostile.json         # about 2 minutes
	$(BIN)/python bench/cluster_throughput.py --out bench/cluster.json  # NATS cluster, 1 and 2 collectors
	$(BIN)/python bench/slow_clients.py --out bench/slow_clients.json   # about 3 minutes
	$(BIN)/python bench/heavy_reads.py --out bench/heavy_reads.json     # about 7 minutes
	$(BIN)/python bench/broker_limits.py --out bench/broker_limits.json # about 2 minutes; exits 1: retained

bench-quick: install
	$(BIN)/python bench/report.py --quick --out $(or $(OUT),bench-quick)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
