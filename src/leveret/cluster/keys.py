"""The cluster's keys in etcd.

Everything lives under `leveret/<cluster>/`. The keys that belong to one leader
(`leader`, `isr`, `term`, `handover`, `transfer`, `status`) hang off a *scope*.
One leader serves the whole cluster, so the scope is the cluster itself and the leader
key is `leveret/<cluster>/leader`. The scope is a seam for leadership per shard: each
would have a scope of its own with the same keys under it, while `nodes/` and
`members/` stay cluster-wide.

- `leader`: JSON naming the leader and its addresses, under the leader's lease.
  Its mod revision is the leader's epoch, which fences an older leader.
- `isr`: JSON {"members": [...]}, the nodes that hold every confirmed write (the
  leader included). No lease: it must outlive every node.
- `term`: a counter, +1 at every election (the leadership changes).
- `handover`: JSON {"target", "epoch"}: a leader that steps down on purpose names
  the node it caught up, which campaigns first.
- `transfer`: JSON {"target"}: `leveret ctl transfer_leadership` on any node asks
  the leader to hand over.
- `status`: JSON the leader refreshes: each follower's lag and whether in sync.
- `nodes/<name>`: JSON addresses of a running node, under its lease.
- `members/<name>`: every node that ever joined (the default majority counts them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    cluster: str

    @property
    def base(self) -> str:
        return f"leveret/{self.cluster}/"

    @property
    def scope(self) -> str:
        """Where one leader's keys are: the cluster's base, one leader for the broker."""
        return self.base

    @property
    def leader(self) -> str:
        return self.scope + "leader"

    @property
    def isr(self) -> str:
        return self.scope + "isr"

    @property
    def term(self) -> str:
        return self.scope + "term"

    @property
    def handover(self) -> str:
        return self.scope + "handover"

    @property
    def transfer(self) -> str:
        return self.scope + "transfer"

    @property
    def status(self) -> str:
        return self.scope + "status"

    @property
    def nodes(self) -> str:
        return self.base + "nodes/"

    @property
    def members(self) -> str:
        return self.base + "members/"
