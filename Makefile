# Two commands on a fresh machine: `make study` and `make test`. Everything else is set up here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

FASHION := /usr/share/datasets/fashion-mnist

.PHONY: help venv test test-fast lint typecheck pytest study bench train clean fashion-mnist chromium slurm jobserver generate

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# uv installs the versions pip would (compared: the same 105 packages) in well under half the time,
# its downloads and byte-compiling in parallel: `make venv` on a fresh clone took 30.7 s against
# pip's 79.6 s here. It reads no pip config, so it is given pip's find-links (where the local CPU
# torch lies: torch is pinned, or a multi-GB CUDA build comes) and constraints. Where uv cannot be
# had or fails (checked: uv offline with an empty cache), pip installs as before.
PIP_SETTING = $$($(BIN)/pip config list 2>/dev/null | sed -n "s/^\(:env:\|global\)\.$(1)='\(.*\)'$$/\2/p" | head -1)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@set -e; from=""; \
	for d in $(call PIP_SETTING,find-links); do from="$$from --find-links $$d"; done; \
	for c in $(call PIP_SETTING,constraint); do from="$$from --constraint $$c"; done; \
	if $(BIN)/pip install --quiet uv && $(BIN)/uv pip install --quiet --python $(BIN)/python \
		--compile-bytecode $$from torch==2.13.0 -e ".[dev]"; then echo "installed with uv"; \
	else \
		echo "uv could not install the project: installing it with pip"; \
		$(BIN)/pip install --quiet torch==2.13.0; \
		$(BIN)/pip install --quiet -e ".[dev]"; \
	fi
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install the project with its dev extras

lint: $(STAMP)  ## ruff lint and format check, and the import contract (pyproject.toml)
	$(BIN)/ruff check ponder study tests bench docs/evidence
	$(BIN)/ruff format --check ponder study tests bench docs/evidence
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)  ## mypy on ponder/ and study/
	$(BIN)/mypy

# After a change to a spec key, a config field, a verb, a flag or an exit code: the tables in
# docs/ and the shipped JSON Schema are generated from the code (tests fail until they match)
generate: $(STAMP)  ## rewrite what is generated from the code: docs' reference tables, spec.schema.json
	$(BIN)/python -m study.cli.reference

fashion-mnist:  ## Debian's Fashion-MNIST IDX files, for the reader's test (best effort: skipped if apt cannot)
	@if [ -d $(FASHION) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's dataset-fashion-mnist for the IDX reader's test"; \
		(apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1)) || \
		echo "could not install dataset-fashion-mnist: its test will be skipped"; \
	else echo "no root or apt-get: the Fashion-MNIST test will be skipped"; fi

# Measured here (root, apt lists present, 2 cores under load): 3 min 21 s with recommends (131
# packages); without them it is fewer packages, its time not measured
chromium:  ## Debian's Chromium, for the report's browser test (best effort: skipped if apt cannot)
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium for the report's browser test"; \
		(apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && \
		  apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1)) || \
		echo "could not install chromium: the browser test will be skipped"; \
	else echo "no root or apt-get: the browser test will be skipped"; fi

# A single-node Slurm for the launcher's test (tests/study/test_slurm.py), which starts its own
# munged, slurmctld and slurmd in a temporary folder: nothing here is started or configured. Eight
# packages, about 4 MB; 7.5 s to install here from apt's cache
slurm:  ## Debian's Slurm and munge, for the Slurm launcher's test (best effort: skipped if apt cannot)
	@if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && \
		[ -x /usr/sbin/munged ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's slurmctld, slurmd and munge for the Slurm test"; \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			slurmctld slurmd slurm-client munge >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1)) || \
		echo "could not install Slurm: its test will be skipped"; \
	else echo "no root or apt-get: the Slurm test will be skipped"; fi

# Ray's job server (the dashboard) needs ray[default]'s packages, which the project's Ray does not
# install: with them every local Ray instance would run the full dashboard. They go into a folder
# of their own that only tests/study/test_submit.py's head node puts on its PYTHONPATH: exactly the
# packages ray[default] adds to .venv, at the versions uv resolves for it (30 packages, about 2.5 s)
JOBSERVER := $(VENV)/jobserver

$(JOBSERVER)/.installed: $(STAMP)
	@set -e; from=""; \
	for d in $(call PIP_SETTING,find-links); do from="$$from --find-links $$d"; done; \
	for c in $(call PIP_SETTING,constraint); do from="$$from --constraint $$c"; done; \
	ray=$$($(BIN)/python -c "import importlib.metadata as m; print(m.version('ray'))"); \
	pkgs=$$($(BIN)/uv pip install --dry-run --python $(BIN)/python $$from "ray[default]==$$ray" 2>&1 | \
		sed -n 's/^ + //p') || true; \
	if [ -n "$$pkgs" ] && $(BIN)/uv pip install --quiet --target $(JOBSERVER) --no-deps $$from $$pkgs; then \
		touch $@; else echo "could not install ray[default]'s packages: the job-server test will be skipped"; fi

jobserver: $(JOBSERVER)/.installed  ## ray[default]'s packages for the job-server test's head node (not on .venv's path)

# Much of a study test's time is spent waiting on Ray and on subprocesses: three test processes
# on two cores (a cluster module's tests stay in one, `xdist_group`). One OpenMP thread per
# process: torch's spinning pool threads burn the cores the other processes need (trials set
# their own thread count).
PYTEST_WORKERS ?= 3

pytest: $(STAMP) fashion-mnist chromium slurm jobserver  ## the test suite on $(PYTEST_WORKERS) processes (the 15 slowest tests listed at the end)
	OMP_NUM_THREADS=1 $(BIN)/pytest -q --durations=15 -n $(PYTEST_WORKERS) --dist loadgroup

test: lint typecheck pytest  ## everything CI runs: lint, types, tests

# Ray reads $$RAY_ADDRESS: a malformed one makes any Ray start fail at once, so a unit test that
# starts Ray without the `ray` mark (tests/conftest.py) fails here instead of slowing the loop
test-fast: $(STAMP)  ## the unit tests, no Ray started, on both cores: the edit-run loop
	RAY_ADDRESS=/no-ray-in-test-fast OMP_NUM_THREADS=1 $(BIN)/pytest -q -m "not ray" -n 2

STUDY ?= parity

study: $(STAMP)  ## the default study on a local Ray instance: Parquet under results/, then a summary
	@# a second `make study` finishes an interrupted study, or shows the finished one's summary
	@if [ -f results/studies/$(STUDY)/spec.toml ]; then \
		$(BIN)/ponder-study resume $(STUDY); \
	else \
		$(BIN)/ponder-study run $(STUDY); \
	fi

bench: $(STAMP)  ## iteration speed against the reference formulation
	$(BIN)/python bench/iteration_speed.py

train: $(STAMP)  ## one parity run with the default config
	$(BIN)/python -m ponder.train --task parity

clean:  ## remove .venv and caches (results/ is kept)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
