"""A delayed exchange's pending messages by due time, as compact positions.

A message waiting in a delayed exchange is a record in the segment log; in RAM it
is only its due time (ms since the epoch), its record's place (segment << 32 |
offset) and its size, in three parallel arrays: 20 bytes a message and no Python
object, so that millions can wait (a paged tail, `paged_index`, is the same idea
in publish order).

The arrays are cut into *chunks* of at most 2 x CHUNK entries, each sorted by
due time, the chunks in order, with each chunk's last due time in `lasts` for a
bisection (sortedcontainers' layout, with arrays for lists). So

- inserting is a bisection and an `array.insert` (a memmove of at most a chunk;
  with one delay for every message, each insert is an append to the last chunk);
- the messages due come off the front of the first chunk;
- compaction finds a record by its due time (which it reads from the record)
  and place, and moves it in place (`relocate`).

Messages with the same due time stay in the order they came in.

The top bit of a size marks a transient record (not fsynced, ignored by
recovery): it gets no ACK when it leaves.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any

CHUNK = 4096  # a chunk splits in two when it passes 2 x CHUNK entries
TRANSIENT_BIT = 0x80000000


def position(seq: int, off: int) -> int:
    return seq << 32 | off


class Chunk:
    __slots__ = ("dues", "poss", "sizes")

    def __init__(self, dues: array | None = None, poss: array | None = None, sizes=None) -> None:
        self.dues = dues if dues is not None else array("q")
        self.poss = poss if poss is not None else array("Q")
        self.sizes = sizes if sizes is not None else array("I")


class DelayIndex:
    """One delayed exchange's pending messages, earliest due first (see module doc)."""

    __slots__ = ("qid", "_chunks", "_lasts", "n")

    def __init__(self, qid: int) -> None:
        self.qid = qid  # the store's id for the exchange's records
        self._chunks: list[Chunk] = []
        self._lasts: list[int] = []  # each chunk's last (greatest) due time
        self.n = 0

    def __len__(self) -> int:
        return self.n

    # ---- filling ---------------------------------------------------------------------

    def insert(self, due: int, pos: int, size: int) -> None:
        """A message due at `due` whose record is at `pos`, `size` bytes (| TRANSIENT_BIT)."""
        chunks = self._chunks
        lasts = self._lasts
        self.n += 1
        if not chunks:
            chunks.append(Chunk(array("q", (due,)), array("Q", (pos,)), array("I", (size,))))
            lasts.append(due)
            return
        k = bisect_right(lasts, due)
        if k == len(chunks):
            # Later than everything (the common case: one delay for all): append.
            k -= 1
            chunk = chunks[k]
            chunk.dues.append(due)
            chunk.poss.append(pos)
            chunk.sizes.append(size)
            lasts[k] = due
        else:
            chunk = chunks[k]
            i = bisect_right(chunk.dues, due)
            chunk.dues.insert(i, due)
            chunk.poss.insert(i, pos)
            chunk.sizes.insert(i, size)
        if len(chunk.dues) > 2 * CHUNK:
            self._split(k)

    def _split(self, k: int) -> None:
        chunk = self._chunks[k]
        right = Chunk(chunk.dues[CHUNK:], chunk.poss[CHUNK:], chunk.sizes[CHUNK:])
        del chunk.dues[CHUNK:]
        del chunk.poss[CHUNK:]
        del chunk.sizes[CHUNK:]
        self._chunks.insert(k + 1, right)
        self._lasts[k] = chunk.dues[-1]
        self._lasts.insert(k + 1, right.dues[-1])

    @classmethod
    def build(cls, qid: int, dues: array, poss: array, sizes: array, mids: array) -> DelayIndex:
        """An index of these messages: sorted by due time, and equal due times by
        message id (the order they came in)."""
        index = cls(qid)
        n = len(dues)
        if not n:
            return index
        order: Any = range(n)
        if any(mids[i] > mids[i + 1] for i in range(n - 1)):  # compaction copies
            order = sorted(order, key=mids.__getitem__)
        order = sorted(order, key=dues.__getitem__)  # stable: ties stay in id order
        for start in range(0, n, CHUNK):
            part = order[start : start + CHUNK]
            chunk = Chunk(
                array("q", [dues[i] for i in part]),
                array("Q", [poss[i] for i in part]),
                array("I", [sizes[i] for i in part]),
            )
            index._chunks.append(chunk)
            index._lasts.append(chunk.dues[-1])
        index.n = n
        return index

    # ---- taking ----------------------------------------------------------------------

    def first_due(self) -> int | None:
        return self._chunks[0].dues[0] if self._chunks else None

    def pop_due(self, now: int, limit: int) -> tuple[array, array, array]:
        """Up to `limit` messages due at or before `now`, earliest first, taken out:
        (due times, positions, sizes)."""
        dues, poss, sizes = array("q"), array("Q"), array("I")
        chunks = self._chunks
        while chunks and limit > 0:
            chunk = chunks[0]
            cd = chunk.dues
            i = min(bisect_right(cd, now), limit)
            if not i:
                break
            dues.extend(cd[:i])
            poss.extend(chunk.poss[:i])
            sizes.extend(chunk.sizes[:i])
            limit -= i
            self.n -= i
            if i == len(cd):
                del chunks[0]
                del self._lasts[0]
            else:
                del cd[:i]
                del chunk.poss[:i]
                del chunk.sizes[:i]
        return dues, poss, sizes

    # ---- compaction and repair -------------------------------------------------------

    def _locate(self, due: int, pos: int) -> tuple[Chunk, int] | None:
        lasts = self._lasts
        k = bisect_left(lasts, due)
        while k < len(self._chunks):
            chunk = self._chunks[k]
            cd = chunk.dues
            i = bisect_left(cd, due)
            n = len(cd)
            while i < n and cd[i] == due:
                if chunk.poss[i] == pos:
                    return chunk, i
                i += 1
            if i < n:
                return None  # passed the due time
            k += 1
        return None

    def find(self, due: int, pos: int) -> int:
        """The size (with its transient bit) of the message due at `due` whose record
        is at `pos`, or -1 if no pending message is that record."""
        found = self._locate(due, pos)
        return -1 if found is None else found[0].sizes[found[1]]

    def relocate(self, due: int, pos: int, new_pos: int) -> bool:
        """Compaction copied the record at `pos` to `new_pos`."""
        found = self._locate(due, pos)
        if found is None:
            return False
        found[0].poss[found[1]] = new_pos
        return True

    def remove(self, due: int, pos: int) -> int:
        """Take one message out (its record is damaged); its size, or -1."""
        found = self._locate(due, pos)
        if found is None:
            return -1
        chunk, i = found
        size = chunk.sizes[i]
        del chunk.dues[i]
        del chunk.poss[i]
        del chunk.sizes[i]
        self.n -= 1
        k = self._chunks.index(chunk)
        if not chunk.dues:
            del self._chunks[k]
            del self._lasts[k]
        else:
            self._lasts[k] = chunk.dues[-1]
        return size

    def truncate(self, from_pos: int) -> list[tuple[int, int]]:
        """Forget messages whose records are at or after `from_pos` (their writes
        failed); returns their (position, size)s."""
        lost: list[tuple[int, int]] = []
        chunks: list[Chunk] = []
        for chunk in self._chunks:
            keep = [i for i, p in enumerate(chunk.poss) if p < from_pos]
            if len(keep) != len(chunk.poss):
                lost += [(p, chunk.sizes[i]) for i, p in enumerate(chunk.poss) if p >= from_pos]
                chunk = Chunk(
                    array("q", [chunk.dues[i] for i in keep]),
                    array("Q", [chunk.poss[i] for i in keep]),
                    array("I", [chunk.sizes[i] for i in keep]),
                )
            if chunk.dues:
                chunks.append(chunk)
        self._chunks = chunks
        self._lasts = [c.dues[-1] for c in chunks]
        self.n -= len(lost)
        return lost

    def clear(self) -> list[Chunk]:
        """Empty the index; returns its chunks (for the store to free their records)."""
        chunks = self._chunks
        self._chunks = []
        self._lasts = []
        self.n = 0
        return chunks

    # ---- reading it all --------------------------------------------------------------

    def chunks(self) -> Iterator[Chunk]:
        return iter(self._chunks)

    def entries(self) -> Iterator[tuple[int, int, int]]:
        """(due, position, size) of every pending message, earliest first."""
        for chunk in self._chunks:
            yield from zip(chunk.dues, chunk.poss, chunk.sizes, strict=True)

    def bytes_by_segment(self) -> dict[int, int]:
        """Record bytes per segment (sizes without the transient bit)."""
        out: dict[int, int] = {}
        for chunk in self._chunks:
            for pos, size in zip(chunk.poss, chunk.sizes, strict=True):
                seq = pos >> 32
                out[seq] = out.get(seq, 0) + (size & ~TRANSIENT_BIT)
        return out
