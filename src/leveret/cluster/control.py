"""What a node tells about the cluster (`cluster_status`, metrics, the management
API's nodes) and the operations `leveret ctl` asks of it over the node's control
socket."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import time
from typing import Any

from leveret.cluster import etcd as E
from leveret.cluster import view
from leveret.cluster.etcd import EtcdError

log = logging.getLogger("leveret.cluster")


class ControlMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

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
        return view.families(view.snapshot(self))  # type: ignore[arg-type]

    def api_nodes(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """GET /api/nodes on the leader (cluster/view.py)."""
        return view.api_nodes(view.snapshot(self), own)  # type: ignore[arg-type]

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
