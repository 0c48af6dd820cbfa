"""Which hot-path modules run compiled, and the switch back to their Python sources.

`pip install .` compiles the modules in COMPILED_MODULES with Cython where a C
compiler is found (setup.py); each is the same `.py` file, with type annotations
Cython reads and Python ignores, so a newcomer reads the source and knows what runs.
Without a compiler, or built with LEVERET_PURE_PYTHON=1, there is no extension and
the `.py` runs as it is.

At run time LEVERET_PURE_PYTHON=1 makes an installed build import the Python sources
instead of its extensions (to compare the two, or to rule the compiled code out),
and an extension whose source changed since it was built (an editable install, then
an edit or a checkout) is skipped (logged at info, listed by build_info()): the
edited `.py` runs, never stale machine code. setup.py writes each source's hash beside the extensions
(`_compiled.json`) when it builds them.

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


_skipped: set[str] = set()


def install() -> None:
    """Called once by leveret/__init__.py, before any hot-path module is imported."""
    if pure_requested():
        _skipped.update(COMPILED_MODULES)
    else:
        try:
            with open(os.path.join(_HERE, MANIFEST)) as f:
                built = json.load(f)
        except (OSError, ValueError):
            return  # nothing was compiled: the sources run anyway
        for module in COMPILED_MODULES:
            want = built.get(module)
            if want is None:
                continue
            try:
                stale = source_hash(source_path(module)) != want
            except OSError:
                continue
            if stale:
                _skipped.add(module)
        if _skipped:
            # Logged, not warned: a warning on stderr would change what every command
            # prints. build_info() lists them too.
            logging.getLogger("leveret").info(
                "the source of %s changed since it was compiled; running the Python "
                "source (rebuild with `pip install -e .` or "
                "`python setup.py build_ext --inplace`)",
                ", ".join(sorted(_skipped)),
            )
    if _skipped:
        sys.meta_path.insert(0, _SourceFirst(set(_skipped)))


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
        "stale": sorted(_skipped - set(COMPILED_MODULES if pure_requested() else ())),
    }
