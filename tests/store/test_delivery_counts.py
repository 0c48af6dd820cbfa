"""Quorum queues' delivery counts in the message store (DELIVERED records with a count).

A count must never go backwards across a restart: after a clean stop (the
clean-shutdown index), after a crash (the scan, with or without segment
summaries) and after compaction moved the message's record.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from leveret.store import MessageStore
from leveret.store import clean_index as ci

Q = ("/", "qq")
SEG = 64 * 1024


def open_store(path: Path) -> tuple[MessageStore, dict]:
    store = MessageStore(str(path), segment_size=SEG)
    return store, store.open()


def crash_reopen(store: MessageStore, path: Path) -> tuple[MessageStore, dict]:
    """Reopen as after a crash: no clean-shutdown index, so the log is scanned."""
    store.close()
    os.unlink(path / "msgs" / "clean.idx")
    return open_store(path)


def counts(store: MessageStore, locs: list) -> list[int]:
    return [store.delivery_count(loc) for loc in locs]


def test_counts_survive_clean_and_crash_restarts(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    locs = [store.publish(Q, b"h", b"m%d" % i) for i in range(4)]
    store.mark_delivered(locs[1])  # delivered once: counts 1 after a restart
    store.mark_delivered(locs[2])
    store.note_count(locs[2], 2)
    store.note_count(locs[2], 5)
    store.note_count(locs[2], 3)  # lower: ignored
    store.note_count(locs[3], 7)
    assert counts(store, locs) == [0, 1, 5, 7]
    store.close()
    assert ci._parse((tmp_path / "msgs" / "clean.idx").read_bytes()).counts
    store, rec = open_store(tmp_path)
    assert counts(store, rec[Q]) == [0, 1, 5, 7]
    assert [loc.redelivered for loc in rec[Q]] == [False, True, True, True]
    store, rec = crash_reopen(store, tmp_path)
    assert counts(store, rec[Q]) == [0, 1, 5, 7]
    store.close()


def test_an_acked_message_leaves_no_count_behind(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    a, b = store.publish(Q, b"", b"a"), store.publish(Q, b"", b"b")
    store.note_count(a, 4)
    store.note_count(b, 2)
    store.ack(a)
    store, rec = crash_reopen(store, tmp_path)
    assert [loc.msg_id for loc in rec[Q]] == [b.msg_id]
    assert store._counts == {b.msg_id: (b.queue_id, 2)}
    store.close()
    # With none left, the clean-shutdown index stays in version 1 (older builds read it).
    store, rec = open_store(tmp_path)
    store.ack(rec[Q][0])
    store.close()
    data = (tmp_path / "msgs" / "clean.idx").read_bytes()
    assert struct.unpack_from("<H", data, 4)[0] == 1


def test_counts_follow_compaction(tmp_path: Path) -> None:
    """Long-lived counted messages among heavy traffic: compaction moves their records
    (and their DELIVERED records), and the counts come back after either restart."""
    store, _ = open_store(tmp_path)
    kept = []
    inflight = []
    total = i = 0
    while total < 10 * SEG:
        loc = store.publish(Q, b"hdr", b"%08d" % i + b"y" * 200)
        total += loc.size
        if i % 97 == 0:
            store.mark_delivered(loc)
            store.note_count(loc, 2 + len(kept))
            kept.append(loc)
        else:
            inflight.append(loc)
        if len(inflight) > 30:
            store.ack(inflight.pop(0))
        if i % 200 == 0:
            store.flush()
        i += 1
    assert min(loc.segment for loc in kept) > 1, "nothing was compacted"
    for loc in inflight:
        store.ack(loc)
    want = [2 + k for k in range(len(kept))]
    store, rec = crash_reopen(store, tmp_path)
    assert counts(store, rec[Q]) == want
    store.close()
    store, rec = open_store(tmp_path)
    assert counts(store, rec[Q]) == want
    store.close()


def test_dropped_tails_and_deleted_queues_forget_their_counts(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    for i in range(5):
        loc = store.publish(Q, b"", b"%d" % i)
        store.note_count(loc, i + 1)
    other = store.publish(("/", "other"), b"", b"o")
    store.note_count(other, 9)
    store.close()
    store = MessageStore(str(tmp_path), segment_size=SEG)
    tails = store.open_paged()  # every message a paged tail's position, as the broker has it
    store.drop_paged(tails[Q])
    assert store._counts == {other.msg_id: (other.queue_id, 9)}
    store.delete_queue(("/", "other"))
    assert store._counts == {}
    store, rec = crash_reopen(store, tmp_path)
    assert store._counts == {} and not rec.get(Q)
    store.close()
