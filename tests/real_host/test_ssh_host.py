"""The SSH host against a real sshd (the systemd test host): keys, quoting, bounds, reconnect."""

from __future__ import annotations

import time
from pathlib import Path

import paramiko
import pytest

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import ConfigError, HostError
from pytest_specdecode.targets.hosts.ssh import SSHHost

from ..support.testbed import Testbed


def host_for(bed: Testbed, **kwargs) -> SSHHost:
    options = {"identity_file": bed.identity, "known_hosts": bed.known_hosts, **kwargs}
    return SSHHost(SSHSpec.parse(bed.host, **options), connect_timeout_s=5)


def test_every_argument_reaches_the_remote_command_verbatim(testbed: Testbed, tmp_path):
    hostile = ["a b", "'; touch /tmp/pwned-ssh; '", "$(touch /tmp/pwned-ssh)", "`id`", "x\ny"]
    host = host_for(testbed)
    try:
        out = host.check(["sh", "-c", 'printf "<%s>" "$@"', "sh", *hostile]).stdout
        assert out == "".join(f"<{a}>" for a in hostile)
        assert not host.run(["test", "-e", "/tmp/pwned-ssh"]).ok
    finally:
        host.close()
    assert not Path("/tmp/pwned-ssh").exists()


def test_stdin_carries_content_and_large_output_is_drained(testbed: Testbed):
    host = host_for(testbed)
    try:
        assert host.check(["cat"], stdin="line one\n$(id)\n").stdout == "line one\n$(id)\n"
        out = host.check(
            [
                "sh",
                "-c",
                "head -c 3000000 /dev/zero | od -An -v | wc -c; head -c 300000 /dev/zero >&2",
            ],
            timeout=60,
        )
        assert int(out.stdout.strip()) > 3_000_000 and len(out.stderr) == 300_000
    finally:
        host.close()


def test_unknown_host_key_is_refused_unless_opted_in(testbed: Testbed, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"unknown host key .*refusing.*Nothing on the host"):
        host_for(testbed, known_hosts=empty).connect()
    opted_in = host_for(testbed, known_hosts=empty, accept_unknown_host_key=True)
    try:
        assert opted_in.check(["true"]).ok
    finally:
        opted_in.close()


def test_a_changed_host_key_is_always_refused(testbed: Testbed, tmp_path):
    other = paramiko.RSAKey.generate(2048)
    forged = tmp_path / "known_hosts"
    forged.write_text(
        f"[127.0.0.1]:2222 ssh-rsa {other.get_base64()}\n"
        f"[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBnD"
        f"tqDfFnQ2mQ1jLQLqkiKc9g3K0H5hH3mC2mH0b8xY\n"
    )
    for accept in (False, True):
        with pytest.raises(ConfigError, match="the host key CHANGED"):
            host_for(testbed, known_hosts=forged, accept_unknown_host_key=accept).connect()


def test_authentication_refused_names_user_and_key(testbed: Testbed, tmp_path):
    stranger = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(stranger))
    with pytest.raises(ConfigError, match=rf"authentication refused .*{stranger}"):
        host_for(testbed, identity_file=stranger).connect()


def test_unreachable_host_fails_fast(testbed: Testbed):
    spec = SSHSpec.parse(
        "ssh://root@127.0.0.1:1", identity_file=testbed.identity, known_hosts=testbed.known_hosts
    )
    # the message names the bound that ended it (a benchmark, not a test, would time it)
    with pytest.raises(HostError, match=r"root@127.0.0.1:1: cannot connect within 5s"):
        SSHHost(spec, connect_timeout_s=5).connect()


def test_a_hanging_command_is_bounded(testbed: Testbed):
    host = host_for(testbed)
    try:
        with pytest.raises(HostError, match=r"`sleep 30` did not finish within 1s"):
            host.run(["sleep", "30"], timeout=1)  # the message names the bound that ended it
    finally:
        host.close()


def test_one_reconnect_after_the_connection_drops(testbed: Testbed):
    host = host_for(testbed)
    try:
        assert host.check(["true"]).ok
        testbed.ssh("pkill", "-KILL", "-f", "sshd: root")  # drops every session, ours too
        testbed.close()
        time.sleep(1)
        assert host.check(["echo", "back"]).stdout == "back\n"
    finally:
        host.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("root@127.0.0.1:2222", "expected ssh://user@host"),
        ("ssh://root@127.0.0.1:99999", "port is not a number"),
        ("ssh://ro;ot@127.0.0.1", "not a valid user name"),
        ("ssh://root@bad_host$(id)", "not a valid host name"),
        ("ssh://root@127.0.0.1/etc", "expected ssh://user@host"),
    ],
)
def test_host_specs_are_validated_before_connecting(url, message):
    with pytest.raises(ConfigError, match=message):
        SSHSpec.parse(url)
