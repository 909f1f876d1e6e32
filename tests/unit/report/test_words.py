"""Words that agree with the numbers: the metric that decided a verdict, the table's columns,
the local server's pid and environment, the suite that ran."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.cli.compare_runs import compare_runs, comparison_lines
from pytest_specdecode.measure.environment import suite_content
from pytest_specdecode.report import html, markdown, terminal
from pytest_specdecode.report.text import suite_text
from pytest_specdecode.targets.local_process import LocalProcessService

from ...support.synthetic import add_phase, record, settings

INTERVAL = r"[+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\]"


def _run(tmp_path: Path, prompt_types: tuple[str, ...] = ("coding", "math")):
    rec = record(settings(tmp_path, prompt_types=prompt_types, samples=12))
    add_phase(rec, "baseline", dict.fromkeys(prompt_types, 20.0), seed=1, spread=0.01)
    add_phase(rec, "ngram", dict.fromkeys(prompt_types, 12.0), seed=2, spread=0.01)
    return rec


def test_every_renderer_names_the_deciding_metric_with_its_interval(tmp_path: Path) -> None:
    rec = _run(tmp_path)
    analysis = analyze(rec)
    v = analysis.verdicts["ngram"]["coding"]
    (deciding,) = v.deciding
    low, high = deciding.ratio_ci
    named = f"{v.verdict.value} ({'TPOT' if deciding.metric == 'tpot' else 'throughput'} "
    said = f"{named}{deciding.change:+.1%} [{low - 1:+.1%}, {high - 1:+.1%}])"
    text = "\n".join(terminal.lines(rec, analysis, files={}))
    assert re.search(rf"^coding\s+ngram\s.*  {re.escape(said)}$", text, re.M), text
    assert said in markdown.summary(rec, analysis)
    assert said in html.summary(rec, analysis, None)
    (tmp_path / "b").mkdir()
    b = _run(tmp_path / "b")
    lines = comparison_lines(
        rec, b, compare_runs(rec, b, alpha=0.05, min_effect=0.03), names=("a", "b"), markdown=False
    )
    table = lines[lines.index(next(x for x in lines if x.startswith("phase"))) + 1 :]
    assert len(table) == 4  # two phases, two prompt types
    assert all(re.search(rf"  \w+ \((throughput|TPOT) {INTERVAL}\)$", row) for row in table)


def test_an_equivalent_verdict_names_both_metrics(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, samples=12))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 20.0}, seed=1, spread=0.001)
    add_phase(rec, "ngram", {"coding": 20.0, "math": 20.0}, seed=1, spread=0.001)
    rec.restart_noise_prior = {
        m: {"sd": 0.002, "df": 40.0, "source": "stored A/A runs", "measured": True}
        for m in ("throughput", "tpot")
    }
    v = analyze(rec).verdicts["ngram"]["coding"]
    assert v.verdict.value == "equivalent"
    assert [c.metric for c in v.deciding] == ["throughput", "tpot"]


def test_the_terminal_table_is_as_wide_as_its_longest_label(tmp_path: Path) -> None:
    rec = _run(tmp_path, ("structured_output_long", "math"))
    text = terminal.lines(rec, analyze(rec), files={})
    head = next(line for line in text if line.startswith("prompt"))
    rows = [line for line in text if line.startswith(("structured_output_long ", "math "))]
    assert len(rows) == 2
    column = head.index("base tok/s") + len("base tok/s")  # right-aligned: ends line up
    for row in rows:
        assert re.match(r"\S+\s+ngram\s+\d+\.\d$", row[:column]), (head, row)
        assert row[column] == " "


def _service(tmp_path: Path, script: str, env: dict[str, str] | None = None) -> LocalProcessService:
    return LocalProcessService(
        name="original",
        argv=[sys.executable, "-c", script],
        api_base="http://127.0.0.1:1",
        model="m",
        workdir=tmp_path,
        env=env or {},
        log_path=tmp_path / "server-original.log",
        stop_timeout_s=5,
    )


def test_a_local_start_names_its_own_pid_and_reads_its_own_log(tmp_path: Path) -> None:
    service = _service(tmp_path, "import time; print('up', flush=True); time.sleep(30)")
    service.start()
    first = service.label
    assert re.search(r"\(pid \d+\)$", first)
    service.stop()
    assert service.label == "local vLLM process 'original'"  # "starting …" names no old pid
    service.start()
    try:
        assert service.label != first and "(pid " in service.label
        assert len([line for line in service.start_log() if line.startswith("$ ")]) == 1
    finally:
        service.stop()
    assert (tmp_path / "server-original.log").read_text().count("$ ") == 2  # both starts kept


def test_a_failed_import_names_the_held_back_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    service = _service(tmp_path, "import flashinfer")
    service.start()
    proc = service._proc
    assert proc is not None
    proc.wait(30)
    reason = service.failure()
    assert reason is not None and reason.startswith("the process exited with status 1; ")
    assert "this run's PYTHONPATH (/tmp/site) is not passed to it" in reason
    assert "set PYTHONPATH in [target.env]" in reason
    given = _service(tmp_path, "import flashinfer", env={"PYTHONPATH": "/elsewhere"})
    given.start()
    assert given._proc is not None
    given._proc.wait(30)
    assert given.failure() == "the process exited with status 1"  # passed as written


def test_a_suite_outside_git_is_named_by_its_folder_and_content(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    (suite / "__pycache__").mkdir(parents=True)
    (suite / "specdecode.toml").write_text("[run]\n")
    (suite / "test_x.py").write_text("def test(): pass\n")
    (suite / "__pycache__" / "x.pyc").write_bytes(os.urandom(8))
    found = suite_content(suite / "specdecode.toml")
    assert found is not None and found.startswith(f"{suite.resolve()}, content ")
    assert found.endswith("(2 files)")
    assert suite_content(suite) == found  # the same suite, the same hash
    # an A/A run writes its host profile beside the suite: measured noise, not suite content
    profiles = suite / "host-profiles-h200"
    profiles.mkdir()
    (profiles / "localhost--gpu-1x-NVIDIA_H200--m.json").write_text("{}\n")
    assert suite_content(suite, besides=[profiles]) == found
    assert suite_content(suite) != found
    (suite / "test_x.py").write_text("def test(): assert 1\n")
    assert suite_content(suite, besides=[profiles]) != found  # another content, another hash
    said = suite_text({"git_commit": None, "suite_content": found}, markdown=True)
    assert said == f"`{found}` (not a git checkout)" and "unknown" not in said
    assert suite_text({"git_commit": "0123456789abcdef"}, markdown=True) == "`0123456789ab`"
