"""Quorum queues over AMQP 0-9-1 (`x-queue-type: quorum`), as RabbitMQ 3.10.8 has them on
one node (docs/quorum-queues.md). tests/test_quorum.py checks the same with pika against
either broker; these are the recorded answers CI replays."""

from __future__ import annotations

from .runner import C, Conn, P, Session, scenario

QUORUM = {"x-queue-type": "quorum"}


def _declare(c: Conn, ch: int, name: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, durable=True, arguments={**QUORUM, **args}))


def _publish(c: Conn, ch: int, name: str, bodies: list[str], one_by_one: bool = False, **props):
    """Publish on a confirm channel and wait for the confirms (a quorum queue takes a
    message once it is committed: a basic.get right after the publish could miss it).

    `one_by_one` waits for each confirm before the next publish: RabbitMQ tells a
    channel that a queue is over its limit (reject-publish) after the fact, so what
    pipelined publishes it still takes depends on timing."""
    if ch not in c.confirm_seq:
        c.confirm_select(ch)
    for body in bodies:
        c.publish(ch, "", name, body.encode(), P(**props) if props else None)
        if one_by_one:
            c.confirms(ch)
    if not one_by_one:
        c.confirms(ch)


def _gets(c: Conn, ch: int, queue: str, n: int, no_ack: bool = False) -> None:
    for _ in range(n):
        c.get(ch, queue, no_ack=no_ack)


def _dlx(c: Conn, ch: int, queue: str = "dlq") -> None:
    """A fanout dead-letter exchange `dlx` into classic queue `queue`."""
    c.rpc(ch, C.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    c.rpc(ch, C.Queue.Declare(queue=queue))
    c.rpc(ch, C.Queue.Bind(queue=queue, exchange="dlx"))


@scenario
def declare_refusals(s: Session) -> None:
    """Durable only, no server-named quorum queue, no other type's arguments."""
    c = s.connect()
    cases = [
        ({"durable": False}, {}),
        ({"durable": True, "exclusive": True}, {}),
        ({"durable": True, "auto_delete": True}, {}),
        ({"durable": True}, {"x-max-priority": 5}),
        ({"durable": True}, {"x-queue-mode": "lazy"}),
        ({"durable": True}, {"x-queue-master-locator": "min-masters"}),
        ({"durable": True}, {"x-max-age": "1D"}),
        ({"durable": True}, {"x-stream-max-segment-size-bytes": 1000}),
        ({"durable": True}, {"x-initial-cluster-size": 1}),
    ]
    for n, (flags, args) in enumerate(cases, start=1):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=f"q{n}", arguments={**QUORUM, **args}, **flags))
    for n, exclusive in ((20, False), (21, True)):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue="", durable=True, exclusive=exclusive, arguments=QUORUM))
    c.alive()


@scenario
def classic_refuses_quorum_arguments(s: Session) -> None:
    """Each type's arguments are its own: a classic queue refuses the quorum ones."""
    c = s.connect()
    for n, args in enumerate(
        [
            {"x-delivery-limit": 3},
            {"x-dead-letter-strategy": "at-least-once"},
            {"x-quorum-initial-group-size": 1},
            {"x-max-in-memory-length": 1},
            {"x-queue-version": 2},
        ],
        start=1,
    ):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=f"c{n}", durable=True, arguments=args))
    c.alive()


@scenario
def declare_arguments(s: Session) -> None:
    """What a quorum queue accepts, and its texts for bad values."""
    c = s.connect()
    c.open(1)
    _declare(
        c,
        1,
        "all",
        **{
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "k",
            "x-dead-letter-strategy": "at-least-once",
            "x-max-length": 10,
            "x-max-length-bytes": 1000,
            "x-overflow": "reject-publish",
            "x-message-ttl": 1000,
            "x-expires": 600000,
            "x-single-active-consumer": True,
            "x-quorum-initial-group-size": 3,
            "x-max-in-memory-length": 5,
            "x-max-in-memory-bytes": 1000,
            "x-queue-leader-locator": "client-local",
            "x-foo": "unknown",
        },
    )
    cases = [
        {"x-overflow": "reject-publish-dlx"},
        {"x-delivery-limit": "3"},
        {"x-delivery-limit": -1},
        {"x-dead-letter-strategy": "sometimes"},
        {"x-dead-letter-strategy": 3},
        {"x-quorum-initial-group-size": "3"},
        {"x-quorum-initial-group-size": 0},
        {"x-max-in-memory-length": "x"},
        {"x-message-ttl": -1},
        {"x-expires": 0},
        {"x-max-length": -1},
        {"x-overflow": "nope"},
        {"x-dead-letter-routing-key": "k"},
        {"x-queue-leader-locator": "nearest"},
    ]
    for n, args in enumerate(cases, start=2):
        c.open(n)
        _declare(c, n, f"q{n}", **args)
    c.alive()


@scenario
def redeclare(s: Session) -> None:
    """Redeclaration compares the quorum arguments (not validated again), the type first."""
    c = s.connect()
    c.open(1)
    same = {"x-delivery-limit": 3, "x-quorum-initial-group-size": 3, "x-message-ttl": 1000}
    _declare(c, 1, "q", **same)
    c.rpc(1, C.Queue.Declare(queue="c", durable=True))
    cases = [
        ("q", {}),
        ("q", {"x-queue-type": "classic"}),
        ("q", {"x-queue-type": "stream"}),
        ("c", QUORUM),
        ("q", {**QUORUM, **same, "x-delivery-limit": 4}),
        ("q", {**QUORUM, "x-quorum-initial-group-size": 3, "x-message-ttl": 1000}),
        ("q", {**QUORUM, **same, "x-quorum-initial-group-size": 1}),
        ("q", {**QUORUM, **same, "x-message-ttl": -1}),
        ("q", {**QUORUM, **same, "x-max-priority": 5, "x-foo": 1}),
    ]
    for n, (name, args) in enumerate(cases, start=2):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=name, durable=True, arguments=args))
    c.open(20)
    c.rpc(20, C.Queue.Declare(queue="q", durable=False, arguments={**QUORUM, **same}))
    c.open(21)
    c.rpc(
        21, C.Queue.Declare(queue="q", durable=True, exclusive=True, arguments={**QUORUM, **same})
    )
    c.open(22)
    c.rpc(22, C.Queue.Declare(queue="q", passive=True))
    c.alive()


@scenario
def global_qos(s: Session) -> None:
    """A channel with a global prefetch cannot consume from a quorum queue (540); a
    global prefetch of 0 and basic.get are fine."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    _publish(c, 1, "q", ["a"])
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=0, global_=True))
    c.consume(2, "q", tag="zero")
    c.rpc(2, C.Basic.Cancel(consumer_tag="zero"))
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=5, global_=True))
    c.get(3, "q", no_ack=True)
    c.consume(3, "q", tag="global")
    c.alive()


@scenario
def exclusive_consume_ignored(s: Session) -> None:
    """basic.consume's exclusive flag does not hold on a quorum queue."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    c.consume(1, "q", tag="a", exclusive=True)
    c.open(2)
    c.consume(2, "q", tag="b", exclusive=True)
    c.consume(2, "q", tag="c")
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))


@scenario
def returns_without_limit(s: Session) -> None:
    """nack and reject with requeue put a message at the back (no delivery limit), counted."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    _publish(c, 1, "q", ["1", "2", "3", "4", "5", "6"])
    _gets(c, 1, "q", 5)  # tags 1-5: bodies 1-5
    c.nack(1, 4)
    c.nack(1, 2)
    c.reject(1, 5)
    _gets(c, 1, "q", 5, no_ack=True)


@scenario
def returns_with_limit(s: Session) -> None:
    """With x-delivery-limit, returns go to the front in the order they came."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q", **{"x-delivery-limit": 10})
    _publish(c, 1, "q", ["1", "2", "3", "4", "5", "6"])
    _gets(c, 1, "q", 5)
    c.nack(1, 4)
    c.nack(1, 2)
    c.reject(1, 5)
    _gets(c, 1, "q", 5, no_ack=True)


@scenario
def nack_multiple_and_recover(s: Session) -> None:
    """A multiple nack returns in delivery order; basic.recover returns as a nack does."""
    c = s.connect()
    for n, args in ((1, {}), (2, {"x-delivery-limit": 10})):
        c.open(n)
        _declare(c, n, f"nack{n}", **args)
        _publish(c, n, f"nack{n}", ["1", "2", "3", "4", "5"])
        _gets(c, n, f"nack{n}", 4)
        c.nack(n, 4, multiple=True)
        _gets(c, n, f"nack{n}", 6, no_ack=True)
    for n, args in ((3, {}), (4, {"x-delivery-limit": 10})):
        c.open(n)
        _declare(c, n, f"recover{n}", **args)
        _publish(c, n, f"recover{n}", ["0", "1", "2", "3"])
        _gets(c, n, f"recover{n}", 3)
        c.rpc(n, C.Basic.Recover(requeue=True))
        _gets(c, n, f"recover{n}", 5, no_ack=True)


@scenario
def closed_channel_returns_to_front(s: Session) -> None:
    """A closed channel's unacked messages go back to the front, counted."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    _publish(c, 1, "q", ["1", "2", "3", "4", "5"])
    c.open(2)
    _gets(c, 2, "q", 4)
    c.close_channel(2)
    _gets(c, 1, "q", 6, no_ack=True)
    _publish(c, 1, "q", ["1", "2", "3", "4", "5"])
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=3))
    c.consume(3, "q", tag="ct")
    c.deliveries(3, 3)
    c.close_channel(3)
    _gets(c, 1, "q", 6, no_ack=True)


@scenario
def delivery_count_header(s: Session) -> None:
    """x-delivery-count: on every basic.get (0 first), on a consumer's redeliveries only,
    in a headers table sorted by key, replacing a publisher's own."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    _publish(c, 1, "q", ["x"])
    for tag in range(1, 4):
        c.get(1, "q", no_ack=False)
        c.nack(1, tag)
    c.get(1, "q", no_ack=True)
    c.open(2)
    _declare(c, 2, "r")
    _publish(c, 2, "r", ["y"], headers={"z": 1, "b": 2, "x-delivery-count": 9})
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=1))
    c.consume(3, "r", tag="ct")
    c.deliveries(3, 1)
    c.nack(3, 1)
    c.deliveries(3, 1)
    c.rpc(3, C.Basic.Cancel(consumer_tag="ct"))
    c.nack(3, 2, requeue=False)
    _publish(c, 2, "r", ["z"], headers={"x-delivery-count": 7, "a": 1})
    c.get(2, "r", no_ack=True)


@scenario
def delivery_limits(s: Session) -> None:
    """Returned more than x-delivery-limit times: gone. -1 trips at the first return, a
    limit that is not a number never trips."""
    c = s.connect()
    for n, limit in enumerate([2, 0, -1, "2"], start=1):
        c.open(n)
        _declare(c, n, f"q{n}", **{"x-delivery-limit": limit})
        _publish(c, n, f"q{n}", ["poison"])
        for tag in range(1, 6):
            if c.get(n, f"q{n}", no_ack=False).get("method") != "basic.get-ok":
                break  # gone: past its limit
            c.nack(n, tag)


@scenario
def poison_dead_lettered(s: Session) -> None:
    """Past the limit with a DLX: reason delivery_limit, expiration kept as
    original-expiration, no x-delivery-count on the copy; a reject's copy likewise."""
    c = s.connect()
    c.open(1)
    _dlx(c, 1)
    _declare(c, 1, "q", **{"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    _publish(c, 1, "q", ["w"], expiration="60000", headers={"h": "v"})
    for tag in (1, 2):
        c.get(1, "q", no_ack=False)
        c.nack(1, tag)
    c.get(1, "q")
    c.get(1, "dlq", wait=2.0)
    c.open(2)
    _declare(c, 2, "r", **{"x-dead-letter-exchange": "dlx"})
    _publish(c, 2, "r", ["v"])
    c.get(2, "r", no_ack=False)
    c.nack(2, 1)
    c.get(2, "r", no_ack=False)
    c.nack(2, 2, requeue=False)
    c.get(2, "dlq", wait=2.0)


@scenario
def counts_and_purge(s: Session) -> None:
    """declare-ok, get-ok and purge-ok count ready messages; an unacked one survives a purge."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "q")
    _publish(c, 1, "q", ["a", "b", "c"])
    c.get(1, "q", no_ack=False)
    _declare(c, 1, "q")
    c.rpc(1, C.Queue.Purge(queue="q"))
    c.nack(1, 1)
    c.get(1, "q", no_ack=True)
    c.get(1, "q", no_ack=True)


@scenario
def reject_publish(s: Session) -> None:
    """reject-publish takes messages while the queue is at or under its limit, then nacks
    until it is back under 80%."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "len", **{"x-max-length": 2, "x-overflow": "reject-publish"})
    _publish(c, 1, "len", ["1", "2", "3", "4"], one_by_one=True)
    c.open(2)
    _declare(c, 2, "bytes", **{"x-max-length-bytes": 5, "x-overflow": "reject-publish"})
    _publish(c, 2, "bytes", ["12", "34", "56", "7"], one_by_one=True)
    c.open(3)
    _declare(c, 3, "soft", **{"x-max-length": 10, "x-overflow": "reject-publish"})
    _publish(c, 3, "soft", [str(i) for i in range(12)], one_by_one=True)
    _gets(c, 3, "soft", 2, no_ack=True)
    _publish(c, 3, "soft", ["x"], one_by_one=True)
    _gets(c, 3, "soft", 1, no_ack=True)
    _publish(c, 3, "soft", ["y", "z", "w", "v"], one_by_one=True)


@scenario
def drop_head_and_reject_publish_dlx(s: Session) -> None:
    """drop-head dead-letters the oldest (maxlen); reject-publish-dlx acts as drop-head."""
    c = s.connect()
    c.open(1)
    _dlx(c, 1)
    for n, overflow in ((2, "drop-head"), (3, "reject-publish-dlx")):
        c.open(n)
        args = {"x-max-length": 2, "x-overflow": overflow, "x-dead-letter-exchange": "dlx"}
        _declare(c, n, f"q{n}", **args)
        _publish(c, n, f"q{n}", ["1", "2", "3", "4"])
        _gets(c, n, f"q{n}", 3, no_ack=True)
        c.get(n, "dlq", wait=2.0)
        c.get(n, "dlq", wait=2.0)


@scenario
def message_ttl(s: Session) -> None:
    """x-message-ttl and a message's expiration dead-letter with reason expired."""
    c = s.connect()
    c.open(1)
    _dlx(c, 1)
    _declare(c, 1, "ttl", **{"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"})
    _publish(c, 1, "ttl", ["a"])
    c.get(1, "dlq", wait=3.0)
    _declare(c, 1, "exp", **{"x-dead-letter-exchange": "dlx"})
    _publish(c, 1, "exp", ["b"], expiration="100")
    _publish(c, 1, "exp", ["c"])
    c.get(1, "dlq", wait=3.0)
    c.get(1, "exp", no_ack=True)


@scenario
def at_least_once(s: Session) -> None:
    """At-least-once dead-lettering reaches its target; unroutable, it waits in the queue
    (not ready) and counts toward x-max-length; with drop-head it falls back to
    at-most-once."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    _declare(c, 1, "dlq")
    c.rpc(1, C.Queue.Bind(queue="dlq", exchange="dlx"))
    alo = {
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    _declare(c, 1, "routed", **alo)
    _publish(c, 1, "routed", ["a", "b"], expiration="60000")
    c.get(1, "routed", no_ack=False)
    c.reject(1, 1, requeue=False)
    c.get(1, "dlq", no_ack=True, wait=3.0)
    c.get(1, "routed", no_ack=True)
    c.open(2)
    c.rpc(2, C.Exchange.Declare(exchange="nowhere", exchange_type="fanout"))
    for n, strategy in ((3, "at-least-once"), (4, "at-most-once")):
        c.open(n)
        args = {**alo, "x-dead-letter-exchange": "nowhere", "x-dead-letter-strategy": strategy}
        _declare(c, n, f"unroutable{n}", **args, **{"x-max-length": 1})
        _publish(c, n, f"unroutable{n}", ["a"])
        c.get(n, f"unroutable{n}", no_ack=False)
        c.reject(n, 1, requeue=False)
        _publish(c, n, f"unroutable{n}", ["b", "c", "d"][: 2 if n == 3 else 3], one_by_one=True)
        c.rpc(n, C.Queue.Declare(queue=f"unroutable{n}", passive=True))
    c.open(5)
    args = {
        "x-dead-letter-exchange": "nowhere",
        "x-dead-letter-strategy": "at-least-once",
        "x-max-length": 1,
    }
    _declare(c, 5, "drophead", **args)
    _publish(c, 5, "drophead", ["a"])
    c.get(5, "drophead", no_ack=False)
    c.reject(5, 1, requeue=False)
    _publish(c, 5, "drophead", ["b", "c"], one_by_one=True)
    _gets(c, 5, "drophead", 2, no_ack=True)


@scenario
def consumer_priority_and_single_active(s: Session) -> None:
    """Consumer priorities and single active consumer, as on classic queues."""
    c = s.connect()
    c.open(1)
    _declare(c, 1, "prio")
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=100))
    c.consume(2, "prio", tag="low", arguments={"x-priority": 1})
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=100))
    c.consume(3, "prio", tag="high", arguments={"x-priority": 5})
    _publish(c, 1, "prio", ["1", "2", "3"])
    c.deliveries(3, 3)
    c.events(2)
    _declare(c, 1, "sac", **{"x-single-active-consumer": True})
    c.open(4)
    c.consume(4, "sac", tag="first", no_ack=True)
    c.open(5)
    c.consume(5, "sac", tag="second", no_ack=True)
    _publish(c, 1, "sac", ["a", "b"])
    c.deliveries(4, 2)
    c.events(5)
    c.close_channel(4)
    _publish(c, 1, "sac", ["c"])
    c.deliveries(5, 1)
    c.open(6)
    c.get(6, "sac")  # 405: no basic.get with single active consumer
