# Prime Agent (Python). `make demo` installs everything and runs an agent on the embedded model;
# `make test` installs everything and runs the tests (what CI runs, via .ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_TASK ?= Compute the sum of the squares of the integers from 1 to 100 with Python, then answer with the number.

.PHONY: install demo test test-all test-stress check lint typecheck bench clean base-offline images images-rust images-cuda

install: $(STAMP)

# Byte-compiling matters: with PYTHONDONTWRITEBYTECODE set, litellm alone takes ~9 s to import
# from source each time instead of ~4 s from .pyc files.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -e '.[local,dev]'
	touch $(STAMP)

demo: install
	$(BIN)/prime-agent -p "$(DEMO_TASK)"

# The session image is built (offline, cached under images/.build) before the tests, when Docker
# answers; without Docker the docker tests skip themselves.
test: install
	$(BIN)/python -m orchestrator.sandbox.images
	$(BIN)/python -m pytest -q tests/unit tests/integration tests/e2e tests/tui

# Session images without a registry (docs/images.md): debootstrap base, wheels from the host.
base-offline:
	bash images/base-offline.sh

images: install
	$(BIN)/prime-agent images build session

images-rust: install
	$(BIN)/prime-agent images build rust

images-cuda: install
	$(BIN)/prime-agent images build cuda

test-stress: install
	$(BIN)/python -m pytest -q -m stress tests/stress

check: lint typecheck

lint: install
	$(BIN)/ruff check orchestrator tui tests bench
	$(BIN)/ruff format --check orchestrator tui tests bench

typecheck: install
	$(BIN)/mypy orchestrator tui

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Peers side by side (issue 18): smolagents and rlms in bench/.venv-peers, same scripted model.
.PHONY: bench-peers
bench-peers: install
	$(BIN)/python -m bench.peers $(PEERS_ARGS)
