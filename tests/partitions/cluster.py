"""etcd members and Leveret nodes, each on a host of its own in a `net.Net`.

Nothing here reads a node's internals: a node is a command line started in its
namespace as the leader of a process group of its own (so that a node made of
several processes is paused, resumed and killed whole), and the cluster's state is
what etcd says (`leader`, `term`, `isr`), read from the observer's host, which no
nemesis cuts.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from leveret.cluster.local import etcd_binary

from .net import Net, in_namespace

AMQP_PORT = 5672
CLUSTER_PORT = 5679
ETCD_CLIENT = 2379
ETCD_PEER = 2380
# a flag file a node's replication writer checks before each write while the
# variable names it (src/leveret/cluster/datadir.py): there, writes fail with EIO
FAULT_ENV = "LEVERET_TEST_EIO_FILE"
# a file whose content, a number of seconds, a node adds to its wall clock while the
# variable names it (src/leveret/wallclock.py): the clock-jump nemesis writes it
CLOCK_ENV = "LEVERET_TEST_CLOCK_FILE"
# --worker-liveness-timeout of nodes that run workers: seconds a stopped worker of the
# leader runs on before its supervisor restarts it
WORKER_LIVENESS = 5.0


class Proc:
    """A command in a host's namespace, leading a process group of its own."""

    def __init__(self, net: Net, host: str, argv: list[str], log_path: str, env: dict[str, str]):
        self.net, self.host, self.argv, self.log_path, self.env = net, host, argv, log_path, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.net.exec_argv(self.host, self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.paused = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            if sig == signal.SIGSTOP:
                self.paused = True
            elif sig == signal.SIGCONT:
                self.paused = False

    def kill(self) -> None:
        if self.proc is not None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.paused = False

    def stop(self, timeout: float = 15) -> None:
        if self.running:
            assert self.proc is not None
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self, tail: int = 4000) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""


def _parent(pid: int) -> int | None:
    """`pid`'s parent, or None when it is gone (a status file's pid may be stale)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Seen:
    """What the observer read from etcd: each change of leader or term, in order."""

    changes: list[tuple[float, str | None, int | None, list[str]]] = field(default_factory=list)
    errors: int = 0


class NetCluster:
    """`etcd_members` etcd members (e0...) and `size` nodes (n0...), each on its own host;
    an observer host (obs) that reads etcd."""

    def __init__(
        self,
        net: Net,
        directory: str,
        *,
        size: int = 3,
        etcd_members: int = 3,
        lease: float = 2.0,
        name: str = "test",
        workers: int = 1,
    ) -> None:
        self.net, self.directory, self.lease, self.name = net, directory, lease, name
        self.workers = workers
        binary = etcd_binary()
        if binary is None:
            raise FileNotFoundError("etcd not found: run scripts/install-test-deps.sh")
        self.obs = net.add("obs")
        env = dict(os.environ)
        self.etcds: dict[str, Proc] = {}
        hosts = [net.add(f"e{i}") for i in range(etcd_members)]
        initial = ",".join(f"{h.name}=http://{h.ip}:{ETCD_PEER}" for h in hosts)
        for h in hosts:
            data = os.path.join(directory, h.name)
            os.makedirs(data, exist_ok=True)
            argv = [
                binary,
                "--name", h.name,
                "--data-dir", os.path.join(data, "etcd"),
                "--listen-client-urls", f"http://{h.ip}:{ETCD_CLIENT}",
                "--advertise-client-urls", f"http://{h.ip}:{ETCD_CLIENT}",
                "--listen-peer-urls", f"http://{h.ip}:{ETCD_PEER}",
                "--initial-advertise-peer-urls", f"http://{h.ip}:{ETCD_PEER}",
                "--initial-cluster", initial,
                "--heartbeat-interval", "50",
                "--election-timeout", "500",
                "--log-level", "error",
            ]  # fmt: skip
            self.etcds[h.name] = Proc(net, h.name, argv, os.path.join(data, "etcd.log"), env)
        self.etcd_urls = [f"http://{h.ip}:{ETCD_CLIENT}" for h in hosts]
        for p in self.etcds.values():
            p.start()
        self.wait_etcd()

        self.nodes: dict[str, Proc] = {}
        # clients come from other hosts: guest may log in from anywhere
        config = os.path.join(directory, "node.toml")
        with open(config, "w") as f:
            f.write("loopback_users = []\n")
        for i in range(size):
            h = net.add(f"n{i}")
            data = os.path.join(directory, h.name)
            os.makedirs(data, exist_ok=True)
            node_env = dict(env)
            node_env[FAULT_ENV] = self.fault_file(h.name)
            node_env[CLOCK_ENV] = self.clock_file(h.name)
            argv = [
                sys.executable, "-m", "leveret", "server",
                "--workers", str(workers),
                "--config", config,
                "--host", h.ip,
                "--port", str(AMQP_PORT),
                "--management-port", "0",
                "--prometheus-port", "0",
                "--data-dir", os.path.join(data, "data"),
                "--cluster-etcd", ",".join(self.etcd_urls),
                "--cluster-name", name,
                "--node-name", h.name,
                "--cluster-port", str(CLUSTER_PORT),
                "--cluster-lease-seconds", str(lease),
            ]  # fmt: skip
            if workers > 1:
                # a stopped worker is found hung, SIGKILLed and restarted within a
                # fault's hold (the default, 30 s, outlasts most holds)
                argv += ["--worker-liveness-timeout", str(WORKER_LIVENESS)]
            self.nodes[h.name] = Proc(net, h.name, argv, os.path.join(data, "node.log"), node_env)
        for p in self.nodes.values():
            p.start()
        self.seen = Seen()
        self._polling = threading.Event()
        self._poller: threading.Thread | None = None

    def data_dir(self, node: str) -> str:
        return os.path.join(self.directory, node, "data")

    def worker_pids(self, node: str) -> list[tuple[int, int]]:
        """(index, pid) of `node`'s workers, from the status file its supervisor writes
        (`workers-status.json`; only a leading node runs workers): [] when none run."""
        try:
            with open(os.path.join(self.data_dir(node), "workers-status.json")) as f:
                status = json.load(f)
        except (OSError, ValueError):
            return []
        proc = self.nodes[node].proc
        pids = [(i, w.get("pid")) for i, w in enumerate(status.get("workers", []))]
        return [(i, int(pid)) for i, pid in pids if pid and proc and _parent(int(pid)) == proc.pid]

    def fault_file(self, node: str) -> str:
        return os.path.join(self.directory, node, "eio")

    def clock_file(self, node: str) -> str:
        return os.path.join(self.directory, node, "clock-offset")

    def set_clock(self, node: str, offset: float) -> None:
        """Jump `node`'s wall clock to the machine's plus `offset` seconds (0: back to it)."""
        path = self.clock_file(node)
        with open(path + ".tmp", "w") as f:
            f.write(f"{offset}\n")
        os.replace(path + ".tmp", path)

    def node_urls(self) -> list[str]:
        return [f"amqp://guest:guest@{self.net.hosts[n].ip}:{AMQP_PORT}/%2F" for n in self.nodes]

    # -- etcd, from the observer -------------------------------------------------

    def _get_prefix(self, url: str) -> dict[str, Any]:
        prefix = f"leveret/{self.name}/"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = json.dumps(
            {"key": base64.b64encode(prefix.encode()).decode(),
             "range_end": base64.b64encode(end.encode()).decode()}
        ).encode()  # fmt: skip
        req = urllib.request.Request(url + "/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=1.5) as res:
            kvs = json.loads(res.read()).get("kvs") or []
        out = {}
        for kv in kvs:
            key = base64.b64decode(kv["key"]).decode()[len(prefix) :]
            value = base64.b64decode(kv.get("value", ""))
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value.decode(errors="replace")
        return out

    def _read_keys(self) -> dict[str, Any]:
        """The cluster's keys, from the first etcd member that answers (in the caller's
        namespace: the observer's)."""
        last: Exception | None = None
        for name, url in zip(self.etcds, self.etcd_urls, strict=True):
            if not self.etcds[name].running or self.etcds[name].paused:
                continue
            try:
                return self._get_prefix(url)
            except OSError as exc:
                last = exc
        raise OSError(f"no etcd member answers: {last}")

    def keys(self) -> dict[str, Any]:
        return in_namespace(self.obs.ns, self._read_keys)

    def wait_etcd(self, timeout: float = 60) -> None:
        def healthy() -> bool:
            for url in self.etcd_urls:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1) as res:
                        if b"true" not in res.read():
                            return False
                except OSError:
                    return False
            return True

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if in_namespace(self.obs.ns, healthy):
                return
            time.sleep(0.2)
        raise RuntimeError("etcd not healthy\n" + self.logs())

    @staticmethod
    def _parse(keys: dict[str, Any]) -> tuple[str | None, int | None, list[str]]:
        leader = keys.get("leader")
        term = keys.get("term")
        isr = keys.get("isr")
        return (
            leader.get("node") if isinstance(leader, dict) else None,
            int(term) if isinstance(term, int | str) and str(term).isdigit() else None,
            sorted(isr.get("members", [])) if isinstance(isr, dict) else [],
        )

    def state(self) -> tuple[str | None, int | None, list[str]]:
        """(leader, term, in-sync set) as etcd says now."""
        return self._parse(self.keys())

    def start_polling(self, interval: float = 0.2) -> None:
        """Record every change of (leader, term, in-sync set) in `seen`, from a thread of
        its own in the observer's namespace."""

        def poll() -> None:
            last = None
            while not self._polling.is_set():
                try:
                    now = self._parse(self._read_keys())
                except Exception:  # noqa: BLE001 (etcd away: counted)
                    self.seen.errors += 1
                else:
                    if now != last:
                        self.seen.changes.append((time.time(), *now))
                        last = now
                self._polling.wait(interval)

        def body() -> None:
            in_namespace(self.obs.ns, poll, timeout=10**9)

        self._poller = threading.Thread(target=body, daemon=True)
        self._poller.start()

    def leader(self) -> str | None:
        try:
            return self.state()[0]
        except OSError:
            return None

    def wait_healthy(self, timeout: float = 120, nodes: set[str] | None = None) -> str:
        """Until a leader leads and the in-sync set holds every node (or `nodes`)."""
        want = sorted(nodes or self.nodes)
        deadline = time.monotonic() + timeout
        state: Any = None
        while time.monotonic() < deadline:
            try:
                state = self.state()
            except OSError as exc:
                state = exc
            else:
                if state[0] is not None and state[2] == want:
                    return state[0]
            time.sleep(0.2)
        raise TimeoutError(f"cluster not whole within {timeout} s: {state}\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {name}\n{p.log_text(tail)}" for name, p in {**self.etcds, **self.nodes}.items()
        )

    def close(self) -> None:
        self._polling.set()
        for p in self.nodes.values():
            p.kill()
        for p in self.etcds.values():
            p.kill()
        if self._poller is not None:
            self._poller.join(2)
