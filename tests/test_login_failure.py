"""A failed login, with and without the client's `authentication_failure_close` capability.

RabbitMQ 3.10 (recorded in tests/compat/access/recordings/login-*.json) answers a
client that announced the capability with a 403 connection.close, and closes the
socket of one that did not without any close method: such a client does not expect
one during the handshake. Both after a delay that slows password guessing.
"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pamqp import commands

from leveret.testing import embedded_broker
from rawamqp import ConnectionLost, RawClient, Timeout, plain_response

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
