"""Record the shovel and federation cases from a reference RabbitMQ 3.10.8.

    python -m tests.compat.plugins.record --rabbitmq amqp://guest:guest@127.0.0.1:5680/%2F \\
        --management http://127.0.0.1:15680 [--only GLOB]

The RabbitMQ needs its shovel and federation plugins (../shared/tools/rabbitmq.sh
enables them). Writes one JSON file per case under recordings/.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path
from typing import Any

from ..common import recorder_args, write_json
from .cases import CASES
from .driver import Driver

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.splitlines()[0])
    driver = Driver(args.management, args.rabbitmq)
    for case in CASES:
        if args.only and not fnmatch.fnmatchcase(case["name"], args.only):
            continue
        records = driver.run(case["steps"])
        write_json(
            RECORDINGS / f"{case['name']}.json",
            {
                "case": case["name"],
                "about": case["about"],
                "steps": jsonable(case["steps"]),
                "records": records,
            },
        )
        print(case["name"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
