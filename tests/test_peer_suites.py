"""py-amqp's and kombu's own integration suites, run against a fresh Leveret.

The suites come pinned from PyPI (tests/peers/suites.py).  The only failures
allowed are those listed in that file as failing against RabbitMQ 3.10.8 too
(py-amqp's TLS tests, which need a TLS listener with the suite's certificates).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "peers"))

import suites  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.leveret_only, pytest.mark.timeout(600)]


@pytest.mark.parametrize("suite", suites.SUITES, ids=lambda s: s.package)
def test_client_suite_passes_against_leveret(suite):
    with suites.leveret_broker() as (host, port):
        result = suites.run_suite(suite, host, port, "Leveret")
    assert result.unexpected(suite) == []
    # A suite that silently ran nothing would pass the line above.
    assert result.passed >= {"amqp": 48, "kombu": 51}[suite.package]


def test_amqplib_suite_passes_against_leveret():
    """Node amqplib 0.10.9's channel_api, callback_api and connect tests (76), as
    against RabbitMQ 3.10.8 (75 pass there; the ipv6 test needs a broker on
    [::1]:5672). Leveret differs in one more: serverProperties asserts the product is
    'RabbitMQ'. A frame after a channel's close-ok makes amqplib print "Frame on
    unknown channel" without failing a test, so that is checked as well."""
    import node_amqplib

    if not node_amqplib.node_available():
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed (scripts/install-test-deps.sh installs them)")
        pytest.skip("node and npm are not installed")
    with suites.leveret_broker() as (host, port):
        result = node_amqplib.run(host, port, "Leveret")
    assert result.unexpected(leveret=True) == [], result.failed
    assert result.unknown_channel_frames == 0
    assert result.passed >= 74
