"""Record the access-control cases from a reference RabbitMQ.

    python -m tests.compat.access.record --rabbitmq amqp://guest:guest@127.0.0.1:5672/ \\
        --management http://127.0.0.1:15672

writes one JSON file per case under recordings/ (the case's steps and RabbitMQ's
answers). `--only NAME` records the named cases alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlparse

from .cases import CASES
from .driver import RabbitOperator, Runner

RECORDINGS = Path(__file__).parent / "recordings"


def as_json(case: dict, answers: list) -> str:
    data = {
        "case": case["name"],
        "about": case["about"],
        "steps": jsonable(case["steps"]),
        "answers": answers,
    }
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def jsonable(value):
    """Steps as JSON has them (tuples become lists), so recorded and current compare equal."""
    return json.loads(json.dumps(value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rabbitmq", required=True, help="AMQP URL of the reference broker")
    parser.add_argument("--management", required=True, help="its management HTTP URL")
    parser.add_argument("--only", nargs="*", help="record these cases only")
    args = parser.parse_args(argv)
    url = urlparse(args.rabbitmq)
    runner = Runner(
        url.hostname or "127.0.0.1",
        url.port or 5672,
        RabbitOperator(args.management),
        api=args.management,
    )
    RECORDINGS.mkdir(exist_ok=True)
    for case in CASES:
        if args.only and case["name"] not in args.only:
            continue
        answers = runner.run(case)
        (RECORDINGS / f"{case['name']}.json").write_text(as_json(case, answers))
        print(case["name"], json.dumps(answers), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
