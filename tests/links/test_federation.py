"""Federation between Leveret brokers: exchanges, queues, upstream sets, max-hops.

The upstream and downstream are in-process brokers. RabbitMQ on either side is
in test_with_rabbitmq.py; the status fields' shapes are compared with
RabbitMQ's in tests/compat/plugins.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

from links_support import api, count, drain, leveret, wait_for

from leveret.client.blocking import connect


def upstream(base: str, name: str, value: dict) -> None:
    status, body = api(
        base, "PUT", f"/api/parameters/federation-upstream/%2F/{name}", {"value": value}
    )
    assert status in (201, 204), body


def policy(base: str, pattern: str, definition: dict, name: str = "fed") -> None:
    status, body = api(
        base, "PUT", f"/api/policies/%2F/{name}", {"pattern": pattern, "definition": definition}
    )
    assert status in (201, 204), body


def links(base: str) -> list[dict]:
    return api(base, "GET", "/api/federation-links")[1]


def wait_running(base: str, n: int = 1) -> list[dict]:
    return wait_for(
        lambda: (rows := links(base)) and sum(r["status"] == "running" for r in rows) >= n and rows,
        30,
        f"{n} running federation links (now {links(base)})",
    )


def declare(url: str, exchanges=(), queues=(), bindings=()) -> None:
    with connect(url) as conn:
        ch = conn.channel()
        for name, kind in exchanges:
            ch.declare_exchange(name, kind, durable=True)
        for name in queues:
            ch.declare_queue(name, durable=True)
        for queue, exchange, key in bindings:
            ch.bind_queue(queue, exchange, key)


def send(url: str, exchange: str, key: str, body: bytes, **props) -> None:
    with connect(url) as conn:
        conn.channel().publish(body, routing_key=key, exchange=exchange, **props)


def test_a_federated_exchange_follows_its_upstream_and_its_bindings():
    with leveret() as up, leveret() as down:
        declare(up.url, exchanges=[("orders", "topic")])
        declare(
            down.url,
            exchanges=[("orders", "topic")],
            queues=["eu"],
            bindings=[("eu", "orders", "eu.#")],
        )
        upstream(down.api, "origin", {"uri": up.url, "expires": 3_600_000, "message-ttl": 60000})
        policy(down.api, "^orders$", {"federation-upstream": "origin"})
        (row,) = wait_running(down.api)
        safe = up.url.replace("guest:guest@", "")
        assert row == {
            "node": "leveret@localhost",
            "exchange": "orders",
            "upstream_exchange": "orders",
            "type": "exchange",
            "vhost": "/",
            "upstream": "origin",
            "id": row["id"],
            "status": "running",
            "local_connection": row["local_connection"],
            "uri": safe,
            "timestamp": row["timestamp"],
        }
        name = f"federation: orders -> {down.server.broker.cluster_name}"
        status, queue = api(up.api, "GET", f"/api/queues/%2F/{name.replace(' ', '%20')}")
        assert status == 200
        assert queue["arguments"] == {
            "x-expires": 3_600_000,
            "x-message-ttl": 60000,
            "x-internal-purpose": "federation",
        }
        send(up.url, "orders", "eu.fr", b"bonjour", user_id="guest")
        send(up.url, "orders", "us.ny", b"hi")
        wait_for(lambda: count(down.url, "eu") == 1, what="the federated message")
        (message,) = drain(down.url, "eu", 1)
        assert message.body == b"bonjour" and message.routing_key == "eu.fr"
        assert message.properties.user_id is None  # trust-user-id is off
        assert message.headers["x-received-from"] == [
            {
                "uri": safe,
                "exchange": "orders",
                "redelivered": False,
                "cluster-name": up.server.broker.cluster_name,
                "vhost": "/",
            }
        ]
        # A new binding downstream is made upstream too; an unbinding is undone.
        declare(down.url, queues=["us"], bindings=[("us", "orders", "us.*")])
        wait_for(lambda: _upstream_keys(up) == {"eu.#", "us.*"}, what="the binding upstream")
        send(up.url, "orders", "us.ny", b"hello")
        wait_for(lambda: count(down.url, "us") == 1, what="a message for the new binding")
        with connect(down.url) as conn:
            conn.channel().unbind_queue("us", "orders", "us.*")
        wait_for(lambda: _upstream_keys(up) == {"eu.#"}, what="the unbinding upstream")
        # The policy goes: the link goes and cleans up its upstream queue.
        assert api(down.api, "DELETE", "/api/policies/%2F/fed")[0] == 204
        wait_for(lambda: links(down.api) == [], what="the link to go")
        wait_for(
            lambda: api(up.api, "GET", f"/api/queues/%2F/{name.replace(' ', '%20')}")[0] == 404,
            what="the upstream queue to be deleted",
        )


def _upstream_keys(broker) -> set[str]:
    rows = api(broker.api, "GET", "/api/bindings/%2F")[1]
    return {b["routing_key"] for b in rows if b["source"] == "orders"}


def test_max_hops_stops_a_loop_between_two_brokers_federating_each_other():
    with leveret() as a, leveret() as b:
        for me, other in ((a, b), (b, a)):
            declare(
                me.url,
                exchanges=[("ring", "fanout")],
                queues=["seen"],
                bindings=[("seen", "ring", "")],
            )
            upstream(me.api, "peer", {"uri": other.url})
            policy(me.api, "^ring$", {"federation-upstream-set": "all"})
        wait_running(a.api)
        wait_running(b.api)
        send(a.url, "ring", "", b"once")
        wait_for(lambda: count(b.url, "seen") == 1, what="the message on b")
        time.sleep(0.5)
        assert count(a.url, "seen") == 1  # not a second time from b
        assert count(b.url, "seen") == 1


def test_bindings_and_messages_cross_two_hops_with_max_hops_2():
    with leveret() as a, leveret() as b, leveret() as c:
        for broker in (a, b, c):
            declare(broker.url, exchanges=[("x", "direct")])
        declare(c.url, queues=["end"], bindings=[("end", "x", "k")])
        upstream(b.api, "a", {"uri": a.url, "max-hops": 2})
        policy(b.api, "^x$", {"federation-upstream": "a"})
        upstream(c.api, "b", {"uri": b.url, "max-hops": 2})
        policy(c.api, "^x$", {"federation-upstream": "b"})
        wait_running(b.api)
        wait_running(c.api)
        # c's binding went to b with hops 2, and from b on to a with hops 1.
        wait_for(
            lambda: any(
                r["source"] == "x" and r["routing_key"] == "k"
                for r in api(a.api, "GET", "/api/bindings/%2F")[1]
            ),
            what="the binding to reach a",
        )
        send(a.url, "x", "k", b"far")
        wait_for(lambda: count(c.url, "end") == 1, what="the message two hops away")
        (message,) = drain(c.url, "end", 1)
        assert [h["exchange"] for h in message.headers["x-received-from"]] == ["x", "x"]


def test_an_upstream_set_with_overrides_and_a_renamed_upstream_exchange():
    with leveret() as up, leveret() as down:
        declare(up.url, exchanges=[("source-x", "fanout")])
        declare(
            down.url,
            exchanges=[("local-x", "fanout")],
            queues=["sink"],
            bindings=[("sink", "local-x", "")],
        )
        upstream(down.api, "u", {"uri": up.url, "exchange": "nope"})  # overridden by the set
        status, _ = api(
            down.api,
            "PUT",
            "/api/parameters/federation-upstream-set/%2F/s",
            {"value": [{"upstream": "u", "exchange": "source-x"}, {"upstream": "missing"}]},
        )
        assert status == 201
        policy(down.api, "^local-x$", {"federation-upstream-set": "s"})
        (row,) = wait_running(down.api)
        assert row["upstream_exchange"] == "source-x"
        send(up.url, "source-x", "", b"renamed")
        wait_for(lambda: count(down.url, "sink") == 1, what="the message")


def test_a_federated_queue_fetches_only_while_it_has_consumers_and_nothing_of_its_own():
    with leveret() as up, leveret() as down:
        declare(up.url, queues=["jobs"])
        with connect(up.url) as conn:
            ch = conn.channel()
            for i in range(20):
                ch.publish(b"j%d" % i, routing_key="jobs")
        upstream(down.api, "up", {"uri": up.url, "prefetch-count": 5})
        policy(down.api, "^jobs$", {"federation-upstream": "up"})
        declare(down.url, queues=["jobs"])
        (row,) = wait_running(down.api)
        assert (row["queue"], row["upstream_queue"], row["consumer_tag"]) == (
            "jobs",
            "jobs",
            "federation-link-up",
        )
        time.sleep(0.5)
        assert count(up.url, "jobs") == 20  # no consumer downstream: nothing fetched
        got = drain(down.url, "jobs", 20, timeout=10)
        assert sorted(m.body for m in got) == sorted(b"j%d" % i for i in range(20))
        assert got[0].headers["x-received-from"][0]["visit-count"] == 1
        assert count(up.url, "jobs") == 0
        # An upstream consumer comes first (the link consumes at priority -1).
        status, queue = api(up.api, "GET", "/api/queues/%2F/jobs")
        assert status == 200


def test_link_restart_and_upstream_removal():
    with leveret() as up, leveret() as down:
        declare(up.url, exchanges=[("e", "fanout")])
        declare(down.url, exchanges=[("e", "fanout")])
        upstream(down.api, "u", {"uri": up.url})
        policy(down.api, "^e$", {"federation-upstream": "u"})
        (row,) = wait_running(down.api)
        path = f"/api/federation-links/vhost/%2F/{row['id']}/leveret@localhost/restart"
        assert api(down.api, "DELETE", path)[0] == 204
        assert api(down.api, "DELETE", path.replace(row["id"], "00000000"))[0] == 404
        wait_running(down.api)
        assert api(down.api, "DELETE", "/api/parameters/federation-upstream/%2F/u")[0] == 204
        wait_for(lambda: links(down.api) == [], what="the link to go with its upstream")


def test_definitions_carry_upstreams_sets_and_shovels():
    with leveret() as a, leveret() as b:
        upstream(a.api, "u", {"uri": "amqp://h", "max-hops": 2})
        api(
            a.api,
            "PUT",
            "/api/parameters/federation-upstream-set/%2F/s",
            {"value": [{"upstream": "u"}]},
        )
        api(
            a.api,
            "PUT",
            "/api/parameters/shovel/%2F/sh",
            {
                "value": {
                    "src-uri": "amqp://",
                    "src-queue": "q",
                    "dest-uri": "amqp://",
                    "dest-queue": "r",
                }
            },
        )
        status, doc = api(a.api, "GET", "/api/definitions")
        params = sorted((p["component"], p["name"]) for p in doc["parameters"])
        assert params == [
            ("federation-upstream", "u"),
            ("federation-upstream-set", "s"),
            ("shovel", "sh"),
        ]
        assert api(b.api, "POST", "/api/definitions", doc)[0] in (200, 201, 204)
        got = api(b.api, "GET", "/api/parameters")[1]
        assert sorted((p["component"], p["name"], str(p["value"])) for p in got) == sorted(
            (p["component"], p["name"], str(p["value"])) for p in doc["parameters"]
        )
        bad = dict(
            doc,
            parameters=[
                {"vhost": "/", "component": "shovel", "name": "x", "value": {"src-queue": "q"}}
            ],
        )
        status, body = api(b.api, "POST", "/api/definitions", bad)
        assert status == 400 and 'Key \\"src-uri\\" not found' not in body["reason"]
        assert 'Key "src-uri" not found in x' in body["reason"]


def _typed_binding(url: str, bind: bool, arguments: dict) -> None:
    """queue.bind (or unbind) of eu to orders with the arguments' own wire types (the
    blocking client would send 7 as a byte whatever its type)."""
    from pamqp import commands as C

    from compat.amqp.scenarios_argtypes import typed
    from rawamqp import RawClient

    raw = RawClient("127.0.0.1", urlparse(url).port, timeout=30)
    raw.handshake()
    raw.open_channel(1)
    cls, ok = (C.Queue.Bind, C.Queue.BindOk) if bind else (C.Queue.Unbind, C.Queue.UnbindOk)
    raw.send_method(1, typed(cls, queue="eu", exchange="orders", routing_key="eu.#",
                             arguments=arguments))  # fmt: skip
    raw.wait_for(ok, channel=1)
    raw.close()


def _upstream_eu_bindings(broker) -> int:
    rows = api(broker.api, "GET", "/api/bindings/%2F")[1]
    return sum(b["source"] == "orders" and b["routing_key"] == "eu.#" for b in rows)


def test_bindings_that_differ_only_in_an_integer_type_are_made_upstream_as_sent():
    """Local bindings whose arguments differ only in an integer's wire type are
    separate bindings. The link's client sends a signedint and a byte alike (the
    smallest type) and a long as a long: two upstream bindings, the byte one kept
    until both local bindings that make it go."""
    from leveret.protocol.fieldtable import Byte, Long, SignedInt

    with leveret() as up, leveret() as down:
        declare(up.url, exchanges=[("orders", "topic")])
        declare(down.url, exchanges=[("orders", "topic")], queues=["eu"])
        for n in (SignedInt(7), Byte(7), Long(7)):
            _typed_binding(down.url, True, {"n": n})
        upstream(down.api, "origin", {"uri": up.url})
        policy(down.api, "^orders$", {"federation-upstream": "origin"})
        wait_running(down.api)
        wait_for(lambda: _upstream_eu_bindings(up) == 2, what="the bindings upstream")
        _typed_binding(down.url, False, {"n": SignedInt(7)})
        # link changes are made in order: once a later binding is upstream, so is this
        declare(down.url, queues=["us"], bindings=[("us", "orders", "us.*")])
        wait_for(lambda: _upstream_keys(up) == {"eu.#", "us.*"}, what="the later binding")
        assert _upstream_eu_bindings(up) == 2
        _typed_binding(down.url, False, {"n": Byte(7)})
        wait_for(lambda: _upstream_eu_bindings(up) == 1, what="the byte binding to go")
        send(up.url, "orders", "eu.fr", b"still bound")
        wait_for(lambda: count(down.url, "eu") == 1, what="the message for the long binding")
        _typed_binding(down.url, False, {"n": Long(7)})
        wait_for(lambda: _upstream_keys(up) == {"us.*"}, what="the last unbinding upstream")
