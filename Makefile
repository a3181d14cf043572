# Two commands set everything up on a fresh machine:  `make dev`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# uv installs exactly the versions in uv.lock (docs/deploy.md, "Locked installs"). It
# lives in a venv of its own so that syncing .venv never touches the tool doing it.
UV_VERSION := 0.13.9
TOOLS  := .tools
UV     := $(TOOLS)/bin/uv
# The machine's Python, never one uv would download.
export UV_PYTHON_DOWNLOADS := never

.PHONY: dev test test-fast test-tools lint bench install lock image schema

# `make dev PORT=8001` when 8000 is taken.
PORT ?= 8000

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# Every extra (runtime, gcs, client, dev, test, profile): the development venv. The
# venv is made by Python's own venv module, so it keeps pip for ad-hoc installs. Its
# modules are compiled once here: otherwise the first processes of a test run (several
# workers, each starting servers) each compile them again, two minutes of CPU.
$(BIN)/ductor-streams: pyproject.toml uv.lock | $(UV)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV) sync --locked --all-extras --compile-bytecode
	touch $@

install: $(BIN)/ductor-streams

# After changing dependencies in pyproject.toml: re-resolve, then commit uv.lock.
# `make lock LOCK_ARGS=--upgrade` moves every pin to the newest release allowed.
lock: $(UV)
	$(UV) lock $(LOCK_ARGS)

# The runtime image (deploy/README.md): a Debian base made here, wheels from uv.lock.
image: $(UV)
	UV=$(UV) deploy/build-image.sh

dev: install
	$(BIN)/ductor-streams dev --port $(PORT)

lint: install
	$(BIN)/ruff check ductor_streams tests bench examples
	$(BIN)/ruff format --check ductor_streams tests bench examples
	$(BIN)/mypy ductor_streams bench
	$(BIN)/lint-imports --no-cache

# The machine's tools the tests drive (browsers, nginx, podman, node): installed from
# Debian's packages when missing, or listed and refused (scripts/test-tools).
test-tools:
	scripts/test-tools

# The whole suite on every core (pytest-xdist); a file's tests run on one worker, in
# order (module fixtures such as a private cluster carry state from test to test).
# With DUCTOR_STREAMS_TEST_DATABASE_URL, one worker per core, each with its own copy of
# one migrated database on that server (whose connections they share). Without it each
# worker starts an embedded Postgres of its own, and there is one worker more than cores:
# a third of the suite's time is spent waiting on processes it started.
# `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= $(if $(DUCTOR_STREAMS_TEST_DATABASE_URL),auto,$(shell echo $$(( $$(nproc) + 1 ))))
test: lint test-tools
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The inner loop: the `fast` tier only (tests/support/tiers.py), which starts no process
# but the tests' Postgres; prints how many of all the tests it ran.
test-fast: install
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -m fast -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# After adding a migration: regenerate the current schema (ductor_streams/schema/schema.sql)
# from a freshly migrated database, and commit it. Uses DUCTOR_STREAMS_TEST_DATABASE_URL's
# server when set, an embedded Postgres otherwise; tests/foundation/test_schema.py fails
# while the file and the migrations disagree.
schema: install
	$(BIN)/python -m tests.support.schema_file

# The append part drives its load with wrk when it is installed (bench/README.md).
bench: install
	command -v wrk >/dev/null || ! command -v apt-get >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk
	$(BIN)/python -m bench $(BENCH_ARGS)
