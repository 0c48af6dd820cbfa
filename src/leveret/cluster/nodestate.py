"""What a node last knew of its cluster, kept in its own data dir.

Why: etcd holds the cluster's state: the in-sync set and the term (the count of
elections). If etcd loses its data (not a restart: its data dir), that state is gone
and every node looks like one of a new cluster: a new, empty node, or one whose copy
is stale, could take the lead, and the others would then sync to it and replace what
they hold. So each node keeps, beside its data, the highest term it saw and whether it
was in the in-sync set then. A node whose etcd knows less than that (no term, or a
lower one) neither leads nor follows: it waits for an operator to name the node whose
copy wins, with `leveret ctl force_boot` on that node (RabbitMQ's command of the same
name does the same for a node that lost its peers). A new node, which knew nothing,
does not start a new cluster while a node that knew one is registered.

The file is not replicated (cluster/datadir.py skips it): it is this node's memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

FILE = "cluster-node.json"


@dataclass
class NodeState:
    cluster: str
    term: int = 0  # the highest term this node saw in etcd
    in_sync: bool = False  # whether it was in the in-sync set at that term
    force_boot: bool = False  # `leveret ctl force_boot`: lead even so, once

    def describe(self) -> str:
        return f"term {self.term}, {'in sync' if self.in_sync else 'not in sync'}"


def load(data_dir: str, cluster: str) -> NodeState:
    try:
        with open(os.path.join(data_dir, FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return NodeState(cluster)
    if data.get("cluster") != cluster:
        return NodeState(cluster)  # a data dir that served another cluster knew nothing of this one
    return NodeState(
        cluster,
        int(data.get("term", 0)),
        bool(data.get("in_sync", False)),
        bool(data.get("force_boot", False)),
    )


def save(data_dir: str, state: NodeState) -> None:
    """Write it durably: a crash leaves the old record or the new one, never half."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(asdict(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
