"""Record the MQTT scenarios from the reference RabbitMQ 3.10 (MQTT plugin).

    python -m tests.compat.mqtt.record --rabbitmq amqp://guest:guest@127.0.0.1:5673/%2F \\
        --management http://127.0.0.1:15673 [--mqtt-port 1884] [--only GLOB]

writes recordings/<scenario>.json: the scenario's description and what was
observed (scenarios.py). The MQTT port defaults to the one rabbitmq.sh gives the
reference (its AMQP port - 3789), the Web MQTT port likewise (AMQP port + 10002,
path /ws).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path
from urllib.parse import urlparse

from ..common import write_json
from .scenarios import SCENARIOS, about
from .target import Target, rabbitmq

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def target_from(args: argparse.Namespace) -> Target:
    url = urlparse(args.rabbitmq)
    amqp_port = url.port or 5672
    return rabbitmq(
        args.mqtt_port or amqp_port - 3789,
        amqp_port,
        args.management,
        args.web_mqtt_port or amqp_port + 10002,
    )


def parse(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5673/%2F")
    parser.add_argument("--management", default="http://127.0.0.1:15673")
    parser.add_argument("--mqtt-port", type=int, default=None)
    parser.add_argument("--web-mqtt-port", type=int, default=None, help="path /ws")
    parser.add_argument("--only", default=None, help="scenarios matching this glob")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv, __doc__.splitlines()[0])
    target = target_from(args)
    for name, run in SCENARIOS.items():
        if args.only and not fnmatch.fnmatchcase(name, args.only):
            continue
        observed = run(target)
        write_json(RECORDINGS / f"{name}.json",
                   {"scenario": name, "about": about(name), "observed": observed})  # fmt: skip
        print(name, json.dumps(observed)[:300], file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
