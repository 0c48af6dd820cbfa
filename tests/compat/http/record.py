"""Record the management API table (cases.py) from the reference RabbitMQ.

    python -m tests.compat.http.record --rabbitmq amqp://guest:guest@127.0.0.1:5677/%2F \
        --management http://127.0.0.1:15677 [--only 'queues.*,users.put.*']

Writes tests/compat/http/recordings/<group>.json (one per group of cases.py). The
broker must be fresh: the state is made in the vhost `compat` and removed after, but
listings of every vhost show what else is there, and RabbitMQ's overview and vhost
`message_stats` keep counting across runs (a deleted vhost's counts stay too). So the
recorder refuses a RabbitMQ that has moved messages before when the overview or vhost
cases are to be recorded: reset it first (`rabbitmq-at.sh stop PORT`, remove
/tmp/rabbitmq-reference-PORT/mnesia, start it again). It also waits until the
distribution links of `rabbitmqctl` calls are gone from /api/nodes' `cluster_links`
(a single node has none).
"""

from __future__ import annotations

import fnmatch
import sys
import time
from pathlib import Path

from ..common import read_json, recorder_args, write_json
from .cases import GROUPS
from .runner import Case, Target, run_all

#: groups whose answers carry counts that outlive a run on the same RabbitMQ
COUNTING = ("overview.", "vhosts.")


def fresh_enough(target: Target, cases: list[Case]) -> str | None:
    """Why this RabbitMQ cannot record these cases as they are, or None. Only GETs
    show the counts (a refused POST or PUT does not)."""
    if any(c.method == "GET" and c.name.startswith(COUNTING) for c in cases):
        stats = target.ok("GET", "/api/overview").get("message_stats")
        if stats:
            return (
                f"RabbitMQ's overview already counts messages ({stats.get('publish', 0)} "
                "published): the overview and vhost cases would record them; reset it"
            )
    # RabbitMQ emits node statistics every 5 s: the links must stay gone for longer.
    deadline, quiet_since = time.monotonic() + 600, time.monotonic()
    while time.monotonic() - quiet_since < 12:
        if any(n.get("cluster_links") for n in target.ok("GET", "/api/nodes")):
            quiet_since = time.monotonic()
        if time.monotonic() > deadline:
            return "/api/nodes still shows cluster_links (a rabbitmqctl call?)"
        time.sleep(2)
    return None


RECORDINGS = Path(__file__).resolve().parent / "recordings"


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.split("\n\n")[0])
    groups = {group.__name__: group() for group in GROUPS}
    wanted = [
        c
        for cases in groups.values()
        for c in cases
        if args.only is None or any(fnmatch.fnmatchcase(c.name, g) for g in args.only.split(","))
    ]
    target = Target(args.management, args.rabbitmq)
    problem = fresh_enough(target, wanted)
    if problem:
        print(f"not recording: {problem}", file=sys.stderr)
        return 1
    records = run_all(target, wanted)
    for name, cases in groups.items():
        path = RECORDINGS / f"{name}.json"
        old = read_json(path) if path.exists() and args.only else {}
        new = {c.name: records.get(c.name, old.get(c.name)) for c in cases}
        write_json(path, {k: v for k, v in new.items() if v is not None})
    print(f"recorded {len(records)} cases into {RECORDINGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
