"""Quorum queues across restarts: every message kept, delivery counts never going back.

After a restart a quorum queue's message counts as delivered as many times as it
went out before: returned ones by their returns, the ones a consumer still held
one more (RabbitMQ counts what a stopped consumer held as returned). Checked
after a clean stop (the clean-shutdown index) and after SIGKILL (the scan).
"""

from __future__ import annotations

import random
import time

import pika
import pytest
from durability_support import (
    PERSISTENT,
    TRANSIENT,
    Brokers,
    check_body,
    close_quietly,
    drain_queue,
    make_body,
)

pytestmark = pytest.mark.leveret_only

Q = "qq.durable"
ARGS = {"x-queue-type": "quorum", "x-delivery-limit": 50}


def _get(ch, expect: bytes):
    method, props, body = ch.basic_get(Q)
    assert body == expect
    return method.delivery_tag, (props.headers or {}).get("x-delivery-count")


def _counts(broker) -> list[tuple[bytes, bool, int]]:
    conn = broker.connect()
    ch = conn.channel()
    out = []
    while True:
        method, props, body = ch.basic_get(Q, auto_ack=True)
        if method is None:
            break
        out.append((body, method.redelivered, props.headers["x-delivery-count"]))
    conn.close()
    return out


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_delivery_counts_and_transient_messages_survive(tmp_path, how):
    with Brokers(tmp_path) as brokers:
        broker = brokers.start(name="qq")
        conn = broker.connect()
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=ARGS)
        ch.confirm_delivery()
        for i in range(6):
            props = TRANSIENT if i == 4 else PERSISTENT
            ch.basic_publish("", Q, b"m%d" % i, props)
        ch.basic_ack(_get(ch, b"m0")[0])  # gone for good
        holder1, holder2 = broker.connect().channel(), broker.connect().channel()
        assert _get(holder1, b"m1")[1] == 0  # held at the stop: delivered once
        for count in (0, 1):  # m2: returned twice (to the front: a delivery limit is set)
            tag, seen = _get(ch, b"m2")
            assert seen == count
            ch.basic_nack(tag, requeue=True)
        assert _get(holder2, b"m2")[1] == 2  # and held: three deliveries
        tag, _ = _get(ch, b"m3")
        ch.basic_nack(tag, requeue=True)  # m3: returned once
        # A confirmed publish after all that: the log is written in order, so every
        # record before it is on disk once it is confirmed.
        ch.queue_declare("fence", durable=True)
        ch.basic_publish("", "fence", b"fence", PERSISTENT)
        if how == "sigkill":
            broker.kill()
        else:
            close_quietly(conn)
            broker.stop()
        broker.start()
        assert _counts(broker) == [
            (b"m1", True, 1),
            (b"m2", True, 3),
            (b"m3", True, 1),
            (b"m4", False, 0),
            (b"m5", False, 0),
        ]


def test_a_count_keeps_growing_over_several_restarts(tmp_path):
    with Brokers(tmp_path) as brokers:
        broker = brokers.start(name="qq")
        conn = broker.connect()
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=ARGS)
        ch.confirm_delivery()
        ch.basic_publish("", Q, b"poison", PERSISTENT)
        conn.close()
        seen = []
        for _round in range(3):
            conn = broker.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("fence", durable=True)
            for _ in range(2):
                method, props, _body = ch.basic_get(Q)
                seen.append((props.headers or {})["x-delivery-count"])
                ch.basic_nack(method.delivery_tag, requeue=True)
            method, props, _body = ch.basic_get(Q)  # held when the broker dies
            seen.append(props.headers["x-delivery-count"])
            ch.basic_publish("", "fence", b"", PERSISTENT)  # the records before it are on disk
            broker.kill()
            broker.start()
        assert seen == list(range(9))
        [(_body, redelivered, count)] = _counts(broker)
        assert (redelivered, count) == (True, 9)


@pytest.mark.soak
def test_at_least_once_dead_lettering_loses_nothing_on_sigkill(tmp_path, soak_rounds):
    """Messages rejected out of a quorum queue with at-least-once dead-lettering, SIGKILL
    in the middle: after the restart each is in the source or in the target (or both:
    at least once), never in neither."""
    rnd = random.Random()
    with Brokers(tmp_path) as brokers:
        broker = brokers.start(name="alo")
        for round_no in range(soak_rounds):
            source, target = f"alo.src.{round_no}", f"alo.dst.{round_no}"
            conn = broker.connect()
            ch = conn.channel()
            ch.exchange_declare("alo.dlx", "fanout", durable=True)
            ch.queue_declare(target, durable=True, arguments={"x-queue-type": "quorum"})
            ch.queue_bind(target, "alo.dlx")
            ch.queue_declare(
                source,
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-dead-letter-exchange": "alo.dlx",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            )
            if round_no:
                ch.queue_unbind(f"alo.dst.{round_no - 1}", "alo.dlx")
            ch.confirm_delivery()
            tags = [f"{round_no}-{i}" for i in range(1000)]
            for tag in tags:
                ch.basic_publish("", source, make_body(tag, 500), PERSISTENT)
            ch.basic_qos(prefetch_count=50)

            def reject(channel, method, _props, _body):
                channel.basic_reject(method.delivery_tag, requeue=False)

            ch.basic_consume(source, reject)
            deadline = time.monotonic() + rnd.uniform(0.0, 0.15)
            while time.monotonic() < deadline:
                conn.process_data_events(0.01)
            broker.kill()
            broker.start()
            conn = broker.connect()
            ch = conn.channel()
            left = [check_body(b) for b, _r, _p in drain_queue(ch, source)]
            moved = [check_body(b) for b, _r, _p in drain_queue(ch, target)]
            conn.close()
            missing = set(tags) - set(left) - set(moved)
            assert not missing, f"round {round_no}: lost {sorted(missing)[:10]}..."
            print(f"round {round_no}: {len(moved)} dead-lettered, {len(left)} left")


def _run(broker, fn):
    """Run `fn()` on the embedded broker's loop (the model is not thread-safe)."""
    import asyncio

    async def call():
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), broker.loop).result(10)


def test_default_queue_type_and_quorum_queues_survive_a_restart_and_a_definitions_round_trip(
    tmp_path,
):
    from leveret.broker.definitions_json import export_definitions, import_definitions
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    config = ServerConfig(port=0, persistence=True, data_dir=str(tmp_path / "data"))
    args = {"x-queue-type": "quorum", "x-delivery-limit": 3}
    for start in range(2):
        with embedded_broker(config) as broker:
            if start == 0:
                broker.admin.add_vhost("qv", default_queue_type="quorum")
                broker.admin.set_permissions("guest", "qv", ".*", ".*", ".*")
                conn = pika.BlockingConnection(
                    pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{broker.port}/qv")
                )
                ch = conn.channel()
                ch.queue_declare("by-default", durable=True)
                ch.queue_declare("classic", durable=True, arguments={"x-queue-type": "classic"})
                ch.queue_declare("explicit", durable=True, arguments=args)
                conn.close()
            vhost = broker.server.broker.vhosts["qv"]
            types = {name: q.queue_type for name, q in vhost.queues.items()}
            assert types == {"by-default": "quorum", "classic": "classic", "explicit": "quorum"}
            assert vhost.default_queue_type == "quorum"
            doc = _run(broker, lambda b=broker: export_definitions(b.server.broker))
    [meta] = [v["metadata"] for v in doc["vhosts"] if v["name"] == "qv"]
    assert meta["default_queue_type"] == "quorum"
    [explicit] = [q for q in doc["queues"] if q["name"] == "explicit"]
    assert explicit["arguments"] == args
    with embedded_broker(ServerConfig(port=0, persistence=False)) as other:
        _run(other, lambda: import_definitions(other.server.broker, doc))
        vhost = other.server.broker.vhosts["qv"]
        assert vhost.default_queue_type == "quorum"
        types = {name: q.queue_type for name, q in vhost.queues.items()}
        assert types == {"by-default": "quorum", "classic": "classic", "explicit": "quorum"}
