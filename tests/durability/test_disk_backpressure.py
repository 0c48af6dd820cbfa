"""Publishers without confirms are paused while store writes back up, then resumed."""

from __future__ import annotations

import time

import pika
import pytest

from leveret.persistence import durable_state
from leveret.server.connection import AMQPConnection
from leveret.testing import embedded_broker

pytestmark = pytest.mark.leveret_only


def _count_disk_pauses(monkeypatch) -> list:
    """Make every queued write a backlog (so publishers pause and resume constantly) and
    return the list that each pause for the disk is appended to. (Counted where the
    connection asks the store to wait: DurableState is a C type when compiled, and
    its methods cannot be replaced.)"""
    monkeypatch.setattr(durable_state, "DISK_BACKLOG", 0)
    pauses: list = []
    real_pause = AMQPConnection.pause_for_disk

    def counting_pause(self):
        was = self.publisher_pause.disk
        real_pause(self)
        if self.publisher_pause.disk and not was:
            pauses.append(self)

    monkeypatch.setattr(AMQPConnection, "pause_for_disk", counting_pause)
    return pauses


def test_publisher_paused_on_write_backlog_loses_nothing(tmp_path, monkeypatch):
    pauses = _count_disk_pauses(monkeypatch)
    with embedded_broker(persistence=True, data_dir=str(tmp_path)) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("bp", durable=True)
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(2000):
            ch.basic_publish("", "bp", b"m%d" % i, props)
        deadline = time.monotonic() + 30

        def count() -> int:
            return broker.call(lambda: broker.server.broker.vhosts["/"].queues["bp"].message_count)

        while count() < 2000 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert count() == 2000
        assert pauses, "the publisher was never paused for the disk"
        got = [ch.basic_get("bp", auto_ack=True)[2] for _ in range(3)]
        assert got == [b"m0", b"m1", b"m2"]
        conn.close()


def test_transient_messages_paged_to_disk_pause_their_publisher_too(tmp_path, monkeypatch):
    """A long queue writes even transient messages to disk (its paged tail); without
    confirms nothing else slows their publisher, so the write backlog pauses it as it
    does for persistent ones. Nothing is lost, and the order holds."""
    pauses = _count_disk_pauses(monkeypatch)
    with embedded_broker(
        persistence=True, data_dir=str(tmp_path), queue_ram_messages=100
    ) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("bp-paged", durable=True)
        for i in range(3000):
            ch.basic_publish("", "bp-paged", b"t%d" % i)  # transient
        deadline = time.monotonic() + 30

        def counts() -> tuple[int, int]:
            def read():
                queue = broker.server.broker.vhosts["/"].queues["bp-paged"]
                return queue.message_count, queue.ready.paged

            return broker.call(read)

        while counts()[0] < 3000 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        total, paged = counts()
        assert total == 3000
        assert paged > 2000, "the queue did not page: the test would not exercise the writes"
        assert pauses, "the publisher was never paused for the disk"
        got = [ch.basic_get("bp-paged", auto_ack=True)[2] for _ in range(3000)]
        assert got == [b"t%d" % i for i in range(3000)]
        conn.close()
