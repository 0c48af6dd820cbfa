"""Who may lead (`eligible`) and the etcd transaction that makes a node leader
(`_campaign`); `force_boot` for an etcd that lost its data."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from leveret.cluster import etcd as E
from leveret.cluster import nodestate
from leveret.cluster.follower import (
    syncing,
)

log = logging.getLogger("leveret.cluster")


class ElectionMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

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
