"""Record rabbitmqctl's answers to the ctl cases from the reference RabbitMQ.

    python -m tests.compat.ctl.record --rabbitmq amqp://guest:guest@127.0.0.1:PORT/%2F \\
        --management http://127.0.0.1:$((PORT+10000))

rabbitmqctl reaches the node over Erlang distribution, not these URLs: its node and
cookie come from RABBITMQ_NODENAME and HOME when set, else from the reference
scripts' conventions for PORT (/work/shared/tools/rabbitmq.sh for 5673:
refrabbit@localhost in /tmp/rabbitmq-reference; /work/tools/rabbitmq-at.sh otherwise:
refrabbitPORT@localhost in /tmp/rabbitmq-reference-PORT). The cases run in order on
one broker, as the replay runs them on one Leveret; the global parameters they set
(and cluster_name) are cleared before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..common import recorder_args, write_json
from .cases import CASES, PREFIX
from .driver import observe

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "recordings" / "rabbitmqctl.json"


def _env(amqp_url: str) -> dict[str, str]:
    env = dict(os.environ)
    if "RABBITMQ_NODENAME" not in env:
        port = urlsplit(amqp_url).port or 5672
        base = "/tmp/rabbitmq-reference" + ("" if port == 5673 else f"-{port}")
        node = "refrabbit" + ("" if port == 5673 else str(port)) + "@localhost"
        env.update(RABBITMQ_NODENAME=node, HOME=base)
    return env


def main(argv: list[str] | None = None) -> int:
    args = recorder_args(argv, __doc__.split("\n\n")[0])
    if args.only:  # each case starts from what the one before left
        raise SystemExit("the ctl cases run in order on one broker: record them all (no --only)")
    env = _env(args.rabbitmq)

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["rabbitmqctl", *argv], capture_output=True, text=True, env=env, timeout=120
        )

    def clean() -> None:
        listing = run(["-q", "list_global_parameters", "--formatter", "json"])
        if listing.returncode != 0:
            raise SystemExit(f"rabbitmqctl cannot reach {env['RABBITMQ_NODENAME']}: "
                             f"{listing.stderr.strip()}")  # fmt: skip
        for item in json.loads(listing.stdout):
            if item["name"].startswith(PREFIX) or item["name"] == "cluster_name":
                run(["-q", "clear_global_parameter", item["name"]])

    clean()
    recorded = {}
    try:
        for case, steps in CASES.items():
            recorded[case] = observe(steps, run)
            print(f"{case}: {len(recorded[case])} steps", flush=True)
    finally:
        clean()
    write_json(RECORDING, recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
