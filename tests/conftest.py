"""Shared fixtures.

The suite runs against Leveret by default (the ``leveret_broker`` fixture of the
leveret pytest plugin gives each test a fresh in-process broker).  Set
``LEVERET_TEST_URL`` to run it against any other broker, e.g. the reference
RabbitMQ::

    LEVERET_TEST_URL=amqp://guest:guest@127.0.0.1:5673/%2F python -m pytest tests

Tests marked ``leveret_only`` are skipped then.  Because a shared broker keeps
state between tests, tests use unique names (``names`` fixture) and clean up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import uuid
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import pika
import pytest

TESTS_DIR = os.path.dirname(__file__)
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

EXTERNAL_URL = os.environ.get("LEVERET_TEST_URL")
#: LEVERET_TEST_WORKERS=N: the tests that take `amqp_url` share one `leveret server
#: --workers N` (a subprocess, started once per run), and brokers that tests start
#: themselves run with `--workers N` too (serverproc.server_argv).
TEST_WORKERS = os.environ.get("LEVERET_TEST_WORKERS")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-rounds",
        type=int,
        default=None,
        help="rounds for crash/soak loops (marked `soak`); CI runs a few by default",
    )


@pytest.fixture
def soak_rounds(request: pytest.FixtureRequest) -> int:
    """How many rounds a soak/crash loop runs: --soak-rounds, else 3 (CI's default)."""
    return request.config.getoption("--soak-rounds") or 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leveret_only: behaviour specific to Leveret; skipped when LEVERET_TEST_URL is set",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rounds = config.getoption("--soak-rounds")
    if rounds:
        # A crash loop's rounds get longer as its data grows: the default --timeout
        # (120 s, sized for CI's 3 rounds) would cut a long run short.
        for item in items:
            if "soak" in item.keywords:
                item.add_marker(pytest.mark.timeout(120 + 15 * rounds))
    if TEST_WORKERS and not EXTERNAL_URL:
        # The in-process broker object is one process's: a test that reaches into it
        # has no broker of workers to look at.
        skip = pytest.mark.skip(reason="uses the in-process broker; LEVERET_TEST_WORKERS is set")
        for item in items:
            if "leveret_embedded" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)
    if not EXTERNAL_URL:
        return
    skip = pytest.mark.skip(reason="leveret_only test; LEVERET_TEST_URL points at another broker")
    for item in items:
        if "leveret_only" in item.keywords:
            item.add_marker(skip)


def against_rabbitmq() -> bool:
    return bool(EXTERNAL_URL)


@dataclass(frozen=True)
class WorkersBroker:
    """The shared `leveret server --workers N`: its AMQP URL and management API (on
    worker 0, showing and closing every worker's connections)."""

    url: str
    api: str


@pytest.fixture(scope="session")
def workers_broker(tmp_path_factory: pytest.TempPathFactory):
    """One `leveret server --workers N` for the run (LEVERET_TEST_WORKERS=N)."""
    from serverproc import start_logged_server

    for attempt in range(3):
        workdir = tmp_path_factory.mktemp("workers-broker")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            management = s.getsockname()[1]
        with start_logged_server(workdir, "--management-port", str(management)) as port:
            # The port was free when picked; on a shared machine another process may
            # take it first, and the broker then runs without its API: start another.
            if "management API not started" in (workdir / "server.log").read_text():
                if attempt < 2:
                    continue
            yield WorkersBroker(
                f"amqp://guest:guest@127.0.0.1:{port}/%2F", f"http://127.0.0.1:{management}/api"
            )
            return


@pytest.fixture(scope="session")
def workers_broker_url(workers_broker: WorkersBroker) -> str:
    return workers_broker.url


@pytest.fixture(scope="session")
def workers_broker_api(workers_broker: WorkersBroker) -> str:
    """The management API of the shared broker of workers: what tests that configure
    the broker (policies, vhosts) go through instead of the in-process broker object."""
    return workers_broker.api


@pytest.fixture
def amqp_url(request: pytest.FixtureRequest) -> str:
    """AMQP URL of the broker under test."""
    if EXTERNAL_URL:
        return EXTERNAL_URL
    if TEST_WORKERS:
        return request.getfixturevalue("workers_broker_url")
    return request.getfixturevalue("leveret_broker")


@pytest.fixture
def amqp_host_port(amqp_url: str) -> tuple[str, int]:
    parsed = urlparse(amqp_url)
    return parsed.hostname or "127.0.0.1", parsed.port or 5672


@pytest.fixture
def amqp_vhost(amqp_url: str) -> str:
    path = urlparse(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


@pytest.fixture
def amqp_credentials(amqp_url: str) -> tuple[str, str]:
    parsed = urlparse(amqp_url)
    return unquote(parsed.username or "guest"), unquote(parsed.password or "guest")


def connection_params(url: str, **overrides) -> pika.URLParameters:
    params = pika.URLParameters(url)
    params.socket_timeout = 5
    params.blocked_connection_timeout = 10
    params.connection_attempts = 1
    for key, value in overrides.items():
        setattr(params, key, value)
    return params


class Names:
    """Unique queue/exchange names, deleted at teardown (RabbitMQ is shared)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.queues: list[str] = []
        self.exchanges: list[str] = []
        self.token = uuid.uuid4().hex[:10]

    def queue(self, prefix: str = "q") -> str:
        name = f"leveret-test.{prefix}.{self.token}.{len(self.queues)}"
        self.queues.append(name)
        return name

    def exchange(self, prefix: str = "x") -> str:
        name = f"leveret-test.{prefix}.{self.token}.{len(self.exchanges)}"
        self.exchanges.append(name)
        return name

    def cleanup(self) -> None:
        if not (self.queues or self.exchanges):
            return
        try:
            conn = pika.BlockingConnection(connection_params(self.url))
        except Exception:
            return
        try:
            for name in self.queues:
                self._delete(conn, "queue_delete", queue=name)
            for name in self.exchanges:
                self._delete(conn, "exchange_delete", exchange=name)
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    @staticmethod
    def _delete(conn, method: str, **kwargs) -> None:
        with contextlib.suppress(Exception):
            ch = conn.channel()
            getattr(ch, method)(**kwargs)
            ch.close()


@pytest.fixture
def names(amqp_url: str):
    n = Names(amqp_url)
    yield n
    n.cleanup()


@pytest.fixture
def connection(amqp_url: str):
    """A pika BlockingConnection, closed at teardown."""
    conn = pika.BlockingConnection(connection_params(amqp_url))
    yield conn
    if conn.is_open:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture
def channel(connection):
    return connection.channel()


@pytest.fixture
def connect(amqp_url: str):
    """Factory for extra pika BlockingConnections (all closed at teardown)."""
    opened: list[pika.BlockingConnection] = []

    def _connect(**overrides) -> pika.BlockingConnection:
        conn = pika.BlockingConnection(connection_params(amqp_url, **overrides))
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        if conn.is_open:
            with contextlib.suppress(Exception):
                conn.close()


@pytest.fixture
def raw(amqp_host_port):
    """Factory for RawClient connections (closed at teardown)."""
    from rawamqp import RawClient

    opened: list[RawClient] = []

    def _raw(timeout: float = 5.0) -> RawClient:
        client = RawClient(*amqp_host_port, timeout=timeout)
        opened.append(client)
        return client

    yield _raw
    for client in opened:
        client.close()


def drain(ch, queue: str, limit: int = 1000) -> list[bytes]:
    """All bodies currently in ``queue`` (basic.get with auto-ack until empty).

    Publish on a confirm-mode channel first so routing is known to be done.
    """
    bodies = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    return bodies


def wait_until(conn, predicate, timeout: float = 5.0, step: float = 0.02) -> bool:
    """Pump a pika BlockingConnection until predicate() is true (or timeout)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        conn.process_data_events(time_limit=step)
    return True


# One local SparkSession for the whole test session (it takes seconds to start), for the
# tests in tests/spark. PYSPARK_PYTHON must be this interpreter, or Spark's Python
# workers start another Python that has neither leveret nor pyarrow. `local[2,4]` gives
# two cores and lets a failed task be retried (plain `local[2]` fails the job at once).
@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from leveret.spark import LeveretDataSource

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("leveret-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LeveretDataSource)
    yield session
    session.stop()
