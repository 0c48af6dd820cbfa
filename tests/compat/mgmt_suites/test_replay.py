"""Replay RabbitMQ's own management test suites (translated to scenarios, answers
recorded from RabbitMQ 3.10.8) against Leveret.

A difference fails unless allowed (allowed.py, with its docs/differences.md entry) or
listed in known_gaps.txt, the differences found and not yet closed; a known gap that no
longer differs fails too, so the list only shrinks (`python -m
tests.compat.mgmt_suites.replay --update-gaps` rewrites it).
"""

from __future__ import annotations

import pytest

from ..common import split_allowed
from ..http.allowed import ALLOWED as HTTP_ALLOWED
from .allowed import ALLOWED
from .replay import gap_key, known_gaps, leveret, replay


@pytest.fixture(scope="module")
def differences():
    with leveret() as target:
        recorded, diffs = replay(target)
    assert all(recorded.values()), "a suite has no recordings"
    return diffs


def _left(differences):
    left, used = split_allowed(differences, ALLOWED + HTTP_ALLOWED)
    return left, used


def test_every_difference_is_allowed_or_a_known_gap(differences):
    left, _used = _left(differences)
    gaps = known_gaps()
    new = [str(d) for d in left if gap_key(d) not in gaps]
    assert not new, "differences from RabbitMQ 3.10.8:\n" + "\n".join(new[:50])


def test_known_gaps_are_still_gaps(differences):
    left, _used = _left(differences)
    current = {gap_key(d) for d in left}
    closed = sorted(known_gaps() - current)
    assert not closed, "closed gaps still in known_gaps.txt (run --update-gaps):\n" + "\n".join(
        closed[:50]
    )


def test_every_allowed_entry_is_used(differences):
    _left_, used = _left(differences)
    assert set(ALLOWED) <= used
