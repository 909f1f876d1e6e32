"""The house's shape: the import contracts hold (import-linter, pyproject.toml), and every room
and module is small enough to read. The docs' limits: test_docs.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pytest_specdecode"
MOST_MODULES = 12  # a folder's own .py files, __init__.py included
MOST_LINES = 500  # 600 before issue 48
ARMS = PACKAGE / "measure" / "experiment" / "arms.py"  # where the arms are started


def test_the_import_contracts_hold() -> None:
    """`lint-imports` reads the contracts from pyproject.toml: layers, and no circle."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_room_holds_more_than_twelve_modules() -> None:
    crowded = {
        str(folder.relative_to(REPO)): n
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > MOST_MODULES
    }
    assert crowded == {}


def test_no_module_is_over_five_hundred_lines_and_the_arms_under_four_hundred() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}
    assert len(ARMS.read_text().splitlines()) < 400


def test_no_unit_test_folder_holds_more_than_fifteen_test_files() -> None:
    """tests/unit mirrors the package's rooms; a folder past 15 test files is split by room."""
    crowded = {
        str(folder.relative_to(REPO)): n
        for folder in [REPO / "tests" / "unit", *(REPO / "tests" / "unit").rglob("*/")]
        if folder.is_dir() and (n := len(list(folder.glob("test_*.py")))) > 15
    }
    assert crowded == {}
