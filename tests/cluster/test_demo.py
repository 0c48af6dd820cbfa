"""The README's one-command demo, `python -m leveret.examples.cluster`, run as a user
runs it: etcd and three nodes on loopback, the leader SIGKILLed under confirmed
publishing, and its report that no confirmed message was lost."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster_support import needs_etcd

pytestmark = [needs_etcd, pytest.mark.slow, pytest.mark.leveret_only]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_cluster_demo_fails_over_without_losing_a_confirmed_message(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    log = tmp_path / "demo.out"
    # Output to a file, not a pipe: the nodes the demo starts inherit its stdout.
    with open(log, "w") as sink:
        proc = subprocess.run(
            [sys.executable, "-m", "leveret.examples.cluster"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=240,
        )
    out = log.read_text()
    assert proc.returncode == 0, out
    kill = re.search(r"kill 1: SIGKILL of leader (\S+); (\S+) leads; first confirmed publish", out)
    assert kill is not None, out
    assert kill.group(1) != kill.group(2), out  # another node took the lead
    counts = re.search(
        r"(\d+) messages confirmed, (\d+) distinct received; confirmed but lost: (\d+)", out
    )
    assert counts is not None, out
    confirmed, received, lost = (int(n) for n in counts.groups())
    assert confirmed > 0 and lost == 0 and received >= confirmed, out
    assert re.search(r"failover: median [\d.]+ s", out), out
