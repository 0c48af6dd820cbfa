"""Exchanges: types, built-ins, declare flags and errors, e2e bindings, AE."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from conftest import drain

BUILTIN = [
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
]


@pytest.fixture
def cch(connection):
    """A confirm-mode channel: every publish is routed by the time it returns."""
    ch = connection.channel()
    ch.confirm_delivery()
    return ch


def _queue(ch, names, prefix="q"):
    return ch.queue_declare(names.queue(prefix), auto_delete=False).method.queue


@pytest.mark.parametrize("name,type_", BUILTIN)
def test_builtin_exchanges_exist(channel, name, type_):
    channel.exchange_declare(name, passive=True)
    # redeclaring with the same properties is fine too (they are durable)
    channel.exchange_declare(name, type_, durable=True)


def test_default_exchange_routes_by_queue_name(cch, names):
    q = _queue(cch, names)
    cch.basic_publish("", q, b"hello", mandatory=True)
    assert drain(cch, q) == [b"hello"]


def test_default_exchange_cannot_be_declared_passively(channel):
    """RabbitMQ: passive declare of "" is 403 ACCESS_REFUSED
    ("operation not permitted on the default exchange"); amq.default is 404."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_declare("", passive=True)
    assert info.value.reply_code == 403


@pytest.mark.parametrize(
    "op",
    ["delete", "bind_queue"],
)
def test_default_exchange_is_untouchable(connection, names, op):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        if op == "delete":
            ch.exchange_delete("")
        else:
            ch.queue_bind(q, "", routing_key="x")
    assert info.value.reply_code == 403


def test_builtin_exchange_cannot_be_deleted(channel):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_delete("amq.direct")
    assert info.value.reply_code == 403


def test_passive_declare_missing_exchange(channel, names):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_declare(names.exchange("missing"), passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text.startswith("NOT_FOUND")


def test_direct_routing(cch, names):
    x = names.exchange("direct")
    cch.exchange_declare(x, "direct")
    q1, q2 = _queue(cch, names), _queue(cch, names)
    cch.queue_bind(q1, x, routing_key="red")
    cch.queue_bind(q2, x, routing_key="green")
    cch.queue_bind(q2, x, routing_key="red")
    cch.basic_publish(x, "red", b"r")
    cch.basic_publish(x, "green", b"g")
    cch.basic_publish(x, "blue", b"b")
    assert drain(cch, q1) == [b"r"]
    assert drain(cch, q2) == [b"r", b"g"]


def test_fanout_routing_ignores_key(cch, names):
    x = names.exchange("fanout")
    cch.exchange_declare(x, "fanout")
    qs = [_queue(cch, names) for _ in range(3)]
    for q in qs:
        cch.queue_bind(q, x, routing_key=q)
    cch.basic_publish(x, "whatever", b"all")
    for q in qs:
        assert drain(cch, q) == [b"all"]


def test_topic_routing(cch, names):
    x = names.exchange("topic")
    cch.exchange_declare(x, "topic")
    q_star, q_hash = _queue(cch, names), _queue(cch, names)
    cch.queue_bind(q_star, x, routing_key="*.orange.*")
    cch.queue_bind(q_hash, x, routing_key="lazy.#")
    for key in ["quick.orange.rabbit", "lazy.orange.elephant", "lazy", "quick.brown.fox"]:
        cch.basic_publish(x, key, key.encode())
    assert drain(cch, q_star) == [b"quick.orange.rabbit", b"lazy.orange.elephant"]
    assert drain(cch, q_hash) == [b"lazy.orange.elephant", b"lazy"]


def _publish_headers(ch, x, headers, body):
    ch.basic_publish(x, "", body, pika.BasicProperties(headers=headers))


@pytest.mark.parametrize("exchange_kind", ["declared", "amq.match", "amq.headers"])
def test_headers_routing(cch, names, exchange_kind):
    if exchange_kind == "declared":
        x = names.exchange("headers")
        cch.exchange_declare(x, "headers")
    else:
        x = exchange_kind
    q_all, q_any, q_default = _queue(cch, names), _queue(cch, names), _queue(cch, names)
    cch.queue_bind(q_all, x, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    cch.queue_bind(q_any, x, arguments={"x-match": "any", "format": "pdf", "type": "log"})
    cch.queue_bind(q_default, x, arguments={"format": "zip", "n": 1})  # x-match defaults to all
    _publish_headers(cch, x, {"format": "pdf", "type": "report"}, b"pdf-report")
    _publish_headers(cch, x, {"format": "pdf", "type": "report", "extra": 1}, b"pdf-report-extra")
    _publish_headers(cch, x, {"format": "pdf"}, b"pdf")
    _publish_headers(cch, x, {"type": "log"}, b"log")
    _publish_headers(cch, x, {"format": "zip", "n": 1}, b"zip-1")
    _publish_headers(cch, x, {"format": "zip", "n": 2}, b"zip-2")
    _publish_headers(cch, x, {}, b"empty")
    _publish_headers(cch, x, None, b"none")
    assert drain(cch, q_all) == [b"pdf-report", b"pdf-report-extra"]
    assert drain(cch, q_any) == [b"pdf-report", b"pdf-report-extra", b"pdf", b"log"]
    assert drain(cch, q_default) == [b"zip-1"]


def test_headers_binding_unbind_by_arguments(cch, names):
    x = names.exchange("headers")
    cch.exchange_declare(x, "headers")
    q = _queue(cch, names)
    cch.queue_bind(q, x, arguments={"x-match": "any", "a": 1})
    cch.queue_bind(q, x, arguments={"x-match": "any", "b": 2})
    cch.queue_unbind(q, x, arguments={"x-match": "any", "a": 1})
    _publish_headers(cch, x, {"a": 1}, b"a")
    _publish_headers(cch, x, {"b": 2}, b"b")
    assert drain(cch, q) == [b"b"]


def test_message_routed_once_per_queue(cch, names):
    """Several matching bindings to one queue still deliver a single copy."""
    x = names.exchange("topic")
    cch.exchange_declare(x, "topic")
    q = _queue(cch, names)
    for key in ["a.b", "a.*", "#", "*.b"]:
        cch.queue_bind(q, x, routing_key=key)
    cch.basic_publish(x, "a.b", b"once")
    assert drain(cch, q) == [b"once"]


def test_declare_flags_reported_by_redeclare(channel, names):
    x = names.exchange("flags")
    channel.exchange_declare(x, "topic", durable=True, auto_delete=False)
    channel.exchange_declare(x, "topic", durable=True, auto_delete=False)  # equivalent: ok
    channel.exchange_declare(x, passive=True)
    channel.exchange_declare(x, "fanout", passive=True)  # passive ignores the type


@pytest.mark.parametrize(
    "change",
    [
        {"exchange_type": "fanout"},
        {"durable": False},
        {"auto_delete": True},
        {"internal": True},
    ],
    ids=["type", "durable", "auto_delete", "internal"],
)
def test_redeclare_with_different_properties(connection, names, change):
    ch = connection.channel()
    x = names.exchange("redeclare")
    base = {"exchange_type": "direct", "durable": True, "auto_delete": False, "internal": False}
    ch.exchange_declare(x, **base)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, **{**base, **change})
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith("PRECONDITION_FAILED")
    assert connection.is_open
    connection.channel().exchange_declare(x, passive=True)  # still there, unchanged


@pytest.mark.parametrize("name", ["amq.leveret-test", "amq.direct2", "amq."])
def test_declare_reserved_prefix_refused(channel, name):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_declare(name, "direct")
    assert info.value.reply_code == 403
    assert info.value.reply_text.startswith("ACCESS_REFUSED")


def test_auto_delete_exchange_goes_with_last_binding(connection, names):
    ch = connection.channel()
    x = names.exchange("autodel")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x)
    ch.queue_bind(q2, x)
    ch.queue_unbind(q1, x)
    ch.exchange_declare(x, passive=True)  # one binding left
    ch.queue_unbind(q2, x)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, passive=True)
    assert info.value.reply_code == 404


def test_auto_delete_exchange_survives_without_ever_having_bindings(channel, names):
    x = names.exchange("autodel-unused")
    channel.exchange_declare(x, "fanout", auto_delete=True)
    channel.exchange_declare(x, passive=True)


def test_delete_exchange_removes_bindings(cch, names):
    x = names.exchange("del")
    cch.exchange_declare(x, "fanout")
    q = _queue(cch, names)
    cch.queue_bind(q, x)
    cch.exchange_delete(x)
    cch.exchange_declare(x, "fanout")
    cch.basic_publish(x, "", b"after recreate")
    assert drain(cch, q) == []


def test_delete_if_unused(connection, names):
    ch = connection.channel()
    x = names.exchange("ifunused")
    ch.exchange_declare(x, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_delete(x, if_unused=True)
    assert info.value.reply_code == 406
    ch = connection.channel()
    ch.queue_unbind(q, x)
    ch.exchange_delete(x, if_unused=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.exchange_declare(x, passive=True)


def test_delete_if_unused_only_counts_outgoing_bindings(connection, names):
    """RabbitMQ: an exchange that is only a *destination* of e2e bindings is unused."""
    ch = connection.channel()
    src, dest = names.exchange("src"), names.exchange("dest")
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(dest, "fanout")
    ch.exchange_bind(destination=dest, source=src)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_delete(src, if_unused=True)
    assert info.value.reply_code == 406
    ch = connection.channel()
    ch.exchange_delete(dest, if_unused=True)


def test_delete_missing_exchange_is_ok(channel, names):
    """RabbitMQ 3.x answers delete-ok for an exchange that does not exist."""
    channel.exchange_delete(names.exchange("never-declared"))


def test_exchange_to_exchange_binding(cch, names):
    src, mid = names.exchange("src"), names.exchange("mid")
    cch.exchange_declare(src, "topic")
    cch.exchange_declare(mid, "direct")
    q = _queue(cch, names)
    cch.exchange_bind(destination=mid, source=src, routing_key="logs.#")
    cch.queue_bind(q, mid, routing_key="logs.error")
    cch.basic_publish(src, "logs.error", b"err")
    cch.basic_publish(src, "logs.info", b"info")  # passes src, not mid
    cch.basic_publish(src, "other", b"other")  # does not pass src
    assert drain(cch, q) == [b"err"]
    cch.exchange_unbind(destination=mid, source=src, routing_key="logs.#")
    cch.basic_publish(src, "logs.error", b"err2")
    assert drain(cch, q) == []


def test_exchange_binding_cycle_delivers_once(cch, names):
    a, b = names.exchange("a"), names.exchange("b")
    cch.exchange_declare(a, "fanout")
    cch.exchange_declare(b, "fanout")
    cch.exchange_bind(destination=b, source=a)
    cch.exchange_bind(destination=a, source=b)
    q = _queue(cch, names)
    cch.queue_bind(q, a)
    cch.queue_bind(q, b)
    cch.basic_publish(a, "", b"loop")
    assert drain(cch, q) == [b"loop"]


def test_exchange_bind_missing_source(channel, names):
    dest = names.exchange("dest")
    channel.exchange_declare(dest, "fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_bind(destination=dest, source=names.exchange("missing"))
    assert info.value.reply_code == 404


def test_alternate_exchange(cch, names):
    ae, main = names.exchange("ae"), names.exchange("main")
    cch.exchange_declare(ae, "fanout")
    cch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    q_main, q_ae = _queue(cch, names), _queue(cch, names)
    cch.queue_bind(q_main, main, routing_key="known")
    cch.queue_bind(q_ae, ae)
    cch.basic_publish(main, "known", b"routed")
    # mandatory does not fire: the AE routed it
    cch.basic_publish(main, "unknown", b"caught", mandatory=True)
    assert drain(cch, q_main) == [b"routed"]
    assert drain(cch, q_ae) == [b"caught"]


def test_alternate_exchange_missing_means_unroutable(cch, names):
    main = names.exchange("main")
    cch.exchange_declare(main, "direct", arguments={"alternate-exchange": names.exchange("none")})
    with pytest.raises(pika.exceptions.UnroutableError):
        cch.basic_publish(main, "unknown", b"lost", mandatory=True)


def test_internal_exchange(connection, cch, names):
    internal, front = names.exchange("internal"), names.exchange("front")
    cch.exchange_declare(internal, "fanout", internal=True)
    cch.exchange_declare(front, "fanout")
    cch.exchange_bind(destination=internal, source=front)
    q = _queue(cch, names)
    cch.queue_bind(q, internal)
    cch.basic_publish(front, "", b"via e2e")
    assert drain(cch, q) == [b"via e2e"]
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(internal, "", b"direct")
        ch.queue_declare("", exclusive=True)  # round trip to see the channel.close
    assert info.value.reply_code == 403
    assert info.value.reply_text.startswith("ACCESS_REFUSED")


def test_publish_to_missing_exchange(connection, names):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(names.exchange("missing"), "rk", b"x")
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text.startswith("NOT_FOUND")
    assert connection.is_open


def test_unroutable_without_mandatory_is_dropped(cch, names):
    x = names.exchange("direct")
    cch.exchange_declare(x, "direct")
    cch.basic_publish(x, "nobody", b"dropped")  # confirmed (acked), silently dropped
