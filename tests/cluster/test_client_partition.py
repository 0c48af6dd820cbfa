"""Clients cut from the leader only: the leader is alive and still leads, the cluster is
whole, but one client's TCP path to the leader goes silent (a TcpProxy in front of the
leader's AMQP port swallows its bytes both ways, answering nothing and resetting
nothing, as a partition or a dead NAT entry would)."""

from __future__ import annotations

import asyncio
import time

import pytest

from leveret.client import connect
from leveret.client import events as ev

from .cluster_support import Cluster, TcpProxy, needs_etcd
from .test_failover import PikaPublisher, _drain, check_delivery
from .test_failure_modes import _publishing_throughout

pytestmark = [needs_etcd, pytest.mark.slow]

WINDOW = 100  # publishes the cut client has in flight (unconfirmed) at a time


@pytest.mark.parametrize("through", ["leader", "follower"])
def test_client_cut_from_the_leader_while_publishing_with_confirms(
    cluster: Cluster, through: str
) -> None:
    """A leveret.client publisher (confirms, a window of 100 in flight, 1 s heartbeats)
    reaches the leader through a proxy, straight or through a follower that passes the
    connection on, and knows another node's address too. The proxy goes silent
    mid-stream. The client hears no heartbeat, drops the link, reconnects through the
    other node (the leader, or a follower that passes it to the same leader) and sends
    its unconfirmed publishes again; the leader hears no heartbeat either and closes its
    side. No confirmed message is lost, duplicates are only of publishes unconfirmed at
    the cut, and a pika publisher connected straight to the leader is confirmed
    throughout without losing its connection; the leader, its term and the in-sync set
    stay."""
    leader = cluster.wait_leader()
    everyone = {n.name for n in cluster.nodes}
    term = cluster._get("term")
    follower = next(n for n in cluster.nodes if n is not leader)
    front, second = (leader, follower) if through == "leader" else (follower, leader)
    proxy = TcpProxy("127.0.0.1", front.port)
    proxy.swallow_closes = True  # the leader's close of its side must not reach the client
    cut_url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"
    queue = f"cut-{through}"
    bystander = PikaPublisher([leader.url], "uncut")
    confirmed: set[int] = set()
    attempted: set[int] = set()
    at_loss: set[int] = set()  # confirmed when the client found its link dead
    lost: list[str] = []

    async def run(confirmed_more) -> None:  # noqa: ANN001
        def listen(event: ev.ClientEvent) -> None:
            if isinstance(event, ev.ConnectionLost) and not lost:
                at_loss.update(confirmed)
                lost.append(event.reason)

        conn = await connect(
            [cut_url, second.url],
            heartbeat=1,
            connect_timeout=2,
            reconnect_delay=0.05,
            reconnect_max_delay=0.5,
        )
        conn.add_listener(listen)
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=True)
        room = asyncio.Semaphore(WINDOW)
        stop = asyncio.Event()

        async def one(i: int) -> None:
            try:
                await ch.publish(str(i).encode(), queue, persistent=True, timeout=60)
                confirmed.add(i)
            finally:
                room.release()

        async def publish() -> None:
            tasks = []
            i = 0
            while not stop.is_set():
                await room.acquire()
                attempted.add(i)
                tasks.append(asyncio.ensure_future(one(i)))
                i += 1
            await asyncio.gather(*tasks)

        async def until(check, what: str) -> None:  # noqa: ANN001
            deadline = time.monotonic() + 60
            while not check():
                assert time.monotonic() < deadline, f"{what}\n{cluster.logs()}"
                await asyncio.sleep(0.05)

        publishing = asyncio.ensure_future(publish())
        await until(lambda: len(confirmed) >= 500, "no confirms before the cut")
        proxy.cut()
        await until(lambda: conn.reconnects >= 1, "the cut client did not reconnect")
        assert conn.port == second.port, "reconnected through the cut proxy?"
        # the other client was confirmed throughout, on its first connection
        await asyncio.to_thread(confirmed_more)
        now = len(confirmed)
        await until(lambda: len(confirmed) >= now + 500, "no confirms after the reconnect")
        stop.set()
        await asyncio.wait_for(publishing, 60)
        await conn.close()

    with _publishing_throughout(bystander, cluster) as confirmed_more:
        confirmed_more()
        asyncio.run(run(confirmed_more))
        confirmed_more()
    proxy.close()
    assert "missed heartbeats" in lost[0], lost
    assert confirmed == attempted, "a publish failed after the reconnect"
    assert len(at_loss) < len(attempted) - 500
    # The leader found the cut connection dead too, and closed it.
    deadline = time.monotonic() + 30
    while "missed heartbeats from client" not in leader.log_text():
        assert time.monotonic() < deadline, leader.log_text()[-3000:]
        time.sleep(0.1)
    assert cluster.leader_name() == leader.name and cluster._get("term") == term
    cluster.wait_in_sync(everyone)
    assert bystander.retried == set(), "the bystander lost its connection"
    bystander.close()
    got = _drain([leader.url], queue)
    check_delivery(got, confirmed, attempted, attempted - at_loss)
    got = _drain([leader.url], "uncut")
    check_delivery(got, bystander.confirmed, set(range(bystander.next)), set())
    assert len(got) == bystander.next
