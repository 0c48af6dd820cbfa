"""Closing without a TCP reset.

A client may go on writing after its connection.close: Node's amqplib does, for
publishes still buffered for other channels.  RabbitMQ answers close-ok, ignores
what follows and lets the client close the socket.  A broker that closes its
socket with unread input makes the kernel send a reset, and the client loses the
close-ok it has not read yet (ECONNRESET instead of close-ok).

Each test here reads the socket after the close and checks that close-ok (or the
server's connection.close) arrives intact, then a clean EOF: never a reset.  They
run against RabbitMQ too (LEVERET_TEST_URL).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from pamqp import commands

from rawamqp import ConnectionLost, method_frame

BURST = 2000


def _publish_frames(client, n: int, channel: int = 1, body: bytes = b"x" * 64) -> bytes:
    one = b""
    publish = method_frame(channel, commands.Basic.Publish(exchange="amq.fanout"))
    from rawamqp import content_frames

    one = publish + content_frames(channel, body, None, 131072)
    return one * n


def _keep_writing(sock: socket.socket, data: bytes, seconds: float) -> list[OSError]:
    """Write `data` repeatedly for a while, as amqplib does after its close.

    Returns the write errors seen: a broker that closed its socket on unread
    input answers these writes with a reset (EPIPE / ECONNRESET), which is what
    makes amqplib give up before it has read close-ok.
    """
    errors: list[OSError] = []

    def run() -> None:
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                sock.sendall(data)
        except OSError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join()
    return errors


def _read_until_close_ok(client) -> list:
    """Frames read until close-ok; a reset before it fails the test.

    The client, not the broker, closes the socket after close-ok (spec 2.2.4;
    RabbitMQ waits for it), so EOF is not awaited here.
    """
    seen = []
    while True:
        try:
            _ch, obj = client.read_frame(timeout=10)
        except ConnectionLost as exc:
            raise AssertionError(f"connection lost before close-ok: {exc}; saw {seen}") from exc
        seen.append(type(obj).__name__)
        if isinstance(obj, commands.Connection.CloseOk):
            return seen


def test_close_in_the_middle_of_a_burst_gets_close_ok(raw):
    client = raw(timeout=10)
    client.handshake()
    client.send_method(1, commands.Channel.Open())
    client.wait_for(commands.Channel.OpenOk)
    burst = _publish_frames(client, BURST)
    client.send(burst + method_frame(0, commands.Connection.Close(200, "bye", 0, 0)))
    # Keep writing, as amqplib does, and only then read: a broker that closed
    # its socket on unread input has by now reset the connection.
    assert _keep_writing(client.sock, _publish_frames(client, 50), 1.0) == []
    _read_until_close_ok(client)


def test_client_close_then_more_frames_no_reset(raw):
    """A pause after the close, then more publishes: still close-ok then EOF."""
    client = raw(timeout=10)
    client.handshake()
    client.send_method(1, commands.Channel.Open())
    client.wait_for(commands.Channel.OpenOk)
    client.send_method(0, commands.Connection.Close(200, "bye", 0, 0))
    time.sleep(0.2)
    assert _keep_writing(client.sock, _publish_frames(client, 200), 0.5) == []
    _read_until_close_ok(client)


def test_server_close_while_client_bursts_delivers_connection_close(raw, names):
    """A connection exception while the client is still writing: the client
    reads connection.close intact and can answer close-ok."""
    client = raw(timeout=10)
    client.handshake()
    client.send_method(1, commands.Channel.Open())
    client.wait_for(commands.Channel.OpenOk)
    # channel 7 was never opened: a frame on it is a connection error (504)
    bad = method_frame(7, commands.Basic.Qos(prefetch_count=1))
    client.send(_publish_frames(client, BURST) + bad)
    assert _keep_writing(client.sock, _publish_frames(client, 50), 1.0) == []
    try:
        _ch, close = client.wait_for(commands.Connection.Close, timeout=10)
    except ConnectionLost as exc:
        raise AssertionError(f"connection lost before connection.close: {exc}") from exc
    assert close.reply_code == 504
    try:
        client.send_method(0, commands.Connection.CloseOk())
    except OSError as exc:
        assert not isinstance(exc, ConnectionResetError), exc
    assert client.wait_closed(timeout=15)


@pytest.mark.leveret_only
def test_bad_frame_mid_burst_delivers_connection_close(raw):
    """An unparseable frame (bad frame end) makes the stream unusable; the server
    still gets its connection.close to the client before closing.

    Leveret-only: RabbitMQ 3.10.8 closes the socket at once on a frame error, so a
    client still writing sees a reset (docs/differences.md).
    """
    from rawamqp import raw_frame

    client = raw(timeout=10)
    client.handshake()
    client.send_method(1, commands.Channel.Open())
    client.wait_for(commands.Channel.OpenOk)
    broken = raw_frame(1, 1, b"\x00\x3c\x00\x28" + b"\x00" * 8, end=b"\x00")
    client.send(_publish_frames(client, BURST) + broken)
    assert _keep_writing(client.sock, _publish_frames(client, 50), 1.0) == []
    try:
        _ch, close = client.wait_for(commands.Connection.Close, timeout=10)
    except ConnectionLost as exc:
        raise AssertionError(f"connection lost before connection.close: {exc}") from exc
    assert close.reply_code == 501
