"""What a candidate changed besides speculation: its start's settings against the baseline's.

`side_changes` diffs two starts' EngineSettings (record/engine_settings.py); every difference
other than the speculative config (and the arguments this tool adds to measure it) is a side
change. `foreseen` names those a known rule predicts before anything starts (FORESEEN_RULES).
`reproduce` says how a control arm (--spec-control) starts the baseline with the same side
changes, and which it cannot reproduce.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...config.arms import BASELINE
from ...config.specconfig import SpecConfig, VllmFacts
from ...config.vllm_argv import REQUEST_METRICS_FLAG
from ...record.engine_settings import ASYNC, RUNNER, EngineSettings
from ...record.schema import RunRecord

# Arguments that differ between the arms by design: the hypothesis, what this tool adds to
# measure it (targets/facts/vllm.py → request_metrics_args), and the port of a candidate that
# serves beside the original (--spec-arms together).
_BY_DESIGN = frozenset(
    {"speculative_config", "port", REQUEST_METRICS_FLAG.removeprefix("--").replace("-", "_")}
)
# the engine config's fields that name the hypothesis, or never change a start's speed
_CONFIG_BY_DESIGN = frozenset({"speculative_config", "observability_config"})
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


@dataclass(frozen=True)
class SideChange:
    """One setting the candidate's start ran with that the baseline's did not."""

    setting: str  # ASYNC, RUNNER, `--max-num-seqs`, a config field, or "warning"
    baseline: str
    candidate: str
    evidence: str | None = None  # the candidate's log line that told it

    def text(self) -> str:
        """`async scheduling disabled (baseline: enabled)`."""
        if self.setting == "warning":
            return f"vLLM warned: {self.candidate[:160]}"
        return f"{self.setting} {self.candidate} (baseline: {self.baseline})"

    def to_dict(self) -> dict[str, str | None]:
        return {
            "setting": self.setting,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "evidence": self.evidence,
        }


def side_changes(baseline: EngineSettings, candidate: EngineSettings) -> list[SideChange]:
    """Every difference between the two starts' settings but the speculative config."""
    if not baseline.known or not candidate.known:
        return []
    out: list[SideChange] = []
    if candidate.async_scheduling is not None and (
        candidate.async_scheduling != baseline.async_scheduling
    ):
        out.append(
            SideChange(
                ASYNC,
                _state(baseline.async_scheduling),
                _state(candidate.async_scheduling),
                candidate.async_evidence,
            )
        )
    if candidate.model_runner is not None and candidate.model_runner != baseline.model_runner:
        out.append(
            SideChange(
                RUNNER,
                baseline.model_runner or "not logged",
                candidate.model_runner,
                candidate.runner_evidence,
            )
        )
    for key in sorted(set(baseline.non_default_args) | set(candidate.non_default_args)):
        if key in _BY_DESIGN:
            continue
        before, after = baseline.non_default_args.get(key), candidate.non_default_args.get(key)
        if before != after:
            flag = "--" + key.replace("_", "-")
            out.append(SideChange(flag, _arg(before), _arg(after)))
    shown = {c.setting.removeprefix("--").replace("-", "_") for c in out}
    for key in sorted(set(baseline.config) & set(candidate.config)):
        if key in _CONFIG_BY_DESIGN or key in shown:
            continue
        if baseline.config[key] != candidate.config[key]:
            out.append(SideChange(key, baseline.config[key], candidate.config[key]))
    told = {candidate.async_evidence, candidate.runner_evidence}
    for warning in candidate.feature_warnings:
        if warning not in baseline.feature_warnings and warning not in told:
            out.append(SideChange("warning", "", warning, warning))
    return out


def _state(value: bool | None) -> str:
    return "not logged" if value is None else "enabled" if value else "disabled"


def _arg(value: object) -> str:
    return "not given" if value is None else str(value)


def changes_text(changes: Sequence[SideChange]) -> str:
    return "; ".join(c.text() for c in changes)


# -- foreseen: known rules, before anything starts -------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A side change that vLLM is known to make for some speculative methods."""

    setting: str
    candidate: str  # what the candidate gets
    baseline: str  # what the original has by default
    methods: frozenset[str]
    why: str
    below: tuple[int, int] | None = None  # only vLLM versions below this one (None: any)


FORESEEN_RULES = (
    Rule(
        ASYNC,
        "disabled",
        "enabled",
        frozenset({"ngram", "suffix", "medusa", "mlp_speculator", "custom_class"}),
        "vLLM 0.26 to 0.32 schedule asynchronously only with EAGLE/MTP, a draft model, "
        "ngram_gpu, DSpark or DFlash (config/vllm.py)",
    ),
    Rule(
        RUNNER,
        "V1",
        "V2",
        frozenset({"ngram", "ngram_gpu"}),
        "vLLM 0.26's Model Runner V2 does not support ngram/ngram_gpu (0.32's does)",
        below=(0, 32),
    ),
    Rule(
        RUNNER,
        "V1",
        "V2",
        frozenset({"suffix", "medusa", "mlp_speculator", "custom_class"}),
        "vLLM 0.32's Model Runner V2 does not support this method",
    ),
)


def foreseen(method: str, version: str | None, facts: VllmFacts | None = None) -> list[Rule]:
    """The rules for a method: those the serving vLLM's own source says where it was asked
    (`facts`, read by targets/facts/vllm.py), else the known rules for its version (all
    versions' where it is unknown)."""
    asked = facts is not None and not facts.offline
    parsed = _version(facts.version if asked and facts else version)
    known = [
        r
        for r in FORESEEN_RULES
        if method in r.methods and (r.below is None or parsed is None or parsed < r.below)
    ]
    if not asked or facts is None:
        return known
    told = f"read from vLLM {facts.version}'s vllm/config/vllm.py on {facts.host}"
    out = [r for r in known if r.setting == ASYNC] if facts.async_kept is None else []
    if facts.async_never:  # off at every start, the original's too: no side change
        out = []
    elif facts.async_kept is not None and method not in facts.async_kept:
        why = f"it keeps async scheduling on only with {_names(facts.async_kept)} ({told})"
        out.append(Rule(ASYNC, "disabled", "enabled", frozenset({method}), why))
    if facts.triton is False:  # every start runs the V1 model runner: no side change
        return out
    if facts.v2_unsupported is None:
        return out + [r for r in known if r.setting == RUNNER]
    if method in facts.v2_unsupported:
        why = f"its Model Runner V2 does not support {method} ({told})"
        out.append(Rule(RUNNER, "V1", "V2", frozenset({method}), why))
    return out


def _names(methods: frozenset[str]) -> str:
    """The methods, each model's own MTP method counted rather than named."""
    named = sorted(m for m in methods if not m.endswith("_mtp"))
    mtp = len(methods) - len(named)
    return ", ".join(named) + (
        f" and {mtp} MTP method{'s' * (mtp > 1)} (a model's own)" if mtp else ""
    )


def foreseen_text(method: str, version: str | None, facts: VllmFacts | None = None) -> str | None:
    """`expected: async scheduling disabled (…)`, for the plan; None where no rule applies."""
    rules = foreseen(method, version, facts)
    if not rules:
        return None
    parts = [
        f"{r.setting} {r.candidate} (the original: {r.baseline} by default; {r.why})" for r in rules
    ]
    return "expected, not measured: " + "; ".join(parts)


def _version(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


# -- the control arm ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reproduction:
    """How the baseline's configuration is started with a candidate's side changes."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    reproduced: tuple[str, ...] = ()  # the side changes' texts it carries
    unreproduced: tuple[str, ...] = ()  # those no argument or variable reproduces

    @property
    def empty(self) -> bool:
        return not self.args and not self.env

    def describe(self) -> str:
        words = [*(f"{k}={v}" for k, v in sorted(self.env.items())), *self.args]
        return " ".join(words) or "nothing to add"


def reproduce(
    changes: Sequence[SideChange], candidate: EngineSettings | None = None
) -> Reproduction:
    """The server arguments and environment that give the original the candidate's side
    changes. Async scheduling that vLLM said it turned off for the candidate is turned off in
    the control too, even where the baseline ran without it as well (harmless, and the control
    then matches the candidate whatever the baseline's log left untold)."""
    args: list[str] = []
    env: dict[str, str] = {}
    done: list[str] = []
    left: list[str] = []
    for change in changes:
        if change.setting == ASYNC and change.candidate in ("enabled", "disabled"):
            args.append(_async_flag(change.candidate == "enabled"))
            done.append(change.text())
        elif change.setting == RUNNER and change.candidate in ("V1", "V2"):
            env[RUNNER_ENV] = "1" if change.candidate == "V2" else "0"
            done.append(change.text())
        elif change.setting == "warning" and _told_by(change, changes):
            continue  # the warning of a change already reproduced
        else:
            left.append(change.text())
    if candidate is not None and not args and _said_off(candidate):
        args.append(_async_flag(False))
    return Reproduction(tuple(args), env, tuple(done), tuple(left))


def _async_flag(on: bool) -> str:
    return "--async-scheduling" if on else "--no-async-scheduling"


def _said_off(settings: EngineSettings) -> bool:
    """vLLM's own log line said it turned async scheduling off for this start."""
    return settings.async_scheduling is False and settings.async_said


def said_but_same(baseline: EngineSettings, candidate: EngineSettings) -> list[str]:
    """What vLLM said it turned off for the candidate that the baseline ran without as well:
    named, since the log says it, but no side change."""
    if not baseline.known or not _said_off(candidate) or baseline.async_scheduling is not False:
        return []
    return [
        f"{ASYNC} disabled (vLLM: {candidate.async_evidence}), but the baseline ran without it "
        f"too ({baseline.async_evidence})"
    ]


def _told_by(change: SideChange, changes: Sequence[SideChange]) -> bool:
    return any(c is not change and c.evidence == change.evidence for c in changes)


def from_rules(rules: Sequence[Rule]) -> list[SideChange]:
    """Foreseen rules as side changes, for a control whose starts' logs told nothing."""
    return [SideChange(r.setting, r.baseline, r.candidate, f"foreseen: {r.why}") for r in rules]


# -- a run's side changes ---------------------------------------------------------------------

CONTROL_SUFFIX = "-control"


def control_name(candidate: str) -> str:
    return candidate + CONTROL_SUFFIX


def arm_settings(record: RunRecord, arm: str) -> EngineSettings | None:
    """The settings of an arm's first start whose log was read; None where none was."""
    return next(
        (p.engine for p in record.arm_phases(arm) if p.engine is not None and p.engine.known),
        None,
    )


@dataclass(frozen=True)
class CandidateSideChanges:
    """One candidate's side changes: measured where both starts' settings were read."""

    candidate: str
    changes: tuple[SideChange, ...] = ()
    same: tuple[str, ...] = ()  # what vLLM said it turned off, but the baseline ran without too
    unread: str | None = None  # why they could not be diffed

    @property
    def text(self) -> str:
        """`async scheduling disabled (baseline: enabled); model runner V1 (baseline: V2)`."""
        if self.unread:
            return f"not known ({self.unread})"
        found = changes_text(self.changes) or "none found in the engine's settings"
        return found + "".join(f"; {s}" for s in self.same)

    def to_dict(self) -> dict[str, object]:
        return {
            "candidate": self.candidate,
            "changes": [c.to_dict() for c in self.changes],
            "same": list(self.same),
            "unread": self.unread,
            "text": self.text,
        }


def run_side_changes(record: RunRecord) -> dict[str, CandidateSideChanges]:
    """Per measured candidate (the A/A one aside), its side changes against the baseline."""
    base = arm_settings(record, BASELINE)
    out = {}
    for name in record.measured_candidates:
        if not record.candidates.get(name):
            continue  # the original's configuration again: nothing but a restart
        mine = arm_settings(record, name)
        if base is None or mine is None:
            side = "the baseline's" if base is None else "the candidate's"
            out[name] = CandidateSideChanges(name, unread=f"{side} start log told no settings")
            continue
        out[name] = CandidateSideChanges(
            name, tuple(side_changes(base, mine)), tuple(said_but_same(base, mine))
        )
    return out


@dataclass(frozen=True)
class ControlPlan:
    """What a control arm adds to the original's configuration, and why."""

    reproduction: Reproduction
    text: str


def control_plan(
    record: RunRecord, spec: SpecConfig, *, version: str | None, facts: VllmFacts | None = None
) -> ControlPlan:
    """The control of one candidate, from its measured side changes, else the rules (the
    serving vLLM's own, where it was asked: `foreseen`)."""
    base, mine = arm_settings(record, BASELINE), arm_settings(record, spec.name)
    if base is not None and mine is not None:
        found = reproduce(side_changes(base, mine), mine)
        origin = f"control of {spec.name}: the original's configuration"
    else:
        found = reproduce(from_rules(foreseen(spec.method, version, facts)))
        origin = (
            f"control of {spec.name}: the original's configuration, with the side changes the "
            "known rules foresee (the start logs told no settings)"
        )
    text = f"{origin} + {found.describe()}"
    if found.unreproduced:
        text += "; cannot reproduce: " + "; ".join(found.unreproduced)
    return ControlPlan(found, text)
