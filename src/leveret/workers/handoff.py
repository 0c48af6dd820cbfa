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
state length) sent with the descriptor in one `sendmsg`, then the state. The receiver
reads exactly the header (the descriptor comes with its first byte) and exactly the
state, never into the next handoff. These calls block; an event loop runs them on a
blocking socket in a thread, or calls them when the socket is readable.
"""

from __future__ import annotations

import socket
import struct

#: the first four bytes of every handoff: a check that both ends speak this framing
MAGIC = b"LVH1"
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
