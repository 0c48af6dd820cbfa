"""Replay every recorded AMQP scenario against an in-process Leveret.

A scenario's record (tests/compat/amqp/recordings/) is what RabbitMQ 3.10.8 answered;
any difference fails unless allowed.py names it. A scenario with no recording fails
too: record it (python -m tests.compat.amqp.record ...).
"""

from __future__ import annotations

import fnmatch

import pytest

from ..common import split_allowed
from .allowed import ALLOWED
from .runner import compare, discover, load_recording, run
from .target import leveret_target

SCENARIOS = discover()


@pytest.fixture(scope="module")
def target():
    with leveret_target() as t:
        yield t


_USED: set = set()  # allow-list entries that allowed something, over the whole run
_RAN: set[str] = set()


@pytest.mark.parametrize("sid", list(SCENARIOS))
def test_scenario_matches_rabbitmq(target, sid):
    sc = SCENARIOS[sid]
    expected = load_recording(sc)
    assert expected is not None, f"{sid} is not recorded: run tests.compat.amqp.record"
    actual = run(target, sc, expected)
    assert "error" not in actual, actual["error"]
    left, used = split_allowed(compare(sid, expected, actual), ALLOWED)
    _USED.update(used)
    _RAN.add(sid)
    assert left == [], "\n".join(map(str, left))


def test_no_stale_allow_entries():
    """Runs after the scenarios (file order): an entry nothing needed is stale."""
    if _RAN != set(SCENARIOS):
        pytest.skip("not every scenario ran in this session (-k?)")
    stale = [a for a in ALLOWED if a not in _USED]
    assert stale == [], f"allow-list entries that allow nothing: {stale}"


def test_every_allow_entry_names_a_scenario():
    for entry in ALLOWED:
        assert any(fnmatch.fnmatchcase(sid, entry.case) for sid in SCENARIOS), entry


def test_masking_of_generated_names():
    from .runner import Placeholders

    names = Placeholders()
    text = "no queue 'amq.gen-AbC_1' for amq.ctag-x1 and amq.gen-AbC_1, amq.gen-Z"
    assert names.sub(text) == "no queue '{gen1}' for {ctag1} and {gen1}, {gen2}"
