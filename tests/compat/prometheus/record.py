"""Record the Prometheus families of a reference RabbitMQ under a known workload.

    python -m tests.compat.prometheus.record --rabbitmq amqp://guest:guest@127.0.0.1:5672/%2F \\
        --management http://127.0.0.1:15672 [--prometheus http://127.0.0.1:15692]

The Prometheus listener defaults to the management port + 20 (the reference brokers
of this project listen so). Writes recordings/families.json: for each endpoint, the
families' names, types and label names.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pika

from ..common import write_json
from . import workload
from .scrape import scrape

RECORDINGS = Path(__file__).resolve().parent / "recordings"
#: RabbitMQ emits channel and connection statistics every 5 s (collect_statistics_interval)
STATS_WAIT = 6.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rabbitmq", required=True)
    parser.add_argument("--management", required=True)
    parser.add_argument("--prometheus")
    parser.add_argument("--only", help="(ignored: one recording)")
    args = parser.parse_args(argv)
    management = urlparse(args.management)
    prometheus = (
        args.prometheus or f"http://{management.hostname}:{(management.port or 15672) + 20}"
    )
    connections = workload.run(args.rabbitmq)
    try:
        time.sleep(STATS_WAIT)
        recorded = scrape(prometheus)
    finally:
        for conn in connections:
            conn.close()
        cleanup = pika.BlockingConnection(pika.URLParameters(args.rabbitmq))
        cleanup.channel().queue_delete(workload.PREFIX + "ready")
        cleanup.close()
    write_json(RECORDINGS / "families.json", recorded)
    for key, entry in recorded.items():
        print(key, entry["status"], len(entry.get("families", {})), "families", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
