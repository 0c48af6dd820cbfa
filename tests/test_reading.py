"""Socket input and output at the broker's edge (server/reading.py, AMQPConnection).

Every connection's bytes land in one shared read buffer, behind that connection's
own unparsed remainder, and large bodies go out without being joined. These tests
cut publishes at arbitrary byte positions across several connections at once, so
that each read ends inside some frame, and check every body that comes back.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time

import pika
import pytest
from pamqp import commands

from leveret.protocol import methods as wire
from leveret.server.reading import (
    READ_MAX,
    READ_MESSAGES,
    READ_MIN,
    READ_START,
    ReadSizer,
    SharedReadBuffer,
)
from rawamqp import RawClient, content_frames

# Sizes around the edges that matter: tiny, just under and at the large-body
# threshold (channel.LARGE_BODY), a whole frame, and bodies of several frames.
SIZES = [0, 1, 16, 1023, 1024, 4096, 131072 - 8, 131072, 300_000]


def body_for(publisher: int, seq: int, size: int) -> bytes:
    """A body whose every byte depends on who sent it and which one it is."""
    seed = hashlib.sha256(f"{publisher}/{seq}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def url_host_port(url: str) -> tuple[str, int]:
    params = pika.URLParameters(url)
    return params.host, params.port


def test_sizer_follows_the_size_of_the_messages() -> None:
    sizer = ReadSizer()
    assert sizer.offer == READ_START
    # 20-byte publishes: a read would hold READ_MESSAGES of them in 40 KB; READ_MIN is more.
    sizer.update(20 * 4000, 4000)
    assert sizer.offer == READ_MIN
    sizer.update(200 * 1000, 1000)
    assert sizer.offer == 200 * READ_MESSAGES
    # 4 KB publishes: as large as allowed.
    sizer.update(4200 * 500, 500)
    assert sizer.offer == READ_MAX
    # Back to small messages: the next read shrinks again.
    sizer.update(100 * 300, 300)
    assert sizer.offer == max(READ_MIN, 100 * READ_MESSAGES)


def test_sizer_grows_on_full_reads_without_whole_messages() -> None:
    sizer = ReadSizer()
    sizer.update(READ_START, 0)  # e.g. one large body in many frames
    assert sizer.offer == 2 * READ_START
    for _ in range(10):
        sizer.update(sizer.offer, 0)
    assert sizer.offer == READ_MAX
    sizer.update(100, 0)  # a heartbeat: no reason to change
    assert sizer.offer == READ_MAX


def test_shared_buffer_puts_the_remainder_in_front_of_the_read() -> None:
    buffer = SharedReadBuffer(frame_max=4096)
    view = buffer.place(b"abc", 10)
    assert len(view) == 10
    view[:4] = b"defg"  # what the kernel would write
    assert buffer.take(4) == b"abcdefg"
    view = buffer.place(b"", 5)
    view[:2] = b"xy"
    assert buffer.take(2) == b"xy"
    # A remainder larger than frame_max could ever leave still works (a private buffer).
    big = bytes(range(256)) * ((READ_MAX + 3 * 4096 + 2048) // 256)
    view = buffer.place(big, 8)
    view[:3] = b"end"
    assert buffer.take(3) == big + b"end"


def _publisher(
    host: str, port: int, queue: str, publisher: int, count: int, errors: list, barrier
) -> None:
    """Publish `count` messages on a raw socket, sent in pieces of random length."""
    rng = random.Random(publisher)
    try:
        with RawClient(host, port, timeout=20) as client:
            client.handshake()
            client.open_channel(1)
            stream = b"".join(
                wire.encode_publish(1, "", queue, False, False)
                + content_frames(1, body_for(publisher, seq, SIZES[seq % len(SIZES)]))
                for seq in range(count)
            )
            barrier.wait()
            pos = 0
            while pos < len(stream):
                step = rng.choice((1, 7, 100, 1500, 9000, 70_000))
                client.send(stream[pos : pos + step])
                pos += step
                if rng.random() < 0.3:
                    time.sleep(0.001)  # let another connection's bytes be read in between
            # A round trip: every publish before it has been taken by the broker.
            client.send_method(1, commands.Basic.Qos(prefetch_count=0))
            client.wait_for(commands.Basic.QosOk)
    except Exception as exc:  # reported by the test, with the publisher's number
        errors.append((publisher, repr(exc)))


def test_partial_frames_from_many_connections_keep_their_bytes(amqp_url, names) -> None:
    """Four publishers' streams, cut at random byte positions and interleaved, while
    a consumer takes them: every body arrives intact and in each publisher's order."""
    host, port = url_host_port(amqp_url)
    publishers, count = 4, 3 * len(SIZES)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    queues = [names.queue(f"reading-{p}") for p in range(publishers)]
    for queue in queues:
        ch.queue_declare(queue)
    errors: list = []
    barrier = threading.Barrier(publishers)
    threads = [
        threading.Thread(target=_publisher, args=(host, port, queues[p], p, count, errors, barrier))
        for p in range(publishers)
    ]
    for t in threads:
        t.start()
    received: dict[int, list[bytes]] = {p: [] for p in range(publishers)}
    deadline = time.monotonic() + 60
    while sum(map(len, received.values())) < publishers * count:
        assert time.monotonic() < deadline, f"received {[len(v) for v in received.values()]}"
        for p, queue in enumerate(queues):
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                received[p].append(body)
        conn.process_data_events(0)
    for t in threads:
        t.join(30)
    assert errors == []
    for p in range(publishers):
        expected = [body_for(p, seq, SIZES[seq % len(SIZES)]) for seq in range(count)]
        assert len(received[p]) == count
        for seq, (got, want) in enumerate(zip(received[p], expected, strict=True)):
            assert got == want, f"publisher {p} message {seq}: {len(got)} bytes, want {len(want)}"
    conn.close()


def test_large_and_small_deliveries_interleave_intact(amqp_url, names) -> None:
    """Deliveries of bodies under and over the large-body threshold, pipelined to one
    consumer in the same loop turns (joined pieces and writev), arrive byte for byte."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    queue = names.queue("reading-out")
    ch.queue_declare(queue)
    bodies = [body_for(9, seq, SIZES[seq % len(SIZES)]) for seq in range(5 * len(SIZES))]
    for body in bodies:
        ch.basic_publish("", queue, body)
    got: list[bytes] = []
    ch.basic_qos(prefetch_count=1000)
    for method, _props, body in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {len(bodies)} delivered"
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    ch.cancel()
    assert got == bodies
    conn.close()


@pytest.mark.leveret_only
def test_a_connection_sending_large_messages_reads_more_at_a_time(leveret_embedded) -> None:
    """The read size follows the messages: large ones let reads grow to READ_MAX,
    small ones keep them near READ_MESSAGES messages."""
    host, port = url_host_port(leveret_embedded.url)
    with RawClient(host, port, timeout=10) as client:
        client.handshake()
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue="reading-sizer"))
        client.wait_for(commands.Queue.DeclareOk)

        def offer() -> int:
            return leveret_embedded.call(
                lambda: [c._sizer.offer for c in leveret_embedded.server.connections if c.vhost][0]
            )

        big = wire.encode_publish(1, "", "reading-sizer", False, False) + content_frames(
            1, bytes(8192)
        )
        client.send(big * 400)
        client.send_method(1, commands.Basic.Qos(prefetch_count=0))
        client.wait_for(commands.Basic.QosOk)
        assert offer() == READ_MAX
        small = wire.encode_publish(1, "", "reading-sizer", False, False) + content_frames(1, b"x")
        client.send(small * 3000)
        client.send_method(1, commands.Basic.Qos(prefetch_count=0))
        client.wait_for(commands.Basic.QosOk)
        assert READ_MIN <= offer() < 2 * len(small) * READ_MESSAGES  # the last read held a qos too
        client.send_method(1, commands.Queue.Delete(queue="reading-sizer"))
        client.wait_for(commands.Queue.DeleteOk)


def test_deliveries_leave_before_the_publishers_read_returns(leveret_embedded) -> None:
    """A publish's delivery is written in the same loop callback as the read that
    carried the publish (S3's latency: no loop turn in between), and everything one
    read queued for a consumer is still one write."""
    host, port = url_host_port(leveret_embedded.url)
    seen: list[tuple[int, int, int]] = []  # per publisher read: (consumer writes, queued, n)

    def watch_publisher() -> None:
        conns = [c for c in leveret_embedded.server.connections if c.vhost]
        consumer = next(c for c in conns if any(ch.consumers for ch in c.channels.values()))
        publisher = next(c for c in conns if c is not consumer)
        original = publisher.buffer_updated

        def buffer_updated(nbytes: int) -> None:
            before = consumer.send_cnt
            original(nbytes)
            seen.append((consumer.send_cnt - before, len(consumer._out), nbytes))

        publisher.buffer_updated = buffer_updated  # type: ignore[method-assign]

    with RawClient(host, port, timeout=10) as consumer, RawClient(host, port, timeout=10) as pub:
        for client in (consumer, pub):
            client.handshake()
            client.open_channel(1)
        consumer.send_method(1, commands.Queue.Declare(queue="reading-flush", auto_delete=True))
        consumer.wait_for(commands.Queue.DeclareOk)
        consumer.send_method(1, commands.Basic.Consume(queue="reading-flush", no_ack=True))
        consumer.wait_for(commands.Basic.ConsumeOk)
        leveret_embedded.call(watch_publisher)
        one = wire.encode_publish(1, "", "reading-flush", False, False) + content_frames(1, b"x")
        pub.send(one * 3)  # one send: almost always one read
        for _ in range(3):
            consumer.wait_for(commands.Basic.Deliver)
        reads = leveret_embedded.call(lambda: list(seen))  # before the clients close
    assert reads, "the publisher's reads were not observed"
    # Every read that delivered wrote before it returned and left nothing queued;
    # a read holding all three publishes wrote them once.
    assert all(queued == 0 for _, queued, _ in reads), reads
    assert sum(writes for writes, _, _ in reads) == len(reads), reads
