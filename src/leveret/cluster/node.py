"""One cluster node: its etcd lease, the election, and the switch between roles.

A node is a follower (a replica of the leader's data dir, and proxies on its
client ports) or the leader (a whole `Server` on its data dir, and the
replication listener that feeds the followers). It is only ever one of them;
becoming leader starts the broker over the replica, as a restart after a crash
would, and stepping down stops it.

This module holds the node's life (its steps, etcd's view, leading); the other
parts are mixins of their own modules, over the same state: `lease` (the etcd
lease and its deadline), `election` (who may lead, the campaign), `following` (the
link to the leader and the client proxies), `insync` (the in-sync set and when
confirms may go out), `replication` (the leader's listener: handshakes, syncs,
streams) and `control` (status, metrics, `leveret ctl`).

The rules that keep confirmed writes safe (docs/cluster.md has the argument):
- Only a member of the in-sync set (`isr` in etcd) with a fully applied copy may
  take the lead, and it takes it with one etcd transaction that checks that no
  leader key exists and that the in-sync set and term are as it read them.
- The leader confirms a write only once every in-sync follower holds it, the
  set has at least `--cluster-min-replicas` members, and its lease is certainly
  valid: the lease's deadline counts from the *send* time of the renewal that
  etcd last granted, with a margin, on the monotonic clock.
- The in-sync set changes only through transactions that check the leader key
  is still this leader's (its epoch), and never shrinks below the minimum.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from typing import Any

from leveret.cluster import etcd as E
from leveret.cluster import nodestate, view
from leveret.cluster.control import ControlMixin
from leveret.cluster.election import ElectionMixin
from leveret.cluster.etcd import Etcd, EtcdError
from leveret.cluster.follower import (
    Follower,
)
from leveret.cluster.following import FollowingMixin
from leveret.cluster.insync import InSyncMixin
from leveret.cluster.keys import Keys
from leveret.cluster.leader import (
    FollowerLink,
    Tap,
)
from leveret.cluster.lease import LeaseMixin
from leveret.cluster.proxy import Proxy
from leveret.cluster.relay import Relay
from leveret.cluster.replication import ReplicationListenerMixin
from leveret.config import ServerConfig
from leveret.server.unix_path import short_path
from leveret.store import replica

log = logging.getLogger("leveret.cluster")

CTL_SOCKET = "leveret-cluster.sock"


def node_name(config: ServerConfig) -> str:
    return config.node_name or socket.gethostname()


class ClusterNode(
    LeaseMixin, ElectionMixin, FollowingMixin, InSyncMixin, ReplicationListenerMixin, ControlMixin
):
    def __init__(self, config: ServerConfig, loop: asyncio.AbstractEventLoop | None = None) -> None:
        assert config.cluster_etcd
        if not config.cluster_name:
            config.cluster_name = "leveret"  # every node reports the same cluster_name
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.name = node_name(config)
        self.keys = Keys(config.cluster_name)
        self.etcd = Etcd([u.strip() for u in config.cluster_etcd.split(",") if u.strip()])
        self.ttl = max(1, round(config.cluster_lease_seconds))
        self.lease = 0
        self.lease_deadline = 0.0
        self.lease_lost = False
        self.role = "starting"
        self.epoch = 0  # the leader key's revision as this node last read it
        self.leader: dict[str, Any] | None = None
        self.last_leader: str | None = None  # the node that led last, as far as we saw
        self.isr: list[str] = []
        self.isr_rev = 0
        self.term = 0
        self.members: list[str] = []
        self.alive: dict[str, dict[str, Any]] = {}
        self.handover: dict[str, Any] | None = None
        self.transfer: dict[str, Any] | None = None
        self.status: dict[str, Any] = {}
        self.server: Any = None
        self.tap: Tap | None = None
        # A node of workers, leading: their taps' relay into `tap` (cluster/relay.py)
        self.relay: Relay | None = None
        self.disk_error: str | None = None  # set when a write under the data dir failed
        self._follow_failures = 0  # following attempts that ended before a whole sync
        self._handshake_failures = 0  # handshakes in a row that got no WELCOME
        self._handshake_logged_at = 0.0  # when the last of them was logged
        self.links: dict[str, FollowerLink] = {}
        self.follower: Follower | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._proxies: list[Proxy] = []
        self._proxied_epoch = 0  # the leader's epoch the proxies' connections go to
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._isr_busy = False
        self._down_since: dict[str, float] = {}
        self._cut_off_since: float | None = None  # leading, unlinked from running followers
        self._campaign_after = 0.0  # a leader that gave the lead up lets others go first
        self._repl_server: asyncio.base_events.Server | None = None
        self._ctl_server: asyncio.base_events.Server | None = None
        self._stopping = False
        self.started_at = time.monotonic()
        self.host = _advertised(config.host)
        self.replication_address()  # a bad cluster_advertise (config file) fails here
        # What this node last knew of the cluster (cluster/nodestate.py): guards against
        # an etcd that lost its data.
        self.local = nodestate.load(config.data_dir, config.cluster_name)
        self.etcd_behind = False  # etcd knows less than this node did
        self._behind_logged = False
        self.registered_at = 0.0

    # ---- addresses -------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        c = self.config
        cluster_host, cluster_port = self.replication_address()
        return {
            "node": self.name,
            "host": self.host,
            "amqp": [[lst.kind, lst.port] for lst in c.effective_listeners()],
            "management": c.management_port or 0,
            "prometheus": c.prometheus_port or 0,
            "cluster": cluster_port,
            "cluster_host": cluster_host,
            "known_term": self.local.term,
        }

    def replication_address(self) -> tuple[str, int]:
        """Where the other nodes reach this node's replication listener: the host and
        --cluster-port, or --cluster-advertise (NAT, a Kubernetes Service, a proxy)."""
        given = self.config.cluster_advertise
        if not given:
            return self.host, self.config.cluster_port
        host, sep, port = given.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster_advertise: expected HOST:PORT, got {given!r}")
        return host.strip("[]"), int(port)

    def min_replicas(self) -> int:
        if self.config.cluster_min_replicas:
            return self.config.cluster_min_replicas
        return len(self.members) // 2 + 1 if self.members else 1

    # ---- life ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> int:
        self.stop_event = stop
        if not await self._register():
            log.info("cluster node %s stopped before it could register with etcd", self.name)
            await self.etcd.close()
            return 0
        self._tasks.append(asyncio.ensure_future(self._keepalive()))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        self._repl_server = await asyncio.start_server(
            self._serve_follower, self.config.host, self.config.cluster_port, reuse_address=True
        )
        ctl_path = os.path.join(self.config.data_dir, CTL_SOCKET)
        os.makedirs(self.config.data_dir, exist_ok=True)
        with short_path(ctl_path) as path:  # a data dir may be deep (server/unix_path.py)
            if os.path.exists(path):
                os.unlink(path)
            self._ctl_server = await asyncio.start_unix_server(self._serve_ctl, path)
            os.chmod(path, 0o600)
        log.info(
            "cluster node %s of %s: replication on %s:%d (reached at %s:%d), etcd %s",
            self.name,
            self.config.cluster_name,
            self.config.host,
            self.config.cluster_port,
            *self.replication_address(),
            self.config.cluster_etcd,
        )
        try:
            while not stop.is_set():
                await self._step()
        finally:
            await self._shutdown()
        return 0

    async def _wait(self, timeout: float) -> None:
        """Until etcd state changes, the node is asked to stop, or `timeout`."""
        self._changed.clear()
        waiters = [asyncio.ensure_future(self._changed.wait())]
        waiters.append(asyncio.ensure_future(self.stop_event.wait()))
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()

    async def _step(self) -> None:
        try:
            await self._refresh()
        except EtcdError as exc:
            log.warning("etcd: %s", exc)
            await self._wait(0.5)
            return
        await self._remember()
        if self.etcd_behind and not self.local.force_boot:
            # etcd lost what it knew (see nodestate): a leader in it is not ours to follow
            self.leader = None
            await self._follow_none()
            await self._wait(1.0)
            return
        if self.leader is None:
            if await self._campaign():
                await self._lead()
                return
            await self._follow_none()
            await self._wait(0.2)
            return
        if self.leader.get("node") == self.name and self.leader.get("lease") == self.lease:
            # Our own key (e.g. after a transaction we could not see the answer of).
            await self._lead()
            return
        await self._follow()
        await self._wait(1.0)

    async def _watch(self) -> None:
        revision = 0
        while True:
            try:
                _kvs, revision = await self.etcd.get_prefix(self.keys.base)
                async for _event in self.etcd.watch(self.keys.base, revision + 1):
                    self._changed.set()
            except EtcdError as exc:
                log.debug("etcd watch: %s", exc)
                self._changed.set()
                await asyncio.sleep(0.3)
            except Exception:
                log.exception("etcd watch failed")
                await asyncio.sleep(0.3)

    async def _refresh(self) -> None:
        kvs, _rev = await self.etcd.get_prefix(self.keys.base)
        by_key = {kv.key: kv for kv in kvs}
        leader = by_key.get(self.keys.leader)
        if leader is not None:
            self.leader = {**json.loads(leader.value), "lease": leader.lease}
            self.epoch = leader.mod_revision
            self.last_leader = self.leader.get("node")
        else:
            self.leader = None
        isr = by_key.get(self.keys.isr)
        if isr is not None and self.role != "leader":
            self.isr = json.loads(isr.value)["members"]
            self.isr_rev = isr.mod_revision
        elif isr is None:
            self.isr, self.isr_rev = [], 0
        term = by_key.get(self.keys.term)
        self.term = int(term.value) if term is not None else 0
        self._term_rev = term.mod_revision if term is not None else 0
        self._isr_kv = isr
        self.members = sorted(
            k[len(self.keys.members) :] for k in by_key if k.startswith(self.keys.members)
        )
        self.alive = {
            k[len(self.keys.nodes) :]: json.loads(kv.value)
            for k, kv in by_key.items()
            if k.startswith(self.keys.nodes)
        }
        handover = by_key.get(self.keys.handover)
        self.handover = json.loads(handover.value) if handover is not None else None
        transfer = by_key.get(self.keys.transfer)
        self.transfer = json.loads(transfer.value) if transfer is not None else None
        status = by_key.get(self.keys.status)
        self.status = json.loads(status.value) if status is not None else {}

    async def _remember(self, holds: bool = False) -> None:
        """Keep this node's record of the cluster (nodestate) up with etcd; notice an
        etcd that knows less than this node did.

        A node that has no record yet (new, or its data dir was replaced) starts one
        only once its copy is known good: it leads (`holds`), or it finished a sync
        from the leader. Until then it may not be elected even if etcd's in-sync set
        still names it: a node that lost its disk and came back under its old name
        must not lead the others into its empty copy."""
        local = self.local
        self.etcd_behind = self.term < local.term
        if self.etcd_behind:
            if not self._behind_logged:
                self._behind_logged = True
                log.error(
                    "cluster: etcd knows cluster %r at term %d, but this node saw term %d "
                    "(%s): did etcd lose its data? %s neither leads nor follows until "
                    "`leveret ctl force_boot` runs on the node whose copy should win",
                    self.config.cluster_name,
                    self.term,
                    local.term,
                    local.describe(),
                    self.name,
                )
            return
        self._behind_logged = False
        follower = self.follower
        synced = follower is not None and follower.synced and follower.epoch == self.epoch
        if local.term == 0 and not (holds or synced):
            return
        in_sync = self.name in self.isr
        if self.term > local.term or (self.term == local.term and in_sync != local.in_sync):
            local.term, local.in_sync = self.term, in_sync
            try:
                await asyncio.to_thread(nodestate.save, self.config.data_dir, local)
            except OSError as exc:
                log.warning("cluster: cannot record the cluster's state locally: %s", exc)

    # ---- leading ---------------------------------------------------------------------

    async def _lead(self) -> None:
        from leveret.launcher import Node

        self.role = "leader"
        await self._stop_following()
        await self._stop_proxies()
        tap = Tap(self.config.data_dir, self.loop)
        tap.safe = self._safe_position
        tap.on_failed = self._disk_failed
        self.disk_error = None
        self.tap = tap
        self.links = {}
        if self.config.workers > 1:
            server = self._workers(tap)
        else:
            replica.TAP = tap
            server = Node(self.config, loop=self.loop)
            server.cluster = self
            tap.output_batch = server.output_batch
        self.server = server
        reason = "stopped"
        try:
            await server.start(wait_for_recovery=True)
            self.ready = True
            reason = await self._while_leading()
        except Exception:
            log.exception("cluster: the broker failed while leading")
            reason = "error"
        finally:
            self.ready = False
            if reason == "handover":
                pass  # _hand_over stopped the server and the tap
            else:
                await self._step_down(reason)

    def _workers(self, tap: Tap) -> Any:
        """A node of workers leads with them (cluster/leading.py): their stores'
        writes reach `tap` through the relay, and their confirms wait for its grants."""
        from leveret.cluster.leading import LeaderWorkers

        self.relay = Relay(tap, self.confirm_deadline, self._disk_failed, self.config.workers)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        return LeaderWorkers(self.config, self.relay, self._worker_restarted, level)

    def _worker_restarted(self, index: int) -> None:
        """A worker of this leader started again: it may have reported writes that it
        never made, which the followers hold. Each follower connects again and has its
        files compared with this node's, as a rejoining node has."""
        log.warning(
            "cluster: worker %d of leader %s started again; its followers sync again",
            index,
            self.name,
        )
        for link in list(self.links.values()):
            link.close()

    async def _while_leading(self) -> str:
        """Lead until something ends it; returns why."""
        last_status = 0.0
        while True:
            if getattr(self.server, "exited", False):
                log.error("cluster: %s's workers stopped; stepping down", self.name)
                return "error"
            if self.stop_event.is_set():
                if await self._hand_over(None):
                    return "handover"
                return "stopped"
            if self.disk_error is not None:
                log.error(
                    "cluster: %s could not write its data dir (%s); it hands the lead over "
                    "and leaves the in-sync set",
                    self.name,
                    self.disk_error,
                )
                if await self._hand_over(None, leave_isr=True):
                    return "handover"
                return "disk"
            now = time.monotonic()
            if self.lease_lost or now > self.lease_deadline:
                log.warning("cluster: %s lost its lease; stepping down", self.name)
                return "lease"
            try:
                await self._refresh_leading()
            except EtcdError:
                pass  # the lease deadline decides
            if self.leader is None or self.leader.get("node") != self.name:
                log.warning("cluster: the leader key is no longer %s's; stepping down", self.name)
                return "deposed"
            if self.transfer and self.transfer.get("target") not in (None, self.name):
                target = self.transfer["target"]
                try:
                    await self.etcd.delete(self.keys.transfer)
                except EtcdError:
                    pass
                if await self._hand_over(target):
                    return "handover"
            await self._maintain_isr()
            if self._cut_off(now):
                log.warning(
                    "cluster: %s cannot reach the in-sync followers it needs to confirm "
                    "(%s), which etcd says run: it is cut off from them; giving the lead up "
                    "so that one of them leads",
                    self.name,
                    ", ".join(self._unlinked()),
                )
                return "cut off"
            if self.tap is not None:
                self.tap.check()
            tell = getattr(self.server, "tell_cluster", None)
            if tell is not None:  # a node of workers: worker 0 shows the cluster
                tell(view.snapshot(self))
            if now - last_status > 1.0:
                last_status = now
                await self._publish_status()
            await self._wait(0.1)

    def _disk_failed(self, path: str, error: BaseException) -> None:
        """The store could not write or fsync (a full disk, an I/O error). What it rolled
        back the followers may hold; what it confirmed they hold. So a follower can take
        over with every confirmed write, and this node, whose copy is now suspect, must
        not lead: it hands over (or, with no in-sync follower, restarts its broker over
        its copy, as a standalone broker would) and catches up as a follower."""
        if self.disk_error is None and self.role == "leader":
            self.disk_error = f"{path}: {error}"

    async def _refresh_leading(self) -> None:
        kv = await self.etcd.get(self.keys.leader)
        if kv is None or kv.mod_revision != self.epoch:
            self.leader = None if kv is None else json.loads(kv.value)
            return
        if self._changed.is_set():
            saved_isr, saved_rev = self.isr, self.isr_rev
            await self._refresh()
            kv = self._isr_kv
            if kv is not None and kv.mod_revision > saved_rev:
                theirs = json.loads(kv.value)["members"]
                if set(theirs) < set(saved_isr) and self.name in theirs:
                    # `forget_cluster_node` took a node out: a smaller set is always
                    # safe (each member still holds every confirmed write)
                    saved_isr, saved_rev = theirs, kv.mod_revision
            self.isr, self.isr_rev = saved_isr, saved_rev

    async def _step_down(self, reason: str) -> None:
        tap, server = self.tap, self.server
        self.tap = None
        if tap is not None:
            tap.stop()
        if self.relay is not None:
            self.relay.stop()  # the workers release nothing from now on
            self.relay = None
        self.links = {}
        self.server = None
        try:
            if server is not None:
                try:
                    await server.stop(reason="leader stepped down")
                except Exception:  # noqa: BLE001 - a failing disk; the node follows all the same
                    log.exception("cluster: the broker did not stop cleanly")
        finally:
            # The stopped tap stays the store's until the broker is stopped: its clients'
            # connections stay open while it stops (a slow management request, MQTT, or
            # links can hold the stop for seconds), and without a tap the store would
            # confirm their writes on this node's fsync alone, as a standalone broker
            # does. Through the stopped tap it confirms nothing, holds definition
            # changes' answers and stream reads, and the clients publish again to the
            # new leader once their connections close.
            if replica.TAP is tap:
                replica.TAP = None
        self.role = "follower"
        if reason == "cut off":
            # Those that run without it elect one of them; this node follows that one
            # once it can reach it (it stays in the set only while it is needed there).
            self._campaign_after = time.monotonic() + 2 * self.ttl
        self._cut_off_since = None
        if reason in ("disk", "cut off"):
            # No in-sync follower to hand over to: give the lead up all the same; this
            # node may win it again and start its broker over its copy.
            try:
                await self.etcd.txn(
                    [E.cmp_mod_revision(self.keys.leader, self.epoch)],
                    [E.op_delete(self.keys.leader)],
                )
            except EtcdError:
                pass
        if reason in ("lease", "deposed", "error"):
            try:
                if reason == "lease" or self.lease_lost:
                    await self._register()
            except EtcdError:
                pass
        log.info("cluster: %s stopped leading (%s)", self.name, reason)

    async def _publish_status(self) -> None:
        status = self.cluster_status()
        try:
            await self.etcd.put(self.keys.status, json.dumps(status), self.lease)
        except EtcdError:
            pass

    async def _hand_over(self, target: str | None, leave_isr: bool = False) -> bool:
        """Stop serving, let a caught-up follower take over; False if none could.

        `leave_isr`: this node also leaves the in-sync set (its copy is suspect), in the
        same etcd transaction, so it cannot be elected before it has caught up again."""
        tap, server = self.tap, self.server
        if tap is None or server is None:
            return False
        deadline = time.monotonic() + max(2.0, self.ttl)
        while True:  # a follower may be finishing its sync: give it a moment
            candidates = [
                link
                for link in self.links.values()
                if link.state == "live" and not link.closed and link.name in self.isr
            ]
            if target is not None:
                candidates = [link for link in candidates if link.name == target]
            if candidates or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if not candidates:
            log.info(
                "cluster: no in-sync follower to hand over to%s", f" ({target})" * bool(target)
            )
            return False
        link = max(candidates, key=lambda lk: lk.acked)
        log.info("cluster: handing over to %s", link.name)
        try:
            await server.stop(reason="leadership transferred")  # writes the clean-shutdown index
        except Exception:  # noqa: BLE001 - a failing disk: the followers have every confirm
            log.exception("cluster: the broker did not stop cleanly")
        self.server = None
        tap.ship()
        deadline = time.monotonic() + max(5.0, 2 * self.ttl)
        while link.acked < tap.position and not link.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        caught_up = link.acked >= tap.position
        ops = [
            E.op_put(
                self.keys.handover,
                json.dumps({"target": link.name if caught_up else None, "epoch": self.epoch}),
            ),
            E.op_delete(self.keys.leader),
        ]
        if leave_isr:
            members = [n for n in self.isr if n != self.name]
            ops.append(E.op_put(self.keys.isr, json.dumps({"members": members})))
        try:
            await self.etcd.txn([E.cmp_mod_revision(self.keys.leader, self.epoch)], ops)
        except EtcdError as exc:
            log.warning("cluster: handover not written to etcd: %s", exc)
        self.tap = None
        replica.TAP = None
        tap.stop()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        self.links = {}
        self.role = "follower"
        self.leader = None
        return True

    # ---- stopping --------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if self.role == "leader":
            await self._step_down("stopped")
        await self._stop_following()
        await self._stop_proxies()
        for task in self._tasks:
            task.cancel()
        for server in (self._repl_server, self._ctl_server):
            if server is not None:
                server.close()
        try:
            await self.etcd.lease_revoke(self.lease)
        except EtcdError:
            pass
        await self.etcd.close()


def _advertised(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return host
