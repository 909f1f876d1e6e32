"""Where a user meets the prediction: the terminal, summary.md, the HTML report and its heat map,
specdecode-predict on a machine without vLLM, and the dry run."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.report import html, markdown, stored_plan, terminal, write_reports
from pytest_specdecode.report.sections.prediction import HEADER, notes

from ...support.inprocess import run_in_process
from ...support.synthetic import RECORDED_TYPES, add_phase, record, recorded_run, settings
from ..plugin.test_report_options import CONFIG

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PREDICT = Path(sys.executable).parent / "specdecode-predict"


def store(rec: RunRecord, folder: Path) -> Path:
    folder.mkdir(parents=True)
    return RunStore(folder, rec).path


def test_terminal_summary_and_html_show_predicted_beside_measured(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    analysis = analyze(rec)
    text = "\n".join(terminal.lines(rec, analysis, files={}))
    assert "Predicted against measured: the n-gram replay of the baseline's token ids" in text
    assert re.search(
        r"^  math +ngram \(k=5 n=4\.\.4\) +4\.36 / 4\.36 +67\.3% / 67\.3% +1\.61 +"
        r"[\d.]+ \[[\d.]+, [\d.]+\] +[\d.]+ +(yes|no)  exact$",
        text,
        re.M,
    ), text
    differs = r"^  explanatory +ngram-min2 \(k=3 n=2\.\.3\) +1\.56 / 1\.62 .* outputs differ$"
    assert re.search(differs, text, re.M)
    assert "  Cost model: t_step = t0 * (1 + " in text and "  Next: " in text

    md = markdown.summary(rec, analysis)
    header = "| " + " | ".join(HEADER) + " |"
    lines = md.splitlines()
    start = lines.index(header)
    table = lines[start : start + 10]
    assert all(line.count("|") == 10 for line in table), table
    assert "| coding | ngram (k=5 n=4..4) | 2.50 / 2.50 | 30.0% / 30.0% | 1.07 |" in md
    assert md.index("### Predicted against measured") < md.index("### Checks")

    page = html.summary(rec, analysis, None)
    assert "<h3 id='specdecode-prediction'>" in page
    assert "<td>ngram (k=5 n=4..4)</td>" in page
    assert re.search(r"<td class='verdict ' title='outputs equal the baseline[^']*'>exact</td>",
                     page)  # fmt: skip
    assert "<td class='verdict v-insufficient-samples'" in page  # explanatory: outputs differ


def test_write_reports_draws_the_heat_map_and_the_html_embeds_it(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    analysis = analyze(rec)
    (tmp_path / "run").mkdir()
    written = write_reports(rec, analysis, tmp_path / "run", failed=[], step_summary=None)
    heat = written.plots["prediction"]
    assert heat == tmp_path / "run" / "prediction.png"
    assert heat.read_bytes().startswith(PNG_MAGIC)
    image = matplotlib.image.imread(heat)
    assert image.shape[1] > 900 and image[..., :3].std() > 0.05  # four panels, drawn
    page = html.summary(rec, analysis, written.plots)
    assert "<img id='specdecode-plot-prediction' alt='prediction plot'" in page
    assert "Predicted speedup over the baseline for every n-gram config" in page
    # Nothing predicted, nothing drawn.
    bare = record(settings(tmp_path))
    add_phase(bare, BASELINE, {"coding": 20.0, "math": 16.0})
    (tmp_path / "bare").mkdir()
    plots = write_reports(bare, analyze(bare), tmp_path / "bare", failed=[], step_summary=None)
    assert "prediction" not in plots.plots
    assert not (tmp_path / "bare" / "prediction.png").exists()
    assert "Not predicted: coding: no token ids recorded" in plots.markdown


def test_specdecode_predict_prints_the_grid_without_vllm(tmp_path: Path) -> None:
    assert importlib.util.find_spec("vllm") is None, "this interpreter must not have vLLM"
    results = store(recorded_run(tmp_path), tmp_path / "reports" / "R")
    done = subprocess.run([str(PREDICT), str(results)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "smollm2-135m-instruct on localhost, vLLM 0.32.0" in out
    assert "token ids, coding: 1 prompt(s); output ids from return_token_ids" in out
    assert '  ngram {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}: ' \
           "effective k=5 n=4..4" in out  # fmt: skip
    for name in RECORDED_TYPES:
        assert f"{name}: predicted speedup over the baseline; rows n=min..max, columns k" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("k=1"))
    assert header.split() == [f"k={k}" for k in range(1, 9)]
    rows = [line for line in out.splitlines() if re.match(r"  n=\d\.\.\d ", line)]
    assert len(rows) == 4 * 21
    # A cell is blank where the prediction's band does not bound, and the grid says how many.
    cells = [[r[10 + 7 * i : 17 + 7 * i].strip() for i in range(8)] for r in rows]
    blank = [sum(c == "" for row in cells[i * 21 : (i + 1) * 21] for c in row) for i in range(4)]
    said = [int(n) for n in re.findall(r"^  no prediction for (\d+) of 168 configs", out, re.M)]
    assert said == [n for n in blank if n], (said, blank)
    assert re.search(
        r"^  math +ngram \(k=5 n=4\.\.4\) +accepted per draft 4\.36 / 4\.36, .*: exact$",
        out,
        re.M,
    )
    assert "Cost model: t_step" in out and "Next: " in out
    as_json = subprocess.run(
        [str(PREDICT), str(results.parent), "--json"], capture_output=True, text=True, timeout=120
    )
    data = json.loads(as_json.stdout)
    assert data["comparisons"]["ngram"]["math"]["status"] == "exact"
    assert len(data["grid"]["math"]["rows"]) == 168


def test_specdecode_predict_says_why_not(tmp_path: Path) -> None:
    bare = record(settings(tmp_path))
    add_phase(bare, BASELINE, {"coding": 20.0, "math": 16.0})
    results = store(bare, tmp_path / "R")
    done = subprocess.run([str(PREDICT), str(results)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "nothing to predict: coding: no token ids recorded" in done.stdout
    missing = subprocess.run([str(PREDICT), str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_dry_run_predicts_the_planned_candidates_from_a_stored_baseline(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    planned = settings(
        tmp_path,
        prompt_types=("coding", "math", "other"),
        candidates=("ngram", "eagle", '{"method": "ngram", "num_speculative_tokens": 2}'),
    )
    assert stored_plan.stored_prediction(planned, host="localhost") == [
        "prediction: no stored baseline with token ids of this model on this host in "
        f"{planned.reports_dir}"
    ]
    store(rec, planned.reports_dir / "20260101T000000Z-ngram")
    lines = stored_plan.stored_prediction(planned, host="localhost")
    assert lines[0].startswith(
        "prediction from the stored baseline of 20260101T000000Z-ngram (n-gram replay; cost "
        "model fitted from its measured n-gram candidates: t_step = t0 * (1 + "
    )
    assert re.fullmatch(
        r"  ngram \(effective k=5 n=4\.\.4\): coding 1\.07 tokens per step, 2\.50 accepted per "
        r"draft, "
        r"predicted [+-][\d.]+% \[[+-][\d.]+%, [+-][\d.]+%\]; math 1\.61 tokens per step, .*",
        lines[1],
    ), lines[1]
    assert lines[2].startswith("  eagle: method 'eagle' drafts with a model")
    assert lines[3].startswith("  ngram-k2 (effective k=2 n=5..5): coding ")  # neither bound: 5
    assert lines[4] == (
        "  not predicted (prompt or max_tokens differ from the stored run, or not in it): other"
    )
    assert stored_plan.stored_prediction(planned, host="gpu-host")[0].startswith(
        "prediction: no stored baseline"
    )


def test_dry_run_through_pytest_shows_the_prediction(pytester: pytest.Pytester) -> None:
    rec = recorded_run(pytester.path)  # writes an experiment.toml of its own: replaced below
    config = pytester.path / "experiment.toml"
    config.write_text(CONFIG.format(reports=pytester.path / "reports"))
    rec.prompt_types = {
        k: dataclasses.replace(v, max_tokens=32)
        for k, v in rec.prompt_types.items()
        if k in ("coding", "math")
    }
    store(rec, pytester.path / "reports" / "20260101T000000Z-ngram")
    result = run_in_process(
        pytester, "--spec-file", str(config), "--spec-config", "ngram", "--spec-dry-run"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "prediction from the stored baseline of 20260101T000000Z-ngram" in out
    assert "  ngram (effective k=5 n=4..4): coding 1.07 tokens per step" in out


def test_a_search_run_names_no_best_of_its_own_in_the_prediction_section(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    prediction = analyze(rec).prediction
    assert prediction is not None and prediction.recommendation is not None
    own = notes(prediction)
    assert f"Next: {prediction.recommendation.reason}" in own
    searched = notes(prediction, searched=True)
    assert prediction.recommendation.reason not in "\n".join(searched)
    assert "Next: as the search's answer says" in "\n".join(searched)
