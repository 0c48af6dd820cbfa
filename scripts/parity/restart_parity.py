"""Same client code against Leveret and RabbitMQ: persistent messages, some delivered
and not acked, some acked, a restart; then the count, the order and which messages
come back redelivered.

    python scripts/parity/restart_parity.py fill URL    # leaves its connection open
    (restart the broker: SIGTERM or SIGKILL for Leveret, rabbitmq.sh stop/start)
    python scripts/parity/restart_parity.py check URL   # prints one JSON line

Run against both brokers; the JSON lines must be equal.
"""

import json
import sys
import time

import pika

Q = "parity.restart"
url = sys.argv[2]
params = pika.URLParameters(url)
if sys.argv[1] == "fill":
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_delete(Q)
    ch.queue_declare(Q, durable=True)
    ch.confirm_delivery()
    for i in range(3000):
        ch.basic_publish("", Q, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=40)
    got = []
    for method, _props, _body in ch.consume(Q, inactivity_timeout=5):
        got.append(method.delivery_tag)
        if len(got) == 40:
            break
    # ack every other one of the 40 (20 acked, 20 left delivered and unacked)
    for tag in got[::2]:
        ch.basic_ack(tag)
    ch.basic_publish("", Q, b"fence", pika.BasicProperties(delivery_mode=2))  # confirmed
    time.sleep(1.0)  # the ACK and DELIVERED records reach the disk
    print("filled; leaving 20 unacked")
    sys.stdout.flush()
    # keep the connection open: the broker is restarted underneath it
    time.sleep(3600)
else:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ok = ch.queue_declare(Q, durable=True, passive=True)
    rows = []
    while True:
        method, _props, body = ch.basic_get(Q, auto_ack=True)
        if method is None:
            break
        rows.append((body.decode(), method.redelivered))
    redelivered = [b for b, r in rows if r]
    expected = [f"m{i}" for i in range(1, 40, 2)] + [f"m{i}" for i in range(40, 3000)] + ["fence"]
    print(
        json.dumps(
            {
                "count": ok.method.message_count,
                "drained": len(rows),
                "order_as_expected": [b for b, _ in rows] == expected,
                "redelivered_n": sum(r for _, r in rows),
                "redelivered": [b for b, r in rows if r],
            }
        )
    )
