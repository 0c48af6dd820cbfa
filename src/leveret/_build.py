"""Which hot-path modules run compiled, and the switch back to their Python sources.

`pip install .` compiles the modules in COMPILED_MODULES with Cython where a C
compiler is found (setup.py); each is the same `.py` file, with type annotations
Cython reads and Python ignores, so a newcomer reads the source and knows what runs.
Without a compiler, or built with LEVERET_PURE_PYTHON=1, there is no extension and
the `.py` runs as it is.

At run time LEVERET_PURE_PYTHON=1 makes an installed build import the Python sources
instead of its extensions (to compare the two, or to rule the compiled code out),
and an extension whose source changed since it was built (an editable install, then
an edit or a checkout) is skipped (listed by build_info()): the edited `.py` runs,
never stale machine code, and so do the modules compiled against its C types (their
`.pxd` cimports it). setup.py writes each source's hash beside the extensions
(`_compiled.json`) when it builds them; the `.py` and `.pxd` it hashes are both
installed (pyproject.toml's package data), so an installed build hashes the same.
`leveret server` logs hot_path() at start: which hot path runs, and why not the
compiled one.

This module is read by setup.py before the package can be imported: it imports
nothing from leveret.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import sys

# The modules the profile names and instruction counts keep
# (docs/architecture.md#the-compiled-hot-path). protocol/methods.py compiled as it is
# costs more (its deliver_head takes more instructions compiled than interpreted); it is
# compiled for deliver_frames, a typed C function (methods.pxd) the compiled
# Channel calls. The model's classes are C types, laid out by the .pxd beside each.
COMPILED_MODULES: tuple[str, ...] = (
    "leveret.protocol.connection",
    "leveret.protocol.events",
    "leveret.protocol.properties",
    "leveret.protocol.methods",
    "leveret.broker.message",
    "leveret.broker.exchange",
    "leveret.broker.stats",
    "leveret.broker.consumer",
    "leveret.broker.queues.base",
    "leveret.broker.queues.classic",
    "leveret.broker.durability",
    "leveret.persistence.durable_state",
    "leveret.server.model_methods",
    "leveret.server.publishing",
    "leveret.server.channel",
    "leveret.server.connection_io",
    "leveret.server.reading",
    "leveret.workers.link",
    "leveret.workers.messages",
)
MANIFEST = "_compiled.json"
PURE_ENV = "LEVERET_PURE_PYTHON"

_HERE = os.path.dirname(os.path.abspath(__file__))


def source_path(module: str, root: str = _HERE) -> str:
    """The `.py` file of `module` under the package directory `root`."""
    parts = module.split(".")[1:]
    return os.path.join(root, *parts) + ".py"


def source_hash(path: str) -> str:
    """The hash of a module's `.py` and, if it has one, the `.pxd` beside it (the C
    layout of its classes): an edit to either makes the extension stale."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read())
    pxd = path[:-3] + ".pxd"
    if os.path.exists(pxd):
        with open(pxd, "rb") as f:
            digest.update(b"\0pxd\0" + f.read())
    return digest.hexdigest()


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Imports the listed modules from their `.py` files, whatever else lies beside them."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname not in self.modules:
            return None
        source = source_path(fullname)
        if not os.path.exists(source):
            return None
        loader = importlib.machinery.SourceFileLoader(fullname, source)
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


#: the compiled modules that run as Python though the install compiled (a manifest),
#: and why: "stale" (the source changed since), "failed" (setup.py could not compile
#: it), "missing" (no extension file), "cimports" (it cimports one of the others)
_python: dict[str, str] = {}
#: what setup.py compiled (module -> source hash), None where it compiled nothing
_built: dict[str, str] | None = None

_CIMPORT = re.compile(
    r"^\s*(?:from\s+(leveret(?:\.\w+)+)\s+cimport|cimport\s+(leveret(?:\.\w+)+))", re.M
)


def cimports(module: str, root: str = _HERE) -> set[str]:
    """The compiled modules whose C types `module`'s `.pxd` cimports: its extension was
    compiled against their layout, so it can run only where they run compiled."""
    try:
        with open(source_path(module, root)[:-3] + ".pxd") as f:
            text = f.read()
    except OSError:
        return set()
    return {a or b for a, b in _CIMPORT.findall(text)} & set(COMPILED_MODULES)


def _has_extension(module: str) -> bool:
    base = source_path(module)[:-3]
    return any(os.path.exists(base + s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def install() -> None:
    """Called once by leveret/__init__.py, before any hot-path module is imported."""
    global _built
    if pure_requested():
        sys.meta_path.insert(0, _SourceFirst(set(COMPILED_MODULES)))
        return
    try:
        with open(os.path.join(_HERE, MANIFEST)) as f:
            built = json.load(f)
    except (OSError, ValueError):
        return  # nothing was compiled: the sources run anyway
    _built = built
    for module in COMPILED_MODULES:
        if module not in built:  # an extension left there would be of another source
            _python[module] = "failed"
        elif not _has_extension(module):
            _python[module] = "missing"
        else:
            try:
                if source_hash(source_path(module)) != built[module]:
                    _python[module] = "stale"
            except OSError:
                continue
    # An extension that cimports a module running as Python would take that module's
    # Python class for its C type: Cython checks only the size at import, then reads
    # fields at the compiled offsets. Such a module runs as Python too, and so on.
    while _python:
        more = [m for m in COMPILED_MODULES if m not in _python and cimports(m) & set(_python)]
        if not more:
            break
        _python.update(dict.fromkeys(more, "cimports"))
    if _python:
        # Logged, not warned: a warning on stderr would change what every command
        # prints. build_info() lists them too, and `leveret server` warns (hot_path()).
        logging.getLogger("leveret").info(
            "running the Python source of %d compiled modules: %s", len(_python), _reasons()
        )
        sys.meta_path.insert(0, _SourceFirst(set(_python)))


def build_info() -> dict[str, object]:
    """Which build is running: the hot-path modules that are compiled extensions now,
    and whether LEVERET_PURE_PYTHON asked for the sources."""
    compiled = []
    for module in COMPILED_MODULES:
        mod = sys.modules.get(module)
        if mod is None:
            __import__(module)
            mod = sys.modules[module]
        if not (getattr(mod, "__file__", "") or "").endswith(".py"):
            compiled.append(module)
    return {
        "compiled": compiled,
        "pure_requested": pure_requested(),
        "stale": sorted(m for m, why in _python.items() if why in ("stale", "cimports")),
    }


_WHY = {
    "stale": "stale (the source changed since it was compiled; reinstall, or run `python "
    "setup.py build_ext --inplace` in a checkout)",
    "failed": "not compiled (the build left it out: its compilation failed, or the build "
    "is older than its place in COMPILED_MODULES)",
    "missing": "extension missing (compiled, but its extension file is not installed)",
    "cimports": "compiled against the C types of one of those, so run as Python too",
}


def _reasons() -> str:
    """Why the modules of `_python` run as Python, grouped by reason."""
    return "; ".join(
        f"{text}: {_names([m for m in COMPILED_MODULES if _python.get(m) == why])}"
        for why, text in _WHY.items()
        if why in _python.values()
    )


def hot_path() -> tuple[int, str]:
    """The line `leveret server` logs at start, with its level: INFO when every module
    of COMPILED_MODULES runs compiled, else a WARNING that says which run as Python and
    why. The fallback is slower, and nothing else tells the operator that it runs."""
    total = len(COMPILED_MODULES)
    if pure_requested():
        return logging.WARNING, (
            f"hot path: pure Python (slower): {PURE_ENV}={os.environ[PURE_ENV]} asks for "
            f"the Python sources of the {total} compiled modules; unset it to run them compiled"
        )
    compiled = build_info()["compiled"]
    if len(compiled) == total:
        return logging.INFO, f"hot path: compiled ({total} modules)"
    if _built is None:
        why = (
            "not compiled: this install has no compiled modules (it was built without a C "
            f"compiler or without Cython, or with {PURE_ENV}=1); reinstall where a C "
            "compiler is found"
        )
    else:
        why = _reasons()
    return logging.WARNING, (
        f"hot path: Python fallback (slower) for {total - len(compiled)} of {total} "
        f"compiled modules: {why}"
    )


def _names(modules: list[str]) -> str:
    return "all of them" if len(modules) == len(COMPILED_MODULES) else ", ".join(modules)
