#!/usr/bin/env python3
"""How long a Prometheus scrape holds the broker's loop, with many queues.

Declares N queues in an in-process broker and renders `/metrics` and
`/metrics/per-object` on the broker's loop (what an HTTP scrape does there), printing
the median of several runs and the size of the text.

    bench/prometheus_scrape.py --queues 10000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from leveret.config import ServerConfig
from leveret.testing import embedded_broker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    config = ServerConfig(port=0, persistence=False, management_port=None, prometheus_port=0)
    with embedded_broker(config) as broker:

        def declare() -> None:
            vhost = broker.server.broker.vhosts["/"]
            for i in range(args.queues):
                vhost.declare_queue(f"q{i}")

        broker.call(declare)
        for mode in ("metrics", "per-object"):

            def scrape(mode: str = mode) -> tuple[float, int]:
                started = time.perf_counter()
                body = broker.server.prometheus.metrics.render(mode)
                return time.perf_counter() - started, len(body)

            runs = [broker.call(scrape) for _ in range(args.runs)]
            median = statistics.median(seconds for seconds, _size in runs)
            print(f"/{mode}: {median * 1000:.0f} ms, {runs[0][1]:,} bytes ({args.queues} queues)")


if __name__ == "__main__":
    main()
