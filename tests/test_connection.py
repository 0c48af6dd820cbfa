"""Connection class: protocol header, start/secure, tune, open, heartbeats, close."""

from __future__ import annotations

import time

import kombu
import pika
import pika.exceptions
import pytest
from amqp.exceptions import AccessRefused
from pamqp import commands, heartbeat

from conftest import connection_params
from rawamqp import ConnectionLost, RawClient, Timeout

EXPECTED_CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
]


# -- protocol header ------------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [b"AMQP\x00\x00\x09\x02", b"AMQP\x00\x00\x08\x00", b"HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n"],
    ids=["amqp-0-9-2", "amqp-0-8-0", "http-short", "http-get"],
)
def test_wrong_protocol_header_gets_server_header_back(raw, sent):
    client = raw()
    client.send(sent)
    assert client.read_bytes(8, timeout=5) == b"AMQP\x00\x00\x09\x01"
    assert client.wait_closed(timeout=5)


def test_connection_start(raw):
    client = raw()
    client.send_protocol_header()
    _ch, start = client.wait_for(commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    props = start.server_properties
    for key in ("product", "version", "platform", "capabilities"):
        assert key in props, key
    assert props["product"]
    for cap in EXPECTED_CAPABILITIES:
        assert props["capabilities"].get(cap) is True, cap
    mechanisms = start.mechanisms.split()
    assert "PLAIN" in mechanisms
    assert "AMQPLAIN" in mechanisms
    assert "en_US" in start.locales.split()


def test_server_properties_seen_by_pika(connection):
    props = connection._impl.server_properties
    for cap in EXPECTED_CAPABILITIES:
        assert props["capabilities"][cap] is True


@pytest.mark.leveret_only
def test_server_properties_product_is_leveret(connection):
    import leveret

    props = connection._impl.server_properties
    product = props["product"]
    product = product.decode() if isinstance(product, bytes) else product
    assert "leveret" in product.lower()
    version = props["version"]
    version = version.decode() if isinstance(version, bytes) else version
    assert version == getattr(leveret, "__version__", version)


# -- authentication -------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_raw_login(raw, amqp_credentials, amqp_vhost, mechanism):
    client = raw()
    user, password = amqp_credentials
    client.handshake(user=user, password=password, vhost=amqp_vhost, mechanism=mechanism)
    client.open_channel(1)
    client.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_raw_bad_password_is_access_refused(raw, mechanism):
    client = raw()
    close = client.handshake(user="guest", password="wrong-password", mechanism=mechanism)
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED")
    client.send_method(0, commands.Connection.CloseOk())
    assert client.wait_closed(timeout=5)


def test_raw_unknown_user_is_access_refused(raw):
    client = raw()
    close = client.handshake(user="no-such-user", password="guest")
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403


def test_pika_plain_login(connection):
    assert connection.is_open
    ch = connection.channel()
    assert ch.is_open


def test_pika_bad_password(amqp_url):
    params = connection_params(amqp_url)
    params.credentials = pika.PlainCredentials("guest", "definitely-wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "403" in str(info.value)
    assert "ACCESS_REFUSED" in str(info.value)


def test_kombu_amqplain_login(amqp_url):
    with kombu.Connection(amqp_url, login_method="AMQPLAIN", connect_timeout=5) as conn:
        conn.connect()
        assert conn.connected
        assert conn.connection.server_properties["capabilities"]["publisher_confirms"]
        with conn.channel() as ch:
            name, _count, _consumers = ch.queue_declare(queue="", exclusive=True)
            assert name.startswith("amq.gen-")


def test_kombu_amqplain_bad_password(amqp_url, amqp_host_port):
    host, port = amqp_host_port
    url = f"amqp://guest:wrong-password@{host}:{port}//"
    with kombu.Connection(url, login_method="AMQPLAIN", connect_timeout=5) as conn:
        with pytest.raises(AccessRefused):
            conn.ensure_connection(max_retries=1)


# -- tune ------------------------------------------------------------------------


def test_tune_server_proposal(raw):
    client = raw()
    tune = client.handshake()
    assert tune.frame_max >= 4096
    assert tune.channel_max > 0
    assert tune.heartbeat >= 0


def test_pika_lower_tune_values_win(connect):
    conn = connect(frame_max=8192, channel_max=16, heartbeat=0)
    params = conn._impl.params
    assert params.frame_max == 8192
    assert params.channel_max == 16
    assert params.heartbeat == 0
    # the lower frame_max is honoured in both directions: a 50 kB message is
    # split by pika and reassembled by the server, and split again on delivery.
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    payload = bytes(range(256)) * 200
    ch.basic_publish("", q, payload)
    method, _props, body = _get(conn, ch, q)
    assert method is not None
    assert body == payload


def _get(conn, ch, queue, attempts=50):
    for _ in range(attempts):
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, props, body
        conn.process_data_events(time_limit=0.05)
    return None, None, None


def test_server_respects_client_frame_max_when_delivering(raw):
    """With frame_max 4096 every frame the server sends fits into 4096 bytes."""
    client = raw()
    client.handshake(frame_max=4096)
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    payload = b"0123456789abcdef" * 1280  # 20 kB
    client.publish(1, "", ok.queue, payload, frame_max=4096)
    client.send_method(1, commands.Basic.Get(queue=ok.queue, no_ack=True))
    client.wait_for(commands.Basic.GetOk, channel=1)
    _ch, hdr = client.read_frame()
    assert hdr.body_size == len(payload)
    received = b""
    while len(received) < len(payload):
        _ch, part = client.read_frame()
        assert len(part.value) <= 4096 - 8
        received += part.value
    assert received == payload


def test_channel_max_negotiated_by_client(raw):
    client = raw()
    client.handshake(channel_max=10)
    client.open_channel(10)
    client.open_channel(1)


# -- heartbeats ------------------------------------------------------------------


def test_heartbeats_sent_and_silent_client_dropped(raw):
    """heartbeat=1: the server sends heartbeats; a client that never sends
    anything is disconnected after a couple of missed intervals."""
    client = raw(timeout=15)
    client.handshake(heartbeat=1)
    heartbeats = 0
    deadline = time.monotonic() + 15
    closed = False
    while time.monotonic() < deadline:
        try:
            _ch, obj = client.read_frame(timeout=deadline - time.monotonic())
        except ConnectionLost:
            closed = True
            break
        if isinstance(obj, heartbeat.Heartbeat):
            heartbeats += 1
        elif isinstance(obj, commands.Connection.Close):
            # A broker may say goodbye first; RabbitMQ just drops the socket.
            continue
    assert closed, "server kept a silent connection open despite heartbeat=1"
    assert heartbeats >= 1


def test_client_sending_heartbeats_stays_connected(raw):
    client = raw(timeout=10)
    client.handshake(heartbeat=1)
    seen = 0
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        client.send_heartbeat()
        try:
            _ch, obj = client.read_frame(timeout=0.5)
            if isinstance(obj, heartbeat.Heartbeat):
                seen += 1
        except Timeout:
            pass
    assert seen >= 1
    client.open_channel(1)


def test_pika_heartbeat_keeps_connection_alive(connect):
    conn = connect(heartbeat=1)
    assert conn._impl.params.heartbeat == 1
    conn.process_data_events(time_limit=3)
    assert conn.is_open
    ch = conn.channel()
    assert ch.queue_declare("", exclusive=True).method.queue


# -- handshake timeout (needs a short timeout configured) -------------------------


@pytest.mark.leveret_only
@pytest.mark.parametrize("send_header", [False, True], ids=["silent", "header-only"])
def test_handshake_timeout(send_header):
    from leveret.testing import embedded_broker

    with embedded_broker(handshake_timeout=0.5) as broker:
        client = RawClient("127.0.0.1", broker.port, timeout=5)
        try:
            if send_header:
                client.send_protocol_header()
                client.wait_for(commands.Connection.Start)
            assert client.wait_closed(timeout=5)
        finally:
            client.sock.close()


@pytest.mark.leveret_only
def test_embedded_broker_heartbeat_setting():
    from leveret.testing import embedded_broker

    with embedded_broker(heartbeat=1) as broker:
        client = RawClient("127.0.0.1", broker.port, timeout=5)
        try:
            tune = client.handshake(heartbeat=None)
            assert tune.heartbeat == 1
            _ch, obj = client.wait_for(heartbeat.Heartbeat, timeout=5)
        finally:
            client.close()


# -- open / close ----------------------------------------------------------------


def test_open_unknown_vhost_not_allowed(raw):
    client = raw()
    client.handshake(open_connection=False)
    client.send_method(0, commands.Connection.Open(virtual_host="no-such-vhost-leveret"))
    close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text.startswith("NOT_ALLOWED")
    assert (close.class_id, close.method_id) == (10, 40)
    assert client.wait_closed(timeout=5)


def test_pika_unknown_vhost(amqp_url):
    params = connection_params(amqp_url, virtual_host="no-such-vhost-leveret")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params)
    assert "530" in str(info.value)


def test_client_initiated_close(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(
        0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    client.wait_for(commands.Connection.CloseOk)
    # The peer that sent connection.close closes the socket after close-ok
    # (RabbitMQ keeps its end open until the client does so).
    client.sock.close()
    client.closed = True


def test_server_initiated_close_then_close_ok(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    # An immediate publish is a connection exception (540) in RabbitMQ.
    client.publish(1, "", "nowhere", b"x", immediate=True)
    close = client.expect_connection_close(reply_ok=True)
    assert close.reply_code == 540
    assert client.wait_closed(timeout=5)


def test_frames_after_server_close_are_ignored_until_close_ok(raw):
    """After sending connection.close the server discards everything but close-ok."""
    client = raw()
    client.handshake()
    client.open_channel(1)
    # acking an unknown tag is a channel exception (406) ...
    client.send_method(1, commands.Basic.Ack(delivery_tag=0))
    close = client.expect_channel_close(1)
    assert close.reply_code == 406
    # ... and using the closed channel without channel.open is a connection one (504)
    client.publish(1, "", "nowhere", b"x")
    conn_close = client.expect_connection_close(reply_ok=False)
    assert conn_close.reply_code == 504
    client.send_method(1, commands.Channel.Open())  # ignored by the server
    client.send_method(0, commands.Connection.CloseOk())
    assert client.wait_closed(timeout=5)


def test_pika_close_is_clean(amqp_url):
    conn = pika.BlockingConnection(connection_params(amqp_url))
    conn.channel()
    conn.close()
    assert conn.is_closed
