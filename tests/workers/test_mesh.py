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


def _loops() -> list:
    """The event loops a worker may run on: asyncio's, and uvloop's where installed
    (the workers' default), which hands a new link what its peer already wrote
    before `open_link` returns."""
    factories = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


@pytest.mark.parametrize("loop_factory", _loops())
def test_records_written_before_the_peer_linked_are_answered(loop_factory) -> None:
    """A restarted worker links to the others only once it serves; what they sent
    it meanwhile waits in the socket and is the first thing it reads. Its answers
    to those records (a call's reply, a publish's confirm) reach the sender."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_records_written_before_the_peer_linked())


async def _records_written_before_the_peer_linked() -> None:
    a, b = Mesh(0, 2), Mesh(1, 2)
    b.serve("add", lambda peer, x, y: x + y)
    # A record answered by a record, as the owner answers a PUBLISH with a CONFIRM.
    b.on(link.CREDIT, lambda peer, r: b.send(peer, link.Credit(r.ref, 0)))
    answered: list[int] = []
    a.on(link.CREDIT, lambda peer, r: answered.append(r.ref))
    joined: list[int] = []
    b.peer_joined.append(joined.append)
    mine, theirs = link.socket_pair()
    await a.connect(1, mine)
    pending = a.call(1, "add", 2, 3)
    a.send(1, link.Credit(5, 1))
    await asyncio.sleep(0.05)  # written; nobody reads the other end yet
    await b.connect(0, theirs)
    assert joined == [0]
    assert await asyncio.wait_for(pending, 10) == 5
    for _ in range(100):
        if answered:
            break
        await asyncio.sleep(0.01)
    assert answered == [5]
    a.close()
    b.close()


def test_a_link_replaced_before_its_loss_was_seen_fails_what_waited_on_it() -> None:
    asyncio.run(_link_replaced())


async def _link_replaced() -> None:
    """A peer's new link (its restart) can come before this worker saw the old one
    break: what waited on the old one (calls; confirms, via peer_lost) fails, as
    for a link that broke, before the new one joins."""
    a, b = await local_meshes(2)
    events: list[tuple[str, int]] = []
    a.peer_lost.append(lambda peer: events.append(("lost", peer)))
    a.peer_joined.append(lambda peer: events.append(("joined", peer)))
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    b.serve("hang", lambda peer: never)
    b.serve("add", lambda peer, x, y: x + y)
    pending = a.call(1, "hang")
    await asyncio.sleep(0.01)
    mine, theirs = link.socket_pair()
    await a.connect(1, mine)
    await b.connect(0, theirs)
    with pytest.raises(PeerDown):
        await asyncio.wait_for(pending, 10)
    assert events == [("lost", 1), ("joined", 1)]
    assert await asyncio.wait_for(a.call(1, "add", 1, 2), 10) == 3
    a.close()
    b.close()
