"""RabbitMQ's deps/rabbit/test/priority_queue_SUITE (v3.10.8), translated.

Each client-driven test is a scenario of the same name doing the same publishes (on a
confirm channel, as the suite's `publish/3`), gets, acks and nacks; every answer is
recorded from RabbitMQ. Left out, because they call into the node by Erlang RPC:
`invoke`, `gen_server2_stats`, `info_head_message_timestamp`, `unknown_info_key`,
`ram_duration`. `resume` publishes its 10,000 messages with priorities 1-5 in turn
rather than at random, so that both brokers see the same sequence.
"""

from __future__ import annotations

from .runner import C, Conn, Session, scenario


def _declare(c: Conn, q: str, args: dict | None = None, maximum: int | None = 3) -> dict:
    arguments = dict(args or {})
    if maximum is not None:
        arguments["x-max-priority"] = maximum
    return c.rpc(1, C.Queue.Declare(queue=q, durable=True, arguments=arguments))


def _body(p: int | None) -> str:
    return "undefined" if p is None else str(p)


def _publish1(c: Conn, q: str, p: int | None) -> None:
    fields = {"delivery_mode": 2} if p is None else {"priority": p, "delivery_mode": 2}
    c.publish(1, "", q, _body(p), **fields)


def _publish(c: Conn, q: str, ps: list) -> None:
    if 1 not in c.confirm_seq:
        c.confirm_select(1)
    for p in ps:
        _publish1(c, q, p)
    c.confirms(1, timeout=30)


def _get_all(c: Conn, q: str, ack: str, n: int) -> list[int]:
    """`n` gets (recorded: which body came in which order), then the get-empty."""
    tags = []
    for _ in range(n):
        reply = c.get(1, q, no_ack=ack == "no_ack")
        tag = reply.get("delivery_tag")
        tags.append(tag)
        if ack == "do_ack" and tag:
            c.ack(1, tag)
    c.get(1, q)
    return tags


def _start(s: Session) -> Conn:
    c = s.connect()
    c.open(1)
    return c


@scenario
def simple_order(s: Session) -> None:
    """Priorities 1-3 come out highest first, in publish order within one priority."""
    c = _start(s)
    q = "simple_order-queue"
    _declare(c, q)
    _publish(c, q, [1, 2, 3, 1, 2, 3, 1, 2, 3])
    _get_all(c, q, "do_ack", 9)
    _publish(c, q, [2, 3, 1, 2, 3, 1, 2, 3, 1])
    _get_all(c, q, "no_ack", 9)
    _publish(c, q, [3, 1, 2, 3, 1, 2, 3, 1, 2])
    _get_all(c, q, "do_ack", 9)
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def matching(s: Session) -> None:
    """Priorities above the maximum count as the maximum; none is 0."""
    c = _start(s)
    q = "matching-queue"
    _declare(c, q, maximum=5)
    _publish(c, q, [None, 0, 5, 10, None])
    _get_all(c, q, "do_ack", 5)
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def resume(s: Session) -> None:
    """10,000 confirmed publishes to a priority queue, then a purge."""
    c = _start(s)
    q = "resume-queue"
    _declare(c, q, maximum=5)
    c.confirm_select(1)
    for i in range(10_000):
        _publish1(c, q, i % 5 + 1)
    c.confirms(1, timeout=60)
    c.rpc(1, C.Queue.Purge(queue=q))
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def straight_through(s: Session) -> None:
    """A consumer gets each message as it is published, with and without acks."""
    c = _start(s)
    q = "straight_through-queue"
    _declare(c, q)
    for ack in ("do_ack", "no_ack"):
        c.consume(1, q, tag="ctag", no_ack=ack == "no_ack")
        for p in (1, 2, 3):
            _publish1(c, q, p)
            got = c.deliveries(1, 1)
            if ack == "do_ack" and got and "delivery_tag" in got[0]:
                c.ack(1, got[0]["delivery_tag"])
        c.rpc(1, C.Basic.Cancel(consumer_tag="ctag"))
    c.get(1, q)
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def max_priorities_above_hard_limit(s: Session) -> None:
    """x-max-priority 3000 is refused."""
    c = _start(s)
    _declare(c, "max_priorities_above_hard_limit", maximum=3000)


@scenario
def negative_max_priorities(s: Session) -> None:
    """x-max-priority -10 is refused."""
    c = _start(s)
    _declare(c, "negative_max_priorities", maximum=-10)


@scenario
def dropwhile_fetchwhile(s: Session) -> None:
    """Messages past a 1 ms TTL are gone from a priority queue, dead-lettered or not."""
    c = _start(s)
    q = "dropwhile_fetchwhile-queue"
    for args in (
        {"x-message-ttl": 1},
        {"x-message-ttl": 1, "x-dead-letter-exchange": "amq.fanout"},
    ):
        _declare(c, q, args)
        _publish(c, q, [1, 2, 3, 1, 2, 3, 1, 2, 3])
        s.sleep(0.05)
        c.get(1, q)
        c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def ackfold(s: Session) -> None:
    """A multiple nack without requeue dead-letters every unacked message, by priority."""
    c = _start(s)
    q, q2 = "ackfolq-queue1", "ackfold-queue2"
    _declare(c, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q2})
    _declare(c, q2, maximum=None)
    _publish(c, q, [1, 2, 3])
    tags = _get_all(c, q, "manual_ack", 3)
    c.nack(1, tags[-1], multiple=True, requeue=False)
    s.sleep(0.1)
    _get_all(c, q2, "do_ack", 3)
    c.rpc(1, C.Queue.Delete(queue=q))
    c.rpc(1, C.Queue.Delete(queue=q2))


@scenario
def requeue(s: Session) -> None:
    """A multiple nack with requeue puts the messages back in priority order."""
    c = _start(s)
    q = "requeue-queue"
    _declare(c, q)
    _publish(c, q, [1, 2, 3])
    tags = _get_all(c, q, "manual_ack", 3)
    c.nack(1, tags[-1], multiple=True, requeue=True)
    _get_all(c, q, "do_ack", 3)
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def drop(s: Session) -> None:
    """x-max-length 4 on a priority queue drops from the head."""
    c = _start(s)
    q = "drop-queue"
    _declare(c, q, {"x-max-length": 4})
    _publish(c, q, [1, 2, 3, 1, 2, 3, 1, 2, 3])
    _get_all(c, q, "do_ack", 4)
    c.rpc(1, C.Queue.Delete(queue=q))


def _reject(s: Session, overflow: str) -> None:
    c = _start(s)
    q = f"reject-queue-{overflow}"
    _declare(c, q, {"x-max-length": 4, "x-overflow": overflow})
    _publish(c, q, [1, 2, 3, 1, 2, 3, 1, 2, 3])
    _get_all(c, q, "do_ack", 4)
    c.rpc(1, C.Queue.Delete(queue=q))


@scenario
def overflow_reject_publish_reject(s: Session) -> None:
    """reject: the first four are kept, the rest refused (x-overflow reject-publish)."""
    _reject(s, "reject-publish")


@scenario
def overflow_reject_publish_dlx_reject(s: Session) -> None:
    """reject with x-overflow reject-publish-dlx."""
    _reject(s, "reject-publish-dlx")


@scenario
def purge(s: Session) -> None:
    """queue.purge empties a priority queue."""
    c = _start(s)
    q = "purge-queue"
    _declare(c, q)
    _publish(c, q, [1, 2, 3])
    c.rpc(1, C.Queue.Purge(queue=q))
    c.get(1, q)
    c.rpc(1, C.Queue.Delete(queue=q))
