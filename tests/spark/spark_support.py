"""Helpers for the Spark tests: stream brokers, publishing, reading and running queries.

Not a conftest (tests/conftest.py is the one): test modules import this by name. Reading
needs Leveret's stream queues and tail-offsets extension; on a broker without them the
reading tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from leveret.testing import embedded_broker
from serverproc import server_argv


def params(url: str) -> pika.URLParameters:
    p = pika.URLParameters(url)
    p.socket_timeout = 10
    p.blocked_connection_timeout = 30
    return p


def has_streams(url: str) -> bool:
    """Whether the broker at `url` declares `x-queue-type: stream` queues."""
    conn = pika.BlockingConnection(params(url))
    try:
        ch = conn.channel()
        name = f"leveret-test.stream-probe.{time.monotonic_ns()}"
        try:
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        except pika.exceptions.ChannelClosedByBroker:
            return False
        ch.queue_delete(name)
        return True
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@contextlib.contextmanager
def stream_broker(tmp_path: Path) -> Iterator[str]:
    """A persistent embedded Leveret (streams live on the segment store); skips without streams."""
    with embedded_broker(persistence=True, data_dir=str(tmp_path / "broker")) as broker:
        if not has_streams(broker.url):
            pytest.skip("this Leveret has no stream queues yet")
        yield broker.url


def declare_stream(url: str, name: str, **args) -> None:
    conn = pika.BlockingConnection(params(url))
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream", **args})
    conn.close()


def declare_super_stream(url: str, name: str, partitions: int) -> list[str]:
    """A super stream as RabbitMQ makes one: a direct exchange, NAME-i streams, keys "i"."""
    conn = pika.BlockingConnection(params(url))
    ch = conn.channel()
    ch.exchange_declare(name, "direct", durable=True)
    streams = [f"{name}-{i}" for i in range(partitions)]
    for i, stream in enumerate(streams):
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(stream, name, str(i), arguments={"x-stream-partition-order": i})
    conn.close()
    return streams


def publish(
    url: str,
    exchange: str,
    routing_key: str | None,
    bodies: list[bytes],
    keys: list[str] | None = None,
    **props,
) -> None:
    """Publish with confirms (so everything is stored when this returns)."""
    conn = pika.BlockingConnection(params(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i, body in enumerate(bodies):
        key = keys[i] if keys is not None else routing_key
        ch.basic_publish(exchange, key or "", body, pika.BasicProperties(**props))
    conn.close()


def events(start: int, count: int, prefix: str = "e") -> list[bytes]:
    return [
        json.dumps({"id": f"{prefix}{i}", "n": i}).encode() for i in range(start, start + count)
    ]


def read_opts(url: str, **opts: str) -> dict[str, str]:
    return {"uri": url, **opts}


def load(spark, **opts: str):
    reader = spark.read.format("leveret")
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def ids_in_parquet(spark, path: Path) -> list[str]:
    if not path.exists():
        return []
    df = spark.read.schema("id string").parquet(str(path))
    return [r.id for r in df.collect()]


def has_dedup_exchange(url: str) -> bool:
    conn = pika.BlockingConnection(params(url))
    try:
        ch = conn.channel()
        name = f"leveret-test.dedup-probe.{time.monotonic_ns()}"
        try:
            ch.exchange_declare(name, "x-message-deduplication", arguments={"x-cache-size": 100})
        except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker):
            return False
        ch.exchange_delete(name)
        return True
    finally:
        with contextlib.suppress(Exception):
            conn.close()


class BrokerProcess:
    """`leveret server` as a subprocess, for SIGKILL; always killed by `close()`."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.data_dir = data_dir
        self.log = log
        self.proc = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self) -> BrokerProcess:
        import socket
        import subprocess

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *server_argv(),
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"broker exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    pytest.fail("broker did not listen within 60 s")
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    close = kill
