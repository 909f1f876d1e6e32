"""The seed's workflow on a real systemd host over SSH, and every way it can go wrong.

Each test ends by checking that the production unit is active, serves its model, and that
nothing of the tool's is left on the host.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from ..support.embedded import all_samples
from ..support.testbed import Testbed, results_of, suite_args, write_remote_experiment


@pytest.fixture(autouse=True)
def original_serving_before_and_after(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.traces() == []
    yield
    testbed.wait_serving(timeout_s=120)  # a restore must already have waited for health
    testbed.assert_original_restored()


def test_seed_workflow_baseline_candidate_restore(pytester: pytest.Pytester, testbed: Testbed):
    # The candidate's TPOT ceiling is impossible: a failing assertion must still restore.
    config = write_remote_experiment(pytester, testbed, thresholds="max_tpot_ms = 1000")
    config.write_text(
        config.read_text().replace(
            "[prompt_types.coding]\n", "[prompt_types.coding]\nmin_tokens_per_s = 1.0\n"
        )
    )
    before = testbed.state()
    result = pytester.runpytest_subprocess(
        *suite_args(
            pytester, testbed, config, "--spec-config", "ngram", "--spec-config", "ngram-k3", "-rA"
        )
    )
    out, err = result.stdout.str(), result.stderr.str()
    data = results_of(pytester)
    gate_fails = any(
        data["analysis"]["verdicts"][c]["coding"]["verdict"] not in ("improved", "equivalent")
        for c in ("ngram", "ngram-k3")
    )
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if gate_fails else pytest.ExitCode.OK), out

    # Two candidates: candidates + 1 restarts. The original stops once and starts once.
    assert err.count(f"stopping unit {testbed.unit} on") == 1, err
    assert err.count(f"starting unit {testbed.candidate_unit}") == 2, err
    assert err.count(f"restore: starting unit {testbed.unit}") == 1, err
    assert re.search(r"restored to active and serving in \d+s", err), err
    assert data["phases"]["baseline"]["acceptance"]["present"] is False
    assert data["phases"]["ngram"]["acceptance"]["present"] is True
    assert data["phases"]["ngram-k3"]["acceptance"]["present"] is True
    assert data["phases"]["ngram"]["service"].startswith(f"unit {testbed.candidate_unit}")
    assert data["target"]["unit"] == testbed.unit
    assert data["restore"]["was_active"] and data["restore"]["is_active"]
    # The original was restarted exactly once (stopped for the candidate, started at restore).
    assert testbed.state()["MainPID"] != before["MainPID"]


def test_candidate_crash_loop_is_detected_and_restored(pytester, testbed):
    # vLLM accepts the JSON, then the engine exits: the unit restarts it again and again.
    config = write_remote_experiment(pytester, testbed, run={"samples": 5, "warmup": 0})
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "suffix")
    )
    out = result.stdout.str()
    assert result.ret != 0
    assert f"unit {testbed.candidate_unit}" in out
    assert re.search(
        r"crash loop: NRestarts climbed|the unit failed|stopped by itself|the engine died", out
    )
    # One start attempt: the other tests of that phase fail at once, with no second reload.
    assert result.stderr.str().count(f"starting unit {testbed.candidate_unit}") == 1
    assert "Arctic Inference is required for suffix decoding" in out  # the journal tail
    assert "restored to active and serving" in result.stderr.str()


def test_candidate_that_never_gets_healthy_times_out_and_restores(pytester, testbed):
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 5, "warmup": 0}, target={"startup_timeout_s": 12}
    )
    # The baseline is already up, so only the candidate's start can take longer than 12 s.
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "ngram")
    )
    out = result.stdout.str()
    assert result.ret != 0
    assert f"unit {testbed.candidate_unit} on" in out and "not ready after 12s" in out
    assert "restored to active and serving" in result.stderr.str()


def test_exception_in_the_fixture_restores(pytester, testbed):
    config = write_remote_experiment(pytester, testbed, run={"samples": 5, "warmup": 0})
    pytester.makeconftest("""
        from pytest_specdecode.measure.experiment import Experiment
        original = Experiment._measure
        def broken(self, name, spec, service):
            if name != "baseline":
                raise RuntimeError("injected fault in the candidate phase")
            return original(self, name, spec, service)
        Experiment._measure = broken
    """)
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "ngram")
    )
    assert result.ret != 0
    assert "injected fault in the candidate phase" in result.stdout.str()
    assert "restored to active and serving" in result.stderr.str()


def run_until(pytester, testbed, config, marker: str, *extra: str) -> subprocess.Popen:
    """Start the suite in a subprocess and return once `marker` shows in its progress."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *suite_args(pytester, testbed, config, "--spec-config", "ngram", *extra),
    ]
    proc = subprocess.Popen(
        cmd, cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen = []
    deadline = time.monotonic() + 600
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    pytest.fail(f"never saw {marker!r}:\n{''.join(seen)}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_candidate_measurement_restores(pytester, testbed, sig):
    config = write_remote_experiment(pytester, testbed, run={"samples": 8, "max_tokens": 64})
    proc = run_until(pytester, testbed, config, "[ngram] coding:")
    time.sleep(10)  # a few candidate requests are done, more are under way
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err
    assert "restored to active and serving" in err
    samples = all_samples(results_of(pytester))
    assert any(s["phase"] == "ngram" for s in samples)  # what was measured is kept


def test_dropped_ssh_connection_reconnects_and_restores(pytester, testbed):
    config = write_remote_experiment(pytester, testbed, run={"samples": 6, "max_tokens": 64})
    proc = run_until(pytester, testbed, config, "[ngram] coding:")
    # Kill every SSH session on the host: the controller's connections drop mid-measurement.
    testbed.ssh("pkill", "-KILL", "-f", "sshd: root")
    testbed.close()
    _, err = proc.communicate(timeout=600)
    assert "restored to active and serving" in err, err
    assert proc.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), err


def test_sigkilled_controller_is_restored_by_the_host_watchdog(pytester, testbed):
    watchdog_s = 20
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 30, "max_tokens": 64}, target={"watchdog_s": watchdog_s}
    )
    proc = run_until(pytester, testbed, config, "[ngram] coding:")
    assert testbed.ssh("systemctl", "is-active", testbed.candidate_unit).stdout.strip() == "active"
    since = testbed.ssh("date", "+%s").stdout.strip()
    proc.kill()  # SIGKILL: no teardown runs on the controller
    proc.wait(timeout=30)
    assert testbed.traces() != []  # the candidate is still up; only the host can restore now
    waited = testbed.wait_serving(timeout_s=watchdog_s + 240)
    # The last renewal came at most watchdog_s / 3 before the kill: nothing restored sooner.
    assert waited >= watchdog_s * 2 / 3 - 2, waited
    journal = testbed.ssh(
        "journalctl",
        "-u",
        "pytest-specdecode-watchdog.service",
        "--since",
        f"@{since}",
        "-o",
        "cat",
        "--no-pager",
    ).stdout
    assert "pytest-specdecode watchdog" in journal, journal  # the watchdog's unit really ran
