"""The Eclipse Paho interoperability suite against Leveret: at least RabbitMQ's passes.

tests/compat/mqtt/paho_rabbitmq.json records which of the suite's tests RabbitMQ
3.10.8 passes (MQTT 3.1.1: `client_test.py`; MQTT 5.0: `client_test5.py`, which
RabbitMQ 3.10 fails entirely: it has no MQTT 5). Each test RabbitMQ passes, and each
one LEVERET_PASSES names besides, is run here against a Leveret subprocess with an
MQTT listener on a free port and must pass. Every other test of the suite has its
line in docs/differences.md (`mqtt-paho`) saying why Leveret fails it.

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
DIFFERENCES = Path(__file__).resolve().parents[2] / "docs" / "differences.md"
RABBITMQ = json.loads(RECORDED.read_text())
PASSED_BY_RABBITMQ = [
    (suite, test)
    for suite, outcomes in sorted(RABBITMQ["suites"].items())
    for test, outcome in sorted(outcomes.items())
    if outcome == "pass"
]
#: the tests Leveret passes (at least RabbitMQ's); docs/differences.md says why not the rest
LEVERET_PASSES: dict[str, set[str]] = {
    "3.1.1": {
        "test_dollar_topics",
        "test_keepalive",
        "test_unsubscribe",
        "test_zero_length_clientid",
    },
    "5": {
        "test_assigned_clientid",
        "test_client_topic_alias",
        "test_dollar_topics",
        "test_flow_control1",
        "test_keepalive",
        "test_maximum_packet_size",
        "test_request_response",
        "test_session_expiry",
        "test_subscribe_identifiers",
        "test_unsubscribe",
        "test_will_delay",
        "test_will_message",
        "test_zero_length_clientid",
    },
}
EXPECTED = sorted(
    set(PASSED_BY_RABBITMQ) | {(s, t) for s, tests in LEVERET_PASSES.items() for t in tests}
)


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
@pytest.mark.parametrize(("suite", "test"), EXPECTED, ids=[f"{s}-{t}" for s, t in EXPECTED])
def test_passes_what_rabbitmq_passes_and_more(paho_root, broker, suite, test):
    details: dict[str, str] = {}
    outcomes = run_suite(paho_root, suite, broker.host, broker.mqtt_port, only=test,
                         details=details)  # fmt: skip
    assert outcomes == {test: "pass"}, details


def test_recording_lists_the_suite(paho_root):
    """The recording names every test of the checkout (a new checkout: record again)."""
    for suite, outcomes in RABBITMQ["suites"].items():
        assert sorted(outcomes) == sorted(list_tests(paho_root, suite, "127.0.0.1", 1))


def test_leveret_passes_at_least_what_rabbitmq_passes():
    for suite, test in PASSED_BY_RABBITMQ:
        assert test in LEVERET_PASSES[suite], (suite, test)


def test_every_test_leveret_fails_is_documented(paho_root):
    """docs/differences.md has a line for each test of the suite outside LEVERET_PASSES
    (`| 5 `test_x` | why |`), and none for a test Leveret passes."""
    text = DIFFERENCES.read_text()
    section = text[text.index('<a id="mqtt-paho"></a>') :]
    section = section[: section.find("\n## ")]
    for suite in RABBITMQ["suites"]:
        for test in list_tests(paho_root, suite, "127.0.0.1", 1):
            line = f"| {suite} `{test}` |"
            if test in LEVERET_PASSES[suite]:
                assert line not in section, f"{line} is passed: take its line out"
            else:
                assert line in section, f"no line in docs/differences.md for {line}"
