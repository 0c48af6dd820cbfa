"""Transient exchanges and the bindings a restarted worker 0 never stored survive a
SIGKILL of worker 0, as they survive a node crash in a RabbitMQ cluster: a client of
worker 1, still connected, publishes through them afterwards, and a transient
exchange deleted before the kill stays deleted. A restart of the whole broker drops
them, as a one-process broker's restart does. Real `leveret server --workers 2`
processes (tests/workers/procs.py)."""

from __future__ import annotations

import pika
from pika.exceptions import ChannelClosedByBroker

from workers.procs import Workers, kill_and_wait, name_on, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

FANOUT = "wk-transient-fan"  # transient, auto-delete, bound to DIRECT
DIRECT = "wk-transient-direct"  # transient
GONE = "wk-transient-gone"  # transient, deleted before the kill


def _syncs(broker: Workers, worker: int) -> int:
    return broker.text().count(f"worker {worker} in sync with worker 0")


def _declare(ch, queue_on_0: str) -> str:
    """The topology, declared through a channel of worker 1; returns the exclusive
    queue's name (owned by worker 1)."""
    ch.exchange_declare(DIRECT, "direct", durable=False)
    ch.exchange_declare(FANOUT, "fanout", durable=False, auto_delete=True)
    ch.exchange_bind(destination=DIRECT, source=FANOUT, routing_key="")
    ch.exchange_declare(GONE, "fanout", durable=False)
    exclusive = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(exclusive, DIRECT, "rk")
    ch.queue_bind(exclusive, GONE, "")
    ch.queue_declare(queue_on_0, durable=True)  # stored by worker 0
    ch.queue_bind(queue_on_0, DIRECT, "rk")  # not stored: its source is transient
    ch.exchange_delete(GONE)
    return exclusive


def _passive_exchange(conn: pika.BlockingConnection, name: str) -> bool:
    """Whether exchange `name` exists for this connection (a passive declare)."""
    ch = conn.channel()
    try:
        ch.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    ch.close()
    return True


def _routed(ch, queues: list[str], body: bytes) -> list[bytes | None]:
    """Publish `body` to FANOUT (mandatory, confirmed) and get one message from each
    queue."""
    ch.basic_publish(FANOUT, "rk", body, mandatory=True)
    got = []
    for queue in queues:
        _method, _props, message = ch.basic_get(queue, auto_ack=True)
        got.append(message)
    return got


def test_transient_exchanges_and_bindings_survive_a_restart_of_worker_0(workers) -> None:
    broker = workers(2).wait_listening()
    queue_on_0 = name_on(0, "wk-transient-q")
    client = broker.connect_to(1, "wk-transient-client")
    ch = client.channel()
    ch.confirm_delivery()
    exclusive = _declare(ch, queue_on_0)
    assert _routed(ch, [exclusive, queue_on_0], b"before") == [b"before", b"before"]

    synced = _syncs(broker, 1)
    kill_and_wait(broker, 0)
    wait_for(lambda: _syncs(broker, 1) > synced)  # worker 1 took the new worker 0's snapshot

    # The client of worker 1 never went away: its exchanges and bindings are there.
    assert _routed(ch, [exclusive, queue_on_0], b"after") == [b"after", b"after"]
    assert not _passive_exchange(client, GONE)
    # Worker 0 has them too: it routes a publish of its own client the same way, and
    # a metadata change through it (a bind) finds the transient exchange.
    on_0 = broker.connect_to(0, "wk-transient-on-0")
    assert _passive_exchange(on_0, DIRECT)
    assert _passive_exchange(on_0, FANOUT)
    assert not _passive_exchange(on_0, GONE)
    ch0 = on_0.channel()
    ch0.confirm_delivery()
    ch0.basic_publish(FANOUT, "rk", b"from worker 0", mandatory=True)
    assert ch.basic_get(exclusive, auto_ack=True)[2] == b"from worker 0"
    assert ch0.basic_get(queue_on_0, auto_ack=True)[2] == b"from worker 0"
    ch.queue_bind(exclusive, DIRECT, "rk2")
    ch0.basic_publish(DIRECT, "rk2", b"rk2", mandatory=True)
    assert ch.basic_get(exclusive, auto_ack=True)[2] == b"rk2"

    # An auto-delete exchange still goes when its last binding does.
    ch.exchange_unbind(destination=DIRECT, source=FANOUT, routing_key="")
    assert not _passive_exchange(on_0, FANOUT)
    assert not _passive_exchange(client, FANOUT)
    on_0.close()
    client.close()


def test_a_restart_of_the_whole_broker_drops_transient_exchanges(workers) -> None:
    broker = workers(2).wait_listening()
    queue_on_0 = name_on(0, "wk-transient-q")
    client = broker.connect_to(1, "wk-transient-client")
    ch = client.channel()
    _declare(ch, queue_on_0)
    client.close()
    assert broker.stop() == 0
    broker.log.rename(broker.log.with_name("server-first.log"))  # the next start's log

    again = workers(2).wait_listening()
    conn = again.connect("wk-transient-again")
    assert not _passive_exchange(conn, DIRECT)
    assert not _passive_exchange(conn, FANOUT)
    conn.channel().queue_declare(queue_on_0, passive=True)  # durable: kept
    conn.close()
    # (stopped here: the fixture's teardown of the first broker reads the status
    # file, which is this one's now)
    assert again.stop() == 0
