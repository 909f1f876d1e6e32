"""The systemd test host as the tests see it: its coordinates and checks of its state."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import HostError
from pytest_specdecode.record.store import JOURNAL_FILE
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.systemd.unitfile import (
    PERSISTENT_UNIT_DIR,
    SHAPE_ROOT,
    dropin_path,
)
from pytest_specdecode.targets.systemd.watchdog import (
    HANDOVER_UNIT,
    LOCK_DIR,
    RESTORE_SCRIPT,
    WATCHDOG,
)

from .terminal import default_signals

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Testbed:
    __test__ = False  # not a test class

    host: str
    identity: Path
    known_hosts: Path
    unit: str
    api_base: str
    image: str = ""  # the podman image built on the host, whose entrypoint is vLLM's server
    binds: tuple[str, ...] = ()  # what the venv's python needs, bound at the same paths
    model: str = "smollm2-135m-instruct"
    _ssh: SSHHost | None = field(default=None, repr=False)

    @classmethod
    def from_script(cls, script: Path, instance: int = 1) -> Testbed:
        out = subprocess.run(
            ["bash", str(script), "--instance", str(instance), "env"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        env = dict(
            shlex.split(line.removeprefix("export "))[0].split("=", 1)
            for line in out.splitlines()
            if line.startswith("export ")
        )
        return cls(
            host=env["SPECDECODE_TEST_HOST"],
            identity=Path(env["SPECDECODE_TEST_IDENTITY"]),
            known_hosts=Path(env["SPECDECODE_TEST_KNOWN_HOSTS"]),
            unit=env["SPECDECODE_TEST_UNIT"],
            api_base=env["SPECDECODE_TEST_API"],
            image=env["SPECDECODE_TEST_IMAGE"],
            binds=tuple(env["SPECDECODE_TEST_BINDS"].split()),
        )

    @property
    def dropin(self) -> str:
        """Where a candidate's drop-in for the production unit lives while it is configured."""
        return dropin_path(self.unit)

    def candidate_label(self, name: str) -> str:
        """How progress lines and results name candidate `name` of the production unit."""
        return f"candidate {name}: unit {self.unit} on {self.host.removeprefix('ssh://')}"

    def ssh(self, *argv: str, timeout: float = 60) -> CommandResult:
        if self._ssh is None:
            self._ssh = SSHHost(
                SSHSpec.parse(self.host, identity_file=self.identity, known_hosts=self.known_hosts)
            )
        return self._ssh.run(list(argv), timeout=timeout)

    def write(self, path: str, content: str, mode: str = "0644") -> None:
        """A file on the test host (the tests' own set-up), by stdin."""
        self.ssh("true")
        assert self._ssh is not None
        script = 'mkdir -p -- "${1%/*}" && cat > "$1" && chmod "$2" "$1"'
        self._ssh.check(["sh", "-c", script, "sh", path, mode], stdin=content, timeout=60)

    def exec_start(self) -> list[str]:
        """The production unit's command as written, its ${VLLM_PORT} unexpanded."""
        from pytest_specdecode.targets.systemd.unitfile import effective_exec_start

        text = self.ssh("systemctl", "cat", self.unit).stdout
        return effective_exec_start(text, where=self.unit).argv

    def close(self) -> None:
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None

    def options(self) -> list[str]:
        return [
            "--spec-host",
            self.host,
            "--spec-unit",
            self.unit,
            "--spec-identity",
            str(self.identity),
            "--spec-known-hosts",
            str(self.known_hosts),
            "--spec-api-base",
            self.api_base,
            "--spec-model",
            self.model,
        ]

    def replica_keys(self) -> dict[str, str]:
        """What reaches this host's unit, as a `[[target.replicas]]` entry's keys: the values
        `options()` passes on the command line (which a target of replicas refuses)."""
        return {
            "host": self.host,
            "unit": self.unit,
            "identity_file": str(self.identity),
            "known_hosts": str(self.known_hosts),
            "api_base": self.api_base,
        }

    def invocations_since(self, epoch_s: str) -> dict[str, float]:
        """Each invocation of the unit whose journal has entries since `epoch_s` (the host's
        `date +%s`), with the time of its first entry (s): one per start of the unit."""
        out = self.ssh(
            "journalctl", "-u", self.unit, "--since", f"@{epoch_s}", "-o", "json", "--no-pager"
        ).stdout
        first: dict[str, float] = {}
        for line in out.splitlines():
            entry = json.loads(line)
            inv = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID")
            if isinstance(inv, str) and inv:
                at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
                first[inv] = min(first.get(inv, at), at)
        return first

    def serves(self) -> bool:
        try:
            models = httpx.get(f"{self.api_base}/v1/models", timeout=5).json()
        except (httpx.HTTPError, json.JSONDecodeError):
            return False
        return any(m.get("id") == self.model for m in models.get("data", []))

    def state(self) -> dict[str, str]:
        out = self.ssh(
            "systemctl", "show", self.unit, "--property=ActiveState,SubState,NRestarts,MainPID"
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def traces(self, unit: str | None = None) -> list[str]:
        """What the tool may leave on the host; an empty list after a clean restore."""
        unit = unit or self.unit
        dropin = dropin_path(unit)
        checks = {
            "candidate drop-in": ["test", "-e", dropin],
            "candidate drop-in directory": ["test", "-e", dropin.rsplit("/", 1)[0]],
            "lock": ["test", "-e", LOCK_DIR],
            "restore script": ["test", "-e", RESTORE_SCRIPT],
            "shape folder": ["test", "-e", SHAPE_ROOT],
            "watchdog timer": ["systemctl", "is-active", "--quiet", f"{WATCHDOG}.timer"],
            "watchdog service": ["systemctl", "is-active", "--quiet", f"{WATCHDOG}.service"],
            "handed-over restore": ["systemctl", "is-active", "--quiet", HANDOVER_UNIT],
            # Nothing of the tool's is ever written to /etc/systemd/system.
            # (the old swap's candidate unit, or a drop-in of the tool's)
            "file in /etc/systemd/system": [
                "sh",
                "-c",
                'find "$1" -name "*pytest-specdecode*" -o -name "$2" | grep -q .',
                "sh",
                PERSISTENT_UNIT_DIR,
                unit.removesuffix(".service") + "-specdecode.service",
            ],
        }
        return [name for name, argv in checks.items() if self.ssh(*argv).ok]

    def settled_traces(self, timeout_s: float = 30.0) -> list[str]:
        """`traces`, once a host-side restore that is still finishing has had time to: it
        keeps the lock until the original listens, and removes it up to 2 s after."""
        deadline = time.monotonic() + timeout_s
        while (found := self.traces()) and time.monotonic() < deadline:
            time.sleep(1)
        return found

    def persistent_units(self) -> str:
        """Every file and link under /etc/systemd/system with its mtime: compared before/after."""
        return self.ssh(
            "find", PERSISTENT_UNIT_DIR, "!", "-type", "d", "-printf", "%p %T@ %l\n"
        ).stdout

    def wait_serving(self, timeout_s: float = 300, poll_s: float = 2) -> float:
        """Until the original (no candidate drop-in) is active and serves; the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            try:
                if (
                    self.state().get("ActiveState") == "active"
                    and not self.ssh("test", "-e", self.dropin).ok
                    and self.serves()
                ):
                    return time.monotonic() - start
            except HostError:  # the host reboots
                self.close()
            time.sleep(poll_s)
        pytest.fail(f"{self.unit} not serving after {timeout_s}s: {self.state()}")

    def assert_original_restored(self) -> None:
        """Active, serving its model, and nothing of the tool's left behind."""
        state = self.state()
        assert state.get("ActiveState") == "active", state
        assert self.serves(), f"{self.unit} is active but {self.api_base} does not serve"
        assert self.settled_traces() == []


def write_remote_experiment(
    pytester: pytest.Pytester,
    bed: Testbed,
    *,
    run: dict[str, object] | None = None,
    target: dict[str, object] | None = None,
    thresholds: str = "",
    replicas: dict[str, Testbed] | None = None,
) -> Path:
    """A suite copy and a config whose target is the test host's production unit; with
    `replicas` ({name: host}, in order), a target of those replicas instead, each entry with
    its host's SSH settings (`replica_args` runs it: the command line sets no host)."""
    import shutil

    shutil.copytree(
        REPO / "suites",
        pytester.path / "suites",
        ignore=shutil.ignore_patterns("*.toml", "__pycache__"),
    )
    # Token ids only where a test asks (the seed workflow), a short look for other clients; the
    # host's CPU recorded, not judged: make test runs the embedded vLLM beside it (embedded.py)
    run_values = {"samples": 5, "max_samples": 5, "warmup": 1, "max_tokens": 32,
                  "record_token_ids": False, "traffic_watch_s": 2.0, "busy_host_share": 1.0,
                  **(run or {})}  # fmt: skip
    target_values = {
        "startup_timeout_s": 400,
        "restore_timeout_s": 600,
        "watchdog_s": 300,
        # a candidate's engine that dies once before serving (seen in CI: 19 s into its start)
        # is started again, so that a test that needs its window does not fail on it
        "retry_failed_start": True,
        **(target or {}),
    }
    table = lambda d: "\n".join(f"{k} = {json.dumps(v)}" for k, v in d.items())  # noqa: E731
    seed = (REPO / "suites" / "specdecode.toml").read_text()
    config = pytester.path / "remote.toml"
    where = f'api_base = "{bed.api_base}"'
    if replicas:
        where = "".join(
            f"[[target.replicas]]\nname = {json.dumps(name)}\n{table(host.replica_keys())}\n"
            for name, host in replicas.items()
        )
    config.write_text(f"""
reports_dir = "{pytester.path / "reports"}"
[target]
model = "{bed.model}"
{table(target_values)}
{where}
[run]
{table(run_values)}
[thresholds]
{thresholds}
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
ngram-k3 = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}
suffix = {{ method = "suffix", num_speculative_tokens = 3 }}
{seed[seed.index("[prompt_types.coding]") :]}
""")
    return config


def results_path(pytester: pytest.Pytester) -> Path:
    (run,) = [p for p in (pytester.path / "reports").iterdir() if p.is_dir()]
    return run / "results.json"


def results_of(pytester: pytest.Pytester) -> dict:
    return json.loads(results_path(pytester).read_text())


def wait_for_sample(pytester: pytest.Pytester, phase: str, *, timeout_s: float = 300) -> None:
    """Until the run's journal (a line per request, written as it ends) holds a request of
    `phase`: a fixed sleep after its first progress line is too short on a busy machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for journal in (pytester.path / "reports").glob(f"*/{JOURNAL_FILE}"):
            for line in journal.read_text().splitlines():
                try:
                    if json.loads(line).get("phase") == phase:
                        return
                except ValueError:  # the line being written
                    continue
        time.sleep(0.5)
    raise AssertionError(f"no request of {phase} finished within {timeout_s:.0f}s")


def suite_args(pytester: pytest.Pytester, bed: Testbed, config: Path, *extra: str) -> list[str]:
    """Arguments that run the copied suite against the test host, coding prompt only."""
    return replica_args(pytester, config, *bed.options(), *extra)


def replica_args(pytester: pytest.Pytester, config: Path, *extra: str) -> list[str]:
    """`suite_args` for a target of replicas: every host is in the spec file."""
    return [
        str(pytester.path / "suites"),
        "--spec-file",
        str(config),
        "-p",
        "no:cacheprovider",
        "--spec-workload",
        "coding",
        *extra,
    ]


@dataclass
class Reach:
    """scripts/testbed/reach-host: the test host as an operator reaches it (alias, jump, sudo)."""

    __test__ = False

    netns: str
    ssh_config: Path
    known_hosts: Path
    alias: str
    jump_alias: str
    jump: str  # ssh://jump@ADDR:PORT
    sudo_user: str
    password_user: str
    api_base: str  # the API as the host sees it; unreachable from the namespace

    @classmethod
    def from_script(cls, script: Path) -> Reach:
        out = subprocess.run(
            ["bash", str(script), "env"], capture_output=True, text=True, check=True
        ).stdout
        env = dict(
            shlex.split(line.removeprefix("export "))[0].split("=", 1)
            for line in out.splitlines()
            if line.startswith("export ")
        )
        return cls(
            netns=env["SPECDECODE_REACH_NETNS"],
            ssh_config=Path(env["SPECDECODE_REACH_SSH_CONFIG"]),
            known_hosts=Path(env["SPECDECODE_REACH_KNOWN_HOSTS"]),
            alias=env["SPECDECODE_REACH_ALIAS"],
            jump_alias=env["SPECDECODE_REACH_JUMP_ALIAS"],
            jump=env["SPECDECODE_REACH_JUMP"],
            sudo_user=env["SPECDECODE_REACH_SUDO_USER"],
            password_user=env["SPECDECODE_REACH_PASSWORD_USER"],
            api_base=env["SPECDECODE_REACH_API"],
        )

    def in_netns(self, *argv: str) -> list[str]:
        """argv run inside the controller's namespace, where only the jump host is reachable."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def reachable_from_netns(self, host: str, port: int) -> bool:
        probe = (
            "import socket,sys; s=socket.socket(); s.settimeout(3); "
            "sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
        )
        argv = self.in_netns(sys.executable, "-c", probe, host, str(port))
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def run_until(
    pytester, testbed, config, marker: str, *extra: str, seen: list[str] | None = None
) -> subprocess.Popen:
    """Start the suite in a subprocess and return once `marker` shows in its progress."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *suite_args(pytester, testbed, config, "--spec-config", "ngram", *extra),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,  # the tests send it Ctrl-C, as a terminal would
    )
    seen = [] if seen is None else seen
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
