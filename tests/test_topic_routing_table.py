"""Topic exchange matching table, checked row by row against the broker.

``*`` matches exactly one word, ``#`` zero or more words; words are separated by
dots and may be empty ("a." is two words, the second empty), except that the
empty routing key is zero words, so ``*`` does not match it.  Every row was
verified against RabbitMQ 3.10.8.
"""

from __future__ import annotations

import pika
import pytest

ROWS = [
    # (binding key, routing key, matches)
    ("a.b", "a.b", True),
    ("a.b", "a.c", False),
    ("a.b", "a.b.c", False),
    ("a.b", "a", False),
    ("a", "A", False),  # case sensitive
    ("", "", True),
    ("", "a", False),
    ("*", "a", True),
    ("*", "", False),  # RabbitMQ: "" is zero words, not one empty word
    ("*", "a.b", False),
    ("*", ".", False),
    ("a.*", "a", False),
    ("a.*", "a.b", True),
    ("a.*", "a.", True),  # empty last word
    ("a.*", "a.b.c", False),
    ("*.b", "b", False),
    ("*.b", "a.b", True),
    ("*.b", ".b", True),
    ("*.b", "x.a.b", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("*.*", "a.b.c", False),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", "..", True),
    ("a.#", "a", True),
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "ab", False),
    ("#.a", "a", True),
    ("#.a", "b.a", True),
    ("#.a", "c.b.a", True),
    ("#.a", "a.b", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "b", False),
    ("a.#.b", "a", False),
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("#.*", "a", True),
    ("#.*", "a.b", True),
    ("#.*", "", False),
    ("*.#", "a", True),
    ("*.#", "a.b.c", True),
    ("*.#", "", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("#.b.#", "b", True),
    ("#.b.#", "a.b.c", True),
    ("#.b.#", "a.b.b.c", True),
    ("#.b.#", "abc", False),
    ("*.*.#", "a", False),
    ("*.*.#", "a.b", True),
    ("#.*.*", "a", False),
    ("#.*.*", "a.b.c", True),
    ("a.*.b", "a..b", True),
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.b", True),
    ("#.a.#.b.#", "a.b", True),
    ("#.a.#.b.#", "x.a.y.b.z", True),
    ("#.a.#.b.#", "b.a", False),
    ("*a", "a", False),  # * and # are only special as whole words
    ("a*", "a*", True),
    ("a#", "a#", True),
    ("a#", "abc", False),
    ("stock.usd.nyse", "stock.usd.nyse", True),
    ("stock.*.nyse", "stock.eur.nyse", True),
    ("stock.#", "stock.usd.nyse.x", True),
]


def test_topic_matching_table(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    x = names.exchange("topic-table")
    ch.exchange_declare(x, "topic", auto_delete=False)
    patterns = sorted({binding for binding, _key, _match in ROWS})
    keys = sorted({key for _binding, key, _match in ROWS})
    queue_for = {}
    for pattern in patterns:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, x, routing_key=pattern)
        queue_for[pattern] = q
    for key in keys:
        ch.basic_publish(x, key, key.encode(), pika.BasicProperties(message_id=key))
    received: dict[str, set[str]] = {}
    for pattern, q in queue_for.items():
        got = set()
        while True:
            method, props, _body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            got.add(props.message_id)
        received[pattern] = got
    mismatches = [
        (binding, key, expected)
        for binding, key, expected in ROWS
        if (key in received[binding]) != expected
    ]
    assert not mismatches, f"rows (binding, key, expected) the broker disagrees with: {mismatches}"


@pytest.mark.parametrize("binding,key,expected", [r for r in ROWS if "#" in r[0]][:8])
def test_topic_rows_with_amq_topic(cch_factory, binding, key, expected):
    """A few rows again through the built-in amq.topic exchange."""
    ch = cch_factory()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", routing_key=binding)
    ch.basic_publish("amq.topic", key, b"m")
    method, _props, _body = ch.basic_get(q, auto_ack=True)
    assert (method is not None) == expected


@pytest.fixture
def cch_factory(connection):
    def make():
        ch = connection.channel()
        ch.confirm_delivery()
        return ch

    return make
