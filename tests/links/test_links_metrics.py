"""Prometheus counts the messages each shovel and federation link moved."""

from __future__ import annotations

import urllib.request

from links_support import api, count, leveret, publish, put_shovel, wait_for, wait_state
from prometheus_client.parser import text_string_to_metric_families


def scrape(broker) -> dict[tuple, float]:
    """(sample name, sorted labels) → value, of the leveret_ link families."""
    url = f"http://127.0.0.1:{broker.server.prometheus.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("leveret_shovel", "leveret_federation")):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def key(sample: str, **labels: str) -> tuple:
    return (sample, tuple(sorted(labels.items())))


def test_messages_moved_per_shovel_and_per_link():
    with leveret(prometheus_port=0) as b:
        publish(b.url, "in", [b"x"] * 120)
        put_shovel(
            b.api,
            "s1",
            {"src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp://", "dest-queue": "out"},
        )
        wait_state(b.api, "s1", "running")
        wait_for(lambda: count(b.url, "out") == 120, what="the shovel")
        api(b.api, "PUT", "/api/exchanges/%2F/up", {"type": "fanout", "durable": True})
        api(b.api, "PUT", "/api/exchanges/%2F/down", {"type": "fanout", "durable": True})
        api(b.api, "PUT", "/api/queues/%2F/sink", {"durable": True})
        api(b.api, "POST", "/api/bindings/%2F/e/down/q/sink", {"routing_key": ""})
        api(
            b.api,
            "PUT",
            "/api/parameters/federation-upstream/%2F/self",
            {"value": {"uri": "amqp://", "exchange": "up"}},
        )
        api(
            b.api,
            "PUT",
            "/api/policies/%2F/fed",
            {"pattern": "^down$", "definition": {"federation-upstream": "self"}},
        )
        link = {"vhost": "/", "type": "exchange", "name": "down", "upstream": "self"}
        wait_for(
            lambda: scrape(b).get(key("leveret_federation_link_running", **link)) == 1,
            what="the link in the metrics",
        )
        for _ in range(7):
            api(
                b.api,
                "POST",
                "/api/exchanges/%2F/up/publish",
                {"properties": {}, "routing_key": "", "payload": "p", "payload_encoding": "string"},
            )
        wait_for(lambda: count(b.url, "sink") == 7, what="the federated messages")
        metrics = scrape(b)
        assert metrics[key("leveret_shovel_messages_total", vhost="/", shovel="s1")] == 120
        assert metrics[key("leveret_shovel_running", vhost="/", shovel="s1")] == 1
        wait_for(
            lambda: scrape(b)[key("leveret_federation_link_messages_total", **link)] == 7,
            what="the link's count",
        )
