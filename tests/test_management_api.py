"""The management HTTP API against RabbitMQ's: the same calls on both brokers.

With LEVERET_TEST_URL set the calls go to the reference RabbitMQ's API on 15673.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from access_setup import RABBITMQ_API, unique
from conftest import EXTERNAL_URL
from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from serverproc import server_argv


@pytest.fixture(scope="module")
def api():
    """(base URL of /api, AMQP URL) of the broker under test."""
    if EXTERNAL_URL:
        yield RABBITMQ_API, EXTERNAL_URL
        return
    with embedded_broker(ServerConfig(port=0, persistence=False, management_port=0)) as broker:
        yield f"http://127.0.0.1:{broker.server.management.port}/api", broker.url


def call(api, method: str, path: str, body=None, user="guest", password="guest", raw=None):
    base, _amqp = api
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text else None


def test_whoami_and_a_failed_login(api):
    assert call(api, "GET", "/whoami") == (200, {"name": "guest", "tags": ["administrator"]})
    assert call(api, "GET", "/whoami", password="wrong") == (
        401,
        {"error": "not_authorized", "reason": "Login failed"},
    )


def test_vhost_lifecycle_and_status_codes(api):
    name = unique("api-v")
    path = f"/vhosts/{quote(name, safe='')}"
    assert call(api, "PUT", path, {"description": "made by a test"})[0] == 201
    assert call(api, "PUT", path, {"description": "made by a test"})[0] == 204
    status, body = call(api, "GET", path)
    assert status == 200
    assert body["name"] == name and body["description"] == "made by a test"
    assert body["metadata"] == {"description": "made by a test", "tags": []}
    assert name in [v["name"] for v in call(api, "GET", "/vhosts")[1]]
    assert call(api, "DELETE", path)[0] == 204
    assert call(api, "GET", path) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_users_and_permissions(api):
    user, vhost = unique("api-u"), unique("api-pv")
    vpath = f"/vhosts/{vhost}"
    assert call(api, "PUT", vpath, {})[0] == 201
    try:
        assert (
            call(api, "PUT", f"/users/{user}", {"password": "pw", "tags": "management"})[0] == 201
        )
        status, body = call(api, "GET", f"/users/{user}")
        assert status == 200
        assert body["tags"] == ["management"]
        assert body["hashing_algorithm"] == "rabbit_password_hashing_sha256"
        perm = {"configure": "^x", "write": ".*", "read": ".*"}
        assert call(api, "PUT", f"/permissions/{vhost}/{user}", perm)[0] == 201
        assert call(api, "GET", f"/permissions/{vhost}/{user}") == (
            200,
            {"user": user, "vhost": vhost, **perm},
        )
        assert call(api, "PUT", f"/permissions/no-such-vhost/{user}", perm) == (
            400,
            {"error": "bad_request", "reason": "vhost_or_user_not_found"},
        )
        # The new user logs in over AMQP with the password set through the API.
        _base, amqp = api
        params = pika.URLParameters(amqp)
        params.credentials = pika.PlainCredentials(user, "pw")
        params.virtual_host = vhost
        pika.BlockingConnection(params).close()
        # A management user sees only its vhosts and may not list users.
        visible = [v["name"] for v in call(api, "GET", "/vhosts", user=user, password="pw")[1]]
        assert visible == [vhost]
        status, body = call(api, "GET", "/users", user=user, password="pw")
        assert (status, body) == (
            401,
            {"error": "not_authorised", "reason": "Not administrator user"},
        )
    finally:
        call(api, "DELETE", f"/users/{user}")
        call(api, "DELETE", vpath)


def test_a_body_that_is_not_json(api):
    status, body = call(api, "PUT", f"/users/{unique('api-bad')}", raw=b"{bad")
    assert (status, body) == (400, {"error": "bad_request", "reason": "not_json"})


def test_queues_listing_and_purge(api):
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    q = unique("api-q")
    channel.queue_declare(q)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", q, b"x")
    try:
        for _ in range(100):  # RabbitMQ publishes queue statistics every 5 s
            status, body = call(api, "GET", f"/queues/%2F/{q}")
            if status != 200 or "messages_ready" in body:
                break
            time.sleep(0.1)
        assert status == 200
        assert (body["name"], body["vhost"], body["durable"], body["messages_ready"]) == (
            q,
            "/",
            False,
            3,
        )
        assert q in [x["name"] for x in call(api, "GET", "/queues/%2F")[1]]
        assert call(api, "DELETE", f"/queues/%2F/{q}/contents")[0] == 204
        assert channel.queue_declare(q, passive=True).method.message_count == 0
        assert call(api, "GET", "/queues/%2F/no-such-queue")[0] == 404
    finally:
        channel.queue_delete(q)
        connection.close()


def test_exchanges_definitions_and_health(api):
    status, body = call(api, "GET", "/exchanges/%2F")
    assert status == 200
    assert {"name": "amq.topic", "type": "topic", "durable": True}.items() <= next(
        x for x in body if x["name"] == "amq.topic"
    ).items()
    status, defs = call(api, "GET", "/definitions")
    assert status == 200 and {"users", "vhosts", "permissions", "queues"} <= set(defs)
    assert call(api, "GET", "/health/checks/alarms") == (200, {"status": "ok"})
    assert call(api, "GET", "/aliveness-test/%2F") == (200, {"status": "ok"})


@pytest.mark.leveret_only
def test_the_cli_serves_the_api_on_its_port(tmp_path):
    import socket
    import subprocess

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    amqp_port, http_port = ports
    proc = subprocess.Popen(
        [*server_argv(), "--port", str(amqp_port),
         "--management-port", str(http_port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        api = (f"http://127.0.0.1:{http_port}/api", None)
        for _ in range(300):
            assert proc.poll() is None, proc.stderr.read()
            try:
                status, body = call(api, "GET", "/overview")
                break
            except OSError:
                time.sleep(0.05)
        assert status == 200
        assert body["product_name"] == "Leveret"
        assert body["listeners"][0]["port"] == amqp_port
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1]
    assert f"management API on http://127.0.0.1:{http_port}/api/" in err


def test_exchange_queue_binding_publish_get_round_trip(api):
    x, q = unique("api-x"), unique("api-bq")
    try:
        assert (
            call(api, "PUT", f"/exchanges/%2F/{x}", {"type": "direct", "durable": False})[0] == 201
        )
        assert call(api, "PUT", f"/exchanges/%2F/{x}", {"type": "fanout"}) == (
            400,
            {
                "error": "bad_request",
                "reason": f"inequivalent arg 'type' for exchange '{x}' in vhost '/': "
                "received 'fanout' but current is 'direct'",
            },
        )
        assert call(api, "GET", f"/exchanges/%2F/{x}")[1]["type"] == "direct"
        assert call(api, "PUT", f"/queues/%2F/{q}", {"durable": False})[0] == 201
        base, _ = api
        request = urllib.request.Request(
            f"{base}/bindings/%2F/e/{x}/q/{q}",
            data=json.dumps({"routing_key": "k1", "arguments": {}}).encode(),
            method="POST",
        )
        request.add_header("content-type", "application/json")
        request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
            assert response.headers["Location"] == f"{q}/k1"
        status, bindings = call(api, "GET", f"/bindings/%2F/e/{x}/q/{q}")
        assert status == 200
        assert bindings == [
            {"source": x, "vhost": "/", "destination": q, "destination_type": "queue",
             "routing_key": "k1", "arguments": {}, "properties_key": "k1"}
        ]  # fmt: skip
        published = {
            "properties": {},
            "routing_key": "k1",
            "payload": "hello",
            "payload_encoding": "string",
        }
        assert call(api, "POST", f"/exchanges/%2F/{x}/publish", published) == (
            200,
            {"routed": True},
        )
        status, got = call(
            api,
            "POST",
            f"/queues/%2F/{q}/get",
            {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"},
        )
        assert status == 200
        assert [(m["payload"], m["routing_key"], m["exchange"], m["redelivered"]) for m in got] == [
            ("hello", "k1", x, False)
        ]
        assert call(api, "DELETE", f"/bindings/%2F/e/{x}/q/{q}/k1")[0] == 204
        assert call(api, "GET", f"/bindings/%2F/e/{x}/q/{q}") == (200, [])
        status, body = call(api, "POST", "/exchanges/%2F/no-such-x/publish", published)
        assert (status, body) == (
            400,
            {
                "error": "bad_request",
                "reason": "404 NOT_FOUND - no exchange 'no-such-x' in vhost '/'",
            },
        )
    finally:
        call(api, "DELETE", f"/exchanges/%2F/{x}")
        call(api, "DELETE", f"/queues/%2F/{q}")


def test_closing_a_connection_from_the_api(api):
    _base, amqp = api
    params = pika.URLParameters(amqp)
    params.client_properties = {"connection_name": "api-close-me"}
    conn = pika.BlockingConnection(params)
    try:
        for _ in range(100):  # RabbitMQ lists connections after its stats interval
            named = [
                c for c in call(api, "GET", "/connections")[1]
                if c.get("client_properties", {}).get("connection_name") == "api-close-me"
            ]  # fmt: skip
            if named:
                break
            time.sleep(0.1)
        assert len(named) == 1 and named[0]["user"] == "guest" and named[0]["vhost"] == "/"
        assert call(api, "DELETE", f"/connections/{quote(named[0]['name'], safe='')}")[0] == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            for _ in range(50):
                conn.process_data_events(0.1)
        assert (info.value.reply_code, info.value.reply_text) == (
            320,
            "CONNECTION_FORCED - Closed via management plugin",
        )
    finally:
        if conn.is_open:
            conn.close()


def test_policies_topic_permissions_and_vhost_limits(api):
    vhost, user = unique("api-pol"), unique("api-tu")
    assert call(api, "PUT", f"/vhosts/{vhost}", {})[0] == 201
    try:
        policy = {
            "pattern": "^capped",
            "definition": {"max-length": 2},
            "apply-to": "queues",
            "priority": 1,
        }
        assert call(api, "PUT", f"/policies/{vhost}/cap", policy)[0] == 201
        status, body = call(api, "GET", f"/policies/{vhost}/cap")
        assert status == 200
        assert {k: body[k] for k in ("name", "pattern", "apply-to", "definition", "priority")} == {
            "name": "cap",
            **policy,
        }
        assert call(api, "PUT", f"/vhost-limits/{vhost}/max-queues", {"value": 5})[0] == 204
        assert call(api, "GET", f"/vhost-limits/{vhost}") == (
            200,
            [{"vhost": vhost, "value": {"max-queues": 5}}],
        )
        assert call(api, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})[0] == 201
        topic = {"exchange": "amq.topic", "write": "^a", "read": "^b"}
        assert call(api, "PUT", f"/topic-permissions/{vhost}/{user}", topic)[0] == 201
        assert call(api, "GET", f"/topic-permissions/{vhost}/{user}") == (
            200,
            [{"user": user, "vhost": vhost, **topic}],
        )
        assert call(api, "DELETE", f"/policies/{vhost}/cap")[0] == 204
        assert call(api, "GET", f"/policies/{vhost}/cap")[0] == 404
    finally:
        call(api, "DELETE", f"/users/{user}")
        call(api, "DELETE", f"/vhosts/{vhost}")


def test_user_listings_bulk_delete_and_a_users_connections(api):
    lonely, busy, vhost = unique("api-lonely"), unique("api-busy"), unique("api-tv")
    assert call(api, "PUT", f"/vhosts/{vhost}", {})[0] == 201
    try:
        for user in (lonely, busy):
            assert call(api, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})[0] == 201
        perm = {"configure": ".*", "write": ".*", "read": ".*"}
        assert call(api, "PUT", f"/permissions/{vhost}/{busy}", perm)[0] == 201
        status, body = call(api, "GET", "/users/without-permissions")
        names = [u["name"] for u in body]
        assert status == 200 and lonely in names and busy not in names
        assert {"name", "password_hash", "hashing_algorithm", "tags"} <= set(body[0])

        topic = {"exchange": "amq.topic", "write": "^w", "read": "^r"}
        assert call(api, "PUT", f"/topic-permissions/{vhost}/{busy}", topic)[0] == 201
        expected = [{"user": busy, "vhost": vhost, **topic}]
        assert call(api, "GET", f"/vhosts/{vhost}/topic-permissions") == (200, expected)
        assert call(api, "GET", f"/users/{busy}/topic-permissions") == (200, expected)
        assert call(api, "GET", f"/users/{lonely}/topic-permissions") == (200, [])
        not_found = (404, {"error": "Object Not Found", "reason": "Not Found"})
        assert call(api, "GET", "/vhosts/no-such-vhost/topic-permissions") == not_found
        assert call(api, "GET", "/users/no-such-user/topic-permissions") == not_found

        # A user's connections; closing them is 320 to the client, as for one connection.
        params = pika.URLParameters(api[1])
        params.credentials = pika.PlainCredentials(busy, "pw")
        params.virtual_host = vhost
        connection = pika.BlockingConnection(params)
        deadline = time.monotonic() + 15  # RabbitMQ's connection tracking lags a little
        while time.monotonic() < deadline:
            status, rows = call(api, "GET", f"/connections/username/{busy}")
            if rows:
                break
            time.sleep(0.2)
        assert status == 200 and len(rows) == 1
        assert {k: rows[0][k] for k in ("user", "vhost")} == {"user": busy, "vhost": vhost}
        assert set(rows[0]) == {"name", "node", "user", "vhost"}
        assert call(api, "GET", "/connections/username/no-such-user") == (200, [])
        assert call(api, "DELETE", f"/connections/username/{busy}") == (204, None)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            connection.process_data_events(time_limit=5)
            connection.process_data_events(time_limit=5)
        assert info.value.reply_code == 320
        assert info.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"

        assert call(api, "POST", "/users/bulk-delete", {"userz": []}) == (
            400,
            {"error": "bad_request", "reason": "[{key_missing,users}]"},
        )
        assert call(api, "POST", "/users/bulk-delete", {"users": [lonely, "no-such-user"]}) == (
            400,
            {"error": "bad_request", "reason": ["no_such_user", "no-such-user"]},
        )
        # (RabbitMQ has deleted `lonely` by now; Leveret checks every name first.)
        call(api, "PUT", f"/users/{lonely}", {"password": "pw", "tags": ""})
        assert call(api, "POST", "/users/bulk-delete", {"users": [lonely, busy]}) == (204, None)
        assert call(api, "GET", f"/users/{lonely}") == not_found
        assert call(api, "GET", f"/users/{busy}") == not_found
    finally:
        call(api, "DELETE", f"/users/{lonely}")
        call(api, "DELETE", f"/users/{busy}")
        call(api, "DELETE", f"/vhosts/{vhost}")


def test_a_user_without_a_management_tag(api):
    user = unique("api-notag")
    assert call(api, "PUT", f"/users/{user}", {"password": "pw", "tags": ""})[0] == 201
    try:
        assert call(api, "GET", "/whoami", user=user, password="pw") == (
            401,
            {"error": "not_authorised", "reason": "Not management user"},
        )
    finally:
        call(api, "DELETE", f"/users/{user}")


def test_operator_policies_travel_in_definitions_as_parameters(api):
    """RabbitMQ exports an operator policy as a parameter of component operator_policy
    and imports it from there; a vhost's own export leaves `vhost` off its queues."""
    vhost = unique("defs-vh")
    assert call(api, "PUT", f"/vhosts/{vhost}")[0] == 201
    try:
        policy = {"pattern": "^q", "definition": {"max-length": 7}, "apply-to": "queues"}
        assert call(api, "PUT", f"/operator-policies/{vhost}/cap", policy)[0] == 201
        assert call(api, "PUT", f"/queues/{vhost}/q1", {"durable": True})[0] == 201
        exported = call(api, "GET", f"/definitions/{vhost}")[1]
        assert {
            "vhost": vhost,
            "component": "operator_policy",
            "name": "cap",
            "value": {**policy, "priority": 0},
        } in exported["parameters"]
        assert exported["queues"] == [
            {"name": "q1", "durable": True, "auto_delete": False, "arguments": {}}
        ]
        assert "users" not in exported and "vhosts" not in exported
        assert call(api, "DELETE", f"/operator-policies/{vhost}/cap")[0] == 204
        assert call(api, "DELETE", f"/queues/{vhost}/q1")[0] == 204
        assert call(api, "POST", f"/definitions/{vhost}", exported)[0] in (201, 204)
        status, back = call(api, "GET", f"/operator-policies/{vhost}/cap")
        assert status == 200 and back["definition"] == {"max-length": 7}
        assert call(api, "GET", f"/queues/{vhost}/q1")[0] == 200
    finally:
        call(api, "DELETE", f"/vhosts/{vhost}")


def _amqp_login(api, vhost: str, user: str, password: str) -> bool:
    """Whether `user` logs in over AMQP (PLAIN) into `vhost` with `password`."""
    params = pika.URLParameters(api[1])
    params.credentials = pika.PlainCredentials(user, password)
    params.virtual_host = vhost
    params.connection_attempts = 1
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def test_a_user_without_a_password_logs_in_with_none(api):
    """PUT /api/users/{name} without password or password_hash: the user has no password
    it can log in with (a certificate-only user), and an empty password never logs in."""
    user, vhost = unique("api-nopw"), unique("api-nopw-v")
    assert call(api, "PUT", f"/vhosts/{vhost}", {})[0] == 201
    try:
        assert call(api, "PUT", f"/users/{user}", {"tags": "management"}) == (201, None)
        perm = {"configure": ".*", "write": ".*", "read": ".*"}
        assert call(api, "PUT", f"/permissions/{vhost}/{user}", perm)[0] == 201
        for password in ("", "guest", user):
            assert not _amqp_login(api, vhost, user, password), password
            assert call(api, "GET", "/whoami", user=user, password=password)[0] == 401
        # A password set later logs in; updating only the tags takes it away again.
        body = {"password": "pw", "tags": "management"}
        assert call(api, "PUT", f"/users/{user}", body) == (204, None)
        assert _amqp_login(api, vhost, user, "pw")
        assert call(api, "GET", "/whoami", user=user, password="pw")[0] == 200
        assert call(api, "PUT", f"/users/{user}", {"tags": "management"}) == (204, None)
        assert not _amqp_login(api, vhost, user, "pw")
        assert call(api, "GET", "/whoami", user=user, password="pw")[0] == 401
        # An empty password is stored, and refused at every login.
        body = {"password": "", "tags": "management"}
        assert call(api, "PUT", f"/users/{user}", body) == (204, None)
        assert not _amqp_login(api, vhost, user, "")
        assert call(api, "GET", "/whoami", user=user, password="")[0] == 401
    finally:
        call(api, "DELETE", f"/users/{user}")
        call(api, "DELETE", f"/vhosts/{vhost}")


#: every basic property by the management API's names (RabbitMQ's)
EVERY_PROPERTY = {
    "content_type": "text/plain",
    "content_encoding": "utf-8",
    "headers": {"i": 1, "s": "x", "b": True, "l": [1, "a"], "t": {"n": 1}},
    "delivery_mode": 2,
    "priority": 3,
    "correlation_id": "c1",
    "reply_to": "r1",
    "expiration": "60000",
    "message_id": "m1",
    "timestamp": 1700000000,
    "type": "t1",
    "user_id": "guest",
    "app_id": "a1",
    "cluster_id": "cl1",
}


def test_every_property_published_over_http_reaches_an_amqp_consumer(api):
    """A recording shows the HTTP side; here an AMQP client reads what the API published,
    and the API reads what an AMQP client published, property by property."""
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    q = unique("api-props")
    channel.queue_declare(q)
    try:
        body = {
            "properties": EVERY_PROPERTY,
            "routing_key": q,
            "payload": "over http",
            "payload_encoding": "string",
        }
        assert call(api, "POST", "/exchanges/%2F/amq.default/publish", body) == (
            200,
            {"routed": True},
        )
        method, props, payload = channel.basic_get(q, auto_ack=True)
        assert payload == b"over http"
        got = {
            name: getattr(props, name)
            for name in EVERY_PROPERTY
            if name not in ("timestamp", "headers")
        }
        assert got == {k: v for k, v in EVERY_PROPERTY.items() if k in got}
        assert props.timestamp == 1700000000
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in props.headers.items()}
        assert headers["i"] == 1 and headers["s"] == "x" and headers["b"] is True
        # The other way: an AMQP publisher's properties, read through the API.
        amqp_props = pika.BasicProperties(
            **{k: v for k, v in EVERY_PROPERTY.items() if k != "headers"},
            headers={"h": "v"},
        )
        channel.basic_publish("", q, b"over amqp", amqp_props)
        take = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
        for _ in range(50):
            status, messages = call(api, "POST", f"/queues/%2F/{q}/get", take)
            if messages:
                break
            time.sleep(0.1)
        assert status == 200 and messages[0]["payload"] == "over amqp"
        assert messages[0]["properties"] == {**EVERY_PROPERTY, "headers": {"h": "v"}}
    finally:
        channel.queue_delete(q)
        connection.close()


def test_an_http_publish_with_expiration_expires(api):
    """The `expiration` of a message published over HTTP is its TTL, as over AMQP."""
    connection = pika.BlockingConnection(pika.URLParameters(api[1]))
    channel = connection.channel()
    q = unique("api-ttl")
    channel.queue_declare(q)
    try:
        for expiration, payload in (("100", "short"), ("60000", "long")):
            body = {
                "properties": {"expiration": expiration},
                "routing_key": q,
                "payload": payload,
                "payload_encoding": "string",
            }
            assert call(api, "POST", "/exchanges/%2F/amq.default/publish", body)[0] == 200
        time.sleep(0.5)
        method, _props, payload = channel.basic_get(q, auto_ack=True)
        assert payload == b"long"
        assert channel.basic_get(q, auto_ack=True)[0] is None
    finally:
        channel.queue_delete(q)
        connection.close()
