"""specdecode init: a starter specdecode.toml (and, with --github, the CI gate) in a project."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

CONFIG = "specdecode.toml"
WORKFLOW = Path(".github") / "workflows" / "specdecode-gate.yml"


def template(name: str) -> str:
    return resources.files("pytest_specdecode").joinpath("templates", name).read_text()


def workflow(*, package: str, tests: str = "-m specdecode", paths: Sequence[str] = ()) -> str:
    """The CI gate's workflow: install `package`, run pytest with `tests`, on changes to
    `paths` (pull requests) or by hand."""
    watched = [*paths, ".github/workflows/specdecode-gate.yml"]
    text = template("specdecode-gate.yml")
    text = text.replace("@PATHS@", "\n".join(f'      - "{p}"' for p in watched))
    return text.replace("@PACKAGE@", package).replace("@TESTS@", tests)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdecode init",
        description="Write a starter specdecode.toml into a project (and the CI gate with "
        "--github). Existing files are never overwritten.",
    )
    parser.add_argument("command", choices=["init"], help="what to do")
    parser.add_argument("--dir", default=".", help="the project's root (default: here)")
    parser.add_argument("--github", action="store_true", help="also write the CI gate workflow")
    parser.add_argument(
        "--package",
        default="pytest-specdecode",
        help="what the workflow installs with pip (default: pytest-specdecode)",
    )
    args = parser.parse_args(argv)
    root = Path(args.dir)
    files = {root / CONFIG: template(CONFIG)}
    if args.github:
        paths = [CONFIG, "pyproject.toml", "requirements*.txt"]
        files[root / WORKFLOW] = workflow(package=args.package, paths=paths)
    existing = [str(p) for p in files if p.exists()]
    if existing:
        print(
            f"specdecode init: {', '.join(existing)} exists; nothing was written", file=sys.stderr
        )
        return 1
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    print(
        "next: edit [target] in specdecode.toml, then `pytest --spec-config ngram --spec-dry-run`"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
