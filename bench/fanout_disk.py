#!/usr/bin/env python3
"""Durable fan-out: bytes written and publish rate, two source trees side by side.

Publishes `--messages` persistent messages of `--size` bytes, with confirms (window
1000), through a fanout exchange into `--queues` durable queues with no consumers,
against `leveret server` started from each tree on a fresh data dir. Reports, per
tree, the median over the rounds (trees alternate each round) of:

- disk: segment-file bytes in the data dir per published message;
- written: what the broker process wrote (/proc/PID/io write_bytes) per message;
- rate: confirmed messages per second.

    git worktree add --detach /tmp/before <commit>
    python bench/fanout_disk.py --a /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tree_ab import add_tree_arguments, alternate, leveret_from, print_medians


def _write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise RuntimeError(f"no write_bytes in /proc/{pid}/io")


def _segment_bytes(data_dir: str) -> int:
    return sum(p.stat().st_size for p in (Path(data_dir) / "msgs").glob("*.seg"))


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    from leveret.client.blocking import connect

    with leveret_from(tree) as broker, connect(broker.url) as conn:
        ch = conn.channel()
        ch.declare_exchange("bench.fan", "fanout", durable=True)
        for i in range(args.queues):
            ch.declare_queue(f"bench.fan.{i}", durable=True)
            ch.bind_queue(f"bench.fan.{i}", "bench.fan")
        body = b"x" * args.size
        disk0, wrote0 = _segment_bytes(broker.data_dir), _write_bytes(broker.pid)
        t0 = time.monotonic()
        sent = ch.publish_many(
            (body for _ in range(args.messages)), "", "bench.fan", persistent=True
        )
        elapsed = time.monotonic() - t0
        disk = _segment_bytes(broker.data_dir) - disk0
        wrote = _write_bytes(broker.pid) - wrote0
    return {"disk": disk / sent, "written": wrote / sent, "rate": sent / elapsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_tree_arguments(p)
    p.add_argument("--queues", type=int, default=10)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=1024)
    args = p.parse_args()
    results = alternate(args, lambda tree: run_once(tree, args))
    print_medians(
        f"{args.messages} persistent messages of {args.size} B, fanout to {args.queues} "
        f"durable queues, confirms; median of {args.rounds} rounds",
        results,
        [
            ("disk", "segment bytes per message"),
            ("written", "bytes written per message"),
            ("rate", "confirmed messages/s"),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
