"""Shovels and federation between Leveret and RabbitMQ, both ways.

- a Leveret shovel moves a RabbitMQ queue into Leveret;
- a Leveret federated exchange follows a RabbitMQ exchange;
- RabbitMQ's own shovel and federation plugins use Leveret as their remote side.

They need a RabbitMQ 3.10 with the shovel and federation plugins
(`../shared/tools/rabbitmq.sh start PORT`, then LEVERET_PLUGINS_RABBITMQ_PORT=PORT;
5673 by default) and skip without one, as in CI: the same behaviours are tested
Leveret to Leveret in test_shovels.py and test_federation.py.
"""

from __future__ import annotations

import uuid

import pytest
from links_support import (
    RABBITMQ_API,
    RABBITMQ_URL,
    api,
    count,
    drain,
    leveret,
    needs_rabbitmq,
    put_shovel,
    q,
    wait_for,
)

from leveret.client.blocking import connect

pytestmark = needs_rabbitmq


@pytest.fixture
def token():
    return uuid.uuid4().hex[:8]


@pytest.fixture
def rabbit_cleanup():
    """Paths to DELETE on RabbitMQ after the test."""
    paths: list[str] = []
    yield paths
    for path in reversed(paths):
        api(RABBITMQ_API, "DELETE", path)


def fill(url: str, queue: str, n: int, **props) -> None:
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        ch.publish_many(
            [b"m%05d" % i for i in range(n)], routing_key=queue, persistent=True, **props
        )


def test_a_leveret_shovel_moves_a_rabbitmq_queue_into_leveret(token, rabbit_cleanup):
    queue = f"lev-shovel-src-{token}"
    rabbit_cleanup.append(f"/api/queues/%2F/{queue}")
    fill(RABBITMQ_URL, queue, 5000, message_id="kept")
    with leveret() as b:
        put_shovel(
            b.api,
            "from-rabbit",
            {
                "src-uri": RABBITMQ_URL,
                "src-queue": queue,
                "dest-uri": "amqp://",
                "dest-queue": "moved",
                "dest-add-forward-headers": True,
            },
        )
        wait_for(lambda: count(b.url, "moved") == 5000, 60, "everything moved")
        wait_for(lambda: count(RABBITMQ_URL, queue) == 0, 30, "RabbitMQ's queue drained")
        messages = drain(b.url, "moved", 5000)
        assert [m.body for m in messages] == [b"m%05d" % i for i in range(5000)]
        assert messages[0].properties.message_id == "kept"
        entry = messages[0].headers["x-shovelled"][0]
        assert entry["src-uri"] == RABBITMQ_URL.replace("guest:guest@", "")


def test_a_leveret_federated_exchange_follows_a_rabbitmq_exchange(token, rabbit_cleanup):
    exchange = f"lev-fed-{token}"
    rabbit_cleanup.append(f"/api/exchanges/%2F/{exchange}")
    with connect(RABBITMQ_URL) as conn:
        conn.channel().declare_exchange(exchange, "topic", durable=True)
    with leveret() as b:
        cluster = b.server.broker.cluster_name
        rabbit_cleanup.append(f"/api/queues/%2F/{q(f'federation: {exchange} -> {cluster}')}")
        with connect(b.url) as conn:
            ch = conn.channel()
            ch.declare_exchange(exchange, "topic", durable=True)
            ch.declare_queue("here", durable=True)
            ch.bind_queue("here", exchange, "news.#")
        api(
            b.api,
            "PUT",
            "/api/parameters/federation-upstream/%2F/rabbit",
            {"value": {"uri": RABBITMQ_URL, "expires": 600000}},
        )
        api(
            b.api,
            "PUT",
            "/api/policies/%2F/fed",
            {"pattern": f"^{exchange}$", "definition": {"federation-upstream": "rabbit"}},
        )
        wait_for(
            lambda: any(
                r["status"] == "running" for r in api(b.api, "GET", "/api/federation-links")[1]
            ),
            30,
            "the link",
        )
        # RabbitMQ has the x-federation-upstream exchange type: the binding is made there.
        wait_for(
            lambda: any(
                x["name"].startswith(f"federation: {exchange} -> {cluster}")
                and x["type"] == "x-federation-upstream"
                for x in api(RABBITMQ_API, "GET", "/api/exchanges/%2F")[1]
            ),
            30,
            "the internal exchange on RabbitMQ",
        )
        with connect(RABBITMQ_URL) as conn:
            ch = conn.channel()
            ch.publish(b"from rabbit", routing_key="news.eu", exchange=exchange)
            ch.publish(b"not bound", routing_key="sport", exchange=exchange)
        wait_for(lambda: count(b.url, "here") == 1, 30, "the federated message")
        (message,) = drain(b.url, "here", 1)
        assert message.body == b"from rabbit"
        hop = message.headers["x-received-from"][0]
        assert hop["exchange"] == exchange and hop["vhost"] == "/"
        assert hop["cluster-name"] == api(RABBITMQ_API, "GET", "/api/overview")[1]["cluster_name"]
        api(b.api, "DELETE", "/api/policies/%2F/fed")
        wait_for(lambda: api(b.api, "GET", "/api/federation-links")[1] == [], 30, "link gone")


def test_rabbitmq_shovels_into_and_out_of_leveret(token, rabbit_cleanup):
    with leveret() as b:
        into, out_of = f"rabbit-to-lev-{token}", f"lev-to-rabbit-{token}"
        rabbit_cleanup += [
            f"/api/queues/%2F/{into}",
            f"/api/queues/%2F/{out_of}",
            f"/api/parameters/shovel/%2F/{into}",
            f"/api/parameters/shovel/%2F/{out_of}",
        ]
        fill(RABBITMQ_URL, into, 2000)
        fill(b.url, out_of, 2000)
        for name, src, dest in ((into, "amqp://", b.url), (out_of, b.url, "amqp://")):
            status, body = api(
                RABBITMQ_API,
                "PUT",
                f"/api/parameters/shovel/%2F/{name}",
                {
                    "value": {
                        "src-uri": src,
                        "src-queue": name,
                        "dest-uri": dest,
                        "dest-queue": name,
                        "dest-add-forward-headers": True,
                    }
                },
            )
            assert status == 201, body
        wait_for(lambda: count(b.url, into) == 2000, 60, "RabbitMQ's shovel into Leveret")
        wait_for(
            lambda: count(RABBITMQ_URL, out_of) == 2000, 60, "RabbitMQ's shovel out of Leveret"
        )
        assert count(RABBITMQ_URL, into) == 0 and count(b.url, out_of) == 0
        (first,) = drain(b.url, into, 1)
        assert first.headers["x-shovelled"][0]["shovel-name"] == into


def test_rabbitmq_federation_follows_a_leveret_exchange_and_queue(token, rabbit_cleanup):
    with leveret() as b:
        exchange, queue, up = f"lev-up-x-{token}", f"lev-up-q-{token}", f"leveret-{token}"
        sink = f"fed-sink-{token}"
        with connect(b.url) as conn:
            ch = conn.channel()
            ch.declare_exchange(exchange, "direct", durable=True)
            ch.declare_queue(queue, durable=True)
            for i in range(10):
                ch.publish(b"q%d" % i, routing_key=queue)
        with connect(RABBITMQ_URL) as conn:
            ch = conn.channel()
            ch.declare_exchange(exchange, "direct", durable=True)
            ch.declare_queue(sink, durable=True)
            ch.bind_queue(sink, exchange, "k")
            ch.declare_queue(queue, durable=True)
        rabbit_cleanup += [
            f"/api/exchanges/%2F/{exchange}",
            f"/api/queues/%2F/{sink}",
            f"/api/queues/%2F/{queue}",
            f"/api/parameters/federation-upstream/%2F/{up}",
            f"/api/policies/%2F/{up}",
        ]
        assert (
            api(
                RABBITMQ_API,
                "PUT",
                f"/api/parameters/federation-upstream/%2F/{up}",
                {"value": {"uri": b.url}},
            )[0]
            == 201
        )
        assert (
            api(
                RABBITMQ_API,
                "PUT",
                f"/api/policies/%2F/{up}",
                {"pattern": f"^lev-up-.-{token}$", "definition": {"federation-upstream": up}},
            )[0]
            == 201
        )

        def links_running() -> bool:
            rows = api(RABBITMQ_API, "GET", "/api/federation-links")[1]
            mine = [r for r in rows if r["upstream"] == up]
            return len(mine) == 2 and all(r["status"] == "running" for r in mine)

        wait_for(
            links_running,
            30,
            f"RabbitMQ's links to Leveret: {api(RABBITMQ_API, 'GET', '/api/federation-links')[1]}",
        )
        # RabbitMQ made its queue and x-federation-upstream exchange on Leveret.
        names = {x["name"]: x["type"] for x in api(b.api, "GET", "/api/exchanges/%2F")[1]}
        assert any(
            t == "x-federation-upstream"
            for n, t in names.items()
            if n.startswith(f"federation: {exchange} ->")
        )
        wait_for(
            lambda: any(
                r["source"] == exchange and r["routing_key"] == "k"
                for r in api(b.api, "GET", "/api/bindings/%2F")[1]
            ),
            30,
            "RabbitMQ's binding on Leveret",
        )
        with connect(b.url) as conn:
            conn.channel().publish(b"to rabbit", routing_key="k", exchange=exchange)
        wait_for(lambda: count(RABBITMQ_URL, sink) == 1, 30, "the message on RabbitMQ")
        # The federated queue fetches from Leveret's queue for a consumer on RabbitMQ.
        got = drain(RABBITMQ_URL, queue, 10, timeout=15)
        assert sorted(m.body for m in got) == sorted(b"q%d" % i for i in range(10))
        assert got[0].headers["x-received-from"][0]["queue"] == queue
