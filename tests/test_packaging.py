"""What users install runs the compiled hot path, as the tests and benchmarks do.

The suite runs on an editable install (`pip install -e .`), where the sources and the
extensions lie side by side in the checkout; an installed build holds only what the
package data names, so a file the build reads and the install lacks goes unseen there.
Here scripts/build-wheel.sh builds the release, from a copy of this checkout's files
(git's tracked and untracked-but-not-ignored files: no in-place build, no build/
leftovers): the sdist, and from it the wheel, repaired into a manylinux one. Each is
installed, not editable, into a fresh venv:

- the sdist by pip, which compiles it (what `pip install leveret` does where no wheel
  fits), with the C compiler on the PATH;
- the manylinux wheel with only the venv's bin/ on the PATH, so no C compiler: nothing
  may need compiling at install.

In both every module of COMPILED_MODULES must run compiled and none stale, and
`leveret server` must log `hot path: compiled (...)`. One build serves every check:
it is what takes the time (the extensions are compiled twice, for the wheel and for
the sdist's install). The venvs see this interpreter's site-packages for the
dependencies, so nothing is downloaded twice; every check first asserts that
`leveret` comes from the venv, not from the checkout or an editable install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from leveret import _build
from serverproc import hot_path_lines

ROOT = Path(__file__).resolve().parent.parent
MODULES = list(_build.COMPILED_MODULES)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.leveret_only,
    pytest.mark.timeout(1500),  # the first test builds the release (minutes on 2 cores)
]


def _run(cmd: list[str], **kwargs) -> str:  # type: ignore[no-untyped-def]
    """Runs `cmd`; its whole output in the failure when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout


def _clean_env(path: str) -> dict[str, str]:
    """This environment without what would import another leveret or ask for the
    Python fallback, with `path` as the PATH."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", _build.PURE_ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PATH": path, "PYTHONNOUSERSITE": "1"}


def _checkout_copy(dest: Path) -> None:
    """This checkout's files as a fresh clone of it (with uncommitted edits) has them."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the release is built from git's list of this checkout's files: {exc}")
    for name in listed.decode().split("\0"):
        src = ROOT / name
        if name and src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the manylinux wheel scripts/build-wheel.sh builds."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: the release's extensions cannot be built here")
    tmp = tmp_path_factory.mktemp("release")
    checkout, dist = tmp / "checkout", tmp / "dist"
    _checkout_copy(checkout)
    env = {**_clean_env(os.environ["PATH"]), "PYTHON": sys.executable}
    _run(["bash", "scripts/build-wheel.sh", str(dist)], cwd=checkout, env=env)
    (sdist,) = dist.glob("leveret-*.tar.gz")
    (wheel,) = dist.glob("leveret-*.whl")
    return {"sdist": sdist, "wheel": wheel}


class Venv:
    """A fresh venv that sees this interpreter's packages; leveret installed in it."""

    def __init__(self, path: Path, search_path: str) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        self.env = _clean_env(search_path)
        self.site = _run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            env=self.env,
        ).strip()  # fmt: skip

    def install(self, what: Path) -> None:
        # pip comes from this interpreter's site-packages and installs into the venv;
        # the dependencies are there already.
        _run([self.python, "-m", "pip", "install", "-q", str(what)], env=self.env, cwd=self.path)

    def report(self) -> dict:
        """What the installed leveret says of itself, run outside any checkout."""
        code = (
            "import json, shutil, sys, leveret\n"
            "from leveret import _build\n"
            "info = leveret.build_info()\n"
            "print(json.dumps({'leveret': leveret.__file__, 'info': info,\n"
            "  'files': {m: sys.modules[m].__file__ for m in _build.COMPILED_MODULES},\n"
            "  'compilers': [c for c in ('cc', 'gcc', 'clang') if shutil.which(c)]}))\n"
        )
        return json.loads(_run([self.python, "-c", code], env=self.env, cwd=self.path))


def _venv(tmp_path_factory: pytest.TempPathFactory, name: str, compiler: bool) -> Venv:
    """A fresh venv; its PATH is its bin/, then this one's only where `compiler`."""
    where = tmp_path_factory.mktemp(name) / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)])
    path = str(where / "bin") + (os.pathsep + os.environ["PATH"] if compiler else "")
    return Venv(where, path)


@pytest.fixture(scope="module")
def sdist_venv(release: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    venv = _venv(tmp_path_factory, "sdist", compiler=True)
    venv.install(release["sdist"])
    return venv


@pytest.fixture(scope="module")
def wheel_venv(release: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    venv = _venv(tmp_path_factory, "wheel", compiler=False)
    venv.install(release["wheel"])
    return venv


def _assert_installed_and_compiled(venv: Venv) -> dict:
    report = venv.report()
    assert report["leveret"] == os.path.join(venv.site, "leveret", "__init__.py"), report
    assert report["info"] == {"compiled": MODULES, "pure_requested": False, "stale": []}
    for module, path in report["files"].items():
        assert path.startswith(venv.site) and path.endswith(".so"), (module, path)
    return report


def test_the_release_holds_the_extensions_and_what_they_are_checked_against(release) -> None:
    assert "manylinux" in release["wheel"].name, release["wheel"].name
    with zipfile.ZipFile(release["wheel"]) as whl:
        names = set(whl.namelist())
        built = json.loads(whl.read(f"leveret/{_build.MANIFEST}"))
    assert sorted(built) == sorted(MODULES)
    for module in MODULES:
        base = module.replace(".", "/")
        assert f"{base}.py" in names and f"{base}.pxd" in names, module
        assert any(n.startswith(base + ".") and n.endswith(".so") for n in names), module
    assert not [n for n in names if n.endswith(".c")]  # the sdist's C is no package data
    with tarfile.open(release["sdist"]) as sdist:
        members = {m.name.partition("/")[2] for m in sdist.getmembers()}
    for module in MODULES:
        assert f"src/{module.replace('.', '/')}.pxd" in members, module


def test_the_sdist_installed_by_pip_runs_compiled(sdist_venv: Venv) -> None:
    _assert_installed_and_compiled(sdist_venv)
    installed = Path(sdist_venv.site, "leveret")
    assert not list(installed.rglob("*.c"))


def test_the_manylinux_wheel_installs_compiled_without_a_compiler(wheel_venv: Venv) -> None:
    report = _assert_installed_and_compiled(wheel_venv)
    assert report["compilers"] == []  # nothing could have compiled at install


@pytest.mark.parametrize("which", ["sdist_venv", "wheel_venv"])
def test_the_installed_server_logs_the_compiled_hot_path(request, which: str, tmp_path) -> None:
    venv: Venv = request.getfixturevalue(which)
    lines = hot_path_lines(venv.python, venv.env, str(tmp_path))
    assert lines == [("INFO", f"hot path: compiled ({len(MODULES)} modules)")]


def test_an_edited_installed_source_runs_as_python_and_the_server_warns(
    sdist_venv: Venv, tmp_path
) -> None:
    source = Path(
        _build.source_path("leveret.server.channel", os.path.join(sdist_venv.site, "leveret"))
    )
    original = source.read_bytes()
    source.write_bytes(original + b"\n# an edit after the install\n")
    try:
        report = sdist_venv.report()
        assert report["info"]["stale"] == ["leveret.server.channel"]
        assert report["files"]["leveret.server.channel"] == str(source)
        lines = hot_path_lines(sdist_venv.python, sdist_venv.env, str(tmp_path))
    finally:
        source.write_bytes(original)
    assert len(lines) == 1 and lines[0][0] == "WARNING", lines
    assert lines[0][1].startswith(f"hot path: Python fallback (slower) for 1 of {len(MODULES)}")
    assert lines[0][1].endswith(": leveret.server.channel")
    _assert_installed_and_compiled(sdist_venv)  # the source back, the extension runs again


def _mapped_extensions(pid: int, site: str) -> set[str]:
    """The leveret extension modules (.so) under `site` that process `pid` has mapped."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[-1] for line in f if line.rstrip().endswith(".so")}
    return {p for p in paths if p.startswith(os.path.join(site, "leveret"))}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers need Linux")
def test_the_installed_wheel_runs_a_broker_of_workers_compiled(wheel_venv: Venv, tmp_path) -> None:
    """`leveret server --workers 2` from the installed wheel: every worker process
    (started as `python -m leveret.worker` by the supervisor) runs the venv's compiled
    extensions, and a message published on one worker reaches a queue another owns."""
    import pika

    from leveret.workers.mesh import placement

    log_path = tmp_path / "server.log"
    data = tmp_path / "data"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [wheel_venv.python, "-m", "leveret", "server", "--workers", "2",
             "--worker-affinity", "off", "--management-port", "0", "--prometheus-port", "0",
             "--mqtt-port", "0", "--web-mqtt-port", "0", "--mqtt-tls-port", "0",
             "--port", "0", "--data-dir", str(data)],
            stdout=log, stderr=subprocess.STDOUT, env=wheel_venv.env, cwd=tmp_path,
        )  # fmt: skip
    try:
        port = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and port is None:
            found = re.search(r"listening for AMQP 0-9-1 on [^:\s]+:(\d+)", log_path.read_text())
            port = int(found.group(1)) if found else None
            time.sleep(0.1)
        assert port is not None, log_path.read_text()
        status = json.loads((data / "workers-status.json").read_text())
        pids = [w["pid"] for w in status["workers"]]
        assert len(pids) == 2, status
        so_files = {p: _mapped_extensions(p, wheel_venv.site) for p in pids}
        for pid, mapped in so_files.items():
            # every compiled module of the venv's install, nothing from the checkout
            assert len(mapped) == len(MODULES), (pid, sorted(mapped))

        # one queue on each worker (placement is a hash of vhost and name), each
        # published to and read through a connection that lands on either worker
        params = pika.ConnectionParameters("127.0.0.1", port)
        names = [f"installed-{i}" for i in range(8)]
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for name in names:
                ch.queue_declare(name, durable=True)
                ch.basic_publish("", name, name.encode())
        # the queues' owners by placement (what tests/workers checks on the live
        # broker): both workers own some, so messages cross between them
        assert {placement("/", name, 2) for name in names} == {0, 1}
        for name in names:
            with pika.BlockingConnection(params) as conn:
                method, _props, body = conn.channel().basic_get(name, auto_ack=True)
                assert body == name.encode(), (name, method)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0, log_path.read_text()
