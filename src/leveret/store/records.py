"""The message store's records: their types, layouts and small readers.

Record types (payloads, little-endian, after the segment record prefix):

    PUBLISH   u32 queue id, u64 message id, u32 header length, header bytes, body bytes
    FANOUT    u32 n, u64 first message id, u32 header length, n x u32 queue ids,
              header bytes, body bytes: one persistent message routed to n durable
              queues, its body written once; the k-th queue's copy has message id
              first + k (segment format version 3)
    ACK       u32 queue id, u64 message id, u64 segment that held the PUBLISH
    DELIVERED u32 queue id, u64 message id, u64 segment that held the PUBLISH,
              [u32 delivery count]: the count is there only for a quorum queue's
              message that was returned and went out again (see below)
    PURGE     u32 queue id, u64 lowest id, u64 highest id, u16 n, n x u64 segments
    REFS      (flags: ACK or DELIVERED) u32 queue id, u64 segment that held the
              PUBLISHes, u32 n, n x u64 message ids: one loop turn's ACKs (or
              DELIVEREDs) of one queue's messages in one segment, in one record
              (segment format version 2)

A PURGE drops, in one record, a queue's messages with ids in [lowest, highest]: a
purged paged tail (its ids are not in RAM, and they are all newer than anything
the queue holds as objects). It names the segments those messages were in.

A DELIVERED record with a count says what a quorum queue's message is to count as
after a restart (RabbitMQ's x-delivery-count); the highest one wins. Without one,
a DELIVERED record means a count of 1. A build older than the counts reads the
record's fixed part and sees a plain DELIVERED, so the format version is the same.

A FANOUT record is one message for several queues: each queue holds its position
(its own Location or paged-tail entry, with its own message id), is acked on its
own, and counts the record's full size in its segment's live bytes. The record is
dead once every queue has let go of it, and compaction moves it once for all of
them. A segment of fan-out records is therefore compacted later than its live
bytes alone would say, never deleted too early.
"""

from __future__ import annotations

import struct
import sys
import zlib

from leveret.store.segments import PREFIX_SIZE, RECORD_PREFIX

PUBLISH = 1
ACK = 2
DELIVERED = 3
PURGE = 4
REFS = 5
FANOUT = 6

FLAG_TRANSIENT = 0x01  # written only to page a body out of RAM; recovery ignores it

PUB_FIXED = struct.Struct("<BBIQI")  # type, flags, queue id, message id, header length
PUB_HEAD = PREFIX_SIZE + PUB_FIXED.size
PUB_IDS = struct.Struct("<IQ")  # queue id, message id (at record offset + 10)
REF_BODY = struct.Struct("<BBIQQ")  # type, flags, queue id, message id, target segment
REF_IDS = struct.Struct("<IQQ")
REF_COUNT = struct.Struct("<I")  # a DELIVERED record's delivery count, after REF_BODY
IDS_AT = PREFIX_SIZE + 2
PURGE_BODY = struct.Struct("<BBIQQH")  # type, flags, queue id, lowest id, highest id, n
PURGE_IDS = struct.Struct("<IQQH")
REFS_BODY = struct.Struct("<BBIQI")  # type, kind (ACK/DELIVERED), queue id, target, n
REFS_IDS = struct.Struct("<IQI")
REFS_MAX = 8192  # message ids in one REFS record (64 KB)
BIG_ENDIAN = sys.byteorder == "big"  # records are little-endian; array("Q") is native
REFS_AT = IDS_AT + REFS_IDS.size  # where a REFS record's message ids start


def intact(record: memoryview, size: int) -> bool:
    """The record is all there and its CRC matches."""
    return (
        len(record) == size
        and zlib.crc32(record[PREFIX_SIZE:]) == RECORD_PREFIX.unpack_from(record)[1]
    )


def record_extra(record: memoryview, size: int) -> int:
    """What a PUBLISH or FANOUT record holds beyond its fixed part that is not body."""
    if len(record) < PUB_HEAD:
        return 0
    rtype, _flags, n, _mid, hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)
    extra = hlen + (4 * n if rtype == FANOUT else 0)
    return min(extra, max(0, size - PUB_HEAD))


def fanout_qids(record: bytes | memoryview, off: int = 0) -> tuple[int, tuple[int, ...]]:
    """(first message id, queue ids) of the FANOUT record at `off`."""
    n, first = PUB_IDS.unpack_from(record, off + IDS_AT)
    return first, struct.unpack_from(f"<{n}I", record, off + PUB_HEAD)


def record_mid(record: bytes | memoryview, qid: int) -> int:
    """The message id that queue `qid` has in a PUBLISH or FANOUT record."""
    if record[PREFIX_SIZE] == FANOUT:
        first, qids = fanout_qids(record)
        return first + qids.index(qid)
    return PUB_IDS.unpack_from(record, IDS_AT)[1]


def purge_fields(data: bytes | memoryview, off: int) -> tuple[int, int, int, list[int]]:
    qid, lo, hi, n = PURGE_IDS.unpack_from(data, off + IDS_AT)
    at = off + PREFIX_SIZE + PURGE_BODY.size
    return qid, lo, hi, list(struct.unpack_from(f"<{n}Q", data, at))
