"""Where a stored message lives: the value types the queues hold.

A queue holds a `Location` (or a `TransientLocation`) for each message it keeps
as an object, and a durable fan-out hands each queue a slot of a `SharedRecord`.
They are their own piece because they are what the rest of the broker sees of
the store, and they know nothing of segments, compaction or recovery: small
`__slots__` objects, made on the publish path and read back by the paged tails.
`split_publish` is the one reader of a stored message's header and body.
"""

from __future__ import annotations

import zlib

from leveret.store.errors import StoreError
from leveret.store.records import PUB_FIXED, PUB_HEAD, PUBLISH
from leveret.store.segments import PREFIX_SIZE, RECORD_PREFIX


class Location:
    """Where one queued message lives on disk, plus what recovery needs to know about it.

    Mutable on purpose: compaction moves records and updates the same object the
    queue holds, so the queue's reference never goes stale. A long queue keeps one
    of these per paged message, so every slot counts: `transient` is a class
    attribute (TransientLocation), and equal sizes share one int (`intern_size`).
    """

    __slots__ = ("segment", "offset", "size", "queue_id", "msg_id", "redelivered")

    transient = False  # a record written only to page a body out (TransientLocation)

    def __init__(self, segment: int, offset: int, size: int, queue_id: int, msg_id: int) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.queue_id = queue_id
        self.msg_id = msg_id
        # True once a DELIVERED record exists: a recovered message goes out redelivered.
        self.redelivered = False

    @property
    def body_estimate(self) -> int:
        """The body's size, over by the routing and properties stored with it; what a
        queue counts for a message it keeps as this location alone."""
        return self.size - PUB_HEAD

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(seg={self.segment}, off={self.offset}, size={self.size}, "
            f"q={self.queue_id}, id={self.msg_id}, redelivered={self.redelivered})"
        )


class SharedRecord:
    """A FANOUT record just written: one message's body for several durable queues.
    Each queue takes its slot as it enqueues the message (`take_slot`,
    `take_slot_paged`); a slot no queue takes is let go (`release_slot`)."""

    __slots__ = ("segment", "offset", "size", "first", "qids", "extra")

    def __init__(
        self, segment: int, offset: int, size: int, first: int, qids: list[int], extra: int = 0
    ) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.first = first  # message id of slot 0; slot k has first + k
        self.qids = qids
        self.extra = extra  # bytes beyond the fixed part that are not body: ids, header


class TransientLocation(Location):
    """A body paged out of RAM: not fsynced on its own account, ignored by recovery."""

    __slots__ = ()
    transient = True


_SIZES: dict[int, int] = {}


def intern_size(n: int) -> int:
    """One int object per distinct record size under 64 KB: a long queue of
    same-sized messages then holds one, not one per Location (28 bytes each)."""
    if n < 65536:
        return _SIZES.setdefault(n, n)
    return n


def split_publish(record: memoryview, loc: Location, check: bool) -> tuple[bytes, bytes]:
    """(header bytes, body) of one PUBLISH or FANOUT record; with `check`, its CRC
    verified first."""
    if check and (
        len(record) != loc.size
        or zlib.crc32(record[PREFIX_SIZE:]) != RECORD_PREFIX.unpack_from(record)[1]
    ):
        raise StoreError(f"stored message {loc!r} is corrupt")
    rtype, _flags, n, _mid, hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)
    start = PUB_HEAD if rtype == PUBLISH else PUB_HEAD + 4 * n  # FANOUT: after the ids
    return bytes(record[start : start + hlen]), bytes(record[start + hlen :])
