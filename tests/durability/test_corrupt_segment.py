"""A torn or corrupt record at the end of the last segment: log it, serve the rest.

The segment layout is parsed here independently of the store's code: a 32-byte
header (b"LVSG", u16 version, u16 header size, ...) then records framed as
u32 length + u32 CRC32 + `length` bytes, little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from durability_support import (
    PERSISTENT,
    Brokers,
    assert_exit_ok,
    check_body,
    drain_queue,
    make_body,
    segment_files,
    tail,
)

pytestmark = pytest.mark.leveret_only

QUEUE = "torn.q"
COUNT = 40


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _records(path: Path) -> list[tuple[int, int]]:
    """(offset, total size) of each framed record in a segment file."""
    data = path.read_bytes()
    assert data[:4] == b"LVSG", f"{path} has no segment magic"
    (hsize,) = struct.unpack_from("<H", data, 6)
    out = []
    off = hsize
    while off + 8 <= len(data):
        (length,) = struct.unpack_from("<I", data, off)
        if length == 0:
            break
        out.append((off, 8 + length))
        off += 8 + length
    assert off == len(data), f"{path}: unexpected trailing bytes at {off}"
    return out


def _publish_and_stop(brokers) -> tuple[object, list[str]]:
    broker = brokers.start(name="torn")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE, durable=True)
    tags = []
    for i in range(COUNT):
        tag = f"m{i}"
        ch.basic_publish("", QUEUE, make_body(tag, 500 + 37 * i), PERSISTENT)
        tags.append(tag)
    conn.close()
    assert_exit_ok(broker)
    return broker, tags


def _restart_and_check(broker, last: Path, expect: list[str], problem: str) -> None:
    broker.start()
    log = broker.run_log()
    warnings = [line for line in log.splitlines() if last.name in line and problem in line]
    assert warnings, f"no log line about {problem!r} in {last.name}:\n{tail(log)}"
    conn = broker.connect()
    ch = conn.channel()
    got = [check_body(body) for body, _r, _p in drain_queue(ch, QUEUE)]
    assert got == expect
    # The damaged tail was cut: new messages append cleanly and survive a restart.
    ch.confirm_delivery()
    ch.basic_publish("", QUEUE, make_body("after", 100), PERSISTENT)
    conn.close()
    assert_exit_ok(broker)
    broker.start()
    conn = broker.connect()
    got = [check_body(body) for body, _r, _p in drain_queue(conn.channel(), QUEUE)]
    conn.close()
    assert got == ["after"], tail(broker.run_log())
    warned = [line for line in broker.run_log().splitlines() if " WARNING " in line]
    assert not warned, f"still complaining after the tail was cut: {warned}"
    assert_exit_ok(broker)


def test_truncated_last_record(brokers):
    broker, tags = _publish_and_stop(brokers)
    last = segment_files(broker.store_dir(QUEUE))[-1]
    off, size = _records(last)[-1]
    with open(last, "r+b") as f:
        f.truncate(off + size // 2)
    _restart_and_check(broker, last, tags[:-1], "torn record")


def test_flipped_byte_in_last_record(brokers):
    broker, tags = _publish_and_stop(brokers)
    last = segment_files(broker.store_dir(QUEUE))[-1]
    off, size = _records(last)[-1]
    with open(last, "r+b") as f:
        pos = off + size - 20  # inside the body
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x5A]))
    _restart_and_check(broker, last, tags[:-1], "CRC mismatch")


def test_torn_record_prefix(brokers):
    """Only the first bytes of a record's length+CRC prefix made it to disk."""
    broker, tags = _publish_and_stop(brokers)
    last = segment_files(broker.store_dir(QUEUE))[-1]
    off, _size = _records(last)[-1]
    with open(last, "r+b") as f:
        f.truncate(off + 3)
    _restart_and_check(broker, last, tags[:-1], "torn record prefix")


def test_zero_filled_tail_loses_nothing(brokers):
    """A preallocated (zero-filled) tail after the last record is not a message."""
    broker, tags = _publish_and_stop(brokers)
    last = segment_files(broker.store_dir(QUEUE))[-1]
    with open(last, "ab") as f:
        f.write(b"\0" * 4096)
    _restart_and_check(broker, last, tags, "invalid record length 0")
