"""The supervisor with real processes: a killed worker is restarted, SIGTERM stops
them all, and a worker that keeps dying stops the supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROG = str(Path(__file__).with_name("worker_prog.py"))
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}


def start(tmp_path: Path, workers: int, *extra: str, prog: list[str] | None = None):
    status = tmp_path / "status.json"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "leveret.workers.supervisor",
            "--workers", str(workers), "--status-file", str(status), "--backoff", "0.05",
            *extra, "--", sys.executable, PROG, str(tmp_path), *(prog or []),
        ],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    return proc, status


def wait_for(what, timeout: float = 30.0):
    """Polls `what()` until it returns something true (the time limit only stops a
    broken test from hanging; nothing is asserted about how long it took)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"still waiting for {what.__doc__ or what}")


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def running(path: Path, n: int):
    """every worker running, each with a pid"""
    doc = read_status(path)
    if doc and all(w["state"] == "running" for w in doc["workers"]) and len(doc["workers"]) == n:
        return doc
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_worker_is_restarted_and_sigterm_stops_all(tmp_path: Path) -> None:
    proc, status = start(tmp_path, 3)
    try:
        doc = wait_for(lambda: running(status, 3))
        pids = [w["pid"] for w in doc["workers"]]
        assert len(set(pids)) == 3 and all(alive(p) for p in pids)
        wait_for(lambda: all((tmp_path / f"started-{i}-{p}").exists() for i, p in enumerate(pids)))

        os.kill(pids[1], signal.SIGKILL)

        def restarted():
            """worker 1 running again as a new process"""
            d = running(status, 3)
            return d if d and d["workers"][1]["pid"] != pids[1] else None

        doc = wait_for(restarted)
        w1 = doc["workers"][1]
        assert w1["restarts"] == 1 and w1["last_exit"] == -signal.SIGKILL
        assert [w["pid"] for w in doc["workers"]][::2] == pids[::2]  # the others untouched
        assert all(w["restarts"] == 0 for w in doc["workers"][::2])
        new_pids = [w["pid"] for w in doc["workers"]]
        wait_for(lambda: (tmp_path / f"started-1-{new_pids[1]}").exists())

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # every worker got the SIGTERM and exited; the supervisor waited for each
    for i, pid in enumerate(new_pids):
        assert (tmp_path / f"stopped-{i}-{pid}").exists()
        assert not alive(pid)
    doc = read_status(status)
    assert doc["state"] == "stopped"
    assert [w["state"] for w in doc["workers"]] == ["stopped"] * 3
    assert [w["last_exit"] for w in doc["workers"]] == [0, 0, 0]


def test_a_worker_that_keeps_dying_stops_the_supervisor(tmp_path: Path) -> None:
    proc, status = start(
        tmp_path, 2, "--max-restarts", "3", "--restart-window", "600", prog=["exit", "3"]
    )
    try:
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = read_status(status)
    assert doc["state"] == "failed"
    # four restarts is one too many: the fourth death stopped everything
    assert sum(w["restarts"] for w in doc["workers"]) == 3
    failed = [w for w in doc["workers"] if w["state"] == "failed"]
    assert len(failed) == 1 and failed[0]["last_exit"] == 3
    assert "more than 3 restarts" in proc.stderr.read()


def test_a_worker_that_ignores_sigterm_is_killed_after_the_stop_timeout(tmp_path: Path) -> None:
    # the worker ignores SIGTERM (as a stuck worker would), says so, and sleeps
    marker = tmp_path / "ignoring"
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').close(); time.sleep(600)"
    )
    prog = ["-c", code, str(marker)]
    status = tmp_path / "status.json"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "leveret.workers.supervisor", "--workers", "1",
            "--status-file", str(status), "--stop-timeout", "0.5", "--", sys.executable, *prog,
        ],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        doc = wait_for(lambda: running(status, 1))
        pid = doc["workers"][0]["pid"]
        wait_for(marker.exists)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not alive(pid)
    assert read_status(status)["workers"][0]["last_exit"] == -signal.SIGKILL
    assert "did not stop in time" in proc.stderr.read()


def test_the_command_line_is_checked() -> None:
    for args, message in [
        (["--workers", "2"], "a worker command is needed"),
        (["--workers", "0", "--", "true"], "at least 1"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "leveret.workers.supervisor", *args],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and message in out.stderr


@pytest.mark.parametrize("count", [0, -1])
def test_a_supervisor_needs_a_worker(count: int) -> None:
    from leveret.workers.supervisor import Supervisor

    with pytest.raises(ValueError):
        Supervisor(count, lambda i: ["true"])


ACCEPTOR = """
import os, socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
while True:
    conn, _ = listener.accept()
    conn.sendall(str(os.getpid()).encode())
    conn.close()
"""


def test_a_listening_socket_the_supervisor_holds_outlives_its_worker() -> None:
    """Worker 0 accepts on a socket the supervisor made and passes it; while it is
    dead, a client's connection waits in that socket's queue and the restarted worker
    serves it."""
    import asyncio
    import socket

    from leveret.workers.supervisor import Supervisor

    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    fd = listener.fileno()
    sup = Supervisor(
        1,
        lambda i: [sys.executable, "-c", ACCEPTOR, str(fd)],
        pass_fds=lambda i: [fd],
        backoff=0.5,
        env=ENV,
    )

    def served_by() -> int:
        with socket.create_connection(address, timeout=30) as c:
            return int(c.recv(100))

    async def main() -> tuple[int, int, int]:
        task = asyncio.create_task(sup.run())
        first = await asyncio.to_thread(served_by)
        assert first == sup.status()[0].pid
        os.kill(first, signal.SIGKILL)
        while sup.status()[0].state == "running":
            await asyncio.sleep(0.01)
        # No worker accepts now (the loop that would restart it is busy here until
        # the connection is made): the connection waits in the queue of the socket
        # that the supervisor still holds, and the next worker serves it.
        client = socket.create_connection(address, timeout=30)
        assert sup.status()[0].state == "restarting"
        with client:
            second = int(await asyncio.to_thread(client.recv, 100))
        sup.stop()
        return first, second, await task

    try:
        first, second, code = asyncio.run(main())
    finally:
        listener.close()
    assert code == 0
    assert second != first
    assert sup.status()[0].restarts == 1
