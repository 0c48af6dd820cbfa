"""MessageStore against real files: recovery, ordering, acks, corruption, reclaiming disk."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import struct
from pathlib import Path

import pytest

from leveret.store import MessageStore, StoreFormatError
from leveret.store.segments import HEADER_SIZE, list_segments

Q = ("/", "q")
SEG = 64 * 1024


def open_store(path: Path, **kw: object) -> tuple[MessageStore, dict]:
    store = MessageStore(str(path), segment_size=kw.pop("segment_size", SEG), **kw)  # type: ignore[arg-type]
    return store, store.open()


def reopen(store: MessageStore, path: Path, **kw: object) -> tuple[MessageStore, dict]:
    store.close()
    return open_store(path, **kw)


def bodies(store: MessageStore, locs: list) -> list[bytes]:
    return [store.read_body(loc)[1] for loc in locs]


def seg_files(path: Path) -> list[int]:
    return list_segments(str(path / "msgs"))


def test_round_trip_and_recovery(tmp_path: Path) -> None:
    store, rec = open_store(tmp_path)
    assert rec == {}
    loc = store.publish(Q, b"props", b"hello")
    assert store.read_body(loc) == (b"props", b"hello")
    store, rec = reopen(store, tmp_path)
    [got] = rec[Q]
    assert got.msg_id == loc.msg_id and not got.redelivered
    assert store.read_body(got) == (b"props", b"hello")
    store.close()


def test_order_preserved_across_queues_and_segments(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    expected: dict[tuple[str, str], list[bytes]] = {("/", "a"): [], ("v", "b"): []}
    for i in range(3000):
        key = ("/", "a") if i % 3 else ("v", "b")
        body = b"m%05d" % i + b"x" * (i % 50)
        store.publish(key, b"", body)
        expected[key].append(body)
    assert len(seg_files(tmp_path)) > 1 or store.flush()
    store, rec = reopen(store, tmp_path)
    assert len(seg_files(tmp_path)) > 1
    for key, want in expected.items():
        assert bodies(store, rec[key]) == want
    store.close()


def test_ack_removes(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    locs = [store.publish(Q, b"", b"%d" % i) for i in range(10)]
    for loc in locs[::2]:
        store.ack(loc)
    store.ack(locs[0])  # twice: ignored
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[Q]) == [b"%d" % i for i in range(1, 10, 2)]
    store.close()


def test_redelivered_after_delivered(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    a = store.publish(Q, b"", b"a")
    store.publish(Q, b"", b"b")
    store.mark_delivered(a)
    store, rec = reopen(store, tmp_path)
    assert [loc.redelivered for loc in rec[Q]] == [True, False]
    store.close()


def test_torn_tail_is_cut_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, _ = open_store(tmp_path)
    locs = [store.publish(Q, b"h", b"body-%d" % i) for i in range(20)]
    store.close()
    last = locs[-1]
    path = tmp_path / "msgs" / f"{last.segment:016d}.seg"
    os.truncate(path, last.offset + last.size // 2)
    with caplog.at_level(logging.WARNING, logger="leveret.store"):
        store, rec = open_store(tmp_path)
    assert bodies(store, rec[Q]) == [b"body-%d" % i for i in range(19)]
    msg = "\n".join(r.getMessage() for r in caplog.records if r.name == "leveret.store")
    assert str(path) in msg and f"offset {last.offset}" in msg and "torn" in msg
    assert os.path.getsize(path) == last.offset  # truncated, so appends are clean
    store.publish(Q, b"h", b"after")
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[Q])[-2:] == [b"body-18", b"after"]
    store.close()


def test_corrupt_byte_detected_by_crc(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, _ = open_store(tmp_path)
    locs = [store.publish(Q, b"h", b"payload-%d" % i) for i in range(5)]
    store.close()
    last = locs[-1]
    path = tmp_path / "msgs" / f"{last.segment:016d}.seg"
    with open(path, "r+b") as f:
        f.seek(last.offset + last.size - 4)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="leveret.store"):
        store, rec = open_store(tmp_path)
    assert bodies(store, rec[Q]) == [b"payload-%d" % i for i in range(4)]
    assert any("CRC mismatch" in r.getMessage() for r in caplog.records)
    store.close()


def test_segment_deleted_when_all_acked(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path, segment_size=4096)
    locs = [store.publish(Q, b"", b"x" * 100) for i in range(200)]
    store.flush()
    assert len(seg_files(tmp_path)) >= 5
    for loc in locs:
        store.ack(loc)
    store.flush()
    assert len(seg_files(tmp_path)) <= 2
    store, rec = reopen(store, tmp_path, segment_size=4096)
    assert rec[Q] == []
    store.close()


def test_compaction_keeps_disk_bounded(tmp_path: Path) -> None:
    """Publish 10x the segment size while acking, keeping a few long-lived messages."""
    store, _ = open_store(tmp_path)
    keep: list[tuple[object, bytes]] = []
    inflight = []
    max_files = 0
    total = 0
    i = 0
    while total < 10 * SEG:
        body = b"%08d" % i + b"y" * 200
        loc = store.publish(Q, b"hdr", body)
        total += loc.size
        if i % 97 == 0:
            keep.append((loc, body))
            store.mark_delivered(loc)
        else:
            inflight.append(loc)
        if len(inflight) > 30:
            store.ack(inflight.pop(0))
        if i % 200 == 0:
            store.flush()
            max_files = max(max_files, len(seg_files(tmp_path)))
        i += 1
    store.flush()
    assert max_files <= 5, max_files
    assert len(seg_files(tmp_path)) <= 5
    for loc, body in keep:  # moved by compaction, still readable through the same object
        assert store.read_body(loc)[1] == body
    remaining = [b for _l, b in keep] + [store.read_body(loc)[1] for loc in inflight]
    store, rec = reopen(store, tmp_path)
    got = rec[Q]
    assert sorted(bodies(store, got)) == sorted(remaining)
    assert [loc.msg_id for loc in got] == sorted(loc.msg_id for loc in got)
    assert all(loc.redelivered for loc in got[: len(keep)] if loc.msg_id % 97 == 1)
    store.close()


def test_random_operations_match_model(tmp_path: Path) -> None:
    """Random publish/ack/deliver/purge/reopen on tiny segments never loses or resurrects."""
    rng = random.Random(1234)
    store, _ = open_store(tmp_path, segment_size=2048)
    model: dict[tuple[str, str], list[list]] = {
        ("/", "a"): [],
        ("/", "b"): [],
    }  # [loc, body, redelivered]
    for step in range(4000):
        key = rng.choice(list(model))
        q = model[key]
        op = rng.random()
        if op < 0.5:
            body = b"%d-" % step + b"z" * rng.randrange(0, 300)
            q.append([store.publish(key, b"h", body), body, False])
        elif op < 0.85 and q:
            entry = q.pop(rng.randrange(len(q)) if rng.random() < 0.3 else 0)
            store.ack(entry[0])
        elif op < 0.95 and q:
            entry = rng.choice(q)
            store.mark_delivered(entry[0])
            entry[2] = True
        elif op < 0.955:
            store.purge(key)
            q.clear()
        elif op < 0.97:
            store, rec = reopen(store, tmp_path, segment_size=2048)
            for k, entries in model.items():
                got = rec.get(k, [])
                assert bodies(store, got) == [e[1] for e in entries], step
                assert [loc.redelivered for loc in got] == [e[2] for e in entries], step
                for e, loc in zip(entries, got, strict=True):
                    e[0] = loc
    store.flush()
    assert len(seg_files(tmp_path)) < 40
    store.close()


def test_transient_records_are_readable_but_not_recovered(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    t = store.publish(Q, b"h", b"paged-out", transient=True)
    store.publish(Q, b"h", b"durable")
    assert store.read_body(t) == (b"h", b"paged-out")
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[Q]) == [b"durable"]
    store.close()


def test_purge_and_delete_queue(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    for i in range(5):
        store.publish(("/", "p"), b"", b"%d" % i)
        store.publish(("/", "d"), b"", b"%d" % i)
    assert store.purge(("/", "p")) == 5
    assert store.delete_queue(("/", "d")) == 5
    store.publish(("/", "p"), b"", b"new")
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[("/", "p")]) == [b"new"]
    assert ("/", "d") not in rec
    store.close()


def _queue_id_file_version(path: Path) -> int:
    with open(path / "msgs" / "queues.idx", "rb") as f:
        return struct.unpack("<4sHH", f.read(8))[1]


def test_priority_levels_are_queues_of_their_own(tmp_path: Path) -> None:
    """(vhost, name, level) keys: recovered apart, each in its order, and deleted with
    the queue. The queue id file turns version 2 with the first level key only."""
    store, _ = open_store(tmp_path)
    store.publish(("/", "plain"), b"", b"p")
    store.close()
    assert _queue_id_file_version(tmp_path) == 1
    store, _ = open_store(tmp_path)
    for i in range(30):
        store.publish(("/", "prio", i % 3), b"", b"%d" % i)
    assert _queue_id_file_version(tmp_path) == 2
    assert sorted(store.queue_keys("/", "prio")) == [("/", "prio", k) for k in range(3)]
    store, rec = reopen(store, tmp_path)
    for k in range(3):
        assert bodies(store, rec[("/", "prio", k)]) == [b"%d" % i for i in range(k, 30, 3)]
    assert bodies(store, rec[("/", "plain")]) == [b"p"]
    for key in store.queue_keys("/", "prio"):
        assert store.delete_queue(key) == 10
    store, rec = reopen(store, tmp_path)
    assert not [key for key in rec if key[:2] == ("/", "prio")]
    assert bodies(store, rec[("/", "plain")]) == [b"p"]
    store.close()


def test_queue_id_file_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    store.publish(Q, b"", b"x")
    store.close()
    with open(tmp_path / "msgs" / "queues.idx", "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<H", 7))
    store = MessageStore(str(tmp_path), segment_size=SEG)
    with pytest.raises(StoreFormatError, match=r"queue id file.*version 7.*expects version 3"):
        store.open()
    store.close()


def test_segment_format_version_mismatch(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    loc = store.publish(Q, b"", b"x")
    store.close()
    path = tmp_path / "msgs" / f"{loc.segment:016d}.seg"
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<H", 99))
    store = MessageStore(str(tmp_path), segment_size=SEG)
    with pytest.raises(StoreFormatError, match=r"version 99.*expects version 3"):
        store.open()
    store.close()


def test_write_failure_reports_error_and_keeps_durable_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        store, _ = open_store(tmp_path, loop=loop)
        results: dict[bytes, BaseException | None] = {}

        def publish(body: bytes) -> asyncio.Future:
            fut = loop.create_future()

            def done(exc: BaseException | None) -> None:
                results[body] = exc
                fut.set_result(exc)

            store.publish(Q, b"", body, done)
            return fut

        assert await publish(b"before") is None
        real = os.pwrite

        def full(fd: int, data: object, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        exc = await publish(b"during")
        assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        monkeypatch.setattr(os, "pwrite", real)
        assert await publish(b"after") is None
        store.close()

    asyncio.run(scenario())
    store, rec = open_store(tmp_path)
    assert bodies(store, rec[Q]) == [b"before", b"after"]
    store.close()


def test_ack_pending_across_a_write_failure_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ACK noted in the turn after a failed write is written once the log has moved
    to a fresh segment, and the next publish does not overwrite it."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        store, _ = open_store(tmp_path, loop=loop)

        def publish(body: bytes) -> tuple[object, asyncio.Future]:
            fut = loop.create_future()
            loc = store.publish(Q, b"", body, fut.set_result)
            return loc, fut

        first, fut = publish(b"acked")
        _second, fut2 = publish(b"kept")
        assert await fut is None and await fut2 is None
        real = os.pwrite

        def full(fd: int, data: object, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        _lost, fut = publish(b"during")
        assert isinstance(await fut, OSError)
        monkeypatch.setattr(os, "pwrite", real)
        store.ack(first)  # noted; written by the flush that the next append starts
        _after, fut = publish(b"after")
        assert await fut is None
        store.close()

    asyncio.run(scenario())
    (tmp_path / "msgs" / "clean.idx").unlink(missing_ok=True)  # the scan must see the ACK
    store, rec = open_store(tmp_path)
    assert bodies(store, rec[Q]) == [b"kept", b"after"]
    store.close()


def test_fsync_failure_reports_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from leveret.store import committer

    store, _ = open_store(tmp_path)
    store.publish(Q, b"", b"ok")
    store.flush()
    errors: list[BaseException | None] = []

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(committer, "_sync_file", eio)
    store.publish(Q, b"", b"lost", errors.append)
    store.flush()
    monkeypatch.undo()
    store.publish(Q, b"", b"ok2", errors.append)
    store.flush()
    assert isinstance(errors[0], OSError) and errors[0].errno == errno.EIO
    assert errors[1] is None
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[Q]) == [b"ok", b"ok2"]
    store.close()


def test_missing_header_in_last_segment(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    store.publish(Q, b"", b"x")
    store.close()
    # A crash right after creating the next segment leaves a file shorter than a header.
    (tmp_path / "msgs" / f"{seg_files(tmp_path)[-1] + 1:016d}.seg").write_bytes(b"LV")
    store, rec = open_store(tmp_path)
    assert bodies(store, rec[Q]) == [b"x"]
    store.publish(Q, b"", b"y")
    store, rec = reopen(store, tmp_path)
    assert bodies(store, rec[Q]) == [b"x", b"y"]
    assert os.path.getsize(tmp_path / "msgs" / f"{seg_files(tmp_path)[-1]:016d}.seg") > HEADER_SIZE
    store.close()


def _record_types(path: Path) -> list[int]:
    from leveret.store.segments import ScanResult, iter_records

    types = []
    for seq in list_segments(str(path / "msgs")):
        data = (path / "msgs" / f"{seq:016d}.seg").read_bytes()
        types += [rtype for _o, _e, rtype, _f in iter_records(data, HEADER_SIZE, ScanResult())]
    return types


def test_acks_and_deliveries_of_one_turn_are_one_record_each(tmp_path: Path) -> None:
    """ACK and DELIVERED records are batched per loop turn (REFS records); a scan
    after a crash applies them as it did the single records."""

    async def scenario() -> None:
        store, _ = open_store(tmp_path, loop=asyncio.get_running_loop())
        locs = [store.publish(Q, b"h", b"m%d" % i) for i in range(50)]
        await asyncio.sleep(0)
        for loc in locs[:30]:
            store.ack(loc)  # one turn: 30 ACKs ...
        for loc in locs[30:]:
            store.mark_delivered(loc)  # ... and 20 DELIVEREDs
        await asyncio.sleep(0)  # the turn ends: the batch goes to the writer
        store.flush()
        store.close()

    asyncio.run(scenario())
    types = _record_types(tmp_path)
    assert types.count(1) == 50 and types.count(5) == 2, types  # PUBLISH x 50, REFS x 2
    (tmp_path / "msgs" / "clean.idx").unlink()  # as after a crash: the scan reads them
    store, recovered = open_store(tmp_path)
    assert bodies(store, recovered[Q]) == [b"m%d" % i for i in range(30, 50)]
    assert all(loc.redelivered for loc in recovered[Q])
    store.close()


@pytest.mark.parametrize("version", [1, 2])
def test_older_segments_are_read_and_get_no_new_records(tmp_path: Path, version: int) -> None:
    """A data dir of an older format (version 1: no REFS records; version 2: no
    FANOUT records) is read; new records go to a new version-3 segment, so the old
    file stays clean of records its own build would not know."""
    store, _ = open_store(tmp_path)
    locs = [store.publish(Q, b"h", b"old%d" % i) for i in range(3)]
    store.ack(locs[0])
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()
    (old,) = list_segments(str(tmp_path / "msgs"))
    old_path = tmp_path / "msgs" / f"{old:016d}.seg"
    with open(old_path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<H", version))
    assert 5 not in _record_types(tmp_path)  # one ack: a plain ACK record, as version 1 had
    size = old_path.stat().st_size
    store, recovered = open_store(tmp_path)
    assert bodies(store, recovered[Q]) == [b"old1", b"old2"]
    store.ack(recovered[Q][0])
    store.publish(Q, b"h", b"new")
    store.flush()
    assert old_path.stat().st_size == size
    new = list_segments(str(tmp_path / "msgs"))[-1]
    assert new > old
    head = (tmp_path / "msgs" / f"{new:016d}.seg").read_bytes()[:6]
    assert struct.unpack("<H", head[4:6]) == (3,)
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()
    store, recovered = open_store(tmp_path)
    assert bodies(store, recovered[Q]) == [b"old2", b"new"]
    store.close()


def test_writing_pending_acks_during_a_read_does_not_compact_what_is_being_read(
    tmp_path: Path,
) -> None:
    """take_paged reads a segment; the read first flushes the ACKs noted so far, and
    writing them may roll the log. That must not start a compaction there: the
    positions being read are neither in the tail any more nor held yet, so a
    compaction would think them dead and delete their segment mid-read."""
    store = MessageStore(str(tmp_path), segment_size=1024)
    store.open()
    lg = store._log
    assert lg is not None
    tail = store.paged_index(Q)
    noise_q = ("/", "noise")
    store.publish_paged(tail, b"h", b"q1" * 10)
    store.publish_paged(tail, b"h", b"q2" * 10)
    first = lg.active
    noise = []
    while lg.active < first + 2:  # two more segments: the first leaves the grace window
        noise.append(store.publish(noise_q, b"h", b"n" * 100))  # ... at the next roll
    noise = [loc for loc in noise if loc.segment == first]
    free = 1024 - lg.segment_sizes()[lg.active]
    pad = free - 27 - 20  # leave 20 bytes: too few for the pending REFS record
    if pad > 0:
        store.publish(noise_q, b"h", b"p" * pad)
    for loc in noise:
        store.ack(loc)  # noted, not written: nothing is appended until the read
    assert store.stats()["live_bytes"] > 0 and first in lg.segment_sizes()
    items = store.take_paged(tail, 2)  # its read flushes the ACKs, which roll the log
    assert [body for _loc, _h, body in items] == [b"q1" * 10, b"q2" * 10]
    assert lg.active == first + 3
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()
    store, rec = open_store(tmp_path, segment_size=1024)
    assert bodies(store, rec[Q]) == [b"q1" * 10, b"q2" * 10]
    store.close()


def test_compaction_that_cannot_fit_does_not_reread_the_segment_at_every_ack(
    tmp_path: Path,
) -> None:
    """A segment holding few live messages but many batched ACK records (REFS) for
    segments that still exist cannot be compacted within the budget. It is read again
    only once it could fit (its ACK records' targets deleted), not at every ack of one
    of its messages: S9's drain spent 93% of its time re-reading 16 MB segments so."""
    from leveret.store.compaction import COMPACT_GRACE

    store = MessageStore(str(tmp_path), segment_size=64 * 1024)
    store.open_paged()
    log = store._log
    a, b, c = ("/", "a"), ("/", "b"), ("/", "c")
    a_locs = [store.publish(a, b"h", b"a" * 16) for _ in range(6000)]
    first = log.active
    while log.active == first:
        store.publish(c, b"h", b"c" * 1000)
    x = log.active
    # Segment x: b's messages, and the ACK records of every other message of a (24 kB
    # of message ids, more than the 16 kB a 64 kB segment may copy). a's segments stay
    # half live, so those records must be kept while they exist.
    b_locs = []
    for i in range(0, 6000, 2):
        store.ack(a_locs[i])
        if i % 20 == 0:
            b_locs.append(store.publish(b, b"h", b"b" * 100))
        if i % 200 == 0:
            store.read_body(b_locs[-1])  # a read flushes: the acks become REFS records
    store.read_body(b_locs[-1])
    in_x = [loc for loc in b_locs if loc.segment == x]
    assert len(in_x) > 200
    while log.active <= x + COMPACT_GRACE + 1:
        store.publish(c, b"h", b"c" * 1000)
    reads: list[int] = []
    read_segment = log.read_segment

    def counting(seq: int) -> bytes:
        reads.append(seq)
        return read_segment(seq)

    log.read_segment = counting  # type: ignore[method-assign]
    for loc in in_x:
        store.ack(loc)
    assert log.exists(x) and reads.count(x) == 1  # one fruitless look, not one per ack
    for loc in a_locs[1::2]:  # a's segments go, and with them what x had to keep
        store.ack(loc)
    assert not log.exists(x)
    # Nothing else was lost on the way (compaction moved what it copied).
    rest = [loc for loc in b_locs if loc not in in_x]
    assert [store.read_body(loc)[1] for loc in rest] == [b"b" * 100] * len(rest)
    store.close()
