"""The Eclipse Paho interoperability suite against Leveret: at least RabbitMQ's passes.

tests/compat/mqtt/paho_rabbitmq.json records which of the suite's tests RabbitMQ
3.10.8 passes (MQTT 3.1.1: `client_test.py`; MQTT 5.0: `client_test5.py`, which
RabbitMQ 3.10 fails entirely: it has no MQTT 5). Each test RabbitMQ passes is run
here against a Leveret subprocess with an MQTT listener on a free port and must pass.

The suite is fetched code and never committed: its checkout comes from
`LEVERET_PAHO_DIR` or the git mirror (tests/mqtt_interop/paho.py says how). These
tests skip only when that checkout is unavailable, saying so; a server that does not
start fails them at setup with its message.

The whole suite, with every test's outcome, runs from the command line:
`python -m tests.mqtt_interop.paho --port MQTT_PORT --details`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.mqtt.target import leveret

from .paho import Unavailable, checkout, list_tests, run_suite

RECORDED = Path(__file__).resolve().parents[1] / "compat" / "mqtt" / "paho_rabbitmq.json"
RABBITMQ = json.loads(RECORDED.read_text())
PASSED_BY_RABBITMQ = [
    (suite, test)
    for suite, outcomes in sorted(RABBITMQ["suites"].items())
    for test, outcome in sorted(outcomes.items())
    if outcome == "pass"
]


@pytest.fixture(scope="module")
def paho_root():
    try:
        with checkout() as (root, _commit):
            yield root
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def broker(paho_root):
    failure = None
    try:
        with leveret() as target:
            yield target
    except RuntimeError as exc:
        failure = f"Leveret with an MQTT listener did not start: {exc}"
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("suite", "test"), PASSED_BY_RABBITMQ, ids=[f"{s}-{t}" for s, t in PASSED_BY_RABBITMQ]
)
def test_passes_what_rabbitmq_passes(paho_root, broker, suite, test):
    details: dict[str, str] = {}
    outcomes = run_suite(paho_root, suite, broker.host, broker.mqtt_port, only=test,
                         details=details)  # fmt: skip
    assert outcomes == {test: "pass"}, details


def test_recording_lists_the_suite(paho_root):
    """The recording names every test of the checkout (a new checkout: record again)."""
    for suite, outcomes in RABBITMQ["suites"].items():
        assert sorted(outcomes) == sorted(list_tests(paho_root, suite, "127.0.0.1", 1))
