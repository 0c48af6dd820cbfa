"""The replication stream's framing and its file operations.

A frame is `<u32 length><u8 type>` and its payload. The leader's live stream is
OPS frames, each a run of file operations (below) and the stream position after
them; a follower answers ACK with the position it has written (and fsynced).
Positions count the bytes of encoded operations since the leader took the lead,
so a follower's lag is in bytes. Nothing in a frame names a vhost: a per-vhost
stream later is more of the same streams, one per vhost leader.

On a link that carried nothing for an interval the leader sends KEEPALIVE (the
interval is in WELCOME), and so does a follower that said in HELLO it would; a side
that hears nothing for SILENT_INTERVALS of them takes the link for dead, so that
neither mistakes a dead link for an idle peer.

A file operation is `<u8 kind><u16 path length><path>` then, by kind:
  WRITE   <u64 offset><u32 n><n bytes>    bytes at an offset (creates the file)
  REPLACE <u32 n><n bytes>                 the whole file now holds these bytes
  UNLINK                                   the file is gone
  TRUNCATE <u64 size>
  RMTREE                                   a directory and all under it are gone
  SQL     <u32 n><n bytes of JSON list>    one committed SQLite transaction
Paths are relative to the data dir, '/'-separated, never absolute or with '..'.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Sequence

FRAME = struct.Struct("<IB")
U64 = struct.Struct("<Q")

# frame types
# (manifest_keepalive in both: the follower sends KEEPALIVE while it reads its data dir
# for MANIFEST, and the leader takes it; each does only if the other said so)
HELLO = 1  # follower → leader: JSON {cluster, node, epoch, keepalive, manifest_keepalive}
WELCOME = 2  # leader → follower: JSON {epoch, leader, keepalive: interval, manifest_keepalive}
REFUSE = 3  # either way: JSON {reason}; the connection then closes
MANIFEST = 4  # follower → leader: JSON [[path, size, crc32], ...]
SNAP_FILE = 5  # leader → follower: <u8 fresh><u16 n><path><u64 offset> data
SNAP_DELETE = 6  # leader → follower: path
SNAP_SQLITE = 7  # leader → follower: <u16 n><path> database image
SNAP_END = 8  # leader → follower: <u64 position>
OPS = 9  # leader → follower: <u64 position after> operations
ACK = 10  # follower → leader: <u64 position>
STATUS = 11  # follower → leader: JSON with the follower's node figures
KEEPALIVE = 12  # either way: empty; the link carried nothing for an interval

# A side of a link that hears nothing for this many keepalive intervals takes it for
# dead: an idle link carries a keepalive at least every second interval, so this
# leaves a wide margin for a busy machine.
SILENT_INTERVALS = 8

# operation kinds
WRITE = 1
REPLACE = 2
UNLINK = 3
TRUNCATE = 4
RMTREE = 5
SQL = 6

_OP_HEAD = struct.Struct("<BH")
_WRITE = struct.Struct("<QI")
_LEN = struct.Struct("<I")
_PATH = struct.Struct("<H")


def frame(kind: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(len(payload) + 1, kind) + payload


def json_frame(kind: int, value: object) -> bytes:
    return frame(kind, json.dumps(value).encode())


def op_write(path: str, offset: int, chunks: Sequence[bytes]) -> list[bytes]:
    raw = path.encode()
    n = sum(len(c) for c in chunks)
    return [_OP_HEAD.pack(WRITE, len(raw)), raw, _WRITE.pack(offset, n), *chunks]


def op_replace(path: str, data: bytes) -> list[bytes]:
    raw = path.encode()
    return [_OP_HEAD.pack(REPLACE, len(raw)), raw, _LEN.pack(len(data)), data]


def op_simple(kind: int, path: str) -> list[bytes]:
    raw = path.encode()
    return [_OP_HEAD.pack(kind, len(raw)), raw]


def op_truncate(path: str, size: int) -> list[bytes]:
    raw = path.encode()
    return [_OP_HEAD.pack(TRUNCATE, len(raw)), raw, U64.pack(size)]


def op_sql(path: str, statements: list[str]) -> list[bytes]:
    raw = path.encode()
    data = json.dumps(statements).encode()
    return [_OP_HEAD.pack(SQL, len(raw)), raw, _LEN.pack(len(data)), data]


def iter_ops(data: memoryview) -> Iterator[tuple[int, str, int, memoryview]]:
    """(kind, path, number, bytes) for each operation; number is the offset or size."""
    pos = 0
    end = len(data)
    while pos < end:
        kind, plen = _OP_HEAD.unpack_from(data, pos)
        pos += _OP_HEAD.size
        path = bytes(data[pos : pos + plen]).decode()
        pos += plen
        if kind == WRITE:
            offset, n = _WRITE.unpack_from(data, pos)
            pos += _WRITE.size
            yield kind, path, offset, data[pos : pos + n]
            pos += n
        elif kind in (REPLACE, SQL):
            (n,) = _LEN.unpack_from(data, pos)
            pos += 4
            yield kind, path, 0, data[pos : pos + n]
            pos += n
        elif kind == TRUNCATE:
            (size,) = U64.unpack_from(data, pos)
            pos += 8
            yield kind, path, size, data[pos:pos]
        elif kind in (UNLINK, RMTREE):
            yield kind, path, 0, data[pos:pos]
        else:
            raise ValueError(f"unknown replication operation {kind}")


def snap_file(path: str, offset: int, data: bytes, fresh: bool) -> bytes:
    raw = path.encode()
    return frame(
        SNAP_FILE,
        bytes([1 if fresh else 0]) + _PATH.pack(len(raw)) + raw + U64.pack(offset) + data,
    )


def parse_snap_file(payload: memoryview) -> tuple[bool, str, int, memoryview]:
    fresh = payload[0] == 1
    (plen,) = _PATH.unpack_from(payload, 1)
    path = bytes(payload[3 : 3 + plen]).decode()
    (offset,) = U64.unpack_from(payload, 3 + plen)
    return fresh, path, offset, payload[11 + plen :]


def snap_sqlite(path: str, image: bytes) -> bytes:
    raw = path.encode()
    return frame(SNAP_SQLITE, _PATH.pack(len(raw)) + raw + image)


def parse_snap_sqlite(payload: memoryview) -> tuple[str, memoryview]:
    (plen,) = _PATH.unpack_from(payload, 0)
    return bytes(payload[2 : 2 + plen]).decode(), payload[2 + plen :]


def safe_path(path: str) -> str:
    """Refuse a path that would leave the data dir (a bug or a hostile peer)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"replication: bad path {path!r}")
    return path


# A payload larger than this is read in pieces of this size when the reader wants to
# hear of progress (a follower's liveness check: a 100 MB frame over a slow link is not
# a silent one). Pieces cost a second copy of the payload, so the frames of everyday
# streaming (a loop turn's writes, rarely over a megabyte) are read whole as before.
PROGRESS_CHUNK = 1 << 20


async def read_frame(
    reader: object, progress: Callable[[], None] | None = None
) -> tuple[int, bytes | bytearray]:
    """One frame from an asyncio.StreamReader: (type, payload). `progress` is called
    before each piece of a payload over PROGRESS_CHUNK (not at all for smaller ones)."""
    head = await reader.readexactly(FRAME.size)  # type: ignore[attr-defined]
    length, kind = FRAME.unpack(head)
    n = length - 1
    if n <= 0:
        return kind, b""
    if progress is None or n <= PROGRESS_CHUNK:
        return kind, await reader.readexactly(n)  # type: ignore[attr-defined]
    payload = bytearray()
    while len(payload) < n:
        progress()
        payload += await reader.readexactly(min(PROGRESS_CHUNK, n - len(payload)))  # type: ignore[attr-defined]
    return kind, payload
