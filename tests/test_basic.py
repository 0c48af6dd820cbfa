"""Basic class: qos, consume/cancel, publish/return, get, ack/nack/reject, recover."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pamqp import commands

from conftest import drain, wait_until


class Collector:
    """A pika consumer callback that records deliveries."""

    def __init__(self) -> None:
        self.deliveries: list[tuple] = []

    def __call__(self, ch, method, props, body) -> None:
        self.deliveries.append((method, props, body))

    @property
    def bodies(self) -> list[bytes]:
        return [d[2] for d in self.deliveries]

    def __len__(self) -> int:
        return len(self.deliveries)


def _filled_queue(connection, names, count, prefix="q"):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue(prefix)
    ch.queue_declare(q)
    for i in range(count):
        ch.basic_publish("", q, str(i).encode())
    return q


def _settle(connection, seconds=0.3):
    """Give the broker a moment to (wrongly) deliver more; used only before
    asserting that nothing more arrived."""
    connection.process_data_events(time_limit=seconds)


# -- qos ----------------------------------------------------------------------------


def test_prefetch_per_consumer(connection, names):
    q = _filled_queue(connection, names, 6)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2)  # global=False: per consumer
    c1, c2 = Collector(), Collector()
    ch.basic_consume(q, c1)
    ch.basic_consume(q, c2)
    assert wait_until(connection, lambda: len(c1) + len(c2) == 4)
    _settle(connection)
    assert (len(c1), len(c2)) == (2, 2)
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    ch.basic_ack(c1.deliveries[0][0].delivery_tag)
    assert wait_until(connection, lambda: len(c1) == 3)
    _settle(connection)
    assert len(c1) + len(c2) == 5


def test_prefetch_global_is_per_channel(connection, names):
    q1 = _filled_queue(connection, names, 5, "q1")
    q2 = _filled_queue(connection, names, 5, "q2")
    ch = connection.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)  # shared by all consumers on ch
    c1, c2 = Collector(), Collector()
    ch.basic_consume(q1, c1)
    ch.basic_consume(q2, c2)
    assert wait_until(connection, lambda: len(c1) + len(c2) == 3)
    _settle(connection)
    assert len(c1) + len(c2) == 3
    tags = [d[0].delivery_tag for d in c1.deliveries + c2.deliveries]
    ch.basic_ack(max(tags), multiple=True)
    assert wait_until(connection, lambda: len(c1) + len(c2) == 6)
    _settle(connection)
    assert len(c1) + len(c2) == 6


def test_prefetch_applies_to_consumers_created_after_qos(connection, names):
    q = _filled_queue(connection, names, 5)
    ch = connection.channel()
    c0 = Collector()
    ch.basic_consume(q, c0)  # unlimited consumer, created before qos
    assert wait_until(connection, lambda: len(c0) == 5)
    for d in c0.deliveries:
        ch.basic_nack(d[0].delivery_tag, requeue=False)
    q2 = _filled_queue(connection, names, 5, "q2")
    ch.basic_qos(prefetch_count=1)
    c1 = Collector()
    ch.basic_consume(q2, c1)
    assert wait_until(connection, lambda: len(c1) == 1)
    _settle(connection)
    assert len(c1) == 1


def test_prefetch_ignored_with_no_ack(connection, names):
    q = _filled_queue(connection, names, 5)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1)
    c = Collector()
    ch.basic_consume(q, c, auto_ack=True)
    assert wait_until(connection, lambda: len(c) == 5)


# -- consume / cancel ---------------------------------------------------------------


def test_server_generated_consumer_tag(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    consume_ok = client.rpc(
        1, commands.Basic.Consume(queue=ok.queue, consumer_tag=""), commands.Basic.ConsumeOk
    )
    assert consume_ok.consumer_tag.startswith("amq.ctag-")
    second = client.rpc(1, commands.Basic.Consume(queue=ok.queue), commands.Basic.ConsumeOk)
    assert second.consumer_tag != consume_ok.consumer_tag
    cancel_ok = client.rpc(
        1, commands.Basic.Cancel(consumer_tag=consume_ok.consumer_tag), commands.Basic.CancelOk
    )
    assert cancel_ok.consumer_tag == consume_ok.consumer_tag


def test_client_consumer_tag_must_be_unique_on_channel(connection):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None, consumer_tag="dup")
    with pytest.raises(pika.exceptions.DuplicateConsumerTag):
        ch.basic_consume(q, lambda *a: None, consumer_tag="dup")


def test_duplicate_consumer_tag_raw(raw):
    """pika refuses locally; the server says 530 NOT_ALLOWED (a connection error)."""
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    client.rpc(
        1, commands.Basic.Consume(queue=ok.queue, consumer_tag="t"), commands.Basic.ConsumeOk
    )
    client.send_method(1, commands.Basic.Consume(queue=ok.queue, consumer_tag="t"))
    close = client.expect_connection_close()
    assert close.reply_code == 530
    assert (close.class_id, close.method_id) == (60, 20)


def test_exclusive_consumer(connection, names):
    q = _filled_queue(connection, names, 0)
    ch = connection.channel()
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    other = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_consume(q, lambda *a: None)
    assert info.value.reply_code == 403
    assert info.value.reply_text.startswith("ACCESS_REFUSED")
    assert ch.is_open


def test_exclusive_consume_when_queue_has_consumer(connection, names):
    q = _filled_queue(connection, names, 0)
    ch = connection.channel()
    ch.basic_consume(q, lambda *a: None)
    other = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_consume(q, lambda *a: None, exclusive=True)
    assert info.value.reply_code == 403


def test_consume_missing_queue(connection, names):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume(names.queue("missing"), lambda *a: None)
    assert info.value.reply_code == 404


def test_no_ack_consumer_leaves_nothing_unacked(connection, names):
    q = _filled_queue(connection, names, 3)
    ch = connection.channel()
    c = Collector()
    ch.basic_consume(q, c, auto_ack=True)
    assert wait_until(connection, lambda: len(c) == 3)
    assert c.bodies == [b"0", b"1", b"2"]
    ch.close()  # nothing to requeue
    check = connection.channel()
    assert check.queue_declare(q, passive=True).method.message_count == 0


def test_cancel_stops_deliveries(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    c = Collector()
    tag = ch.basic_consume(q, c, auto_ack=True)
    ch.basic_publish("", q, b"before")
    assert wait_until(connection, lambda: len(c) == 1)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"after")
    _settle(connection, 0.1)
    assert c.bodies == [b"before"]
    assert drain(ch, q) == [b"after"]


def test_cancel_unknown_tag_is_ok(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Basic.Cancel(consumer_tag="never"), commands.Basic.CancelOk)
    assert ok.consumer_tag == "never"


def test_server_cancels_consumer_when_queue_deleted(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda method: cancelled.append(method))
    tag = ch.basic_consume(q, lambda *a: None)
    connection.channel().queue_delete(q)
    assert wait_until(connection, lambda: cancelled)
    assert cancelled[0].method.consumer_tag == tag
    assert ch.is_open


def test_server_cancel_raw(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    client.rpc(
        1, commands.Basic.Consume(queue=ok.queue, consumer_tag="c1"), commands.Basic.ConsumeOk
    )
    client.send_method(1, commands.Queue.Delete(queue=ok.queue))
    # RabbitMQ sends delete-ok first, then basic.cancel (nowait)
    _ch, cancel = client.wait_for(commands.Basic.Cancel, channel=1)
    assert cancel.consumer_tag == "c1"
    # The spec lets a client answer cancel-ok, but RabbitMQ treats a
    # client-sent basic.cancel-ok as 503 COMMAND_INVALID "unimplemented
    # method", so real clients never send it.  The channel stays usable.
    again = client.rpc(
        1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk
    )
    assert again.queue


def test_round_robin(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    c1, c2 = Collector(), Collector()
    consumer_ch = connection.channel()
    consumer_ch.basic_consume(q, c1, auto_ack=True)
    consumer_ch.basic_consume(q, c2, auto_ack=True)
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(c1) + len(c2) == 10)
    assert c1.bodies == [str(i).encode() for i in range(0, 10, 2)]
    assert c2.bodies == [str(i).encode() for i in range(1, 10, 2)]


def test_deliver_fields(connection, names):
    x = names.exchange("direct")
    ch = connection.channel()
    ch.exchange_declare(x, "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, routing_key="rk")
    c = Collector()
    tag = ch.basic_consume(q, c)
    ch.basic_publish(x, "rk", b"m1")
    ch.basic_publish(x, "rk", b"m2")
    assert wait_until(connection, lambda: len(c) == 2)
    m1, m2 = c.deliveries[0][0], c.deliveries[1][0]
    assert (m1.consumer_tag, m1.exchange, m1.routing_key, m1.redelivered) == (tag, x, "rk", False)
    assert (m1.delivery_tag, m2.delivery_tag) == (1, 2)


# -- publish: mandatory / immediate -----------------------------------------------


def test_mandatory_unroutable_is_returned(connection, names):
    ch = connection.channel()
    returned = []
    ch.add_on_return_callback(lambda ch_, method, props, body: returned.append((method, body)))
    x = names.exchange("direct")
    ch.exchange_declare(x, "direct")
    ch.basic_publish(x, "nobody", b"bounce", pika.BasicProperties(message_id="m1"), mandatory=True)
    assert wait_until(connection, lambda: returned)
    method, body = returned[0]
    assert method.reply_code == 312
    assert method.reply_text == "NO_ROUTE"
    assert (method.exchange, method.routing_key) == (x, "nobody")
    assert body == b"bounce"


def test_mandatory_unroutable_raw(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.publish(1, "amq.direct", "leveret-nobody-bound", b"back", mandatory=True)
    _ch, ret = client.wait_for(commands.Basic.Return, channel=1)
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
    _ch, hdr = client.read_frame()
    _ch, content = client.read_frame()
    assert hdr.body_size == 4
    assert content.value == b"back"


def test_mandatory_with_confirms_is_returned_then_acked(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("amq.direct", names.queue("nobody"), b"x", mandatory=True)
    assert info.value.messages[0].method.reply_code == 312


def test_immediate_not_implemented(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.publish(1, "", "whatever", b"x", immediate=True)
    close = client.expect_connection_close()
    assert close.reply_code == 540
    assert close.reply_text.startswith("NOT_IMPLEMENTED")
    assert (close.class_id, close.method_id) == (60, 40)


# -- get ----------------------------------------------------------------------------


def test_get_ok_and_get_empty(connection, names):
    q = _filled_queue(connection, names, 3)
    ch = connection.channel()
    method, _props, body = ch.basic_get(q)
    assert isinstance(method, pika.spec.Basic.GetOk)
    assert body == b"0"
    assert method.message_count == 2  # messages left after this one
    assert method.redelivered is False
    assert method.exchange == ""
    assert method.routing_key == q
    ch.basic_get(q, auto_ack=True)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert method.message_count == 0
    method, props, body = ch.basic_get(q)
    assert method is None  # get-empty


def test_get_empty_raw(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    reply = client.rpc(1, commands.Basic.Get(queue=ok.queue), commands.Basic.GetEmpty)
    assert isinstance(reply, commands.Basic.GetEmpty)


# -- ack / nack / reject ----------------------------------------------------------


def _get_all(ch, q, n):
    methods = []
    for _ in range(n):
        method, _p, _b = ch.basic_get(q)
        assert method is not None
        methods.append(method)
    return methods


def test_ack_multiple(connection, names):
    q = _filled_queue(connection, names, 5)
    ch = connection.channel()
    methods = _get_all(ch, q, 5)
    ch.basic_ack(methods[2].delivery_tag, multiple=True)  # acks 1..3
    ch.close()  # 4 and 5 are requeued
    ch = connection.channel()
    assert drain(ch, q) == [b"3", b"4"]


def test_nack_multiple_requeue(connection, names):
    q = _filled_queue(connection, names, 4)
    ch = connection.channel()
    methods = _get_all(ch, q, 4)
    ch.basic_nack(methods[1].delivery_tag, multiple=True, requeue=True)  # 0, 1 back
    ch.basic_nack(methods[3].delivery_tag, multiple=False, requeue=False)  # 3 dropped
    got = []
    while True:
        method, _props, body = ch.basic_get(q)
        if method is None:
            break
        assert method.redelivered is True
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert got == [b"0", b"1"]
    ch.basic_ack(methods[2].delivery_tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_reject_requeue_and_discard(connection, names):
    q = _filled_queue(connection, names, 2)
    ch = connection.channel()
    m0, m1 = _get_all(ch, q, 2)
    ch.basic_reject(m0.delivery_tag, requeue=False)
    ch.basic_reject(m1.delivery_tag, requeue=True)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"1", True)
    assert ch.basic_get(q)[0] is None


def test_requeued_message_keeps_its_position(connection, names):
    q = _filled_queue(connection, names, 4)
    ch = connection.channel()
    m0, _m1 = _get_all(ch, q, 2)
    ch.basic_ack(_m1.delivery_tag)
    ch.basic_nack(m0.delivery_tag, requeue=True)
    got = []
    for _ in range(3):
        method, _props, body = ch.basic_get(q, auto_ack=True)
        got.append((body, method.redelivered))
    assert got == [(b"0", True), (b"2", False), (b"3", False)]


def test_requeue_order_of_several_messages(connection, names):
    q = _filled_queue(connection, names, 5)
    ch = connection.channel()
    methods = _get_all(ch, q, 5)
    ch.basic_ack(methods[0].delivery_tag)
    ch.basic_ack(methods[2].delivery_tag)
    ch.basic_nack(methods[4].delivery_tag, requeue=True)
    ch.basic_nack(methods[1].delivery_tag, requeue=True)
    ch.basic_nack(methods[3].delivery_tag, requeue=True)
    assert drain(ch, q) == [b"1", b"3", b"4"]


def test_redelivered_flag_on_consumer(connection, names):
    q = _filled_queue(connection, names, 1)
    ch = connection.channel()
    c = Collector()
    ch.basic_consume(q, c)
    assert wait_until(connection, lambda: len(c) == 1)
    ch.basic_nack(c.deliveries[0][0].delivery_tag, requeue=True)
    assert wait_until(connection, lambda: len(c) == 2)
    assert c.deliveries[1][0].redelivered is True
    assert c.deliveries[1][2] == b"0"


@pytest.mark.parametrize("method", ["ack", "nack", "reject"])
def test_unknown_delivery_tag(connection, method):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        if method == "ack":
            ch.basic_ack(42)
        elif method == "nack":
            ch.basic_nack(42)
        else:
            ch.basic_reject(42)
        ch.queue_declare("", exclusive=True)  # round trip
    assert info.value.reply_code == 406
    assert "unknown delivery tag 42" in info.value.reply_text
    assert connection.is_open


def test_double_ack(connection, names):
    q = _filled_queue(connection, names, 1)
    ch = connection.channel()
    method, _p, _b = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_ack(method.delivery_tag)
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 406


def test_ack_multiple_zero_acks_everything(connection, names):
    """delivery_tag 0 with multiple=True means "all outstanding"."""
    q = _filled_queue(connection, names, 3)
    ch = connection.channel()
    _get_all(ch, q, 3)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert connection.channel().queue_declare(q, passive=True).method.message_count == 0


def test_delivery_tags_are_per_channel(connection, names):
    q = _filled_queue(connection, names, 2)
    ch1, ch2 = connection.channel(), connection.channel()
    m1, _p, _b = ch1.basic_get(q)
    m2, _p, _b = ch2.basic_get(q)
    assert m1.delivery_tag == m2.delivery_tag == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch1.basic_ack(2)
        ch1.queue_declare("", exclusive=True)
    ch2.basic_ack(1)


# -- recover ----------------------------------------------------------------------


def test_recover_requeue(connection, names):
    q = _filled_queue(connection, names, 3)
    ch = connection.channel()
    c = Collector()
    ch.basic_consume(q, c)
    assert wait_until(connection, lambda: len(c) == 3)
    ch.basic_ack(c.deliveries[0][0].delivery_tag)
    ch.basic_recover(requeue=True)
    assert wait_until(connection, lambda: len(c) == 5)
    redelivered = c.deliveries[3:]
    assert [d[2] for d in redelivered] == [b"1", b"2"]
    assert all(d[0].redelivered for d in redelivered)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_recover_async(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    client.publish(1, "", ok.queue, b"a")
    client.publish(1, "", ok.queue, b"b")
    client.rpc(
        1, commands.Basic.Consume(queue=ok.queue, consumer_tag="c"), commands.Basic.ConsumeOk
    )
    first = [client.wait_for(commands.Basic.Deliver, channel=1)[1] for _ in range(2)]
    assert [d.redelivered for d in first] == [False, False]
    client.send_method(1, commands.Basic.RecoverAsync(requeue=True))  # no reply
    again = [client.wait_for(commands.Basic.Deliver, channel=1)[1] for _ in range(2)]
    assert [d.redelivered for d in again] == [True, True]
    assert again[0].delivery_tag > first[1].delivery_tag


def test_recover_without_requeue_not_implemented(connect):
    """RabbitMQ: basic.recover(requeue=False) is 540 NOT_IMPLEMENTED."""
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.basic_recover(requeue=False)
    assert info.value.reply_code == 540


# -- unacked messages go back on close ---------------------------------------------


def test_channel_close_requeues_unacked(connection, names):
    q = _filled_queue(connection, names, 3)
    ch = connection.channel()
    c = Collector()
    ch.basic_consume(q, c)
    assert wait_until(connection, lambda: len(c) == 3)
    ch.basic_ack(c.deliveries[1][0].delivery_tag)
    ch.close()
    ch = connection.channel()
    got = []
    for _ in range(2):
        method, _p, body = ch.basic_get(q, auto_ack=True)
        got.append((body, method.redelivered))
    assert got == [(b"0", True), (b"2", True)]


def test_connection_close_requeues_unacked(connect, names):
    conn = connect()
    q = _filled_queue(conn, names, 2)
    ch = conn.channel()
    _get_all(ch, q, 2)
    conn.close()
    ch = connect().channel()
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"0", True, 1)


def test_unacked_messages_go_to_other_consumer(connect, names):
    conn1, conn2 = connect(), connect()
    q = _filled_queue(conn1, names, 1)
    ch1 = conn1.channel()
    c1 = Collector()
    ch1.basic_consume(q, c1)
    assert wait_until(conn1, lambda: len(c1) == 1)
    ch2 = conn2.channel()
    c2 = Collector()
    ch2.basic_consume(q, c2)
    conn1.close()
    assert wait_until(conn2, lambda: len(c2) == 1)
    assert c2.deliveries[0][0].redelivered is True


# -- content sizes -------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 131072, 1024 * 1024])
def test_body_sizes_with_small_frame_max(connect, size):
    conn = connect(frame_max=4096)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    payload = bytes((i * 7) % 256 for i in range(size))
    ch.basic_publish("", q, payload)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert len(body) == size
    assert body == payload


@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_body_sizes_delivered_to_a_consumer(connect, frame_max):
    """Deliveries (not basic.get) of every size class: empty, small, around the
    large-body threshold, one whole frame and several frames, in one pipelined run."""
    conn = connect(frame_max=frame_max)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    sizes = [0, 1, 1023, 1024, 4088, 4089, frame_max - 8, frame_max, 300_000, 0, 5]
    payloads = [bytes((i * 7 + n) % 256 for i in range(n)) for n in sizes]
    for payload in payloads:
        ch.basic_publish("", q, payload)
    got = []
    for method, _props, body in ch.consume(q, auto_ack=True, inactivity_timeout=10):
        assert method is not None, f"{len(got)} of {len(payloads)} delivered"
        got.append(body)
        if len(got) == len(payloads):
            break
    assert [len(b) for b in got] == sizes
    assert got == payloads


def test_empty_body_is_delivered_without_a_body_frame(raw):
    """Spec 4.2.6: a content with a zero body size has no body frame. pika takes an
    empty body frame after such a header for a frame of no message, and drops the
    connection (RabbitMQ sends none)."""
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    client.publish(1, "", ok.queue, b"")
    client.publish(1, "", ok.queue, b"next")
    client.rpc(1, commands.Basic.Consume(queue=ok.queue, no_ack=True), commands.Basic.ConsumeOk)
    frames = [client.read_frame()[1] for _ in range(5)]
    kinds = [type(f).__name__ for f in frames]
    assert kinds == ["Deliver", "ContentHeader", "Deliver", "ContentHeader", "ContentBody"]
    assert frames[1].body_size == 0
    assert frames[4].value == b"next"


def test_large_body_raw_frames(raw):
    """1 MB split into 4088-byte body frames by the client and by the server."""
    client = raw(timeout=15)
    client.handshake(frame_max=4096)
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    payload = bytes(range(256)) * 4096
    client.publish(1, "", ok.queue, payload, frame_max=4096)
    client.send_method(1, commands.Basic.Get(queue=ok.queue, no_ack=True))
    client.wait_for(commands.Basic.GetOk, channel=1)
    _ch, hdr = client.read_frame()
    assert hdr.body_size == len(payload)
    parts = []
    while sum(map(len, parts)) < len(payload):
        _ch, part = client.read_frame()
        assert len(part.value) <= 4088
        parts.append(part.value)
    assert b"".join(parts) == payload
    assert len(parts) == -(-len(payload) // 4088)
