"""`leveret server --workers N` as a subprocess, for the tests that run real worker
processes: the broker and its log, its workers' status file and ctl sockets, the
fixture that starts and kills them, and queue names placed on a chosen worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pika
import pytest

from leveret.ctl import call
from leveret.workers.mesh import placement
from serverproc import server_argv

LISTENING = re.compile(r"leveret\.workers: Leveret listening for AMQP 0-9-1 on 127\.0\.0\.1:(\d+)")


def wait_for(what, timeout: float = 60.0):
    """Polls `what()` until it returns something true (the limit only stops a broken
    test from hanging; nothing is asserted about how long it took)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"still waiting for {what.__doc__ or what}")


class Workers:
    """`leveret server --workers N` as a subprocess, its log in a file."""

    def __init__(self, tmp: Path, count: int = 2, *args: str, data: str = "data") -> None:
        self.data = tmp / data
        self.log = tmp / "server.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                server_argv("--port", "0", "--data-dir", str(self.data), *args, workers=count),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.port = 0

    def text(self) -> str:
        return self.log.read_text()

    def wait_listening(self) -> Workers:
        def listening():
            """the supervisor's listening line"""
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.text()}")
            return LISTENING.search(self.text())

        self.port = int(wait_for(listening).group(1))
        return self

    def status(self) -> dict:
        return json.loads((self.data / "workers-status.json").read_text())

    def connect(self, name: str = "wk-proc") -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                self.port,
                heartbeat=0,
                socket_timeout=30,
                client_properties={"connection_name": name},
            )
        )

    def connection_names(self, worker: int) -> list[str]:
        """The connection names worker `worker` has (from its own ctl socket; worker
        0's lists every worker's, each row with its `worker`)."""
        ctl = str(self.data / f"worker-{worker}" / "ctl.sock")
        rows = call(ctl, "list_connections", {})
        return [row["connection_name"] for row in rows if row.get("worker", worker) == worker]

    def connections_of(self, worker: int) -> int:
        return len(self.connection_names(worker))

    def connect_to(self, worker: int, name: str) -> pika.BlockingConnection:
        """A connection the kernel gave worker `worker` (others made on the way are
        closed): its socket group hashes each new connection to one worker."""
        for attempt in range(64):
            conn = self.connect(f"{name}-{attempt}")
            if f"{name}-{attempt}" in self.connection_names(worker):
                return conn
            conn.close()
        raise AssertionError(f"64 connections and none on worker {worker}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        # the workers stop on their own once their control channel ends
        for worker in self._status_or_empty().get("workers", []):
            if worker.get("pid"):
                wait_for(lambda pid=worker["pid"]: not alive(pid))

    def _status_or_empty(self) -> dict:
        try:
            return self.status()
        except (OSError, ValueError):
            return {}


def kill_and_wait(broker: Workers, victim: int) -> None:
    """SIGKILL worker `victim` and wait until the supervisor's replacement serves."""
    before = broker.status()["workers"][victim]
    os.kill(before["pid"], signal.SIGKILL)

    def back() -> bool:
        """the killed worker serves again"""
        w = broker.status()["workers"][victim]
        return w["pid"] != before["pid"] and w["ready"]

    wait_for(back)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of the supervisor (killed itself) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def workers(tmp_path: Path):
    made: list[Workers] = []

    def start(count: int = 2, *args: str, **kw) -> Workers:
        broker = Workers(tmp_path, count, *args, **kw)
        made.append(broker)
        return broker

    yield start
    for broker in made:
        broker.kill()


def name_on(owner: int, prefix: str, count: int = 2) -> str:
    """A queue name (`prefix-<n>`) that worker `owner` owns by placement in vhost "/"."""
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if placement("/", name, count) == owner:
            return name
    raise AssertionError(f"no name from {prefix!r} for worker {owner}")
