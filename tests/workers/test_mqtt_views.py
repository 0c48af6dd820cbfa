"""MQTT (and AMQP) connections of worker 1 seen from outside a `leveret server --workers
2`: worker 0's management API, Prometheus and every worker's `leveret ctl` socket show
and close them as a one-process broker shows and closes its own.

Each MQTT client has a client id of worker 1, so worker 1 serves it whichever worker
the kernel gave its socket (docs/workers.md, MQTT). The same client ids connect to a
one-process broker, and what the same request answers about them is compared field
by field: only the fields of the socket (its ports, so its name), the byte and
packet counts, the connection time and the `worker` field may differ.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
import requests

from clienthelp import free_port
from leveret.config import ServerConfig
from leveret.ctl import call
from leveret.server.ctl_socket import run_operation
from leveret.testing import embedded_broker
from workers.procs import Workers, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414
from workers.test_mqtt_workers import client_id_on

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

AUTH = ("guest", "guest")
#: the fields of a connection that depend on its socket, its traffic and its time
VARYING = {"name", "port", "peer_port", "connected_at", "recv_oct", "send_oct", "recv_cnt"}
VARYING |= {"send_cnt", "worker"}
V311 = client_id_on(1, "wk-mqttviews-311")
V5 = client_id_on(1, "wk-mqttviews-5")
ON_0 = client_id_on(0, "wk-mqttviews-on0")
TOPIC = "wk/mqttviews"


class Broker:
    """One broker's ports, and requests to its management API and Prometheus."""

    def __init__(self, mqtt_port: int, api_port: int, metrics_port: int, amqp_port: int) -> None:
        self.mqtt_port = mqtt_port
        self.api = f"http://127.0.0.1:{api_port}/api"
        self.metrics = f"http://127.0.0.1:{metrics_port}/metrics/per-object"
        self.amqp_port = amqp_port
        self.embedded: Any = None  # the one-process broker (leveret.testing)

    def get(self, path: str) -> Any:
        response = requests.get(f"{self.api}{path}", auth=AUTH, timeout=30)
        assert response.status_code == 200, (path, response.text)
        return response.json()

    def status(self, method: str, path: str) -> int:
        return requests.request(method, f"{self.api}{path}", auth=AUTH, timeout=30).status_code

    def connection(self, client_id: str) -> dict[str, Any] | None:
        """The listed connection of MQTT client `client_id`, if listed."""
        found = [
            c
            for c in self.get("/connections")
            if c.get("variable_map", {}).get("client_id") == client_id
        ]
        assert len(found) <= 1, found
        return found[0] if found else None

    def listed(self, client_id: str) -> dict[str, Any]:
        return wait_for(lambda: self.connection(client_id), 30)

    def scrape(self, name: str) -> dict[str, float]:
        """Prometheus' per-object samples of connection `name` (their label is RabbitMQ
        3.10's `channel="<connection name>"`)."""
        text = requests.get(self.metrics, timeout=30).text
        label = f'{{channel="{name}"}}'
        out = {}
        for line in text.splitlines():
            if label in line and not line.startswith("#"):
                out[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
        return out

    def gauge(self, family: str) -> float:
        """A sample without labels of the per-object scrape."""
        text = requests.get(self.metrics, timeout=30).text
        [value] = [
            line.split(" ")[1] for line in text.splitlines() if line.startswith(family + " ")
        ]
        return float(value)


class Client:
    """A paho-mqtt client (3.1.1 or 5) in its loop thread, subscribed to TOPIC; what
    it heard when the server closed it."""

    def __init__(self, port: int, client_id: str, version: int) -> None:
        self.gone = threading.Event()
        self.reason: Any = None
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version
        )
        self.client.username_pw_set(*AUTH)
        self.client.reconnect_delay_set(60, 120)  # not back within the test
        connected = threading.Event()
        self.client.on_connect = lambda *_a: connected.set()
        self.client.on_disconnect = self._on_disconnect
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        assert connected.wait(10)
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_a: subscribed.set()
        self.client.subscribe(TOPIC, 1)
        assert subscribed.wait(10)

    def _on_disconnect(self, _c, _u, _flags, reason, _props) -> None:
        self.reason = (reason.value, str(reason))
        self.gone.set()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="module")
def one_process() -> Iterator[Broker]:
    config = ServerConfig(
        port=0, persistence=False, management_port=0, prometheus_port=0, mqtt_port=0
    )
    with embedded_broker(config) as b:
        out = Broker(b.mqtt_port, b.server.management.port, b.server.prometheus.port, b.port)
        out.embedded = b
        yield out


def start(workers) -> tuple[Workers, Broker]:
    ports = [free_port() for _ in range(3)]
    broker = workers(
        2,
        *("--mqtt-port", str(ports[0]), "--management-port", str(ports[1])),
        *("--prometheus-port", str(ports[2])),
    ).wait_listening()
    out = Broker(*ports, broker.port)
    wait_for(lambda: out.get("/overview"), 30)
    return broker, out


def names(b: Broker) -> list[str]:
    return [c["name"] for c in b.get("/connections")]


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VARYING}


def views(b: Broker, client_id: str) -> dict[str, Any]:
    """What the API shows about MQTT client `client_id`'s connection, less VARYING."""
    listed = b.listed(client_id)
    name = quote(listed["name"], safe="")
    qos1 = f"mqtt-subscription-{client_id}qos1"
    queue = b.get(f"/queues/%2F/{qos1}")
    return {
        "listed": comparable(listed),
        "single": comparable(b.get(f"/connections/{name}")),
        "in vhost": [c["name"] for c in b.get("/vhosts/%2F/connections")].count(listed["name"]),
        "of user": [c["name"] for c in b.get("/connections/username/guest")].count(listed["name"]),
        "channels": b.get(f"/connections/{name}/channels"),
        "in /channels": [
            ch for ch in b.get("/channels") if ch["connection_details"]["name"] == listed["name"]
        ],
        "consumers": [
            c
            for c in b.get("/consumers")
            if c["channel_details"]["connection_name"] == listed["name"]
        ],
        "queue consumers": (queue["consumers"], queue["consumer_details"]),
        "metrics": sorted(wait_for(lambda: b.scrape(listed["name"]), 30)),
    }


def test_mqtt_connections_of_worker_1_through_worker_0_as_at_one_process(
    workers, one_process: Broker
) -> None:
    broker, w = start(workers)
    versions = {V311: mqtt.MQTTv311, V5: mqtt.MQTTv5}
    clients = {cid: Client(w.mqtt_port, cid, v) for cid, v in versions.items()}
    alone = {cid: Client(one_process.mqtt_port, cid, v) for cid, v in versions.items()}
    try:
        for cid in versions:
            mine, theirs = views(w, cid), views(one_process, cid)
            assert mine == theirs, cid
            doc = w.listed(cid)
            assert doc["worker"] == 1
            assert set(doc) - {"worker"} == set(one_process.listed(cid))
        # the broker's totals count them as one process counts its own
        for b in (w, one_process):
            assert b.get("/overview")["object_totals"]["connections"] == 2
            assert b.gauge("rabbitmq_connections") == 2
        assert w.listed(V311)["protocol"] == "MQTT 3.1.1"
        assert w.listed(V5)["protocol"] == "MQTT 5-0"

        # DELETE through worker 0 closes it on worker 1, as one process closes its own
        for cid in versions:
            for b, held in ((w, clients), (one_process, alone)):
                listed = b.listed(cid)["name"]
                name = quote(listed, safe="")
                assert b.status("DELETE", f"/connections/{name}") == 204
                assert held[cid].gone.wait(10), cid
                wait_for(lambda b=b, old=listed: old not in names(b), 30)
                assert b.status("GET", f"/connections/{name}") == 404
            assert clients[cid].reason == alone[cid].reason, cid
        assert clients[V5].reason[0] == 0x98  # MQTT 5: administrative action
    finally:
        for c in (*clients.values(), *alone.values()):
            c.client.loop_stop()


def test_an_amqp_connection_of_worker_1_is_closed_through_worker_0(
    workers, one_process: Broker
) -> None:
    broker, w = start(workers)
    conn = broker.connect_to(1, "wk-mqttviews-amqp")
    alone = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", one_process.amqp_port, heartbeat=0)
    )
    texts = []
    for b, client in ((w, conn), (one_process, alone)):

        def amqp(b: Broker = b) -> list[str]:
            """the one open AMQP connection, once listed (worker 0 asks worker 1 at most
            once a second, and the tries of connect_to are closed)"""
            names = [c["name"] for c in b.get("/connections") if c["protocol"] == "AMQP 0-9-1"]
            return names if len(names) == 1 else []

        [name] = wait_for(amqp, 30)
        assert b.status("DELETE", f"/connections/{quote(name, safe='')}") == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(1000):
                client.process_data_events(0.01)
        texts.append((closed.value.reply_code, closed.value.reply_text))
        wait_for(lambda b=b, name=name: name not in [c["name"] for c in b.get("/connections")])
    assert texts[0] == texts[1]
    assert texts[0][0] == 320


def ctl(broker: Workers, worker: int, op: str) -> list[dict[str, Any]]:
    return call(str(broker.data / f"worker-{worker}" / "ctl.sock"), op, {})


def test_every_workers_socket_lists_every_workers_connections(workers, one_process: Broker) -> None:
    broker, w = start(workers)
    amqp = broker.connect_to(1, "wk-mqttviews-ctl")
    clients = [Client(w.mqtt_port, cid, mqtt.MQTTv311) for cid in (V311, ON_0)]
    alone = Client(one_process.mqtt_port, V311, mqtt.MQTTv311)
    try:
        # the same rows through either worker's socket, each with its worker
        for op in ("list_connections", "list_mqtt_connections"):

            def same(op: str = op) -> list[dict[str, Any]] | None:
                """the same rows through both sockets, every client listed"""
                rows = ctl(broker, 0, op)
                return (
                    rows
                    if len(rows) == 3 - (op != "list_connections") and rows == ctl(broker, 1, op)
                    else None
                )

            rows = wait_for(same, 30)
            if op == "list_connections":
                amqp_rows = [r for r in rows if r["connection_name"].startswith("wk-mqttviews")]
                assert [r["worker"] for r in amqp_rows] == [1]
        mqtt_rows = {r["client_id"]: r for r in ctl(broker, 0, "list_mqtt_connections")}
        assert {cid: r["worker"] for cid, r in mqtt_rows.items()} == {V311: 1, ON_0: 0}
        # what a one-process broker's socket answers (its ctl operation, on its loop)
        [theirs] = one_process.embedded.call(
            lambda: run_operation(one_process.embedded.server.broker, "list_mqtt_connections", {})
        )
        mine = {k: v for k, v in mqtt_rows[V311].items() if k not in ("worker", "conn_name")}
        assert mine == {k: v for k, v in theirs.items() if k != "conn_name"}

        # DELETE /api/connections/username/guest through worker 0: every worker's, MQTT
        # and AMQP
        assert w.status("DELETE", "/connections/username/guest") == 204
        for c in clients:
            assert c.gone.wait(10)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="320"):
            for _ in range(1000):
                amqp.process_data_events(0.01)
        wait_for(lambda: not ctl(broker, 1, "list_connections"), 30)  # none left anywhere
    finally:
        if amqp.is_open:
            amqp.close()
        for c in (*clients, alone):
            c.close()
