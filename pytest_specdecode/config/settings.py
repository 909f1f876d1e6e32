"""The experiment's configuration: a TOML file plus command-line overrides, validated up front."""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..targets.vllm_argv import check_image_names, check_vllm_command
from .specconfig import SpecConfig, parse_spec_config, validate_spec_values


@dataclass(frozen=True)
class Workload:
    """One prompt type, with optional per-workload thresholds."""

    name: str
    prompt: str
    max_tokens: int
    min_tokens_per_s: float | None
    max_tpot_ms: float | None


@dataclass(frozen=True)
class TargetConfig:
    """How the original service runs, and where it answers."""

    backend: Literal["local", "systemd"]
    api_base: str
    model: str
    command: tuple[str, ...]  # local: the original server's command line
    workdir: Path
    env: Mapping[str, str]
    startup_timeout_s: float
    restore_timeout_s: float
    api_key_env: str | None  # the *name* of a variable holding an API key, never the key
    host: str | None = None  # systemd: ssh://user@host:port
    unit: str | None = None  # systemd: the production unit
    identity_file: Path | None = None
    known_hosts: Path | None = None
    accept_unknown_host_key: bool = False
    watchdog_s: float = 1800.0
    vllm_images: tuple[str, ...] = ()  # systemd: container images whose entrypoint is vLLM's


@dataclass(frozen=True)
class RunConfig:
    samples: int = 5
    warmup: int = 1
    concurrency: int = 1
    max_tokens: int = 128
    endpoint: Literal["chat", "completions"] = "chat"
    ignore_eos: bool = False
    alpha: float = 0.05
    min_effect: float = 0.03
    request_timeout_s: float = 300.0
    read_timeout_s: float = 60.0


@dataclass(frozen=True)
class Settings:
    source: Path
    target: TargetConfig
    run: RunConfig
    presets: Mapping[str, Mapping[str, Any]]
    workloads: Mapping[str, Workload]
    candidates: tuple[SpecConfig, ...] = ()
    reports_dir: Path = field(default=Path("reports"))


_TOP_KEYS = {"target", "run", "thresholds", "presets", "workloads", "reports_dir"}
_TARGET_KEYS = {
    "backend",
    "host",
    "unit",
    "identity_file",
    "known_hosts",
    "accept_unknown_host_key",
    "watchdog_s",
    "restore_timeout_s",
    "api_base",
    "model",
    "command",
    "workdir",
    "env",
    "startup_timeout_s",
    "api_key_env",
    "vllm_images",
}
_RUN_KEYS = set(RunConfig.__dataclass_fields__)
_THRESHOLD_KEYS = {"min_tokens_per_s", "max_tpot_ms"}
_WORKLOAD_KEYS = {"prompt", "max_tokens"} | _THRESHOLD_KEYS


def load_settings(
    path: Path,
    *,
    spec_configs: Sequence[str] = (),
    target_overrides: Mapping[str, Any] | None = None,
    run_overrides: Mapping[str, Any] | None = None,
    workloads: Sequence[str] = (),
    reports_dir: Path | None = None,
) -> Settings:
    """Read and validate everything; raises ConfigError naming the file and the key."""
    raw = _read_toml(path)
    where = str(path)
    _no_unknown(raw, _TOP_KEYS, where)
    presets = _table(raw, "presets", where)
    for name, values in presets.items():
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: [presets] {name} must be a table of vLLM keys")
        validate_spec_values(values, source=f"{name} in {where}")
    run = _run_config(_table(raw, "run", where), run_overrides or {}, where)
    thresholds = _table(raw, "thresholds", where)
    _no_unknown(thresholds, _THRESHOLD_KEYS, f"{where} [thresholds]")
    all_workloads = _workloads(_table(raw, "workloads", where), thresholds, run, where)
    chosen = _choose(all_workloads, workloads, where)
    candidates = tuple(parse_spec_config(text, presets) for text in spec_configs)
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ConfigError(f"--spec-config names a candidate twice: {names}")
    base = path.parent
    reports = reports_dir or base / str(raw.get("reports_dir", "../reports"))
    return Settings(
        source=path,
        target=_target_config(
            {
                **_table(raw, "target", where),
                **{k: v for k, v in (target_overrides or {}).items() if v not in (None, False)},
            },
            base,
            where,
        ),
        run=run,
        presets=presets,
        workloads=chosen,
        candidates=candidates,
        reports_dir=(reports if reports.is_absolute() else Path.cwd() / reports).resolve(),
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"configuration file {path} does not exist; pass --spec-file PATH "
            "(suites/specdecode.toml is the embedded default)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def _table(raw: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return dict(value)


def _no_unknown(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def _run_config(table: dict[str, Any], overrides: Mapping[str, Any], where: str) -> RunConfig:
    _no_unknown(table, _RUN_KEYS, f"{where} [run]")
    merged = {**table, **{k: v for k, v in overrides.items() if v is not None}}
    run = replace(RunConfig(), **merged)
    _positive_int(run.samples, "samples", where, minimum=1)
    _positive_int(run.warmup, "warmup", where, minimum=0)
    _positive_int(run.concurrency, "concurrency", where, minimum=1)
    _positive_int(run.max_tokens, "max_tokens", where, minimum=2)
    if run.endpoint not in ("chat", "completions"):
        raise ConfigError(
            f"{where}: endpoint must be 'chat' or 'completions', got {run.endpoint!r}"
        )
    if not isinstance(run.alpha, float | int) or not 0 < run.alpha < 1:
        raise ConfigError(f"{where}: alpha must be between 0 and 1, got {run.alpha!r}")
    if not isinstance(run.min_effect, float | int) or not 0 <= run.min_effect < 1:
        raise ConfigError(f"{where}: min_effect must be in [0, 1), got {run.min_effect!r}")
    for key in ("request_timeout_s", "read_timeout_s"):
        _positive_number(getattr(run, key), key, where)
    return run


def _positive_int(value: Any, key: str, where: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")


def _threshold(value: Any, key: str, where: str) -> float | None:
    return None if value is None else _positive_number(value, key, where)


def _workloads(
    table: dict[str, Any], thresholds: Mapping[str, Any], run: RunConfig, where: str
) -> dict[str, Workload]:
    if not table:
        raise ConfigError(f"{where}: [workloads] is empty; define at least one prompt type")
    out: dict[str, Workload] = {}
    for name, spec in table.items():
        here = f"{where} [workloads.{name}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{here} must be a table with a 'prompt'")
        _no_unknown(spec, _WORKLOAD_KEYS, here)
        prompt = spec.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{here}: 'prompt' must be a non-empty string")
        max_tokens = spec.get("max_tokens", run.max_tokens)
        _positive_int(max_tokens, "max_tokens", here, minimum=2)
        out[name] = Workload(
            name=name,
            prompt=prompt,
            max_tokens=max_tokens,
            min_tokens_per_s=_threshold(
                spec.get("min_tokens_per_s", thresholds.get("min_tokens_per_s")),
                "min_tokens_per_s",
                here,
            ),
            max_tpot_ms=_threshold(
                spec.get("max_tpot_ms", thresholds.get("max_tpot_ms")), "max_tpot_ms", here
            ),
        )
    return out


def _choose(
    all_workloads: dict[str, Workload], names: Sequence[str], where: str
) -> dict[str, Workload]:
    if not names:
        return all_workloads
    missing = [n for n in names if n not in all_workloads]
    if missing:
        raise ConfigError(
            f"--spec-workload {', '.join(missing)}: no such prompt type in {where}; "
            f"known: {', '.join(all_workloads)}"
        )
    return {n: all_workloads[n] for n in names}


def _target_config(table: dict[str, Any], base: Path, where: str) -> TargetConfig:
    here = f"{where} [target]"
    _no_unknown(table, _TARGET_KEYS, here)
    backend = table.get("backend", "systemd" if table.get("host") else "local")
    if backend not in ("local", "systemd"):
        raise ConfigError(f"{here}: backend must be 'local' or 'systemd', got {backend!r}")
    api_base = str(table.get("api_base", "")).rstrip("/")
    parts = urlsplit(api_base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{here}: api_base must be an http(s) URL, got {api_base!r}")
    model = table.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{here}: 'model' (the served model name) is required")
    command: Any = ()
    if backend == "local":
        command = table.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise ConfigError(f"{here}: 'command' must be the server's command line")
        check_vllm_command(command, where=here)
        if any(a == "--api-key" or a.startswith("--api-key=") for a in command):
            raise ConfigError(
                f"{here}: the command carries --api-key: a key on a command line shows in ps and "
                "in logs. Put it in an environment variable and name it in api_key_env; the "
                "server gets it as VLLM_API_KEY"
            )
    else:
        _systemd_keys(table, here)
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{here}: 'env' must be a table of strings")
    api_key_env = table.get("api_key_env")
    if api_key_env is not None and not (
        isinstance(api_key_env, str) and api_key_env.isidentifier()
    ):
        raise ConfigError(f"{here}: api_key_env must name an environment variable")
    timeout = _positive_number(table.get("startup_timeout_s", 1800), "startup_timeout_s", here)
    return TargetConfig(
        backend=backend,
        api_base=api_base,
        model=model,
        command=tuple(command),
        workdir=(base / str(table.get("workdir", "."))).resolve(),
        env=dict(env),
        startup_timeout_s=timeout,
        restore_timeout_s=_positive_number(
            table.get("restore_timeout_s", max(timeout, 3600.0)), "restore_timeout_s", here
        ),
        api_key_env=api_key_env,
        host=table.get("host"),
        unit=table.get("unit"),
        identity_file=_path(table.get("identity_file"), base),
        known_hosts=_path(table.get("known_hosts"), base),
        accept_unknown_host_key=bool(table.get("accept_unknown_host_key", False)),
        watchdog_s=_positive_number(table.get("watchdog_s", 1800), "watchdog_s", here),
        vllm_images=_images(table.get("vllm_images", []), here),
    )


def _images(value: Any, here: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{here}: vllm_images must be a list of image names")
    return check_image_names(value, where=here)


def _systemd_keys(table: Mapping[str, Any], here: str) -> None:
    from ..targets.ssh import SSHSpec  # paramiko only where a remote host is used
    from ..targets.unitfile import check_unit_name

    host, unit = table.get("host"), table.get("unit")
    if not isinstance(host, str):
        raise ConfigError(
            f"{here}: the systemd backend needs host = 'ssh://user@host:port' (or --spec-host)"
        )
    SSHSpec.parse(host)
    if not isinstance(unit, str):
        raise ConfigError(
            f"{here}: the systemd backend needs unit = 'NAME.service' (or --spec-unit)"
        )
    check_unit_name(unit)
    for key in ("identity_file", "known_hosts"):
        value = table.get(key)
        if value is not None and not Path(os.path.expanduser(str(value))).is_file():
            raise ConfigError(f"{here}: {key} {value!r} is not a readable file")
    if not isinstance(table.get("accept_unknown_host_key", False), bool):
        raise ConfigError(f"{here}: accept_unknown_host_key must be true or false")


def _positive_number(value: Any, key: str, here: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{here}: {key} must be a positive number, got {value!r}")
    return float(value)


def _path(value: Any, base: Path) -> Path | None:
    if value is None:
        return None
    path = Path(os.path.expanduser(str(value)))
    return path if path.is_absolute() else (base / path).resolve()
