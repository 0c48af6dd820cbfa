"""One cluster node: its etcd lease, the election, and the switch between roles.

A node is a follower (a replica of the leader's data dir, and proxies on its
client ports) or the leader (a whole `Server` on its data dir, and the
replication listener that feeds the followers). It is only ever one of them;
becoming leader starts the broker over the replica, as a restart after a crash
would, and stepping down stops it.

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
import resource
import socket
import time
from typing import Any

from leveret.cluster import datadir, nodestate, wire
from leveret.cluster import etcd as E
from leveret.cluster.etcd import Etcd, EtcdError
from leveret.cluster.follower import (
    CopyFailed,
    Follower,
    NoWelcome,
    Refused,
    Silent,
    handshake_timeout,
    syncing,
)
from leveret.cluster.keys import Keys
from leveret.cluster.leader import (
    LAG_TIMEOUT_FRACTION,
    FollowerLink,
    Tap,
    keepalive,
    keepalive_interval,
    read_manifest,
)
from leveret.cluster.proxy import Proxy
from leveret.config import ServerConfig
from leveret.server.unix_path import short_path
from leveret.store import replica

log = logging.getLogger("leveret.cluster")

CTL_SOCKET = "leveret-cluster.sock"


def node_name(config: ServerConfig) -> str:
    return config.node_name or socket.gethostname()


class ClusterNode:
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

    def lease_ok(self) -> bool:
        margin = 0.05 + 0.1 * self.ttl
        return not self.lease_lost and time.monotonic() < self.lease_deadline - margin

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

    async def _register(self) -> bool:
        """Take a lease and write this node's keys; False if asked to stop first.

        etcd may be down for as long as an operator takes to notice, so the retries
        back off (0.5 s doubling to 5 s, one warning each) and a SIGTERM ends them,
        even in the middle of a request to an etcd that does not answer.
        """
        delay = 0.5
        while not self.stop_event.is_set():
            attempt = asyncio.ensure_future(self._register_once())
            stopping = asyncio.ensure_future(self.stop_event.wait())
            done, _ = await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if attempt not in done:
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                break
            try:
                attempt.result()
                return True
            except EtcdError as exc:
                log.warning(
                    "cluster: cannot register with etcd yet (retrying in %.1f s): %s", delay, exc
                )
            try:
                await asyncio.wait_for(self.stop_event.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 5.0)
        return False

    async def _register_once(self) -> None:
        self.lease, self.ttl = await self.etcd.lease_grant(self.ttl)
        self.lease_deadline = time.monotonic() + self.ttl
        self.lease_lost = False
        info = json.dumps(self.info())
        await self.etcd.put(self.keys.nodes + self.name, info, self.lease)
        await self.etcd.put(self.keys.members + self.name, info)
        self.registered_at = time.monotonic()

    async def _keepalive(self) -> None:
        # Every third of the lease: a live leader may miss one renewal (a slow etcd, a
        # busy machine) and still confirm. (A dead leader is noticed a lease after its
        # last renewal, so renewing at half the lease would shorten failovers by about
        # 0.4 s with 5 s leases; tests with 1 s leases on a loaded machine then saw
        # leaders step down for one late answer.)
        while True:
            interval = self.ttl / 3
            sent = time.monotonic()
            try:
                ttl = await self.etcd.lease_keepalive(self.lease, timeout=interval)
            except EtcdError as exc:
                log.debug("lease renewal failed: %s", exc)
                ttl = None
            if ttl == 0:
                log.warning("cluster: lease expired in etcd")
                self.lease_lost = True
                self._changed.set()
                if self.role != "leader":
                    await self._register()
                    continue
            elif ttl:
                self.lease_deadline = sent + ttl
            elif time.monotonic() > self.lease_deadline:
                self._changed.set()
            if self.tap is not None:
                self.tap.check()
            await asyncio.sleep(max(0.05, interval - (time.monotonic() - sent)))

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

    async def force_boot(self) -> dict[str, Any]:
        """`leveret ctl force_boot`: this node's copy wins; it leads at the next chance."""
        await self._refresh()
        if self.local.term == 0:
            raise ValueError(
                f"{self.name} never belonged to cluster {self.config.cluster_name!r}: "
                "nothing to force (run it on a node whose copy should win)"
            )
        if self.term >= self.local.term:
            raise ValueError(
                f"etcd holds cluster {self.config.cluster_name!r} at term {self.term} "
                f"(this node saw {self.local.term}): nothing to force"
            )
        if self.leader is not None:
            raise ValueError(
                f"node {self.leader.get('node')!r} leads a cluster etcd started afresh; "
                "stop it first"
            )
        self.local.force_boot = True
        await asyncio.to_thread(nodestate.save, self.config.data_dir, self.local)
        self._changed.set()
        return {"node": self.name, "term": self.local.term}

    # ---- the election ----------------------------------------------------------------

    def eligible(self) -> bool:
        if syncing(self.config.data_dir):
            return False
        if self.local.force_boot:
            return True
        if self.etcd_behind:
            return False
        if not self.isr:
            # A new cluster, as far as etcd knows: not while a node that knew one is
            # registered (etcd may have lost its data), and not before the others had a
            # lease's time to register.
            if any(int(n.get("known_term") or 0) > 0 for n in self.alive.values()):
                return False
            return time.monotonic() - self.registered_at >= self.ttl
        # in the set, and with a copy this node knows to be its own (see _remember)
        return self.name in self.isr and self.local.term > 0

    async def _campaign(self) -> bool:
        if not self.eligible() or self.lease_lost or not self.lease_ok():
            return False
        if time.monotonic() < self._campaign_after:
            return False
        if self.handover and self.handover.get("target") != self.name:
            # A leader handed over to another node on purpose: let it go first.
            if time.monotonic() - self.handover.setdefault("_seen", time.monotonic()) < self.ttl:
                return False
        isr_kv = self._isr_kv
        members = list(self.isr) if self.isr else [self.name]
        if self.name not in members:
            members.append(self.name)
        term = self.term
        if self.local.force_boot:
            members = [self.name]  # the others catch up from this copy, then join
            term = max(term, self.local.term)
        # The last leader's lease ran out (or it handed over): it is gone or cut off,
        # so it leaves the set now rather than hold the new leader's first confirms
        # until it times out; but never below the minimum (then it is still needed).
        gone = self.last_leader
        if gone and gone != self.name and gone in members:
            without = [m for m in members if m != gone]
            if len(without) >= self.min_replicas():
                members = without
        ok, revision, _ = await self.etcd.txn(
            [
                E.cmp_create_revision(self.keys.leader, 0),
                E.cmp_mod_revision(self.keys.isr, isr_kv.mod_revision if isr_kv else 0),
                E.cmp_mod_revision(self.keys.term, self._term_rev),
            ],
            [
                E.op_put(self.keys.leader, json.dumps(self.info()), self.lease),
                E.op_put(self.keys.isr, json.dumps({"members": members})),
                E.op_put(self.keys.term, str(term + 1)),
                E.op_delete(self.keys.handover),
            ],
        )
        if not ok:
            return False
        self.epoch = revision
        self.isr, self.isr_rev = members, revision
        self.term = term + 1
        if self.local.force_boot:
            log.warning("cluster: %s forced its boot: its copy is the cluster's", self.name)
            self.local.force_boot = False
        await self._remember(holds=True)
        self.leader = {**self.info(), "lease": self.lease}
        log.info("cluster: %s leads (epoch %d, term %d)", self.name, revision, self.term)
        return True

    # ---- following -------------------------------------------------------------------

    def _leader_port(self, kind: str) -> tuple[str, int] | None:
        leader = self.leader
        if leader is None or self.role != "follower":
            return None
        if kind in ("management", "prometheus"):
            port = leader.get(kind) or 0
        else:
            port = next((p for k, p in leader.get("amqp", []) if k == kind), 0)
        return (leader["host"], port) if port else None

    async def _start_proxies(self) -> None:
        if self._proxies:
            return
        c = self.config
        hold = 3.0 * self.ttl
        wanted = [(lst.host, lst.port, lst.kind) for lst in c.effective_listeners()]
        if c.management_port:
            wanted.append((c.host, c.management_port, "management"))
        if c.prometheus_port:
            wanted.append((c.host, c.prometheus_port, "prometheus"))
        for host, port, kind in wanted:
            proxy = Proxy(host, port, lambda k=kind: self._leader_port(k), hold, kind)
            for attempt in range(50):
                try:
                    await proxy.start()
                    break
                except OSError:
                    if attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
            self._proxies.append(proxy)

    async def _stop_proxies(self) -> None:
        for proxy in self._proxies:
            await proxy.stop()
        self._proxies = []

    async def _follow_none(self) -> None:
        """No leader: keep the proxies (they hold new clients) and stop following."""
        self.role = "follower"
        await self._start_proxies()
        await self._stop_following()

    async def _follow(self) -> None:
        self.role = "follower"
        await self._start_proxies()
        leader = self.leader
        assert leader is not None
        if self.follower is not None and self.follower.epoch == self.epoch:
            if self._follow_task is not None and not self._follow_task.done():
                return
        await self._stop_following()
        if self._proxied_epoch != self.epoch:
            # Connections proxied to an older leader go; but not when the follower only
            # connects again to the same leader (its replication link failed or was cut):
            # its clients' connections to that leader are as good as ever.
            for proxy in self._proxies:
                proxy.drop_all()
            self._proxied_epoch = self.epoch
            # A new leader is tried at once, and again soon if it is still starting
            # (it refuses until its broker is up), whatever the last one cost.
            self._handshake_failures = 0
        self.follower = Follower(
            self.config.data_dir,
            self.name,
            self.config.cluster_name,
            leader,
            self.epoch,
            self.config.fsync != "never",
            self.local_status,
            handshake_timeout(self.ttl),
        )
        self._follow_task = asyncio.ensure_future(self._run_follower(self.follower))

    async def _run_follower(self, follower: Follower) -> None:
        copy_failed = False
        why = ""  # why the handshake failed, for its log line
        try:
            await follower.run()
        except NoWelcome as exc:
            why = str(exc)
        except Refused as exc:
            if follower.welcomed:
                log.info("cluster: %s", exc)
            else:
                why = str(exc)
        except Silent as exc:
            log.warning(
                "cluster: %s heard %s: the link is dead; dropping it to connect again and "
                "sync what it lacks",
                self.name,
                exc,
            )
        except CopyFailed as exc:
            copy_failed = True
            log.warning("cluster: %s could not write its copy of the data dir: %s", self.name, exc)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            what = str(exc) or exc.__class__.__name__
            if follower.welcomed:
                log.info("cluster: link to leader %s: %s", follower.leader.get("node"), what)
            else:
                why = f"handshake with leader {follower.leader.get('node')}: {what}"
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cluster: following %s failed", follower.leader.get("node"))
        if not follower.welcomed:
            await self._handshake_failed(follower, why or "the link closed")
            return
        self._handshake_failures = 0
        # A follower that keeps failing (its own disk full, say) backs off rather than
        # asking the leader for a snapshot five times a second. Only streaming resets
        # the count: a nearly full disk may take a small snapshot and fail at its next
        # write, and each time it went live it would hold the leader's confirms again
        # (and restart the leader's clock for taking it out of the in-sync set).
        if follower.streamed:
            self._follow_failures = 0  # it streamed: whatever ended it is a first failure
        if copy_failed or not follower.synced:
            self._follow_failures += 1
        elif not follower.streamed:
            self._follow_failures = 0  # synced, then the link ended (a new leader, say)
        pause = min(0.2 * 2 ** max(0, self._follow_failures - 1), 5.0)
        if copy_failed:
            log.warning("cluster: %s retries following in %.1f s", self.name, pause)
        await self._follow_again(follower, pause)

    async def _handshake_failed(self, follower: Follower, why: str) -> None:
        """No WELCOME: the leader was not reached, did not answer in time, or refused.

        That is the link's fault (or the leader's state), not this copy's, and cost the
        leader nothing (no snapshot was asked for), so it does not count towards the
        copy's back-off above. Attempts start at most every 0.2 s, doubling up to the
        handshake's own bound: one that timed out already waited that long and goes
        again at once, one refused at once does not spin. So a follower whose link
        healed is back within about one bound (0.8 lease) of the heal."""
        self._handshake_failures += 1
        n = self._handshake_failures
        spacing = min(0.2 * 2 ** (n - 1), follower.handshake)
        pause = max(0.0, spacing - follower.handshake_seconds)
        # A timeout is a partition's mark (warning); a refusal or a closed port is
        # what a leader starting, stopping or changing looks like (info).
        level = (
            logging.WARNING if follower.handshake_seconds >= follower.handshake else logging.INFO
        )
        # A partition may last hours: the first few failures, then one line a minute.
        now = time.monotonic()
        if n <= 3 or now - self._handshake_logged_at >= 60.0:
            self._handshake_logged_at = now
            log.log(
                level,
                "cluster: %s: %s; connecting again in %.1f s (%d in a row)",
                self.name,
                why,
                pause,
                n,
            )
        await self._follow_again(follower, pause)

    async def _follow_again(self, follower: Follower, pause: float) -> None:
        await asyncio.sleep(pause)
        self._changed.set()
        if self.follower is follower:
            self._follow_task = None  # the next step starts again

    async def _stop_following(self) -> None:
        task, follower = self._follow_task, self.follower
        self._follow_task = None
        self.follower = None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if follower is not None:
            await follower.close()

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

    async def _while_leading(self) -> str:
        """Lead until something ends it; returns why."""
        last_status = 0.0
        while True:
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
            if now - last_status > 1.0:
                last_status = now
                await self._publish_status()
            await self._wait(0.1)

    def _unlinked(self) -> list[str]:
        """In-sync followers with no live link to this leader."""
        out = []
        for name in self.isr:
            link = self.links.get(name)
            if name != self.name and (link is None or link.closed or link.state != "live"):
                out.append(name)
        return out

    def _cut_off(self, now: float) -> bool:
        """Whether this leader has been unable to confirm for a while because in-sync
        followers it needs have no link to it, while etcd says they run (their leases
        are renewed): a partition between it and them, not their death.

        Dead followers (their leases expired) keep the leader as it is: confirms wait
        until one returns. Cut-off ones could lead without it (they reach etcd and may
        reach each other), while it, holding its lease, would keep the cluster from
        confirming for as long as the partition lasts: past two leases (at least 3 s:
        the time a follower takes to find a dead link and connect again) it gives up
        the lead."""
        unlinked = self._unlinked()
        linked = len(self.isr) - len(unlinked)  # this leader included
        if linked >= self.min_replicas() or not any(n in self.alive for n in unlinked):
            self._cut_off_since = None
            return False
        if self._cut_off_since is None:
            self._cut_off_since = now
        return now - self._cut_off_since > max(3.0, 2 * self.ttl)

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
        replica.TAP = None
        if tap is not None:
            tap.stop()
        self.links = {}
        self.server = None
        if server is not None:
            try:
                await server.stop(reason="leader stepped down")
            except Exception:  # noqa: BLE001 - a failing disk; the node follows all the same
                log.exception("cluster: the broker did not stop cleanly")
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

    def _safe_position(self) -> int:
        """The stream position up to which held confirms may go out now (-1: none)."""
        tap = self.tap
        if tap is None or self.role != "leader" or not self.lease_ok():
            return -1
        if len(self.isr) < self.min_replicas():
            return -1
        safe = tap.position
        for name in self.isr:
            if name == self.name:
                continue
            link = self.links.get(name)
            if link is None or link.state != "live":
                return -1
            safe = min(safe, link.acked)
        for link in self.links.values():
            if link.required and link.name not in self.isr:
                safe = min(safe, link.acked)
        return safe

    async def _maintain_isr(self) -> None:
        """Let caught-up followers in, and slow or gone ones out (never below the minimum)."""
        if self._isr_busy or self.tap is None:
            return
        now = time.monotonic()
        limit = max(0.5, LAG_TIMEOUT_FRACTION * self.ttl)
        position = self.tap.position
        for link in list(self.links.values()):
            if link.state != "live" or link.closed:
                continue
            if link.acked >= link.sent:
                link.acked_at = now
            if link.name in self.isr:
                continue
            recent = now - link.acked_at <= limit  # it acknowledges: not stuck or cut off
            if not link.required and recent and link.acked >= getattr(link, "snapshot_at", 0):
                link.required = True
                link.join_at = position
            elif link.required and link.join_at is not None and link.acked >= link.join_at:
                await self._change_isr([*self.isr, link.name])
                return
        worst = None
        for name in self.isr:
            if name == self.name:
                continue
            link = self.links.get(name)
            if link is None or link.closed or link.state != "live":
                since = self._down_since.setdefault(name, now)
            else:
                self._down_since.pop(name, None)
                since = link.acked_at if link.acked < link.sent else now
            if now - since > limit:
                worst = name
        for link in list(self.links.values()):
            if link.required and link.name not in self.isr and now - link.acked_at > limit:
                link.required = False  # a joiner that cannot keep up does not hold confirms
                link.join_at = None
        if worst is not None and len(self.isr) > self.min_replicas():
            log.warning("cluster: %s leaves the in-sync set (behind or gone)", worst)
            link = self.links.get(worst)
            if link is not None:
                # Still connected but silent (a cut link, a hung disk): it must join
                # again from scratch, not at once on its old join point, and not hold
                # confirms as a joiner until it acknowledges again.
                link.required = False
                link.join_at = None
            await self._change_isr([n for n in self.isr if n != worst])

    async def _change_isr(self, members: list[str]) -> None:
        self._isr_busy = True
        try:
            ok, revision, _ = await self.etcd.txn(
                [
                    E.cmp_mod_revision(self.keys.leader, self.epoch),
                    E.cmp_mod_revision(self.keys.isr, self.isr_rev),
                ],
                [E.op_put(self.keys.isr, json.dumps({"members": members}))],
            )
            if ok:
                log.info("cluster: in-sync set %s", members)
                self.isr, self.isr_rev = members, revision
                for name in members:
                    self._down_since.pop(name, None)
                if self.tap is not None:
                    self.tap.check()
            else:
                kv = await self.etcd.get(self.keys.isr)
                if kv is not None:
                    self.isr, self.isr_rev = json.loads(kv.value)["members"], kv.mod_revision
        except EtcdError as exc:
            log.warning("cluster: in-sync set not changed: %s", exc)
        finally:
            self._isr_busy = False

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
        self.links = {}
        self.role = "follower"
        self.leader = None
        return True

    # ---- the replication listener (leader side) ---------------------------------------

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
        for transfer in sends:
            offset = transfer.start
            fresh = transfer.fresh
            path = os.path.join(root, transfer.path)
            while True:
                chunk = await self.loop.run_in_executor(None, _read_at, path, offset)
                if chunk is None:
                    break
                if chunk or fresh:
                    writer.write(wire.snap_file(transfer.path, offset, chunk, fresh))
                    await writer.drain()
                fresh = False
                if len(chunk) < datadir.CHUNK:
                    break
                offset += len(chunk)
            if link.closed:
                return None
        writer.write(wire.frame(wire.SNAP_END, wire.U64.pack(link.snapshot_at)))  # type: ignore[attr-defined]
        link.go_live()
        await writer.drain()
        return link

    # ---- status and operations -------------------------------------------------------

    def cluster_status(self) -> dict[str, Any]:
        """What `leveret ctl cluster_status` prints (the leader's view when leading)."""
        if self.role != "leader":
            status = dict(self.status) if self.status else {}
            status.setdefault("leader", self.leader.get("node") if self.leader else None)
            status["asked"] = self.name
            return status
        position = self.tap.position if self.tap is not None else 0
        nodes = []
        for name in sorted(set(self.members) | set(self.alive) | {self.name}):
            link = self.links.get(name)
            if name == self.name:
                role, lag = "leader", 0
            else:
                role = "follower" if name in self.alive else "down"
                lag = (
                    max(0, position - link.acked) if link is not None and link.acked >= 0 else None
                )
            nodes.append(
                {
                    "name": name,
                    "role": role,
                    "running": name in self.alive or name == self.name,
                    "in_sync": name in self.isr,
                    "lag_bytes": lag,
                    "status": link.status if link is not None else {},
                }
            )
        return {
            "cluster": self.config.cluster_name,
            "leader": self.name,
            "epoch": self.epoch,
            "term": self.term,
            "in_sync": list(self.isr),
            "min_replicas": self.min_replicas(),
            "position": position,
            "nodes": nodes,
        }

    def metrics(self) -> Any:
        from leveret.cluster.metrics import families

        return families(self)

    def api_nodes(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """GET /api/nodes on the leader: every node, with RabbitMQ's fields (the leader's
        own from the broker, a follower's from the figures it sends), `running` and
        `leader`."""
        nodes = []
        for name in sorted(set(self.members) | set(self.alive) | {self.name}):
            if name == self.name:
                entry = {**own, "running": True, "leader": True}
            else:
                link = self.links.get(name)
                running = name in self.alive
                entry = {
                    **own,
                    "os_pid": "",
                    "uptime": 0,
                    "mem_used": 0,
                    "fd_used": 0,
                    "sockets_used": 0,
                    "proc_used": 0,
                    "mem_alarm": False,
                    "disk_free_alarm": False,
                    **(link.status if link is not None and running else {}),
                    "running": running,
                    "leader": False,
                }
            entry["name"] = f"leveret@{name}"
            nodes.append(entry)
        return nodes

    def local_status(self) -> dict[str, Any]:
        """This node's figures for the leader's /api/nodes."""
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            fds = 0
        try:
            st = os.statvfs(self.config.data_dir)
            disk_free = st.f_bavail * st.f_frsize
        except OSError:
            disk_free = 0
        try:
            with open("/proc/self/statm") as f:
                mem = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            mem = 0
        return {
            "os_pid": str(os.getpid()),
            "uptime": int((time.monotonic() - self.started_at) * 1000),
            "mem_used": mem,
            "fd_used": fds,
            "fd_total": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "disk_free": disk_free,
            "processors": os.cpu_count() or 1,
        }

    async def request_transfer(self, target: str) -> dict[str, Any]:
        if target not in set(self.members) | set(self.alive):
            raise ValueError(f"no node {target!r} in cluster {self.config.cluster_name!r}")
        if self.leader is not None and self.leader.get("node") == target:
            return {"leader": target, "changed": False}
        await self.etcd.put(self.keys.transfer, json.dumps({"target": target}))
        deadline = time.monotonic() + max(15.0, 4 * self.ttl)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            kv = await self.etcd.get(self.keys.leader)
            if kv is not None and json.loads(kv.value).get("node") == target:
                return {"leader": target, "changed": True}
        raise TimeoutError(f"{target} did not take the lead (is it in sync?)")

    async def forget(self, name: str) -> dict[str, Any]:
        """`leveret ctl forget_cluster_node NAME`: a node gone for good leaves the members
        (so it no longer counts towards the majority) and the in-sync set. As
        rabbitmqctl's, it must be stopped; it may come back later as a new follower."""
        await self._refresh()
        if name == self.name:
            raise ValueError(f"{name} cannot forget itself; run this on another node")
        if name not in self.members:
            raise ValueError(f"no node {name!r} in cluster {self.config.cluster_name!r}")
        if name in self.alive or (self.leader or {}).get("node") == name:
            raise ValueError(f"node {name!r} is running; stop it first")
        for _attempt in range(10):
            ops = [E.op_delete(self.keys.members + name)]
            compares = []
            isr_kv = self._isr_kv
            if isr_kv is not None:
                members = json.loads(isr_kv.value)["members"]
                compares.append(E.cmp_mod_revision(self.keys.isr, isr_kv.mod_revision))
                if name in members:
                    rest = [n for n in members if n != name]
                    ops.append(E.op_put(self.keys.isr, json.dumps({"members": rest})))
            ok, _revision, _ = await self.etcd.txn(compares, ops)
            if ok:
                log.info("cluster: %s forgotten", name)
                return {"node": name, "forgotten": True}
            await self._refresh()  # the in-sync set changed meanwhile: again
        raise TimeoutError(f"{name} not forgotten: the in-sync set keeps changing")

    async def _serve_ctl(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(await reader.readline())
            op = request.get("op")
            args = request.get("args") or {}
            try:
                if op == "cluster_status":
                    if self.role != "leader":
                        await self._refresh()
                    reply: dict[str, Any] = {"ok": self.cluster_status()}
                elif op == "transfer_leadership":
                    reply = {"ok": await self.request_transfer(str(args.get("node")))}
                elif op == "forget_cluster_node":
                    reply = {"ok": await self.forget(str(args.get("node")))}
                elif op == "force_boot":
                    reply = {"ok": await self.force_boot()}
                else:
                    reply = {"error": "invalid", "message": f"unknown cluster operation {op!r}"}
            except (ValueError, TimeoutError, EtcdError) as exc:
                reply = {"error": "refused", "message": str(exc)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ValueError, ConnectionError):
            pass
        finally:
            writer.close()

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


def _read_at(path: str, offset: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(datadir.CHUNK)
    except FileNotFoundError:
        return None


def _advertised(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return host
