"""What the message store's publish costs, in two source trees side by side.

    git worktree add --detach /tmp/before <commit>
    python bench/store_publish_ab.py --a /tmp/before --rounds 5

Each round runs one child process per tree, alternating A and B: a store with
fsync=never and an asyncio loop, `publish_paged` of N persistent 16 B messages into
one queue's paged tail (the path a long durable queue takes), yielding to the loop
every 1,000 as the broker does. Prints ns per publish for every round and the
medians. In-process store work only: no sockets, no broker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = """
import asyncio, shutil, sys, tempfile, time
from leveret.store import MessageStore

async def main(n):
    d = tempfile.mkdtemp(prefix="leveret-store-ab-")
    store = MessageStore(d, fsync="never", loop=asyncio.get_running_loop())
    store.open_paged()
    tail = store.paged_index(("/", "q"))
    body, header = b"x" * 16, b"\\x00" * 14
    t0 = time.perf_counter()
    for i in range(n):
        store.publish_paged(tail, header, body)
        if i % 1000 == 999:
            await asyncio.sleep(0)
    took = time.perf_counter() - t0
    store.close()
    shutil.rmtree(d)
    print(took / n * 1e9)

asyncio.run(main(int(sys.argv[1])))
"""


def run(tree: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.join(tree, "src")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def main() -> None:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="source tree A (before)")
    p.add_argument("--b", default=here, help="source tree B (default: this)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=600_000)
    args = p.parse_args()
    a_ns: list[float] = []
    b_ns: list[float] = []
    for r in range(args.rounds):
        first, second = (
            ((args.a, a_ns), (args.b, b_ns)) if r % 2 == 0 else ((args.b, b_ns), (args.a, a_ns))
        )
        for tree, out in (first, second):
            out.append(run(tree, args.messages))
        print(f"round {r + 1}: A {a_ns[-1]:,.0f} ns  B {b_ns[-1]:,.0f} ns per publish", flush=True)
    ma, mb = statistics.median(a_ns), statistics.median(b_ns)
    print(f"median: A {ma:,.0f} ns, B {mb:,.0f} ns per publish; B - A = {mb - ma:+,.0f} ns")


if __name__ == "__main__":
    main()
