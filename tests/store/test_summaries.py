"""Segment summaries (store.summaries): recovery from them equals recovery by walking.

A summary is a cache of its segment, so the test that matters compares the two
ways of recovering the same data dir: one copy keeps its summary files, the
other has them deleted and is walked record by record. Both must give every queue the same positions, flags and order, and
the store the same live bytes, dependencies and next message id.
"""

from __future__ import annotations

import random
import shutil
import struct
import zlib
from array import array
from pathlib import Path

import pytest
from store_support import recovered_state

from leveret.store import MessageStore
from leveret.store.summaries import Columns, Summary, encode, load, summary_path, write_file

QUEUES = [("/", f"q{i}") for i in range(4)]


def _workload(path: Path, seed: int, steps: int, segment_size: int) -> None:
    """Several queues' traffic on tiny segments: paged and held messages, fan-out,
    deliveries, acks in any order, purges, compaction; then a stop without the
    clean-shutdown index, as a crash leaves it."""
    rng = random.Random(seed)
    store = MessageStore(str(path), segment_size=segment_size)
    store.open_paged()
    tails = {key: store.paged_index(key) for key in QUEUES}
    held: list = []
    for step in range(steps):
        op = rng.random()
        key = rng.choice(QUEUES)
        body = b"%d-" % step + b"b" * rng.randrange(0, 120)
        if op < 0.35:
            store.publish_paged(tails[key], b"h", body)
        elif op < 0.5:
            held.append(store.publish(key, b"h", body))
        elif op < 0.58:
            shared = store.publish_shared(QUEUES, b"h", body)
            for k in range(len(QUEUES)):
                if rng.random() < 0.5:
                    held.append(store.take_slot(shared, k))
                else:
                    store.release_slot(shared, k)
        elif op < 0.62:
            store.publish_paged(tails[key], b"h", body, transient=True)
        elif op < 0.8 and held:
            loc = held.pop(rng.randrange(len(held)))
            store.mark_delivered(loc)
            if rng.random() < 0.7:
                store.ack(loc)
            else:
                held.append(loc)
        elif op < 0.95:
            tail = tails[key]
            if len(tail):
                for loc, _h, _b in store.take_paged(tail, rng.randrange(1, 6)):
                    if rng.random() < 0.5:
                        store.ack(loc)
                    else:
                        store.mark_delivered(loc)
                        held.append(loc)
        elif op < 0.96:
            store.drop_paged(tails[key])
    store.close()
    (path / "msgs" / "clean.idx").unlink(missing_ok=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recovery_from_summaries_equals_walking_every_record(tmp_path: Path, seed: int) -> None:
    seg = 4096
    _workload(tmp_path / "a", seed, 4000, seg)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    sums = list((tmp_path / "b" / "msgs").glob("*.sum"))
    assert len(sums) > 20, "the workload should seal many segments"
    for f in sums:
        f.unlink()
    walked, how_b = recovered_state(tmp_path / "b", seg)
    summarised, how_a = recovered_state(tmp_path / "a", seg)
    assert how_b["summaries"] == 0 and how_b["walked"] > 20
    assert how_a["walked"] == 1, "only the newest segment is walked"
    assert how_a["summaries"] == how_b["walked"] - 1
    assert sum(len(rows) for rows in walked["queues"].values()) > 50
    assert summarised == walked
    # The walk wrote the summaries it lacked: the next recovery of b uses them.
    again, how_again = recovered_state(tmp_path / "b", seg)
    assert how_again == how_a
    assert again == walked


def test_a_segment_with_compaction_copies_is_replayed_in_order(tmp_path: Path) -> None:
    """Compaction copies older messages into the active segment, among newer ones:
    such a segment's ids do not rise with file order, and recovery replays it
    record by record. The copies must come back where they were."""
    seg = 2048
    store = MessageStore(str(tmp_path), segment_size=seg)
    store.open_paged()
    key = QUEUES[0]
    tail = store.paged_index(key)
    noise = None
    for i in range(3000):
        # Acked noise leaves q0's records few per segment, so they are compacted.
        if noise is not None:
            store.ack(noise)
        noise = store.publish(("/", "noise"), b"h", b"n" * 100)
        store.publish_paged(tail, b"h", b"%d" % i)
        if i % 7 == 0:
            for loc, _h, _b in store.take_paged(tail, 2):
                store.ack(loc)
    expected = [b for _loc, _h, b in store.take_paged(tail, 10**9)]
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()
    store = MessageStore(str(tmp_path), segment_size=seg)
    recovered = store.open_paged()
    assert store.recovered_from["summaries"] > 0
    got = [b for _loc, _h, b in store.take_paged(recovered[key], 10**9)]
    store.close()
    # The taken-and-not-acked ones above came back too (no clean stop records them
    # as gone): the expected list is what was still queued, in order, at the end.
    assert got[-len(expected) :] == expected
    assert got == sorted(set(got), key=got.index), "no duplicate after compaction"


# ---- the file itself ------------------------------------------------------------------


def _summary() -> Summary:
    s = Summary()
    a = s.columns(7)
    for i in range(5):
        a.note(100 + i, 32 + 40 * i, 40)  # consecutive ids, uniform sizes
    b = s.columns(9)
    for mid, off, size in ((300, 500, 41), (250, 541, 77), (310, 618, 40)):
        b.note(mid, off, size)  # a compaction copy: not ordered
    s.others.extend([700, 760])
    s.fanouts.append(820)
    s.top_mid = 310
    return s


def _round_trip(tmp_path: Path, size: int = 800, head_crc: int = 1234) -> object:
    write_file(summary_path(str(tmp_path), 3), encode(3, 800, 1234, _summary()))
    return load(str(tmp_path), 3, size, head_crc, Columns)


def test_summary_file_round_trips_every_form(tmp_path: Path) -> None:
    loaded = _round_trip(tmp_path)
    assert isinstance(loaded, Summary)
    queues, others, top = loaded.queues, loaded.others, loaded.top_mid
    assert list(queues) == [7, 9]
    assert list(queues[7].mids) == [100, 101, 102, 103, 104]
    assert list(queues[7].sizes) == [40] * 5 and queues[7].ordered
    assert list(queues[9].mids) == [300, 250, 310] and not queues[9].ordered
    assert list(queues[9].offs) == [500, 541, 618]
    assert list(queues[9].sizes) == [41, 77, 40]
    assert list(others) == [700, 760] and list(loaded.fanouts) == [820] and top == 310
    # Consecutive ids and one size are stored once, not per message: header 48,
    # q7 12 + 8 (first id) + 5 x 4 (offsets) + 4 (the size), q9 12 + 3 x 16, two
    # other offsets 8, one fan-out offset 4, CRC 4.
    body = Path(summary_path(str(tmp_path), 3)).read_bytes()
    assert len(body) == 48 + (12 + 8 + 20 + 4) + (12 + 48) + 8 + 4 + 4


@pytest.mark.parametrize(
    "damage", ["flip", "truncate", "empty", "other_size", "other_header", "garbage"]
)
def test_a_summary_that_does_not_match_is_not_used(tmp_path: Path, damage: str) -> None:
    path = Path(summary_path(str(tmp_path), 3))
    write_file(str(path), encode(3, 800, 1234, _summary()))
    data = bytearray(path.read_bytes())
    size, head_crc = 800, 1234
    if damage == "flip":
        data[60] ^= 0x10
    elif damage == "truncate":
        del data[-10:]
    elif damage == "empty":
        data = bytearray()
    elif damage == "other_size":
        size = 801
    elif damage == "other_header":
        head_crc = 4321
    else:
        data = bytearray(b"LVSM\x01\x00" + bytes(100))  # a known version, nonsense after
        data += struct.pack("<I", zlib.crc32(data))
    path.write_bytes(bytes(data))
    assert load(str(tmp_path), 3, size, head_crc, Columns) is None


def test_a_damaged_record_named_by_a_summary_makes_recovery_walk(tmp_path: Path) -> None:
    """Bit rot in an ACK record after its summary was written: the summary is not
    trusted for that segment, which is walked (and stops at the damage, as always)."""
    seg = 4096
    store = MessageStore(str(tmp_path), segment_size=seg)
    store.open_paged()
    key = QUEUES[0]
    locs = []
    for i in range(200):
        # Without a loop an ACK is written by the next append: ACKs land in every
        # segment, between the publishes.
        locs.append(store.publish(key, b"h", b"m%d" % i + b"x" * 60))
        if i % 3 == 0:
            store.ack(locs[i // 2])
    store.close()
    (tmp_path / "msgs" / "clean.idx").unlink()
    msgs = tmp_path / "msgs"
    # Find a sealed segment whose summary names other records, and damage one.
    newest = max(int(f.stem) for f in msgs.glob("*.seg"))
    for sum_file in sorted(msgs.glob("*.sum")):
        seq = int(sum_file.stem)
        if seq == newest:
            continue  # always walked
        seg_file = msgs / f"{seq:016d}.seg"
        data = seg_file.read_bytes()
        loaded = load(str(msgs), seq, len(data), zlib.crc32(data[:32]), Columns)
        if loaded is not None and len(loaded.others):
            off = loaded.others[0]
            damaged = bytearray(data)
            damaged[off + 12] ^= 0xFF
            seg_file.write_bytes(bytes(damaged))
            break
    else:
        pytest.fail("no summarised segment holds an ACK record")
    store = MessageStore(str(tmp_path), segment_size=seg)
    store.open_paged()
    assert store.recovered_from["walked"] >= 2
    store.close()


def test_summary_bytes_are_little_endian(tmp_path: Path) -> None:
    """The file format is little-endian whatever the machine: check the bytes."""
    s = Summary()
    s.columns(1).note(0x0102030405060708, 0x0A0B0C0D, 0x11)
    s.columns(1).note(0x0102030405060700, 0x0A0B0C1D, 0x12)  # not consecutive
    write_file(summary_path(str(tmp_path), 1), encode(1, 64, 0, s))
    data = Path(summary_path(str(tmp_path), 1)).read_bytes()
    assert struct.pack("<Q", 0x0102030405060708) in data
    assert struct.pack("<I", 0x0A0B0C1D) in data
    mids = array("Q")  # (on a big-endian machine this line would need byteswap)
    mids.frombytes(data[48 + 12 : 48 + 12 + 16])  # header, queue entry, two ids
    assert list(mids) == [0x0102030405060708, 0x0102030405060700]
