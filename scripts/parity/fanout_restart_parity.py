"""Same client code against Leveret and RabbitMQ: persistent messages through a
fanout exchange into three durable queues, each consumed differently (all acked,
half acked, ten delivered and not acked), a restart; then each queue's count,
order and redelivered messages. Leveret writes such a message once for all three
queues (a FANOUT record); each queue must still come back on its own.

    python scripts/parity/fanout_restart_parity.py fill URL   # leaves its connection open
    (restart the broker: SIGTERM or SIGKILL for Leveret, rabbitmq.sh stop/start)
    python scripts/parity/fanout_restart_parity.py check URL  # prints one JSON line

Run against both brokers; the JSON lines must be equal.
"""

import json
import sys
import time

import pika

EX = "parity.fan"
QUEUES = ["parity.fan.a", "parity.fan.b", "parity.fan.c"]
N = 2000
PERSISTENT = pika.BasicProperties(delivery_mode=2)
url = sys.argv[2]
params = pika.URLParameters(url)
if sys.argv[1] == "fill":
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_delete(EX)
    ch.exchange_declare(EX, "fanout", durable=True)
    for q in QUEUES:
        ch.queue_delete(q)
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, EX)
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish(EX, "", b"m%d" % i, PERSISTENT)
    a, b, c = QUEUES
    while (got := ch.basic_get(a, auto_ack=False))[0] is not None:
        ch.basic_ack(got[0].delivery_tag)
    for _ in range(N // 2):
        ch.basic_ack(ch.basic_get(b, auto_ack=False)[0].delivery_tag)
    for _ in range(10):
        ch.basic_get(c, auto_ack=False)  # delivered, never acked
    ch.basic_publish("", a, b"fence", PERSISTENT)  # confirmed: what came before is on disk
    time.sleep(1.0)
    print("filled; queue c has 10 unacked")
    sys.stdout.flush()
    time.sleep(3600)  # keep the connection open: the broker is restarted underneath it
else:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    result = {}
    for q in QUEUES:
        count = ch.queue_declare(q, durable=True, passive=True).method.message_count
        rows = []
        while True:
            method, _props, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            rows.append((body.decode(), method.redelivered))
        result[q] = {
            "count": count,
            "first": rows[0][0] if rows else None,
            "last": rows[-1][0] if rows else None,
            "in_order": [int(b[1:]) for b, _ in rows if b != "fence"]
            == sorted(int(b[1:]) for b, _ in rows if b != "fence"),
            "redelivered": [b for b, r in rows if r],
        }
    print(json.dumps(result, sort_keys=True))
