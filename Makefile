# Every target bootstraps .venv itself; `make setup` is idempotent.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export WANDB_SILENT ?= true

.PHONY: setup data browser demo test test-fast fuzz bench results scaling clean

setup: $(STAMP) data browser

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel -c constraints.txt
	$(PIP) install -q -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

data:
	@bash scripts/get_data.sh

browser:
	@bash scripts/get_browser.sh

demo: setup
	bash scripts/demo.sh

# Every test process runs one torch thread (tests/conftest.py), so one worker per core
# (TEST_WORKERS, default: this machine's cores, at most 4) keeps them busy; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# The test workers keep their compiled bytecode (an environment that sets PYTHONDONTWRITEBYTECODE would
# have each worker recompile and assertion-rewrite every module: about 5 s of every run).
test test-fast: export PYTHONDONTWRITEBYTECODE =

test: setup
	$(PY) -m pytest -q --timeout 900 --durations=25 $(XDIST) tests

# The quick loop: everything but the tests marked `slow` (subprocesses, several processes, the Java
# scorers, real fits and compiles, the seeded writer fuzz; `make test` runs them). It still runs one
# family's whole run lifecycle (tests/test_lifecycle.py, the smallest tiny model), every fuzz corpus
# replay and each family's tiny configuration through the graph-break checks. Measured alone on this
# 2-core machine (`time make test-fast`, venv set up, no bytecode caches in the tree): see MEASURED below.
# MEASURED: 146 s (pytest 142 s) at a126ea5; budget: at most 3 minutes.
test-fast: setup
	$(PY) -m pytest -q --timeout 900 $(XDIST) -m "not slow" tests

# Fuzz the ten kinds of untrusted input and the writers (sequences of the commands that write files,
# over seeded user files and links) with fresh draws for FUZZ_SECONDS (tools/fuzz.py); failing inputs
# and sequences are saved under tests/fuzz_corpus/ (writers/ for sequences), which `make test` replays.
FUZZ_SECONDS ?= 600
fuzz: setup
	$(PY) tools/fuzz.py --seconds $(FUZZ_SECONDS) --json results/fuzz_report.json

# benchmarks/releases.py writes results/benchmark-<kind>-<device>-fp32-bs<N>-torch<v>.csv; the leaderboard is rebuilt from them
bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	$(PY) scripts/results_tables.py

# The results runs behind the README's tables (hours on 2 CPU cores; see scripts/results.sh).
results: setup
	bash scripts/results.sh

# Cost (and accuracy, from committed results) of every family against the canvas side, issue 43:
# `measure` (slow: about 10 minutes on one CPU thread; SCALING_ARGS passes it flags, e.g.
# --device cuda) writes results/scaling_cost_<device>.json, `report` the CSV, figure and docs/scaling.md.
scaling: setup
	$(PY) scripts/scaling.py measure $(SCALING_ARGS)
	$(PY) scripts/scaling.py report

clean:
	rm -rf $(VENV) .pytest_cache runs wandb
