"""The search as the run drives it (`--spec-search ngram`): each slot resolved when asked.

pytest collects the tests before anything is measured, so the search's candidates have slots
known at collection: `search-1` .. `search-N` (N = `--spec-max-reloads`). Asking for slot i
measures the baseline, then each slot up to i in turn: the policy (analysis/search/policy.py) picks
the config from what was measured so far, the host's vLLM checks it as any candidate's, and the
experiment measures it as one more candidate, in a server start of its own. A slot the search
did not reach raises `SearchStopped` with the reason; its tests are skipped with it.

Nothing here starts or stops a service itself: the experiment does, inside the context manager
whose teardown restores the original, so a search interrupted anywhere (a failed reload, an
exception while choosing, Ctrl-C) leaves no candidate running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..analysis.prediction.bands.coverage import band_coverage
from ..analysis.prediction.level_prediction import cost_prior
from ..analysis.run import candidate_verdicts
from ..analysis.search.policy import SearchPolicy, Stop
from ..config.arms import BASELINE
from ..config.break_even import point_of
from ..config.specconfig import SpecConfig
from ..errors import ConfigError
from ..record.schema import RunRecord
from ..record.search import SearchRecord, SearchReload, slot_name
from ..targets.base import Progress
from .experiment.arms import Experiment

__all__ = ["SearchRun", "SearchStopped"]

Stored = Callable[[], Sequence[tuple[str, RunRecord]]]


class SearchStopped(Exception):
    """A slot the search did not reach, and why: not a failure."""


class SearchRun:
    """One search over one experiment: its slots, its policy and its record."""

    def __init__(
        self,
        experiment: Experiment,
        *,
        method: str,
        max_reloads: int,
        margin: float,
        stored: Stored,
        prepare: Callable[[SpecConfig], SpecConfig],
        progress: Progress,
        before_choice: Callable[[], None] = lambda: None,
        max_num_seqs: int | None = None,
    ) -> None:
        self.experiment = experiment
        self.method = method
        self.max_reloads = max_reloads
        self.margin = margin
        self._stored = stored
        self._prepare = prepare  # the host's vLLM checks the values; per-request metrics added
        self._before_choice = before_choice
        self._progress = progress
        self._max_num_seqs = max_num_seqs
        self._policy: SearchPolicy | None = None
        self._stopped: str | None = None
        self._failed: Exception | None = None

    @property
    def record(self) -> RunRecord:
        return self.experiment.record

    def arm(self, slot: int) -> str:
        """The candidate name of slot `slot` (1-based), measured; SearchStopped if the search
        stopped before it. A reload that failed raises its error again, as any arm does."""
        if not 1 <= slot <= self.max_reloads:
            raise SearchStopped(f"there is no slot {slot}: the budget is {self.max_reloads}")
        search = self._begin()
        while search.used < slot:
            if self._failed is not None or self._stopped is not None:
                break
            self._step(search)
        if search.used >= slot:
            name = slot_name(slot)
            if self._failed is not None and search.used == slot:
                raise self._failed
            return name
        raise SearchStopped(self._stopped or "it did not get this far")

    def complete(self) -> None:
        """Every slot the search reaches (a failed reload is recorded, not raised: the slot's
        own tests report it)."""
        for slot in range(1, self.max_reloads + 1):
            try:
                self.arm(slot)
            except SearchStopped:
                return
            except Exception:
                if self._stopped is None:
                    raise
                return

    # -- the steps ----------------------------------------------------------------------------
    def _begin(self) -> SearchRecord:
        """The baseline, then what stored runs know: the band's coverage and the cost prior."""
        if self.record.search is not None and self._policy is not None:
            return self.record.search
        self.experiment.arm(BASELINE)
        for spec in self.experiment.settings.candidates:  # the break-even map, read by the policy
            if point_of(spec.values) is not None:
                self.experiment.arm(spec.name)
        self._before_choice()
        stored = list(self._stored())
        coverage = band_coverage(stored)
        prior = cost_prior(stored, self.record)
        self._policy = SearchPolicy(
            margin=self.margin,
            max_reloads=self.max_reloads,
            prior=prior,
            coverage=coverage,
            max_num_seqs=self._max_num_seqs,
        )
        prior_text = "; ".join(f"{level}: {p.text}" for level, p in prior.items()) or None
        self.record.search = SearchRecord(
            method=self.method,
            max_reloads=self.max_reloads,
            margin=self.margin,
            prior=prior_text,
            coverage=coverage.lines(),
            widen=coverage.widen,
            coverage_counts={n: [c.inside, c.total] for n, c in coverage.per_type.items()},
        )
        self.experiment.store.flush()
        for line in coverage.lines():
            self._progress(f"search: {line.strip()}")
        self._progress(f"search: cost prior: {prior_text or 'none from stored runs'}")
        return self.record.search

    def _step(self, search: SearchRecord) -> None:
        """Choose the next reload and measure it; or record why the search stops."""
        assert self._policy is not None
        record = self.record
        slot = search.used + 1
        try:
            verdicts = {c: candidate_verdicts(record, c) for c in record.measured_candidates}
            step = self._policy.next(record, verdicts)
        except Exception as exc:
            self._stop(search, f"choosing reload {slot} failed: {_first_line(exc)}")
            raise
        if isinstance(step, Stop):
            self._stop(search, step.why)
            return
        name = slot_name(slot)
        try:
            spec = self._prepare(SpecConfig(name=name, values=dict(step.values)))
        except ConfigError as exc:  # e.g. the host's vLLM does not know a schedule
            self._stop(search, f"{name} ({step.label}) was refused before it was started: {exc}")
            return
        search.reloads.append(
            SearchReload(slot, name, dict(step.values), step.label, step.kind, step.why,
                         dict(step.predicted))
        )  # fmt: skip
        self.experiment.store.flush()
        self._progress(
            f"search: reload {slot} of {self.max_reloads}: {name} = {step.label} "
            f"[{step.kind}]: {step.why}"
        )
        try:
            self.experiment.measure_new(spec)
        except Exception as exc:
            self._failed = exc
            self._stop(search, f"{name} ({step.label}) failed: {_first_line(exc)}")

    def _stop(self, search: SearchRecord, why: str) -> None:
        self._stopped = why
        search.stopped = why
        self.experiment.store.flush()
        self._progress(f"search: stopped after {search.used} of {self.max_reloads} reloads: {why}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
