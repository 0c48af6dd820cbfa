"""MQTT over TCP on every worker of `leveret server --workers 2`, with paho-mqtt clients.

Every worker accepts on the MQTT port (one SO_REUSEPORT group, as the AMQP port); a
connection is served by the worker of its client id, to which the worker that
accepted it hands it over. So the newest connection of a client id takes over the
older one whichever workers the kernel gave them, a persistent session resumes on
its worker, and retained messages (held by worker 0) reach subscribers on any worker.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import sys
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from clienthelp import free_port
from leveret.ctl import call
from leveret.mqtt import packets as p
from leveret.mqtt.session import queue_names
from leveret.workers.mesh import placement
from mqttraw import RawMQTT
from workers.procs import Workers, kill_and_wait, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

MQTT_PORT = re.compile(r"worker 0 leveret\.mqtt: Leveret listening for MQTT on 127\.0\.0\.1:(\d+)")


def home(client_id: str) -> int:
    """The worker (of 2) that serves `client_id` in vhost "/": the one its session's
    QoS 1 queue is placed on."""
    return placement("/", queue_names(client_id)[1], 2)


def client_id_on(worker: int, prefix: str) -> str:
    """A client id that worker `worker` serves (of 2)."""
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if home(name) == worker:
            return name
    raise AssertionError(f"no client id from {prefix!r} for worker {worker}")


def start(workers) -> tuple[Workers, int]:
    port = free_port()
    broker = workers(2, "--mqtt-port", str(port), "--web-mqtt-port", "0").wait_listening()
    # worker 0 says it listens (the others accept on the same port)
    assert int(wait_for(lambda: MQTT_PORT.search(broker.text())).group(1)) == port
    return broker, port


def mqtt_clients(broker: Workers, worker: int) -> list[str]:
    """The client ids of the MQTT connections worker `worker` serves (from its own ctl
    socket, which lists every worker's, each row with its `worker`)."""
    ctl = str(broker.data / f"worker-{worker}" / "ctl.sock")
    rows = call(ctl, "list_mqtt_connections", {})
    return sorted(row["client_id"] for row in rows if row["worker"] == worker)


def stored_owner(broker: Workers, worker: int, queue: str) -> list:
    """The `worker` column of `queue` in worker `worker`'s definitions (None: its own)."""
    with sqlite3.connect(broker.data / f"worker-{worker}" / "definitions.db") as db:
        return [row[0] for row in db.execute("SELECT worker FROM queues WHERE name = ?", (queue,))]


def handed(broker: Workers, worker: int) -> int:
    return len(re.findall(rf"handed to worker {worker}\b", broker.text()))


def connect_through(broker: Workers, port: int, other: int, client_id: str, **kw) -> RawMQTT:
    """An MQTT connection for `client_id` that the kernel gave to worker `other`, which
    handed it over (others made on the way are closed)."""
    home_worker = home(client_id)
    assert home_worker != other
    for _attempt in range(64):
        before = handed(broker, home_worker)
        raw = RawMQTT(port)
        connack = raw.connect(client_id, **kw)
        assert connack.reason_code == 0
        if handed(broker, home_worker) > before:
            raw.connack = connack
            return raw
        raw.close()
    raise AssertionError(f"64 connections and none accepted by worker {other}")


class Paho:
    """A paho-mqtt client (v2 callbacks) with what it received, in a loop thread."""

    def __init__(self, port: int, client_id: str, clean: bool = True) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.disconnected = threading.Event()
        self.connected = threading.Event()
        self.session_present = None
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean
        )
        self.client.username_pw_set("guest", "guest")
        self.client.on_message = lambda _c, _u, m: self.messages.append(m)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *_a: self.disconnected.set()
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        assert self.connected.wait(10)

    def _on_connect(self, _c, _u, flags, reason, _props) -> None:
        self.session_present = flags.session_present
        self.connected.set()

    def subscribe(self, topic: str, qos: int) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *_a: done.set()
        self.client.subscribe(topic, qos)
        assert done.wait(10)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos, retain).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_every_worker_accepts_mqtt_and_each_client_id_has_one_worker(
    workers, tmp_path: Path
) -> None:
    broker, port = start(workers)
    for worker in (0, 1):
        other = 1 - worker
        client_id = client_id_on(worker, f"wk-mqtt-take-{worker}")
        first = connect_through(broker, port, other, client_id)
        assert mqtt_clients(broker, worker) == [client_id]
        # the newest connection of the id takes over, whichever worker accepted it
        second = Paho(port, client_id)
        assert first.closed()
        third = connect_through(broker, port, other, client_id)
        assert second.disconnected.wait(10)
        assert mqtt_clients(broker, worker) == [client_id]
        assert mqtt_clients(broker, other) == []
        third.send(p.Disconnect())
        third.close()
        second.client.loop_stop()


def test_a_persistent_session_resumes_on_the_worker_of_its_client_id(
    workers, tmp_path: Path
) -> None:
    broker, port = start(workers)
    client_id = client_id_on(1, "wk-mqtt-session")
    raw = connect_through(broker, port, 0, client_id, clean=False)
    raw.send(p.Subscribe(1, [p.Subscription("wk/session", 1)]))
    assert isinstance(raw.recv(), p.Suback)
    raw.send(p.Disconnect())
    raw.close()
    # its queue is owned by worker 1 (its store's own; worker 0's names the owner)
    qos1 = queue_names(client_id)[1]
    assert stored_owner(broker, 1, qos1) == [None]
    assert stored_owner(broker, 0, qos1) == [1]
    publisher = Paho(port, client_id_on(0, "wk-mqtt-session-pub"))
    publisher.publish("wk/session", b"while away", qos=1)
    publisher.close()
    again = connect_through(broker, port, 0, client_id, clean=False)
    assert again.connack.session_present
    message = again.recv(10)
    assert (message.topic, message.payload, message.qos) == ("wk/session", b"while away", 1)
    again.send(p.PubAck(p.PUBACK, message.packet_id))
    again.send(p.Disconnect())
    again.close()
    resumed = Paho(port, client_id, clean=False)  # lands anywhere, served by worker 1
    assert resumed.session_present
    assert mqtt_clients(broker, 1) == [client_id]
    resumed.close()


def test_retained_messages_reach_subscribers_on_any_worker(workers, tmp_path: Path) -> None:
    broker, port = start(workers)
    for retainer, subscriber in ((1, 0), (0, 1)):
        topic = f"wk/retained/{retainer}"
        pub = Paho(port, client_id_on(retainer, f"wk-mqtt-retainer-{retainer}"))
        pub.publish(topic, f"from {retainer}".encode(), qos=1, retain=True)
        pub.close()
        sub = Paho(port, client_id_on(subscriber, f"wk-mqtt-ret-sub-{subscriber}"))
        sub.subscribe(topic, 1)
        wait_for(lambda s=sub: s.messages, 10)
        got = [(m.topic, m.payload, m.retain) for m in sub.messages]
        assert got == [(topic, f"from {retainer}".encode(), True)]
        sub.close()


def test_a_port_taken_stops_the_broker_before_it_starts(workers) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        broker = workers(2, "--mqtt-port", str(taken))
        rc = broker.proc.wait(timeout=60)
    assert rc != 0
    assert "address already in use" in broker.text()
    assert "Leveret listening for AMQP" not in broker.text()


def test_a_persistent_session_survives_a_restart_of_its_worker(workers, tmp_path: Path) -> None:
    broker, port = start(workers)
    client_id = client_id_on(1, "wk-mqtt-kill")
    raw = connect_through(broker, port, 0, client_id, clean=False)
    raw.send(p.Subscribe(1, [p.Subscription("wk/kill", 1)]))
    assert isinstance(raw.recv(), p.Suback)
    raw.send(p.Disconnect())
    raw.close()
    publisher = Paho(port, client_id_on(0, "wk-mqtt-kill-pub"))
    publisher.publish("wk/kill", b"stored", qos=1)
    publisher.close()
    kill_and_wait(broker, 1)
    again = Paho(port, client_id, clean=False)
    assert again.session_present
    wait_for(lambda: again.messages, 10)
    assert [(m.topic, m.payload, m.qos) for m in again.messages] == [("wk/kill", b"stored", 1)]
    assert mqtt_clients(broker, 1) == [client_id]
    again.close()


def test_retained_messages_survive_a_restart_of_worker_0(workers, tmp_path: Path) -> None:
    broker, port = start(workers)
    pub = Paho(port, client_id_on(1, "wk-mqtt-ret-kill-pub"))
    pub.publish("wk/ret-kill", b"kept by worker 0", qos=1, retain=True)
    pub.close()
    kill_and_wait(broker, 0)
    sub = Paho(port, client_id_on(1, "wk-mqtt-ret-kill-sub"))
    sub.subscribe("wk/ret-kill", 1)
    wait_for(lambda: sub.messages, 10)
    got = [(m.topic, m.payload, m.retain) for m in sub.messages]
    assert got == [("wk/ret-kill", b"kept by worker 0", True)]
    sub.close()
