#!/usr/bin/env python3
"""RAM of a long durable queue with given arguments, two source trees side by side.

Fills one durable queue (declared with `--arguments`, JSON) with `--messages`
persistent messages of `--size` bytes, with confirms and no consumer, against
`leveret server` started from each tree on a fresh data dir; then reports the
broker's RSS growth over its idle RSS, per queued message, and the fill rate.
The trees alternate each round; the figures are medians.

    git worktree add --detach /tmp/before <commit>
    python bench/queue_rss.py --a /tmp/before --arguments '{"x-message-ttl": 3600000}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tree_ab import add_tree_arguments, alternate, leveret_from, print_medians


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    from leveret.client.blocking import connect

    with leveret_from(tree) as broker:
        time.sleep(0.5)
        idle = _rss_kb(broker.pid)
        with connect(broker.url) as conn:
            ch = conn.channel()
            ch.declare_queue("bench.long", durable=True, arguments=json.loads(args.arguments))
            body = b"x" * args.size
            t0 = time.monotonic()
            sent = ch.publish_many(
                (body for _ in range(args.messages)), "bench.long", persistent=True
            )
            elapsed = time.monotonic() - t0
        time.sleep(0.5)
        grown = _rss_kb(broker.pid) - idle
    return {"bytes_per_msg": grown * 1024 / sent, "rss_mb": grown / 1024, "rate": sent / elapsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_tree_arguments(p)
    p.add_argument("--arguments", default='{"x-message-ttl": 3600000}', help="queue arguments")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=16)
    args = p.parse_args()
    results = alternate(args, lambda tree: run_once(tree, args))
    print_medians(
        f"{args.messages:,} persistent messages of {args.size} B in one durable queue with "
        f"arguments {args.arguments}, no consumer; median of {args.rounds} round(s)",
        results,
        [
            ("rss_mb", "RSS growth, MB"),
            ("bytes_per_msg", "RSS growth per queued message, B"),
            ("rate", "confirmed messages/s while filling"),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
