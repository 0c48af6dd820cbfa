"""One broker from outside: worker 0's management API, Prometheus endpoint and ctl
socket show the queues, connections, channels and consumers of every worker
(leveret.management.workers), with real clients on each worker's port."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import requests
from tests.workers.inprocess import InProcessWorkers, in_process_workers

from leveret import ctl
from leveret.broker.queues.remote import RemoteQueue
from leveret.server.ctl_socket import SOCKET_NAME
from leveret.workers.mesh import placement

AUTH = ("guest", "guest")
HTTP_ON_0 = {0: {"management_port": 0, "prometheus_port": 0}}


def _name_on(worker: int, prefix: str) -> str:
    """A queue name that worker `worker` owns in a broker of two."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if placement("/", name, 2) == worker:
            return name
    raise AssertionError("no name found")


def _placeholder(w: InProcessWorkers, name: str, owner: int = 1) -> None:
    """Worker 0's RemoteQueue for a queue `owner` holds, unless metadata replication
    already made it."""

    def place() -> None:
        vhost = w.nodes[0].broker.vhosts["/"]
        if name in vhost.queues:
            return
        real = w.nodes[owner].broker.vhosts["/"].queues[name]
        vhost.queues[name] = RemoteQueue(
            vhost,
            name,
            owner,
            real.durable,
            None,
            real.auto_delete,
            dict(real.arguments),
            getattr(real, "options", None),
        )

    w.call(place)


def _api(w: InProcessWorkers, path: str) -> str:
    node = w.nodes[0]
    assert node.management is not None
    return f"http://127.0.0.1:{node.management.port}/api/{path}"


def _get(w: InProcessWorkers, path: str) -> Any:
    response = requests.get(_api(w, path), auth=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _until(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll until `what()` is truthy (a report is at most a second old)."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout} s: {what}")
        time.sleep(0.1)


def _connect(w: InProcessWorkers, worker: int, name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(w.url(worker))
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def test_worker_0_shows_every_workers_queues_connections_and_metrics(tmp_path: Path) -> None:
    with in_process_workers(2, tmp_path, per_worker=HTTP_ON_0) as w:
        full = _name_on(1, "wk-stats-full")
        consumed = _name_on(1, "wk-stats-consumed")
        local = _name_on(0, "wk-stats-local")
        on_1 = _connect(w, 1, "wk-stats-on-1")
        on_0 = _connect(w, 0, "wk-stats-on-0")
        try:
            ch1 = on_1.channel()
            ch1.queue_declare(full)
            ch1.queue_declare(consumed)
            for i in range(3):
                ch1.basic_publish("", full, f"m{i}".encode())
            ch1.basic_consume(consumed, lambda *a: None, consumer_tag="wk-stats-tag")
            on_1.process_data_events(0.1)
            on_0.channel().queue_declare(local)
            _placeholder(w, full)
            _placeholder(w, consumed)

            # The owner's figures, fields and `worker`, on worker 0's API.
            doc = _until(lambda: (d := _get(w, f"queues/%2F/{full}"))["messages"] == 3 and d)
            assert doc["worker"] == 1
            assert doc["messages_ready"] == 3
            assert doc["messages_unacknowledged"] == 0
            assert doc["message_bytes"] == 6
            assert doc["state"] == "running"
            assert doc["type"] == "classic"
            assert doc["consumer_details"] == []
            listed = {q["name"]: q for q in _get(w, "queues")}
            assert listed[full]["worker"] == 1 and listed[full]["messages"] == 3
            assert "consumer_details" not in listed[full]
            assert listed[consumed]["worker"] == 1 and listed[consumed]["consumers"] == 1
            assert listed[local]["worker"] == 0 and listed[local]["messages"] == 0
            basics = {q["name"]: q for q in _get(w, "queues?disable_stats=true")}
            assert basics[full] == {**basics[full], "worker": 1, "state": "live"}

            # Connections, channels and consumers of worker 1, listed on worker 0.
            conns = {c.get("user_provided_name"): c for c in _get(w, "connections")}
            assert conns["wk-stats-on-1"]["worker"] == 1
            assert conns["wk-stats-on-0"]["worker"] == 0
            assert conns["wk-stats-on-1"]["channels"] == 1
            remote_name = conns["wk-stats-on-1"]["name"]
            quoted = urllib.parse.quote(remote_name, safe="")
            single = _get(w, f"connections/{quoted}")
            assert single["worker"] == 1 and single["ssl_protocol"] == ""
            channels = [
                c for c in _get(w, "channels") if c["connection_details"]["name"] == remote_name
            ]
            assert len(channels) == 1 and channels[0]["consumer_count"] == 1
            consumers = [c for c in _get(w, "consumers") if c["consumer_tag"] == "wk-stats-tag"]
            assert len(consumers) == 1
            assert consumers[0]["queue"] == {"name": consumed, "vhost": "/"}

            details = _get(w, f"queues/%2F/{consumed}")["consumer_details"]
            assert [c["consumer_tag"] for c in details] == ["wk-stats-tag"]
            assert details[0]["channel_details"]["connection_name"] == remote_name

            overview = _get(w, "overview")
            assert overview["object_totals"]["connections"] == 2
            assert overview["object_totals"]["queues"] == 3
            assert overview["object_totals"]["consumers"] == 1
            assert overview["queue_totals"]["messages"] == 3
            assert overview["message_stats"]["publish"] == 3

            vhost = _get(w, "vhosts/%2F")
            assert vhost["messages_ready"] == 3 and vhost["messages"] == 3

            # Prometheus: the remote queue's own numbers, and every worker's objects.
            port = w.nodes[0].prometheus.port  # type: ignore[union-attr]
            text = requests.get(f"http://127.0.0.1:{port}/metrics/per-object", timeout=10).text
            assert f'rabbitmq_queue_messages_ready{{queue="{full}",vhost="/"}} 3.0' in text
            assert f'rabbitmq_queue_consumers{{queue="{consumed}",vhost="/"}} 1.0' in text
            assert "rabbitmq_connections 2.0" in text
            assert "rabbitmq_channels 2.0" in text
            totals = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            assert "rabbitmq_queue_messages_ready 3.0" in totals
            assert 'rabbitmq_global_messages_received_total{protocol="amqp091"} 3.0' in totals

            detailed = requests.get(
                f"http://127.0.0.1:{port}/metrics/detailed",
                params={"family": "queue_coarse_metrics", "vhost": "/"},
                timeout=10,
            ).text
            assert (
                f'rabbitmq_detailed_queue_messages_ready{{queue="{full}",vhost="/"}} 3.0'
                in detailed
            )
            assert _get(w, "nodes")[0]["sockets_used"] == 2  # one client on each worker

            # leveret ctl on worker 0's socket lists the owner's counts and connections.
            sock = os.path.join(tmp_path, "worker-0", SOCKET_NAME)
            rows = {r["name"]: r for r in ctl.call(sock, "list_queues", {})}
            assert rows[full]["messages"] == 3 and rows[consumed]["consumers"] == 1
            names = {
                (r["connection_name"], r["worker"]) for r in ctl.call(sock, "list_connections", {})
            }
            assert names == {("wk-stats-on-1", 1), ("wk-stats-on-0", 0)}

            # Messages got and purged through worker 0's API, on the owner.
            got = requests.post(
                _api(w, f"queues/%2F/{full}/get"),
                json={"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"},
                auth=AUTH,
                timeout=10,
            )
            assert got.status_code == 200, got.text
            assert [(m["payload"], m["message_count"]) for m in got.json()] == [
                ("m0", 2),
                ("m1", 1),
            ]
            got = requests.post(
                _api(w, f"queues/%2F/{full}/get"),
                json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
                auth=AUTH,
                timeout=10,
            )
            assert [(m["payload"], m["redelivered"]) for m in got.json()] == [("m0", True)]
            _until(lambda: _get(w, f"queues/%2F/{full}")["messages"] == 2)
            purged = requests.delete(_api(w, f"queues/%2F/{full}/contents"), auth=AUTH, timeout=10)
            assert purged.status_code == 204
            _until(lambda: _get(w, f"queues/%2F/{full}")["messages"] == 0)
            owner_vhost = w.nodes[1].broker.vhosts["/"]
            assert w.call(lambda: owner_vhost.queues[full].message_count) == 0
            # a placeholder whose queue its owner no longer has
            w.call(lambda: owner_vhost.delete_queue(owner_vhost.queues[full]))
            gone = requests.post(
                _api(w, f"queues/%2F/{full}/get"),
                json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
                auth=AUTH,
                timeout=10,
            )
            assert gone.status_code == 404

            # Closed through worker 0's API, on worker 1.
            response = requests.delete(
                _api(w, f"connections/{quoted}"),
                auth=AUTH,
                headers={"X-Reason": "wk-stats"},
                timeout=10,
            )
            assert response.status_code == 204
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                for _ in range(100):
                    on_1.process_data_events(0.1)
            assert closed.value.reply_code == 320
            assert "wk-stats" in closed.value.reply_text
            _until(lambda: remote_name not in {c["name"] for c in _get(w, "connections")})
        finally:
            for conn in (on_1, on_0):
                if conn.is_open:
                    conn.close()


def test_a_queue_whose_worker_is_down_shows_its_definition(tmp_path: Path) -> None:
    with in_process_workers(2, tmp_path, per_worker=HTTP_ON_0) as w:
        name = _name_on(1, "wk-stats-down")
        conn = _connect(w, 1, "wk-stats-down")
        try:
            conn.channel().queue_declare(name, durable=True)
        finally:
            conn.close()
        _placeholder(w, name)
        _until(lambda: _get(w, f"queues/%2F/{name}").get("messages") == 0)
        assert name in {q["name"] for q in _get(w, "definitions")["queues"]}
        w.call(w.meshes[0].links[1].close)
        doc = _until(lambda: (d := _get(w, f"queues/%2F/{name}"))["state"] == "down" and d)
        assert doc == {
            "arguments": {},
            "auto_delete": False,
            "durable": True,
            "exclusive": False,
            "name": name,
            "node": doc["node"],
            "type": "classic",
            "vhost": "/",
            "state": "down",
            "worker": 1,
        }
        assert json.loads(json.dumps(_get(w, "overview")))["object_totals"]["queues"] == 1


def test_the_web_ui_shows_each_queue_and_connection_s_worker(tmp_path: Path) -> None:
    from playwright.sync_api import expect
    from tests.browser import chromium

    with in_process_workers(2, None, per_worker=HTTP_ON_0) as w, chromium() as browser:
        name = _name_on(1, "wk-stats-ui")
        conn = _connect(w, 1, "wk-stats-ui")
        try:
            conn.channel().queue_declare(name)
            _placeholder(w, name)
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{w.nodes[0].management.port}/")  # type: ignore[union-attr]
            page.fill("input[name=username]", "guest")
            page.fill("input[name=password]", "guest")
            page.click("#login-form button[type=submit]")
            page.click("#nav >> text=Queues")
            expect(page.locator("#list th[data-key=worker]")).to_be_visible()
            cells = page.locator("#list tbody tr", has_text=name).locator("td")
            expect(cells.last).to_have_text("1")
            page.click("#nav >> text=Connections")
            expect(page.locator("#list th[data-key=worker]")).to_be_visible()
            # the worker is the last column before the close button
            cells = page.locator("#list tbody tr").first.locator("td")
            expect(cells.nth(-2)).to_have_text("1")
            assert errors == []
        finally:
            conn.close()


def test_a_delayed_exchange_counts_what_every_worker_holds_back(tmp_path: Path) -> None:
    """Each worker delays what its own clients publish; worker 0's API adds them up."""
    with in_process_workers(2, tmp_path, per_worker=HTTP_ON_0) as w:
        on_0 = _connect(w, 0, "wk-delayed-on-0")
        on_1 = _connect(w, 1, "wk-delayed-on-1")
        try:
            ch0, ch1 = on_0.channel(), on_1.channel()
            ch0.exchange_declare(
                "wk-delayed-x", "x-delayed-message", arguments={"x-delayed-type": "direct"}
            )
            ch0.confirm_delivery()
            ch1.confirm_delivery()
            held = pika.BasicProperties(headers={"x-delay": 600_000})
            ch0.basic_publish("wk-delayed-x", "k", b"a", held)
            for body in (b"b", b"c"):
                ch1.basic_publish("wk-delayed-x", "k", body, held)
            doc = _get(w, "exchanges/%2F/wk-delayed-x")
            assert doc["messages_delayed"] == 3
        finally:
            on_0.close()
            on_1.close()


def test_an_exchange_counts_what_every_worker_routed(tmp_path: Path) -> None:
    """Each worker routes (and counts) what its own clients publish; worker 0's API
    shows an exchange's message_stats summed over the workers, in a single GET and in
    the listings, as the vhost's message_stats are."""
    with in_process_workers(2, tmp_path, per_worker=HTTP_ON_0) as w:
        on_0 = _connect(w, 0, "wk-xstats-on-0")
        on_1 = _connect(w, 1, "wk-xstats-on-1")
        try:
            ch0, ch1 = on_0.channel(), on_1.channel()
            ch0.exchange_declare("wk-xstats-x", "fanout")
            ch0.confirm_delivery()
            ch1.confirm_delivery()
            ch0.basic_publish("wk-xstats-x", "", b"a")
            for body in (b"b", b"c"):
                ch1.basic_publish("wk-xstats-x", "", body)
            own = w.call(lambda: w.nodes[0].broker.vhosts["/"].exchanges["wk-xstats-x"].stats)
            assert own.publish_in == 1  # worker 0 counted only its own client's

            def publish_in(doc: dict[str, Any]) -> Any:
                return doc.get("message_stats", {}).get("publish_in")

            def counted() -> dict[str, Any] | None:
                doc = _get(w, "exchanges/%2F/wk-xstats-x")
                return doc if publish_in(doc) == 3 else None

            doc = _until(counted)
            # nothing bound: routed nowhere on either worker
            assert doc["message_stats"]["publish_out"] == 0
            assert "rate" in doc["message_stats"]["publish_in_details"]
            for path in ("exchanges", "exchanges/%2F"):
                listed = {x["name"]: x for x in _get(w, path)}
                assert publish_in(listed["wk-xstats-x"]) == 3
        finally:
            on_0.close()
            on_1.close()


def test_a_vhost_counts_the_bytes_of_every_workers_clients(tmp_path: Path) -> None:
    """A vhost whose only client is on worker 1 shows that client's bytes on worker
    0's API (RabbitMQ shows a vhost's recv_oct/send_oct once it has had connections)."""
    with in_process_workers(2, tmp_path, per_worker=HTTP_ON_0) as w:
        own = w.call(lambda: [c for c in w.nodes[0].broker.connections if c.vhost is not None])
        assert own == []
        on_1 = _connect(w, 1, "wk-octets-on-1")
        try:
            ch = on_1.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.fanout", "", b"x" * 1000)
            remote = w.call(lambda: [c.recv_oct for c in w.nodes[1].broker.connections])
            assert remote and max(remote) > 1000

            def counted() -> dict[str, Any] | None:
                doc = _get(w, "vhosts/%2F")
                return doc if doc.get("recv_oct", 0) > 1000 else None

            doc = _until(counted)
            assert doc["send_oct"] > 0
            assert "rate" in doc["recv_oct_details"] and "rate" in doc["send_oct_details"]
            listed = {v["name"]: v for v in _get(w, "vhosts")}
            assert listed["/"]["recv_oct"] > 1000
        finally:
            on_1.close()
