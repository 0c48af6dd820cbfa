"""Paged tails as compact positions (store.paged_index), on real segment files.

The model test drives a store the way a queue does: a head of Locations, a paged
tail behind it, acks, deliveries, purges, compaction on tiny segments and
reopens, and checks every body and redelivered flag against a plain list.
"""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from pathlib import Path

import pytest

from leveret.store import MessageStore
from leveret.store.compaction import COMPACT_GRACE
from leveret.store.paged_index import REDELIVERED, PagedIndex

Q = ("/", "q")


def _store(path: Path, segment_size: int = 64 * 1024) -> tuple[MessageStore, dict]:
    store = MessageStore(str(path), segment_size=segment_size)
    return store, store.open_paged()


def _bodies(items: list) -> list[bytes]:
    return [body for _loc, _header, body in items]


def test_index_keeps_order_runs_and_held_entries() -> None:
    paged = PagedIndex(1, overhead=10)
    for off in (0, 100, 200):
        paged.append(1, off, 50)
    paged.append(2, 0, 60, REDELIVERED)  # a new segment starts a new run
    paged.hold("held", 7)
    paged.append(2, 60, 60)
    assert (paged.n, paged.nbytes) == (6, 3 * 40 + 2 * 50 + 7)
    assert paged.find(1, 100) == 0x100 and paged.find(2, 0) == 0x100 | REDELIVERED
    assert paged.find(1, 101) == -1
    first = paged.popleft(2)
    assert [(seq, list(offs)) for seq, offs, _s, _f, _t in first] == [(1, [0, 100])]
    assert paged.find(1, 0) == -1, "a taken position is no longer queued"
    rest = paged.popleft(10)
    assert [r if isinstance(r, str) else (r[0], list(r[1])) for r in rest] == [
        (1, [200]),
        (2, [0]),
        "held",
        (2, [60]),
    ]
    assert list(rest[1][3]) == [REDELIVERED]
    assert (paged.n, paged.nbytes) == (0, 0)


def test_relocate_splits_a_run_where_the_copies_cross_segments() -> None:
    paged = PagedIndex(1)
    for off in (10, 20, 30, 40):
        paged.append(3, off, 5)
    paged.popleft(1)
    paged.relocate(3, {20: (7, 100), 30: (7, 105), 40: (8, 16)})
    assert paged.find(3, 20) == -1
    assert paged.find(7, 105) == 0x100 and paged.find(8, 16) == 0x100
    got = paged.popleft(10)
    assert [(seq, list(offs)) for seq, offs, _s, _f, _t in got] == [(7, [100, 105]), (8, [16])]


def test_stamps_follow_their_positions_through_relocate_and_truncate() -> None:
    """A TTL queue's deadlines (stamps) come back with their own positions; a run
    without stamps keeps none (no 8 bytes a message for queues without TTLs)."""
    paged = PagedIndex(1)
    paged.append(3, 10, 5)
    paged.append(3, 20, 5, stamp=2.5)
    paged.append(3, 30, 5, REDELIVERED, stamp=3.5)
    paged.append(3, 40, 5)
    paged.append(4, 10, 5)
    paged.relocate(3, {10: (7, 100), 20: (7, 105), 30: (8, 16), 40: (8, 21)})
    assert paged.truncate(8, 21) == 1
    got = paged.popleft(10)
    rows = [
        (seq, off, flags[i] if flags else 0, stamps[i] if stamps else 0.0)
        for seq, offs, _s, flags, stamps in got
        for i, off in enumerate(offs)
    ]
    assert rows == [(7, 100, 0, 0.0), (7, 105, 0, 2.5), (8, 16, REDELIVERED, 3.5), (4, 10, 0, 0.0)]
    plain = PagedIndex(2)
    plain.append(1, 0, 5)
    assert plain.popleft(1)[0][4] is None


def test_truncate_forgets_positions_whose_write_failed() -> None:
    paged = PagedIndex(1)
    for seq, off in ((1, 10), (1, 20), (2, 10), (2, 20), (3, 10)):
        paged.append(seq, off, 5)
    assert paged.truncate(2, 20) == 2
    got = paged.popleft(10)
    assert [(seq, list(offs)) for seq, offs, _s, _f, _t in got] == [(1, [10, 20]), (2, [10])]


def test_paged_messages_round_trip_and_survive_reopen(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    tail = store.paged_index(Q)
    head = store.publish(Q, b"h", b"head")
    for i in range(1000):
        store.publish_paged(tail, b"h", b"body-%d" % i)
    store.publish_paged(tail, b"h", b"transient", transient=True)
    assert store.stats()["messages"] == 1002
    items = store.take_paged(tail, 3)
    assert _bodies(items) == [b"body-0", b"body-1", b"body-2"]
    store.mark_delivered(items[1][0])
    store.ack(items[0][0])
    store.close()
    store, rec = _store(tmp_path)
    again = store.take_paged(rec[Q], 10_000)
    # The transient record is not recovered; the delivered one comes back redelivered.
    assert _bodies(again) == [b"head"] + [b"body-%d" % i for i in range(1, 1000)]
    assert [loc.redelivered for loc, _h, _b in again[:3]] == [False, True, False]
    assert again[0][0].msg_id == head.msg_id
    store.close()


def test_purging_a_paged_tail_is_durable_and_keeps_the_head(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, segment_size=4096)
    tail = store.paged_index(Q)
    unacked = store.publish(Q, b"h", b"unacked")
    for i in range(500):
        store.publish_paged(tail, b"h", b"p%d" % i + b"x" * 50)
    assert store.drop_paged(tail) == []
    store.publish_paged(tail, b"h", b"after")
    store.close()
    store, rec = _store(tmp_path, segment_size=4096)
    assert _bodies(store.take_paged(rec[Q], 1000)) == [b"unacked", b"after"]
    store.close()
    assert unacked.msg_id > 0


def test_bookkeeping_per_paged_message_is_under_16_bytes(tmp_path: Path) -> None:
    """Python allocations made by 200,000 paged publishes, per message (tracemalloc
    counts bytes, not time): at most 16 B.

    The messages span about nine 1 MB segments, as a long queue spans many: the
    active segment's summary (16 B a message, see store.summaries) is freed when
    the segment is sealed, so it costs one segment's worth, not 16 B per queued
    message. With a single segment, 8 B of that would be counted per message."""
    store, _ = _store(tmp_path, segment_size=1024 * 1024)
    tail = store.paged_index(Q)
    for i in range(1000):  # warm up: segment state, first run
        store.publish_paged(tail, b"h", b"%016d" % i)
    store.flush()
    n = 200_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        store.publish_paged(tail, b"h", b"%016d" % i)
        if i % 20_000 == 0:
            store.flush()
    store.flush()
    per_message = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    print(f"{per_message:.2f} B of Python allocations per paged message")
    assert per_message <= 16, per_message
    store.close()


@pytest.mark.parametrize(
    ("turns", "exact"), [("none", False), ("held", False), ("none", True), ("held", True)]
)
@pytest.mark.parametrize("restart", ["clean", "scan"])
def test_random_operations_with_a_paged_tail_match_a_model(
    tmp_path: Path, restart: str, turns: str, exact: bool
) -> None:
    """A queue's life on tiny segments (so compaction moves paged records): nothing
    is lost, resurrected, reordered or misflagged, across reopens, whether they read
    the clean-shutdown index or scan the log (as after a crash).

    turns="none": no event loop, so every append flushes (and writes the ACKs noted
    so far); "held": a loop that never runs, so records and ACKs wait for a read, a
    segment's deletion or the close (the longest batches the store can see).

    exact: the tail counts its bodies' bytes exactly (x-max-length-bytes queues), as
    checked after every step, also once a reopen has read its extras back."""
    rng = random.Random(4321)
    seg = 2048
    loop = asyncio.new_event_loop() if turns == "held" else None

    def fresh() -> tuple[MessageStore, PagedIndex, list, list]:
        if restart == "scan":
            (tmp_path / "msgs" / "clean.idx").unlink(missing_ok=True)
        store = MessageStore(str(tmp_path), segment_size=seg, loop=loop)
        rec = store.open_paged()
        tail = rec.get(Q) or store.paged_index(Q, exact)
        if exact:
            store.make_exact(tail)
        return store, tail, [], []

    store, tail, head, unacked = fresh()
    # What the queue holds, in order: [body, redelivered]; head/unacked hold Locations.
    model: list[list] = []
    in_tail = 0
    noise = None
    for step in range(6000):
        # Another queue's traffic, acked at once, leaves Q's records few in each
        # segment: compaction then copies them and relocates the paged positions.
        if noise is not None:
            store.ack(noise)
        noise = store.publish(("/", "noise"), b"h", b"n" * 100)
        op = rng.random()
        if op < 0.45:
            body = b"%d-" % step + b"z" * rng.randrange(0, 200)
            if in_tail or rng.random() < 0.6:
                store.publish_paged(tail, b"h", body)
                in_tail += 1
            else:
                head.append(store.publish(Q, b"h", body))
            model.append([body, False])
        elif op < 0.75 and model:
            if not head and in_tail:  # refill the head from the tail, as a queue does
                items = store.take_paged(tail, rng.randrange(1, 20))
                in_tail -= len(items)
                for (loc, _h, body), expected in zip(items, model, strict=False):
                    assert body == expected[0], step
                    assert loc.redelivered == expected[1], step
                head.extend(loc for loc, _h, _b in items)
            if head:
                loc = head.pop(0)
                store.mark_delivered(loc)
                model.pop(0)
                if rng.random() < 0.5:
                    store.ack(loc)
                else:
                    unacked.append(loc)
        elif op < 0.85 and unacked:
            store.ack(unacked.pop(rng.randrange(len(unacked))))
        elif op < 0.86:
            store.drop_paged(tail)
            del model[len(head) :]
            in_tail = 0
        elif op < 0.88:
            # Unacked deliveries come back first (they were older), redelivered.
            model = [[store.read_body(loc)[1], True] for loc in unacked] + model
            store.ack(noise)
            noise = None
            store.close()
            store, tail, head, unacked = fresh()
            items = store.take_paged(tail, 10**9)
            assert _bodies(items) == [row[0] for row in model], step
            assert [loc.redelivered for loc, _h, _b in items] == [row[1] for row in model], step
            head = [loc for loc, _h, _b in items]
            in_tail = 0
        if exact:
            in_the_tail = model[len(model) - in_tail :] if in_tail else []
            assert tail.nbytes == sum(len(body) for body, _r in in_the_tail), step
    # 6000 steps wrote about 730 segments.
    _close_with_disk_bounded(store, seg, loop)


def _close_with_disk_bounded(
    store: MessageStore, seg: int, loop: asyncio.AbstractEventLoop | None
) -> None:
    """Disk follows what is queued: compaction keeps a segment only while a quarter
    of it is live (compact_ratio), or while it is among the newest (the grace
    window). Live bytes count a shared (FANOUT) record once per queue holding it,
    so with fan-out the bound is looser; it still fails if dead records pile up."""
    store.flush()
    stats = store.stats()
    assert stats["disk_bytes"] <= 4 * stats["live_bytes"] + (COMPACT_GRACE + 2) * seg, stats
    store.close()
    if loop is not None:
        loop.close()


class _Queue:
    """One queue of the fan-out model test: its tail, head and unacked Locations, and
    what it should hold, in order, as [body, redelivered]."""

    def __init__(self, store: MessageStore, key: tuple[str, str], paged: PagedIndex | None):
        self.key = key
        # Queue "c" counts its tail's bodies exactly (as x-max-length-bytes queues do).
        self.exact = key[1] == "c"
        self.tail = paged or store.paged_index(key, self.exact)
        if self.exact:
            store.make_exact(self.tail)
        self.head: list = []
        self.unacked: list = []
        self.model: list[list] = []
        self.in_tail = 0


@pytest.mark.parametrize("turns", ["none", "held"])
@pytest.mark.parametrize("restart", ["clean", "scan"])
@pytest.mark.parametrize("seed", [11, 12])
def test_random_fan_out_matches_a_model(
    tmp_path: Path, restart: str, seed: int, turns: str
) -> None:
    """Messages written once for several queues (FANOUT records) on tiny segments:
    each queue takes its slot as a Location or a paged position, acks, purges and
    delivers on its own, and compaction moves the shared records. Across reopens
    (clean index or scan) no queue loses, resurrects, reorders or misflags one.
    `turns` as in the test above.

    Seed 11 found the first version's flaw: compaction copied a FANOUT record whole,
    so the copy brought back the slots that queues had acked (their ACKs name the
    old segment), and a scan resurrected them."""
    rng = random.Random(seed)
    seg = 2048
    loop = asyncio.new_event_loop() if turns == "held" else None
    keys = [("/", "a"), ("/", "b"), ("/", "c")]

    def fresh() -> tuple[MessageStore, dict]:
        if restart == "scan":
            (tmp_path / "msgs" / "clean.idx").unlink(missing_ok=True)
        store = MessageStore(str(tmp_path), segment_size=seg, loop=loop)
        rec = store.open_paged()
        return store, {k: _Queue(store, k, rec.get(k)) for k in keys}

    store, queues = fresh()
    noise = None
    for step in range(5000):
        if noise is not None:
            store.ack(noise)
        noise = store.publish(("/", "noise"), b"h", b"n" * 100)
        q = queues[rng.choice(keys)]
        op = rng.random()
        if op < 0.4:
            body = b"%d-" % step + b"f" * rng.randrange(0, 200)
            chosen = rng.sample(keys, rng.choice([2, 3]))
            shared = store.publish_shared(chosen, b"h", body)
            for k, key in enumerate(chosen):
                t = queues[key]
                if rng.random() < 0.05:
                    store.release_slot(shared, k)  # this queue turned the message away
                elif t.in_tail or rng.random() < 0.6:
                    store.take_slot_paged(shared, t.tail)
                    t.in_tail += 1
                    t.model.append([body, False])
                else:
                    t.head.append(store.take_slot(shared, k))
                    t.model.append([body, False])
        elif op < 0.5:
            body = b"%d-" % step + b"s" * rng.randrange(0, 200)
            if q.in_tail:
                store.publish_paged(q.tail, b"h", body)
                q.in_tail += 1
            else:
                q.head.append(store.publish(q.key, b"h", body))
            q.model.append([body, False])
        elif op < 0.75 and q.model:
            if not q.head and q.in_tail:
                items = store.take_paged(q.tail, rng.randrange(1, 20))
                q.in_tail -= len(items)
                for (loc, _h, body), expected in zip(items, q.model, strict=False):
                    assert body == expected[0], step
                    assert loc.redelivered == expected[1], step
                q.head.extend(loc for loc, _h, _b in items)
            if q.head:
                loc = q.head.pop(0)
                store.mark_delivered(loc)
                q.model.pop(0)
                if rng.random() < 0.5:
                    store.ack(loc)
                else:
                    q.unacked.append(loc)
        elif op < 0.87 and q.unacked:
            store.ack(q.unacked.pop(rng.randrange(len(q.unacked))))
        elif op < 0.88:
            store.drop_paged(q.tail)
            del q.model[len(q.head) :]
            q.in_tail = 0
        elif op < 0.885:
            store.purge(q.key)
            queues[q.key] = _Queue(store, q.key, None)
        elif op < 0.90:
            expected = {
                key: [[store.read_body(loc)[1], True] for loc in t.unacked] + t.model
                for key, t in queues.items()
            }
            store.ack(noise)
            noise = None
            store.close()
            store, queues = fresh()
            for key, t in queues.items():
                items = store.take_paged(t.tail, 10**9)
                assert _bodies(items) == [row[0] for row in expected[key]], (step, key)
                flags = [loc.redelivered for loc, _h, _b in items]
                assert flags == [row[1] for row in expected[key]], (step, key)
                t.head = [loc for loc, _h, _b in items]
                t.model = expected[key]
        for t in queues.values():
            if t.exact:
                in_the_tail = t.model[len(t.model) - t.in_tail :] if t.in_tail else []
                assert t.tail.nbytes == sum(len(b) for b, _r in in_the_tail), step
    _close_with_disk_bounded(store, seg, loop)


def test_reading_back_skips_other_queues_records(tmp_path: Path) -> None:
    """Queues filled in turn interleave their records in the log. Reading one queue's
    tail back reads its own records, not the stretches of the others' between them
    (which read the log once per queue: S9's drain read 400 GB)."""
    store, _ = _store(tmp_path, segment_size=64 * 1024 * 1024)
    queues = [("/", f"q{i}") for i in range(200)]
    tails = {q: store.paged_index(q) for q in queues}
    for n in range(50):
        for q in queues:
            # 100-byte bodies: each queue's records are 200 x ~130 B apart, past READ_GAP
            body = b"%s-%d " % (q[1].encode(), n)
            store.publish_paged(tails[q], b"h", body.ljust(100, b"."))
    log = store._log
    read = log.read
    sizes: list[int] = []

    def counting_read(seq: int, offset: int, size: int) -> bytes:
        sizes.append(size)
        return read(seq, offset, size)

    log.read = counting_read  # type: ignore[method-assign]
    got = _bodies(store.take_paged(tails[("/", "q7")], 50))
    assert got == [(b"q7-%d " % n).ljust(100, b".") for n in range(50)]
    assert len(tails[("/", "q7")]) == 0
    # 50 records of about 130 bytes, 200 records apart: read one by one (about 6.5 kB),
    # not as stretches through the other queues' records (about 1.3 MB).
    assert len(sizes) == 50 and sum(sizes) < 50 * 1000, sizes
    # Records side by side still come back with one read.
    sizes.clear()
    alone = store.paged_index(("/", "alone"))
    for n in range(100):
        store.publish_paged(alone, b"h", b"alone-%d" % n)
    assert _bodies(store.take_paged(alone, 100)) == [b"alone-%d" % n for n in range(100)]
    assert len(sizes) == 1
    store.close()
