"""Dynamic shovels between Leveret brokers (and within one), through the management API.

Each test runs its brokers in-process; the SIGKILL and restart tests are in
test_shovel_faults.py. What is compared with RabbitMQ's own answers (validation
texts, status fields) is in tests/compat/plugins.
"""

from __future__ import annotations

import time

import pytest
from links_support import (
    api,
    count,
    drain,
    free_port,
    leveret,
    publish,
    put_shovel,
    shovel_state,
    wait_count,
    wait_for,
    wait_state,
)

from leveret.client.blocking import connect


def test_a_shovel_moves_a_queue_to_another_broker_with_forward_headers():
    with leveret() as src, leveret() as dest:
        publish(src.url, "orders", [b"o%d" % i for i in range(500)], message_id="m", app_id="a")
        assert (
            put_shovel(
                src.api,
                "move-orders",
                {
                    "src-uri": "amqp://",
                    "src-queue": "orders",
                    "dest-uri": dest.url,
                    "dest-queue": "orders-copy",
                    "dest-add-forward-headers": True,
                    "dest-add-timestamp-header": True,
                    "dest-publish-properties": {"app_id": "shovel", "priority": 3},
                },
            )
            == 201
        )
        wait_count(dest.url, "orders-copy", 500)
        row = wait_state(src.api, "move-orders", "running")
        safe_dest = dest.url.replace("guest:guest@", "")
        assert row == {
            "node": "leveret@localhost",
            "timestamp": row["timestamp"],
            "name": "move-orders",
            "vhost": "/",
            "type": "dynamic",
            "state": "running",
            "src_uri": "amqp://",
            "src_protocol": "amqp091",
            "dest_protocol": "amqp091",
            "dest_uri": safe_dest,
            "src_queue": "orders",
            "dest_queue": "orders-copy",
        }
        wait_for(lambda: count(src.url, "orders") == 0, what="source drained")
        messages = drain(dest.url, "orders-copy", 500)
        assert [m.body for m in messages] == [b"o%d" % i for i in range(500)]  # in order
        first = messages[0]
        assert first.properties.app_id == "shovel"  # dest-publish-properties
        assert first.properties.priority == 3
        assert first.properties.message_id == "m"  # everything else as it came
        assert first.properties.delivery_mode == 2
        (entry,) = first.headers["x-shovelled"]
        assert entry == {
            "shovelled-by": src.server.broker.cluster_name,
            "shovel-type": "dynamic",
            "shovel-name": "move-orders",
            "shovel-vhost": "/",
            "src-uri": "amqp://",
            "dest-uri": safe_dest,
            "src-queue": "orders",
            "dest-queue": "orders-copy",
        }
        assert abs(first.headers["x-shovelled-timestamp"] - time.time()) < 120


def test_the_source_queue_is_declared_when_missing_and_an_exchange_can_be_the_source():
    with leveret() as b:
        put_shovel(
            b.api,
            "from-q",
            {
                "src-uri": "amqp://",
                "src-queue": "not-yet",
                "dest-uri": "amqp://",
                "dest-exchange": "amq.topic",
                "dest-exchange-key": "from.q",
            },
        )
        wait_state(b.api, "from-q", "running")
        status, queue = api(b.api, "GET", "/api/queues/%2F/not-yet")
        assert status == 200 and queue["durable"] is True  # declared as RabbitMQ does
        put_shovel(
            b.api,
            "from-x",
            {
                "src-uri": "amqp://",
                "src-exchange": "amq.direct",
                "src-exchange-key": "k",
                "dest-uri": "amqp://",
                "dest-queue": "from-x-out",
            },
        )
        wait_state(b.api, "from-x", "running")
        with connect(b.url) as conn:
            ch = conn.channel()
            ch.declare_queue("topic-sink")
            ch.bind_queue("topic-sink", "amq.topic", "from.#")
            ch.publish(b"via-exchange", routing_key="k", exchange="amq.direct")
            ch.publish(b"via-queue", routing_key="not-yet")
        wait_count(b.url, "from-x-out", 1)
        wait_count(b.url, "topic-sink", 1)
        assert [m.body for m in drain(b.url, "from-x-out", 1)] == [b"via-exchange"]
        got = drain(b.url, "topic-sink", 1)
        assert got[0].body == b"via-queue" and got[0].routing_key == "from.q"


@pytest.mark.parametrize("after", ["queue-length", 120])
def test_src_delete_after_moves_that_many_then_deletes_the_shovel(after):
    with leveret() as b:
        publish(b.url, "batch", [b"%d" % i for i in range(300)])
        put_shovel(
            b.api,
            "once",
            {
                "src-uri": "amqp://",
                "src-queue": "batch",
                "dest-uri": "amqp://",
                "dest-queue": "batch-out",
                "src-delete-after": after,
                "src-prefetch-count": 50,
            },
        )
        wait_for(lambda: shovel_state(b.api, "once") is None, what="the shovel to delete itself")
        assert api(b.api, "GET", "/api/parameters/shovel/%2F/once")[0] == 404
        moved = 300 if after == "queue-length" else after
        assert count(b.url, "batch-out") == moved
        assert count(b.url, "batch") == 300 - moved


@pytest.mark.parametrize("mode", ["on-publish", "no-ack"])
def test_other_ack_modes_move_everything(mode):
    with leveret() as src, leveret() as dest:
        publish(src.url, "work", [b"w%d" % i for i in range(2000)])
        put_shovel(
            src.api,
            "m",
            {
                "src-uri": "amqp://",
                "src-queue": "work",
                "dest-uri": dest.url,
                "dest-queue": "work",
                "ack-mode": mode,
            },
        )
        wait_count(dest.url, "work", 2000)
        assert sorted(m.body for m in drain(dest.url, "work", 2000)) == sorted(
            b"w%d" % i for i in range(2000)
        )


def test_an_unreachable_destination_is_listed_with_its_reason_and_retried():
    with leveret() as src:
        publish(src.url, "held", [b"x"] * 10)
        port = free_port()
        put_shovel(
            src.api,
            "later",
            {
                "src-uri": "amqp://",
                "src-queue": "held",
                "dest-uri": f"amqp://guest:guest@127.0.0.1:{port}",
                "dest-queue": "held",
                "reconnect-delay": 0.3,
            },
        )
        row = wait_for(
            lambda: (r := shovel_state(src.api, "later")) and "reason" in r and r, what="a reason"
        )
        assert row["state"] in ("starting", "terminated")
        assert f"127.0.0.1:{port}" in row["reason"]
        assert count(src.url, "held") == 10  # nothing taken while it cannot deliver
        with leveret(port=port) as dest:
            wait_count(dest.url, "held", 10)
            wait_state(src.api, "later", "running")


def test_restart_and_delete_through_the_api():
    with leveret() as b:
        put_shovel(
            b.api,
            "s",
            {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
        )
        wait_state(b.api, "s", "running")
        before = b.call(lambda: b.server.links.shovels[("/", "s")].attempt)
        assert api(b.api, "DELETE", "/api/shovels/vhost/%2F/s/restart")[0] == 204
        wait_state(b.api, "s", "running")
        assert api(b.api, "DELETE", "/api/shovels/vhost/%2F/nope/restart")[0] == 404
        assert b.call(lambda: b.server.links.shovels[("/", "s")].attempt) == before
        publish(b.url, "a", [b"after restart"])
        wait_count(b.url, "b", 1)
        assert api(b.api, "DELETE", "/api/shovels/vhost/%2F/s")[0] == 204
        assert shovel_state(b.api, "s") is None
        assert api(b.api, "GET", "/api/parameters/shovel")[1] == []


def test_a_blocked_destination_slows_the_shovel_and_prefetch_bounds_what_is_in_flight():
    with leveret() as src, leveret() as dest:
        publish(src.url, "big", [b"b" * 1024] * 3000)

        def alarm(on: bool) -> None:
            alarms = dest.server.alarms
            alarms.memory_limit = 1 if on else 0
            alarms.check()

        dest.call(alarm, True)
        put_shovel(
            src.api,
            "slow",
            {
                "src-uri": "amqp://",
                "src-queue": "big",
                "dest-uri": dest.url,
                "dest-queue": "big",
                "src-prefetch-count": 100,
            },
        )
        wait_state(src.api, "slow", "running")
        time.sleep(1.0)
        status, queue = api(src.api, "GET", "/api/queues/%2F/big")
        assert queue["messages_unacknowledged"] <= 100  # the prefetch bounds it
        assert queue["messages_ready"] >= 2900
        assert count(dest.url, "big") == 0  # connection.blocked: nothing published
        dest.call(alarm, False)
        wait_count(dest.url, "big", 3000)
        wait_for(lambda: count(src.url, "big") == 0, what="the source to drain")


def test_shovels_in_another_vhost_and_visibility():
    with leveret() as b:
        b.admin.add_vhost("v2")
        b.admin.set_permissions("guest", "v2", ".*", ".*", ".*")
        put_shovel(
            b.api,
            "s2",
            {
                "src-uri": "amqp:///v2",
                "src-queue": "a",
                "dest-uri": "amqp:///v2",
                "dest-queue": "b",
            },
            vhost="v2",
        )
        wait_state(b.api, "s2", "running")
        assert [r["name"] for r in api(b.api, "GET", "/api/shovels/v2")[1]] == ["s2"]
        assert api(b.api, "GET", "/api/shovels/%2F")[1] == []
        assert api(b.api, "GET", "/api/shovels/nope")[0] == 404
        # The defining user must be able to use the vhost a direct URI names.
        b.admin.add_user("pm", "pm", ["policymaker"])
        b.admin.set_permissions("pm", "/", ".*", ".*", ".*")
        status, body = api(
            b.api,
            "PUT",
            "/api/parameters/shovel/%2F/x",
            {
                "value": {
                    "src-uri": "amqp:///v2",
                    "src-queue": "a",
                    "dest-uri": "amqp://",
                    "dest-queue": "b",
                }
            },
            user="pm:pm",
        )
        assert (status, body["reason"]) == (
            400,
            'Validation failed\n\nuser "pm" may not connect to vhost "v2"\n',
        )
        b.admin.delete_vhost("v2")
        assert shovel_state(b.api, "s2") is None  # its shovels went with it


def test_several_uris_are_tried_in_turn():
    with leveret() as src, leveret() as dest:
        publish(src.url, "jobs", [b"j"] * 20)
        dead = f"amqp://guest:guest@127.0.0.1:{free_port()}"
        put_shovel(
            src.api,
            "turns",
            {
                "src-uri": "amqp://",
                "src-queue": "jobs",
                "dest-uri": [dead, dest.url],
                "dest-queue": "jobs",
                "reconnect-delay": 0.2,
            },
        )
        row = wait_state(src.api, "turns", "running")
        assert row["dest_uri"] == dest.url.replace("guest:guest@", "")
        wait_count(dest.url, "jobs", 20)


def test_leveret_ctl_over_the_management_api():
    import subprocess
    import sys

    with leveret() as b:
        ctl = [sys.executable, "-m", "leveret", "ctl", "--url", b.api]
        value = '{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}'

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*ctl, *args], capture_output=True, text=True, timeout=60)

        assert run("set_parameter", "shovel", "s", value).returncode == 0
        wait_state(b.api, "s", "running")
        bad = run("set_parameter", "shovel", "t", '{"src-uri": "http://x"}')
        assert bad.returncode == 1
        assert '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"}' in bad.stderr
        assert '"name": "s"' in run("--formatter", "json", "list_parameters").stdout
        assert '"state": "running"' in run("--formatter", "json", "shovel_status").stdout
        assert run("restart_shovel", "s").returncode == 0
        assert run("delete_shovel", "s").returncode == 0
        missing = run("clear_parameter", "shovel", "s")
        assert missing.returncode == 1 and "no shovel parameter 's' in vhost '/'" in missing.stderr


def test_a_shovels_connections_to_this_broker_are_listed_as_direct():
    with leveret() as b:
        put_shovel(
            b.api,
            "s",
            {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
        )
        wait_state(b.api, "s", "running")
        conns = [
            c
            for c in api(b.api, "GET", "/api/connections")[1]
            if c["client_properties"].get("connection_name") == "Shovel s"
        ]
        assert len(conns) == 2
        assert {(c["type"], c["user"], c["vhost"]) for c in conns} == {("direct", "none", "/")}
