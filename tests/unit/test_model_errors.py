"""The model's errors without a connection: a VirtualHost raises broker.errors, and the
AMQP front end's table (server.amqp_errors) gives each the code RabbitMQ answers with.

The reply texts and codes over the wire are pinned against RabbitMQ by the AMQP tests
(test_queues, test_exchanges, test_streams, ...); this checks the seam between the two.
"""

from __future__ import annotations

import pytest

from leveret.broker.errors import (
    AccessRefused,
    InvalidValue,
    LimitReached,
    NotFound,
    NotSupported,
    PreconditionFailed,
    ResourceLocked,
    UnknownType,
)
from leveret.broker.vhost import VirtualHost
from leveret.protocol.errors import ChannelError, ConnectionError_
from leveret.server.amqp_errors import amqp_error


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


def test_declarations_raise_model_errors_with_rabbitmqs_texts(vhost):
    cases = [
        (lambda: vhost.get_queue("q"), NotFound, "no queue 'q' in vhost '/'"),
        (lambda: vhost.get_exchange("x"), NotFound, "no exchange 'x' in vhost '/'"),
        (lambda: vhost.declare_exchange("", "direct"), AccessRefused,
         "operation not permitted on the default exchange"),
        (lambda: vhost.declare_exchange("amq.mine", "direct"), AccessRefused,
         "exchange name 'amq.mine' contains reserved prefix 'amq.*'"),
        (lambda: vhost.declare_exchange("x", "nonsense"), UnknownType,
         "unknown exchange type 'nonsense'"),
        (lambda: vhost.declare_queue("amq.q"), AccessRefused,
         "queue name 'amq.q' contains reserved prefix 'amq.*'"),
        (lambda: vhost.declare_queue("q", arguments={"x-max-length": -1}), PreconditionFailed,
         "invalid arg 'x-max-length' for queue 'q' in vhost '/'"),
    ]  # fmt: skip
    for call, kind, text in cases:
        with pytest.raises(kind) as info:
            call()
        assert str(info.value).startswith(text), str(info.value)


def test_redeclaring_differently_and_other_connections_exclusive_queues(vhost):
    vhost.declare_exchange("logs", "fanout")
    with pytest.raises(PreconditionFailed) as info:
        vhost.declare_exchange("logs", "direct")
    assert str(info.value) == (
        "inequivalent arg 'type' for exchange 'logs' in vhost '/': "
        "received 'direct' but current is 'fanout'"
    )
    owner, other = object(), object()
    vhost.declare_queue("mine", exclusive=True, connection=owner)
    with pytest.raises(ResourceLocked):
        vhost.get_queue("mine", other)
    assert vhost.get_queue("mine", owner).name == "mine"
    vhost.limits["max-queues"] = 1
    with pytest.raises(LimitReached) as info:
        vhost.declare_queue("second")
    assert (
        str(info.value) == "cannot declare queue 'second': queue limit in vhost '/' (1) is reached"
    )


@pytest.mark.parametrize(
    "error, kind, code",
    [
        (NotFound("a"), ChannelError, 404),
        (AccessRefused("a"), ChannelError, 403),
        (ResourceLocked("a"), ChannelError, 405),
        (PreconditionFailed("a"), ChannelError, 406),
        (LimitReached("a"), ChannelError, 406),
        (InvalidValue("a"), ChannelError, 406),
        (UnknownType("a"), ConnectionError_, 503),
        (NotSupported("a"), ConnectionError_, 540),
    ],
)
def test_the_amqp_front_end_codes(error, kind, code):
    amqp = amqp_error(error)
    assert type(amqp) is kind and amqp.code == code
    assert amqp.reply_text.endswith(" - a")
