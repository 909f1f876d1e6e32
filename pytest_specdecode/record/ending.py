"""How a run ended and how the original was put back, and a start that died and was started
again: written by targets/lifecycle.py, kept in the record (results.json "ending", "restore",
a phase's "died_start"), read by the reports."""

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
