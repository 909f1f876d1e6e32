"""The package's imports run one way, down its layers, and make no cycle (CONTRIBUTING.md).

Read from the source with `ast`: every import, at module level or inside a function, of every
module of pytest_specdecode/. `farm-studio look` draws the same graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_specdecode"

# From the bottom up. A module may import its own unit (package or top-level module) and the
# units of lower layers, never a unit of its own layer or of a higher one.
LAYERS: list[set[str]] = [
    {"clock", "errors", "files", "redaction"},
    {"config"},
    {"record"},
    {"targets"},
    {"analysis"},
    {"measure", "report", "case", "hookspecs", "options", "progress"},
    {"run", "cli"},
    {"html_hooks", "fixtures", "standard"},
    {"plugin"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The pytest_specdecode modules that a file imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pytest_specdecode")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("pytest_specdecode"):
                continue
            for alias in node.names:  # `from . import x` may name a module
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return found - {name}


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def unit(module: str) -> str:
    """'pytest_specdecode.analysis.verdict.stats' -> 'analysis'; the package root -> ''."""
    return module.split(".")[1] if "." in module else ""


def layer(module: str) -> int:
    name = unit(module)
    for i, units in enumerate(LAYERS):
        if name in units:
            return i
    raise AssertionError(f"{module}: in no layer of tests/unit/test_layers.py; place it")


GRAPH = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_every_import_runs_down_a_layer_or_stays_in_its_unit() -> None:
    upward = [
        f"{source} imports {target} (layer {layer(source)} -> {layer(target)})"
        for source, targets in sorted(GRAPH.items())
        if source != "pytest_specdecode"  # the root names the fixture's type, lazily
        for target in sorted(targets)
        if target != "pytest_specdecode"
        and unit(source) != unit(target)
        and layer(target) >= layer(source)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        path.append(module)
        for target in GRAPH.get(module, ()):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(GRAPH):
        visit(module)


def test_the_graph_is_read_whole() -> None:
    """The checks are not vacuous: relative, nested and lazy imports are all in the graph."""
    assert "pytest_specdecode.config.arms" in GRAPH["pytest_specdecode.measure.experiment.arms"]
    assert "pytest_specdecode.errors" in GRAPH["pytest_specdecode.config.settings"]
    assert layer("pytest_specdecode.measure.experiment.arms") > layer(
        "pytest_specdecode.config.arms"
    )
    assert "pytest_specdecode.case" in GRAPH["pytest_specdecode.fixtures"]
    assert len(GRAPH) > 80 and sum(map(len, GRAPH.values())) > 250
