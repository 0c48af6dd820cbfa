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
