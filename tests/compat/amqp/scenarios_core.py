"""Core AMQP 0-9-1: declarations, bindings, basic.get, tx, exclusivity, errors."""

from __future__ import annotations

from .runner import C, P, Session, scenario


@scenario
def queue_declare_and_passive(s: Session) -> None:
    """Declare, redeclare, passive declare of an existing and a missing queue."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q1", durable=True))
    c.rpc(1, C.Queue.Declare(queue="q1", durable=True))
    c.rpc(1, C.Queue.Declare(queue="q1", passive=True))
    c.rpc(1, C.Queue.Declare(queue="missing", passive=True))
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="q1", durable=False))
    c.alive()


@scenario
def queue_declare_inequivalent(s: Session) -> None:
    """Redeclaring with other flags or arguments: 406 naming the one that differs."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 5}))
    c.rpc(1, C.Queue.Declare(queue="q", durable=True, auto_delete=True))
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 6}))
    c.open(3)
    c.rpc(3, C.Queue.Declare(queue="q", durable=True))
    c.open(4)
    c.rpc(4, C.Queue.Declare(queue="q", durable=True, exclusive=True))


@scenario
def queue_declare_bad_names(s: Session) -> None:
    """Reserved and over-long names."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="amq.q"))
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="amq.q", passive=True))
    c.open(3)
    c.rpc(3, C.Queue.Declare(queue="x" * 255))
    c.rpc(3, C.Queue.Delete(queue="x" * 255))


@scenario
def server_named_queue(s: Session) -> None:
    """queue.declare with an empty name, then using the last queue name ('')."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="", exclusive=True))
    c.rpc(1, C.Queue.Bind(queue="", exchange="amq.fanout"))
    c.publish(1, "amq.fanout", "", b"to the last queue")
    c.get(1, "")
    c.rpc(1, C.Queue.Purge(queue=""))
    c.rpc(1, C.Queue.Delete(queue=""))
    c.open(2)
    c.get(2, "")


@scenario
def exchange_declare_errors(s: Session) -> None:
    """Unknown type, amq. prefix, inequivalent redeclare, passive of a missing one."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="x", exchange_type="topic", durable=True))
    c.rpc(1, C.Exchange.Declare(exchange="x", exchange_type="direct", durable=True))
    c.open(2)
    c.rpc(2, C.Exchange.Declare(exchange="x", exchange_type="topic", durable=False))
    c.open(3)
    c.rpc(3, C.Exchange.Declare(exchange="amq.mine", exchange_type="topic"))
    c.open(4)
    c.rpc(4, C.Exchange.Declare(exchange="nope", exchange_type="topic", passive=True))
    c.open(5)
    c.rpc(5, C.Exchange.Declare(exchange="amq.direct", exchange_type="direct", passive=True))
    c.rpc(5, C.Exchange.Declare(exchange="amq.direct", exchange_type="direct", durable=True))
    c.rpc(5, C.Exchange.Declare(exchange="y", exchange_type="no-such-type"))


@scenario
def exchange_delete(s: Session) -> None:
    """Delete missing (ok), if-unused with a binding (406), a built-in one (403)."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Delete(exchange="never-declared"))
    c.rpc(1, C.Exchange.Declare(exchange="x", exchange_type="fanout"))
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.rpc(1, C.Queue.Bind(queue="q", exchange="x"))
    c.rpc(1, C.Exchange.Delete(exchange="x", if_unused=True))
    c.open(2)
    c.rpc(2, C.Exchange.Delete(exchange="amq.fanout"))
    c.open(3)
    c.rpc(3, C.Exchange.Delete(exchange="x"))
    c.rpc(3, C.Exchange.Declare(exchange="x", exchange_type="fanout", passive=True))


@scenario
def bindings_errors(s: Session) -> None:
    """Binding missing queues and exchanges; the default exchange refuses bindings."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.rpc(1, C.Queue.Bind(queue="q", exchange="missing-x", routing_key="k"))
    c.open(2)
    c.rpc(2, C.Queue.Bind(queue="missing-q", exchange="amq.direct", routing_key="k"))
    c.open(3)
    c.rpc(3, C.Queue.Bind(queue="q", exchange="", routing_key="q"))
    c.open(4)
    c.rpc(4, C.Queue.Unbind(queue="q", exchange="amq.direct", routing_key="never-bound"))
    c.rpc(4, C.Queue.Unbind(queue="q", exchange="missing-x", routing_key="k"))
    c.open(5)
    c.rpc(5, C.Queue.Unbind(queue="missing-q", exchange="amq.direct", routing_key="k"))


@scenario
def publish_routing(s: Session) -> None:
    """Direct, topic, fanout and headers routing; mandatory returns; missing exchange."""
    c = s.connect()
    c.open(1)
    for q in ("qa", "qb", "qc"):
        c.rpc(1, C.Queue.Declare(queue=q))
    c.rpc(1, C.Queue.Bind(queue="qa", exchange="amq.topic", routing_key="a.*"))
    c.rpc(1, C.Queue.Bind(queue="qb", exchange="amq.topic", routing_key="#.b"))
    c.rpc(
        1,
        C.Queue.Bind(
            queue="qc", exchange="amq.headers", arguments={"x-match": "any", "k": "v", "n": 1}
        ),
    )
    c.publish(1, "amq.topic", "a.b", b"both")
    c.publish(1, "amq.topic", "a.c", b"qa only")
    c.publish(1, "amq.headers", "", b"headers", headers={"k": "v"})
    c.publish(1, "amq.topic", "none", b"returned", mandatory=True)
    c.publish(1, "", "qc", b"default exchange")
    c.events(1)
    for q in ("qa", "qb", "qc", "qc", "qc"):
        c.get(1, q)
    c.publish(1, "missing-x", "k", b"lost")
    c.events(1)
    c.alive()


@scenario
def basic_get_and_properties(s: Session) -> None:
    """basic.get returns every property and header type as published."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    props = P(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"s": "str", "i": 7, "b": True, "f": 1.5, "t": {"n": [1, "two"]}},
        delivery_mode=2,
        priority=3,
        correlation_id="corr",
        reply_to="rq",
        expiration="60000",
        message_id="mid",
        message_type="kind",
        user_id="guest",
        app_id="app",
    )
    c.publish(1, "", "q", b'{"a": 1}', props)
    c.publish(1, "", "q", b"")
    c.get(1, "q", no_ack=False)
    c.get(1, "q", no_ack=False)
    c.get(1, "q")
    c.ack(1, 1)
    c.ack(1, 2)
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    c.get(1, "missing")


@scenario
def user_id_must_match(s: Session) -> None:
    """A user_id other than the connection's user: 406."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.publish(1, "", "q", b"spoof", user_id="somebody-else")
    c.events(1)
    c.alive()


@scenario
def acks_errors(s: Session) -> None:
    """Unknown and repeated delivery tags; multiple acks; nack and reject requeue."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    for i in range(4):
        c.publish(1, "", "q", f"m{i}".encode())
    c.rpc(1, C.Basic.Qos(prefetch_count=10))
    c.consume(1, "q", "ctag")
    c.deliveries(1, 4)
    c.ack(1, 2, multiple=True)
    c.reject(1, 3, requeue=True)
    c.deliveries(1, 1)
    c.nack(1, 5, requeue=False)
    c.nack(1, 4, requeue=True)
    c.deliveries(1, 1)
    c.ack(1, 6)
    c.ack(1, 6)
    c.events(1)
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="q", passive=True))


@scenario
def qos_and_redelivery(s: Session) -> None:
    """prefetch_count limits deliveries; closing the channel requeues (redelivered)."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    for i in range(5):
        c.publish(1, "", "q", f"m{i}".encode())
    c.rpc(1, C.Basic.Qos(prefetch_count=2))
    c.consume(1, "q", "one")
    c.deliveries(1, 2)
    c.events(1)
    c.ack(1, 1)
    c.deliveries(1, 1)
    c.close_channel(1)
    c.open(2)
    c.get(2, "q")
    c.get(2, "q")
    c.rpc(2, C.Queue.Declare(queue="q", passive=True))


@scenario
def basic_recover(s: Session) -> None:
    """basic.recover requeue=true redelivers the unacked; requeue=false is refused."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.publish(1, "", "q", b"m")
    c.consume(1, "q", "t")
    c.deliveries(1, 1)
    c.rpc(1, C.Basic.Recover(requeue=True))
    c.deliveries(1, 1)
    c.rpc(1, C.Basic.Recover(requeue=False))
    c.alive()


@scenario
def consume_errors(s: Session) -> None:
    """Consuming a missing queue, a duplicate tag, cancel of an unknown tag."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.consume(1, "missing")
    c.open(2)
    c.consume(2, "q", "dup")
    c.consume(2, "q", "dup")
    c.open(3)
    c.rpc(3, C.Basic.Cancel(consumer_tag="never-was"))
    c.consume(3, "q")
    c.rpc(3, C.Queue.Declare(queue="q", passive=True))


@scenario
def exclusive_queue_and_consumer(s: Session) -> None:
    """An exclusive queue is locked to its connection; an exclusive consumer to itself."""
    a = s.connect()
    b = s.connect()
    a.open(1)
    b.open(1)
    a.rpc(1, C.Queue.Declare(queue="excl", exclusive=True))
    b.rpc(1, C.Queue.Declare(queue="excl", passive=True))
    b.open(2)
    b.consume(2, "excl")
    b.open(3)
    b.rpc(3, C.Queue.Delete(queue="excl"))
    b.open(4)
    b.rpc(4, C.Queue.Purge(queue="excl"))
    b.open(5)
    b.rpc(5, C.Queue.Declare(queue="excl"))
    a.rpc(1, C.Queue.Declare(queue="shared"))
    a.consume(1, "shared", "first", exclusive=True)
    b.open(6)
    b.consume(6, "shared", "second")
    a.consume(1, "shared", "third")
    a.close()
    b.open(7)
    b.rpc(7, C.Queue.Declare(queue="excl", passive=True))


@scenario
def queue_delete_conditions(s: Session) -> None:
    """if-empty and if-unused on queue.delete; deleting a missing queue."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.publish(1, "", "q", b"m")
    c.rpc(1, C.Queue.Delete(queue="q", if_empty=True))
    c.open(2)
    c.consume(2, "q", "t", no_ack=False)
    c.deliveries(2, 1)
    c.open(3)
    c.rpc(3, C.Queue.Delete(queue="q", if_unused=True))
    c.open(4)
    c.rpc(4, C.Queue.Delete(queue="missing"))
    c.rpc(4, C.Queue.Purge(queue="missing"))
    c.open(5)
    c.rpc(5, C.Queue.Delete(queue="q"))
    c.events(2)


@scenario
def tx_publish_and_ack(s: Session) -> None:
    """tx.select: publishes and acks take effect at commit; rollback drops them."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.rpc(1, C.Tx.Select())
    c.publish(1, "", "q", b"one")
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    c.rpc(1, C.Tx.Commit())
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    c.publish(1, "", "q", b"two")
    c.rpc(1, C.Tx.Rollback())
    c.get(1, "q", no_ack=False)
    c.ack(1, 1)
    c.rpc(1, C.Tx.Rollback())
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    c.rpc(1, C.Confirm.Select())
    c.open(2)
    c.rpc(2, C.Tx.Commit())
    c.open(3)
    c.rpc(3, C.Tx.Rollback())


@scenario
def confirms_basic(s: Session) -> None:
    """Confirms for routed, unroutable and mandatory-returned publishes; tx after confirm."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.confirm_select(1)
    c.publish(1, "", "q", b"routed")
    c.publish(1, "amq.direct", "nowhere", b"unroutable")
    c.publish(1, "amq.direct", "nowhere", b"returned", mandatory=True)
    c.confirms(1)
    c.events(1)
    c.rpc(1, C.Tx.Select())


@scenario
def access_refused(s: Session) -> None:
    """A user without configure/write/read rights: 403 on each; a vhost it may not use."""
    s.user("cx-limited", "pw", "^own-.*", "^own-.*", "^own-.*")
    admin = s.connect()
    admin.open(1)
    admin.rpc(1, C.Queue.Declare(queue="theirs"))
    admin.rpc(1, C.Exchange.Declare(exchange="their-x", exchange_type="fanout"))
    c = s.connect(user="cx-limited", password="pw")
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="own-q"))
    c.rpc(1, C.Queue.Declare(queue="theirs"))
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="theirs", passive=True))
    c.get(2, "theirs")
    c.open(3)
    c.publish(3, "their-x", "", b"m")
    c.events(3)
    c.open(4)
    c.rpc(4, C.Queue.Bind(queue="own-q", exchange="their-x"))
    c.open(5)
    c.rpc(5, C.Queue.Purge(queue="theirs"))
    c.open(6)
    c.rpc(6, C.Queue.Delete(queue="theirs"))
    c.open(7)
    c.consume(7, "theirs")
    s.connect(user="cx-limited", password="pw", vhost="/")
    s.connect(user="cx-limited", password="wrong")
    s.connect(vhost="cx-no-such-vhost")


@scenario
def channel_errors(s: Session) -> None:
    """Channel numbers: reopening an open one (504), a method on a closed one."""
    c = s.connect()
    c.open(1)
    c.open(1)
    d = s.connect()
    d.rpc(5, C.Queue.Declare(queue="q"))
    e = s.connect()
    e.open(1)
    e.rpc(1, C.Basic.Qos(prefetch_size=1))
    e.alive()


@scenario
def queue_type_classic_equivalence(s: Session) -> None:
    """x-queue-type classic given on one declaration and not on the other; an unknown type."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="typed", arguments={"x-queue-type": "classic"}))
    c.rpc(1, C.Queue.Declare(queue="typed"))
    c.open(2)
    c.rpc(2, C.Queue.Declare(queue="untyped"))
    c.rpc(2, C.Queue.Declare(queue="untyped", arguments={"x-queue-type": "classic"}))
    c.open(3)
    c.rpc(3, C.Queue.Declare(queue="new", arguments={"x-queue-type": "no-such-type"}))
    c.open(4)
    c.rpc(4, C.Queue.Declare(queue="new", arguments={"x-queue-type": 5}))


@scenario
def unknown_and_other_arguments(s: Session) -> None:
    """Unknown x- arguments are accepted and not compared; passive ignores arguments."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", arguments={"x-unknown": "a", "y": 1}))
    c.rpc(1, C.Queue.Declare(queue="q", arguments={"x-unknown": "b"}))
    c.rpc(1, C.Queue.Declare(queue="q", passive=True, arguments={"x-max-length": 1}))
    c.rpc(1, C.Exchange.Declare(exchange="x", exchange_type="direct", arguments={"x-any": 1}))
    c.rpc(1, C.Exchange.Declare(exchange="x", exchange_type="direct"))
    c.consume(1, "q", "t", arguments={"x-unknown-consumer-arg": True})


@scenario
def exclusive_queue_lifecycle(s: Session) -> None:
    """An exclusive queue outlives its channel, not its connection; other connections
    see it locked until then, and gone after."""
    owner = s.connect()
    owner.open(1)
    owner.rpc(1, C.Queue.Declare(queue="mine", exclusive=True))
    owner.publish(1, "", "mine", b"m")
    owner.close_channel(1)
    owner.open(2)
    owner.rpc(2, C.Queue.Declare(queue="mine", passive=True))
    other = s.connect()
    other.open(1)
    other.get(1, "mine")
    owner.close()
    other.open(2)
    other.rpc(2, C.Queue.Declare(queue="mine", passive=True))
    other.open(3)
    other.rpc(3, C.Queue.Declare(queue="mine", exclusive=True))


@scenario
def channel_numbers(s: Session) -> None:
    """Channel numbers up to channel_max; a number above it; reuse after close."""
    c = s.connect()
    top = c.raw.tune.channel_max
    s.record("channel_max", top)
    c.open(top)
    c.close_channel(top)
    c.open(top)
    c.open(top + 1)


@scenario
def no_local_and_consume_flags(s: Session) -> None:
    """no_local is ignored (RabbitMQ delivers a connection's own messages); nowait
    consume; server-generated consumer tags."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.rpc(1, C.Basic.Consume(queue="q", no_local=True, no_ack=True))
    c.publish(1, "", "q", b"own message")
    c.deliveries(1, 1)
    c.send(1, C.Basic.Consume(queue="q", consumer_tag="quiet", nowait=True, no_ack=True))
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    c.rpc(1, C.Basic.Cancel(consumer_tag="quiet"))
    c.consume(1, "q")
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
