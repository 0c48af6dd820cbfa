"""x-delayed-message: hold a message back for its `x-delay`, then route it.

The interface is the community plugin rabbitmq-delayed-message-exchange's. The
exchange is declared with `x-delayed-type`, the type that routes for it (direct,
topic, fanout, headers or x-consistent-hash); its bindings are that type's. A
message with a positive `x-delay` header (milliseconds) is kept until then and
routed against the bindings as they are at that moment, with `x-delay` set to
minus the delay (so another delayed exchange on its way routes it at once, and
consumers can tell it was delayed). Without `x-delay`, or with 0 or less, it is
routed at once. `x-delay` is read as the plugin reads it: integers as they are,
floats and decimals truncated, strings of digits as their integer; other types
mean no delay. A string that is not an integer is refused with 406 on
basic.publish (the plugin's channel crashes).

Where the plugin falls short, this one does not (docs/differences.md):

- Pending messages are records in the message store, ordered by due time
  (store/delay_queue.py), 20 bytes of RAM each: millions can wait. Persistent
  messages on a durable exchange are fsynced before their publisher confirm and
  survive a restart or a crash; transient ones take no RAM either but are gone
  after a restart, as in a queue.
- No delay is too long: the plugin routes a message at once when its delay
  exceeds Erlang's timer limit (2^32 - 1 ms, about 49 days).
- The held message counts as routed: a mandatory publish is not returned, and
  the alternate exchange is not used at publish time, only at the due time if
  nothing is bound then (the plugin returns every delayed mandatory message,
  and sends every delayed message to the alternate exchange at once).
- Deleting the exchange drops its pending messages.

How it fits the model: for a delayed message `route` returns the exchange's
`DelayedMessages`, which the publish path treats as a queue; its `enqueue`
writes the message to the exchange's delay store (`DurabilityHooks.delay_store`:
the message store's delay queue, or RAM without persistence), with the
publisher's write barrier, so confirms, transactions and e2e bindings work
unchanged. A timer takes what is due, a batch per loop turn, and routes it as a
dead-lettered message is routed.

In a broker of workers (`vhost.crossing` is set) a due message may go to a queue
another worker owns. Its record is then kept until every owner confirmed it has
the message (a WriteBarrier on the remote queues' enqueue; the store `keep`s the
taken record meanwhile: not compacted away, and back among the pending ones after
a clean stop); a NACK or a lost worker puts it back to be routed again later (a
copy may then arrive twice: at least once, never lost). Until confirmed it counts
in `messages_delayed`. And nothing fires while the link to any other worker is
down (a restarted worker, before its links are up): such a publish would be
dropped as one to an unreachable queue.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import re
import struct
from contextlib import nullcontext
from decimal import Decimal
from typing import Any

from leveret import wallclock
from leveret.broker.errors import PreconditionFailed
from leveret.broker.exchanges.base import ExchangeType
from leveret.broker.exchanges.consistent_hash import ConsistentHashExchange
from leveret.broker.exchanges.direct import DirectExchange
from leveret.broker.exchanges.fanout import FanoutExchange
from leveret.broker.exchanges.headers import HeadersExchange
from leveret.broker.exchanges.topic import TopicExchange
from leveret.protocol.fieldtable import decode_value, encode_value, skip_value
from leveret.protocol.properties import FLAG_CONTENT_ENCODING, FLAG_CONTENT_TYPE, FLAG_HEADERS

log = logging.getLogger("leveret.delayed")

TYPE_NAME = "x-delayed-message"
# The types that may route for a delayed exchange (its `x-delayed-type`).
ROUTING_TYPES: dict[str, type[ExchangeType]] = {
    cls.name: cls
    for cls in (
        DirectExchange,
        TopicExchange,
        FanoutExchange,
        HeadersExchange,
        ConsistentHashExchange,
    )
}
MAX_DUE = 1 << 62  # ms since the epoch: a later due time waits "for ever"
BATCH = 1024  # due messages routed per loop turn
MAX_WAIT = 60.0  # s: the timer wakes at least this often (the wall clock may be set)
DISK_WAIT = 0.005  # s: a pause when the store's writer has a backlog
LINK_WAIT = 0.05  # s: a pause while the link to another worker is down
RETRY_WAIT = 0.5  # s: before routing again a message another worker did not confirm
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")  # what Erlang's binary_to_integer takes
_LONG = struct.Struct(">I")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class InvalidDelay(PreconditionFailed):
    """An x-delay header the exchange cannot read as a number of milliseconds."""


def delay_of(message: Any) -> int:
    """The message's `x-delay` in ms, read as the plugin reads it; 0 for none.

    Raises InvalidDelay for a string that is not an integer, or a float that is not
    finite (the plugin's channel crashes on the first; the wire cannot carry the
    second to it)."""
    if not message.flags & FLAG_HEADERS:
        return 0
    if _last[0] is message:  # a publish asks three times: check, route, enqueue
        return _last[1]
    value = _x_delay(message)
    delay = _read_delay(value)
    _last[0], _last[1] = message, delay
    return delay


_last: list[Any] = [None, 0]  # the message delay_of read last, and its delay


def _read_delay(value: Any) -> int:
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float | Decimal):
        finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
        if not finite:
            raise InvalidDelay(f"invalid x-delay header: {value} is not a number of milliseconds")
        return math.trunc(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if _INTEGER.match(value):
            return int(value)
        raise InvalidDelay(f"invalid x-delay header: '{value}' is not an integer")
    return 0  # tables, arrays, timestamps: no delay, as the plugin


def _lenient_delay(message: Any) -> int:
    """delay_of, where an error can only be logged (routing, firing): no delay."""
    try:
        return delay_of(message)
    except InvalidDelay as exc:
        log.warning("%s; routed without delay", exc)
        return 0


def now_ms() -> int:
    return wallclock.time_ns() // 1_000_000


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class MemoryDelays:
    """A delay store in RAM (the broker without persistence): a heap by due time."""

    closed = False

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Any]] = []
        self._count = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: int, delay: int, message: Any, barrier: Any, durable: bool) -> None:
        self._count += 1
        # A copy: its header is edited when it is routed, and queues may share the original.
        heapq.heappush(
            self._heap, (due, self._count, (message.copy_with_body(message.body), delay))
        )

    def first_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def take_due(self, now: int, limit: int) -> list[tuple[Any, int, Any]]:
        """(message, its delay, token for `done`) of up to `limit` messages due by `now`."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now and len(out) < limit:
            message, delay = heapq.heappop(heap)[2]
            out.append((message, delay, None))
        return out

    def done(self, token: Any) -> None:
        """The message taken with `token` was routed."""

    def keep(self, token: Any) -> None:
        """The message taken with `token` waits for its `done` beyond this loop turn
        (nothing to keep in RAM: a restart loses it anyway)."""

    def paused(self) -> Any:
        return nullcontext()

    def drop(self) -> None:
        self._heap.clear()

    def recovered(self) -> None:
        """Stored messages are back (nothing is stored in RAM across a restart)."""


class DelayedMessages:
    """Where a delayed exchange routes a message that must wait: its delay store.

    The publish path treats it as a queue (`enqueue`, `consumers`, `name`): a
    message held here counts as routed. It also owns the timer that routes the
    messages when they are due."""

    name = ""  # never a queue's name (dead-lettering's cycle check compares names)
    consumers = ()  # never throttles a publisher
    stores_messages = False  # not a taker of a shared fan-out record
    can_page = False
    remote = False

    def __init__(self, vhost: Any, exchange: Any, store: Any) -> None:
        self.vhost = vhost
        self.exchange = exchange
        self.store = store
        self.closed = False
        self.firing: Any = None  # the due message being routed (see `_route`)
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0  # ms since the epoch when the timer runs
        # Workers: (message, delay, token) another worker did not confirm, to route again.
        self._retry: list[tuple[Any, int, Any]] = []
        self._unconfirmed = 0  # workers: routed, waiting for other workers' confirms

    def __len__(self) -> int:
        return len(self.store) + len(self._retry) + self._unconfirmed

    def __repr__(self) -> str:
        return f"<DelayedMessages of {self.exchange.describe()}>"

    def enqueue(self, message: Any, barrier: Any = None) -> bool:
        """Keep a message with a positive x-delay until it is due."""
        delay = _lenient_delay(message)  # its headers were decoded by `route`: cached
        # Rounded up to the ms (and fired once the ms has passed): never early.
        due = min(-(-wallclock.time_ns() // 1_000_000) + delay, MAX_DUE)
        # Persistent on a durable exchange: fsynced before the confirm, and it
        # survives a restart. Anything else is kept out of RAM but not made durable.
        durable = message.persistent and self.exchange.durable
        self.store.add(due, delay, message, barrier, durable)
        self._arm(due)
        return True

    # ---- the timer -------------------------------------------------------------------

    def _arm(self, due: int) -> None:
        if self.closed or (self._timer is not None and self._timer_at <= due):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a tool): `fire` is called by hand
        if self._timer is not None:
            self._timer.cancel()
        now = now_ms()
        wait = min(max(0, due - now) / 1000.0, MAX_WAIT)
        self._timer_at = now + int(wait * 1000)
        self._timer = loop.call_later(wait, self.fire)

    def recovered(self) -> None:
        """The store has its messages back after a restart: wake for the first."""
        first = self.store.first_due()
        if first is not None:
            self._arm(first)

    def fire(self) -> int:
        """Route what is due (at most BATCH; the rest the next loop turn). Returns how
        many were routed.

        In a broker of workers (`vhost.crossing` is set) it first waits for every
        link, routes again what other workers did not confirm, and acks a message's
        record only once each worker it went to confirmed it (`_awaiting`)."""
        self._timer = None
        if self.closed or self.store.closed:
            return 0
        if self.vhost.hooks.disk_backlogged():
            self._again(DISK_WAIT)
            return 0
        crossing = getattr(self.vhost, "crossing", None)
        retry: list[tuple[Any, int, Any]] = []
        if crossing is not None:
            if not crossing.all_linked():
                self._again(LINK_WAIT)
                return 0
            retry, self._retry = self._retry, []
        store = self.store
        with store.paused():
            batch = store.take_due(now_ms(), BATCH)
            for message, delay, token in retry + batch if retry else batch:
                barrier = None if crossing is None else self._awaiting(message, delay, token)
                try:
                    self._route(message, delay, barrier)
                except Exception:
                    log.exception("a delayed message of %s could not be routed", self.exchange)
                if barrier is None:
                    store.done(token)
                else:
                    barrier.seal()
        if len(batch) == BATCH:
            self._again(0.0)
        else:
            first = store.first_due()
            if first is not None:
                self._arm(first)
        return len(retry) + len(batch)

    def _awaiting(self, message: Any, delay: int, token: Any) -> Any:
        """Workers: the barrier a taken message's routing adds other workers' confirms
        to; its record stays (maybe past this loop turn) until `_confirmed`."""
        # (Imported here: broker.durability imports the queue types, which import the
        # exchanges, so a module-level import would be circular.)
        from leveret.broker.durability import WriteBarrier

        self.store.keep(token)
        self._unconfirmed += 1
        # Not a publisher confirm's barrier: a queue that refuses the message
        # (x-overflow=reject-publish) drops it, as on one process.
        return WriteBarrier(self._on_confirmed(message, delay, token))

    def _on_confirmed(self, message: Any, delay: int, token: Any) -> Any:
        return lambda error: self._confirmed(message, delay, token, error)

    def _confirmed(self, message: Any, delay: int, token: Any, error: Any) -> None:
        """Every worker a fired message went to has it (`error` None): its record
        goes. Otherwise it is routed again after RETRY_WAIT."""
        self._unconfirmed -= 1
        if self.closed or self.store.closed:
            return  # the exchange is gone (its messages too), or the broker stops
        if error is None:
            self.store.done(token)
            return
        log.warning(
            "a delayed message of %s was not taken by another worker (%s); routing it again",
            self.exchange.describe(),
            error,
        )
        self._retry.append((message, delay, token))
        if self._timer is None or self._timer_at > now_ms() + int(RETRY_WAIT * 1000):
            if self._timer is not None:
                self._timer.cancel()
            self._again(RETRY_WAIT)

    def _again(self, wait: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer_at = now_ms()
        self._timer = loop.call_later(wait, self.fire)

    def _route(self, message: Any, delay: int, barrier: Any = None) -> None:
        """Route a due message as the exchange's bindings are now, its x-delay made
        -delay (so a delayed exchange on its way, this one too, routes it at once).
        `barrier` (workers): what the queues of other workers confirm to."""
        _set_delay(message, -delay)
        vhost = self.vhost
        self.firing = message  # this exchange need not read the x-delay it just wrote
        try:
            if message.routing_keys is None:
                queues = vhost.route(self.exchange, message)
            else:
                queues = vhost.route_keys(self.exchange, message, message.routing_keys)
        finally:
            self.firing = None
        # (The exchange's publish_out counted the message when it was held.)
        hooks = vhost.hooks
        shared = len(queues) > 1 and hooks.share_body(message, queues, None)
        try:
            for queue in queues:
                if barrier is not None and queue.remote:
                    queue.enqueue(message, barrier)
                else:
                    queue.enqueue(message)
        finally:
            if shared:
                hooks.share_done()

    def close(self, drop: bool) -> None:
        """Stop the timer; with `drop` (the exchange is deleted) forget every message."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if drop:
            self.store.drop()


def _x_delay_span(header: bytes, flags: int) -> tuple[int, int, int, int] | None:
    """Where the headers table's x-delay entry is in a content header: (table start,
    value start, value end, table end), or None. A scan of the raw table: decoding
    the whole table for one value cost more than the rest of a delayed publish."""
    pos = 14  # after class, weight, body size, flags; then the properties in order
    if flags & FLAG_CONTENT_TYPE:
        pos += 1 + header[pos]
    if flags & FLAG_CONTENT_ENCODING:
        pos += 1 + header[pos]
    (size,) = _LONG.unpack_from(header, pos)
    at, end = pos + 4, pos + 4 + size
    while at < end:
        key_end = at + 1 + header[at]
        value_end = skip_value(header, key_end)
        if header[at + 1 : key_end] == b"x-delay":
            return pos, key_end, value_end, end
        at = value_end
    return None


def _x_delay(message: Any) -> Any:
    """The x-delay header's value (a message with headers), or None."""
    if message._headers is not False:  # already decoded (routing by headers, CC)
        headers = message._headers
        return headers.get("x-delay") if headers else None
    header = message.header
    try:
        span = _x_delay_span(header, message.flags)
    except (ValueError, struct.error, IndexError):
        headers = message.headers  # malformed: as the rest of the broker reads it
        return headers.get("x-delay") if headers else None
    if span is None:
        return None
    _pos, start, end, _table_end = span
    kind = header[start]
    if kind == 73:  # 'I', signed 32-bit: what most clients send
        return _INT32.unpack_from(header, start + 1)[0]
    if kind == 108:  # 'l', signed 64-bit
        return _INT64.unpack_from(header, start + 1)[0]
    return decode_value(header[start:end])


def _set_delay(message: Any, value: int) -> None:
    """Make the x-delay header of `message` (a private copy) `value`, every other byte
    of the header as it was: the fire path's one header edit, done in place."""
    header = message.header
    span = _x_delay_span(header, message.flags)
    if span is None:
        return
    pos, start, value_end, end = span
    table = header[pos + 4 : start] + encode_value(value) + header[value_end:end]
    message.set_header(header[:pos] + _LONG.pack(len(table)) + table + header[end:])


class DelayedMessageExchange(ExchangeType):
    """The x-delayed-message type: another type's routing, behind a delay."""

    name = TYPE_NAME

    def __init__(self, inner: ExchangeType) -> None:
        self.inner = inner
        self.pending: DelayedMessages | None = None
        self._held: tuple[DelayedMessages, ...] = ()

    @staticmethod
    def _routing_type(arguments: dict[str, Any]) -> type[ExchangeType]:
        kind = _text(arguments.get("x-delayed-type"))
        if kind == TYPE_NAME:
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
            )
        if not isinstance(kind, str):
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type"
            )
        routing = ROUTING_TYPES.get(kind)
        if routing is None:
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type: "
                f"'{kind}' is not one of {', '.join(ROUTING_TYPES)}"
            )
        return routing

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        cls._routing_type(arguments).validate_arguments(arguments)

    @classmethod
    def for_exchange(cls, arguments: dict[str, Any]) -> DelayedMessageExchange:
        return cls(cls._routing_type(arguments).for_exchange(arguments))

    def placed(self, vhost: Any, exchange: Any) -> None:
        self.pending = DelayedMessages(vhost, exchange, vhost.hooks.delay_store(exchange))
        self._held = (self.pending,)
        if len(self.pending):
            self.pending.recovered()  # declared again over messages the store kept

    def detach(self) -> None:
        if self.pending is not None:
            self.pending.close(drop=True)
            self._held = ()

    def recovered(self) -> None:
        if self.pending is not None:
            self.pending.store.recovered()
            self.pending.recovered()

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:  # type: ignore[override]
        self.inner.validate_binding(routing_key, arguments)

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self.inner.bind(destination, routing_key, arguments)

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self.inner.unbind(destination, routing_key, arguments)

    def route(self, routing_key: str, message: Any):
        held = self._held
        if held and message.flags & FLAG_HEADERS and held[0].firing is not message:
            if _lenient_delay(message) > 0:
                return held
        return self.inner.route(routing_key, message)

    def check_publish(self, message: Any) -> None:
        """basic.publish into this exchange: an x-delay it cannot read is an error."""
        delay_of(message)

    def info(self) -> dict[str, Any]:
        return {"messages_delayed": len(self.pending) if self.pending is not None else 0}
