# Two commands set everything up on a fresh machine:  `make dev`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: dev test lint bench install

$(BIN)/ductor-streams: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

install: $(BIN)/ductor-streams

dev: install
	$(BIN)/ductor-streams dev

lint: install
	$(BIN)/ruff check ductor_streams tests bench examples
	$(BIN)/ruff format --check ductor_streams tests bench examples
	$(BIN)/mypy ductor_streams bench

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The append part drives its load with wrk when it is installed (bench/README.md).
bench: install
	command -v wrk >/dev/null || ! command -v apt-get >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk
	$(BIN)/python -m bench $(BENCH_ARGS)
