"""One baseline-only run on the real CPU vLLM (one server start), two behaviours: an API key
that authenticates and is never written or printed, and a Spec-Bench file's categories as
prompt types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from ..support.embedded import EmbeddedExperiment, require_embedded, write_experiment

SECRET = "sk-specdecode-test-7f3a9c2e41"

SPEC_BENCH = [
    {"question_id": i, "category": category, "turns": [text]}
    for i, (category, text) in enumerate(
        [
            ("writing", "Write a two-sentence note thanking a colleague for a code review."),
            ("writing", "Write a short haiku about a compiler."),
            ("writing", "Write one sentence announcing a release of a small library."),
            ("math_reasoning", "What is 17 times 23? Show the steps."),
            ("math_reasoning", "A train travels 60 km in 45 minutes. What is its speed in km/h?"),
            ("math_reasoning", "Is 221 a prime number? Explain briefly."),
            ("coding", "Write a Python one-liner that reverses a string."),
        ]
    )
]


@dataclass
class Run:
    exp: EmbeddedExperiment
    returncode: int
    stdout: str
    stderr: str
    unauthenticated: str  # the HTTP status of a request without the key, sent mid-run
    data: dict


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The suite as it serves (no candidate), its prompt types from a Spec-Bench file, the
    server started with --api-key from an environment variable."""
    require_embedded()
    where = tmp_path_factory.mktemp("baseline-run")
    questions = where / "question.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in SPEC_BENCH))
    table = (
        f'[prompt_types.sb]\nprompts_file = "{questions}"\nformat = "spec-bench"\n'
        'categories = ["writing", "math_reasoning"]\n'
    )
    exp = write_experiment(
        where,
        run={"samples": 3, "max_samples": 3, "max_tokens": 24},
        prompt_types=table,
    )
    exp.config.write_text(
        exp.config.read_text().replace(
            "startup_timeout_s = 400",
            'startup_timeout_s = 400\napi_key_env = "SPECDECODE_TEST_KEY"',
        )
    )
    status = where / "unauthenticated-status.txt"
    (where / "suites" / "conftest.py").write_text(f"""
import httpx
def pytest_runtest_teardown(item):
    status = httpx.get("http://127.0.0.1:{exp.port}/v1/models").status_code
    with open("{status}", "w") as f:
        f.write(str(status))
""")
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env.update(
        SPECDECODE_TEST_KEY=SECRET,
        SPECDECODE_HOST_PROFILES=str(tmp_path_factory.mktemp("host-profiles")),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *exp.args("-rA")],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return Run(
        exp,
        done.returncode,
        done.stdout,
        done.stderr,
        status.read_text() if status.exists() else "(no request sent)",
        exp.results() if exp.reports.exists() else {},
    )


def test_api_key_authenticates_and_never_reaches_results_logs_or_output(run: Run) -> None:
    # Baseline only: the key authenticated every request (vLLM refuses them without it).
    assert run.returncode == pytest.ExitCode.OK, run.stdout[-3000:] + run.stderr[-3000:]
    ms = run.data["phases"]["baseline"]["measurements"]
    assert all(len(m["samples"]) == 3 for m in ms.values()), ms
    everything = [run.stdout, run.stderr]
    everything += [
        p.read_text(errors="replace") for p in run.exp.run_dir().rglob("*") if p.is_file()
    ]
    assert all(SECRET not in text for text in everything)
    # And the server really demanded it: a request without the key was refused mid-run.
    assert run.unauthenticated == "401"
    assert run.exp.leftover_servers() == []


def test_a_spec_bench_file_gives_a_prompt_type_per_category(run: Run) -> None:
    assert run.returncode == pytest.ExitCode.OK, run.stdout[-3000:] + run.stderr[-3000:]
    data = run.data
    ms = data["phases"]["baseline"]["measurements"]
    assert list(ms) == ["sb.writing", "sb.math_reasoning"]  # coding was not chosen
    for name, m in ms.items():
        prompts = [p["text"] for p in data["prompt_types"][name]["prompts"]]
        category = name.split(".", 1)[1]
        assert prompts == [q["turns"][0] for q in SPEC_BENCH if q["category"] == category]
        assert {s["prompt_index"] for s in m["samples"]} == {0, 1, 2}
        assert len({s["text"] for s in m["samples"]}) == 3
