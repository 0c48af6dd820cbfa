"""RabbitMQ's extensions to AMQP 0-9-1, each with its success and error paths:
TTLs and x-expires, dead-lettering and x-death, length limits and overflow, priorities,
single active consumer, consumer priorities, alternate exchanges, CC/BCC, direct
reply-to, exchange-to-exchange bindings, consumer cancel notifications, auto-delete."""

from __future__ import annotations

from .runner import C, Conn, P, Session, scenario

WAIT_TTL = 0.4  # longer than every TTL below


def _q(c: Conn, ch: int, name: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, arguments=args))


def _count(c: Conn, ch: int, name: str) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, passive=True))


def _drain(c: Conn, ch: int, name: str, n: int, wait: float = 0.0) -> None:
    """n basic.gets; with `wait` the first n-1 may wait for a message (dead-lettered
    ones arrive asynchronously on RabbitMQ); the last one is expected empty."""
    for i in range(n):
        c.get(ch, name, wait=wait if i < n - 1 else 0.0)


# --- TTL and expiry ---------------------------------------------------------------------


@scenario
def queue_message_ttl(s: Session) -> None:
    """x-message-ttl drops messages; the expiration property per message; the lower wins."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q", **{"x-message-ttl": 100})
    c.publish(1, "", "q", b"dies")
    c.publish(1, "", "q", b"also dies", expiration="60000")
    _q(c, 1, "long", **{"x-message-ttl": 60000})
    c.publish(1, "", "long", b"per-message", expiration="100")
    c.publish(1, "", "long", b"stays")
    s.sleep(WAIT_TTL)
    _count(c, 1, "q")
    c.get(1, "q")
    c.get(1, "long")
    c.get(1, "long")


@scenario
def ttl_zero(s: Session) -> None:
    """x-message-ttl 0: delivered to a consumer that can take it, else dropped."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q", **{"x-message-ttl": 0})
    c.publish(1, "", "q", b"nobody there")
    c.rpc(1, C.Basic.Qos(prefetch_count=1))
    c.consume(1, "q", "t")
    c.publish(1, "", "q", b"taken")
    c.deliveries(1, 1)
    c.publish(1, "", "q", b"consumer full")
    c.events(1)
    c.ack(1, 1)
    c.events(1)


@scenario
def ttl_bad_values(s: Session) -> None:
    """Bad x-message-ttl arguments and expiration properties."""
    c = s.connect()
    for n, value in enumerate([-1, "100", 1.5], start=1):
        c.open(n)
        _q(c, n, f"q{n}", **{"x-message-ttl": value})
    c.open(9)
    _q(c, 9, "ok")
    for n, expiration in enumerate(["abc", "-5", "1.5", ""], start=10):
        c.open(n)
        c.publish(n, "", "ok", b"m", expiration=expiration)
        c.events(n)
    c.open(20)
    _count(c, 20, "ok")


@scenario
def queue_expires(s: Session) -> None:
    """x-expires deletes an unused queue; a consumer keeps it; 0 is refused."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "gone", **{"x-expires": 100})
    _q(c, 1, "kept", **{"x-expires": 100})
    c.consume(1, "kept", "t")
    s.sleep(WAIT_TTL)
    c.open(2)
    _count(c, 2, "gone")
    c.open(3)
    _count(c, 3, "kept")
    c.open(4)
    _q(c, 4, "zero", **{"x-expires": 0})
    c.open(5)
    _q(c, 5, "negative", **{"x-expires": -10})


# --- dead-lettering ----------------------------------------------------------------------


def _dlx_setup(c: Conn, **source_args) -> None:
    c.rpc(1, C.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    _q(c, 1, "dlq")
    c.rpc(1, C.Queue.Bind(queue="dlq", exchange="dlx"))
    _q(c, 1, "src", **{"x-dead-letter-exchange": "dlx", **source_args})


@scenario
def dead_letter_rejected(s: Session) -> None:
    """basic.reject and basic.nack without requeue dead-letter with x-death; requeue does not."""
    c = s.connect()
    c.open(1)
    _dlx_setup(c)
    c.publish(1, "", "src", b"one", headers={"app": "h"}, message_id="m1")
    c.publish(1, "", "src", b"two")
    c.publish(1, "", "src", b"three")
    c.get(1, "src", no_ack=False)
    c.reject(1, 1, requeue=False)
    c.get(1, "src", no_ack=False)
    c.nack(1, 2, requeue=False)
    c.get(1, "src", no_ack=False)
    c.nack(1, 3, requeue=True)
    _drain(c, 1, "dlq", 3, wait=2)
    _count(c, 1, "src")


@scenario
def dead_letter_expired(s: Session) -> None:
    """An expired message is dead-lettered (reason expired), with the routing key set."""
    c = s.connect()
    c.open(1)
    _dlx_setup(c, **{"x-message-ttl": 50, "x-dead-letter-routing-key": "new-key"})
    c.publish(1, "", "src", b"queue ttl")
    c.publish(1, "", "src", b"message ttl", expiration="20")
    s.sleep(WAIT_TTL)
    _drain(c, 1, "dlq", 3, wait=2)


@scenario
def dead_letter_maxlen(s: Session) -> None:
    """x-max-length drop-head dead-letters the oldest (reason maxlen)."""
    c = s.connect()
    c.open(1)
    _dlx_setup(c, **{"x-max-length": 1})
    c.publish(1, "", "src", b"first")
    c.publish(1, "", "src", b"second")
    _drain(c, 1, "dlq", 2, wait=2)
    c.get(1, "src")


@scenario
def dead_letter_cycles(s: Session) -> None:
    """x-death counts repeats: a message rejected twice through the same queues."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "b", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
    _q(c, 1, "a", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"})
    c.publish(1, "", "a", b"round")
    for tag, queue in enumerate(["a", "b", "a"], start=1):
        c.get(1, queue, no_ack=False, wait=2)
        c.reject(1, tag, requeue=False)
    c.get(1, "b", no_ack=False, wait=2)


@scenario
def dead_letter_to_itself_on_expiry(s: Session) -> None:
    """An expired message whose dead-letter target is its own queue is dropped."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "self", **{"x-message-ttl": 50, "x-dead-letter-exchange": ""})
    c.publish(1, "", "self", b"m")
    s.sleep(WAIT_TTL)
    _count(c, 1, "self")


@scenario
def dead_letter_errors(s: Session) -> None:
    """A missing dead-letter exchange drops silently; bad dead-letter arguments."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "src", **{"x-dead-letter-exchange": "missing"})
    c.publish(1, "", "src", b"m")
    c.get(1, "src", no_ack=False)
    c.reject(1, 1, requeue=False)
    _count(c, 1, "src")
    c.open(2)
    _q(c, 2, "rk-only", **{"x-dead-letter-routing-key": "k"})
    c.open(3)
    _q(c, 3, "bad-type", **{"x-dead-letter-exchange": 5})
    c.open(4)
    _q(c, 4, "bad-rk", **{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 5})


# --- length limits -------------------------------------------------------------------------


@scenario
def max_length_drop_head(s: Session) -> None:
    """x-max-length and x-max-length-bytes drop the oldest; unacked do not count."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "n", **{"x-max-length": 2})
    c.confirm_select(1)
    for body in ["a", "b", "c"]:
        c.publish(1, "", "n", body.encode())
    c.confirms(1)
    _count(c, 1, "n")
    c.get(1, "n", no_ack=False)
    c.publish(1, "", "n", b"d")
    c.publish(1, "", "n", b"e")
    c.confirms(1)
    _count(c, 1, "n")
    _q(c, 1, "bytes", **{"x-max-length-bytes": 10})
    for body in ["12345", "67890", "abcde"]:
        c.publish(1, "", "bytes", body.encode())
    _drain(c, 1, "bytes", 3)
    _q(c, 1, "zero", **{"x-max-length": 0})
    c.publish(1, "", "zero", b"never kept")
    c.confirms(1)
    _count(c, 1, "zero")


@scenario
def overflow_reject_publish(s: Session) -> None:
    """x-overflow reject-publish nacks; reject-publish-dlx nacks and dead-letters."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    _q(c, 1, "dlq")
    c.rpc(1, C.Queue.Bind(queue="dlq", exchange="dlx"))
    _q(c, 1, "rp", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    _q(
        c,
        1,
        "rpd",
        **{
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "dlx",
        },
    )
    c.confirm_select(1)
    c.publish(1, "", "rp", b"fits")
    c.publish(1, "", "rp", b"refused")
    c.publish(1, "", "rpd", b"fits")
    c.publish(1, "", "rpd", b"refused, dead-lettered")
    c.confirms(1)
    _drain(c, 1, "dlq", 2, wait=2)
    c.open(2)
    _q(c, 2, "bad", **{"x-overflow": "drop-tail"})
    c.open(3)
    _q(c, 3, "bad2", **{"x-max-length": "ten"})


# --- priorities ----------------------------------------------------------------------------


@scenario
def priority_queue(s: Session) -> None:
    """x-max-priority: higher first, FIFO within one, above max counts as max."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "p", **{"x-max-priority": 5})
    for body, prio in [("none", None), ("p1", 1), ("p5", 5), ("p3", 3), ("p9", 9), ("p1b", 1)]:
        c.publish(1, "", "p", body.encode(), priority=prio)
    _drain(c, 1, "p", 7)
    c.open(2)
    _q(c, 2, "too-high", **{"x-max-priority": 256})
    c.open(3)
    _q(c, 3, "negative", **{"x-max-priority": -1})
    c.open(4)
    _q(c, 4, "string", **{"x-max-priority": "5"})


# --- consumers ------------------------------------------------------------------------------


@scenario
def single_active_consumer(s: Session) -> None:
    """Only the first consumer receives; when it goes, the next takes over."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "sac", **{"x-single-active-consumer": True})
    c.open(2)
    c.consume(2, "sac", "first")
    c.open(3)
    c.consume(3, "sac", "second")
    for body in ["a", "b"]:
        c.publish(1, "", "sac", body.encode())
    c.deliveries(2, 2)
    c.events(3)
    c.rpc(2, C.Basic.Cancel(consumer_tag="first"))
    c.deliveries(3, 2)
    c.publish(1, "", "sac", b"c")
    c.deliveries(3, 1)
    _count(c, 1, "sac")
    c.open(4)
    _q(c, 4, "bad", **{"x-single-active-consumer": "yes"})


@scenario
def consumer_priorities(s: Session) -> None:
    """x-priority: the higher-priority consumer gets messages while it has room."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=2))
    c.consume(2, "q", "low", arguments={"x-priority": -1})
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=2))
    c.consume(3, "q", "high", arguments={"x-priority": 10})
    for body in ["a", "b", "c", "d", "e"]:
        c.publish(1, "", "q", body.encode())
    c.deliveries(3, 2)
    c.deliveries(2, 2)
    c.events(3)
    c.open(4)
    c.consume(4, "q", "bad", arguments={"x-priority": "high"})


@scenario
def cancel_notify_on_queue_delete(s: Session) -> None:
    """Deleting a queue cancels its consumers: basic.cancel to those with the
    consumer_cancel_notify capability, nothing to the others."""
    owner = s.connect()
    owner.open(1)
    _q(owner, 1, "q")
    told = s.connect()
    told.open(1)
    told.consume(1, "q", "told")
    silent = s.connect(capabilities={"consumer_cancel_notify": False})
    silent.open(1)
    silent.consume(1, "q", "silent")
    owner.rpc(1, C.Queue.Delete(queue="q"))
    told.events(1)
    silent.events(1)
    told.alive()
    silent.alive()


@scenario
def auto_delete(s: Session) -> None:
    """An auto-delete queue goes with its last consumer, not before it had one; an
    auto-delete exchange with its last binding."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="ad", auto_delete=True))
    _count(c, 1, "ad")
    c.consume(1, "ad", "one")
    c.consume(1, "ad", "two")
    c.rpc(1, C.Basic.Cancel(consumer_tag="one"))
    _count(c, 1, "ad")
    c.rpc(1, C.Basic.Cancel(consumer_tag="two"))
    c.open(2)
    _count(c, 2, "ad")
    c.open(3)
    c.rpc(3, C.Exchange.Declare(exchange="adx", exchange_type="fanout", auto_delete=True))
    c.rpc(3, C.Queue.Declare(queue="plain"))
    c.rpc(3, C.Queue.Bind(queue="plain", exchange="adx"))
    c.rpc(3, C.Queue.Unbind(queue="plain", exchange="adx"))
    c.rpc(3, C.Exchange.Declare(exchange="adx", exchange_type="fanout", passive=True))


# --- routing extensions ----------------------------------------------------------------------


@scenario
def alternate_exchange(s: Session) -> None:
    """Unroutable messages go to the alternate exchange; a missing one drops them."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="ae", exchange_type="fanout"))
    _q(c, 1, "unrouted")
    c.rpc(1, C.Queue.Bind(queue="unrouted", exchange="ae"))
    c.rpc(
        1,
        C.Exchange.Declare(
            exchange="main", exchange_type="direct", arguments={"alternate-exchange": "ae"}
        ),
    )
    _q(c, 1, "routed")
    c.rpc(1, C.Queue.Bind(queue="routed", exchange="main", routing_key="k"))
    c.publish(1, "main", "k", b"routed")
    c.publish(1, "main", "other", b"to the AE", mandatory=True)
    c.rpc(
        1,
        C.Exchange.Declare(
            exchange="lost", exchange_type="direct", arguments={"alternate-exchange": "missing"}
        ),
    )
    c.publish(1, "lost", "k", b"returned", mandatory=True)
    c.publish(1, "lost", "k", b"dropped")
    c.events(1)
    _drain(c, 1, "routed", 2)
    _drain(c, 1, "unrouted", 2)


@scenario
def cc_and_bcc(s: Session) -> None:
    """CC routes to more keys and stays in the headers; BCC routes and is removed."""
    c = s.connect()
    c.open(1)
    for q in ("a", "b", "c"):
        _q(c, 1, q)
        c.rpc(1, C.Queue.Bind(queue=q, exchange="amq.direct", routing_key=q))
    c.publish(1, "amq.direct", "a", b"cc", headers={"CC": ["b"], "keep": 1})
    c.publish(1, "amq.direct", "a", b"bcc", headers={"BCC": ["c"]})
    c.publish(1, "amq.direct", "nowhere", b"cc makes it routable", mandatory=True,
              headers={"CC": ["b", "b"]})  # fmt: skip
    c.events(1)
    _drain(c, 1, "a", 3)
    _drain(c, 1, "b", 3)
    _drain(c, 1, "c", 2)
    c.publish(1, "amq.direct", "a", b"bad cc", headers={"CC": "b"})
    c.events(1)
    c.alive()


@scenario
def direct_reply_to(s: Session) -> None:
    """RPC over amq.rabbitmq.reply-to, and its errors."""
    server = s.connect()
    server.open(1)
    _q(server, 1, "rpc")
    client = s.connect()
    client.open(1)
    client.rpc(1, C.Queue.Declare(queue="amq.rabbitmq.reply-to", passive=True))
    client.consume(1, "amq.rabbitmq.reply-to", "replies", no_ack=True)
    client.publish(1, "", "rpc", b"request", reply_to="amq.rabbitmq.reply-to",
                   correlation_id="c1")  # fmt: skip
    request = server.get(1, "rpc", wait=2)
    reply_to = request.get("properties", {}).get("reply_to", "")
    s.record("reply_to is a reply-to name", str(reply_to).startswith("{reply"))
    token = next((k for k, v in client.session.names.seen.items() if v == reply_to), "amq.invalid")
    server.publish(1, "", token, b"response", correlation_id="c1")
    client.deliveries(1, 1)
    bad = s.connect()
    bad.open(1)
    bad.consume(1, "amq.rabbitmq.reply-to", "acks")
    bad.open(2)
    bad.publish(2, "", "rpc", b"no consumer", reply_to="amq.rabbitmq.reply-to")
    bad.events(2)
    bad.alive()


@scenario
def exchange_to_exchange(s: Session) -> None:
    """exchange.bind routes from one exchange through another; unbind; errors."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="src", exchange_type="topic"))
    c.rpc(1, C.Exchange.Declare(exchange="dst", exchange_type="fanout"))
    _q(c, 1, "q")
    c.rpc(1, C.Queue.Bind(queue="q", exchange="dst"))
    c.rpc(1, C.Exchange.Bind(destination="dst", source="src", routing_key="a.#"))
    c.publish(1, "src", "a.b", b"through")
    c.publish(1, "src", "b.a", b"not bound")
    c.get(1, "q")
    c.get(1, "q")
    c.rpc(1, C.Exchange.Unbind(destination="dst", source="src", routing_key="a.#"))
    c.publish(1, "src", "a.b", b"after unbind")
    c.get(1, "q")
    c.rpc(1, C.Exchange.Bind(destination="dst", source="missing", routing_key="k"))
    c.open(2)
    c.rpc(2, C.Exchange.Bind(destination="missing", source="src", routing_key="k"))
    c.open(3)
    c.rpc(3, C.Exchange.Unbind(destination="dst", source="src", routing_key="never"))
    c.rpc(3, C.Exchange.Bind(destination="dst", source="amq.default", routing_key="k"))
    c.open(4)
    c.rpc(4, C.Exchange.Bind(destination="amq.default", source="src", routing_key="k"))


@scenario
def consistent_hash_exchange(s: Session) -> None:
    """x-consistent-hash: every message reaches exactly one queue (where each key goes
    differs by design); bad binding weights."""
    s.mask("message_count")  # which queue a key reaches differs on purpose
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="h", exchange_type="x-consistent-hash"))
    for q, weight in (("h1", "1"), ("h2", "2")):
        _q(c, 1, q)
        c.rpc(1, C.Queue.Bind(queue=q, exchange="h", routing_key=weight))
    c.confirm_select(1)
    for i in range(50):
        c.publish(1, "h", f"key-{i}", b"m")
    c.confirms(1)
    counts = []
    for q in ("h1", "h2"):
        c.raw.send_method(1, C.Queue.Declare(queue=q, passive=True))
        ev = c.wait(1, C.Queue.DeclareOk)
        counts.append(ev.method.message_count if ev is not None else -1)
    s.record("messages in all", sum(counts))
    s.record("each queue has some", all(n > 0 for n in counts))
    c.rpc(1, C.Queue.Bind(queue="h1", exchange="h", routing_key="heavy"))
    c.open(2)
    c.rpc(2, C.Queue.Bind(queue="h1", exchange="h", routing_key="-1"))


@scenario
def properties_roundtrip(s: Session) -> None:
    """Header field types survive routing as they were sent (decimal, timestamp,
    nested tables and arrays, binary)."""
    import datetime
    import decimal

    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    c.publish(
        1,
        "",
        "q",
        b"typed",
        P(
            headers={
                "dec": decimal.Decimal("1.25"),
                "ts": datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
                "nested": {"a": [1, "x", {"b": False}]},
                "big": 2**40,
                "neg": -3,
                "void": None,
            },
            timestamp=datetime.datetime(2021, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
        ),
    )
    c.get(1, "q")
