# nodelm: build, test and reproduce.
#
#   make setup                 create $(VENV) (if missing) and install torch + nodelm[dev]
#   make test                  unit tests, then nbval over notebooks/ (smoke parameters)
#   make reproduce PROFILE=cpu every notebook with params/<nb>/$(PROFILE).yaml, timed into
#                              results/reproduce_$(PROFILE).{json,csv}; then tables
#   make docs                  the docs site (mkdocs build --strict into site/), offline
#
# torch is installed first, on its own, so that you choose the build:
#   default:        TORCH_SPEC=torch==2.13.0 from pip's configured sources (find-links, PyPI)
#   CUDA:           make setup TORCH_INDEX=https://download.pytorch.org/whl/cu124 TORCH_SPEC=torch
#   CPU-only wheel on Linux (PyPI's Linux wheel pulls ~3 GB of CUDA libraries):
#                   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# If torch already imports in $(VENV) it is left alone (on Colab, reuse its torch with
# `make setup VENV_FLAGS=--system-site-packages`);
# pyproject.toml only asks for a range (torch>=2.1) so pip never replaces it.
#
# GNU make; tested with 4.3 and Python 3.10+.

PYTHON      ?= python3
VENV        ?= .venv
PROFILE     ?= cpu
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
VENV_FLAGS  ?=
# fallback when the pinned wheel is not available for this platform / Python
TORCH_FALLBACK ?= torch>=2.1

# Notebooks, by file stem under notebooks/. Adding one is one word here; each gets a
# phony target of the same name and an alias without the numeric prefix
# (01_gradient_flow -> gradient_flow).
NOTEBOOKS := 01_gradient_flow 02_seed_comparison 03_ablations 04_spectral_lyapunov 05_integrators 06_generation 07_scaling 08_long_context 09_compute_on_demand

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

# Paths are taken relative to this Makefile, so `make -C <repo>` works too.
ROOT   := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
VPY    := $(VENV)/bin/python
VPIP   := $(VPY) -m pip
STAMP  := $(VENV)/.nodelm-installed

# Offline data next to the checkout (../shared/data); an explicit environment wins.
SHARED_DATA := $(abspath $(ROOT)/../shared/data)
ifneq ($(wildcard $(SHARED_DATA)/.),)
NODELM_DATA_DIR ?= $(SHARED_DATA)
export NODELM_DATA_DIR
endif
ifneq ($(wildcard $(SHARED_DATA)/tiktoken_cache/.),)
TIKTOKEN_CACHE_DIR ?= $(SHARED_DATA)/tiktoken_cache
export TIKTOKEN_CACHE_DIR
endif

# Jupyter kernels (nbval, papermill) run without an inherited MPLBACKEND so ipykernel
# picks its headless inline backend: figures then appear in outputs the same way as in
# JupyterLab, whatever the caller set (CI sets MPLBACKEND=Agg for plain pytest).
KERNEL_ENV := env -u MPLBACKEND

PYTEST_FLAGS    ?=
NBVAL_FLAGS     ?= --nbval-current-env
# Test processes (pytest-xdist): auto is one per CPU core, at most 8 (each imports torch); 0 runs
# everything in this process.
# nbval keeps each notebook's cells on one worker (--dist loadfile): they share one kernel.
TEST_WORKERS    ?= auto
xdist_opt = -n $(TEST_WORKERS) --maxprocesses 8
PAPERMILL_FLAGS ?=

torch_index_opt = $(if $(strip $(TORCH_INDEX)),--index-url $(strip $(TORCH_INDEX)))
# 02_seed_comparison -> seed_comparison
empty :=
space := $(empty) $(empty)
comma := ,
nb_alias = $(subst $(space),_,$(wordlist 2,99,$(subst _, ,$(1))))

.PHONY: help setup test lint unit nbval reproduce tables bench docs docs-notebooks lab wheel clean distclean $(NOTEBOOKS)

help:
	@echo "nodelm make targets (PROFILE=$(PROFILE), VENV=$(VENV)):"
	@echo "  setup       create $(VENV) if missing; install torch ($(TORCH_SPEC)) then -e .[dev]"
	@echo "  test        unit tests (pytest tests/) then nbval over notebooks/"
	@echo "  bench       the benchmark record (results/bench_cpu.*), then the docs' tables"
	@echo "  unit        unit tests only;  nbval: notebook tests only"
	@echo "  lint        the import layering contract (lint-imports, pyproject.toml)"
	@echo "  reproduce   run every notebook with params/<nb>/\$$PROFILE.yaml, then tables"
	@echo "  tables      rewrite the docs pages' tables from results/ (python -m nodelm_lib tables)"
	@echo "  docs        install the [docs] extra if needed; mkdocs build --strict into site/"
	@echo "  docs-notebooks  the docs' notebook pages: $(DOCS_EXECUTED) executed with PROFILE=$(DOCS_PROFILE)"
	@echo "  lab         install the [lab] extra if needed and start JupyterLab"
	@echo "  wheel       build dist/nodelm-<version>-py3-none-any.whl (to upload to Colab)"
	@echo "  clean       remove executed notebooks, caches, checkpoints, __pycache__"
	@echo "  distclean   clean, and remove $(VENV)"
	@echo "  notebooks:  $(foreach nb,$(NOTEBOOKS),$(nb)$(if $(call nb_alias,$(nb)), (alias $(call nb_alias,$(nb)))))"
	@echo "variables: PYTHON=$(PYTHON) PROFILE=cpu|gpu|smoke TORCH_SPEC=... TORCH_INDEX=<url> TEST_WORKERS=auto|N|0"

# ---------------------------------------------------------------- environment

setup: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x "$(VPY)" ]; then \
	  $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	    || { echo "error: $(PYTHON) is $$($(PYTHON) --version 2>&1); nodelm needs Python 3.10+ (set PYTHON=...)" >&2; exit 1; }; \
	  echo ">> creating $(VENV) with $$($(PYTHON) --version 2>&1)"; \
	  $(PYTHON) -m venv $(VENV_FLAGS) "$(VENV)"; \
	  $(VPIP) install --quiet --upgrade pip \
	    || echo "warning: could not upgrade pip; continuing with $$($(VPIP) --version)" >&2; \
	fi
	@if $(VPY) -c 'import torch' >/dev/null 2>&1; then \
	  echo ">> torch $$($(VPY) -c 'import torch; print(torch.__version__)') already installed; leaving it"; \
	else \
	  echo ">> installing $(TORCH_SPEC) $(torch_index_opt)"; \
	  if ! $(VPIP) install "$(TORCH_SPEC)" $(torch_index_opt); then \
	    echo "warning: $(TORCH_SPEC) is not available here; falling back to '$(TORCH_FALLBACK)' (results may differ slightly from the pinned version)" >&2; \
	    $(VPIP) install "$(TORCH_FALLBACK)" $(torch_index_opt); \
	  fi; \
	fi
	@echo ">> installing nodelm (editable) with the [dev] extra"
	$(VPIP) install -e ".[dev]"
	@touch "$@"

# ---------------------------------------------------------------- tests

# Canned recipes, shared by `test` (all, in order) and `lint` / `unit` / `nbval` (one each).
# lint-imports finds the package through the editable install
define run_lint
cd "$(ROOT)" && $(VENV)/bin/lint-imports --no-cache
endef

define run_unit
$(VPY) -m pytest $(xdist_opt) $(PYTEST_FLAGS)
endef

# pytest exits 5 when it collects nothing (no notebooks yet): success for this step only.
define run_nbval
@if [ -z "$$(ls notebooks/*.ipynb 2>/dev/null)" ]; then \
  echo ">> nbval: no notebooks/*.ipynb yet; skipping"; \
else \
  rc=0; \
  echo "$(KERNEL_ENV) $(VPY) -m pytest --nbval $(NBVAL_FLAGS) $(xdist_opt) --dist loadfile $(PYTEST_FLAGS) notebooks/"; \
  $(KERNEL_ENV) $(VPY) -m pytest --nbval $(NBVAL_FLAGS) $(xdist_opt) --dist loadfile $(PYTEST_FLAGS) notebooks/ || rc=$$?; \
  if [ $$rc -eq 5 ]; then echo ">> nbval: no notebook tests collected; ok"; rc=0; fi; \
  exit $$rc; \
fi
endef

test: setup
	$(run_lint)
	$(run_unit)
	$(run_nbval)

lint: setup
	$(run_lint)

unit: setup
	$(run_unit)

nbval: setup
	$(run_nbval)

# ---------------------------------------------------------------- notebooks

# One phony target per notebook: papermill with params/<nb>/$(PROFILE).yaml, whose keys are checked
# first (papermill injects them as lines of code: a key must be a parameter of the notebook).
# PROFILE=smoke uses the notebook's own parameters cell when no smoke.yaml exists.
$(NOTEBOOKS): %: setup
	@mkdir -p results/executed
	@params="params/$*/$(PROFILE).yaml"; \
	if [ -f "$$params" ]; then popt="-f $$params"; $(VPY) -m nodelm_lib check-params notebooks/$*.ipynb "$$params"; \
	elif [ "$(PROFILE)" = smoke ]; then popt=""; \
	else echo "error: $$params not found (profiles here: $$(ls params/$*/ 2>/dev/null | tr '\n' ' '))" >&2; exit 1; fi; \
	echo ">> $* [$(PROFILE)]: papermill notebooks/$*.ipynb -> results/executed/$*_$(PROFILE).ipynb"; \
	start=$$(date +%s); \
	$(KERNEL_ENV) $(VENV)/bin/papermill notebooks/$*.ipynb results/executed/$*_$(PROFILE).ipynb \
	  $$popt --cwd notebooks -k python3 $(PAPERMILL_FLAGS); \
	echo ">> $* [$(PROFILE)] done in $$(( $$(date +%s) - start )) s"

# Short aliases: gradient_flow -> 01_gradient_flow, ...
define alias_rule
.PHONY: $(2)
$(2): $(1)
endef
$(foreach nb,$(NOTEBOOKS),$(if $(call nb_alias,$(nb)),$(eval $(call alias_rule,$(nb),$(call nb_alias,$(nb))))))

# nodelm_lib.reporting.reproduce runs `make <nb>` for each notebook and times it, between two CPU probes
# (a shared VM can run the same profile at very different wall times), writing the timings to
# results/reproduce_$(PROFILE).{json,csv} after every notebook; tables then renders them in the docs.
# (Through SUBMAKE, not $(MAKE) itself: a recipe line that names $(MAKE) runs even under
# `make -n`, which would write a record of notebooks that were only printed.)
SUBMAKE = $(MAKE)
reproduce: setup
	$(VPY) -m nodelm_lib reproduce --profile $(PROFILE) --make "$(SUBMAKE)" $(NOTEBOOKS)
	$(VPY) -m nodelm_lib tables

tables: setup
	$(VPY) -m nodelm_lib tables

# the benchmark record (bench/record.py, ~16 min on two cores), then the docs' tables
bench: setup
	$(VPY) bench/record.py
	$(VPY) -m nodelm_lib tables

# ---------------------------------------------------------------- docs

# The docs site (mkdocs.yml, docs/), built offline; --strict makes a broken link or a missing
# page an error. The [docs] extra is installed the first time.
DOCS_PACKAGES := mkdocs material mkdocstrings mkdocstrings_handlers.python mkdocs_jupyter
docs: setup
	@$(VPY) -c 'import $(subst $(space),$(comma),$(DOCS_PACKAGES))' >/dev/null 2>&1 || $(VPIP) install -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The docs' notebook pages: each notebook of DOCS_EXECUTED run by papermill with
# params/<nb>/$(DOCS_PROFILE).yaml in a scratch work folder that holds a copy of the run store
# (so the committed results/ and figures/ are never rewritten; notebooks that only read the store
# train nothing), then written to docs/notebooks/<nb>.ipynb with a first cell naming the profile
# and the machine. The other notebooks' pages are the committed notebooks (smoke outputs) with a
# note that their $(DOCS_PROFILE) outputs come later, unless their page is already an executed one
# (so that DOCS_EXECUTED="07_scaling" refreshes 07's page alone). A notebook whose runs are not all in the
# store trains them (for hours, for a sweep): run its profile first. One notebook at a time.
DOCS_PROFILE  ?= cpu
DOCS_EXECUTED ?= $(NOTEBOOKS)
DOCS_WORK     ?= build/docs-notebooks
docs-notebooks: setup
	rm -rf "$(DOCS_WORK)" && mkdir -p "$(DOCS_WORK)/results" docs/notebooks
	cp -r results/runs "$(DOCS_WORK)/results/"
	cp results/*.csv "$(DOCS_WORK)/results/"  # results a notebook reads (07: 02's chosen rates)
	@commit=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown); \
	for nb in $(DOCS_EXECUTED); do \
	  echo ">> $$nb [$(DOCS_PROFILE)] -> docs/notebooks/$$nb.ipynb"; start=$$(date +%s); \
	  $(VPY) -m nodelm_lib check-params notebooks/$$nb.ipynb params/$$nb/$(DOCS_PROFILE).yaml; \
	  $(KERNEL_ENV) $(VENV)/bin/papermill notebooks/$$nb.ipynb "$(DOCS_WORK)/$$nb.ipynb" \
	    -f params/$$nb/$(DOCS_PROFILE).yaml -p work_dir "$(abspath $(DOCS_WORK))" \
	    --cwd notebooks -k python3 $(PAPERMILL_FLAGS); \
	  $(VPY) -m nodelm_lib.reporting.pages notebook "$(DOCS_WORK)/$$nb.ipynb" docs/notebooks/$$nb.ipynb \
	    --profile $(DOCS_PROFILE) --commit $$commit; \
	  echo ">> $$nb done in $$(( $$(date +%s) - start )) s"; \
	done
	@for nb in $(filter-out $(DOCS_EXECUTED),$(NOTEBOOKS)); do \
	  if grep -q "Outputs on this page: the \`$(DOCS_PROFILE)\` profile" docs/notebooks/$$nb.ipynb 2>/dev/null; then \
	    echo ">> $$nb: its page is already an executed $(DOCS_PROFILE) page; kept"; continue; fi; \
	  $(VPY) -m nodelm_lib.reporting.pages notebook notebooks/$$nb.ipynb docs/notebooks/$$nb.ipynb --profile $(DOCS_PROFILE) --pending; \
	done

lab: setup
	@$(VPY) -c 'import jupyterlab' >/dev/null 2>&1 || $(VPIP) install -e ".[lab]"
	$(KERNEL_ENV) $(VENV)/bin/jupyter lab

# A wheel of the library alone (no notebooks, results or tests), for a runtime that cannot
# reach your fork: upload it and set NODELM_SOURCE to its path in a notebook's first cell.
# a pure-Python wheel needs pip and the network (pip builds it in isolation), not the dev environment
wheel:
	$(PYTHON) -m pip wheel --no-deps --wheel-dir dist .
	@ls -1 dist/nodelm-*.whl

# ---------------------------------------------------------------- cleaning

# Committed outputs (results/*.csv|md|tex, results/runs/, figures/) are never touched.
clean:
	rm -rf results/executed .cache checkpoints .pytest_cache build dist site
	find . \( -path ./.git -o -path "./$(VENV:./%=%)" -o -path ./.venv \) -prune \
	  -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf "$(VENV)"
