"""Replay the Prometheus families recorded from RabbitMQ 3.10 against Leveret.

The same workload (workload.py) runs on an in-process Leveret; every endpoint's
family names, types and label names must be RabbitMQ's, or allowed in allowed.py.
Record again with `python -m tests.compat.prometheus.record`; list the differences
with `python -m tests.compat.prometheus.replay --all`.
"""

from __future__ import annotations

import pytest

from ..common import split_allowed
from .allowed import ALLOWED
from .replay import differences, leveret_scrape, recording


@pytest.fixture(scope="module")
def diffs():
    with leveret_scrape() as actual:
        return differences(recording(), actual)


def test_families_types_and_labels_are_rabbitmqs(diffs):
    left, _used = split_allowed(diffs, ALLOWED)
    assert left == [], "\n".join(str(d) for d in left)


def test_every_allowed_difference_is_still_one(diffs):
    _left, used = split_allowed(diffs, ALLOWED)
    assert set(ALLOWED) == used, [f"{a.case} {a.kind} {a.path}" for a in ALLOWED if a not in used]
