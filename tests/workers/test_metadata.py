"""Metadata in a broker of several workers: one writer (worker 0), every change on
every worker in one order, placement, exclusivity, cascades, restarts and resyncs.

The workers run in one process (tests/workers/inprocess.py) with real links between
them; clients are pika connections to different workers' ports."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from tests.workers.inprocess import InProcessWorkers, in_process_workers

from leveret.broker.queues.remote import RemoteOwner, RemoteQueue
from leveret.workers.mesh import placement


@pytest.fixture
def workers() -> Iterator[InProcessWorkers]:
    with in_process_workers(3) as w:
        yield w


def connect(w: InProcessWorkers, index: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(w.url(index)))


def name_owned_by(worker: int, count: int, prefix: str = "q") -> str:
    """A queue name that placement gives to `worker`."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if placement("/", name, count) == worker:
            return name
    raise AssertionError("no such name")


def vhost(w: InProcessWorkers, index: int) -> Any:
    return w.nodes[index].broker.vhosts["/"]


def topology(w: InProcessWorkers, index: int) -> dict[str, Any]:
    """What a worker's model holds: exchanges, queues with owners, bindings."""

    def read() -> dict[str, Any]:
        v = vhost(w, index)
        return {
            "exchanges": sorted(
                (e.name, e.type_name, e.durable, e.auto_delete) for e in v.exchanges.values()
            ),
            "queues": sorted(
                (q.name, q.worker if type(q) is RemoteQueue else index, q.durable)
                for q in v.queues.values()
            ),
            "bindings": sorted(
                (b.source.name, b.destination.name, b.routing_key)
                for e in v.exchanges.values()
                for b in e.bindings.values()
            ),
        }

    return w.call(read)


def test_declare_on_one_worker_is_seen_by_all(workers: InProcessWorkers) -> None:
    w = workers
    c1 = connect(w, 1)
    ch1 = c1.channel()
    names = [name_owned_by(k, 3) for k in range(3)]
    for name in names:
        ok = ch1.queue_declare(name, durable=True)
        assert ok.method.queue == name
    c0 = connect(w, 0)
    ch0 = c0.channel()
    for name in names:
        assert ch0.queue_declare(name, passive=True).method.message_count == 0
    views = [topology(w, i) for i in range(3)]
    assert views[0] == views[1] == views[2]
    for k, name in enumerate(names):
        assert (name, k, True) in views[0]["queues"]
        for i in range(3):
            queue = w.call(lambda i=i, name=name: vhost(w, i).queues[name])
            assert (type(queue) is RemoteQueue) == (i != k)
    # a publish on worker 0 right after a declare on worker 2 finds the queue
    c2 = connect(w, 2)
    ch2 = c2.channel()
    ch2.exchange_declare("wk-fan", "fanout")
    ch2.queue_bind(names[0], "wk-fan")
    ch0.confirm_delivery()
    ch0.basic_publish("", names[0], b"hello", mandatory=True)
    for c in (c0, c1, c2):
        c.close()


def test_conflicting_exchange_declares_one_wins(workers: InProcessWorkers) -> None:
    w = workers
    conns = [connect(w, i) for i in (1, 2)]
    results: dict[str, Any] = {}

    def declare(conn: pika.BlockingConnection, kind: str) -> None:
        ch = conn.channel()
        try:
            ch.exchange_declare("wk-race", kind)
            results[kind] = "ok"
        except ChannelClosedByBroker as exc:
            results[kind] = (exc.reply_code, exc.reply_text)

    threads = [
        threading.Thread(target=declare, args=(conns[0], "direct")),
        threading.Thread(target=declare, args=(conns[1], "topic")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r == "ok" for r in results.values()) == [False, True]
    winner = next(k for k, r in results.items() if r == "ok")
    loser = next(k for k, r in results.items() if r != "ok")
    assert results[loser] == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'wk-race' in vhost '/': "
        f"received '{loser}' but current is '{winner}'",
    )
    for i in range(3):
        assert ("wk-race", winner, False, False) in topology(w, i)["exchanges"]
    for c in conns:
        c.close()


def test_bindings_and_delete_cascades_everywhere(workers: InProcessWorkers) -> None:
    w = workers
    c1 = connect(w, 1)
    ch = c1.channel()
    ch.exchange_declare("wk-auto", "direct", auto_delete=True)
    ch.exchange_declare("wk-dest", "fanout")
    q = name_owned_by(2, 3, "bound")
    ch.queue_declare(q)
    ch.queue_bind(q, "wk-auto", "k1")
    ch.exchange_bind("wk-dest", "wk-auto", "k2")
    views = [topology(w, i) for i in range(3)]
    assert views[0] == views[1] == views[2]
    assert ("wk-auto", q, "k1") in views[0]["bindings"]
    assert ("wk-auto", "wk-dest", "k2") in views[0]["bindings"]
    ch.queue_unbind(q, "wk-auto", "k1")
    ch.exchange_unbind("wk-dest", "wk-auto", "k2")  # the last binding: wk-auto goes
    for i in range(3):
        view = topology(w, i)
        assert not [e for e in view["exchanges"] if e[0] == "wk-auto"]
        assert not [b for b in view["bindings"] if b[0] == "wk-auto"]
    ch.exchange_declare("wk-auto2", "direct", auto_delete=True)
    ch.queue_bind(q, "wk-auto2", "k")
    c0 = connect(w, 0)
    c0.channel().queue_delete(q)  # deleted on worker 0; owned by worker 2
    views = [topology(w, i) for i in range(3)]
    assert views[0] == views[1] == views[2]
    assert q not in [x[0] for x in views[0]["queues"]]
    assert "wk-auto2" not in [e[0] for e in views[0]["exchanges"]]
    c0.close()
    c1.close()


def test_exclusive_queue_is_locked_elsewhere_and_goes_with_its_connection(
    workers: InProcessWorkers,
) -> None:
    w = workers
    c1 = connect(w, 1)
    ch1 = c1.channel()
    name = ch1.queue_declare("", exclusive=True).method.queue
    named = name_owned_by(0, 3, "excl")
    ch1.queue_declare(named, exclusive=True)  # exclusive: on worker 1, not its hash owner
    for q in (name, named):
        assert (q, 1, False) in topology(w, 0)["queues"]
        owner = w.call(lambda q=q: vhost(w, 2).queues[q].exclusive_owner)
        assert type(owner) is RemoteOwner and owner.worker == 1
    c0 = connect(w, 0)
    for q in (name, named):
        with pytest.raises(ChannelClosedByBroker) as err:
            c0.channel().queue_declare(q, passive=True)
        assert err.value.reply_code == 405
        assert err.value.reply_text.startswith(
            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}'"
        )
    ch1.queue_declare(named, exclusive=True)  # its own connection may redeclare it
    c1.close()
    for _ in range(100):
        if all(name not in [x[0] for x in topology(w, i)["queues"]] for i in range(3)):
            break
        threading.Event().wait(0.05)
    for i in range(3):
        names = [x[0] for x in topology(w, i)["queues"]]
        assert name not in names and named not in names
    c0.close()


def test_placement_is_kept_across_restarts(tmp_path: Path) -> None:
    names = [name_owned_by(k, 2, "keep") for k in range(2)]
    with in_process_workers(2, tmp_path) as w:
        conn = connect(w, 1)
        ch = conn.channel()
        ch.exchange_declare("wk-keep", "topic", durable=True)
        for name in names:
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, "wk-keep", "a.#")
        before = [topology(w, i) for i in range(2)]
        conn.close()
    assert before[0] == before[1]
    with in_process_workers(2, tmp_path) as w:
        after = [topology(w, i) for i in range(2)]
        assert after == before
        conn = connect(w, 0)
        assert conn.channel().queue_declare(names[1], passive=True).method.queue == names[1]
        conn.close()


def test_a_worker_that_missed_changes_resyncs(workers: InProcessWorkers) -> None:
    w = workers
    # worker 2's link to worker 0 breaks: it misses what follows, then rejoins
    w.call(lambda: w.meshes[0].links[2].close())
    c1 = connect(w, 1)
    ch = c1.channel()
    ch.exchange_declare("wk-missed", "direct")
    q = name_owned_by(1, 3, "missed")
    ch.queue_declare(q)
    ch.queue_bind(q, "wk-missed", "r")
    c0 = connect(w, 0)  # an exclusive, server-named queue of worker 0 (amq.gen-...)
    generated = c0.channel().queue_declare("", exclusive=True).method.queue
    assert "wk-missed" not in [e[0] for e in topology(w, 2)["exchanges"]]

    async def relink() -> None:
        from leveret.workers.link import socket_pair

        a, b = socket_pair()
        await w.meshes[0].connect(2, a)
        await w.meshes[2].connect(0, b)

    w.run(relink())
    for _ in range(100):
        if topology(w, 2) == topology(w, 0):
            break
        threading.Event().wait(0.05)
    assert topology(w, 2) == topology(w, 0)
    assert (generated, 0, False) in topology(w, 2)["queues"]
    c0.close()
    c1.close()


def test_changes_while_worker_0_is_down_fail_clearly(workers: InProcessWorkers) -> None:
    w = workers
    c1 = connect(w, 1)
    ch = c1.channel()
    ch.queue_declare(name_owned_by(1, 3, "before"))
    w.nodes[1].metadata.writer_wait = 0.5  # (the time worker 0 has to be back)
    w.call(lambda: [w.meshes[0].links[p].close() for p in (1, 2)])
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        ch.exchange_declare("wk-nowriter", "direct")
    assert err.value.reply_code == 541
    assert "metadata writer (worker 0" in err.value.reply_text


def test_queue_whose_owner_is_down_answers_as_rabbitmq(workers: InProcessWorkers) -> None:
    w = workers
    name = name_owned_by(2, 3, "home")
    c0 = connect(w, 0)
    c0.channel().queue_declare(name, durable=True)
    w.call(lambda: [w.meshes[2].links[p].close() for p in (0, 1)])
    for index in (0, 1):
        conn = connect(w, index)
        with pytest.raises(ChannelClosedByBroker) as err:
            conn.channel().queue_declare(name, durable=True)
        assert (err.value.reply_code, err.value.reply_text) == (
            404,
            f"NOT_FOUND - home node 'leveret-2@localhost' of durable queue '{name}' in "
            "vhost '/' is down or inaccessible",
        )
        conn.close()
    c0.close()


def wait_until(check: Any, timeout: float = 10) -> bool:
    for _ in range(int(timeout / 0.05)):
        if check():
            return True
        threading.Event().wait(0.05)
    return bool(check())


def queue_names(w: InProcessWorkers, index: int) -> list[str]:
    return [x[0] for x in topology(w, index)["queues"]]


def test_model_made_deletions_reach_every_worker(workers: InProcessWorkers) -> None:
    w = workers
    auto = name_owned_by(1, 3, "auto")
    expiring = name_owned_by(2, 3, "expiring")
    c0 = connect(w, 0)
    ch0 = c0.channel()
    ch0.queue_declare(auto, auto_delete=True)
    ch0.queue_declare(expiring, arguments={"x-expires": 300})
    assert all(auto in queue_names(w, i) and expiring in queue_names(w, i) for i in range(3))
    c1 = connect(w, 1)  # the owner's own worker: a consumer there, then none
    ch1 = c1.channel()
    tag = ch1.basic_consume(auto, lambda *a: None)
    ch1.basic_cancel(tag)
    assert wait_until(lambda: all(auto not in queue_names(w, i) for i in range(3)))
    assert wait_until(lambda: all(expiring not in queue_names(w, i) for i in range(3)))
    c0.close()
    c1.close()


def test_admin_changes_reach_every_worker(workers: InProcessWorkers) -> None:
    w = workers
    admin = w.nodes[0].broker.admin

    def change() -> None:
        admin.add_vhost("wk-meta-v")
        admin.add_user("wk-meta-u", "secret", ["management"])
        admin.set_permissions("wk-meta-u", "wk-meta-v", ".*", ".*", ".*")
        admin.set_policy("wk-meta-v", "wk-ttl", "^ttl", {"message-ttl": 1000}, 0, "queues")

    w.call(change)
    w.run(w.nodes[0].broker.meta.settled())
    for i in range(3):
        broker = w.nodes[i].broker
        assert w.call(lambda b=broker: "wk-meta-v" in b.vhosts)
        assert w.call(lambda b=broker: "wk-ttl" in b.vhosts["wk-meta-v"].policies)
    params = pika.URLParameters(f"amqp://wk-meta-u:secret@127.0.0.1:{w.port(2)}/wk-meta-v")
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare("ttl-q")
    conn.close()
    assert "ttl-q" in w.call(lambda: list(w.nodes[1].broker.vhosts["wk-meta-v"].queues))
    with pytest.raises(Exception, match="cannot change metadata itself"):
        w.call(lambda: w.nodes[1].broker.admin.add_vhost("wk-elsewhere"))
    w.call(lambda: admin.delete_vhost("wk-meta-v"))
    w.run(w.nodes[0].broker.meta.settled())
    for i in range(3):
        assert w.call(lambda i=i: "wk-meta-v" not in w.nodes[i].broker.vhosts)


def test_management_api_changes_go_through_the_writer() -> None:
    import json
    import urllib.request

    with in_process_workers(2, management_port=0) as w:
        port = w.nodes[0].management.port
        name = name_owned_by(1, 2, "http")

        def request(method: str, path: str, body: Any = None) -> int:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, method=method)
            req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req) as response:
                return response.status

        assert request("PUT", f"/api/queues/%2F/{name}", {"durable": True}) == 201
        assert request("PUT", "/api/exchanges/%2F/wk-http", {"type": "topic"}) == 201
        assert request("POST", f"/api/bindings/%2F/e/wk-http/q/{name}", {"routing_key": "a"})
        for i in range(2):
            view = topology(w, i)
            assert (name, 1, True) in view["queues"]
            assert ("wk-http", name, "a") in view["bindings"]
        assert request("DELETE", f"/api/queues/%2F/{name}") == 204
        assert request("DELETE", "/api/exchanges/%2F/wk-http") == 204
        for i in range(2):
            assert name not in queue_names(w, i)
            assert "wk-http" not in [e[0] for e in topology(w, i)["exchanges"]]


def test_a_resync_brings_admin_changes_too(workers: InProcessWorkers) -> None:
    w = workers
    w.call(lambda: w.meshes[0].links[2].close())
    admin = w.nodes[0].broker.admin
    w.call(lambda: admin.add_vhost("wk-missed-v"))
    w.call(lambda: admin.add_user("wk-missed-u", "pw", []))
    assert not w.call(lambda: "wk-missed-v" in w.nodes[2].broker.vhosts)

    async def relink() -> None:
        from leveret.workers.link import socket_pair

        a, b = socket_pair()
        await w.meshes[0].connect(2, a)
        await w.meshes[2].connect(0, b)

    w.run(relink())
    assert wait_until(lambda: w.call(lambda: "wk-missed-v" in w.nodes[2].broker.vhosts))
    assert w.call(lambda: "wk-missed-u" in w.nodes[2].broker.access.users)


def restart(w: InProcessWorkers, index: int) -> None:
    """Stop worker `index` and start it again from its store, with new links."""
    from leveret.launcher import Node
    from leveret.workers.link import socket_pair
    from leveret.workers.mesh import Mesh

    async def go() -> None:
        await w.nodes[index].stop()
        w.meshes[index].close()
        mesh = Mesh(index, w.count)
        node = Node(w.worker_config(index), loop=w.loop, mesh=mesh)
        for peer in range(w.count):
            if peer != index:
                a, b = socket_pair()
                await mesh.connect(peer, a)
                await w.meshes[peer].connect(index, b)
        w.nodes[index], w.meshes[index] = node, mesh
        await node.start()

    w.run(go())


def test_workers_resync_when_worker_0_restarts(tmp_path: Path) -> None:
    with in_process_workers(3, tmp_path) as w:
        transient = name_owned_by(1, 3, "transient")
        durable = name_owned_by(2, 3, "durable")
        conn = connect(w, 1)
        ch = conn.channel()
        ch.exchange_declare("wk-restart", "direct", durable=True)
        ch.queue_declare(transient)  # worker 0 keeps it in memory only
        ch.queue_bind(transient, "wk-restart", "t")
        ch.queue_declare(durable, durable=True)
        ch.queue_bind(durable, "wk-restart", "d")
        before = topology(w, 1)
        restart(w, 0)
        assert wait_until(lambda: all(topology(w, i) == before for i in range(3)))
        ch.queue_declare(transient, passive=True)
        ch.exchange_declare("wk-after", "fanout")  # worker 0 writes again
        assert all("wk-after" in [e[0] for e in topology(w, i)["exchanges"]] for i in range(3))
        conn.close()


def test_a_restarted_worker_keeps_its_queues_and_messages(tmp_path: Path) -> None:
    with in_process_workers(2, tmp_path) as w:
        mine = name_owned_by(1, 2, "kept")
        gone = name_owned_by(1, 2, "transient")
        conn = connect(w, 1)
        ch = conn.channel()
        ch.queue_declare(mine, durable=True)
        ch.queue_declare(gone)  # in worker 1's memory only: lost with its restart
        ch.confirm_delivery()
        ch.basic_publish("", mine, b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
        assert gone in queue_names(w, 0)
        restart(w, 1)
        assert wait_until(lambda: gone not in queue_names(w, 0))
        assert topology(w, 0) == topology(w, 1)
        conn = connect(w, 1)
        ch = conn.channel()
        assert ch.queue_declare(mine, passive=True).method.message_count == 1
        method, _props, body = ch.basic_get(mine, auto_ack=True)
        assert body == b"kept"
        conn.close()
        conn = connect(w, 0)  # counts of a queue another worker owns: from the owner
        assert conn.channel().queue_declare(mine, durable=True).method.message_count == 0
        conn.close()


def test_a_connection_holds_what_follows_a_change_in_flight(workers: InProcessWorkers) -> None:
    """Pipelined, without waiting for any answer (nowait): each method must see what
    the ones before it changed, as on one process."""
    from pamqp import commands
    from tests.rawamqp import RawClient, method_frame

    w = workers
    name = name_owned_by(2, 3, "pipelined")
    with RawClient("127.0.0.1", w.port(1)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(
            method_frame(1, commands.Exchange.Declare(exchange="wk-pipe", nowait=True))
            + method_frame(1, commands.Queue.Declare(queue=name, nowait=True))
            + method_frame(
                1,
                commands.Queue.Bind(queue=name, exchange="wk-pipe", routing_key="k", nowait=True),
            )
            + method_frame(
                1, commands.Queue.Unbind(queue=name, exchange="wk-pipe", routing_key="k")
            )
            + method_frame(1, commands.Queue.Declare(queue=name, passive=True))
        )
        c.wait_for(commands.Queue.UnbindOk, timeout=10)
        _ch, ok = c.wait_for(commands.Queue.DeclareOk, timeout=10)
        assert ok.queue == name
    for i in range(3):
        assert ("wk-pipe", "direct", False, False) in topology(w, i)["exchanges"]
        assert (name, 2, False) in topology(w, i)["queues"]


QUORUM = {"x-queue-type": "quorum"}
QUORUM_NAME = "wk-err-quorum-2"  # owned by worker 2 of 3


def _error_replies(url: str) -> list[tuple[int, str]]:
    """The broker's answers to refused metadata changes, one channel each."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    attempts = [
        lambda ch: ch.exchange_declare("wk-err", "direct"),
        lambda ch: ch.exchange_declare("wk-err", "fanout"),
        lambda ch: ch.exchange_declare("amq.wk", "direct"),
        lambda ch: ch.queue_declare("amq.wk"),
        lambda ch: ch.queue_declare("wk-err-q", arguments={"x-message-ttl": "soon"}),
        lambda ch: ch.queue_declare("wk-err-q", arguments={"x-max-length": -1}),
        lambda ch: ch.queue_declare("wk-err-q2", durable=True),
        lambda ch: ch.queue_declare("wk-err-q2", durable=False),
        lambda ch: ch.queue_bind("wk-err-q2", "wk-missing"),
        lambda ch: ch.exchange_bind("wk-err", "wk-missing"),
        lambda ch: ch.exchange_delete("amq.direct"),
        lambda ch: ch.queue_declare("wk-missing", passive=True),
        lambda ch: ch.exchange_declare("wk-missing", "direct", passive=True),
        # a queue type's own refusals, checked by worker 0 for a queue it will not own
        lambda ch: ch.queue_declare("wk-err-qx", durable=True, exclusive=True, arguments=QUORUM),
        lambda ch: ch.queue_declare("wk-err-qt", durable=False, arguments=QUORUM),
        lambda ch: ch.queue_declare(QUORUM_NAME, durable=True, arguments=QUORUM),
        lambda ch: ch.queue_declare(QUORUM_NAME, durable=True),  # compared as a quorum queue
    ]
    replies = []
    for attempt in attempts:
        ch = conn.channel()
        try:
            attempt(ch)
            replies.append((200, "ok"))
        except ChannelClosedByBroker as exc:
            replies.append((exc.reply_code, exc.reply_text))
        if ch.is_open:
            ch.close()
    conn.channel().queue_delete("wk-err-q2")
    conn.channel().queue_delete(QUORUM_NAME)
    conn.channel().exchange_delete("wk-err")
    conn.close()
    return replies


def test_refusals_cross_workers_unchanged(workers: InProcessWorkers) -> None:
    """Checked on worker 0 and refused there, a change gets the same answer on every
    worker as on a broker of one process (whose answers tests/compat records)."""
    from leveret.testing import embedded_broker

    with embedded_broker() as one:
        expected = _error_replies(one.url)
    assert [code for code, _ in expected].count(200) == 3  # the first declares
    for index in (0, 1, 2):
        assert _error_replies(workers.url(index)) == expected


def test_queue_churn_counts_on_the_owner_only(workers: InProcessWorkers) -> None:
    w = workers
    before = [w.call(lambda i=i: list(vhost(w, i).churn)) for i in range(3)]
    conn = connect(w, 1)
    ch = conn.channel()
    name = name_owned_by(2, 3, "churn")
    ch.queue_declare(name)
    ch.queue_declare(name)
    ch.queue_delete(name)
    conn.close()
    after = [w.call(lambda i=i: list(vhost(w, i).churn)) for i in range(3)]
    deltas = [
        [a - b for a, b in zip(x, y, strict=True)] for x, y in zip(after, before, strict=True)
    ]
    assert deltas == [[0, 0, 0], [0, 0, 0], [2, 1, 1]]


def test_what_mqtt_makes_on_worker_0_reaches_the_others() -> None:
    """MQTT listens on worker 0; its subscriptions' queues and bindings are made by
    worker 0's model itself, and the other workers get them as made changes."""
    from tests.mqttraw import RawMQTT

    from leveret.mqtt import packets

    with in_process_workers(2, mqtt_port=0) as w:
        with RawMQTT(w.nodes[0].mqtt.port) as client:
            client.connect("wk-meta-client", clean=False)
            client.send(packets.Subscribe(1, [packets.Subscription("wk/meta", 1)]))
            assert isinstance(client.recv(), packets.Suback)
            views = [topology(w, i) for i in range(2)]
            assert views[0] == views[1]
            bound = [b for b in views[1]["bindings"] if b[0] == "amq.topic" and b[2] == "wk.meta"]
            assert len(bound) == 1
            assert (bound[0][1], 0, True) in views[1]["queues"]
        with RawMQTT(w.nodes[0].mqtt.port) as client:  # a clean session's queue
            client.connect("wk-meta-clean", clean=True)
            client.send(packets.Subscribe(1, [packets.Subscription("wk/clean", 0)]))
            assert isinstance(client.recv(), packets.Suback)
            views = [topology(w, i) for i in range(2)]
            assert views[0] == views[1]
            assert [b for b in views[1]["bindings"] if b[2] == "wk.clean"]
        assert wait_until(lambda: not [b for b in topology(w, 1)["bindings"] if b[2] == "wk.clean"])
        assert topology(w, 0) == topology(w, 1)


def test_a_worker_that_cannot_apply_a_change_resyncs(workers: InProcessWorkers) -> None:
    w = workers
    conn = connect(w, 1)
    ch = conn.channel()
    ch.exchange_declare("wk-diverged", "direct")
    q = name_owned_by(1, 3, "diverged")
    ch.queue_declare(q)
    # worker 2's model loses the exchange behind the writer's back
    w.call(lambda: vhost(w, 2)._remove_exchange(vhost(w, 2).exchanges["wk-diverged"]))
    ch.queue_bind(q, "wk-diverged", "k")  # worker 2 cannot apply it: it syncs
    assert wait_until(lambda: topology(w, 2) == topology(w, 0))
    assert ("wk-diverged", q, "k") in topology(w, 2)["bindings"]
    conn.close()


def test_metadata_across_worker_processes(tmp_path: Path) -> None:
    """`leveret server --workers 2`: what a client declares on one worker process
    holds on the other at once, exclusivity included, and after a SIGKILL of worker
    0 the restarted writer has it all again (the survivor syncs with it)."""
    import os
    import signal

    from tests.workers.procs import Workers, wait_for

    # Affinity off: each connection stays on the worker it is tested on (with it on,
    # the one on worker 1 would move to worker 0, which owns the first queue it names).
    broker = Workers(tmp_path, 2, "--worker-affinity", "off").wait_listening()
    try:
        on = [broker.connect_to(i, f"wk-meta-{i}") for i in (0, 1)]
        names = [name_owned_by(k, 2, "proc") for k in (0, 1)]
        for i, conn in enumerate(on):
            ch = conn.channel()
            ch.exchange_declare(f"wk-proc-{i}", "topic", durable=True)
            for name in names:
                ch.queue_declare(name, durable=True)
                ch.queue_bind(name, f"wk-proc-{i}", f"k{i}")
        mine = on[1].channel().queue_declare("", exclusive=True).method.queue
        for conn in on:
            ch = conn.channel()
            for i in (0, 1):
                ch.exchange_declare(f"wk-proc-{i}", "topic", passive=True)
            for name in names:
                ch.queue_declare(name, passive=True)
        with pytest.raises(ChannelClosedByBroker) as err:
            on[0].channel().queue_declare(mine, passive=True)
        assert err.value.reply_code == 405
        before = broker.status()["workers"][0]
        os.kill(before["pid"], signal.SIGKILL)

        def back() -> bool:
            """worker 0 serves again"""
            w = broker.status()["workers"][0]
            return w["pid"] != before["pid"] and w["ready"]

        wait_for(back)
        conn = broker.connect_to(0, "wk-meta-after")
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name, passive=True)
        with pytest.raises(ChannelClosedByBroker) as err:  # worker 1's, from its sync
            ch.queue_declare(mine, passive=True)
        assert err.value.reply_code == 405
        on[1].channel().exchange_declare("wk-proc-after", "direct")  # the writer is back
        conn.channel().exchange_declare("wk-proc-after", "direct", passive=True)
        conn.close()
        on[1].close()
        assert broker.stop() == 0
    finally:
        broker.kill()
