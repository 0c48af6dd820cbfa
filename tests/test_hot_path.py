"""`leveret server` says at start which hot path runs (leveret/_build.py hot_path()):
`hot path: compiled (19 modules)` at INFO, or a WARNING naming the modules that run as
Python and why. Real `leveret server` processes, their log read back; the installs
without a compiled module, or with a stale one, are copies of this one's package.
tests/test_packaging.py checks the same line in installed sdists and wheels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import leveret
from leveret import _build
from serverproc import hot_path_lines

pytestmark = pytest.mark.leveret_only

PACKAGE_DIR = os.path.dirname(leveret.__file__)
TOTAL = len(_build.COMPILED_MODULES)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", _build.PURE_ENV)}
    return {**env, "PYTHONPATH": os.path.dirname(PACKAGE_DIR), **extra}


def _build_info(env: dict[str, str], cwd: str) -> tuple[str, dict]:
    out = subprocess.run(
        [sys.executable, "-c",
         "import json, leveret; print(json.dumps([leveret.__file__, leveret.build_info()]))"],
        env=env, cwd=cwd, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    path, info = json.loads(out)
    return path, info


def _compiled_here() -> bool:
    """Whether this checkout's package has compiled modules to copy."""
    return os.path.exists(os.path.join(PACKAGE_DIR, _build.MANIFEST))


def test_the_server_logs_the_hot_path_this_install_runs(tmp_path) -> None:
    env = _env()
    _, info = _build_info(env, str(tmp_path))
    lines = hot_path_lines(sys.executable, env, str(tmp_path))
    assert len(lines) == 1, lines
    if len(info["compiled"]) == TOTAL:
        assert lines == [("INFO", f"hot path: compiled ({TOTAL} modules)")]
    else:
        level, text = lines[0]
        assert level == "WARNING"
        assert f"for {TOTAL - len(info['compiled'])} of {TOTAL} compiled modules" in text
    if os.environ.get("LEVERET_REQUIRE_COMPILED") == "1":
        assert lines == [("INFO", f"hot path: compiled ({TOTAL} modules)")]


def test_pure_python_asked_for_is_a_warning_that_names_the_variable(tmp_path) -> None:
    lines = hot_path_lines(sys.executable, _env(LEVERET_PURE_PYTHON="1"), str(tmp_path))
    assert lines == [
        (
            "WARNING",
            f"hot path: pure Python (slower): LEVERET_PURE_PYTHON=1 asks for the Python "
            f"sources of the {TOTAL} compiled modules; unset it to run them compiled",
        )
    ]


def _extension(root: str, module: str) -> str:
    """The compiled extension file of `module` in the package copy under `root`."""
    base = _build.source_path(module, os.path.join(root, "leveret"))[: -len(".py")]
    folder, name = os.path.split(base)
    (found,) = [f for f in os.listdir(folder) if f.startswith(name + ".") and f.endswith(".so")]
    return os.path.join(folder, found)


def _no_compiled_modules(root: str) -> None:
    os.remove(os.path.join(root, "leveret", _build.MANIFEST))
    for module in _build.COMPILED_MODULES:
        os.remove(_extension(root, module))


# The channel: no other compiled module cimports it, so it falls back alone.
LEAF = "leveret.server.channel"


def _edit(root: str, module: str) -> None:
    with open(_build.source_path(module, os.path.join(root, "leveret")), "a") as f:
        f.write("\n# an edit after the build\n")


def _edited_source(root: str) -> None:
    _edit(root, LEAF)


def _failed_compilation(root: str) -> None:
    path = os.path.join(root, "leveret", _build.MANIFEST)
    with open(path) as f:
        built = json.load(f)
    del built[LEAF]  # what setup.py writes when a module fails
    with open(path, "w") as f:
        json.dump(built, f)
    os.remove(_extension(root, LEAF))


def _missing_extension(root: str) -> None:
    os.remove(_extension(root, LEAF))


def _copy(tmp_path) -> tuple[str, dict[str, str]]:
    """A copy of this checkout's compiled package, and the environment that runs it."""
    if not _compiled_here():
        pytest.skip("this checkout is not compiled: there is no compiled install to copy")
    root = tmp_path / "site"
    shutil.copytree(
        PACKAGE_DIR,
        root / "leveret",
        ignore=shutil.ignore_patterns("*.c", "*.html", "__pycache__"),
    )
    return str(root), _env(PYTHONPATH=str(root))


@pytest.mark.parametrize(
    ("damage", "python", "reason"),
    [
        (
            _no_compiled_modules,
            [],
            f"{TOTAL} of {TOTAL} compiled modules: not compiled: this install has no "
            "compiled modules (it was built without a C compiler or without Cython, or "
            "with LEVERET_PURE_PYTHON=1); reinstall where a C compiler is found",
        ),
        (
            _edited_source,
            [LEAF],
            f"1 of {TOTAL} compiled modules: stale (the source changed since it was "
            "compiled; reinstall, or run `python setup.py build_ext --inplace` in a "
            f"checkout): {LEAF}",
        ),
        (
            _failed_compilation,
            [LEAF],
            f"1 of {TOTAL} compiled modules: not compiled (the build left it out: its "
            "compilation failed, or the build is older than its place in "
            f"COMPILED_MODULES): {LEAF}",
        ),
        (
            _missing_extension,
            [LEAF],
            f"1 of {TOTAL} compiled modules: extension missing (compiled, but its extension "
            f"file is not installed): {LEAF}",
        ),
    ],
    ids=["not-compiled", "stale", "failed", "missing"],
)
def test_a_fallback_is_a_warning_that_says_why(tmp_path, damage, python, reason) -> None:
    root, env = _copy(tmp_path)
    damage(root)
    path, info = _build_info(env, str(tmp_path))
    assert path == os.path.join(root, "leveret", "__init__.py")  # the copy, not the checkout
    assert sorted(set(_build.COMPILED_MODULES) - set(info["compiled"])) == sorted(
        python or _build.COMPILED_MODULES
    )
    assert info["stale"] == (python if damage is _edited_source else [])
    lines = hot_path_lines(sys.executable, env, str(tmp_path))
    assert lines == [("WARNING", f"hot path: Python fallback (slower) for {reason}")]


def _cimported_by(root: str) -> dict[str, set[str]]:
    """For each compiled module, the compiled modules whose .pxd cimports it."""
    users: dict[str, set[str]] = {m: set() for m in _build.COMPILED_MODULES}
    for module in _build.COMPILED_MODULES:
        pxd = _build.source_path(module, os.path.join(root, "leveret"))[:-3] + ".pxd"
        if os.path.exists(pxd):
            with open(pxd) as f:
                for name in re.findall(r"from (leveret[\w.]+) cimport", f.read()):
                    users.setdefault(name, set()).add(module)
    return users


def test_a_stale_module_takes_the_modules_compiled_against_its_types_with_it(tmp_path) -> None:
    # Their extensions would take its Python class for the C type they were compiled
    # against (Cython checks only the size at import) and read fields at C offsets.
    root, env = _copy(tmp_path)
    edited = "leveret.server.model_methods"
    _edit(root, edited)
    users = _cimported_by(root)
    assert users[edited], "the example needs a module other modules cimport"
    expected, todo = {edited}, [edited]
    while todo:
        for user in users[todo.pop()] - expected:
            expected.add(user)
            todo.append(user)
    path, info = _build_info(env, str(tmp_path))  # imports every module: none fails
    assert path == os.path.join(root, "leveret", "__init__.py")
    assert set(info["stale"]) == expected
    assert set(info["compiled"]) == set(_build.COMPILED_MODULES) - expected
    others = [m for m in _build.COMPILED_MODULES if m in expected - {edited}]
    lines = hot_path_lines(sys.executable, env, str(tmp_path))
    assert lines == [
        (
            "WARNING",
            f"hot path: Python fallback (slower) for {len(expected)} of {TOTAL} compiled "
            "modules: stale (the source changed since it was compiled; reinstall, or run "
            f"`python setup.py build_ext --inplace` in a checkout): {edited}; compiled "
            "against the C types of one of those, so run as Python too: " + ", ".join(others),
        )
    ]


def test_the_docs_quote_the_line_the_server_logs() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for doc in ("README.md", "docs/architecture.md"):
        with open(os.path.join(root, doc)) as f:
            assert f"`hot path: compiled ({TOTAL} modules)`" in f.read(), doc
