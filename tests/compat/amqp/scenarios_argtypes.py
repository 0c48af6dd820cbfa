"""The wire type of a declared object's integer arguments.

RabbitMQ compares a redeclaration's arguments by value within a type class (every
integer type is one class), so 10 sent as a long redeclares a queue declared with 10
as a signedint; but the text refusing a redeclaration that leaves the argument out
names the type it was first sent as ("current is the value '10' of type
'signedint'"), and a binding's arguments are its identity with their types (a
binding with `n` = 7 as a signedint and one with 7 as a long are two bindings).
pamqp, which the runner sends tables with, picks the smallest integer type, so these
send each value with exactly the type given (`typed`). tests/durability/
test_argument_types_restart.py checks that a restart of Leveret keeps these answers.
"""

from __future__ import annotations

from typing import Any

from leveret.protocol.fieldtable import (
    Byte,
    Long,
    Short,
    SignedInt,
    UnsignedByte,
    UnsignedInt,
    UnsignedShort,
    encode_decoded_table,
)
from leveret.protocol.methods import _marshal_fields

from .runner import C, P, Session, scenario

_TYPED: dict[type, type] = {}


def typed(cls: type, **fields: Any) -> Any:
    """`cls(**fields)` whose field tables go out with each value's own wire type and
    the keys in the order given (a plain int: a signedint)."""
    sub = _TYPED.get(cls)
    if sub is None:
        sub = _TYPED[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__qualname__": cls.__qualname__,
                "marshal": lambda self: _marshal_fields(self, encode_decoded_table),
            },
        )
    return sub(**fields)


#: (queue, argument, the type it is declared with, another integer type of the same
#: value, extra arguments): RabbitMQ's classic queue arguments that are compared on
#: redeclaration and take an integer, and a quorum queue's
QUEUE_CASES: list[tuple[str, str, Any, Any, dict[str, Any]]] = [
    ("len-signedint", "x-max-length", SignedInt(10), Long(10), {}),
    ("len-byte", "x-max-length", Byte(10), SignedInt(10), {}),
    ("len-long", "x-max-length", Long(10), Short(10), {}),
    ("ttl-signedint", "x-message-ttl", SignedInt(1000), Long(1000), {}),
    ("ttl-unsignedshort", "x-message-ttl", UnsignedShort(1000), Short(1000), {}),
    ("expires-unsignedint", "x-expires", UnsignedInt(100000), SignedInt(100000), {}),
    ("prio-unsignedbyte", "x-max-priority", UnsignedByte(5), Long(5), {}),
    ("bytes-short", "x-max-length-bytes", Short(1000), Long(1000), {}),
    ("quorum-len", "x-max-length", SignedInt(10), Long(10), {"x-queue-type": "quorum"}),
]


def declare_queues(c: Any, ch: int) -> None:
    """Each QUEUE_CASES queue, durable, with its argument in its first type."""
    for name, key, first, _other, extra in QUEUE_CASES:
        c.rpc(ch, typed(C.Queue.Declare, queue=name, durable=True, arguments={key: first, **extra}))


def redeclare_queues(c: Any, ch: int) -> int:
    """Each queue redeclared with the value in another type, without the argument (406:
    the text names the type), and with another value; returns the channel to go on on."""
    for name, key, first, other, extra in QUEUE_CASES:
        c.rpc(ch, typed(C.Queue.Declare, queue=name, durable=True, arguments={key: other, **extra}))
        c.rpc(ch, typed(C.Queue.Declare, queue=name, durable=True, arguments=dict(extra)))
        ch += 1
        c.open(ch)
        c.rpc(
            ch,
            typed(
                C.Queue.Declare,
                queue=name,
                durable=True,
                arguments={key: Long(int(first) + 1), **extra},
            ),
        )
        ch += 1
        c.open(ch)
    return ch


@scenario
def queue_redeclare_other_integer_type(s: Session) -> None:
    """An integer argument redeclared as another integer type is the same; left out,
    the 406 names the type it was declared with; another value, the values only."""
    c = s.connect()
    c.open(1)
    declare_queues(c, 1)
    ch = redeclare_queues(c, 1)
    c.rpc(ch, typed(C.Queue.Declare, queue="len-signedint", passive=True))


@scenario
def exchange_redeclare_other_integer_type(s: Session) -> None:
    """An exchange's arguments other than alternate-exchange are not compared: an
    integer one in another type, or left out, redeclares it."""
    c = s.connect()
    c.open(1)
    args = {"x-n": SignedInt(3), "alternate-exchange": "ae"}
    c.rpc(1, typed(C.Exchange.Declare, exchange="x", exchange_type="topic", durable=True,
                   arguments=args))  # fmt: skip
    c.rpc(1, typed(C.Exchange.Declare, exchange="x", exchange_type="topic", durable=True,
                   arguments={"x-n": Long(3), "alternate-exchange": "ae"}))  # fmt: skip
    c.rpc(1, typed(C.Exchange.Declare, exchange="x", exchange_type="topic", durable=True,
                   arguments={"alternate-exchange": "ae"}))  # fmt: skip
    c.rpc(1, typed(C.Exchange.Delete, exchange="x"))


@scenario
def binding_arguments_other_integer_type(s: Session) -> None:
    """Two bindings whose arguments differ only in an integer's wire type are two
    bindings (RabbitMQ keys a binding by its arguments with their types): unbinding
    with a third type removes neither, each unbind removes its own, and a message
    matching them is routed until both are gone."""
    c = s.connect()
    c.open(1)
    c.rpc(1, typed(C.Queue.Declare, queue="bq", durable=True))
    c.rpc(1, typed(C.Exchange.Declare, exchange="hx", exchange_type="headers", durable=True))
    for n in (SignedInt(7), Long(7)):
        c.rpc(
            1, typed(C.Queue.Bind, queue="bq", exchange="hx", arguments={"x-match": "any", "n": n})
        )
    c.confirm_select(1)
    for n in (Byte(7), Long(7), SignedInt(7)):
        c.rpc(
            1,
            typed(C.Queue.Unbind, queue="bq", exchange="hx", arguments={"x-match": "any", "n": n}),
        )
        c.publish(1, "hx", "", b"m", P(headers={"n": 7}), mandatory=True)
        c.confirms(1)
        c.get(1, "bq")
    c.rpc(1, typed(C.Exchange.Delete, exchange="hx", if_unused=True))


# --- arguments from JSON: the management API and definitions imports -------------------
#
# RabbitMQ makes every JSON integer a long. A client sees it where a type shows: the
# 406 refusing a redeclaration that leaves the argument out names it, a binding's
# identity includes it, and an argument refused for its type names it.

#: (queue, its arguments as JSON, the integer argument a redeclaration leaves out)
JSON_QUEUES: list[tuple[str, dict[str, Any], str]] = [
    ("len", {"x-max-length": 10}, "x-max-length"),
    ("ttl", {"x-message-ttl": 1000, "x-overflow": "reject-publish"}, "x-message-ttl"),
    ("big", {"x-max-length-bytes": 2**40}, "x-max-length-bytes"),
    ("quorum", {"x-queue-type": "quorum", "x-max-length": 10}, "x-max-length"),
]


def redeclare_json_queues(c: Any, prefix: str, ch: int) -> int:
    """Each JSON_QUEUES queue redeclared over AMQP without its integer argument (the
    406 names the type it has), then with the value as a signedint (the same: one
    integer class); returns the channel to go on on."""
    for name, arguments, key in JSON_QUEUES:
        rest = {k: v for k, v in arguments.items() if k != key}
        declare = typed(C.Queue.Declare, queue=prefix + name, durable=True, arguments=rest)
        c.rpc(ch, declare)
        ch += 1
        c.open(ch)
        same = {**rest, key: Long(arguments[key])}
        if arguments[key] < 2**31:
            same[key] = SignedInt(arguments[key])
        c.rpc(ch, typed(C.Queue.Declare, queue=prefix + name, durable=True, arguments=same))
    return ch


def unbind_json_binding(c: Any, ch: int, queue: str, exchange: str) -> None:
    """A binding made from JSON with `n` = 7: an unbind with 7 as a signedint leaves
    it (a message with n = 7 is still routed to `queue`), one with 7 as a long removes
    it (the next is returned unroutable)."""
    c.confirm_select(ch)
    for n in (SignedInt(7), Long(7)):
        args = {"x-match": "any", "n": n}
        c.rpc(ch, typed(C.Queue.Unbind, queue=queue, exchange=exchange, arguments=args))
        c.publish(ch, exchange, "", b"m", P(headers={"n": 7}), mandatory=True)
        c.confirms(ch)
        c.get(ch, queue)


@scenario
def http_declared_integer_arguments(s: Session) -> None:
    """Queues declared through the management API with integer arguments hold them as
    longs: a redeclaration without one is refused naming type 'long'; with the value
    as a signedint it is the same queue. An exchange's integer argument is not
    compared (redeclared without it: ok). A binding made through the API with `n` = 7
    is removed by an unbind with 7 as a long, not as a signedint."""
    c = s.connect()
    c.open(1)
    for name, arguments, _key in JSON_QUEUES:
        s.http("PUT", f"/api/queues/{{vhost}}/hq-{name}", {"durable": True, "arguments": arguments})
    ch = redeclare_json_queues(c, "hq-", 1)
    s.http("PUT", "/api/exchanges/{vhost}/hx", {"type": "headers", "arguments": {"x-n": 3}})
    c.rpc(ch, typed(C.Exchange.Declare, exchange="hx", exchange_type="headers"))
    s.http("PUT", "/api/queues/{vhost}/hb", {})
    binding = {"arguments": {"x-match": "any", "n": 7}}
    s.http("POST", "/api/bindings/{vhost}/e/hx/q/hb", binding)
    unbind_json_binding(c, ch, "hb", "hx")


@scenario
def definitions_import_integer_arguments(s: Session) -> None:
    """A definitions import gives integer arguments RabbitMQ's JSON type, long, as the
    management API does: queues, an exchange and a binding, as in
    http_declared_integer_arguments."""
    queues = [
        {"name": f"dq-{name}", "durable": True, "auto_delete": False, "arguments": arguments}
        for name, arguments, _key in JSON_QUEUES
    ]
    exchange = {
        "name": "dx",
        "type": "headers",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {"x-n": 3},
    }
    binding = {
        "source": "dx",
        "destination": "dq-len",
        "destination_type": "queue",
        "routing_key": "",
        "arguments": {"x-match": "any", "n": 7},
    }
    body = {"queues": queues, "exchanges": [exchange], "bindings": [binding]}
    s.http("POST", "/api/definitions/{vhost}", body)
    c = s.connect()
    c.open(1)
    ch = redeclare_json_queues(c, "dq-", 1)
    c.rpc(ch, typed(C.Exchange.Declare, exchange="dx", exchange_type="headers", durable=True))
    unbind_json_binding(c, ch, "dq-len", "dx")


@scenario
def http_declare_refused_for_argument_type(s: Session) -> None:
    """Queue arguments of the wrong type declared through the management API: the 400
    names the JSON integer's type as RabbitMQ holds it (long); x-queue-mode as an
    integer is refused for its type before its value."""
    for i, arguments in enumerate(
        [
            {"x-overflow": 5},
            {"x-dead-letter-exchange": 5},
            {"x-single-active-consumer": 1},
            {"x-queue-mode": 3},
            {"x-max-length": "ten"},
            {"x-max-length": -1},
        ]
    ):
        s.http("PUT", f"/api/queues/{{vhost}}/bad-{i}", {"arguments": arguments})
    c = s.connect()
    c.open(1)
    c.rpc(1, typed(C.Queue.Declare, queue="bad-q", arguments={"x-queue-mode": SignedInt(3)}))


@scenario
def alternate_exchange_of_another_type(s: Session) -> None:
    """alternate-exchange must be a longstr: a new exchange with it as an integer is
    refused naming the type (signedint over AMQP, long from the management API's
    JSON); a definitions import takes it as it is; an existing exchange redeclared
    with one it does not have is refused as inequivalent."""
    c = s.connect()
    c.open(1)
    c.rpc(1, typed(C.Exchange.Declare, exchange="ae-int", exchange_type="direct",
                   arguments={"alternate-exchange": SignedInt(5)}))  # fmt: skip
    c.open(2)
    c.rpc(2, typed(C.Exchange.Declare, exchange="ae-int", exchange_type="direct", passive=True))
    s.http("PUT", "/api/exchanges/{vhost}/ae-http", {"arguments": {"alternate-exchange": 5}})
    exchange = {
        "name": "ae-imported",
        "type": "direct",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {"alternate-exchange": 5},
    }
    s.http("POST", "/api/definitions/{vhost}", {"exchanges": [exchange]})
    c.open(3)
    c.rpc(3, typed(C.Exchange.Declare, exchange="ae-imported", exchange_type="direct",
                   passive=True))  # fmt: skip
    c.rpc(3, typed(C.Exchange.Declare, exchange="plain", exchange_type="direct"))
    c.rpc(3, typed(C.Exchange.Declare, exchange="plain", exchange_type="direct",
                   arguments={"alternate-exchange": SignedInt(5)}))  # fmt: skip
    c.open(4)
    c.rpc(4, typed(C.Exchange.Declare, exchange="plain", exchange_type="direct",
                   arguments={"alternate-exchange": "other"}))  # fmt: skip
