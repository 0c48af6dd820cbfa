"""What comes back after a restart, and what must not."""

from __future__ import annotations

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
    store_dirs,
    tail,
)

pytestmark = pytest.mark.leveret_only


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _restart(broker, kill: bool = False):
    if kill:
        broker.kill()
    else:
        assert_exit_ok(broker)
    return broker.start()


def _exists(broker, kind: str, name: str) -> bool:
    """Passive declare on a fresh channel: True if it exists, False on 404."""
    conn = broker.connect()
    try:
        ch = conn.channel()
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404, exc
            return False
    finally:
        close_quietly(conn)


def _fence(ch) -> None:
    """A confirmed persistent publish: everything the broker wrote before it is on disk."""
    ch.queue_declare("fence", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "fence", b"fence", PERSISTENT)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_durable_topology_survives(brokers, kill):
    broker = brokers.start(name="topo")
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("d.x", "direct", durable=True)
    ch.exchange_declare("d.topic", "topic", durable=True)
    ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 1000})
    ch.queue_bind("d.q", "d.x", "k1")
    ch.exchange_bind("d.x", "d.topic", "#")  # exchange-to-exchange
    ch.exchange_declare("t.x", "fanout", durable=False)
    ch.queue_declare("t.q", durable=False)
    ch.queue_bind("t.q", "d.x", "k1")  # binding to a transient queue
    ch.queue_declare("excl.q", durable=True, exclusive=True)
    server_named = ch.queue_declare("", durable=True).method.queue
    ch.queue_declare("ad.q", durable=True, auto_delete=True)
    _fence(ch)
    if not kill:
        close_quietly(conn)
    _restart(broker, kill=kill)
    close_quietly(conn)

    assert _exists(broker, "exchange", "d.x")
    assert _exists(broker, "exchange", "d.topic")
    assert _exists(broker, "queue", "d.q")
    assert not _exists(broker, "exchange", "t.x")
    assert not _exists(broker, "queue", "t.q")
    assert not _exists(broker, "queue", "excl.q")
    assert not _exists(broker, "queue", server_named)

    conn = broker.connect()
    ch = conn.channel()
    # Same type and arguments are accepted; a different type is refused (type was kept).
    ch.exchange_declare("d.x", "direct", durable=True)
    ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 1000})
    ch.confirm_delivery()
    # Direct binding and exchange-to-exchange binding both route (mandatory: no return).
    ch.basic_publish("d.x", "k1", b"direct", PERSISTENT, mandatory=True)
    ch.basic_publish("d.topic", "k1", b"e2e", PERSISTENT, mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("d.x", "nope", b"x", PERSISTENT, mandatory=True)
    assert [b for b, _r, _p in drain_queue(ch, "d.q")] == [b"direct", b"e2e"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare("d.x", "fanout", durable=True)
    assert info.value.reply_code == 406
    close_quietly(conn)
    assert_exit_ok(broker)
    log = broker.log()
    assert "recovered" in log, tail(log)


def test_transient_messages_in_durable_queue_are_dropped(brokers):
    broker = brokers.start(name="transient")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("mix.q", durable=True)
    ch.queue_declare("transient.q", durable=False)
    expected = []
    for i in range(100):
        persistent = i % 3 == 0
        body = make_body(f"m{i}", 64)
        ch.basic_publish("", "mix.q", body, PERSISTENT if persistent else TRANSIENT)
        ch.basic_publish("", "transient.q", body, PERSISTENT)
        if persistent:
            expected.append(f"m{i}")
    assert ch.queue_declare("mix.q", passive=True).method.message_count == 100
    close_quietly(conn)
    _restart(broker)
    conn = broker.connect()
    ch = conn.channel()
    got = drain_queue(ch, "mix.q")
    assert [check_body(b) for b, _r, _p in got] == expected
    assert all(p.delivery_mode == 2 for _b, _r, p in got)
    close_quietly(conn)
    assert not _exists(broker, "queue", "transient.q")
    assert_exit_ok(broker)


def test_order_and_properties_preserved(brokers):
    broker = brokers.start(name="order")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("order.q", durable=True)
    for i in range(1000):
        props = pika.BasicProperties(
            delivery_mode=2,
            content_type="application/x-test",
            correlation_id=f"c{i}",
            priority=i % 10,
            headers={"n": i, "s": "é", "nested": {"a": [1, 2]}},
        )
        ch.basic_publish("", "order.q", make_body(f"{i}", i % 700), props)
    close_quietly(conn)
    _restart(broker)
    assert "1000 messages" in broker.run_log(), tail(broker.run_log())
    conn = broker.connect()
    got = drain_queue(conn.channel(), "order.q")
    close_quietly(conn)
    assert [check_body(b) for b, _r, _p in got] == [str(i) for i in range(1000)]
    for i, (_b, redelivered, p) in enumerate(got):
        assert not redelivered
        assert p.delivery_mode == 2 and p.content_type == "application/x-test"
        assert p.correlation_id == f"c{i}" and p.priority == i % 10
        assert p.headers == {"n": i, "s": "é", "nested": {"a": [1, 2]}}
    assert_exit_ok(broker)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_purge_and_delete_survive_restart(brokers, kill):
    broker = brokers.start(name="purge")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("p.x", "fanout", durable=True)
    for q in ("p.purged", "p.deleted", "p.kept"):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, "p.x")
    for i in range(300):
        ch.basic_publish("p.x", "", make_body(f"old{i}", 2000), PERSISTENT)
    # One delivered-but-unacked message in the purged queue: purge leaves it; ack removes it.
    method, _p, _b = ch.basic_get("p.purged")
    assert ch.queue_purge("p.purged").method.message_count == 299
    ch.basic_ack(method.delivery_tag)
    ch.queue_delete("p.deleted")
    ch.basic_publish("", "p.purged", make_body("new", 10), PERSISTENT)
    _fence(ch)
    if not kill:
        close_quietly(conn)
    _restart(broker, kill=kill)
    close_quietly(conn)
    for round_no in range(2):  # and once more, after a clean restart
        assert not _exists(broker, "queue", "p.deleted"), f"round {round_no}"
        conn = broker.connect()
        ch = conn.channel()
        if round_no == 0:
            assert [check_body(b) for b, _r, _p in drain_queue(ch, "p.purged")] == ["new"]
            kept = [check_body(ch.basic_get("p.kept", auto_ack=True)[2]) for _ in range(5)]
            assert kept == [f"old{i}" for i in range(5)]
        else:
            assert ch.queue_declare("p.purged", passive=True).method.message_count == 0
            assert ch.queue_declare("p.kept", passive=True).method.message_count == 295
        # Re-creating the deleted queue starts it empty, and the fanout binding is gone.
        ch.queue_declare("p.deleted", durable=True)
        assert ch.queue_declare("p.deleted", passive=True).method.message_count == 0
        ch.queue_delete("p.deleted")
        close_quietly(conn)
        _restart(broker)
    assert_exit_ok(broker)


def test_priority_queue_order_restored(brokers):
    broker = brokers.start(name="prio")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("prio.q", durable=True, arguments={"x-max-priority": 5})
    published = []
    for i in range(60):
        prio = (i * 7) % 8  # 0..7; above 5 counts as 5
        published.append((min(prio, 5), i))
        props = pika.BasicProperties(delivery_mode=2, priority=prio)
        ch.basic_publish("", "prio.q", make_body(f"{i}", 32), props)
    close_quietly(conn)
    expected = [str(i) for _p, i in sorted(published, key=lambda t: (-t[0], t[1]))]

    _restart(broker, kill=True)
    conn = broker.connect()
    ch = conn.channel()
    # The argument came back with the queue: redeclaring without it is refused.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("prio.q", durable=True)
    assert info.value.reply_code == 406
    ch = conn.channel()
    got = [check_body(b) for b, _r, _p in drain_queue(ch, "prio.q")]
    close_quietly(conn)
    assert got == expected
    assert_exit_ok(broker)


@pytest.mark.parametrize("fsync", ["always", "never", "batch"])
def test_fsync_modes_end_to_end(brokers, fsync):
    broker = brokers.start(name=f"fsync-{fsync}", fsync=fsync)
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("f.x", "direct", durable=True)
    ch.queue_declare("f.q", durable=True)
    ch.queue_bind("f.q", "f.x", "k")
    for i in range(300):
        ch.basic_publish("f.x", "k", make_body(f"{i}", (i * 131) % 5000), PERSISTENT)
    for _ in range(100):  # ack the first 100
        method, _p, _b = ch.basic_get("f.q")
        ch.basic_ack(method.delivery_tag)
    _fence(ch)
    # kill -9 of the broker process only: page cache survives, so even "never" keeps it all.
    _restart(broker, kill=True)
    close_quietly(conn)
    conn = broker.connect()
    ch = conn.channel()
    got = [check_body(b) for b, _r, _p in drain_queue(ch, "f.q")]
    assert got == [str(i) for i in range(100, 300)]
    ch.confirm_delivery()
    ch.basic_publish("f.x", "k", make_body("after", 10), PERSISTENT)
    close_quietly(conn)
    _restart(broker)
    conn = broker.connect()
    assert [check_body(b) for b, _r, _p in drain_queue(conn.channel(), "f.q")] == ["after"]
    close_quietly(conn)
    assert_exit_ok(broker)


def test_messages_of_an_undefined_queue_are_kept_not_deleted(brokers):
    """A data-loss trap: a queue whose definition is missing at start
    (lost, or in a vhost not loaded yet) keeps its messages on disk."""
    import sqlite3

    broker = brokers.start(name="orphans")
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for q in ("keep-a", "keep-b"):
        ch.queue_declare(q, durable=True)
        for i in range(5):
            ch.basic_publish("", q, make_body(f"{q}-{i}"), PERSISTENT)
    close_quietly(conn)
    assert_exit_ok(broker)
    # The definition of keep-a is lost.
    for store in store_dirs(broker.data_dir):  # every worker's catalog holds every queue
        db = sqlite3.connect(store / "definitions.db")
        with db:
            db.execute("DELETE FROM queues WHERE name = 'keep-a'")
        db.close()
    broker.start()
    assert "kept 5 message(s) of queue 'keep-a'" in broker.log()
    conn = broker.connect()
    ch = conn.channel()
    assert len(drain_queue(ch, "keep-b")) == 5
    ch.queue_declare("keep-a", durable=True)  # the definition comes back
    close_quietly(conn)
    assert_exit_ok(broker)
    broker.start()
    conn = broker.connect()
    bodies = [
        check_body(body) for body, _redelivered, _props in drain_queue(conn.channel(), "keep-a")
    ]
    assert bodies == [f"keep-a-{i}" for i in range(5)]
    close_quietly(conn)
