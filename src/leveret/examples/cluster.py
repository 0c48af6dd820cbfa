"""A three-node Leveret cluster on loopback, and its leader killed under load.

    python -m leveret.examples.cluster            # etcd from PATH or .cache/tools/etcd
    python -m leveret.examples.cluster --kills 3 --lease 5

1. Starts etcd and three `leveret server --cluster-etcd` nodes on free loopback
   ports, each with its own data dir in a temporary directory.
2. A publisher (leveret.client, every node's URL) publishes persistent messages
   with confirms; a consumer (leveret.client too) consumes them.
3. Kills the leader with SIGKILL, waits for the first confirmed publish after the
   kill and prints how long the failover took; the killed node is started again
   and rejoins as a follower.
4. At the end it checks that every confirmed message reached the consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from base64 import b64decode, b64encode

from leveret.client import ConnectError, Connection, connect
from leveret.cluster.local import EtcdProcess, NodeProcess, etcd_binary

QUEUE = "demo.cluster"


def leader_name(etcd_url: str, cluster: str) -> str | None:
    body = json.dumps({"key": b64encode(f"leveret/{cluster}/leader".encode()).decode()})
    req = urllib.request.Request(etcd_url + "/v3/kv/range", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=2) as res:
            kvs = json.loads(res.read()).get("kvs") or []
    except OSError:
        return None
    return json.loads(b64decode(kvs[0]["value"]))["node"] if kvs else None


class DemoFailed(Exception):
    """The cluster did not come up or did not fail over: the message says why."""


def wait_leader(
    etcd_url: str,
    cluster: str,
    nodes: list[NodeProcess],
    other_than: str | None = None,
    timeout: float = 60.0,
) -> str:
    """The leader's name, once there is one (not `other_than`). A node that exited, or
    no leader within `timeout`, ends the demo with the nodes' last log lines rather
    than a wait that never ends."""
    deadline = time.monotonic() + timeout
    while True:
        name = leader_name(etcd_url, cluster)
        if name is not None and name != other_than:
            return name
        dead = [n for n in nodes if n.name != other_than and not n.running]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(n.name for n in dead)} exited" if dead else "no leader"
            tails = "\n".join(
                f"--- {n.name}'s log ends:\n" + "\n".join(n.log_text().splitlines()[-8:])
                for n in (dead or nodes)
            )
            raise DemoFailed(f"the cluster did not elect a leader ({why})\n{tails}")
        time.sleep(0.05)


async def _connect(urls: list[str]) -> Connection:
    """The nodes may still be starting: try for a while."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await connect(urls, reconnect_delay=0.05, reconnect_max_delay=0.5)
        except ConnectError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def demo(args: argparse.Namespace, etcd: EtcdProcess, nodes: list[NodeProcess]) -> int:
    urls = [n.url for n in nodes]
    confirmed: set[int] = set()
    received: set[int] = set()
    conn = await _connect(urls)
    ch = await conn.channel()
    await ch.declare_queue(QUEUE, durable=True)
    consumer_conn = await _connect(urls)
    consumer_ch = await consumer_conn.channel(prefetch=500)
    queue = await consumer_ch.declare_queue(QUEUE, durable=True)

    async def consume() -> None:
        async with queue.consume() as messages:
            async for message in messages:
                received.add(int(message.body))
                message.ack()

    consuming = asyncio.ensure_future(consume())
    figures = []
    i = 0

    async def publish(n: int) -> None:
        nonlocal i
        for _ in range(n):
            await ch.publish(str(i).encode(), QUEUE, persistent=True)
            confirmed.add(i)
            i += 1

    await publish(args.messages)
    for kill in range(args.kills):
        name = wait_leader(etcd.url, "demo", nodes)
        node = next(n for n in nodes if n.name == name)
        node.kill()
        killed_at = time.monotonic()
        await publish(1)
        took = time.monotonic() - killed_at
        figures.append(took)
        new = wait_leader(etcd.url, "demo", nodes, other_than=name)
        print(
            f"kill {kill + 1}: SIGKILL of leader {name}; {new} leads; first confirmed "
            f"publish after the kill {took:.2f} s later"
        )
        node.start()  # rejoins as a follower
        await publish(args.messages)
    deadline = time.monotonic() + 30
    while not confirmed <= received and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    consuming.cancel()
    await conn.close()
    await consumer_conn.close()
    lost = confirmed - received
    print(
        f"{len(confirmed)} messages confirmed, {len(received)} distinct received; "
        f"confirmed but lost: {len(lost)}"
    )
    if figures:
        figures.sort()
        print(
            f"failover: median {figures[len(figures) // 2]:.2f} s, worst {figures[-1]:.2f} s "
            f"(lease {args.lease:g} s)"
        )
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--lease", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--messages", type=int, default=500, help="between kills")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    args = parser.parse_args(argv)
    logging.getLogger("leveret.client").setLevel(logging.ERROR)  # reconnect attempts
    if etcd_binary() is None:
        print("etcd not found: install Debian's etcd-server or run scripts/install-test-deps.sh")
        return 2
    directory = tempfile.mkdtemp(prefix="leveret-cluster-demo-")
    etcd = EtcdProcess(f"{directory}/etcd-data")
    nodes: list[NodeProcess] = []
    try:
        os.makedirs(etcd.directory)
        etcd.start()
        nodes = [
            NodeProcess(f"node{i}", etcd.url, directory, cluster="demo", lease=args.lease).start()
            for i in range(1, 4)
        ]
        leader = wait_leader(etcd.url, "demo", nodes)
        print(f"etcd on {etcd.url}; nodes {', '.join(n.name for n in nodes)}; {leader} leads")
        print("AMQP URLs: " + " ".join(n.url for n in nodes))
        return asyncio.run(demo(args, etcd, nodes))
    except DemoFailed as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()
        if args.keep:
            print(f"data dirs and logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
