"""--spec-control on a scripted run: the control arm gets the candidate's side changes, and the
report splits the change in three; what each backend starts the control with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.verdict.side_changes import RUNNER_ENV
from pytest_specdecode.config.specconfig import OFFLINE_FACTS, SpecConfig
from pytest_specdecode.config.vllm_argv import with_speculative_config
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.record.engine_settings import parse_engine_log
from pytest_specdecode.record.store import load_run
from pytest_specdecode.report import html, markdown, terminal
from pytest_specdecode.report.plan import phase_order, side_change_plan
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.local import LocalProcessTarget
from pytest_specdecode.targets.systemd.unitfile import render_dropin
from pytest_specdecode.targets.systemd.units import SETTINGS_LINES, SystemdUnit

from ....support.scripted_target import Script, ScriptedTarget, Speed, measure_arms
from ....support.synthetic import settings
from ...record.test_engine_settings import gpu_lines

PROMPTS = ("the coding prompt", "the math prompt")


def script(gap_s: float, arm: str | None) -> Script:
    speeds = {p: Speed(gap_s=gap_s, tokens=12) for p in PROMPTS}
    return Script(speeds, start_log=tuple(gpu_lines(arm)) if arm else ())


@pytest.fixture
def controlled(tmp_path: Path):
    """Baseline 10 ms a token; n-gram 25 ms; its control (no speculation, its side changes)
    12 ms: the side changes cost a little, speculation itself the most."""
    s = settings(tmp_path, run_extra="control = true")
    target = ScriptedTarget(
        script(0.010, "baseline"),
        {"ngram": script(0.025, "ngram"), "ngram-control": script(0.012, None)},
    )
    store = measure_arms(target, s, tmp_path, "ngram", "ngram-control")
    return target, store


def test_the_control_starts_after_the_candidate_with_its_side_changes(controlled) -> None:
    target, store = controlled
    assert [s.name for s in target.specs] == ["ngram", "ngram-control"]
    control = target.specs[1]
    assert control.values == {} and control.control_of == "ngram"
    assert control.extra_args == ("--no-async-scheduling",)
    assert dict(control.env) == {RUNNER_ENV: "0"}
    # like any candidate, stopped at the end (the original was not running before)
    assert target.events[-2:] == ["stop ngram-control", "close"] and target.serving is None
    phase = store.record.phases["ngram-control"]
    assert phase.control_of == "ngram" and phase.extra_args == ["--no-async-scheduling"]
    assert phase.env == {RUNNER_ENV: "0"}
    assert list(store.record.candidates) == ["ngram"]  # no verdict test gates on the control


def test_the_change_splits_in_three_and_the_flag_stays_the_verdict(controlled) -> None:
    _, store = controlled
    stored = load_run(store.path)
    assert stored == store.record  # the settings and the control round-trip
    analysis = analyze(stored)
    split = analysis.splits["ngram"]
    assert split.keys == ["coding", "math"]
    for key in split.keys:
        flag, spec, side = (split.part(p, key) for p in ("flag", "speculation", "side"))
        assert flag is analysis.verdicts["ngram"][key].throughput  # the gate's own figure
        assert flag.change < spec.change < 0 and side.change < 0
        assert side.change > flag.change
        # the log-ratios add up: the flag's change is speculation's and the side changes'
        assert (1 + flag.change) == pytest.approx((1 + spec.change) * (1 + side.change), rel=1e-6)
        for c in (flag, spec, side):
            low, high = c.ratio_ci
            assert low <= c.ratio <= high
    changed = analysis.side_changes["ngram"].text
    assert (
        changed == "async scheduling disabled (baseline: enabled); model runner V1 (baseline: V2)"
    )


def test_every_report_names_the_side_changes_and_the_split(controlled) -> None:
    _, store = controlled
    rec = store.record
    analysis = analyze(rec)
    want = "ngram also changed: async scheduling disabled (baseline: enabled); model runner V1"
    text = "\n".join(terminal.lines(rec, analysis, files={}))
    md = markdown.summary(rec, analysis)
    page = html.summary(rec, analysis, None)
    for out in (text, md, page):
        assert want in out
        assert "split by its control arm ngram-control" in out
        assert "--no-async-scheduling" in out and f"{RUNNER_ENV}=0" in out
    line = next(x for x in text.splitlines() if x.strip().startswith("coding: the flag"))
    assert line.count("[") == 3 and "speculation itself" in line and "the side changes" in line
    # in the terminal, right under the candidate's rows
    lines = text.splitlines()
    assert lines.index(f"  {want} (baseline: V2)") > max(
        i for i, x in enumerate(lines) if x.startswith(("coding ", "math "))
    )


def test_without_control_no_split_but_the_side_changes_are_named(tmp_path: Path) -> None:
    s = settings(tmp_path)
    target = ScriptedTarget(script(0.010, "baseline"), {"ngram": script(0.025, "ngram")})
    store = measure_arms(target, s, tmp_path, "ngram")
    analysis = analyze(store.record)
    assert analysis.splits == {}
    assert [s.name for s in target.specs] == ["ngram"]
    assert "ngram also changed: async scheduling disabled" in markdown.summary(
        store.record, analysis
    )


def test_the_plan_names_foreseen_side_changes_and_the_control(tmp_path: Path) -> None:
    s = settings(tmp_path, run_extra="control = true")
    assert phase_order(s, baseline=True, aba=False) == ["baseline", "ngram", "ngram-control"]
    lines = side_change_plan(s, "0.26.0")
    assert lines[0].startswith("side changes of ngram: expected, not measured: async scheduling")
    assert "model runner V1" in lines[0]
    assert "--no-async-scheduling" in lines[1] and f"{RUNNER_ENV}=0" in lines[1]
    assert f"{RUNNER_ENV}" not in side_change_plan(s, "0.32.0")[1]


def test_the_plan_foresees_by_the_serving_vllms_own_rules(tmp_path: Path) -> None:
    """Where the serving vLLM was asked, its source's rules decide, not the version's: a vLLM
    that reports 0.26 but keeps async scheduling on with n-gram and runs it on V2 foresees
    nothing; the control then adds nothing either."""
    s = settings(tmp_path, run_extra="control = true")
    facts = replace(
        OFFLINE_FACTS,
        version="0.26.0",
        host="root@gpu:22",
        async_kept=frozenset({"ngram", "eagle3"}),
        v2_unsupported=frozenset({"suffix"}),
    )
    lines = side_change_plan(s, "0.26.0", facts)
    assert lines[0].startswith("side changes of ngram: none foreseen"), lines
    assert "(foreseen: nothing to add)" in lines[1], lines
    kept_off = replace(facts, async_kept=frozenset({"eagle3"}))
    lines = side_change_plan(s, "0.26.0", kept_off)
    assert "async scheduling disabled" in lines[0] and "model runner" not in lines[0], lines
    assert "read from vLLM 0.26.0's vllm/config/vllm.py on root@gpu:22" in lines[0], lines
    assert "--no-async-scheduling" in lines[1] and RUNNER_ENV not in lines[1], lines
    never = "vLLM 0.32.0's CPU platform turns async scheduling off at every start"
    cpu = replace(kept_off, version="0.32.0", async_never=never, triton=False)
    lines = side_change_plan(s, "0.32.0", cpu)
    assert lines[0].startswith(f"side changes of ngram: none foreseen ({never}, the original's")


CONTROL = SpecConfig(
    name="ngram-control",
    values={},
    extra_args=("--no-async-scheduling",),
    env={RUNNER_ENV: "0"},
    control_of="ngram",
)
UNIT = """# /etc/systemd/system/vllm.service
[Service]
ExecStart=/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model /m --port 8000
"""


def test_a_control_is_the_original_command_plus_its_arguments() -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert with_speculative_config(argv, CONTROL, where="t") == [*argv, "--no-async-scheduling"]
    aa = SpecConfig(name="baseline-again", values={})
    assert with_speculative_config(argv, aa, where="t") == argv


def test_a_systemd_control_sets_the_variable_in_its_dropin() -> None:
    text = render_dropin("vllm.service", UNIT, CONTROL, run_id="r1")
    assert "Environment=VLLM_USE_V2_MODEL_RUNNER=0\n" in text
    assert text.rstrip().endswith('--port 8000 "--no-async-scheduling"')
    assert text.index("Environment=") < text.index("ExecStart=")


def test_a_container_unit_cannot_carry_the_variable() -> None:
    unit = UNIT.replace(
        "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server",
        "/usr/bin/docker run --rm vllm/vllm-openai:latest",
    )
    with pytest.raises(ConfigError, match=r"VLLM_USE_V2_MODEL_RUNNER.*cannot be reproduced"):
        render_dropin("vllm.service", unit, CONTROL, run_id="r1", images=("vllm/vllm-openai",))


def test_a_local_control_gets_its_variable_over_the_targets_env(tmp_path: Path) -> None:
    target = LocalProcessTarget(
        command=["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"],
        api_base="http://127.0.0.1:1",
        model="m",
        workdir=tmp_path,
        env={"VLLM_CPU_KVCACHE_SPACE": "2", RUNNER_ENV: "1"},
        log_dir=tmp_path,
    )
    service = target.candidate(CONTROL)
    assert service._env == {"VLLM_CPU_KVCACHE_SPACE": "2", RUNNER_ENV: "0"}
    assert service.argv[-1] == "--no-async-scheduling"
    assert target.original()._env[RUNNER_ENV] == "1"
    plan = target.plan([CONTROL])
    assert any(s.startswith(f"start candidate ngram-control: {RUNNER_ENV}=0 ") for s in plan)


def test_a_local_start_log_is_the_lines_after_its_own_command(tmp_path: Path) -> None:
    target = LocalProcessTarget(
        command=["python"], api_base="http://127.0.0.1:1", model="m", workdir=tmp_path,
        env={}, log_dir=tmp_path,
    )  # fmt: skip
    service = target.original()
    (tmp_path / "server-original.log").write_text(
        "$ python -m old\nUsing V2 Model Runner\n$ python -m new\nfirst\n\nsecond\n"
    )
    assert service.start_log() == ["$ python -m new", "first", "second"]


class JournalHost:
    """A host that answers systemctl's InvocationID and journalctl, as the calls are made."""

    name = "root@gpu"

    def __init__(self, lines: list[str], *, grep: bool = True) -> None:
        self.lines, self.grep, self.calls = lines, grep, []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "systemctl":
            return CommandResult(self.name, argv, 0, "0123456789abcdef0123456789abcdef\n", "")
        if "--grep" in argv and not self.grep:
            return CommandResult(self.name, argv, 1, "", "journalctl: --grep is not supported")
        found = self.lines if "--grep" not in argv else [x for x in self.lines if "Async" in x]
        return CommandResult(
            self.name, argv, 0, "\n".join(found[::-1] if "-r" in argv else found), ""
        )


def systemd_unit(host: JournalHost) -> SystemdUnit:
    target = SimpleNamespace(
        host=host, unit="vllm.service", api_base="http://h:8000", model="m", host_name="root@gpu",
        progress=lambda _: None,
    )  # fmt: skip
    return SystemdUnit(target)  # type: ignore[arg-type]


def test_a_systemd_start_log_is_its_invocations_journal_lines_that_tell_settings() -> None:
    lines = gpu_lines("ngram")
    host = JournalHost(lines)
    found = systemd_unit(host).settings_log()
    journal = host.calls[-1]
    assert "_SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef" in journal
    assert journal[journal.index("--grep") + 1] == SETTINGS_LINES
    assert found == [lines[0]]
    # a journalctl without --grep: the newest lines, oldest first
    host = JournalHost(lines, grep=False)
    assert systemd_unit(host).settings_log() == lines
    assert parse_engine_log(lines).model_runner == "V1"


def test_the_split_says_what_the_control_ran_with_and_what_its_log_did_not_confirm() -> None:
    """The H200's control logged `model runner not logged`: its split named "model runner V1"
    among the side changes as if reproduced."""
    from pytest_specdecode.analysis.verdict.control import _checked
    from pytest_specdecode.record.engine_settings import EngineSettings
    from pytest_specdecode.record.schema import Phase

    def phase(name: str, async_on: bool, runner: str | None) -> Phase:
        p = Phase(name=name, arm=name, spec=None)
        p.engine = EngineSettings(version="0.26.0", async_scheduling=async_on, model_runner=runner)
        return p

    base = phase("baseline", True, "V2")
    cand = phase("ngram", False, "V1")
    assert _checked([base], [cand], phase("ngram-control", False, None)) == (
        "it ran with: async scheduling disabled, model runner not logged; not confirmed by its "
        "log: "
        "model runner V1 (baseline: V2)"
    )
    assert _checked([base], [cand], phase("ngram-control", False, "V1")) == (
        "it ran with: async scheduling disabled, model runner V1"
    )
