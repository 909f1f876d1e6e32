"""How a run ended and how the original was put back, and a start that died and was started
again: written by targets/lifecycle.py, kept in the record (results.json "ending", "restore",
a phase's "died_start"), read by the reports. A run cut short (`RunCut`, results.json "cut"):
composed by `run_cut` from what the session saw at its end."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class RestoreReport:
    """How the original was put back: the one text of it, in every report."""

    original: str
    was_active: bool
    is_active: bool | None  # None: the controller did not live to see the end
    seconds: float
    errors: list[str]
    serving: bool = False  # it answered /health and /v1/models with its model again
    observed: bool = True  # False: the host restores; the controller stopped watching
    notes: list[str] = field(default_factory=list)
    never_stopped: bool = False  # the original served throughout: nothing of it was touched

    @property
    def failed(self) -> bool:
        """Not as it was found: a serving original must be active and serving again. A restore
        handed to the host and not watched to the end is not known to have failed."""
        if not self.observed:
            return False
        if self.was_active:
            return not (self.is_active and self.serving)
        return bool(self.is_active)

    def describe(self) -> str:
        if not self.observed:
            text = f"{self.original}: the host restores it; not watched to the end"
        else:
            if self.is_active:
                state = "active and serving" if self.serving else "active but NOT serving"
            else:
                state = "stopped"
            text = (
                f"{self.original} was never stopped: it served throughout, and is {state} "
                f"(checked in {self.seconds:.0f}s)"
                if self.never_stopped
                else f"{self.original} restored to {state} in {self.seconds:.0f}s"
            )
        text += "".join(f"; {note}" for note in self.notes)
        return text + ("; problems on the way: " + "; ".join(self.errors) if self.errors else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RestoreReport:
        return cls(
            **{k: data[k] for k in ("original", "was_active", "is_active", "seconds")},
            errors=list(data.get("errors", [])),
            serving=bool(data.get("serving", False)),
            observed=bool(data.get("observed", True)),
            notes=list(data.get("notes", [])),
            never_stopped=bool(data.get("never_stopped", False)),
        )


@dataclass
class RunEnding:
    """How the run ended: for results.json ("ending") and run.log."""

    how: str = "finished"  # "finished", or "interrupted" by a signal
    signals: list[str] = field(default_factory=list)  # every signal, in order
    handed_over: str | None = None  # what the host was told to do at the first signal
    handover_s: float | None = None  # from the first signal until the host had it
    restore_s: float | None = None  # first signal (or restore start) until the original is as found
    restore_observed: bool | None = None  # None: no restore yet
    note: str | None = None
    original_never_stopped: bool = False  # side by side beside a unit that kept serving

    def describe(self) -> str:
        if self.how == "finished":
            text = "the run finished"
        else:
            text = f"interrupted by {', then '.join(self.signals) or 'KeyboardInterrupt'}"
        if self.handed_over:
            text += f"; the restore was handed over after {self.handover_s or 0:.1f}s"
            text += f" ({self.handed_over})"
        if self.original_never_stopped:
            text += "; the original was never stopped: it served throughout"
        elif self.restore_s is not None:
            text += f"; the original was back as found {self.restore_s:.0f}s after"
            text += " the signal" if self.signals else " the restore began"
        elif self.restore_observed is False:
            text += "; the controller did not see the restore end"
        return text + (f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunEnding:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# -- a run cut short ---------------------------------------------------------------------------

SIGNAL_CAUSES = {
    "SIGINT": "Ctrl-C, or a timeout's signal",
    "SIGTERM": "a cancelled job, or a timeout's signal",
    "SIGHUP": "a closed terminal",
}


@dataclass
class Measured:
    """What a run had measured when it ended, against what its design planned."""

    starts: int = 0  # server starts measured (a reused baseline's not counted)
    starts_planned: int = 0
    cells: int = 0  # cells (a prompt type at a load level, in one start) with measured requests
    cells_planned: int = 0
    samples: int = 0  # measured requests, warm-up not counted
    token_ids: int = 0  # cells whose token ids were recorded

    def describe(self) -> str:
        text = (
            f"{self.starts} of {self.starts_planned} server starts, "
            f"{self.cells} of {self.cells_planned} cells, {self.samples} requests"
        )
        return text + (f"; token ids of {self.token_ids} cells" if self.token_ids else "")


@dataclass
class RanTests:
    """Which of the collected tests ran to their end before the run did."""

    collected: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # of those that ran, by outcome
    ran: list[str] = field(default_factory=list)  # their names, in order

    def describe(self) -> str:
        if not self.ran:
            return f"no tests ran (none of {self.collected})"
        counts = ", ".join(f"{n} {outcome}" for outcome, n in self.outcomes.items())
        names = ", ".join(self.ran[:3]) + (", …" if len(self.ran) > 3 else "")
        rest = self.collected - len(self.ran)
        return f"{len(self.ran)} of {self.collected} tests ran ({counts}: {names})" + (
            f"; {rest} did not run" if rest > 0 else ""
        )


@dataclass
class RunCut:
    """A run ended early: by what, when, in which step, what it had measured, which tests ran.
    results.json "cut"; the top of summary.md, report.html and the terminal's section."""

    by: str  # "SIGINT", "SIGTERM, then SIGINT", "KeyboardInterrupt", or the error's first line
    kind: str  # "signal", "interrupt" (no signal seen), "exit" (pytest.exit), "error"
    at_s: float | None  # seconds into the run
    at: str | None  # the wall time, UTC
    step: str | None  # what the run was doing
    measured: Measured = field(default_factory=Measured)
    tests: RanTests = field(default_factory=RanTests)
    design_complete: bool = False  # every start of the design was measured before the cut
    exit_code: int | None = None  # pytest's
    ending: str | None = None  # RunEnding.describe(): the handover and the restore

    @property
    def partial(self) -> bool:
        """A result computed from it reads what was measured, not the whole design."""
        return not self.design_complete

    def short_cause(self) -> str:
        """ "SIGINT", "a KeyboardInterrupt", "pytest.exit", "an error": for the result line."""
        return {"interrupt": f"a {self.by}", "exit": "pytest.exit", "error": "an error"}.get(
            self.kind, self.by
        )

    def cause(self) -> str:
        if self.kind == "signal":
            first = self.by.split(",")[0]
            why = SIGNAL_CAUSES.get(first)
            return f"{self.by} ({why})" if why else self.by
        if self.kind == "interrupt":
            return f"a {self.by}"
        if self.kind == "exit":
            return f"pytest.exit: {self.by}"
        return f"an error: {self.by}"

    def headline(self) -> str:
        """One sentence: cut by what, when, in which step."""
        when = f" {self.at_s:.0f} s into the run" if self.at_s is not None else ""
        when += f" ({self.at})" if self.at else ""
        step = f", while {self.step}" if self.step else ""
        return f"Cut short by {self.cause()}{when}{step}."

    def lines(self) -> list[str]:
        """The banner: the headline, then what was measured, the tests, what the result is."""
        out = [
            self.headline(),
            f"Measured before the cut: {self.measured.describe()}.",
            f"Tests: {self.tests.describe()}.",
        ]
        if self.partial:
            out.append(
                "The design was not complete: the result below reads only what was measured "
                "(partial), and no verdict of it is the whole run's."
            )
        if self.ending:
            out.append(f"Ending: {self.ending}.")
        if self.exit_code is not None:
            out.append(f"pytest's exit code: {self.exit_code}.")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunCut:
        names = {f.name for f in fields(cls)} - {"measured", "tests"}
        return cls(
            **{k: v for k, v in data.items() if k in names},
            measured=Measured(**_known(Measured, data.get("measured") or {})),
            tests=RanTests(**_known(RanTests, data.get("tests") or {})),
        )


def run_cut(
    *,
    ending: RunEnding | None,
    stopped: tuple[str, str] | None,
    at_s: float | None,
    at: str | None,
    step: str | None,
    measured: Measured,
    tests: RanTests,
    design_complete: bool,
    exit_code: int | None = None,
) -> RunCut | None:
    """Whether the run was cut, and how to say so: None for a run that ended whole.

    `stopped`: (kind, by) of what ended it, where the session saw it (a KeyboardInterrupt, a
    pytest.exit, an error); a signal recorded in `ending` names it. A run is cut when something
    stopped it before its design was complete or before every collected test ran: a signal
    during the restore, after everything ran, cuts nothing.
    """
    signals = ending.signals if ending is not None else []
    if signals:
        kind, by = "signal", ", then ".join(signals)
    elif stopped is not None:
        kind, by = stopped
    else:
        return None
    if design_complete and len(tests.ran) >= tests.collected:
        return None
    return RunCut(
        by=by,
        kind=kind,
        at_s=at_s,
        at=at,
        step=step,
        measured=measured,
        tests=tests,
        design_complete=design_complete,
        exit_code=exit_code,
        ending=ending.describe() if ending is not None and ending.how != "finished" else None,
    )


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


@dataclass(frozen=True)
class DiedStart:
    """A candidate's first start, whose engine died before it ever served, for a reason other
    than its configuration: the candidate was started once more (`[target] retry_failed_start`),
    and its phase is the second start."""

    service: str  # the first start's server, as named then
    after_s: float  # how long into that start it died
    cause: str  # its root cause, one line
    text: str = ""  # its failure as a failed start reports it: each process's error, log tail

    def describe(self, phase: str, ready_s: float | None = None) -> str:
        """Both starts: the first, which died, and the second, which was measured."""
        ready = f", which served after {ready_s:.0f}s" if ready_s is not None else ""
        return (
            f"candidate {phase}: the first start died before serving ({self.cause}, "
            f"{self.after_s:.0f}s into it); started again, and measured on the second{ready}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiedStart:
        return cls(
            service=str(data["service"]),
            after_s=float(data["after_s"]),
            cause=str(data["cause"]),
            text=str(data.get("text", "")),
        )
