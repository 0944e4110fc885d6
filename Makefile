# The two commands a fresh machine needs: `make demo` (the main job) and `make test` (every test tier).
# Both create .venv and install everything on first use.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/hubshift demo $(ARGS)

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" tools/run-tests

lint: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" TIERS=lint tools/run-tests

bench: $(STAMP)  ## every benchmark against its peer (about an hour; BENCHES="emulator store_ops" for some)
	PATH="$(CURDIR)/$(BIN):$$PATH" tools/run-benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
