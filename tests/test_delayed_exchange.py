"""The x-delayed-message exchange, with the interface of the community
plugin rabbitmq-delayed-message-exchange.

The reference RabbitMQ does not have the plugin, so these tests are Leveret's own:
what they check is the plugin's documented behaviour and, where Leveret differs on
purpose, docs/differences.md#the-delayed-message-exchange. Each runs on the broker
without persistence (pending messages in RAM) and with it (in the segment store).
Arrival times are checked only from below (never before the due time): an upper
bound would be a timing assertion on a shared machine.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from decimal import Decimal

import pika
import pika.exceptions
import pytest

from leveret.config import ServerConfig
from leveret.testing import embedded_broker

pytestmark = pytest.mark.leveret_only

X = "x-delayed-message"


@pytest.fixture(params=["memory", "store"], scope="module")
def broker(request, tmp_path_factory):
    if request.param == "memory":
        config = ServerConfig(port=0, persistence=False, management_port=0, prometheus_port=0)
    else:
        config = ServerConfig(
            port=0,
            data_dir=str(tmp_path_factory.mktemp("delayed")),
            management_port=0,
            prometheus_port=0,
        )
    with embedded_broker(config) as b:
        yield b


@pytest.fixture
def ch(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield conn.channel()
    if conn.is_open:
        conn.close()


def _props(delay=None, persistent=True, **headers):
    if delay is not None:
        headers["x-delay"] = delay
    return pika.BasicProperties(headers=headers or None, delivery_mode=2 if persistent else 1)


def _declare(ch, name, kind="direct", durable=True, **args):
    ch.exchange_delete(name)
    ch.exchange_declare(name, X, durable=durable, arguments={"x-delayed-type": kind, **args})


def _queue(ch, name, exchange=None, key="", arguments=None):
    ch.queue_delete(name)
    ch.queue_declare(name, durable=True, arguments=arguments)
    if exchange is not None:
        ch.queue_bind(name, exchange, key)


def _collect(ch, queue, count, timeout=10.0):
    """(arrival time, body, headers) of `count` messages, in arrival order."""
    got = []
    deadline = time.time() + timeout
    while len(got) < count and time.time() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            ch.connection.sleep(0.01)
            continue
        got.append((time.time(), body, props.headers))
    return got


def _count(ch, queue):
    return ch.queue_declare(queue, passive=True).method.message_count


def _pending(broker, exchange, vhost="/"):
    return broker.call(
        lambda: broker.server.broker.vhosts[vhost].exchanges[exchange].router.info()
    )["messages_delayed"]


# ---- declaration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        (
            {"x-delayed-type": 5},
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": "nope"},
            "Invalid argument, 'x-delayed-type' must be an existing exchange type: 'nope' is "
            "not one of direct, topic, fanout, headers, x-consistent-hash",
        ),
        (
            {"x-delayed-type": X},
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
        (
            {
                "x-delayed-type": "x-consistent-hash",
                "hash-header": "h",
                "hash-property": "message_id",
            },
            "hash-header and hash-property are mutually exclusive",
        ),
    ],
)
def test_declaration_without_a_routing_type_is_refused(ch, arguments, text):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare("dx.bad", X, arguments=arguments)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - " + text


def test_bindings_are_the_routing_types(ch):
    _declare(ch, "dx.hash", "x-consistent-hash")
    ch.queue_declare("dx.hq", exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind("dx.hq", "dx.hash", "not-a-weight")
    assert info.value.reply_code == 406


@pytest.mark.parametrize(
    ("kind", "bind", "routed", "unrouted"),
    [
        ("direct", "k", ("k", {}), ("j", {})),
        ("topic", "a.*", ("a.b", {}), ("b.a", {})),
        ("fanout", "", ("any", {}), None),
        ("headers", "", ("", {"h": "1"}), ("", {"h": "2"})),
        ("x-consistent-hash", "1", ("any", {}), None),
    ],
)
def test_each_routing_type_routes_at_once_and_after_a_delay(ch, kind, bind, routed, unrouted):
    ex, q = f"dx.{kind}", f"dq.{kind}"
    _declare(ch, ex, kind)
    _queue(ch, q)
    ch.queue_bind(
        q, ex, bind, arguments={"h": "1", "x-match": "all"} if kind == "headers" else None
    )
    key, headers = routed
    ch.basic_publish(ex, key, b"now", _props(**headers))
    ch.basic_publish(ex, key, b"zero", _props(0, **headers))
    ch.basic_publish(ex, key, b"later", _props(150, **headers))
    if unrouted is not None:
        ch.basic_publish(ex, unrouted[0], b"nowhere", _props(100, **unrouted[1]))
    assert [b for _t, b, _h in _collect(ch, q, 3)] == [b"now", b"zero", b"later"]
    ch.connection.sleep(0.3)
    assert _count(ch, q) == 0


def test_messages_come_in_due_order_never_early_with_x_delay_negated(ch):
    _declare(ch, "dx.order")
    _queue(ch, "dq.order", "dx.order", "k")
    delays = [500, 100, 300, 200, 100, 400]  # the plugin's own test
    sent = {}
    for n, d in enumerate(delays):
        sent[b"%d" % n] = (time.time(), d)
        ch.basic_publish("dx.order", "k", b"%d" % n, _props(d))
    got = _collect(ch, "dq.order", len(delays))
    assert [sent[b][1] for _t, b, _h in got] == sorted(delays)
    assert [b for _t, b, _h in got][:2] == [b"1", b"4"]  # equal delays keep their order
    for arrived, body, headers in got:
        published, d = sent[body]
        assert arrived >= published + d / 1000
        assert headers["x-delay"] == -d


@pytest.mark.parametrize(
    ("value", "delayed_for"),
    [
        ("200", 200),  # a string of digits, as the plugin's binary_to_integer
        ("-200", None),
        (Decimal("150.9"), 150),  # truncated
        (True, None),  # a boolean is not a delay
        (0, None),
        (-40, None),
        ({"a": 1}, None),
    ],
)
def test_x_delay_values_as_the_plugin_reads_them(ch, value, delayed_for):
    _declare(ch, "dx.types")
    _queue(ch, "dq.types", "dx.types", "k")
    published = time.time()
    ch.basic_publish("dx.types", "k", b"m", _props(value))
    ((arrived, _b, headers),) = _collect(ch, "dq.types", 1)
    if delayed_for is None:
        assert headers["x-delay"] == value
    else:
        assert arrived >= published + delayed_for / 1000
        assert headers["x-delay"] == -delayed_for


@pytest.mark.parametrize("value", ["abc", "1.5", " 5", ""])
def test_an_x_delay_that_is_no_integer_is_refused(ch, value):
    _declare(ch, "dx.bad-delay")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("dx.bad-delay", "k", b"m", _props(value))
        ch.queue_declare("", exclusive=True)  # the close comes instead of declare-ok
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        f"PRECONDITION_FAILED - invalid x-delay header: '{value}' is not an integer"
    )


# ---- publishing: confirms, mandatory, transactions ----------------------------------------


def test_confirmed_on_receipt_and_never_returned_as_unroutable(ch, broker):
    _declare(ch, "dx.confirm")
    returned = []
    ch.add_on_return_callback(lambda *args: returned.append(args))
    ch.confirm_delivery()
    ch.basic_publish("dx.confirm", "k", b"held", _props(5_000), mandatory=True)  # confirmed now
    assert _pending(broker, "dx.confirm") == 1
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("dx.confirm", "k", b"now", _props(0), mandatory=True)
    ch.connection.process_data_events(0.2)
    assert len(returned) == 1  # only the message routed at once, to nowhere
    ch.exchange_delete("dx.confirm")


def test_transactions_hold_delayed_messages_until_commit(ch):
    _declare(ch, "dx.tx")
    _queue(ch, "dq.tx", "dx.tx", "k")
    ch.tx_select()
    ch.basic_publish("dx.tx", "k", b"rolled back", _props(50))
    ch.tx_rollback()
    ch.basic_publish("dx.tx", "k", b"committed", _props(50))
    ch.tx_commit()
    assert [b for _t, b, _h in _collect(ch, "dq.tx", 1)] == [b"committed"]
    ch.connection.sleep(0.2)
    assert _count(ch, "dq.tx") == 0


# ---- routing at the due time --------------------------------------------------------------


def test_routed_against_the_bindings_of_the_due_time(ch, broker):
    _declare(ch, "dx.late")
    _queue(ch, "dq.late-a")
    _queue(ch, "dq.late-b", "dx.late", "k")
    ch.basic_publish("dx.late", "k", b"m", _props(1000))
    ch.queue_bind("dq.late-a", "dx.late", "k")  # bound after the publish
    ch.queue_unbind("dq.late-b", "dx.late", "k")  # unbound before the due time
    assert [b for _t, b, _h in _collect(ch, "dq.late-a", 1)] == [b"m"]
    assert _count(ch, "dq.late-b") == 0
    assert _pending(broker, "dx.late") == 0


def test_alternate_exchange_only_at_the_due_time(ch):
    ch.exchange_declare("dx.ae", "fanout")
    _queue(ch, "dq.ae", "dx.ae")
    _declare(ch, "dx.with-ae", **{"alternate-exchange": "dx.ae"})
    ch.basic_publish("dx.with-ae", "k", b"m", _props(1000))
    ch.connection.sleep(0.1)
    assert _count(ch, "dq.ae") == 0  # the plugin would have sent it there already
    ((_t, body, headers),) = _collect(ch, "dq.ae", 1)
    assert (body, headers["x-delay"]) == (b"m", -1000)


def test_exchange_to_exchange_bindings_on_both_sides(ch):
    ch.exchange_declare("dx.src", "topic")
    _declare(ch, "dx.mid")
    ch.exchange_declare("dx.dst", "fanout")
    ch.exchange_bind("dx.mid", "dx.src", "#")
    ch.exchange_bind("dx.dst", "dx.mid", "k")
    _queue(ch, "dq.e2e", "dx.dst")
    published = time.time()
    ch.basic_publish("dx.src", "k", b"m", _props(200))
    ((arrived, body, headers),) = _collect(ch, "dq.e2e", 1)
    assert arrived >= published + 0.2
    assert headers["x-delay"] == -200


def test_cc_and_bcc_keys_are_kept_while_delayed(ch):
    _declare(ch, "dx.cc")
    for k in "abc":
        _queue(ch, f"dq.cc-{k}", "dx.cc", k)
    ch.basic_publish("dx.cc", "a", b"m", _props(150, CC=["b"], BCC=["c"]))
    for k in "abc":
        ((_t, body, headers),) = _collect(ch, f"dq.cc-{k}", 1)
        assert body == b"m" and "BCC" not in headers and headers["CC"] == ["b"]


def test_dead_lettered_into_a_delayed_exchange_is_delayed(ch):
    _declare(ch, "dx.dlx")
    _queue(ch, "dq.dlx-target", "dx.dlx", "retry")
    _queue(
        ch,
        "dq.dlx-source",
        arguments={
            "x-message-ttl": 10,
            "x-dead-letter-exchange": "dx.dlx",
            "x-dead-letter-routing-key": "retry",
        },
    )
    published = time.time()
    ch.basic_publish("", "dq.dlx-source", b"m", _props(300))
    ((arrived, body, headers),) = _collect(ch, "dq.dlx-target", 1)
    assert arrived >= published + 0.3
    assert headers["x-death"][0]["reason"] == "expired"


def test_deleting_the_exchange_drops_its_pending_messages(ch, broker):
    _declare(ch, "dx.gone")
    _queue(ch, "dq.gone", "dx.gone", "k")
    ch.confirm_delivery()
    for d in (1000, 1100):
        ch.basic_publish("dx.gone", "k", b"m", _props(d))
    assert _pending(broker, "dx.gone") == 2
    ch.exchange_delete("dx.gone")
    _declare(ch, "dx.gone")
    ch.queue_bind("dq.gone", "dx.gone", "k")
    ch.connection.sleep(1.3)
    assert _count(ch, "dq.gone") == 0
    assert _pending(broker, "dx.gone") == 0


def test_delays_past_erlangs_timer_limit_wait(ch, broker):
    """The plugin routes a delay over 2^32 - 1 ms (49 days) at once; here it waits."""
    _declare(ch, "dx.long")
    _queue(ch, "dq.long", "dx.long", "k")
    ch.basic_publish("dx.long", "k", b"m", _props(2**32 + 5))
    ch.basic_publish("dx.long", "k", b"m", _props(2**62))
    ch.connection.sleep(0.2)
    assert _count(ch, "dq.long") == 0
    assert _pending(broker, "dx.long") == 2
    ch.exchange_delete("dx.long")


# ---- where it shows -----------------------------------------------------------------------


def _api(broker, path):
    request = urllib.request.Request(f"http://127.0.0.1:{broker.server.management.port}/api{path}")
    request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_management_api_and_prometheus_show_the_pending_messages(ch, broker):
    _declare(ch, "dx.shown", "topic")
    ch.confirm_delivery()
    for d in (5_000, 6_000, 7_000):
        ch.basic_publish("dx.shown", "k", b"m", _props(d))
    shown = _api(broker, "/exchanges/%2F/dx.shown")
    assert shown["messages_delayed"] == 3
    assert shown["type"] == X and shown["arguments"] == {"x-delayed-type": "topic"}
    listed = {x["name"]: x for x in _api(broker, "/exchanges/%2F")}
    assert listed["dx.shown"]["messages_delayed"] == 3
    assert "messages_delayed" not in listed["amq.direct"]
    port = broker.server.prometheus.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/per-object") as r:
        text = r.read().decode()
    assert 'leveret_exchange_messages_delayed{exchange="dx.shown",vhost="/"} 3.0' in text
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        text = r.read().decode()
    assert "leveret_exchange_messages_delayed 3.0" in text
    ch.exchange_delete("dx.shown")


def test_aio_pika_x_delayed_message(broker):
    """aio-pika's ExchangeType.X_DELAYED_MESSAGE; a float x-delay (which pika cannot
    send) is truncated."""
    import asyncio

    import aio_pika

    async def scenario() -> list[tuple[float, bytes, int]]:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(
                "dx.aio",
                aio_pika.ExchangeType.X_DELAYED_MESSAGE,
                durable=True,
                arguments={"x-delayed-type": "direct"},
            )
            queue = await channel.declare_queue("dq.aio", durable=True)
            await queue.purge()
            await queue.bind(exchange, "k")
            start = time.time()
            for d in (250.9, 50):
                message = aio_pika.Message(b"%d" % int(d), headers={"x-delay": d})
                await exchange.publish(message, "k")
            got = []
            async with queue.iterator() as it:
                async for message in it:
                    await message.ack()
                    got.append((time.time() - start, message.body, message.headers["x-delay"]))
                    if len(got) == 2:
                        break
            await exchange.delete()
            await queue.delete()
            return got

    got = asyncio.run(scenario())
    assert [(b, h) for _t, b, h in got] == [(b"50", -50), (b"250", -250)]
    assert got[1][0] >= 0.25


def test_the_example_in_docs_delayed_md_runs(broker):
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "delayed.md"
    block = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)[0]
    exec(
        compile(block.replace("amqp://guest:guest@127.0.0.1:5672/%2F", broker.url), "doc", "exec"),
        {},
    )
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    assert _pending(broker, "retry") == 1
    ch.exchange_delete("retry")
    ch.queue_delete("work")
    conn.close()
