"""Channels opening and closing, the close handshakes and protocol errors.

The protocol core's rules for everything that is not a message: what arrives on
channel 0 (the handshake, which `handshake.py` runs, then connection.close,
blocked and unblocked), frames for a channel that is not open (channel.open and
open-ok, and while a channel or the connection is closing, dropping all but close
and close-ok until close-ok arrives, spec 2.3.5.2), answering the peer's closes,
and closing by our side or because the peer broke the protocol. None of it runs
per message, so it is plain Python apart from the compiled parser in
`connection.py`: these are functions of a `Connection`, called from its general
frame path (`Connection._frame`) and by its methods (`open_channel`,
`close_channel`, `close`).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.protocol import handshake
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_ERROR,
    CHANNEL_OPEN,
    CHANNEL_OPEN_OK,
    CLASS_CONNECTION,
    COMMAND_INVALID,
    CONNECTION_BLOCKED,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_UNBLOCKED,
    FRAME_METHOD,
    NOT_ALLOWED,
    REPLY_SUCCESS,
    UNEXPECTED_FRAME,
)
from leveret.protocol.errors import AMQPError, ConnectionError_, FrameError
from leveret.protocol.events import (
    ChannelClosed,
    ChannelCloseOk,
    ChannelOpened,
    ConnectionBlocked,
    ConnectionClosed,
    ConnectionCloseOk,
    ConnectionUnblocked,
    MethodReceived,
    ProtocolError,
)
from leveret.protocol.frames import method_frame
from leveret.protocol.states import (
    AWAITING_HEADER,
    CH_CLOSING,
    CH_OPEN,
    CH_OPENING,
    CLOSED,
    CLOSING,
    LOGIN_REFUSED,
    NEW,
    OPEN,
    UsageError,
)

if TYPE_CHECKING:
    from leveret.protocol.connection import Connection, _Channel

# channel.open-ok as RabbitMQ sends it: an empty channel-id (pamqp only writes "0").
_CHANNEL_OPEN_OK_PAYLOAD = struct.pack(">HHI", 20, 11, 0)


# --- what the peer sends -------------------------------------------------------------


def connection_method(conn: Connection, payload: bytes) -> None:
    """A method on channel 0: the handshake until the connection is open, then
    close, blocked and unblocked; while we are closing, only close and close-ok."""
    index = wire.method_index(payload)
    state = conn.state
    if state == OPEN:
        method = wire.decode_method(payload)
        if index == CONNECTION_CLOSE:
            peer_closed(conn, method)
        elif index == CONNECTION_BLOCKED:
            conn._events.append(ConnectionBlocked(method.reason))
        elif index == CONNECTION_UNBLOCKED:
            conn._events.append(ConnectionUnblocked())
        elif index >> 16 == CLASS_CONNECTION:
            conn._events.append(MethodReceived(0, method))
        else:
            raise ConnectionError_(
                CHANNEL_ERROR,
                f"method {method.name} is not valid on channel 0",
                index >> 16,
                index & 0xFFFF,
            )
    elif state == CLOSING:
        # After connection.close only close and close-ok matter.
        if index == CONNECTION_CLOSE_OK:
            conn.state = CLOSED
            conn._events.append(ConnectionCloseOk())
        elif index == CONNECTION_CLOSE:
            conn._reply(0, cmd.Connection.CloseOk())
            conn.state = CLOSED
            conn._events.append(ConnectionCloseOk())
    elif state == LOGIN_REFUSED:
        return  # nothing a refused client sends is acted on, its close included
    elif index == CONNECTION_CLOSE:  # the peer gives up during the handshake
        peer_closed(conn, wire.decode_method(payload))
    elif conn.client:
        handshake.client_step(conn, index, payload)
    else:
        handshake.server_step(conn, index, payload)


def peer_closed(conn: Connection, method: Any) -> None:
    """The peer's connection.close: answer close-ok, forget every channel."""
    conn._reply(0, cmd.Connection.CloseOk())
    conn.state = CLOSED
    conn._channels.clear()
    conn._events.append(
        ConnectionClosed(method.reply_code, method.reply_text, method.class_id, method.method_id)
    )


def frame_for_other_channel(
    conn: Connection, frame_type: int, number: int, payload: bytes, ch: _Channel | None
) -> None:
    """A frame for a channel that is not open, or before/after the connection is."""
    if conn.state == CLOSING or conn.state == LOGIN_REFUSED:
        return  # after connection.close everything but close/close-ok is dropped
    if conn.state != OPEN:
        raise ConnectionError_(
            UNEXPECTED_FRAME if frame_type != FRAME_METHOD else COMMAND_INVALID,
            f"frame on channel {number} before the connection was opened",
        )
    index = wire.method_index(payload) if frame_type == FRAME_METHOD else 0
    if ch is not None:
        if ch.state == CH_CLOSING:
            # Waiting for close-ok: only close and close-ok matter (spec 2.3.5.2).
            if index == CHANNEL_CLOSE_OK:
                del conn._channels[number]
                conn._events.append(ChannelCloseOk(number))
            elif index == CHANNEL_CLOSE:
                conn._reply(number, cmd.Channel.CloseOk())
            return
        # CH_OPENING (client role): expect open-ok, or a close.
        if index == CHANNEL_OPEN_OK:
            ch.state = CH_OPEN
            conn._events.append(ChannelOpened(number))
            return
        if index == CHANNEL_CLOSE:
            channel_closed_by_peer(conn, ch, wire.decode_method(payload))
            return
        raise ConnectionError_(
            CHANNEL_ERROR,
            f"expected 'channel.open-ok' on channel {number}, got "
            + (wire.method_name(index) if index else f"a frame of type {frame_type}"),
        )
    if frame_type == FRAME_METHOD and index == CHANNEL_OPEN and not conn.client:
        if number > conn.channel_max:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"channel {number} is above the negotiated channel_max ({conn.channel_max})",
                20,
                10,
            )
        if conn.channel_guard is not None:
            conn.channel_guard(number)  # may refuse it with a connection error
        conn._add_channel(number, CH_OPEN)
        conn._deferred.append(method_frame(number, _CHANNEL_OPEN_OK_PAYLOAD))
        conn._events.append(ChannelOpened(number))
        return
    if frame_type == FRAME_METHOD:
        if index == CHANNEL_CLOSE_OK:  # stray close-ok for a channel already gone
            return
        if conn.client and index == CHANNEL_CLOSE:
            # A close for a channel we already forgot: answer it, or the peer waits.
            conn._reply(number, cmd.Channel.CloseOk())
            return
        raise ConnectionError_(
            CHANNEL_ERROR,
            "expected 'channel.open'",  # RabbitMQ's text (it names neither)
            index >> 16,
            index & 0xFFFF,
        )
    raise ConnectionError_(CHANNEL_ERROR, f"content frame on channel {number}, which is not open")


def channel_closed_by_peer(conn: Connection, ch: _Channel, method: Any) -> None:
    """The peer's channel.close: answer close-ok (after the caller has seen the
    event) and forget the channel."""
    conn._reply(ch.number, cmd.Channel.CloseOk())
    del conn._channels[ch.number]
    conn._events.append(
        ChannelClosed(
            ch.number, method.reply_code, method.reply_text, method.class_id, method.method_id
        )
    )


def protocol_error(conn: Connection, exc: AMQPError) -> None:
    """The peer broke the protocol: queue connection.close with the error and report
    it. Broken framing, or an error before the handshake finished, leaves nothing to
    wait for (`ProtocolError.drop`): the caller writes the close and hangs up."""
    if conn.state == LOGIN_REFUSED:
        return  # a refused client's bytes are not read: broken ones are no exception
    drop = isinstance(exc, FrameError) or conn.state in (AWAITING_HEADER, NEW)
    if conn.state not in (CLOSING, CLOSED):
        conn._method(
            0, cmd.Connection.Close(exc.code, exc.reply_text[:255], exc.class_id, exc.method_id)
        )
        handshake_done = conn.state == OPEN
        conn.state = CLOSING if handshake_done and not drop else CLOSED
        drop = drop or not handshake_done
    conn._channels.clear()
    conn._events.append(ProtocolError(exc, drop))


# --- what the local program asks for ---------------------------------------------------


def open_channel(conn: Connection, number: int | None) -> int:
    """Connection.open_channel."""
    if not conn.client:
        raise UsageError("only the client opens channels")
    if conn.state != OPEN:
        raise UsageError(f"cannot open a channel: the connection is {conn.state}")
    if number is None:
        number = free_channel(conn)
    elif number in conn._channels:
        raise UsageError(f"channel {number} is already in use")
    elif not 1 <= number <= conn.channel_max:
        raise UsageError(f"channel number {number} is outside 1..{conn.channel_max}")
    conn._add_channel(number, CH_OPENING)
    conn._method(number, cmd.Channel.Open())
    return number


def free_channel(conn: Connection) -> int:
    """The next unused channel number after the last one handed out, wrapping at
    channel_max, so a number just closed is not reused at once."""
    limit = conn.channel_max
    n = conn._next_channel
    for _ in range(limit):
        if n > limit:
            n = 1
        if n not in conn._channels:
            conn._next_channel = n + 1
            return n
        n += 1
    raise UsageError(f"all {limit} channels are in use")


def close_channel(
    conn: Connection,
    number: int,
    code: int = REPLY_SUCCESS,
    text: str = "",
    class_id: int = 0,
    method_id: int = 0,
) -> None:
    """Connection.close_channel."""
    ch = conn._channels.get(number)
    if ch is None or ch.state == CH_CLOSING:
        return
    ch.state = CH_CLOSING
    ch.content = None
    conn._method(number, cmd.Channel.Close(code, text[:255], class_id, method_id))


def close(
    conn: Connection,
    code: int = REPLY_SUCCESS,
    text: str = "",
    class_id: int = 0,
    method_id: int = 0,
) -> None:
    """Connection.close."""
    if conn.state in (CLOSING, CLOSED):
        return
    if conn.state in (NEW, AWAITING_HEADER):
        conn.state = CLOSED
        return
    handshake_done = conn.state == OPEN
    conn._method(0, cmd.Connection.Close(code, text[:255], class_id, method_id))
    conn.state = CLOSING if handshake_done else CLOSED
    for ch in conn._channels.values():
        ch.content = None
