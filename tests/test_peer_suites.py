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
