"""An undecided verdict as pytest's own outcome: a failure with its own category, letter and word.

A verdict test whose comparison decided nothing raises `Undecided`. Its report stays failed, so
the exit code and the CI gate are unchanged; pytest's terminal counts it as `N undecided`, `-v`
says UNDECIDED, JUnit XML's message starts `undecided: `, and pytest-html's result column says
Undecided. The hooks that apply this are in `plugin.py` and `html_hooks.py`.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Protocol

CATEGORY = "undecided"
LETTER = "U"
WORD = "UNDECIDED"
PROPERTY = "specdecode_outcome"  # a user property: kept in JUnit XML's <properties> too
_MARK = (PROPERTY, CATEGORY)


class Undecided(Exception):
    """A comparison that decided nothing: the gate must not pass on it, nor call it failed."""


class _Item(Protocol):
    user_properties: list[tuple[str, object]]


class _Report(Protocol):
    nodeid: str
    when: str
    longrepr: object
    user_properties: list[tuple[str, object]]

    @property
    def failed(self) -> bool: ...


def mark(item: _Item, report: _Report, error: BaseException | None) -> None:
    """A call that raised `Undecided`: the report (and the item, which JUnit XML reads at
    teardown) carries the mark, and its message reads `undecided: ...`."""
    if report.when != "call" or not report.failed or not isinstance(error, Undecided):
        return
    report.user_properties.append(_MARK)
    if _MARK not in item.user_properties:
        item.user_properties.append(_MARK)
    report.longrepr = f"{CATEGORY}: {error}"


def is_undecided(report: _Report) -> bool:
    """A failed call whose verdict was undecided (marked by `mark`)."""
    return report.when == "call" and report.failed and _MARK in report.user_properties


def teststatus(report: _Report) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
    """pytest's category, letter and word for an undecided report; None for any other."""
    if not is_undecided(report):
        return None
    return CATEGORY, LETTER, (WORD, {"yellow": True})


def summary_lines(reports: Iterable[_Report]) -> list[str]:
    """One line for each undecided test, as pytest's short summary gives a failed one."""
    lines = []
    for report in reports:
        if not is_undecided(report):
            continue
        message = str(report.longrepr).removeprefix(f"{CATEGORY}: ")
        lines.append(f"{WORD} {report.nodeid} - {message}")
    return lines


def html_result_cells(report: _Report, cells: list[str]) -> None:
    """pytest-html's row: the result column says Undecided.

    pytest-html (4.x) files each row under a fixed set of results, read from the first cell's
    text, and hides a row whose result it does not know. So the row keeps a hidden first cell
    that says Failed (counted, filtered and coloured as failed, which it is), and the visible
    result cell says Undecided."""
    if not is_undecided(report) or not cells or "col-result" not in cells[0]:
        return
    word = html.escape(CATEGORY.capitalize())
    cells[0] = f'<td class="col-result-as" hidden>Failed</td><td class="col-result">{word}</td>'
