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
    ch.queue_bind(queue_on_0, "amq.direct", "durable-rk")  # both ends durable: stored
    ch.queue_bind(exclusive, "amq.direct", "durable-rk")  # its queue's owner sends it
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
    ch.basic_publish("amq.direct", "durable-rk", b"durable", mandatory=True)
    assert ch.basic_get(exclusive, auto_ack=True)[2] == b"durable"
    assert ch.basic_get(queue_on_0, auto_ack=True)[2] == b"durable"
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


# --- the order of syncs, in one process (tests/workers/inprocess.py), where the test
# links the restarted worker 0 to one worker, then to the other, when it chooses


def _restart_worker_0_linked_to(w, linked: list[int]) -> None:
    """Stop worker 0 and start it again from its store, linked to `linked` only."""
    from leveret.launcher import Node
    from leveret.workers.link import socket_pair
    from leveret.workers.mesh import Mesh

    async def go() -> None:
        await w.nodes[0].stop()
        w.meshes[0].close()
        mesh = Mesh(0, w.count)
        node = Node(w.worker_config(0), loop=w.loop, mesh=mesh)
        for peer in linked:
            await _link(w, mesh, peer)
        w.nodes[0], w.meshes[0] = node, mesh
        await node.start()

    async def _link(w, mesh, peer: int) -> None:
        a, b = socket_pair()
        await mesh.connect(peer, a)
        await w.meshes[peer].connect(0, b)

    w.run(go())


def _link_worker_0_to(w, peer: int) -> None:
    from leveret.workers.link import socket_pair

    async def go() -> None:
        a, b = socket_pair()
        await w.meshes[0].connect(peer, a)
        await w.meshes[peer].connect(0, b)

    w.run(go())


def _exchanges(w, index: int) -> dict[str, str]:
    def read() -> dict[str, str]:
        v = w.nodes[index].broker.vhosts["/"]
        return {e.name: e.type_name for e in v.exchanges.values() if e.name}

    return w.call(read)


def _bindings_from(w, index: int, source: str) -> list[tuple[str, str]]:
    def read() -> list[tuple[str, str]]:
        ex = w.nodes[index].broker.vhosts["/"].exchanges.get(source)
        if ex is None:
            return []
        return sorted((b.destination.name, b.routing_key) for b in ex.bindings.values())

    return w.call(read)


def _in_sync(w, index: int) -> bool:
    return w.call(lambda: w.nodes[index].metadata.in_sync)


def test_a_later_first_sync_brings_back_nothing_deleted_or_made_anew(tmp_path) -> None:
    from workers.inprocess import in_process_workers

    with in_process_workers(3, tmp_path) as w:
        c1 = pika.BlockingConnection(pika.URLParameters(w.url(1)))
        ch1 = c1.channel()
        ch1.exchange_declare("wk-transient-deleted", "fanout", durable=False)
        ch1.exchange_declare("wk-transient-anew", "direct", durable=False)
        ch1.exchange_declare("wk-transient-kept", "topic", durable=False)
        queue = ch1.queue_declare("", exclusive=True).method.queue  # worker 1's
        ch1.queue_bind(queue, "wk-transient-anew", "a")
        ch1.queue_bind(queue, "wk-transient-kept", "k.#")
        ch1.queue_bind(queue, "wk-transient-deleted", "")
        ch1.queue_bind(queue, "amq.topic", "unbound.later")  # durable exchange
        before = _exchanges(w, 2)
        assert before["wk-transient-anew"] == "direct"

        _restart_worker_0_linked_to(w, [])
        # Before any worker's first sync, a client of worker 0 makes another exchange
        # under a name the others hold: theirs, and its bindings, are not taken.
        c0 = pika.BlockingConnection(pika.URLParameters(w.url(0)))
        c0.channel().exchange_declare("wk-transient-anew", "fanout", durable=False)
        _link_worker_0_to(w, 1)
        wait_for(lambda: _in_sync(w, 1))
        assert not _in_sync(w, 2)
        # Worker 1's first sync brought the others back; then, before worker 2's first
        # sync, a client of worker 1 deletes one and unbinds a binding.
        assert {"wk-transient-deleted", "wk-transient-kept"} <= set(_exchanges(w, 0))
        ch1.exchange_delete("wk-transient-deleted")
        ch1.queue_unbind(queue, "amq.topic", "unbound.later")

        _link_worker_0_to(w, 2)
        wait_for(lambda: _in_sync(w, 2))
        for index in range(3):
            held = _exchanges(w, index)
            assert "wk-transient-deleted" not in held, index
            assert held["wk-transient-anew"] == "fanout", index
            assert held["wk-transient-kept"] == "topic", index
            assert _bindings_from(w, index, "wk-transient-anew") == [], index
            assert _bindings_from(w, index, "wk-transient-kept") == [(queue, "k.#")], index
            assert (queue, "unbound.later") not in _bindings_from(w, index, "amq.topic"), index
        c0.close()
        c1.close()
