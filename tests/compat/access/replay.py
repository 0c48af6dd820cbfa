"""Replay the recorded access-control cases against Leveret and list the differences.

    python -m tests.compat.access.replay [--all] [--only GLOB]

It starts an in-process Leveret (as the CI test does). `--all` also prints the
differences the allow-list allows; the summary counts identical and different cases.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..common import Difference, read_json, split_allowed
from .allowed import ALLOWED
from .cases import CASES
from .driver import LeveretOperator, Runner

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def recording(name: str) -> dict[str, Any]:
    return read_json(RECORDINGS / f"{name}.json")


def differences(name: str, expected: list[Any], actual: list[Any]) -> list[Difference]:
    """One difference per step whose answer is not RabbitMQ's."""
    if len(expected) != len(actual):
        return [Difference(name, "value", "steps", len(expected), len(actual))]
    return [
        Difference(name, "value", f"steps.{i}", want, got)
        for i, (want, got) in enumerate(zip(expected, actual, strict=True))
        if want != got
    ]


@contextmanager
def leveret() -> Iterator[Runner]:
    """A Runner on an in-process Leveret (AMQP and management API on ephemeral ports)."""
    from leveret.testing import embedded_broker

    # A short login delay: the answers are the same, the replay is faster.
    with embedded_broker(
        port=0, persistence=False, auth_failure_delay=0.05, management_port=0
    ) as broker:
        api = f"http://127.0.0.1:{broker.server.management.port}"
        yield Runner("127.0.0.1", broker.port, LeveretOperator(broker.admin), 5.0, api)


def replay_case(runner: Runner, case: dict[str, Any]) -> list[Difference]:
    return differences(case["name"], recording(case["name"])["answers"], runner.run(case))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="print allowed differences too")
    parser.add_argument("--only", help="cases matching this glob")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or fnmatch.fnmatchcase(c["name"], args.only)]
    diffs: list[Difference] = []
    with leveret() as runner:
        for case in cases:
            diffs += replay_case(runner, case)
    left, _used = split_allowed(diffs, ALLOWED)
    for diff in diffs if args.all else left:
        print(diff)
    differing = {d.case for d in diffs}
    print(
        f"{len(cases)} cases: {len(cases) - len(differing)} identical, {len(differing)} "
        f"different ({len({d.case for d in left})} not allowed)"
    )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
