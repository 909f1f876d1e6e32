"""Adoption as a user does it: the wheel into a fresh venv, `specdecode init` in an empty
project, the target pointed at the real CPU vLLM, `pytest --spec-config ngram`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.embedded import (
    MODEL,
    MODEL_DIR,
    REPO,
    SERVER_ENV_TOML,
    SERVER_PYTHON,
    free_port,
    require_embedded,
)


def run(*argv: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_pip_install_init_and_run_in_an_empty_project(tmp_path: Path) -> None:
    require_embedded()
    dist, venv, project = tmp_path / "dist", tmp_path / "venv", tmp_path / "project"
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, REPO, cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("pytest_specdecode-*.whl")
    assert run(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    installed = run(venv / "bin" / "pip", "install", "-q", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    project.mkdir()
    init = run(venv / "bin" / "specdecode", "init", cwd=project)
    assert init.returncode == 0, init.stdout + init.stderr
    port = free_port()
    config = project / "specdecode.toml"
    target = f"""[target]
model = "{MODEL}"
backend = "local"
api_base = "http://127.0.0.1:{port}"
command = ["{SERVER_PYTHON}", "-m", "vllm.entrypoints.openai.api_server", "--model",
           "{MODEL_DIR}", "--served-model-name", "{MODEL}", "--port", "{port}",
           "--enforce-eager", "--max-model-len", "1024", "--seed", "0",
           "--distributed-executor-backend", "uni"]
startup_timeout_s = 400
[target.env]
{SERVER_ENV_TOML}

"""
    config.write_text(re.sub(r"(?s)\[target\].*?(?=\[run\])", target, config.read_text()))
    before = sorted(p.name for p in tmp_path.iterdir())

    result = run(
        venv / "bin" / "pytest", "--spec-config", "ngram", "--spec-prompt-type", "coding",
        "--spec-samples", "5", "--spec-max-samples", "5", "--spec-max-tokens", "32",
        "-p", "no:cacheprovider", "-rA",
        cwd=project,
    )  # fmt: skip
    out = result.stdout + result.stderr
    (run_dir,) = (project / "reports").iterdir()  # under the project's root
    data = json.loads((run_dir / "results.json").read_text())
    # The built-in tests ran, and passed or failed as the verdicts say.
    assert "PASSED specdecode::test_throughput_threshold" not in out  # no thresholds: skipped
    assert "specdecode::test_speculation_does_not_regress[ngram-coding]" in out, out
    expected = pytest.ExitCode.OK if data["analysis"]["passed"] else pytest.ExitCode.TESTS_FAILED
    assert result.returncode == expected, out
    assert {p.name for p in run_dir.iterdir()} >= {"results.json", "summary.md", "report.html"}
    # Nothing written elsewhere: beside the project, and in it, only what the run owns.
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert sorted(p.name for p in project.iterdir()) == ["reports", "specdecode.toml"]
    assert "DeprecationWarning" not in out
