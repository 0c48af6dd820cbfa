"""Replay the recorded AMQP scenarios against Leveret and list the differences.

    python -m tests.compat.amqp.replay [--all] [--only GLOB]

Starts an in-process Leveret (as the CI test does). `--all` also prints the
differences the allow-list allows.
"""

from __future__ import annotations

import argparse
import sys

from ..common import split_allowed
from .allowed import ALLOWED
from .runner import compare, discover, load_recording, run, select
from .target import leveret_target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--only", default=None)
    args = parser.parse_args(argv)
    scenarios = select(discover(), args.only)
    same = unrecorded = 0
    left_total = 0
    with leveret_target() as target:
        for sc in scenarios:
            expected = load_recording(sc)
            if expected is None:
                unrecorded += 1
                print(f"{sc.id}: not recorded")
                continue
            diffs = compare(sc.id, expected, run(target, sc, expected))
            left, _used = split_allowed(diffs, ALLOWED)
            left_total += len(left)
            if not diffs:
                same += 1
            for diff in diffs if args.all else left:
                print(f"{'allowed ' if diff not in left else ''}{diff}")
    print(
        f"{len(scenarios)} scenarios: {same} identical, "
        f"{len(scenarios) - same - unrecorded} differ, {unrecorded} not recorded; "
        f"{left_total} differences not allowed"
    )
    return 1 if left_total or unrecorded else 0


if __name__ == "__main__":
    sys.exit(main())
