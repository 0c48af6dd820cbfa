"""Stream queues over AMQP 0-9-1 .

Codes and texts were pinned by running these same pika calls against RabbitMQ
3.10.8; tests not marked leveret_only run against it too (LEVERET_TEST_URL).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import time
import uuid

import pika
import pika.exceptions
import pytest

from serverproc import owner_pid, owner_store, server_argv, sigkill_broker

STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def stream(connection, names):
    name = names.queue("stream")
    connection.channel().queue_declare(name, durable=True, arguments=STREAM)
    yield name
    if connection.is_open:
        connection.channel().queue_delete(name)


def _publish(ch, queue: str, bodies) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def _consume(connection, queue: str, n: int, offset=None, prefetch: int = 100, ack=True):
    """The first n deliveries as (offset header, body), acking as they come."""
    ch = connection.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got = []
    args = {} if offset is None else {"x-stream-offset": offset}

    def on_message(channel, method, props, body):
        got.append((props.headers["x-stream-offset"], body))
        if ack:
            channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message, arguments=args)
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    ch.close()
    return got


@pytest.mark.parametrize(
    "kwargs,text",
    [
        ({"durable": False}, "invalid property 'non-durable' for queue"),
        ({"durable": True, "exclusive": True}, "invalid property 'exclusive-owner' for queue"),
        ({"durable": True, "auto_delete": True}, "invalid property 'auto-delete' for queue"),
    ],
)
def test_stream_declaration_refusals(connection, names, kwargs, text):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(names.queue("s"), arguments=STREAM, **kwargs)
    assert info.value.reply_code == 406
    assert text in info.value.reply_text


@pytest.mark.parametrize(
    "args,text",
    [
        ({"x-message-ttl": 1000}, "invalid arg 'x-message-ttl' for queue"),
        ({"x-max-age": "7X"}, "invalid arg 'x-max-age' for queue"),
    ],
)
def test_stream_bad_arguments(connection, names, args, text):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(names.queue("s"), durable=True, arguments={**STREAM, **args})
    assert info.value.reply_code == 406
    assert text in info.value.reply_text


def test_consume_needs_prefetch(connection, stream):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume(stream, lambda *a: None)
        connection.process_data_events(0.5)
    assert info.value.reply_code == 406
    assert "consumer prefetch count is not set" in info.value.reply_text


def test_global_qos_is_not_a_prefetch(connection, stream):
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume(stream, lambda *a: None)
        connection.process_data_events(0.5)
    assert info.value.reply_code == 406


def test_global_qos_with_a_prefetch_is_refused(amqp_url, stream):
    """RabbitMQ 3.10 refuses a stream consumer on a channel whose global prefetch is
    set, even with a consumer prefetch (540, the connection closes)."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.basic_consume(stream, lambda *a: None)
        conn.process_data_events(0.5)
    assert (info.value.reply_code, info.value.reply_text) == (
        540,
        f"NOT_IMPLEMENTED - queue '{stream}' in vhost '/' does not support global qos",
    )


@pytest.mark.parametrize(
    "action,text",
    [
        ("no_ack", "automatic acknowledgement not supported by stream queues"),
        ("get", "basic.get not supported by stream queues"),
        ("purge", "queue.purge not supported by stream queues"),
    ],
)
def test_not_implemented_for_streams(amqp_url, stream, action, text):
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        if action == "no_ack":
            ch.basic_consume(stream, lambda *a: None, auto_ack=True)
            conn.process_data_events(0.5)
        elif action == "get":
            ch.basic_get(stream)
        else:
            ch.queue_purge(stream)
    assert info.value.reply_code == 540
    assert text in info.value.reply_text


@pytest.mark.leveret_only
@pytest.mark.parametrize("offset", ["bogus", True, b"\x00", b"1h", b"2"])
def test_bad_offset_is_a_clear_error(connection, stream, offset):
    """RabbitMQ 3.10.8 crashes the connection with 541 INTERNAL_ERROR here;
    Leveret names the argument (docs/differences.md)."""
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume(stream, lambda *a: None, arguments={"x-stream-offset": offset})
        connection.process_data_events(0.5)
    assert info.value.reply_code == 406
    assert "invalid arg 'x-stream-offset'" in info.value.reply_text
    assert connection.is_open


def test_offset_names_in_a_byte_array(connection, stream):
    """pika sends Python bytes as a byte array (field type 'x'); first, last and
    next in one work as in a longstr (RabbitMQ 3.10.8 takes them too)."""
    _publish(connection.channel(), stream, [b"m0", b"m1", b"m2"])
    assert _consume(connection, stream, 3, offset=b"first") == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    assert _consume(connection, stream, 1, offset=b"last") == [(2, b"m2")]
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(
        stream,
        lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": b"next"},
    )
    connection.process_data_events(0.3)
    assert got == []
    _publish(connection.channel(), stream, [b"m3"])
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert got == [b"m3"]


@pytest.mark.leveret_only
def test_offset_longstr_that_is_not_utf8_is_a_clear_error(amqp_url, stream):
    """A longstr pamqp cannot decode as UTF-8 reaches the stream as bytes: 406 with
    the bytes shown as U+FFFD, not an internal error (RabbitMQ: 406 with the raw
    bytes, or 541; docs/differences.md)."""
    from pamqp import commands

    from rawamqp import RawClient, method_frame

    host, port = pika.URLParameters(amqp_url).host, pika.URLParameters(amqp_url).port
    client = RawClient(host, port)
    try:
        client.handshake()
        client.open_channel(1)
        client.rpc(1, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
        consume = commands.Basic.Consume(
            queue=stream, consumer_tag="t", arguments={"x-stream-offset": "@@@"}
        )
        # The same length, so the frame's sizes still hold: "1", 0xFF, "h".
        client.send(
            method_frame(1, consume).replace(b"S\x00\x00\x00\x03@@@", b"S\x00\x00\x00\x031\xffh")
        )
        _ch, close = client.wait_for(commands.Channel.Close, channel=1)
        assert close.reply_code == 406
        assert close.reply_text.endswith('{invalid_stream_offset_arg,{longstr,<<"1\ufffdh">>}}')
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(2)  # the connection carries on
    finally:
        client.close()


def test_offsets_and_header(connection, stream):
    _publish(connection.channel(), stream, [b"m0", b"m1", b"m2", b"m3"])
    got = _consume(connection, stream, 4, offset="first")
    assert got == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"m3")]
    assert _consume(connection, stream, 2, offset=2) == [(2, b"m2"), (3, b"m3")]
    assert _consume(connection, stream, 1, offset="last") == [(3, b"m3")]


def test_next_is_the_default_and_sees_only_new_messages(connection, stream):
    ch = connection.channel()
    _publish(ch, stream, [b"old"])
    cch = connection.channel()
    cch.basic_qos(prefetch_count=10)
    got = []
    cch.basic_consume(stream, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    connection.process_data_events(0.3)
    _publish(ch, stream, [b"new"])
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert got == [b"new"]


def test_timestamp_and_interval_offsets(connection, stream):
    _publish(connection.channel(), stream, [b"a", b"b"])
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert [b for _, b in _consume(connection, stream, 2, offset=past)] == [b"a", b"b"]
    assert [b for _, b in _consume(connection, stream, 2, offset="1h")] == [b"a", b"b"]


def test_many_consumers_at_different_offsets(connection, stream):
    _publish(connection.channel(), stream, [b"%d" % i for i in range(50)])
    a = _consume(connection, stream, 50, offset="first")
    b = _consume(connection, stream, 10, offset=40)
    assert [o for o, _ in a] == list(range(50))
    assert [o for o, _ in b] == list(range(40, 50))


def test_ack_gives_credit_and_deletes_nothing(connection, stream):
    _publish(connection.channel(), stream, [b"%d" % i for i in range(10)])
    unacked = _consume(connection, stream, 10, offset="first", prefetch=3, ack=False)
    assert len(unacked) == 3  # prefetch limits; without acks no more come
    acked = _consume(connection, stream, 10, offset="first", prefetch=3)
    assert [o for o, _ in acked] == list(range(10))
    again = _consume(connection, stream, 10, offset="first")  # acks removed nothing
    assert len(again) == 10


def test_each_acked_message_is_one_more_credit(connection, stream):
    """Prefetch 20: a multiple ack of 5 lets 5 more come, then each single ack one
    more, at once (RabbitMQ 3.10.8 does the same; one message per chunk here, as
    each publish waits for its confirm)."""
    _publish(connection.channel(), stream, [b"%d" % i for i in range(30)])
    ch = connection.channel()
    ch.basic_qos(prefetch_count=20)
    got = []
    ch.basic_consume(
        stream, lambda c, m, p, b: got.append(m.delivery_tag), arguments={"x-stream-offset": 0}
    )

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 5
        while len(got) < n and time.monotonic() < deadline:
            connection.process_data_events(0.05)
        connection.process_data_events(0.2)  # anything beyond the credit would come now
        assert got == list(range(1, n + 1))

    wait_for(20)
    ch.basic_ack(5, multiple=True)
    wait_for(25)
    ch.basic_ack(6)
    wait_for(26)
    ch.basic_ack(7)
    wait_for(27)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_ack(1)  # acked already
        ch.queue_declare(stream, passive=True)  # waits, and gets the close instead
    assert (info.value.reply_code, info.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - unknown delivery tag 1",
    )


@pytest.mark.parametrize("size", [3_000_000_001, 2**63 - 1])
def test_segment_size_above_the_maximum_is_refused(connection, names, size):
    name = names.queue("s")
    connection.channel().queue_declare(
        name, durable=True, arguments={**STREAM, "x-stream-max-segment-size-bytes": 3_000_000_000}
    )
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(
            names.queue("s"),
            durable=True,
            arguments={**STREAM, "x-stream-max-segment-size-bytes": size},
        )
    assert (info.value.reply_code, info.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes",
    )


# --- the tail-offsets extension ---------------------------------------------------


def _ask_offsets(connection, request: bytes):
    ch = connection.channel()
    replies = []
    ch.basic_consume(
        "amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((p, b)), auto_ack=True
    )
    ch.confirm_delivery()
    corr = uuid.uuid4().hex
    ch.basic_publish(
        "",
        "amq.leveret.stream-offsets",
        request,
        pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=corr),
        mandatory=True,
    )
    deadline = time.monotonic() + 5
    while not replies and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    ch.close()
    props, body = replies[0]
    assert props.correlation_id == corr
    assert props.content_type == "application/json"
    return json.loads(body)


@pytest.mark.leveret_only
def test_tail_offsets_extension(connection, stream, names):
    _publish(connection.channel(), stream, [b"x", b"y", b"z"])
    before = int(time.time() * 1000) - 60_000
    reply = _ask_offsets(
        connection, json.dumps({"streams": [stream], "timestamp": before}).encode()
    )
    (part,) = reply["partitions"]
    assert (part["stream"], part["first"], part["next"]) == (stream, 0, 3)
    assert part["offset_for_timestamp"] == 0
    assert part["first_timestamp"] <= part["last_timestamp"]
    missing = _ask_offsets(connection, json.dumps({"streams": [names.queue("no")]}).encode())
    assert missing["error"] == "not_found"
    bad = _ask_offsets(connection, b"{not json")
    assert bad["error"] == "bad_request" and "not JSON" in bad["reason"]
    neither = _ask_offsets(connection, b"{}")
    assert neither["error"] == "bad_request"
    no_super = _ask_offsets(connection, json.dumps({"super_stream": names.exchange()}).encode())
    assert no_super["error"] == "not_found"


def test_tail_offsets_request_on_rabbitmq_is_returned(connection):
    """Why the extension cannot be confused with RabbitMQ: there the mandatory
    request is returned NO_ROUTE (run with LEVERET_TEST_URL to see it)."""
    from conftest import against_rabbitmq

    if not against_rabbitmq():
        pytest.skip("checks RabbitMQ's side of the contract")
    ch = connection.channel()
    reply_queue = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(
            "",
            "amq.leveret.stream-offsets",
            b"{}",
            pika.BasicProperties(reply_to=reply_queue),
            mandatory=True,
        )


# --- durability (Leveret's own process) ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(data_dir, port):
    proc = subprocess.Popen(
        [*server_argv(), "--port", str(port), "--data-dir", data_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("broker did not start")


@contextlib.contextmanager
def _broker(data_dir, port, stop=signal.SIGTERM):
    """A `leveret server` subprocess on `data_dir`, stopped with `stop` on leaving."""
    proc = _start(data_dir, port)
    try:
        yield proc
    finally:
        if stop == signal.SIGKILL:
            sigkill_broker(proc, data_dir)  # with workers: the supervisor and every worker
        else:
            proc.send_signal(stop)
            proc.wait()


@pytest.mark.leveret_only
def test_stream_survives_sigkill_and_cuts_a_torn_tail(tmp_path):
    data, port = str(tmp_path / "d"), _free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    with _broker(data, port, signal.SIGKILL):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare("events", durable=True, arguments=STREAM)
        _publish(ch, "events", [b"e%d" % i for i in range(500)])  # confirmed = fsynced
        conn.close()
    seg_dir = os.path.join(owner_store(data, "events"), "streams", "%2F", "events")
    (segment,) = [f for f in os.listdir(seg_dir) if f.endswith(".seg")]
    with open(os.path.join(seg_dir, segment), "ab") as f:
        f.write(b"\x00\x00\x01\x00torn")  # half a record, as a crash mid-write leaves
    with _broker(data, port):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        got = _consume(conn, "events", 500, offset="first")
        assert got == [(i, b"e%d" % i) for i in range(500)]
        _publish(conn.channel(), "events", [b"after"])  # appends after the cut tail
        assert _consume(conn, "events", 1, offset=500) == [(500, b"after")]
        conn.close()


@pytest.mark.leveret_only
def test_retention_deletes_whole_segments(connection, names):
    name = names.queue("retained")
    args = {
        **STREAM,
        "x-stream-max-segment-size-bytes": 4096,
        "x-max-length-bytes": 16384,
    }
    connection.channel().queue_declare(name, durable=True, arguments=args)
    _publish(connection.channel(), name, [b"r" * 500 for _ in range(200)])
    reply = _ask_offsets(connection, json.dumps({"streams": [name]}).encode())
    part = reply["partitions"][0]
    assert part["next"] == 200
    assert 0 < part["first"] < 200  # old segments went, whole
    got = _consume(connection, name, 200 - part["first"], offset="first")
    assert got[0][0] == part["first"]  # reading from first starts at what is left
    assert got[-1][0] == 199
    connection.channel().queue_delete(name)


@pytest.mark.leveret_only
def test_pipelined_confirms_across_many_segments_survive_sigkill(tmp_path):
    """Appends are buffered per loop turn and segments roll under confirms in flight:
    every confirmed record is there after SIGKILL, in order, and rolled segment
    files are closed once synced (no descriptor per segment left open)."""
    import asyncio

    from leveret.client import connect

    data, port = str(tmp_path / "d"), _free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    args = {**STREAM, "x-stream-max-segment-size-bytes": 8192}
    n = 3000

    async def publish() -> int:
        conn = await connect(url)
        ch = await conn.channel()
        await ch.declare_queue("rolled", durable=True, arguments=args)
        bodies = [b"p%05d" % i + b"." * 90 for i in range(n)]
        sent = await ch.publish_many(bodies, routing_key="rolled", window=500, delivery_mode=2)
        await conn.close()
        return sent

    with _broker(data, port, signal.SIGKILL) as proc:
        assert asyncio.run(publish()) == n
        seg_dir = os.path.join(owner_store(data, "rolled"), "streams", "%2F", "rolled")
        segments = [f for f in os.listdir(seg_dir) if f.endswith(".seg")]
        assert len(segments) > 30
        open_segments = [
            link for link in _open_files(owner_pid(proc, data, "rolled")) if link.endswith(".seg")
        ]
        assert len(open_segments) <= 2, open_segments
    with _broker(data, port):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        got = _consume(conn, "rolled", n, offset="first", prefetch=500)
        assert got == [(i, b"p%05d" % i + b"." * 90) for i in range(n)]
        conn.close()


def _open_files(pid: int) -> list[str]:
    """What the process's descriptors point at; one closed between the listing and the
    readlink (the client's connection winding down, say) is skipped, not an error."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return links


def test_offset_past_the_end_starts_there_once_it_exists(connection, stream):
    """A reader resuming at a stored offset beyond the end gets that
    offset first, once it is written: nothing before it, nothing skipped."""
    ch = connection.channel()
    _publish(ch, stream, [b"m0", b"m1", b"m2"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=10)
    got = []
    consumer.basic_consume(
        stream,
        lambda c, m, p, b: (
            got.append((p.headers["x-stream-offset"], b)),
            c.basic_ack(m.delivery_tag),
        ),
        arguments={"x-stream-offset": 5},
    )
    connection.process_data_events(0.3)
    assert got == []
    _publish(ch, stream, [b"m3", b"m4", b"m5", b"m6"])
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert got == [(5, b"m5"), (6, b"m6")]


def test_server_named_stream_is_refused(connection):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("", durable=True, arguments=STREAM)
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue"
    )


@pytest.mark.parametrize(
    "key,value",
    [
        ("x-max-age", "2D"),
        ("x-max-length-bytes", 2_000_000),
        ("x-stream-max-segment-size-bytes", 200_000),
    ],
)
def test_redeclare_with_other_retention_is_inequivalent(connection, names, key, value):
    name = names.queue("s")
    args = {
        **STREAM,
        "x-max-age": "1D",
        "x-max-length-bytes": 1_000_000,
        "x-stream-max-segment-size-bytes": 100_000,
    }
    connection.channel().queue_declare(name, durable=True, arguments=args)
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(name, durable=True, arguments={**args, key: value})
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith(f"PRECONDITION_FAILED - inequivalent arg '{key}'")
