# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test lint format bench migrate demo services clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.run-deps: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.test-deps: requirements.txt requirements-test.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@ $(VENV)/.run-deps

migrate: $(VENV)/.run-deps
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py load_demo

## run: the product on http://127.0.0.1:8000 (SQLite and embedded Redis unless configured)
## and one local worker agent (Docker engine → pool lab; else the process runtime → pool dev)
run: demo
	@bash .ci/ensure-services.sh --for-run || true  # Docker, registry, test image: best effort
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py runstack

## services: PostgreSQL, Redis, Docker engine, loopback registry, Chromium for the tests
services:
	bash .ci/ensure-services.sh

lint: $(VENV)/.test-deps
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

format: $(VENV)/.test-deps
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## test: lint, then the whole suite against the real services
test: $(VENV)/.test-deps services lint
	$(BIN)/python manage.py makemigrations --check --dry-run --settings=config.settings_test
	$(BIN)/pytest -n 2 -q

## bench: benchmarks (apart from tests), JSON on stdout
bench: $(VENV)/.test-deps services
	$(BIN)/python -m scheduling.bench.placement --quick
	for clients in 1 16 64; do \
		$(BIN)/python manage.py bench_leases --clients $$clients --seconds 10 --json || exit 1; \
	done

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis
