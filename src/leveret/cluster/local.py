"""etcd and Leveret nodes as local processes on loopback: the demo, the tests and the
benchmarks start clusters with these (never a fixed port: each asks the OS for one).

The etcd binary is Debian's (`scripts/install-test-deps.sh` puts it in
`.cache/tools/etcd/` when it is not on PATH); `LEVERET_ETCD` names another.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

QUIET_PORTS = (
    "--management-port", "0", "--prometheus-port", "0",
    "--mqtt-port", "0", "--web-mqtt-port", "0", "--mqtt-tls-port", "0",
)  # fmt: skip


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port the OS says is free, never one this process was given before.

    Each pick is released at once, so two picks in a row can get the same port back:
    a node once got one port for both its AMQP and its replication listener and could
    not start (CI, tests/cluster/test_streams_failover.py).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def etcd_binary() -> str | None:
    """Where etcd is: $LEVERET_ETCD, PATH, or the checkout's .cache/tools/etcd/etcd."""
    given = os.environ.get("LEVERET_ETCD")
    if given:
        return given
    found = shutil.which("etcd")
    if found:
        return found
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / ".cache" / "tools" / "etcd" / "etcd"
        if candidate.exists():
            return str(candidate)
    cwd = Path.cwd() / ".cache" / "tools" / "etcd" / "etcd"
    return str(cwd) if cwd.exists() else None


class EtcdProcess:
    """An etcd member on loopback, with a data dir of its own: alone (the default), or
    one of several (`etcd_members`).

    Elections and lease checks are tuned short (50 ms heartbeats) so that a lease of
    one second is allowed: etcd refuses TTLs under 1.5 election timeouts.
    """

    def __init__(
        self, directory: str | None = None, port: int | None = None, name: str = "default"
    ) -> None:
        binary = etcd_binary()
        if binary is None:
            raise FileNotFoundError("etcd not found: run scripts/install-test-deps.sh")
        self.binary = binary
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="leveret-etcd-")
        self.port = port or free_port()
        self.peer_port = free_port()
        self.name = name
        self.initial_cluster = f"{name}=http://127.0.0.1:{self.peer_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, timeout: float = 20.0, wait: bool = True) -> EtcdProcess:
        """Start the member; with `wait`, until it answers healthy (a member of several
        is healthy only once a quorum of them runs: start them all, then wait)."""
        peer = self.peer_url
        argv = [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            os.path.join(self.directory, "etcd"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster,
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            "--log-level",
            "error",
        ]
        self.log = open(os.path.join(self.directory, "etcd.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 20.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as res:
                    if b"true" in res.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not become healthy")

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine: no goodbye to the other members."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if getattr(self, "log", None) is not None:
            self.log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if getattr(self, "log", None) is not None:
            self.log.close()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeProcess:
    """One `leveret server --cluster-etcd ...` subprocess with its own ports and data dir."""

    def __init__(
        self,
        name: str,
        etcd_url: str,
        directory: str,
        *,
        cluster: str = "leveret",
        lease: float = 5,
        extra: tuple[str, ...] = (),
        management: bool = False,
        prometheus: bool = False,
    ) -> None:
        self.name = name
        self.etcd_url = etcd_url
        self.directory = directory
        self.data_dir = os.path.join(directory, name)
        self.cluster = cluster
        self.lease = lease
        self.extra = extra
        self.port = free_port()
        self.cluster_port = free_port()
        self.management_port = free_port() if management else 0
        self.prometheus_port = free_port() if prometheus else 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(directory, f"{name}.log")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "leveret",
            "server",
            *QUIET_PORTS,
            "--port",
            str(self.port),
            "--data-dir",
            self.data_dir,
            "--management-port",
            str(self.management_port),
            "--prometheus-port",
            str(self.prometheus_port),
            "--cluster-etcd",
            self.etcd_url,
            "--cluster-name",
            self.cluster,
            "--node-name",
            self.name,
            "--cluster-port",
            str(self.cluster_port),
            "--cluster-lease-seconds",
            str(self.lease),
            *self.extra,
        ]

    def start(self) -> NodeProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_text(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""
