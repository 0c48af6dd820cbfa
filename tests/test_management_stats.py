"""Statistics, channels, consumers, nodes and listing parameters of the management API.

The same calls run against RabbitMQ 3.10 with LEVERET_TEST_URL set (its API on 15673).
RabbitMQ collects statistics every 5 seconds, so counts are awaited, never assumed.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pika
import pytest

from access_setup import unique
from test_management_api import api, call  # noqa: F401  (api is a fixture)


def eventually(fetch, check, timeout: float = 20.0):
    """Poll `fetch()` until `check(value)` holds; return the last value either way."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.25)


@pytest.fixture
def traffic(api):  # noqa: F811
    """A connection whose channel published 5 (confirmed), 1 unroutable with mandatory,
    consumed 3 with acks and got 1 without ack, on a fresh queue."""
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = unique("stats-q")
    channel.queue_declare(queue, auto_delete=False)
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    try:
        channel.basic_publish("", unique("nowhere"), b"lost", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    method, _props, _body = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    seen = []
    for method, _props, _body in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        channel.basic_ack(method.delivery_tag)
        seen.append(method)
        if len(seen) == 3:
            break
    channel.cancel()  # the generator's consumer; requeues what it still held
    channel.basic_qos(prefetch_count=11)
    channel.basic_consume(queue, lambda *a: None, consumer_tag=unique("ctag"))
    connection.process_data_events(0.2)
    yield connection, channel, queue
    channel.queue_delete(queue)
    connection.close()


def test_message_stats_of_queue_channel_and_overview(api, traffic):  # noqa: F811
    connection, channel, queue = traffic
    path = f"/queues/%2F/{quote(queue, safe='')}"

    def counted(q):
        stats = q[1].get("message_stats", {})
        return stats.get("ack") == 3 and stats.get("publish") == 5

    status, body = eventually(lambda: call(api, "GET", path), counted)
    assert status == 200
    stats = body["message_stats"]
    assert stats["publish"] == 5 and stats["ack"] == 3
    assert stats["get_no_ack"] == 1 and stats["deliver"] >= 3
    assert stats["deliver_get"] == stats["deliver"] + stats["get_no_ack"]
    assert isinstance(stats["publish_details"]["rate"], float)
    assert {"messages_details", "messages_ready_details"} <= set(body)

    def our_channel(result):
        want = {"ack": 3, "publish": 6, "confirm": 6}
        return [
            c
            for c in result[1]
            if want.items() <= c.get("message_stats", {}).items() and c["consumer_count"] == 1
        ]

    result = eventually(lambda: call(api, "GET", "/channels"), our_channel)
    mine = our_channel(result)
    assert len(mine) == 1, result
    ch = mine[0]
    assert ch["message_stats"]["publish"] == 6
    assert ch["message_stats"]["confirm"] == 6
    assert ch["message_stats"]["return_unroutable"] == 1
    assert ch["confirm"] is True and ch["transactional"] is False
    assert ch["prefetch_count"] == 11 and ch["consumer_count"] == 1
    assert ch["name"] == f"{ch['connection_details']['name']} ({ch['number']})"
    assert call(api, "GET", f"/channels/{quote(ch['name'], safe='')}")[1]["number"] == ch["number"]

    overview = call(api, "GET", "/overview")[1]
    assert overview["message_stats"]["publish"] >= 6
    assert overview["object_totals"]["channels"] >= 1


def test_consumers_listing(api, traffic):  # noqa: F811
    _connection, _channel, queue = traffic

    def ours(result):
        return [c for c in result[1] if c["queue"]["name"] == queue]

    status, _ = call(api, "GET", "/consumers")
    assert status == 200
    mine = ours(eventually(lambda: call(api, "GET", "/consumers/%2F"), ours))
    assert len(mine) == 1
    consumer = mine[0]
    assert consumer["ack_required"] is True and consumer["exclusive"] is False
    assert consumer["prefetch_count"] == 11
    assert consumer["queue"] == {"name": queue, "vhost": "/"}
    assert consumer["channel_details"]["connection_name"] in consumer["channel_details"]["name"]


def test_exchange_publish_in_and_out(api):  # noqa: F811
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    exchange, queue = unique("stats-x"), unique("stats-xq")
    channel.exchange_declare(exchange, "direct", auto_delete=False)
    channel.queue_declare(queue, auto_delete=False)
    channel.queue_bind(queue, exchange, "k")
    try:
        channel.confirm_delivery()
        for key in ("k", "k", "other"):
            channel.basic_publish(exchange, key, b"x")
        path = f"/exchanges/%2F/{quote(exchange, safe='')}"

        def counted(result):
            return result[1].get("message_stats", {}).get("publish_in") == 3

        body = eventually(lambda: call(api, "GET", path), counted)[1]
        assert body["message_stats"]["publish_in"] == 3
        assert body["message_stats"]["publish_out"] == 2
    finally:
        channel.exchange_delete(exchange)
        channel.queue_delete(queue)
        connection.close()


# --- listing parameters -----------------------------------------------------------------


@pytest.fixture
def three_queues(api):  # noqa: F811
    prefix = unique("lst")
    names = [f"{prefix}-a-one", f"{prefix}-a-two", f"{prefix}-b-three"]
    for name in names:
        assert call(api, "PUT", f"/queues/%2F/{name}", {"durable": False})[0] == 201
    yield prefix, names
    for name in names:
        call(api, "DELETE", f"/queues/%2F/{name}")


def test_pagination_name_filter_and_columns(api, three_queues):  # noqa: F811
    prefix, names = three_queues
    status, page = call(api, "GET", f"/queues?page=1&page_size=2&name={prefix}-A&columns=name")
    assert status == 200
    assert page["items"] == [{"name": names[0]}, {"name": names[1]}]
    assert page["filtered_count"] == 2 and page["item_count"] == 2
    assert page["page"] == 1 and page["page_count"] == 1 and page["page_size"] == 2
    assert page["total_count"] >= 3

    regex = quote(f"^{prefix}-.*e$")
    page = call(api, "GET", f"/queues?page=1&name={regex}&use_regex=true&columns=name")[1]
    assert [i["name"] for i in page["items"]] == [names[0], names[2]]

    # Without `page` the name filter is not applied (RabbitMQ's behaviour), columns are.
    listed = call(api, "GET", f"/queues/%2F?name={prefix}-b&columns=name,durable")[1]
    assert {"name": names[0], "durable": False} in listed
    assert all(set(item) <= {"name", "durable"} for item in listed)

    nested = call(api, "GET", f"/queues?page=1&name={prefix}-b&columns=name,arguments.x")[1]
    assert nested["items"] == [{"name": names[2], "arguments": {}}]


def test_sort_and_sort_reverse(api, three_queues):  # noqa: F811
    prefix, names = three_queues
    query = f"page=1&name={prefix}&columns=name&sort=name&sort_reverse=true"
    page = call(api, "GET", f"/queues?{query}")[1]
    assert [i["name"] for i in page["items"]] == list(reversed(names))


@pytest.mark.parametrize(
    "query, error, reason",
    [
        ("page=9&page_size=2", "page_out_of_range", "Page out of range, page: 9 page size: 2"),
        ("page=x", "bad_request", "Pagination parameters are invalid"),
        (
            "page=1&page_size=501",
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 1, page size 501",
        ),
        (
            "page=0",
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 0, page size undefined",
        ),
        ("page=1&name=%28&use_regex=true", "bad_request", "Pagination parameters are invalid"),
    ],
)
def test_bad_listing_parameters(api, three_queues, query, error, reason):  # noqa: F811
    prefix, _names = three_queues
    if query.startswith("page=9"):
        query += f"&name={prefix}"
    status, body = call(api, "GET", f"/queues?{query}")
    assert status == 400
    assert body["error"] == error
    assert body["reason"].startswith(reason)


# --- node, extensions, port listener -------------------------------------------------------


def test_nodes_and_extensions(api):  # noqa: F811
    status, nodes = call(api, "GET", "/nodes")
    assert status == 200 and len(nodes) == 1
    node = nodes[0]
    assert node["running"] is True and node["type"] == "disc"
    for key in ("mem_used", "mem_limit", "disk_free", "fd_used", "fd_total", "uptime"):
        assert isinstance(node[key], int) and node[key] >= 0, key
    assert node["mem_alarm"] is False and node["disk_free_alarm"] is False
    assert call(api, "GET", f"/nodes/{quote(node['name'], safe='')}")[1]["name"] == node["name"]
    # Leveret answers 404; RabbitMQ 3.10 answers an unknown node with a 500.
    assert call(api, "GET", "/nodes/nobody@nowhere")[0] in (404, 500)
    status, extensions = call(api, "GET", "/extensions")
    assert status == 200 and isinstance(extensions, list)


def test_port_listener_health_check(api):  # noqa: F811
    amqp_port = pika.URLParameters(api[1]).port
    assert call(api, "GET", f"/health/checks/port-listener/{amqp_port}") == (
        200,
        {"status": "ok", "port": amqp_port},
    )
    status, body = call(api, "GET", "/health/checks/port-listener/1")
    assert status == 503
    assert body["status"] == "failed" and body["reason"] == "No active listener"
    assert body["missing"] == 1 and amqp_port in body["ports"]
    assert call(api, "GET", "/health/checks/port-listener/abc") == (
        400,
        {"error": "bad_request", "reason": "Invalid port"},
    )


# --- Leveret's own guarantees: rates from the sampler, totals that never go back ------------


@pytest.mark.leveret_only
def test_rates_appear_while_publishing_and_totals_survive_closed_channels(api):  # noqa: F811
    vhost = unique("stats-v")
    assert call(api, "PUT", f"/vhosts/{vhost}", {})[0] == 201
    assert (
        call(
            api,
            "PUT",
            f"/permissions/{vhost}/guest",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )[0]
        == 204  # the creator of a vhost already has full permissions in it
    )
    try:
        params = pika.URLParameters(api[1])
        params.virtual_host = vhost
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.queue_declare("q")

        def publishing_rate():
            for _ in range(50):
                channel.basic_publish("", "q", b"x")
            connection.process_data_events(0.05)
            return call(api, "GET", f"/vhosts/{vhost}")[1]

        body = eventually(
            publishing_rate,
            lambda b: b.get("message_stats", {}).get("publish_details", {}).get("rate", 0) > 0,
        )
        assert body["message_stats"]["publish_details"]["rate"] > 0
        published = body["message_stats"]["publish"]
        assert published >= 50
        channel.close()
        connection.close()
        # The connection is gone; its counts stay in the vhost's and the overview's totals.
        after = eventually(
            lambda: call(api, "GET", f"/vhosts/{vhost}")[1],
            lambda b: b["message_stats"]["publish"] >= published,
        )
        assert after["message_stats"]["publish"] >= published
        assert call(api, "GET", "/overview")[1]["message_stats"]["publish"] >= published
    finally:
        call(api, "DELETE", f"/vhosts/{vhost}")


@pytest.mark.leveret_only
def test_stream_queues_show_their_offsets(api):  # noqa: F811
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    name = unique("stats-stream")
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    try:
        channel.confirm_delivery()
        for _ in range(3):
            channel.basic_publish("", name, b"e")
        body = call(api, "GET", f"/queues/%2F/{name}")[1]
        assert body["type"] == "stream"
        assert body["stream_first_offset"] == 0 and body["stream_next_offset"] == 3
    finally:
        channel.queue_delete(name)
        connection.close()


def test_persistent_messages_are_counted_until_they_leave(api):  # noqa: F811
    """messages_persistent and message_bytes_persistent: persistent messages of a
    durable queue, ready or unacknowledged; a transient queue counts none."""
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    channel.confirm_delivery()
    durable, transient = unique("persist-q"), unique("transient-q")
    channel.queue_declare(durable, durable=True)
    channel.queue_declare(transient, durable=False)
    persistent = pika.BasicProperties(delivery_mode=2)
    for queue in (durable, transient):
        channel.basic_publish("", queue, b"first", persistent)
        channel.basic_publish("", queue, b"plain")
        channel.basic_publish("", queue, b"second!", persistent)

    def counts(queue):
        body = call(api, "GET", f"/queues/%2F/{queue}")[1]
        return (
            body.get("messages"),
            body.get("messages_persistent"),
            body.get("message_bytes_persistent"),
        )

    try:
        assert eventually(lambda: counts(durable), lambda c, want=(3, 2, 12): c == want) == (
            3,
            2,
            12,
        )
        assert eventually(lambda: counts(transient), lambda c, want=(3, 0, 0): c == want) == (
            3,
            0,
            0,
        )
        method, _props, body = channel.basic_get(durable)  # unacknowledged: still counted
        assert body == b"first"
        assert eventually(lambda: counts(durable), lambda c, want=(3, 2, 12): c == want) == (
            3,
            2,
            12,
        )
        channel.basic_nack(method.delivery_tag, requeue=True)  # back: counted once
        method, _props, body = channel.basic_get(durable)
        channel.basic_ack(method.delivery_tag)  # gone
        assert eventually(lambda: counts(durable), lambda c, want=(2, 1, 7): c == want) == (2, 1, 7)
        channel.queue_purge(durable)
        assert eventually(lambda: counts(durable), lambda c, want=(0, 0, 0): c == want) == (0, 0, 0)
    finally:
        channel.queue_delete(durable)
        channel.queue_delete(transient)
        connection.close()


def test_exchanges_name_who_declared_them(api):  # noqa: F811
    """user_who_performed_action: the API's user, the AMQP connection's user, and
    "rmq-internal" for what the broker made itself."""
    _base, amqp = api
    user, vhost = unique("declarer"), unique("declarer-vh")
    assert call(api, "PUT", f"/users/{user}", {"password": "pw", "tags": "administrator"})[0] == 201
    assert call(api, "PUT", f"/vhosts/{vhost}", user=user, password="pw")[0] == 201
    try:
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        assert call(api, "PUT", f"/permissions/{vhost}/guest", everything)[0] == 201
        assert call(api, "PUT", f"/exchanges/{vhost}/by-api", {"type": "fanout"})[0] == 201
        params = pika.URLParameters(amqp.rsplit("/", 1)[0] + "/" + vhost)
        params.credentials = pika.PlainCredentials(user, "pw")
        connection = pika.BlockingConnection(params)
        connection.channel().exchange_declare("by-amqp", "topic")
        connection.close()
        who = {
            x["name"]: x["user_who_performed_action"]
            for x in call(api, "GET", f"/exchanges/{vhost}")[1]
        }
        assert who["by-api"] == "guest"
        assert who["by-amqp"] == user
        assert who["amq.topic"] == user  # made with the vhost, by whoever made it
        assert who["amq.rabbitmq.trace"] == user
        assert call(api, "GET", "/exchanges/%2F/amq.direct")[1]["user_who_performed_action"] == (
            "rmq-internal"
        )
    finally:
        call(api, "DELETE", f"/vhosts/{vhost}")
        call(api, "DELETE", f"/users/{user}")


def test_churn_counts_connections_channels_and_queues(api):  # noqa: F811
    """churn_rates in the overview and the same counters on the node."""

    def churn():
        return call(api, "GET", "/overview")[1]["churn_rates"]

    before = churn()
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    queue = unique("churn-q")
    channel.queue_declare(queue)
    channel.queue_declare(queue)  # declared again: declared, not created
    channel.queue_delete(queue)
    channel.close()
    connection.close()

    def moved(now):
        return all(
            now[key] - before[key] >= n
            for key, n in (
                ("connection_created", 1),
                ("connection_closed", 1),
                ("channel_created", 1),
                ("channel_closed", 1),
                ("queue_declared", 2),
                ("queue_created", 1),
                ("queue_deleted", 1),
            )
        )

    assert moved(eventually(churn, moved)), (before, churn())
    node = call(api, "GET", "/nodes")[1][0]
    assert node["queue_created"] >= before["queue_created"] + 1
    assert set(before) == {
        f"{kind}_{what}{details}"
        for kind, what in (
            ("connection", "created"),
            ("connection", "closed"),
            ("channel", "created"),
            ("channel", "closed"),
            ("queue", "declared"),
            ("queue", "created"),
            ("queue", "deleted"),
        )
        for details in ("", "_details")
    }
