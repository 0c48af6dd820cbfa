"""The mesh: calls with answers and errors between workers, dispatch by kind,
placement, and a lost peer failing its pending calls."""

from __future__ import annotations

import asyncio

import pytest

from leveret.protocol.constants import NOT_FOUND
from leveret.protocol.errors import ChannelError
from leveret.workers import link
from leveret.workers.mesh import Mesh, PeerDown, local_meshes, placement


def test_placement_is_stable_and_spreads() -> None:
    owners = [placement("/", f"q{i}", 4) for i in range(400)]
    assert owners == [placement("/", f"q{i}", 4) for i in range(400)]
    assert {owners.count(w) for w in range(4)} <= set(range(60, 141))
    assert placement("/", "anything", 1) == 0
    with pytest.raises(ValueError):
        Mesh(2, 2)


def test_calls_records_and_errors() -> None:
    asyncio.run(_calls_records_and_errors())


async def _calls_records_and_errors() -> None:
    a, b, c = await local_meshes(3)
    seen: list[tuple[int, object]] = []
    b.on(link.CREDIT, lambda peer, r: seen.append((peer, r)))

    async def slow(peer: int, x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 2

    def missing(peer: int, name: str) -> None:
        raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '/'")

    b.serve("add", lambda peer, x, y: (peer, x + y))
    b.serve("slow", slow)
    b.serve("missing", missing)
    assert await a.call(1, "add", 2, 3) == (0, 5)
    assert await c.call(1, "add", 1.5, 2) == (2, 3.5)
    assert await c.call(1, "slow", 21) == 42
    with pytest.raises(ChannelError) as err:
        await a.call(1, "missing", "q")
    assert err.value.code == NOT_FOUND and "no queue 'q'" in str(err.value)
    with pytest.raises(KeyError, match="unknown"):
        await a.call(1, "unknown")
    a.send(1, link.Credit(7, 10))
    c.send(1, link.Credit(8, 1))
    for _ in range(20):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert sorted((p, r.ref) for p, r in seen) == [(0, 7), (2, 8)]
    for m in (a, b, c):
        m.close()


def test_lost_peer_fails_pending_calls() -> None:
    asyncio.run(_lost_peer_fails_pending_calls())


async def _lost_peer_fails_pending_calls() -> None:
    a, b = await local_meshes(2)
    lost: list[int] = []
    a.peer_lost.append(lost.append)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    b.serve("hang", lambda peer: never)
    pending = a.call(1, "hang")
    await asyncio.sleep(0.01)
    b.close()
    with pytest.raises(PeerDown):
        await pending
    assert lost == [1]
    with pytest.raises(PeerDown):
        await a.call(1, "hang")
    with pytest.raises(PeerDown):
        a.send(1, link.Credit(1, 1))
