"""Consuming a queue another worker owns is what consuming it on one process is.

Each scenario below is one body run twice: against a one-process broker (every
party on its one port) and against three in-process workers (tests/workers/
inprocess.py), where the client consumes on worker 1 a queue that worker 0 owns,
publishers sit on worker 2, and a dead-letter queue or a second consumer is on
worker 2 or 0. What the clients observe (deliveries with their headers and
redelivered flags, offsets, counts, errors with code and text) must be equal; a
few checks on the one-process answer make sure it shows what the scenario is
about. Queue names differ between the two brokers (placement picks a suffix), so
observations name queues by their role.

Streams: x-stream-offset in its forms, the offset header on each delivery, acks as
credit, reading while another worker appends, the refusals (no qos, no-ack,
x-priority, a bad offset, basic.get) and cancel. Quorum queues: x-delivery-count
on returns and on basic.get, returns of a closed channel, x-delivery-limit
dead-lettering to a queue on a third worker. Consumer arguments and flags:
x-priority, exclusive consume, single active consumer with consumers on two
workers, no-ack consumers, a consumer tag used twice.
"""

from __future__ import annotations

import datetime
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from leveret.workers.serving import LinkedChannel
from workers.inprocess import InProcessWorkers, in_process_workers
from workers.placing import owned, place

STREAM = {"x-queue-type": "stream"}
QUORUM = {"x-queue-type": "quorum"}
_serial = itertools.count()


class Broker:
    """Where each party of a scenario connects (`url(role)`), and where its queues go
    (`declare(role, ...)`): roles "client", "owner" and "third"."""

    def __init__(self, one: Any = None, workers: InProcessWorkers | None = None) -> None:
        self.one = one
        self.workers = workers
        self.names: dict[str, str] = {}  # real queue name -> its name in observations
        self.linked: list[int] = []  # see `crossed`

    _INDEX = {"owner": 0, "client": 1, "third": 2}

    def url(self, role: str) -> str:
        if self.workers is None:
            return self.one.url
        return self.workers.url(self._INDEX[role])

    def declare(
        self, role: str, label: str, *, durable: bool = False, arguments: dict | None = None
    ) -> str:
        prefix = f"wks-{label}-{next(_serial)}"
        if self.workers is None:
            conn = pika.BlockingConnection(pika.URLParameters(self.one.url))
            try:
                conn.channel().queue_declare(prefix, durable=durable, arguments=arguments)
            finally:
                conn.close()
            name = prefix
        else:
            name = place(
                self.workers, self._INDEX[role], prefix, durable=durable, arguments=arguments
            )
        self.names[name] = f"<{label}>"
        return name

    def crossed(self, queue: str) -> None:
        """With workers: note how many consumers of `queue` on its owner are a client's
        on another worker (`same_on_both` checks that the scenario crossed)."""
        if self.workers is None:
            return

        def read() -> int:
            consumers = owned(self.workers, 0, queue).consumers  # type: ignore[arg-type]
            return sum(type(c.channel) is LinkedChannel for c in consumers)

        self.linked.append(self.workers.call(read))

    def norm(self, value: Any) -> Any:
        """`value` with queue names replaced by their labels and x-death times dropped."""
        if isinstance(value, bytes):
            return self.norm(value.decode(errors="replace")).encode()
        if isinstance(value, str):
            for name in sorted(self.names, key=len, reverse=True):
                value = value.replace(name, self.names[name])
            return value
        if isinstance(value, dict):
            return {k: self.norm(v) for k, v in value.items() if k != "time"}
        if isinstance(value, list | tuple):
            return type(value)(self.norm(v) for v in value)
        return value


@pytest.fixture(scope="module")
def brokers() -> Iterator[tuple[Broker, Broker]]:
    with embedded_broker(ServerConfig(port=0, persistence=False)) as one:
        with in_process_workers(3) as w:
            yield Broker(one=one), Broker(workers=w)


def same_on_both(
    brokers: tuple[Broker, Broker], scenario: Callable[[Broker], Any], consumes: bool = True
) -> Any:
    """The scenario's observations on one process, checked equal across workers
    (where, if it `consumes`, a consumer on worker 1 was registered on worker 0)."""
    one, workers = brokers
    expected = one.norm(scenario(one))
    workers.linked = []
    got = workers.norm(scenario(workers))
    assert got == expected
    if consumes:
        assert workers.linked and all(workers.linked), "the consumers did not cross"
    return expected


def wait_for(what: Callable[[], Any], poll: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        poll()
        value = what()
        if value or time.monotonic() > deadline:
            return value


class Client:
    """A pika connection with one channel that collects what its consumers get."""

    def __init__(self, broker: Broker, role: str, prefetch: int | None = None) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(broker.url(role)))
        self.ch = self.conn.channel()
        if prefetch is not None:
            self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[Any, Any, bytes]] = []

    def on_message(self, _ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.got.append((method, props, body))

    def consume(self, queue: str, **kw: Any) -> str:
        return self.ch.basic_consume(queue, self.on_message, **kw)

    def pump(self, seconds: float = 0.02) -> None:
        self.conn.process_data_events(seconds)

    def until(self, n: int, *others: Client) -> None:
        """Pump (this client and `others`) until this one has `n` deliveries."""
        assert wait_for(lambda: len(self.got) >= n, lambda: pump(self, *others)), (
            f"{len(self.got)} of {n} deliveries"
        )

    def settle_down(self, *others: Client) -> None:
        """Pump a while, so that a delivery that should not come would have come."""
        for _ in range(15):
            pump(self, *others)

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def pump(*clients: Client) -> None:
    for c in clients:
        c.pump(0.01)


def seen(got: list[tuple[Any, Any, bytes]]) -> list[tuple[bytes, bool, dict]]:
    """(body, redelivered, headers) of each delivery."""
    return [(body, method.redelivered, dict(props.headers or {})) for method, props, body in got]


def error_of(fn: Callable[[], Any]) -> tuple[str, int, str]:
    """What the broker answered to `fn()`: a channel or connection close, its code and text."""
    try:
        fn()
    except pika.exceptions.ChannelClosedByBroker as e:
        return ("channel", e.reply_code, e.reply_text)
    except pika.exceptions.ConnectionClosedByBroker as e:
        return ("connection", e.reply_code, e.reply_text)
    raise AssertionError("no error")


def publisher(broker: Broker) -> Client:
    pub = Client(broker, "third")
    pub.ch.confirm_delivery()
    return pub


# --- streams ------------------------------------------------------------------------


def stream_offsets(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "stream", durable=True, arguments=STREAM)
    pub = publisher(b)
    for i in range(10):
        pub.ch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(headers={"i": i}))
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    specs: list[Any] = [
        "first",
        "last",
        "next",
        4,
        0,
        now - datetime.timedelta(hours=1),
        now + datetime.timedelta(hours=1),
        "1h",
        b"first",
    ]
    out: dict[str, Any] = {}
    for n, spec in enumerate(specs):
        c = Client(b, "client", prefetch=100)
        c.consume(q, arguments={"x-stream-offset": spec})
        b.crossed(q)
        marker = f"mark{n}".encode()
        pub.ch.basic_publish("", q, marker)
        assert wait_for(lambda c=c, marker=marker: marker in [g[2] for g in c.got], c.pump)
        c.ch.basic_ack(c.got[-1][0].delivery_tag, multiple=True)
        out[repr(spec) if not isinstance(spec, datetime.datetime) else f"ts{n}"] = seen(c.got)
        c.close()
    pub.close()
    return out


def test_stream_offsets_and_headers(brokers) -> None:
    expected = same_on_both(brokers, stream_offsets)
    first = expected["'first'"]
    assert [h["x-stream-offset"] for _b, _r, h in first] == list(range(11))
    assert first[3] == (b"m3", False, {"i": 3, "x-stream-offset": 3})
    assert [h["x-stream-offset"] for _b, _r, h in expected["4"]][0] == 4
    assert [b for b, _r, _h in expected["'next'"]] == [b"mark2"]


def stream_credit(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "credit", durable=True, arguments=STREAM)
    pub = publisher(b)
    for i in range(10):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    c = Client(b, "client", prefetch=3)
    c.consume(q, arguments={"x-stream-offset": "first"})
    steps = []
    c.until(3)
    b.crossed(q)
    c.settle_down()
    steps.append(len(c.got))  # the prefetch is the credit
    c.ch.basic_ack(c.got[0][0].delivery_tag)  # one ack, one more message
    c.until(4)
    c.settle_down()
    steps.append(len(c.got))
    c.ch.basic_ack(c.got[-1][0].delivery_tag, multiple=True)  # three acks, three more
    c.until(7)
    c.settle_down()
    steps.append(len(c.got))
    c.ch.basic_ack(0, multiple=True)
    c.until(10)
    c.settle_down()
    steps.append(len(c.got))
    # A stream takes nothing back: nack closes the connection, as RabbitMQ 3.10 does.
    nack = error_of(lambda: (c.ch.basic_nack(c.got[-1][0].delivery_tag), c.pump()))
    offsets = [h["x-stream-offset"] for _b, _r, h in seen(c.got)]
    redelivered = [r for _b, r, _h in seen(c.got)]
    c.close()
    pub.close()
    return {"steps": steps, "offsets": offsets, "redelivered": redelivered, "nack": nack}


def test_stream_acks_are_credit(brokers) -> None:
    expected = same_on_both(brokers, stream_credit)
    assert expected["steps"] == [3, 4, 7, 10]
    assert expected["offsets"] == list(range(10))
    assert expected["nack"][:2] == ("connection", 540)


def stream_live(b: Broker) -> dict[str, Any]:
    """A consumer reading from an offset while a publisher on another worker appends."""
    q = b.declare("owner", "live", durable=True, arguments=STREAM)
    pub = publisher(b)
    for i in range(5):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    c = Client(b, "client", prefetch=7)

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        c.got.append((method, props, body))
        ch.basic_ack(method.delivery_tag)

    c.ch.basic_consume(q, on_message, arguments={"x-stream-offset": 2})
    for batch in range(10):
        for i in range(30):
            n = 5 + batch * 30 + i
            pub.ch.basic_publish("", q, f"m{n}".encode())
        c.pump()
    c.until(303)
    b.crossed(q)
    c.settle_down()
    got = seen(c.got)
    c.close()
    pub.close()
    return {
        "count": len(got),
        "bodies_in_order": [b for b, _r, _h in got] == [f"m{n}".encode() for n in range(2, 305)],
        "offsets": [h["x-stream-offset"] for _b, _r, h in got] == list(range(2, 305)),
    }


def test_stream_read_while_another_worker_appends(brokers) -> None:
    expected = same_on_both(brokers, stream_live)
    assert expected == {"count": 303, "bodies_in_order": True, "offsets": True}


def stream_refusals(b: Broker) -> list[Any]:
    q = b.declare("owner", "refusals", durable=True, arguments=STREAM)
    out = []
    attempts: list[Callable[[Client], Any]] = [
        lambda c: c.consume(q),  # no basic.qos
        lambda c: (c.ch.basic_qos(prefetch_count=10), c.consume(q, auto_ack=True)),
        lambda c: (c.ch.basic_qos(prefetch_count=10), c.consume(q, arguments={"x-priority": 3})),
        lambda c: (
            c.ch.basic_qos(prefetch_count=10),
            c.consume(q, arguments={"x-stream-offset": "bogus"}),
        ),
        lambda c: (
            c.ch.basic_qos(prefetch_count=10),
            c.consume(q, arguments={"x-stream-offset": True}),
        ),
        lambda c: (
            c.ch.basic_qos(prefetch_count=10),
            c.ch.basic_qos(prefetch_count=2, global_qos=True),
            c.consume(q),
        ),
        lambda c: c.ch.basic_get(q),
        lambda c: c.ch.basic_get(q, auto_ack=True),
        lambda c: c.ch.queue_purge(q),
    ]
    for attempt in attempts:
        c = Client(b, "client")
        out.append(error_of(lambda c=c, attempt=attempt: attempt(c)))
        c.close()
    return out


def test_stream_refusals(brokers) -> None:
    expected = same_on_both(brokers, stream_refusals, consumes=False)
    assert expected[0] == (
        "channel",
        406,
        "PRECONDITION_FAILED - consumer prefetch count is not set for "
        "'queue '<refusals>' in vhost '/''",
    )
    assert expected[5] == (
        "connection",
        540,
        "NOT_IMPLEMENTED - queue '<refusals>' in vhost '/' does not support global qos",
    )
    assert expected[6][1] == 540  # basic.get: NOT_IMPLEMENTED


def stream_cancel(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "cancel", durable=True, arguments=STREAM)
    pub = publisher(b)
    c = Client(b, "client", prefetch=10)
    tag = c.consume(q, arguments={"x-stream-offset": "first"})
    for i in range(3):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    c.until(3)
    b.crossed(q)
    c.ch.basic_cancel(tag)  # returns at cancel-ok
    for i in range(3, 6):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    c.settle_down()
    after_cancel = len(c.got)
    c.ch.basic_ack(c.got[-1][0].delivery_tag, multiple=True)  # still the channel's to ack
    again = Client(b, "client", prefetch=10)
    again.consume(q, arguments={"x-stream-offset": "first"})
    again.until(6)
    out = {
        "after_cancel": after_cancel,
        "again": [h["x-stream-offset"] for _b, _r, h in seen(again.got)],
        "open": c.ch.is_open,
    }
    for x in (c, again, pub):
        x.close()
    return out


def test_stream_cancel(brokers) -> None:
    expected = same_on_both(brokers, stream_cancel)
    assert expected == {"after_cancel": 3, "again": list(range(6)), "open": True}


def test_stream_filter_is_not_a_feature_of_the_broker(brokers) -> None:
    """x-stream-filter came with RabbitMQ 3.13; as 3.10 does, the broker ignores it as
    any other unknown consumer argument (on both placements: the same deliveries)."""

    def scenario(b: Broker) -> Any:
        q = b.declare("owner", "filter", durable=True, arguments=STREAM)
        pub = publisher(b)
        for i, f in enumerate(["a", "b", "a"]):
            props = pika.BasicProperties(headers={"x-stream-filter-value": f})
            pub.ch.basic_publish("", q, f"m{i}".encode(), props)
        c = Client(b, "client", prefetch=10)
        c.consume(q, arguments={"x-stream-offset": "first", "x-stream-filter": "a"})
        c.until(3)
        b.crossed(q)
        c.settle_down()
        out = [body for body, _r, _h in seen(c.got)]
        c.close()
        pub.close()
        return out

    assert same_on_both(brokers, scenario) == [b"m0", b"m1", b"m2"]


# --- quorum queues --------------------------------------------------------------------


def quorum_counts(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "quorum", durable=True, arguments=QUORUM)
    pub = publisher(b)
    for body in (b"a", b"b", b"c"):
        pub.ch.basic_publish("", q, body, pika.BasicProperties(headers={"k": body.decode()}))
    c = Client(b, "client", prefetch=10)
    c.consume(q)
    c.until(3)
    b.crossed(q)
    tags = {body: m.delivery_tag for m, _p, body in c.got}
    c.ch.basic_nack(tags[b"a"], requeue=True)
    c.ch.basic_reject(tags[b"b"], requeue=True)
    c.until(5)
    c.ch.basic_nack(c.got[3][0].delivery_tag, requeue=True)  # a second return of "a"
    c.until(6)
    c.ch.basic_ack(c.got[-1][0].delivery_tag)
    c.ch.basic_ack(c.got[4][0].delivery_tag)
    c.settle_down()
    consumed = seen(c.got)  # "c" is still unacked: the channel closes with it
    c.ch.close()
    ch2 = c.conn.channel()
    ch2.basic_qos(prefetch_count=10)
    after_close: list = []
    ch2.basic_consume(q, lambda _c, m, p, body: after_close.append((m, p, body)))
    assert wait_for(lambda: after_close, c.pump)
    ch2.basic_ack(after_close[0][0].delivery_tag)
    c.settle_down()
    ch2.close()
    # basic.get: x-delivery-count 0 the first time, counted returns after that
    pub.ch.basic_publish("", q, b"d")
    gets = []
    ch3 = c.conn.channel()
    for settle in ("nack", "reject", "ack"):
        method, props, body = None, None, None
        for _ in range(200):
            method, props, body = ch3.basic_get(q)
            if method is not None:
                break
            time.sleep(0.01)
        assert method is not None
        gets.append((body, method.redelivered, method.message_count, dict(props.headers or {})))
        if settle == "nack":
            ch3.basic_nack(method.delivery_tag, requeue=True)
        elif settle == "reject":
            ch3.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch3.basic_ack(method.delivery_tag)
    empty = ch3.basic_get(q)[0] is None
    c.close()
    pub.close()
    return {"consumed": consumed, "after_close": seen(after_close), "gets": gets, "empty": empty}


def test_quorum_delivery_counts(brokers) -> None:
    expected = same_on_both(brokers, quorum_counts)
    assert expected["consumed"][3] == (b"a", True, {"k": "a", "x-delivery-count": 1})
    assert expected["consumed"][5] == (b"a", True, {"k": "a", "x-delivery-count": 2})
    assert expected["after_close"] == [(b"c", True, {"k": "c", "x-delivery-count": 1})]
    assert [g[3] for g in expected["gets"]] == [{"x-delivery-count": n} for n in (0, 1, 2)]


def quorum_closed_channel(b: Broker, close: str) -> list[Any]:
    """What a closing channel held goes back to the front of a quorum queue, counted:
    a basic.get's delivery and a cancelled consumer's, as well as a consumer's."""
    q = b.declare("owner", "closing", durable=True, arguments=QUORUM)
    pub = publisher(b)
    for body in (b"a", b"b", b"c", b"d", b"e"):
        pub.ch.basic_publish("", q, body)
    c = Client(b, "client", prefetch=1)
    got = None
    for _ in range(200):
        got = c.ch.basic_get(q)
        if got[0] is not None:
            break
        time.sleep(0.01)
    tag = c.consume(q)
    c.until(1)
    b.crossed(q)
    c.ch.basic_cancel(tag)  # "b" stays the channel's
    c.consume(q)
    c.until(2)  # "c", a live consumer's
    if close == "channel":
        c.ch.close()
    else:
        c.conn.close()
    again = Client(b, "client", prefetch=10)
    again.consume(q, auto_ack=True)
    again.until(5)
    again.settle_down()
    out = [(got[2], got[1].headers), seen(c.got), seen(again.got)]
    for x in (c, again, pub):
        x.close()
    return out


@pytest.mark.parametrize("close", ["channel", "connection"])
def test_quorum_closed_channel_returns_to_the_front(brokers, close: str) -> None:
    expected = same_on_both(brokers, lambda b: quorum_closed_channel(b, close))
    assert [(body, r) for body, r, _h in expected[2]] == [
        (b"a", True),
        (b"b", True),
        (b"c", True),
        (b"d", False),
        (b"e", False),
    ]
    assert expected[2][0][2] == {"x-delivery-count": 1}


def quorum_limit(b: Broker) -> dict[str, Any]:
    dlq = b.declare("third", "dlq")
    q = b.declare(
        "owner",
        "limited",
        durable=True,
        arguments={
            **QUORUM,
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    pub = publisher(b)
    pub.ch.basic_publish("", q, b"x", pika.BasicProperties(headers={"k": "x"}))
    c = Client(b, "client", prefetch=10)
    c.consume(q)
    c.until(1)
    b.crossed(q)
    c.ch.basic_nack(c.got[0][0].delivery_tag, requeue=True)
    c.until(2)
    c.ch.basic_reject(c.got[1][0].delivery_tag, requeue=True)  # over the limit
    c.settle_down()
    dead = None
    for _ in range(500):
        method, props, body = c.ch.basic_get(dlq, auto_ack=True)
        if method is not None:
            dead = (body, method.redelivered, dict(props.headers or {}))
            break
        time.sleep(0.01)
    ok = c.ch.queue_declare(q, passive=True).method
    c.close()
    pub.close()
    return {"consumed": seen(c.got), "dead": dead, "left": (ok.message_count, ok.consumer_count)}


def test_quorum_delivery_limit_dead_letters_to_another_worker(brokers) -> None:
    expected = same_on_both(brokers, quorum_limit)
    assert len(expected["consumed"]) == 2
    body, _redelivered, headers = expected["dead"]
    assert body == b"x" and headers["k"] == "x"
    assert headers["x-death"][0]["reason"] == "delivery_limit"
    assert headers["x-death"][0]["queue"] == "<limited>"
    assert expected["left"] == (0, 1)


# --- consumer arguments and flags -------------------------------------------------------


def priorities(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "prio")
    low_owner = Client(b, "owner", prefetch=100)
    low_third = Client(b, "third", prefetch=100)
    high = Client(b, "client", prefetch=4)
    low_owner.consume(q)
    low_third.consume(q, arguments={"x-priority": 1})
    high.consume(q, arguments={"x-priority": 10})
    pub = publisher(b)
    for i in range(10):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    clients = (high, low_owner, low_third)

    def total() -> int:
        return sum(len(x.got) for x in clients)

    assert wait_for(lambda: total() >= 10, lambda: pump(*clients))
    b.crossed(q)
    # The highest priority consumer gets what its prefetch allows, then the next one.
    out = {"high": len(high.got), "low_third": len(low_third.got), "owner": len(low_owner.got)}
    for x in (*clients, pub):
        x.close()
    return out


def test_consumer_priorities(brokers) -> None:
    assert same_on_both(brokers, priorities) == {"high": 4, "low_third": 6, "owner": 0}


def exclusive(b: Broker) -> list[Any]:
    q = b.declare("owner", "excl")
    out: list[Any] = []
    a = Client(b, "client")
    tag = a.consume(q, exclusive=True)
    b.crossed(q)
    for role in ("third", "owner", "client"):
        other = Client(b, role)
        out.append(error_of(lambda other=other: other.consume(q)))
        other.close()
    a.ch.basic_cancel(tag)
    shared = Client(b, "owner")
    shared.consume(q)
    for role in ("client", "third"):
        other = Client(b, role)
        out.append(error_of(lambda other=other: other.consume(q, exclusive=True)))
        other.close()
    for x in (a, shared):
        x.close()
    return out


def test_exclusive_consume_on_any_worker(brokers) -> None:
    expected = same_on_both(brokers, exclusive)
    assert (
        expected
        == [("channel", 403, "ACCESS_REFUSED - queue '<excl>' in vhost '/' in exclusive use")] * 5
    )


def single_active(b: Broker, arguments: dict[str, Any], second_on: str) -> dict[str, Any]:
    q = b.declare("owner", "sac", durable=True, arguments=arguments)
    first = Client(b, "client", prefetch=10)
    second = Client(b, second_on, prefetch=10)
    tag = first.consume(q)
    second.consume(q)
    pub = publisher(b)
    for i in range(4):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    first.until(4, second)
    b.crossed(q)
    first.settle_down(second)
    first.ch.basic_ack(first.got[1][0].delivery_tag, multiple=True)
    before = (len(first.got), len(second.got))
    first.ch.basic_cancel(tag)  # the second consumer takes over
    for i in range(4, 6):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    second.until(2, first)
    first.ch.close()  # its two unacked go back, to the active consumer
    second.until(4, first)
    second.settle_down(first)
    out = {"before": before, "first": seen(first.got), "second": seen(second.got)}
    for x in (first, second, pub):
        x.close()
    return out


@pytest.mark.parametrize("second_on", ["third", "owner"])
@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_single_active_consumer_on_two_workers(brokers, kind: str, second_on: str) -> None:
    arguments = {"x-single-active-consumer": True, "x-queue-type": kind}
    expected = same_on_both(brokers, lambda b: single_active(b, arguments, second_on))
    assert expected["before"] == (4, 0)
    assert [body for body, _r, _h in expected["second"]][:2] == [b"m4", b"m5"]
    assert sorted(body for body, _r, _h in expected["second"][2:]) == [b"m2", b"m3"]


def no_ack(b: Broker) -> dict[str, Any]:
    q = b.declare("owner", "noack")
    pub = publisher(b)
    for i in range(5):
        pub.ch.basic_publish("", q, f"m{i}".encode())
    c = Client(b, "client", prefetch=2)  # no effect on a no-ack consumer
    c.consume(q, auto_ack=True)
    c.until(5)
    b.crossed(q)
    c.settle_down()
    ok = c.ch.queue_declare(q, passive=True).method
    c.ch.close()
    ch = c.conn.channel()
    ok2 = ch.queue_declare(q, passive=True).method  # nothing went back at close
    out = {
        "got": seen(c.got),
        "open": (ok.message_count, ok.consumer_count),
        "closed": (ok2.message_count, ok2.consumer_count),
    }
    c.close()
    pub.close()
    return out


def test_no_ack_consumer(brokers) -> None:
    expected = same_on_both(brokers, no_ack)
    assert [body for body, _r, _h in expected["got"]] == [f"m{i}".encode() for i in range(5)]
    assert expected["open"] == (0, 1) and expected["closed"] == (0, 0)


def tag_clash(b: Broker) -> list[Any]:
    q = b.declare("owner", "tags")
    c = Client(b, "client")
    c.consume(q, consumer_tag="wks-tag")
    b.crossed(q)
    other = c.conn.channel()  # the same tag on another channel is fine
    other.basic_consume(q, lambda *a: None, consumer_tag="wks-tag")

    def again() -> None:
        # pika refuses a tag it knows on the channel: the frame goes out directly
        c.ch._impl._send_method(pika.spec.Basic.Consume(queue=q, consumer_tag="wks-tag"))
        c.settle_down()

    out = [error_of(again)]
    c.close()
    return out


def test_consumer_tag_clash(brokers) -> None:
    expected = same_on_both(brokers, tag_clash)
    assert expected == [
        ("connection", 530, "NOT_ALLOWED - attempt to reuse consumer tag 'wks-tag'")
    ]


def consume_refusals(b: Broker) -> list[Any]:
    """What basic.consume and basic.get refuse, answered by the queue's owner."""
    classic = b.declare("owner", "plain")
    quorum = b.declare("owner", "qq", durable=True, arguments=QUORUM)
    sac = b.declare(
        "owner", "qq-sac", durable=True, arguments={**QUORUM, "x-single-active-consumer": True}
    )
    classic_sac = b.declare("owner", "sac", arguments={"x-single-active-consumer": True})
    attempts: list[Callable[[Client], Any]] = [
        lambda c: c.consume(classic, arguments={"x-priority": "high"}),
        lambda c: c.consume(classic, arguments={"x-priority": True}),
        lambda c: c.consume("wks-no-such-queue"),
        lambda c: (c.ch.basic_qos(prefetch_count=5, global_qos=True), c.consume(quorum)),
        lambda c: c.ch.basic_get(sac),
        lambda c: (c.consume(classic_sac), c.consume(classic_sac, exclusive=True)),
    ]
    out = []
    for n, attempt in enumerate(attempts):
        c = Client(b, "client")
        out.append((n, error_of(lambda c=c, attempt=attempt: attempt(c))))
        c.close()
    return out


def test_consume_refusals(brokers) -> None:
    expected = same_on_both(brokers, consume_refusals, consumes=False)
    assert expected[0][1] == (
        "channel",
        406,
        "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '<plain>' in vhost '/': "
        '"expected integer, got longstr"',
    )
    assert expected[2][1][:2] == ("channel", 404)
    assert expected[3][1][:2] == ("connection", 540)
    assert expected[4][1][:2] == ("channel", 405)
    assert expected[5][1][:2] == ("channel", 403)
