"""What one server start actually ran with, read from its own log: `parse_engine_log` (pure).

vLLM resolves its settings at start and says so only in its log: the `non-default args: {…}`
line, the engine's `with config: …` line, the warnings where it turned a feature off, and the
model runner it chose. /metrics offers the cache config alone (`vllm:cache_config_info`), and
/server_info only in dev mode (VLLM_SERVER_DEV_MODE=1), where it is read too
(measure/experiment/arms.py). analysis/verdict/side_changes.py diffs two starts' settings.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ASYNC = "async scheduling"
RUNNER = "model runner"

# A log line's prefix: `(APIServer pid=1) WARNING 12-02 10:43:55 [vllm.py:1605] `; a tensor
# parallel rank's names its process `Worker_TP1` (vLLM 0.32), `VllmWorker TP1` or `VllmWorker
# rank=1` (older): each rank's line read as the engine's, the same warning kept once
_PREFIX = re.compile(
    r"^(?:\((?:[\w.=-]+\s+)+pid=\d+\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR)\s+\S+\s+\S+\s+\[[^\]]*\]\s?"
)
_VERSION = re.compile(r"(?:Initializing a V1 LLM engine \(v|█\s+version\s+)(\d+\.\d+[\w.+-]*)")
_ENGINE_CONFIG = re.compile(r"Initializing a V1 LLM engine \([^)]*\) with config: (.*)$")
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
# the line that says it is on, the line that says it is off
_ASYNC_LINES = (
    re.compile(r"Asynchronous scheduling is enabled"),
    re.compile(r"Async scheduling .*(?:will be disabled|is disabled)"),
)
_RUNNER_V2 = re.compile(r"Using V2 Model Runner")
_RUNNER_V1 = re.compile(r"using the V1 model runner instead", re.IGNORECASE)
# A warning that says a feature was turned off or replaced.
_FEATURE_OFF = re.compile(
    r"disabl|not supported|not compatible|instead|fall(?:ing)? back|overrid", re.IGNORECASE
)
# vLLM 0.26 says when async scheduling is on; 0.32 says only when it turns it off. From vLLM
# 0.26 on, it is on unless a line turns it off (0.32: config/vllm.py, `async_scheduling is None`)
# or the start runs on the CPU, whose platform turns it off silently (0.32: platforms/cpu.py).
_ASYNC_DEFAULT_ON_FROM = (0, 26)


@dataclass
class EngineSettings:
    """The settings one server start ran with, as its log (or /server_info) tells them."""

    version: str | None = None
    non_default_args: dict[str, Any] = field(default_factory=dict)  # `non-default args: {…}`
    config: dict[str, str] = field(default_factory=dict)  # scalar fields of `with config: …`
    async_scheduling: bool | None = None  # None: not told
    async_evidence: str | None = None  # the line (or rule) that told it
    async_said: bool = False  # True: a line of vLLM's said it (not inferred from a rule)
    model_runner: str | None = None  # "V1", "V2"; None: not told
    runner_evidence: str | None = None
    feature_warnings: list[str] = field(default_factory=list)  # turned off, replaced, overridden
    source: str = "log"  # "log (N lines)", "+ /server_info"
    missing: str | None = None  # why nothing could be read

    @property
    def known(self) -> bool:
        return self.missing is None

    def describe(self) -> str:
        """`async scheduling on, model runner V1`, or why nothing was read."""
        if self.missing:
            return f"settings not read ({self.missing})"
        parts = [
            f"{ASYNC} {_on_off(self.async_scheduling)}",
            f"{RUNNER} {self.model_runner or 'not logged'}",
        ]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "non_default_args": self.non_default_args,
            "config": self.config,
            "async_scheduling": self.async_scheduling,
            "async_evidence": self.async_evidence,
            "async_said": self.async_said,
            "model_runner": self.model_runner,
            "runner_evidence": self.runner_evidence,
            "feature_warnings": self.feature_warnings,
            "source": self.source,
            "missing": self.missing,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineSettings:
        return cls(
            version=data.get("version"),
            non_default_args=dict(data.get("non_default_args") or {}),
            config={str(k): str(v) for k, v in (data.get("config") or {}).items()},
            async_scheduling=data.get("async_scheduling"),
            async_evidence=data.get("async_evidence"),
            async_said=bool(data.get("async_said")),
            model_runner=data.get("model_runner"),
            runner_evidence=data.get("runner_evidence"),
            feature_warnings=list(data.get("feature_warnings") or []),
            source=str(data.get("source") or "log"),
            missing=data.get("missing"),
        )


def _on_off(value: bool | None) -> str:
    return "not logged" if value is None else "enabled" if value else "disabled"


def parse_engine_log(lines: Sequence[str]) -> EngineSettings:
    """The settings of one start, from the whole log of that start (oldest line first)."""
    if not lines:
        return EngineSettings(missing="no log lines of this start")
    out = EngineSettings(source=f"log ({len(lines)} lines)")
    for raw in lines:
        match = _PREFIX.match(raw.strip())
        level = match.group("level") if match else None
        text = raw.strip()[match.end() :] if match else raw.strip()
        _read_line(out, text, level)
    if out.async_scheduling is None and out.config:
        explicit = out.non_default_args.get("async_scheduling")
        if isinstance(explicit, bool):
            out.async_scheduling = explicit
            out.async_evidence = f"non-default args: async_scheduling={explicit}"
        elif out.config.get("device_config") == "cpu":
            out.async_scheduling = False
            out.async_evidence = (
                "vLLM's CPU platform turns it off at every start (vllm/platforms/cpu.py, 0.32; "
                "its /server_info says async_scheduling=false)"
            )
        elif _version_at_least(out.version, _ASYNC_DEFAULT_ON_FROM):
            out.async_scheduling = True
            out.async_evidence = (
                f"vLLM {out.version}'s default: no line turned it off and no --no-async-scheduling"
            )
    return out


def _read_line(out: EngineSettings, text: str, level: str | None) -> None:
    version = _VERSION.search(text)
    if version and out.version is None:
        out.version = version.group(1)
    args = _NON_DEFAULT.search(text)
    if args:
        out.non_default_args = _literal_dict(args.group(1))
    config = _ENGINE_CONFIG.search(text)
    if config:
        out.config = scalar_fields(config.group(1))
    for line, value in zip(_ASYNC_LINES, (True, False), strict=True):
        if line.search(text):
            out.async_scheduling, out.async_evidence, out.async_said = value, text, True
    if _RUNNER_V2.search(text):
        out.model_runner, out.runner_evidence = "V2", text
    elif _RUNNER_V1.search(text):
        out.model_runner, out.runner_evidence = "V1", text
    if level == "WARNING" and _FEATURE_OFF.search(text) and text not in out.feature_warnings:
        out.feature_warnings.append(text)


def scalar_fields(text: str) -> dict[str, str]:
    """`a=1, b=Cfg(x=1, y=2), c='m'` → {"a": "1", "c": "m"}: the top-level fields whose
    values are plain (no brackets), split where the brackets are balanced."""
    out: dict[str, str] = {}
    depth, start = 0, 0
    parts: list[str] = []
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in parts:
        key, sep, value = part.strip().partition("=")
        if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", key) or re.search(r"[(\[{]", value):
            continue
        out[key] = value.strip().strip("'\"")
    return out


def _literal_dict(text: str) -> dict[str, Any]:
    """A Python dict literal as vLLM prints it, made JSON-able; {} where it is not one."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return {str(k): _jsonable(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _version_at_least(version: str | None, least: tuple[int, int]) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= least


def from_server_info(settings: EngineSettings, info: Mapping[str, Any]) -> EngineSettings:
    """The log's settings, corrected by /server_info?config_format=json (vLLM dev mode)."""
    config = info.get("vllm_config")
    scheduler = config.get("scheduler_config") if isinstance(config, Mapping) else None
    value = scheduler.get("async_scheduling") if isinstance(scheduler, Mapping) else None
    if isinstance(value, bool):
        settings.async_scheduling = value
        settings.async_evidence = f"/server_info: scheduler_config.async_scheduling={value}"
        settings.source += " + /server_info"
    env = info.get("vllm_env")
    runner = env.get("VLLM_USE_V2_MODEL_RUNNER") if isinstance(env, Mapping) else None
    if isinstance(runner, bool) and settings.model_runner is None:
        settings.model_runner = "V2" if runner else "V1"
        settings.runner_evidence = f"/server_info: VLLM_USE_V2_MODEL_RUNNER={runner}"
    return settings
