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
QUEUE_TYPES = ("classic", "stream")
QUEUE_MODES = ("default", "lazy")


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
    if "x-queue-type" in arguments:
        value = arguments["x-queue-type"]
        if not isinstance(value, str | bytes):
            raise fail("x-queue-type", f"{{unacceptable_type,{amqp_type_name(value)}}}")
        value = _text(value)
        if value not in QUEUE_TYPES:
            raise fail("x-queue-type", f"\"unsupported queue type '{value}'\"")
    if "x-queue-mode" in arguments:
        value = _text(arguments["x-queue-mode"])
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
