"""Prometheus metrics: RabbitMQ's family names and types, values read from the live broker.

The expected names and types below were read off RabbitMQ 3.10.8's rabbitmq_prometheus
(`/metrics` on the reference broker); test_the_pinned_families_are_rabbitmqs checks them
again whenever that broker is reachable.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request

import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from serverproc import server_argv

RABBITMQ_METRICS = "http://127.0.0.1:15693/metrics"

# family (as the parser names it: counters without _total) -> type, as RabbitMQ 3.10 has them
PINNED = {
    "rabbitmq_connections": "gauge",
    "rabbitmq_channels": "gauge",
    "rabbitmq_queues": "gauge",
    "rabbitmq_consumers": "gauge",
    "rabbitmq_global_consumers": "gauge",
    "rabbitmq_connections_opened": "counter",
    "rabbitmq_connections_closed": "counter",
    "rabbitmq_channels_opened": "counter",
    "rabbitmq_channels_closed": "counter",
    "rabbitmq_queues_declared": "counter",
    "rabbitmq_queues_created": "counter",
    "rabbitmq_queues_deleted": "counter",
    "rabbitmq_queue_messages_ready": "gauge",
    "rabbitmq_queue_messages_unacked": "gauge",
    "rabbitmq_queue_messages": "gauge",
    "rabbitmq_queue_consumers": "gauge",
    "rabbitmq_queue_messages_published": "counter",
    "rabbitmq_channel_messages_published": "counter",
    "rabbitmq_channel_messages_confirmed": "counter",
    "rabbitmq_channel_messages_unroutable_returned": "counter",
    "rabbitmq_channel_messages_unroutable_dropped": "counter",
    "rabbitmq_channel_get_ack": "counter",
    "rabbitmq_channel_get": "counter",
    "rabbitmq_channel_get_empty": "counter",
    "rabbitmq_channel_messages_delivered_ack": "counter",
    "rabbitmq_channel_messages_delivered": "counter",
    "rabbitmq_channel_messages_redelivered": "counter",
    "rabbitmq_channel_messages_acked": "counter",
    "rabbitmq_channel_consumers": "gauge",
    "rabbitmq_channel_messages_unacked": "gauge",
    "rabbitmq_connection_incoming_bytes": "counter",
    "rabbitmq_connection_outgoing_bytes": "counter",
    "rabbitmq_global_messages_received": "counter",
    "rabbitmq_global_messages_routed": "counter",
    "rabbitmq_global_messages_unroutable_dropped": "counter",
    "rabbitmq_global_messages_unroutable_returned": "counter",
    "rabbitmq_global_messages_confirmed": "counter",
    "rabbitmq_global_messages_delivered": "counter",
    "rabbitmq_global_messages_delivered_consume_manual_ack": "counter",
    "rabbitmq_global_messages_delivered_consume_auto_ack": "counter",
    "rabbitmq_global_messages_delivered_get_manual_ack": "counter",
    "rabbitmq_global_messages_delivered_get_auto_ack": "counter",
    "rabbitmq_global_messages_get_empty": "counter",
    "rabbitmq_global_messages_redelivered": "counter",
    "rabbitmq_global_messages_acknowledged": "counter",
    "rabbitmq_process_resident_memory_bytes": "gauge",
    "rabbitmq_resident_memory_limit_bytes": "gauge",
    "rabbitmq_process_open_fds": "gauge",
    "rabbitmq_process_max_fds": "gauge",
    "rabbitmq_process_open_tcp_sockets": "gauge",
    "rabbitmq_disk_space_available_bytes": "gauge",
    "rabbitmq_disk_space_available_limit_bytes": "gauge",
    "rabbitmq_alarms_memory_used_watermark": "unknown",
    "rabbitmq_alarms_free_disk_space_watermark": "unknown",
    "rabbitmq_alarms_file_descriptor_limit": "unknown",
    "rabbitmq_erlang_uptime_seconds": "gauge",
    "rabbitmq_identity_info": "unknown",
    "rabbitmq_build_info": "unknown",
}


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, name: str, suffix: str = "", **labels) -> float:
    for sample in families[name].samples:
        if sample.name == name + suffix and labels.items() <= sample.labels.items():
            return sample.value
    raise KeyError((name, suffix, labels))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    config = ServerConfig(
        port=0,
        data_dir=str(tmp_path_factory.mktemp("prom")),
        management_port=None,
        prometheus_port=0,
    )
    with embedded_broker(config) as b:
        yield b, f"http://127.0.0.1:{b.server.prometheus.port}/metrics"


def test_families_have_rabbitmqs_names_and_types(broker):
    families = scrape(broker[1])
    for name, kind in PINNED.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
    identity = families["rabbitmq_identity_info"].samples[0]
    assert identity.labels["rabbitmq_node"] and identity.labels["rabbitmq_cluster"]
    assert value(families, "rabbitmq_process_resident_memory_bytes") > 0
    assert value(families, "rabbitmq_process_open_fds") > 0


def test_values_follow_the_traffic(broker):
    b, url = broker
    before = scrape(url)
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("prom-q", durable=True)
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(5):
        channel.basic_publish("", "prom-q", b"x" * 100, props)
    channel.basic_publish("", "prom-nowhere", b"dropped")
    for _ in range(2):
        method, _p, _b = channel.basic_get("prom-q")
        channel.basic_ack(method.delivery_tag)
    channel.basic_get("prom-q", auto_ack=True)
    connection.process_data_events(0.1)
    try:
        after = scrape(url)
        assert value(after, "rabbitmq_connections") == value(before, "rabbitmq_connections") + 1
        assert value(after, "rabbitmq_queue_messages_ready") == 2
        gained = {
            name: value(after, name, "_total", protocol="amqp091")
            - value(before, name, "_total", protocol="amqp091")
            for name in (
                "rabbitmq_global_messages_received",
                "rabbitmq_global_messages_routed",
                "rabbitmq_global_messages_unroutable_dropped",
                "rabbitmq_global_messages_confirmed",
                "rabbitmq_global_messages_acknowledged",
                "rabbitmq_global_messages_delivered_get_manual_ack",
                "rabbitmq_global_messages_delivered_get_auto_ack",
            )
        }
        assert gained == {
            "rabbitmq_global_messages_received": 6,
            "rabbitmq_global_messages_routed": 5,
            "rabbitmq_global_messages_unroutable_dropped": 1,
            "rabbitmq_global_messages_confirmed": 6,
            "rabbitmq_global_messages_acknowledged": 2,
            "rabbitmq_global_messages_delivered_get_manual_ack": 2,
            "rabbitmq_global_messages_delivered_get_auto_ack": 1,
        }
        assert value(after, "rabbitmq_channel_messages_published", "_total") == 6
        assert value(after, "rabbitmq_connection_incoming_bytes", "_total") > 500
        # Leveret's own: the persistent messages went through the group commit's fsync.
        assert value(after, "leveret_store_fsync_seconds", "_count") >= 1
        assert value(after, "leveret_store_group_commit_writes", "_sum") >= 5
        per_queue = scrape(url + "/per-object")
        assert value(per_queue, "rabbitmq_queue_messages_ready", vhost="/", queue="prom-q") == 2
        assert value(per_queue, "rabbitmq_queue_messages_published", "_total", queue="prom-q") == 5
    finally:
        channel.queue_delete("prom-q")
        connection.close()


def test_closed_connections_stay_in_the_global_totals(broker):
    b, url = broker
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    channel = connection.channel()
    channel.basic_publish("", "nowhere-at-all", b"x")
    connection.process_data_events(0.1)
    during = scrape(url)
    connection.close()
    deadline = time.monotonic() + 10
    while True:
        after = scrape(url)
        closed = value(after, "rabbitmq_connections_closed", "_total")
        if closed >= value(during, "rabbitmq_connections_closed", "_total") + 1:
            break
        assert time.monotonic() < deadline, "the closed connection was never counted"
        time.sleep(0.05)
    name = "rabbitmq_global_messages_received"
    assert value(after, name, "_total") == value(during, name, "_total")


def test_the_cli_serves_metrics_on_its_port_and_0_turns_them_off(tmp_path):
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    amqp_port, metrics_port = ports
    proc = subprocess.Popen(
        [*server_argv(), "--port", str(amqp_port),
         "--management-port", "0", "--prometheus-port", str(metrics_port),
         "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(300):
            assert proc.poll() is None, proc.stderr.read()
            try:
                families = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
                break
            except OSError:
                time.sleep(0.05)
        assert value(families, "rabbitmq_connections") == 0
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1]
    assert f"Prometheus metrics on http://127.0.0.1:{metrics_port}/metrics" in err
    assert "management API on" not in err


def test_the_pinned_families_are_rabbitmqs():
    """RabbitMQ's side: the reference broker has every pinned family with the same type."""
    try:
        families = scrape(RABBITMQ_METRICS)
    except (OSError, urllib.error.URLError):
        pytest.skip("the reference RabbitMQ is not reachable on 15693")
    for name, kind in PINNED.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)


# --- more families RabbitMQ's dashboards read: logins, channels, queues, ... ----------------


def _gain(before, after, name, suffix="_total", **labels):
    return value(after, name, suffix, **labels) - value(before, name, suffix, **labels)


def _settle(connection, predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the broker never got there"
        connection.process_data_events(0.05)


def test_logins_are_counted(broker):
    b, url = broker
    before = scrape(url)
    params = pika.URLParameters(b.url.replace("guest:guest", "guest:wrong"))
    params.connection_attempts = 1
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)
    pika.BlockingConnection(pika.URLParameters(b.url)).close()
    after = scrape(url)
    amqp = {"protocol": "amqp091"}
    assert _gain(before, after, "rabbitmq_auth_attempts", **amqp) == 2
    assert _gain(before, after, "rabbitmq_auth_attempts_succeeded", **amqp) == 1
    assert _gain(before, after, "rabbitmq_auth_attempts_failed", **amqp) == 1


def test_dead_lettering_is_counted_by_reason_and_strategy(broker):
    b, url = broker
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = connection.channel()
    ch.exchange_declare("prom-dlx", "fanout", auto_delete=True)
    ch.queue_declare("prom-dead", auto_delete=True)
    ch.queue_bind("prom-dead", "prom-dlx")
    dlx = {"x-dead-letter-exchange": "prom-dlx"}
    ch.queue_declare("prom-rej", auto_delete=True, arguments=dlx)
    ch.queue_declare("prom-rej-nodlx", auto_delete=True)
    ch.queue_declare("prom-ttl", auto_delete=True, arguments={**dlx, "x-message-ttl": 1})
    ch.queue_declare("prom-max", auto_delete=True, arguments={"x-max-length": 1})
    before = scrape(url)
    try:
        for queue in ("prom-rej", "prom-rej-nodlx", "prom-ttl", "prom-max", "prom-max", "prom-max"):
            ch.basic_publish("", queue, b"m")
        for queue in ("prom-rej", "prom-rej-nodlx"):
            _settle(
                connection, lambda q=queue: ch.queue_declare(q, passive=True).method.message_count
            )
            method, _p, _b = ch.basic_get(queue)
            ch.basic_reject(method.delivery_tag, requeue=False)
        _settle(
            connection,
            lambda: ch.queue_declare("prom-dead", passive=True).method.message_count == 2,
        )
        after = scrape(url)
        classic = "rabbit_classic_queue"
        name = "rabbitmq_global_messages_dead_lettered"
        gains = {
            (reason, strategy): _gain(
                before, after, f"{name}_{reason}",
                queue_type=classic, dead_letter_strategy=strategy,
            )
            for reason in ("rejected", "expired", "maxlen")
            for strategy in ("at_most_once", "disabled")
        }  # fmt: skip
        assert gains == {
            ("rejected", "at_most_once"): 1,
            ("rejected", "disabled"): 1,
            ("expired", "at_most_once"): 1,
            ("expired", "disabled"): 0,
            ("maxlen", "at_most_once"): 0,
            ("maxlen", "disabled"): 2,
        }
        # RabbitMQ's quorum-queue series are listed too (none here).
        assert value(after, f"{name}_confirmed", "_total", queue_type="rabbit_quorum_queue") == 0
    finally:
        for queue in ("prom-rej", "prom-rej-nodlx", "prom-ttl", "prom-max", "prom-dead"):
            ch.queue_delete(queue)
        connection.close()


def test_confirm_publishers_unconfirmed_and_uncommitted(broker):
    b, url = broker
    before = scrape(url)
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    confirm = connection.channel()
    confirm.confirm_delivery()
    for _ in range(4):
        confirm.basic_publish("", "prom-nowhere", b"x")
    plain = connection.channel()
    plain.basic_publish("", "prom-nowhere", b"x")
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", "prom-nowhere", b"x")
    tx.basic_publish("", "prom-nowhere", b"x")
    idle = connection.channel()
    idle.basic_qos(prefetch_count=7)
    connection.process_data_events(0.1)
    during = scrape(url)
    amqp = {"protocol": "amqp091"}
    assert _gain(before, during, "rabbitmq_global_messages_received_confirm", **amqp) == 4
    # Channels that published, the transactional one too (as RabbitMQ counts them).
    assert _gain(before, during, "rabbitmq_global_publishers", "", **amqp) == 3
    per_channel = scrape(url + "/per-object")
    uncommitted = [
        s.value for s in per_channel["rabbitmq_channel_messages_uncommitted"].samples if s.value
    ]
    assert uncommitted == [2]
    prefetch = [s.value for s in per_channel["rabbitmq_consumer_prefetch"].samples if s.value]
    assert prefetch == [7]
    assert value(during, "rabbitmq_channel_messages_unconfirmed") == 0  # all confirmed
    connection.close()
    deadline = time.monotonic() + 10
    while value(after := scrape(url), "rabbitmq_channels") != value(before, "rabbitmq_channels"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Closed channels' confirm-mode publishes stay counted; they publish no more.
    assert _gain(before, after, "rabbitmq_global_messages_received_confirm", **amqp) == 4
    assert _gain(before, after, "rabbitmq_global_publishers", "", **amqp) == 0


def test_global_counters_by_queue_type_outlive_their_queues_and_vhosts(broker):
    b, url = broker
    b.admin.add_vhost("prom-v")
    b.admin.set_permissions("guest", "prom-v", ".*", ".*", ".*")
    before = scrape(url)
    params = pika.URLParameters(b.url.rsplit("/", 1)[0] + "/prom-v")
    connection = pika.BlockingConnection(params)
    ch = connection.channel()
    ch.queue_declare("prom-classic")
    ch.queue_declare("prom-stream", durable=True, arguments={"x-queue-type": "stream"})
    for queue in ("prom-classic", "prom-stream"):
        ch.basic_publish("", queue, b"m")
    ch.basic_get("prom-classic", auto_ack=True)
    ch.basic_get("prom-classic", auto_ack=True)  # empty
    ch.basic_qos(prefetch_count=1)
    got = []
    ch.basic_consume("prom-stream", lambda c, m, p, body: got.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})  # fmt: skip
    _settle(connection, lambda: got)
    ch.basic_ack(got[0])
    connection.process_data_events(0.1)
    name = "rabbitmq_global_messages"

    def gains(after):
        return {
            (kind, queue_type): _gain(
                before, after, f"{name}_{kind}", protocol="amqp091",
                queue_type=f"rabbit_{queue_type}_queue",
            )
            for kind in ("delivered_get_auto_ack", "get_empty", "delivered_consume_manual_ack",
                         "acknowledged")
            for queue_type in ("classic", "stream")
        }  # fmt: skip

    expected = {
        ("delivered_get_auto_ack", "classic"): 1,
        ("delivered_get_auto_ack", "stream"): 0,
        ("get_empty", "classic"): 1,
        ("get_empty", "stream"): 0,
        ("delivered_consume_manual_ack", "classic"): 0,
        ("delivered_consume_manual_ack", "stream"): 1,
        ("acknowledged", "classic"): 0,
        ("acknowledged", "stream"): 1,
    }
    assert gains(scrape(url)) == expected
    ch.queue_delete("prom-classic")
    connection.close()
    b.admin.delete_vhost("prom-v")  # its queues and closed connections go with it
    after = scrape(url)
    assert gains(after) == expected
    assert _gain(before, after, f"{name}_received", protocol="amqp091") == 2
    assert _gain(before, after, "rabbitmq_queues_deleted") == 2


def test_detailed_gives_the_groups_asked_for(broker):
    b, url = broker
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = connection.channel()
    ch.queue_declare("prom-detailed", auto_delete=True)
    ch.basic_consume("prom-detailed", lambda *a: None)
    base = url.removesuffix("/metrics")
    try:
        families = scrape(f"{base}/metrics/detailed?family=queue_consumer_count&vhost=%2F")
        assert (
            value(families, "rabbitmq_detailed_queue_consumers", vhost="/", queue="prom-detailed")
            == 1
        )
        assert {f for f in families if f.startswith("rabbitmq_")} == {
            "rabbitmq_detailed_queue_consumers",
            "rabbitmq_identity_info",
            "rabbitmq_build_info",
        }
        other = scrape(f"{base}/metrics/detailed?family=queue_coarse_metrics&vhost=nope")
        assert other["rabbitmq_detailed_queue_messages"].samples == []
        cluster = scrape(f"{base}/metrics/detailed?family=exchange_names&family=vhost_status")
        assert value(cluster, "rabbitmq_cluster_vhost_status", vhost="/") == 1
        assert value(
            cluster, "rabbitmq_cluster_exchange_name", vhost="/", exchange="amq.topic",
            type="topic",
        ) == 1  # fmt: skip
    finally:
        connection.close()


def test_identity_build_and_socket_limit(broker):
    from leveret.management.prometheus import max_tcp_sockets

    b, url = broker
    families = scrape(url)
    identity = families["rabbitmq_identity_info"].samples[0].labels
    assert identity["rabbitmq_cluster"] == b.server.broker.cluster_name
    assert identity["rabbitmq_cluster_permanent_id"].startswith("leveret-cluster-id-")
    build = families["rabbitmq_build_info"].samples[0].labels
    assert build["rabbitmq_version"] == "3.10.8"
    assert build["erlang_version"].startswith("python-")
    max_fds = value(families, "rabbitmq_process_max_fds")
    assert value(families, "rabbitmq_process_max_tcp_sockets") == max_tcp_sockets(int(max_fds))
    assert max_tcp_sockets(1024) == 832  # RabbitMQ 3.10's figure for a 1024 limit
    assert value(families, "process_start_time_seconds") <= time.time()
