"""leveret.client.blocking: the asyncio client driven from a background loop thread."""

from __future__ import annotations

import threading
import time

import pytest

from clienthelp import close_from_leveret
from leveret.client import ChannelClosed, MessageReturned, MessageStateError, NotFound
from leveret.client import events as ev
from leveret.client.blocking import OutgoingMessage, connect


def test_publish_consume_ack(amqp_url, names):
    with connect(amqp_url, name="i12-blocking") as conn:
        ch = conn.channel()
        q = ch.declare_queue(names.queue())
        assert (q.message_count, q.consumer_count) == (0, 0)
        ch.publish(b"one", routing_key=q.name, message_id="1")
        assert ch.publish_many([b"two", OutgoingMessage(b"three")], routing_key=q.name) == 2
        bodies = []
        consumer = q.consume(prefetch=10)
        for message in consumer:
            bodies.append(message.body)
            message.ack()
            if len(bodies) == 3:
                break
        consumer.cancel()
        assert bodies == [b"one", b"two", b"three"]
        with pytest.raises(StopIteration):
            next(consumer)
        assert ch.declare_queue(q.name, passive=True).message_count == 0


def test_errors_are_the_same_as_the_asyncio_api(amqp_url, names):
    with connect(amqp_url) as conn:
        ch = conn.channel()
        with pytest.raises(NotFound):
            ch.declare_queue(names.queue("missing"), passive=True)
        with pytest.raises(NotFound):
            ch.publish(b"x", routing_key="q")  # that channel is closed now
        ch = conn.channel()
        with pytest.raises(MessageReturned):
            ch.publish(b"x", routing_key=names.queue("nowhere"), mandatory=True)
        q = ch.declare_queue(names.queue())
        ch.publish(b"x", routing_key=q.name)
        msg = q.get()
        assert msg.ack() is True
        with pytest.raises(MessageStateError):
            msg.ack()
        ch.close()
        with pytest.raises(ChannelClosed):
            ch.publish(b"x", routing_key=q.name)


def test_heartbeats_keep_running_while_user_code_blocks(amqp_url, names):
    with connect(amqp_url, heartbeat=1) as conn:
        ch = conn.channel()
        q = ch.declare_queue(names.queue())
        ch.publish(b"slow job", routing_key=q.name)
        consumer = q.consume(prefetch=1)
        message = consumer.next_message(timeout=10)
        time.sleep(3.5)  # a long handler; the broker drops clients silent for 2 heartbeats
        message.ack()
        ch.publish(b"next", routing_key=q.name)
        assert consumer.next_message(timeout=10).body == b"next"
        assert conn.is_open and conn.reconnects == 0


def test_next_message_timeout(amqp_url, names):
    with connect(amqp_url) as conn:
        ch = conn.channel()
        q = ch.declare_queue(names.queue())
        consumer = q.consume()
        with pytest.raises(TimeoutError):
            consumer.next_message(timeout=0.2)


def test_many_threads_share_one_connection(amqp_url, names):
    with connect(amqp_url) as conn:
        ch = conn.channel()
        q = ch.declare_queue(names.queue())
        errors: list[BaseException] = []

        def publisher(k: int) -> None:
            try:
                for i in range(50):
                    ch.publish(b"%d-%d" % (k, i), routing_key=q.name)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=publisher, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        received = []
        consumer = q.consume(prefetch=20)
        acker_done = threading.Event()

        def acker() -> None:
            for message in consumer:
                received.append(message.body)
                message.ack()  # from a thread that is not the loop thread
                if len(received) == 200:
                    break
            acker_done.set()

        threading.Thread(target=acker).start()
        for t in threads:
            t.join(30)
        assert acker_done.wait(30)
        assert not errors
        assert sorted(received) == sorted(b"%d-%d" % (k, i) for k in range(4) for i in range(50))


def test_rpc_and_transactions(amqp_url, names):
    with connect(amqp_url) as conn:
        ch = conn.channel()
        q = ch.declare_queue(names.queue())
        stop = ch.serve(q, lambda request: request.body.upper())
        assert ch.rpc_call(b"ping", routing_key=q.name, timeout=10).body == b"PING"
        stop()
        tx = conn.channel(confirms=False)
        q2 = tx.declare_queue(names.queue())
        with tx.transaction():
            tx.publish(b"committed", routing_key=q2.name)
        assert q2.get(no_ack=True).body == b"committed"


@pytest.mark.leveret_only
def test_blocking_consumer_survives_a_server_side_close(leveret_embedded, names):
    seen: list = []
    with connect(leveret_embedded.url, reconnect_delay=0.05) as conn:
        conn.add_listener(seen.append)
        ch = conn.channel()
        q = ch.declare_queue("i12-blocking-recovery")
        consumer = q.consume(prefetch=10)
        ch.publish(b"before", routing_key=q.name)
        consumer.next_message(timeout=10).ack()
        ch.declare_queue(q.name, passive=True)  # round trip: the ack is in
        close_from_leveret(leveret_embedded)
        conn.wait_recovered(30)
        ch.publish(b"after", routing_key=q.name)  # waits for recovery if need be
        assert consumer.next_message(timeout=10).body == b"after"
    assert any(isinstance(e, ev.Recovered) for e in seen)


def test_calling_blocking_methods_from_the_loop_thread_is_refused(amqp_url):
    with connect(amqp_url) as conn:
        outcome: list = []

        def listener(_event) -> None:
            try:
                conn.channel()
            except RuntimeError as exc:
                outcome.append(exc)

        conn.add_listener(listener)
        conn.connection._loop.call_soon_threadsafe(conn.connection._emit, ev.Unblocked())
        deadline = time.monotonic() + 5
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        assert outcome and "loop thread" in str(outcome[0])
