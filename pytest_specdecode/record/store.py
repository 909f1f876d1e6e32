"""Where a run is stored: the one writer of results.json, and the reader of stored runs.

Each request is appended to `samples.jsonl` the moment it finishes (the crash journal: a killed
controller loses nothing it measured). `results.json`, the run record with the derived analysis
beside it, is rewritten atomically whenever a measurement, a phase or the run ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import write_atomically
from ..redaction import redact_data
from .requests.samples import RequestSample
from .schema import RunRecord, _finite

RESULTS_FILE = "results.json"
JOURNAL_FILE = "samples.jsonl"


class RunStore:
    """One run's folder: results.json and the sample journal. The only writer of either."""

    def __init__(self, run_dir: Path, record: RunRecord) -> None:
        self.run_dir = run_dir
        self.record = record
        self.path = run_dir / RESULTS_FILE
        self.analysis: Mapping[str, Any] | None = None  # derived; written for readers only
        self.extra: dict[str, Any] = {}  # top-level keys of a run of its own kind (a crossover)
        self.flush()

    def add_sample(self, phase: str, sample: RequestSample, **tags: Any) -> None:
        """Journal one finished request at once; results.json follows at the next flush.
        `tags`: where it was measured, beside its own fields (a crossover's period, replica)."""
        data = redact_data(_finite({"phase": phase, **tags, **sample.to_json()}))
        with (self.run_dir / JOURNAL_FILE).open("a") as journal:
            journal.write(json.dumps(data, allow_nan=False) + "\n")

    def flush(self) -> None:
        data = self.record.to_json()
        data.update(_finite(dict(self.extra)))
        if self.analysis is not None:
            data["analysis"] = _finite(dict(self.analysis))
        text = json.dumps(redact_data(data), indent=1, default=str, allow_nan=False)
        write_atomically(self.path, text)


def load_run(path: str | Path) -> RunRecord:
    """A stored run: its results.json, or the run folder that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"stored run {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"stored run {path} is not a readable results.json: {exc}") from None
    return RunRecord.from_json(data, source=str(path))


def stored_runs(reports_dir: Path, *, host: str, model: str) -> Iterator[tuple[Path, RunRecord]]:
    """The readable stored runs of this host and model, newest first."""
    if not reports_dir.is_dir():
        return
    for folder in sorted((p for p in reports_dir.iterdir() if p.is_dir()), reverse=True):
        if not (folder / RESULTS_FILE).is_file():
            continue
        try:
            record = load_run(folder)
        except ConfigError:
            continue
        if record.target.host == host and record.target.model == model:
            yield folder, record
