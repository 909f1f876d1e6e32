# The two commands of the README. Both set everything up first (idempotent).
.PHONY: setup experiment test testbed-build lint

setup:
	bash scripts/setup-dev
	bash scripts/setup-embedded

# The main job on the embedded default: baseline vs n-gram speculation on a local CPU vLLM.
experiment: setup
	.venv/bin/pytest suites/ --spec-config ngram

# The systemd test host's root filesystem (apt and debootstrap, minutes on a fresh machine), built
# in the background while the rest is set up and the unit tests run; the real-host tests boot it.
testbed-build:
	bash scripts/testbed/systemd-host build --background

# The plugin's own tests, unit and end to end against the real CPU vLLM and the systemd host.
# The CPU vLLM is set up while the unit tests run (they start no server); its lines interleave.
# The real ones in two workers: the test host's tests in order in one (tests/conftest.py groups
# them), the embedded vLLM's files in either; each vLLM has a core of its own.
test: testbed-build
	bash scripts/setup-dev
	.venv/bin/ruff check .
	.venv/bin/lint-imports --no-cache
	@echo "bash scripts/setup-embedded &  # beside the unit tests"
	@echo ".venv/bin/pytest tests/unit -n 2 --dist worksteal -p no:cacheprovider"
	@bash scripts/setup-embedded & embedded=$$!; \
	.venv/bin/pytest tests/unit -n 2 --dist worksteal -p no:cacheprovider; unit=$$?; \
	wait $$embedded || { echo "make test: scripts/setup-embedded failed" >&2; exit 1; }; \
	exit $$unit
	.venv/bin/pytest tests/real_host tests/real_vllm -n 2 --dist loadscope -v -p no:cacheprovider --durations=30

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports
