"""Record the AMQP scenarios (scenarios_*.py) from the reference RabbitMQ.

    python -m tests.compat.amqp.record --rabbitmq amqp://guest:guest@127.0.0.1:5675/%2F \
        --management http://127.0.0.1:15675 [--only 'streams.*']

Writes tests/compat/amqp/recordings/<topic>/<scenario>.json. Each scenario runs in a
vhost of its own (`cx-<id>`, made before and deleted after), so the broker need not
be fresh. A scenario is recorded twice and the two runs compared: one whose answers
change from run to run is reported (fix the scenario, or mask what changes).
"""

from __future__ import annotations

import sys

from ..common import recorder_args
from .runner import Target, compare, discover, run, save_recording, select


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.split("\n\n")[0])
    target = Target.rabbitmq(args.rabbitmq, args.management)
    wanted = select(discover(), args.only)
    unstable = []
    for sc in wanted:
        first = run(target, sc)
        second = run(target, sc)
        diffs = compare(sc.id, first, second)
        if diffs:
            unstable.append(sc.id)
            for diff in diffs:
                print(f"  unstable: {diff}")
        if "error" in first:
            print(f"  {sc.id}: the scenario raised {first['error']}")
        save_recording(sc, first)
        print(f"recorded {sc.id} ({len(first['steps'])} steps)", flush=True)
    print(f"recorded {len(wanted)} scenarios; {len(unstable)} unstable")
    return 1 if unstable else 0


if __name__ == "__main__":
    sys.exit(main())
