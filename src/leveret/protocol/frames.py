"""Sans-IO framing: bytes in, frames out; frames in, bytes out.

Nothing here touches a socket, so it can be fed any byte string in tests and
fuzzers. The reader never copies a payload more than once: frames are sliced
out of one buffer with a precompiled struct.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from leveret.protocol.constants import (
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
)
from leveret.protocol.errors import FrameError

FRAME_HEAD = struct.Struct(">BHI")
KNOWN_FRAME_TYPES = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


class FrameReader:
    """Splits a byte stream into (frame_type, channel, payload) triples.

    `frame_max` is the largest whole frame (header and end octet included) the
    peer may send; it is raised or lowered once tuning is agreed.
    """

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self._buf = bytearray()
        self.frame_max = frame_max

    def feed(self, data: bytes) -> Iterator[tuple[int, int, bytes]]:
        """Add bytes and yield every complete frame they finish.

        Raises FrameError for a stream that is not valid AMQP framing; the
        caller must then close the connection, since the stream is out of sync.
        """
        buf = self._buf
        buf += data
        offset = 0
        size_left = len(buf)
        unpack_head = FRAME_HEAD.unpack_from
        frame_max = self.frame_max
        try:
            while size_left >= 7:
                frame_type, channel, size = unpack_head(buf, offset)
                if frame_type not in KNOWN_FRAME_TYPES:
                    raise FrameError(FRAME_ERROR, f"unknown frame type {frame_type}")
                if size + FRAME_OVERHEAD > frame_max:
                    raise FrameError(
                        FRAME_ERROR,
                        f"frame of {size + FRAME_OVERHEAD} bytes on channel {channel} "
                        f"exceeds the negotiated frame_max of {frame_max}",
                    )
                end = offset + 7 + size
                if size_left < size + FRAME_OVERHEAD:
                    break
                if buf[end] != FRAME_END:
                    raise FrameError(
                        FRAME_ERROR,
                        f"bad frame end octet 0x{buf[end]:02x} (expected 0xce) "
                        f"on channel {channel}",
                    )
                payload = bytes(buf[offset + 7 : end])
                offset = end + 1
                size_left -= size + FRAME_OVERHEAD
                yield frame_type, channel, payload
        finally:
            if offset:
                del buf[:offset]


def method_frame(channel: int, payload: bytes) -> bytes:
    """A whole method frame around an already-encoded method payload."""
    return FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def header_frame(channel: int, payload: bytes) -> bytes:
    return FRAME_HEAD.pack(FRAME_HEADER, channel, len(payload)) + payload + b"\xce"


def body_frames(channel: int, body: bytes, frame_max: int) -> list[bytes]:
    """The body split into frames that each fit frame_max (an empty body has none)."""
    chunk = frame_max - FRAME_OVERHEAD
    pack = FRAME_HEAD.pack
    if len(body) <= chunk:
        return [pack(FRAME_BODY, channel, len(body)), body, b"\xce"] if body else []
    parts: list[bytes] = []
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start : start + chunk]
        parts += (pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return parts
