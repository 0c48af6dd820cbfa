"""RabbitMQ's own command-line tool, rabbitmqadmin, against Leveret's management API.

rabbitmqadmin is the script RabbitMQ's management plugin serves at /cli/rabbitmqadmin;
scripts/install-test-deps.sh takes it out of Debian's rabbitmq-server package into
.cache/tools/ (or finds it on the PATH). With LEVERET_TEST_URL set the same commands run
against the reference RabbitMQ's API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from access_setup import unique
from test_management_api import api  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent


def _rabbitmqadmin() -> str:
    for candidate in (
        os.environ.get("LEVERET_RABBITMQADMIN"),
        str(ROOT / ".cache" / "tools" / "rabbitmqadmin"),
        shutil.which("rabbitmqadmin"),
    ):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise AssertionError("rabbitmqadmin not found: run scripts/install-test-deps.sh")


def _runner(api, user: str = "guest", password: str = "guest"):  # noqa: F811
    tool = _rabbitmqadmin()
    url = urlsplit(api[0])

    def run(*args: str) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, tool, "-H", url.hostname, "-P", str(url.port),
             "-u", user, "-p", password, *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    return run


@pytest.fixture(scope="module")
def admin(api):  # noqa: F811
    """Run rabbitmqadmin against the broker under test; returns (returncode, stdout+stderr)."""
    return _runner(api)


def ok(result: tuple[int, str]) -> str:
    code, out = result
    assert code == 0, out
    assert "***" not in out, out  # rabbitmqadmin's error marker
    return out


def listed(admin, *args: str) -> list[dict]:
    return json.loads(ok(admin("-f", "raw_json", "list", *args)))


def test_declare_publish_get_purge_delete(admin):
    queue, exchange = unique("adm-q"), unique("adm-x")
    assert "queue declared" in ok(
        admin("declare", "queue", f"name={queue}", "durable=false",
              'arguments={"x-max-length": 10}')
    )  # fmt: skip
    assert "exchange declared" in ok(
        admin("declare", "exchange", f"name={exchange}", "type=fanout")
    )
    assert "binding declared" in ok(
        admin("declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=k")
    )
    try:
        queues = {q["name"]: q for q in listed(admin, "queues")}
        assert queues[queue]["arguments"] == {"x-max-length": 10}
        assert queues[queue]["durable"] is False
        assert exchange in {x["name"] for x in listed(admin, "exchanges")}
        assert any(
            b["source"] == exchange and b["destination"] == queue and b["routing_key"] == "k"
            for b in listed(admin, "bindings")
        )
        for payload in ("hello", "again"):
            assert "Message published" in ok(
                admin("publish", f"exchange={exchange}", "routing_key=k", f"payload={payload}")
            )
        got = json.loads(
            ok(admin("-f", "raw_json", "get", f"queue={queue}", "ackmode=ack_requeue_false"))
        )
        assert [m["payload"] for m in got] == ["hello"]
        assert got[0]["exchange"] == exchange and got[0]["message_count"] == 1
        assert "queue purged" in ok(admin("purge", "queue", f"name={queue}"))
        empty = json.loads(
            ok(admin("-f", "raw_json", "get", f"queue={queue}", "ackmode=ack_requeue_false"))
        )
        assert empty == []
    finally:
        assert "queue deleted" in ok(admin("delete", "queue", f"name={queue}"))
        assert "exchange deleted" in ok(admin("delete", "exchange", f"name={exchange}"))
    assert queue not in {q["name"] for q in listed(admin, "queues")}
    code, out = admin("delete", "queue", f"name={queue}")
    assert code != 0 and "Not found" in out


def test_users_vhosts_permissions_and_policies(admin):
    user, vhost = unique("adm-u"), unique("adm-v")
    ok(admin("declare", "vhost", f"name={vhost}"))
    ok(admin("declare", "user", f"name={user}", "password=pw", "tags=management"))
    ok(admin("declare", "permission", f"vhost={vhost}", f"user={user}",
             "configure=^x-", "write=.*", "read=.*"))  # fmt: skip
    ok(admin("declare", "policy", f"--vhost={vhost}", "name=cap", "pattern=^cap",
             'definition={"max-length": 5}', "apply-to=queues"))  # fmt: skip
    try:
        assert user in {u["name"] for u in listed(admin, "users")}
        assert vhost in {v["name"] for v in listed(admin, "vhosts")}
        perms = [p for p in listed(admin, "permissions") if p["user"] == user]
        assert perms == [
            {"user": user, "vhost": vhost, "configure": "^x-", "write": ".*", "read": ".*"}
        ]
        policies = listed(admin, "policies")
        mine = [p for p in policies if p["vhost"] == vhost]
        assert mine and mine[0]["definition"] == {"max-length": 5}
    finally:
        ok(admin("delete", "policy", f"--vhost={vhost}", "name=cap"))
        ok(admin("delete", "user", f"name={user}"))
        ok(admin("delete", "vhost", f"name={vhost}"))
    assert user not in {u["name"] for u in listed(admin, "users")}


def test_overview_nodes_connections_and_channels(admin):
    overview = json.loads(ok(admin("-f", "raw_json", "show", "overview")))
    assert overview[0]["rabbitmq_version"]
    nodes = listed(admin, "nodes")
    assert len(nodes) == 1 and nodes[0]["running"] is True
    for kind in ("connections", "channels", "consumers", "exchanges"):
        assert isinstance(listed(admin, kind), list)


def test_export_and_import_definitions(admin, tmp_path):
    queue = unique("adm-exp")
    ok(admin("declare", "queue", f"name={queue}", "durable=true"))
    path = tmp_path / "definitions.json"
    try:
        assert "Exported definitions" in ok(admin("export", str(path)))
        exported = json.loads(path.read_text())
        assert queue in {q["name"] for q in exported["queues"]}
        ok(admin("delete", "queue", f"name={queue}"))
        assert "Uploaded definitions" in ok(admin("import", str(path)))
        assert queue in {q["name"] for q in listed(admin, "queues")}
    finally:
        admin("delete", "queue", f"name={queue}")


def test_bad_input_is_reported_by_the_tool(admin):
    queue = unique("adm-bad")
    code, out = admin("declare", "queue", f"name={queue}", "durable=maybe")
    assert code != 0 and "not_boolean" in out
    code, out = admin("close", "connection", "name=no such connection")
    assert code != 0 and "Not found" in out


def test_a_vhost_rabbitmqadmin_made_is_usable_at_once(api, admin, tmp_path):  # noqa: F811
    """An administrator creates a vhost with rabbitmqadmin and uses it
    at once (RabbitMQ grants the creator full permissions in it): declare, list,
    publish, get, export, delete and import, all in that vhost, as that user."""
    user, vhost = unique("adm-maker"), unique("adm-new-vh")
    queue, exchange = unique("adm-vq"), unique("adm-vx")
    ok(admin("declare", "user", f"name={user}", "password=pw", "tags=administrator"))
    maker = _runner(api, user, "pw")
    try:
        assert "vhost declared" in ok(maker("declare", "vhost", f"name={vhost}"))
        in_vhost = ("-V", vhost)
        assert "queue declared" in ok(
            maker(*in_vhost, "declare", "queue", f"name={queue}", "durable=true")
        )
        assert "exchange declared" in ok(
            maker(*in_vhost, "declare", "exchange", f"name={exchange}", "type=direct")
        )
        assert "binding declared" in ok(
            maker(*in_vhost, "declare", "binding", f"source={exchange}",
                  f"destination={queue}", "routing_key=k")
        )  # fmt: skip
        assert [q["name"] for q in listed(maker, *in_vhost, "queues")] == [queue]
        assert exchange in {x["name"] for x in listed(maker, *in_vhost, "exchanges")}
        permissions = [p for p in listed(maker, "permissions") if p["vhost"] == vhost]
        assert permissions == [
            {"user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}
        ]
        for payload in ("one", "two"):
            assert "Message published" in ok(
                maker(*in_vhost, "publish", f"exchange={exchange}", "routing_key=k",
                      f"payload={payload}", "properties={\"delivery_mode\": 2}")
            )  # fmt: skip
        got = json.loads(
            ok(maker(*in_vhost, "-f", "raw_json", "get", f"queue={queue}",
                     "ackmode=ack_requeue_false"))
        )  # fmt: skip
        assert [m["payload"] for m in got] == ["one"] and got[0]["message_count"] == 1
        path = tmp_path / "vhost.json"
        assert "Exported definitions" in ok(maker(*in_vhost, "export", str(path)))
        exported = json.loads(path.read_text())
        assert [q["name"] for q in exported["queues"]] == [queue]
        assert [(b["source"], b["destination"]) for b in exported["bindings"]] == [
            (exchange, queue)
        ]
        assert "queue deleted" in ok(maker(*in_vhost, "delete", "queue", f"name={queue}"))
        assert "exchange deleted" in ok(maker(*in_vhost, "delete", "exchange", f"name={exchange}"))
        assert listed(maker, *in_vhost, "queues") == []
        assert "Uploaded definitions" in ok(maker(*in_vhost, "import", str(path)))
        assert [q["name"] for q in listed(maker, *in_vhost, "queues")] == [queue]
        assert exchange in {x["name"] for x in listed(maker, *in_vhost, "exchanges")}
        # The binding came back too: a message routed through the exchange arrives.
        ok(maker(*in_vhost, "publish", f"exchange={exchange}", "routing_key=k", "payload=back"))
        got = json.loads(
            ok(maker(*in_vhost, "-f", "raw_json", "get", f"queue={queue}",
                     "ackmode=ack_requeue_false"))
        )  # fmt: skip
        assert [m["payload"] for m in got] == ["back"]
    finally:
        admin("delete", "vhost", f"name={vhost}")
        admin("delete", "user", f"name={user}")
    assert vhost not in {v["name"] for v in listed(admin, "vhosts")}


def test_publish_and_get_every_property(admin):
    """rabbitmqadmin publishes `properties` as given (RabbitMQ's names, `type` too) and
    shows them back from get."""
    queue = unique("adm-props")
    properties = {
        "content_type": "text/plain",
        "content_encoding": "utf-8",
        "headers": {"h": "v", "n": 1},
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
    ok(admin("declare", "queue", f"name={queue}", "durable=false"))
    try:
        assert "Message published" in ok(
            admin("publish", "exchange=amq.default", f"routing_key={queue}", "payload=p",
                  f"properties={json.dumps(properties)}")
        )  # fmt: skip
        got = json.loads(
            ok(admin("-f", "raw_json", "get", f"queue={queue}", "ackmode=ack_requeue_false"))
        )
        assert got[0]["payload"] == "p" and got[0]["properties"] == properties
        # A bad one is the API's answer, shown by the tool.
        code, out = admin("publish", "exchange=amq.default", f"routing_key={queue}",
                          "payload=p", 'properties={"priority": "high"}')  # fmt: skip
        assert code != 0 and "not_int" in out and "priority" in out
    finally:
        ok(admin("delete", "queue", f"name={queue}"))


def test_a_binding_whose_key_has_a_space_is_deleted_by_its_properties_key(admin):
    """rabbitmqadmin deletes a binding by the properties_key the listing gives (RabbitMQ
    form-encodes the routing key there: a space is `+`)."""
    queue, exchange = unique("adm-bq"), unique("adm-bx")
    ok(admin("declare", "queue", f"name={queue}", "durable=false"))
    ok(admin("declare", "exchange", f"name={exchange}", "type=direct"))
    try:
        ok(admin("declare", "binding", f"source={exchange}", f"destination={queue}",
                 "routing_key=with space/and%"))  # fmt: skip
        mine = [b for b in listed(admin, "bindings") if b["source"] == exchange]
        assert [b["properties_key"] for b in mine] == ["with+space%2Fand%25"]
        assert "binding deleted" in ok(
            admin("delete", "binding", f"source={exchange}", f"destination={queue}",
                  "destination_type=queue", f"properties_key={mine[0]['properties_key']}")
        )  # fmt: skip
        assert not [b for b in listed(admin, "bindings") if b["source"] == exchange]
    finally:
        ok(admin("delete", "queue", f"name={queue}"))
        ok(admin("delete", "exchange", f"name={exchange}"))
