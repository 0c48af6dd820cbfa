"""The x-consistent-hash exchange, with the interface of RabbitMQ's plugin.

Runs against the reference RabbitMQ too, which has the plugin on.  The exact
queue a key lands on differs (the ring's hash differs), so the tests check the
contract: every message routed once, a key always to the same queue, a fair
spread, and the plugin's refusals.
"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from conftest import drain


@pytest.fixture
def ring(connection, names):
    ch = connection.channel()
    x = names.exchange("chx")
    ch.exchange_declare(x, "x-consistent-hash", auto_delete=False)
    queues = [names.queue(f"chq{i}") for i in range(4)]
    for q in queues:
        ch.queue_declare(q, auto_delete=False)
        ch.queue_bind(q, x, "1")
    yield ch, x, queues
    for q in queues:
        ch.queue_delete(q)
    ch.exchange_delete(x)


def _counts(ch, queues):
    return [ch.queue_declare(q, passive=True).method.message_count for q in queues]


def test_spreads_every_message_once(ring):
    ch, x, queues = ring
    ch.confirm_delivery()
    for k in range(1000):
        ch.basic_publish(x, str(k), b"m")
    counts = _counts(ch, queues)
    assert sum(counts) == 1000
    assert min(counts) > 150  # weights are equal: no queue starves


def test_same_key_same_queue(ring):
    ch, x, queues = ring
    ch.confirm_delivery()
    for _ in range(20):
        ch.basic_publish(x, "user-42", b"m")
    assert sorted(_counts(ch, queues)) == [0, 0, 0, 20]


def test_hash_header(connection, names):
    ch = connection.channel()
    x = names.exchange("chh")
    ch.exchange_declare(x, "x-consistent-hash", arguments={"hash-header": "user"})
    queues = [names.queue(f"chh{i}") for i in range(3)]
    for q in queues:
        ch.queue_declare(q)
        ch.queue_bind(q, x, "2")
    ch.confirm_delivery()
    for k in range(30):  # the routing key varies; the header does not
        ch.basic_publish(x, str(k), b"m", pika.BasicProperties(headers={"user": "ann"}))
    assert sorted(_counts(ch, queues)) == [0, 0, 30]
    for q in queues:
        drain(ch, q)
        ch.queue_delete(q)
    ch.exchange_delete(x)


@pytest.mark.parametrize(
    "key,text",
    [
        ("abc", 'The binding key must be an integer: <<"abc">>'),
        ("0", "The binding key must be greater than 0"),
    ],
)
def test_bad_binding_keys(connection, names, key, text):
    ch = connection.channel()
    x = names.exchange("chb")
    q = names.queue()
    ch.exchange_declare(x, "x-consistent-hash")
    ch.queue_declare(q)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(q, x, key)
    assert info.value.reply_code == 406
    assert text in info.value.reply_text
    ch = connection.channel()
    ch.queue_delete(q)
    ch.exchange_delete(x)


@pytest.mark.parametrize(
    "args,text",
    [
        (
            {"hash-header": "a", "hash-property": "message_id"},
            "hash-header and hash-property are mutually exclusive",
        ),
        ({"hash-property": "nope"}, "Unsupported property: nope"),
    ],
)
def test_bad_exchange_arguments(connection, names, args, text):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(names.exchange("cha"), "x-consistent-hash", arguments=args)
    assert info.value.reply_code == 406
    assert text in info.value.reply_text
