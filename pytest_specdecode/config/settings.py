"""The experiment's configuration: a TOML file plus command-line overrides, validated up front."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError
from .arms import AA_ARM
from .break_even import (
    check_carrier_keys,
    map_candidates,
    map_carriers,
    point_of,
    target_shape,
)
from .load import (
    LoadLevel,
    SLOConfig,
    check_slo_levels,
    load_levels,
    parse_float_list,
    parse_int_list,
    slo_config,
)
from .prompts import PROMPT_KEYS, Prompt, prompts_of_table
from .replicas import ReplicaConfig, target_and_replicas
from .shape.table import ShapeConfig, shape_config
from .specconfig import SpecConfig, check_spec_shape, parse_spec_config
from .target import TargetConfig
from .values import no_unknown, positive_int, positive_number


@dataclass(frozen=True)
class PromptType:
    """One prompt type (coding, math, ...): its prompts, with its optional thresholds."""

    name: str
    prompt: str  # the first prompt's text
    max_tokens: int
    min_tokens_per_s: float | None
    max_tpot_ms: float | None
    prompts: tuple[Prompt, ...] = ()  # all of them, in sending order (config/prompts.py)

    def __post_init__(self) -> None:
        if not self.prompts:
            object.__setattr__(self, "prompts", (Prompt(self.prompt),))

    def to_dict(self) -> dict[str, Any]:
        """For results.json: the settings and every prompt."""
        return {
            "name": self.name,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "min_tokens_per_s": self.min_tokens_per_s,
            "max_tpot_ms": self.max_tpot_ms,
            "prompts": [p.to_dict() for p in self.prompts],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptType:
        return cls(
            name=data["name"],
            prompt=data["prompt"],
            max_tokens=data["max_tokens"],
            min_tokens_per_s=data.get("min_tokens_per_s"),
            max_tpot_ms=data.get("max_tpot_ms"),
            prompts=tuple(Prompt.from_dict(p) for p in data.get("prompts", ())),
        )


@dataclass(frozen=True)
class RunConfig:
    """The design of the measurement. These defaults are the only place each is defined."""

    samples: int = 6  # measured requests per prompt type and server start (the least, adaptive)
    max_samples: int | None = 16  # adaptive: up to this many, until the start is pinned down
    repeats: int = 1  # server starts per arm, in a balanced order (A B B A ...)
    warmup: int = 1
    concurrency: tuple[int, ...] = (1,)  # closed-loop levels; with `rate`, the in-flight cap
    rate: tuple[float, ...] = ()  # open-loop levels: Poisson arrivals, requests per second
    max_tokens: int = 128
    endpoint: Literal["chat", "completions"] = "chat"
    ignore_eos: bool = False
    alpha: float = 0.05
    min_effect: float = 0.03
    assumed_restart_noise: float = 0.05  # where none was measured (log-scale SD of a start)
    on_traffic: Literal["remeasure", "mark"] = "remeasure"  # a window with other clients' requests
    traffic_attempts: int = 3  # windows tried per prompt type and start before it is marked
    traffic_watch_s: float = 10.0  # a running service is watched this long before it is touched
    quiet_wait_s: float = 120.0  # before measuring a window again, wait at most this for quiet
    allow_traffic: bool = False  # measure a service that others are using (their traffic shows)
    busy_host_share: float = 0.25  # other work beyond the host's usual: a window is contaminated
    allow_busy_host: bool = False  # keep windows of a busy host, its environment beside verdicts
    record_token_ids: bool = True  # untimed requests for the n-gram prediction (analysis/)
    request_timeout_s: float = 300.0
    read_timeout_s: float = 60.0
    search: str | None = (
        None  # "ngram": the search chooses the candidates (analysis/search/policy.py)
    )
    max_reloads: int = 3  # the search's budget: candidates it may start
    # --spec-break-even: "auto" or the k to map ("3,5"); each at break_even_points lengths
    break_even: str | None = None
    break_even_points: int = 2
    # what drafts on its servers (config/break_even.py): auto (an EAGLE-3 head of the target's
    # shape where it can be had, else n-gram), ngram or eagle3; the drafters whose pay-off it
    # also tells, each with servers of its own ("eagle3", "draft_model:NAME"); a head you made
    break_even_carrier: str = "auto"
    break_even_drafters: tuple[str, ...] = ()
    break_even_head: str = ""
    control: bool = False  # --spec-control: each candidate's control arm (analysis/side_changes)
    order: Literal["interleaved", "blocked"] = "interleaved"  # a start's requests (measure/order)
    # "together": two servers at once; "auto": together where the host has room (run/arms.py)
    arms: Literal["auto", "one-at-a-time", "together"] = "auto"
    beside: int = 1  # together: the most candidates served beside one baseline start at once
    # beside two or more: the baseline's slots per cell with one server beside, before the rest
    # start (the regime window, measure/experiment/regime.py; 0: none; unset: sized by the plan
    # to settle its tolerance, or left out, analysis/map/regime.py `regime_size`), and how much
    # slower the baseline beside all of them may run before the run says so
    regime_slots: int | None = None
    regime_tolerance: float = 0.05
    sequential: bool = True  # side by side: a cell stops once decided (analysis/verdict/)
    seed: int = 0  # the interleaved order's, with each start's name (measure/experiment/order.py)
    # a drafter with a model: its first requests' acceptance on the counters, before its timed
    # windows (measure/experiment/drafter_check.py); below the floor, the candidate is stopped
    drafter_floor: float = 0.05
    drafter_check_requests: int = 4

    @property
    def regime_window_slots(self) -> int:
        """The regime window's slots per cell: as set or sized by the plan; where no plan sized
        it (an experiment driven by hand), 4."""
        return 4 if self.regime_slots is None else self.regime_slots

    def __post_init__(self) -> None:  # a single value, or a list from results.json
        for key in ("concurrency", "rate", "break_even_drafters"):
            value = getattr(self, key)
            if not isinstance(value, tuple):
                items = list(value) if isinstance(value, list) else [value]
                object.__setattr__(self, key, tuple(items))

    @property
    def levels(self) -> tuple[LoadLevel, ...]:
        """The load levels each phase measures, in order (config/load.py)."""
        return load_levels(self.concurrency, self.rate or None)

    def requests_at(self, level: LoadLevel, *, fixed: bool = False) -> tuple[int, int]:
        """The least and the most measured requests per prompt type at a level and start.

        A closed-loop level of N sends at least 2·N, so that it spends most of its time with N
        in flight rather than filling up and draining. `fixed`: always the most (an A/A run,
        whose starts measure the restart noise: many requests make their own share small).
        """
        least = self.samples
        if not level.open_loop and level.concurrency:
            least = max(least, 2 * level.concurrency)
        most = max(least, self.max_samples or 0)
        return (most, most) if fixed else (least, most)


@dataclass(frozen=True)
class Settings:
    source: Path
    target: TargetConfig
    run: RunConfig
    prompt_types: Mapping[str, PromptType]
    candidates: tuple[SpecConfig, ...] = ()
    reports_dir: Path = field(default=Path("reports"))
    slo: SLOConfig = field(default_factory=SLOConfig)
    host_profiles: Path | None = None  # the experiment's `host_profiles` folder (record/profile.py)
    # [[target.replicas]] (config/replicas.py): `target` is then the first replica's
    replicas: tuple[ReplicaConfig, ...] = ()
    # [shape] / --spec-shape (config/shape/): the served model's architecture, dummy weights
    shape: ShapeConfig | None = None

    @property
    def aa_only(self) -> bool:
        """An A/A run: every candidate is the original's configuration again."""
        return bool(self.candidates) and all(c.name == AA_ARM for c in self.candidates)


_TOP_KEYS = {
    "target",
    "run",
    "thresholds",
    "presets",
    "prompt_types",
    "workloads",
    "reports_dir",
    "host_profiles",
    "slo",
    "shape",
}
_RUN_KEYS = set(RunConfig.__dataclass_fields__)
SEARCH_METHODS = ("ngram",)  # what --spec-search can search
ORDERS = ("interleaved", "blocked")  # [run] order: a start's requests
ARMS_MODES = ("auto", "one-at-a-time", "together")  # [run] arms: --spec-arms
_THRESHOLD_KEYS = {"min_tokens_per_s", "max_tpot_ms"}
_PROMPT_TYPE_KEYS = {"max_tokens"} | _THRESHOLD_KEYS | PROMPT_KEYS


def load_settings(
    path: Path,
    *,
    spec_configs: Sequence[str] = (),
    target_overrides: Mapping[str, Any] | None = None,
    run_overrides: Mapping[str, Any] | None = None,
    prompt_types: Sequence[str] = (),
    reports_dir: Path | None = None,
    table: str | None = None,
    rootdir: Path | None = None,
    shape_overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Read and validate everything; raises ConfigError naming the file and the key.

    `table` names a dotted table inside the file (`tool.specdecode` in a pyproject.toml). Paths
    resolve against the file's folder; reports go to `<rootdir>/reports` unless it says where.
    """
    raw = _read_toml(path)
    where = str(path)
    if table:
        where = f"{path} [{table}]"
        for key in table.split("."):
            raw = raw.get(key, {})
            if not isinstance(raw, Mapping):
                raise ConfigError(f"{where} must be a table")
    no_unknown(raw, _TOP_KEYS, where)
    presets = _table(raw, "presets", where)
    for name, values in presets.items():
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: [presets] {name} must be a table of vLLM keys")
        check_spec_shape(values, source=f"{name} in {where}")
    run = _run_config(_table(raw, "run", where), run_overrides or {}, where)
    slo = slo_config(_table(raw, "slo", where), where=where)
    check_slo_levels(slo, run.levels, where=where)
    thresholds = _table(raw, "thresholds", where)
    no_unknown(thresholds, _THRESHOLD_KEYS, f"{where} [thresholds]")
    section = "workloads" if "workloads" in raw else "prompt_types"  # as the user wrote it
    all_types = _prompt_types(
        _prompt_type_table(raw, where), thresholds, run, where, base=path.parent, section=section
    )
    chosen = _choose(all_types, prompt_types, where)
    candidates = tuple(parse_spec_config(text, presets) for text in spec_configs)
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ConfigError(f"--spec-config names a candidate twice: {names}")
    if run.search and [c for c in candidates if point_of(c.values) is None]:
        raise ConfigError(
            f"--spec-search {run.search} chooses its own candidates: drop --spec-config "
            f"{' '.join(names)} (or measure them in a run of their own; a stored run of this "
            "host lends the search its cost model)"
        )
    if run.search and run.repeats > 1:
        if (run_overrides or {}).get("repeats") is not None:
            raise ConfigError(
                f"--spec-search {run.search} measures each config in one server start: drop "
                f"--spec-repeats {run.repeats} (the restart noise comes from the host's "
                "profile: measure it with an A/A run, --spec-config baseline --spec-repeats 4)"
            )
        # the file's repeats are its design for --spec-config runs: the search starts each
        # config once, and says so in its plan (report/plan.py search_text)
        run = replace(run, repeats=1)
    base = path.parent
    default_reports = (rootdir or base) / "reports"
    reports = reports_dir or (
        base / str(raw["reports_dir"]) if "reports_dir" in raw else default_reports
    )
    target, replicas = target_and_replicas(
        _table(raw, "target", where),
        {k: v for k, v in (target_overrides or {}).items() if v not in (None, False)},
        base,
        where,
    )
    shape = shape_config(_table(raw, "shape", where), shape_overrides or {}, base=base, where=where)
    if shape is not None and replicas:
        raise ConfigError(
            f"{where}: [shape] with [[target.replicas]]: a shape is served on one target; "
            "measure it on one replica's target"
        )
    if run.break_even:  # on a shape, chosen again once it is resolved (run/map_on_shape.py)
        positive_int(run.break_even_points, "break_even_points", where, minimum=2)
        check_carrier_keys(run.break_even_carrier, run.break_even_drafters)
        carriers = () if shape else map_carriers(
            run.break_even_carrier,
            run.break_even_drafters,
            candidates,
            target_shape(target),
            head=run.break_even_head,
        )  # fmt: skip
        candidates += map_candidates(run.break_even, candidates, run.break_even_points, carriers)
    return Settings(
        source=path,
        target=target,
        replicas=replicas,
        run=run,
        prompt_types=chosen,
        candidates=candidates,
        reports_dir=(reports if reports.is_absolute() else Path.cwd() / reports).resolve(),
        slo=slo,
        host_profiles=_folder(raw, "host_profiles", base, where),
        shape=shape,
    )


def _folder(raw: Mapping[str, Any], key: str, base: Path, where: str) -> Path | None:
    if key not in raw:
        return None
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key} must be a folder's path, got {value!r}")
    return (base / value).resolve()


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"configuration file {path} does not exist; pass --spec-file PATH, or run "
            "`specdecode init` to write a starter specdecode.toml"
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


def _run_config(table: dict[str, Any], overrides: Mapping[str, Any], where: str) -> RunConfig:
    no_unknown(table, _RUN_KEYS, f"{where} [run]")
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**table, **given}
    for key, parse in (("concurrency", parse_int_list), ("rate", parse_float_list)):
        if key in merged:
            source = f"--spec-{key}" if key in given else f"{where} [run] {key}"
            merged[key] = parse(merged[key], source=source) if merged[key] else ()
    if merged.get("rate") and "concurrency" not in (given if "rate" in given else merged):
        merged["concurrency"] = ()  # open loop without a cap (the file's levels do not apply)
    run = replace(RunConfig(), **merged)
    if not run.concurrency and not run.rate:
        raise ConfigError(f"{where}: [run] concurrency needs at least one level, e.g. [1, 4, 8]")
    load_levels(run.concurrency, run.rate)  # several concurrencies with rates: ConfigError
    positive_int(run.samples, "samples", where, minimum=1)
    if run.max_samples is not None:  # at or below samples: a fixed design
        positive_int(run.max_samples, "max_samples", where, minimum=1)
    positive_int(run.repeats, "repeats", where, minimum=1)
    positive_int(run.warmup, "warmup", where, minimum=0)
    positive_int(run.max_tokens, "max_tokens", where, minimum=2)
    if run.endpoint not in ("chat", "completions"):
        raise ConfigError(
            f"{where}: endpoint must be 'chat' or 'completions', got {run.endpoint!r}"
        )
    if not isinstance(run.alpha, float | int) or not 0 < run.alpha < 1:
        raise ConfigError(f"{where}: alpha must be between 0 and 1, got {run.alpha!r}")
    if not isinstance(run.min_effect, float | int) or not 0 <= run.min_effect < 1:
        raise ConfigError(f"{where}: min_effect must be in [0, 1), got {run.min_effect!r}")
    noise = run.assumed_restart_noise
    if isinstance(noise, bool) or not isinstance(noise, float | int) or not 0 < noise < 1:
        raise ConfigError(f"{where}: assumed_restart_noise must be in (0, 1), got {noise!r}")
    for key in ("request_timeout_s", "read_timeout_s", "traffic_watch_s", "quiet_wait_s"):
        positive_number(getattr(run, key), key, where)
    share = run.busy_host_share
    if isinstance(share, bool) or not isinstance(share, float | int) or not 0 < share <= 1:
        raise ConfigError(f"{where}: busy_host_share must be in (0, 1], got {share!r}")
    if run.on_traffic not in ("remeasure", "mark"):
        raise ConfigError(
            f"{where}: on_traffic must be 'remeasure' or 'mark', got {run.on_traffic!r}"
        )
    positive_int(run.traffic_attempts, "traffic_attempts", where, minimum=1)
    positive_int(run.beside, "beside", where, minimum=1)
    if run.regime_slots is not None:
        positive_int(run.regime_slots, "regime_slots", where, minimum=0)
    positive_int(run.drafter_check_requests, "drafter_check_requests", where, minimum=0)
    floor = run.drafter_floor
    if isinstance(floor, bool) or not isinstance(floor, float | int) or not 0 <= floor < 1:
        raise ConfigError(f"{where}: drafter_floor must be in [0, 1), got {floor!r}")
    tolerance = run.regime_tolerance
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, float | int)
        or not 0 < tolerance < 1
    ):
        raise ConfigError(f"{where}: regime_tolerance must be in (0, 1), got {tolerance!r}")
    for key in ("allow_traffic", "allow_busy_host", "record_token_ids", "ignore_eos", "control"):
        if not isinstance(getattr(run, key), bool):
            raise ConfigError(f"{where}: {key} must be true or false")
    if run.search is not None and run.search not in SEARCH_METHODS:
        raise ConfigError(
            f"{where}: search must be one of {', '.join(SEARCH_METHODS)}, got {run.search!r}"
        )
    positive_int(run.max_reloads, "max_reloads", where, minimum=1)
    for key, allowed in (("order", ORDERS), ("arms", ARMS_MODES)):
        if getattr(run, key) not in allowed:
            raise ConfigError(
                f"{where}: {key} must be one of {', '.join(allowed)}, got {getattr(run, key)!r}"
            )
    if isinstance(run.seed, bool) or not isinstance(run.seed, int):
        raise ConfigError(f"{where}: seed must be an integer, got {run.seed!r}")
    return run


def _threshold(value: Any, key: str, where: str) -> float | None:
    return None if value is None else positive_number(value, key, where)


def _prompt_type_table(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """[prompt_types.NAME] tables; [workloads.NAME], the older name, is read the same way."""
    if "prompt_types" in raw and "workloads" in raw:
        raise ConfigError(f"{where}: both [prompt_types] and [workloads]; keep [prompt_types]")
    return _table(raw, "workloads" if "workloads" in raw else "prompt_types", where)


def _prompt_types(
    table: dict[str, Any],
    thresholds: Mapping[str, Any],
    run: RunConfig,
    where: str,
    *,
    base: Path,
    section: str = "prompt_types",
) -> dict[str, PromptType]:
    if not table:
        raise ConfigError(f"{where}: [{section}] is empty; define at least one prompt type")
    out: dict[str, PromptType] = {}
    for name, spec in table.items():
        here = f"{where} [{section}.{name}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{here} must be a table with a 'prompt' or 'prompts'")
        no_unknown(spec, _PROMPT_TYPE_KEYS, here)
        max_tokens = spec.get("max_tokens", run.max_tokens)
        positive_int(max_tokens, "max_tokens", here, minimum=2)
        for type_name, prompts in prompts_of_table(
            name, spec, base=base, where=where, section=section
        ).items():
            if type_name in out:
                raise ConfigError(f"{here}: the prompt type {type_name!r} is defined twice")
            if run.endpoint == "completions" and any(p.messages for p in prompts):
                raise ConfigError(
                    f"{here}: multi-turn prompts need endpoint = 'chat', not 'completions'"
                )
            out[type_name] = PromptType(
                name=type_name,
                prompt=prompts[0].text,
                max_tokens=max_tokens,
                min_tokens_per_s=_threshold(
                    spec.get("min_tokens_per_s", thresholds.get("min_tokens_per_s")),
                    "min_tokens_per_s",
                    here,
                ),
                max_tpot_ms=_threshold(
                    spec.get("max_tpot_ms", thresholds.get("max_tpot_ms")), "max_tpot_ms", here
                ),
                prompts=prompts,
            )
    return out


def _choose(
    all_types: dict[str, PromptType], names: Sequence[str], where: str
) -> dict[str, PromptType]:
    if not names:
        return all_types
    missing = [n for n in names if n not in all_types]
    if missing:
        raise ConfigError(
            f"--spec-prompt-type {', '.join(missing)}: no such prompt type in {where}; "
            f"known: {', '.join(all_types)}"
        )
    return {n: all_types[n] for n in names}
