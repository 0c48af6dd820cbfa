"""Close orderings: nothing follows a close on its channel.

How many confirms a broker sends before a close depends on timing, so these record
what must hold on any run: the frame that ends the channel, that no frame follows
it on that channel, that confirms only go up and never past what was published, and
that the publishes themselves were all routed.
"""

from __future__ import annotations

from .runner import C, Conn, Event, P, Session, scenario

BURST = 300


def _burst(c: Conn, n: int, persistent: bool, exchange: str = "", key: str = "q") -> None:
    props = P(delivery_mode=2 if persistent else 1)
    for _ in range(n):
        c.publish(1, exchange, key, b"m" * 64, props)


def _summary(events: list[Event], ch: int, n: int, end: type) -> dict:
    on_ch = [ev for ev in events if ev.channel == ch]
    names = [ev.name for ev in on_ch]
    tags = [
        ev.method.delivery_tag for ev in on_ch if isinstance(ev.method, C.Basic.Ack | C.Basic.Nack)
    ]
    ends = [i for i, ev in enumerate(on_ch) if isinstance(ev.method, end)]
    return {
        "ends_with": names[ends[0]] if ends else None,
        "after_end": names[ends[0] + 1 :] if ends else None,
        "confirms_rise": tags == sorted(set(tags)),
        "confirms_within_burst": all(0 < t <= n for t in tags),
        "nacks": [ev.name for ev in on_ch if isinstance(ev.method, C.Basic.Nack)],
    }


def _count(s: Session, queue: str) -> None:
    check = s.connect(label="check")
    check.open(1)
    check.rpc(1, C.Queue.Declare(queue=queue, durable=True, passive=True))
    check.close()


def _client_channel_close(s: Session, persistent: bool) -> None:
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", durable=True))
    c.confirm_select(1)
    _burst(c, BURST, persistent)
    c.raw.send_method(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    events = c.frames(lambda ev: ev.channel == 1 and isinstance(ev.method, C.Channel.CloseOk))
    s.record("channel 1", _summary(events, 1, BURST, C.Channel.CloseOk))
    c.open(1)  # the number is free again
    c.confirm_select(1)
    c.publish(1, "", "q", b"after")
    c.confirms(1)
    _count(s, "q")


@scenario
def client_channel_close_with_confirms_transient(s: Session) -> None:
    """channel.close right after a burst of confirmed transient publishes."""
    _client_channel_close(s, persistent=False)


@scenario
def client_channel_close_with_confirms_persistent(s: Session) -> None:
    """channel.close right after a burst of persistent publishes to a durable queue."""
    _client_channel_close(s, persistent=True)


def _burst_then_close(s: Session, n: int) -> None:
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue=f"q{n}", durable=True))
    c.confirm_select(1)
    with c.one_write():
        _burst(c, n, persistent=False, key=f"q{n}")
        c.raw.send_method(
            1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
    events = c.frames(lambda ev: ev.channel == 1 and isinstance(ev.method, C.Channel.CloseOk))
    summary = _summary(events, 1, n, C.Channel.CloseOk)
    acks = [ev for ev in events if ev.channel == 1 and isinstance(ev.method, C.Basic.Ack)]
    summary["confirms_before_close_ok"] = bool(acks)
    s.record(f"{n} publishes, then channel.close", summary)
    _count(s, f"q{n}")


@scenario
def confirms_due_go_out_before_close_ok(s: Session) -> None:
    """Transient publishes with confirms and channel.close in one write (100, then
    1,000): the confirms the broker has by then come before close-ok (RabbitMQ's
    count depends on timing; some always come), nothing after it, all routed."""
    _burst_then_close(s, 100)
    _burst_then_close(s, 1000)


@scenario
def channel_error_with_confirms_pending(s: Session) -> None:
    """A burst, then a publish to a missing exchange: 404 channel.close comes last."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", durable=True))
    c.confirm_select(1)
    _burst(c, BURST, True)
    c.publish(1, "missing", "k", b"lost")
    events = c.frames(lambda ev: ev.channel == 1 and isinstance(ev.method, C.Channel.Close))
    close = next(ev for ev in events if isinstance(ev.method, C.Channel.Close))
    s.record("close", {k: v for k, v in close.method})
    s.record("channel 1", _summary(events, 1, BURST, C.Channel.Close))
    c.alive()
    _count(s, "q")


@scenario
def client_connection_close_with_confirms(s: Session) -> None:
    """connection.close right after a burst: close-ok is the last frame."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", durable=True))
    c.confirm_select(1)
    _burst(c, BURST, True)
    c.raw.send_method(
        0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    events = c.frames(lambda ev: ev.channel == 0 and isinstance(ev.method, C.Connection.CloseOk))
    c.closed = True
    s.record("channel 1", _summary(events, 1, BURST, C.Channel.CloseOk))
    s.record("last frame", events[-1].name if events else None)
    _count(s, "q")


@scenario
def server_connection_close_with_confirms(s: Session) -> None:
    """A connection error (channel.open on an open channel) after a burst."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q", durable=True))
    c.confirm_select(1)
    _burst(c, BURST, True)
    c.raw.send_method(1, C.Channel.Open())
    events = c.frames(lambda ev: isinstance(ev.method, C.Connection.Close))
    close = next(ev for ev in events if isinstance(ev.method, C.Connection.Close))
    s.record("close", {k: v for k, v in close.method})
    s.record("last frame", events[-1].name)
    s.record("channel 1", _summary(events, 1, BURST, C.Channel.CloseOk))
    _count(s, "q")


@scenario
def deliveries_stop_at_close_ok(s: Session) -> None:
    """A consumer closes its channel while messages keep coming from another connection."""
    p = s.connect()
    p.open(1)
    p.rpc(1, C.Queue.Declare(queue="q"))
    c = s.connect()
    c.open(1)
    c.consume(1, "q", "t", no_ack=True)
    for _ in range(BURST):
        p.publish(1, "", "q", b"m")
    c.raw.send_method(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    for _ in range(BURST):
        p.publish(1, "", "q", b"m")
    events = c.frames(lambda ev: ev.channel == 1 and isinstance(ev.method, C.Channel.CloseOk))
    summary = _summary(events, 1, BURST, C.Channel.CloseOk)
    s.record("ends_with", summary["ends_with"])
    s.record("after_end", summary["after_end"])


@scenario
def channel_close_handshake_both_ways(s: Session) -> None:
    """The server's channel.close, then the client's close crossing it."""
    c = s.connect()
    c.open(1)
    c.raw.send_method(1, C.Queue.Declare(queue="missing", passive=True))
    c.raw.send_method(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    events = c.frames(lambda ev: ev.channel == 1 and isinstance(ev.method, C.Channel.Close))
    s.record("frames", [ev.name for ev in events])
    c.open(1)
    c.rpc(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.alive()
