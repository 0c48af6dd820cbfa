"""Delay queues (store.delay_queue, store.delay_index): delayed exchanges' pending
messages in the segment store, ordered by due time.

A random workload on tiny segments (so the log rolls, and compaction copies
delay records among other queues' traffic) is checked against a model after
every kind of restart: a clean stop (the clean-shutdown index), a stop without
it (the scan, from segment summaries), and the same without summaries (every
segment walked). The two crash recoveries of one data dir must agree exactly.
"""

from __future__ import annotations

import random
import shutil
import time
from array import array
from pathlib import Path

import pytest

from leveret.store import MessageStore
from leveret.store import delay_index as di
from leveret.store.delay_index import TRANSIENT_BIT, DelayIndex
from leveret.store.delay_queue import DUE, DUE_AT, is_delay_key
from leveret.store.records import PUB_FIXED, PUB_HEAD
from leveret.store.segments import PREFIX_SIZE, list_segments

SEG = 2048
FAR = time.time_ns() // 1_000_000 + 86_400_000  # due times a day ahead
NAMES = ("dx1", "dx2")
CHURN = ("/", "churn")


# ---- the index on its own ----------------------------------------------------------------


@pytest.mark.parametrize("chunk", [2, 3, 4096])
def test_index_keeps_due_order_and_arrival_order_for_ties(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(di, "CHUNK", chunk)
    rng = random.Random(chunk)
    index = DelayIndex(1)
    model: list[tuple[int, int, int]] = []  # (due, arrival, pos)
    for n in range(3000):
        op = rng.random()
        if op < 0.6:
            due = rng.randrange(0, 500) if rng.random() < 0.7 else 10_000 + n  # ties, appends
            index.insert(due, n << 32 | n, n % 100)
            model.append((due, n, n << 32 | n))
        elif op < 0.75 and model:
            now = rng.randrange(0, 600)
            limit = rng.choice([1, 7, 1000])
            dues, poss, sizes = index.pop_due(now, limit)
            model.sort()
            expect = [m for m in model if m[0] <= now][:limit]
            assert list(zip(dues, poss, strict=True)) == [(m[0], m[2]) for m in expect]
            assert list(sizes) == [(m[2] & 0xFFFFFFFF) % 100 for m in expect]
            for m in expect:
                model.remove(m)
        elif op < 0.85 and model:
            due, arrival, pos = rng.choice(model)
            assert index.find(due, pos) == arrival % 100
            assert index.find(due, pos + (1 << 40)) == -1
            new = pos + (1 << 50)
            assert index.relocate(due, pos, new)
            model[model.index((due, arrival, pos))] = (due, arrival, new)
        elif op < 0.9 and model:
            due, arrival, pos = rng.choice(model)
            assert index.remove(due, pos) == arrival % 100
            model.remove((due, arrival, pos))
        assert len(index) == len(model)
        model.sort()
        assert index.first_due() == (model[0][0] if model else None)
    assert [(d, p) for d, p, _s in index.entries()] == [(m[0], m[2]) for m in sorted(model)]
    lost = index.truncate(1500 << 32)
    assert sorted(p for p, _s in lost) == sorted(m[2] for m in model if m[2] >= 1500 << 32)
    assert [(d, p) for d, p, _s in index.entries()] == [
        (m[0], m[2]) for m in sorted(model) if m[2] < 1500 << 32
    ]


def test_index_build_sorts_by_due_then_message_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(di, "CHUNK", 4)
    rng = random.Random(7)
    rows = [(rng.randrange(20), mid, mid << 32, mid) for mid in rng.sample(range(1000), 100)]
    index = DelayIndex.build(
        3,
        array("q", [r[0] for r in rows]),
        array("Q", [r[2] for r in rows]),
        array("I", [r[3] for r in rows]),
        array("Q", [r[1] for r in rows]),
    )
    assert [(d, p) for d, p, _s in index.entries()] == sorted((r[0], r[2]) for r in rows)
    assert len(index) == 100


# ---- the store ---------------------------------------------------------------------------


def _open(path: Path) -> tuple[MessageStore, dict]:
    store = MessageStore(str(path), segment_size=SEG)
    recovered = store.open_paged()
    return store, recovered


def _pending(store: MessageStore, index: DelayIndex) -> list[tuple[int, bytes, bool]]:
    """(due, body, transient) of every pending message, in order, read without taking."""
    out = []
    for due, pos, size in index.entries():
        length = size & ~TRANSIENT_BIT & 0xFFFFFFFF
        record = store._log.read(pos >> 32, pos & 0xFFFFFFFF, length)  # type: ignore[union-attr]
        hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)[4]
        assert DUE.unpack_from(record, DUE_AT)[0] == due
        out.append((due, bytes(record[PUB_HEAD + hlen :]), bool(size & TRANSIENT_BIT)))
    return out


def _crash(store: MessageStore) -> None:
    """Stop as a crash leaves the data dir: everything written, no clean-shutdown index."""
    store.flush()
    store._log.committer.close()  # type: ignore[union-attr]
    store._log.close_readers()  # type: ignore[union-attr]
    store._queues.close()


def _recovered_delays(path: Path) -> tuple[dict, dict]:
    """Recover `path` and stop before anything is reclaimed: each delay queue's
    (due, position, size) rows, and the live bytes."""
    store = MessageStore(str(path), segment_size=SEG)
    store.prepare()
    recovered = store.recover()
    rows = {key: list(index.entries()) for key, index in recovered.items() if is_delay_key(key)}
    live = {s: n for s, n in store._live.items()}
    store._log.committer.close()  # type: ignore[union-attr]
    return rows, live


class Model:
    def __init__(self) -> None:
        self.pending: dict[str, list[tuple[int, int, bytes, bool]]] = {n: [] for n in NAMES}
        self.n = 0

    def add(self, name: str, due: int, body: bytes, transient: bool) -> None:
        self.n += 1
        self.pending[name].append((due, self.n, body, transient))

    def expect(self, name: str) -> list[tuple[int, bytes, bool]]:
        return [(d, b, t) for d, _n, b, t in sorted(self.pending[name])]

    def restarted(self) -> None:
        for name in NAMES:
            self.pending[name] = [p for p in self.pending[name] if not p[3]]


def _check(store: MessageStore, indexes: dict[str, DelayIndex], model: Model, step: int) -> None:
    for name in NAMES:
        assert _pending(store, indexes[name]) == model.expect(name), (name, step)


def _indexes(store: MessageStore) -> dict[str, DelayIndex]:
    return {name: store.delays.index("/", name) for name in NAMES}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_workload_survives_every_kind_of_restart(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "data"
    store, _ = _open(path)
    indexes = _indexes(store)
    churn = store.paged_index(CHURN)
    held = []
    model = Model()
    clock = FAR  # virtual ms: far enough ahead that compaction never holds back
    for step in range(2500):
        op = rng.random()
        name = rng.choice(NAMES)
        if op < 0.35:
            due = clock + rng.choice([rng.randrange(-5, 300), 50, 50])
            body = b"%d:" % step + b"d" * rng.randrange(0, 150)
            transient = rng.random() < 0.15
            store.delays.add(indexes[name], due, b"routing", body, None, transient)
            model.add(name, due, body, transient)
        elif op < 0.55:
            # Other queues' traffic rolls the log and leaves segments to compact.
            body = b"c" * rng.randrange(0, 200)
            if rng.random() < 0.5:
                store.publish_paged(churn, b"h", body)
            else:
                held.append(store.publish(CHURN, b"h", body))
            if len(held) > 5:
                store.ack(held.pop(rng.randrange(len(held))))
            if len(churn) > 5:
                for loc, _h, _b in store.take_paged(churn, len(churn) - 2):
                    store.ack(loc)
        elif op < 0.8:
            clock += rng.randrange(0, 30)
            limit = rng.choice([1, 3, 50])
            with store.delays.paused():
                taken = store.delays.take(indexes[name], clock, limit)
                expect = [p for p in sorted(model.pending[name]) if p[0] <= clock][:limit]
                assert [(t[0], t[2]) for t in taken] == [(p[0], p[2]) for p in expect], step
                assert all(t[1] == b"routing" for t in taken)
                for t, p in zip(taken, expect, strict=True):
                    store.delays.ack(indexes[name], t[3])
                    model.pending[name].remove(p)
        elif op < 0.81:
            store.delays.drop("/", name)  # the exchange was deleted
            model.pending[name].clear()
            indexes[name] = store.delays.index("/", name)
        elif op < 0.84:
            kind = rng.choice(["clean", "crash", "walk"])
            if kind == "clean":
                store.close()
            else:
                _crash(store)
                if kind == "walk":
                    for f in (path / "msgs").glob("*.sum"):
                        f.unlink()
            model.restarted()
            store, recovered = _open(path)
            indexes = _indexes(store)
            for name_ in NAMES:
                key = ("/", name_, "delayed")
                if key in recovered:
                    assert recovered[key] is indexes[name_]
            churn = store.paged_index(CHURN)
            held = [loc for loc, _h, _b in store.take_paged(churn, len(churn))]
            _check(store, indexes, model, step)
        if step % 100 == 0:
            _check(store, indexes, model, step)
    _check(store, indexes, model, -1)
    # Everything taken and acked: the disk is given back.
    with store.delays.paused():
        for name in NAMES:
            for t in store.delays.take(indexes[name], FAR << 1, 1 << 30):
                store.delays.ack(indexes[name], t[3])
    for loc in held:
        store.ack(loc)
    for loc, _h, _b in store.take_paged(churn, len(churn)):
        store.ack(loc)
    for _ in range(3):
        store.publish(CHURN, b"", b"x" * 1500)  # roll past the last segments
    store.flush()
    assert len(list_segments(str(path / "msgs"))) <= 6
    assert store.stats()["messages"] == 3
    store.close()


@pytest.mark.parametrize("seed", [11, 12])
def test_scan_with_summaries_equals_walking_every_segment(tmp_path: Path, seed: int) -> None:
    """A crash leaves one data dir; recovered from its summaries and by walking it,
    the delay queues and the live bytes are the same."""
    rng = random.Random(seed)
    a = tmp_path / "a"
    store, _ = _open(a)
    indexes = _indexes(store)
    churn = store.paged_index(CHURN)
    clock = FAR
    for step in range(3000):
        name = rng.choice(NAMES)
        op = rng.random()
        if op < 0.4:
            store.delays.add(
                indexes[name],
                clock + rng.randrange(0, 3000),
                b"r",
                b"%d" % step * rng.randrange(1, 20),
                None,
                rng.random() < 0.1,
            )
        elif op < 0.6:
            store.publish_paged(churn, b"h", b"c" * rng.randrange(0, 200))
            if len(churn) > 3:
                for loc, _h, _b in store.take_paged(churn, 2):
                    store.ack(loc)
        else:
            clock += rng.randrange(0, 20)
            with store.delays.paused():
                for t in store.delays.take(indexes[name], clock, rng.choice([1, 10])):
                    store.delays.ack(indexes[name], t[3])
    _crash(store)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for f in (b / "msgs").glob("*.sum"):
        f.unlink()
    rows_a, live_a = _recovered_delays(a)
    rows_b, live_b = _recovered_delays(b)
    assert rows_a == rows_b
    assert live_a == live_b
    assert sum(len(r) for r in rows_a.values()) > 50


def test_large_records_recover_their_due_times_without_reading_bodies(tmp_path: Path) -> None:
    store = MessageStore(str(tmp_path), segment_size=1 << 20)
    store.open_paged()
    index = store.delays.index("/", "big")
    bodies = {}
    for k in range(6):
        body = bytes([65 + k]) * (70_000 if k % 2 else 10)
        due = 5_000 - k * 10
        store.delays.add(index, due, b"r", body, None, False)
        bodies[due] = body
    store.close()
    store = MessageStore(str(tmp_path), segment_size=1 << 20)
    recovered = store.open_paged()
    index = recovered[("/", "big", "delayed")]
    assert [d for d, _p, _s in index.entries()] == sorted(bodies)
    with store.delays.paused():
        taken = store.delays.take(index, 10_000, 100)
        for t in taken:
            store.delays.ack(index, t[3])
    assert [(t[0], t[2]) for t in taken] == sorted(bodies.items())
    store.close()


def test_delay_keys_make_the_queue_id_file_version_3_and_stay_apart_from_queues(
    tmp_path: Path,
) -> None:
    """A queue named like a delayed exchange is another queue: deleting one leaves the
    other's messages; an older build (version 2) refuses the file, not misreads it."""
    import struct

    store = MessageStore(str(tmp_path), segment_size=SEG)
    store.open_paged()
    store.publish(("/", "same"), b"", b"q")
    with open(tmp_path / "msgs" / "queues.idx", "rb") as f:
        assert struct.unpack("<4sHH", f.read(8))[1] == 1
    index = store.delays.index("/", "same")
    store.delays.add(index, 123, b"r", b"delayed", None, False)
    with open(tmp_path / "msgs" / "queues.idx", "rb") as f:
        assert struct.unpack("<4sHH", f.read(8))[1] == 3
    assert store.queue_keys("/", "same") == [("/", "same")]
    assert store.delete_queue(("/", "same")) == 1
    store.close()
    store = MessageStore(str(tmp_path), segment_size=SEG)
    recovered = store.open_paged()
    assert ("/", "same") not in recovered
    assert _pending(store, recovered[("/", "same", "delayed")]) == [(123, b"delayed", False)]
    assert store.delays.drop("/", "same") == 1
    store.close()
    store = MessageStore(str(tmp_path), segment_size=SEG)
    assert store.open() == {}
    assert store.delays.by_qid == {}
    store.close()


def _compacted_after_most_fire(path: Path, base: int) -> tuple[set[int], set[int]]:
    """60 delay records, the first written due last; all but those 3 taken; then the
    log rolls on. (segments they were in, segments they are in now)"""
    store = MessageStore(str(path), segment_size=SEG)
    store.open_paged()
    index = store.delays.index("/", "dx")
    for k in range(60):
        store.delays.add(index, base + 59 - k, b"r", b"b" * 100, None, False)
    first = {pos >> 32 for _d, pos, _s in index.entries()}
    store.publish(CHURN, b"", b"x" * 1900)  # the ACKs below go to a segment of their own
    with store.delays.paused():
        for t in store.delays.take(index, base + 56, 100):
            store.delays.ack(index, t[3])
    for _ in range(40):  # roll well past the grace window
        store.publish(CHURN, b"", b"x" * 400)
    store.flush()
    left = {pos >> 32 for _d, pos, _s in index.entries()}
    store.close()
    return first, left


def test_segments_of_messages_due_soon_are_not_compacted(tmp_path: Path) -> None:
    """Compaction leaves a segment whose remaining delay records are mostly due within
    seconds: they free it themselves (a copy would be read back at once, maybe before
    the writer thread has written it). Far ones are copied as usual."""
    first, left = _compacted_after_most_fire(tmp_path / "soon", time.time_ns() // 1_000_000 + 3000)
    assert len(left) == 1 and left <= first  # not moved
    first, left = _compacted_after_most_fire(tmp_path / "far", FAR)
    assert len(left) == 1 and not left & first  # copied out of a segment now gone


def test_messages_due_within_a_second_are_routed_from_ram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message due within HOT_MS keeps its bytes in RAM until taken: routing it does
    not read back a record the writer thread may not have written yet. The record is
    written all the same (a restart finds it)."""
    store = MessageStore(str(tmp_path), segment_size=SEG)
    store.open_paged()
    dq = store.delays
    index = dq.index("/", "dx")
    now = time.time_ns() // 1_000_000
    for k in range(10):
        dq.add(index, now + 50 + k, b"r%d" % k, b"hot %d" % k, None, False)
    dq.add(index, FAR, b"r", b"cold", None, False)
    assert dq._hot_bytes > 0
    store.close()
    store = MessageStore(str(tmp_path), segment_size=SEG)
    recovered = store.open_paged()
    assert [b for _d, b, _t in _pending(store, recovered[("/", "dx", "delayed")])] == [
        b"hot %d" % k for k in range(10)
    ] + [b"cold"]
    dq = store.delays
    index = dq.index("/", "dx")
    assert dq._hot_bytes == 0  # recovered: read from disk
    dq.drop("/", "dx")
    index = dq.index("/", "dx")
    for k in range(10):
        dq.add(index, now + 50 + k, b"r%d" % k, b"hot %d" % k, None, False)

    def no_reads(*args):
        raise AssertionError("read from disk")

    monkeypatch.setattr(store, "_read_positions", no_reads)
    with dq.paused():
        taken = dq.take(index, now + 1000, 100)
        for t in taken:
            dq.ack(index, t[3])
    assert [(t[1], t[2]) for t in taken] == [(b"r%d" % k, b"hot %d" % k) for k in range(10)]
    assert dq._hot_bytes == 0
    for k in range(3):
        dq.add(index, now + 50 + k, b"r", b"dropped", None, False)
    dq.drop("/", "dx")
    assert dq._hot_bytes == 0 and not dq._hot
    store.close()


def test_a_clean_restart_reads_no_record_and_a_stale_side_file_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgs/delays.idx, written at a clean stop beside the clean-shutdown index, gives
    the due times back without reading records; one that does not belong to the
    clean index found (or is damaged) is ignored, and the records are read."""
    from leveret.store import delay_queue

    store = MessageStore(str(tmp_path), segment_size=SEG)
    store.open_paged()
    index = store.delays.index("/", "dx")
    for k in range(200):
        store.delays.add(index, FAR + (k * 7919) % 300, b"r", b"%d" % k, None, k % 10 == 0)
    want = [(d, b) for d, b, t in _pending(store, index) if not t]
    store.close()
    side = tmp_path / "msgs" / "delays.idx"
    stale = side.read_bytes()

    read = []
    real = delay_queue.DelayQueues._read_dues
    monkeypatch.setattr(
        delay_queue.DelayQueues, "_read_dues", lambda self, p: read.append(1) or real(self, p)
    )

    def reopen() -> tuple[MessageStore, DelayIndex]:
        s = MessageStore(str(tmp_path), segment_size=SEG)
        return s, s.open_paged()[("/", "dx", "delayed")]

    store, index = reopen()
    assert [(d, b) for d, b, _t in _pending(store, index)] == want
    assert read == [] and not side.exists()
    store.delays.add(index, FAR + 1000, b"r", b"new", None, False)
    want.append((FAR + 1000, b"new"))
    store.close()
    side.write_bytes(stale)  # an older stop's
    store, index = reopen()
    assert [(d, b) for d, b, _t in _pending(store, index)] == want
    assert read == [1]
    store.close()
    side.write_bytes(side.read_bytes()[:-1] + b"\0")  # damaged
    store, index = reopen()
    assert [(d, b) for d, b, _t in _pending(store, index)] == want
    assert read == [1, 1]
    store.close()


def _kept_while_the_log_rolls(path: Path, keep: bool) -> MessageStore:
    """60 far-due records; 57 taken and acked, 1 taken and (with `keep`) kept for a
    later ack, as a broker of workers does while the owner of its queue has not
    confirmed it; then the log rolls on past the grace window (the segment is worth
    compacting). Returns the store, still open."""
    store = MessageStore(str(path), segment_size=SEG)
    store.open_paged()
    dq = store.delays
    index = dq.index("/", "dx")
    for k in range(60):
        dq.add(index, FAR + k, b"r", b"b%d" % k, None, False)
    store.publish(CHURN, b"", b"x" * 1900)  # the ACKs below go to a segment of their own
    with dq.paused():
        taken = dq.take(index, FAR + 57, 100)
        for t in taken[1:]:
            dq.ack(index, t[3])
        if keep:
            dq.keep(index, taken[0][3])
    for _ in range(40):
        store.publish(CHURN, b"", b"x" * 400)
    store.flush()
    store._kept_token = taken[0][3]  # type: ignore[attr-defined]
    return store


def test_a_kept_message_survives_compaction_and_a_crash(tmp_path: Path) -> None:
    """A taken message waiting for its ack outside the loop turn (`keep`) keeps its
    record: compaction leaves its segment, and a crash before the ack brings it back.
    Without `keep`, compaction copies only the index's records: the taken one is gone
    (what the one-process exchange may rely on: it acks in the same loop turn)."""
    store = _kept_while_the_log_rolls(tmp_path / "kept", keep=True)
    index = store.delays.index("/", "dx")
    assert [b for _d, b, _t in _pending(store, index)] == [b"b58", b"b59"]
    _crash(store)
    store, recovered = _open(tmp_path / "kept")
    index = recovered[("/", "dx", "delayed")]
    assert [b for _d, b, _t in _pending(store, index)] == [b"b0", b"b58", b"b59"]
    store.close()

    store = _kept_while_the_log_rolls(tmp_path / "taken", keep=False)
    _crash(store)
    store, recovered = _open(tmp_path / "taken")
    index = recovered[("/", "dx", "delayed")]
    assert [b for _d, b, _t in _pending(store, index)] == [b"b58", b"b59"]
    store.close()


def test_a_kept_message_once_acked_lets_its_segment_go(tmp_path: Path) -> None:
    store = _kept_while_the_log_rolls(tmp_path, keep=True)
    index = store.delays.index("/", "dx")
    token = store._kept_token  # type: ignore[attr-defined]
    segment = token[0] >> 32
    assert store._log.exists(segment)  # type: ignore[union-attr]
    store.delays.keep(index, token)  # again: no second pin
    store.delays.ack(index, token)
    assert not store.delays._pinned and not any(store.delays._kept.values())
    for _ in range(10):
        store.publish(CHURN, b"", b"x" * 400)
    store.flush()
    assert not store._log.exists(segment)  # type: ignore[union-attr]  # compacted away
    _crash(store)
    store, recovered = _open(tmp_path)
    index = recovered[("/", "dx", "delayed")]
    assert [b for _d, b, _t in _pending(store, index)] == [b"b58", b"b59"]
    store.close()


def test_a_clean_stop_puts_kept_messages_back(tmp_path: Path) -> None:
    """Kept when the broker stops cleanly: the clean-shutdown index lists it again."""
    store = _kept_while_the_log_rolls(tmp_path, keep=True)
    store.close()
    assert (tmp_path / "msgs" / "delays.idx").exists()
    store, recovered = _open(tmp_path)
    index = recovered[("/", "dx", "delayed")]
    assert [b for _d, b, _t in _pending(store, index)] == [b"b0", b"b58", b"b59"]
    store.close()


def test_dropping_the_exchange_frees_its_kept_messages(tmp_path: Path) -> None:
    store = _kept_while_the_log_rolls(tmp_path, keep=True)
    token = store._kept_token  # type: ignore[attr-defined]
    segment = token[0] >> 32
    store.delays.drop("/", "dx")
    assert not store.delays._pinned and not store.delays._kept
    for _ in range(10):
        store.publish(CHURN, b"", b"x" * 400)
    store.flush()
    assert not store._log.exists(segment)  # type: ignore[union-attr]
    store.close()


def test_read_all_reads_every_pending_message_and_takes_none(tmp_path: Path) -> None:
    """`read_all` (an offline copy's reader, workers/reshard.py): every pending
    message, earliest first, with its blob, body and transient flag; the delay queue
    keeps them all, before and after a restart."""
    store = MessageStore(str(tmp_path), segment_size=SEG)
    store.open_paged()
    index = store.delays.index("/", "dx")
    written = []
    for k in range(40):
        due = FAR + (k * 7919) % 101
        blob, body = b"blob-%d" % k, bytes([k]) * (k * 30)
        store.delays.add(index, due, blob, body, None, k % 5 == 0)
        written.append((due, k, blob, body, k % 5 == 0))
    expected = [(due, blob, body, transient) for due, _k, blob, body, transient in sorted(written)]
    assert list(store.delays.read_all(index)) == expected
    assert len(index) == 40
    store.close()
    store = MessageStore(str(tmp_path), segment_size=SEG)
    index = store.open_paged()[("/", "dx", "delayed")]
    durable = [item for item in expected if not item[3]]
    assert [item for item in store.delays.read_all(index) if not item[3]] == durable
    assert len(list(store.delays.read_all(index))) == len(index)
    store.close()
