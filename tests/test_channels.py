"""Channel class: open/close, flow, channel vs connection exceptions."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pamqp import commands


def test_open_and_close_many_channels(connection):
    channels = [connection.channel() for _ in range(20)]
    numbers = {ch.channel_number for ch in channels}
    assert len(numbers) == 20
    for ch in channels[::2]:
        ch.close()
    for ch in channels[1::2]:
        assert ch.is_open
        ch.queue_declare("", exclusive=True)
    again = connection.channel()
    assert again.is_open


def test_raw_channel_open_close_and_reuse_number(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.send_method(
        1, commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0)
    )
    client.wait_for(commands.Channel.CloseOk, channel=1)
    client.open_channel(1)  # the number can be used again
    ok = client.rpc(2, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    assert ok.queue


def test_channel_flow_active_true(raw):
    """pika has no channel.flow API. flow(active=True) is answered with flow-ok(True)."""
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
    assert isinstance(ok, commands.Channel.FlowOk)
    assert ok.active is True


def test_channel_flow_active_false(raw):
    """RabbitMQ does not implement client-requested flow control: it answers
    channel.flow(active=False) with connection.close 540 NOT_IMPLEMENTED
    ("NOT_IMPLEMENTED - active=false").  Leveret may instead comply and
    reply flow-ok(False)."""
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Channel.Flow(active=False))
    _ch, reply = client.wait_for(commands.Channel.FlowOk, commands.Connection.Close)
    if isinstance(reply, commands.Channel.FlowOk):
        assert reply.active is False
    else:
        assert reply.reply_code == 540
        assert (reply.class_id, reply.method_id) == (20, 20)


def test_close_channel_from_server_then_reopen(raw, names):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Queue.Declare(queue=names.queue("missing"), passive=True))
    close = client.expect_channel_close(1)
    assert close.reply_code == 404
    assert (close.class_id, close.method_id) == (50, 10)
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    assert ok.queue


def _trigger_403(ch, names):
    ch.exchange_declare(names.exchange("amq-prefix").replace("leveret-test", "amq.leveret"))


def _trigger_404(ch, names):
    ch.queue_declare(names.queue("missing"), passive=True)


def _trigger_405(ch, names, connect):
    other = connect().channel()
    q = names.queue("excl")
    other.queue_declare(q, exclusive=True)
    ch.queue_declare(q)


def _trigger_406(ch, names):
    x = names.exchange("redeclare")
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.exchange_declare(x, "fanout", auto_delete=True)


@pytest.mark.parametrize("code", [403, 404, 405, 406])
def test_channel_exception_closes_only_the_channel(connection, names, connect, code):
    bystander = connection.channel()
    victim = connection.channel()
    trigger = {
        403: lambda: _trigger_403(victim, names),
        404: lambda: _trigger_404(victim, names),
        405: lambda: _trigger_405(victim, names, connect),
        406: lambda: _trigger_406(victim, names),
    }[code]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        trigger()
    assert info.value.reply_code == code
    assert info.value.reply_text
    assert victim.is_closed
    assert connection.is_open
    assert bystander.is_open
    q = bystander.queue_declare("", exclusive=True).method.queue
    bystander.basic_publish("", q, b"still here")
    method, _props, body = bystander.basic_get(q, auto_ack=True)
    assert body == b"still here"
    assert connection.channel().is_open


# A trigger for each connection exception a client can provoke in RabbitMQ.
# 502 SYNTAX_ERROR, 506 RESOURCE_ERROR and 541 INTERNAL_ERROR have no trigger:
# RabbitMQ reports undecodable arguments as 501, and the other two depend on
# server-side conditions.
def _conn_exc_frame_error(c):
    from rawamqp import method_payload, raw_frame

    c.send(raw_frame(1, 1, method_payload(commands.Basic.Qos(prefetch_count=1)), b"\x00"))


def _conn_exc_unknown_exchange_type(c):
    c.send_method(
        1, commands.Exchange.Declare(exchange="leveret-test-bogus-type", exchange_type="bogus")
    )


def _conn_exc_channel_error(c):
    c.send_method(7, commands.Queue.Declare(queue="", exclusive=True))


def _conn_exc_unexpected_frame(c):
    from pamqp import body, frame

    c.send(frame.marshal(body.ContentBody(b"orphan"), 1))


def _conn_exc_channel_max(c):
    # handshake negotiated channel_max=3; channel 1 is open, so two more fit
    for n in (2, 3, 4, 5):
        c.send_method(n, commands.Channel.Open())


def _conn_exc_immediate(c):
    c.publish(1, "", "nowhere", b"x", immediate=True)


def _conn_exc_prefetch_size(c):
    c.send_method(1, commands.Basic.Qos(prefetch_size=10))


def _conn_exc_recover_no_requeue(c):
    c.send_method(1, commands.Basic.Recover(requeue=False))


CONNECTION_EXCEPTIONS = {
    "501-frame-error": (_conn_exc_frame_error, {501}, None),
    "503-unknown-exchange-type": (_conn_exc_unknown_exchange_type, {503}, (40, 10)),
    "504-channel-not-open": (_conn_exc_channel_error, {504}, (50, 10)),
    "505-body-without-header": (_conn_exc_unexpected_frame, {505}, None),
    "530-channel-max-exceeded": (_conn_exc_channel_max, {530}, None),
    "540-immediate": (_conn_exc_immediate, {540}, (60, 40)),
    "540-prefetch-size": (_conn_exc_prefetch_size, {540}, (60, 10)),
    "540-recover-requeue-false": (_conn_exc_recover_no_requeue, {540}, (60, 110)),
}


@pytest.mark.parametrize("case", sorted(CONNECTION_EXCEPTIONS))
def test_connection_exception_closes_connection(raw, case):
    trigger, codes, method = CONNECTION_EXCEPTIONS[case]
    bystander = raw()
    bystander.handshake()
    bystander.open_channel(1)
    client = raw()
    client.handshake(channel_max=3)
    client.open_channel(1)
    trigger(client)
    close = client.expect_connection_close()
    assert close.reply_code in codes, (close.reply_code, close.reply_text)
    assert close.reply_text
    if method is not None:
        assert (close.class_id, close.method_id) == method
    assert client.wait_closed(timeout=8)
    ok = bystander.rpc(
        1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk
    )
    assert ok.queue


def test_pika_connection_exception(connect):
    conn = connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.basic_qos(prefetch_size=10)
    assert info.value.reply_code == 540
    assert conn.is_closed


def test_pika_channel_close_by_client(connection):
    ch = connection.channel()
    ch.close()
    assert ch.is_closed
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        ch.queue_declare("", exclusive=True)
    assert connection.is_open


def test_many_channels_independent_consumers(connection):
    ch1 = connection.channel()
    ch2 = connection.channel()
    q = ch1.queue_declare("", exclusive=True).method.queue
    got = []
    ch2.basic_consume(q, lambda ch, m, p, b: got.append(b), auto_ack=True)
    ch1.basic_publish("", q, b"one")
    ch1.basic_publish("", q, b"two")
    for _ in range(50):
        if len(got) == 2:
            break
        connection.process_data_events(time_limit=0.1)
    assert got == [b"one", b"two"]


def test_pika_params_for_channel_max(amqp_url):
    params = pika.URLParameters(amqp_url)
    params.channel_max = 3
    conn = pika.BlockingConnection(params)
    try:
        chans = [conn.channel() for _ in range(3)]
        assert all(c.is_open for c in chans)
        # pika refuses to allocate a 4th channel number itself
        with pytest.raises(pika.exceptions.NoFreeChannels):
            conn.channel()
    finally:
        conn.close()
