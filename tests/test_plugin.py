"""The leveret pytest plugin, as a user of the package would use it."""

from __future__ import annotations

import pika
import pytest

pytestmark = pytest.mark.leveret_only

pytest_plugins = ["pytester"]


def test_leveret_broker_fixture(leveret_broker):
    """What a user writes: the fixture is an AMQP URL of a fresh broker."""
    assert leveret_broker.startswith("amqp://")
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker))
    try:
        ch = conn.channel()
        ch.queue_declare("jobs")
        ch.basic_publish("", "jobs", b"job-1")
        method, _props, body = ch.basic_get("jobs", auto_ack=True)
        assert body == b"job-1"
    finally:
        conn.close()


def test_leveret_embedded_fixture(leveret_embedded):
    assert leveret_embedded.port > 0
    assert str(leveret_embedded.port) in leveret_embedded.url


def test_embedded_broker_context_manager():
    from leveret.testing import embedded_broker

    with embedded_broker() as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().queue_declare("", exclusive=True)
        conn.close()


def test_each_test_gets_a_fresh_broker(pytester):
    pytester.makepyfile(
        """
        import pika

        def _declare_count(url):
            conn = pika.BlockingConnection(pika.URLParameters(url))
            try:
                ch = conn.channel()
                ok = ch.queue_declare("shared-name")
                ch.basic_publish("", "shared-name", b"x")
                return ok.method.message_count
            finally:
                conn.close()

        def test_first(leveret_broker):
            assert _declare_count(leveret_broker) == 0

        def test_second(leveret_broker):
            # a new broker: the message published by test_first is not here
            assert _declare_count(leveret_broker) == 0
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
