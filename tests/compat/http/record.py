"""Record the management API table (cases.py) from the reference RabbitMQ.

    python -m tests.compat.http.record --rabbitmq amqp://guest:guest@127.0.0.1:5677/%2F \
        --management http://127.0.0.1:15677 [--only 'queues.*']

Writes tests/compat/http/recordings/<group>.json (one per group of cases.py). The
broker should be fresh: the state is made in the vhost `compat` and removed after,
but listings of every vhost also show what else is there.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

from ..common import read_json, recorder_args, write_json
from .cases import GROUPS
from .runner import Target, run_all

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.split("\n\n")[0])
    groups = {group.__name__: group() for group in GROUPS}
    wanted = [
        c
        for cases in groups.values()
        for c in cases
        if args.only is None or fnmatch.fnmatchcase(c.name, args.only)
    ]
    records = run_all(Target(args.management, args.rabbitmq), wanted)
    for name, cases in groups.items():
        path = RECORDINGS / f"{name}.json"
        old = read_json(path) if path.exists() and args.only else {}
        new = {c.name: records.get(c.name, old.get(c.name)) for c in cases}
        write_json(path, {k: v for k, v in new.items() if v is not None})
    print(f"recorded {len(records)} cases into {RECORDINGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
