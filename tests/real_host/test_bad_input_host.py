"""Mistaken and hostile input against the real systemd host: refused, and the host unchanged.

Each test checks afterwards that the original unit is in the state it was found in, kept its
main PID (it was never restarted), and that no candidate unit, lock or watchdog was left.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_specdecode.targets.systemd.watchdog import LOCK_DIR

from ..support.testbed import Testbed, suite_args, write_remote_experiment

INJECTION = '{"method":"ngram","num_speculative_tokens":5,"x":"\'; touch /tmp/pwned; \'"}'


@pytest.fixture
def unchanged(testbed: Testbed):
    """The original's state before; asserts after that nothing changed on the host."""
    testbed.wait_serving()
    before = testbed.state()
    etc = testbed.persistent_units()
    yield before
    assert testbed.state() == before
    assert testbed.traces() == []
    assert testbed.persistent_units() == etc


def suite(pytester, bed: Testbed, *extra: str, config=None) -> pytest.RunResult:
    config = config or write_remote_experiment(pytester, bed)
    args = suite_args(pytester, bed, config, "--spec-config", "ngram")
    return pytester.runpytest_subprocess(*args, *extra)


@contextmanager
def stopped_unit(bed: Testbed, unit: str, service: str) -> Iterator[str]:
    """A unit of the tests' own, written to /run (runtime only) and never started; removed
    after. `service` is its [Service] section's body."""
    path = f"/run/systemd/system/{unit}"
    bed.write(path, f"[Service]\n{service}")
    bed.ssh("systemctl", "daemon-reload")
    try:
        yield unit
    finally:
        bed.ssh("rm", "-f", path)
        bed.ssh("systemctl", "daemon-reload")


def refused(result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert message in result.stdout.str() + result.stderr.str()


def test_unit_not_found(pytester, testbed, unchanged):
    result = suite(pytester, testbed, "--spec-unit", "nosuch.service")
    refused(result, "unit nosuch.service not found on root@127.0.0.1:2222")
    refused(result, "nothing was touched")


def test_original_not_active_is_refused_and_left_stopped(pytester, testbed, unchanged):
    """A vLLM unit that is installed but stopped (a unit of its own, so that the production
    unit keeps serving and needs no restart): refused, and never started."""
    python, *_ = testbed.exec_start()
    port = testbed.api_base.rsplit(":", 1)[1]
    command = f"{python} -m vllm.entrypoints.openai.api_server --model /m --port {port}"
    with stopped_unit(testbed, "vllm-stopped.service", f"ExecStart={command}\n") as unit:
        result = suite(pytester, testbed, "--spec-unit", unit)
        refused(
            result,
            f"unit {unit} on root@127.0.0.1:2222 is inactive/dead, not active: refusing to "
            "experiment",
        )
        # Never "restored" into a state that was not there: it stays stopped.
        state = testbed.ssh("systemctl", "show", unit, "--property=ActiveState").stdout
        assert state.strip() == "ActiveState=inactive"
        assert testbed.traces(unit) == []


def test_a_held_lock_names_its_owner(pytester, testbed, unchanged):
    testbed.ssh("mkdir", "-p", LOCK_DIR)
    testbed.ssh("sh", "-c", f"echo 'run 42 by alice on laptop' > {LOCK_DIR}/owner.txt")
    try:
        result = suite(pytester, testbed)
        refused(
            result,
            "root@127.0.0.1:2222 is locked by another experiment (run 42 by alice "
            "on laptop); nothing was touched",
        )
        assert testbed.ssh("cat", f"{LOCK_DIR}/owner.txt").stdout == "run 42 by alice on laptop\n"
    finally:
        testbed.ssh("rm", "-rf", LOCK_DIR)


def test_no_permission_to_write_the_unit_file(pytester, testbed, unchanged):
    setup = (
        "id bench >/dev/null 2>&1 || useradd -m bench; mkdir -p ~bench/.ssh; "
        "cp /root/.ssh/authorized_keys ~bench/.ssh/; chown -R bench ~bench/.ssh"
    )
    testbed.ssh("sh", "-c", setup)
    # A user that is not root runs every command under `sudo -n`; bench may not.
    result = suite(pytester, testbed, "--spec-host", "ssh://bench@127.0.0.1:2222")
    refused(result, "on bench@127.0.0.1:2222 exited 1: sudo: a password is required")
    refused(result, "this tool needs passwordless sudo")
    # Without sudo, it reads the unit, then finds it cannot write one.
    config = pytester.path / "remote.toml"
    no_sudo = pytester.path / "no-sudo.toml"
    no_sudo.write_text(config.read_text().replace("[target]\n", "[target]\nsudo = false\n", 1))
    result = suite(pytester, testbed, "--spec-host", "ssh://bench@127.0.0.1:2222", config=no_sudo)
    refused(result, "/run/systemd/system is not writable by bench")


def test_port_held_by_another_server(pytester, testbed, unchanged):
    rogue = [
        "systemd-run",
        "--unit=rogue-listener",
        "python3",
        "-m",
        "http.server",
        "8107",
        "--bind",
        "127.0.0.1",
    ]
    testbed.ssh(*rogue)
    try:
        result = suite(pytester, testbed, "--spec-api-base", "http://127.0.0.1:8107")
        refused(result, "port 8107 on root@127.0.0.1:2222 is held by pid")
        refused(result, f"which is not part of unit {testbed.unit}")
    finally:
        testbed.ssh("systemctl", "stop", "rogue-listener")


def test_served_model_mismatch_stops_before_the_original_is_touched(pytester, testbed, unchanged):
    result = suite(pytester, testbed, "--spec-model", "kimi-k2.5-int4")
    assert result.ret != 0
    assert (
        "serves ['smollm2-135m-instruct'], not the configured model 'kimi-k2.5-int4'"
        in result.stdout.str()
    )


def test_injection_is_refused_before_connecting(pytester, testbed, unchanged):
    config = write_remote_experiment(pytester, testbed)
    args = [
        str(pytester.path / "suites"),
        "--spec-file",
        str(config),
        *testbed.options(),
        "--spec-config",
        INJECTION,
    ]
    result = pytester.runpytest_subprocess(*args)
    refused(result, "speculative config 'ngram-k5': x must be a plain name or path")
    assert not testbed.ssh("test", "-e", "/tmp/pwned").ok
    assert not Path("/tmp/pwned").exists()


def test_unknown_host_key_through_the_suite(pytester, testbed, unchanged, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    result = suite(pytester, testbed, "--spec-known-hosts", str(empty))
    refused(result, "unknown host key")


def test_unreachable_host_fails_fast(pytester, testbed, unchanged):
    result = suite(pytester, testbed, "--spec-host", "ssh://root@127.0.0.1:1")
    refused(result, "root@127.0.0.1:1: cannot connect within 10s")


def test_a_variable_set_nowhere_is_refused_with_where_it_was_looked_for(
    pytester, testbed, unchanged
):
    """The real systemd reports the unit's environment; nothing sets ${SERVED_NAME}."""
    python, *_ = testbed.exec_start()
    service = (
        "Environment=VLLM_PORT=8000\nEnvironmentFile=-/etc/vllm/unset.env\n"
        f"ExecStart={python} -m vllm.entrypoints.openai.api_server --model /m "
        "--port ${VLLM_PORT} --served-model-name ${SERVED_NAME}\n"
    )
    with stopped_unit(testbed, "vllm-unset.service", service) as unit:
        result = suite(pytester, testbed, "--spec-unit", unit, "--spec-dry-run")
        refused(
            result,
            f"unit {unit} on root@127.0.0.1:2222: ExecStart uses ${{SERVED_NAME}}, which is set "
            "nowhere systemd looks: the manager's environment (systemctl show-environment); "
            "Environment= of the unit and its drop-ins; EnvironmentFile=-/etc/vllm/unset.env "
            "(missing: skipped, as systemd does).",
        )
        refused(result, "Nothing was touched")
