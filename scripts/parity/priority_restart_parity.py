"""Same client code against Leveret and RabbitMQ: a durable priority queue
(x-max-priority 5) holding 3,000 persistent messages of mixed priorities (some
above 5, some without one), 30 of them delivered (20 acked, 10 left unacked), a
restart; then the count, the delivery order and the redelivered messages. Run
Leveret with a small --queue-ram-messages (100, say) so that every level pages.

    python scripts/parity/priority_restart_parity.py fill URL   # leaves its connection open
    (restart the broker: SIGTERM or SIGKILL for Leveret, rabbitmq.sh stop/start)
    python scripts/parity/priority_restart_parity.py check URL  # prints one JSON line

Run against both brokers; the JSON lines must be equal.
"""

import hashlib
import json
import sys
import time

import pika

Q = "parity.prio"
N = 3000
url = sys.argv[2]
params = pika.URLParameters(url)


def priority(i: int) -> int | None:
    return None if i % 11 == 0 else (i * 7) % 9


if sys.argv[1] == "fill":
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_delete(Q)
    ch.queue_declare(Q, durable=True, arguments={"x-max-priority": 5})
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish(
            "", Q, b"m%d" % i, pika.BasicProperties(delivery_mode=2, priority=priority(i))
        )
    ch.basic_qos(prefetch_count=30)
    tags = []
    for method, _props, _body in ch.consume(Q, inactivity_timeout=10):
        tags.append(method.delivery_tag)
        if len(tags) == 30:
            break
    for tag in tags[:20]:
        ch.basic_ack(tag)
    time.sleep(1.0)
    print("filled; 10 delivered and unacked")
    sys.stdout.flush()
    time.sleep(3600)  # keep the connection open: the broker is restarted underneath it
else:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    count = ch.queue_declare(Q, durable=True, passive=True, arguments={"x-max-priority": 5})
    rows = []
    while True:
        method, _props, body = ch.basic_get(Q, auto_ack=True)
        if method is None:
            break
        rows.append((body.decode(), method.redelivered))
    order = ",".join(b for b, _ in rows).encode()
    print(
        json.dumps(
            {
                "count": count.method.message_count,
                "first": [b for b, _ in rows[:12]],
                "order_sha256": hashlib.sha256(order).hexdigest(),
                "redelivered": [b for b, r in rows if r],
            },
            sort_keys=True,
        )
    )
