"""Run a Leveret broker inside the current process, on its own thread.

Synchronous clients (pika's BlockingConnection, kombu) block the calling thread,
so the broker gets an event loop of its own on a daemon thread.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from urllib.parse import quote

from leveret.config import ServerConfig
from leveret.launcher import Node


class AdminProxy:
    """broker.admin's operations (leveret.broker.admin.Admin), run on the broker's loop.

    `embedded.admin.add_user("bob", "secret")`, `.add_vhost("v1")`,
    `.set_permissions("bob", "v1", ".*", ".*", ".*")`: the same operations and
    errors as `leveret ctl`, for tests that set up users and vhosts.
    """

    def __init__(self, embedded: EmbeddedBroker) -> None:
        self._embedded = embedded

    def __getattr__(self, name: str):
        embedded = self._embedded

        def operation(*args, **kwargs):
            return embedded.call(
                lambda: getattr(embedded.server.broker.admin, name)(*args, **kwargs)
            )

        operation.__name__ = name
        return operation


class EmbeddedBroker:
    """A broker on an ephemeral loopback port; `url` is ready once `start()` returns."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig(port=0, persistence=False)
        self.loop = asyncio.new_event_loop()
        self.server = Node(self.config, loop=self.loop)  # the node (leveret.launcher)
        self._thread = threading.Thread(target=self._run, name="leveret-broker", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def admin(self) -> AdminProxy:
        """The operator's operations (vhosts, users, permissions, limits, policies)."""
        return AdminProxy(self)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def mqtt_port(self) -> int:
        """The MQTT listener's port (start it with `mqtt_port=0`: a free one)."""
        return self.server.mqtt.addresses["mqtt"][1]

    @property
    def web_mqtt_port(self) -> int:
        """The Web MQTT listener's port (`web_mqtt_port=0`), path /ws."""
        return self.server.mqtt.addresses["web-mqtt"][1]

    @property
    def url(self) -> str:
        user, password = self.config.default_user, self.config.default_pass
        return f"amqp://{quote(user)}:{quote(password)}@127.0.0.1:{self.port}/%2F"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def start(self) -> EmbeddedBroker:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"embedded broker failed to start: {self._error!r}") from self._error
        return self

    def call(self, fn, *args):
        """Run fn(*args) on the broker's loop and return its result (for inspecting state)."""
        result: dict = {}
        done = threading.Event()

        def runner() -> None:
            try:
                result["value"] = fn(*args)
            except BaseException as exc:  # re-raised in the caller's thread
                result["error"] = exc
            done.set()

        self.loop.call_soon_threadsafe(runner)
        done.wait(30)
        if "error" in result:
            raise result["error"]
        return result.get("value")

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            fut.result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)


@contextmanager
def embedded_broker(config: ServerConfig | None = None, **overrides) -> Iterator[EmbeddedBroker]:
    """Context manager: `with embedded_broker() as b: pika.URLParameters(b.url)`."""
    cfg = config or ServerConfig(port=0, persistence=False)
    if overrides:
        cfg = replace(cfg, **overrides)
    if cfg.persistence and cfg.data_dir == ServerConfig.data_dir:
        cfg = replace(cfg, data_dir=tempfile.mkdtemp(prefix="leveret-"))
    broker = EmbeddedBroker(cfg).start()
    try:
        yield broker
    finally:
        broker.stop()
