# Runyard: two commands on a fresh machine with Python 3.11 and pip.
#   make up    start the whole platform (embedded Postgres + Kafka-compatible broker)
#   make test  install what is needed into .venv and run the tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install up test test-fast lint typecheck bench docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

up: install
	$(BIN)/runyard up

test: install
	$(BIN)/python -m pytest -q

# Everything but the slow end-to-end tests.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check libs services tests benchmarks
	$(BIN)/python -m runyard.contracts.catalogue --check docs/events.md

bench: install
	$(BIN)/python benchmarks/eventstore.py --quick

docs: install
	$(BIN)/python -m runyard.contracts.catalogue > docs/events.md

clean:
	rm -rf $(VENV) .runyard build *.egg-info
