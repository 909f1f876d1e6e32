"""pytest's options and ini keys to validated Settings, and where the experiment's TOML is found."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from .config.settings import Settings, load_settings
from .errors import ConfigError


def settings_from_options(config: pytest.Config) -> Settings:
    """The validated Settings for this pytest run; raises ConfigError."""
    opt = config.getoption
    reports = opt("spec_reports")
    path, table = find_config(config)
    settings = load_settings(
        path,
        table=table,
        rootdir=Path(config.rootpath),
        spec_configs=opt("spec_config"),
        prompt_types=opt("spec_prompt_type"),
        target_overrides={
            "host": opt("spec_host"),
            "unit": opt("spec_unit"),
            "identity_file": opt("spec_identity"),
            "known_hosts": opt("spec_known_hosts"),
            "accept_unknown_host_key": opt("spec_accept_unknown_host_key"),
            "api_base": opt("spec_api_base"),
            "model": opt("spec_model"),
            "watchdog_s": opt("spec_watchdog"),
            "ssh_config": opt("spec_ssh_config"),
            "api_via": opt("spec_api_via"),
            **({"backend": "systemd"} if opt("spec_host") else {}),
        },
        reports_dir=Path(reports).resolve() if reports else None,
        run_overrides={
            "samples": opt("spec_samples"),
            "max_samples": opt("spec_max_samples"),
            "repeats": opt("spec_repeats"),
            "crossovers": opt("spec_crossovers"),
            "allow_traffic": opt("spec_allow_traffic") or None,
            "allow_busy_host": opt("spec_allow_busy_host") or None,
            "warmup": opt("spec_warmup"),
            "max_tokens": opt("spec_max_tokens"),
            "concurrency": opt("spec_concurrency"),
            "rate": opt("spec_rate"),
            "alpha": opt("spec_alpha"),
            "min_effect": opt("spec_min_effect"),
            "search": opt("spec_search"),
            "max_reloads": opt("spec_max_reloads"),
            "control": opt("spec_control") or None,
            "order": opt("spec_order"),
            "arms": opt("spec_arms"),
            "break_even": opt("spec_break_even"),
        },
        shape_overrides={"source": opt("spec_shape"), "layers": opt("spec_shape_layers")},
    )
    return settings


def find_config(config: pytest.Config) -> tuple[Path, str | None]:
    """Where the experiment is configured, first found wins:
    1. --spec-file PATH (relative to the current folder);
    2. the ini key `specdecode_file` (relative to the ini file);
    3. a [tool.specdecode] table in the rootdir's pyproject.toml;
    4. specdecode.toml at the rootdir.
    """
    given = config.getoption("spec_file")
    if given:
        return Path(given).absolute(), None
    ini = config.getini("specdecode_file")
    if ini:
        base = config.inipath.parent if config.inipath else Path(config.rootpath)
        return base / ini, None
    root = Path(config.rootpath)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            has_table = "specdecode" in tomllib.loads(pyproject.read_text()).get("tool", {})
        except (OSError, tomllib.TOMLDecodeError):
            has_table = False
        if has_table:
            return pyproject, "tool.specdecode"
    found = root / "specdecode.toml"
    if found.is_file():
        return found, None
    raise ConfigError(
        f"no experiment is configured for {root}: looked for --spec-file, the ini key "
        "specdecode_file, [tool.specdecode] in pyproject.toml and specdecode.toml at the "
        "rootdir. Run `specdecode init` to write a starter specdecode.toml"
    )
