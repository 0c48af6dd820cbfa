"""Policies and operator policies, as RabbitMQ applies them.

Runs on Leveret and, with LEVERET_TEST_URL set, on the reference RabbitMQ (policies
set through its HTTP API), so the effects are pinned on both. RabbitMQ applies a
policy change asynchronously, so checks there poll (`_eventually`) or wait a moment
(`_settle`); Leveret applies it before set_policy returns.
"""

from __future__ import annotations

import json
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _settle() -> None:
    """Let RabbitMQ's queues take a policy change (a message to each queue process)."""
    time.sleep(0.3 if EXTERNAL_URL else 0)


def _dead_letter_one(ch, queue: str) -> None:
    method, _, _ = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    # basic.reject has no reply: a synchronous call fences it, so a policy set next
    # cannot overtake it (the rejected message would then be dead-lettered by it).
    ch.queue_declare(queue, passive=True)


# --- limits: applied at once, the lowest of argument, policy and operator policy ------


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
        _settle()
        _publish(channel, q, 5)
        assert _eventually(lambda: _count(channel, q) == 6)
    finally:
        channel.queue_delete(q)


def test_a_changed_policy_applies_at_once_and_one_that_stops_matching_lets_go(operator, channel):
    q = unique("pol-chg")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 5}, apply_to="queues")
    try:
        _settle()
        _publish(channel, q, 6)
        assert _eventually(lambda: _count(channel, q) == 5)
        operator.set_policy("/", q, f"^{q}$", {"max-length": 2}, apply_to="queues")
        assert _eventually(lambda: _count(channel, q) == 2)
        operator.set_policy("/", q, f"^{q}-other$", {"max-length": 1}, apply_to="queues")
        _settle()
        _publish(channel, q, 3)
        assert _eventually(lambda: _count(channel, q) == 5)
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_a_queue_declared_later_gets_the_policy_at_declare(operator, channel):
    q = unique("pol-later")
    operator.set_policy("/", q, f"^{q}$", {"max-length": 1}, apply_to="queues")
    try:
        _settle()
        channel.queue_declare(q)
        channel.confirm_delivery()
        _publish(channel, q, 3)
        assert _count(channel, q) == 1
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


@pytest.mark.parametrize("argument, policy, expected", [(3, 1, 1), (1, 3, 1)])
def test_the_lower_of_argument_and_policy_limits_wins(
    operator, channel, argument, policy, expected
):
    """RabbitMQ takes the minimum for limits: a lower x-max-length beats the policy,
    a higher one does not."""
    q = unique("pol-arg")
    channel.queue_declare(q, arguments={"x-max-length": argument})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": policy}, apply_to="queues")
    try:
        _settle()
        _publish(channel, q, 5)
        assert _eventually(lambda: _count(channel, q) == expected)
        assert channel.basic_get(q, auto_ack=True)[2] == b"m4"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_max_length_bytes_policy_drops_heads_at_once(operator, channel):
    q = unique("pol-mlb")
    channel.queue_declare(q)
    channel.confirm_delivery()
    _publish(channel, q, 5)  # 2 bytes each
    operator.set_policy("/", q, f"^{q}$", {"max-length-bytes": 5}, apply_to="queues")
    try:
        assert _eventually(lambda: _count(channel, q) == 2)
        assert channel.basic_get(q, auto_ack=True)[2] == b"m3"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_overflow_reject_publish_from_a_policy(operator, channel):
    q = unique("pol-rp")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy(
        "/", q, f"^{q}$", {"max-length": 1, "overflow": "reject-publish"}, apply_to="queues"
    )
    try:
        _settle()
        _publish(channel, q, 1)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", q, b"second")
        assert channel.basic_get(q, auto_ack=True)[2] == b"m0"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_the_queue_argument_wins_for_overflow(operator, channel):
    q = unique("pol-ovf")
    channel.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"overflow": "drop-head"}, apply_to="queues")
    try:
        _settle()
        _publish(channel, q, 2)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", q, b"third")
        assert channel.basic_get(q, auto_ack=True)[2] == b"m0"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_expires_from_a_policy_deletes_an_idle_queue(operator, channel):
    q = unique("pol-exp")
    channel.queue_declare(q)
    operator.set_policy("/", q, f"^{q}$", {"expires": 100}, apply_to="queues")
    try:
        time.sleep(0.6)  # no polling: on RabbitMQ a passive declare renews the lease
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(q, passive=True)
        assert info.value.reply_code == 404
    finally:
        operator.clear_policy("/", q)


# --- operator policies ------------------------------------------------------------------


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


def test_operator_and_user_policy_apply_together_lowest_wins(operator, channel):
    q = unique("pol-opuser")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 2}, apply_to="queues")
    operator.set_policy("/", q, f"^{q}$", {"max-length": 4}, apply_to="queues", operator=True)
    try:
        _settle()
        _publish(channel, q, 6)
        assert _eventually(lambda: _count(channel, q) == 2)
        operator.clear_policy("/", q)  # the operator's cap is what is left
        _settle()
        _publish(channel, q, 6)
        assert _eventually(lambda: _count(channel, q) == 4)
        operator.clear_policy("/", q, operator=True)
        _settle()
        _publish(channel, q, 3)
        assert _eventually(lambda: _count(channel, q) == 7)
    finally:
        channel.queue_delete(q)


# --- which policy applies ---------------------------------------------------------------


def test_the_higher_priority_policy_wins(operator, channel):
    q = unique("pol-prio")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q + "-low", f"^{q}", {"max-length": 1}, priority=1, apply_to="queues")
    operator.set_policy(
        "/", q + "-high", f"^{q}$", {"max-length": 3}, priority=5, apply_to="queues"
    )
    try:
        _settle()
        _publish(channel, q, 6)
        assert _eventually(lambda: _count(channel, q) == 3)
        operator.clear_policy("/", q + "-high")
        assert _eventually(lambda: _count(channel, q) == 1)
    finally:
        operator.clear_policy("/", q + "-low")
        channel.queue_delete(q)


@pytest.mark.leveret_only
def test_equal_priorities_go_to_the_first_name(operator, channel):
    """RabbitMQ leaves a tie to its table order (it varies with the names); Leveret
    picks the first name, so the outcome does not change between runs."""
    q = unique("pol-tie")
    channel.queue_declare(q)
    channel.confirm_delivery()
    for name, n in (("zeta", 1), ("alpha", 2), ("mid", 3)):
        operator.set_policy("/", f"{q}-{name}", f"^{q}$", {"max-length": n}, 3, "queues")
    _publish(channel, q, 6)
    assert _count(channel, q) == 2


def test_apply_to_exchanges_leaves_queues_alone(operator, channel):
    q = unique("pol-apply")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length": 1}, apply_to="exchanges")
    try:
        _settle()
        _publish(channel, q, 3)
        assert _count(channel, q) == 3
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_apply_to_queues_leaves_exchanges_alone(operator, channel):
    x, ae, q = unique("pol-xq"), unique("pol-aeq"), unique("pol-qq")
    channel.exchange_declare(x, "direct")
    channel.exchange_declare(ae, "fanout")
    channel.queue_declare(q)
    channel.queue_bind(q, ae)
    channel.confirm_delivery()
    operator.set_policy("/", x, f"^{x}$", {"alternate-exchange": ae}, apply_to="queues")
    try:
        _settle()
        channel.basic_publish(x, "nowhere", b"lost")
        assert _count(channel, q) == 0
    finally:
        operator.clear_policy("/", x)
        channel.exchange_delete(x)
        channel.exchange_delete(ae)
        channel.queue_delete(q)


@pytest.mark.leveret_only
@pytest.mark.parametrize("apply_to, capped", [("classic_queues", "classic"), ("streams", "stream")])
def test_apply_to_one_queue_type(leveret_embedded, channel, apply_to, capped):
    """RabbitMQ 3.12's apply-to values (3.10, the reference, refuses them)."""
    classic, stream = unique("pol-classic"), unique("pol-stream")
    channel.queue_declare(classic)
    channel.queue_declare(
        stream,
        durable=True,
        arguments={"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 100},
    )
    channel.confirm_delivery()
    for _ in range(20):
        channel.basic_publish("", classic, b"x" * 50)
        channel.basic_publish("", stream, b"x" * 50)
    leveret_embedded.admin.set_policy(
        "/", "by-type", "^pol-", {"max-length-bytes": 200}, 0, apply_to
    )
    vhost = leveret_embedded.server.broker.vhosts["/"]
    first = leveret_embedded.call(lambda: vhost.queues[stream].log.first)
    assert (_count(channel, classic) == 4) == (capped == "classic")
    assert (first > 0) == (capped == "stream")


# --- message TTL and dead-lettering -----------------------------------------------------


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
        _settle()
        _publish(channel, q, 1)
        assert _eventually(lambda: _count(channel, dlq) == 1)
        assert _count(channel, q) == 0
        headers = channel.basic_get(dlq, auto_ack=True)[1].headers
        assert headers["x-death"][0]["reason"] == "expired"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)
        channel.queue_delete(dlq)


def test_a_ttl_policy_spares_messages_queued_before_it(operator, channel):
    """A message's expiry is fixed when it is enqueued, and only the head is checked."""
    q = unique("pol-ttl-old")
    channel.queue_declare(q)
    channel.confirm_delivery()
    _publish(channel, q, 1)
    operator.set_policy("/", q, f"^{q}$", {"message-ttl": 20}, apply_to="queues")
    try:
        _settle()
        _publish(channel, q, 1)
        time.sleep(0.3)
        assert _count(channel, q) == 2  # the expired m1 waits behind m0
        assert channel.basic_get(q, auto_ack=True)[2] == b"m0"
        assert _eventually(lambda: _count(channel, q) == 0)
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)


def test_messages_keep_the_ttl_they_were_queued_with_after_the_policy_goes(operator, channel):
    q = unique("pol-ttl-rm")
    channel.queue_declare(q)
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"message-ttl": 300}, apply_to="queues")
    _settle()
    _publish(channel, q, 1)
    operator.clear_policy("/", q)
    try:
        _settle()
        _publish(channel, q, 1)
        time.sleep(0.5)
        assert _eventually(lambda: _count(channel, q) == 1)
        assert channel.basic_get(q, auto_ack=True)[2] == b"m0"  # the second publish
    finally:
        channel.queue_delete(q)


def test_a_dead_letter_exchange_policy_applies_to_later_dead_letters(operator, channel):
    q, dlq = unique("pol-dlx"), unique("pol-dlx-t")
    channel.queue_declare(dlq)
    channel.queue_declare(q)
    channel.confirm_delivery()
    _publish(channel, q, 2)
    _dead_letter_one(channel, q)  # no DLX yet: dropped
    operator.set_policy(
        "/",
        q,
        f"^{q}$",
        {"dead-letter-exchange": "", "dead-letter-routing-key": dlq},
        apply_to="queues",
    )
    try:
        _settle()
        _dead_letter_one(channel, q)
        assert _eventually(lambda: _count(channel, dlq) == 1)
        headers = channel.basic_get(dlq, auto_ack=True)[1].headers
        assert headers["x-death"][0]["reason"] == "rejected"
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)
        channel.queue_delete(dlq)


def test_the_dead_letter_arguments_beat_the_policy(operator, channel):
    q, mine, theirs = unique("pol-dlxarg"), unique("pol-mine"), unique("pol-theirs")
    channel.queue_declare(mine)
    channel.queue_declare(theirs)
    channel.queue_declare(
        q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": mine}
    )
    channel.confirm_delivery()
    operator.set_policy(
        "/",
        q,
        f"^{q}$",
        {"dead-letter-exchange": "amq.direct", "dead-letter-routing-key": theirs},
        apply_to="queues",
    )
    try:
        _settle()
        _publish(channel, q, 1)
        _dead_letter_one(channel, q)
        assert _eventually(lambda: _count(channel, mine) == 1)
        assert _count(channel, theirs) == 0
    finally:
        operator.clear_policy("/", q)
        for name in (q, mine, theirs):
            channel.queue_delete(name)


def test_a_policy_routing_key_completes_a_dead_letter_exchange_argument(operator, channel):
    """Each key on its own: the argument's DLX, the policy's routing key."""
    q, target = unique("pol-dlrk"), unique("pol-dlrk-t")
    channel.queue_declare(target)
    channel.queue_declare(q, arguments={"x-dead-letter-exchange": ""})
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"dead-letter-routing-key": target}, apply_to="queues")
    try:
        _settle()
        _publish(channel, q, 1)
        _dead_letter_one(channel, q)
        assert _eventually(lambda: _count(channel, target) == 1)
    finally:
        operator.clear_policy("/", q)
        channel.queue_delete(q)
        channel.queue_delete(target)


# --- exchanges: alternate-exchange ------------------------------------------------------


def test_alternate_exchange_from_a_policy(operator, channel):
    x, ae, q = unique("pol-x"), unique("pol-ae"), unique("pol-aeq")
    channel.exchange_declare(x, "direct")
    channel.exchange_declare(ae, "fanout")
    channel.queue_declare(q)
    channel.queue_bind(q, ae)
    channel.confirm_delivery()
    operator.set_policy("/", x, f"^{x}$", {"alternate-exchange": ae}, apply_to="exchanges")
    try:
        _settle()
        channel.basic_publish(x, "nowhere", b"lost?")
        assert _eventually(lambda: _count(channel, q) == 1)
        operator.clear_policy("/", x)
        _settle()
        channel.basic_publish(x, "nowhere", b"lost")
        assert _count(channel, q) == 1
    finally:
        channel.exchange_delete(x)
        channel.exchange_delete(ae)
        channel.queue_delete(q)


def test_an_exchange_declared_later_gets_the_alternate_exchange(operator, channel):
    x, ae, q = unique("pol-xl"), unique("pol-ael"), unique("pol-aelq")
    channel.exchange_declare(ae, "fanout")
    channel.queue_declare(q)
    channel.queue_bind(q, ae)
    operator.set_policy("/", x, f"^{x}$", {"alternate-exchange": ae}, apply_to="all")
    try:
        _settle()
        channel.exchange_declare(x, "topic")
        channel.confirm_delivery()
        channel.basic_publish(x, "nowhere", b"lost?")
        assert _eventually(lambda: _count(channel, q) == 1)
    finally:
        operator.clear_policy("/", x)
        channel.exchange_delete(x)
        channel.exchange_delete(ae)
        channel.queue_delete(q)


def test_the_alternate_exchange_argument_beats_the_policy(operator, channel):
    x, ae1, ae2, q1, q2 = (unique(p) for p in ("pol-x", "pol-ae1", "pol-ae2", "pol-q1", "pol-q2"))
    channel.exchange_declare(ae1, "fanout")
    channel.exchange_declare(ae2, "fanout")
    channel.queue_declare(q1)
    channel.queue_declare(q2)
    channel.queue_bind(q1, ae1)
    channel.queue_bind(q2, ae2)
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": ae1})
    channel.confirm_delivery()
    operator.set_policy("/", x, f"^{x}$", {"alternate-exchange": ae2}, apply_to="exchanges")
    try:
        _settle()
        channel.basic_publish(x, "nowhere", b"lost?")
        assert _eventually(lambda: _count(channel, q1) == 1)
        assert _count(channel, q2) == 0
    finally:
        operator.clear_policy("/", x)
        for e in (x, ae1, ae2):
            channel.exchange_delete(e)
        channel.queue_delete(q1)
        channel.queue_delete(q2)


# --- declarations stay as declared ------------------------------------------------------


def test_redeclaration_compares_the_arguments_not_the_policy(operator, channel):
    q = unique("pol-redecl")
    channel.queue_declare(q)
    operator.set_policy("/", q, f"^{q}$", {"max-length": 2}, apply_to="queues")
    try:
        _settle()
        channel.queue_declare(q)  # the same (no) arguments: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(q, arguments={"x-max-length": 2})
        assert info.value.reply_code == 406
        assert info.value.reply_text == (
            f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in vhost"
            " '/': received the value '2' of type 'signedint' but current is none"
        )
    finally:
        operator.clear_policy("/", q)
        channel.connection.channel().queue_delete(q)


# --- streams: max-length-bytes, max-age, segment size -----------------------------------


def test_a_max_length_bytes_policy_trims_a_stream(operator, channel):
    q = unique("pol-stream")
    channel.queue_declare(
        q,
        durable=True,
        arguments={"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 200},
    )
    channel.confirm_delivery()
    operator.set_policy("/", q, f"^{q}$", {"max-length-bytes": 500}, apply_to="queues")
    try:
        _settle()
        for _ in range(100):
            channel.basic_publish("", q, b"x" * 50)
        channel.basic_qos(prefetch_count=10)
        got: list[int] = []
        channel.basic_consume(
            q,
            lambda ch, m, p, b: got.append(p.headers["x-stream-offset"]),
            arguments={"x-stream-offset": "first"},
        )
        assert _eventually(lambda: (channel.connection.process_data_events(0.05), got)[1])
        assert got[0] > 0  # the oldest segments are gone
    finally:
        operator.clear_policy("/", q)
        channel.connection.channel().queue_delete(q)


@pytest.mark.leveret_only
def test_stream_policies_take_the_lowest_and_apply_at_once(leveret_embedded, channel):
    q = unique("pol-sx")
    channel.queue_declare(
        q,
        durable=True,
        arguments={
            "x-queue-type": "stream",
            "x-max-age": "7D",
            "x-stream-max-segment-size-bytes": 100,
        },
    )
    channel.confirm_delivery()
    for _ in range(20):
        channel.basic_publish("", q, b"x" * 50)
    vhost = leveret_embedded.server.broker.vhosts["/"]

    def log():
        stream_log = vhost.queues[q].log
        return stream_log.max_age_ms, stream_log.max_bytes, stream_log.first

    definition = {"max-age": "1D", "max-length-bytes": 300, "stream-max-segment-size-bytes": 9}
    leveret_embedded.call(lambda: vhost.set_policy("s", f"^{q}$", definition))
    max_age, max_bytes, first = leveret_embedded.call(log)
    assert (max_age, max_bytes) == (86400_000, 300) and first > 0
    assert leveret_embedded.call(lambda: vhost.queues[q].log.max_segment_bytes) == 9
    leveret_embedded.call(lambda: vhost.set_policy("s", f"^{q}$", {"max-age": "30D"}))
    assert leveret_embedded.call(log)[:2] == (7 * 86400_000, None)
    leveret_embedded.call(lambda: vhost.clear_policy("s"))
    assert leveret_embedded.call(lambda: vhost.queues[q].log.max_segment_bytes) == 100


# --- refused when set -------------------------------------------------------------------


@pytest.mark.leveret_only
@pytest.mark.parametrize(
    "args, message",
    [
        (("p", "(", {"max-length": 1}), "policy 'p': invalid regular expression '(': missing ), unterminated subpattern at position 0"),
        (("p", 5, {"max-length": 1}), "policy 'p': pattern should be a string but was 5"),
        (("p", ".*", {"max-lenght": 1}), "policy 'p': 'max-lenght' is not a recognised policy setting; known: message-ttl,"),
        (("p", ".*", {"max-length": 1, "a": 1, "b": 2}), "policy 'p': 'a', 'b' are not recognised policy settings; known:"),
        (("p", ".*", {"max-length": -1}), "policy 'p': -1 is not a valid maximum length"),
        (("p", ".*", {"max-length": True}), "policy 'p': true is not a valid maximum length"),
        (("p", ".*", {"max-length-bytes": "x"}), 'policy \'p\': "x" is not a valid maximum length in bytes'),
        (("p", ".*", {"message-ttl": -1}), "policy 'p': -1 is not a valid message TTL"),
        (("p", ".*", {"message-ttl": 1.5}), "policy 'p': 1.5 is not a valid message TTL"),
        (("p", ".*", {"expires": 0}), "policy 'p': 0 is not a valid queue expiry"),
        (("p", ".*", {"overflow": "explode"}), 'policy \'p\': "explode" is not a valid overflow value'),
        (("p", ".*", {"dead-letter-exchange": 5}), "policy 'p': 5 is not a valid dead letter exchange name"),
        (("p", ".*", {"dead-letter-routing-key": 5}), "policy 'p': 5 is not a valid dead letter routing key"),
        (("p", ".*", {"queue-mode": "weird"}), 'policy \'p\': "weird" is not a valid queue-mode value'),
        (("p", ".*", {"max-age": "7X"}), 'policy \'p\': "7X" is not a valid max age'),
        (("p", ".*", {"max-age": "0D"}), 'policy \'p\': "0D" is not a valid max age'),
        (("p", ".*", {"stream-max-segment-size-bytes": -1}), "policy 'p': -1 is not a valid segment size"),
        (("p", ".*", {"alternate-exchange": 5}), "policy 'p': 5 is not a valid alternate exchange name"),
        (("p", ".*", {"delivery-limit": -1}), "policy 'p': -1 is not a valid delivery limit"),
        (("p", ".*", {}), "policy 'p': no policy provided"),
        (("p", ".*", [1]), "policy 'p': definition should be an object but was [1]"),
        (("p", ".*", {"max-length": 1}, "x"), "policy 'p': priority should be a number, actually was \"x\""),
        (("p", ".*", {"max-length": 1}, 0, "bogus"), "policy 'p': apply-to 'bogus' unrecognised; should be 'queues', 'exchanges', 'all', 'classic_queues', 'quorum_queues' or 'streams'"),
        (("", ".*", {"max-length": 1}), "policy name must be a non-empty string"),
    ],
)  # fmt: skip
def test_bad_policies_are_refused_when_set(leveret_embedded, args, message):
    """The sentences are RabbitMQ 3.10's (its HTTP API's), values shown as JSON."""
    from leveret.broker.errors import InvalidValue
    from leveret.broker.policies import PolicyError

    with pytest.raises(PolicyError) as info:
        leveret_embedded.admin.set_policy("/", *args)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidValue)
    assert leveret_embedded.admin.list_policies("/") == []


@pytest.mark.leveret_only
@pytest.mark.parametrize("key, value", [("dead-letter-exchange", "x"), ("overflow", "drop-head"),
                                        ("max-age", "1D"), ("alternate-exchange", "x"),
                                        ("queue-mode", "lazy")])  # fmt: skip
def test_operator_policies_may_only_cap_resources(leveret_embedded, key, value):
    from leveret.broker.policies import PolicyError

    with pytest.raises(PolicyError) as info:
        leveret_embedded.admin.set_operator_policy("/", "op", ".*", {key: value})
    assert str(info.value) == (
        f"operator policy 'op': '{key}' is not a recognised operator policy setting; known: "
        "expires, message-ttl, max-length, max-length-bytes, delivery-limit, "
        "max-in-memory-length, max-in-memory-bytes"
    )
    assert leveret_embedded.admin.list_operator_policies("/") == []


@pytest.mark.leveret_only
def test_quorum_only_settings_are_accepted_without_effect(leveret_embedded, channel):
    """RabbitMQ accepts them (definitions exports carry them); classic queues ignore them."""
    q = unique("pol-quorum")
    channel.queue_declare(q)
    definition = {"delivery-limit": 3, "max-in-memory-length": 1, "max-in-memory-bytes": 1}
    leveret_embedded.admin.set_operator_policy("/", "op", f"^{q}$", definition)
    leveret_embedded.admin.set_policy("/", "p", f"^{q}$", definition)
    channel.confirm_delivery()
    _publish(channel, q, 3)
    assert _count(channel, q) == 3


@pytest.mark.leveret_only
def test_clearing_a_policy_that_does_not_exist(leveret_embedded):
    from leveret.broker.errors import NotFound

    with pytest.raises(NotFound, match="^policy 'nope' does not exist in vhost '/'$"):
        leveret_embedded.admin.clear_policy("/", "nope")
    with pytest.raises(NotFound, match="^operator policy 'nope' does not exist in vhost '/'$"):
        leveret_embedded.admin.clear_operator_policy("/", "nope")


def test_the_http_api_refuses_a_bad_policy_with_the_reason():
    """Leveret's management API and RabbitMQ's answer 400 and name the bad value."""
    from access_setup import RABBITMQ_API
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    if EXTERNAL_URL:
        _refused_over_http(RABBITMQ_API)
        return
    with embedded_broker(ServerConfig(port=0, persistence=False, management_port=0)) as broker:
        _refused_over_http(f"http://127.0.0.1:{broker.server.management.port}/api")


def _refused_over_http(api: str) -> None:
    import urllib.error
    import urllib.request

    body = json.dumps({"pattern": ".*", "definition": {"max-length": -1}}).encode()
    put = urllib.request.Request(
        f"{api}/policies/%2F/{unique('pol-bad')}",
        data=body,
        method="PUT",
        headers={"content-type": "application/json", "authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(put, timeout=10)
    assert info.value.code == 400
    reply = json.loads(info.value.read())
    assert reply["error"] == "bad_request"
    assert "-1 is not a valid maximum length" in reply["reason"]


# --- the vhost's own operations, persistence ---------------------------------------------


@pytest.mark.leveret_only
def test_vhost_operations_through_the_embedded_broker(leveret_embedded, channel):
    q = unique("pol-vh")
    channel.queue_declare(q)
    channel.confirm_delivery()
    _publish(channel, q, 4)
    vhost = leveret_embedded.server.broker.vhosts["/"]
    leveret_embedded.call(lambda: vhost.set_policy("cap", f"^{q}$", {"max-length": 3}))
    leveret_embedded.call(lambda: vhost.set_operator_policy("op", f"^{q}$", {"max-length": 2}))
    assert _count(channel, q) == 2
    assert set(leveret_embedded.call(lambda: vhost.policies)) == {"cap"}
    assert set(leveret_embedded.call(lambda: vhost.operator_policies)) == {"op"}
    leveret_embedded.call(lambda: vhost.clear_operator_policy("op"))
    leveret_embedded.call(lambda: vhost.clear_policy("cap"))
    _publish(channel, q, 3)
    assert _count(channel, q) == 5


@pytest.mark.leveret_only
def test_policies_survive_a_restart_and_apply_to_recovered_queues(tmp_path):
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("capped", durable=True)
        ch.queue_declare("opcapped", durable=True)
        ch.exchange_declare("x", "direct", durable=True)
        ch.exchange_declare("ae", "fanout", durable=True)
        ch.queue_declare("aeq", durable=True)
        ch.queue_bind("aeq", "ae")
        conn.close()
        broker.admin.set_policy("/", "cap", "^capped$", {"max-length": 2}, 0, "queues")
        broker.admin.set_policy("/", "gone", "^capped$", {"max-length": 1}, 9, "queues")
        broker.admin.clear_policy("/", "gone")
        broker.admin.set_policy("/", "ae", "^x$", {"alternate-exchange": "ae"}, 0, "exchanges")
        broker.admin.set_operator_policy("/", "cap-op", "capped$", {"max-length": 3})
        vhost = broker.server.broker.vhosts["/"]
        broker.call(lambda: vhost.set_policy("tiny", "^nothing$", {"max-length": 1}))
    with embedded_broker(config) as broker:
        assert [p["name"] for p in broker.admin.list_policies("/")] == ["ae", "cap", "tiny"]
        assert [p["name"] for p in broker.admin.list_operator_policies("/")] == ["cap-op"]
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for queue in ("capped", "opcapped"):
            for i in range(5):
                ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare("capped", passive=True).method.message_count == 2
        assert ch.queue_declare("opcapped", passive=True).method.message_count == 3
        ch.basic_publish("x", "nowhere", b"lost?", pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare("aeq", passive=True).method.message_count == 1
        conn.close()


@pytest.mark.leveret_only
def test_a_stored_policy_that_no_longer_validates_does_not_stop_a_start(tmp_path, caplog):
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        broker.admin.set_policy("/", "good", "^g$", {"max-length": 2})
        hooks = broker.server.broker.hooks
        record = {"vhost": "/", "name": "bad", "pattern": "(", "definition": {"max-length": 1}}
        broker.call(lambda: hooks.catalog_put("policy", json.dumps(["/", "bad"]), record))
    with embedded_broker(config) as broker:
        assert [p["name"] for p in broker.admin.list_policies("/")] == ["good"]
    assert "stored policy not loaded: policy 'bad': invalid regular expression" in caplog.text
