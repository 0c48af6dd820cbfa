"""Helpers for the durability tests: broker subprocesses, checksummed bodies, draining.

Not a conftest (the directory must not have one): test modules import this by name.
Every broker started through a ``Brokers`` set is killed when the set is closed, so a
failing test never leaves a server running.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from serverproc import TEST_WORKERS, server_argv, sigkill_broker

START_TIMEOUT = 60.0
RECOVERED_LINE = re.compile(r"recovered \d+ messages in [\d.]+ s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_amqp(port: int, timeout: float) -> bool:
    """Whether an AMQP server answers on `port`: its first frame after the protocol
    header is a method frame (connection.start). A bare TCP connect is not enough:
    while nothing listens on a port of the ephemeral range, a connect to it may be
    given that very port as its source and reach itself."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        return sock.recv(1) == b"\x01"


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """VmRSS (or VmHWM, the peak) of a process from /proc, in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


@functools.cache
def server_supports(flag: str) -> bool:
    """Whether `leveret server` accepts `flag` (options are being added as we go)."""
    result = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return flag in result.stdout


class Broker:
    """One `leveret server` subprocess; stderr goes to a log file that outlives restarts."""

    def __init__(self, data_dir: Path, log_path: Path, port: int, args: list[str]) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = port
        self.args = args
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0
        self.management: str | None = None  # the management API's base URL, if served

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def store_dir(self, queue: str | None = None, vhost: str = "/") -> Path:
        """The store that holds `queue` (definitions catalog, segments, queue index).

        A one-process broker keeps it in its data dir; a broker of workers
        (LEVERET_TEST_WORKERS) in `<data-dir>/worker-<i>` of the queue's owner, worker 0
        when no queue is named."""
        return store_dir(self.data_dir, queue, vhost)

    def owner_pid(self, queue: str, vhost: str = "/") -> int:
        """The process that holds `queue`: this broker's, or with workers the owner
        worker's (from `<data-dir>/workers-status.json`), so that memory measured on
        it is the queue's."""
        count = test_workers()
        if count == 1:
            return self.pid
        from leveret.workers.mesh import placement

        status = json.loads((self.data_dir / "workers-status.json").read_text())
        return status["workers"][placement(vhost, queue, count)]["pid"]

    def command(self) -> list[str]:
        return [
            *server_argv(),
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]

    def spawn(self) -> subprocess.Popen:
        """Start the process without waiting for it to listen."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL
            )
        return self.proc

    def start(self, timeout: float = START_TIMEOUT, recovered: bool = True) -> Broker:
        """Start and wait until the broker answers on its port, and (with `recovered`)
        until the log says the stored messages are back.

        The broker listens before that: clients' operations made meanwhile wait for
        the recovery, as do the management API and leveret ctl (a broker of workers
        answers only once every worker recovered and linked to the others). Tests that check the
        log right after a start need the second wait; tests of the wait pass False."""
        proc = self.spawn()
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"broker exited early with {proc.returncode}:\n{self.run_log()}")
            try:
                if answers_amqp(self.port, min(5.0, max(0.5, deadline - time.monotonic()))):
                    break
                raise ConnectionError("not the broker's answer")
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"broker did not listen within {timeout} s:\n{self.run_log()}")
                time.sleep(0.02)
        if recovered:
            self.wait_recovered(max(1.0, deadline - time.monotonic()))
        return self

    def wait_recovered(self, timeout: float = START_TIMEOUT) -> None:
        """Wait for the log line of a finished recovery ("recovered N messages in"):
        with workers, one from every worker (each recovers its own store)."""
        deadline = time.monotonic() + timeout
        while len(RECOVERED_LINE.findall(self.run_log())) < test_workers():
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"broker exited with {self.proc.returncode}:\n{self.run_log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"broker did not recover within {timeout} s:\n{self.run_log()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"broker did not exit on SIGTERM within {timeout} s:\n{self.run_log()}")

    def kill(self) -> None:
        """SIGKILL (if running) and reap: with workers, the supervisor and every worker."""
        if self.proc is not None:
            sigkill_broker(self.proc, self.data_dir)

    def restart(self) -> Broker:
        self.stop()
        return self.start()

    def log(self) -> str:
        """Everything this broker (all its runs) wrote to stderr."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def run_log(self) -> str:
        """What the current (or last) run wrote to stderr."""
        return self.log()[self._log_offset :] if self.log_path.exists() else ""

    def connect(self, **overrides) -> pika.BlockingConnection:
        params = pika.URLParameters(self.url)
        params.socket_timeout = 10
        params.blocked_connection_timeout = 30
        params.connection_attempts = 1
        params.heartbeat = 0
        for key, value in overrides.items():
            setattr(params, key, value)
        return pika.BlockingConnection(params)


class Brokers:
    """Creates brokers under one tmp dir; closing it kills every one still running."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: list[Broker] = []

    def new(
        self,
        data_dir: Path | None = None,
        *,
        fsync: str | None = None,
        max_memory_bytes: int | None = None,
        extra: tuple[str, ...] = (),
        name: str | None = None,
    ) -> Broker:
        name = name or f"broker{len(self.brokers)}"
        args = ["--log-level", "info", *extra]
        if fsync is not None:
            args += ["--fsync", fsync]
        if max_memory_bytes is not None:
            args += ["--max-memory-bytes", str(max_memory_bytes)]
        broker = Broker(
            data_dir if data_dir is not None else self.root / f"{name}-data",
            self.root / f"{name}.log",
            free_port(),
            args,
        )
        self.brokers.append(broker)
        return broker

    def start(self, data_dir: Path | None = None, **kwargs) -> Broker:
        return self.new(data_dir, **kwargs).start()

    def close(self) -> None:
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.kill()

    def __enter__(self) -> Brokers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_paging_broker(
    brokers: Brokers, name: str, ram: int, data_dir: Path | None = None
) -> Broker:
    """A broker whose queues keep `ram` messages in RAM (--queue-ram-messages: the rest
    page out) and that serves its management API at `broker.management`."""
    mport = free_port()
    extra = ("--queue-ram-messages", str(ram), "--management-port", str(mport))
    broker = brokers.start(data_dir, name=name, extra=extra)
    broker.management = f"http://127.0.0.1:{mport}"
    return broker


def management_request(
    broker: Broker, method: str, path: str, body: dict | None = None
) -> tuple[int, Any]:
    """One call to the broker's management API as guest: (HTTP status, decoded JSON or
    None). An error status raises urllib's HTTPError."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{broker.management}/api/{path}", data, method=method)
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)


def queue_info(broker: Broker, name: str) -> dict:
    """The management API's view of queue `name` in vhost /."""
    return management_request(broker, "GET", f"queues/%2F/{name}")[1]


# ---- bodies ----------------------------------------------------------------------------


_PATTERN = bytes(48 + (i * 7) % 75 for i in range(1 << 20))


def make_body(tag: str, size: int = 0) -> bytes:
    """``tag|padding|crc32`` (about ``size`` bytes) where the CRC covers what precedes it."""
    head = tag.encode() + b"|"
    pad_len = max(0, size - len(head) - 9)
    start = zlib.crc32(head) % 4096
    assert pad_len <= len(_PATTERN) - start, "body too large"
    payload = head + _PATTERN[start : start + pad_len]
    return payload + b"|" + b"%08x" % zlib.crc32(payload)


def check_body(body: bytes) -> str:
    """The tag of an intact body; raises AssertionError on corruption."""
    payload, sep, crc = body.rpartition(b"|")
    assert sep and len(crc) == 8, f"body has no checksum: {body[:60]!r}..."
    assert b"%08x" % zlib.crc32(payload) == crc, f"corrupt body {body[:60]!r}... ({len(body)} B)"
    return payload.split(b"|", 1)[0].decode()


# ---- draining ----------------------------------------------------------------------------


def message_count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def drain_queue(ch, queue: str, limit: int | None = None) -> list[tuple[bytes, bool, object]]:
    """Consume everything ready in ``queue`` (auto-ack): [(body, redelivered, properties)]."""
    want = message_count(ch, queue) if limit is None else limit
    out: list[tuple[bytes, bool, object]] = []
    if want == 0:
        return out
    for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=10):
        if method is None:
            break
        out.append((body, method.redelivered, props))
        if len(out) >= want:
            break
    ch.cancel()
    return out


PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def close_quietly(conn) -> None:
    with contextlib.suppress(Exception):
        if conn.is_open:
            conn.close()


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def assert_exit_ok(broker: Broker) -> None:
    rc = broker.stop()
    assert rc == 0, f"broker exited {rc} on SIGTERM:\n{tail(broker.run_log())}"


def test_workers() -> int:
    """How many workers the brokers of this run have (LEVERET_TEST_WORKERS, else 1)."""
    return int(TEST_WORKERS or 1)


test_workers.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest


def store_dir(data_dir: Path, queue: str | None = None, vhost: str = "/") -> Path:
    """The store under `data_dir` that holds `queue` (see Broker.store_dir)."""
    count = test_workers()
    if count == 1:
        return data_dir
    from leveret.workers.mesh import placement

    owner = placement(vhost, queue, count) if queue is not None else 0
    return data_dir / f"worker-{owner}"


def store_dirs(data_dir: Path) -> list[Path]:
    """Every store under `data_dir`: each worker keeps its own definitions catalog."""
    count = test_workers()
    return [data_dir] if count == 1 else [data_dir / f"worker-{i}" for i in range(count)]


def segment_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "msgs").glob("*.seg"))


# ---- a fast raw-frame client (pika is too slow for 200,000 messages) ---------------------

_FRAME_HEAD = struct.Struct(">BHI")
_DELIVER = (60 << 16) | 60
_CONFIRM_ACK = (60 << 16) | 80
_CONFIRM_NACK = (60 << 16) | 120


def _raw_client(port: int):
    from rawamqp import RawClient  # tests/rawamqp.py (tests/ is on sys.path via conftest)

    client = RawClient("127.0.0.1", port, timeout=30)
    client.handshake()
    client.open_channel(1)
    return client


def fast_publish(
    port: int, queue: str, bodies: Iterable[bytes], persistent: bool, window: int = 2000
) -> int:
    """Publish through the default exchange with confirms, `window` unconfirmed at most.

    Returns how many were confirmed; raises AssertionError on any nack.
    """
    from pamqp import commands, frame, header

    client = _raw_client(port)
    try:
        client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        method = frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        sent = acked = 0
        buf: list[bytes] = []
        for body in bodies:
            assert len(body) < 100_000, "fast_publish sends each body as one frame"
            buf.append(method)
            buf.append(frame.marshal(header.ContentHeader(0, len(body), props), 1))
            buf.append(_FRAME_HEAD.pack(3, 1, len(body)) + body + b"\xce")
            sent += 1
            if len(buf) >= 300:
                client.send(b"".join(buf))
                buf.clear()
                while sent - acked > window:
                    acked = _read_confirms(client, acked)
        if buf:
            client.send(b"".join(buf))
        while acked < sent:
            acked = _read_confirms(client, acked)
        return acked
    finally:
        client.close()


def _read_confirms(client, acked: int) -> int:
    from pamqp import commands

    _ch, obj = client.read_frame()
    if isinstance(obj, commands.Basic.Ack):
        return obj.delivery_tag if obj.multiple else acked + 1
    if isinstance(obj, commands.Basic.Nack):
        raise AssertionError(f"publish nacked: {obj}")
    if isinstance(obj, commands.Channel.Close | commands.Connection.Close):
        raise AssertionError(f"closed while publishing: {obj.reply_code} {obj.reply_text}")
    return acked


def fast_consume(port: int, queue: str, count: int) -> Iterator[tuple[bytes, bool]]:
    """Yield (body, redelivered) for `count` messages, consuming with acks (prefetch 2000)."""
    from pamqp import commands, frame

    client = _raw_client(port)
    try:
        client.rpc(1, commands.Basic.Qos(prefetch_count=2000), commands.Basic.QosOk)
        client.rpc(1, commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk)
        got = 0
        buf = bytearray(client.buf)  # deliveries may have arrived with consume-ok
        client.buf = b""
        sock = client.sock
        state = 0  # 0: want deliver, 1: want header, 2: want body bytes
        redelivered = False
        size = 0
        parts: list[bytes] = []
        last_tag = 0
        while True:
            off = 0
            n = len(buf)
            while n - off >= 7:
                ftype, _ch, fsize = _FRAME_HEAD.unpack_from(buf, off)
                end = off + 7 + fsize + 1
                if end > n:
                    break
                if ftype == 1:
                    (mid,) = struct.unpack_from(">I", buf, off + 7)
                    if mid != _DELIVER:
                        _c, _h, obj = frame.unmarshal(bytes(buf[off:end]))
                        raise AssertionError(f"unexpected {obj!r} after {got} messages")
                    p = off + 11
                    p += 1 + buf[p]  # consumer tag
                    (last_tag,) = struct.unpack_from(">Q", buf, p)
                    redelivered = bool(buf[p + 8] & 1)
                    state = 1
                elif ftype == 2:
                    assert state == 1, "content header out of place"
                    (size,) = struct.unpack_from(">Q", buf, off + 11)
                    parts = []
                    state = 2
                    if size == 0:
                        got += 1
                        state = 0
                        yield b"", redelivered
                elif ftype == 3:
                    assert state == 2, "content body out of place"
                    parts.append(bytes(buf[off + 7 : end - 1]))
                    size -= fsize
                    if size == 0:
                        got += 1
                        state = 0
                        yield b"".join(parts), redelivered
                off = end
            del buf[:off]
            if last_tag:
                client.send(frame.marshal(commands.Basic.Ack(last_tag, multiple=True), 1))
                last_tag = 0
            if got >= count:
                break
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise AssertionError(f"connection lost after {got} of {count} messages")
            buf += chunk
    finally:
        client.close()
