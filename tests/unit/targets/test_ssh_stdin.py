"""A remote command that exits before it reads its input: its exit status and stderr say what
happened, not an OSError from the closed channel (fast: a stand-in channel, no socket).

A fresh-clone CI on 2026-12-07: the facts fingerprint, `python3 -` fed over stdin as a user
without sudo, found the channel closed under `sendall`; the run ended in pytest's INTERNALERROR
where it should have refused with the host's own words."""

from __future__ import annotations

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.targets.hosts.ssh import SSHHost


class ExitedChannel:
    """A channel whose command has already exited: writing to it fails as paramiko's does."""

    closed = False

    def __init__(self) -> None:
        self.stderr = [b"bash: /opt/venv/bin/python3: Permission denied\n"]

    def settimeout(self, _t: float) -> None: ...

    def exec_command(self, _command: str) -> None: ...

    def sendall(self, _data: bytes) -> None:
        raise OSError("Socket is closed")

    def shutdown_write(self) -> None:
        raise OSError("Socket is closed")

    def recv_ready(self) -> bool:
        return False

    def recv_stderr_ready(self) -> bool:
        return bool(self.stderr)

    def recv_stderr(self, _n: int) -> bytes:
        return self.stderr.pop(0)

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 126


def test_a_command_that_exits_before_its_input_is_read_gives_its_status(tmp_path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = SSHHost(SSHSpec.parse("ssh://bench@gpu-box:22", known_hosts=known))
    argv = ("/opt/venv/bin/python3", "-")
    result = host._finish(ExitedChannel(), argv, "/opt/venv/bin/python3 -", 5.0, "print(1)\n")
    assert result.exit_status == 126 and not result.ok
    assert "Permission denied" in result.stderr
