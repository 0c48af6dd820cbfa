"""A delayed exchange's delay store on the message store (the durable broker's
`DurabilityHooks.delay_store`): messages to and from delay records.

The exchange type (broker/exchanges/delayed.py) drives it; the message store's
delay queue (store/delay_queue.py) keeps the records in due-time order. What a
record holds after its due time is this module's business:

    u8 flags (KEYS), i64 the delay (ms, as read from x-delay at publish),
    the exchange and routing key as basic.deliver carries them,
    [KEYS: u16 n, n x (u16 length, key): the CC/BCC routing keys],
    the content header as published; then the body.

BCC keys are only here: the header lost its BCC entry at publish, as in a queue.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any

from leveret.broker.errors import PreconditionFailed
from leveret.broker.message import Message
from leveret.broker.queue_args import parse_expiration
from leveret.protocol.properties import FLAG_EXPIRATION, parse_header

if TYPE_CHECKING:
    from leveret.store.delay_index import DelayIndex
    from leveret.store.message_store import MessageStore

log = logging.getLogger("leveret.store")

KEYS = 0x01
_U16 = struct.Struct("<H")
_HEAD = struct.Struct("<Bq")  # flags, delay


def encode(message: Message, delay: int) -> bytes:
    keys = message.routing_keys
    if keys is None:
        return _HEAD.pack(0, delay) + message.exchange_and_key + message.header
    parts = [_HEAD.pack(KEYS, delay), message.exchange_and_key, _U16.pack(len(keys))]
    for key in keys:
        raw = key.encode()
        parts += [_U16.pack(len(raw)), raw]
    parts.append(message.header)
    return b"".join(parts)


def decode(blob: bytes, body: bytes) -> tuple[Message, int]:
    """(the message, its delay) of a stored record."""
    flags, delay = _HEAD.unpack_from(blob)
    at = _HEAD.size
    n = blob[at]
    exchange = blob[at + 1 : at + 1 + n].decode()
    m = blob[at + 1 + n]
    routing_key = blob[at + 2 + n : at + 2 + n + m].decode()
    encoded = blob[at : at + 2 + n + m]
    p = at + 2 + n + m
    keys = None
    if flags & KEYS:
        (count,) = _U16.unpack_from(blob, p)
        p += 2
        keys = []
        for _ in range(count):
            (size,) = _U16.unpack_from(blob, p)
            keys.append(blob[p + 2 : p + 2 + size].decode())
            p += 2 + size
    header = blob[p:]
    _cls, _w, _size, hflags, delivery_mode = parse_header(header)
    message = Message(exchange, routing_key, header, body, hflags, delivery_mode == 2, encoded)
    message.routing_keys = keys
    if hflags & FLAG_EXPIRATION:
        try:
            message.ttl = parse_expiration(message.properties.expiration)
        except PreconditionFailed:
            message.ttl = None
    return message, delay


class StoredDelays:
    """One delayed exchange's pending messages, in the message store."""

    def __init__(self, messages: MessageStore, vhost: str, exchange: str, state: Any) -> None:
        self.messages = messages
        self.vhost = vhost
        self.exchange = exchange
        self.state = state  # the DurableState: `recovering`, and drops held until then
        self.closed = False
        self._index: DelayIndex | None = None

    def _resolve(self, create: bool) -> DelayIndex | None:
        """The store's index for this exchange: looked up when first needed (the
        store recovers after the exchange is declared), created on the first add."""
        index = self._index
        if index is None or index.qid not in self.messages.delays.by_qid:
            if create:
                index = self.messages.delays.index(self.vhost, self.exchange)
            else:
                index = self.messages.delays.find(self.vhost, self.exchange)
            self._index = index
        return index

    def __len__(self) -> int:
        index = self._resolve(False)
        return len(index) if index is not None else 0

    def add(self, due: int, delay: int, message: Message, barrier: Any, durable: bool) -> None:
        index = self._resolve(True)
        assert index is not None
        self.messages.delays.add(
            index,
            due,
            encode(message, delay),
            message.body,
            barrier.add() if durable and barrier is not None else None,
            not durable,
        )

    def first_due(self) -> int | None:
        index = self._resolve(False)
        return index.first_due() if index is not None else None

    def take_due(self, now: int, limit: int) -> list[tuple[Message, int, Any]]:
        index = self._resolve(False)
        if index is None:
            return []
        return [
            (*decode(header, body), token)
            for _due, header, body, token in self.messages.delays.take(index, now, limit)
        ]

    def done(self, token: Any) -> None:
        index = self._index
        if index is not None:
            self.messages.delays.ack(index, token)

    def keep(self, token: Any) -> None:
        """The message taken with `token` waits for its `done` beyond this loop turn
        (a broker of workers: for another worker's confirm): its record stays."""
        index = self._index
        if index is not None:
            self.messages.delays.keep(index, token)

    def paused(self) -> Any:
        return self.messages.delays.paused()

    def recovered(self) -> None:
        self._index = None  # look again: recovery may have brought one

    def drop(self) -> None:
        """The exchange is deleted: its pending messages go with it."""
        self._index = None
        self.closed = True
        if self.state.recovering:
            # The store is the recovery thread's until it is done.
            self.state.delay_drops.append((self.vhost, self.exchange))
        else:
            self.messages.delays.drop(self.vhost, self.exchange)
