"""Policies and operator policies, as RabbitMQ applies them.

Runs on Leveret and, with LEVERET_TEST_URL set, on the reference RabbitMQ (policies
set through its HTTP API), so the effects are pinned on both.
"""

from __future__ import annotations

import time

import pika
import pytest

from access_setup import LeveretOperator, RabbitOperator, unique
from conftest import EXTERNAL_URL


@pytest.fixture
def operator(request):
    if EXTERNAL_URL:
        op = RabbitOperator()
        yield op
        op.cleanup()
    else:
        yield LeveretOperator(request.getfixturevalue("leveret_embedded"))


def _count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def _publish(ch, queue: str, n: int, exchange: str = "") -> None:
    for i in range(n):
        ch.basic_publish(exchange, queue, f"m{i}".encode())


def _eventually(predicate, timeout: float = 5.0) -> bool:
    """RabbitMQ applies policies asynchronously; Leveret at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_max_length_policy_applies_to_an_existing_queue_at_once(operator, channel):
    q = unique("pol-q")
    channel.queue_declare(q, auto_delete=False)
    channel.confirm_delivery()
    _publish(channel, q, 5)
    operator.set_policy("/", q, f"^{q}$", {"max-length": 2}, apply_to="queues")
    try:
        assert _eventually(lambda: _count(channel, q) == 2)
        # The oldest went (drop-head): m3 and m4 are left.
        assert channel.basic_get(q, auto_ack=True)[2] == b"m3"
        operator.clear_policy("/", q)
        time.sleep(0.2 if EXTERNAL_URL else 0)
        _publish(channel, q, 5)
        assert _eventually(lambda: _count(channel, q) == 6)
    finally:
        channel.queue_delete(q)


def test_the_lower_of_argument_and_policy_limits_wins(operator, channel):
    """RabbitMQ takes the minimum for limits (its res_min), not the argument."""
    q = unique("pol-arg")
    channel.queue_declare(q, arguments={"x-max-length": 3})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 1}, apply_to="queues")
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        _publish(channel, q, 5)
        assert _eventually(lambda: _count(channel, q) == 1)
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_the_queue_argument_wins_for_overflow(operator, channel):
    q = unique("pol-ovf")
    channel.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"overflow": "drop-head"}, apply_to="queues")
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        _publish(channel, q, 2)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", q, b"third")
        assert channel.basic_get(q, auto_ack=True)[2] == b"m0"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_the_lower_operator_policy_value_wins(operator, channel):
    q = unique("pol-op")
    channel.queue_declare(q, arguments={"x-max-length": 10})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 4}, apply_to="queues", operator=True)
    try:
        assert _eventually(lambda: (_publish(channel, q, 1), _count(channel, q))[1] == 4)
        _publish(channel, q, 5)
        assert _count(channel, q) == 4
    finally:
        operator.clear_policy("/", q, operator=True)
        channel.queue_delete(q)


def test_the_higher_priority_policy_wins(operator, channel):
    q = unique("pol-prio")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q + "-low", f"^{q}", {"max-length": 1}, priority=1, apply_to="queues")
    operator.set_policy(
        "/", q + "-high", f"^{q}$", {"max-length": 3}, priority=5, apply_to="queues"
    )
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        _publish(channel, q, 6)
        assert _eventually(lambda: _count(channel, q) == 3)
    finally:
        operator.clear_policy("/", q + "-low")
        operator.clear_policy("/", q + "-high")
        channel.queue_delete(q)


def test_message_ttl_and_dead_letter_exchange_from_a_policy(operator, channel):
    q, dlq = unique("pol-ttl"), unique("pol-dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy(
        "/",
        q,
        f"^{q}$",
        {"message-ttl": 50, "dead-letter-exchange": "", "dead-letter-routing-key": dlq},
        apply_to="queues",
    )
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        _publish(channel, q, 1)
        assert _eventually(lambda: _count(channel, dlq) == 1)
        assert _count(channel, q) == 0
        headers = channel.basic_get(dlq, auto_ack=True)[1].headers
        assert headers["x-death"][0]["reason"] == "expired"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)
        channel.queue_delete(dlq)


def test_alternate_exchange_from_a_policy(operator, channel):
    x, ae, q = unique("pol-x"), unique("pol-ae"), unique("pol-aeq")
    channel.exchange_declare(x, "direct")
    channel.exchange_declare(ae, "fanout")
    channel.queue_declare(q)
    channel.queue_bind(q, ae)
    channel.confirm_delivery()
    operator.set_policy("/", x, f"^{x}$", {"alternate-exchange": ae}, apply_to="exchanges")
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        channel.basic_publish(x, "nowhere", b"lost?")
        assert _eventually(lambda: _count(channel, q) == 1)
    finally:
        operator.clear_policy("/", x)
        channel.exchange_delete(x)
        channel.exchange_delete(ae)
        channel.queue_delete(q)


def test_apply_to_exchanges_leaves_queues_alone(operator, channel):
    q = unique("pol-apply")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 1}, apply_to="exchanges")
    try:
        time.sleep(0.3 if EXTERNAL_URL else 0)
        _publish(channel, q, 3)
        assert _count(channel, q) == 3
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


@pytest.mark.leveret_only
@pytest.mark.parametrize(
    "args, message",
    [
        (("p", "(", {"max-length": 1}), "policy 'p': invalid regular expression '('"),
        (("p", ".*", {"max-lenght": 1}), "policy 'p': 'max-lenght' is not a recognised policy setting"),
        (("p", ".*", {"max-length": -1}), "invalid value for 'max-length' for policy 'p': {value_negative,-1}"),
        (("p", ".*", {"overflow": "explode"}), "invalid value for 'overflow' for policy 'p': invalid_overflow"),
        (("p", ".*", {}), "policy 'p': definition must be a non-empty object"),
    ],
)  # fmt: skip
def test_bad_policies_are_refused_when_set(leveret_embedded, args, message):
    from leveret.broker.errors import InvalidValue

    with pytest.raises(InvalidValue) as info:
        leveret_embedded.admin.set_policy("/", *args)
    assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(
        InvalidValue, match="'dead-letter-exchange' is not a recognised operator policy setting"
    ):
        leveret_embedded.admin.set_policy(
            "/", "op", ".*", {"dead-letter-exchange": "x"}, operator=True
        )
    assert leveret_embedded.admin.list_policies("/") == []


@pytest.mark.leveret_only
def test_policies_survive_a_restart_and_apply_to_recovered_queues(tmp_path):
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("capped", durable=True)
        conn.close()
        broker.admin.set_policy("/", "cap", "^capped$", {"max-length": 2}, 0, "queues")
        broker.admin.set_policy("/", "cap-op", ".*", {"max-length": 5}, 0, "queues", True)
    with embedded_broker(config) as broker:
        assert [p["name"] for p in broker.admin.list_policies("/")] == ["cap"]
        assert [p["name"] for p in broker.admin.list_operator_policies("/")] == ["cap-op"]
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", "capped", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare("capped", passive=True).method.message_count == 2
        conn.close()
