"""Stored runs: loading, a reused baseline, two runs compared, timings, facts of a run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze, candidate_verdicts
from pytest_specdecode.analysis.verdict.reuse import stored_baseline
from pytest_specdecode.cli import compare_runs as compare
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.measure.environment import git_commit, gpu_list
from pytest_specdecode.record.store import load_run
from pytest_specdecode.report import markdown, plan
from pytest_specdecode.targets.hosts.base import CommandResult

from ...support.synthetic import NGRAM_ACCEPTANCE, add_phase, record, settings, store

REPO = Path(__file__).resolve().parents[3]


def stored_run(tmp_path: Path, *, rates: dict[str, float], candidate: dict[str, float]) -> Path:
    """A finished run on disk: baseline and ngram measured."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    s = store(tmp_path, settings(tmp_path))
    add_phase(s.record, BASELINE, rates, seed=1)
    add_phase(s.record, "ngram", candidate, acceptance=NGRAM_ACCEPTANCE, seed=2)
    s.analysis = analyze(s.record).to_json()
    s.flush()
    return s.path


def test_a_stored_run_loads_as_the_record_it_was(tmp_path: Path) -> None:
    path = stored_run(tmp_path, rates={"coding": 20.0, "math": 16.0}, candidate={"coding": 25.0})
    rec = load_run(path.parent)  # a run folder works as well as its results.json
    phase = rec.phases[BASELINE]
    assert phase.spec is None and phase.server_version == "0.32.0"
    assert len(phase.measurements["math"].samples) == 6  # warm-ups are kept apart
    assert len(phase.measurements["math"].warmup) == 1


def test_load_run_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(tmp_path / "nope.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="has schema None; this pytest-specdecode reads"):
        load_run(tmp_path / "other.json")
    (tmp_path / "part.json").write_text('{"schema": 2, "target": {}}')
    with pytest.raises(ConfigError, match="is not a complete pytest-specdecode run"):
        load_run(tmp_path / "part.json")


def test_stored_baseline_needs_candidates_and_every_prompt_type(tmp_path: Path) -> None:
    path = stored_run(tmp_path / "old", rates={"coding": 20.0}, candidate={"coding": 25.0})
    phase, source = stored_baseline(str(path), settings(tmp_path, prompt_types=("coding",)))
    assert phase.reused_from == str(path.resolve()) and list(phase.measurements) == ["coding"]
    assert source.facts["vllm_version"] == "0.32.0"
    with pytest.raises(ConfigError, match="pass --spec-config"):
        stored_baseline(str(path), settings(tmp_path, candidates=()))
    with pytest.raises(ConfigError, match=r"requests for math \(prompt type"):
        stored_baseline(str(path), settings(tmp_path, prompt_types=("coding", "math")))


def test_reused_baseline_is_compared_and_its_differences_named(tmp_path: Path) -> None:
    path = stored_run(
        tmp_path / "old", rates={"coding": 20.0, "math": 16.0}, candidate={"coding": 25.0}
    )
    new = tmp_path / "new"
    new.mkdir()
    s = settings(new, prompts={"math": "another math prompt"})
    rec = record(s)
    rec.environment["gpus"] = ["0: NVIDIA L4, 23034 MiB, driver 550"]
    rec.phases[BASELINE], rec.baseline_from = stored_baseline(str(path), s)
    add_phase(
        rec, "ngram", {"coding": 30.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE, version="0.33.0"
    )
    assert candidate_verdicts(rec, "ngram")["coding"].verdict.value == "improved"
    analysis = analyze(rec)
    assert [w for w in analysis.warnings if "stored baseline" in w] == [
        "the stored baseline differs: vLLM version: 0.32.0 vs 0.33.0",
        "the stored baseline differs: GPU: none vs 0: NVIDIA L4, 23034 MiB, driver 550",
        "the stored baseline differs: the prompts of 'math' differ",
    ]
    md = markdown.summary(rec, analysis)
    assert "- ⚠ the stored baseline differs: vLLM version: 0.32.0 vs 0.33.0" in md
    assert f"- Baseline reused from {path.resolve()}" in md


def test_compare_runs_finds_a_slower_run(tmp_path: Path) -> None:
    a = stored_run(
        tmp_path / "a",
        rates={"coding": 20.0, "math": 16.0},
        candidate={"coding": 25.0, "math": 16.0},
    )
    b = stored_run(
        tmp_path / "b",
        rates={"coding": 20.0, "math": 12.0},
        candidate={"coding": 25.0, "math": 16.0},
    )
    found = compare.compare_runs(load_run(a), load_run(b), alpha=0.05, min_effect=0.03)
    # Each phase of B is another server start than A's: the restart noise (unmeasured here,
    # assumed 5%) keeps small differences undecided; 16 -> 12 tok/s is beyond it.
    assert {(r.candidate, r.prompt_type): r.verdict for r in found} == {
        ("baseline", "coding"): "inconclusive",
        ("baseline", "math"): "regressed",
        ("ngram", "coding"): "inconclusive",
        ("ngram", "math"): "inconclusive",
    }


def test_specdecode_compare_console_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = stored_run(
        tmp_path / "a",
        rates={"coding": 20.0, "math": 16.0},
        candidate={"coding": 25.0, "math": 16.0},
    )
    b = stored_run(
        tmp_path / "b",
        rates={"coding": 20.0, "math": 12.0},
        candidate={"coding": 25.0, "math": 16.0},
    )
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no differences in model, host, vLLM, GPU" in out
    regressed = r"regressed \(throughput -2\d\.\d% \[-\d+\.\d%, -\d+\.\d%\]\)"
    assert re.search(rf"^baseline\s+math\s+16\.\d\s+12\.\d\s+-2\d\.\d%.*{regressed}$", out, re.M), (
        out
    )
    assert compare.main([str(a), str(b), "--fail-on-regression", "--markdown"]) == 1
    md = capsys.readouterr().out
    assert "| phase | prompt | A tok/s | B tok/s | change | TPOT A → B ms | p | verdict |" in md
    assert compare.main([str(a), str(tmp_path / "missing.json")]) == 2
    # Installed as a console script.
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "specdecode-compare"]
    assert script.value == "pytest_specdecode.cli.compare_runs:main"
    done = subprocess.run(
        [Path(sys.executable).parent / "specdecode-compare", str(a), str(a)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "inconclusive" in done.stdout


def test_specdecode_compare_is_never_green_on_nothing_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = stored_run(tmp_path / "a", rates={"coding": 20.0}, candidate={"coding": 25.0})
    same = stored_run(tmp_path / "same", rates={"coding": 20.0}, candidate={"coding": 25.0})
    # Run B as fast as A: with the restart noise unmeasured (assumed 5%), no verdict either way.
    assert compare.main([str(a), str(same), "--fail-on-regression"]) == 0
    assert compare.main([str(a), str(same), "--fail-on-undecided"]) == 1
    err = capsys.readouterr().err
    assert "specdecode-compare: no verdict on baseline/coding (inconclusive), ngram/coding" in err
    # 50% faster on every row: decided, so the gate passes.
    fast = stored_run(tmp_path / "fast", rates={"coding": 30.0}, candidate={"coding": 37.5})
    args = [str(a), str(fast), "--fail-on-undecided", "--fail-on-regression"]
    assert compare.main(args) == 0
    assert "improved" in capsys.readouterr().out
    # Nothing in common: nothing compared is not a pass.
    other = stored_run(tmp_path / "other", rates={"math": 20.0}, candidate={"math": 25.0})
    assert compare.main([str(a), str(other), "--fail-on-undecided"]) == 1
    assert "nothing was compared" in capsys.readouterr().err


def test_compare_names_what_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = stored_run(tmp_path / "a", rates={"coding": 20.0}, candidate={"coding": 25.0})
    b = stored_run(tmp_path / "b", rates={"coding": 20.0}, candidate={"coding": 25.0})
    doc = json.loads(b.read_text())
    doc["phases"]["baseline"]["server_version"] = "0.33.0"
    doc["target"]["model"] = "other-model"
    doc["prompt_types"]["coding"]["max_tokens"] = 256
    b.write_text(json.dumps(doc))
    compare.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "differs: model: smollm2-135m-instruct vs other-model" in out
    assert "differs: vLLM version: 0.32.0 vs 0.33.0" in out
    assert "differs: max_tokens of 'coding': 64 vs 256" in out


def test_previous_timing_from_a_stored_run(tmp_path: Path) -> None:
    s = settings(tmp_path)
    kwargs = {"host": "localhost", "default_start_s": 60.0}
    unknown = plan.previous_timing(s, **kwargs)  # nothing stored, the accelerator unknown
    assert unknown.s_per_token is None and unknown.source.startswith("no stored run")
    run = s.reports_dir / "20260101T000000Z-ngram"
    run.mkdir(parents=True)
    st = store(run.parent / "x", s)
    add_phase(st.record, BASELINE, {"coding": 20.0}).startup_s = 40.0
    add_phase(st.record, "ngram", {"coding": 20.0}).startup_s = 44.0
    add_phase(st.record, "baseline-after", {"coding": 20.0}, arm=BASELINE)  # found running
    st.path = run / "results.json"
    st.flush()
    # The start-up times are the phases' own, never read back from the log.
    (run / "run.log").write_text("x local vLLM process 'original' not ready after 600s\n")
    timing = plan.previous_timing(s, **kwargs)
    assert timing.start_s == 42.0
    assert timing.s_per_token == pytest.approx(1 / 20.0, rel=0.05)
    assert timing.source == "from the stored run 20260101T000000Z-ngram"
    assert plan.previous_timing(s, host="root@gpu:22", default_start_s=300.0).start_s == 300.0
    # A run that took twice its plan's estimate (warm-up, token ids, waits, stops the plain
    # estimate leaves out): the next plan's estimate goes at that pace, and says so.
    st.record.environment.update({"planned_s": 180.0, "run_s": 370.0})
    st.flush()
    paced = plan.previous_timing(s, **kwargs)
    assert paced.pace == pytest.approx(370 / 180)
    assert paced.source.endswith("which took 2.1 times its plan's estimate")
    args = {"baseline": True, "aba": False, "adopts_original": False}
    assert plan.estimate_seconds(s, paced, **args)[0] == pytest.approx(
        plan.plain_seconds(s, paced, **args)[0] * 370 / 180
    )


class FakeHost:
    name = "root@gpu:22"

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.seen: list[list[str]] = []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        self.seen.append(list(argv))
        return self.result


def test_gpu_list_and_git_commit() -> None:
    line = "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"
    csv = f"0, {line}\n1, {line}\n"
    host = FakeHost(CommandResult("gpu", ("sh",), 0, csv, ""))
    assert gpu_list(host) == [
        "0: NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15",
        "1: NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15",
    ]
    assert "nvidia-smi" in host.seen[0][-1]
    assert gpu_list(FakeHost(CommandResult("gpu", ("sh",), 3, "", ""))) is None
    commit = git_commit(REPO / "suites" / "specdecode.toml")
    assert commit is not None and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
