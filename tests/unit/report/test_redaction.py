"""Secrets never reach a file or the terminal: each rule, in each place the run writes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.progress import ProgressLog
from pytest_specdecode.record.store import JOURNAL_FILE, RunStore
from pytest_specdecode.redaction import (
    REDACTED,
    redact_argv,
    redact_data,
    redact_env,
    redact_text,
    register_secret,
)
from pytest_specdecode.report import html, write_reports
from pytest_specdecode.targets.local_process import LocalProcessService

from ...support.synthetic import NGRAM_ACCEPTANCE, add_phase, record, sample, settings

KEY = "sk-live-0123456789abcdef"  # registered: the value of api_key_env's variable
CASES = {
    "the API key, wherever it appears": (f"request failed with key {KEY} in it", KEY),
    "--hf-token VALUE": ("vllm serve m --hf-token hf_abcdefghijklmnop --port 8000", "hf_abc"),
    "--api-key=VALUE": ("vllm serve m --api-key=s3cr3t-value", "s3cr3t-value"),
    "a *TOKEN*= variable": ("Environment=HUGGING_FACE_HUB_TOKEN=hf_zyxwvutsrq", "hf_zyxw"),
    "a *KEY*= variable": ("export OPENAI_API_KEY=sk-other-98765", "sk-other"),
    "a Bearer header": ("Authorization: Bearer tok-4242-4242-4242", "tok-4242"),
    "a key in JSON": ('{"api_key": "json-secret-777"}', "json-secret-777"),
    "a *PASSWORD*= variable": ("Environment=DB_PASSWORD=hunter2-hunter2", "hunter2"),
    "a bearer header in lower case": ("authorization: bearer tok-lower-5555", "tok-lower"),
    "hf_token in JSON": ('{"hf_token": "hf_json_secret_888"}', "hf_json_secret"),
    "HF_TOKEN in JSON": ('{"HF_TOKEN": "hf_upper_secret_999"}', "hf_upper_secret"),
    "a key ending in token": ('{"access_token": "ya29-access-secret"}', "ya29-access"),
    "a key ending in api_key": ("openai_api_key = 'sk-py-secret-31415'", "sk-py-secret"),
}
LEAKY = "\n".join(text for text, _ in CASES.values())


@pytest.fixture(autouse=True)
def _registered() -> None:
    register_secret(KEY)


def assert_clean(text: str) -> None:
    for rule, (_, secret) in CASES.items():
        assert secret not in text, f"{rule} leaked: {text!r}"
    assert REDACTED in text


@pytest.mark.parametrize("rule", list(CASES))
def test_each_rule_hides_its_secret_and_keeps_the_rest(rule: str) -> None:
    text, secret = CASES[rule]
    clean = redact_text(text)
    assert secret not in clean and REDACTED in clean
    assert clean.split(REDACTED)[0] == text.split(secret)[0]  # what precedes it stays


def test_argv_and_env_are_redacted() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "abc123xyz", "--hf-token=hf_q", "--port", "8000"]
    assert redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--port", "8000"
    ]  # fmt: skip
    assert redact_env({"HF_TOKEN": "hf_x", "VLLM_CPU_KVCACHE_SPACE": "2"}) == {
        "HF_TOKEN": REDACTED,
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }


def test_results_json_and_the_journal(tmp_path: Path) -> None:
    rec = record(settings(tmp_path))
    rec.environment["note"] = LEAKY
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run", rec)
    store.add_sample("baseline", sample("coding", "baseline", 0, 20.0, text=LEAKY))
    store.analysis = {"warnings": [LEAKY]}
    store.flush()
    assert_clean(store.path.read_text())
    assert_clean((tmp_path / "run" / JOURNAL_FILE).read_text())
    json.loads(store.path.read_text())  # still valid JSON


def test_run_log_and_the_terminal(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    terminal = io.StringIO()
    progress = ProgressLog(pytestconfig, stream=terminal)
    progress(LEAKY)  # before the run folder exists: kept, then written
    progress.open(tmp_path / "run.log")
    progress(LEAKY)
    assert_clean((tmp_path / "run.log").read_text())
    assert_clean(terminal.getvalue())


def test_a_server_log_in_the_run_folder(tmp_path: Path) -> None:
    log = tmp_path / "server-original.log"
    log.write_text(LEAKY + "\n")
    service = LocalProcessService(
        name="original",
        argv=["true"],
        api_base="http://127.0.0.1:1",
        model="m",
        workdir=tmp_path,
        env={},
        log_path=log,
    )
    assert_clean("\n".join(service.log_tail(20)))
    service._redact_log()  # what stop() does before the log stays behind
    assert_clean(log.read_text())


def test_values_inside_lists_and_tuples_are_redacted() -> None:
    data = {"argv": ("vllm", f"--api-key={KEY}"), "turns": [("user", LEAKY)], "n": 3}
    clean = redact_data(data)
    assert_clean(json.dumps(clean))
    assert clean["n"] == 3 and clean["argv"][0] == "vllm"


def test_summary_md_the_job_summary_and_the_html_report(tmp_path: Path) -> None:
    # summary.md goes to the GitHub job summary, and the HTML report to whoever opens it: a
    # secret in any text they show (here a candidate's values and a failed test's id) is hidden.
    rec = record(settings(tmp_path))
    rec.candidates["ngram"]["draft_model"] = f"https://{KEY}@models.internal/draft"
    add_phase(rec, "baseline", {"coding": 20.0, "math": 20.0})
    add_phase(rec, "ngram", {"coding": 26.0, "math": 20.0}, acceptance=NGRAM_ACCEPTANCE)
    analysis = analyze(rec)
    (tmp_path / "run").mkdir()
    job_summary = tmp_path / "step-summary.md"
    written = write_reports(
        rec,
        analysis,
        tmp_path / "run",
        failed=[f"test_x[{line}]" for line in LEAKY.splitlines()],
        step_summary=str(job_summary),
    )
    for text in (written.summary.read_text(), job_summary.read_text()):
        assert_clean(text)
    page = html.summary(rec, analysis, plots=None) + html.extra(rec, analysis, "ngram", None)
    assert KEY not in page and REDACTED in page
