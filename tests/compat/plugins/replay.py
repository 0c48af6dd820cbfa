"""Replay the plugin cases against Leveret and list the differences.

    python -m tests.compat.plugins.replay [--all]

prints every difference (with --all, allowed ones too, marked). The pytest module
test_replay.py fails on any difference the allow-list does not name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from leveret.config import ServerConfig
from leveret.testing import embedded_broker

from ..common import Difference, compare, read_json, shape, split_allowed
from .allowed import ALLOWED
from .cases import CASES
from .driver import Driver

RECORDINGS = Path(__file__).resolve().parent / "recordings"


@contextmanager
def leveret() -> Iterator[Driver]:
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config) as broker:
        yield Driver(f"http://127.0.0.1:{broker.server.management.port}", broker.url)


def recording(name: str) -> dict[str, Any]:
    return read_json(RECORDINGS / f"{name}.json")


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    if "message" in record:
        return {"shape": shape(record["message"]), "body": record["message"]}
    return {k: v for k, v in record.items() if k != "step"}


def replay_case(driver: Driver, case: dict[str, Any]) -> list[Difference]:
    expected = recording(case["name"])["records"]
    actual = driver.run(case["steps"])
    out: list[Difference] = []
    by_step = {r["step"]: r for r in actual}
    for record in expected:
        name = f"{case['name']}[{record['step']}]"
        got = by_step.get(record["step"])
        if got is None:
            out.append(Difference(name, "missing", "", "a record", None))
            continue
        out += compare(name, comparable(record), comparable(got))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list allowed differences too")
    args = parser.parse_args(argv)
    left_total = 0
    with leveret() as driver:
        for case in CASES:
            diffs = replay_case(driver, case)
            left, _ = split_allowed(diffs, ALLOWED)
            left_total += len(left)
            for diff in diffs:
                if diff in left or args.all:
                    mark = "" if diff in left else "  (allowed)"
                    print(f"{diff}{mark}")
    print(f"{left_total} differences not allowed", file=sys.stderr)
    return 1 if left_total else 0


if __name__ == "__main__":
    sys.exit(main())
