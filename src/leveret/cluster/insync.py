"""The leader's in-sync set: up to where held confirms may go out
(`_safe_position`), followers let in and taken out (never below the minimum), and a
leader cut off from the followers it needs."""

from __future__ import annotations

import json
import logging
import time

from leveret.cluster import etcd as E
from leveret.cluster.etcd import EtcdError
from leveret.cluster.leader import (
    LAG_TIMEOUT_FRACTION,
)

log = logging.getLogger("leveret.cluster")


class InSyncMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

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
