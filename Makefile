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
	.venv/bin/pytest tests/ -v -p no:cacheprovider

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
