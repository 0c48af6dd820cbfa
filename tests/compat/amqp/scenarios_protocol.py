"""Protocol-level behaviour: the handshake's offers, flags RabbitMQ refuses, frame order
of returns and confirms, QoS semantics, routing patterns, nowait errors, big bodies."""

from __future__ import annotations

from .runner import C, Conn, P, Session, scenario


def _q(c: Conn, ch: int, name: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, arguments=args))


@scenario
def handshake_offers(s: Session) -> None:
    """connection.start and connection.tune: versions, mechanisms, capabilities, limits."""
    c = s.connect()
    start, tune = c.raw.start, c.raw.tune
    props = dict(start.server_properties)
    s.record(
        "start",
        {
            "version": [start.version_major, start.version_minor],
            "mechanisms": sorted(str(start.mechanisms).split()),
            "locales": str(start.locales),
            "capabilities": dict(props.get("capabilities", {})),
            "server_properties keys": sorted(props),
        },
    )
    s.record(
        "tune",
        {"channel_max": tune.channel_max, "frame_max": tune.frame_max, "heartbeat": tune.heartbeat},
    )


@scenario
def refused_flags(s: Session) -> None:
    """immediate=true, channel.flow active=false, basic.qos with a prefetch size."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    c.publish(1, "", "q", b"m", immediate=True)
    c.events(1)
    c.alive()
    d = s.connect()
    d.open(1)
    d.rpc(1, C.Channel.Flow(active=False))
    d.rpc(1, C.Channel.Flow(active=True))
    d.alive()


@scenario
def return_comes_before_ack(s: Session) -> None:
    """A mandatory unroutable publish on a confirm channel: basic.return, then basic.ack."""
    c = s.connect()
    c.open(1)
    c.confirm_select(1)
    c.publish(1, "amq.direct", "nowhere", b"m", mandatory=True)
    events = c.frames(lambda ev: isinstance(ev.method, C.Basic.Ack))
    s.record("order", [ev.name for ev in events if ev.channel == 1])
    s.record("return", {k: v for k, v in events[0].method} if events else None)


@scenario
def qos_per_consumer_and_global(s: Session) -> None:
    """basic.qos global=false limits each new consumer; global=true the whole channel."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    c.confirm_select(1)
    for i in range(6):
        c.publish(1, "", "q", f"m{i}".encode())
    c.confirms(1)
    c.open(2)
    c.rpc(2, C.Basic.Qos(prefetch_count=1))
    c.consume(2, "q", "a")
    c.consume(2, "q", "b")
    c.deliveries(2, 2)
    c.events(2)
    c.close_channel(2)
    c.open(3)
    c.rpc(3, C.Basic.Qos(prefetch_count=3, global_=True))
    c.rpc(3, C.Basic.Qos(prefetch_count=1))
    c.consume(3, "q", "c")
    c.consume(3, "q", "d")
    c.deliveries(3, 2)
    c.events(3)


@scenario
def topic_patterns(s: Session) -> None:
    """Topic bindings with *, # and empty words."""
    c = s.connect()
    c.open(1)
    patterns = ["#", "*", "a.*", "a.#", "#.b", "a.*.c", "*.*", "a..c", ""]
    for n, pattern in enumerate(patterns):
        _q(c, 1, f"t{n}")
        c.rpc(1, C.Queue.Bind(queue=f"t{n}", exchange="amq.topic", routing_key=pattern))
    c.confirm_select(1)
    keys = ["a", "a.b", "a.b.c", "a..c", "", "b", "x.y.b", "a.c"]
    for key in keys:
        c.publish(1, "amq.topic", key, key.encode() or b"(empty)")
    c.confirms(1)
    got = {}
    for n, pattern in enumerate(patterns):
        bodies = []
        while True:
            c.raw.send_method(1, C.Basic.Get(queue=f"t{n}", no_ack=True))
            ev = c.wait(1, C.Basic.GetOk, C.Basic.GetEmpty)
            if ev is None or not isinstance(ev.method, C.Basic.GetOk):
                break
            bodies.append(ev.body.decode())
        got[pattern] = bodies
    s.record("routed", got)


@scenario
def headers_exchange_modes(s: Session) -> None:
    """x-match all / any (and -with-x), value types, bad x-match."""
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="hx", exchange_type="headers"))
    binds = {
        "all": {"x-match": "all", "a": 1, "b": "two"},
        "any": {"x-match": "any", "a": 1, "b": "two"},
        "default": {"a": 1},
        "void": {"x-match": "all", "v": None},
        "allx": {"x-match": "all-with-x", "x-k": "v"},
        "anyx": {"x-match": "any-with-x", "x-k": "v", "z": 9},
    }
    for name, args in binds.items():
        _q(c, 1, name)
        c.rpc(1, C.Queue.Bind(queue=name, exchange="hx", arguments=args))
    c.confirm_select(1)
    messages = [
        {"a": 1, "b": "two"},
        {"a": 1},
        {"a": "1"},
        {"a": 1.0},
        {"v": "anything"},
        {"x-k": "v"},
        {},
    ]
    for n, headers in enumerate(messages):
        c.publish(1, "hx", "", f"h{n}".encode(), headers=headers)
    c.confirms(1)
    got = {}
    for name in binds:
        bodies = []
        while True:
            c.raw.send_method(1, C.Basic.Get(queue=name, no_ack=True))
            ev = c.wait(1, C.Basic.GetOk, C.Basic.GetEmpty)
            if ev is None or not isinstance(ev.method, C.Basic.GetOk):
                break
            bodies.append(ev.body.decode())
        got[name] = bodies
    s.record("routed", got)
    c.rpc(1, C.Queue.Bind(queue="all", exchange="hx", arguments={"x-match": "some"}))


@scenario
def nowait_errors(s: Session) -> None:
    """An error on a nowait method arrives as channel.close afterwards."""
    c = s.connect()
    c.open(1)
    c.send(1, C.Queue.Declare(queue="missing", passive=True, nowait=True))
    c.events(1)
    c.open(2)
    c.send(2, C.Exchange.Declare(exchange="x", exchange_type="bogus", nowait=True))
    c.events(2)
    c.alive()


@scenario
def bodies_across_frames(s: Session) -> None:
    """A body larger than frame_max arrives whole; an empty body; a 1 MB body."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    big = bytes(range(256)) * 1024  # 256 KB, several frames
    c.publish(1, "", "q", big)
    c.publish(1, "", "q", b"")
    c.publish(1, "", "q", b"z" * 1_048_576)
    for _ in range(3):
        c.raw.send_method(1, C.Basic.Get(queue="q", no_ack=True))
        ev = c.wait(1, C.Basic.GetOk, C.Basic.GetEmpty)
        s.record("body", None if ev is None else [len(ev.body), ev.body[:16].hex()])
    s.record("big intact", True)


@scenario
def redelivered_flag(s: Session) -> None:
    """A message requeued by a closed channel, a nack and basic.recover comes back
    redelivered; basic.get reports message_count."""
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    c.publish(1, "", "q", b"m", P(delivery_mode=2))
    c.get(1, "q", no_ack=False)
    c.close_channel(1)
    c.open(2)
    c.get(2, "q", no_ack=False)
    c.nack(2, 1, requeue=True)
    c.get(2, "q", no_ack=False)
    c.rpc(2, C.Basic.Recover(requeue=True))
    c.get(2, "q", no_ack=False)
    c.ack(2, 4)
    c.get(2, "q")
