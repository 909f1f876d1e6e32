"""history.py: facts of a run, a reused stored baseline, two stored runs compared."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.measure.experiment import BASELINE
from pytest_specdecode.record import history
from pytest_specdecode.report import summary as report
from pytest_specdecode.targets.hosts import CommandResult

from .test_report_data import NGRAM_ACCEPTANCE, add_phase, experiment, settings

REPO = Path(__file__).resolve().parent.parent


def stored_run(tmp_path: Path, *, rates: dict[str, float], candidate: dict[str, float]) -> Path:
    """A finished run on disk: baseline and ngram measured, verdicts computed."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    exp = experiment(tmp_path, settings(tmp_path), run_dir=tmp_path / "run")
    add_phase(exp, BASELINE, rates, seed=1)
    add_phase(exp, "ngram", candidate, acceptance=NGRAM_ACCEPTANCE, seed=2)
    exp.verdicts("ngram")
    return exp.results.path


def test_stored_phase_round_trip(tmp_path: Path) -> None:
    path = stored_run(tmp_path, rates={"coding": 20.0, "math": 16.0}, candidate={"coding": 25.0})
    doc = history.load_results(path.parent)  # a run folder works as well as its results.json
    phase = history.stored_phase(doc, BASELINE, ["coding", "math"])
    assert phase.spec is None and phase.server_version == "0.32.0"
    assert phase.measurements["coding"].tokens_per_s == report.tokens_per_s(doc, BASELINE, "coding")
    assert len(phase.measurements["math"].samples) == 6  # warm-ups are left out
    with pytest.raises(
        ConfigError, match="no measured 'baseline' requests for the prompt type 'x'"
    ):
        history.stored_phase(doc, BASELINE, ["x"])


def test_load_results_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        history.load_results(tmp_path / "nope.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match=r"not a pytest-specdecode results\.json"):
        history.load_results(tmp_path / "other.json")


def test_check_stored_baseline_needs_candidates_and_every_prompt(tmp_path: Path) -> None:
    path = stored_run(tmp_path / "old", rates={"coding": 20.0}, candidate={"coding": 25.0})
    ok = settings(tmp_path, workloads=("coding",))
    assert history.check_stored_baseline(str(path), ok)["phases"][BASELINE]
    with pytest.raises(ConfigError, match="pass --spec-config"):
        history.check_stored_baseline(str(path), settings(tmp_path, candidates=()))
    with pytest.raises(ConfigError, match="prompt type 'math'"):
        history.check_stored_baseline(str(path), settings(tmp_path, workloads=("coding", "math")))


def test_reused_baseline_is_not_measured_and_warns_about_differences(tmp_path: Path) -> None:
    path = stored_run(
        tmp_path / "old", rates={"coding": 20.0, "math": 16.0}, candidate={"coding": 25.0}
    )
    new = tmp_path / "new"
    new.mkdir()
    s = settings(new, prompts={"math": "another math prompt"})
    exp = experiment(new, s)
    exp.results.data["environment"]["gpus"] = ["0: NVIDIA L4, 23034 MiB, driver 550"]
    with pytest.warns(history.StoredBaselineWarning) as caught:
        history.use_stored_baseline(exp, str(path))
    assert [str(w.message) for w in caught] == [
        "the stored baseline differs: GPU: none vs 0: NVIDIA L4, 23034 MiB, driver 550",
        "the stored baseline differs: the prompt of 'math' differs",
    ]
    doc = exp.results.data
    assert doc["phases"][BASELINE]["reused_from"] == str(path.resolve())
    assert doc["baseline_from"]["vllm_version"] == "0.32.0"
    assert sum(s["phase"] == BASELINE for s in doc["samples"]) == 2 * 7  # with the warm-ups
    # The candidate is compared with the stored baseline; nothing measures the baseline again.
    exp.board.activate = None
    add_phase(
        exp, "ngram", {"coding": 30.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE, version="0.33.0"
    )
    assert exp.phase(BASELINE) is exp.phases[BASELINE]
    assert exp.verdicts("ngram")["coding"].verdict == "improved"
    # At the end the vLLM version is known too; each difference is kept once.
    fresh = history.stored_baseline_warnings(doc)
    assert fresh == ["the stored baseline differs: vLLM version: 0.32.0 vs 0.33.0"]
    assert history.stored_baseline_warnings(doc) == []
    assert len(doc["warnings"]) == 3
    md = report.summary_markdown(doc)
    assert "- ⚠ the stored baseline differs: vLLM version: 0.32.0 vs 0.33.0" in md
    assert f"- Baseline reused from `{path.resolve()}`" in md


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
    rows = history.compare_runs(history.load_results(a), history.load_results(b))
    verdicts = {(r.phase, r.prompt): r.verdict for r in rows}
    assert verdicts == {
        ("baseline", "coding"): "no significant difference",
        ("baseline", "math"): "regressed",
        ("ngram", "coding"): "no significant difference",
        ("ngram", "math"): "no significant difference",
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
    assert history.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no differences in model, host, vLLM, GPU" in out
    assert re.search(r"^baseline\s+math\s+16\.\d\s+12\.\d\s+-2\d\.\d%.*regressed$", out, re.M), out
    assert history.main([str(a), str(b), "--fail-on-regression", "--markdown"]) == 1
    md = capsys.readouterr().out
    assert "| phase | prompt | A tok/s | B tok/s | change | TPOT A → B ms | p | verdict |" in md
    assert history.main([str(a), str(tmp_path / "missing.json")]) == 2
    # Installed as a console script.
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "specdecode-compare"]
    assert script.value == "pytest_specdecode.record.history:main"
    done = subprocess.run(
        [Path(sys.executable).parent / "specdecode-compare", str(a), str(a)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no significant difference" in done.stdout


def test_compare_names_what_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = stored_run(tmp_path / "a", rates={"coding": 20.0}, candidate={"coding": 25.0})
    b = stored_run(tmp_path / "b", rates={"coding": 20.0}, candidate={"coding": 25.0})
    doc = json.loads(b.read_text())
    doc["phases"]["baseline"]["server_version"] = "0.33.0"
    doc["target"]["model"] = "other-model"
    doc["workloads"]["coding"]["max_tokens"] = 256
    b.write_text(json.dumps(doc))
    history.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "differs: model: smollm2-135m-instruct vs other-model" in out
    assert "differs: vLLM version: 0.32.0 vs 0.33.0" in out
    assert "differs: max_tokens of 'coding': 64 vs 256" in out


def test_previous_timing_from_a_stored_run(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert history.previous_timing(s).source.startswith("assumed: no stored run")
    run = s.reports_dir / "20260101T000000Z-ngram"
    exp = experiment(tmp_path, s, run_dir=run)
    add_phase(exp, BASELINE, {"coding": 20.0})
    (run / "run.log").write_text(
        "x local vLLM process 'original' (pid 1) ready after 40s\n"
        "x local vLLM process 'candidate-ngram' (pid 2) ready after 44s\n"
    )
    timing = history.previous_timing(s)
    assert timing.start_s == 42.0
    assert timing.s_per_token == pytest.approx(1 / 20.0, rel=0.05)
    assert timing.source == "from the stored run 20260101T000000Z-ngram"


class FakeHost:
    name = "root@gpu:22"

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.seen: list[list[str]] = []

    def run(self, argv, *, timeout=60.0, stdin=None):
        self.seen.append(list(argv))
        return self.result


def test_gpu_list_and_git_commit() -> None:
    line = "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"
    csv = f"0, {line}\n1, {line}\n"
    host = FakeHost(CommandResult("gpu", ("sh",), 0, csv, ""))
    assert history.gpu_list(host) == [
        "0: NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15",
        "1: NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15",
    ]
    assert "nvidia-smi" in host.seen[0][-1]
    assert history.gpu_list(FakeHost(CommandResult("gpu", ("sh",), 3, "", ""))) is None
    commit = history.git_commit(REPO / "suites" / "specdecode.toml")
    assert commit is not None and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    assert history.git_commit(Path("/")) is None
