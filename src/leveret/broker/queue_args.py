"""Validation of queue arguments (`x-…`), with RabbitMQ's reply texts.

Unknown `x-` arguments are accepted and ignored, as RabbitMQ does. Texts were
taken by experiment from RabbitMQ 3.10 and are pinned in tests/test_extensions_args.py.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any

from leveret.broker.errors import PreconditionFailed

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_TYPES = ("classic", "quorum", "stream")
QUEUE_MODES = ("default", "lazy")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")

# The arguments each queue type recognises: RabbitMQ 3.10's lists (the `queue_arguments`
# capability of rabbit_classic_queue, rabbit_quorum_queue and rabbit_stream_queue). An
# argument that some type recognises but the declared type does not is refused
# (`foreign_argument`); one that no type knows (x-foo, or a plugin's such as
# x-message-deduplication) is accepted and left to whoever reads it.
TYPE_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "classic": (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
    ),
    "quorum": (
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    ),
    "stream": (
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    ),
}
KNOWN_ARGUMENTS = frozenset(arg for args in TYPE_ARGUMENTS.values() for arg in args)
# RabbitMQ's module names, which its texts use for the types.
RABBIT_TYPE_NAMES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}


def declared_type(arguments: dict[str, Any]) -> str:
    """The queue type `arguments` ask for (classic when they name none)."""
    value = arguments.get("x-queue-type", "classic")
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def foreign_arguments(queue_type: str, arguments: dict[str, Any]) -> list[str]:
    """The arguments, in the client's order, that another queue type recognises and
    `queue_type` does not: RabbitMQ refuses them (see `foreign_argument`)."""
    own = TYPE_ARGUMENTS.get(queue_type)
    if own is None:
        return []
    return [key for key in arguments if key in KNOWN_ARGUMENTS and key not in own]


def foreign_argument(key: str, describe: str, queue_type: str) -> PreconditionFailed:
    """RabbitMQ's refusal of an argument that belongs to another queue type."""
    return PreconditionFailed(
        f"invalid arg '{key}' for {describe} of queue type {RABBIT_TYPE_NAMES[queue_type]}"
    )


def amqp_type_name(value: Any) -> str:
    """The field-table type name RabbitMQ uses in its error texts: the wire type the
    client sent when the value was decoded (protocol.fieldtable's typed numbers)."""
    wire_type = getattr(value, "amqp_type", None)
    if wire_type is not None:
        return wire_type
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bytearray):
        return "binary"
    return "void"


def type_class(value: Any) -> str:
    """RabbitMQ's `type_class` of a field value: every integer type (and decimal) is
    "int", float and double "float"; others are their own. Redeclarations and the
    headers exchange compare values of one class, so 5 sent as a byte equals 5 sent
    as a long, but not "5" or 5.0."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | decimal.Decimal):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str | bytes):
        return "longstr"
    return type(value).__name__


def same_value(a: Any, b: Any) -> bool:
    """Equal as RabbitMQ compares field values (same type class, same value)."""
    return type_class(a) == type_class(b) and a == b


@dataclass(frozen=True)
class QueueOptions:
    """The arguments that change how a queue behaves, parsed once at declare time."""

    message_ttl: int | None = None  # ms
    expires: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int = 0
    single_active_consumer: bool = False
    consumer_timeout: int | None = None  # ms
    deduplication: bool = False  # x-message-deduplication (the community plugin's)
    # Quorum queues: x-delivery-limit as declared (RabbitMQ checks no type: a non-number
    # never trips; see queues/quorum.py), and x-dead-letter-strategy.
    delivery_limit: Any = None
    dead_letter_strategy: str | None = None

    @property
    def pageable(self) -> bool:
        """True when the queue may keep messages as disk positions only. Message TTLs
        are fine (the deadline is kept with the position), so are length limits
        (x-max-length-bytes makes the tail count its bodies' bytes exactly) and
        priorities (each level pages on its own), and deduplication: the ids of the
        paged messages stay in RAM (a set of strings, not an entry each), and a paged
        message's id is forgotten when it is read back and leaves the queue. A
        restart still reads a deduplicating queue whole, to rebuild its ids
        (ClassicQueue.can_page)."""
        return True

    @property
    def plain(self) -> bool:
        """True when none of the extensions apply, so the hot path can skip them."""
        return (
            self.message_ttl is None
            and self.max_length is None
            and self.max_length_bytes is None
            and not self.max_priority
            and not self.deduplication
        )


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def parse_queue_arguments(arguments: dict[str, Any], describe: str) -> QueueOptions:
    """Check a queue.declare arguments table; raise 406 with RabbitMQ's text if invalid."""

    def fail(key: str, reason: str) -> PreconditionFailed:
        return PreconditionFailed(f"invalid arg '{key}' for {describe}: {reason}")

    def integer(key: str, *, positive: bool = False, maximum: int | None = None) -> int | None:
        if key not in arguments:
            return None
        value = arguments[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(key, f'"expected integer, got {amqp_type_name(value)}"')
        if value < 0:
            raise fail(key, f"{{value_negative,{value}}}")
        if positive and value == 0:
            raise fail(key, "{value_zero,0}")
        if maximum is not None and value > maximum:
            raise fail(key, f"{{max_value_exceeded,{value}}}")
        return value

    if "x-queue-type" in arguments:  # first, as RabbitMQ: the type decides what else is valid
        value = arguments["x-queue-type"]
        if not isinstance(value, str | bytes):
            raise fail("x-queue-type", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        value = _text(value)
        if value not in QUEUE_TYPES:
            raise fail("x-queue-type", f"\"unsupported queue type '{value}'\"")
    foreign = foreign_arguments(declared_type(arguments), arguments)
    if foreign:
        # Another type's arguments are refused at declaration (vhost.declare_queue);
        # here they are only left unread, as RabbitMQ leaves them unchecked.
        arguments = {k: v for k, v in arguments.items() if k not in foreign}
    options: dict[str, Any] = {
        "message_ttl": integer("x-message-ttl"),
        "expires": integer("x-expires", positive=True),
        "max_length": integer("x-max-length"),
        "max_length_bytes": integer("x-max-length-bytes"),
        "max_priority": integer("x-max-priority", maximum=255) or 0,
    }
    if "x-overflow" in arguments:
        value = arguments["x-overflow"]
        if not isinstance(value, str | bytes):
            raise fail("x-overflow", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        if _text(value) not in OVERFLOW_MODES:
            raise fail("x-overflow", "invalid_overflow")
        options["overflow"] = _text(value)
    if "x-dead-letter-exchange" in arguments:
        value = arguments["x-dead-letter-exchange"]
        if not isinstance(value, str | bytes):
            raise PreconditionFailed(
                f"invalid type '{amqp_type_name(value)}' for arg 'x-dead-letter-exchange' in "
                f"{describe}",
            )
        options["dead_letter_exchange"] = _text(value)
    if "x-dead-letter-routing-key" in arguments:
        value = arguments["x-dead-letter-routing-key"]
        if not isinstance(value, str | bytes):
            raise fail(
                "x-dead-letter-routing-key", f"{{unacceptable_type,{amqp_type_name(value)}}}"
            )
        if options.get("dead_letter_exchange") is None:
            raise fail("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
        options["dead_letter_routing_key"] = _text(value)
    if "x-dead-letter-strategy" in arguments:
        value = arguments["x-dead-letter-strategy"]
        if not isinstance(value, str | bytes):
            raise fail("x-dead-letter-strategy", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        if _text(value) not in DEAD_LETTER_STRATEGIES:
            raise fail("x-dead-letter-strategy", "invalid_dlx_strategy")
        options["dead_letter_strategy"] = _text(value)
    for key in ("x-max-in-memory-length", "x-max-in-memory-bytes"):
        integer(key)  # accepted and checked as RabbitMQ does; they change nothing there either
    integer("x-quorum-initial-group-size", positive=True)
    if "x-queue-leader-locator" in arguments:
        value = arguments["x-queue-leader-locator"]
        if not isinstance(value, str | bytes):
            raise fail("x-queue-leader-locator", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        if _text(value) not in LEADER_LOCATORS:
            raise fail("x-queue-leader-locator", "invalid_queue_locator_arg")
    if "x-delivery-limit" in arguments:
        options["delivery_limit"] = arguments["x-delivery-limit"]
    if "x-single-active-consumer" in arguments:
        value = arguments["x-single-active-consumer"]
        if not isinstance(value, bool):
            raise fail("x-single-active-consumer", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        options["single_active_consumer"] = value
    if "x-message-deduplication" in arguments:
        value = arguments["x-message-deduplication"]
        if not isinstance(value, bool):
            raise fail(
                "x-message-deduplication",
                f"expected true or false, got {amqp_type_name(value)} {describe_value(value)!r}",
            )
        options["deduplication"] = value
    if "x-queue-mode" in arguments:
        value = arguments["x-queue-mode"]
        if not isinstance(value, str | bytes):
            raise fail("x-queue-mode", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        value = _text(value)
        if value not in QUEUE_MODES:
            raise fail("x-queue-mode", f"\"unsupported queue mode '{value}'\"")
    timeout = arguments.get("x-consumer-timeout")
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0:
        options["consumer_timeout"] = timeout
    return QueueOptions(**options)


def describe_value(value: Any) -> str:
    """How RabbitMQ prints an argument value in its texts."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(_text(value))


def inequivalent_text(key: str, describe: str, received: Any, current: Any) -> str:
    """RabbitMQ's text for a redeclaration whose argument differs."""

    def side(value: Any) -> str:
        return (
            "none"
            if value is None
            else (f"the value '{describe_value(value)}' of type '{amqp_type_name(value)}'")
        )

    if received is not None and current is not None:
        got, cur = f"'{describe_value(received)}'", f"'{describe_value(current)}'"
    else:
        got, cur = side(received), side(current)
    return f"inequivalent arg '{key}' for {describe}: received {got} but current is {cur}"


def parse_expiration(value: Any) -> int:
    """The per-message `expiration` property in ms, or 406 as RabbitMQ words it."""
    text = _text(value) if value is not None else ""
    digits = len(text) - len(text.lstrip("-0123456789"))
    head, rest = text[:digits], text[digits:]
    try:
        number = int(head)
    except ValueError:
        raise PreconditionFailed(f"invalid expiration '{text}': no_integer") from None
    if rest:
        raise PreconditionFailed(f"invalid expiration '{text}': {{leftover_string,\"{rest}\"}}")
    if number < 0:
        raise PreconditionFailed(f"invalid expiration '{text}': {{value_negative,{number}}}")
    return number
