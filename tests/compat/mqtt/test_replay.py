"""Replay the MQTT scenarios recorded from RabbitMQ 3.10's MQTT plugin against Leveret.

These tests start `python -m leveret server` with `--mqtt-port` and
`--web-mqtt-port` (Leveret's MQTT listeners). A server that does not start fails
every replay test at setup with its own output; none is skipped.

One Leveret subprocess (free ports, a fresh data directory) serves every scenario;
each scenario makes and removes its own sessions, users and vhosts. Record again with
`python -m tests.compat.mqtt.record`; list the differences with
`python -m tests.compat.mqtt.replay --all` (`--target rabbitmq` checks that the
scenarios replay identically on the reference itself).
"""

from __future__ import annotations

import pytest

from ..common import split_allowed
from .allowed import ALLOWED
from .record import RECORDINGS
from .replay import recording, replay_case
from .scenarios import SCENARIOS, about
from .target import leveret


@pytest.fixture(scope="module")
def target():
    failure = None
    try:
        with leveret() as t:
            yield t
    except RuntimeError as exc:
        failure = f"Leveret with an MQTT listener did not start: {exc}"
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_answers_as_rabbitmq(target, name):
    diffs = replay_case(target, name)
    left, used = split_allowed(diffs, ALLOWED)
    assert left == [], "\n".join(str(d) for d in left)
    stale = [a for a in ALLOWED if a.case == name and a not in used]
    assert stale == [], f"allowed differences that no longer occur: drop them: {stale}"


def test_every_scenario_is_recorded():
    assert {path.stem for path in RECORDINGS.glob("*.json")} == set(SCENARIOS)
    changed = [n for n in SCENARIOS if recording(n)["about"] != about(n)]
    assert changed == [], f"scenarios changed since recorded: record them again: {changed}"


def test_allowed_entries_name_scenarios():
    assert [a.case for a in ALLOWED if a.case not in SCENARIOS] == []
