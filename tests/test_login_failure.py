"""A failed login, with and without the client's `authentication_failure_close` capability.

RabbitMQ 3.10 (recorded in tests/compat/access/recordings/login-*.json) answers a
client that announced the capability with a 403 connection.close, and closes the
socket of one that did not without any close method: such a client does not expect
one during the handshake. Both after a delay that slows password guessing: 3 s by
default, RabbitMQ's (its reader sleeps that long before it closes a failed handshake;
a client with the capability gets RabbitMQ's 403 at once, Leveret's after the delay,
docs/differences.md). Nothing the refused client sends meanwhile is acted on, and the
wait holds that connection only.
"""

from __future__ import annotations

import socket
import time

import pika
import pika.exceptions
import pytest
from pamqp import commands

from leveret.testing import embedded_broker
from rawamqp import ConnectionLost, RawClient, Timeout, method_frame, plain_response

TEXT = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)
WITHOUT_CAPABILITY = {"capabilities": {"basic.nack": True, "publisher_confirms": True}}


@pytest.fixture(scope="module")
def broker():
    with embedded_broker(port=0, persistence=False, auth_failure_delay=0.05) as b:
        yield b


def _start_ok(client: RawClient, capable: bool, password: str) -> None:
    capabilities = {"publisher_confirms": True}
    if capable:
        capabilities["authentication_failure_close"] = True
    client.send_protocol_header()
    client.wait_for(commands.Connection.Start)
    client.send_method(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": capabilities},
            mechanism="PLAIN",
            response=plain_response("guest", password),
        ),
    )


def test_raw_client_with_the_capability_gets_403(broker):
    with RawClient("127.0.0.1", broker.port) as client:
        _start_ok(client, capable=True, password="wrong")
        close = client.expect_connection_close()
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            403,
            TEXT,
            0,
            0,
        )
        assert client.wait_closed()


def test_raw_client_without_the_capability_sees_only_the_socket_close(broker):
    with RawClient("127.0.0.1", broker.port) as client:
        _start_ok(client, capable=False, password="wrong")
        with pytest.raises(ConnectionLost):
            client.read_frame(timeout=5)
        assert client.frames_seen[-1][1].__class__ is commands.Connection.Start


def test_raw_client_without_the_capability_logs_in_with_the_right_password(broker):
    with RawClient("127.0.0.1", broker.port) as client:
        _start_ok(client, capable=False, password="guest")
        _ch, tune = client.wait_for(commands.Connection.Tune)
        assert tune.frame_max > 0
        with pytest.raises(Timeout):
            client.read_frame(timeout=0.2)  # nothing more until tune-ok


def _pika_login(port: int, client_properties=None):
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=pika.PlainCredentials("guest", "wrong"),
        client_properties=client_properties,
        connection_attempts=1,
        socket_timeout=5,
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    return str(info.value)


def test_pika_announces_the_capability_and_gets_the_reason(broker):
    assert f"(403) '{TEXT}'" in _pika_login(broker.port)


def test_pika_without_the_capability_sees_a_lost_stream(broker):
    # pika replaces its capabilities with ours, so it does not announce the capability.
    message = _pika_login(broker.port, WITHOUT_CAPABILITY)
    assert "StreamLostError" in message and "403" not in message


# --- the delay: how long, what it ignores, and that nobody else waits ---------------------


@pytest.fixture(scope="module")
def default_broker():
    """A broker with the default delay (RabbitMQ's: its reader sleeps 3 s)."""
    with embedded_broker(port=0, persistence=False) as b:
        yield b


@pytest.fixture(scope="module")
def slow_refusal_broker():
    """A delay far longer than anything the other clients do meanwhile."""
    with embedded_broker(port=0, persistence=False, auth_failure_delay=30) as b:
        yield b


def _socket_open(client: RawClient) -> bool:
    """Whether the server has not closed the socket yet (nothing is waited for)."""
    client.sock.setblocking(False)
    try:
        return client.sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        client.sock.settimeout(client.timeout)


def test_without_the_capability_the_socket_closes_after_the_delay(default_broker):
    """No close method, and not at once: the default delay is RabbitMQ's 3 s (the
    test checks a lower bound of 2 s only)."""
    with RawClient("127.0.0.1", default_broker.port) as client:
        _start_ok(client, capable=False, password="wrong")
        sent = time.monotonic()
        with pytest.raises(ConnectionLost):
            client.read_frame(timeout=15)
        assert time.monotonic() - sent >= 2.0
        assert client.frames_seen[-1][1].__class__ is commands.Connection.Start


@pytest.mark.parametrize("capable", [True, False], ids=["capable", "without-capability"])
def test_what_follows_a_refused_start_ok_does_not_end_the_delay(default_broker, capable):
    """tune-ok, connection.open and connection.close sent with the refused start-ok
    (a client that does not wait for connection.tune, or a guesser in a hurry) are
    ignored, as RabbitMQ ignores them: the same answer after the same delay, not a
    COMMAND_INVALID at once."""
    capabilities = {"publisher_confirms": True}
    if capable:
        capabilities["authentication_failure_close"] = True
    with RawClient("127.0.0.1", default_broker.port) as client:
        client.send_protocol_header()
        client.wait_for(commands.Connection.Start)
        client.send(
            method_frame(
                0,
                commands.Connection.StartOk(
                    client_properties={"capabilities": capabilities},
                    mechanism="PLAIN",
                    response=plain_response("guest", "wrong"),
                ),
            )
            + method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072))
            + method_frame(0, commands.Connection.Open(virtual_host="/"))
            + method_frame(1, commands.Channel.Open())
            + method_frame(0, commands.Connection.Close(200, "bye", 0, 0))
        )
        sent = time.monotonic()
        if capable:
            close = client.expect_connection_close(timeout=15)
            assert (close.reply_code, close.reply_text) == (403, TEXT)
        else:
            with pytest.raises(ConnectionLost):
                client.read_frame(timeout=15)
            assert client.frames_seen[-1][1].__class__ is commands.Connection.Start
        assert time.monotonic() - sent >= 2.0
        assert client.wait_closed()


@pytest.mark.parametrize("capable", [True, False], ids=["capable", "without-capability"])
def test_other_clients_carry_on_while_a_refused_login_waits(slow_refusal_broker, capable):
    """The delay holds the refused connection only: meanwhile another client
    declares, publishes, consumes and gets, and the refused socket is still open
    when it is done (a broker that slept in its event loop would have answered
    nobody until the delay was over)."""
    port = slow_refusal_broker.port
    with RawClient("127.0.0.1", port) as refused:
        _start_ok(refused, capable=capable, password="wrong")
        conn = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)
        )
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            queue = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", queue, b"got")
            _ok, _props, body = ch.basic_get(queue, auto_ack=True)
            assert body == b"got"
            ch.basic_publish("", queue, b"one")
            ch.basic_publish("", queue, b"two")
            got = []
            ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=True)
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                conn.process_data_events(0.05)
            assert got == [b"one", b"two"]
        finally:
            conn.close()
        assert _socket_open(refused)
        assert [f.__class__ for _c, f in refused.frames_seen] == [commands.Connection.Start]
