"""A long queue's paged tail as compact positions: no object per message.

A message whose body is only on disk is kept as its record's place in the log:
the segment, the offset and the size. Consecutive messages of one queue sit in
the same segment at rising offsets, so the tail is a deque of *runs*: one
segment number and two `array('I')` columns (offset, size) per run, 8 bytes a
message. A per-run bytearray of flags (redelivered, transient) exists only for
runs that need one, and so does an `array('d')` of stamps: the moment a message
with a TTL expires (the queue's clock, opaque to the store), 8 bytes more a
message, for queues with TTLs only. The message id is not kept: it is in the
record, and is read back with the body when the message nears the head.

The tail may also hold, in their places, whole entries the queue could not page
(`hold`); they come back from `popleft` as they went in.

The store owns these indexes (one per queue) so that compaction can ask whether
a record is still queued (`find`) and move positions when it copies records
(`relocate`). Offsets rise within a run, so `find` is a bisection.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from itertools import compress
from typing import Any

REDELIVERED = 0x01  # a DELIVERED record exists: the message goes out redelivered
TRANSIENT = 0x02  # written only to page a body out; recovery ignores it


class Run:
    """Tail messages in one segment, at rising offsets; `start` skips those taken."""

    __slots__ = ("seq", "offs", "sizes", "flags", "stamps", "extras", "start")

    def __init__(
        self,
        seq: int,
        offs: array | None = None,
        sizes: array | None = None,
        flags: bytearray | None = None,
        stamps: array | None = None,
        extras: array | None = None,
    ) -> None:
        self.seq = seq
        self.offs = offs if offs is not None else array("I")
        self.sizes = sizes if sizes is not None else array("I")
        self.flags = flags  # None while every message's flags are 0
        self.stamps = stamps  # None while no message has a stamp (expiry time)
        # Exact tails only: each record's bytes beyond the fixed part that are not
        # body (routing, properties, a fan-out record's queue ids).
        self.extras = extras
        self.start = 0

    def __len__(self) -> int:
        return len(self.offs) - self.start

    def flag(self, i: int) -> int:
        return self.flags[i] if self.flags is not None else 0


class _Held:
    """An entry kept in the tail as it is, with the bytes it counts for."""

    __slots__ = ("entry", "size")

    def __init__(self, entry: Any, size: int) -> None:
        self.entry = entry
        self.size = size


class PagedIndex:
    """One queue's paged tail, oldest first. `n` counts positions and held entries;
    `nbytes` is what the positions' bodies count for: each record's size less
    `overhead` (its fixed part; routing and properties are still included).

    An *exact* tail (a queue with x-max-length-bytes, which counts body bytes as
    RabbitMQ does) also keeps each record's `extra` bytes (4 a message), so that
    its `nbytes` is the bodies' bytes exactly."""

    __slots__ = ("qid", "overhead", "exact", "_items", "_by_seq", "n", "nbytes")

    def __init__(self, qid: int, overhead: int = 0, exact: bool = False) -> None:
        self.qid = qid
        self.overhead = overhead
        self.exact = exact
        self._items: deque[Run | _Held] = deque()
        self._by_seq: dict[int, list[Run]] = {}
        self.n = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return self.n

    # ---- filling ---------------------------------------------------------------------

    def append(
        self, seq: int, off: int, size: int, flags: int = 0, stamp: float = 0.0, extra: int = 0
    ) -> None:
        """A message whose record is at (seq, off), `size` bytes long, joins the tail;
        `stamp` (0: none) comes back with it from `popleft`; `extra` (what of the
        record is neither the fixed part nor the body) counts only in exact tails."""
        items = self._items
        run = items[-1] if items else None
        if type(run) is not Run or run.seq != seq or (run.offs and off <= run.offs[-1]):
            run = Run(seq, extras=array("I") if self.exact else None)
            items.append(run)
            self._by_seq.setdefault(seq, []).append(run)
        if run.extras is not None:
            run.extras.append(extra)
            self.nbytes -= extra
        if flags:
            if run.flags is None:
                run.flags = bytearray(len(run.offs))
            run.flags.append(flags)
        elif run.flags is not None:
            run.flags.append(0)
        if stamp:
            if run.stamps is None:
                run.stamps = array("d", bytes(8 * len(run.offs)))
            run.stamps.append(stamp)
        elif run.stamps is not None:
            run.stamps.append(0.0)
        run.offs.append(off)
        run.sizes.append(size)
        self.n += 1
        self.nbytes += size - self.overhead

    def append_run(self, run: Run) -> None:
        """A whole run at once (recovery builds them from its scan)."""
        if not run:
            return
        self._items.append(run)
        self._by_seq.setdefault(run.seq, []).append(run)
        self.n += len(run)
        self.nbytes += sum(run.sizes) - self.overhead * len(run)
        if run.extras is not None:
            self.nbytes -= sum(run.extras)

    def hold(self, entry: Any, size: int) -> None:
        """Keep an entry the queue could not page in its place, behind the rest;
        it counts for `size` bytes."""
        self._items.append(_Held(entry, size))
        self.n += 1
        self.nbytes += size

    # ---- taking ----------------------------------------------------------------------

    def popleft(self, limit: int) -> list[Any]:
        """Up to `limit` messages from the front: a held entry as it is, and positions
        as (seq, offs, sizes, flags, stamps) slices, one per stretch of a run (flags
        and stamps None where the run has none)."""
        out: list[Any] = []
        items = self._items
        left = limit
        while left and items:
            item = items[0]
            if type(item) is _Held:
                items.popleft()
                out.append(item.entry)
                self.n -= 1
                self.nbytes -= item.size
                left -= 1
                continue
            a = item.start
            if a >= len(item.offs):  # emptied by truncate()
                items.popleft()
                self._forget(item)
                continue
            b = min(len(item.offs), a + left)
            sizes = item.sizes[a:b]
            flags = item.flags[a:b] if item.flags is not None else None
            stamps = item.stamps[a:b] if item.stamps is not None else None
            out.append((item.seq, item.offs[a:b], sizes, flags, stamps))
            taken = b - a
            self.n -= taken
            self.nbytes -= sum(sizes) - self.overhead * taken
            if item.extras is not None:
                self.nbytes += sum(item.extras[a:b])
            left -= taken
            if b == len(item.offs):
                items.popleft()
                self._forget(item)
            else:
                item.start = b
        return out

    def clear(self) -> tuple[list[Any], list[Run]]:
        """Empty the tail: (held entries, runs of positions) for the store to free."""
        held = [item.entry for item in self._items if type(item) is _Held]
        runs = [item for item in self._items if type(item) is Run and len(item)]
        self._items.clear()
        self._by_seq.clear()
        self.n = 0
        self.nbytes = 0
        return held, runs

    # ---- compaction ------------------------------------------------------------------

    def find(self, seq: int, off: int) -> int:
        """The flags of the queued message at (seq, off) plus 0x100, or -1 if none is."""
        for run in self._by_seq.get(seq, ()):
            offs = run.offs
            i = bisect_left(offs, off, run.start)
            if i < len(offs) and offs[i] == off:
                return 0x100 | run.flag(i)
        return -1

    def relocate(self, seq: int, moved: dict[int, tuple[int, int]]) -> None:
        """Compaction copied segment `seq`'s records: offset -> (new seq, new offset).

        Records are copied in file order, so a run's positions stay at rising
        offsets; a run splits where the copies crossed into a new segment.
        """
        runs = self._by_seq.pop(seq, None)
        if not runs:
            return
        items = self._items
        for run in runs:
            pieces: list[Run] = []
            cur: Run | None = None
            flags = run.flags
            stamps = run.stamps
            extras = run.extras
            for i in range(run.start, len(run.offs)):
                new_seq, new_off = moved[run.offs[i]]
                if cur is None or cur.seq != new_seq:
                    cur = Run(
                        new_seq,
                        flags=bytearray() if flags is not None else None,
                        stamps=array("d") if stamps is not None else None,
                        extras=array("I") if extras is not None else None,
                    )
                    pieces.append(cur)
                cur.offs.append(new_off)
                cur.sizes.append(run.sizes[i])
                if flags is not None:
                    cur.flags.append(flags[i])  # type: ignore[union-attr]
                if stamps is not None:
                    cur.stamps.append(stamps[i])  # type: ignore[union-attr]
                if extras is not None:
                    cur.extras.append(extras[i])  # type: ignore[union-attr]
            at = _index_of(items, run)
            del items[at]
            for k, piece in enumerate(pieces):
                items.insert(at + k, piece)
                self._by_seq.setdefault(piece.seq, []).append(piece)

    def truncate(self, seq: int, off: int) -> int:
        """Forget positions at or after (seq, off) (their writes failed); how many."""
        lost = 0
        for s in [s for s in self._by_seq if s >= seq]:
            for run in self._by_seq[s]:
                cut = bisect_left(run.offs, off, run.start) if s == seq else 0
                cut = max(cut, run.start)
                gone = len(run.offs) - cut
                if gone > 0:
                    self.nbytes -= sum(run.sizes[cut:]) - self.overhead * gone
                    del run.offs[cut:]
                    del run.sizes[cut:]
                    if run.flags is not None:
                        del run.flags[cut:]
                    if run.stamps is not None:
                        del run.stamps[cut:]
                    if run.extras is not None:
                        self.nbytes += sum(run.extras[cut:])
                        del run.extras[cut:]
                    lost += gone
        self.n -= lost
        return lost

    def make_exact(self, extras_of: Callable[[Run], array]) -> None:
        """Count bodies exactly from now on: `extras_of(run)` gives a run's extras
        (read from its records by the store) for every run that has none yet."""
        self.exact = True
        for item in self._items:
            if type(item) is Run and item.extras is None:
                item.extras = extras_of(item)
                self.nbytes -= sum(item.extras[item.start :])

    def runs(self) -> Iterator[Run]:
        return (item for item in self._items if type(item) is Run and len(item))

    def export(self) -> list[Any]:
        """The tail in order for the clean-shutdown index: held entries' locations
        (or nothing, for a held entry the store does not keep), and each run's
        remaining positions as (seq, offsets, sizes, flags) without TRANSIENT ones."""
        out: list[Any] = []
        for item in self._items:
            if type(item) is _Held:
                location = getattr(item.entry, "location", None)
                if location is not None and not location.transient:
                    out.append(location)
                continue
            if not len(item):
                continue
            a = item.start
            offs, sizes = item.offs[a:], item.sizes[a:]
            flags = item.flags[a:] if item.flags is not None else None
            if flags is not None and any(f & TRANSIENT for f in flags):
                keep = [not f & TRANSIENT for f in flags]
                offs = array("I", compress(offs, keep))
                sizes = array("I", compress(sizes, keep))
                flags = bytearray(compress(flags, keep))
                if not offs:
                    continue
            if flags is not None and not any(flags):
                flags = None
            out.append((item.seq, offs, sizes, flags))
        return out

    def _forget(self, run: Run) -> None:
        runs = self._by_seq.get(run.seq)
        if runs is not None:
            runs[:] = [r for r in runs if r is not run]
            if not runs:
                del self._by_seq[run.seq]


def _index_of(items: deque[Any], run: Run) -> int:
    for i, item in enumerate(items):
        if item is run:
            return i
    raise ValueError("run not in the tail")


def live_run(seq: int, offs: array, sizes: array, flags: bytearray | None, dead: int) -> Run:
    """A run from recovery's columns, without the entries whose size was zeroed (acked)."""
    if dead:
        keep = list(map(bool, sizes))
        offs = array("I", compress(offs, keep))
        flags = bytearray(compress(flags, keep)) if flags is not None else None
        sizes = array("I", compress(sizes, keep))
    if flags is not None and not any(flags):
        flags = None
    return Run(seq, offs, sizes, flags)
