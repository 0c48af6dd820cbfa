"""Builds the compiled hot path (Cython) where a C compiler is found; pyproject.toml has
everything else. Without a compiler, with Cython missing, or with LEVERET_PURE_PYTHON=1,
the package installs as pure Python and runs the same `.py` files
(src/leveret/_build.py lists the compiled modules and says how they are chosen)."""

from __future__ import annotations

import json
import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = runpy.run_path(os.path.join(HERE, "src", "leveret", "_build.py"))
MODULES: tuple[str, ...] = BUILD["COMPILED_MODULES"]


def _extensions() -> list:
    if os.environ.get(BUILD["PURE_ENV"], "") not in ("", "0"):
        print("leveret: LEVERET_PURE_PYTHON set, building pure Python", file=sys.stderr)
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("leveret: Cython not found, building pure Python", file=sys.stderr)
        return []
    sources = [os.path.relpath(BUILD["source_path"](m, os.path.join(HERE, "src", "leveret")), HERE)
               for m in MODULES]  # fmt: skip
    return cythonize(
        sources,
        language_level=3,
        quiet=True,
        include_path=[os.path.join(HERE, "src")],  # the .pxd files cimport each other
        compiler_directives={
            "binding": True,  # functions keep their signatures and docstrings
            "boundscheck": False,  # the sources check lengths before they index
            "wraparound": False,
            "initializedcheck": False,
        },
    )


class OptionalBuildExt(build_ext):
    """Compiles what it can; a missing compiler or a failed module leaves the sources,
    which run as they are. Writes the manifest of what was compiled from which source.
    Compiles several modules at once (one per CPU, at most 8: gcc takes hundreds of MB
    for each generated C file) unless `build_ext -j N` says otherwise: the C compiler
    takes most of an install's time."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self._failed: set[str] = set()

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = min(os.cpu_count() or 1, 8)

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler: pure Python it is
            print(f"leveret: not compiling the hot path ({exc}); pure Python", file=sys.stderr)
            return
        self._write_manifest()

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"leveret: {ext.name} not compiled ({exc}); it runs as Python", file=sys.stderr)
            self._failed.add(ext.name)  # set.add: safe from the parallel build's threads

    def _write_manifest(self) -> None:
        failed = self._failed
        built = {
            ext.name: BUILD["source_hash"](
                BUILD["source_path"](ext.name, os.path.join(HERE, "src", "leveret"))
            )
            for ext in self.extensions
            if ext.name not in failed
        }
        root = os.path.join(HERE, "src") if self.inplace else self.build_lib
        path = os.path.join(root, "leveret", BUILD["MANIFEST"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(built, f, indent=1, sort_keys=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
