"""Reaching the test host as operators do: an ssh_config alias through a real jump host, a
non-root user with a restricted sudo rule, and the API reachable only through SSH.

The controller runs inside the network namespace of scripts/testbed/reach-host: from there the
host's sshd and its API are unreachable, and only the jump host answers.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.hosts.tunnel import ApiTunnel

from ..support.embedded import all_samples
from ..support.testbed import Reach, Testbed, results_of, write_remote_experiment


@pytest.fixture(autouse=True)
def original_serving_before_and_after(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.settled_traces() == []
    yield
    testbed.wait_serving(timeout_s=120)
    testbed.assert_original_restored()


def journal_since(testbed: Testbed, since: float, *match: str) -> str:
    """The host's journal lines since `since` (epoch seconds), filtered by journalctl matches."""
    argv = ["journalctl", *match, "--since", f"@{int(since) - 1}", "-o", "cat", "--no-pager"]
    return testbed.ssh(*argv).stdout


def test_alias_with_proxyjump_sudo_user_and_api_only_through_ssh_runs_the_workflow(
    pytester: pytest.Pytester, testbed: Testbed, reach: Reach
):
    host_port = 2222
    api = httpx.URL(reach.api_base)
    # From the controller's namespace, neither the host's sshd nor its API can be reached.
    assert not reach.reachable_from_netns("127.0.0.1", host_port)
    assert not reach.reachable_from_netns(api.host, api.port)
    assert reach.reachable_from_netns("10.213.0.1", 2223)  # the jump host answers

    # 16 tokens a request (the podman unit's test's): what is read is that each phase was
    # measured through the tunnel, not how fast
    config = write_remote_experiment(pytester, testbed, run={"samples": 5, "max_tokens": 16})
    # No api_base at all: the API is reached through the SSH connection.
    config.write_text(re.sub(r'(?m)^api_base = ".*"\n', "", config.read_text()))
    before = testbed.state()
    started = time.time()
    argv = reach.in_netns(
        sys.executable,
        "-m",
        "pytest",
        str(pytester.path / "suites"),
        "--spec-file",
        str(config),
        "--spec-host",
        reach.alias,
        "--spec-ssh-config",
        str(reach.ssh_config),
        "--spec-unit",
        testbed.unit,
        "--spec-model",
        testbed.model,
        "--spec-workload",
        "coding",
        "--spec-config",
        "ngram",
        "-p",
        "no:cacheprovider",
    )
    proc = subprocess.run(argv, cwd=pytester.path, capture_output=True, text=True, timeout=1200)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out + err

    name = "deploy@127.0.0.1:2222 (specdecode-gpu; via jump@10.213.0.1:2223)"
    assert f"forwarded over SSH to 127.0.0.1:{api.port} on {name}" in err, err
    # The unit says `--port ${VLLM_PORT}`: 8000 in Environment=, overridden by the file that a
    # drop-in names (scripts/testbed/systemd-host), read as systemd expands it.
    origin = "(ExecStart as systemd expands it: VLLM_PORT from EnvironmentFile=/etc/default/"
    assert origin + "vllm-kimi-k25-int4)" in err, err
    assert err.count(f"stopping unit {testbed.unit} on {name}") == 1, err
    assert err.count(f"starting candidate ngram: unit {testbed.unit} on {name}") == 1, err
    assert re.search(r"restored to active and serving in \d+s", err), err

    data = results_of(pytester)
    assert data["target"]["host"] == name
    samples = all_samples(data)
    by_phase = {p: [s for s in samples if s["phase"] == p] for p in ("baseline", "ngram")}
    assert all(len(s) >= 5 for s in by_phase.values()), by_phase
    assert all(s["output_tokens"] > 0 for s in samples)
    assert data["phases"]["ngram"]["acceptance"]["present"] is True  # /metrics, tunnelled too
    assert testbed.state()["MainPID"] != before["MainPID"]

    # Every command ran under sudo as deploy, within the restricted rule (a refused one fails
    # the run); the candidate file was written with install, not a shell.
    sudo_log = journal_since(testbed, started, "_COMM=sudo")
    assert re.search(
        rf"deploy : .*USER=root ; COMMAND=/usr/bin/systemctl stop {re.escape(testbed.unit)}",
        sudo_log,
    ), sudo_log[-3000:]
    dropin_dir = f"/run/systemd/system/{testbed.unit}.d/"
    assert f"COMMAND=/usr/bin/install -m 0644 -D /dev/stdin {dropin_dir}" in sudo_log, sudo_log
    assert "/etc/systemd/system" not in sudo_log  # a runtime drop-in: gone at the next boot
    assert "COMMAND=/usr/bin/sh" not in sudo_log and "incorrect password" not in sudo_log
    # And it came in through the jump host, from the controller's namespace.
    jump_log = journal_since(testbed, started, "-u", "specdecode-jump-sshd.service")
    assert "Accepted publickey for jump from 10.213.0.2" in jump_log, jump_log[-2000:]


def test_sudo_that_asks_for_a_password_is_refused_before_anything_is_touched(
    pytester: pytest.Pytester, testbed: Testbed, reach: Reach
):
    config = write_remote_experiment(pytester, testbed)
    before = testbed.state()
    host = f"ssh://{reach.password_user}@127.0.0.1:2222"
    options = testbed.options()
    options[options.index(testbed.host)] = host
    result = pytester.runpytest_subprocess(
        str(pytester.path / "suites"),
        "--spec-file",
        str(config),
        *options,
        "--spec-workload",
        "coding",
        "--spec-config",
        "ngram",
        "-p",
        "no:cacheprovider",
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    # The first command (reading the unit for the plan) already names host, user and command.
    assert re.search(
        rf"`sudo -n -- systemctl cat {re.escape(testbed.unit)}` on "
        rf"{reach.password_user}@127\.0\.0\.1:2222 exited 1: sudo: a password is required",
        text,
    ), text
    assert "passwordless sudo" in text and "Nothing on the host was touched" in text
    assert "stopping unit" not in text
    assert testbed.state()["MainPID"] == before["MainPID"]


def known_hosts_with_jump_key(reach: Reach, tmp_path, *, forged: bool):
    """The reach known_hosts with the jump host's line replaced by another key, or dropped."""
    lines = reach.known_hosts.read_text().splitlines()
    kept = [line for line in lines if not line.startswith("[10.213.0.1]:2223 ")]
    assert len(kept) == len(lines) - 1
    if forged:
        other = tmp_path / "other_ed25519"
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)]
        subprocess.run(keygen, check=True)
        key = other.with_suffix(".pub").read_text().split()[1]
        kept.append(f"[10.213.0.1]:2223 ssh-ed25519 {key}")
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(kept) + "\n")
    return path


def test_a_changed_host_key_on_the_jump_hop_is_always_refused(reach: Reach, tmp_path):
    forged = known_hosts_with_jump_key(reach, tmp_path, forged=True)
    for accept in (False, True):
        spec = SSHSpec.parse(
            reach.alias,
            ssh_config_path=reach.ssh_config,
            known_hosts=forged,
            accept_unknown_host_key=accept,
        )
        changed = r"^jump host jump@10\.213\.0\.1:2223: the host key CHANGED .*Nothing on the"
        with pytest.raises(ConfigError, match=changed):
            SSHHost(spec, connect_timeout_s=5).connect()


def test_an_unknown_jump_host_key_is_refused_unless_opted_in(reach: Reach, tmp_path):
    missing = known_hosts_with_jump_key(reach, tmp_path, forged=False)
    spec = SSHSpec.parse(reach.alias, ssh_config_path=reach.ssh_config, known_hosts=missing)
    with pytest.raises(ConfigError, match=r"^jump host jump@10\.213\.0\.1:2223: unknown host key"):
        SSHHost(spec, connect_timeout_s=5).connect()
    opted_in = SSHHost(
        SSHSpec.parse(
            reach.alias,
            ssh_config_path=reach.ssh_config,
            known_hosts=missing,
            accept_unknown_host_key=True,
        )
    )
    try:
        assert opted_in.check(["systemctl", "--version"]).ok  # as deploy, under sudo
    finally:
        opted_in.close()


def test_the_api_tunnel_survives_a_dropped_ssh_connection_and_closes(
    testbed: Testbed, reach: Reach
):
    spec = SSHSpec.parse(reach.alias, ssh_config_path=reach.ssh_config)
    api = httpx.URL(reach.api_base)
    tunnel = ApiTunnel(SSHHost(spec, connect_timeout_s=5), (api.host, api.port))
    try:
        assert tunnel.remote_answers()
        models = httpx.get(f"{tunnel.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [testbed.model]
        # Kill every session of deploy on the host: the tunnel's connection drops.
        testbed.ssh("pkill", "-KILL", "-f", "sshd: deploy")
        time.sleep(1)
        assert httpx.get(f"{tunnel.url}/health", timeout=30).status_code == 200
        assert tunnel.forwarded >= 2
    finally:
        tunnel.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tunnel.url}/health", timeout=5)
