"""Replay the management API table recorded from RabbitMQ 3.10.8 against Leveret.

Any difference fails unless allowed (allowed.py, with its docs/differences.md entry) or
listed as a known gap not yet closed (known_gaps.txt); a known gap that no longer
differs fails too, so the list only shrinks (`python -m tests.compat.http.replay
--update-gaps` rewrites it).
"""

from __future__ import annotations

import pytest

from ..common import split_allowed
from .allowed import ALLOWED
from .replay import gap_key, known_gaps, leveret, replay


@pytest.fixture(scope="module")
def differences():
    with leveret() as target:
        expected, diffs = replay(target)
    assert expected, "no recordings"
    return diffs


def test_every_difference_is_allowed_or_a_known_gap(differences):
    left, _used = split_allowed(differences, ALLOWED)
    gaps = known_gaps()
    new = [str(d) for d in left if gap_key(d) not in gaps]
    assert not new, "differences from RabbitMQ 3.10.8:\n" + "\n".join(new[:50])


def test_known_gaps_are_still_gaps(differences):
    left, _used = split_allowed(differences, ALLOWED)
    current = {gap_key(d) for d in left}
    closed = sorted(known_gaps() - current)
    assert not closed, "closed gaps still in known_gaps.txt (run --update-gaps):\n" + "\n".join(
        closed[:50]
    )


def test_every_allowed_entry_is_used(differences):
    _left, used = split_allowed(differences, ALLOWED)
    assert set(ALLOWED) == used
