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
