"""Bounded memory: bodies beyond --max-memory-bytes live on disk, and come back intact.

Memory is judged from /proc/PID/status: VmHWM (peak RSS) minus the RSS of the idle
broker, against the bytes of bodies queued. No timing is asserted.
"""

from __future__ import annotations

import time

import pytest
from durability_support import (
    Brokers,
    assert_exit_ok,
    check_body,
    close_quietly,
    fast_consume,
    fast_publish,
    make_body,
    message_count,
    rss_kb,
    segment_files,
    tail,
)

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow]

BUDGET = 5_000_000
MB = 1024 * 1024


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _bodies(count: int, size: int):
    return (make_body(str(i), size) for i in range(count))


def _consume_in_order(broker, queue: str, count: int) -> None:
    expected = 0
    for body, redelivered in fast_consume(broker.port, queue, count):
        tag = check_body(body)  # raises on a corrupt body
        assert tag == str(expected), f"message {expected} came as {tag}"
        assert not redelivered
        expected += 1
    assert expected == count


def _baseline(broker, queue: str) -> int:
    time.sleep(0.3)  # let start-up allocations settle before taking the baseline
    return rss_kb(broker.owner_pid(queue))


def test_persistent_messages_beyond_budget_are_paged(brokers):
    count, size = 200_000, 1024
    broker = brokers.start(name="paging", max_memory_bytes=BUDGET)
    conn = broker.connect()
    conn.channel().queue_declare("paged.q", durable=True)
    close_quietly(conn)
    base = _baseline(broker, "paged.q")

    assert fast_publish(broker.port, "paged.q", _bodies(count, size), persistent=True) == count
    conn = broker.connect()
    assert message_count(conn.channel(), "paged.q") == count
    close_quietly(conn)

    bodies_mb = count * size / MB
    peak_growth_mb = (rss_kb(broker.owner_pid("paged.q"), "VmHWM") - base) / 1024
    growth_mb = (rss_kb(broker.owner_pid("paged.q")) - base) / 1024
    print(f"bodies {bodies_mb:.0f} MB, RSS growth {growth_mb:.0f} MB, peak {peak_growth_mb:.0f} MB")
    # Holding the bodies alone would take ~195 MB (plus per-message bookkeeping).
    assert peak_growth_mb < bodies_mb, (
        f"RSS grew {peak_growth_mb:.0f} MB at peak for {bodies_mb:.0f} MB of bodies with a "
        f"{BUDGET / MB:.0f} MB budget: bodies are not being paged out"
    )
    on_disk = sum(p.stat().st_size for p in segment_files(broker.store_dir("paged.q")))
    assert on_disk >= count * size

    _consume_in_order(broker, "paged.q", count)
    conn = broker.connect()
    assert message_count(conn.channel(), "paged.q") == 0
    close_quietly(conn)
    assert_exit_ok(broker)


def test_transient_messages_beyond_budget_are_paged(brokers):
    count, size = 60_000, 2048
    broker = brokers.start(name="transient-paging", max_memory_bytes=BUDGET)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("paged.transient", durable=False)
    ch.queue_declare("paged.durable-transient", durable=True)
    close_quietly(conn)
    base = _baseline(broker, "paged.transient")

    sent = fast_publish(broker.port, "paged.transient", _bodies(count, size), persistent=False)
    assert sent == count
    peak_growth_mb = (rss_kb(broker.owner_pid("paged.transient"), "VmHWM") - base) / 1024
    bodies_mb = count * size / MB
    print(f"bodies {bodies_mb:.0f} MB, peak RSS growth {peak_growth_mb:.0f} MB")
    assert peak_growth_mb < bodies_mb, (
        f"RSS grew {peak_growth_mb:.0f} MB for {bodies_mb:.0f} MB of transient bodies"
    )
    # The bodies went to the segment log (as records recovery ignores). Transient
    # records are confirmed without waiting for the writer thread, so give it a
    # moment to catch up before reading the file sizes.
    want = count * size - 2 * BUDGET
    deadline = time.monotonic() + 15
    on_disk = 0
    while time.monotonic() < deadline:
        on_disk = sum(p.stat().st_size for p in segment_files(broker.store_dir("paged.transient")))
        if on_disk >= want:
            break
        time.sleep(0.1)
    assert on_disk >= want
    _consume_in_order(broker, "paged.transient", count)

    # Paged transient messages in a durable queue do not come back after a restart.
    more = 20_000
    fast_publish(broker.port, "paged.durable-transient", _bodies(more, size), persistent=False)
    conn = broker.connect()
    assert message_count(conn.channel(), "paged.durable-transient") == more
    close_quietly(conn)
    assert_exit_ok(broker)
    broker.start()
    assert "recovered 0 messages" in broker.run_log(), tail(broker.run_log())
    conn = broker.connect()
    assert message_count(conn.channel(), "paged.durable-transient") == 0
    close_quietly(conn)
    assert_exit_ok(broker)


@pytest.mark.parametrize(
    "arguments",
    [{"x-message-ttl": 600_000}, {"x-max-length": 100_000}, {"x-max-priority": 5}],
    ids=["ttl", "max-length", "priority"],
)
def test_queues_that_cannot_page_drop_bodies_over_budget(brokers, arguments):
    """A queue with TTL, limits or priorities keeps its messages as objects, but over
    the budget their bodies still leave RAM: persistent ones are read back from their
    own records, transient ones from a record written for the purpose. This path once
    failed with an AttributeError that closed the publisher's connection (541)."""
    count, size = 3_000, 4096
    broker = brokers.start(name="cannot-page", max_memory_bytes=1_000_000)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("limited.durable", durable=True, arguments=arguments)
    ch.queue_declare("limited.transient", durable=False, arguments=arguments)
    close_quietly(conn)
    for queue, persistent in (("limited.durable", True), ("limited.transient", False)):
        sent = fast_publish(broker.port, queue, _bodies(count, size), persistent=persistent)
        assert sent == count, f"{queue}: {sent} of {count} confirmed"
        conn = broker.connect()
        assert message_count(conn.channel(), queue) == count
        close_quietly(conn)
        _consume_in_order(broker, queue, count)
    assert "Traceback" not in broker.log(), tail(broker.log())
    assert_exit_ok(broker)
