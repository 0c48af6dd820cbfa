"""A real etcd and real `leveret server --cluster-etcd` subprocesses for the cluster tests.

Leases are short (1 s; etcd runs with 50 ms heartbeats so it allows them), so a
failover takes a second or two and the whole set stays within CI's budget.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from leveret.cluster import wire
from leveret.cluster.local import EtcdProcess, NodeProcess, etcd_binary

LEASE = 1.0

needs_etcd = pytest.mark.skipif(
    etcd_binary() is None, reason="etcd not installed (scripts/install-test-deps.sh)"
)


def etcd_get(url: str, key: str) -> Any:
    """One key's JSON value through etcd's JSON gateway (plain urllib: tests call this
    from inside event loops too)."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(url + "/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=2) as res:
        kvs = json.loads(res.read()).get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


class Cluster:
    def __init__(
        self,
        directory: str,
        size: int = 3,
        lease: float = LEASE,
        partitionable: bool = False,
        etcd_members: int = 1,
        replication_proxies: bool = False,
        **kwargs: Any,
    ) -> None:
        self.directory = directory
        # etcd_members > 1: an etcd cluster of that many members, every node given
        # every member's URL (self.etcd is the first)
        if etcd_members == 1:
            self.etcds = [EtcdProcess(os.path.join(directory, "etcd-data"))]
        else:
            self.etcds = [
                EtcdProcess(os.path.join(directory, f"etcd-data-{i}"), name=f"e{i}")
                for i in range(etcd_members)
            ]
            members = ",".join(f"{e.name}={e.peer_url}" for e in self.etcds)
            for e in self.etcds:
                e.initial_cluster = members
        for e in self.etcds:
            os.makedirs(e.directory, exist_ok=True)
            e.start(wait=False)
        for e in self.etcds:
            e.wait_healthy()
        self.etcd = self.etcds[0]
        self.name = "test"
        # partitionable: each node reaches etcd through a TcpProxy of its own, to cut
        self.etcd_proxies: dict[str, TcpProxy] = {}
        self.nodes = []
        for i in range(size):
            url = ",".join(e.url for e in self.etcds)
            if partitionable:
                proxy = TcpProxy("127.0.0.1", self.etcd.port)
                self.etcd_proxies[f"n{i}"] = proxy
                url = f"http://127.0.0.1:{proxy.port}"
            self.nodes.append(
                NodeProcess(f"n{i}", url, directory, cluster=self.name, lease=lease, **kwargs)
            )
        # replication_proxies: each node's replication listener is reached through a
        # ReplicationProxy of its own, which the node advertises (--cluster-advertise)
        self.replication_proxies: dict[str, ReplicationProxy] = {}
        if replication_proxies:
            for node in self.nodes:
                proxy = ReplicationProxy("127.0.0.1", node.cluster_port)
                self.replication_proxies[node.name] = proxy
                node.extra = (*node.extra, "--cluster-advertise", f"127.0.0.1:{proxy.port}")
        for node in self.nodes:
            node.start()

    def etcd_leader(self) -> EtcdProcess:
        """The member that leads the etcd cluster (raft's leader) now."""
        for e in self.etcds:
            if not e.running:
                continue
            req = urllib.request.Request(e.url + "/v3/maintenance/status", data=b"{}")
            try:
                with urllib.request.urlopen(req, timeout=2) as res:
                    status = json.loads(res.read())
            except OSError:
                continue
            if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                return e
        raise AssertionError("no etcd member leads")

    def node(self, name: str) -> NodeProcess:
        return next(n for n in self.nodes if n.name == name)

    def urls(self, first: NodeProcess | None = None) -> list[str]:
        nodes = sorted(self.nodes, key=lambda n: n is not first)
        return [n.url for n in nodes]

    def _get(self, key: str) -> Any:
        """From the first etcd member that answers (several: a member may be down)."""
        running = [e for e in self.etcds if e.running] or self.etcds
        for e in running[:-1]:
            try:
                return etcd_get(e.url, f"leveret/{self.name}/{key}")
            except OSError:
                continue
        return etcd_get(running[-1].url, f"leveret/{self.name}/{key}")

    def leader_name(self) -> str | None:
        try:
            info = self._get("leader")
        except Exception:
            return None
        return info["node"] if info else None

    def in_sync(self) -> list[str]:
        info = self._get("isr")
        return info["members"] if info else []

    def status(self) -> dict[str, Any]:
        return self._get("status") or {}

    def wait_leader(self, *, other_than: str | None = None, timeout: float = 30) -> NodeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.leader_name()
            if name is not None and name != other_than:
                return self.node(name)
            time.sleep(0.05)
        raise AssertionError(
            f"no leader (other than {other_than}) within {timeout} s\n{self.logs()}"
        )

    def wait_in_sync(self, names: set[str], timeout: float = 30, caught_up: bool = True) -> None:
        """Until exactly `names` are in sync and each follower among them is caught up
        (`caught_up=False`: the set only, as while a publisher keeps them a write behind
        now and then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not caught_up and set(self.in_sync()) == names:
                return
            status = self.status()
            if set(self.in_sync()) == names and status.get("leader") == self.leader_name():
                nodes = status.get("nodes", [])
                lags = {n["name"]: n["lag_bytes"] for n in nodes}
                if all(lags.get(name) == 0 for name in names):
                    return
            time.sleep(0.1)
        raise AssertionError(
            f"in-sync set {self.in_sync()} not {sorted(names)} in {timeout} s\n{self.logs()}"
        )

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{n.log_text()[-3000:]}" for n in self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        for proxy in [*self.etcd_proxies.values(), *self.replication_proxies.values()]:
            proxy.close()
        for e in self.etcds:
            e.stop()


@pytest.fixture
def cluster_dir(tmp_path: Any) -> Iterator[str]:
    path = str(tmp_path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(cluster_dir: str) -> Iterator[Cluster]:
    c = Cluster(cluster_dir)
    try:
        c.wait_leader()
        c.wait_in_sync({n.name for n in c.nodes})
        yield c
    finally:
        c.close()


class TcpProxy:
    """A TCP proxy on loopback that a test can cut, as a network partition would: from
    `cut()` on, bytes through it go nowhere and new connections are accepted but
    answered by nothing (no refusal, no reset: the other side hears silence, and its
    timeouts decide), until `heal()`, which drops the connections the cut broke."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import asyncio
        import threading

        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self.cut_off = False
        # While cut, a close of either side is lost too (as in a real partition, where
        # nobody hears the FIN): each side's own timeouts must find the other gone.
        self.swallow_closes = False
        self._writers: set[Any] = set()
        self._who: dict[Any, str | None] = {}  # each connection's owner (_identify)
        self._stalled: set[Any] = set()  # connections held as black holes
        self.stalls: dict[str | None, int] = {}  # black-holed connections, by owner
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _identify(self, reader: Any) -> tuple[bytes, str | None]:
        """What a new connection sent first, and whose it is (a subclass may read a
        greeting to tell connections apart); passed on unchanged."""
        return b"", None

    def _silent(self, who: str | None, way: str) -> bool:
        """Whether bytes of `who`'s connection going `way` ("up": to the target; "down":
        back from it) are lost."""
        return self.cut_off

    async def _serve(self, reader: Any, writer: Any) -> None:
        import asyncio
        import contextlib

        self._writers.add(writer)
        who = None
        try:
            first, who = await self._identify(reader)
            self._who[writer] = who
            if self._silent(who, "up"):
                # A black hole: hold the connection, answer nothing. Its first bytes are
                # lost, so it stays one even after a heal that keeps it (`_stalled`).
                self._stalled.add(writer)
                self.stalls[who] = self.stalls.get(who, 0) + 1
                await reader.read()
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            self._who[up_writer] = who
            if first:
                up_writer.write(first)

            async def pipe(src: Any, dst: Any, way: str) -> None:
                with contextlib.suppress(Exception):
                    while data := await src.read(65536):
                        if self._silent(who, way):
                            continue  # lost in the partition
                        dst.write(data)
                        await dst.drain()
                if self.swallow_closes and self._silent(who, way):
                    return  # (heal() drops the connection)
                with contextlib.suppress(Exception):
                    dst.close()

            await asyncio.gather(pipe(reader, up_writer, "up"), pipe(up_reader, writer, "down"))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._who.pop(writer, None)
            self._stalled.discard(writer)
            writer.close()

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "cut_off", True)

    def heal(self) -> None:
        def restore() -> None:
            for w in list(self._writers):  # they lost bytes: no use going on with them
                w.transport.abort()
            self._writers.clear()
            self.cut_off = False

        self.loop.call_soon_threadsafe(restore)

    def close(self) -> None:
        self.heal()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class ReplicationProxy(TcpProxy):
    """A TcpProxy in front of a node's replication listener (the node advertises it
    with --cluster-advertise) that cuts the link of one follower only: it reads each
    connection's HELLO frame to learn which follower it is."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.cut_nodes: set[str] = set()
        self.cut_to_nodes: set[str] = set()  # only the leader → follower direction
        self.cut_from_nodes: set[str] = set()  # only the follower → leader direction
        super().__init__(target_host, target_port)

    async def _identify(self, reader: Any) -> tuple[bytes, str | None]:
        kind, payload = await wire.read_frame(reader)
        who = json.loads(payload).get("node") if kind == wire.HELLO else None
        return wire.frame(kind, payload), who

    def _silent(self, who: str | None, way: str) -> bool:
        return (
            self.cut_off
            or who in self.cut_nodes
            or (way == "down" and who in self.cut_to_nodes)
            or (way == "up" and who in self.cut_from_nodes)
        )

    def cut_node(self, name: str, way: str = "both") -> None:
        """From now on `name`'s link through this proxy goes silent both ways, or one way
        only (an asymmetric partition): "to_node" from the leader to `name` (whose
        frames, its acknowledgements among them, still reach the leader), "from_node"
        from `name` to the leader (whose frames still reach `name`)."""
        cuts = {"both": self.cut_nodes, "to_node": self.cut_to_nodes}
        cuts["from_node"] = self.cut_from_nodes
        self.loop.call_soon_threadsafe(cuts[way].add, name)

    def heal_node(self, name: str, keep_stalled: bool = False) -> None:
        """Drop `name`'s connections (they lost bytes) and let new ones through.

        `keep_stalled`: leave the connections held as black holes (their greeting lost)
        as they are, as a NAT, a load balancer or a TCP proxy would that lost a
        connection's first bytes or its upstream: the peer that waits for an answer
        on one hears nothing until its own timeout gives up."""

        def restore() -> None:
            for w, who in list(self._who.items()):
                if who == name and not (keep_stalled and w in self._stalled):
                    w.transport.abort()
                    self._writers.discard(w)
                    del self._who[w]
            self.cut_nodes.discard(name)
            self.cut_to_nodes.discard(name)
            self.cut_from_nodes.discard(name)

        self.loop.call_soon_threadsafe(restore)
