"""Host keys are verified: paramiko's RejectPolicy is in force unless the user opts in (fast)."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.hosts.ssh import SSHHost


class Refused(Exception):
    pass


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> list[paramiko.MissingHostKeyPolicy]:
    """The policy of each connection attempt; the attempt itself goes nowhere."""
    seen: list[paramiko.MissingHostKeyPolicy] = []

    def connect(self: paramiko.SSHClient, *args: object, **kwargs: object) -> None:
        seen.append(self._policy)
        raise Refused

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    return seen


def attempt(tmp_path: Path, **kwargs: object) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    spec = SSHSpec.parse("ssh://root@gpu-box:22", known_hosts=known, **kwargs)
    with pytest.raises(Refused):
        SSHHost(spec).connect()


def test_an_unknown_host_key_is_refused_by_default(tmp_path: Path, policies) -> None:
    attempt(tmp_path)
    assert [type(p) for p in policies] == [paramiko.RejectPolicy]


def test_only_the_explicit_opt_in_accepts_an_unknown_key(tmp_path: Path, policies) -> None:
    attempt(tmp_path, accept_unknown_host_key=True)
    assert [type(p) for p in policies] == [paramiko.AutoAddPolicy]


def test_no_known_hosts_file_is_refused_before_connecting(tmp_path: Path, policies) -> None:
    spec = SSHSpec.parse("ssh://root@gpu-box:22", known_hosts=tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"known_hosts file .* does not exist"):
        SSHHost(spec).connect()
    assert policies == []
