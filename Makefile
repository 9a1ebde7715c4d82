# gpuprov — every target sets up what it needs; `make demo` and `make test` work on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install sysdeps test test-fast lint demo sandbox bench mutate chaos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# System tools the tests drive for real: OpenSSH servers, sudo, network namespaces, shellcheck.
sysdeps:
	@bash tools/sysdeps.sh

# Parallel workers (pytest-xdist): each gets its own test-host networks, moto server and state dirs
# (docs/testing.md, "Parallel runs"). TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 3

# CI's suite (under 12 minutes on 2 cores): every test, but only the first cases of the crash sweeps. worksteal:
# an idle worker takes tests queued on a busy one, so the 10-30 s scenarios do not pile up on one worker at the end
test: install sysdeps
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not sweep"

# The fast lane (tests/lanes.py): the tests that need no root, no SSH test hosts, no moto server and no system
# package, and not the slow ones; a test left in that reaches for them fails. No sysdeps: any user, under 3 minutes.
test-fast: install
	$(PY) -m pytest -q -n $(TEST_JOBS) --fast

# every case of every sweep too (tests/conftest.py `sweep`)
test-all: install sysdeps
	$(PY) -m pytest -q -n $(TEST_JOBS)

# The randomized walk (tests/chaos), long: WALKS walks of up to STEPS steps from Hypothesis seed SEED, every rule on
# (KNOWN=1: the KNOWN ones too; or a comma list of them); a failure prints its seed and the shrunk steps.
# CLOUD=aws (moto), alibaba (the ECS imitation) or all. `make test` runs a bounded walk of each.
# CHAOS_LOG=FILE: every command as it ends.
SEED  ?= 0
STEPS ?= 50
WALKS ?= 3
KNOWN ?= 1
CLOUD ?= aws
chaos: install sysdeps
	GPUPROV_TEST_CHAOS_SEED=$(SEED) GPUPROV_TEST_CHAOS_STEPS=$(STEPS) GPUPROV_TEST_CHAOS_WALKS=$(WALKS) \
	GPUPROV_TEST_CHAOS_CLOUD=$(CLOUD) GPUPROV_TEST_CHAOS_KNOWN=$(KNOWN) GPUPROV_TEST_CHAOS_LOG=$(CHAOS_LOG) $(PY) -m pytest -q -s -n 0 -p no:cacheprovider \
		tests/chaos/test_chaos.py

lint: install
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	@$(PY) tools/smells.py

demo: install
	@bash tools/demo.sh

# A local AWS endpoint + SSH hosts with shimmed GPUs, until Ctrl-C (as root; tools/sandbox.py says what runs).
# Only the system packages the sandbox runs (tools/sysdeps.sh sandbox), not the whole test toolchain.
sandbox: install
	@bash tools/sysdeps.sh sandbox
	@$(PY) tools/sandbox.py up

bench: install
	$(PY) bench/cli_startup.py

# Mutation testing (mutmut) on the deciding modules; not part of `make test`. MODULES="compat verify" to pick.
mutate: install
	$(PY) tools/mutate.py $(MODULES)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .mutate
