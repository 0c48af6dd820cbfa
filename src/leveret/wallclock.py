"""The broker's wall clock: what it reads where a time is kept on disk or compared
with one, so that it must mean the same after a restart or on another node.

Those are a stream record's and segment's timestamp, a stream's `max-age`
retention and `x-stream-offset` intervals, a delayed message's due time, the
deduplication journal's expiry and the `time` of an `x-death` entry. Everything
that only measures how long something took, or waits (leases, timeouts, message
TTL, `x-expires`, consumer timeouts), reads `time.monotonic()` instead, which no
wall-clock jump moves.

A test hook jumps this clock for one node (tests/partitions' clock-jump nemesis),
as the machine's own clock cannot be jumped for one process and libfaketime breaks
asyncio's sleeps: while `LEVERET_TEST_CLOCK_FILE` names a file, its content (a
number of seconds, maybe negative or fractional) is added to every reading. The
file is read again when it changes (inode, modification time or size), looked at no more
than every 50 ms, so a jump takes effect within 50 ms. Unset (always, outside
tests), `time` and `time_ns` are `time.time` and `time.time_ns` themselves: the
hook costs nothing.
"""

from __future__ import annotations

import datetime
import os
import time as _time

CLOCK_FILE_ENV = "LEVERET_TEST_CLOCK_FILE"
_RECHECK_S = 0.05


class _OffsetClock:
    """time.time() plus the offset written in `path` (0 while it is missing or unreadable)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset_ns = 0
        self._stamp: tuple[int, int, int] | None = None
        self._checked = -1.0

    def _offset(self) -> int:
        now = _time.monotonic()
        if now - self._checked >= _RECHECK_S:
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError:
                stamp = None
            if stamp != self._stamp:
                self._stamp = stamp
                self.offset_ns = self._read() if stamp is not None else 0
        return self.offset_ns

    def _read(self) -> int:
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read().strip()
            return int(float(text or 0) * 1e9)
        except (OSError, ValueError):
            return self.offset_ns  # half written: keep the last one until it is whole

    def time(self) -> float:
        return (_time.time_ns() + self._offset()) / 1e9

    def time_ns(self) -> int:
        return _time.time_ns() + self._offset()


_flag = os.environ.get(CLOCK_FILE_ENV)
if _flag:
    _clock = _OffsetClock(_flag)
    time = _clock.time
    time_ns = _clock.time_ns
else:
    time = _time.time
    time_ns = _time.time_ns


def now_utc() -> datetime.datetime:
    """This clock as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(time(), datetime.UTC)
