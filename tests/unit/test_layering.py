"""The packages' layering, read from the sources' import statements.

Leveret is built in layers: libraries at the bottom (`protocol/`, `store/`), the model
(`broker/`) on them, the AMQP front end (`server/`) on the model, the extensions
(`management/`, `links/`, `cluster/`) beside each other on top, and `launcher.py`, the
composition root, which alone knows all of them (docs/architecture.md, "Layers").
An import that points up a layer is how circles of imports start, so each rule
below names the packages a package must not import, and the last test refuses any
circle between packages.

Every import counts: at module level, inside functions and under TYPE_CHECKING, since
a type annotation ties a module to another as much as a call does.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "leveret"

#: package -> packages of leveret it must not import (a top-level module counts as a
#: package of its own name)
FORBIDDEN: dict[str, set[str]] = {
    # the disk, as a library: the model's persistence is persistence/'s
    "store": {
        "broker", "server", "persistence", "management", "links", "cluster", "protocol",
        "auth", "client", "launcher", "cli", "ctl", "ctl_http", "testing", "config",
    },
    # the wire, as a library
    "protocol": {
        "broker", "server", "store", "persistence", "management", "links", "cluster",
        "auth", "client", "launcher", "cli", "ctl", "testing",
    },
    # the model: extensions reach it through ports (broker/extensions.py)
    "broker": {
        "server", "persistence", "management", "links", "cluster", "launcher", "cli",
        "ctl", "ctl_http", "testing", "client",
    },
    # the model's persistence: below the front end and the extensions
    "persistence": {
        "server", "management", "links", "cluster", "launcher", "cli", "ctl", "testing",
    },
    # the AMQP front end: knows nothing of what the launcher puts beside it
    "server": {
        "management", "links", "cluster", "launcher", "cli", "ctl", "testing", "mqtt",
    },
    # MQTT: a front end beside server/, on the same model
    "mqtt": {"management", "links", "cluster", "launcher", "cli", "ctl", "testing"},
    "management": {"links", "cluster", "launcher", "cli", "ctl", "testing"},
    "links": {"management", "cluster", "launcher", "cli", "ctl", "testing"},
}  # fmt: skip

#: single modules a package may import although FORBIDDEN names their package: each a
#: leaf (it imports nothing else of leveret, which test_exceptions_are_leaves checks)
EXCEPTIONS: dict[str, set[str]] = {
    # the store keeps AMQP field tables (declared objects' arguments) as the wire
    # writes them, each value with its own type, by the protocol's codec for them
    "store": {"leveret.protocol.fieldtable"},
}

#: packages that are one unit for the circle check: a command and its HTTP transport;
#: the model's users and permissions (auth/), which raise the model's errors
GROUPS = {"ctl_http": "ctl", "auth": "broker"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every leveret module or name `path` imports, relative imports resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "leveret" or m.startswith("leveret.")}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "leveret"


def _edges() -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the importing modules (with what they import)."""
    modules = {_module_name(p) for p in SRC.rglob("*.py")}
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in SRC.rglob("*.py"):
        importer = _module_name(path)
        for target in _imports(path):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]  # a name from a module: the module
            a, b = _package(importer), _package(target)
            if a != b:
                edges[a][b].add(f"{importer} -> {target}")
    return edges


EDGES = _edges()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_up(package: str) -> None:
    assert (SRC / package).is_dir(), f"{package}/ is gone: update FORBIDDEN"
    wrong = sorted(
        line
        for target, lines in EDGES.get(package, {}).items()
        if target in FORBIDDEN[package]
        for line in lines
        if line.split(" -> ")[1] not in EXCEPTIONS.get(package, set())
    )
    assert not wrong, f"{package}/ imports a layer above it:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(m for modules in EXCEPTIONS.values() for m in modules))
def test_exceptions_are_leaves(module: str) -> None:
    path = SRC.parent / (module.replace(".", "/") + ".py")
    inner = sorted(t for t in _imports(path) if t == "leveret" or t.startswith("leveret."))
    assert not inner, (
        f"{module} is allowed below its layer only while it imports no leveret module: {inner}"
    )


def test_no_circle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, targets in EDGES.items():
        for b in targets:
            ga, gb = GROUPS.get(a, a), GROUPS.get(b, b)
            if ga != gb and ga != "leveret" and gb != "leveret":
                graph[ga].add(gb)
    # Tarjan's strongly connected components: a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    detail = [
        line
        for circle in circles
        for a in circle
        for b in circle
        if b in EDGES.get(a, {})
        for line in sorted(EDGES[a][b])
    ]
    assert not circles, f"packages import each other: {circles}\n" + "\n".join(detail)
