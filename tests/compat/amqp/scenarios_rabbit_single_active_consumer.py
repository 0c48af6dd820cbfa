"""RabbitMQ's deps/rabbit/test/single_active_consumer_SUITE (v3.10.8), translated.

Each test of the `classic_queue` and `quorum_queue` groups is a scenario of the same
name with the group as prefix. The suite counts deliveries per consumer tag; here
every delivery is recorded with its consumer tag (the tags are named `c1`..`c3` where
the suite let the broker name them). Left out: nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from .runner import C, Conn, Session, scenario

GROUPS = {
    "classic_queue": ({"x-queue-type": "classic"}, {"auto_delete": True}),
    "quorum_queue": ({"x-queue-type": "quorum"}, {"durable": True}),
}


def _declare(c: Conn, group: str, q: str) -> None:
    args, flags = GROUPS[group]
    c.rpc(
        1, C.Queue.Declare(queue=q, arguments={"x-single-active-consumer": True, **args}, **flags)
    )


def _publish(c: Conn, ch: int, q: str, n: int, body: str = "foobar") -> None:
    for _ in range(n):
        c.publish(ch, "", q, body)


def all_messages_go_to_one_consumer(c: Conn, q: str) -> None:
    c.consume(1, q, tag="c1", no_ack=True)
    c.consume(1, q, tag="c2", no_ack=True)
    _publish(c, 1, q, 5)
    c.deliveries(1, 5)
    c.events(1)


def fallback_to_another_consumer_when_first_one_is_cancelled(c: Conn, q: str) -> None:
    for tag in ("c1", "c2", "c3"):
        c.consume(1, q, tag=tag, no_ack=True)
    _publish(c, 1, q, 5)
    c.deliveries(1, 5)
    c.rpc(1, C.Basic.Cancel(consumer_tag="c1"))
    _publish(c, 1, q, 4)
    c.deliveries(1, 4)
    c.rpc(1, C.Basic.Cancel(consumer_tag="c2"))
    _publish(c, 1, q, 1)
    c.deliveries(1, 1)
    c.events(1)


def fallback_to_another_consumer_when_first_one_is_cancelled_manual_acks(c: Conn, q: str) -> None:
    for tag in ("c1", "c2", "c3"):
        c.consume(1, q, tag=tag)
    _publish(c, 1, q, 1, "msg1")
    _publish(c, 1, q, 1, "msg2")
    got = c.deliveries(1, 2)
    c.rpc(1, C.Basic.Cancel(consumer_tag="c1"))
    _publish(c, 1, q, 1, "msg3")
    _publish(c, 1, q, 1, "msg4")
    c.deliveries(1, 2)
    for d in got:
        if "delivery_tag" in d:
            c.ack(1, d["delivery_tag"])
    c.events(1)


def fallback_to_another_consumer_when_exclusive_consumer_channel_is_cancelled(
    c: Conn, q: str
) -> None:
    for ch, tag in ((2, "1"), (3, "2"), (4, "3")):
        c.open(ch)
        c.consume(ch, q, tag=tag, no_ack=True)
    _publish(c, 1, q, 5)
    c.deliveries(2, 5)
    c.close_channel(2)
    _publish(c, 1, q, 4)
    c.deliveries(3, 4)
    c.close_channel(3)
    _publish(c, 1, q, 1, "poison")
    c.deliveries(4, 1)


def basic_get_is_unsupported(c: Conn, q: str) -> None:
    c.get(1, q, no_ack=False)


def amqp_exclusive_consume_fails_on_exclusive_consumer_queue(c: Conn, q: str) -> None:
    c.consume(1, q, exclusive=True)


TESTS = {
    "classic_queue": (
        all_messages_go_to_one_consumer,
        fallback_to_another_consumer_when_first_one_is_cancelled,
        fallback_to_another_consumer_when_exclusive_consumer_channel_is_cancelled,
        fallback_to_another_consumer_when_first_one_is_cancelled_manual_acks,
        amqp_exclusive_consume_fails_on_exclusive_consumer_queue,
    ),
    "quorum_queue": (
        all_messages_go_to_one_consumer,
        fallback_to_another_consumer_when_first_one_is_cancelled,
        fallback_to_another_consumer_when_exclusive_consumer_channel_is_cancelled,
        fallback_to_another_consumer_when_first_one_is_cancelled_manual_acks,
        basic_get_is_unsupported,
    ),
}


def _scenario(group: str, test: Callable[[Conn, str], None]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.connect()
        c.open(1)
        q = test.__name__
        _declare(c, group, q)
        test(c, q)

    run.__name__ = f"{group}_{test.__name__}"
    run.__doc__ = f"single_active_consumer_SUITE: {test.__name__} in the {group} group"
    return run


for _group, _tests in TESTS.items():
    for _test in _tests:
        scenario(_scenario(_group, _test))
