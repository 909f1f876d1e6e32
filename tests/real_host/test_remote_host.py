"""The seed's workflow on a real systemd host over SSH, and every way it can go wrong.

Each test ends by checking that the production unit is active, serves its model, and that
nothing of the tool's is left on the host.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from ..support.embedded import all_samples
from ..support.pipes import finish
from ..support.terminal import Terminal
from ..support.testbed import (
    Testbed,
    results_of,
    results_path,
    run_until,
    suite_args,
    wait_for_sample,
    write_remote_experiment,
)


@pytest.fixture(autouse=True)
def original_serving_before_and_after(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.settled_traces() == []
    etc = testbed.persistent_units()
    yield
    testbed.wait_serving(timeout_s=120)  # a restore must already have waited for health
    testbed.assert_original_restored()
    assert testbed.persistent_units() == etc  # nothing written to /etc/systemd/system


def test_seed_workflow_baseline_candidate_restore_through_a_dropped_ssh_connection(
    pytester: pytest.Pytester, testbed: Testbed
):
    """The whole workflow with two candidates. Mid-way through the first candidate's requests,
    every SSH session on the host is killed: the controller reconnects and goes on."""
    # The candidate's TPOT ceiling is impossible: a failing assertion must still restore.
    # 16 tokens a request, not 32: three windows of what the assertions read (phases, starts,
    # acceptance present), not of how fast
    config = write_remote_experiment(
        pytester,
        testbed,
        run={"record_token_ids": True, "max_tokens": 16},
        thresholds="max_tpot_ms = 1000",
    )
    config.write_text(
        config.read_text().replace(
            "[prompt_types.coding]\n", "[prompt_types.coding]\nmin_tokens_per_s = 1.0\n"
        )
    )
    before = testbed.state()
    seen: list[str] = []
    proc = run_until(
        pytester, testbed, config, "[ngram] coding:", "--spec-config", "ngram-k3", "-rA", seen=seen
    )
    # Kill every SSH session on the host: the controller's connections drop mid-measurement.
    testbed.ssh("pkill", "-KILL", "-f", "sshd: root")
    testbed.close()
    _, rest = finish(proc, 900)
    err = "".join(seen) + rest
    data = results_of(pytester)
    gate_fails = any(
        data["analysis"]["verdicts"][c]["coding"]["verdict"] not in ("improved", "equivalent")
        for c in ("ngram", "ngram-k3")
    )
    assert proc.returncode == (
        pytest.ExitCode.TESTS_FAILED if gate_fails else pytest.ExitCode.OK
    ), err

    # Two candidates: candidates + 1 restarts. The original stops once and starts once; each
    # candidate is the production unit itself with a runtime drop-in.
    assert err.count(f"stopping unit {testbed.unit} on") == 1, err
    assert err.count("starting candidate ") == 2, err
    assert f"starting {testbed.candidate_label('ngram-k3')}" in err, err
    assert err.count(f"restore: starting unit {testbed.unit}") == 1, err
    assert re.search(r"restored to active and serving in \d+s", err), err
    assert data["phases"]["baseline"]["acceptance"]["present"] is False
    assert data["phases"]["ngram"]["acceptance"]["present"] is True
    assert data["phases"]["ngram-k3"]["acceptance"]["present"] is True
    assert data["phases"]["ngram"]["service"].startswith(testbed.candidate_label("ngram"))
    assert data["ending"]["how"] == "finished" and data["ending"]["restore_observed"] is True
    assert data["target"]["unit"] == testbed.unit
    assert data["restore"]["was_active"] and data["restore"]["is_active"]
    # The original was restarted exactly once (stopped for the candidate, started at restore).
    assert testbed.state()["MainPID"] != before["MainPID"]


# The tests of a candidate that fails measure nothing that they read: their baseline's
# requests are as short as a request may be here (8 tokens: busy_host's too), not 32.
FAILING_CANDIDATE_RUN = {"samples": 5, "warmup": 0, "max_tokens": 8}


def test_candidate_crash_loop_is_detected_and_restored(pytester, testbed):
    # vLLM accepts the JSON, then the engine exits: the unit restarts it again and again.
    config = write_remote_experiment(pytester, testbed, run=FAILING_CANDIDATE_RUN)
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "suffix")
    )
    out = result.stdout.str()
    assert result.ret != 0
    assert testbed.candidate_label("suffix") in out
    assert re.search(
        r"crash loop: NRestarts climbed|the unit failed|stopped by itself|the engine died", out
    )
    # One start attempt: the other tests of that phase fail at once, with no second reload.
    assert result.stderr.str().count(f"starting {testbed.candidate_label('suffix')}") == 1
    assert "Arctic Inference is required for suffix decoding" in out  # the journal tail
    assert "restored to active and serving" in result.stderr.str()


def test_candidate_that_never_gets_healthy_times_out_and_restores(pytester, testbed):
    config = write_remote_experiment(
        pytester, testbed, run=FAILING_CANDIDATE_RUN, target={"startup_timeout_s": 4}
    )
    # The baseline is already up, so only the candidate's start can take longer than 4 s. A
    # CPU vLLM's start took 12 s on a quiet machine (ready at a 12 s limit on 2026-12-07), so the
    # limit is a third of the fastest start seen, not a guess about a busy one.
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "ngram")
    )
    out = result.stdout.str()
    assert result.ret != 0
    assert testbed.candidate_label("ngram") in out and "not ready after 4s" in out
    assert "restored to active and serving" in result.stderr.str()


def test_exception_in_the_fixture_restores(pytester, testbed):
    config = write_remote_experiment(pytester, testbed, run=FAILING_CANDIDATE_RUN)
    pytester.makeconftest("""
        from pytest_specdecode.measure.experiment.arms import Experiment
        original = Experiment._new_phase
        def broken(self, name, arm, spec, service, **kwargs):
            if name != "baseline":  # the candidate is serving: the original was stopped
                raise RuntimeError("injected fault in the candidate phase")
            return original(self, name, arm, spec, service, **kwargs)
        Experiment._new_phase = broken
    """)
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "ngram")
    )
    assert result.ret != 0
    assert "injected fault in the candidate phase" in result.stdout.str()
    assert "restored to active and serving" in result.stderr.str()


# A restore handed to the host at the signal takes a stop, a daemon-reload and a start of the
# original. Without the handover only the watchdog would restore, WATCHDOG_S after the last
# renewal. A start took 35 to 110 s on this 2-core machine (the longest beside the embedded
# vLLM's tests), so the restore must be over well before the watchdog could have fired.
WATCHDOG_S = 900
RESTORED_WITHIN_S = WATCHDOG_S / 3


def test_ctrl_c_in_a_terminal_on_pytest_piped_to_tee_restores(pytester, testbed):
    """Ctrl-C reaches the whole foreground process group: tee dies and the pipe breaks. The
    first signal mid-candidate hands the restore to the host; the run records how it ended."""
    # Ctrl-C comes once a candidate request has ended (wait_for_sample): 16 tokens a request
    # leave 7 more under way, and the baseline's 9 requests cost half of what 32 did
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 8, "max_tokens": 16}, target={"watchdog_s": WATCHDOG_S}
    )
    suite = [sys.executable, "-m", "pytest"]
    suite += suite_args(pytester, testbed, config, "--spec-config", "ngram")
    log = pytester.path / "tee.log"
    with Terminal(["bash", "-c", f"{shlex.join(suite)} | tee {shlex.quote(str(log))}"]) as term:
        term.wait_for("[ngram] coding:", timeout_s=600)
        wait_for_sample(pytester, "ngram")  # a candidate request is done, more are under way
        term.write(b"\x03")  # what the terminal sends on Ctrl-C
        # The host puts the original back at once, without the watchdog (900 s here): the
        # wait fails long before the watchdog could fire.
        testbed.wait_serving(timeout_s=RESTORED_WITHIN_S + 60, poll_s=1)
        term.wait_exit(timeout_s=300)
    run_log = (results_path(pytester).parent / "run.log").read_text()
    assert "interrupted by SIGINT: the restore was handed over at once" in run_log
    assert "run ending: interrupted by SIGINT; the restore was handed over" in run_log
    data = results_of(pytester)
    assert any(s["phase"] == "ngram" for s in all_samples(data))  # what was measured is kept
    # How the run ended: the signal, the handover to the host at once, and the restore seen.
    ending = data["ending"]
    assert ending["how"] == "interrupted" and ending["signals"] == ["SIGINT"], ending
    assert "pytest-specdecode-watchdog.service" in ending["handed_over"], ending
    # The handover came first, then the restore seen: by the host at once, not by the watchdog
    # (900 s), whose timer the wait above (it gives up at RESTORED_WITHIN_S + 60) rules out.
    assert ending["restore_observed"] is True, ending
    assert 0 <= ending["handover_s"] <= ending["restore_s"], ending


def test_github_actions_cancel_sequence_restores_without_the_watchdog(pytester, testbed):
    """SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after that: the host restores by itself."""
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 8, "max_tokens": 32}, target={"watchdog_s": 900}
    )
    seen: list[str] = []
    proc = run_until(pytester, testbed, config, "[ngram] coding:", seen=seen)
    time.sleep(5)
    cancelled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(2)
    # Meanwhile a second controller is refused by the lock, and told why.
    second = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            *suite_args(pytester, testbed, config, "--spec-config", "ngram"),
            "--spec-reports",
            str(pytester.path / "second"),
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(max(0.0, 7.5 - (time.monotonic() - cancelled)))
    proc.send_signal(signal.SIGTERM)
    time.sleep(2.5)
    proc.kill()
    proc.wait(timeout=30)
    # At once, not by the watchdog (900 s): the wait gives up long before it could fire.
    testbed.wait_serving(timeout_s=RESTORED_WITHIN_S + 60, poll_s=1)
    refused, _ = second.communicate(timeout=120)
    assert second.returncode == pytest.ExitCode.USAGE_ERROR, refused
    assert "is locked by another experiment (run " in refused, refused
    assert "restore in progress since" in refused and "handed to the host by run" in refused
    # The controller recorded the handover at once, and the second signal, which ended its
    # watching; it did not live to see the restore end (SIGKILL).
    ending = results_of(pytester)["ending"]
    assert ending["signals"] == ["SIGINT", "SIGTERM"] and ending["handed_over"], ending
    assert ending["restore_observed"] is False and ending["restore_s"] is None, ending


def test_sigkilled_controller_is_restored_by_the_host_watchdog(pytester, testbed):
    watchdog_s = 20
    # killed at the candidate's first line: its window's length does not matter, the
    # baseline's 9 requests of 16 tokens cost half of what 32 did
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 8, "max_tokens": 16}, target={"watchdog_s": watchdog_s}
    )
    proc = run_until(pytester, testbed, config, "[ngram] coding:")
    assert testbed.ssh("systemctl", "is-active", testbed.unit).stdout.strip() == "active"
    assert testbed.ssh("test", "-e", testbed.dropin).ok  # the candidate is configured
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
