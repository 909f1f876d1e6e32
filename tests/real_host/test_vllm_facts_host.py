"""The systemd test host's own vLLM decides what is valid, before anything on it is touched."""

from __future__ import annotations

import pytest

from ..support.testbed import Testbed, suite_args, write_remote_experiment


@pytest.fixture
def unchanged(testbed: Testbed):
    """Asserts afterwards: same state and MainPID (never restarted), nothing of the tool's left."""
    testbed.wait_serving()
    before = testbed.state()
    yield before
    assert testbed.state() == before
    assert testbed.settled_traces() == []


def test_a_key_the_hosts_vllm_does_not_know_is_refused_before_anything(
    pytester, testbed, unchanged
):
    config = write_remote_experiment(pytester, testbed)
    spec = '{"method":"ngram","num_speculative_tokens":3,"lookahead":2}'
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", spec)
    )
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    assert (
        f"ERROR: speculative config 'ngram-k3' on {testbed.host.removeprefix('ssh://')} "
        "(vLLM 0.32.0): unknown key(s) 'lookahead'; this vLLM knows: " in err
    )
    # It was asked of the unit's own interpreter, over SSH.
    python = testbed.ssh("systemctl", "show", "-p", "ExecStart", "--value", testbed.unit).stdout
    interpreter = python.split("argv[]=")[1].split()[0]
    assert f"s] vLLM 0.32.0 on root@127.0.0.1:2222 ({interpreter}): 39 " in err
    reports = pytester.path / "reports"
    assert not reports.exists() or not any(reports.iterdir())  # no run folder either


def test_the_dry_run_says_which_vllm_it_validated_against(pytester, testbed, unchanged):
    config = write_remote_experiment(pytester, testbed)
    args = suite_args(pytester, testbed, config, "--spec-config", "ngram", "--spec-dry-run")
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "  1. validated the candidates against vLLM 0.32.0 on root@127.0.0.1:2222 (/" in out
