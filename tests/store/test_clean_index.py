"""The clean-shutdown index (store/clean_index.py): a clean stop saves the store's
positions, the next start reads them instead of scanning, and anything that does
not match the files on disk falls back to the scan."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from leveret.store import MessageStore
from leveret.store.segments import list_segments

Q = ("/", "q")
SEG = 64 * 1024


class Held:
    """A queue entry a paged tail holds in its place (the store sees `.location`)."""

    def __init__(self, location: object) -> None:
        self.location = location


def _open(path: Path) -> tuple[MessageStore, dict]:
    store = MessageStore(str(path), segment_size=SEG)
    return store, store.open_paged()


def _fill(path: Path) -> list[bytes]:
    """A queue with an unacked delivery, a head, a paged tail with a held entry and a
    transient record in it; returns the bodies a restart must give back, in order."""
    store, _ = _open(path)
    tail = store.paged_index(Q)
    unacked = store.publish(Q, b"h", b"unacked")
    store.mark_delivered(unacked)
    store.publish(Q, b"h", b"head")
    for i in range(3000):
        store.publish_paged(tail, b"h", b"tail-%d" % i)
    tail.hold(Held(store.publish(Q, b"h", b"held")), 4)
    store.publish_paged(tail, b"h", b"transient", transient=True)
    store.publish_paged(tail, b"h", b"last")
    store.close()
    return [b"unacked", b"head"] + [b"tail-%d" % i for i in range(3000)] + [b"held", b"last"]


def _read_all(store: MessageStore, rec: dict) -> list[tuple[bytes, bool]]:
    return [(body, loc.redelivered) for loc, _h, body in store.take_paged(rec[Q], 10**9)]


def test_a_clean_restart_reads_the_index_not_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = _fill(tmp_path)
    index = tmp_path / "msgs" / "clean.idx"
    assert index.exists()
    with caplog.at_level(logging.INFO, logger="leveret.store"):
        store, rec = _open(tmp_path)
    assert any("clean-shutdown index" in r.getMessage() for r in caplog.records)
    assert not index.exists(), "the index must go before anything new is written"
    got = _read_all(store, rec)
    assert [body for body, _r in got] == expected
    assert [r for _b, r in got] == [True] + [False] * (len(expected) - 1)
    # New ids stay above the old ones: order holds across the restart.
    store.publish(Q, b"h", b"new")
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()  # as after a crash: the scan agrees
    store, rec = _open(tmp_path)
    assert [body for body, _r in _read_all(store, rec)] == expected + [b"new"]
    store.close()


def _damage_index(path: Path) -> None:
    index = path / "msgs" / "clean.idx"
    data = bytearray(index.read_bytes())
    data[len(data) // 2] ^= 0xFF
    index.write_bytes(bytes(data))


def _grow_a_segment(path: Path) -> None:
    seg = path / "msgs" / f"{list_segments(str(path / 'msgs'))[0]:016d}.seg"
    with open(seg, "ab") as f:
        f.write(b"\0" * 16)


def _flip_a_byte_in_the_newest_segment(path: Path) -> None:
    seg = path / "msgs" / f"{list_segments(str(path / 'msgs'))[-1]:016d}.seg"
    with open(seg, "r+b") as f:
        f.seek(os.path.getsize(seg) - 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    ("damage", "warning"),
    [
        (_damage_index, "unusable (bad checksum)"),
        (_grow_a_segment, "does not match the segment files"),
        (_flip_a_byte_in_the_newest_segment, "does not match the segment files"),
    ],
    ids=["damaged-index", "segment-size", "newest-segment-content"],
)
def test_an_index_that_does_not_match_falls_back_to_the_scan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage, warning: str
) -> None:
    expected = _fill(tmp_path)
    damage(tmp_path)
    with caplog.at_level(logging.INFO, logger="leveret.store"):
        store, rec = _open(tmp_path)
    messages = [r.getMessage() for r in caplog.records]
    assert any(warning in m for m in messages), messages
    assert not any("from the clean-shutdown index" in m for m in messages), messages
    bodies = [body for body, _r in _read_all(store, rec)]
    if damage is _flip_a_byte_in_the_newest_segment:
        expected = expected[:-1]  # the scan cuts the damaged last record
    assert bodies == expected
    store.close()
