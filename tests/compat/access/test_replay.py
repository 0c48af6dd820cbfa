"""Replay the access-control cases recorded from RabbitMQ 3.10 against Leveret.

One in-process broker serves every case (each case makes and deletes its own vhost
and users). Record again with `python -m tests.compat.access.record` (record.py);
list the differences with `python -m tests.compat.access.replay --all`.
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
def runner():
    with leveret() as r:
        yield r


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_answers_as_rabbitmq(runner, name):
    case = BY_NAME[name]
    assert recording(name)["steps"] == jsonable(case["steps"]), "the case changed: record it"
    left, _used = split_allowed(replay_case(runner, case), ALLOWED)
    assert left == []


def test_every_case_is_recorded():
    assert {path.stem for path in RECORDINGS.glob("*.json")} == set(BY_NAME)


def test_every_allowed_difference_is_still_one(runner):
    """An entry that allows nothing any more must go."""
    for entry in ALLOWED:
        _left, used = split_allowed(replay_case(runner, BY_NAME[entry.case]), [entry])
        assert used == {entry}, f"{entry.case} {entry.path} no longer differs: drop it"
