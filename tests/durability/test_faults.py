"""Bad data dirs and a full disk: refuse clearly, or degrade without losing confirmed data."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import struct
import subprocess
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from durability_support import (
    PERSISTENT,
    TRANSIENT,
    Brokers,
    assert_exit_ok,
    check_body,
    close_quietly,
    drain_queue,
    make_body,
    segment_files,
    server_supports,
    tail,
)

from leveret.store.definitions import DEFINITIONS_FORMAT_VERSION

pytestmark = pytest.mark.leveret_only


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _run_refused(broker) -> tuple[int, str]:
    """Start a broker that is expected to refuse; returns (exit status, its stderr)."""
    proc = broker.spawn()
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        broker.kill()
        pytest.fail(f"broker started although it should have refused:\n{tail(broker.run_log())}")
    return rc, broker.run_log()


# ---- unusable data dirs ----------------------------------------------------------------


def test_data_dir_is_a_regular_file(brokers, tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("I am a file")
    rc, log = _run_refused(brokers.new(path))
    assert rc != 0
    assert str(path) in log, log
    # The problem is that the path is a file, not a directory; say that.
    assert "not a directory" in log.lower(), f"message does not name the problem:\n{log}"
    assert path.read_text() == "I am a file"


def test_data_dir_below_a_regular_file(brokers, tmp_path):
    parent = tmp_path / "file"
    parent.write_text("x")
    rc, log = _run_refused(brokers.new(parent / "data"))
    assert rc != 0
    assert "not a directory" in log.lower(), log


def _make_data_dir(brokers) -> object:
    broker = brokers.start(name="versioned")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("v.q", durable=True)
    ch.basic_publish("", "v.q", make_body("v", 100), PERSISTENT)
    conn.close()
    assert_exit_ok(broker)
    return broker


def test_definitions_format_version_refused(brokers):
    broker = _make_data_dir(brokers)
    db_path = broker.store_dir("v.q") / "definitions.db"
    db = sqlite3.connect(db_path)
    (version,) = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
    assert version == str(DEFINITIONS_FORMAT_VERSION)
    with db:
        db.execute("UPDATE meta SET value='99' WHERE key='format_version'")
    db.close()
    rc, log = _run_refused(broker)
    assert rc != 0
    assert "version 99" in log and "definitions" in log, log
    # Refusing must not rewrite what it does not understand.
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone() == ("99",)
    db.close()


def test_segment_format_version_refused(brokers):
    broker = _make_data_dir(brokers)
    seg = segment_files(broker.store_dir("v.q"))[0]
    with open(seg, "r+b") as f:
        head = f.read(6)
        assert head[:4] == b"LVSG" and struct.unpack("<H", head[4:6]) == (3,)
        f.seek(4)
        f.write(struct.pack("<H", 7))
    size = seg.stat().st_size
    rc, log = _run_refused(broker)
    assert rc != 0
    assert "version 7" in log and seg.name in log, log
    assert seg.stat().st_size == size  # not truncated or rewritten


def test_queue_index_format_version_refused(brokers):
    broker = _make_data_dir(brokers)
    idx = broker.store_dir("v.q") / "msgs" / "queues.idx"
    with open(idx, "r+b") as f:
        assert f.read(4) == b"LVQI"
        f.write(struct.pack("<H", 9))
    rc, log = _run_refused(broker)
    assert rc != 0
    assert "version 9" in log and "queues.idx" in log, log


# ---- disk full -------------------------------------------------------------------------


@contextlib.contextmanager
def _small_tmpfs(path: Path, size: str):
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root/CAP_SYS_ADMIN): {result.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_disk_full(brokers, tmp_path):
    with _small_tmpfs(tmp_path / "small", "2m") as mnt:
        _disk_full_scenario(brokers, tmp_path, mnt / "data")


def _disk_full_scenario(brokers, tmp_path: Path, data_dir: Path) -> None:
    # The free-space alarm would block publishers long before ENOSPC on a 2 MB disk;
    # switch it off to reach the real thing.
    extra = ("--disk-free-limit", "0") if server_supports("--disk-free-limit") else ()
    broker = brokers.start(data_dir, name="full", extra=extra)
    setup = broker.connect()
    ch = setup.channel()
    ch.queue_declare("full.q", durable=True)
    ch.queue_declare("full.other", durable=True)
    setup.close()

    # Client A fills the disk with confirmed 20 KB messages until the broker nacks.
    conn_a = broker.connect()
    ch_a = conn_a.channel()
    ch_a.confirm_delivery()
    confirmed: list[str] = []
    nacked: list[str] = []
    for i in range(400):  # 8 MB worth: far more than the 2 MB disk
        tag = f"a{i}"
        try:
            ch_a.basic_publish("", "full.q", make_body(tag, 20_000), PERSISTENT)
            confirmed.append(tag)
        except pika.exceptions.NackError:
            nacked.append(tag)
            if len(nacked) >= 5:
                break
    assert nacked, "the disk never filled up: no publish was nacked"
    assert confirmed, "nothing was confirmed before the disk filled up"
    assert conn_a.is_open and ch_a.is_open, "a nack must not close the channel"

    log = broker.run_log()
    assert "ENOSPC" in log or "No space left on device" in log, tail(log)

    # Another client carries on with work that does not need the disk.
    conn_b = broker.connect()
    ch_b = conn_b.channel()
    ch_b.confirm_delivery()
    ch_b.queue_declare("full.transient", durable=False)
    ch_b.basic_publish("", "full.transient", b"still here", TRANSIENT)
    method, _props, body = ch_b.basic_get("full.transient", auto_ack=True)
    assert body == b"still here"
    # Reading what is stored works too (a delivery without ack writes nothing durable).
    method, _props, body = ch_b.basic_get("full.q")
    assert method is not None and check_body(body) == confirmed[0]
    ch_b.basic_nack(method.delivery_tag, requeue=True)

    # Without confirm mode, a persistent publish that cannot be stored closes the channel.
    conn_c = broker.connect()
    ch_c = conn_c.channel()
    closed = None
    try:
        for i in range(20):
            ch_c.basic_publish("", "full.other", make_body(f"c{i}", 200_000), PERSISTENT)
            time.sleep(0.2)  # let the failed write come back (not a timing assertion)
            ch_c.queue_declare("full.other", passive=True)  # a round trip
    except pika.exceptions.ChannelClosedByBroker as exc:
        closed = exc
    assert closed is not None, "publishing on a full disk without confirms went unreported"
    assert closed.reply_code == 506, closed
    assert "disk" in closed.reply_text.lower(), closed.reply_text
    assert conn_c.is_open, "only the channel should be closed"

    # Client B is still fine after all that.
    ch_b.basic_publish("", "full.transient", b"still fine", TRANSIENT)
    assert ch_b.basic_get("full.transient", auto_ack=True)[2] == b"still fine"
    for conn in (conn_a, conn_b, conn_c):
        close_quietly(conn)
    rc = broker.stop()
    stop_log = broker.run_log()

    # Move the data dir to a roomy disk and check that every confirmed message is there.
    big = tmp_path / "big-data"
    shutil.copytree(data_dir, big)
    roomy = brokers.start(big, name="roomy")
    conn = roomy.connect()
    got = [check_body(body) for body, _r, _p in drain_queue(conn.channel(), "full.q")]
    conn.close()
    assert got[: len(confirmed)] == confirmed, (
        f"confirmed messages lost or reordered; got {len(got)} of {len(confirmed)}"
    )
    assert set(got[len(confirmed) :]) <= set(nacked), "messages that were never published"
    assert rc == 0, f"broker exited {rc} on SIGTERM with a full disk:\n{tail(stop_log)}"
    assert_exit_ok(roomy)
