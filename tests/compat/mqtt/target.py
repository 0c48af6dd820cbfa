"""The broker a scenario runs against, and the clients it drives.

A `Target` names the ports of one broker: MQTT, AMQP and the management HTTP API.
The reference is RabbitMQ 3.10.8 with its MQTT plugin (`rabbitmq()`); the replay
starts Leveret as a subprocess on free ports (`leveret()`), with the same command
line a user types. Scenarios set up users, vhosts and permissions, and read the
queues an MQTT session made, through the management HTTP API, which both brokers
serve, so one scenario text runs unchanged on both.

`Mqtt` is a synchronous face on a paho-mqtt client: it runs paho's network loop in a
thread (without paho's automatic reconnect, so a takeover is seen as such) and keeps
what arrives (CONNACK, SUBACKs, PUBACKs, messages, the disconnect) as data.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import paho.mqtt.client as paho
import pika
from paho.mqtt.enums import CallbackAPIVersion

#: every name a scenario makes on the reference starts with this (it is shared)
PREFIX = "mqtt-compat"
#: the WebSocket path of MQTT over WebSocket (RabbitMQ's Web MQTT plugin serves /ws)
WEB_MQTT_PATH = "/ws"


@dataclass(frozen=True)
class Target:
    name: str  # "rabbitmq" or "leveret"
    host: str
    mqtt_port: int
    amqp_port: int
    api: str  # http://host:port of the management API
    web_mqtt_port: int | None = None  # MQTT over WebSocket, path WEB_MQTT_PATH
    user: str = "guest"
    password: str = "guest"

    # --- management API ---------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> Any:
        request = urllib.request.Request(
            self.api.rstrip("/") + "/api" + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "content-type": "application/json",
                "authorization": "Basic "
                + base64.b64encode(f"{self.user}:{self.password}".encode()).decode(),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        return json.loads(text) if text else None

    def add_vhost(self, name: str) -> None:
        self.call("PUT", f"/vhosts/{quote(name, safe='')}", {})

    def delete_vhost(self, name: str) -> None:
        self.call("DELETE", f"/vhosts/{quote(name, safe='')}", missing_ok=True)

    def add_user(self, name: str, password: str) -> None:
        self.call("PUT", f"/users/{quote(name, safe='')}", {"password": password, "tags": ""})

    def delete_user(self, name: str) -> None:
        self.call("DELETE", f"/users/{quote(name, safe='')}", missing_ok=True)

    def permit(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        body = {"configure": configure, "write": write, "read": read}
        self.call("PUT", f"/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}", body)

    def topic_permit(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        body = {"exchange": exchange, "write": write, "read": read}
        path = f"/topic-permissions/{quote(vhost, safe='')}/{quote(user, safe='')}"
        self.call("PUT", path, body)

    def queues(self, vhost: str, contains: str) -> list[dict[str, Any]]:
        """The queues of `vhost` whose name contains `contains`: name, durable,
        auto_delete, exclusive, arguments, messages ready (what a session looks like)."""
        listing = self.call("GET", f"/queues/{quote(vhost, safe='')}") or []
        return sorted(
            (
                {
                    "name": q["name"],
                    "durable": q.get("durable"),
                    "auto_delete": q.get("auto_delete"),
                    "exclusive": q.get("exclusive"),
                    "arguments": q.get("arguments"),
                }
                for q in listing
                if contains in q["name"]
            ),
            key=lambda q: q["name"],
        )

    def delete_queues(self, vhost: str, contains: str) -> None:
        listing = self.call("GET", f"/queues/{quote(vhost, safe='')}") or []
        for q in listing:
            if contains in q["name"]:
                path = f"/queues/{quote(vhost, safe='')}/{quote(q['name'], safe='')}"
                self.call("DELETE", path, missing_ok=True)

    # --- clients ------------------------------------------------------------------------

    def amqp(self, vhost: str = "/") -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            self.host,
            self.amqp_port,
            vhost,
            pika.PlainCredentials(self.user, self.password),
            connection_attempts=3,
            retry_delay=0.5,
        )
        return pika.BlockingConnection(params)

    def raw(self):
        from .wire import RawClient

        return RawClient(self.host, self.mqtt_port)

    def raw_websocket(self):
        from .wire import RawWebSocketClient

        if self.web_mqtt_port is None:
            raise ValueError(f"{self.name}: no Web MQTT port")
        return RawWebSocketClient(self.host, self.web_mqtt_port, WEB_MQTT_PATH)

    def mqtt(self, client_id: str, **kwargs: Any) -> Mqtt:
        return Mqtt(self, client_id, **kwargs)


#: paho's names for MQTT 3.1.1's CONNACK return codes, back to the codes
_CONNACK_CODES = {
    "Success": 0,
    "Unsupported protocol version": 1,
    "Client identifier not valid": 2,
    "Server unavailable": 3,
    "Bad user name or password": 4,
    "Not authorized": 5,
}


class Mqtt:
    """One paho MQTT 3.1.1 client, connected on construction; `connack` is
    {"return_code", "session_present"} or None when no CONNACK came."""

    def __init__(
        self,
        target: Target,
        client_id: str,
        *,
        clean: bool = True,
        username: str | None = "guest",
        password: str | None = "guest",
        will: tuple[str, bytes, int, bool] | None = None,
        wait: float = 5.0,
        websocket: bool = False,
    ) -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean,
            protocol=paho.MQTTv311,
            transport="websockets" if websocket else "tcp",
        )
        if websocket:
            self.client.ws_set_options(path=WEB_MQTT_PATH)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.messages: list[dict[str, Any]] = []
        self.subacks: dict[int, list[int]] = {}
        self.pubacks: set[int] = set()
        self.disconnected = threading.Event()
        self.connack: dict[str, Any] | None = None
        self._stop = threading.Event()
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            topic, payload, qos, retain = will
            self.client.will_set(topic, payload, qos, retain)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect
        port = target.web_mqtt_port if websocket else target.mqtt_port
        if port is None:
            raise ValueError(f"{target.name}: no Web MQTT port")
        self.client.connect(target.host, port, keepalive=60)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + wait
        while self.connack is None and not self.disconnected.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)

    # paho's callbacks (its network thread)
    def _on_connect(self, _c, _u, flags, reason, _props) -> None:
        self.connack = {
            "return_code": _CONNACK_CODES.get(reason.getName(), reason.value),
            "session_present": bool(flags.session_present),
        }

    def _on_message(self, _c, _u, msg) -> None:
        self.messages.append(
            {
                "topic": msg.topic,
                "payload": msg.payload.decode(errors="replace"),
                "qos": msg.qos,
                "retain": bool(msg.retain),
                "dup": bool(msg.dup),
            }
        )

    def _on_subscribe(self, _c, _u, mid, reason_codes, _props) -> None:
        self.subacks[mid] = [rc.value for rc in reason_codes]

    def _on_publish(self, _c, _u, mid, _rc, _props) -> None:
        self.pubacks.add(mid)

    def _on_disconnect(self, _c, _u, _flags, _rc, _props) -> None:
        self.disconnected.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            rc = self.client.loop(timeout=0.05)
            if rc != paho.MQTT_ERR_SUCCESS:
                self.disconnected.set()
                return

    # the scenario's side
    def subscribe(self, *filters: tuple[str, int], wait: float = 5.0) -> list[int] | None:
        """SUBSCRIBE; the granted QoS list of its SUBACK (128 for a failure), or None
        if no SUBACK came (the broker closed the connection instead)."""
        _rc, mid = self.client.subscribe(list(filters))
        deadline = time.monotonic() + wait
        while mid not in self.subacks and not self.disconnected.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return self.subacks.get(mid)

    def unsubscribe(self, *topics: str) -> None:
        self.client.unsubscribe(list(topics))

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                wait: float = 5.0) -> bool | None:  # fmt: skip
        """PUBLISH; for QoS 1, whether its PUBACK came (None for QoS 0)."""
        info = self.client.publish(topic, payload, qos, retain)
        if qos == 0:
            return None
        deadline = time.monotonic() + wait
        while info.mid not in self.pubacks and not self.disconnected.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return info.mid in self.pubacks

    def wait_messages(self, count: int, wait: float = 5.0, grace: float = 0.5) -> list[dict]:
        """The messages received once `count` have come (or `wait` passed), plus any
        that come within `grace` seconds after: extra deliveries are seen too."""
        deadline = time.monotonic() + wait
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(grace)
        return list(self.messages)

    def wait_closed(self, wait: float = 5.0) -> bool:
        return self.disconnected.wait(wait)

    def disconnect(self) -> None:
        """A clean DISCONNECT (no last will)."""
        if not self.disconnected.is_set():
            self.client.disconnect()
            self.disconnected.wait(5)
        self._stop.set()
        self._thread.join(5)

    def drop(self) -> None:
        """Close the socket without DISCONNECT: the broker publishes the last will."""
        self._stop.set()
        self._thread.join(5)
        sock = self.client.socket()
        if sock is not None:
            sock.close()


# --- the brokers ----------------------------------------------------------------------


def rabbitmq(
    mqtt_port: int = 1884,
    amqp_port: int = 5673,
    api: str = "http://127.0.0.1:15673",
    web_mqtt_port: int = 15675,
) -> Target:
    return Target("rabbitmq", "127.0.0.1", mqtt_port, amqp_port, api, web_mqtt_port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen, ports: list[int], log: Path, wait: float) -> None:
    deadline = time.monotonic() + wait
    pending = list(ports)
    while pending:
        if proc.poll() is not None:
            raise RuntimeError(
                f"leveret server exited with status {proc.returncode} before listening "
                f"on {ports}:\n{log.read_text()[-3000:]}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", pending[0])) == 0:
                pending.pop(0)
                continue
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"leveret server does not listen on {pending} after {wait:.0f} s:\n"
                f"{log.read_text()[-3000:]}"
            )
        time.sleep(0.1)


@contextmanager
def leveret(wait: float = 30.0) -> Iterator[Target]:
    """`python -m leveret server` with MQTT, Web MQTT and the management API on free
    ports, in a fresh data directory; the Target of it. Fails (RuntimeError with the
    server's output) when the server will not start or listen."""
    try:
        from serverproc import server_argv
    except ImportError:  # pragma: no cover - under `python -m tests.compat...`
        from tests.serverproc import server_argv

    amqp, mqtt, web, api = free_port(), free_port(), free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="leveret-mqtt-compat-"))
    log = data / "server.log"
    argv = server_argv(
        "--port", str(amqp), "--mqtt-port", str(mqtt), "--web-mqtt-port", str(web),
        "--management-port", str(api), "--data-dir", str(data / "d"),
    )  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        _wait_listening(proc, [amqp, mqtt, web, api], log, wait)
        yield Target("leveret", "127.0.0.1", mqtt, amqp, f"http://127.0.0.1:{api}", web)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)
