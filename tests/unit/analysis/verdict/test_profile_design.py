"""A host profile's entries name the design their starts were sent in, and a run reads its own.

A blocked start's restart noise holds the drift that interleaving spreads over the prompt types:
on the H200 the blocked A/A measured 13.8%, the interleaved one 5.5%. Pooled, an interleaved run
was told about 11%; it now reads the interleaved entry, and falls back to the others, named, only
where none of its design was measured.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.verdict import noise
from pytest_specdecode.config.arms import AA_ARM, BASELINE
from pytest_specdecode.record.profile import (
    Accelerator,
    ProfileEntry,
    ProfileKey,
    add_entry,
    lookup,
    record_design,
)

from ....support.synthetic import aa_entry, add_phase, record, settings

REPO = Path(__file__).resolve().parents[4]
CPU = Accelerator("cpu", "AMD EPYC")
H200 = Accelerator("gpu", "NVIDIA H200", 1)
MODEL = "smollm2-135m-instruct"
KEY = ProfileKey("localhost", CPU, MODEL, "0.32.0")
DRIFT = {"sd": 0.05, "phi": 0.8, "lag1": 0.4, "residual_sd": 0.1, "requests": 96, "starts": 8}


def entry(run: str, sd: float, design: str) -> ProfileEntry:
    return aa_entry(run, "0.32.0", sd, design=design)


def test_an_entry_written_before_its_design_was_kept_reads_it_from_its_drift() -> None:
    old = entry("aa", 0.07, "blocked").to_json()
    del old["design"]
    assert ProfileEntry.from_json(old).design == "blocked"  # before interleaving: blocked
    drift = {m: {**DRIFT, "blocked": False} for m in ("throughput", "tpot")}
    assert ProfileEntry.from_json({**old, "drift": drift}).design == "interleaved"
    drift = {m: {**DRIFT, "blocked": True} for m in ("throughput", "tpot")}
    assert ProfileEntry.from_json({**old, "drift": drift}).design == "blocked"
    kept = entry("aa", 0.07, "together")
    assert ProfileEntry.from_json(json.loads(json.dumps(kept.to_json()))) == kept


def test_a_run_reads_the_entries_of_its_own_design_else_all_of_them_named(tmp_path: Path) -> None:
    add_entry(tmp_path, "localhost", CPU, MODEL, entry("aa-blocked", 0.10, "blocked"))
    add_entry(tmp_path, "localhost", CPU, MODEL, entry("aa-interleaved", 0.04, "interleaved"))
    found = lookup(tmp_path, KEY)

    interleaved = noise.known(found, [], design="interleaved")["throughput"]
    assert interleaved.sd == pytest.approx(0.04) and interleaved.df == 7.0
    assert "1 A/A run, 8 starts, vLLM 0.32.0, interleaved design" in interleaved.source
    blocked = noise.known(found, [], design="blocked")["throughput"]
    assert blocked.sd == pytest.approx(0.10)

    # None of its design: every entry, pooled, and the source says which designs they were.
    together = noise.known(found, [], design="together")["throughput"]
    assert together.df == 14.0 and 0.04 < together.sd < 0.10
    assert "blocked and interleaved design, none together" in together.source
    # No design given (a caller that does not know it): every entry, as before.
    assert noise.known(found, [])["throughput"].df == 14.0


def test_an_aa_run_writes_the_design_its_starts_were_sent_in(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, prompt_types=("coding",)))
    rec.candidates = {AA_ARM: {}}
    for i, arm in enumerate((BASELINE, AA_ARM, BASELINE, AA_ARM)):
        name = arm if i < 2 else f"{arm}#2"
        scaled = 20.0 * (1 + 0.04 * (-1) ** i)
        add_phase(rec, name, {"coding": scaled}, arm=arm, seed=i)
    assert record_design(rec) == "blocked"  # no order recorded: written before interleaving
    for name, phase in list(rec.phases.items()):
        rec.phases[name] = dataclasses.replace(phase, order="interleaved")
    assert record_design(rec) == "interleaved"
    entry_written = noise.profile_entry(rec, run="aa", date="2026-12-02")
    assert entry_written is not None and entry_written.design == "interleaved"
    first = next(iter(rec.phases))
    rec.phases[first] = dataclasses.replace(rec.phases[first], together_with="other")
    assert record_design(rec) == "together"


def test_the_committed_h200_profile_gives_an_interleaved_run_its_interleaved_entry() -> None:
    folder = REPO / "suites" / "host-profiles-h200"
    found = lookup(folder, ProfileKey("localhost", H200, MODEL, "0.26.0"))
    assert found.profile is not None
    designs = sorted(e.design for e in found.profile.entries)
    assert "blocked" in designs and "interleaved" in designs
    interleaved = noise.known(found, [], design="interleaved")["throughput"]
    blocked = noise.known(found, [], design="blocked")["throughput"]
    assert interleaved.sd < blocked.sd and interleaved.df == blocked.df == 3.0
