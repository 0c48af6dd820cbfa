"""Replays the ctl cases with `leveret ctl` against a `leveret server` process, over its
control socket and with --url, with rabbitmqctl's own arguments (`-q`, `--formatter json`
after the command), and compares with what rabbitmqctl 3.10.8 did
(recordings/rabbitmqctl.json; `python -m tests.compat.ctl.record` records it)."""

from __future__ import annotations

import subprocess

import pytest

from test_ctl import Server

from ..common import Allowed, compare, read_json, split_allowed
from .allowed import ALLOWED
from .cases import CASES
from .driver import observe
from .record import RECORDING

pytestmark = pytest.mark.leveret_only


@pytest.mark.parametrize("transport", ["socket", "url"])
def test_leveret_ctl_as_rabbitmqctl(tmp_path, transport):
    recorded = read_json(RECORDING)
    assert set(recorded) == set(CASES), "record again: the cases changed"
    srv = Server(tmp_path / "data", transport=transport).wait()

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return srv.ctl(*argv)

    used: set[Allowed] = set()
    left = []
    try:
        for case, steps in CASES.items():  # in order, on one broker, as recorded
            actual = observe(steps, run)
            assert [a["step"] for a in actual] == [e["step"] for e in recorded[case]]
            for i, (expected, got) in enumerate(zip(recorded[case], actual, strict=True)):
                diffs, hit = split_allowed(
                    compare(f"{case}[{i}] {got['step']}", expected, got), ALLOWED
                )
                left += diffs
                used |= hit
    finally:
        srv.stop()
    assert not left, "\n".join(map(str, left))
    assert used == set(ALLOWED), "an allow-list entry no longer matches anything"
