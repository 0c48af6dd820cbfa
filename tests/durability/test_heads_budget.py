"""One RAM budget for all queues' heads (--queue-ram-bytes), and paging with deduplication.

Many long queues must not each keep --queue-ram-messages entries as objects: past
the shared budget every queue longer than one refill batch keeps new messages as
their places on disk. The broker runs in-process so that the store's own accounting
(`heads_used`) and each queue's head and paged tail can be read exactly; messages
still go through real pika connections.
"""

from __future__ import annotations

import pika
import pytest

from leveret.config import ServerConfig
from leveret.persistence.durable_state import ENTRY_OVERHEAD, HEADS_CHECK_FROM
from leveret.testing import EmbeddedBroker

pytestmark = pytest.mark.leveret_only

QUEUES = 20
PER_QUEUE = 1500
BUDGET = 1_000_000  # bytes: about 2,400 entries of 16 B for all 20 queues together


@pytest.fixture
def broker(tmp_path):
    config = ServerConfig(
        port=0,
        data_dir=str(tmp_path / "data"),
        fsync="never",
        queue_ram_bytes=BUDGET,
        queue_ram_messages=100_000,  # so only the shared budget pages
    )
    b = EmbeddedBroker(config).start()
    yield b
    b.stop()


def _queues(b: EmbeddedBroker) -> list:
    vhost = b.server.broker.vhosts["/"]
    return [vhost.queues[f"hb.{i}"] for i in range(QUEUES)]


def _head_costs(b: EmbeddedBroker) -> list[int]:
    return b.call(lambda: [q.ready.head_cost(ENTRY_OVERHEAD) for q in _queues(b)])


def test_long_queues_share_one_budget_and_come_back_in_order(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    for i in range(QUEUES):
        ch.queue_declare(f"hb.{i}", durable=True)
    ch.confirm_delivery()
    for n in range(PER_QUEUE):
        for i in range(QUEUES):
            ch.basic_publish("", f"hb.{i}", f"{i}:{n:06d}".encode().ljust(16, b"."))
    heads = _head_costs(broker)
    paged = broker.call(lambda: [q.ready.paged for q in _queues(broker)])
    state = broker.server.durable_state
    # Spent; then each queue kept its first HEADS_CHECK_FROM, and its figure lags by 64.
    slack = QUEUES * (HEADS_CHECK_FROM + 64) * (ENTRY_OVERHEAD + 16)  # floor, and lag
    assert sum(heads) <= BUDGET + slack, (sum(heads), heads)
    assert state.heads_used >= BUDGET * 0.9
    assert all(p > 0 for p in paged), paged  # every queue paged, not one queue alone
    assert sum(paged) + sum(h // (ENTRY_OVERHEAD + 16) for h in heads) == QUEUES * PER_QUEUE
    # Everything comes back, in order, head then tail.
    for i in range(QUEUES):
        got = []
        for _method, _props, body in ch.consume(f"hb.{i}", auto_ack=True, inactivity_timeout=5):
            if body is None:
                break
            got.append(body)
            if len(got) == PER_QUEUE:
                break
        ch.cancel()
        assert got == [f"{i}:{n:06d}".encode().ljust(16, b".") for n in range(PER_QUEUE)]
    conn.close()


def test_a_queue_shorter_than_a_refill_batch_never_pages_for_the_budget(tmp_path):
    config = ServerConfig(port=0, data_dir=str(tmp_path / "d"), fsync="never", queue_ram_bytes=1)
    b = EmbeddedBroker(config).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("short", durable=True)
        ch.confirm_delivery()
        for n in range(HEADS_CHECK_FROM + 10):
            ch.basic_publish("", "short", str(n).encode())
        ready = b.call(lambda: b.server.broker.vhosts["/"].queues["short"].ready)
        assert ready.paged == 10  # the first HEADS_CHECK_FROM stayed objects
        conn.close()
    finally:
        b.stop()


def test_a_deduplicating_queue_pages_and_still_drops_duplicates(tmp_path):
    config = ServerConfig(
        port=0, data_dir=str(tmp_path / "d"), fsync="never", queue_ram_messages=50
    )
    b = EmbeddedBroker(config).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("dq", durable=True, arguments={"x-message-deduplication": True})
        ch.confirm_delivery()

        def pub(ident: str) -> None:
            props = pika.BasicProperties(headers={"x-deduplication-header": ident})
            ch.basic_publish("", "dq", ident.encode(), props)

        for n in range(300):
            pub(f"id{n}")
        queue = b.call(lambda: b.server.broker.vhosts["/"].queues["dq"])
        assert b.call(lambda: queue.ready.paged) == 250  # past 50 ready: places on disk
        for n in (0, 10, 120, 299):  # duplicates of messages in the head and in the tail
            pub(f"id{n}")
        assert b.call(lambda: queue.ready.n) == 300
        got = []
        for _m, _p, body in ch.consume("dq", auto_ack=True, inactivity_timeout=5):
            if body is None:
                break
            got.append(body)
            if len(got) == 300:
                break
        ch.cancel()
        assert got == [f"id{n}".encode() for n in range(300)]
        # Consumed (paged ones included): their ids are forgotten, so they may come again.
        pub("id200")
        assert b.call(lambda: queue.ready.n) == 1
        # A purge reads the paged messages back and forgets their ids too.
        for n in range(300, 500):
            pub(f"id{n}")
        assert b.call(lambda: queue.ready.paged) > 0
        assert ch.queue_purge("dq").method.message_count == 201
        pub("id400")
        assert b.call(lambda: queue.ready.n) == 1
        conn.close()
    finally:
        b.stop()
