"""Malformed frames on a raw socket: the connection.close each earns (code, class and
method), and that the broker's other connections carry on. Each case has a
connection of its own."""

from __future__ import annotations

import struct

from .runner import C, Conn, Session, scenario
from .runner import method_frame as _method_frame

FRAME_END = b"\xce"


def _frame(kind: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + end


def _broken(s: Session, data: bytes, open_channel: bool = True) -> Conn:
    c = s.connect()
    if open_channel:
        c.open(1)
    c.raw.send(data)
    c.events(0)
    return c


def _publish_method(channel: int, queue: str) -> bytes:
    return _method_frame(channel, C.Basic.Publish(exchange="", routing_key=queue))


@scenario
def frame_errors(s: Session) -> None:
    """Broken framing: a bad frame-end octet, an unknown frame type, a frame over
    frame_max."""
    witness = s.connect()
    witness.open(1)
    _broken(s, _frame(1, 1, struct.pack(">HH", 10, 40), end=b"\x00"))
    _broken(s, _frame(9, 0, b"hello"))
    _broken(s, _frame(1, 1, b"\x00" * 200_000))
    witness.rpc(1, C.Queue.Declare(queue="still-here"))


@scenario
def unexpected_frames(s: Session) -> None:
    """Frames where they may not be: content on channel 0, a heartbeat on a channel,
    a body without a header, a header without a publish, a method inside content."""
    witness = s.connect()
    witness.open(1)
    header = struct.pack(">HHQH", 60, 0, 5, 0)
    _broken(s, _frame(2, 0, header))
    _broken(s, _frame(3, 0, b"hello"))
    _broken(s, _frame(8, 1, b""))
    _broken(s, _frame(3, 1, b"hello"))
    _broken(s, _frame(2, 1, header))
    _broken(s, _publish_method(1, "q") + _method_frame(1, C.Queue.Declare(queue="x")))
    witness.rpc(1, C.Queue.Declare(queue="still-here"))


@scenario
def channel_state_errors(s: Session) -> None:
    """Methods on channels in the wrong state, and on channel 0."""
    _broken(s, _method_frame(3, C.Queue.Declare(queue="q")), open_channel=False)
    _broken(s, _method_frame(0, C.Queue.Declare(queue="q")))
    _broken(s, _method_frame(1, C.Connection.Close(reply_code=200, reply_text="", class_id=0,
                                                   method_id=0)))  # fmt: skip


@scenario
def undecodable_methods(s: Session) -> None:
    """Truncated method payloads and garbage field tables."""
    witness = s.connect()
    witness.open(1)
    _broken(s, _frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00"))
    _broken(s, _frame(1, 1, struct.pack(">HH", 60, 80) + b"\x00\x00\x00\x07"))
    declare = _method_frame(1, C.Queue.Declare(queue="q", arguments={"a": 1}))
    _broken(s, declare[:-6] + b"\xff\xff" + declare[-4:])
    witness.rpc(1, C.Queue.Declare(queue="still-here"))


@scenario
def short_method_frames(s: Session) -> None:
    """Method frames too short for their class and method ids (0, 1 and 2 octets),
    each followed by a good frame the parser must not read the ids out of, on a
    channel and on channel 0."""
    witness = s.connect()
    witness.open(1)
    qos = _method_frame(1, C.Basic.Qos(prefetch_count=1))
    _broken(s, _frame(1, 1, b"") + qos)
    _broken(s, _frame(1, 1, b"\x00") + qos)
    _broken(s, _frame(1, 1, b"\x00\x3c") + qos)
    _broken(s, _frame(1, 0, b"\x00\x0a") + qos)
    witness.rpc(1, C.Queue.Declare(queue="still-here"))
