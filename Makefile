# The two commands of the README: `make serve` and `make test`. Both do all of the set-up first.
VENV ?= .venv
PY := $(VENV)/bin/python
SERVE_ARGS ?=

.PHONY: setup serve test lint render bench
BENCH_ARGS ?=

setup:
	bash tools/setup_env.sh
	$(PY) tools/build_tiny_model.py
	$(PY) tools/build_tiny_lora.py

serve: setup
	$(PY) tools/serve.py $(SERVE_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

render: setup
	$(PY) tools/render_repo.py

# pytest exits 5 when no test ran, and make fails on it: an empty run never passes.
test: lint
	$(PY) tools/render_repo.py --check
	$(PY) -m pytest

# Side-by-side benchmark (bare vLLM, vllm serve, our ensembles); not part of the test suite.
bench: setup
	$(PY) tools/bench.py $(BENCH_ARGS)
