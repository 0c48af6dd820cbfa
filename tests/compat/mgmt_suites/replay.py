"""Replay RabbitMQ's translated management suites against Leveret; list the differences.

    python -m tests.compat.mgmt_suites.replay [--all] [--only GLOB] [--update-gaps]
        [--management URL --amqp URL]

Without URLs it starts an in-process Leveret (as the CI test does). The summary counts,
per suite, the scenarios translated, those that differ, and those left out.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path
from typing import Any

from ..common import Difference, compare, read_json, split_allowed
from ..http.allowed import ALLOWED as HTTP_ALLOWED
from ..http.replay import gap_key, leveret
from ..http.replay import known_gaps as http_known_gaps
from ..http.runner import Target
from .allowed import ALLOWED
from .scenario import run_scenarios
from .suites import SUITES

RECORDINGS = Path(__file__).resolve().parent / "recordings"
#: differences found and not yet closed, one "scenario#step kind path" a line; the
#: replay test fails on a difference neither here nor allowed, and on a line here that
#: no longer differs (`--update-gaps` rewrites it), so the list only shrinks
KNOWN_GAPS = Path(__file__).resolve().parent / "known_gaps.txt"


def known_gaps() -> set[str]:
    return http_known_gaps(KNOWN_GAPS)


def differences(
    suite: str, expected: dict[str, list[dict[str, Any]]], actual: dict[str, list[dict[str, Any]]]
) -> list[Difference]:
    out: list[Difference] = []
    for name, want_steps in expected.items():
        got_steps = actual.get(name, [])
        for i, want in enumerate(want_steps):
            case = f"{suite}.{name}#{i}"
            got = got_steps[i] if i < len(got_steps) else None
            if got is None:
                out.append(Difference(case, "step", "", "recorded", "not reached"))
                continue
            if want.get("status") == 500 and want.get("shape") == "empty":
                # RabbitMQ crashed on bad input: Leveret must answer a 4xx error instead
                if not 400 <= got.get("status", 0) < 500:
                    out.append(Difference(case, "status", "", "4xx", got.get("status")))
                continue
            out += compare(case, want, got)
        if len(got_steps) > len(want_steps):
            out.append(Difference(f"{suite}.{name}", "step", "", "ended", got_steps[-1]))
    return out


def replay(
    target: Target, only: str | None = None
) -> tuple[dict[str, dict[str, Any]], list[Difference]]:
    """(recordings per suite, differences)"""
    recorded: dict[str, dict[str, Any]] = {}
    diffs: list[Difference] = []
    for suite, (scenarios, _left_out) in SUITES.items():
        path = RECORDINGS / f"{suite}.json"
        expected = read_json(path) if path.exists() else {}
        if only:
            expected = {k: v for k, v in expected.items() if fnmatch.fnmatchcase(k, only)}
        recorded[suite] = expected
        wanted = [s for s in scenarios if s.name in expected]
        actual = run_scenarios(target, wanted)
        diffs += differences(suite, expected, actual)
    return recorded, diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also print allowed differences")
    parser.add_argument("--only", default=None)
    parser.add_argument("--management", default=None)
    parser.add_argument("--amqp", default=None)
    parser.add_argument("--update-gaps", action="store_true", help="rewrite known_gaps.txt")
    args = parser.parse_args(argv)
    if args.management:
        recorded, diffs = replay(Target(args.management, args.amqp), args.only)
    else:
        with leveret() as target:
            recorded, diffs = replay(target, args.only)
    left, _used = split_allowed(diffs, ALLOWED + HTTP_ALLOWED)
    if args.update_gaps:
        KNOWN_GAPS.write_text("".join(f"{k}\n" for k in sorted({gap_key(d) for d in left})))
    for diff in diffs if args.all else left:
        print(diff)
    print(f"{'suite':28} translated  steps  scenarios-differing  not-allowed  left-out")
    for suite, expected in recorded.items():
        names_with = {d.case.split("#")[0] for d in diffs if d.case.startswith(suite + ".")}
        names_left = {d.case.split("#")[0] for d in left if d.case.startswith(suite + ".")}
        steps = sum(len(v) for v in expected.values())
        print(
            f"{suite:28} {len(expected):10}  {steps:5}  {len(names_with):19}  "
            f"{len(names_left):11}  {len(SUITES[suite][1]):8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
