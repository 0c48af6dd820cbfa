"""Record the access-control cases from a reference RabbitMQ.

    python -m tests.compat.access.record --rabbitmq amqp://guest:guest@127.0.0.1:5672/%2F \\
        --management http://127.0.0.1:15672 [--only GLOB]

writes one JSON file per case under recordings/: the case's steps and RabbitMQ's
answers, one per step.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..common import recorder_args, write_json
from .cases import CASES
from .driver import RabbitOperator, Runner

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def jsonable(value: Any) -> Any:
    """Steps as JSON has them (tuples become lists), so recorded and current compare equal."""
    return json.loads(json.dumps(value))


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.splitlines()[0])
    url = urlparse(args.rabbitmq)
    runner = Runner(
        url.hostname or "127.0.0.1",
        url.port or 5672,
        RabbitOperator(args.management),
        api=args.management,
    )
    for case in CASES:
        if args.only and not fnmatch.fnmatchcase(case["name"], args.only):
            continue
        answers = runner.run(case)
        record = {
            "case": case["name"],
            "about": case["about"],
            "steps": jsonable(case["steps"]),
            "answers": answers,
        }
        write_json(RECORDINGS / f"{case['name']}.json", record)
        print(case["name"], json.dumps(answers), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
