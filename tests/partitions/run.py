"""One partition run: a cluster on its own network, clients under load, nemeses in a
random order with random timing from a seed, then the heal and the checker's verdict.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import checker, nemeses
from .cluster import NetCluster, Proc
from .net import Net, Unavailable, why_unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# how long a pika client may take to find its connection dead (2 s heartbeats, checked
# every heartbeat + 5 s: no bytes over one whole check interval, so up to two of them)
CLIENT_DETECTION = 2 * (2 + 5)
QUEUES = [("pt-classic", "classic"), ("pt-quorum", "quorum"), ("pt-stream", "stream")]


@dataclass
class Event:
    nemesis: str
    describe: str
    start: float
    stop: float = 0.0
    healed: float = 0.0  # when the cluster was whole again (leader + full in-sync set)
    leader_before: str | None = None
    leader_after: str | None = None
    available: bool = True  # a majority of nodes and of etcd still reach each other
    #: when the fault's second step came (`Nemesis.midway`), for a nemesis that has one
    worse_from: float = 0.0
    problems: list[str] = field(default_factory=list)
    #: availability found short of the checker's time budget: reported, and a failure
    #: of the long runs (`python -m tests.partitions`), but not of the CI tests, whose
    #: machine's speed is not the cluster's
    slow: list[str] = field(default_factory=list)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Run:
    def __init__(
        self,
        seed: int,
        *,
        minutes: float | None = None,
        events: int | None = None,
        lease: float = 2.0,
        only: list[str] | None = None,
        directory: str | None = None,
        keep: bool = False,
        hold: float | None = None,
        workers: int = 1,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.seed, self.minutes, self.events, self.lease = seed, minutes, events, lease
        self.workers = workers  # each node's --workers
        kinds = sorted(nemeses.ALL)
        if workers == 1:
            kinds = [k for k in kinds if k not in nemeses.WORKERS_ONLY]
            if only and set(only) & nemeses.WORKERS_ONLY:
                raise ValueError(f"{sorted(nemeses.WORKERS_ONLY)} need --workers 2 or more")
        self.kinds = only or kinds
        self.keep, self.say = keep, say
        self.hold = hold  # each fault's length in leases (default: random)
        self.directory = directory or tempfile.mkdtemp(prefix=f"leveret-partitions-{seed}-")
        self.rng = random.Random(seed)
        self.timeline: list[Event] = []
        self._deck: list[str] = []
        self.clients: dict[str, Proc] = {}
        self.records: dict[str, str] = {}

    # -- clients ---------------------------------------------------------------

    def _client(self, net: Net, cluster: NetCluster, role: str, queue: str, kind: str) -> None:
        name = f"{role[0]}-{kind}"
        net.add(name)
        urls = cluster.node_urls()
        k = self.rng.randrange(len(urls))
        urls = urls[k:] + urls[:k]
        out = os.path.join(self.directory, f"{name}.jsonl")
        self.records[name] = out
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (ROOT, os.path.join(ROOT, "src"), env.get("PYTHONPATH")) if p
        )
        argv = [sys.executable, "-m", "tests.partitions.clients", role, "--name", name]
        argv += ["--queue", queue, "--kind", kind, "--out", out, *urls]
        proc = Proc(net, name, argv, os.path.join(self.directory, f"{name}.log"), env)
        proc.start()
        self.clients[name] = proc

    def _confirms(self) -> dict[str, int]:
        return {
            n: sum(1 for ev in checker.read(p) if ev["e"] == "ok")
            for n, p in self.records.items()
            if n.startswith("p-")
        }

    # -- the run -----------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        why = why_unavailable()
        if why is not None:
            raise Unavailable(why)
        self.say(
            f"seed {self.seed}; --workers {self.workers}; records and logs in {self.directory}"
        )
        net = Net()
        cluster: NetCluster | None = None
        report: dict[str, Any] = {
            "seed": self.seed,
            "workers": self.workers,
            "directory": self.directory,
        }
        ok = False
        try:
            cluster = NetCluster(net, self.directory, lease=self.lease, workers=self.workers)
            leader = cluster.wait_healthy()
            self.say(f"cluster whole, leader {leader}; netem: {net.netem}")
            cluster.start_polling()
            for queue, kind in QUEUES:
                self._client(net, cluster, "consumer", queue, kind)
            time.sleep(1)
            for queue, kind in QUEUES:
                self._client(net, cluster, "publisher", queue, kind)
            self._wait_confirms(net, cluster)
            started = time.monotonic()
            n = 0
            while True:
                if self.events is not None and n >= self.events:
                    break
                if self.minutes is not None and time.monotonic() - started > self.minutes * 60:
                    break
                self._event(net, cluster)
                n += 1
            report.update(self._finish(net, cluster))
            ok = report["failures"] == 0
            return report
        finally:
            for p in self.clients.values():
                p.kill()
            if cluster is not None:
                if not ok:
                    report.setdefault("logs", cluster.logs(2000))
                cluster.close()
            net.close()
            self._write(report)
            if ok and not self.keep:
                shutil.rmtree(self.directory, ignore_errors=True)

    def _wait_confirms(self, net: Net, cluster: NetCluster, timeout: float = 60) -> None:
        """Until every publisher has had a confirm (the load is on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(c > 0 for c in self._confirms().values()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"no confirms within {timeout} s: {self._confirms()}\n{cluster.logs()}")

    def _event(self, net: Net, cluster: NetCluster) -> None:
        rng = self.rng
        time.sleep(rng.uniform(1.0, 3.0) * self.lease)
        if not self._deck:  # every kind once per round, in the seed's order
            self._deck = list(self.kinds)
            rng.shuffle(self._deck)
        kind = self._deck.pop()
        nemesis = nemeses.ALL[kind](kind)
        before = cluster.leader()
        clients = [c for c in self.clients]
        ev = Event(kind, "", time.time(), leader_before=before)
        nemesis.start(net, cluster, rng, clients)
        ev.describe = nemesis.describe
        self.say(f"{kind}: {nemesis.describe}")
        self.timeline.append(ev)
        # long enough for a lease to run out and the cluster to act, sometimes much longer
        hold = rng.uniform(1.5, 4.0) + (rng.random() < 0.2) * 12
        ev.available = nemesis.available
        time.sleep((self.hold or hold) * self.lease / 2)
        if nemesis.midway():
            ev.worse_from = time.time()
        time.sleep((self.hold or hold) * self.lease / 2)
        nemesis.stop()
        ev.stop = time.time()
        for name, p in cluster.nodes.items():
            if not p.running:
                ev.problems.append(f"node {name} exited ({p.proc and p.proc.returncode})")
                self.say(f"!! node {name} exited; its log:\n{p.log_text(3000)}")
                p.start()
        try:
            ev.leader_after = cluster.wait_healthy(timeout=30 + 20 * self.lease)
            ev.healed = time.time()
        except TimeoutError as exc:
            ev.problems.append(f"not whole again: {str(exc).splitlines()[0]}")
            self.say(f"!! {ev.problems[-1]}")
            ev.leader_after = cluster.wait_healthy(timeout=120)
            ev.healed = time.time()
        self.say(
            f"   healed after {ev.healed - ev.stop:.1f} s; leader {ev.leader_before} -> "
            f"{ev.leader_after}; confirms so far {self._confirms()}"
        )

    def _finish(self, net: Net, cluster: NetCluster) -> dict[str, Any]:
        net.heal()
        for p in cluster.nodes.values():
            p.signal(signal.SIGCONT)
        leader = cluster.wait_healthy(timeout=120)
        self.say(f"all healed, leader {leader}; stopping publishers")
        time.sleep(2)
        for name, p in self.clients.items():
            if name.startswith("p-"):
                p.stop(timeout=20)
        # consumers drain: until every confirmed message has come, or nothing new for 20 s
        last, still = -1, time.monotonic()
        while time.monotonic() - still < 20:
            got = sum(
                1
                for n, path in self.records.items()
                if n.startswith("c-")
                for ev in checker.read(path)
                if ev["e"] == "got"
            )
            if got != last:
                last, still = got, time.monotonic()
            if self._all_delivered():
                break
            time.sleep(1)
        for name, p in self.clients.items():
            if name.startswith("c-"):
                p.stop(timeout=10)
        verdicts = [
            checker.check_queue(
                queue, kind, {f"p-{kind}": self.records[f"p-{kind}"]}, [self.records[f"c-{kind}"]]
            )
            for queue, kind in QUEUES
        ]
        pubs = [p for n, p in self.records.items() if n.startswith("p-")]
        gaps = checker.confirm_gaps(pubs)
        confirm_times = checker.confirm_times(pubs)
        events = []
        for ev in self.timeline:
            gap = max(
                (g for t, g in gaps if ev.start - 1 <= t <= (ev.healed or ev.stop)), default=0.0
            )
            # A fault a majority of nodes and of etcd still reach each other through
            # must not stop confirms for good. The cluster has 4 leases to act (a leader
            # cut from its followers gives the lead up after about 3); a client whose
            # connection went through a node that is now paused or cut learns it only
            # from its own heartbeats, which pika checks every heartbeat + 5 s, so it
            # may take CLIENT_DETECTION s more to connect elsewhere. Past both, with
            # at least 2 s of the fault left, some confirm must come.
            window = ev.stop - ev.start
            due = max(ev.start, ev.worse_from) + 4 * self.lease + CLIENT_DETECTION
            if ev.available and ev.stop - due >= 2:
                if not [t for t in confirm_times if due <= t <= ev.stop]:
                    ev.slow.append(
                        f"unavailable: no confirm in the last {ev.stop - due:.1f} s of "
                        f"the {window:.1f} s fault"
                    )
            changes = [c for c in cluster.seen.changes if ev.start <= c[0] <= (ev.healed or 0)]
            new_leader = next((c for c in changes if c[1] not in (None, ev.leader_before)), None)
            events.append(
                {
                    "nemesis": ev.nemesis,
                    "what": ev.describe,
                    "at": time.strftime("%H:%M:%S", time.localtime(ev.start)),
                    "lasted_s": round(ev.stop - ev.start, 1),
                    "whole_again_after_heal_s": round(ev.healed - ev.stop, 1),
                    "leader": f"{ev.leader_before} -> {ev.leader_after}",
                    "new_leader_after_s": (
                        round(new_leader[0] - ev.start, 2) if new_leader else None
                    ),
                    "longest_confirm_gap_s": round(gap, 2),
                    "problems": ev.problems,
                    "slow": ev.slow,
                }
            )
        terms = sorted({c[2] for c in cluster.seen.changes if c[2] is not None})
        leaders = [c[1] for c in cluster.seen.changes]
        leaders = [x for i, x in enumerate(leaders) if i == 0 or leaders[i - 1] != x]
        problems = sum(len(ev.problems) for ev in self.timeline)
        return {
            "events": events,
            "leaders_seen": leaders,
            "terms_seen": [terms[0], terms[-1]] if terms else [],
            "etcd_read_errors": cluster.seen.errors,
            "queues": [v.summary() for v in verdicts],
            "failures": sum(v.failures() for v in verdicts) + problems,
            "slow": sum(len(ev.slow) for ev in self.timeline),
        }

    def _all_delivered(self) -> bool:
        for queue, kind in QUEUES:
            v = checker.check_queue(
                queue, kind, {f"p-{kind}": self.records[f"p-{kind}"]}, [self.records[f"c-{kind}"]]
            )
            if v.lost:
                return False
        return True

    def _write(self, report: dict[str, Any]) -> None:
        report = {**report, "timeline_raw": [ev.__dict__ for ev in self.timeline]}
        path = os.path.join(self.directory, "report.json")
        try:
            with open(path, "w") as f:
                json.dump(report, f, indent=1, default=str)
        except OSError:
            pass


def format_report(report: dict[str, Any]) -> str:
    lines = [f"seed {report['seed']}, --workers {report.get('workers', 1)}"]
    for ev in report.get("events", []):
        lines.append(
            f"  {ev['at']} {ev['nemesis']:<16} {ev['what']}; lasted {ev['lasted_s']} s; "
            f"leader {ev['leader']}; new leader after {ev['new_leader_after_s']} s; "
            f"longest confirm gap {ev['longest_confirm_gap_s']} s; whole again "
            f"{ev['whole_again_after_heal_s']} s after the heal"
            + (f"; PROBLEMS {ev['problems']}" if ev["problems"] else "")
            + (f"; SLOW {ev['slow']}" if ev.get("slow") else "")
        )
    lines.append(f"leaders seen: {report.get('leaders_seen')}; terms {report.get('terms_seen')}")
    for q in report.get("queues", []):
        lines.append("  " + json.dumps(q))
    lines.append(f"failures: {report.get('failures')}")
    return "\n".join(lines)
