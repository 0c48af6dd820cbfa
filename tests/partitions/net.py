"""A private network of Linux network namespaces, made and torn down by the test.

Every host (a Leveret node, an etcd member, a client, the test's observer) is a
network namespace of its own with one interface, `eth0`, and one address in a
private range (10.77.0.0/24 by default). Each `eth0` is one end of a veth pair
whose other end is a port of a bridge; the bridge lives in a namespace of its own
(the hub), so nothing is added to the namespace the test runs in, and the range
exists only inside these namespaces: several runs at once do not see each other.

Faults are made inside the hosts' namespaces, where only this test's packets pass:
- a cut: nftables drops a host's packets *to* another host (one way), or both
  ways; a TCP connection over a one-way cut stays open (nothing resets it), as in
  a real asymmetric partition;
- loss: nftables drops a random share of a host's packets to another host;
- a slow link: `tc netem` delay where the kernel has `sch_netem`, else a `tbf`
  rate limit on the host's interface.

Names are unique per run (`lvp-<pid>-<random>-<host>`); `close()` deletes every
namespace the run made (killing what runs in them is the caller's job), and
`sweep()` deletes those a dead run left behind.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

PREFIX = "lvp-"
CLONE_NEWNET = 0x40000000
TABLE = "leveret_partitions"


class Unavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, no nftables)."""


def _run(*argv: str, check: bool = True, input: str | None = None) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res.stdout


def why_unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can (checked by making one)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed (scripts/install-test-deps.sh installs it)"
    name = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        _run("ip", "netns", "add", name)
        _run("ip", "netns", "exec", name, "nft", "add", "table", "inet", TABLE)
    except RuntimeError as exc:
        return f"cannot make a network namespace with nftables: {exc}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


def sweep() -> list[str]:
    """Delete namespaces that runs which no longer exist left behind (their pid is in
    the name); returns their names."""
    gone = []
    for name in _run("ip", "netns", "list", check=False).split("\n"):
        name = name.split(" ")[0]
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            # what that run started there (nodes, etcd, clients) outlived it: end it
            for left in _run("ip", "netns", "pids", name, check=False).split():
                try:
                    os.kill(int(left), 9)
                except (ValueError, OSError):
                    pass
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    return gone


_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace(ns: str, fn: Callable[[], T], timeout: float = 30) -> T:
    """Run `fn` in a thread of this process that has entered namespace `ns` (sockets it
    opens live there). The thread ends after `fn`: no other thread changes namespace."""
    result: list[Any] = []

    def body() -> None:
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            result.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            result.append((False, exc))

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    if not result:
        raise TimeoutError(f"nothing back from {ns} within {timeout} s")
    ok, value = result[0]
    if not ok:
        raise value
    return value


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    # destinations this host's packets are dropped to (`cut`), and lossy ones
    blocked: set[str] = field(default_factory=set)
    loss: dict[str, int] = field(default_factory=dict)
    slow: bool = False


class Net:
    """The hub and its hosts. `add()` a host, `cut()`/`heal()` links, `close()`."""

    def __init__(self, subnet: str = "10.77.0") -> None:
        self.subnet = subnet
        self.run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.hosts: dict[str, Host] = {}
        self.by_ip: dict[str, Host] = {}
        self._next = 10
        self.netem = False
        self.hub = self._ns("hub")
        self._namespaces: list[str] = []
        sweep()
        self._add_ns(self.hub)
        self._ip(self.hub, "link", "add", "br0", "type", "bridge")
        self._ip(self.hub, "link", "set", "br0", "up")
        self.netem = self._probe_netem()

    def _ns(self, host: str) -> str:
        return f"{PREFIX}{self.run_id}-{host}"

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        self._ip(ns, "link", "set", "lo", "up")

    @staticmethod
    def _ip(ns: str, *args: str) -> str:
        return _run("ip", "-n", ns, *args)

    @staticmethod
    def nsexec(ns: str, *argv: str, check: bool = True, input: str | None = None) -> str:
        return _run("ip", "netns", "exec", ns, *argv, check=check, input=input)

    def _probe_netem(self) -> bool:
        res = subprocess.run(
            ["ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
            capture_output=True,
        )
        if res.returncode == 0:
            self.nsexec(self.hub, "tc", "qdisc", "del", "dev", "lo", "root", check=False)
        return res.returncode == 0

    def add(self, name: str) -> Host:
        """A new host on the bridge, with the next address."""
        ip = f"{self.subnet}.{self._next}"
        self._next += 1
        ns = self._ns(name)
        self._add_ns(ns)
        port = f"v{len(self.hosts)}"
        self._ip(self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip(self.hub, "link", "set", port, "master", "br0", "up")
        self._ip(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        self._ip(ns, "link", "set", "eth0", "up")
        host = Host(name, ns, ip)
        self.hosts[name] = host
        self.by_ip[ip] = host
        self._rules(host)
        return host

    def _rules(self, host: Host) -> None:
        """Rewrite `host`'s table: drop to each blocked address, drop a share to each
        lossy one (outgoing packets only: a cut of b→a is made in b)."""
        lines = [
            f"table inet {TABLE}",
            f"delete table inet {TABLE}",
            f"table inet {TABLE} {{",
            "  chain out {",
            "    type filter hook output priority 0; policy accept;",
        ]
        lines += [f"    ip daddr {ip} drop" for ip in sorted(host.blocked)]
        lines += [
            f"    ip daddr {ip} numgen random mod 100 < {pct} drop"
            for ip, pct in sorted(host.loss.items())
        ]
        lines += ["  }", "}"]
        self.nsexec(host.ns, "nft", "-f", "-", input="\n".join(lines) + "\n")

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside `host`'s namespace (`ip netns exec` execs it: its pid is
        the command's own)."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def call(self, host: str, fn: Callable[[], T], timeout: float = 30) -> T:
        return in_namespace(self.hosts[host].ns, fn, timeout)

    # -- faults ---------------------------------------------------------------

    def cut(self, a: str, b: str, way: str = "both") -> None:
        """Cut the link between hosts a and b: "both" ways, or one way only: "a->b"
        (b hears nothing from a; a still hears b)."""
        if way in ("both", "a->b"):
            self.hosts[a].blocked.add(self.hosts[b].ip)
            self._rules(self.hosts[a])
        if way in ("both", "b->a"):
            self.hosts[b].blocked.add(self.hosts[a].ip)
            self._rules(self.hosts[b])

    def lossy(self, a: str, b: str, percent: int) -> None:
        """Drop `percent` of the packets between a and b, both ways."""
        for x, y in ((a, b), (b, a)):
            self.hosts[x].loss[self.hosts[y].ip] = percent
            self._rules(self.hosts[x])

    def slow(self, host: str, delay_ms: int = 100) -> None:
        """Slow everything `host` sends: netem delay (with jitter), or where the kernel
        has no netem, a rate limit of 256 kbit/s with a 200 ms queue."""
        h = self.hosts[host]
        if self.netem:
            q = ["netem", "delay", f"{delay_ms}ms", f"{delay_ms // 4}ms"]
        else:
            q = ["tbf", "rate", "256kbit", "burst", "16kb", "latency", "200ms"]
        self.nsexec(h.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *q)
        h.slow = True

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Undo the cuts and losses between a and b (either way); with no arguments,
        every fault on every host."""
        for h in self.hosts.values():
            changed = False
            for other in list(h.blocked | set(h.loss)):
                peer = self.by_ip[other].name
                if a is None or {h.name, peer} == {a, b}:
                    h.blocked.discard(other)
                    h.loss.pop(other, None)
                    changed = True
            if changed:
                self._rules(h)
            if h.slow and (a is None or h.name in (a, b)):
                self.nsexec(h.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
                h.slow = False

    def faults(self) -> list[str]:
        """The faults in place now, in words."""
        out = []
        for h in self.hosts.values():
            out += [f"{h.name}->{self.by_ip[ip].name} cut" for ip in sorted(h.blocked)]
            out += [f"{h.name}->{self.by_ip[ip].name} {p}% loss" for ip, p in h.loss.items()]
            if h.slow:
                out.append(f"{h.name} slow")
        return out

    def close(self) -> None:
        """Delete every namespace this run made (their interfaces go with them)."""
        for ns in reversed(self._namespaces):
            _run("ip", "netns", "del", ns, check=False)
        self._namespaces.clear()
