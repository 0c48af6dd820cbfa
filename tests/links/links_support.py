"""Helpers for the shovel and federation tests: brokers with their management API,
API calls, waiting, and moving messages in and out with leveret.client.

Not a conftest: test modules import it by name (pytest puts this directory on
sys.path). Brokers run in-process (leveret.testing) unless a test needs to kill
one, then as subprocesses (tests/durability/durability_support.Brokers).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest

from leveret.client.blocking import connect
from leveret.client.errors import NotFound
from leveret.config import ServerConfig
from leveret.testing import EmbeddedBroker, embedded_broker

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "durability"))
from durability_support import Brokers, free_port  # noqa: E402  (subprocess brokers)

__all__ = ["Brokers", "free_port"]

# A RabbitMQ 3.10 with the shovel and federation plugins, for the tests that need
# one (skipped when it is not there, as in CI): ../shared/tools/rabbitmq.sh start PORT.
RABBITMQ_PORT = int(os.environ.get("LEVERET_PLUGINS_RABBITMQ_PORT", "5673"))
RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}/%2F"
RABBITMQ_API = f"http://127.0.0.1:{RABBITMQ_PORT + 10000}"


def api(base: str, method: str, path: str, body: Any = None, user: str = "guest:guest") -> Any:
    """(status, decoded JSON body or None); HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


def rabbitmq_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", RABBITMQ_PORT), timeout=1):
            pass
        status, _ = api(RABBITMQ_API, "GET", "/api/overview")
        return status == 200
    except OSError:
        return False


needs_rabbitmq = pytest.mark.skipif(
    not rabbitmq_reachable(),
    reason=f"needs RabbitMQ with the shovel and federation plugins on {RABBITMQ_PORT}",
)


def q(name: str) -> str:
    return quote(name, safe="")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def leveret(**overrides: Any) -> Iterator[EmbeddedBroker]:
    """An in-process broker with its management API on an ephemeral port (`.api`)."""
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config, **overrides) as broker:
        broker.api = f"http://127.0.0.1:{broker.server.management.port}"  # type: ignore[attr-defined]
        yield broker


def put_shovel(base: str, name: str, value: dict[str, Any], vhost: str = "/") -> int:
    status, body = api(
        base, "PUT", f"/api/parameters/shovel/{q(vhost)}/{q(name)}", {"value": value}
    )
    assert status in (201, 204), (status, body)
    return status


def shovel_state(base: str, name: str) -> dict[str, Any] | None:
    status, rows = api(base, "GET", "/api/shovels")
    assert status == 200, rows
    for row in rows:
        if row["name"] == name:
            return row
    return None


def wait_state(base: str, name: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_for(
        lambda: (row := shovel_state(base, name)) is not None and row["state"] == state and row,
        timeout,
        f"shovel {name} to be {state} (last: {shovel_state(base, name)})",
    )


def publish(url: str, queue: str, bodies: list[bytes], **props: Any) -> None:
    """Declare `queue` durable and publish persistent, confirmed messages to it."""
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        for body in bodies:
            ch.publish(body, routing_key=queue, persistent=True, **props)


def count(url: str, queue: str) -> int:
    """Messages ready in `queue`; 0 if it does not exist (yet)."""
    with connect(url) as conn:
        try:
            return conn.channel().declare_queue(queue, passive=True).message_count
        except NotFound:
            return 0


def drain(url: str, queue: str, expect: int | None = None, timeout: float = 10.0) -> list[Any]:
    """Every message in `queue` (acked), stopping after `timeout` s of silence or `expect`."""
    out = []
    with connect(url) as conn:
        ch = conn.channel()
        with ch.consume(queue, prefetch=500) as consumer:
            while expect is None or len(out) < expect:
                try:
                    message = consumer.next_message(timeout)
                except TimeoutError:
                    break
                out.append(message)
                message.ack()
    return out


def wait_count(url: str, queue: str, n: int, timeout: float = 30.0) -> None:
    wait_for(lambda: count(url, queue) >= n, timeout, f"{n} messages in {queue}")
