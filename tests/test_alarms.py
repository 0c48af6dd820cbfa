"""Resource alarms: connection.blocked / unblocked and publishers held while an alarm is on."""

from __future__ import annotations

import time

import pika
import pytest

from leveret.testing import embedded_broker

pytestmark = pytest.mark.leveret_only


def _set(broker, **limits) -> None:
    def apply() -> None:
        for name, value in limits.items():
            setattr(broker.server.alarms, name, value)
        broker.server.alarms.check()

    broker.call(apply)


def _ready(broker, queue: str) -> int:
    return broker.call(lambda: broker.server.broker.vhosts["/"].queues[queue].message_count)


def test_memory_alarm_blocks_publishers_and_clears():
    with embedded_broker() as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        events: list[tuple] = []
        conn.add_on_connection_blocked_callback(
            lambda _c, m: events.append(("blocked", m.method.reason))
        )
        conn.add_on_connection_unblocked_callback(lambda _c, _m: events.append(("unblocked",)))
        ch = conn.channel()
        ch.queue_declare("alarm-q")
        _set(broker, memory_limit=1)  # any RSS is over the limit
        conn.process_data_events(time_limit=0.3)
        assert events == [("blocked", "low on memory")]
        ch.basic_publish("", "alarm-q", b"first")
        conn.process_data_events(time_limit=0.5)
        # The broker stopped reading this connection once it saw a publish (possibly
        # before that publish's body frame), so nothing sent after it gets in.
        for i in range(4):
            ch.basic_publish("", "alarm-q", b"held %d" % i)
        conn.process_data_events(time_limit=0.5)
        assert _ready(broker, "alarm-q") <= 1
        _set(broker, memory_limit=0)
        deadline = time.monotonic() + 10
        while (_ready(broker, "alarm-q") < 5 or events[-1] != ("unblocked",)) and (
            time.monotonic() < deadline
        ):
            conn.process_data_events(time_limit=0.1)
        assert events[-1] == ("unblocked",)
        assert _ready(broker, "alarm-q") == 5  # nothing was lost while blocked
        conn.close()


def test_consumers_keep_running_during_an_alarm():
    with embedded_broker() as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("alarm-c")
        ch.basic_publish("", "alarm-c", b"before")
        conn.process_data_events(time_limit=0.2)
        _set(broker, memory_limit=1)
        consumer_conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        got = consumer_conn.channel().basic_get("alarm-c", auto_ack=True)
        assert got[2] == b"before"
        consumer_conn.close()
        _set(broker, memory_limit=0)
        conn.close()


def test_disk_alarm_uses_the_data_dir(tmp_path):
    with embedded_broker(persistence=True, data_dir=str(tmp_path), disk_free_limit=2**62) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        blocked: list[str] = []
        conn.add_on_connection_blocked_callback(lambda _c, m: blocked.append(m.method.reason))
        assert broker.call(lambda: sorted(broker.server.alarms.active)) == ["disk"]
        ch = conn.channel()
        ch.queue_declare("disk-q")
        ch.basic_publish("", "disk-q", b"x")
        conn.process_data_events(time_limit=0.3)
        _set(broker, disk_free_limit=0)
        deadline = time.monotonic() + 10
        while _ready(broker, "disk-q") < 1 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert _ready(broker, "disk-q") == 1
        conn.close()
