"""bench/mqtt.py runs each scenario and counts right (a fraction of a second against
Leveret only; the figures themselves are not checked: they are the benchmark's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_every_scenario_delivers_what_it_sent(tmp_path: Path) -> None:
    out = tmp_path / "rounds.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [
        sys.executable, str(ROOT / "bench" / "mqtt.py"), "--only", "leveret",
        "--rounds", "1", "--seconds", "0.3", "--warmup", "0.1", "--drain", "5",
        "--publishers", "3", "--subscribers", "3", "--window", "20", "--backlog", "500",
        "--idle-conns", "40", "--settle", "0.2", "--json", str(out),
    ]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rounds = json.loads(out.read_text())
    assert set(rounds) == {
        "idle:40|leveret", "fanin0|leveret", "fanin1|leveret", "fanout|leveret"
    }  # fmt: skip
    for key, (result,) in rounds.items():
        assert result["error"] is None, (key, result)
        detail = result["detail"]
        if key.startswith("idle"):
            assert detail["opened"] == 40
            continue
        assert detail["sent"] > 0, key
        assert detail["received"] == detail["expected"], (key, detail)
        if key.startswith("fanout"):
            assert detail["expected"] == 3 * detail["sent"]
        else:
            assert detail["expected"] == detail["sent"]
        if key.startswith("fanin1"):
            assert detail["acked"] == detail["sent"], detail  # every QoS 1 PUBLISH acked
    table = res.stdout
    assert "fan-in QoS 1, 3 publishers (window 20)" in table
    assert "40 idle connections: RSS KB per connection" in table
