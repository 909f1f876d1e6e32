"""A run's own folder under the reports dir, proved writable first, and the API's auth headers."""

from __future__ import annotations

import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ..config.settings import Settings
from ..errors import ConfigError
from ..redaction import register_secret


def api_headers(settings: Settings) -> dict[str, str]:
    """Authorization from the variable the config names; the key itself is never stored."""
    name = settings.target.api_key_env
    if not name:
        return {}
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"[target] api_key_env names {name}, but it is not set")
    register_secret(key)
    return {"Authorization": f"Bearer {key}"}


def new_run_dir(settings: Settings) -> Path:
    """This run's own folder under the reports dir: a name no other run has taken."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    label = "-".join(c.name for c in settings.candidates) or (
        f"search-{settings.run.search}" if settings.run.search else "baseline-only"
    )
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:60]
    run_dir = settings.reports_dir / f"{stamp}-{label}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = settings.reports_dir / f"{stamp}-{label}-{suffix}"
    return run_dir


def check_writable(reports_dir: Path) -> None:
    """Prove the reports folder can be written, leaving nothing behind."""
    existing = reports_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        Path(tempfile.mkdtemp(dir=existing, prefix=".specdecode-probe-")).rmdir()
    except OSError as exc:
        raise ConfigError(
            f"reports directory {reports_dir} is not writable ({exc.strerror}); nothing was "
            "started. Pass --spec-reports DIR"
        ) from None
