"""Quorum queues over AMQP 0-9-1: RabbitMQ 3.10's semantics on one node.

Every expected code, text, order and header here was taken from RabbitMQ 3.10.8
by running these same pika calls against it; tests not marked leveret_only run
against it too:

    LEVERET_TEST_URL=amqp://guest:guest@127.0.0.1:5676/%2F python -m pytest tests/test_quorum.py
"""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

QUORUM = {"x-queue-type": "quorum"}


def declare(ch, name: str, **args):
    return ch.queue_declare(name, durable=True, arguments={**QUORUM, **args})


def publish(ch, queue: str, bodies, exchange: str = "", **props) -> list[str]:
    """Publish with confirms; 'ack' or 'nack' per message."""
    if not getattr(ch, "confirming", False):
        ch.confirm_delivery()
        ch.confirming = True
    out = []
    for body in bodies:
        try:
            ch.basic_publish(exchange, queue, body.encode(), pika.BasicProperties(**props))
            out.append("ack")
        except pika.exceptions.NackError:
            out.append("nack")
    return out


def drain(ch, queue: str, ack: bool = True) -> list[tuple[str, bool, object]]:
    """Every ready message by basic.get: (body, redelivered, x-delivery-count)."""
    out = []
    while True:
        method, props, body = ch.basic_get(queue)
        if method is None:
            return out
        out.append(
            (body.decode(), method.redelivered, (props.headers or {}).get("x-delivery-count"))
        )
        if ack:
            ch.basic_ack(method.delivery_tag)


def take(ch, queue: str, n: int) -> dict[str, int]:
    """basic.get n messages without acking them: body -> delivery tag."""
    tags = {}
    for _ in range(n):
        method, _props, body = ch.basic_get(queue)
        tags[body.decode()] = method.delivery_tag
    return tags


def refused(call, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(
        (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)
    ) as info:
        call(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text


@pytest.fixture
def ch(connection):
    return connection.channel()


# --- declaration -------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,prop",
    [
        ({"durable": False}, "non-durable"),
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
    ],
)
def test_only_durable_shared_queues(connection, names, flags, prop):
    q = names.queue("qq")
    code, text = refused(connection.channel().queue_declare, q, arguments=QUORUM, **flags)
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{q}' in vhost '/'",
    )


@pytest.mark.parametrize("exclusive", [False, True])
def test_server_named_quorum_queue_is_refused(connection, exclusive):
    ch = connection.channel()
    code, text = refused(ch.queue_declare, "", durable=True, exclusive=exclusive, arguments=QUORUM)
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue",
    )


@pytest.mark.parametrize(
    "arg,value",
    [
        ("x-max-priority", 5),
        ("x-queue-mode", "lazy"),
        ("x-queue-master-locator", "min-masters"),
        ("x-max-age", "1D"),
        ("x-stream-max-segment-size-bytes", 1000),
        ("x-initial-cluster-size", 1),
    ],
)
def test_other_types_arguments_are_refused(connection, names, arg, value):
    q = names.queue("qq")
    code, text = refused(declare, connection.channel(), q, **{arg: value})
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/' "
        "of queue type rabbit_quorum_queue",
    )


@pytest.mark.parametrize(
    "arg,value",
    [
        ("x-delivery-limit", 3),
        ("x-dead-letter-strategy", "at-least-once"),
        ("x-quorum-initial-group-size", 1),
        ("x-max-in-memory-length", 1),
        ("x-max-age", "1D"),
    ],
)
def test_classic_queues_refuse_other_types_arguments(connection, names, arg, value):
    q = names.queue("cq")
    code, text = refused(
        connection.channel().queue_declare, q, durable=True, arguments={arg: value}
    )
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/' "
        "of queue type rabbit_classic_queue",
    )


def test_every_quorum_argument_is_accepted(ch, names):
    q = names.queue("qq")
    args = {
        "x-delivery-limit": 3,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "k",
        "x-dead-letter-strategy": "at-least-once",
        "x-max-length": 10,
        "x-max-length-bytes": 1000,
        "x-overflow": "reject-publish",
        "x-message-ttl": 1000,
        "x-expires": 600_000,
        "x-single-active-consumer": True,
        "x-quorum-initial-group-size": 3,
        "x-max-in-memory-length": 5,
        "x-max-in-memory-bytes": 1000,
        "x-queue-leader-locator": "client-local",
        "x-foo": "unknown arguments pass, as on RabbitMQ",
        "x-message-deduplication": True,
    }
    ok = declare(ch, q, **args)
    assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)
    # reject-publish-dlx and a delivery limit of any type are taken too (see their tests)
    for extra in (
        {"x-overflow": "reject-publish-dlx"},
        {"x-delivery-limit": "3"},
        {"x-delivery-limit": -1},
    ):
        q = names.queue("qq")
        declare(ch, q, **extra)


@pytest.mark.parametrize(
    "args,reason",
    [
        ({"x-dead-letter-strategy": "sometimes"}, "invalid_dlx_strategy"),
        ({"x-dead-letter-strategy": 3}, "{unacceptable_type,signedint}"),
        ({"x-quorum-initial-group-size": "3"}, '"expected integer, got longstr"'),
        ({"x-quorum-initial-group-size": 0}, "{value_zero,0}"),
        ({"x-max-in-memory-length": "x"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-overflow": "nope"}, "invalid_overflow"),
        ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
    ],
)
def test_bad_argument_values(connection, names, args, reason):
    q = names.queue("qq")
    code, text = refused(declare, connection.channel(), q, **args)
    arg = next(iter(args))
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': {reason}",
    )


def test_redeclaring_as_another_type(connection, names):
    q, c = names.queue("qq"), names.queue("cq")
    declare(connection.channel(), q)
    connection.channel().queue_declare(c, durable=True)
    prefix = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue"
    cases = [
        (
            q,
            {},
            f"{prefix} '{q}' in vhost '/': received none but current is the value 'quorum' of type 'longstr'",
        ),
        (
            q,
            {"x-queue-type": "classic"},
            f"{prefix} '{q}' in vhost '/': received 'classic' but current is 'quorum'",
        ),
        (
            q,
            {"x-queue-type": "stream"},
            f"{prefix} '{q}' in vhost '/': received 'stream' but current is 'quorum'",
        ),
        (
            c,
            QUORUM,
            f"{prefix} '{c}' in vhost '/': received the value 'quorum' of type 'longstr' but current is none",
        ),
    ]
    for name, args, text in cases:
        code, got = refused(connection.channel().queue_declare, name, durable=True, arguments=args)
        assert (code, got) == (406, text)


def test_redeclaring_compares_the_quorum_arguments_only(connection, names):
    q = names.queue("qq")
    declare(
        connection.channel(),
        q,
        **{"x-delivery-limit": 3, "x-quorum-initial-group-size": 3, "x-message-ttl": 1000},
    )
    describe = f"for queue '{q}' in vhost '/'"
    cases = [
        (
            {"x-delivery-limit": 4},
            f"inequivalent arg 'x-delivery-limit' {describe}: received '4' but current is '3'",
        ),
        (
            {"x-delivery-limit": None},
            f"inequivalent arg 'x-delivery-limit' {describe}: received none but current is the value '3' of type 'signedint'",
        ),
        (
            {"x-quorum-initial-group-size": 1},
            f"inequivalent arg 'x-quorum-initial-group-size' {describe}: received '1' but current is '3'",
        ),
        # an existing queue is compared, not validated again: -1 is "inequivalent", not "invalid"
        (
            {"x-message-ttl": -1},
            f"inequivalent arg 'x-message-ttl' {describe}: received '-1' but current is '1000'",
        ),
    ]
    same = {"x-delivery-limit": 3, "x-quorum-initial-group-size": 3, "x-message-ttl": 1000}
    for change, text in cases:
        args = {**same, **change}
        args = {k: v for k, v in args.items() if v is not None}
        code, got = refused(declare, connection.channel(), q, **args)
        assert (code, got) == (406, "PRECONDITION_FAILED - " + text)
    # Arguments the type does not compare (another type's, unknown ones) pass on a redeclaration.
    ok = declare(connection.channel(), q, **same, **{"x-max-priority": 5, "x-foo": 1})
    assert ok.method.queue == q
    code, text = refused(
        connection.channel().queue_declare, q, durable=False, arguments={**QUORUM, **same}
    )
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'durable' {describe}: received 'false' but current is 'true'",
    )
    code, text = refused(
        connection.channel().queue_declare,
        q,
        durable=True,
        exclusive=True,
        arguments={**QUORUM, **same},
    )
    assert code == 405
    assert text.startswith(
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'"
    )


def test_passive_declare(ch, names):
    q = names.queue("qq")
    declare(ch, q)
    publish(ch, q, ["a", "b"])
    ok = ch.queue_declare(q, passive=True)
    assert (ok.method.queue, ok.method.message_count, ok.method.consumer_count) == (q, 2, 0)


# --- consuming --------------------------------------------------------------------------


def test_global_qos_consume_is_refused(connection, names):
    q = names.queue("qq")
    declare(connection.channel(), q)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    code, text = refused(ch.basic_consume, q, lambda *a: None)
    assert (code, text) == (
        540,
        f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos",
    )


def test_global_qos_zero_and_basic_get_are_fine(connection, names):
    q = names.queue("qq")
    ch = connection.channel()
    declare(ch, q)
    publish(ch, q, ["a"])
    ch2 = connection.channel()
    ch2.basic_qos(prefetch_count=0, global_qos=True)
    ch2.basic_consume(q, lambda *a: None)
    ch3 = connection.channel()
    ch3.basic_qos(prefetch_count=5, global_qos=True)
    ch2.close()
    assert ch3.basic_get(q)[0] is not None


def test_basic_get_refused_with_single_active_consumer(connection, names):
    q = names.queue("qq")
    ch = connection.channel()
    declare(ch, q, **{"x-single-active-consumer": True})
    publish(ch, q, ["a"])
    code, text = refused(ch.basic_get, q)
    assert (code, text) == (
        405,
        f"RESOURCE_LOCKED - cannot obtain access to locked queue '{q}' in vhost '/'. "
        "basic.get operations are not supported by quorum queues with single active consumer",
    )


def test_exclusive_consume_is_not_exclusive(connection, names):
    """RabbitMQ 3.10's quorum queues ignore basic.consume's exclusive flag."""
    q = names.queue("qq")
    declare(connection.channel(), q)
    a, b, c = connection.channel(), connection.channel(), connection.channel()
    a.basic_consume(q, lambda *x: None, exclusive=True)
    b.basic_consume(q, lambda *x: None, exclusive=True)
    c.basic_consume(q, lambda *x: None)
    ok = connection.channel().queue_declare(q, passive=True)
    assert ok.method.consumer_count == 3


def test_consumer_priority_and_single_active_consumer(connection, names):
    q, s = names.queue("qq"), names.queue("sac")
    ch = connection.channel()
    declare(ch, q)
    declare(ch, s, **{"x-single-active-consumer": True})
    low, high = [], []
    for got, prio in ((low, 1), (high, 5)):
        c = connection.channel()
        c.basic_qos(prefetch_count=100)
        c.basic_consume(
            q, lambda _c, _m, _p, b, got=got: got.append(b), arguments={"x-priority": prio}
        )
    publish(ch, q, [str(i) for i in range(4)])
    connection.process_data_events(0.5)
    assert (len(low), len(high)) == (0, 4)
    first, second = [], []
    c1, c2 = connection.channel(), connection.channel()
    c1.basic_consume(s, lambda _c, _m, _p, b: first.append(b), auto_ack=True)
    c2.basic_consume(s, lambda _c, _m, _p, b: second.append(b), auto_ack=True)
    publish(ch, s, ["1", "2"])
    connection.process_data_events(0.5)
    assert (len(first), len(second)) == (2, 0)
    c1.close()
    publish(ch, s, ["3"])
    deadline = time.monotonic() + 5
    while not second and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert second == [b"3"]


# --- returns and x-delivery-count ----------------------------------------------------------


def test_returns_go_to_the_back_without_a_delivery_limit(ch, names):
    q = names.queue("qq")
    declare(ch, q)
    publish(ch, q, ["1", "2", "3", "4", "5", "6"])
    tags = take(ch, q, 5)
    ch.basic_nack(tags["4"], requeue=True)
    ch.basic_nack(tags["2"], requeue=True)
    ch.basic_reject(tags["5"], requeue=True)
    assert drain(ch, q, ack=False) == [
        ("6", False, 0),
        ("4", True, 1),
        ("2", True, 1),
        ("5", True, 1),
    ]


def test_returns_go_to_the_front_with_a_delivery_limit(ch, names):
    q = names.queue("qq")
    declare(ch, q, **{"x-delivery-limit": 10})
    publish(ch, q, ["1", "2", "3", "4", "5", "6"])
    tags = take(ch, q, 5)
    ch.basic_nack(tags["4"], requeue=True)
    ch.basic_nack(tags["2"], requeue=True)
    ch.basic_reject(tags["5"], requeue=True)
    assert drain(ch, q, ack=False) == [
        ("4", True, 1),
        ("2", True, 1),
        ("5", True, 1),
        ("6", False, 0),
    ]


@pytest.mark.parametrize(
    "args,expected",
    [({}, ["5", "1", "2", "3", "4"]), ({"x-delivery-limit": 10}, ["1", "2", "3", "4", "5"])],
)
def test_multiple_nack_returns_in_delivery_order(ch, names, args, expected):
    q = names.queue("qq")
    declare(ch, q, **args)
    publish(ch, q, ["1", "2", "3", "4", "5"])
    tags = take(ch, q, 4)
    ch.basic_nack(tags["4"], multiple=True, requeue=True)
    assert [body for body, _r, _c in drain(ch, q)] == expected


@pytest.mark.parametrize(
    "args,expected", [({}, ["3", "0", "1", "2"]), ({"x-delivery-limit": 5}, ["0", "1", "2", "3"])]
)
def test_basic_recover_returns_like_a_nack(ch, names, args, expected):
    q = names.queue("qq")
    declare(ch, q, **args)
    publish(ch, q, ["0", "1", "2", "3"])
    take(ch, q, 3)
    ch.basic_recover(requeue=True)
    assert [body for body, _r, _c in drain(ch, q)] == expected


def test_a_closed_channels_messages_go_back_to_the_front(connection, names):
    q = names.queue("qq")
    ch = connection.channel()
    declare(ch, q)
    publish(ch, q, ["1", "2", "3", "4", "5"])
    holder = connection.channel()
    take(holder, q, 4)
    holder.close()
    assert drain(ch, q) == [
        ("1", True, 1),
        ("2", True, 1),
        ("3", True, 1),
        ("4", True, 1),
        ("5", False, 0),
    ]
    # A consumer's too, when its channel closes.
    publish(ch, q, ["1", "2", "3", "4", "5"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=3)
    got = []
    consumer.basic_consume(q, lambda _c, _m, _p, body: got.append(body.decode()))
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    consumer.close()
    assert got == ["1", "2", "3"]
    assert [b for b, _r, _c in drain(ch, q)] == ["1", "2", "3", "4", "5"]


def test_delivery_count_header(connection, names):
    q = names.queue("qq")
    ch = connection.channel()
    declare(ch, q)
    publish(ch, q, ["x"])
    seen = []
    for _ in range(4):
        method, props, _body = ch.basic_get(q)
        seen.append((method.redelivered, props.headers["x-delivery-count"]))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [(False, 0), (True, 1), (True, 2), (True, 3)]
    # A consumer's first delivery has no header; later ones have it, in a table sorted by
    # key, replacing a publisher's own x-delivery-count.
    r = names.queue("qq")
    declare(ch, r)
    publish(ch, r, ["y"], headers={"z": 1, "b": 2, "x-delivery-count": 9})
    got = []
    c = connection.channel()
    c.basic_qos(prefetch_count=1)

    def on_message(channel, method, props, _body):
        got.append((method.redelivered, props.headers))
        channel.basic_nack(method.delivery_tag, requeue=len(got) < 2)

    c.basic_consume(r, on_message)
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert got[0] == (False, {"z": 1, "b": 2, "x-delivery-count": 9})
    assert got[1][0] is True
    assert list(got[1][1].items()) == [("b", 2), ("x-delivery-count", 1), ("z", 1)]
    c.close()
    # basic.get always has it, 0 the first time, overwriting the publisher's.
    publish(ch, r, ["z"], headers={"x-delivery-count": 7, "a": 1})
    method, props, _ = ch.basic_get(r, auto_ack=True)
    assert props.headers == {"a": 1, "x-delivery-count": 0}


@pytest.mark.parametrize(
    "limit,deliveries", [(2, 3), (0, 1), (-1, 1), ("2", None)], ids=["2", "0", "-1", "string"]
)
def test_poison_message_is_dropped_past_the_delivery_limit(ch, names, limit, deliveries):
    """Returned more than x-delivery-limit times: gone. RabbitMQ checks no type: -1 trips at
    the first return, a string never does."""
    q = names.queue("qq")
    declare(ch, q, **{"x-delivery-limit": limit})
    publish(ch, q, ["poison"])
    counts = []
    for _ in range(6):
        method, props, _ = ch.basic_get(q)
        if method is None:
            break
        counts.append(props.headers["x-delivery-count"])
        ch.basic_nack(method.delivery_tag, requeue=True)
    if deliveries is None:
        assert counts == [0, 1, 2, 3, 4, 5]
    else:
        assert counts == list(range(deliveries))


def test_poison_message_is_dead_lettered(ch, names):
    q, dlq, dlx = names.queue("qq"), names.queue("dlq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    declare(ch, q, **{"x-delivery-limit": 1, "x-dead-letter-exchange": dlx})
    publish(ch, q, ["w"], expiration="60000", headers={"h": "v"})
    for _ in range(2):
        method, _p, _b = ch.basic_get(q)
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert ch.basic_get(q)[0] is None
    method, props, body = _wait_get(ch, dlq)
    assert body == b"w"
    assert props.expiration is None
    headers = props.headers
    assert "x-delivery-count" not in headers  # the stored message is dead-lettered
    death = headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"], death["routing-keys"]) == (
        "delivery_limit",
        q,
        1,
        [q],
    )
    assert death["original-expiration"] == "60000"
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-first-death-queue"] == q
    assert headers["h"] == "v"


def test_rejected_message_is_dead_lettered_without_its_count(ch, names):
    q, dlq, dlx = names.queue("qq"), names.queue("dlq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    declare(ch, q, **{"x-dead-letter-exchange": dlx})
    publish(ch, q, ["v"])
    method, _p, _b = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, _b = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=False)
    _m, props, body = _wait_get(ch, dlq)
    assert body == b"v"
    assert "x-delivery-count" not in props.headers
    assert props.headers["x-death"][0]["reason"] == "rejected"


def _wait_get(ch, queue: str):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, props, body
        time.sleep(0.05)
    raise AssertionError(f"nothing arrived in {queue}")


# --- counts, purge ---------------------------------------------------------------------


def test_counts_are_of_ready_messages(ch, names):
    q = names.queue("qq")
    declare(ch, q)
    publish(ch, q, ["a", "b", "c"])
    method, _p, _b = ch.basic_get(q)
    assert method.message_count == 2
    assert declare(ch, q).method.message_count == 2
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_nack(method.delivery_tag, requeue=True)  # the unacked one survived the purge
    assert drain(ch, q) == [("a", True, 1)]


# --- limits, TTL ---------------------------------------------------------------------


def test_reject_publish_takes_messages_until_over_the_limit(ch, names):
    """A quorum queue refuses publishes once it is over x-max-length, not at it."""
    q, b = names.queue("qq"), names.queue("qq")
    declare(ch, q, **{"x-max-length": 2, "x-overflow": "reject-publish"})
    assert publish(ch, q, ["1", "2", "3", "4"]) == ["ack", "ack", "ack", "nack"]
    assert [m for m, _r, _c in drain(ch, q)] == ["1", "2", "3"]
    declare(ch, b, **{"x-max-length-bytes": 5, "x-overflow": "reject-publish"})
    assert publish(ch, b, ["12", "34", "56", "7"]) == ["ack", "ack", "ack", "nack"]


def test_reject_publish_counts_ready_messages_and_reopens_under_80_percent(ch, names):
    q = names.queue("qq")
    declare(ch, q, **{"x-max-length": 10, "x-overflow": "reject-publish"})
    assert publish(ch, q, [str(i) for i in range(12)]) == ["ack"] * 11 + ["nack"]
    take(ch, q, 2)  # 9 ready: over 80% of 10, still refused
    assert publish(ch, q, ["x"]) == ["nack"]
    take(ch, q, 1)  # 8 ready: in again
    assert publish(ch, q, ["y", "z", "w", "v"]) == ["ack", "ack", "ack", "nack"]


def test_reject_publish_dlx_acts_as_drop_head(ch, names):
    q, dlq, dlx = names.queue("qq"), names.queue("dlq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    declare(
        ch,
        q,
        **{"x-max-length": 2, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx},
    )
    assert publish(ch, q, ["1", "2", "3", "4"]) == ["ack"] * 4
    assert [m for m, _r, _c in drain(ch, q)] == ["3", "4"]
    dropped = [_wait_get(ch, dlq)[2], _wait_get(ch, dlq)[2]]
    assert dropped == [b"1", b"2"]
    assert ch.basic_get(dlq)[0] is None


def test_message_ttl_dead_letters_expired(ch, names):
    q, r, dlq, dlx = names.queue("qq"), names.queue("qq"), names.queue("dlq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    declare(ch, q, **{"x-message-ttl": 200, "x-dead-letter-exchange": dlx})
    publish(ch, q, ["a"])
    _m, props, body = _wait_get(ch, dlq)
    assert body == b"a"
    assert props.headers["x-death"][0]["reason"] == "expired"
    declare(ch, r, **{"x-dead-letter-exchange": dlx})
    publish(ch, r, ["b"], expiration="100")
    publish(ch, r, ["c"])
    _m, props, body = _wait_get(ch, dlq)
    assert body == b"b"
    assert props.headers["x-death"][0]["original-expiration"] == "100"
    assert drain(ch, r) == [("c", False, 0)]


# --- at-least-once dead-lettering ------------------------------------------------------


def _dead_letter_setup(ch, names, strategy: str, **extra):
    q, dlq, dlx = names.queue("qq"), names.queue("dlq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    declare(
        ch,
        q,
        **{
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-strategy": strategy,
            "x-overflow": "reject-publish",
            **extra,
        },
    )
    return q, dlq, dlx


def test_at_least_once_dead_lettering_reaches_the_target(ch, names):
    q, dlq, dlx = _dead_letter_setup(ch, names, "at-least-once")
    declare(ch, dlq)
    ch.queue_bind(dlq, dlx)
    publish(ch, q, ["a", "b"], expiration="60000")
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, body = _wait_get(ch, dlq)
    assert body == b"a"
    assert props.expiration is None
    assert props.headers["x-death"][0]["reason"] == "rejected"
    assert props.headers["x-death"][0]["original-expiration"] == "60000"
    assert drain(ch, q) == [("b", False, 0)]


@pytest.mark.parametrize(
    "strategy,publishes",
    [("at-least-once", ["ack", "nack"]), ("at-most-once", ["ack", "ack", "nack"])],
)
def test_unroutable_at_least_once_dead_letters_wait_and_count_to_the_limit(
    ch, names, strategy, publishes
):
    """At-least-once: a message no target took stays in the queue (not ready), and counts
    toward x-max-length; at-most-once drops it."""
    q, _dlq, _dlx = _dead_letter_setup(ch, names, strategy, **{"x-max-length": 1})
    publish(ch, q, ["a"])
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert publish(ch, q, ["b", "c", "d"][: len(publishes)]) == publishes
    assert ch.queue_declare(q, passive=True).method.message_count == len(publishes) - 1


@pytest.mark.leveret_only
def test_at_least_once_retries_until_a_target_takes_it(leveret_embedded, ch, names, monkeypatch):
    from leveret.broker.queues import quorum

    monkeypatch.setattr(quorum, "RETRY_INTERVAL", 0.1)
    q, dlq, dlx = _dead_letter_setup(ch, names, "at-least-once")
    full = names.queue("full")
    # A target that refuses (over its limit, reject-publish) and none at all: both wait.
    declare(ch, full, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    publish(ch, full, ["1", "2"])
    ch.queue_bind(full, dlx)
    publish(ch, q, ["a"])
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    queue = leveret_embedded.server.broker.vhosts["/"].queues[q]
    time.sleep(0.3)
    assert len(queue.dead_lettering) == 1
    ch.queue_purge(full)
    _m, props, body = _wait_get(ch, full)
    assert body == b"a"
    deadline = time.monotonic() + 5
    while queue.dead_lettering and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not queue.dead_lettering
    # Unroutable until a queue is bound.
    ch.queue_unbind(full, dlx)
    publish(ch, q, ["b"])
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(0.3)
    assert len(queue.dead_lettering) == 1
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    assert _wait_get(ch, dlq)[2] == b"b"


def test_at_least_once_needs_reject_publish(ch, names):
    """With x-overflow drop-head RabbitMQ falls back to at-most-once: unroutable is gone."""
    q, dlx = names.queue("qq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    declare(
        ch,
        q,
        **{
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-strategy": "at-least-once",
            "x-max-length": 1,
        },
    )
    publish(ch, q, ["a"])
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert publish(ch, q, ["b", "c"]) == ["ack", "ack"]  # drop-head: nothing waits, nothing refused
    assert drain(ch, q) == [("c", False, 0)]


# --- policies ---------------------------------------------------------------------------


@pytest.fixture
def operator(request):
    from access_setup import LeveretOperator, RabbitOperator
    from conftest import EXTERNAL_URL, TEST_WORKERS

    if EXTERNAL_URL or TEST_WORKERS:
        # A broker of workers is configured through its management API (worker 0).
        op = (
            RabbitOperator(request.getfixturevalue("workers_broker_api"))
            if TEST_WORKERS and not EXTERNAL_URL
            else RabbitOperator()
        )
        yield op
        op.cleanup()
    else:
        yield LeveretOperator(request.getfixturevalue("leveret_embedded"))


def _returned_until_gone(ch, q: str, tries: int = 6) -> list[int]:
    """Publish one message and nack it until it is gone: the counts it went out with."""
    publish(ch, q, ["p"])
    seen = []
    for _ in range(tries):
        method, props, _b = ch.basic_get(q)
        if method is None:
            break
        seen.append(props.headers["x-delivery-count"])
        ch.basic_nack(method.delivery_tag, requeue=True)
    return seen


def test_delivery_limit_policy(ch, names, operator):
    q, r = names.queue("pol-qq"), names.queue("pol-qq")
    declare(ch, q)
    declare(ch, r, **{"x-delivery-limit": 3})
    operator.set_policy(
        "/", names.token, f"^{names.token}|{q}|{r}$".replace(".", r"\."), {"delivery-limit": 1}
    )
    time.sleep(0.5)  # RabbitMQ applies a policy to a quorum queue asynchronously
    try:
        assert _returned_until_gone(ch, q) == [0, 1]
        assert _returned_until_gone(ch, r) == [0, 1]  # the lower of argument and policy
    finally:
        operator.clear_policy("/", names.token)


def test_overflow_policy_wins_over_the_argument(ch, names, operator):
    """For a quorum queue the policy's overflow replaces the argument (for a classic queue
    the argument wins), as RabbitMQ resolves them."""
    q = names.queue("pol-qq")
    declare(ch, q, **{"x-overflow": "drop-head"})
    operator.set_policy(
        "/", names.token, q.replace(".", r"\."), {"max-length": 1, "overflow": "reject-publish"}
    )
    time.sleep(0.5)
    try:
        assert publish(ch, q, ["1", "2", "3"]) == ["ack", "ack", "nack"]
    finally:
        operator.clear_policy("/", names.token)


def test_dead_letter_strategy_policy(ch, names, operator):
    q, dlx = names.queue("pol-qq"), names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    declare(
        ch, q, **{"x-dead-letter-exchange": dlx, "x-overflow": "reject-publish", "x-max-length": 1}
    )
    definition = {"dead-letter-strategy": "at-least-once"}
    operator.set_policy("/", names.token, q.replace(".", r"\."), definition)
    time.sleep(0.5)
    try:
        publish(ch, q, ["a"])
        method, _p, _b = ch.basic_get(q)
        ch.basic_reject(method.delivery_tag, requeue=False)  # unroutable: waits, counts
        assert publish(ch, q, ["b", "c"]) == ["ack", "nack"]
    finally:
        operator.clear_policy("/", names.token)


@pytest.mark.leveret_only
def test_policy_apply_to_quorum_queues(ch, names, operator):
    """RabbitMQ 3.12's `quorum_queues` (3.10 knows queues, exchanges, all)."""
    q, c = names.queue("pol-qq"), names.queue("pol-cq")
    declare(ch, q)
    ch.queue_declare(c, durable=True)
    operator.set_policy(
        "/", "only-quorum", f"^{names.token}$|pol-", {"max-length": 1}, apply_to="quorum_queues"
    )
    try:
        publish(ch, q, ["1", "2"])
        publish(ch, c, ["1", "2"])
        assert ch.queue_declare(q, passive=True).method.message_count == 1
        assert ch.queue_declare(c, passive=True).method.message_count == 2
    finally:
        operator.clear_policy("/", "only-quorum")


# --- the vhost's default queue type ------------------------------------------------------------


@pytest.fixture
def quorum_vhost(request, amqp_url):
    """A vhost whose default_queue_type is quorum (RabbitMQ 3.10: `defaultqueuetype` in the
    management API's PUT /api/vhosts/{name}); yields an AMQP URL into it."""
    from urllib.parse import quote

    from access_setup import RabbitOperator, unique
    from conftest import EXTERNAL_URL, TEST_WORKERS

    name = unique("qq-vhost")
    url = amqp_url.rsplit("/", 1)[0] + "/" + quote(name, safe="")
    if EXTERNAL_URL or TEST_WORKERS:
        # A broker of workers is configured through its management API (worker 0).
        api = request.getfixturevalue("workers_broker_api") if not EXTERNAL_URL else None
        op = RabbitOperator(api) if api else RabbitOperator()
        op._call("PUT", f"/vhosts/{quote(name, safe='')}", {"defaultqueuetype": "quorum"})
        op.created.append(f"/vhosts/{quote(name, safe='')}")
        if api:  # as the in-process case does: guest gets access to the new vhost
            op._call("PUT", f"/permissions/{quote(name, safe='')}/guest",
                     {"configure": ".*", "write": ".*", "read": ".*"})  # fmt: skip
        yield url
        op.cleanup()
    else:
        admin = request.getfixturevalue("leveret_embedded").admin
        admin.add_vhost(name, default_queue_type="quorum")
        admin.set_permissions("guest", name, ".*", ".*", ".*")
        yield url
        admin.delete_vhost(name)


def test_vhost_default_queue_type(quorum_vhost):
    from conftest import connection_params

    conn = pika.BlockingConnection(connection_params(quorum_vhost))
    try:
        ch = conn.channel()
        ch.queue_declare("durable", durable=True)
        ch.queue_declare("exclusive", durable=True, exclusive=True)
        ch.queue_declare("transient", durable=False)
        ch.queue_declare("classic", durable=True, arguments={"x-queue-type": "classic"})
        assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
        publish(ch, "durable", ["q"])
        publish(ch, "exclusive", ["c"])
        # Only the durable, shared queue became a quorum queue (x-delivery-count on get).
        assert drain(ch, "durable") == [("q", False, 0)]
        assert drain(ch, "exclusive") == [("c", False, None)]
        text = (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{}' in vhost '{}': "
        )
        vhost = conn._impl.params.virtual_host
        code, got = refused(
            ch.queue_declare, "durable", durable=True, arguments={"x-queue-type": "classic"}
        )
        assert (code, got) == (
            406,
            text.format("durable", vhost) + "received 'classic' but current is 'quorum'",
        )
        # A declaration without a type gets the default, so the classic queue is inequivalent.
        code, got = refused(conn.channel().queue_declare, "classic", durable=True)
        assert (code, got) == (
            406,
            text.format("classic", vhost) + "received 'quorum' but current is 'classic'",
        )
        code, got = refused(conn.channel().queue_declare, "", durable=True)
        assert (code, got) == (
            406,
            "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue",
        )
    finally:
        conn.close()


# --- the management API ---------------------------------------------------------------------

CLASSIC_ONLY_FIELDS = {
    "backing_queue_status",
    "exclusive_consumer_tag",
    "head_message_timestamp",
    "idle_since",
    "message_bytes_paged_out",
    "messages_paged_out",
    "messages_ready_ram",
    "messages_unacknowledged_ram",
    "recoverable_slaves",
    "single_active_consumer_tag",
}


def _api_get(api: str, path: str):
    import base64
    import json
    import urllib.request

    request = urllib.request.Request(
        api + path, headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _check_queue_record(api: str, amqp: str) -> None:
    from conftest import connection_params

    conn = pika.BlockingConnection(connection_params(amqp))
    try:
        ch = conn.channel()
        q = f"qq-mgmt-{time.monotonic_ns()}"
        declare(ch, q, **{"x-single-active-consumer": True, "x-delivery-limit": 5})
        publish(ch, q, ["hello", "hello", "hello"], delivery_mode=1)
        consumer = conn.channel()
        consumer.basic_qos(prefetch_count=1)
        consumer.basic_consume(q, lambda *a: None, consumer_tag="ct1")
        deadline = time.monotonic() + 20  # RabbitMQ reports a quorum queue every 5 s
        while True:
            conn.process_data_events(0.2)
            record = _api_get(api, f"/queues/%2F/{q}")
            if (
                "messages_dlx" in record
                and record.get("messages") == 3
                or time.monotonic() > deadline
            ):
                break
        listed = next(r for r in _api_get(api, "/queues/%2F") if r["name"] == q)
        ch.queue_delete(q)
    finally:
        conn.close()
    assert record["type"] == "quorum"
    assert not CLASSIC_ONLY_FIELDS & set(record)
    node = record["node"]
    assert (record["leader"], record["members"], record["online"]) == (node, [node], [node])
    assert record["open_files"] == {node: 0}
    assert (record["messages_dlx"], record["message_bytes_dlx"]) == (0, 0)
    assert (record["messages"], record["messages_ready"], record["messages_unacknowledged"]) == (
        3,
        2,
        1,
    )
    assert record["messages_persistent"] == 3  # all stored, transient ones too
    # (message_bytes: RabbitMQ 15, Leveret the ready messages' 10: docs/management.md#stand-ins)
    assert record["message_bytes_persistent"] == record["message_bytes"]
    assert record["single_active_consumer_ctag"] == "ct1"
    assert record["arguments"]["x-delivery-limit"] == 5
    assert not CLASSIC_ONLY_FIELDS & set(listed)
    assert {"leader", "members", "online", "messages_dlx"} <= set(listed)


def test_management_api_shows_quorum_fields():
    from access_setup import RABBITMQ_API
    from conftest import EXTERNAL_URL
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    if EXTERNAL_URL:
        _check_queue_record(RABBITMQ_API, EXTERNAL_URL)
        return
    with embedded_broker(ServerConfig(port=0, persistence=False, management_port=0)) as broker:
        api = f"http://127.0.0.1:{broker.server.management.port}/api"
        _check_queue_record(api, f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F")


def _api_call(api: str, method: str, path: str, body=None) -> int:
    import base64
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        api + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "content-type": "application/json",
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _check_vhost_records(api: str) -> None:
    from access_setup import unique

    with_type, without = unique("qq-vh"), unique("qq-vh")
    try:
        assert _api_call(api, "PUT", f"/vhosts/{with_type}", {"defaultqueuetype": "quorum"}) == 201
        assert _api_call(api, "PUT", f"/vhosts/{without}", {}) == 201
        record = _api_get(api, f"/vhosts/{with_type}")
        assert record["default_queue_type"] == "quorum"
        assert record["metadata"]["default_queue_type"] == "quorum"
        record = _api_get(api, f"/vhosts/{without}")
        assert record["default_queue_type"] == "undefined"
        assert "default_queue_type" not in record["metadata"]
        # Set when the vhost is created only, as RabbitMQ 3.10 does.
        assert _api_call(api, "PUT", f"/vhosts/{without}", {"defaultqueuetype": "quorum"}) == 204
        assert _api_get(api, f"/vhosts/{without}")["default_queue_type"] == "undefined"
    finally:
        _api_call(api, "DELETE", f"/vhosts/{with_type}")
        _api_call(api, "DELETE", f"/vhosts/{without}")


def test_management_api_vhost_default_queue_type():
    from access_setup import RABBITMQ_API
    from conftest import EXTERNAL_URL
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    if EXTERNAL_URL:
        _check_vhost_records(RABBITMQ_API)
        return
    with embedded_broker(ServerConfig(port=0, persistence=False, management_port=0)) as broker:
        api = f"http://127.0.0.1:{broker.server.management.port}/api"
        _check_vhost_records(api)
        # RabbitMQ answers an unknown type with 500 and a list of character codes; Leveret
        # with 400 and the reason (docs/differences.md).
        assert _api_call(api, "PUT", "/vhosts/bad-type", {"defaultqueuetype": "bogus"}) == 400
        assert _api_call(api, "GET", "/vhosts/bad-type") == 404


@pytest.mark.leveret_only
def test_server_setting_gives_rabbitmq_4s_default_delivery_limit():
    """--quorum-delivery-limit 20 is RabbitMQ 4's default; an argument still wins."""
    from conftest import connection_params
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    with embedded_broker(ServerConfig(port=0, persistence=False, quorum_delivery_limit=2)) as b:
        conn = pika.BlockingConnection(
            connection_params(f"amqp://guest:guest@127.0.0.1:{b.port}/%2F")
        )
        ch = conn.channel()
        declare(ch, "defaulted")
        declare(ch, "declared", **{"x-delivery-limit": 4})
        assert _returned_until_gone(ch, "defaulted", 8) == [0, 1, 2]
        assert _returned_until_gone(ch, "declared", 8) == [0, 1, 2, 3, 4]
        conn.close()


@pytest.mark.leveret_only
def test_quorum_delivery_limit_flag_and_file(tmp_path):
    from leveret.cli import build_parser
    from leveret.config_file import load

    args = build_parser().parse_args(["server", "--quorum-delivery-limit", "20"])
    assert args.quorum_delivery_limit == 20
    assert build_parser().parse_args(["server"]).quorum_delivery_limit is None
    path = tmp_path / "leveret.toml"
    path.write_text("quorum_delivery_limit = 20\n")
    assert load(str(path)) == {"quorum_delivery_limit": 20}


# --- Prometheus: dead-lettering counters by strategy ------------------------------------------


def _dead_lettered(metrics_url: str) -> dict[tuple[str, str], float]:
    """rabbitmq_global_messages_dead_lettered_<reason>_total of quorum queues, by
    (reason, dead_letter_strategy)."""
    import re
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    line = re.compile(r"^rabbitmq_global_messages_dead_lettered_(\w+)_total\{([^}]*)\} (\S+)$")
    for match in re.finditer(line.pattern, text, flags=re.M):
        reason, labels, value = match.groups()
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))  # in any order
        if fields.get("queue_type") == "rabbit_quorum_queue":
            out[(reason, fields["dead_letter_strategy"])] = float(value)
    return out


def _dead_letter_counts(amqp: str, metrics_url: str) -> None:
    from conftest import connection_params

    before = _dead_lettered(metrics_url)
    conn = pika.BlockingConnection(connection_params(amqp))
    try:
        ch = conn.channel()
        token = f"qq-dl-{time.monotonic_ns()}"
        ch.exchange_declare(token, "fanout")
        ch.queue_declare(token + ".dlq")
        ch.queue_bind(token + ".dlq", token)
        alo = {
            "x-dead-letter-exchange": token,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        cases = [
            (token + ".none", {}),  # rejected, disabled
            (token + ".amo", {"x-dead-letter-exchange": token}),  # rejected, at_most_once
            (token + ".alo", alo),  # rejected, at_least_once; then confirmed
        ]
        for q, args in cases:
            declare(ch, q, **args)
            publish(ch, q, ["m"])
            method, _p, _b = ch.basic_get(q)
            ch.basic_reject(method.delivery_tag, requeue=False)
        limited = token + ".limit"
        declare(ch, limited, **{"x-delivery-limit": 0})  # delivery_limit, disabled
        publish(ch, limited, ["m"])
        method, _p, _b = ch.basic_get(limited)
        ch.basic_nack(method.delivery_tag, requeue=True)
        want = {
            ("rejected", "disabled"): 1,
            ("rejected", "at_most_once"): 1,
            ("rejected", "at_least_once"): 1,
            ("confirmed", "at_least_once"): 1,
            ("delivery_limit", "disabled"): 1,
        }
        deadline = time.monotonic() + 15  # RabbitMQ's counters follow its queues' ticks
        while True:
            after = _dead_lettered(metrics_url)
            got = {k: after.get(k, 0) - before.get(k, 0) for k in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for q in [c[0] for c in cases] + [limited, token + ".dlq"]:
            ch.queue_delete(q)
        ch.exchange_delete(token)
    finally:
        conn.close()
    assert got == want


def test_dead_lettering_counters_by_strategy():
    """What a test run does alone: another client dead-lettering quorum messages at the
    same time (a shared RabbitMQ) would count too."""
    from conftest import EXTERNAL_URL
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    if EXTERNAL_URL:
        import os

        metrics = os.environ.get("LEVERET_TEST_PROMETHEUS", "http://127.0.0.1:15693/metrics")
        _dead_letter_counts(EXTERNAL_URL, metrics)
        return
    with embedded_broker(ServerConfig(port=0, persistence=False, prometheus_port=0)) as broker:
        metrics = f"http://127.0.0.1:{broker.server.prometheus.port}/metrics"
        _dead_letter_counts(f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F", metrics)
