# memtrace: two commands do all set-up on a fresh clone.
#   make demo   virtualenv + install + build the demo workload + capture it on this machine + report
#   make test   virtualenv + install + the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT := build/demo
DEMO_CAPTURE := demo-out/workload-malloc

.PHONY: all demo test bench bench-real lint programs clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

programs:
	$(MAKE) -s -C demo OUT=$(abspath $(DEMO_OUT))

demo: $(STAMP) programs
	rm -rf $(DEMO_CAPTURE)
	$(BIN)/memtrace malloc --device local --window 30 --leaks --out $(DEMO_CAPTURE) -- $(DEMO_OUT)/workload
	$(BIN)/memtrace report demo-out
	@echo "report: demo-out/REPORT.md and demo-out/report.html"

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP) programs
	$(BIN)/python bench/malloc_bench.py

# native, memtrace's default and heaptrack on four real programs (installs python3, sqlite3, g++, heaptrack)
bench-real: $(STAMP)
	$(BIN)/python bench/bench_real.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf build demo-out captures .pytest_cache
