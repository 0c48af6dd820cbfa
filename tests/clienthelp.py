"""Helpers for the leveret.client tests: running coroutines, a TCP proxy that can
cut or freeze connections, and closing a client's connection from the server side.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from typing import Any
from urllib.parse import quote, urlparse

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5673/%2F"
RABBITMQ_API = "http://127.0.0.1:15673/api"


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run a coroutine on a fresh event loop, failing (not hanging) after `timeout`."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def rabbitmq_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5673), timeout=1):
            pass
        api_get("/overview")
    except (OSError, urllib.error.URLError):
        return False
    return True


def _auth() -> dict[str, str]:
    token = base64.b64encode(b"guest:guest").decode()
    return {"Authorization": f"Basic {token}"}


def api_get(path: str, api: str = RABBITMQ_API) -> Any:
    req = urllib.request.Request(api + path, headers=_auth())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def api_delete(path: str, api: str = RABBITMQ_API) -> None:
    req = urllib.request.Request(
        api + path, method="DELETE", headers=_auth() | {"X-Reason": "leveret test"}
    )
    with urllib.request.urlopen(req, timeout=5):
        pass


def rabbitmq_connection_names(
    client_name: str, timeout: float = 10.0, api: str = RABBITMQ_API
) -> list[str]:
    """Management-API names of the connections whose client connection_name matches.

    The management API lists a connection a few seconds after it opens (stats
    are collected on a timer), so this polls.
    """
    deadline = time.monotonic() + timeout
    while True:
        conns = api_get("/connections?columns=name,client_properties", api)
        names = [
            c["name"]
            for c in conns
            if (c.get("client_properties") or {}).get("connection_name") == client_name
        ]
        if names or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


def close_from_rabbitmq(client_name: str, timeout: float = 30.0, api: str = RABBITMQ_API) -> int:
    """Close (management API DELETE) the open RabbitMQ connections with this client name
    (`api`: another broker's management API, e.g. a broker of workers').

    Polls until at least one is closed: the management API lists a new
    connection only after its next stats tick, and may still list one that
    has just gone.
    """
    deadline = time.monotonic() + timeout
    while True:
        closed = 0
        for name in rabbitmq_connection_names(client_name, timeout=1.0, api=api):
            try:
                api_delete("/connections/" + quote(name, safe=""), api)
                closed += 1
            except urllib.error.HTTPError:
                pass  # already gone
        if closed or time.monotonic() > deadline:
            return closed
        time.sleep(0.5)


def close_from_leveret(broker: Any) -> int:
    """Force-close every client connection of an embedded Leveret (320 CONNECTION_FORCED)."""

    def close_all() -> int:
        conns = list(broker.server.connections)
        for conn in conns:
            conn.force_close("closed by a test")
        return len(conns)

    return broker.call(close_all)


class TcpProxy:
    """A loopback TCP proxy in a thread, to cut or freeze client connections.

    `cut()` closes every proxied connection (as a network failure or broker
    crash looks to the client); `freeze()` stops forwarding without closing (a
    dead peer: only heartbeats can tell); `accepted` counts connections.
    `drop_after_open_ok = n` makes the next n connections close as soon as the
    broker's connection.open-ok has been passed on (a node that accepts a
    client and then forces it off, as a cluster node handing over does).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.frozen = False
        self.refuse = False
        self.drop_after_open_ok = 0
        self._doomed: set[socket.socket] = set()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def url(self, base: str) -> str:
        parsed = urlparse(base)
        netloc = parsed.netloc.rsplit("@", 1)
        creds = netloc[0] + "@" if len(netloc) == 2 else ""
        return f"{parsed.scheme}://{creds}127.0.0.1:{self.port}{parsed.path or '/'}" + (
            f"?{parsed.query}" if parsed.query else ""
        )

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        self._poke()

    def freeze(self, frozen: bool = True) -> None:
        self.frozen = frozen
        self._poke()

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._thread.join(5)
        self.listener.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        peers: dict[socket.socket, socket.socket] = {}
        while not self._stop:
            for key, _ in sel.select(0.2):
                tag = key.data
                if tag == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(1024)
                    continue
                if tag == "accept":
                    try:
                        client, _ = self.listener.accept()
                    except OSError:
                        continue
                    self.accepted += 1
                    if self.refuse:
                        client.close()
                        continue
                    try:
                        upstream = socket.create_connection(self.target, timeout=5)
                    except OSError:
                        client.close()
                        continue
                    for s in (client, upstream):
                        s.setblocking(False)
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    peers[client], peers[upstream] = upstream, client
                    if self.drop_after_open_ok > 0:
                        self.drop_after_open_ok -= 1
                        self._doomed.add(upstream)
                    with self._lock:
                        self._pairs.append((client, upstream))
                    sel.register(client, selectors.EVENT_READ, "data")
                    sel.register(upstream, selectors.EVENT_READ, "data")
                    continue
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if self.frozen:
                    continue
                other = peers.get(sock)
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data and other is not None:
                    try:
                        other.setblocking(True)
                        other.sendall(data)
                        other.setblocking(False)
                        # connection.open-ok is method 10/41: forward it, then hang up.
                        if not (sock in self._doomed and b"\x00\x0a\x00\x29" in data):
                            continue
                    except OSError:
                        pass
                self._doomed.discard(sock)
                for s in (sock, other):
                    if s is None:
                        continue
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(s)
                    peers.pop(s, None)
                    with contextlib.suppress(OSError):
                        s.close()
            if self.frozen:
                time.sleep(0.05)
        for s in list(peers):
            with contextlib.suppress(OSError):
                s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "no")


def broker_has_streams(url: str) -> bool:
    """Whether the broker at `url` declares stream queues (x-queue-type=stream)."""
    from leveret.client import ClientError, connect

    async def probe() -> bool:
        async with await connect(url) as conn:
            ch = await conn.channel()
            name = f"stream-probe-{os.getpid()}"
            try:
                q = await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "stream"})
            except ClientError:
                return False
            await q.delete()
            return True

    return run(probe(), timeout=30)
