"""The stream queue (`x-queue-type: stream`), as RabbitMQ's streams over AMQP 0-9-1.

An append-only log (store.stream_log) that many consumers read at their own
offsets.  Nothing is removed by an ack: an ack only gives the consumer its
credit back.  Every delivery carries its offset in the `x-stream-offset` header.
Reply codes and texts are RabbitMQ 3.10.8's, pinned by running the same pika
calls against it (tests/test_streams.py).
"""

from __future__ import annotations

import asyncio
import datetime
import re
import struct
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from leveret import wallclock
from leveret.broker.errors import NotSupported, PreconditionFailed
from leveret.broker.message import Message
from leveret.broker.queue_args import amqp_type_name
from leveret.broker.queues.base import Queue
from leveret.broker.queues.classic import QueueEntry
from leveret.broker.stats import MessageStats
from leveret.protocol.properties import (
    FLAG_CONTENT_ENCODING,
    FLAG_CONTENT_TYPE,
    FLAG_HEADERS,
    rewrite_header,
    split_properties,
)
from leveret.store.stream_log import StreamLog

if TYPE_CHECKING:
    from leveret.broker.consumer import Consumer
    from leveret.broker.queue_args import QueueOptions
    from leveret.broker.vhost import VirtualHost

DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's default x-stream-max-segment-size-bytes
MAX_SEGMENT_BYTES = 3_000_000_000  # the largest RabbitMQ 3.10 accepts in a declaration
_OFFSET_ENTRY = b"\x0fx-stream-offset" + b"l"
_Q = struct.Struct(">q")
_I = struct.Struct(">I")
# Arguments a stream accepts besides RabbitMQ's common ones.
_NOT_FOR_STREAMS = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-overflow",
    "x-max-priority",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-single-active-consumer",
    "x-queue-mode",
    "x-message-deduplication",  # the plugin's queue-level cache is for classic queues
)
_AGE = re.compile(r"^(\d+)(Y|M|D|h|m|s)$")
_AGE_MS = {
    "Y": 365 * 86400_000,
    "M": 30 * 86400_000,
    "D": 86400_000,
    "h": 3600_000,
    "m": 60_000,
    "s": 1000,
}


def parse_age(value: Any) -> int | None:
    """`7D`, `12h`, ... in ms; None if malformed."""
    if not isinstance(value, str):
        return None
    match = _AGE.match(value)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * _AGE_MS[match.group(2)]


def with_offset_header(header: bytes, offset: int) -> bytes:
    """The content header with `x-stream-offset` (a long) added to its headers.

    Appends one raw table entry instead of decoding the table; a table that
    already had the key decodes with the last value winning, as the offset must.
    """
    entry = _OFFSET_ENTRY + _Q.pack(offset)
    table = split_properties(header).get(FLAG_HEADERS)
    if table is None:
        new = _I.pack(len(entry)) + entry
    else:
        new = _I.pack(len(table) - 4 + len(entry)) + table[4:] + entry
    return rewrite_header(header, {FLAG_HEADERS: new})


def _offset_header_parts(header: bytes) -> tuple[bytes, bytes]:
    """`with_offset_header(header, n)` as prefix + 8-byte n + suffix, for any n.

    The offset is the last entry of the headers table, so only those 8 bytes
    change from message to message; a publisher that sends the same
    properties every time pays for the property split once.
    """
    out = with_offset_header(header, 0)
    flags = int.from_bytes(out[12:14], "big")
    pos = 14
    for flag in (FLAG_CONTENT_TYPE, FLAG_CONTENT_ENCODING):
        if flags & flag:
            pos += 1 + out[pos]
    end = pos + 4 + _I.unpack_from(out, pos)[0]
    return out[: end - 8], out[end:]


def _unpack_exchange_and_key(ek: bytes) -> tuple[str, str]:
    n = ek[0]
    exchange = ek[1 : 1 + n].decode()
    routing_key = ek[2 + n :].decode()
    return exchange, routing_key


class _Backlog:
    """Stands in for a classic queue's ready list.

    Truthy so that the channel redispatches after acks; `n` is 0 so that a
    stream never throttles its publishers (a slow consumer must not slow them).
    """

    __slots__ = ()
    n = 0

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return 0

    def clear(self) -> list:
        return []


class StreamQueue(Queue):
    queue_type = "stream"
    # RabbitMQ's module name, in its texts ("... for type rabbit_stream_queue")
    type_module = "rabbit_stream_queue"
    server_named_ok = False  # "Cannot declare a server-named queue for type ..."
    # Redeclaration compares these, in this order (RabbitMQ's for streams).
    equivalence_args = (
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    )

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        durable: bool,
        exclusive_owner: Any,
        auto_delete: bool,
        arguments: dict[str, Any],
        options: QueueOptions,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.options = options
        self.consumers: list[Consumer] = []
        self.bindings: set[Any] = set()
        self.deleted = False
        self.had_consumer = False
        self.unacked = 0
        self.stats = MessageStats()
        self.throttled: set[Any] = set()
        self.ready = _Backlog()
        self.tracked = vhost.hooks.active  # the definition is stored and deleted
        self.stores_messages = True
        self.plain = True
        directory = vhost.hooks.stream_directory(vhost.name, name)
        self._scratch = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="leveret-stream-")
        self.log = StreamLog(
            directory,
            fsync=not self._scratch,
            max_segment_bytes=arguments.get(
                "x-stream-max-segment-size-bytes", DEFAULT_SEGMENT_BYTES
            ),
            max_bytes=arguments.get("x-max-length-bytes"),
            max_age_ms=parse_age(arguments["x-max-age"]) if "x-max-age" in arguments else None,
            sync=None if self._scratch else vhost.hooks.stream_sync(),
        )
        self.log.on_readable = self._on_readable
        self._readers: dict[Consumer, Any] = {}
        self._last_header = b""  # one-entry cache for _offset_header_parts
        self._header_parts = (b"", b"")
        self._refill_handle: asyncio.Handle | None = None  # a small refill, due this turn
        self._refilling = False

    # --- declaration ------------------------------------------------------------

    @staticmethod
    def check_declare(
        describe: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict
    ) -> None:
        """RabbitMQ's refusals for stream declarations."""
        for bad, name in ((not durable, "non-durable"), (exclusive, "exclusive-owner"),
                          (auto_delete, "auto-delete")):  # fmt: skip
            if bad:
                raise PreconditionFailed(f"invalid property '{name}' for {describe}")
        for key in _NOT_FOR_STREAMS:
            if key in arguments:
                raise PreconditionFailed(
                    f"invalid arg '{key}' for {describe} of queue type rabbit_stream_queue",
                )
        if "x-max-age" in arguments:
            age = arguments["x-max-age"]
            if not isinstance(age, str | bytes):
                raise PreconditionFailed(
                    f"invalid arg 'x-max-age' for {describe}: "
                    f"{{unacceptable_type,{amqp_type_name(age)}}}"
                )
            if parse_age(age) is None:
                raise PreconditionFailed(f"invalid arg 'x-max-age' for {describe}: invalid_max_age")
        # (x-max-length-bytes is checked for every queue type by parse_queue_arguments.)
        # RabbitMQ 3.10 takes any size that is not negative, 0 included: the log then
        # starts a segment for every message.
        size = arguments.get("x-stream-max-segment-size-bytes")
        if size is not None:
            key = "x-stream-max-segment-size-bytes"
            if isinstance(size, bool) or not isinstance(size, int):
                raise PreconditionFailed(
                    f"invalid arg '{key}' for {describe}: "
                    f'"expected integer, got {amqp_type_name(size)}"'
                )
            if size < 0:
                raise PreconditionFailed(
                    f"invalid arg '{key}' for {describe}: {{value_negative,{size}}}"
                )
            if size > MAX_SEGMENT_BYTES:  # RabbitMQ checks this last, with no name
                raise PreconditionFailed(f"Exceeded max value for {key}")

    def apply_policy(self, arguments: dict[str, Any], options: QueueOptions) -> None:
        """Retention and segment size from the effective arguments; old segments go at once."""
        log = self.log
        log.max_segment_bytes = arguments.get(
            "x-stream-max-segment-size-bytes", DEFAULT_SEGMENT_BYTES
        )
        log.max_bytes = arguments.get("x-max-length-bytes")
        age = arguments.get("x-max-age")
        log.max_age_ms = parse_age(age) if age is not None else None
        log.apply_retention(int(wallclock.time() * 1000))

    # --- publishing (hot path for streams) ----------------------------------------

    def enqueue(self, message: Message, barrier: Any = None) -> bool:
        self.stats.publish += 1
        log = self.log
        body = message.body
        if body is None:  # pragma: no cover - a fresh publish always has its body
            body = b""
        header = message.header
        if header != self._last_header:
            self._last_header = header
            self._header_parts = _offset_header_parts(header)
        prefix, suffix = self._header_parts
        log.append(
            int(wallclock.time() * 1000),
            message.exchange_and_key,
            prefix + _Q.pack(log.next) + suffix,
            body,
        )
        if barrier is not None:
            log.when_durable(barrier.add())
        if self.consumers:
            self.dispatch()
        return True

    def dispatch(self, check_expiry: bool = True) -> None:
        for consumer in list(self.consumers):
            reader = self._readers.get(consumer)
            if reader is None or not consumer.channel.deliverable:
                continue
            credit = consumer.prefetch - consumer.unacked
            if credit <= 0:
                continue
            if consumer.unacked and credit < consumer.prefetch // 4 and not self._refilling:
                # Every acked message is one more credit at once, as with RabbitMQ,
                # but a small refill waits for the end of the loop turn: the acks
                # of one read then cost one read of the log, not one each.
                self._refill_soon()
                continue
            channel = consumer.channel
            for rec in reader.read(credit):
                header = rec.header
                message = Message(
                    *_unpack_exchange_and_key(rec.exchange_and_key),
                    header,
                    rec.body,
                    int.from_bytes(header[12:14], "big"),
                    True,
                    rec.exchange_and_key,
                )
                self.unacked += 1
                channel.deliver(consumer, self, QueueEntry(rec.offset, message))

    def _refill_soon(self) -> None:
        if self._refill_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (no event loop: a test driving the queue directly)
                self._refill()
                return
            self._refill_handle = loop.call_soon(self._refill)

    def _refill(self) -> None:
        self._refill_handle = None
        if self.deleted or not self.consumers:
            return
        self._refilling = True
        try:
            self.dispatch()
        finally:
            self._refilling = False

    # --- acks give credit back; nothing is removed ----------------------------------

    def settle(self, entry: QueueEntry) -> None:
        self.unacked -= 1

    def reject(self, entry: QueueEntry) -> None:
        self.unacked -= 1

    def requeue(self, entries: Iterable[QueueEntry], dispatch: bool = True) -> None:
        self.unacked -= len(list(entries))  # a stream does not redeliver
        if dispatch and self.consumers:
            self.dispatch()

    # --- consumers ---------------------------------------------------------------

    def check_consume(self, prefetch: int, global_prefetch: int, no_ack: bool, args: dict) -> None:
        if no_ack:
            raise NotSupported(
                f"automatic acknowledgement not supported by stream queues {self.describe()}"
            )
        if prefetch <= 0:
            raise PreconditionFailed(f"consumer prefetch count is not set for '{self.describe()}'")
        if "x-priority" in args:  # a stream delivers to every consumer in turn
            raise PreconditionFailed(
                f"invalid arg 'x-priority' for {self.describe()} of queue type rabbit_stream_queue"
            )
        if "x-stream-offset" in args:
            self.start_offset(args["x-stream-offset"])  # raises if malformed
        if global_prefetch:
            # RabbitMQ 3.10 refuses a stream consumer on a channel with a global
            # prefetch (its limiter is active) once the rest is valid, closing the
            # connection: a stream's credit is the consumer's prefetch alone.
            raise NotSupported(f"{self.describe()} does not support global qos")

    def _on_readable(self) -> None:
        """A cluster leader's followers now hold more of the log: deliver it."""
        if self.consumers and not self.deleted:
            self.dispatch()

    def start_offset(self, spec: Any) -> int:
        """Where a consumer with this `x-stream-offset` starts reading."""
        log = self.log
        if isinstance(spec, bool):
            pass
        elif isinstance(spec, int):
            # Past the end: the consumer starts at that offset once it exists (a
            # reader resuming at a stored offset must not get what came before it).
            return max(spec, log.first)
        elif isinstance(spec, str | bytes | bytearray):
            # A longstr (str, or bytes when it is not UTF-8) or a byte array (field
            # type 'x', what pika sends for Python bytes). RabbitMQ takes the three
            # names in either type, an interval only in a longstr.
            text = spec if isinstance(spec, str) else spec.decode(errors="replace")
            if text == "first":
                return log.first
            if text == "last":
                return max(log.first, log.next - 1)
            if text == "next":
                return log.next
            age = parse_age(text) if not isinstance(spec, bytearray) else None
            if age is not None:
                return log.offset_for_timestamp(int(wallclock.time() * 1000) - age)
        elif isinstance(spec, datetime.datetime):
            ts = spec if spec.tzinfo else spec.replace(tzinfo=datetime.UTC)
            return log.offset_for_timestamp(int(ts.timestamp() * 1000))
        # RabbitMQ's text; it answers some of these (a word that is no interval, a
        # boolean, a float, any other byte array) with 541 INTERNAL_ERROR and
        # closes the connection.
        if isinstance(spec, str | bytes | bytearray):
            text = spec if isinstance(spec, str) else spec.decode(errors="replace")
            shown = f'<<"{text}">>'
        elif isinstance(spec, bool):
            shown = "true" if spec else "false"
        else:
            shown = str(spec)
        raise PreconditionFailed(
            f"invalid arg 'x-stream-offset' for {self.describe()}: "
            f"{{invalid_stream_offset_arg,{{{amqp_type_name(spec)},{shown}}}}}"
        )

    def add_consumer(self, consumer: Consumer) -> None:
        start = self.start_offset(consumer.arguments.get("x-stream-offset", "next"))
        self._readers[consumer] = self.log.reader(start)
        self.consumers.append(consumer)
        self.had_consumer = True

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        reader = self._readers.pop(consumer, None)
        if reader is not None:
            reader.close()

    # --- what a stream refuses --------------------------------------------------------

    def get(self) -> QueueEntry | None:
        raise NotSupported(f"basic.get not supported by stream queues {self.describe()}")

    def purge(self) -> list:
        raise NotSupported(f"queue.purge not supported by stream queues {self.describe()}")

    @property
    def message_count(self) -> int:
        return 0  # as RabbitMQ 3.10.8 reports for streams in declare-ok

    # --- lifetime -----------------------------------------------------------------

    def touch(self) -> None:
        """Streams have no x-expires; nothing to re-arm."""

    def stop_timers(self) -> None:
        if self._refill_handle is not None:
            self._refill_handle.cancel()
            self._refill_handle = None
        for reader in self._readers.values():
            reader.close()

    def release(self) -> None:
        """The queue was deleted: its log goes too."""
        self.log.destroy()

    def __repr__(self) -> str:
        return f"<StreamQueue {self.name!r} first={self.log.first} next={self.log.next}>"
