# Every target creates or reuses the virtualenv itself: nothing is installed by hand first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3

.PHONY: venv lint test oracles bench demo chart proto clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest --ignore=tests/oracles

# The differential tests against upstream's allocator and CEL (needs Go; builds once, cached).
oracles: $(STAMP)
	$(PY) -m tests.e2e.build oracles
	$(PY) -m pytest tests/oracles

bench: $(STAMP)
	@set -e; for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

demo: $(STAMP)
	$(VENV)/bin/gpu-dra demo $(DEMO_ARGS)

chart: $(STAMP)
	$(PY) -m tests.chart_render

proto: $(STAMP)
	$(PY) -m api.protogen

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
