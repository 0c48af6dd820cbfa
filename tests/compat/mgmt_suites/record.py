"""Record RabbitMQ's own management test suites, translated to scenarios, from the
reference RabbitMQ.

    python -m tests.compat.mgmt_suites.record --rabbitmq amqp://guest:guest@127.0.0.1:5673/%2F \
        --management http://127.0.0.1:15673 [--only 'users_*']

Writes recordings/<suite>.json: for each scenario, every step's answer. The scenarios
work on `suite-*` objects of their own and remove them, so the broker need not be fresh.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

from ..common import read_json, recorder_args, write_json
from ..http.runner import Target
from .scenario import run_scenarios
from .suites import SUITES

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.split("\n\n")[0])
    target = Target(args.management, args.rabbitmq)
    total = 0
    for suite, (scenarios, _left_out) in SUITES.items():
        wanted = [
            s for s in scenarios if args.only is None or fnmatch.fnmatchcase(s.name, args.only)
        ]
        if not wanted:
            continue
        records = run_scenarios(target, wanted)
        path = RECORDINGS / f"{suite}.json"
        old = read_json(path) if path.exists() and args.only else {}
        new = {s.name: records.get(s.name, old.get(s.name)) for s in scenarios}
        write_json(path, {k: v for k, v in new.items() if v is not None})
        total += len(records)
    print(f"recorded {total} scenarios into {RECORDINGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
