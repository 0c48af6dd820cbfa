"""Validation of queue and consumer x-arguments (texts measured on RabbitMQ 3.10.8)."""

from __future__ import annotations

import decimal

import pika.exceptions
import pytest

from ext_helpers import closed_with


def _declare_error(connection, names, arguments):
    q = names.queue()
    ch = connection.channel()
    with closed_with(406) as info:
        ch.queue_declare(q, arguments=arguments)
    assert connection.is_open  # a channel error
    return q, info.value.reply_text


def _invalid_arg(arg: str, q: str, detail: str) -> str:
    return f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': {detail}"


@pytest.mark.parametrize(
    ("arguments", "arg", "detail"),
    [
        ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
        ({"x-message-ttl": "abc"}, "x-message-ttl", '"expected integer, got longstr"'),
        ({"x-message-ttl": True}, "x-message-ttl", '"expected integer, got bool"'),
        (
            {"x-message-ttl": decimal.Decimal("1.5")},
            "x-message-ttl",
            '"expected integer, got decimal"',
        ),
        ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
        ({"x-expires": -5}, "x-expires", "{value_negative,-5}"),
        ({"x-expires": "x"}, "x-expires", '"expected integer, got longstr"'),
        ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
        ({"x-max-length": "10"}, "x-max-length", '"expected integer, got longstr"'),
        ({"x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
        ({"x-max-length-bytes": "x"}, "x-max-length-bytes", '"expected integer, got longstr"'),
        ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
        ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
        ({"x-max-priority": "5"}, "x-max-priority", '"expected integer, got longstr"'),
        ({"x-overflow": "foo"}, "x-overflow", "invalid_overflow"),
        ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
        (
            {"x-dead-letter-routing-key": "rk"},
            "x-dead-letter-routing-key",
            "routing_key_but_no_dlx_defined",
        ),
        (
            {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 5},
            "x-dead-letter-routing-key",
            "{unacceptable_type,signedint}",
        ),
        (
            {"x-single-active-consumer": "yes"},
            "x-single-active-consumer",
            "{unacceptable_type,longstr}",
        ),
        (
            {"x-single-active-consumer": 1},
            "x-single-active-consumer",
            "{unacceptable_type,signedint}",
        ),
        ({"x-queue-type": "bogus"}, "x-queue-type", "\"unsupported queue type 'bogus'\""),
        ({"x-queue-type": 5}, "x-queue-type", "{unacceptable_type,signedint}"),
        ({"x-queue-mode": "bogus"}, "x-queue-mode", "\"unsupported queue mode 'bogus'\""),
    ],
)
def test_invalid_queue_argument(connection, names, arguments, arg, detail):
    q, text = _declare_error(connection, names, arguments)
    assert text == _invalid_arg(arg, q, detail)


def test_dead_letter_exchange_of_wrong_type(connection, names):
    q, text = _declare_error(connection, names, {"x-dead-letter-exchange": 5})
    assert text == (
        "PRECONDITION_FAILED - invalid type 'signedint' for arg "
        f"'x-dead-letter-exchange' in queue '{q}' in vhost '/'"
    )


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": 0},
        {"x-message-ttl": 2**32},
        {"x-max-priority": 0},
        {"x-max-priority": 255},
        {"x-max-length": 0},
        {"x-max-length-bytes": 0},
        {"x-overflow": "drop-head"},
        {"x-overflow": "reject-publish"},
        {"x-overflow": "reject-publish-dlx"},
        {"x-queue-type": "classic"},
        {"x-queue-mode": "lazy"},
        {"x-queue-mode": "default"},
        {"x-single-active-consumer": False},
        {"x-dead-letter-exchange": ""},
        {"x-foo": "bar", "x-bar": 1, "not-even-x": [1, 2]},
    ],
)
def test_valid_queue_arguments_accepted(connection, names, arguments):
    q = names.queue()
    ch = connection.channel()
    ok = ch.queue_declare(q, arguments=arguments)
    assert ok.method.queue == q
    ch.queue_declare(q, arguments=arguments)  # and an identical redeclare is fine


@pytest.mark.parametrize(
    ("first", "second", "arg", "detail"),
    [
        (
            {"x-message-ttl": 100},
            {"x-message-ttl": 200},
            "x-message-ttl",
            "received '200' but current is '100'",
        ),
        (
            {"x-message-ttl": 100},
            {},
            "x-message-ttl",
            "received none but current is the value '100' of type 'signedint'",
        ),
        (
            {},
            {"x-message-ttl": 100},
            "x-message-ttl",
            "received the value '100' of type 'signedint' but current is none",
        ),
        (
            {"x-expires": 1000},
            {"x-expires": 2000},
            "x-expires",
            "received '2000' but current is '1000'",
        ),
        (
            {"x-max-priority": 5},
            {"x-max-priority": 6},
            "x-max-priority",
            "received '6' but current is '5'",
        ),
        (
            {"x-max-length": 5},
            {"x-max-length": 6},
            "x-max-length",
            "received '6' but current is '5'",
        ),
        (
            {"x-overflow": "drop-head"},
            {"x-overflow": "reject-publish"},
            "x-overflow",
            "received 'reject-publish' but current is 'drop-head'",
        ),
        (
            {"x-dead-letter-exchange": "a"},
            {"x-dead-letter-exchange": "b"},
            "x-dead-letter-exchange",
            "received 'b' but current is 'a'",
        ),
        (
            {"x-single-active-consumer": True},
            {},
            "x-single-active-consumer",
            "received none but current is the value 'true' of type 'bool'",
        ),
    ],
)
def test_redeclare_with_different_argument(connection, names, first, second, arg, detail):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q, arguments=first)
    with closed_with(406) as info:
        ch.queue_declare(q, arguments=second)
    assert info.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{q}' in vhost '/': {detail}"
    )
    # the queue is unchanged
    assert connection.channel().queue_declare(q, arguments=first).method.queue == q


def test_redeclare_with_different_x_message_ttl_is_inequivalent(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments={"x-message-ttl": 200})
    assert info.value.reply_code == 406
    assert "inequivalent arg 'x-message-ttl'" in info.value.reply_text


def test_unknown_arguments_not_compared_on_redeclare(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q, arguments={"x-foo": 1, "x-message-ttl": 100})
    ch.queue_declare(q, arguments={"x-foo": 2, "x-message-ttl": 100})
    ch.queue_declare(q, arguments={"x-message-ttl": 100})


def test_passive_redeclare_ignores_arguments(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ok = ch.queue_declare(q, passive=True, arguments={"x-message-ttl": 999})
    assert ok.method.queue == q


def test_consumer_priority_of_wrong_type(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q)
    with closed_with(406) as info:
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})
    assert info.value.reply_text == _invalid_arg("x-priority", q, '"expected integer, got longstr"')


def test_unknown_consumer_arguments_accepted(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q)
    tag = ch.basic_consume(q, lambda *a: None, arguments={"x-foo": 1, "x-priority": 2**40})
    ch.basic_cancel(tag)
