"""The command line of a `leveret server` subprocess started by a test.

Every broker a test starts must take ports nobody else holds: people moving from
RabbitMQ run the suite on a machine where RabbitMQ already listens on 5672, 15672
and 15692, and two runs of the suite may share a machine.  So the HTTP and MQTT listeners a
test does not ask for are off (`0`); a test that wants one passes its own
`--management-port` or `--prometheus-port` after these, and argparse keeps the last.

`workers` (or, when a caller gives none, `LEVERET_TEST_WORKERS` in the environment)
runs the broker as that many worker processes (`--workers N`, docs/workers.md): the
supervisor logs the same "listening for AMQP" line once every worker accepts.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: the listeners a test broker does not get unless the test names a port for them
QUIET_PORTS = (
    "--management-port", "0", "--prometheus-port", "0",
    "--mqtt-port", "0", "--web-mqtt-port", "0", "--mqtt-tls-port", "0",
)  # fmt: skip


#: LEVERET_TEST_WORKERS=N runs every broker a test starts as N worker processes
#: (`--workers N`): how CI runs its subset of the suite on a broker of workers.
TEST_WORKERS = os.environ.get("LEVERET_TEST_WORKERS")


def workers_argv(workers: int | str | None = None) -> list[str]:
    """`--workers N` for `workers`, else for LEVERET_TEST_WORKERS, else 1: always
    given, so the suite's brokers do not depend on `leveret server`'s default."""
    if workers is None:
        workers = int(TEST_WORKERS or 1)
    return ["--workers", str(workers)]


def server_argv(*args: str, workers: int | str | None = None) -> list[str]:
    """`python -m leveret server` with the HTTP listeners off, then ``args``."""
    return [sys.executable, "-m", "leveret", "server", *QUIET_PORTS, *workers_argv(workers), *args]


def worker_pids(data_dir: str | os.PathLike) -> list[int]:
    """The pids of the worker processes of the broker of workers on `data_dir`
    (`<data-dir>/workers-status.json`); none for a one-process broker."""
    import json

    try:
        with open(os.path.join(data_dir, "workers-status.json")) as f:
            doc = json.load(f)
    except (FileNotFoundError, ValueError):
        return []
    return [w["pid"] for w in doc.get("workers", []) if w.get("pid")]


def owner_store(data_dir: str | os.PathLike, queue: str, vhost: str = "/") -> str:
    """The store dir that holds `queue`: the data dir itself for a one-process broker,
    `<data-dir>/worker-<i>` of the queue's owner for a broker of workers."""
    count = int(TEST_WORKERS or 1)
    if count == 1:
        return os.fspath(data_dir)
    from leveret.workers.mesh import placement

    return os.path.join(data_dir, f"worker-{placement(vhost, queue, count)}")


def owner_pid(
    proc: subprocess.Popen, data_dir: str | os.PathLike, queue: str, vhost: str = "/"
) -> int:
    """The process that holds `queue`: `proc` itself, or its owner worker."""
    count = int(TEST_WORKERS or 1)
    if count == 1:
        return proc.pid
    from leveret.workers.mesh import placement

    return worker_pids(data_dir)[placement(vhost, queue, count)]


def sigkill_broker(
    proc: subprocess.Popen, data_dir: str | os.PathLike, timeout: float = 30.0
) -> None:
    """SIGKILL a broker as a crash would: a one-process broker's process, or every
    worker of a broker of workers and then its supervisor, held stopped meanwhile (a
    worker whose supervisor is gone stops cleanly, flushing what a crash loses, and a
    running supervisor restarts a killed worker). Waits until every one is gone."""
    workers = worker_pids(data_dir) if TEST_WORKERS and int(TEST_WORKERS) > 1 else []
    if workers and proc.poll() is None:
        # Stopped, the supervisor neither restarts a worker nor closes the control
        # channels whose end would make the workers stop cleanly before their SIGKILL.
        proc.send_signal(signal.SIGSTOP)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    deadline = time.monotonic() + timeout
    for pid in workers:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def hot_path_lines(
    python: str, env: dict[str, str], workdir: str, timeout: float = 60.0,
    workers: int | None = None,
) -> list[tuple[str, str]]:  # fmt: skip
    """Starts `python -m leveret server` in `workdir` (its data dir under it) on a port
    the OS picks, waits until it listens, stops it, and returns the (level, text) of
    each `hot path:` line of its log."""
    path = os.path.join(workdir, "server.log")
    with open(path, "w") as log:  # read through another open: the child owns this offset
        proc = subprocess.Popen(
            [python, "-m", "leveret", "server", *QUIET_PORTS, *workers_argv(workers),
             "--port", "0", "--data-dir", os.path.join(workdir, "data")],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            with open(path) as f:
                if "listening for AMQP" in f.read():
                    break
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with open(path) as f:
        text = f.read()
    if "listening for AMQP" not in text:
        raise AssertionError(f"`leveret server` did not start listening:\n{text}")
    return re.findall(r"^\S+ \S+ (\w+) leveret: (hot path: .*)$", text, re.MULTILINE)


#: how many free ports start_logged_server tries when another process takes the one
#: it picked before the broker binds it
PORT_TRIES = 3


@contextmanager
def start_logged_server(workdir: Path, *args: str, timeout: float = 60.0) -> Iterator[int]:
    """A `leveret server` (server_argv: with `--workers N` under LEVERET_TEST_WORKERS)
    on a free port with its data dir and log in `workdir`; yields the AMQP port once it
    listens, and stops it (SIGTERM) after. Its log is `workdir/server.log`."""
    path = workdir / "server.log"
    deadline = time.monotonic() + timeout
    for attempt in range(PORT_TRIES):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(path, "w") as log:
            proc = subprocess.Popen(
                server_argv("--port", str(port), "--data-dir", str(workdir / "data"), *args),
                stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            )  # fmt: skip
        # The port was free when picked; on a shared machine another process may take
        # it before the broker binds it: then the broker exits saying so, and another
        # port is tried.
        while (
            proc.poll() is None
            and "listening for AMQP" not in path.read_text()
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        if proc.poll() is None or attempt == PORT_TRIES - 1:
            break
        if f"('127.0.0.1', {port}): address already in use" not in path.read_text():
            break
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"`leveret server` exited:\n{path.read_text()}")
            # The log line, not the port: a broker of workers binds its port before
            # its workers accept, and logs the line once every worker does.
            if "listening for AMQP" in path.read_text():
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"`leveret server` did not listen:\n{path.read_text()}")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
