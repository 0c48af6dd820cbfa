"""Policies as AMQP clients see them: what a policy sets, and how it meets a queue's
own arguments (the lower limit wins; a queue's dead-letter exchange wins)."""

from __future__ import annotations

from .runner import C, Conn, Session, scenario

WAIT_TTL = 0.4


def _q(c: Conn, ch: int, name: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=name, arguments=args))


def _confirmed(c: Conn, ch: int, queue: str, bodies: list[str]) -> None:
    if ch not in c.confirm_seq:
        c.confirm_select(ch)
    for body in bodies:
        c.publish(ch, "", queue, body.encode())
    c.confirms(ch)


@scenario
def message_ttl(s: Session) -> None:
    """A message-ttl policy expires messages; with x-message-ttl too, the lower wins."""
    s.policy("ttl", "^ttl\\.", {"message-ttl": 100}, apply_to="queues")
    c = s.connect()
    c.open(1)
    _q(c, 1, "ttl.plain")
    _q(c, 1, "ttl.longer-arg", **{"x-message-ttl": 60000})
    _q(c, 1, "ttl.shorter-arg", **{"x-message-ttl": 10})
    _q(c, 1, "other")
    for q in ("ttl.plain", "ttl.longer-arg", "ttl.shorter-arg", "other"):
        _confirmed(c, 1, q, [q])
    s.sleep(WAIT_TTL)
    for q in ("ttl.plain", "ttl.longer-arg", "ttl.shorter-arg", "other"):
        c.get(1, q)
    # a policy does not make a redeclaration without the argument inequivalent
    _q(c, 1, "ttl.plain")


@scenario
def dead_letter_exchange(s: Session) -> None:
    """A dead-letter-exchange policy; a queue's own x-dead-letter-exchange wins."""
    s.policy("dlx", "^src\\.", {"dead-letter-exchange": "by-policy"}, apply_to="queues")
    c = s.connect()
    c.open(1)
    for x in ("by-policy", "by-arg"):
        c.rpc(1, C.Exchange.Declare(exchange=x, exchange_type="fanout"))
        _q(c, 1, f"dlq.{x}")
        c.rpc(1, C.Queue.Bind(queue=f"dlq.{x}", exchange=x))
    _q(c, 1, "src.policy")
    _q(c, 1, "src.arg", **{"x-dead-letter-exchange": "by-arg"})
    tag = 0
    for q in ("src.policy", "src.arg"):
        _confirmed(c, 1, q, [q])
        c.get(1, q, no_ack=False)
        tag += 1
        c.reject(1, tag, requeue=False)
    for x in ("by-policy", "by-arg"):
        c.get(1, f"dlq.{x}", wait=2)
        c.get(1, f"dlq.{x}")


@scenario
def max_length_and_overflow(s: Session) -> None:
    """max-length and overflow from a policy; with x-max-length too, the lower wins."""
    s.policy("len", "^len\\.", {"max-length": 1}, apply_to="queues")
    s.policy("rp", "^rp\\.", {"max-length": 1, "overflow": "reject-publish"}, apply_to="queues")
    c = s.connect()
    c.open(1)
    _q(c, 1, "len.plain")
    _q(c, 1, "len.arg-higher", **{"x-max-length": 5})
    _q(c, 1, "rp.q")
    for q in ("len.plain", "len.arg-higher", "rp.q"):
        _confirmed(c, 1, q, ["first", "second"])
        c.rpc(1, C.Queue.Declare(queue=q, passive=True))
        c.get(1, q)


@scenario
def priority_between_policies(s: Session) -> None:
    """Of two matching policies the higher priority applies (only one applies)."""
    s.policy("low", "^q$", {"max-length": 1}, priority=1, apply_to="queues")
    s.policy("high", "^q$", {"message-ttl": 100}, priority=5, apply_to="queues")
    c = s.connect()
    c.open(1)
    _q(c, 1, "q")
    _confirmed(c, 1, "q", ["a", "b"])
    c.rpc(1, C.Queue.Declare(queue="q", passive=True))
    s.sleep(WAIT_TTL)
    c.get(1, "q")


@scenario
def policy_on_exchanges(s: Session) -> None:
    """An alternate-exchange policy applies to exchanges only when apply-to allows."""
    s.policy("ae", "^main", {"alternate-exchange": "ae"}, apply_to="exchanges")
    s.policy("ae-queues", "^other", {"alternate-exchange": "ae"}, apply_to="queues")
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Exchange.Declare(exchange="ae", exchange_type="fanout"))
    _q(c, 1, "unrouted")
    c.rpc(1, C.Queue.Bind(queue="unrouted", exchange="ae"))
    c.rpc(1, C.Exchange.Declare(exchange="main", exchange_type="direct"))
    c.rpc(1, C.Exchange.Declare(exchange="other", exchange_type="direct"))
    c.confirm_select(1)
    c.publish(1, "main", "nowhere", b"to the AE", mandatory=True)
    c.publish(1, "other", "nowhere", b"returned", mandatory=True)
    c.confirms(1)
    c.events(1)
    c.get(1, "unrouted")
    c.get(1, "unrouted")
