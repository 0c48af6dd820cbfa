"""Replay the access-control cases recorded from RabbitMQ 3.10 against Leveret.

One in-process broker serves every case (each case makes and deletes its own vhost
and users). Record again with `python -m tests.compat.access.record` (see record.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from leveret.testing import embedded_broker

from .allowed import ALLOWED
from .cases import CASES
from .driver import LeveretOperator, Runner
from .record import RECORDINGS, jsonable

DIFFERENCES = Path(__file__).parents[3] / "docs" / "differences.md"
BY_NAME = {case["name"]: case for case in CASES}


@pytest.fixture(scope="module")
def leveret():
    # A short login delay: the answers are the same, the suite is faster.
    with embedded_broker(
        port=0, persistence=False, auth_failure_delay=0.05, management_port=0
    ) as broker:
        yield broker


def recording(name: str) -> dict:
    return json.loads((RECORDINGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_answers_as_rabbitmq(leveret, name):
    case = BY_NAME[name]
    recorded = recording(name)
    assert recorded["steps"] == jsonable(case["steps"]), "the case changed: record it again"
    api = f"http://127.0.0.1:{leveret.server.management.port}"
    runner = Runner("127.0.0.1", leveret.port, LeveretOperator(leveret.admin), 5.0, api)
    answers = runner.run(case)
    expected = list(recorded["answers"])
    allowed = ALLOWED.get(name, {})
    for step, answer in allowed.items():
        if isinstance(step, int):
            assert expected[step] != answer, (
                f"step {step} no longer differs: drop it from allowed.py"
            )
            expected[step] = answer
    assert answers == expected


def test_every_case_is_recorded():
    recorded = {path.stem for path in RECORDINGS.glob("*.json")}
    assert recorded == set(BY_NAME)


def test_allowed_differences_are_documented():
    text = DIFFERENCES.read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"', text))
    for name, entry in ALLOWED.items():
        assert name in BY_NAME, name
        assert entry["why"], name
        page, _, anchor = entry["doc"].partition("#")
        assert page == "differences.md" and anchor in anchors, entry["doc"]
