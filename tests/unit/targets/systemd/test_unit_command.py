"""What the systemd backend reads of a unit before anything is touched: ExecStart as systemd
expands it, where the API answers (through a container's -p), and the vLLM in a container.

A scripted host answers `systemctl show`, `show-environment`, `cat` and `busctl` with what a real
systemd 252 printed for such units; the real-host tests run the same paths against the test host.
"""

from __future__ import annotations

import json

import pytest

from pytest_specdecode.config.vllm_argv import ServerCommand, host_address, parse_server_command
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.facts.vllm import VllmFactsError
from pytest_specdecode.targets.facts.vllm_snippet import MARKER
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.hosts.container import first_process
from pytest_specdecode.targets.systemd.inspection import bus_label
from pytest_specdecode.targets.systemd.target import SystemdTarget

PYTHON = "/opt/venv/bin/python"
PODMAN_UNIT = """# /etc/systemd/system/vllm-podman.service
[Service]
ExecStartPre=-/usr/bin/podman rm -f vllm-ctr
ExecStart=/usr/bin/podman run --rm --name vllm-ctr -p ${CTR_PORT}:8000 \\
    -v /srv/models:/models:ro localhost/my-vllm:${TAG} --model /models/smol --port 8000

# /etc/systemd/system/vllm-podman.service.d/10-port.conf
[Service]
Environment=CTR_PORT=18123
EnvironmentFile=-/etc/default/vllm-podman
"""
PLAIN_UNIT = """# /etc/systemd/system/vllm.service
[Service]
Environment=VLLM_PORT=8000
EnvironmentFile=/etc/default/vllm
ExecStart=/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model /m \\
    --host 0.0.0.0 --port ${VLLM_PORT}
"""


class ScriptedHost:
    """Answers the read-only commands the backend runs; refuses anything else."""

    name = "root@gpu:22"

    def __init__(self, unit_text: str, shown: str, files: dict[str, str], words=None) -> None:
        self.unit_text, self.shown, self.files, self.words = unit_text, shown, files, words
        self.seen: list[tuple[str, ...]] = []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        argv = tuple(argv)
        self.seen.append(argv)
        out, err, status = "", "", 0
        if argv[:2] == ("systemctl", "cat"):
            out = self.unit_text
        elif argv[:2] == ("systemctl", "show-environment"):
            out = "LANG=C.UTF-8\nPATH=/usr/bin:/bin\n"
        elif argv[:2] == ("systemctl", "show"):
            out = self.shown
        elif argv[0] == "cat" and argv[-1] in self.files:
            out = self.files[argv[-1]]
        elif argv[0] == "cat":
            err, status = f"cat: {argv[-1]}: No such file or directory", 1
        elif argv[0] == "busctl" and self.words is not None:
            out = json.dumps({"type": "a(sasbttttuii)", "data": [["/x", self.words, False]]})
        elif argv[0] == "busctl":
            err, status = "busctl: not found", 127
        elif argv[:3] == ("/usr/bin/podman", "exec", "vllm-ctr"):
            out = f"{PYTHON}\0-m\0vllm.entrypoints.openai.api_server\0--model\0/models/smol\0"
        elif argv[:4] == ("/usr/bin/podman", "exec", "-i", "vllm-ctr"):
            answer = {"version": "0.32.0", "keys": {"method": "str"}, "methods": ["ngram"]}
            out = MARKER + json.dumps(answer)
        else:
            raise AssertionError(f"not a read-only command: {argv}")
        return CommandResult(self.name, argv, status, out, err)

    check = run

    def close(self) -> None:
        pass


def target(host: ScriptedHost, unit: str, images=("localhost/my-vllm",)) -> SystemdTarget:
    return SystemdTarget(host, unit, api_base="", model="smol", vllm_images=images)  # type: ignore[arg-type]


SHOWN_PODMAN = (
    "Environment=CTR_PORT=18123\nEnvironmentFiles=/etc/default/vllm-podman (ignore_errors=yes)\n"
)


def test_a_container_units_api_is_on_the_host_side_of_its_port_mapping():
    host = ScriptedHost(PODMAN_UNIT, SHOWN_PODMAN, {"/etc/default/vllm-podman": "TAG=v1\n"})
    unit = target(host, "vllm-podman.service")
    assert unit.api_address() == ("127.0.0.1", 18123)
    assert unit.command().server.image == "localhost/my-vllm:v1"
    assert unit.command().sources() == (
        "CTR_PORT from Environment=, TAG from EnvironmentFile=-/etc/default/vllm-podman"
    )


def test_vllms_facts_are_asked_inside_the_running_container():
    host = ScriptedHost(PODMAN_UNIT, SHOWN_PODMAN, {"/etc/default/vllm-podman": "TAG=v1\n"})
    facts = target(host, "vllm-podman.service").vllm_facts()
    assert (facts.version, facts.host, facts.interpreter) == (
        "0.32.0",
        "container vllm-ctr on root@gpu:22",
        PYTHON,
    )
    # The unit's own engine, `exec` into the container named by --name; the snippet by stdin.
    assert ("/usr/bin/podman", "exec", "vllm-ctr", "cat", "/proc/1/cmdline") in host.seen
    assert ("/usr/bin/podman", "exec", "-i", "vllm-ctr", PYTHON, "-") in host.seen


def test_a_container_without_a_name_cannot_be_asked():
    text = PODMAN_UNIT.replace("--name vllm-ctr ", "")
    host = ScriptedHost(text, SHOWN_PODMAN, {"/etc/default/vllm-podman": "TAG=v1\n"})
    with pytest.raises(VllmFactsError, match="without --name"):
        target(host, "vllm-podman.service").vllm_facts()


def test_the_port_comes_from_the_environment_file_over_environment():
    shown = "Environment=VLLM_PORT=8000\nEnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
    host = ScriptedHost(PLAIN_UNIT, shown, {"/etc/default/vllm": "VLLM_PORT=8100\n"})
    assert target(host, "vllm.service").api_address() == ("127.0.0.1", 8100)


def test_systemds_own_words_carry_the_resolved_specifiers():
    unit = "[Service]\nExecStart=/opt/venv/bin/vllm serve /models/%i --port 80%i\n"
    words = ["/opt/venv/bin/vllm", "serve", "/models/42", "--port", "8042"]
    host = ScriptedHost(unit, "Environment=\n", {}, words=words)
    assert target(host, "vllm@42.service").api_address() == ("127.0.0.1", 8042)
    assert any(
        argv[0] == "busctl" and "/org/freedesktop/systemd1/unit/vllm_4042_2eservice" in argv
        for argv in host.seen
    )


def test_an_unset_port_variable_is_refused_before_anything_is_touched():
    shown = "Environment=\nEnvironmentFiles=/etc/vllm/port.env (ignore_errors=yes)\n"
    host = ScriptedHost(PLAIN_UNIT.replace("Environment=VLLM_PORT=8000\n", ""), shown, {})
    with pytest.raises(ConfigError) as info:
        target(host, "vllm.service").api_address()
    message = str(info.value)
    assert "unit vllm.service on root@gpu:22: ExecStart uses ${VLLM_PORT}, which is set" in message
    assert "EnvironmentFile=-/etc/vllm/port.env (missing: skipped, as systemd does)" in message
    assert "Nothing was touched" in message


def test_a_missing_required_environment_file_is_refused():
    shown = "Environment=VLLM_PORT=8000\nEnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
    host = ScriptedHost(PLAIN_UNIT, shown, {})
    with pytest.raises(ConfigError, match=r"cannot read its EnvironmentFile=/etc/default/vllm"):
        target(host, "vllm.service").api_address()


def test_a_token_in_an_environment_file_is_registered_as_a_secret():
    from pytest_specdecode.redaction import redact_text

    shown = "Environment=VLLM_PORT=8000\nEnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
    files = {"/etc/default/vllm": "VLLM_PORT=8100\nHF_TOKEN=hf_s3cr3tvalue\n"}
    target(ScriptedHost(PLAIN_UNIT, shown, files), "vllm.service").api_address()
    assert "hf_s3cr3tvalue" not in redact_text("seen: hf_s3cr3tvalue")


def container(*options: str) -> ServerCommand:
    argv = ["docker", "run", *options, "vllm/vllm-openai:v1", "--port", "8001"]
    return parse_server_command(argv, where="u", images=())


@pytest.mark.parametrize(
    ("options", "address"),
    [
        (["-p", "9000:8001"], ("0.0.0.0", 9000)),
        (["-p", "8000:8000", "--publish=127.0.0.1:9001:8001"], ("127.0.0.1", 9001)),
        (["-p", "[::1]:9002:8001/tcp"], ("::1", 9002)),
        (["-p", "9000-9009:8000-8009"], ("0.0.0.0", 9001)),
        (["--network", "host", "-p", "9000:8001"], ("127.0.0.1", 8001)),
        (["--net=host"], ("127.0.0.1", 8001)),
    ],
)
def test_the_host_side_of_a_port_mapping(options, address):
    assert host_address(container(*options), ("127.0.0.1", 8001), where="u") == address


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["-p", "8000:8000"], r"publishes no host port for it \(-p 8000:8000\)"),
        ([], r"\(no -p at all\)"),
        (["-P"], r"-P picks random host ports"),
        (["-p", "8001"], "on a random host port"),
        (["-p", "9000:8001/udp"], "publishes no host port"),
    ],
)
def test_a_port_it_cannot_find_on_the_host_is_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        host_address(container(*options), ("127.0.0.1", 8001), where="u")


def test_the_engine_and_its_own_options_are_kept_for_exec():
    argv = ["/usr/bin/podman", "--root", "/srv/c", "run", "--name=vllm", "vllm/vllm-openai"]
    found = parse_server_command(argv, where="u", images=())
    assert found.engine == ("/usr/bin/podman", "--root", "/srv/c")
    assert found.container_name == "vllm"


@pytest.mark.parametrize(
    ("cmdline", "argv"),
    [
        (
            "python3\0-m\0vllm.entrypoints.openai.api_server\0",
            ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        ),
        ("/run/podman-init\0--\0vllm\0serve\0m\0", ["vllm", "serve", "m"]),
        ("/sbin/docker-init\0-s\0vllm\0serve\0", ["vllm", "serve"]),
        ("", []),
    ],
)
def test_the_first_process_of_a_container_past_its_init(cmdline, argv):
    assert first_process(cmdline) == argv


def test_unit_names_as_dbus_object_path_elements():
    assert bus_label("vllm-kimi-k25-int4.service") == "vllm_2dkimi_2dk25_2dint4_2eservice"
    assert bus_label("vllm@smol.service") == "vllm_40smol_2eservice"
    assert bus_label("0a.service") == "_30a_2eservice"


def test_a_port_that_is_not_one_names_where_its_variable_came_from():
    shown = "Environment=VLLM_PORT=8000\nEnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
    host = ScriptedHost(PLAIN_UNIT, shown, {"/etc/default/vllm": "VLLM_PORT=http\n"})
    with pytest.raises(ConfigError) as info:
        target(host, "vllm.service").api_address()
    assert str(info.value) == (
        "unit vllm.service on root@gpu:22: --port 'http' (VLLM_PORT from "
        "EnvironmentFile=/etc/default/vllm) is not a port; cannot tell where its API listens"
    )
