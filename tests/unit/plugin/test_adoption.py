"""Adopting the plugin in a project: `specdecode init`, where the configuration is found, and a
run that writes nothing it should not (fast: nothing is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdecode.cli import init

from ...support.inprocess import run_in_process

TARGET = """
[target]
model = "m"
backend = "local"
api_base = "http://127.0.0.1:18011"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port",
           "18011"]
[presets]
ngram = { method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }
[prompt_types.coding]
prompt = "write code"
"""


def test_init_writes_a_starter_that_loads_and_never_overwrites(tmp_path: Path, capsys) -> None:
    assert init.main(["init", "--dir", str(tmp_path), "--github"]) == 0
    config = tmp_path / "specdecode.toml"
    gate = tmp_path / ".github" / "workflows" / "specdecode-gate.yml"
    assert config.is_file() and gate.is_file()
    text = config.read_text()
    assert '# backend = "systemd"' in text and 'backend = "local"' in text
    assert all(f"[prompt_types.{t}]" in text for t in ("coding", "math", "structured"))
    from pytest_specdecode.config.settings import load_settings

    settings = load_settings(config, spec_configs=["ngram"], rootdir=tmp_path)
    assert settings.reports_dir == (tmp_path / "reports").resolve()
    assert settings.run.samples == 8 and settings.candidates[0].name == "ngram"
    assert all(len(t.prompts) >= 10 for t in settings.prompt_types.values())  # shipped sets
    before = config.read_text()
    assert init.main(["init", "--dir", str(tmp_path)]) == 1
    assert "exists; nothing was written" in capsys.readouterr().err
    assert config.read_text() == before


@pytest.mark.parametrize(
    "where",
    ["pyproject", "specdecode.toml", "ini"],
)
def test_the_configuration_is_found_where_pytest_users_look(
    pytester: pytest.Pytester, where: str
) -> None:
    if where == "pyproject":
        body = TARGET.replace("[target]", "[tool.specdecode.target]")
        for table in ("presets", "prompt_types.coding"):
            body = body.replace(f"[{table}]", f"[tool.specdecode.{table}]")
        pytester.makefile(".toml", pyproject=body)
    elif where == "specdecode.toml":
        pytester.makefile(".toml", specdecode=TARGET)
    else:
        (pytester.path / "conf").mkdir()
        (pytester.path / "conf" / "exp.toml").write_text(TARGET)
        pytester.makeini("[pytest]\nspecdecode_file = conf/exp.toml\n")
    result = run_in_process(pytester, "--spec-config", "ngram", "--spec-dry-run")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "candidates: ngram" in out
    assert not (pytester.path / "reports").exists()


def test_collecting_and_refusing_write_nothing(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", specdecode=TARGET)
    collect = run_in_process(pytester, "--spec-config", "ngram", "--collect-only", "-q")
    assert collect.ret == pytest.ExitCode.OK
    assert "specdecode::test_speculation_does_not_regress[ngram-coding]" in collect.stdout.str()
    assert "Generated html report" not in collect.stdout.str()
    helped = run_in_process(pytester, "--spec-config", "ngram", "--help")
    assert helped.ret == pytest.ExitCode.OK
    refused = run_in_process(pytester, "--spec-config", "nope")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert not (pytester.path / "reports").exists()
    pytesters = ("runpytest-", "stdout", "stderr")  # pytester's own
    written = [p.name for p in pytester.path.iterdir() if not p.name.startswith(pytesters)]
    assert written == ["specdecode.toml"]


def test_no_configuration_says_where_it_looked(pytester: pytest.Pytester) -> None:
    result = run_in_process(pytester, "--spec-config", "ngram")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: no experiment is configured for *specdecode init*"])
