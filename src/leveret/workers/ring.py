"""A single-producer, single-consumer byte ring in shared memory, with eventfd wakeups.

The alternative to a socket pair for the link between two workers: the producer
copies a batch of records (the bytes `link.LinkWriter` makes) into memory both
processes map, and the consumer copies them out, with no system call while both are
busy; a side that finds the ring empty (or full) sleeps on an eventfd that the other
side writes when it sees the sleeper's flag. `bench/interworker.py` measures it
against the socket pair; the link uses the socket pair (docs/benchmarks.md,
"Between worker processes", says why).

Layout: a 128-byte header of 8-byte cells, then `capacity` bytes of data. `head`
(bytes written ever, at byte 0) is written by the producer only, `tail` (bytes read
ever, at byte 64) by the consumer only, each on its own cache line; each side has a
sleeping flag beside its counter. Positions only grow; `position % capacity` is the
place.

Python cannot issue a memory fence, so a sleeper may miss a wakeup (it sets its flag
and re-checks; the other side may have read the flag before the store was visible):
sleeps are therefore bounded (`POLL_MS`), which costs a missed wakeup a millisecond
and never a hang. That, and relying on x86's store order for the counters, is why
this ring is for measurement, not for the broker as it stands.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from multiprocessing import shared_memory

# Native formats: their packers copy the integer with one memcpy, which an aligned
# 8-byte field makes one store; the "=" formats write byte by byte, and the other
# process could read a counter half written.
# The header as 8-byte cells. A memoryview cast to "Q" stores an item with one
# memcpy, which an aligned 8-byte cell makes one store; struct.pack_into zero-fills
# its field before writing it, so the other process could read a counter as 0.
HEAD = 0  # cell: bytes written ever (the producer's)
CONSUMER_SLEEPING = 1  # cell: the consumer sleeps on wake_consumer
TAIL = 8  # cell, at byte 64 (its own cache line): bytes read ever (the consumer's)
PRODUCER_SLEEPING = 9  # cell: the producer sleeps on wake_producer
HEADER_SIZE = 128
#: longest sleep before a side looks again without a wakeup
POLL_MS = 1


class Ring:
    """Both ends of one ring. Make it in the parent (`Ring.create`), fork, and use
    `write` in one process and `read` in the other; `close` in each, `unlink` once."""

    def __init__(self, shm: shared_memory.SharedMemory, capacity: int, wake_consumer: int,
                 wake_producer: int) -> None:  # fmt: skip
        self.shm = shm
        self.capacity = capacity
        self.cells = shm.buf[:HEADER_SIZE].cast("Q")
        self.data = shm.buf[HEADER_SIZE : HEADER_SIZE + capacity]
        self.wake_consumer = wake_consumer  # eventfd: data was written
        self.wake_producer = wake_producer  # eventfd: room was made
        self.sleeps = 0  # times this process slept on an eventfd
        self.wakeups = 0  # eventfd writes this process made

    @classmethod
    def create(cls, capacity: int = 1 << 20) -> Ring:
        shm = shared_memory.SharedMemory(create=True, size=HEADER_SIZE + capacity)
        shm.buf[:HEADER_SIZE] = bytes(HEADER_SIZE)
        return cls(shm, capacity, os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK))

    def _sleep(self, flag: int, fd: int, ready: Callable[[], bool]) -> None:
        """Sleep on `fd` until `ready()` (checked again after raising the flag)."""
        cells = self.cells
        cells[flag] = 1
        try:
            if ready():
                return
            self.sleeps += 1
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(POLL_MS)
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass
        finally:
            cells[flag] = 0

    def _wake(self, flag: int, fd: int) -> None:
        if self.cells[flag]:
            self.wakeups += 1
            os.eventfd_write(fd, 1)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Copy all of `data` into the ring, waiting for room as the consumer reads."""
        cap = self.capacity
        cells = self.cells
        view = memoryview(data)
        sent = 0
        total = len(view)
        head = cells[HEAD]
        while sent < total:
            free = cap - (head - cells[TAIL])
            if not free:
                self._sleep(
                    PRODUCER_SLEEPING,
                    self.wake_producer,
                    lambda h=head: cap - (h - cells[TAIL]) > 0,
                )
                continue
            n = min(free, total - sent)
            at = head % cap
            first = min(n, cap - at)
            self.data[at : at + first] = view[sent : sent + first]
            if first < n:
                self.data[: n - first] = view[sent + first : sent + n]
            sent += n
            head += n
            cells[HEAD] = head  # published after the bytes (x86 keeps stores in order)
            self._wake(CONSUMER_SLEEPING, self.wake_consumer)

    def read(self) -> bytes:
        """Everything written and not yet read (waiting until there is some)."""
        cap = self.capacity
        cells = self.cells
        tail = cells[TAIL]
        while True:
            avail = cells[HEAD] - tail
            if avail:
                break
            self._sleep(CONSUMER_SLEEPING, self.wake_consumer, lambda: cells[HEAD] != tail)
        at = tail % cap
        first = min(avail, cap - at)
        out = bytes(self.data[at : at + first])
        if first < avail:
            out += bytes(self.data[: avail - first])
        cells[TAIL] = tail + avail
        self._wake(PRODUCER_SLEEPING, self.wake_producer)
        return out

    def close(self) -> None:
        self.data.release()
        self.cells.release()
        self.shm.close()
        for fd in (self.wake_consumer, self.wake_producer):
            try:
                os.close(fd)
            except OSError:
                pass

    def unlink(self) -> None:
        self.shm.unlink()
