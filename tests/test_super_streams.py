"""`leveret streams add-super-stream`: RabbitMQ's super stream layout in one step."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from test_streams import _ask_offsets


def _drain_stream(conn, queue: str) -> int:
    """How many messages a stream holds: read from first until 0.5 s of silence."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got = []
    ch.basic_consume(
        queue,
        lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": "first"},
    )
    seen = -1
    while seen != len(got):
        seen = len(got)
        conn.process_data_events(0.5)
    ch.close()
    return len(got)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "leveret", "streams", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_add_super_stream_and_publish_through_the_hash_exchange(amqp_url, names):
    name = names.exchange("clicks")
    proc = _cli(
        "add-super-stream", name, "--partitions", "3", "--consistent-hash", "--url", amqp_url
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{name}-0, {name}-1, {name}-2" in proc.stdout
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.confirm_delivery()
    for k in range(60):
        ch.basic_publish(f"{name}-hash", f"user-{k}", b"%d" % k)
    ch.basic_publish(name, "1", b"direct to partition 1")  # RabbitMQ's layout: key = index
    counts = [_drain_stream(conn, f"{name}-{i}") for i in range(3)]
    assert sum(counts) == 61 and min(counts) > 0
    proc = _cli("delete-super-stream", name, "--partitions", "3", "--url", amqp_url)
    assert proc.returncode == 0, proc.stderr
    conn.close()


@pytest.mark.leveret_only
def test_offsets_extension_lists_partitions_in_order(amqp_url, connection, names):
    name = names.exchange("ss")
    assert _cli("add-super-stream", name, "--partitions", "4", "--url", amqp_url).returncode == 0
    reply = _ask_offsets(connection, json.dumps({"super_stream": name}).encode())
    assert [p["stream"] for p in reply["partitions"]] == [f"{name}-{i}" for i in range(4)]
    _cli("delete-super-stream", name, "--partitions", "4", "--url", amqp_url)


@pytest.mark.parametrize(
    "args,text",
    [
        (["add-super-stream", "x", "--partitions", "0"], "at least 1 partition"),
        (["add-super-stream", "x", "--partitions", "two"], "expected a whole number"),
        (["add-super-stream", "x"], "--partitions"),
    ],
)
def test_bad_cli_arguments(args, text):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert text in proc.stderr


def test_unreachable_broker_is_named():
    proc = _cli(
        "add-super-stream", "x", "--partitions", "1", "--url", "amqp://guest:guest@127.0.0.1:1/%2F"
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("leveret streams: ")
