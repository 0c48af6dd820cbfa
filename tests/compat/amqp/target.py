"""The Leveret to replay scenarios against (the CI test and replay.py): an in-process
broker with its management API on a free port, or under LEVERET_TEST_WORKERS=N a `leveret server --workers N` subprocess whose
admin side is its management API (worker 0's)."""

from __future__ import annotations

import os
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .runner import BrokerAdmin, Target


@contextmanager
def leveret_target() -> Iterator[Target]:
    if os.environ.get("LEVERET_TEST_WORKERS"):
        with workers_target() as target:
            yield target
        return
    from leveret.config import ServerConfig
    from leveret.testing import EmbeddedBroker

    config = ServerConfig(host="127.0.0.1", port=0, persistence=False, management_port=0)
    broker = EmbeddedBroker(config).start()
    try:
        management = f"http://127.0.0.1:{broker.server.management.port}"
        yield Target("127.0.0.1", broker.port, BrokerAdmin(broker), management=management)
    finally:
        broker.stop()


@contextmanager
def workers_target() -> Iterator[Target]:
    """`leveret server --workers N` (serverproc.server_argv) with its management API on
    a free port: the scenarios reach whichever worker the kernel gives them."""
    from serverproc import start_logged_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="leveret-replay-") as tmp:
        with start_logged_server(Path(tmp), "--management-port", str(http_port)) as port:
            management = f"http://127.0.0.1:{http_port}"
            _wait_http(management)
            yield Target.rabbitmq(f"amqp://guest:guest@127.0.0.1:{port}/%2F", management)


def _wait_http(base: str, timeout: float = 60.0) -> None:
    """Worker 0 serves the management API once it accepts; the AMQP line can come first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/overview", timeout=5):
                return
        except OSError as exc:
            if "401" in str(exc):
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
