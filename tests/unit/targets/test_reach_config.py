"""Reaching a host, in milliseconds: ssh_config resolution, sudo wrapping, the API route, and the
tunnel's forwarding over a stand-in SSH connection. The real thing: tests/test_reach_host.py.
"""

from __future__ import annotations

import getpass
import re
import socket
import threading
from pathlib import Path

import httpx
import paramiko
import pytest

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets import api_through_ssh
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.hosts.tunnel import ApiTunnel
from pytest_specdecode.targets.systemd.inspection import HOST_PROGRAMS

REPO = Path(__file__).resolve().parents[3]

SSH_CONFIG = """
Host gpu
    HostName 10.0.0.5
    User deploy
    Port 2200
    IdentityFile ~/.ssh/id_gpu
    UserKnownHostsFile ~/gpu_known_hosts /etc/ignored
    ProxyJump bastion

Host bastion
    HostName bastion.example.org
    User hop
    IdentityFile /keys/bastion

Host two-hops
    HostName 10.0.0.6
    ProxyJump ops@bastion:2022,ssh://edge@10.9.9.9:22

Host nested
    HostName 10.0.0.7
    ProxyJump inner

Host inner
    HostName 10.1.0.1
    ProxyJump bastion

Host loop-a
    ProxyJump loop-b
Host loop-b
    ProxyJump loop-a

Host with-command
    ProxyCommand nc %h %p

Host bad-name
    HostName bad$(id)

Host no-jump
    HostName 10.0.0.8
    ProxyJump none
"""


@pytest.fixture
def ssh_config(tmp_path: Path) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text(SSH_CONFIG)
    return path


def test_an_alias_brings_hostname_user_port_identity_known_hosts_and_jump(ssh_config: Path):
    spec = SSHSpec.parse("gpu", ssh_config_path=ssh_config)
    assert (spec.user, spec.hostname, spec.port) == ("deploy", "10.0.0.5", 2200)
    assert spec.identity_files == (Path.home() / ".ssh" / "id_gpu",)
    assert spec.config_known_hosts == Path.home() / "gpu_known_hosts"
    (jump,) = spec.jumps
    assert (jump.user, jump.hostname, jump.port) == ("hop", "bastion.example.org", 22)
    assert jump.identity_files == (Path("/keys/bastion"),)
    assert spec.name == "deploy@10.0.0.5:2200 (gpu; via hop@bastion.example.org:22)"


def test_user_at_alias_overrides_the_configured_user(ssh_config: Path):
    assert SSHSpec.parse("ops@gpu", ssh_config_path=ssh_config).user == "ops"


def test_several_hops_in_order_with_their_own_users_and_ports(ssh_config: Path):
    spec = SSHSpec.parse("two-hops", ssh_config_path=ssh_config)
    assert [j.name for j in spec.jumps] == ["ops@bastion.example.org:2022", "edge@10.9.9.9:22"]
    assert spec.user == getpass.getuser()  # no User: the local user, as ssh does


def test_the_first_hops_own_proxyjump_is_followed(ssh_config: Path):
    spec = SSHSpec.parse("nested", ssh_config_path=ssh_config)
    assert [j.hostname for j in spec.jumps] == ["bastion.example.org", "10.1.0.1"]


def test_proxyjump_none_and_unknown_alias(ssh_config: Path):
    assert SSHSpec.parse("no-jump", ssh_config_path=ssh_config).jumps == ()
    plain = SSHSpec.parse("gpu07.internal", ssh_config_path=ssh_config)
    assert (plain.hostname, plain.port, plain.jumps) == ("gpu07.internal", 22, ())


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("loop-a", "longer than 8 hops or loops"),
        ("with-command", "ProxyCommand is not supported"),
        ("bad-name", r"'bad\$\(id\)' is not a valid host name"),
        ("gpu;id", "expected ssh://user@host"),
        ("root@127.0.0.1:2222", "expected ssh://user@host"),
        ("Bad$User@gpu", "not a valid user name"),
    ],
)
def test_bad_aliases_and_entries_are_refused_before_connecting(ssh_config, host, message):
    with pytest.raises(ConfigError, match=message):
        SSHSpec.parse(host, ssh_config_path=ssh_config)


def test_the_url_form_ignores_ssh_config(ssh_config: Path):
    spec = SSHSpec.parse("ssh://root@gpu:22", ssh_config_path=ssh_config)
    assert (spec.hostname, spec.jumps, spec.alias) == ("gpu", (), None)


def test_a_bad_proxyjump_entry_is_refused(tmp_path: Path):
    path = tmp_path / "config"
    path.write_text("Host x\n    ProxyJump jump@host$(id):22\n")
    with pytest.raises(ConfigError, match="ProxyJump"):
        SSHSpec.parse("x", ssh_config_path=path)


@pytest.mark.parametrize(
    ("user", "sudo", "wrapped"),
    [("deploy", None, True), ("root", None, False), ("deploy", False, False), ("root", True, True)],
)
def test_sudo_wraps_every_argv_for_a_non_root_user(user, sudo, wrapped):
    host = SSHHost(SSHSpec(user=user, hostname="gpu", sudo=sudo))
    argv = ["systemctl", "stop", "a b.service"]
    expected = ("sudo", "-n", "--", *argv) if wrapped else tuple(argv)
    assert host.wrap(argv) == expected


def test_the_documented_sudo_rule_allows_every_program_the_backend_runs():
    rule = (REPO / "scripts" / "sudoers.d" / "pytest-specdecode").read_text()
    alias = re.search(r"Cmnd_Alias SPECDECODE = (.*?)\n(?!\s)", rule, re.S)
    assert alias, rule
    allowed = {Path(p.strip(" \\\n")).name for p in alias.group(1).split(",")}
    assert set(HOST_PROGRAMS) <= allowed, set(HOST_PROGRAMS) - allowed
    assert re.search(r"^deploy ALL=\(root\) NOPASSWD: SPECDECODE$", rule, re.M)


CONFIG = """
[target]
model = "m"
unit = "vllm.service"
{extra}
[workloads.coding]
prompt = "p"
"""


def settings_with(tmp_path: Path, extra: str):
    path = tmp_path / "exp.toml"
    path.write_text(CONFIG.format(extra=extra))
    return load_settings(path, target_overrides={"host": "ssh://deploy@gpu:22"})


def test_without_api_base_the_systemd_target_is_valid_and_goes_through_ssh(tmp_path: Path):
    target = settings_with(tmp_path, "").target
    assert target.api_base == "" and target.api_via == "auto"
    assert api_through_ssh(target, SSHSpec.parse(target.host))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('api_via = "direct"', "api_via = 'direct' needs api_base"),
        ('api_via = "carrier-pigeon"', "api_via must be 'auto', 'direct' or 'ssh'"),
        ('sudo = "yes"', "sudo must be true or false"),
        ('ssh_config = "missing"', "ssh_config .* is not a readable file"),
    ],
)
def test_reach_settings_are_validated(tmp_path: Path, extra: str, message: str):
    with pytest.raises(ConfigError, match=message):
        settings_with(tmp_path, extra)


def test_auto_route_direct_only_when_it_answers_and_is_not_the_hosts_loopback(tmp_path):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        here = f"http://127.0.0.1:{listening.getsockname()[1]}"
        local = settings_with(tmp_path, f'api_base = "{here}"').target
        # The SSH host is this machine's loopback: 127.0.0.1 here is the host's too.
        assert not api_through_ssh(local, SSHSpec.parse("ssh://root@127.0.0.1:2222"))
        # A remote host (or a jump): 127.0.0.1 here is not the host's, whatever answers here.
        assert api_through_ssh(local, SSHSpec.parse("ssh://root@gpu:22"))
    closed = settings_with(tmp_path, 'api_base = "http://127.0.0.1:9"').target
    assert api_through_ssh(closed, SSHSpec.parse("ssh://root@127.0.0.1:2222"))
    forced = settings_with(tmp_path, f'api_base = "{here}"\napi_via = "ssh"').target
    assert api_through_ssh(forced, SSHSpec.parse("ssh://root@127.0.0.1:2222"))


class StandInChannel:
    """Stand-in for a paramiko direct-tcpip Channel: one end of a socket pair."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.closed = False
        self.eof_received = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, n: int) -> bytes:
        data = self._sock.recv(n)
        self.eof_received = not data
        return data

    def recv_ready(self) -> bool:
        return False

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        self.closed = True
        self._sock.close()


class StandInSSHHost:
    """Stand-in for SSHHost.open_forward: 'forwards' to a local server, or refuses."""

    name = "deploy@gpu:22"

    def __init__(self, target: tuple[str, int] | None, refuse_code: int = 2) -> None:
        self.target, self.refuse_code, self.opened, self.closed = target, refuse_code, 0, False

    def open_forward(self, host: str, port: int) -> StandInChannel:
        if self.target is None:
            raise paramiko.ChannelException(self.refuse_code, "refused")
        self.opened += 1
        return StandInChannel(socket.create_connection(self.target))

    def close(self) -> None:
        self.closed = True


def test_the_tunnel_forwards_http_and_closes(tmp_path: Path):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = StandInSSHHost(server.server_address[:2])
    tunnel = ApiTunnel(host, ("127.0.0.1", 8000))  # type: ignore[arg-type]
    try:
        with httpx.Client(timeout=5) as client:
            assert client.get(f"{tunnel.url}/v1/models").text == "/v1/models"
            assert client.get(f"{tunnel.url}/health").text == "/health"
        assert tunnel.remote_answers() and tunnel.forwarded >= 1
        assert "forwarded over SSH to 127.0.0.1:8000 on deploy@gpu:22" in tunnel.describe()
    finally:
        tunnel.close()
        server.shutdown()
    assert host.closed
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tunnel.url}/health", timeout=2)


def test_a_refused_forward_looks_like_a_down_server_and_forbidden_forwarding_is_refused():
    down = ApiTunnel(StandInSSHHost(None), ("127.0.0.1", 8000))  # type: ignore[arg-type]
    try:
        assert down.remote_answers() is False
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{down.url}/health", timeout=5)
    finally:
        down.close()
    forbidden = ApiTunnel(StandInSSHHost(None, 1), ("127.0.0.1", 8000))  # type: ignore[arg-type]
    try:
        with pytest.raises(ConfigError, match=r"sshd refuses to forward to 127\.0\.0\.1:8000"):
            forbidden.remote_answers()
    finally:
        forbidden.close()


class RecordingHost:
    """Stand-in Host: records argv and stdin, answers journalctl newest first as -r does."""

    name = "deploy@gpu:22"

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[str, ...], str | None]] = []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        from pytest_specdecode.targets.hosts.base import CommandResult

        self.seen.append((tuple(argv), stdin))
        out = ""
        if argv[0] == "systemctl" and "InvocationID" in argv:
            out = "0123456789abcdef0123456789abcdef\n"
        elif argv[0] == "journalctl":
            out = "third\nsecond\nfirst\n"
        return CommandResult(self.name, tuple(argv), 0, out, "")

    def check(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        return self.run(argv, timeout=timeout, stdin=stdin)

    def close(self) -> None:
        pass


def test_files_are_written_with_install_and_mv_and_journals_read_without_a_shell():
    from pytest_specdecode.targets.systemd.target import SystemdTarget
    from pytest_specdecode.targets.systemd.units import SystemdUnit

    host = RecordingHost()
    target = SystemdTarget(host, "vllm.service", api_base="http://gpu:8000", model="m")
    target.write_file("/run/systemd/system/vllm.service.d/x.conf", "[Service]\n$(id)\n")
    assert host.seen == [
        (
            (
                "install",
                "-m",
                "0644",
                "-D",
                "/dev/stdin",
                "/run/systemd/system/vllm.service.d/x.conf.tmp",
            ),
            "[Service]\n$(id)\n",
        ),
        (
            (
                "mv",
                "-f",
                "/run/systemd/system/vllm.service.d/x.conf.tmp",
                "/run/systemd/system/vllm.service.d/x.conf",
            ),
            None,
        ),
    ]
    for path, mode in [("relative", "0644"), ("/etc/../x", "0644"), ("/x", "644; rm")]:
        with pytest.raises(ValueError):
            target.write_file(path, "", mode)
    assert SystemdUnit(target).log_tail(3) == [
        "first",
        "second",
        "third",
    ]
    assert all(argv[0] in HOST_PROGRAMS for argv, _ in host.seen)
