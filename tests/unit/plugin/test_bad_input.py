"""Mistaken and hostile input on the local side: refused clearly, before anything starts.

Host-side cases are in test_bad_input_host.py; spec-config and config-file cases in
test_specconfig.py and test_config.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ...support.embedded import write_experiment
from ...support.inprocess import run_in_process

INJECTION = '{"method":"ngram","num_speculative_tokens":5,"x":"\'; touch /tmp/pwned; \'"}'


@pytest.fixture
def experiment(pytester: pytest.Pytester):
    return write_experiment(pytester)


def run(pytester: pytest.Pytester, experiment, *extra: str) -> pytest.RunResult:
    return run_in_process(pytester, *experiment.args(*extra))


def assert_untouched(experiment) -> None:
    assert experiment.leftover_servers() == []
    assert not experiment.reports.exists() or not any(experiment.reports.iterdir())


def test_injection_through_the_spec_config_never_reaches_a_shell(pytester, experiment):
    result = run(pytester, experiment, "--spec-config", INJECTION)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # Refused by its shape, before any vLLM or host is asked.
    result.stderr.fnmatch_lines(["ERROR: speculative config 'ngram-k5': x must be a plain name*"])
    assert not Path("/tmp/pwned").exists()
    assert_untouched(experiment)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"method":"ngram","num_speculative_tokens":5', "*is not valid JSON*"),
        ('{"method":"medusa2","num_speculative_tokens":5}', "*unknown method 'medusa2'*"),
        ('{"method":"ngram","num_speculative_tokens":0}', "*num_speculative_tokens must be > 0*"),
        ('{"method":"eagle3","num_speculative_tokens":3}', "*needs a draft 'model'*"),
        ("ngram-k9", "*is neither inline JSON nor a preset; known presets: ngram, suffix*"),
    ],
)
def test_bad_spec_configs_stop_pytest_before_anything_starts(pytester, experiment, spec, message):
    result = run(pytester, experiment, "--spec-config", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert_untouched(experiment)


def test_missing_config_file_is_a_usage_error(pytester, experiment):
    result = run_in_process(
        pytester,
        str(experiment.dir / "suites"),
        "--spec-file",
        "nope.toml",
        "--spec-config",
        "ngram",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: configuration file *nope.toml does not exist*"])


def test_malformed_toml_is_a_usage_error(pytester, experiment):
    experiment.config.write_text("[target\napi_base = 1\n")
    result = run(pytester, experiment, "--spec-config", "ngram")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *experiment.toml is not valid TOML*"])


def test_unwritable_reports_dir_is_refused_before_any_server_starts(pytester, experiment):
    result = run(pytester, experiment, "--spec-config", "ngram", "--spec-reports", "/proc/x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: reports directory /proc/x is not writable (*); nothing was started.*"]
    )
    assert experiment.leftover_servers() == []


def test_negative_samples_from_the_command_line(pytester, experiment):
    result = run(pytester, experiment, "--spec-config", "ngram", "--spec-samples", "-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *samples must be an integer >= 1, got -3"])


def test_unknown_prompt_type_from_the_command_line(pytester, experiment):
    result = run(pytester, experiment, "--spec-config", "ngram", "--spec-workload", "poetry")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --spec-prompt-type poetry: no such prompt type*"])


def test_xdist_is_refused(pytester, experiment):
    pytest.importorskip("xdist")
    result = run(pytester, experiment, "--spec-config", "ngram", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-specdecode refuses to run under pytest-xdist*"])
    assert_untouched(experiment)


def test_api_key_on_the_local_command_line_is_refused(pytester, experiment):
    config = experiment.config.read_text()
    assert '"--seed", "0"' in config
    text = config.replace('"--seed", "0"', '"--api-key", "sk-live-1"')
    experiment.config.write_text(text)
    result = run(pytester, experiment, "--spec-config", "ngram")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *the command carries --api-key*api_key_env*"])
    assert "sk-live-1" not in result.stderr.str().split("ERROR:")[0]
