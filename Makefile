# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test lint format bench fuzz keyring migrate demo services clean gpu-check drill

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# `-e .`: the poolctl console script (pyproject.toml), editable so it runs this tree's code
$(VENV)/.run-deps: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt -e .
	touch $@

$(VENV)/.test-deps: requirements.txt requirements-test.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-test.txt -e .
	touch $@ $(VENV)/.run-deps

# the key ring of values encrypted at rest: var/encryption-keys (0600), once, when ENCRYPTION_KEYS
# is not set (README, Configuration)
keyring: $(VENV)/.run-deps
	$(BIN)/python manage.py encryption_key --init-file

migrate: keyring
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py load_demo

## run: the product on http://127.0.0.1:8000 (SQLite and embedded Redis unless configured)
## and one local worker agent (Docker engine → pool lab; else the process runtime → pool dev)
run: demo
	@bash .ci/ensure-services.sh --for-run || true  # Docker, registry, test image: best effort
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py runstack

## gpu-check: on a GPU machine (NVIDIA driver; no Docker or CUDA toolkit needed; MIG left as
## it is): records the NVML inventory as a test fixture, starts a throwaway control plane (SQLite,
## embedded Redis, loopback) and a real agent (process runtime) that enrolls in a marketplace
## pool and answers the GPU challenge over HTTP; prints one JSON verdict (< 6 minutes)
gpu-check: $(VENV)/.run-deps
	timeout --foreground -k 10 345 $(BIN)/python deploy/gpu_check.py

## services: PostgreSQL, Redis, Docker engine, loopback registry, Chromium for the tests
services:
	bash .ci/ensure-services.sh

# no repeated block of six or more lines in the ledger, gang and knob code
DUPLICATE_CHECKED := leases scheduling/pass_steps pools/knobs.py pools/validation.py

lint: $(VENV)/.test-deps
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 \
		--ignore=migrations --score=n $(DUPLICATE_CHECKED)

format: $(VENV)/.test-deps
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## test: lint, then the whole suite against the real services. Three workers on two cores: about
## half the suite waits on servers, agents and containers it started (on a 2-core machine: 17 min
## with two; 13 with four, where the timing-bound tests began to feel the contention)
test: $(VENV)/.test-deps services lint
	$(BIN)/python manage.py makemigrations --check --dry-run --settings=config.settings_test
	$(BIN)/pytest -n 3 -q

## bench: benchmarks (apart from tests), JSON on stdout. The last, submit → running through a
## whole throwaway stack (issue 20), sends 240 jobs at 120/min: it adds about 2.5 minutes
## (LATENCY_RATE, LATENCY_JOBS change it; docs/benchmarks.md)
bench: $(VENV)/.test-deps services
	$(BIN)/python -m scheduling.bench.placement --quick
	for clients in 1 16 64; do \
		LEASE_THROTTLE_RATE=$${LEASE_THROTTLE_RATE:-100000000/minute} \
		TOKEN_THROTTLE_RATE=$${TOKEN_THROTTLE_RATE:-100000000/minute} \
		$(BIN)/python manage.py bench_leases --clients $$clients --seconds 10 --json || exit 1; \
	done
	$(BIN)/python manage.py bench_scheduler --nodes 5000 --jobs 20000 --json
	$(BIN)/python manage.py bench_sweeps --nodes 10000 --jobs 7000 --json
	$(BIN)/python manage.py bench_latency --rate $${LATENCY_RATE:-120} --jobs $${LATENCY_JOBS:-240} --json

## drill: the product as a fleet on this machine — its own PostgreSQL and Redis, two TLS web
## processes behind one balancer, two Celery workers, one beat, three agents in network
## namespaces — broken while it works (every fault of config/drill/faults.py); ONE JSON object,
## exit status 1 when a count that must be zero is not (root and Docker; about 6 minutes)
drill: $(VENV)/.run-deps services
	$(BIN)/python manage.py drill --json

## fuzz: schemathesis against a live server, every operation with each role's token
## (a throwaway database; docs/api.md, Fuzzing). FUZZ_EXAMPLES cases per operation.
FUZZ_EXAMPLES ?= 25
fuzz: $(VENV)/.test-deps services
	$(BIN)/python manage.py fuzz_api --examples $(FUZZ_EXAMPLES)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis
