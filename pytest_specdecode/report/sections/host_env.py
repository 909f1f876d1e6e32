"""The serving host during each timed window: a small strip per arm in the HTML report."""

from __future__ import annotations

import html

from ...record.schema import RunRecord


def html_section(record: RunRecord) -> str:
    """One row per arm's start, one cell per window: its environment, marked where it was off."""
    phases = [
        p for p in record.phases.values() if any(m.environment for m in p.measurements.values())
    ]
    if not phases:
        return ""
    rows = []
    for phase in phases:
        cells = []
        for key, m in phase.measurements.items():
            env = m.environment
            if env is None:
                continue
            state = "contaminated" if env.contaminated else "kept, not quiet" if env.off else ""
            n = len(env.remeasured)
            again = f"; measured again {n} time{'s' if n > 1 else ''}" if n else ""
            title = env.contaminated or env.off or "; ".join(env.remeasured) or "clean"
            klass = "v-contaminated" if env.contaminated or env.off else ""
            text = f"{key}: {env.describe()}" + (f" ({state})" if state else "") + again
            cells.append(
                f"<td class='{klass}' title='{html.escape(title)}'>{html.escape(text)}</td>"
            )
        rows.append(f"<tr><th>{html.escape(phase.name)}</th>{''.join(cells)}</tr>")
    return (
        "<h3>The host during each window</h3>"
        f"<table class='specdecode-table specdecode-host'>{''.join(rows)}</table>"
    )
