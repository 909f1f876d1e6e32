# The two commands of the README. Both set everything up first (idempotent).
.PHONY: setup experiment test lint

setup:
	bash scripts/setup-dev
	bash scripts/setup-embedded

# The main job on the embedded default: baseline vs n-gram speculation on a local CPU vLLM.
experiment: setup
	.venv/bin/pytest suites/ --spec-config ngram

# The plugin's own tests, unit and end to end against the real CPU vLLM.
test: setup
	.venv/bin/ruff check .
	.venv/bin/pytest tests/unit -n 2 -p no:cacheprovider
	.venv/bin/pytest tests/real_vllm tests/real_host -v -p no:cacheprovider --durations=15

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
