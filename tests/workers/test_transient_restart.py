"""Transient exchanges and the bindings a restarted worker 0 never stored survive a
SIGKILL of worker 0, as they survive a node crash in a RabbitMQ cluster: a client of
worker 1, still connected, publishes through them afterwards, and a transient
exchange deleted before the kill stays deleted. A restart of the whole broker drops
them, as a one-process broker's restart does. Real `leveret server --workers 2`
processes (tests/workers/procs.py)."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from workers.procs import Workers, kill_and_wait, name_on, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

FANOUT = "wk-transient-fan"  # transient, auto-delete, bound to DIRECT
DIRECT = "wk-transient-direct"  # transient
GONE = "wk-transient-gone"  # transient, deleted before the kill
LONE = "wk-transient-lone"  # auto-delete, bound only to a transient queue of worker 0


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


@pytest.mark.parametrize("count", [2, 3])
def test_transient_exchanges_and_bindings_survive_a_restart_of_worker_0(workers, count) -> None:
    broker = workers(count).wait_listening()
    queue_on_0 = name_on(0, "wk-transient-q", count)
    client = broker.connect_to(1, "wk-transient-client")
    ch = client.channel()
    ch.confirm_delivery()
    exclusive = _declare(ch, queue_on_0)
    transient_on_0 = name_on(0, "wk-transient-tq", count)
    ch.exchange_declare(LONE, "fanout", durable=False, auto_delete=True)
    ch.queue_declare(transient_on_0, durable=False)
    ch.queue_bind(transient_on_0, LONE)
    assert _routed(ch, [exclusive, queue_on_0], b"before") == [b"before", b"before"]

    synced = [_syncs(broker, w) for w in range(count)]
    kill_and_wait(broker, 0)
    # every other worker took the new worker 0's snapshot
    wait_for(lambda: all(_syncs(broker, w) > synced[w] for w in range(1, count)))

    # The client of worker 1 never went away: its exchanges and bindings are there.
    assert _routed(ch, [exclusive, queue_on_0], b"after") == [b"after", b"after"]
    assert not _passive_exchange(client, GONE)
    # A transient queue of worker 0 went with it, and so did the auto-delete exchange
    # whose last binding was to it, as when a RabbitMQ node with the queue crashes.
    with pytest.raises(ChannelClosedByBroker) as gone:
        client.channel().queue_declare(transient_on_0, passive=True)
    assert gone.value.reply_code == 404
    assert not _passive_exchange(client, LONE)
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
    if count == 3:  # a third worker's model is worker 0's
        on_2 = broker.connect_to(2, "wk-transient-on-2")
        assert _passive_exchange(on_2, DIRECT)
        assert not _passive_exchange(on_2, GONE)
        assert not _passive_exchange(on_2, LONE)
        ch2 = on_2.channel()
        ch2.confirm_delivery()
        ch2.basic_publish(DIRECT, "rk", b"from worker 2", mandatory=True)
        assert ch.basic_get(exclusive, auto_ack=True)[2] == b"from worker 2"
        on_2.close()
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
