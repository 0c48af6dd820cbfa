"""The stream log's persisted sparse index (`<first>.idx`): start-up reads it instead
of the segments, and a damaged or missing index never changes what is read.

Real files in a temporary directory; the log is used without an event loop, so
every append is written at once.
"""

from __future__ import annotations

import os

import pytest

from leveret.store import stream_log
from leveret.store.stream_log import INDEX_EVERY, StreamLog

N = 3 * INDEX_EVERY + 17


def _fill(directory, n=N, **kwargs) -> StreamLog:
    log = StreamLog(str(directory), **kwargs)
    for i in range(n):
        log.append(1_000 + i, b"\x00\x01q", b"h%d" % i, b"body-%d" % i)
    log.close()
    return log


def _read_all(log: StreamLog) -> list[tuple[int, int, bytes]]:
    reader = log.reader(log.first)
    out = [(r.offset, r.timestamp, r.body) for r in reader.read(10 * N)]
    reader.close()
    return out


EXPECTED = [(i, 1_000 + i, b"body-%d" % i) for i in range(N)]


def _idx_files(directory) -> list[str]:
    return sorted(str(directory / n) for n in os.listdir(directory) if n.endswith(".idx"))


def test_index_is_written_and_start_up_scans_only_the_tail(tmp_path, monkeypatch):
    _fill(tmp_path)
    (idx,) = _idx_files(tmp_path)
    assert os.path.getsize(idx) == 4 * 24  # one entry per INDEX_EVERY records
    scanned = []
    real_scan = StreamLog._scan

    def counting_scan(self, seg, pos, size):
        before = seg.count
        good = real_scan(self, seg, pos, size)
        scanned.append(seg.count - before)
        return good

    monkeypatch.setattr(StreamLog, "_scan", counting_scan)
    log = StreamLog(str(tmp_path))
    assert scanned == [17]  # the records after the last entry, not all N
    assert (log.first, log.next) == (0, N)
    assert log.first_timestamp == 1_000 and log.last_timestamp == 1_000 + N - 1
    assert _read_all(log) == EXPECTED
    assert log.offset_for_timestamp(1_000 + 300) == 300
    log.close()


@pytest.mark.parametrize(
    "damage",
    ["missing", "garbage", "torn entry", "points past the end", "wrong offsets"],
)
def test_a_damaged_index_is_rebuilt_and_reads_stay_right(tmp_path, damage):
    _fill(tmp_path)
    (idx,) = _idx_files(tmp_path)
    raw = open(idx, "rb").read()
    if damage == "missing":
        os.unlink(idx)
    elif damage == "garbage":
        open(idx, "wb").write(os.urandom(len(raw)))
    elif damage == "torn entry":
        open(idx, "wb").write(raw[:-10])
    elif damage == "points past the end":
        open(idx, "wb").write(raw + stream_log._IDX.pack(4 * INDEX_EVERY, 10**9, 0))
    else:
        open(idx, "wb").write(raw[:24] + raw[48:])  # entry 1 missing: offsets out of step
    log = StreamLog(str(tmp_path))
    assert (log.first, log.next) == (0, N)
    assert _read_all(log) == EXPECTED
    log.close()
    assert open(idx, "rb").read() == raw  # rewritten to the right entries


def test_index_entry_beyond_a_cut_segment_is_dropped(tmp_path):
    """A crash can leave index entries whose records never reached the file."""
    _fill(tmp_path)
    (seg,) = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".seg")]
    (idx,) = _idx_files(tmp_path)
    entries = open(idx, "rb").read()
    third = stream_log._IDX.unpack_from(entries, 3 * 24)[1]  # position of record 768
    with open(seg, "r+b") as f:
        f.truncate(third + 5)  # record 768 torn: its entry points at half a record
    log = StreamLog(str(tmp_path))
    assert log.next == 3 * INDEX_EVERY
    assert _read_all(log) == EXPECTED[: 3 * INDEX_EVERY]
    log.append(5, b"\x00\x01q", b"h", b"after")  # appends where the whole records end
    log.close()
    log = StreamLog(str(tmp_path))
    assert log.next == 3 * INDEX_EVERY + 1
    assert _read_all(log)[-1] == (3 * INDEX_EVERY, 5, b"after")
    log.close()


def test_every_segment_has_its_index_and_retention_removes_both(tmp_path):
    _fill(tmp_path, n=2000, max_segment_bytes=8192)
    segs = sorted(n for n in os.listdir(tmp_path) if n.endswith(".seg"))
    assert len(segs) > 5
    assert [n[:-4] for n in segs] == [
        n[:-4] for n in sorted(os.listdir(tmp_path)) if n.endswith(".idx")
    ]
    log = StreamLog(str(tmp_path), max_segment_bytes=8192, max_bytes=20_000)
    assert log.next == 2000
    log.apply_retention(0)
    left = sorted(os.listdir(tmp_path))
    assert len([n for n in left if n.endswith(".seg")]) < len(segs)
    assert [n[:-4] for n in left if n.endswith(".seg")] == [
        n[:-4] for n in left if n.endswith(".idx")
    ]
    got = _read_all(log)
    assert got[0][0] == log.first and got[-1][0] == 1999
    log.close()
