"""Connection affinity for publishers to a named exchange, with real `leveret server
--workers 2` processes: a producer in confirm mode whose exchange leads to queues of
the other worker only moves there after its first routed publish was confirmed, and
its messages keep their confirms and order; one whose exchange reaches queues of
both workers, one without confirms, and a broker with affinity off keep it where
the kernel put it."""

from __future__ import annotations

import asyncio
import sys

import aio_pika
import kombu
import pika
import pytest

from leveret.ctl import call
from workers.procs import Workers, name_on, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

EXCHANGE = "wk-affinity2-x"


def linked(broker: Workers) -> Workers:
    wait_for(lambda: "worker 0 leveret.workers: link to worker 1 up" in broker.text())
    wait_for(lambda: "worker 1 leveret.workers: link to worker 0 up" in broker.text())
    return broker


def on_worker(broker: Workers, port: int) -> int | None:
    """The worker whose own ctl socket lists the connection from local port `port`."""
    found = []
    for w in range(2):
        rows = call(str(broker.data / f"worker-{w}" / "ctl.sock"), "list_connections", {})
        if any(r["name"] == f"127.0.0.1:{port}" and r.get("worker", w) == w for r in rows):
            found.append(w)
    assert len(found) <= 1, f"connection from port {port} listed on workers {found}"
    return found[0] if found else None


def pika_port(conn: pika.BlockingConnection) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def pika_on(broker: Workers, worker: int) -> pika.BlockingConnection:
    """A pika connection the kernel gave worker `worker`."""
    for _ in range(64):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        if on_worker(broker, pika_port(conn)) == worker:
            return conn
        conn.close()
    raise AssertionError(f"64 connections and none on worker {worker}")


def setup_exchange(broker: Workers, kind: str, *queues: str) -> pika.BlockingConnection:
    """Declares exchange EXCHANGE of `kind` with `queues` bound by their own names."""
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    ch = setup.channel()
    ch.exchange_declare(EXCHANGE, kind)
    for queue in queues:
        ch.queue_declare(queue)
        ch.queue_bind(queue, EXCHANGE, queue)
    return setup


def drain(setup: pika.BlockingConnection, queue: str) -> list[bytes]:
    ch = setup.channel()
    bodies = []
    while True:
        _method, _props, body = ch.basic_get(queue, auto_ack=True)
        if body is None:
            return bodies
        bodies.append(body)


def test_a_confirming_producer_moves_to_the_worker_its_exchange_leads_to(workers) -> None:
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity2-q")
    setup = setup_exchange(broker, "direct", queue)
    conn = pika_on(broker, 0)
    port = pika_port(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    # Each publish is confirmed (pika raises on a nack or a return): the first one
    # is routed and confirmed on worker 0, the connection moves at the second.
    for n in range(20):
        ch.basic_publish(EXCHANGE, queue, f"m{n}".encode(), mandatory=True)
    wait_for(lambda: on_worker(broker, port) == 1)
    assert f":{port} handed to worker 1" in broker.text()
    for n in range(20, 30):
        ch.basic_publish(EXCHANGE, queue, f"m{n}".encode(), mandatory=True)
    assert drain(setup, queue) == [f"m{n}".encode() for n in range(30)]
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_a_kombu_producer_moves_and_keeps_its_confirms_and_order(workers) -> None:
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity2-k")
    setup = setup_exchange(broker, "direct", queue)
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}//"
    for _ in range(64):
        conn = kombu.Connection(url, transport_options={"confirm_publish": True})
        conn.connect()
        port = conn.connection.sock.getsockname()[1]
        if on_worker(broker, port) == 0:
            break
        conn.release()
    else:
        raise AssertionError("64 connections and none on worker 0")
    producer = conn.Producer(exchange=kombu.Exchange(EXCHANGE, "direct", durable=False))
    for n in range(40):  # each publish waits for its confirm (confirm_publish)
        producer.publish({"n": n}, routing_key=queue, serializer="json", retry=False)
    wait_for(lambda: on_worker(broker, port) == 1)
    bodies = drain(setup, queue)
    assert [int(b.decode().split(":")[1].strip(" }")) for b in bodies] == list(range(40))
    conn.release()
    setup.close()
    assert broker.stop() == 0


def test_a_producer_whose_exchange_fans_out_to_both_workers_stays(workers) -> None:
    broker = linked(workers(2).wait_listening())
    here = name_on(0, "wk-affinity2-h")
    there = name_on(1, "wk-affinity2-t")
    setup = setup_exchange(broker, "fanout", here, there)
    conn = pika_on(broker, 0)
    port = pika_port(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    for n in range(10):
        ch.basic_publish(EXCHANGE, "", f"f{n}".encode(), mandatory=True)
    conn.process_data_events(time_limit=0.2)
    assert on_worker(broker, port) == 0
    assert f":{port} handed to worker" not in broker.text()
    expected = [f"f{n}".encode() for n in range(10)]
    assert drain(setup, here) == expected and drain(setup, there) == expected
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_a_producer_without_confirms_stays(workers) -> None:
    """Nothing tells when a message crossing to the other worker got there, so a
    move could let a later message overtake it: such a producer stays."""
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity2-n")
    setup = setup_exchange(broker, "direct", queue)
    conn = pika_on(broker, 0)
    port = pika_port(conn)
    ch = conn.channel()
    for n in range(50):
        ch.basic_publish(EXCHANGE, queue, f"u{n}".encode())
    wait_for(lambda: setup.channel().queue_declare(queue, passive=True).method.message_count == 50)
    assert on_worker(broker, port) == 0
    assert f":{port} handed to worker" not in broker.text()
    assert drain(setup, queue) == [f"u{n}".encode() for n in range(50)]
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_affinity_off_keeps_a_producer_to_an_exchange_where_it_is(workers) -> None:
    broker = linked(workers(2, "--worker-affinity", "off").wait_listening())
    queue = name_on(1, "wk-affinity2-o")
    setup = setup_exchange(broker, "direct", queue)
    conn = pika_on(broker, 0)
    port = pika_port(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    for n in range(10):
        ch.basic_publish(EXCHANGE, queue, f"o{n}".encode(), mandatory=True)
    conn.process_data_events(time_limit=0.2)
    assert on_worker(broker, port) == 0
    assert f":{port} handed to worker" not in broker.text()
    assert drain(setup, queue) == [f"o{n}".encode() for n in range(10)]
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_a_publish_with_cc_keeps_its_producer_and_an_unroutable_one_decides_nothing(
    workers,
) -> None:
    """An unroutable publish does not decide (the next one does); one whose CC header
    adds routing keys is not followed: its producer stays."""
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity2-c")
    setup = setup_exchange(broker, "direct", queue)
    cc = pika.BasicProperties(headers={"CC": [queue]})
    conn = pika_on(broker, 0)
    port = pika_port(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(EXCHANGE, "nowhere", b"lost")  # routed to no queue: no decision
    for n in range(5):
        ch.basic_publish(EXCHANGE, "nowhere", f"c{n}".encode(), cc, mandatory=True)
    conn.process_data_events(time_limit=0.2)
    assert on_worker(broker, port) == 0
    assert f":{port} handed to worker" not in broker.text()
    assert drain(setup, queue) == [f"c{n}".encode() for n in range(5)]
    conn.close()

    conn = pika_on(broker, 0)  # the same without CC: the routed publish decides
    port = pika_port(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(EXCHANGE, "nowhere", b"lost")
    for n in range(5):
        ch.basic_publish(EXCHANGE, queue, f"d{n}".encode(), mandatory=True)
    wait_for(lambda: on_worker(broker, port) == 1)
    assert drain(setup, queue) == [f"d{n}".encode() for n in range(5)]
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_a_producer_with_a_window_of_confirms_keeps_its_confirms_and_order(workers) -> None:
    """Publishes pipelined behind the deciding one: the connection moves only at an
    event where every confirm was sent (or stays, after the tries), so however its
    publishes fall into reads, each is confirmed once and the queue has them in order."""
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity2-w")
    setup = setup_exchange(broker, "direct", queue)

    async def produce() -> None:
        for attempt in range(64):
            name = f"windowed-{attempt}"
            conn = await aio_pika.connect(
                f"amqp://guest:guest@127.0.0.1:{broker.port}/",
                client_properties={"connection_name": name},
            )
            if name in broker.connection_names(0):
                break
            await conn.close()
        else:
            raise AssertionError("64 connections and none on worker 0")
        ch = await conn.channel(publisher_confirms=True)
        exchange = await ch.get_exchange(EXCHANGE)
        for batch in range(5):  # windows of 100 publishes, each confirmed (or raises)
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(f"w{batch * 100 + n}".encode()), queue, mandatory=True
                    )
                    for n in range(100)
                )
            )
        where = [w for w in range(2) if name in broker.connection_names(w)]
        assert len(where) == 1
        await conn.close()

    asyncio.run(produce())
    assert drain(setup, queue) == [f"w{n}".encode() for n in range(500)]
    setup.close()
    assert broker.stop() == 0
