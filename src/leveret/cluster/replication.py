"""The leader's replication listener: each follower's handshake, its sync (manifest,
files) and then the live stream."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from leveret.cluster import datadir, wire
from leveret.cluster.follower import (
    handshake_timeout,
)
from leveret.cluster.leader import (
    FollowerLink,
    keepalive,
    keepalive_interval,
    read_manifest,
    send_files,
)

log = logging.getLogger("leveret.cluster")


class ReplicationListenerMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

    async def _serve_follower(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        link: FollowerLink | None = None
        beat: asyncio.Future[None] | None = None
        try:
            # (a follower sends HELLO as it connects, and gives up after this bound)
            kind, payload = await asyncio.wait_for(
                wire.read_frame(reader), handshake_timeout(self.ttl)
            )
            hello = json.loads(payload) if kind == wire.HELLO else {}
            reason = None
            if hello.get("cluster") != self.config.cluster_name:
                reason = f"this is cluster {self.config.cluster_name!r}"
            elif self.role != "leader" or self.tap is None or not getattr(self, "ready", False):
                reason = "not the leader"
            elif hello.get("workers", 1) != self.config.workers:
                # its copy would be served by another layout of stores, which reads
                # none of this one's (docs/workers.md, where data lives)
                reason = (
                    f"this cluster's nodes run --workers {self.config.workers}, "
                    f"{hello.get('node')} runs --workers {hello.get('workers', 1)}"
                )
            elif hello.get("epoch") != self.epoch:
                reason = f"epoch {hello.get('epoch')} is not the leader's {self.epoch}"
                if (hello.get("epoch") or 0) > self.epoch:
                    self._changed.set()
            if reason is not None:
                writer.write(wire.json_frame(wire.REFUSE, {"reason": reason}))
                await writer.drain()
                return
            interval = keepalive_interval(self.ttl)
            writer.write(
                wire.json_frame(
                    wire.WELCOME,
                    {
                        "epoch": self.epoch,
                        "leader": self.name,
                        "keepalive": interval,
                        "manifest_keepalive": True,  # it takes keepalives before MANIFEST
                    },
                )
            )
            watch = hello.get("keepalive") is True  # (an older follower sends none)
            # (`link` is set once the snapshot is sent and this loop reads the follower's
            # frames: only then can its silence be told from a long snapshot's)
            beat = asyncio.ensure_future(keepalive(writer, interval, lambda: link, watch))
            beating = hello.get("manifest_keepalive") is True
            kind, payload = await read_manifest(reader, interval, beating)
            if kind != wire.MANIFEST:
                return
            theirs = {p: (s, c) for p, s, c in json.loads(payload)}
            name = str(hello["node"])
            link = await self._snapshot(name, theirs, writer)
            if link is None:
                return
            while True:
                kind, payload = await wire.read_frame(reader)
                if kind == wire.ACK:
                    (position,) = wire.U64.unpack(payload)
                    link.acked = position
                    link.acked_at = time.monotonic()
                    if self.tap is not None:
                        self.tap.check()
                elif kind == wire.KEEPALIVE:
                    link.heard += 1
                elif kind == wire.STATUS:
                    link.heard += 1
                    link.status = json.loads(payload)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("cluster: replication link failed")
        finally:
            if beat is not None:
                beat.cancel()
            if link is not None:
                link.close()
                if self.links.get(link.name) is link:
                    del self.links[link.name]
                if self.tap is not None and link in self.tap.links:
                    self.tap.links.remove(link)
                log.info("cluster: follower %s disconnected", link.name)
            writer.close()

    async def _snapshot(
        self, name: str, theirs: datadir.Manifest, writer: asyncio.StreamWriter
    ) -> FollowerLink | None:
        """Bring a follower's copy to a point of the stream, then go live from it."""
        tap, server = self.tap, self.server
        if self.relay is not None and tap is not None:
            return await self._snapshot_workers(name, theirs, writer)
        if tap is None or server is None or server.durable_state is None:
            return None
        old = self.links.get(name)
        if old is not None:
            old.close()
            if old in tap.links:
                tap.links.remove(old)
        state = server.durable_state
        state.messages.flush(0)  # hand the loop turn's records to the writer thread
        tap.ship()
        link = FollowerLink(name, writer)
        link.snapshot_at = tap.position  # type: ignore[attr-defined]
        link.sent = tap.position
        tap.links.append(link)
        self.links[name] = link
        image = state.definitions.db.serialize()
        await self.loop.run_in_executor(None, state.messages.committer.drain)
        root = self.config.data_dir
        sends, deletes, total = await self.loop.run_in_executor(None, datadir.plan, root, theirs)
        log.info(
            "cluster: syncing %s: %d file(s), %d byte(s) to send, %d to delete",
            name,
            len(sends),
            total,
            len(deletes),
        )
        for rel in deletes:
            writer.write(wire.frame(wire.SNAP_DELETE, rel.encode()))
        writer.write(wire.snap_sqlite(datadir.DEFINITIONS, image))
        if not await send_files(self.loop, writer, root, sends, link):
            return None
        writer.write(wire.frame(wire.SNAP_END, wire.U64.pack(link.snapshot_at)))  # type: ignore[attr-defined]
        link.go_live()
        await writer.drain()
        return link

    async def _snapshot_workers(
        self, name: str, theirs: datadir.Manifest, writer: asyncio.StreamWriter
    ) -> FollowerLink | None:
        """`_snapshot` for a node of workers: one cut per worker (cluster/relay.py)."""
        tap, relay = self.tap, self.relay
        old = self.links.pop(name, None)
        if old is not None:
            old.close()
            if old in tap.links:
                tap.links.remove(old)
        link = await relay.sync_follower(name, theirs, writer, self.config.data_dir)
        if link is None:
            return None
        if self.tap is not tap or link.closed:  # stopped leading meanwhile
            link.close()
            return None
        self.links[name] = link
        return link
