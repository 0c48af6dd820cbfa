"""RabbitMQ's deps/rabbit/test/dead_lettering_SUITE (v3.10.8), translated in part.

Each translated test of the `classic_queue` and `quorum_queue` groups (quorum in both
dead-letter strategies: `at_most_once`, and `at_least_once` with `x-overflow
reject-publish`, as the suite sets them) is a scenario named group_test. The suite's
`wait_for_messages` (queue counts through rabbitmqctl) becomes a basic.get that asks
again while the dead-lettered message is on its way; every get is recorded.

Left out: the suite's `counted(...)` checks of RabbitMQ's global counters (Erlang RPC);
the `mirrored_queue` group (a three-node cluster); the tests from
`dead_letter_routing_key` on (routing keys, CC/BCC, cycles, policies and x-death
headers; tests/compat/amqp/scenarios_ext.py records those behaviours), and the
`disabled` metric group.
"""

from __future__ import annotations

from collections.abc import Callable

from .runner import C, Conn, Session, scenario

#: group -> (queue arguments, durable)
GROUPS = {
    "classic_queue": ({"x-queue-type": "classic"}, False),
    "quorum_queue_at_most_once": (
        {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-most-once"},
        True,
    ),
    "quorum_queue_at_least_once": (
        {
            "x-queue-type": "quorum",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
        True,
    ),
}
#: how long a get waits for a message still being dead-lettered
DL_WAIT = 5.0


class T:
    """One test's names, as the suite's init_per_testcase makes them."""

    def __init__(self, c: Conn, group: str, test: str) -> None:
        self.c, self.group = c, group
        self.q = f"{group}_{test}"
        self.dlq = f"{self.q}_2"
        self.dlx = f"{self.q}_dlx_exchange"

    def declare(self, **extra) -> None:
        args, durable = GROUPS[self.group]
        c = self.c
        c.rpc(1, C.Exchange.Declare(exchange=self.dlx))
        c.rpc(
            1,
            C.Queue.Declare(
                queue=self.q,
                durable=durable,
                arguments={
                    "x-dead-letter-exchange": self.dlx,
                    "x-dead-letter-routing-key": self.dlq,
                    **args,
                    **extra,
                },
            ),
        )
        c.rpc(1, C.Queue.Declare(queue=self.dlq, durable=durable))
        c.rpc(1, C.Queue.Bind(queue=self.dlq, exchange=self.dlx, routing_key=self.dlq))

    def publish(self, *bodies: str) -> None:
        for body in bodies:
            self.c.publish(1, "", self.q, body)

    def consume(self, queue: str, n: int, wait: float = DL_WAIT) -> list[int]:
        """`n` basic.gets with acks required; their delivery tags."""
        tags = []
        for _ in range(n):
            reply = self.c.get(1, queue, no_ack=False, wait=wait)
            tags.append(reply.get("delivery_tag", 0))
        return tags

    def empty(self, queue: str) -> None:
        self.c.get(1, queue, no_ack=False)


def dead_letter_nack(t: T) -> None:
    t.declare()
    t.publish("msg1", "msg2", "msg3")
    d1, d2, d3 = t.consume(t.q, 3)
    t.c.nack(1, d3, requeue=False)
    t.consume(t.dlq, 1)
    t.empty(t.q)
    t.empty(t.dlq)
    t.c.nack(1, d1, requeue=False)
    t.c.nack(1, d2, requeue=False)
    t.empty(t.q)
    t.consume(t.dlq, 2)
    t.empty(t.dlq)


def dead_letter_multiple_nack(t: T) -> None:
    t.declare()
    t.publish("msg1", "msg2", "msg3")
    _, _, d3 = t.consume(t.q, 3)
    t.c.nack(1, d3, multiple=True, requeue=False)
    t.consume(t.dlq, 3)
    t.empty(t.dlq)
    t.empty(t.q)


def dead_letter_nack_requeue(t: T) -> None:
    t.declare()
    t.publish("msg1", "msg2", "msg3")
    _, _, d3 = t.consume(t.q, 3)
    t.empty(t.q)
    t.c.nack(1, d3, requeue=True)
    t.consume(t.q, 1)
    t.empty(t.q)
    t.empty(t.dlq)


def dead_letter_nack_requeue_multiple(t: T) -> None:
    t.declare()
    t.publish("msg1", "msg2", "msg3")
    _, _, d3 = t.consume(t.q, 3)
    t.empty(t.q)
    t.c.nack(1, d3, multiple=True, requeue=True)
    t.consume(t.q, 3)
    t.empty(t.q)
    t.empty(t.dlq)


def dead_letter_reject(t: T) -> None:
    t.declare()
    t.publish("msg1", "msg2", "msg3")
    (d,) = t.consume(t.q, 1)
    t.c.reject(1, d, requeue=False)
    t.consume(t.dlq, 1)
    t.empty(t.dlq)
    t.consume(t.q, 2)
    t.empty(t.q)


def dead_letter_reject_many(t: T) -> None:
    t.declare()
    t.publish(*(str(i) for i in range(1, 101)))
    t.c.consume(1, t.q, tag="ctag")
    got = t.c.deliveries(1, 100)
    for d in got:
        if "delivery_tag" in d:
            t.c.reject(1, d["delivery_tag"], requeue=False)
    t.c.rpc(1, C.Basic.Cancel(consumer_tag="ctag"))
    t.consume(t.dlq, 100)
    t.empty(t.dlq)


def dead_letter_reject_requeue(t: T) -> None:
    t.declare()
    t.c.session.policy(t.q + "_policy", f"^{t.q}$", {"delivery-limit": 50}, apply_to="queues")
    t.publish("msg1", "msg2", "msg3")
    (d,) = t.consume(t.q, 1)
    t.c.reject(1, d, requeue=True)
    t.consume(t.q, 3)
    t.empty(t.q)
    t.empty(t.dlq)


def dead_letter_ttl(t: T) -> None:
    t.declare(**{"x-message-ttl": 1})
    t.publish("msg1")
    t.consume(t.dlq, 1)
    t.empty(t.q)


def dead_letter_max_length_drop_head(t: T) -> None:
    t.declare(**{"x-max-length": 1})
    t.publish("msg1", "msg2", "msg3")
    t.consume(t.q, 1)
    t.empty(t.q)
    t.consume(t.dlq, 2)
    t.empty(t.dlq)


def dead_letter_reject_requeue_reject_norequeue(t: T) -> None:
    t.declare()
    t.publish("msg")
    (d0,) = t.consume(t.q, 1)
    t.c.reject(1, d0, requeue=True)
    (d1,) = t.consume(t.q, 1)
    t.c.reject(1, d1, requeue=False)
    t.consume(t.dlq, 1)
    t.empty(t.dlq)
    t.empty(t.q)


def dead_letter_max_length_reject_publish_dlx(t: T) -> None:
    t.declare(**{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    t.publish("msg1", "msg2", "msg3")
    t.consume(t.q, 1)
    t.empty(t.q)
    t.consume(t.dlq, 2)
    t.empty(t.dlq)


def dead_letter_missing_exchange(t: T) -> None:
    args, durable = GROUPS[t.group]
    c, dlx = t.c, "dlx-exchange-2"
    c.rpc(1, C.Exchange.Delete(exchange=dlx))
    c.rpc(
        1,
        C.Queue.Declare(
            queue=t.q,
            durable=durable,
            arguments={
                "x-max-length": 1,
                "x-dead-letter-exchange": dlx,
                "x-dead-letter-routing-key": t.dlq,
                **args,
            },
        ),
    )
    c.rpc(1, C.Queue.Declare(queue=t.dlq, durable=durable))
    t.publish("msg1")
    (d,) = t.consume(t.q, 1)
    c.reject(1, d, requeue=False)
    t.empty(t.dlq)
    c.rpc(1, C.Exchange.Declare(exchange=dlx))
    c.rpc(1, C.Queue.Bind(queue=t.dlq, exchange=dlx, routing_key=t.dlq))
    t.publish("msg2")
    (d2,) = t.consume(t.q, 1)
    c.reject(1, d2, requeue=False)
    t.consume(t.dlq, 1)
    t.empty(t.dlq)
    c.rpc(1, C.Exchange.Delete(exchange=dlx))


COMMON = (
    dead_letter_nack,
    dead_letter_multiple_nack,
    dead_letter_nack_requeue,
    dead_letter_nack_requeue_multiple,
    dead_letter_reject,
    dead_letter_reject_many,
    dead_letter_reject_requeue,
    dead_letter_ttl,
    dead_letter_reject_requeue_reject_norequeue,
)
TESTS = {
    "classic_queue": (
        *COMMON,
        dead_letter_max_length_drop_head,
        dead_letter_max_length_reject_publish_dlx,
        dead_letter_missing_exchange,
    ),
    "quorum_queue_at_most_once": (
        *COMMON,
        dead_letter_max_length_drop_head,
        dead_letter_missing_exchange,
    ),
    "quorum_queue_at_least_once": COMMON,
}


def _scenario(group: str, test: Callable[[T], None]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        if group.startswith("quorum"):
            # A quorum queue dead-letters after the ack has returned: how many messages
            # a get-ok says are left behind it depends on when it was asked.
            s.mask("message_count")
        c = s.connect()
        c.open(1)
        test(T(c, group, test.__name__))

    run.__name__ = f"{group}_{test.__name__}"
    run.__doc__ = f"dead_lettering_SUITE: {test.__name__} in the {group} group"
    return run


for _group, _tests in TESTS.items():
    for _test in _tests:
        scenario(_scenario(_group, _test))
