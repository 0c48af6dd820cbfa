"""Messages crossing between workers: publishes to a queue another worker owns, with
confirms; consumers, acks, nacks and closes across the link; basic.get and purge;
order; persistence on the owner; and a worker that goes away.

Real clients (pika, aio-pika) on different workers' ports of an in-process broker
of two workers (tests/workers/inprocess.py); the queues are placed by
tests/workers/placing.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest

from leveret.protocol.constants import ACCESS_REFUSED, NOT_FOUND
from leveret.workers import link as records
from workers.inprocess import InProcessWorkers, in_process_workers
from workers.placing import declare_exchange, owned, place

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def wait_for(what: Callable[[], Any], timeout: float = 20.0, poll: Any = None) -> Any:
    """Polls `what()` (after `poll()`, e.g. a client's event pump) until it is true."""
    deadline = time.monotonic() + timeout
    while True:
        if poll is not None:
            poll()
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def counts(w: InProcessWorkers, owner: int, name: str) -> tuple[int, int, int]:
    """(ready, unacked, consumers) of the real queue on its owner."""

    def read() -> tuple[int, int, int]:
        queue = owned(w, owner, name)
        return queue.message_count, queue.unacked, len(queue.consumers)

    return w.call(read)


def connect(w: InProcessWorkers, index: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(w.url(index)))


def flow_paused(w: InProcessWorkers) -> bool:
    """Whether a connection of worker 0 is paused for flow (a full link, a queue far
    behind); runs on the workers' loop: `w.call(lambda: flow_paused(w))`."""
    return any("flow" in c.publisher_pause.reasons for c in w.nodes[0].connections)


def squeeze_link(w: InProcessWorkers) -> tuple[Any, Any]:
    """Worker 0's link to worker 1 made small (64 KiB) and worker 1's end of it no
    longer read, so that it fills: (the link, its peer end)."""
    link = w.meshes[0].links[1]
    peer = w.meshes[1].links[0]

    def squeeze() -> None:
        link.high_water = 64 << 10
        link.transport.set_write_buffer_limits(high=64 << 10, low=16 << 10)
        peer.pause_reading()  # the owner stops taking records

    w.call(squeeze)
    return link, peer


def publish_in_thread(
    w: InProcessWorkers, queue: str, count: int, size: int
) -> tuple[pika.BlockingConnection, threading.Thread]:
    """A connection to worker 0 and a started thread publishing `count` messages of
    `size` bytes to `queue` on it; the thread blocks while the broker pauses it (or
    stops reading it)."""
    conn = connect(w, 0)

    def publish() -> None:
        ch = conn.channel()
        body = b"x" * size
        for _ in range(count):
            ch.basic_publish("", queue, body)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    return conn, publisher


@pytest.fixture
def workers():
    with in_process_workers(2) as w:
        yield w


def consume_n(conn: pika.BlockingConnection, ch: Any, queue: str, n: int, **kw: Any) -> list:
    got: list = []

    def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((method, props, body))

    ch.basic_consume(queue, on_message, **kw)
    wait_for(lambda: len(got) >= n, poll=lambda: conn.process_data_events(0.02))
    return got


def test_publish_on_one_worker_consume_on_both(workers) -> None:
    w = workers
    q_both = place(w, 1, "both")
    pub = connect(w, 0)
    ch = pub.channel()
    ch.confirm_delivery()
    for i in range(200):
        ch.basic_publish("", q_both, str(i).encode())
    assert counts(w, 1, q_both) == (200, 0, 0)  # confirmed: the owner has every one
    c0, c1 = connect(w, 0), connect(w, 1)
    ch0, ch1 = c0.channel(), c1.channel()
    ch0.basic_qos(prefetch_count=10)
    ch1.basic_qos(prefetch_count=10)
    got: dict[int, list[bytes]] = {0: [], 1: []}

    def on(index: int, channel: Any) -> Callable[..., None]:
        def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
            got[index].append(body)
            c.basic_ack(method.delivery_tag)

        return on_message

    ch0.basic_consume(q_both, on(0, ch0))
    ch1.basic_consume(q_both, on(1, ch1))
    assert counts(w, 1, q_both)[2] == 2  # the remote consumer is one of the queue's

    def pump() -> None:
        c0.process_data_events(0.01)
        c1.process_data_events(0.01)

    wait_for(lambda: len(got[0]) + len(got[1]) >= 200, poll=pump)
    everything = got[0] + got[1]
    assert sorted(everything, key=int) == [str(i).encode() for i in range(200)]
    assert len(set(everything)) == 200
    assert got[0] and got[1]  # round-robin reached the consumer on the other worker
    assert wait_for(lambda: counts(w, 1, q_both) == (0, 0, 2), poll=pump)
    for c in (pub, c0, c1):
        c.close()


def test_persistent_confirms_and_the_owner_restarting(tmp_path: Path) -> None:
    with in_process_workers(2, tmp_path) as w:
        q_durable_q = place(w, 1, "durable-q", durable=True)
        conn = connect(w, 0)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish("", q_durable_q, f"p{i}".encode(), PERSISTENT)
        # Transient ones too: confirmed once the owner has them (not stored).
        ch.basic_publish("", q_durable_q, b"transient")
        assert counts(w, 1, q_durable_q)[0] == 51
        conn.close()
    with in_process_workers(2, tmp_path) as w:
        place(w, 1, q_durable_q, durable=True)  # the owner's is the one it recovered
        assert counts(w, 1, q_durable_q)[0] == 50
        conn = connect(w, 0)
        ch = conn.channel()
        bodies = []
        for _ in range(50):
            method, props, body = ch.basic_get(q_durable_q, auto_ack=True)
            assert props.delivery_mode == 2
            bodies.append(body)
        assert bodies == [f"p{i}".encode() for i in range(50)]
        assert ch.basic_get(q_durable_q)[0] is None
        conn.close()


def test_fanout_to_queues_on_both_workers_with_confirms(tmp_path: Path) -> None:
    with in_process_workers(2, tmp_path) as w:
        declare_exchange(w, "fan", "fanout", durable=True)
        q_fan_a = place(w, 0, "fan-a", durable=True, bind=("fan", ""))
        q_fan_b = place(w, 1, "fan-b", durable=True, bind=("fan", ""))
        q_fan_c = place(w, 1, "fan-c", durable=True, bind=("fan", ""))
        link = w.meshes[0].links[1]
        before = w.call(lambda: link.writer.records)
        conn = connect(w, 0)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("fan", "", f"f{i}".encode(), PERSISTENT)
        # One PUBLISH record per message for worker 1's two queues.
        assert w.call(lambda: link.writer.records) - before == 100
        for owner, name in ((0, q_fan_a), (1, q_fan_b), (1, q_fan_c)):
            assert counts(w, owner, name)[0] == 100
        for name in (q_fan_a, q_fan_b, q_fan_c):
            first = ch.basic_get(name, auto_ack=True)
            assert first[2] == b"f0" and first[0].exchange == "fan"
        conn.close()


def test_prefetch_is_kept_across_the_link(workers) -> None:
    w = workers
    q_prefetched = place(w, 1, "prefetched")
    pub = connect(w, 1)
    pch = pub.channel()
    for i in range(20):
        pch.basic_publish("", q_prefetched, str(i).encode())
    conn = connect(w, 0)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    got = consume_n(conn, ch, q_prefetched, 3)
    for _ in range(20):
        conn.process_data_events(0.02)
    assert len(got) == 3
    assert counts(w, 1, q_prefetched) == (17, 3, 1)
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    wait_for(lambda: len(got) >= 6, poll=lambda: conn.process_data_events(0.02))
    for _ in range(10):
        conn.process_data_events(0.02)
    assert [int(b) for _m, _p, b in got] == list(range(6))
    assert counts(w, 1, q_prefetched) == (14, 3, 1)
    pub.close()
    conn.close()


def test_nack_requeue_comes_back_redelivered_and_reject_drops(workers) -> None:
    w = workers
    q_nacked = place(w, 1, "nacked")
    conn = connect(w, 0)
    ch = conn.channel()
    ch.basic_publish("", q_nacked, b"one")
    ch.basic_publish("", q_nacked, b"two")
    ch.basic_qos(prefetch_count=1)
    got = consume_n(conn, ch, q_nacked, 1)
    assert got[0][2] == b"one" and not got[0][0].redelivered
    ch.basic_nack(got[0][0].delivery_tag, requeue=True)
    wait_for(lambda: len(got) >= 2, poll=lambda: conn.process_data_events(0.02))
    assert got[1][2] == b"one" and got[1][0].redelivered  # back in its place, first
    ch.basic_reject(got[1][0].delivery_tag, requeue=False)  # dropped for good
    wait_for(lambda: len(got) >= 3, poll=lambda: conn.process_data_events(0.02))
    assert got[2][2] == b"two" and not got[2][0].redelivered
    ch.basic_ack(got[2][0].delivery_tag)
    assert wait_for(
        lambda: counts(w, 1, q_nacked) == (0, 0, 1), poll=lambda: conn.process_data_events(0.02)
    )
    conn.close()


def test_closed_consumer_channel_requeues_its_unacked(workers) -> None:
    w = workers
    q_closing = place(w, 1, "closing")
    conn = connect(w, 0)
    ch = conn.channel()
    for i in range(10):
        ch.basic_publish("", q_closing, str(i).encode())
    ch.basic_qos(prefetch_count=4)
    got = consume_n(conn, ch, q_closing, 4)
    assert counts(w, 1, q_closing) == (6, 4, 1)
    ch.close()
    assert wait_for(lambda: counts(w, 1, q_closing) == (10, 0, 0))
    # Another consumer (on the owner's own port) gets them back, in order, redelivered.
    own = connect(w, 1)
    och = own.channel()
    again = consume_n(own, och, q_closing, 10, auto_ack=True)
    assert [int(b) for _m, _p, b in again] == list(range(10))
    assert [m.redelivered for m, _p, _b in again] == [True] * 4 + [False] * 6
    assert len(got) == 4
    own.close()
    conn.close()


def test_connection_closed_requeues_and_cancel_keeps_unacked_ackable(workers) -> None:
    w = workers
    q_cancelled = place(w, 1, "cancelled")
    conn = connect(w, 0)
    ch = conn.channel()
    for i in range(6):
        ch.basic_publish("", q_cancelled, str(i).encode())
    ch.basic_qos(prefetch_count=2)
    got = consume_n(conn, ch, q_cancelled, 2)
    # basic.cancel: the consumer goes, its deliveries stay the channel's (RabbitMQ).
    ch.basic_cancel(got[0][0].consumer_tag)
    assert counts(w, 1, q_cancelled) == (4, 2, 0)
    ch.basic_ack(got[1][0].delivery_tag, multiple=True)
    assert wait_for(lambda: counts(w, 1, q_cancelled) == (4, 0, 0))
    # A connection that drops with unacked deliveries: the owner requeues them.
    got2 = consume_n(conn, ch, q_cancelled, 2)
    assert [b for _m, _p, b in got2] == [b"2", b"3"]
    conn.close()
    assert wait_for(lambda: counts(w, 1, q_cancelled) == (4, 0, 0))


def test_basic_get_and_purge(workers) -> None:
    w = workers
    q_got = place(w, 1, "got")
    conn = connect(w, 0)
    ch = conn.channel()
    method, _props, body = ch.basic_get(q_got)
    assert method is None
    for i in range(5):
        ch.basic_publish("", q_got, str(i).encode())
    method, _props, body = ch.basic_get(q_got)
    assert body == b"0" and method.message_count == 4 and not method.redelivered
    assert counts(w, 1, q_got) == (4, 1, 0)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _props, body = ch.basic_get(q_got, auto_ack=True)
    assert body == b"0" and method.redelivered and method.message_count == 4
    method, _props, body = ch.basic_get(q_got)
    assert body == b"1"
    ch.basic_ack(method.delivery_tag)
    assert ch.queue_purge(q_got).method.message_count == 3
    assert counts(w, 1, q_got) == (0, 0, 0)
    # A get taken and never acked goes back when the channel closes.
    ch.basic_publish("", q_got, b"last")
    assert ch.basic_get(q_got)[2] == b"last"
    ch.close()
    assert wait_for(lambda: counts(w, 1, q_got) == (1, 0, 0))
    conn.close()


def test_ten_thousand_in_order(workers) -> None:
    w = workers
    q_ordered = place(w, 1, "ordered")
    pub = connect(w, 0)
    pch = pub.channel()
    pch.confirm_delivery()
    n = 10_000
    for i in range(n):
        pch.basic_publish("", q_ordered, str(i).encode(), mandatory=False)
    # Consumed on the owner's worker, and (published again) on the publisher's.
    for index in (1, 0):
        conn = connect(w, index)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        bodies: list[int] = []

        def on_message(c: Any, method: Any, props: Any, body: bytes, bodies=bodies) -> None:
            bodies.append(int(body))
            if len(bodies) % 100 == 0:
                c.basic_ack(method.delivery_tag, multiple=True)

        ch.basic_consume(q_ordered, on_message)
        wait_for(
            lambda b=bodies: len(b) >= n,
            timeout=60,
            poll=lambda c=conn: c.process_data_events(0.05),
        )
        assert bodies == list(range(n))
        conn.close()
        if index == 1:
            for i in range(n):
                pch.basic_publish("", q_ordered, str(i).encode())
    pub.close()


def test_owner_errors_come_back_with_their_codes(workers) -> None:
    w = workers
    q_exclusive_use = place(w, 1, "exclusive-use")
    own = connect(w, 1)
    och = own.channel()
    och.basic_consume(q_exclusive_use, lambda *a: None, exclusive=True)
    conn = connect(w, 0)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_consume(q_exclusive_use, lambda *a: None)
    assert err.value.reply_code == ACCESS_REFUSED
    assert "in exclusive use" in err.value.reply_text
    # The owner lost the queue (this worker still has its placeholder): 404.
    w.call(lambda: owned(w, 1, q_exclusive_use).vhost.delete_queue(owned(w, 1, q_exclusive_use)))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_get(q_exclusive_use)
    assert err.value.reply_code == NOT_FOUND
    assert f"no queue '{q_exclusive_use}'" in err.value.reply_text
    # Mandatory and unroutable are decided where the publish is read.
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nowhere", b"x", mandatory=True)
    own.close()
    conn.close()


def test_owner_deleting_the_queue_cancels_remote_consumers(workers) -> None:
    w = workers
    q_deleted_there = place(w, 1, "deleted-there")
    conn = connect(w, 0)
    ch = conn.channel()
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(q_deleted_there, lambda *a: None)
    w.call(lambda: owned(w, 1, q_deleted_there).vhost.delete_queue(owned(w, 1, q_deleted_there)))
    assert wait_for(lambda: cancelled, poll=lambda: conn.process_data_events(0.02))
    conn.close()


def test_publisher_pauses_while_the_link_is_full(workers) -> None:
    w = workers
    q_backlog = place(w, 1, "backlog")
    link, peer = squeeze_link(w)
    conn, publisher = publish_in_thread(w, q_backlog, 3000, 1000)
    assert wait_for(lambda: w.call(lambda: flow_paused(w)))
    assert w.call(lambda: link.pauses) >= 1
    held = counts(w, 1, q_backlog)[0]
    assert held < 3000
    w.call(peer.resume_reading)
    publisher.join(30)
    assert not publisher.is_alive()
    assert wait_for(lambda: counts(w, 1, q_backlog)[0] == 3000)
    assert wait_for(lambda: not w.call(lambda: flow_paused(w)))
    conn.close()


def test_publisher_paused_by_a_full_link_goes_on_when_the_owner_comes_back(workers) -> None:
    """The owner goes away (SIGKILL) while the link to it is full and a publisher waits
    for it: the publisher is released, its publishes meanwhile fail (nothing waits
    for a link that is gone), and once the owner's new link is up (its restart) the
    same connection's publishes are confirmed again."""
    w = workers
    q_refill = place(w, 1, "refill")
    _link, peer = squeeze_link(w)
    conn, publisher = publish_in_thread(w, q_refill, 3000, 1000)
    assert wait_for(lambda: w.call(lambda: flow_paused(w)))
    w.call(peer.transport.abort)  # worker 1 dies: its end goes without a word
    assert wait_for(lambda: w.call(lambda: 1 not in w.meshes[0].peers))

    async def relink() -> None:  # what the supervisor does for the restarted worker
        mine, theirs = records.socket_pair()
        await w.meshes[0].connect(1, mine)
        await w.meshes[1].connect(0, theirs)

    w.run(relink())
    publisher.join(30)
    assert not publisher.is_alive(), "the publisher stays paused"
    assert wait_for(lambda: not w.call(lambda: flow_paused(w)))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q_refill, b"after", PERSISTENT)  # NackError if not confirmed
    conn.close()


def test_publisher_pauses_while_the_owners_queue_is_behind(workers) -> None:
    """As on one process (FLOW_LIMIT): a queue far behind its consumers pauses the
    publishers into it, those of other workers too, until it drains."""
    w = workers
    q_slow = place(w, 1, "slow")
    own = connect(w, 1)
    och = own.channel()
    och.basic_qos(prefetch_count=1)
    tag = och.basic_consume(q_slow, lambda *a: None)  # takes one, never acks
    conn, publisher = publish_in_thread(w, q_slow, 6000, 100)
    assert wait_for(
        lambda: w.call(lambda: flow_paused(w)), poll=lambda: own.process_data_events(0.01)
    )
    assert counts(w, 1, q_slow)[0] < 6000
    och.basic_cancel(tag)  # no consumer left: the queue no longer holds publishers back
    publisher.join(30)
    assert not publisher.is_alive()
    # All there: the one delivered stays unacked with its channel after the cancel.
    assert wait_for(lambda: counts(w, 1, q_slow) == (5999, 1, 0))
    assert wait_for(lambda: not w.call(lambda: flow_paused(w)))
    own.close()
    conn.close()


def test_a_worker_going_away(workers) -> None:
    """The owner's link drops: pending confirms are nacked, consumers on its queues are
    cancelled, and it requeues the deliveries the other worker's clients had."""
    w = workers
    q_lost_q = place(w, 1, "lost-q")
    feeder = connect(w, 1)
    fch = feeder.channel()
    for i in range(10):
        fch.basic_publish("", q_lost_q, str(i).encode())
    conn = connect(w, 0)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    got = consume_n(conn, ch, q_lost_q, 3)
    assert counts(w, 1, q_lost_q) == (7, 3, 1)

    async def publish_unconfirmed() -> list[Any]:
        amqp = await aio_pika.connect(w.url(0))
        channel = await amqp.channel(publisher_confirms=True)
        w.call(w.meshes[1].links[0].pause_reading)  # the owner takes no more records
        pending = [
            asyncio.ensure_future(
                channel.default_exchange.publish(aio_pika.Message(b"late"), routing_key=q_lost_q)
            )
            for _ in range(5)
        ]
        await asyncio.sleep(0.2)
        assert not any(p.done() for p in pending)
        w.call(w.meshes[1].links[0].close)  # worker 1's end of the link goes
        results = await asyncio.gather(*pending, return_exceptions=True)
        await amqp.close()
        return results

    results = asyncio.run(publish_unconfirmed())
    assert len(results) == 5
    assert all(isinstance(r, aio_pika.exceptions.DeliveryError) for r in results), results
    assert wait_for(lambda: cancelled, poll=lambda: conn.process_data_events(0.02))
    assert counts(w, 1, q_lost_q) == (10, 0, 0)  # the deliveries in flight came back
    # The other worker's clients carry on: acks of what the gone worker sent are dropped,
    # and a publish without confirms to its queue is dropped, the channel open.
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    plain = conn.channel()
    plain.basic_publish("", q_lost_q, b"nobody takes it", PERSISTENT)
    for _ in range(10):
        conn.process_data_events(0.02)
    assert ch.is_open and plain.is_open
    feeder.close()
    conn.close()


def test_link_records_join_acks_into_runs() -> None:
    writer = records.LinkWriter()
    for i in range(1, 101):
        writer.settle_open(records.ACK, 0, i)
    writer.settle_open(records.ACK, 0, 200)
    writer.settle_open(records.REJECT, 0, 201, records.REQUEUE)
    token = object()
    writer.publish_open(token, 5, "/", "a", b"msg")
    assert writer.publish_more(token, "/", "b")
    assert not writer.publish_more(object(), "/", "c")
    out = records.LinkReader().feed(writer.data_to_send())
    assert out == [
        records.Settle(records.ACK, 0, [(1, 100), (200, 1)]),
        records.Settle(records.REJECT, 0, [(201, 1)], records.REQUEUE),
        records.Publish(5, "/", ["a", "b"], b"msg"),
    ]


def test_transactions_across_workers(workers) -> None:
    w = workers
    q_tx_q = place(w, 1, "tx-q")
    conn = connect(w, 0)
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q_tx_q, b"a")
    ch.basic_publish("", q_tx_q, b"b")
    assert counts(w, 1, q_tx_q)[0] == 0  # nothing leaves before the commit
    ch.tx_commit()
    assert counts(w, 1, q_tx_q)[0] == 2  # commit-ok once the owner holds them
    method, _props, body = ch.basic_get(q_tx_q)
    assert body == b"a"
    ch.basic_ack(method.delivery_tag)
    assert counts(w, 1, q_tx_q) == (1, 1, 0)
    ch.tx_commit()
    assert wait_for(lambda: counts(w, 1, q_tx_q) == (1, 0, 0))
    conn.close()


def test_aio_pika_consumer_on_the_other_worker(workers) -> None:
    w = workers
    q_aio_q = place(w, 0, "aio-q")

    async def run() -> list[tuple[bytes, bool]]:
        producer = await aio_pika.connect(w.url(0))
        pch = await producer.channel(publisher_confirms=True)
        for i in range(50):
            await pch.default_exchange.publish(
                aio_pika.Message(str(i).encode(), delivery_mode=2), routing_key=q_aio_q
            )
        consumer = await aio_pika.connect(w.url(1))
        cch = await consumer.channel()
        await cch.set_qos(prefetch_count=7)
        queue = await cch.get_queue(q_aio_q, ensure=False)
        got: list[tuple[bytes, bool]] = []
        async with queue.iterator() as messages:
            async for message in messages:
                if message.body == b"0" and not message.redelivered:
                    await message.nack(requeue=True)
                    continue
                await message.ack()
                got.append((message.body, message.redelivered))
                if len(got) == 50:
                    break
        await consumer.close()
        await producer.close()
        return got

    got = asyncio.run(run())
    # "0" comes back (at the queue's head, after what the prefetch already delivered).
    assert (b"0", True) in got[:8]
    assert sorted(int(b) for b, _r in got) == list(range(50))
    assert [r for b, r in got if b != b"0"] == [False] * 49
    assert wait_for(lambda: counts(w, 0, q_aio_q) == (0, 0, 0))


def test_channel_flow_stops_the_owners_deliveries(workers) -> None:
    w = workers
    q_flowed = place(w, 1, "flowed")
    conn = connect(w, 0)
    ch = conn.channel()
    got = consume_n(conn, ch, q_flowed, 0, auto_ack=True)
    ch.flow(False)  # channel.flow active=false: no deliveries, even without a prefetch
    pub = connect(w, 1)
    pch = pub.channel()
    for i in range(100):
        pch.basic_publish("", q_flowed, str(i).encode())
    for _ in range(20):
        conn.process_data_events(0.02)
    assert got == []
    assert counts(w, 1, q_flowed) == (100, 0, 1)
    ch.flow(True)
    wait_for(lambda: len(got) >= 100, poll=lambda: conn.process_data_events(0.02))
    assert [int(b) for _m, _p, b in got] == list(range(100))
    pub.close()
    conn.close()


def test_reject_publish_overflow_nacks_across_workers(tmp_path: Path) -> None:
    """x-overflow=reject-publish on the owner: a confirm is a nack; without confirms the
    message is dropped and the channel stays open, as on one process."""
    with in_process_workers(2, tmp_path) as w:
        args = {"x-max-length": 2, "x-overflow": "reject-publish"}
        q = place(w, 1, "bounded", durable=True, arguments=args)
        conn = connect(w, 0)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, b"1", PERSISTENT)
        ch.basic_publish("", q, b"2")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", q, b"3", PERSISTENT)
        plain = conn.channel()
        plain.basic_publish("", q, b"4", PERSISTENT)  # refused there: dropped silently
        plain.basic_publish("", q, b"5")
        assert plain.basic_get(q, auto_ack=True)[2] == b"1"
        assert plain.is_open and ch.is_open
        assert counts(w, 1, q) == (1, 0, 0)
        conn.close()
