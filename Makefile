# Prime Agent (Python). `make demo` installs everything and runs an agent on the embedded model;
# `make test` installs everything and runs the tests (what CI runs, via .ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo is a task of the kind a new user tries first (docs/embedded-model.md, "Which embedded
# variant"): a 2,000-line file with one line that states a number, which only code can find.
DEMO_DIR ?= build/demo
DEMO_TASK ?= The file notes.txt in your working directory has 2000 lines. Exactly one line states a number. Find that line with Python and answer with the number.

.PHONY: install bubblewrap kubectl demo test test-all test-stress check lint typecheck layers bench clean base-offline images images-rust images-cuda images-orchestrator

install: $(STAMP) bubblewrap kubectl

# The bwrap sandbox backend needs bubblewrap (docs/docker.md, "Backend selection"). As root
# with apt-get (CI, a fresh container) it is installed, refreshing the package lists only when the
# first try fails; anyone else is told how, once, and `make install` goes on: the docker
# backend may be all they use. `prime-agent doctor` says which backends work.
bubblewrap:
	@if command -v bwrap >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing bubblewrap (the bwrap sandbox backend)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q bubblewrap >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; } \
	    || echo "could not install bubblewrap with apt-get: the bwrap backend is unavailable"; \
	else \
	  echo "bubblewrap is not installed: the bwrap sandbox backend needs it (sudo apt-get install bubblewrap, or dnf install bubblewrap)"; \
	fi

# The k8s/ tests render the manifests with `kubectl kustomize` (docs/kubernetes.md): Debian's
# kubernetes-client package has it (kubectl 1.20, kustomize v2.0.3, which k8s/ is written for).
# Installed like bubblewrap: as root with apt-get; anyone else is told how, once.
kubectl:
	@if command -v kubectl >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing kubernetes-client (kubectl, to render k8s/)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q kubernetes-client >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null && apt-get install -y -q kubernetes-client >/dev/null; } \
	    || echo "could not install kubernetes-client with apt-get: the k8s/ tests cannot run (they fail with CI=true)"; \
	else \
	  echo "kubectl is not installed: the k8s/ tests need it (sudo apt-get install kubernetes-client)"; \
	fi

# Byte-compiling matters: with PYTHONDONTWRITEBYTECODE set, litellm alone takes ~9 s to import
# from source each time instead of ~4 s from .pyc files.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -e '.[local,dev]'
	touch $(STAMP)

demo: install
	$(BIN)/python examples/demo/make_notes.py $(DEMO_DIR)
	$(BIN)/prime-agent --cwd $(DEMO_DIR) -p "$(DEMO_TASK)"

# The session image is built (offline, cached under images/.build) before the tests, when Docker
# answers; without Docker the docker tests skip themselves (and with CI=true, as .ci/run's
# machines set, they fail: so do the bwrap tests without bubblewrap, which install provides).
# pytest's -ra (pyproject) ends the run with the list of skipped tests and why.
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

images-orchestrator: install
	$(BIN)/prime-agent images build orchestrator

test-stress: install
	$(BIN)/python -m pytest -q -m stress tests/stress

check: lint typecheck layers

lint: install
	$(BIN)/ruff check orchestrator tui tests bench
	$(BIN)/ruff format --check orchestrator tui tests bench

typecheck: install
	$(BIN)/mypy orchestrator tui

# The layers of docs/architecture.md (pyproject.toml, [tool.importlinter]).
layers: install
	$(BIN)/lint-imports --no-cache

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Peers side by side (issue 18): smolagents and rlms in bench/.venv-peers, same scripted model.
.PHONY: bench-peers
bench-peers: install
	$(BIN)/python -m bench.peers $(PEERS_ARGS)
