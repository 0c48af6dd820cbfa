"""Replay the shovel and federation cases recorded from RabbitMQ 3.10.8 against Leveret.

One in-process broker serves every case (each case deletes what it made). Record
again with `python -m tests.compat.plugins.record` (record.py); list the differences
with `python -m tests.compat.plugins.replay --all`.
"""

from __future__ import annotations

import pytest

from ..common import split_allowed
from .allowed import ALLOWED
from .cases import CASES
from .record import RECORDINGS, jsonable
from .replay import leveret, recording, replay_case

BY_NAME = {case["name"]: case for case in CASES}


@pytest.fixture(scope="module")
def driver():
    with leveret() as d:
        yield d


@pytest.fixture(scope="module")
def differences(driver):
    return {name: replay_case(driver, case) for name, case in BY_NAME.items()}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_answers_as_rabbitmq(differences, name):
    assert recording(name)["steps"] == jsonable(BY_NAME[name]["steps"]), (
        "the case changed: record it"
    )
    left, _used = split_allowed(differences[name], ALLOWED)
    assert [str(d) for d in left] == []


def test_every_case_is_recorded():
    assert {path.stem for path in RECORDINGS.glob("*.json")} == set(BY_NAME)


def test_every_allowed_difference_is_still_one(differences):
    """An entry that allows nothing any more must go."""
    everything = [d for diffs in differences.values() for d in diffs]
    _left, used = split_allowed(everything, ALLOWED)
    assert [e for e in ALLOWED if e not in used] == []
