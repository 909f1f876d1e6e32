"""The options of issue 4 through pytest itself (fast: nothing is started): dry run, reuse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.report import plan
from pytest_specdecode.report.plan_reach import plan_time, time_lines
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.systemd.target import SystemdTarget

from ...support.inprocess import run_in_process
from ..record.test_stored_runs import stored_run

CONFIG = """
reports_dir = "{reports}"
[target]
api_base = "http://127.0.0.1:18011"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
  "--port", "18011"]
[run]
samples = 5
max_samples = 5
warmup = 1
max_tokens = 32
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompt = "the coding prompt"
[prompt_types.math]
prompt = "the math prompt"
"""


@pytest.fixture
def config(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "experiment.toml"
    path.write_text(CONFIG.format(reports=pytester.path / "reports"))
    pytester.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")
    return path


def test_dry_run_prints_the_plan_and_changes_nothing(pytester: pytest.Pytester, config) -> None:
    result = run_in_process(
        pytester,
        "--spec-file",
        str(config),
        "--spec-config",
        "ngram",
        "--spec-dry-run",
        "--spec-aba",
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "pytest-specdecode dry run: nothing is started, written or changed." in out
    assert "host: localhost (local backend)" in out
    # `python` here has no vLLM (or is absent): the offline list stands in, and the plan says so.
    assert (
        "  1. validated the candidates against the offline list of vLLM 0.32's speculative "
        "methods and keys (the target's vLLM could not be asked: " in out
    )
    # ... so the candidate does not ask for per-request metrics: an option the server might
    # not know would stop it from starting
    assert (
        "  2. per-request speculative metrics: not asked for: the target's vLLM could not be "
        "asked whether it knows --per-request-spec-decode-metrics" in out
    )
    assert "  3. start the original: (cd " in out
    assert '--speculative-config \'{"method":"ngram","num_speculative_tokens":5,' in out
    assert "--per-request-spec-decode-metrics" not in out.split("  3. start the original")[1]
    assert "drift check (ABA): stop the last candidate" in out
    assert "requests: 36 = 3 phases x 2 prompt types x (5 measured + 1 warm-up)" in out
    assert "restart noise: unmeasured: assumed 5%" in out
    assert "estimated duration: about" in out
    assert "ran" not in out and "passed" not in out  # no test ran: nothing was collected
    assert not (pytester.path / "reports").exists()  # no run folder, no report.html


def test_dry_run_says_what_the_design_can_call_and_what_would_call_a_named_change(
    pytester: pytest.Pytester, config
) -> None:
    result = run_in_process(pytester,
        "--spec-file", str(config), "--spec-config", "ngram", "--spec-dry-run",
        "--spec-detect", "25%",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    found = re.search(r"what this design can call with 80% power: throughput ±([\d.]+)%", out)
    assert found and float(found.group(1)) > 25, out  # one start per arm, the noise assumed
    assert "restart noise assumed 5% (weighted as 8 df)" in out
    found = re.search(r"to call a 25% change with 80% power: --spec-repeats (\d+) ", out)
    assert found and int(found.group(1)) > 1, out
    bad = run_in_process(pytester, "--spec-file", str(config), "--spec-detect", "lots")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "not a relative change: 'lots' (say 10% or 0.1)" in bad.stderr.str()


def test_dry_run_without_pytest_html(pytester: pytest.Pytester, config) -> None:
    result = run_in_process(pytester, "--spec-file", str(config), "--spec-dry-run", "-p", "no:html")
    assert result.ret == pytest.ExitCode.OK
    assert "candidates: none" in result.stdout.str()


def test_baseline_from_is_checked_before_anything_starts(pytester: pytest.Pytester, config) -> None:
    result = run_in_process(
        pytester,
        "--spec-file",
        str(config),
        "--spec-config",
        "ngram",
        "--spec-baseline-from",
        str(pytester.path / "nope" / "results.json"),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "does not exist" in result.stderr.str()
    assert not (pytester.path / "reports").exists()


def test_baseline_from_a_stored_run_in_the_plan(
    pytester: pytest.Pytester, config, tmp_path: Path
) -> None:
    # The stored run has coding and math: its baseline serves, only ngram is planned.
    path = stored_run(
        tmp_path / "old", rates={"coding": 20.0, "math": 16.0}, candidate={"coding": 25.0}
    )
    result = run_in_process(
        pytester,
        "--spec-file",
        str(config),
        "--spec-config",
        "ngram",
        "--spec-dry-run",
        "--spec-baseline-from",
        str(path),
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert f"baseline: reused from {path}, not measured" in out
    assert "requests: 12 = 1 phases x 2 prompt types" in out


UNIT = """# /etc/systemd/system/vllm-kimi-k25-int4.service
[Unit]
Description=vLLM Kimi-K2.5 INT4

[Service]
ExecStart=/opt/vllm/bin/vllm serve /models/kimi-k25-int4 --served-model-name kimi-k25-int4 \\
    --port 8000 --tensor-parallel-size 8
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


class ReadOnlyHost:
    """Answers `systemctl cat`; records every command, to prove nothing else is run."""

    name = "root@gpu-box:22"

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        self.seen.append(tuple(argv))
        assert tuple(argv[:2]) == ("systemctl", "cat"), argv
        return CommandResult(self.name, tuple(argv), 0, UNIT, "")

    def check(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        raise AssertionError(f"a dry run ran {argv}")

    def close(self) -> None:
        pass


def test_systemd_dry_run_shows_complete_dropins_and_only_reads(tmp_path: Path) -> None:
    (tmp_path / "exp.toml").write_text(CONFIG.format(reports=tmp_path / "reports"))
    settings = load_settings(
        tmp_path / "exp.toml",
        spec_configs=["ngram", '{"method": "ngram", "num_speculative_tokens": 3}'],
        target_overrides={
            "backend": "systemd",
            "host": "ssh://root@gpu-box:22",
            "unit": "vllm-kimi-k25-int4.service",
            "model": "kimi-k25-int4",
        },
    )
    host = ReadOnlyHost()
    target = SystemdTarget(
        host, "vllm-kimi-k25-int4.service", api_base="http://gpu-box:8000", model="kimi-k25-int4"
    )
    timing = plan.Timing(start_s=600.0, s_per_token=0.03, source="assumed")
    time, _ = plan_time(settings, {}, timing, baseline=True, aba=False, adopts_original=True)
    lines = plan.dry_run_lines(
        settings,
        target.plan(settings.candidates),
        host=target.host_name,
        duration=time_lines(time, timing),
        aba=False,
        baseline_from=None,
        adopts_original=target.adopts_running_original,
    )
    text = "\n".join(lines)
    assert host.seen and set(host.seen) == {("systemctl", "cat", "vllm-kimi-k25-int4.service")}
    assert "host: root@gpu-box:22 (systemd backend), unit vllm-kimi-k25-int4.service" in text
    # Each candidate's drop-in, in full, at its path, with its speculative config; the
    # candidate is the production unit itself, and a reboot brings back the original.
    dropin = "/run/systemd/system/vllm-kimi-k25-int4.service.d/zz-pytest-specdecode.conf"
    assert text.count(f"write {dropin} (runtime only: /run is cleared at boot, so a reboot") == 2
    assert text.count("# Written by pytest-specdecode") == 2
    assert text.count("    [Service]\n         ExecStart=\n         ExecStart=/opt/vllm/bin") == 2
    assert "--speculative-config" in text and '"num_speculative_tokens":3' in text
    assert "systemctl daemon-reload; systemctl start vllm-kimi-k25-int4.service (now candidate" in (
        text
    )
    assert f"restore: systemctl stop vllm-kimi-k25-int4.service; rm {dropin}" in text
    assert "/etc/systemd/system/vllm-kimi-k25-int4" not in text.replace(UNIT, "")
    # The original is measured as it runs: 2 candidate starts and the restore's.
    assert "requests: 36 = 3 phases x 2 prompt types" in text
    assert "server starts, in order: baseline (as it runs), ngram, ngram-k3" in text
    assert "3 server starts at ~600 s" in text
