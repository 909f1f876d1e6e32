"""The CI gate's own steps, twice, with the workspace cleaned in between as actions/checkout
cleans it: the restart noise an A/A run measured must reach the next run (over a scripted
service; the gate's run step is the workflow's own text)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WORKFLOW = REPO / ".github" / "workflows" / "specdecode-gate.yml"

CONFIG = """
[target]
api_base = "http://scripted.invalid:8000"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
startup_timeout_s = 5
[run]
samples = 5
max_samples = 5
warmup = 1
max_tokens = 8
[presets]
ngram = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }
[prompt_types.coding]
prompt = "coding"
[prompt_types.math]
prompt = "math"
"""

CONFTEST = """
from tests.support.scripted_target import Script, ScriptedTarget, Speed

def pytest_specdecode_open_target(config, settings, log_dir):
    fast = {"coding": Speed(gap_s=0.005), "math": Speed(gap_s=0.005)}
    return ScriptedTarget(Script(), {"baseline-again": Script(), "ngram": Script(fast)})
"""


def run_step(name: str) -> str:
    """The `run:` script of a step of the gate workflow, as written there."""
    lines = WORKFLOW.read_text().splitlines()
    start = lines.index(f"      - name: {name}")
    at = next(i for i in range(start, len(lines)) if lines[i].strip() == "run: |")
    body = []
    for line in lines[at + 1 :]:
        if line.strip() and not line.startswith(" " * 10):
            break
        body.append(line[10:])
    return "\n".join(body) + "\n"


def checkout(workspace: Path) -> None:
    """As actions/checkout with `clean: true`: untracked files go; then the install step's
    venv (a link to this one)."""
    subprocess.run(["git", "clean", "-ffdxq"], cwd=workspace, check=True)
    (workspace / ".venv").symlink_to(Path(sys.executable).parents[1])


def gate(workspace: Path, env: dict[str, str], spec_config: str, repeats: str = "") -> str:
    result = subprocess.run(
        ["bash", "-e", "-c", run_step("Run the experiment")],
        cwd=workspace,
        env={**env, "SPEC_CONFIG": spec_config, "SPEC_REPEATS": repeats},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result.stdout + result.stderr


def test_the_noise_an_aa_run_measured_outlives_a_cleaned_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, home = tmp_path / "workspace", tmp_path / "runner-home"
    shutil.copytree(REPO / "suites", workspace / "suites", ignore=shutil.ignore_patterns("*.toml"))
    (workspace / "suites" / "conftest.py").write_text(CONFTEST)
    (workspace / "specdecode.toml").write_text(CONFIG)
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "the project"]):
        subprocess.run(["git", *args], cwd=workspace, check=True, env={
            **os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip
    monkeypatch.delenv("SPECDECODE_HOST_PROFILES")  # the workflow's default: the runner's home
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONPATH": str(REPO),  # `tests.support` for the scripted service
        "SPEC_FILE": "specdecode.toml",
        "SPEC_HOST": "",
        "RUNNER_TEMP": str(tmp_path),
    }
    checkout(workspace)
    first = gate(workspace, env, "baseline", repeats="2")  # the A/A run: four starts
    assert "host profile" in first and "restart noise added" in first, first
    profiles = list((home / ".local/state/pytest-specdecode/host-profiles").glob("*.json"))
    assert len(profiles) == 1, first
    # Token ids once per prompt type, at the first of the four starts: the others skip them.
    (aa,) = (workspace / "reports").iterdir()
    phases = json.loads((aa / "results.json").read_text())["phases"]
    ids = [m["token_ids"] for p in phases.values() for m in p["measurements"].values()]
    skipped = [i for i in ids if i and i["missing"] == "an A/A run records them at its first start"]
    assert (len(ids), len(skipped)) == (8, 6), ids

    checkout(workspace)
    assert not (workspace / "reports").exists()  # the A/A run's folder is gone
    second = gate(workspace, env, "ngram")
    (run,) = (workspace / "reports").iterdir()
    prior = json.loads((run / "results.json").read_text())["restart_noise_prior"]
    assert prior["throughput"]["measured"] is True, second
    assert prior["throughput"]["source"].startswith(f"host profile {profiles[0]}"), prior
    assert prior["throughput"]["df"] == 3  # four starts of one configuration
    assert f"plan: restart noise: {prior['throughput']['sd']:.1%} [" in second, second
    assert "(90% interval), measured (host profile" in second, second
