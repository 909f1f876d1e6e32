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
# them), the embedded vLLM's files in either; each vLLM has a core of its own. Then the tests
# marked `alone` by themselves (test_busy_host.py measures other work on the machine, which the
# other worker's vLLM would be), on the test host the first run left up
# (SPECDECODE_TESTBED_KEEP); the hosts that were down before are taken down after.
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
	@down=$$(for i in 1 2; do bash scripts/testbed/systemd-host --instance $$i status >/dev/null 2>&1 || printf '%s ' $$i; done); \
	export SPECDECODE_TESTBED_KEEP=1; \
	echo '.venv/bin/pytest tests/real_host tests/real_vllm -m "not alone" -n 2 --dist loadscope -v -p no:cacheprovider --durations=30'; \
	.venv/bin/pytest tests/real_host tests/real_vllm -m "not alone" -n 2 --dist loadscope -v -p no:cacheprovider --durations=30; real=$$?; \
	case " $$down" in *" 2 "*) bash scripts/testbed/systemd-host --instance 2 down >/dev/null 2>&1;; esac; \
	echo '.venv/bin/pytest tests/real_host -m alone -v -p no:cacheprovider --durations=5  # alone on the machine'; \
	.venv/bin/pytest tests/real_host -m alone -v -p no:cacheprovider --durations=5; alone=$$?; \
	for i in $$down; do bash scripts/testbed/systemd-host --instance $$i down >/dev/null 2>&1; done; \
	[ $$real -eq 0 ] && exit $$alone; exit $$real

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports
