# memtrace: two commands do all set-up on a fresh clone.
#   make demo   virtualenv + install + build the demo workload + capture it on this machine + report
#   make test   virtualenv + install + lint + type check + the whole test suite (CI runs this)
#   make test-fast   unit tests and the integration smoke tests (see CONTRIBUTING.md): about a minute
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT := build/demo
DEMO_CAPTURE := demo-out/workload-malloc

.PHONY: all demo test test-fast bench bench-real lint typecheck programs clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# Optional: the Parquet export and its DuckDB check (tests/unit/test_parquet.py skips without them).
	$(BIN)/python -m pip install --quiet -e '.[parquet-test]' || echo "note: pyarrow/duckdb not installed: the Parquet tests will skip"
	touch $(STAMP)

programs:
	$(MAKE) -s -C demo OUT=$(abspath $(DEMO_OUT))

demo: $(STAMP) programs
	rm -rf $(DEMO_CAPTURE)
	$(BIN)/memtrace malloc --device local --window 30 --leaks --out $(DEMO_CAPTURE) -- $(DEMO_OUT)/workload
	$(BIN)/memtrace report demo-out
	@echo "report: demo-out/REPORT.md and demo-out/report.html"

# pytest-xdist workers (`make test JOBS=0` runs in one process).  Most of a traced test is waiting
# (the target, Frida's injection, the CModule build), so two workers overlap it even on 2 CPUs;
# loadfile keeps a module's tests, and its module-scoped captures, on one worker.
JOBS ?= 2
XDIST := -n $(JOBS) --dist loadfile

# lint and typecheck first: CI (.ci/run) is `make test`, so ruff and mypy gate it too.
test: lint typecheck
	$(BIN)/python -m pytest -q $(XDIST) --durations=30

# The tier to run while editing (CONTRIBUTING.md, "The test tiers"): the unit tests not marked
# slow and the integration tests marked smoke, each cut off after 120 s so a hang shows up as a
# failure.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "(smoke or not integration) and not slow" --timeout 120

bench: $(STAMP) programs
	$(BIN)/python bench/malloc_bench.py

# native, memtrace's default and heaptrack on four real programs (installs python3, sqlite3, g++, heaptrack)
bench-real: $(STAMP)
	$(BIN)/python bench/bench_real.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf build demo-out captures .pytest_cache
