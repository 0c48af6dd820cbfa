"""amqps: TLS listeners, client certificates and SASL EXTERNAL, with real clients.

Certificates come from trustme: a throwaway CA signs the broker's certificate
and the clients' certificates.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import time
import urllib.request

import aio_pika
import pika
import pika.credentials
import pytest
import trustme

from clienthelp import run
from leveret.client import connect as leveret_connect
from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from serverproc import server_argv

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(files["ca"])
    server_cert.private_key_pem.write_to_path(files["key"])
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    for name in ("guest", "stranger", "certonly"):
        client = ca.issue_cert(f"{name}@example", common_name=name)
        client.private_key_and_cert_chain_pem.write_to_path(d / f"{name}.pem")
        files[name] = d / f"{name}.pem"
    files["other_ca"] = d / "other-ca.pem"
    other = trustme.CA()
    other.issue_cert("x", common_name="guest").private_key_and_cert_chain_pem.write_to_path(
        d / "foreign.pem"
    )
    files["foreign"] = d / "foreign.pem"
    return files


def _config(pki, **extra) -> ServerConfig:
    return ServerConfig(
        port=0,
        persistence=False,
        tls_cert=str(pki["cert"]),
        tls_key=str(pki["key"]),
        tls_ca=str(pki["ca"]),
        tls_port=0,
        auth_failure_delay=0,
        **extra,
    )


def _tls_port(broker) -> int:
    return broker.server.addresses[1][1]


def _client_context(pki, cert: str | None = None, **kw) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        context.load_cert_chain(str(pki[cert]))
    for key, value in kw.items():
        setattr(context, key, value)
    return context


def _pika_round_trip(port: int, context: ssl.SSLContext | None, credentials=None) -> bytes:
    """Publish and get one message; `context` None: plain AMQP."""
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(context, "localhost") if context is not None else None,
        connection_attempts=1,
        socket_timeout=5,
    )
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"over tls")
    body = ch.basic_get(q, auto_ack=True)[2]
    conn.close()
    return body


def test_pika_aio_pika_and_leveret_client_over_tls(pki):
    with embedded_broker(_config(pki)) as broker:
        port = _tls_port(broker)
        assert _pika_round_trip(port, _client_context(pki)) == b"over tls"

        async def with_aio_pika():
            conn = await aio_pika.connect(
                f"amqps://guest:guest@localhost:{port}/", ssl_context=_client_context(pki)
            )
            async with conn:
                ch = await conn.channel()
                q = await ch.declare_queue(exclusive=True)
                await ch.default_exchange.publish(aio_pika.Message(b"aio"), routing_key=q.name)
                message = await q.get(timeout=5)
                await message.ack()
                return message.body

        assert asyncio.run(with_aio_pika()) == b"aio"

        async def with_leveret_client():
            conn = await leveret_connect(
                f"amqps://guest:guest@localhost:{port}/%2F", ssl_context=_client_context(pki)
            )
            try:
                ch = await conn.channel()
                q = await ch.declare_queue("", exclusive=True)
                await ch.publish(b"own", routing_key=q.name)
                message = await ch.get(q.name, no_ack=True)
                return message.body
            finally:
                await conn.close()

        assert run(with_leveret_client()) == b"own"
        # Plain TCP goes on beside it.
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.close()


def _handshake_fails(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as info:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"AMQP\x00\x00\x09\x01")
                if not tls.recv(1):
                    raise ConnectionResetError("closed")
        return str(info.value)


def test_tls_1_1_is_refused(pki, caplog):
    with embedded_broker(_config(pki)) as broker:
        context = _client_context(pki)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("ALL:@SECLEVEL=0")
        _handshake_fails(_tls_port(broker), context)
        _wait_for_log(caplog, "TLS handshake with 127.0.0.1:")


def _broker_tracebacks(caplog) -> list[str]:
    """Tracebacks logged by the broker or asyncio (pika logs its own side's errors)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.exc_info and r.name.startswith(("leveret", "asyncio"))
    ]


def _wait_for_log(caplog, text: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(text in r.getMessage() for r in caplog.records):
            return
        time.sleep(0.02)
    raise AssertionError(f"no log line with {text!r}: {[r.getMessage() for r in caplog.records]}")


def test_a_missing_client_certificate_is_refused_when_required(pki, caplog):
    with embedded_broker(_config(pki, tls_verify=True, tls_fail_if_no_peer_cert=True)) as broker:
        port = _tls_port(broker)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _pika_round_trip(port, _client_context(pki))
        _wait_for_log(caplog, "TLS handshake with 127.0.0.1:")
        # A certificate from another CA is refused too.
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _pika_round_trip(port, _client_context(pki, "foreign"))
        assert _pika_round_trip(port, _client_context(pki, "guest")) == b"over tls"
        assert not _broker_tracebacks(caplog)


def test_a_plain_amqp_client_on_the_tls_port_is_dropped_with_a_log_line(pki, caplog):
    with embedded_broker(_config(pki)) as broker:
        params = pika.ConnectionParameters(
            "127.0.0.1", _tls_port(broker), connection_attempts=1, socket_timeout=5
        )
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params)
        _wait_for_log(caplog, "TLS handshake with 127.0.0.1:")
        assert not _broker_tracebacks(caplog)
        # The broker carries on.
        assert _pika_round_trip(_tls_port(broker), _client_context(pki)) == b"over tls"


def test_sasl_external_logs_in_as_the_certificate_cn(pki):
    with embedded_broker(_config(pki, tls_verify=True)) as broker:
        port = _tls_port(broker)
        external = pika.credentials.ExternalCredentials()
        assert _pika_round_trip(port, _client_context(pki, "guest"), external) == b"over tls"
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            _pika_round_trip(port, _client_context(pki, "stranger"), external)
        assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(
            info.value
        )
        # Without a certificate EXTERNAL is not offered at all: pika gives up.
        with pytest.raises(
            (pika.exceptions.AMQPConnectionError, pika.exceptions.AuthenticationError)
        ):
            _pika_round_trip(port, _client_context(pki), external)


def test_a_user_made_without_a_password_logs_in_by_certificate_only(pki):
    """PUT /api/users/{name} with tags only (RabbitMQ's way to make a certificate-only
    user): SASL EXTERNAL logs in, PLAIN with any password (the empty one too) does not."""
    config = _config(pki, tls_verify=True, management_port=0)
    with embedded_broker(config) as broker:
        base = f"http://127.0.0.1:{broker.server.management.port}/api"
        for path, body in (
            ("/users/certonly", {"tags": ""}),
            ("/permissions/%2F/certonly", {"configure": ".*", "write": ".*", "read": ".*"}),
        ):
            request = urllib.request.Request(
                base + path, data=json.dumps(body).encode(), method="PUT"
            )
            request.add_header("content-type", "application/json")
            token = base64.b64encode(b"guest:guest").decode()
            request.add_header("authorization", f"Basic {token}")
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 201
        port = _tls_port(broker)
        external = pika.credentials.ExternalCredentials()
        assert _pika_round_trip(port, _client_context(pki, "certonly"), external) == b"over tls"
        for password in ("", "guest", "certonly"):
            plain = pika.PlainCredentials("certonly", password)
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                _pika_round_trip(port, _client_context(pki, "certonly"), plain)
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                _pika_round_trip(broker.port, None, plain)


def _server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*server_argv(), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_refuses_incomplete_or_broken_tls_settings(pki, tmp_path):
    data = ["--data-dir", str(tmp_path / "d")]
    result = _server("--tls-cert", str(pki["cert"]), *data)
    assert result.returncode == 2 and "TLS needs both --tls-cert and --tls-key" in result.stderr
    result = _server("--tls-verify", *data)
    assert result.returncode == 2 and "need --tls-cert and --tls-key" in result.stderr
    result = _server("--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(pki["key"]), *data)
    assert result.returncode == 2
    assert f"cannot start: cannot read {tmp_path / 'nope.pem'}: no such file" in result.stderr
    result = _server("--tls-cert", str(pki["ca"]), "--tls-key", str(pki["key"]), *data)
    assert result.returncode == 2 and "cannot load the certificate" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_amqps_listener(pki, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*server_argv(), "--listen", f"amqps://127.0.0.1:{port}",
         "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
         "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        assert _pika_round_trip(port, _client_context(pki)) == b"over tls"
        pika_plain = pika.ConnectionParameters(
            "127.0.0.1", port, connection_attempts=1, socket_timeout=5
        )
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika_plain)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1]
    assert f"listening for AMQP 0-9-1 over TLS on 127.0.0.1:{port}" in err
    assert "TLS handshake with 127.0.0.1:" in err
    assert "Traceback" not in err
