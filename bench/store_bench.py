"""Persistent-publish throughput of the message store (fsync=batch by default).

    python bench/store_bench.py [--count N] [--fsync batch|always|never] [--dir PATH]

Publishes from an asyncio loop the way the broker does, counts on_durable callbacks,
and reports records/s from the first publish to the last confirm. Then reopens the
store and reports recovery time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from leveret.store import MessageStore  # noqa: E402


async def run(data_dir: str, size: int, count: int, fsync: str) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    store = MessageStore(data_dir, fsync=fsync, loop=loop)
    store.open()
    body = b"x" * size
    header = b"\x00" * 14
    key = ("/", "bench")
    done = asyncio.Event()
    remaining = count

    def on_durable(exc: BaseException | None) -> None:
        nonlocal remaining
        remaining -= 1
        if not remaining:
            done.set()

    t0 = time.perf_counter()
    publish = store.publish
    for i in range(count):
        publish(key, header, body, on_durable)
        if i % 1000 == 999:
            await asyncio.sleep(0)  # let callbacks run, as a real server would
    await done.wait()
    elapsed = time.perf_counter() - t0
    store.close()
    t1 = time.perf_counter()
    store = MessageStore(data_dir, fsync=fsync)
    recovered = store.open()
    recovery = time.perf_counter() - t1
    assert len(recovered[key]) == count, len(recovered[key])
    store.close()
    return count / elapsed, recovery


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--fsync", default="batch", choices=["always", "batch", "never"])
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    for size in (16, 1024):
        base = tempfile.mkdtemp(prefix="leveret-bench-", dir=args.dir)
        try:
            rate, recovery = asyncio.run(run(base, size, args.count, args.fsync))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(
            f"{size:>5} B bodies, fsync={args.fsync}: {rate:>10,.0f} records/s durable; "
            f"recovery of {args.count:,} messages: {recovery:.2f} s"
        )


if __name__ == "__main__":
    main()
