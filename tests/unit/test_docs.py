"""The docs hold their limits after an issue is closed: the README stays short, and every link
and every path the pages name resolves. In tests/unit, so `make test` (CI) runs them beside the
module limit (test_rooms.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pytest_specdecode"
README = REPO / "README.md"
README_MOST_LINES = 200
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target): a relative target, maybe with an #anchor; web addresses are not followed
LINK = re.compile(r"\[[^\]]*\]\((?P<path>[^)\s#]*)(?:#(?P<anchor>[^)\s]+))?\)")
# docs/x.md written out in the text, e.g. "(docs/ci-gate.md)"
NAMED_PAGE = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)\b")
# a path in backticks: a file (.py, .md, .toml) or a folder (ending in /)
BACKTICKED = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|toml)|/))[`:]")


def test_the_readme_is_at_most_two_hundred_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MOST_LINES, (
        f"README.md has {lines} lines, over {README_MOST_LINES}: move the detail into docs/ and "
        "link it"
    )


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to -."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    text = page.read_text()
    broken = []
    for link in LINK.finditer(text):
        path, anchor = link["path"], link["anchor"]
        if re.match(r"[a-z]+:", path):  # https:, mailto:
            continue
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link[0])
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link[0]} (no heading gives #{anchor})")
    if page == README:
        broken += [name for name in NAMED_PAGE.findall(text) if not (REPO / name).exists()]
    assert broken == []


@pytest.mark.parametrize("page", ["docs/architecture.md", "CONTRIBUTING.md"])
def test_the_maps_name_only_paths_that_exist(page: str) -> None:
    """A path in backticks, a file or a folder, from the repository's root, the package's or
    the tests' (`plugin/`); a bare name (`stats.py`, `verdict/`), in its room's line, anywhere
    in the package."""
    text = (REPO / page).read_text()
    named = set(BACKTICKED.findall(text))
    assert len(named) > 30  # each follows the code file by file
    roots = (REPO, PACKAGE, REPO / "tests", REPO / "tests" / "unit")
    anywhere = {p.name for p in PACKAGE.rglob("*.py")}
    anywhere |= {f"{p.name}/" for p in PACKAGE.rglob("*") if p.is_dir()}
    missing = sorted(
        name
        for name in named
        if not any((root / name).exists() for root in roots)
        and not ("/" not in name.rstrip("/") and name in anywhere)
    )
    assert missing == []
