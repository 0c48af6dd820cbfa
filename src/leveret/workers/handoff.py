"""Moving a client connection to another worker process: its socket and its state.

A connection whose channels use the queues of one other worker is best served by
that worker, with no link between them. The kernel can give an open socket to
another process (SCM_RIGHTS over an AF_UNIX socket); the connection's state goes
with it as an opaque blob made by its owner: the protocol's state, and the bytes
already read from the socket but not yet handled, which the kernel no longer has.
The receiver handles those bytes first and then reads the socket, so the client's
bytes keep their order. The same call serves an acceptor that passes each new
connection to a worker (then the state is empty).

The channel is a stream socket, so one handoff is framed: an 8-byte header (magic,
state length) sent with the descriptor in one `sendmsg`, then the state.
`recv_connection` (blocking) reads exactly the header (the descriptor comes with its
first byte) and exactly the state, never into the next handoff. In an event loop,
`HandoffReader` takes whatever a non-blocking `recvmsg` returns: Linux hands over a
descriptor with the first read that reaches the bytes it was sent with, and stops
that read after them, so descriptors arrive in the order of their headers, never
after, and the reader pairs each header with the next descriptor
(`receive_connections` runs it on a socket in the loop).

A channel may also carry notes: a header with its own magic and a state, no
descriptor (`send_note`); the supervisor's liveness pings reach a worker this way,
on the channel its links come on, in order with them.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from collections.abc import Callable

#: the first four bytes of every handoff: a check that both ends speak this framing
MAGIC = b"LVH1"
#: the first four bytes of a note: a state without a descriptor
NOTE_MAGIC = b"LVN1"
_HEAD = struct.Struct(">4sI")  # magic, state length

#: a state larger than this is refused: it is a connection's unread input and protocol
#: state, which the broker bounds (reads of at most 4 MB), not a bulk transfer
MAX_STATE = 64 << 20


class HandoffError(Exception):
    """The handoff channel carried something that is not a handoff, or closed in the
    middle of one."""


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """A connected AF_UNIX stream pair to hand connections over (one end per process)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def send_connection(channel: socket.socket, conn: socket.socket, state: bytes = b"") -> None:
    """Give `conn` and `state` to the process at the other end of `channel`.

    The receiver gets its own descriptor for the connection; the caller then closes
    `conn` (without `shutdown`, which would end the connection for both)."""
    if len(state) > MAX_STATE:
        raise ValueError(f"handoff state of {len(state)} bytes is over {MAX_STATE}")
    head = _HEAD.pack(MAGIC, len(state))
    sent = socket.send_fds(channel, [head], [conn.fileno()])
    if sent < len(head):  # a stream socket may take part of a message: send the rest
        channel.sendall(head[sent:])
    if state:
        channel.sendall(state)


def send_note(channel: socket.socket, state: bytes) -> bool:
    """Send `state` as a note (no descriptor) without waiting: False, and nothing
    sent, when the channel's buffer is full (the reader is not reading)."""
    if len(state) > MAX_STATE:
        raise ValueError(f"note of {len(state)} bytes is over {MAX_STATE}")
    data = _HEAD.pack(NOTE_MAGIC, len(state)) + state
    try:
        sent = channel.send(data, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    if sent < len(data):  # a stream socket may take part of it: the rest, as a frame
        channel.sendall(data[sent:])
    return True


def _recv_exactly(channel: socket.socket, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        chunk = channel.recv(min(size, 1 << 20))
        if not chunk:
            raise HandoffError("handoff channel closed in the middle of a handoff")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def recv_connection(channel: socket.socket) -> tuple[socket.socket, bytes] | None:
    """The next connection handed over on `channel` and its state; None once the
    channel is closed between handoffs."""
    head, fds, _flags, _addr = socket.recv_fds(channel, _HEAD.size, 1)
    if not head and not fds:
        return None
    conn: socket.socket | None = None
    try:
        if len(fds) != 1:
            raise HandoffError(f"a handoff header came with {len(fds)} descriptors")
        conn = socket.socket(fileno=fds[0])
        fds = []
        if len(head) < _HEAD.size:
            head += _recv_exactly(channel, _HEAD.size - len(head))
        magic, length = _HEAD.unpack(head)
        if magic != MAGIC:
            raise HandoffError(f"not a handoff: header {head!r}")
        if length > MAX_STATE:
            raise HandoffError(f"handoff state of {length} bytes is over {MAX_STATE}")
        state = _recv_exactly(channel, length) if length else b""
        return conn, state
    except BaseException:
        for fd in fds:
            socket.close(fd)
        if conn is not None:
            conn.close()
        raise


class HandoffReader:
    """Sans-IO receiving side: bytes and descriptors in (as `recvmsg` returns them),
    whole handoffs out (a note as `(None, state)`). Owns the descriptors it was given
    until it returns them."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: deque[int] = deque()

    def feed(self, data: bytes, fds: list[int]) -> list[tuple[socket.socket | None, bytes]]:
        """The handoffs `data` completes, each a socket and its state, and its notes,
        each None and its state, in order. Raises `HandoffError` (closing every
        descriptor it holds) for a broken stream."""
        self._fds.extend(fds)
        buf = self._buffer
        buf += data
        out: list[tuple[socket.socket | None, bytes]] = []
        pos = 0
        try:
            while len(buf) - pos >= _HEAD.size:
                magic, length = _HEAD.unpack_from(buf, pos)
                if magic == NOTE_MAGIC and length <= MAX_STATE:
                    end = pos + _HEAD.size + length
                    if len(buf) < end:
                        break
                    out.append((None, bytes(buf[pos + _HEAD.size : end])))
                    pos = end
                    continue
                if magic != MAGIC:
                    raise HandoffError(f"not a handoff: header {bytes(buf[pos : pos + 8])!r}")
                if length > MAX_STATE:
                    raise HandoffError(f"handoff state of {length} bytes is over {MAX_STATE}")
                if not self._fds:
                    raise HandoffError("a handoff header came with 0 descriptors")
                end = pos + _HEAD.size + length
                if len(buf) < end:
                    break
                conn = socket.socket(fileno=self._fds.popleft())
                out.append((conn, bytes(buf[pos + _HEAD.size : end])))
                pos = end
        except HandoffError:
            for conn, _ in out:
                if conn is not None:
                    conn.close()
            self.close()
            raise
        del buf[:pos]
        return out

    @property
    def pending(self) -> bool:
        """Whether part of a handoff has arrived and waits for its rest."""
        return bool(self._buffer or self._fds)

    def close(self) -> None:
        """Close the descriptors received but not yet handed out."""
        while self._fds:
            socket.close(self._fds.popleft())


async def receive_connections(
    channel: socket.socket,
    on_connection: Callable[[socket.socket, bytes], None],
    on_note: Callable[[bytes], None] | None = None,
) -> None:
    """Call `on_connection(sock, state)` for each connection handed over on `channel`,
    and `on_note(state)` for each note, in the running loop, until the channel closes
    (then return) or breaks (then raise `HandoffError`; a note where `on_note` is None
    breaks it too: that channel carries none)."""
    loop = asyncio.get_running_loop()
    channel.setblocking(False)
    reader = HandoffReader()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(channel, 1 << 16, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            finish(exc)
            return
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                socket.close(fd)
            finish(HandoffError("descriptors were lost: the control message was cut"))
            return
        if not data and not fds:
            cut = reader.pending
            finish(
                HandoffError("handoff channel closed in the middle of a handoff") if cut else None
            )
            return
        try:
            handoffs = reader.feed(data, fds)
        except HandoffError as exc:
            finish(exc)
            return
        for index, (conn, state) in enumerate(handoffs):
            if conn is not None:
                on_connection(conn, state)
            elif on_note is not None:
                on_note(state)
            else:
                for rest, _ in handoffs[index + 1 :]:
                    if rest is not None:
                        rest.close()
                finish(HandoffError("a note on a channel that carries none"))
                return

    def finish(exc: BaseException | None) -> None:
        loop.remove_reader(channel.fileno())
        reader.close()
        if not done.done():
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)

    loop.add_reader(channel.fileno(), readable)
    try:
        await done
    finally:  # also when cancelled
        loop.remove_reader(channel.fileno())
        reader.close()
