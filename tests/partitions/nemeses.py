"""The faults a run injects. Each nemesis picks its victims from the cluster's state
when it starts (which node leads now), does its damage, may do more halfway through
(`midway`), and undoes it when it stops; `describe` says what it did, for the
timeline.
"""

from __future__ import annotations

import os
import random
import signal
from dataclasses import dataclass, field

from .cluster import NetCluster
from .net import Net


@dataclass
class Nemesis:
    name: str
    describe: str = ""
    # whether a majority of nodes and of etcd members still reach each other (and the
    # clients reach one of them): then confirms must go on
    available: bool = True
    undo: list = field(default_factory=list)

    def start(self, net: Net, cluster: NetCluster, rng: random.Random, clients: list[str]) -> None:
        raise NotImplementedError

    def midway(self) -> bool:
        """Halfway through the fault's hold: a second step, for a nemesis that has one;
        whether it took one (the fault got worse: the clock of the availability
        check starts again)."""
        return False

    def stop(self) -> None:
        for fn in reversed(self.undo):
            fn()
        self.undo.clear()


def _roles(cluster: NetCluster, rng: random.Random) -> tuple[str, list[str]]:
    leader = cluster.leader() or rng.choice(sorted(cluster.nodes))
    followers = [n for n in sorted(cluster.nodes) if n != leader]
    rng.shuffle(followers)
    return leader, followers


class FollowerCut(Nemesis):
    """A follower cut from the leader only (both still reach etcd and the clients)."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        f = followers[0]
        net.cut(leader, f)
        self.undo.append(lambda: net.heal(leader, f))
        self.describe = f"{f} cut from leader {leader}"


class LeaderIsolated(Nemesis):
    """The leader cut from both followers; it still reaches etcd and the clients."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        for f in followers:
            net.cut(leader, f)
            self.undo.append(lambda f=f: net.heal(leader, f))
        self.describe = f"leader {leader} cut from followers {followers}"


class Asymmetric(Nemesis):
    """A hears B, B does not hear A (a one-way cut between two nodes, one of them the
    leader, either way round)."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        a, b = (leader, followers[0]) if rng.random() < 0.5 else (followers[0], leader)
        net.cut(b, a, way="a->b")  # b's packets to a are lost: a does not hear b
        self.undo.append(lambda: net.heal(a, b))
        self.describe = f"{a} does not hear {b} ({b} hears {a}); leader {leader}"


class Bridge(Nemesis):
    """Two nodes cut from each other, both still reaching the third (the bridge)."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        if rng.random() < 0.5:
            a, b, bridge = leader, followers[0], followers[1]
        else:
            a, b, bridge = followers[0], followers[1], leader
        net.cut(a, b)
        self.undo.append(lambda: net.heal(a, b))
        self.describe = f"{a} and {b} cut, both reach {bridge}; leader {leader}"


class ClientCut(Nemesis):
    """Every client cut from the leader only (they reach the followers)."""

    def start(self, net, cluster, rng, clients):
        leader, _ = _roles(cluster, rng)
        for c in clients:
            net.cut(c, leader)
            self.undo.append(lambda c=c: net.heal(c, leader))
        self.describe = f"clients cut from leader {leader}"


class EtcdDown(Nemesis):
    """One etcd member of three SIGKILLed; half the time a second one too, halfway
    through (quorum lost). Restarted on stop, on their data dirs."""

    def start(self, net, cluster, rng, clients):
        members = sorted(cluster.etcds)
        rng.shuffle(members)
        n = 1 if rng.random() < 0.5 else 2
        self.down = members[:n]
        self.available = n == 1
        cluster.etcds[self.down[0]].kill()
        self.cluster = cluster

        def restart() -> None:
            for m in self.down:
                cluster.etcds[m].start()

        self.undo.append(restart)
        self.describe = f"etcd {self.down[0]} killed (2 of 3 left)"
        if n == 2:
            self.describe += f", then {self.down[1]} (1 of 3 left: no quorum)"

    def midway(self) -> bool:
        for m in self.down[1:]:
            self.cluster.etcds[m].kill()
        return len(self.down) > 1


class Pause(Nemesis):
    """A node's process group SIGSTOPped past its lease (the leader, or a follower a
    third of the time), SIGCONT on stop."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        victim = followers[0] if rng.random() < 1 / 3 else leader
        proc = cluster.nodes[victim]
        proc.signal(signal.SIGSTOP)
        self.undo.append(lambda: proc.signal(signal.SIGCONT))
        role = "leader" if victim == leader else "follower"
        self.describe = f"{role} {victim} paused (SIGSTOP)"


class WorkerPause(Nemesis):
    """One worker process of the leader SIGSTOPped (a node that runs workers: `--workers
    N`), SIGCONT on stop. The node's supervisor, its lease and its other workers go on;
    past the nodes' `--worker-liveness-timeout` the supervisor finds the worker hung,
    SIGKILLs and restarts it, and the leader drops its follower links so that each
    compares its copy again (docs/cluster.md#a-worker-restarted-on-the-leader). A
    shorter hold resumes it where it stopped."""

    def start(self, net, cluster, rng, clients):
        leader, _ = _roles(cluster, rng)
        pids = cluster.worker_pids(leader)
        if not pids:
            self.describe = f"no worker of leader {leader} found: nothing paused"
            return
        i, pid = rng.choice(pids)
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # killed as hung and restarted meanwhile
                pass

        self.undo.append(resume)
        self.describe = f"worker {i} (pid {pid}) of leader {leader} paused (SIGSTOP)"


class SupervisorPause(Nemesis):
    """The supervisor process of the leader alone SIGSTOPped (a node that runs workers):
    its lease, its election and its replication stream stop while its workers run on
    with their clients. Its workers may confirm nothing past the deadline of the last
    lease renewal they were sent (docs/cluster.md#a-workers-confirm); a follower takes
    the lead; SIGCONT on stop: the old leader finds its lease gone and stops its
    workers."""

    def start(self, net, cluster, rng, clients):
        leader, _ = _roles(cluster, rng)
        proc = cluster.nodes[leader]
        if not cluster.worker_pids(leader) or proc.proc is None:
            self.describe = f"no worker of leader {leader} found: nothing paused"
            return
        pid = proc.proc.pid
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

        self.undo.append(resume)
        self.describe = f"supervisor (pid {pid}) of leader {leader} paused (SIGSTOP)"


class FollowerEio(Nemesis):
    """A follower's replication writes fail with EIO (the test hook in
    cluster/datadir.py) until stop."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        f = followers[0]
        path = cluster.fault_file(f)
        open(path, "w").close()
        self.undo.append(lambda: os.path.exists(path) and os.unlink(path))
        self.describe = f"follower {f}'s disk fails writes with EIO; leader {leader}"


class Lossy(Nemesis):
    """The links of the leader to one follower drop a share of their packets, and the
    follower is slowed (netem delay, or a rate limit)."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        f = followers[0]
        pct = rng.choice([5, 20, 40])
        net.lossy(leader, f, pct)
        net.slow(f)
        self.undo.append(lambda: net.heal(leader, f))
        self.undo.append(lambda: net.heal(f, f))
        self.describe = f"{pct}% loss between {leader} and {f}; {f} slowed"


class ClockJump(Nemesis):
    """Wall clocks jumped an hour or a day forward or back, through each node's clock
    hook (`leveret.wallclock`; the machine's clock is every namespace's), and back to
    the machine's time on stop, a second jump the other way. A third of the time the
    leader's clock; a third, one follower's; a third, both followers' (by the same
    offset), and halfway through the leader is paused (SIGSTOP past its lease), so
    that a node whose clock is off takes over from one whose clock is not, and hands
    back to it later."""

    def start(self, net, cluster, rng, clients):
        leader, followers = _roles(cluster, rng)
        offset = rng.choice([-86400, -3600, 3600, 86400])
        r = rng.random()
        if r < 1 / 3:
            victims, what = [leader], f"leader {leader}'s clock"
        elif r < 2 / 3:
            victims, what = followers[:1], f"follower {followers[0]}'s clock"
        else:
            victims, what = followers, f"followers {followers}' clocks"
        for v in victims:
            cluster.set_clock(v, offset)
            self.undo.append(lambda v=v: cluster.set_clock(v, 0))
        self.describe = f"{what} jumped {offset:+d} s"
        self.pause = None
        if len(victims) > 1:
            self.pause = cluster.nodes[leader]
            self.describe += f", then leader {leader} paused (SIGSTOP)"

    def midway(self) -> bool:
        if self.pause is None:
            return False
        proc = self.pause
        proc.signal(signal.SIGSTOP)
        self.undo.append(lambda: proc.signal(signal.SIGCONT))
        return True


# kinds that need nodes of several workers (`--workers N`, N > 1)
WORKERS_ONLY = {"worker-pause", "supervisor-pause"}

ALL = {
    "follower-cut": FollowerCut,
    "leader-isolated": LeaderIsolated,
    "asymmetric": Asymmetric,
    "bridge": Bridge,
    "client-cut": ClientCut,
    "etcd-down": EtcdDown,
    "pause": Pause,
    "follower-eio": FollowerEio,
    "worker-pause": WorkerPause,
    "supervisor-pause": SupervisorPause,
    "lossy": Lossy,
    "clock-jump": ClockJump,
}
