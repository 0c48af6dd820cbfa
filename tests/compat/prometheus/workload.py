"""A known workload, so that every family RabbitMQ exposes has something to show.

Run with pika (a real client) against either broker, it leaves open: a publisher
connection with a confirm channel, a consumer connection with manual-ack and
auto-ack consumers and unacknowledged deliveries, and queues holding ready,
unacknowledged, persistent and dead-lettered messages. It also makes one failed
login. `run(amqp_url)` returns the connections, which the caller closes after
scraping.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pika
import pika.exceptions

PREFIX = "prom."


def _params(url: str, password: str | None = None) -> pika.URLParameters:
    params = pika.URLParameters(url)
    if password is not None:
        params.credentials = pika.PlainCredentials(params.credentials.username, password)
    params.connection_attempts = 1
    params.socket_timeout = 5
    return params


def run(url: str) -> list[pika.BlockingConnection]:
    """Build the workload; returns the connections it leaves open."""
    try:
        pika.BlockingConnection(_params(url, password="not-the-password"))
    except pika.exceptions.ProbableAuthenticationError:
        pass  # a failed login, for rabbitmq_auth_attempts_failed_total
    publisher = pika.BlockingConnection(_params(url))
    consumer = pika.BlockingConnection(_params(url))
    setup = publisher.channel()
    q = {name: PREFIX + name for name in ("ready", "work", "auto", "dead", "ttl", "max", "reject")}
    setup.exchange_declare(PREFIX + "dlx", "fanout", auto_delete=True)
    setup.queue_declare(q["dead"], auto_delete=True)
    setup.queue_bind(q["dead"], PREFIX + "dlx")
    dlx = {"x-dead-letter-exchange": PREFIX + "dlx"}
    setup.queue_declare(q["ready"], durable=True)
    setup.queue_declare(q["work"], auto_delete=True)
    setup.queue_declare(q["auto"], auto_delete=True)
    setup.queue_declare(q["ttl"], auto_delete=True, arguments={**dlx, "x-message-ttl": 1})
    setup.queue_declare(q["max"], auto_delete=True, arguments={**dlx, "x-max-length": 1})
    setup.queue_declare(q["reject"], auto_delete=True, arguments=dlx)

    confirm = publisher.channel()
    confirm.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(5):
        confirm.basic_publish("", q["ready"], b"persistent %d" % i, persistent)
    for i in range(3):
        confirm.basic_publish("", q["ready"], b"transient %d" % i)
    for name in ("work", "auto", "ttl", "max", "max", "max", "reject", "reject"):
        confirm.basic_publish("", q[name], b"m")
    try:
        confirm.basic_publish("amq.direct", "nowhere", b"m", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    plain = publisher.channel()
    plain.basic_publish("amq.direct", "nowhere", b"dropped")
    for _ in range(3):
        plain.basic_publish("", q["work"], b"w", persistent)

    ch = consumer.channel()
    method, _props, _body = ch.basic_get(q["reject"])
    ch.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered (rejected)
    method, _props, _body = ch.basic_get(q["reject"], auto_ack=False)
    ch.basic_nack(method.delivery_tag, requeue=True)  # back, to be redelivered
    ch.basic_get(q["reject"], auto_ack=True)
    ch.basic_get(q["reject"])  # empty now: get_empty
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume(q["work"], lambda *a: None)  # manual ack: 2 stay unacknowledged
    auto = consumer.channel()
    auto.basic_consume(q["auto"], lambda *a: None, auto_ack=True)
    tx = consumer.channel()
    tx.tx_select()
    tx.basic_publish("", q["ready"], b"uncommitted")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        consumer.process_data_events(0.1)
        depth = setup.queue_declare(q["dead"], passive=True).method.message_count
        if depth >= 4:  # rejected 1, expired 1, over the max length 2
            break
    return [publisher, consumer]


def host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 5672
