"""MQTT security and operations: client-certificate login (`mqtt_ssl_cert_login`), the
port and certificate vhost mappings (global parameters `mqtt_port_to_vhost_mapping`
and `mqtt_default_vhosts`), MQTT connections in the overview and in Prometheus, and
connection limits. Real sockets: paho-mqtt 2.x over TLS with trustme certificates, the
raw client (tests/mqttraw.py) where the exact CONNACK matters, HTTP for the APIs.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest
import trustme

from leveret.config import ServerConfig
from leveret.mqtt import packets as p
from leveret.testing import embedded_broker
from mqttraw import RawMQTT
from serverproc import server_argv

pytestmark = pytest.mark.leveret_only

CERT_USER = "mqtt-cert-user"
# paho-mqtt 2.x reports a 3.1.1 CONNACK return code as the MQTT 5 reason code it
# means: 4 (bad user name or password) as 0x86.
PAHO_BAD_CREDENTIALS = p.RC_BAD_USERNAME_OR_PASSWORD


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("mqtt-pki")
    ca = trustme.CA()
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(files["ca"])
    server_cert.private_key_pem.write_to_path(files["key"])
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    for name in (CERT_USER, "nobody-here"):
        client = ca.issue_cert(f"{name}@example", common_name=name)
        client.private_key_and_cert_chain_pem.write_to_path(d / f"{name}.pem")
        files[name] = d / f"{name}.pem"
    return files


def _tls_config(pki, **extra) -> ServerConfig:
    settings = {
        "port": 0,
        "persistence": False,
        "tls_cert": str(pki["cert"]),
        "tls_key": str(pki["key"]),
        "tls_ca": str(pki["ca"]),
        "tls_verify": True,
        "mqtt_port": 0,
        "mqtt_tls_port": 0,
        "auth_failure_delay": 0,
        **extra,
    }
    return ServerConfig(**settings)


def _mqtts_port(b) -> int:
    return b.server.mqtt.addresses["mqtts"][1]


class Outcome:
    """What a paho-mqtt 2.x client saw of its CONNECT: the CONNACK's reason code."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.code: int | None = None


def paho_connect(port: int, pki, cert: str | None, username: str | None = None,
                 password: str | None = None, client_id: str = "ops") -> tuple[mqtt.Client, int]:  # fmt: skip
    """Connect with paho-mqtt over TLS; the client (looping) and the CONNACK's code."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.tls_set(ca_certs=str(pki["ca"]), certfile=str(pki[cert]) if cert else None, keyfile=None)
    if username is not None:
        client.username_pw_set(username, password)
    outcome = Outcome()

    def on_connect(c, userdata, flags, reason_code, properties) -> None:
        outcome.code = reason_code.value
        outcome.done.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    assert outcome.done.wait(10), "no CONNACK"
    assert outcome.code is not None
    return client, outcome.code


def _stop(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


def _open(b) -> list[tuple[str | None, str | None, str | None]]:
    """(client id, user, vhost) of the broker's open MQTT connections."""
    return b.call(
        lambda: [
            (c.client_id, c.user, c.vhost.name if c.vhost else None)
            for c in b.server.mqtt.open_connections()
        ]
    )


def _tls_raw(port: int, pki, cert: str | None) -> ssl.SSLSocket:
    import socket

    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        context.load_cert_chain(str(pki[cert]))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _raw_connect(sock: ssl.SSLSocket, connect: p.Connect, version: int = p.MQTT_3_1_1):
    from leveret.mqtt.codec import Decoder, encode

    sock.sendall(encode(connect, version))
    decoder = Decoder("client", version)
    while True:
        data = sock.recv(4096)
        assert data, "closed without a CONNACK"
        packets = decoder.feed(data)
        if packets:
            return packets[0]


# --- mqtt_ssl_cert_login -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cert_broker(pki):
    with embedded_broker(
        _tls_config(pki, mqtt_ssl_cert_login=True, mqtt_allow_anonymous=False)
    ) as b:
        # A user made without a password: it can log in only by certificate.
        b.admin.add_user(CERT_USER, "")
        b.admin.set_permissions(CERT_USER, "/", ".*", ".*", ".*")
        yield b


def test_a_client_certificate_logs_in_as_its_cn_without_a_password(cert_broker, pki):
    client, code = paho_connect(_mqtts_port(cert_broker), pki, CERT_USER, client_id="by-cert")
    try:
        assert code == 0
        assert ("by-cert", CERT_USER, "/") in _open(cert_broker)
        # The login is a real one: the user publishes and receives through amq.topic.
        got = threading.Event()
        client.on_message = lambda c, u, m: got.set() if m.payload == b"hi" else None
        client.subscribe("ops/cert", qos=1)
        client.publish("ops/cert", b"hi", qos=1).wait_for_publish(10)
        assert got.wait(10)
    finally:
        _stop(client)


def test_a_certificate_naming_no_user_is_refused_as_bad_credentials(cert_broker, pki):
    client, code = paho_connect(_mqtts_port(cert_broker), pki, "nobody-here")
    _stop(client)
    assert code == PAHO_BAD_CREDENTIALS
    with _tls_raw(_mqtts_port(cert_broker), pki, "nobody-here") as sock:
        ack = _raw_connect(sock, p.Connect("ops-5", protocol_level=p.MQTT_5), p.MQTT_5)
    assert ack.reason_code == p.RC_BAD_USERNAME_OR_PASSWORD
    assert (
        "authentication failed for user 'nobody-here' (client certificate)"
        in (ack.properties["reason_string"])
    )


def test_user_name_and_password_take_priority_over_the_certificate(cert_broker, pki):
    client, code = paho_connect(
        _mqtts_port(cert_broker), pki, CERT_USER, "guest", "guest", client_id="by-password"
    )
    try:
        assert code == 0
        assert ("by-password", "guest", "/") in _open(cert_broker)
    finally:
        _stop(client)
    client, code = paho_connect(_mqtts_port(cert_broker), pki, CERT_USER, "guest", "wrong")
    _stop(client)
    assert code == PAHO_BAD_CREDENTIALS


def test_without_a_certificate_or_on_the_plain_port_no_credentials_is_refused(cert_broker, pki):
    client, code = paho_connect(_mqtts_port(cert_broker), pki, None)
    _stop(client)
    assert code == PAHO_BAD_CREDENTIALS
    with RawMQTT(cert_broker.mqtt_port) as plain:
        assert plain.connect("plain", None, None).reason_code == p.CONNACK_BAD_CREDENTIALS


def test_with_cert_login_off_a_certificate_alone_is_refused(pki):
    config = _tls_config(pki, mqtt_allow_anonymous=False)
    with embedded_broker(config) as b:
        b.admin.add_user(CERT_USER, "")
        b.admin.set_permissions(CERT_USER, "/", ".*", ".*", ".*")
        client, code = paho_connect(_mqtts_port(b), pki, CERT_USER)
        _stop(client)
        assert code == PAHO_BAD_CREDENTIALS
        assert _open(b) == []


def test_with_cert_login_off_and_anonymous_on_a_certificate_alone_is_the_default_user(pki):
    """RabbitMQ 3.10's creds/3: anonymous login comes before nothing, never the cert."""
    with embedded_broker(_tls_config(pki)) as b:
        client, code = paho_connect(_mqtts_port(b), pki, CERT_USER, client_id="anon")
        try:
            assert code == 0
            assert _open(b) == [("anon", "guest", "/")]
        finally:
            _stop(client)


def test_cert_login_needs_a_verifying_tls_listener(pki):
    """The broker does not start (TLSConfigError, wrapped by the embedded broker)."""
    with pytest.raises(RuntimeError, match="needs the MQTT TLS listener"):
        with embedded_broker(mqtt_port=0, mqtt_ssl_cert_login=True):
            pass
    with pytest.raises(RuntimeError, match=r"needs verified client certificates"):
        with embedded_broker(_tls_config(pki, tls_verify=False, mqtt_ssl_cert_login=True)):
            pass


def _server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*server_argv(), "--port", "0", "--management-port", "0", "--prometheus-port", "0",
         "--web-mqtt-port", "0", "--mqtt-port", "0", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cli_refuses_cert_login_without_tls_or_verification(pki, tmp_path):
    proc = _server("--data-dir", str(tmp_path / "a"), "--mqtt-ssl-cert-login")
    assert proc.returncode == 2
    assert "--mqtt-ssl-cert-login needs the MQTT TLS listener" in proc.stderr
    # Refused before anything listens; the port is one the OS had free.
    from test_ctl import _free_port

    tls = ["--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
           "--mqtt-tls-port", str(_free_port())]  # fmt: skip
    proc = _server("--data-dir", str(tmp_path / "b"), *tls, "--mqtt-ssl-cert-login")
    assert proc.returncode == 2
    assert "--mqtt-ssl-cert-login needs client certificates: --tls-verify" in proc.stderr
    # The config-file key is checked as every key is: a boolean.
    bad = tmp_path / "bad.toml"
    bad.write_text('mqtt_ssl_cert_login = "yes"\n')
    proc = _server("--data-dir", str(tmp_path / "c"), "--config", str(bad))
    assert proc.returncode == 2
    assert "mqtt_ssl_cert_login" in proc.stderr


def test_config_file_key_turns_cert_login_on(pki, tmp_path):
    from leveret.config_file import load

    good = tmp_path / "good.toml"
    good.write_text("mqtt_ssl_cert_login = true\n")
    assert load(str(good))["mqtt_ssl_cert_login"] is True


# --- vhost mappings ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mapped(pki):
    with embedded_broker(_tls_config(pki, management_port=0)) as b:
        for vhost in ("ops-port", "ops-cert", "ops-user"):
            b.admin.add_vhost(vhost)
            b.admin.set_permissions("guest", vhost, ".*", ".*", ".*")
        b.admin.add_user(CERT_USER, "pw")
        for vhost in ("/", "ops-port", "ops-cert", "ops-user"):
            b.admin.set_permissions(CERT_USER, vhost, ".*", ".*", ".*")
        yield b


def _set_global(b, name: str, value) -> None:
    b.call(lambda: b.server.broker.global_parameters.set(name, value))


def _clear_globals(b) -> None:
    def clear() -> None:
        params = b.server.broker.global_parameters
        for name in ("mqtt_port_to_vhost_mapping", "mqtt_default_vhosts"):
            if name in params.values:
                params.clear(name)

    b.call(clear)


def _vhost_of(port: int, username: str, password: bytes = b"guest") -> tuple[int, str | None]:
    with RawMQTT(port, p.MQTT_5) as c:
        ack = c.connect("ops-map", username, password)
        return ack.reason_code, ack.properties.get("reason_string")


def _plain_vhost(b, username: str, password: bytes = b"guest") -> str | None:
    with RawMQTT(b.mqtt_port) as c:
        assert c.connect("ops-plain", username, password).reason_code == 0
        return dict((cid, v) for cid, _, v in _open(b)).get("ops-plain")


def test_port_mapping_picks_the_vhost_of_a_plain_user_name(mapped):
    b = mapped
    try:
        _set_global(b, "mqtt_port_to_vhost_mapping", {str(b.mqtt_port): "ops-port"})
        assert _plain_vhost(b, "guest") == "ops-port"
        # A vhost:user user name wins over the port mapping.
        assert _plain_vhost(b, "ops-user:guest") == "ops-user"
        # Another port's entry does not apply.
        _set_global(b, "mqtt_port_to_vhost_mapping", {"1": "ops-port"})
        assert _plain_vhost(b, "guest") == "/"
        # A mapping to a vhost that does not exist refuses as a missing vhost does.
        _set_global(b, "mqtt_port_to_vhost_mapping", {str(b.mqtt_port): "ops-nowhere"})
        code, reason = _vhost_of(b.mqtt_port, "guest")
        assert code == p.RC_BAD_USERNAME_OR_PASSWORD
        assert reason == "virtual host 'ops-nowhere' does not exist (picked by port mapping)"
        with RawMQTT(b.mqtt_port) as c:
            assert c.connect("ops-x", "guest", b"guest").reason_code == p.CONNACK_BAD_CREDENTIALS
    finally:
        _clear_globals(b)


def test_certificate_mapping_comes_first_for_a_verified_certificate(mapped, pki):
    b = mapped
    port = _mqtts_port(b)

    def vhost_with_cert(username: str, password: str = "guest", cert: str | None = CERT_USER):
        client, code = paho_connect(port, pki, cert, username, password, client_id="ops-tls")
        try:
            return code, dict((cid, v) for cid, _, v in _open(b)).get("ops-tls")
        finally:
            _stop(client)

    try:
        _set_global(b, "mqtt_default_vhosts", {CERT_USER: "ops-cert"})
        _set_global(b, "mqtt_port_to_vhost_mapping", {str(port): "ops-port"})
        # RabbitMQ 3.10 (get_vhost_ssl): certificate mapping, then port mapping, then
        # the vhost:user user name, then mqtt_vhost.
        assert vhost_with_cert("guest") == (0, "ops-cert")
        # A mapping keeps the whole user name: "ops-user:guest" is no user.
        assert vhost_with_cert("ops-user:guest") == (PAHO_BAD_CREDENTIALS, None)
        _clear_globals(b)
        _set_global(b, "mqtt_port_to_vhost_mapping", {str(port): "ops-port"})
        assert vhost_with_cert("guest") == (0, "ops-port")
        _clear_globals(b)
        assert vhost_with_cert("ops-user:guest") == (0, "ops-user")
        assert vhost_with_cert("guest") == (0, "/")
        # Without a certificate, the certificate mapping cannot apply.
        _set_global(b, "mqtt_default_vhosts", {CERT_USER: "ops-cert"})
        assert vhost_with_cert("guest", cert=None) == (0, "/")
    finally:
        _clear_globals(b)


def _api(b, method: str, path: str, body=None) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{b.server.management.port}/api{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("mqtt_port_to_vhost_mapping", "vhost1", "must be a JSON object of port number"),
        ("mqtt_port_to_vhost_mapping", {"mqtt": "v"}, 'key "mqtt" is not a port number'),
        ("mqtt_port_to_vhost_mapping", {"70000": "v"}, 'key "70000" is not a port number'),
        ("mqtt_port_to_vhost_mapping", {"1883": 7}, 'the vhost for "1883" must be a non-empty'),
        ("mqtt_default_vhosts", [CERT_USER], "must be a JSON object of certificate user name"),
        ("mqtt_default_vhosts", {CERT_USER: ""}, "must be a non-empty string"),
    ],
)
def test_a_malformed_mapping_is_refused_over_http(mapped, name, value, problem):
    status, body = _api(mapped, "PUT", f"/global-parameters/{name}", {"value": value})
    assert status == 400
    assert body["error"] == "bad_request"
    assert problem in body["reason"]
    assert _api(mapped, "GET", f"/global-parameters/{name}")[0] == 404


def test_mappings_are_set_and_cleared_over_http(mapped):
    b = mapped
    value = {str(b.mqtt_port): "ops-port"}
    try:
        assert (
            _api(b, "PUT", "/global-parameters/mqtt_port_to_vhost_mapping", {"value": value})[0]
            == 201
        )
        assert _plain_vhost(b, "guest") == "ops-port"
        assert _api(b, "DELETE", "/global-parameters/mqtt_port_to_vhost_mapping")[0] == 204
        assert _plain_vhost(b, "guest") == "/"
    finally:
        _clear_globals(b)


def test_ctl_refuses_a_malformed_mapping(tmp_path):
    from test_ctl import Server

    srv = Server(tmp_path / "data").wait()
    try:
        result = srv.ctl("set_global_parameter", "mqtt_port_to_vhost_mapping", '{"x": "v"}')
        assert result.returncode != 0
        assert 'key "x" is not a port number (1-65535)' in result.stderr
        result = srv.ctl("set_global_parameter", "mqtt_default_vhosts", '{"CN=a": "v"}')
        assert (result.returncode, result.stderr) == (0, "")
    finally:
        srv.stop()


def test_definitions_with_a_malformed_mapping_are_refused(mapped):
    status, body = _api(
        mapped,
        "POST",
        "/definitions",
        {"global_parameters": [{"name": "mqtt_default_vhosts", "value": "oops"}]},
    )
    assert status == 400
    assert "mqtt_default_vhosts must be a JSON object" in body["reason"]


# --- the overview and Prometheus ------------------------------------------------------


def _get(url: str) -> str:
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")  # a label value may hold spaces
        if sample == name:
            return float(value)
    raise KeyError(name)


def test_mqtt_connections_count_in_the_overview_and_prometheus():
    with embedded_broker(mqtt_port=0, management_port=0, prometheus_port=0) as b:
        api = f"http://127.0.0.1:{b.server.management.port}/api/overview"
        metrics = f"http://127.0.0.1:{b.server.prometheus.port}/metrics"
        assert json.loads(_get(api))["object_totals"]["connections"] == 0
        assert _metric(_get(metrics), "rabbitmq_connections") == 0
        with RawMQTT(b.mqtt_port) as c:
            c.connect("ops-prom")
            overview = json.loads(_get(api))
            assert overview["object_totals"]["connections"] == 1
            text = _get(metrics)
            assert _metric(text, "rabbitmq_connections") == 1
            assert _metric(text, "rabbitmq_connections_opened_total") == 1
            assert _metric(text, "rabbitmq_connections_closed_total") == 0
            # The aggregated per-connection counters include it: CONNECT in, CONNACK out.
            assert _metric(text, "rabbitmq_connection_incoming_packets_total") == 1
            assert _metric(text, "rabbitmq_connection_outgoing_packets_total") == 1
            assert _metric(text, "rabbitmq_connection_outgoing_bytes_total") == 4
            name = b.call(lambda: b.server.mqtt.open_connections()[0].name)
            per_object = _get(metrics + "/per-object")
            label = f'{{channel="{name}"}}'
            assert _metric(per_object, f"rabbitmq_connection_incoming_bytes_total{label}") > 0
            assert _metric(per_object, f"rabbitmq_connection_pending_packets{label}") == 0
        deadline_text = ""
        for _ in range(100):
            deadline_text = _get(metrics)
            if _metric(deadline_text, "rabbitmq_connections") == 0:
                break
            threading.Event().wait(0.05)
        assert _metric(deadline_text, "rabbitmq_connections") == 0
        assert _metric(deadline_text, "rabbitmq_connections_opened_total") == 1
        assert _metric(deadline_text, "rabbitmq_connections_closed_total") == 1
        assert json.loads(_get(api))["object_totals"]["connections"] == 0


# --- connection limits -------------------------------------------------------------------


def test_user_connection_limit_refuses_mqtt_5_with_quota_exceeded():
    with embedded_broker(mqtt_port=0) as b:
        b.admin.add_user("ops-one", "pw")
        b.admin.set_permissions("ops-one", "/", ".*", ".*", ".*")
        b.admin.set_user_limits("ops-one", {"max-connections": 1})
        with RawMQTT(b.mqtt_port, p.MQTT_5) as first:
            assert first.connect("ops-l1", "ops-one", b"pw").reason_code == 0
            with RawMQTT(b.mqtt_port, p.MQTT_5) as second:
                ack = second.connect("ops-l2", "ops-one", b"pw")
                assert ack.reason_code == p.RC_QUOTA_EXCEEDED
                assert ack.properties["reason_string"] == (
                    "connection limit (1) is reached for user 'ops-one'"
                )
        b.admin.set_user_limits("ops-one", {"max-connections": 0})
        with RawMQTT(b.mqtt_port) as c:
            assert c.connect("ops-l3", "ops-one", b"pw").reason_code == p.CONNACK_NOT_AUTHORIZED


def test_a_port_mapped_vhost_limit_applies(pki):
    with embedded_broker(mqtt_port=0) as b:
        b.admin.add_vhost("ops-full")
        b.admin.set_permissions("guest", "ops-full", ".*", ".*", ".*")
        b.admin.set_vhost_limits("ops-full", {"max-connections": 0})
        _set_global(b, "mqtt_port_to_vhost_mapping", {str(b.mqtt_port): "ops-full"})
        with RawMQTT(b.mqtt_port) as c:
            assert c.connect("ops-full-1").reason_code == p.CONNACK_NOT_AUTHORIZED


# --- tls_cert_login_from -----------------------------------------------------------------


def _subject_dn(pki, name: str) -> str:
    from cryptography import x509

    pem = pki[name].read_bytes()
    certificate = x509.load_pem_x509_certificates(pem)[0]
    return certificate.subject.rfc4514_string()


def test_distinguished_name_logs_in_mqtt_and_amqp_and_keys_the_cert_mapping(pki):
    import pika

    dn = _subject_dn(pki, CERT_USER)
    assert dn.startswith(f"CN={CERT_USER},OU=")
    config = _tls_config(
        pki, tls_port=0, mqtt_ssl_cert_login=True, tls_cert_login_from="distinguished_name"
    )
    with embedded_broker(config) as b:
        b.admin.add_vhost("ops-dn")
        b.admin.add_user(dn, "")
        for vhost in ("/", "ops-dn"):
            b.admin.set_permissions(dn, vhost, ".*", ".*", ".*")
        client, code = paho_connect(_mqtts_port(b), pki, CERT_USER, client_id="dn")
        _stop(client)
        assert code == 0
        _set_global(b, "mqtt_default_vhosts", {dn: "ops-dn"})
        client, code = paho_connect(_mqtts_port(b), pki, CERT_USER, client_id="dn-mapped")
        try:
            assert code == 0
            assert ("dn-mapped", dn, "ops-dn") in _open(b)
        finally:
            _stop(client)
        # SASL EXTERNAL reads the same setting.
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        context.load_cert_chain(str(pki[CERT_USER]))
        params = pika.ConnectionParameters(
            "127.0.0.1",
            b.server.addresses[1][1],
            ssl_options=pika.SSLOptions(context, "localhost"),
            credentials=pika.credentials.ExternalCredentials(),
        )
        connection = pika.BlockingConnection(params)
        try:
            assert b.call(lambda: [c.user for c in b.server.broker.connections]) == [dn]
        finally:
            connection.close()


def test_a_bad_cert_login_from_is_refused(pki, tmp_path):
    with pytest.raises(RuntimeError, match="tls_cert_login_from must be one of common_name"):
        with embedded_broker(_tls_config(pki, tls_cert_login_from="cn")):
            pass
    bad = tmp_path / "bad.toml"
    bad.write_text('[tls]\ncert_login_from = "subject"\n')
    proc = _server("--data-dir", str(tmp_path / "d"), "--config", str(bad))
    assert proc.returncode == 2
    assert "key 'tls.cert_login_from': expected one of common_name, distinguished_name" in (
        proc.stderr
    )
    proc = _server("--data-dir", str(tmp_path / "e"), "--tls-cert-login-from", "cn")
    assert proc.returncode == 2
    assert "argument --tls-cert-login-from: invalid choice: 'cn'" in proc.stderr
