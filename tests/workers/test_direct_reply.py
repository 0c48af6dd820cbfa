"""Direct reply-to across workers: the requester's connection (consuming
`amq.rabbitmq.reply-to`) on one worker, the responder that publishes the reply on
another (tests/workers/inprocess.py pins each connection to its worker's port).
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from workers.inprocess import in_process_workers
from workers.placing import place


@pytest.fixture
def workers():
    with in_process_workers(2) as w:
        yield w


def pump_until(conns: list[pika.BlockingConnection], done: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(0.02)


@pytest.mark.parametrize("requester", [0, 1])
def test_reply_reaches_the_requester_on_another_worker(workers, requester: int) -> None:
    w = workers
    responder = 1 - requester
    rpc = place(w, responder, "rpc")
    req_conn = pika.BlockingConnection(pika.URLParameters(w.url(requester)))
    resp_conn = pika.BlockingConnection(pika.URLParameters(w.url(responder)))
    try:
        req = req_conn.channel()
        resp = resp_conn.channel()
        replies: list[tuple[str, bytes, bool]] = []
        req.basic_consume(
            "amq.rabbitmq.reply-to",
            lambda ch, m, p, b: replies.append((p.correlation_id, b, m.redelivered)),
            auto_ack=True,
        )
        reply_names: list[str] = []

        def serve(ch: Any, method: Any, props: Any, body: bytes) -> None:
            reply_names.append(props.reply_to)
            ch.basic_publish(
                "",
                props.reply_to,
                str(int(body) * 2).encode(),
                pika.BasicProperties(correlation_id=props.correlation_id),
            )
            ch.basic_ack(method.delivery_tag)

        resp.basic_consume(rpc, serve)
        for i in range(20):
            req.basic_publish(
                "",
                rpc,
                str(i).encode(),
                pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=f"c{i}"),
            )
        pump_until([req_conn, resp_conn], lambda: len(replies) >= 20)
        # every reply, in the order the responder sent them
        assert replies == [(f"c{i}", str(i * 2).encode(), False) for i in range(20)]
        assert all(n.startswith(f"amq.rabbitmq.reply-to.{requester}.") for n in reply_names)

        # a reply to a channel that has gone is dropped, the responder's channel stays open
        name = reply_names[0]
        req_conn.close()
        resp.basic_publish("", name, b"late", pika.BasicProperties(correlation_id="late"))
        resp.confirm_delivery()
        resp.basic_publish("", name, b"late", mandatory=False)
        assert resp.is_open
    finally:
        if req_conn.is_open:
            req_conn.close()
        resp_conn.close()


def test_reply_to_a_worker_name_that_does_not_exist_is_dropped(workers) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(workers.url(0)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        # worker 7 of 2, and a name without a worker: nobody waits for them
        ch.basic_publish("", "amq.rabbitmq.reply-to.7.abc", b"x")
        ch.basic_publish("", "amq.rabbitmq.reply-to.abc", b"x")
        returned: list[bytes] = []
        ch.add_on_return_callback(lambda c, m, p, b: returned.append(b))
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", "amq.rabbitmq.reply-to.0.abc", b"m", mandatory=True)
        assert ch.is_open
    finally:
        conn.close()
