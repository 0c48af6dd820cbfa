"""Reading from client sockets: one buffer for all connections, reads sized per connection.

uvloop's plain `data_received` reads at most 256 KB at a time into its own buffer and
hands over a copy, which the protocol core then copies again to put a partial frame
left from the last read in front of it. With large messages those copies, and the
number of reads, cost more than the parsing: at 4 KB a message, reads of up to 4 MB
deliver 14% more messages a second than 256 KB reads (S5, docs/benchmarks.md#s5,
with bench/broker_ab.py).

So connections are `asyncio.BufferedProtocol`s. The kernel writes straight into one
`SharedReadBuffer` (reads are handled one at a time on the loop, so one buffer serves
every connection), behind the bytes the core had not parsed yet, and the connection
feeds the core one `bytes` copy of the lot. An idle connection keeps no read buffer.

How much one read may take is chosen per connection (`ReadSizer`). Big reads help
large messages, but thousands of small messages in one read are worse: they are all
routed in one loop turn, before any consumer's ack is read (16 B messages: reads of
1 MB delivered a third fewer than reads of 256 KB). So a read is sized to hold about
READ_MESSAGES messages of the size the last read held, within [READ_MIN, READ_MAX].
"""

from __future__ import annotations

import mmap

try:
    import cython
except ImportError:  # no Cython installed: the annotations below are only comments
    from leveret import _cython_shim as cython

READ_MIN = 64 * 1024
READ_MAX = 4 * 1024 * 1024
READ_START = 256 * 1024  # what uvloop's own reads take; the first reads of a connection
READ_MESSAGES = 2048  # messages one read should hold at most, about


class SharedReadBuffer:
    """The memory reads land in, shared by every connection of a server.

    A read is placed (`place`, from the protocol's get_buffer) and taken (`take`,
    from its buffer_updated) before the loop reads another socket, so one buffer
    serves all. It is an anonymous mapping: a page costs RAM only once a read has
    reached it, so a broker whose clients send small messages never pays for the
    whole of READ_MAX.
    """

    __slots__ = ("_view", "_size", "_placed", "_start")

    def __init__(self, frame_max: int) -> None:
        # Room for the largest read behind the largest unparsed remainder: a content
        # method, its header frame and part of its body frame (each up to frame_max).
        self._size = READ_MAX + 3 * frame_max + 1024
        self._view = memoryview(mmap.mmap(-1, self._size))
        self._placed = self._view
        self._start = 0

    def place(self, pending: bytes, want: cython.Py_ssize_t) -> memoryview:
        """Where a read of up to `want` bytes goes: behind a copy of `pending`."""
        k = len(pending)
        view = self._view
        if k + want > self._size:
            # A remainder larger than frame_max allows (never from a sane peer).
            view = memoryview(bytearray(k + want))
        if k:
            view[:k] = pending
        self._placed, self._start = view, k
        return view[k : k + want]

    def take(self, nbytes: cython.Py_ssize_t) -> bytes:
        """The pending bytes and the `nbytes` just read, as one bytes object."""
        return bytes(self._placed[: self._start + nbytes])


class ReadSizer:
    """How much the next read of one connection may take."""

    __slots__ = ("offer",)

    def __init__(self) -> None:
        self.offer = READ_START

    def update(self, nbytes: cython.Py_ssize_t, messages: cython.Py_ssize_t) -> None:
        """The last read brought `nbytes`, of which the core parsed `messages` whole
        content messages (publishes) on its fast path."""
        if messages:
            want = nbytes * READ_MESSAGES // messages
            self.offer = READ_MIN if want < READ_MIN else READ_MAX if want > READ_MAX else want
        elif nbytes >= self.offer:
            # Full, and no small messages in it (large bodies in several frames, or
            # methods only): let the next read take more.
            self.offer = min(self.offer * 2, READ_MAX)
