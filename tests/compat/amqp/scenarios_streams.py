"""Stream queues over AMQP 0-9-1 (`x-queue-type: stream`), as RabbitMQ 3.10.8 has them."""

from __future__ import annotations

from .runner import C, Conn, Session, scenario

STREAM = {"x-queue-type": "stream"}


def _stream(c: Conn, ch: int, name: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, durable=True, arguments={**STREAM, **args}))


def _publish(c: Conn, ch: int, name: str, bodies: list[str]) -> None:
    """Publish on a confirm channel, one at a time: RabbitMQ then writes each message
    as a chunk of its own, and chunk boundaries (where "last" and credit stop) are the
    same on every run."""
    if ch not in c.confirm_seq:
        c.confirm_select(ch)
    for body in bodies:
        c.publish(ch, "", name, body.encode())
        c.confirms(ch)


@scenario
def declare_refusals(s: Session) -> None:
    """What a stream declaration refuses: flags, other types' arguments, a server name."""
    c = s.connect()
    for n, (kwargs, args) in enumerate(
        [
            ({"durable": False}, {}),
            ({"durable": True, "exclusive": True}, {}),
            ({"durable": True, "auto_delete": True}, {}),
            ({"durable": True}, {"x-message-ttl": 1000}),
            ({"durable": True}, {"x-max-length": 10}),
            ({"durable": True}, {"x-max-priority": 5}),
            ({"durable": True}, {"x-dead-letter-exchange": "dlx"}),
            ({"durable": True}, {"x-expires": 10000}),
            ({"durable": True}, {"x-single-active-consumer": True}),
            ({"durable": True}, {"x-overflow": "reject-publish"}),
            ({"durable": True}, {"x-queue-mode": "lazy"}),
            ({"durable": True}, {"x-max-age": "1x"}),
            ({"durable": True}, {"x-max-age": 10}),
        ],
        start=1,
    ):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=f"s{n}", arguments={**STREAM, **args}, **kwargs))
    c.open(30)
    c.rpc(30, C.Queue.Declare(queue="", durable=True, arguments=STREAM))
    c.alive()


@scenario
def declare_limits(s: Session) -> None:
    """Segment size and x-max-length-bytes: zero, negative, strings, huge values."""
    c = s.connect()
    cases = [
        ("x-stream-max-segment-size-bytes", 0),
        ("x-stream-max-segment-size-bytes", -1),
        ("x-stream-max-segment-size-bytes", "big"),
        ("x-stream-max-segment-size-bytes", 1),
        ("x-stream-max-segment-size-bytes", 3_000_000_000),
        ("x-max-length-bytes", 0),
        ("x-max-length-bytes", -5),
        ("x-max-length-bytes", "lots"),
        ("x-max-length-bytes", 1),
        ("x-max-length-bytes", 10**12),
        ("x-max-age", "0s"),
        ("x-max-age", "7D"),
        ("x-initial-cluster-size", 3),
        ("x-queue-leader-locator", "balanced"),
    ]
    for n, (key, value) in enumerate(cases, start=1):
        c.open(n)
        _stream(c, n, f"s{n}", **{key: value})
    c.alive()


@scenario
def redeclare_inequivalent(s: Session) -> None:
    """Redeclaring a stream with other retention or segment arguments, or as classic."""
    c = s.connect()
    c.open(1)
    _stream(
        c,
        1,
        "s",
        **{
            "x-max-age": "1D",
            "x-max-length-bytes": 1_000_000,
            "x-stream-max-segment-size-bytes": 100_000,
        },
    )
    _stream(
        c,
        1,
        "s",
        **{
            "x-max-age": "1D",
            "x-max-length-bytes": 1_000_000,
            "x-stream-max-segment-size-bytes": 100_000,
        },
    )
    variants = [
        {"x-max-age": "2D", "x-max-length-bytes": 1_000_000,
         "x-stream-max-segment-size-bytes": 100_000},
        {"x-max-age": "1D", "x-max-length-bytes": 2_000_000,
         "x-stream-max-segment-size-bytes": 100_000},
        {"x-max-age": "1D", "x-max-length-bytes": 1_000_000,
         "x-stream-max-segment-size-bytes": 200_000},
        {"x-max-length-bytes": 1_000_000, "x-stream-max-segment-size-bytes": 100_000},
        {},
        {"x-max-age": "1D", "x-max-length-bytes": 1_000_000,
         "x-stream-max-segment-size-bytes": 100_000, "x-initial-cluster-size": 3},
        {"x-max-age": "1D", "x-max-length-bytes": 1_000_000,
         "x-stream-max-segment-size-bytes": 100_000, "x-queue-leader-locator": "balanced"},
    ]  # fmt: skip
    for n, args in enumerate(variants, start=2):
        c.open(n)
        _stream(c, n, "s", **args)
    same = {
        "x-max-age": "1D",
        "x-max-length-bytes": 1_000_000,
        "x-stream-max-segment-size-bytes": 100_000,
    }
    for n, (name, args) in enumerate(
        [
            ("s", None),
            ("s", same),
            ("s", {"x-queue-type": "classic"}),
            ("s", {**same, "x-queue-type": "classic"}),
            ("s", {**same, "x-queue-type": "no-such-type"}),
            ("classic", None),
            ("classic", STREAM),
        ],
        start=10,
    ):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=name, durable=True, arguments=args or {}))
    c.open(30)
    c.rpc(30, C.Queue.Declare(queue="s", passive=True))


@scenario
def consume_rules(s: Session) -> None:
    """Consuming needs a prefetch and manual acks; global qos; exclusive consumers;
    consumer counts."""
    s.mask("message_count")
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.consume(1, "s", "no-qos")
    d = s.connect()
    d.open(2)
    d.rpc(2, C.Basic.Qos(prefetch_count=10))
    d.consume(2, "s", "auto-ack", no_ack=True)
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=10, global_=True))
    c.consume(3, "s", "global")
    c.open(6)
    c.rpc(6, C.Queue.Declare(queue="s", passive=True))
    c.rpc(6, C.Basic.Qos(prefetch_count=10))
    c.consume(6, "s", "plain-1")
    c.consume(6, "s", "plain-2")
    c.rpc(6, C.Queue.Declare(queue="s", passive=True))
    c.rpc(6, C.Basic.Cancel(consumer_tag="plain-1"))
    c.rpc(6, C.Queue.Declare(queue="s", passive=True))
    c.rpc(6, C.Queue.Declare(queue="s", durable=True, arguments=STREAM))
    c.close_channel(6)
    c.open(7)
    c.rpc(7, C.Queue.Declare(queue="s", passive=True))


@scenario
def global_qos_with_a_prefetch(s: Session) -> None:
    """A consumer prefetch and a global one on the channel: the stream refuses the
    consumer (after its other checks), closing the connection."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.rpc(1, C.Basic.Qos(prefetch_count=10))
    c.rpc(1, C.Basic.Qos(prefetch_count=2, global_=True))
    c.consume(1, "s", "priority", arguments={"x-priority": 1})
    d = s.connect()
    d.open(1)
    d.rpc(1, C.Basic.Qos(prefetch_count=10))
    d.rpc(1, C.Basic.Qos(prefetch_count=0, global_=True))
    d.consume(1, "s", "global-zero")
    e = s.connect()
    e.open(1)
    e.rpc(1, C.Basic.Qos(prefetch_count=10))
    e.rpc(1, C.Basic.Qos(prefetch_count=2, global_=True))
    e.consume(1, "s", "global")


@scenario
def exclusive_consumer(s: Session) -> None:
    """An exclusive consumer on a stream, then another consumer."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.rpc(1, C.Basic.Qos(prefetch_count=10))
    c.consume(1, "s", "excl", exclusive=True)
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=10))
    c.consume(2, "s", "second")
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=10))
    c.consume(3, "s", "third", exclusive=True)


@scenario
def offsets(s: Session) -> None:
    """x-stream-offset: first, last, next, a number, an interval; each delivery's header."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1", "m2", "m3"])
    for n, offset in enumerate(["first", "last", 2, 0, "1h"], start=2):
        c.open(n)
        c.rpc(n, C.Basic.Qos(prefetch_count=10))
        c.consume(n, "s", f"at-{offset}", arguments={"x-stream-offset": offset})
        c.deliveries(n, 4 if offset in ("first", 0, "1h") else (1 if offset == "last" else 2))
    c.open(10)
    c.rpc(10, C.Basic.Qos(prefetch_count=10))
    c.consume(10, "s", "at-next", arguments={"x-stream-offset": "next"})
    c.events(10)
    c.publish(1, "", "s", b"m4")
    c.confirms(1)
    c.deliveries(10, 1)


@scenario
def offset_past_the_end(s: Session) -> None:
    """A consumer that asks for an offset past the end starts at that offset once it
    exists (not at the end, not with earlier messages)."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1", "m2"])
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=10))
    c.consume(2, "s", "far", arguments={"x-stream-offset": 5})
    c.events(2)
    for body in ["m3", "m4", "m5", "m6"]:
        c.publish(1, "", "s", body.encode())
    c.confirms(1)
    c.deliveries(2, 2)
    c.events(2)


@scenario
def bad_offsets(s: Session) -> None:
    """Malformed x-stream-offset values (each on a connection of its own)."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    for offset in ["bogus", True, -1, "10x", 1.5]:
        d = s.connect()
        d.open(1)
        d.rpc(1, C.Basic.Qos(prefetch_count=10))
        d.consume(1, "s", "t", arguments={"x-stream-offset": offset})
        d.alive()


@scenario
def acks_give_credit(s: Session) -> None:
    """With prefetch 2, acking lets more come; nothing is removed by an ack."""
    s.mask("message_count")
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1", "m2", "m3", "m4"])
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=2))
    c.consume(2, "s", "t", arguments={"x-stream-offset": "first"})
    c.deliveries(2, 2)
    c.events(2)
    c.ack(2, 2, multiple=True)
    c.deliveries(2, 2)
    c.ack(2, 3)
    c.ack(2, 4)
    c.deliveries(2, 1)
    c.open(3)
    c.rpc(3, C.Queue.Declare(queue="s", passive=True))


@scenario
def nack_and_reject(s: Session) -> None:
    """basic.nack and basic.reject of a stream delivery."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1", "m2"])
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=10))
    c.consume(2, "s", "t", arguments={"x-stream-offset": "first"})
    c.deliveries(2, 3)
    c.nack(2, 1, requeue=True)
    c.events(2)
    c.alive()
    d = s.connect()
    d.open(1)
    d.rpc(1, C.Basic.Qos(prefetch_count=10))
    d.consume(1, "s", "t", arguments={"x-stream-offset": "first"})
    d.deliveries(1, 3)
    d.reject(1, 2, requeue=False)
    d.events(1)
    d.alive()
    e = s.connect()
    e.open(1)
    e.rpc(1, C.Basic.Qos(prefetch_count=10))
    e.consume(1, "s", "t", arguments={"x-stream-offset": "first"})
    e.deliveries(1, 3)
    e.nack(1, 3, multiple=True, requeue=False)
    e.events(1)
    e.alive()


@scenario
def get_and_purge(s: Session) -> None:
    """basic.get and queue.purge on a stream."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0"])
    c.get(1, "s", no_ack=False)
    c.alive()
    d = s.connect()
    d.open(1)
    d.rpc(1, C.Queue.Purge(queue="s"))
    d.alive()
    e = s.connect()
    e.open(1)
    e.get(1, "s", no_ack=True)
    e.alive()


@scenario
def delete_if_empty(s: Session) -> None:
    """if-empty on a stream that has messages."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1"])
    c.rpc(1, C.Queue.Delete(queue="s", if_empty=True))
    c.rpc(1, C.Queue.Declare(queue="s", passive=True))


@scenario
def delete_if_unused(s: Session) -> None:
    """if-unused on a stream that has a consumer."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=10))
    c.consume(2, "s", "t")
    c.rpc(1, C.Queue.Delete(queue="s", if_unused=True))
    c.events(2)


@scenario
def delete_if_unused_without_consumers(s: Session) -> None:
    """if-unused on a stream whose consumer was cancelled."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.rpc(1, C.Basic.Qos(prefetch_count=10))
    c.consume(1, "s", "t")
    c.rpc(1, C.Basic.Cancel(consumer_tag="t"))
    c.rpc(1, C.Queue.Delete(queue="s", if_unused=True))
    c.rpc(1, C.Queue.Declare(queue="s", passive=True))


@scenario
def delete_cancels_consumers(s: Session) -> None:
    """Deleting a stream sends basic.cancel to consumers that asked for it
    (consumer_cancel_notify) and nothing to those that did not."""
    owner = s.connect()
    owner.open(1)
    _stream(owner, 1, "s")
    notified = s.connect()
    notified.open(1)
    notified.rpc(1, C.Basic.Qos(prefetch_count=10))
    notified.consume(1, "s", "told")
    silent = s.connect(capabilities={"consumer_cancel_notify": False})
    silent.open(1)
    silent.rpc(1, C.Basic.Qos(prefetch_count=10))
    silent.consume(1, "s", "not-told")
    owner.rpc(1, C.Queue.Delete(queue="s"))
    notified.events(1)
    silent.events(1)
    notified.alive()
    silent.alive()


@scenario
def publish_to_stream(s: Session) -> None:
    """Publishes through an exchange reach a stream with their properties; confirms."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    c.rpc(1, C.Queue.Bind(queue="s", exchange="amq.direct", routing_key="k"))
    c.confirm_select(1)
    c.publish(1, "amq.direct", "k", b"routed", headers={"h": "v"}, content_type="text/plain")
    c.publish(1, "", "s", b"direct", delivery_mode=2)
    c.publish(1, "amq.direct", "k", b"mandatory", mandatory=True)
    c.confirms(1)
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=10))
    c.consume(2, "s", "t", arguments={"x-stream-offset": "first"})
    c.deliveries(2, 3)


@scenario
def binary_offsets(s: Session) -> None:
    """x-stream-offset as a byte array (field type 'x', what pika sends for Python
    bytes): first, last and next as in a longstr; an interval or a number in one is
    refused (each refusal on a connection of its own)."""
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", ["m0", "m1", "m2"])
    for n, (offset, count) in enumerate([(b"first", 3), (b"last", 1)], start=2):
        c.open(n)
        c.rpc(n, C.Basic.Qos(prefetch_count=10))
        c.consume(n, "s", f"at-{offset.decode()}", arguments={"x-stream-offset": bytearray(offset)})
        c.deliveries(n, count)
    c.open(5)
    c.rpc(5, C.Basic.Qos(prefetch_count=10))
    c.consume(5, "s", "at-next", arguments={"x-stream-offset": bytearray(b"next")})
    c.events(5)
    c.publish(1, "", "s", b"m3")
    c.confirms(1)
    c.deliveries(5, 1)
    for offset in (b"1h", b"2", b"bogus"):
        d = s.connect()
        d.open(1)
        d.rpc(1, C.Basic.Qos(prefetch_count=10))
        d.consume(1, "s", "t", arguments={"x-stream-offset": bytearray(offset)})
        d.alive()


@scenario
def credit_per_ack(s: Session) -> None:
    """Each acked message is one more credit at once: prefetch 20, a multiple ack of 5
    lets 5 more come, then each single ack one more; an ack of a tag already acked
    is 406 (unknown delivery tag)."""
    s.mask("message_count")
    c = s.connect()
    c.open(1)
    _stream(c, 1, "s")
    _publish(c, 1, "s", [f"m{i}" for i in range(30)])
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=20))
    c.consume(2, "s", "t", arguments={"x-stream-offset": "first"})
    c.deliveries(2, 20)
    c.events(2)
    c.ack(2, 5, multiple=True)
    c.deliveries(2, 5)
    c.events(2)
    c.ack(2, 6)
    c.deliveries(2, 1)
    c.ack(2, 7)
    c.deliveries(2, 1)
    c.events(2)
    c.ack(2, 1)
    c.events(2)
    c.alive()


@scenario
def segment_size_maximum(s: Session) -> None:
    """x-stream-max-segment-size-bytes above 3,000,000,000 is refused, after the
    flags and the other arguments are checked; a redeclaration compares it first."""
    c = s.connect()
    big = {"x-stream-max-segment-size-bytes": 3_000_000_001}
    cases = [
        ({"durable": True}, {"x-stream-max-segment-size-bytes": 3_000_000_000}),
        ({"durable": True}, big),
        ({"durable": True}, {"x-stream-max-segment-size-bytes": 2**63 - 1}),
        ({"durable": False}, big),
        ({"durable": True, "exclusive": True}, big),
        ({"durable": True}, {**big, "x-message-ttl": 5}),
        ({"durable": True}, {**big, "x-max-length-bytes": -1}),
    ]
    for n, (flags, args) in enumerate(cases, start=1):
        c.open(n)
        c.rpc(n, C.Queue.Declare(queue=f"s{n}", arguments={**STREAM, **args}, **flags))
    c.open(20)
    _stream(c, 20, "small", **{"x-stream-max-segment-size-bytes": 1000})
    _stream(c, 20, "small", **big)
    c.alive()
