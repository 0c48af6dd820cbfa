"""Global parameters and the cluster name: the HTTP API, what the name changes (the
overview, a new AMQP connection's server properties, Prometheus' identity), a restart,
and definitions. Real brokers, real HTTP requests, pika for AMQP.

(RabbitMQ's answers to the same requests are recorded in tests/compat/http: group
global_parameters.)
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from contextlib import contextmanager

import pika
import pytest

from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from test_management_api import call  # the HTTP helper, with RabbitMQ's auth header

pytestmark = pytest.mark.leveret_only


@contextmanager
def broker_with_api(data_dir: str | None = None, **config):
    if data_dir is not None:
        config.update(data_dir=data_dir)
    else:
        config.update(persistence=False)
    cfg = ServerConfig(port=0, management_port=0, prometheus_port=0, **config)
    with embedded_broker(cfg) as b:
        yield b


class Api:
    def __init__(self, broker) -> None:
        self.base = f"http://127.0.0.1:{broker.server.management.port}/api"
        self.metrics = f"http://127.0.0.1:{broker.server.prometheus.port}/metrics"

    def __call__(self, method, path, body=None, user="guest", password="guest", raw=None):
        return call((self.base, None), method, path, body, user, password, raw)

    def identity(self) -> dict[str, str]:
        with urllib.request.urlopen(self.metrics, timeout=10) as response:
            text = response.read().decode()
        line = next(ln for ln in text.splitlines() if ln.startswith("rabbitmq_identity_info{"))
        return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _server_cluster_name(broker) -> str:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        name = conn._impl.server_properties["cluster_name"]
    finally:
        conn.close()
    return name.decode() if isinstance(name, bytes) else name


NOT_FOUND = (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_global_parameters_lifecycle_users_and_bad_bodies():
    with broker_with_api() as b:
        api = Api(b)
        status, listed = api("GET", "/global-parameters")
        assert status == 200
        assert [p["name"] for p in listed] == ["internal_cluster_id"]
        cluster_id = listed[0]["value"]
        assert cluster_id.startswith("leveret-cluster-id-")
        assert api("GET", "/global-parameters/internal_cluster_id") == (
            200,
            {"name": "internal_cluster_id", "value": cluster_id},
        )
        assert api("GET", "/global-parameters/nope") == NOT_FOUND
        value = {"a": [1, "b", None], "c": {"d": 2.5}}
        assert api("PUT", "/global-parameters/mine", {"value": value})[0] == 201
        assert api("GET", "/global-parameters/mine") == (200, {"name": "mine", "value": value})
        assert api("PUT", "/global-parameters/mine", {"value": "text"})[0] == 204
        assert api("GET", "/global-parameters/mine")[1]["value"] == "text"
        assert [p["name"] for p in api("GET", "/global-parameters")[1]] == [
            "internal_cluster_id",
            "mine",
        ]
        # bad bodies: RabbitMQ's reasons, nothing changed
        for raw, reason in (
            (b"{not json", "not_json"),
            (b"[1]", "not_json"),
            (b"{}", "[{key_missing,value}]"),
            (b'{"val": 1}', "[{key_missing,value}]"),
        ):
            assert api("PUT", "/global-parameters/mine", raw=raw) == (
                400,
                {"error": "bad_request", "reason": reason},
            )
        assert api("GET", "/global-parameters/mine")[1]["value"] == "text"
        # who may: administrators and policymakers
        assert api("PUT", "/users/pm", {"password": "pw", "tags": "policymaker"})[0] == 201
        assert api("PUT", "/users/mon", {"password": "pw", "tags": "monitoring"})[0] == 201
        assert api("PUT", "/global-parameters/pm", {"value": 1}, "pm", "pw")[0] == 201
        assert api("GET", "/global-parameters/pm", user="pm", password="pw")[0] == 200
        refused = (
            401,
            {"error": "not_authorised", "reason": "User not authorised to access object"},
        )
        assert api("GET", "/global-parameters", user="mon", password="pw") == refused
        assert api("PUT", "/global-parameters/x", {"value": 1}, "mon", "pw") == refused
        assert api("DELETE", "/global-parameters/pm", user="mon", password="pw") == refused
        assert api("DELETE", "/global-parameters/pm", user="pm", password="pw")[0] == 204
        assert api("DELETE", "/global-parameters/mine")[0] == 204
        assert api("DELETE", "/global-parameters/mine") == NOT_FOUND
        assert api("GET", "/global-parameters/mine") == NOT_FOUND
        assert api("POST", "/global-parameters", {})[0] == 405


def test_cluster_name_changes_overview_new_connections_and_prometheus():
    with broker_with_api() as b:
        api = Api(b)
        default = b.server.broker.default_cluster_name
        assert api("GET", "/cluster-name") == (200, {"name": default})
        assert api("GET", "/overview")[1]["cluster_name"] == default
        before = api.identity()
        assert before["rabbitmq_cluster"] == default
        assert _server_cluster_name(b) == default
        # a connection opened before the change keeps what it was told
        old = pika.BlockingConnection(pika.URLParameters(b.url))

        assert api("PUT", "/cluster-name", {"name": "east-1"}) == (204, None)
        assert api("PUT", "/cluster-name", {"name": "east-1"}) == (204, None)
        assert api("GET", "/cluster-name") == (200, {"name": "east-1"})
        assert api("GET", "/overview?columns=cluster_name") == (200, {"cluster_name": "east-1"})
        assert api("GET", "/global-parameters/cluster_name") == (
            200,
            {"name": "cluster_name", "value": "east-1"},
        )
        assert _server_cluster_name(b) == "east-1"
        assert old._impl.server_properties["cluster_name"] in (default, default.encode())
        old.close()
        after = api.identity()
        assert after["rabbitmq_cluster"] == "east-1"
        # the permanent id is internal_cluster_id, not derived from the name
        assert after["rabbitmq_cluster_permanent_id"] == before["rabbitmq_cluster_permanent_id"]
        assert (
            after["rabbitmq_cluster_permanent_id"]
            == api("GET", "/global-parameters/internal_cluster_id")[1]["value"]
        )

        # the same parameter through /api/global-parameters
        assert api("PUT", "/global-parameters/cluster_name", {"value": "west-2"})[0] == 204
        assert api("GET", "/cluster-name")[1] == {"name": "west-2"}
        assert _server_cluster_name(b) == "west-2"

        # bad bodies and users: nothing changes
        for body, reason in (
            ({"value": 5}, "cluster_name must be a string, got 5"),
            ({"value": {"a": 1}}, 'cluster_name must be a string, got {"a": 1}'),
        ):
            assert api("PUT", "/global-parameters/cluster_name", body) == (
                400,
                {"error": "bad_request", "reason": reason},
            )
        for body, reason in (
            ({"name": 5}, "name must be a string"),
            ({"name": ["a", "b"]}, "name must be a string"),
            ({}, "[{key_missing,name}]"),
        ):
            assert api("PUT", "/cluster-name", body) == (
                400,
                {"error": "bad_request", "reason": reason},
            )
        assert api("PUT", "/cluster-name", raw=b"{nope") == (
            400,
            {"error": "bad_request", "reason": "not_json"},
        )
        assert api("PUT", "/users/pm", {"password": "pw", "tags": "policymaker"})[0] == 201
        assert api("PUT", "/cluster-name", {"name": "x"}, "pm", "pw") == (
            401,
            {"error": "not_authorised", "reason": "Not administrator user"},
        )
        assert api("GET", "/cluster-name", user="pm", password="pw") == (200, {"name": "west-2"})
        assert api("DELETE", "/cluster-name")[0] == 405

        # clearing the parameter brings the default back
        assert api("DELETE", "/global-parameters/cluster_name")[0] == 204
        assert api("GET", "/cluster-name")[1] == {"name": default}
        assert api.identity()["rabbitmq_cluster"] == default


def test_global_parameters_and_cluster_name_survive_a_restart(tmp_path):
    data_dir = str(tmp_path / "data")
    with broker_with_api(data_dir) as b:
        api = Api(b)
        default = b.server.broker.default_cluster_name
        cluster_id = api("GET", "/global-parameters/internal_cluster_id")[1]["value"]
        assert api("PUT", "/cluster-name", {"name": "kept"})[0] == 204
        assert api("PUT", "/global-parameters/kept", {"value": {"n": [1, 2]}})[0] == 201
        assert api("PUT", "/global-parameters/gone", {"value": 1})[0] == 201
        assert api("DELETE", "/global-parameters/gone")[0] == 204
    with broker_with_api(data_dir) as b:
        api = Api(b)
        assert b.server.broker.default_cluster_name == default
        assert api("GET", "/cluster-name")[1] == {"name": "kept"}
        assert _server_cluster_name(b) == "kept"
        assert api("GET", "/global-parameters")[1] == [
            {"name": "cluster_name", "value": "kept"},
            {"name": "internal_cluster_id", "value": cluster_id},
            {"name": "kept", "value": {"n": [1, 2]}},
        ]
        assert api.identity()["rabbitmq_cluster_permanent_id"] == cluster_id
        assert api("DELETE", "/global-parameters/cluster_name")[0] == 204
    with broker_with_api(data_dir) as b:
        assert Api(b)("GET", "/cluster-name")[1] == {"name": default}


def test_a_configured_cluster_name_is_the_default(tmp_path):
    data_dir = str(tmp_path / "data")
    with broker_with_api(data_dir, cluster_name="configured") as b:
        api = Api(b)
        assert api("GET", "/cluster-name")[1] == {"name": "configured"}
        assert api("GET", "/global-parameters/cluster_name") == NOT_FOUND
        assert api("PUT", "/cluster-name", {"name": "from-api"})[0] == 204
    with broker_with_api(data_dir, cluster_name="configured") as b:
        api = Api(b)
        assert api("GET", "/cluster-name")[1] == {"name": "from-api"}
        assert api("DELETE", "/global-parameters/cluster_name")[0] == 204
        assert api("GET", "/cluster-name")[1] == {"name": "configured"}


def test_definitions_export_and_import_global_parameters():
    with broker_with_api() as a, broker_with_api() as b:
        api_a, api_b = Api(a), Api(b)
        assert api_a("PUT", "/cluster-name", {"name": "exported"})[0] == 204
        assert api_a("PUT", "/global-parameters/setting", {"value": {"k": [1]}})[0] == 201
        status, doc = api_a("GET", "/definitions")
        assert status == 200
        a_id = api_a("GET", "/global-parameters/internal_cluster_id")[1]["value"]
        assert doc["global_parameters"] == [
            {"name": "cluster_name", "value": "exported"},
            {"name": "internal_cluster_id", "value": a_id},
            {"name": "setting", "value": {"k": [1]}},
        ]
        # a vhost's export has none, and a vhost's import leaves them alone
        assert "global_parameters" not in api_a("GET", "/definitions/%2F")[1]
        assert api_b("POST", "/definitions/%2F", doc)[0] in (200, 201, 204)
        assert api_b("GET", "/global-parameters/setting") == NOT_FOUND
        # a bad one refuses the whole file before anything changes
        bad = {
            **doc,
            "global_parameters": [
                *doc["global_parameters"][1:],
                {"name": "cluster_name", "value": 7},
            ],
        }
        status, body = api_b("POST", "/definitions", bad)
        assert status == 400
        assert body["reason"] == "global_parameters[2]: cluster_name must be a string, got 7"
        assert api_b("GET", "/global-parameters/setting") == NOT_FOUND
        # as RabbitMQ, an import takes the other broker's name and id
        assert api_b("POST", "/definitions", doc)[0] in (200, 201, 204)
        assert api_b("GET", "/global-parameters")[1] == doc["global_parameters"]
        assert api_b("GET", "/cluster-name")[1] == {"name": "exported"}
        assert _server_cluster_name(b) == "exported"
        assert api_b.identity()["rabbitmq_cluster_permanent_id"] == a_id
